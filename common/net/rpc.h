/*
 * rpc — unary gRPC server and client on top of gRPC C core 1.51, for Tessera's services.
 *
 * Everything is unary and bytes in / bytes out: a request and a response are one
 * serialized protobuf message each (use the protobuf-c helpers below, or your own
 * packing). Method paths are "/<package>.<Service>/<Method>", e.g.
 * "/tessera.v1.Shard/Search" (protoc-c generates no gRPC code; build paths by hand).
 *
 * SERVER (rpc_server.c)
 *   tsr_rpc_server_opts o; tsr_rpc_server_opts_init(&o); o.listen = "0.0.0.0:7001";
 *   tsr_rpc_server *s = tsr_rpc_server_create(&o, &err);        // binds the port
 *   tsr_rpc_server_add_method(s, "/tessera.v1.Shard/Search", search_fn, shard, 0);
 *   tsr_rpc_server_add_method(s, "/tessera.v1.Shard/Stage", stage_fn, shard, TSR_RPC_LONG);
 *   tsr_rpc_server_start(s, &err);                              // threads run
 *   ...  tsr_rpc_server_destroy(s);                             // graceful shutdown
 *
 *   Handlers of protobuf methods are typed (net/rpc_typed.h, tsr_rpc_server_add_typed): they
 *   get the decoded request and fill the response; the layer unpacks, checks, maps errors,
 *   packs and frees. The raw form below is for byte-level handlers (tests, relays) and is
 *   what the typed layer itself is built on. A raw handler:
 *     static int search_fn(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
 *     {
 *         Tessera__V1__ShardSearchRequest *rq =
 *             tessera__v1__shard_search_request__unpack(NULL, len, req);
 *         if (!rq) return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
 *                                             "ShardSearchRequest: malformed protobuf");
 *         ... build Tessera__V1__ShardSearchResponse resp ...
 *         int rc = tsr_rpc_reply_pack(reply, &resp.base);
 *         tessera__v1__shard_search_request__free_unpacked(rq, NULL);
 *         return rc;
 *     }
 *   Return 0 with a response set (none set = an empty message, valid for any proto3
 *   message with all fields default). To fail, either set a status with
 *   tsr_rpc_reply_error / tsr_rpc_reply_from_error (their return value is a negative TSR
 *   code, so `return tsr_rpc_reply_error(...)` reads well), or just return a negative TSR
 *   code: it is mapped with tsr_rpc_status_from_error and the message is tsr_strerror.
 *   An error status discards any response set.
 *
 *   Threads: `cqs` completion queues with `pollers` polling threads each (defaults 1 and
 *   1: on gRPC's epoll engine every polling thread of a process takes part in every event,
 *   so fewer is faster as long as no handler blocks a poller for long). A
 *   handler without TSR_RPC_LONG runs on the polling thread that received the call: it
 *   must be short and must never block on another RPC or on a lock held by slow work.
 *   TSR_RPC_LONG handlers run on the polling thread that received the call while another
 *   polling thread of its queue stays free, else on a worker pool (`workers` threads);
 *   either way the reply is sent from the thread that ran them (env TSR_RPC_INLINE_LONG=0:
 *   always the pool). A handler that fans out to other servers either uses
 *   tsr_rpc_reply_fanout (asynchronous: it does not block, so it needs no TSR_RPC_LONG;
 *   the coordinator's FindNeighbors) or blocks in tsr_rpc_fanout and MUST be TSR_RPC_LONG.
 *   Env TSR_RPC_CQS / TSR_RPC_POLLERS override cqs / pollers (for A/B measurements).
 *   Handlers for the same or different methods run concurrently: they must be
 *   thread-safe with respect to their ctx.
 *
 *   Built in: grpc.health.v1.Health/Check ("" = the server as a whole, SERVING once
 *   started; other service names only when set with tsr_rpc_server_set_health; an unknown
 *   name → NOT_FOUND, as the standard says); unknown method → UNIMPLEMENTED; a request
 *   larger than max_message → RESOURCE_EXHAUSTED (by gRPC core); a reply larger than
 *   max_message → RESOURCE_EXHAUSTED with a message.
 *
 *   Shutdown (tsr_rpc_server_shutdown, also done by destroy): health turns NOT_SERVING,
 *   no new calls are accepted, calls in flight get up to grace_ms to finish, then they
 *   are cancelled (clients see CANCELLED or UNAVAILABLE; LONG calls still queued are not
 *   started); it then waits for running handlers to return
 *   (a handler may check tsr_rpc_reply_cancelled to stop early), then stops the threads.
 *
 * CLIENT (rpc_client.c)
 *   tsr_rpc_channel *ch = tsr_rpc_channel_create("ipv4:127.0.0.1:7001", NULL, &err);
 *   tsr_rpc_result res; tsr_rpc_result_init(&res);
 *   if (tsr_rpc_call(ch, "/tessera.v1.Shard/Stats", buf, len, 1000, &res) != TSR_RPC_OK)
 *       fprintf(stderr, "%s: %s\n", tsr_rpc_code_name(res.code), res.message);
 *   ... unpack res.data / res.len ...
 *   tsr_rpc_result_close(&res); tsr_rpc_channel_destroy(ch);
 *
 *   Channels are thread-safe; share one per peer. Every channel is watched by one
 *   process-wide connectivity thread (GRPC_C_CORE.md: idle channels are not polled, so
 *   without it a restarted peer is noticed only at the 5 s backup poll; with it, and its
 *   retry of failed channels every 0.2 s, in ~0.1–0.3 s). A dead peer fails fast with UNAVAILABLE; a hung peer shows as
 *   DEADLINE_EXCEEDED, so every call has a deadline.
 *   tsr_rpc_fanout sends N calls in parallel on one completion queue and waits for all,
 *   each with its own deadline. Completion queues for calls are pooled (TSR_RPC_CQ_POOL=0:
 *   one per call, as before). Inside a server handler, tsr_rpc_reply_fanout does the same
 *   without blocking (see the server section).
 *
 * Targets: "ipv4:127.0.0.1:PORT", "host:port", "dns:///host:port", "unix:/path".
 * Prefer ipv4: literal targets in tests (the localhost resolver leaks a few bytes once per
 * process under LeakSanitizer).
 *
 * Error mapping (DESIGN "Conventions"): tsr_rpc_status_from_error maps TSR codes to gRPC
 * status codes at this boundary; tsr_rpc_error_from_status maps back for callers that
 * want to propagate a peer's failure as a tsr_error.
 */
#ifndef TSR_RPC_H
#define TSR_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "core/error.h"

/* gRPC status codes (same numbers as grpc_status_code, so they can be compared with what
 * any gRPC client reports). */
enum tsr_rpc_code {
    TSR_RPC_OK = 0,
    TSR_RPC_CANCELLED = 1,
    TSR_RPC_UNKNOWN = 2,
    TSR_RPC_INVALID_ARGUMENT = 3,
    TSR_RPC_DEADLINE_EXCEEDED = 4,
    TSR_RPC_NOT_FOUND = 5,
    TSR_RPC_ALREADY_EXISTS = 6,
    TSR_RPC_PERMISSION_DENIED = 7,
    TSR_RPC_RESOURCE_EXHAUSTED = 8,
    TSR_RPC_FAILED_PRECONDITION = 9,
    TSR_RPC_ABORTED = 10,
    TSR_RPC_OUT_OF_RANGE = 11,
    TSR_RPC_UNIMPLEMENTED = 12,
    TSR_RPC_INTERNAL = 13,
    TSR_RPC_UNAVAILABLE = 14,
    TSR_RPC_DATA_LOSS = 15,
    TSR_RPC_UNAUTHENTICATED = 16
};

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" for others. Never NULL. */
const char *tsr_rpc_code_name(int code);

/* TSR_OK→OK, TSR_EINVAL→INVALID_ARGUMENT, TSR_ENOTFOUND→NOT_FOUND,
 * TSR_ESTATE→FAILED_PRECONDITION, TSR_EUNAVAILABLE→UNAVAILABLE,
 * TSR_ETIMEOUT→DEADLINE_EXCEEDED, TSR_ELIMIT→RESOURCE_EXHAUSTED, anything else→INTERNAL
 * (TSR_EFORMAT and TSR_EREJECTED included: a handler that means "the request is bad"
 * must say INVALID_ARGUMENT itself). */
int tsr_rpc_status_from_error(int tsr_code);

/* The reverse, for propagating a peer's status: OK→TSR_OK, INVALID_ARGUMENT and
 * OUT_OF_RANGE→TSR_EINVAL, NOT_FOUND→TSR_ENOTFOUND, FAILED_PRECONDITION/ABORTED→
 * TSR_ESTATE, UNAVAILABLE/CANCELLED→TSR_EUNAVAILABLE, DEADLINE_EXCEEDED→TSR_ETIMEOUT,
 * RESOURCE_EXHAUSTED→TSR_ELIMIT, UNIMPLEMENTED→TSR_EUNSUPPORTED, others→TSR_EINTERNAL. */
int tsr_rpc_error_from_status(int grpc_code);

/* Default max message size (both directions, server and client). */
#define TSR_RPC_DEFAULT_MAX_MESSAGE (64u * 1024u * 1024u)
/* Status messages longer than this are truncated (they travel in HTTP/2 trailers). */
#define TSR_RPC_MAX_STATUS_MESSAGE 2048

/* ===================================== server ===================================== */

typedef struct tsr_rpc_server tsr_rpc_server;
typedef struct tsr_rpc_reply tsr_rpc_reply; /* one call's reply; owned by rpc */
typedef struct tsr_rpc_fanout_call tsr_rpc_fanout_call; /* client section */

/* Handler: req/req_len borrow the request bytes (valid during the call only; req may be
 * NULL when req_len is 0). Fill `reply` (see the file comment). Returns 0 or a negative
 * TSR code. */
typedef int (*tsr_rpc_handler_fn)(void *ctx, const uint8_t *req, size_t req_len,
                                  tsr_rpc_reply *reply);

/* add_method flags */
#define TSR_RPC_LONG 1u /* run on the worker pool, not on the polling thread */

typedef struct tsr_rpc_server_opts {
    /* "ADDR:PORT" to listen on; port 0 = an ephemeral port (see tsr_rpc_server_port).
     * Default "127.0.0.1:0". Borrowed during create. */
    const char *listen;
    int cqs;             /* completion queues; 0 = 1 */
    /* Polling threads per queue; 0 = 1: the fewest thread wake-ups per call (gRPC's epoll
     * engine hands its one epoll set from thread to thread, waking the next one on every
     * event), best for latency when no handler blocks; LONG handlers then always run on
     * the worker pool. With 2 or more, a LONG handler may run in place on the receiving
     * poller while another keeps polling. 1..8. */
    int pollers;
    int workers;         /* worker threads for TSR_RPC_LONG handlers; 0 = 4 */
    int max_queued;      /* LONG calls waiting for a worker before RESOURCE_EXHAUSTED; 0 = 1024 */
    int pending_per_cq;  /* request_call slots kept armed per queue; 0 = 16 */
    size_t max_message;  /* max request and reply bytes; 0 = TSR_RPC_DEFAULT_MAX_MESSAGE */
    int grace_ms;        /* shutdown grace for calls in flight; 0 = 2000, <0 = none */
    /* TLS: both set = TLS only (no plaintext). PEM file paths, read during create. */
    const char *tls_cert_file; /* certificate chain */
    const char *tls_key_file;  /* private key */
    /* With TLS: require and verify client certificates against this CA (mutual TLS). */
    const char *tls_client_ca_file;
    /* Appended to the UNIMPLEMENTED message of a call to a service this server does not
     * serve, naming what this port is and where the caller probably meant to go (a
     * coordinator method sent to a shard's port). NULL = none. Copied during create. */
    const char *wrong_port_hint;
} tsr_rpc_server_opts;

void tsr_rpc_server_opts_init(tsr_rpc_server_opts *o); /* zeroes, sets listen */

/* Creates a server bound to o->listen (the port is open but calls wait until start).
 * Returns a new server (caller destroys) or NULL with err set (EINVAL bad options,
 * EIO unreadable TLS file, EUNAVAILABLE the address cannot be bound). */
tsr_rpc_server *tsr_rpc_server_create(const tsr_rpc_server_opts *o, tsr_error *err);

/* Registers a handler for a method path ("/pkg.Service/Method"; copied). ctx is borrowed
 * and passed to every call. Only before start. Returns TSR_EINVAL for a bad path, a
 * duplicate, or after start. */
int tsr_rpc_server_add_method(tsr_rpc_server *s, const char *path, tsr_rpc_handler_fn fn,
                              void *ctx, unsigned flags);

/* Starts the polling and worker threads; health "" becomes SERVING. */
int tsr_rpc_server_start(tsr_rpc_server *s, tsr_error *err);

/* The bound port (useful after listening on port 0). */
int tsr_rpc_server_port(const tsr_rpc_server *s);

/* Health serving status for grpc.health.v1.Health/Check. */
enum tsr_rpc_health {
    TSR_RPC_HEALTH_UNKNOWN = 0,
    TSR_RPC_HEALTH_SERVING = 1,
    TSR_RPC_HEALTH_NOT_SERVING = 2
};
/* Sets the status reported for `service` ("" or NULL = the whole server). Thread-safe,
 * any time. At most 32 service names. Returns 0 or TSR_ELIMIT. */
int tsr_rpc_server_set_health(tsr_rpc_server *s, const char *service, int status);

/* Graceful shutdown as described in the file comment; blocks until every thread has
 * stopped. Idempotent; thread-safe against calls in flight, but must not be called from a
 * handler. */
void tsr_rpc_server_shutdown(tsr_rpc_server *s);

/* Shuts down if needed and frees. Accepts NULL. */
void tsr_rpc_server_destroy(tsr_rpc_server *s);

/* ---- inside a handler (reply is valid only until the handler returns) ---- */

/* Sets the response, taking ownership of buf (malloc'ed; rpc frees it with free()).
 * Replaces a response set before. */
void tsr_rpc_reply_set(tsr_rpc_reply *r, uint8_t *buf, size_t len);

/* Copies len bytes as the response. Returns 0 or TSR_ENOMEM. */
int tsr_rpc_reply_copy(tsr_rpc_reply *r, const void *data, size_t len);

/* Packs a protobuf-c message as the response (no intermediate copy). Returns 0, or
 * TSR_ELIMIT when it is larger than max_message (the reply then carries
 * RESOURCE_EXHAUSTED), or TSR_ENOMEM. */
int tsr_rpc_reply_pack(tsr_rpc_reply *r, const ProtobufCMessage *msg);

/* Sets an error status (code != OK) with a printf message; discards any response.
 * Returns the TSR code matching the status (tsr_rpc_error_from_status), always < 0. */
int tsr_rpc_reply_error(tsr_rpc_reply *r, int grpc_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets the status mapped from err->code with err->msg as the message (code TSR_OK is
 * treated as TSR_EINTERNAL). Returns err->code (or TSR_EINTERNAL). */
int tsr_rpc_reply_from_error(tsr_rpc_reply *r, const tsr_error *err);

/* Called on a polling thread when every call of an asynchronous fan-out has completed
 * (calls[i].result filled, as tsr_rpc_fanout does). reply is the reply of the call that
 * started the fan-out. Like a handler it fills the reply and returns 0 or a negative TSR
 * code; or it starts another fan-out (tsr_rpc_reply_fanout), and the reply waits for that
 * one. It must not block. */
typedef int (*tsr_rpc_fanout_done_fn)(void *ud, tsr_rpc_reply *reply, tsr_rpc_fanout_call *calls,
                                      size_t n);

/* Asynchronous fan-out (inside a handler, or a done callback): starts the n calls on the
 * server's completion queue that received this call and returns at once; the reply is not
 * sent when the handler returns but after done has run — on whichever polling thread
 * completes the last call, so no thread blocks and no thread is woken just to wait. Each
 * call has its own deadline (timeout_ms) as with tsr_rpc_fanout; calls whose channel or
 * method is NULL fail with UNAVAILABLE without being sent. calls, their request buffers
 * and ud are borrowed until done is called (done may free them). At most one fan-out per
 * reply at a time. With it, a handler that fans out needs no TSR_RPC_LONG (it must still
 * be short). Returns 0 (done will be called exactly once), or TSR_EINVAL (a fan-out is
 * already pending, done NULL), TSR_ELIMIT, TSR_ENOMEM (nothing started, done will not be
 * called). */
int tsr_rpc_reply_fanout(tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n,
                         tsr_rpc_fanout_done_fn done, void *ud);

/* A held reply (inside a handler or a done callback): the reply is not sent when the
 * handler returns but when someone calls tsr_rpc_reply_release — from any thread, at any
 * time, also before the handler has returned. After holding, the handler must not touch r
 * again and its return value is ignored; the releaser fills r (tsr_rpc_reply_pack,
 * _error, ...) and then releases it with the code the handler would have returned. For a
 * handler whose answer depends on work that other calls share (the coordinator's
 * coalesced shard calls). Returns 0, TSR_EINVAL (already held or a fan-out pending), or
 * TSR_EUNAVAILABLE (a detached call, tsr__rpc_run_detached: answer in the handler). */
int tsr_rpc_reply_hold(tsr_rpc_reply *r);
void tsr_rpc_reply_release(tsr_rpc_reply *r, int rc);

/* The server that received this call (NULL for a detached call). */
tsr_rpc_server *tsr_rpc_reply_server(const tsr_rpc_reply *r);

/* A server fan-out: n client calls started on one of the server's completion queues (round
 * robin) and owned by no call: when all have completed, done(ud, calls, n) runs on a
 * polling thread of that queue — or on the calling thread before this returns, when none
 * could be started (no channel: UNAVAILABLE results). done must not block; it may start
 * further fan-outs. calls, their requests and ud are borrowed until done. Shutdown waits
 * for every server fan-out's done (each call has its deadline). Returns 0 (done will be
 * called exactly once), TSR_EUNAVAILABLE (server not started or shutting down),
 * TSR_EINVAL, TSR_ELIMIT, TSR_ENOMEM (nothing started, done will not be called). */
typedef void (*tsr_rpc_calls_done_fn)(void *ud, tsr_rpc_fanout_call *calls, size_t n);
int tsr_rpc_server_fanout(tsr_rpc_server *s, tsr_rpc_fanout_call *calls, size_t n,
                          tsr_rpc_calls_done_fn done, void *ud);

/* Milliseconds left before the client's deadline (INT64_MAX when it set none; may be
 * negative). Pass it on when calling further servers. */
int64_t tsr_rpc_reply_remaining_ms(const tsr_rpc_reply *r);

/* Nonzero once the server is shutting down and the grace period has passed (the call is
 * being cancelled): a long handler may stop early. */
int tsr_rpc_reply_cancelled(const tsr_rpc_reply *r);

/* The method path of this call (NUL-terminated, borrowed). */
const char *tsr_rpc_reply_method(const tsr_rpc_reply *r);

/* ---- authorization (rpc_auth.c): bearer tokens and per-method roles ----
 *
 * A server with a token set (tsr_rpc_server_set_tokens) checks every call where it is
 * dispatched, before its message is read: the call's `authorization: Bearer <token>`
 * metadata must hold a token of the set (else UNAUTHENTICATED) whose role level is at
 * least the method's (else PERMISSION_DENIED). Levels: 1..nroles, named by the
 * application in tsr_rpc_tokens_load (e.g. {"query", "admin"}); 0 = open. A method's level
 * is set with tsr_rpc_server_set_role; a method without one, and an unknown method, need
 * the highest level; grpc.health.v1.Health/Check is always open. Without a token set every
 * call is allowed (the application decides whether that is acceptable, see
 * tsr_rpc_addr_is_loopback). Tokens are compared in constant time and never logged. */
#define TSR_RPC_MAX_ROLES 4
#define TSR_RPC_MIN_TOKEN 16
#define TSR_RPC_MAX_TOKEN 512

typedef struct tsr_rpc_tokens tsr_rpc_tokens;

/* Loads a token file: one "<role> <token>" per line, '#' starts a comment, blank lines
 * ignored; role is one of roles[0..nroles-1] (level i+1); a token is 16..512 visible ASCII
 * characters, each at most once. Returns 0 with *out set (caller frees), or TSR_EIO /
 * TSR_EINVAL with err naming file:line and what is wrong (never the token). */
int tsr_rpc_tokens_load(const char *path, const char *const *roles, int nroles,
                        tsr_rpc_tokens **out, tsr_error *err);
/* A set of the one bare token in path (tsr_rpc_token_read), level 1 (a peer token). */
int tsr_rpc_tokens_single(const char *path, tsr_rpc_tokens **out, tsr_error *err);
void tsr_rpc_tokens_free(tsr_rpc_tokens *t); /* accepts NULL; wipes the tokens */
/* Tokens of a level; the number of roles. */
size_t tsr_rpc_tokens_count(const tsr_rpc_tokens *t, int level);
int tsr_rpc_tokens_roles(const tsr_rpc_tokens *t);

/* Reads a file that holds one bare token (surrounding blanks and newlines dropped).
 * Returns 0 with *out a new string (caller frees), or an error naming the file. */
int tsr_rpc_token_read(const char *path, char **out, tsr_error *err);

/* Installs t (the server takes it; NULL = no checks) in place of the set it had, which is
 * freed; thread-safe at any time (calls already dispatched keep their verdict). */
void tsr_rpc_server_set_tokens(tsr_rpc_server *s, tsr_rpc_tokens *t);
/* The level a registered method needs (0 = open). Only before start. TSR_EINVAL for an
 * unknown path. */
int tsr_rpc_server_set_role(tsr_rpc_server *s, const char *path, int level);

/* Deepest nesting of sub-messages a request of a method with a request type may have.
 * protobuf-c's unpack recurses once per level, so a message of a recursive type
 * (google.protobuf.Struct / Value: embedding_metadata, Index.metadata) nested millions
 * deep — a few MB on the wire — would overflow the stack. A Struct takes 3 levels per
 * JSON level, so 256 covers a batch's 64 JSON levels of metadata with room to spare. */
#define TSR_RPC_MAX_DEPTH 256
/* Declares the request type of a registered method (desc: static storage): before the
 * handler runs, a request nesting deeper than TSR_RPC_MAX_DEPTH is answered
 * INVALID_ARGUMENT ("<Type>: sub-messages nest deeper than 256 levels") and the handler is
 * not called. For the methods whose request type is recursive. Only before start;
 * TSR_EINVAL for an unknown path. */
int tsr_rpc_server_set_request_type(tsr_rpc_server *s, const char *path,
                                    const ProtobufCMessageDescriptor *desc);
/* 1 when the protobuf data[0..len) of type desc nests sub-messages more than max_depth
 * levels deep, else 0 (also when it is malformed: its unpack says so). Walks the wire
 * format with the descriptors: no allocation, at most max_depth recursions; fields that
 * desc does not know are skipped (protobuf-c keeps them as bytes, unparsed). */
int tsr_rpc_too_deep(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                     int max_depth);

/* Walks a message data[0..len) that holds nothing but entries of one repeated
 * length-delimited field (`repeated Msg x = field;`, e.g. ShardSearchResponse.results):
 * the offset of each entry's key into at[] (at most cap). Returns the number of entries,
 * or -1 when another field, a malformed length or more than cap entries is found. Since
 * protobuf concatenates repeated fields, bytes at[i]..at[j] are themselves such a message
 * holding entries i..j-1 (the coordinator's coalesced shard calls cut replies so). */
long tsr_rpc_split_repeated(const uint8_t *data, size_t len, unsigned field, size_t *at,
                            size_t cap);

/* 1 when a listen address is local only: 127.0.0.0/8, ::1, ::ffff:127.x, localhost,
 * unix:. "0.0.0.0", "[::]" and every other address give 0. */
int tsr_rpc_addr_is_loopback(const char *addr);

/* ===================================== client ===================================== */

typedef struct tsr_rpc_channel tsr_rpc_channel;

typedef struct tsr_rpc_client_opts {
    size_t max_message;          /* 0 = TSR_RPC_DEFAULT_MAX_MESSAGE */
    int keepalive_ms;            /* HTTP/2 keepalive ping interval; 0 = 5000; <0 = off */
    int keepalive_timeout_ms;    /* ping ack timeout; 0 = 3000 */
    int min_reconnect_backoff_ms; /* 0 = 1000; values < 1000 are raised to 1000 (it is also
                                    the minimum connect timeout, GRPC_C_CORE.md) */
    int max_reconnect_backoff_ms; /* 0 = 2000: a restarted peer is found within ~2 s */
    int no_watch;                /* 1 = not watched by the connectivity thread */
    int slow_reconnect;          /* 1 = the watcher leaves a failed channel to core's
                                    backoff (1..2 s) instead of retrying every 0.2 s */
    int streams_nowait;          /* 1 = a stream's user never blocks in gRPC's queue: it
                                    looks for completions every 10 ms and sleeps between
                                    (rpc_stream.c "Ticking mode"), so a long-waiting stream
                                    user (an etcd watch) stays out of core's poller hand-offs
                                    on every call of the process; a stream event then waits
                                    up to 10 ms. For processes whose server pollers do the
                                    I/O (docs/performance.md "Metadata backend"). Env
                                    TSR_RPC_STREAM_POLL=1 overrides it (benchmarks). */
    /* TLS: set tls_ca_file to use TLS (server verified against this CA, PEM path). */
    const char *tls_ca_file;
    const char *tls_cert_file;   /* optional client certificate (mutual TLS) */
    const char *tls_key_file;
    /* Host name to check the server certificate against instead of the target's
     * (e.g. "localhost" when dialling ipv4:127.0.0.1:PORT). */
    const char *tls_server_name;
    /* Sent as "authorization: Bearer <token>" on every call (copied; NULL = none). Over
     * plaintext it is readable by anyone on the path: use it on loopback or with TLS. */
    const char *bearer_token;
} tsr_rpc_client_opts;

void tsr_rpc_client_opts_init(tsr_rpc_client_opts *o); /* zeroes */

/* Creates a channel to target (copied); it connects lazily (and the watcher makes it
 * connect soon). opts may be NULL (defaults, plaintext). Returns a new channel (caller
 * destroys) or NULL with err set (EINVAL, EIO for TLS files). */
tsr_rpc_channel *tsr_rpc_channel_create(const char *target, const tsr_rpc_client_opts *opts,
                                        tsr_error *err);

/* Accepts NULL. No call may be running on the channel. */
void tsr_rpc_channel_destroy(tsr_rpc_channel *ch);

const char *tsr_rpc_channel_target(const tsr_rpc_channel *ch); /* borrowed */

/* Connectivity state (same numbers as grpc_connectivity_state). */
enum tsr_rpc_conn {
    TSR_RPC_CONN_IDLE = 0,
    TSR_RPC_CONN_CONNECTING = 1,
    TSR_RPC_CONN_READY = 2,
    TSR_RPC_CONN_TRANSIENT_FAILURE = 3,
    TSR_RPC_CONN_SHUTDOWN = 4
};
/* Current state; try_connect nonzero asks an idle channel to connect. NULL: SHUTDOWN. */
int tsr_rpc_channel_state(tsr_rpc_channel *ch, int try_connect);

/* Forgets the reconnect backoff so the next attempt is immediate (call it when you know
 * the peer was restarted, e.g. the supervisor saw it start; otherwise a peer that was
 * down is retried every min..max_reconnect_backoff_ms). */
void tsr_rpc_channel_reset_backoff(tsr_rpc_channel *ch);

/* Outcome of one call. Caller-embedded: _init before use, _close after. */
typedef struct tsr_rpc_result {
    int code;       /* gRPC status code, TSR_RPC_OK on success */
    char *message;  /* status details (owned, NUL-terminated; "" when none). For
                       failures generated locally it says what happened, e.g.
                       "Deadline Exceeded" or "failed to connect to all addresses". */
    uint8_t *data;  /* response bytes (owned, malloc'ed; NULL if none or code != OK) */
    size_t len;
} tsr_rpc_result;

void tsr_rpc_result_init(tsr_rpc_result *r);
void tsr_rpc_result_close(tsr_rpc_result *r); /* frees message and data, re-inits */

/* Copies "code name: message" into err (prefixed by ctx, e.g. the peer), with the
 * TSR code from tsr_rpc_error_from_status. Returns that code (TSR_OK when r->code is OK). */
int tsr_rpc_result_to_error(const tsr_rpc_result *r, const char *ctx, tsr_error *err);

/* Unary call: sends req (borrowed; req_len 0 = empty message), waits for the reply or
 * the deadline (timeout_ms from now; <= 0 means 30000 — calls without deadlines hang on
 * a stopped peer). Fills res (closing what it held before). Returns res->code. Thread-
 * safe; any number of threads may call on one channel. It blocks the calling thread:
 * never call it (or tsr_rpc_fanout) on the libuv loop thread or from a non-LONG
 * handler. */
int tsr_rpc_call(tsr_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                 int64_t timeout_ms, tsr_rpc_result *res);

/* One call of a fan-out. Fill the inputs; result is filled by tsr_rpc_fanout. */
struct tsr_rpc_fanout_call {
    tsr_rpc_channel *ch;    /* borrowed; NULL → result UNAVAILABLE "no channel" */
    const char *method;     /* borrowed */
    const void *req;        /* borrowed until tsr_rpc_fanout returns; several calls may
                               share one buffer (it is not copied) */
    size_t req_len;
    int64_t timeout_ms;     /* own deadline, as tsr_rpc_call */
    tsr_rpc_result result;  /* output; init it once, fanout closes what it held */
    void *user;             /* for the caller (e.g. the shard index); untouched */
};

/* Starts all n calls at once on one completion queue and waits until every one has
 * completed or hit its deadline. Returns the number of calls whose code is not OK. */
size_t tsr_rpc_fanout(tsr_rpc_fanout_call *calls, size_t n);

/* For a clean stop of a process: from now on every tsr_rpc_fanout / tsr_rpc_call of the
 * process, in flight or started later, ends within about 200 ms with CANCELLED "the
 * process is shutting down" (a sooner deadline still applies). Threads blocked on long
 * calls (a shard's Prepare may take minutes) come back and can be joined. Irreversible;
 * call it once the calls still needed (e.g. revoking an etcd lease) are done. Streams
 * (tsr_rpc_stream_*) are not affected: their owners close them. */
void tsr_rpc_client_shutdown(void);

/* ================================ streaming calls ================================= */
/* A bidirectional (or server-streaming) call, e.g. etcd's Watch and LeaseKeepAlive
 * (common/net/etcd). One thread uses a stream at a time; different streams are
 * independent (each has its own completion queue, polled only by its user).
 *
 *   tsr_rpc_stream *st = tsr_rpc_stream_open(ch, "/etcdserverpb.Watch/Watch", 0, &err);
 *   tsr_rpc_stream_send(st, req, len, 1000, &err);
 *   for (;;) { rc = tsr_rpc_stream_recv(st, 500, &msg, &n, &err); ... free(msg); }
 *   tsr_rpc_stream_close(st);
 */
typedef struct tsr_rpc_stream tsr_rpc_stream;

/* Starts a call of method on ch (borrowed; it must outlive the stream). life_ms bounds the
 * whole call (<= 0: no deadline; a stream usually lives until closed). Returns NULL with
 * err set (TSR_EIO) when core refuses the call. */
tsr_rpc_stream *tsr_rpc_stream_open(tsr_rpc_channel *ch, const char *method, int64_t life_ms,
                                    tsr_error *err);

/* Sends one message (borrowed; copied) and waits until core has taken it or timeout_ms
 * passed. Returns 0; TSR_ETIMEOUT (the stream is then unusable: close it); when the call
 * has ended, the code of its status (tsr_rpc_error_from_status; TSR_EUNAVAILABLE for an OK
 * status: the peer finished the stream) with err saying "<status name>: <details>". */
int tsr_rpc_stream_send(tsr_rpc_stream *st, const void *msg, size_t len, int64_t timeout_ms,
                        tsr_error *err);

/* Waits up to timeout_ms for the next message: 0 with *msg (malloc'ed, caller frees; NULL
 * for an empty message) and *len; TSR_ETIMEOUT when none came in time (the receive stays
 * pending: the next call goes on waiting for the same message, nothing is lost); when the
 * call has ended, as tsr_rpc_stream_send. */
int tsr_rpc_stream_recv(tsr_rpc_stream *st, int64_t timeout_ms, uint8_t **msg, size_t *len,
                        tsr_error *err);

/* Cancels the call if it is still running, waits for core to give back every pending
 * operation, frees everything. Accepts NULL. */
void tsr_rpc_stream_close(tsr_rpc_stream *st);

/* ================================ protobuf helpers ================================ */

/* Packs msg into a new malloc'ed buffer (caller frees), *len set. NULL on ENOMEM (an
 * empty message gives a 1-byte buffer with *len 0). */
uint8_t *tsr_rpc_pack(const ProtobufCMessage *msg, size_t *len);

/* Unary call with protobuf-c messages: packs req, calls, and unpacks the reply with
 * resp_desc into *resp (caller frees with protobuf_c_message_free_unpacked(*resp, NULL)).
 * A reply that does not parse gives code INTERNAL "malformed response". Returns res->code;
 * res->data is released after unpacking. */
int tsr_rpc_call_pb(tsr_rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                    ProtobufCMessage **resp, tsr_rpc_result *res);

/* The reply of a call that returned OK (a fan-out's result), unpacked with desc and
 * allocator (NULL = malloc; free with protobuf_c_message_free_unpacked(m, allocator)): the
 * message (res->data stays, closed with res), or NULL when res->code is not OK, or when the
 * reply does not parse — res then becomes INTERNAL "malformed <Type>" (e.g. "malformed
 * ShardReadResponse"), so the caller's one error path reports it. */
ProtobufCMessage *tsr_rpc_result_unpack(tsr_rpc_result *res, const ProtobufCMessageDescriptor *desc,
                                        ProtobufCAllocator *allocator);

#endif
