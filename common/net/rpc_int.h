/*
 * rpc_int — declarations shared by the files of the rpc module (rpc*.c) only.
 * Not for use outside the rpc module.
 */
#ifndef TSR_RPC_INTERNAL_H
#define TSR_RPC_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "core/error.h"
#include "net/rpc.h"
#include "net/rpc_typed.h"

/* Reads a whole (small) text file, NUL-terminated; caller frees. NULL with err set
 * (TSR_EIO; TSR_ELIMIT above 1 MiB). `what` names the option in the message. */
char *tsr__rpc_read_file(const char *path, const char *what, tsr_error *err);

/* Copies a slice into a new NUL-terminated string (caller frees); never NULL. */
char *tsr__rpc_slice_strdup(grpc_slice s);

/* Reads a received byte buffer (possibly many slices or compressed) into one slice
 * (caller unrefs). */
grpc_slice tsr__rpc_buffer_to_slice(grpc_byte_buffer *bb);

/* The verdict on a call's metadata against t for a method needing `required` (0 = open):
 * TSR_RPC_OK, UNAUTHENTICATED or PERMISSION_DENIED with msg set (never quoting a token). */
int tsr__rpc_auth_check(const tsr_rpc_tokens *t, const grpc_metadata_array *md, int required,
                        char *msg, size_t cap);

/* A client channel (rpc_client.c creates and destroys it; rpc_stream.c starts calls on it). */
struct tsr_rpc_channel {
    grpc_channel *ch;
    char *target;
    int watched;
    int fast_reconnect;
    int streams_nowait;  /* opts.streams_nowait (rpc_stream.c) */
    char *auth;            /* "Bearer <token>" (opts.bearer_token), NULL = none; wiped */
    grpc_metadata auth_md; /* its metadata entry, sent on every call */
    gpr_timespec last_reset; /* W.mu: last backoff reset by the watcher */
    struct tsr_rpc_channel *next, *prev; /* rpc_client.c's watcher list (W.mu) */
};

/* Milliseconds from now to deadline d (any clock); INT64_MAX for an infinite deadline. */
int64_t tsr__rpc_remaining_ms(gpr_timespec d);

/* Deadline timeout_ms from now on the monotonic clock (<= 0 → 30000). */
gpr_timespec tsr__rpc_deadline(int64_t timeout_ms);

/* The first member of every struct whose address rpc gives core as a tag on a server
 * queue, so that a polling thread can tell a server call from a client call started on
 * that queue by an asynchronous fan-out (tsr_rpc_reply_fanout). */
enum { TSR__TAG_SERVER_CALL = 0x5e7c, TSR__TAG_CLIENT_CALL = 0xc11e };

/* One client call in flight (GRPC_C_CORE.md "Client call sequence": one batch of six
 * ops). Its address is the batch's tag. */
struct tsr__ccall {
    int kind; /* TSR__TAG_CLIENT_CALL; must stay first */
    grpc_call *call;
    grpc_metadata_array init_md, trail_md;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    int started, unusable;
    void *owner;  /* the asynchronous fan-out it belongs to (NULL for tsr_rpc_fanout) */
    size_t index; /* its call's index in that fan-out */
};

/* Starts fc on cq with cc as the tag (owner and index are stored before the batch
 * starts). Returns 0, or -1 when nothing was started (no channel or method, or core
 * refused): no event will come, tsr__ccall_finish still fills the result. fc->req is
 * borrowed until the event. */
int tsr__ccall_start(struct tsr__ccall *cc, tsr_rpc_fanout_call *fc, grpc_completion_queue *cq,
                     void *owner, size_t index);

/* After its event (or a failed start): fills fc->result and frees everything of cc. */
void tsr__ccall_finish(struct tsr__ccall *cc, tsr_rpc_fanout_call *fc);

/* Polling threads of started servers in this process (rpc_server.c keeps it): while it is
 * nonzero somebody always polls gRPC's one epoll set, so the client's connectivity watcher
 * needs no polls of its own. */
extern atomic_int tsr__rpc_pollers_running;

/* ThreadSanitizer cannot see the synchronization inside gRPC core (not instrumented):
 * a call context handed to core on one thread and delivered by the completion queue on
 * another looks like a race. These annotate the hand-over (release before giving a tag
 * to core, acquire when its event arrives); no-ops in other builds. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSR_TSAN_RELEASE(p) __tsan_release((void *)(p))
#define TSR_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define TSR_TSAN_RELEASE(p) ((void)0)
#define TSR_TSAN_ACQUIRE(p) ((void)0)
#endif

/* For tests and fuzz harnesses only: runs one handler on request bytes as the server would
 * (the nesting check of req_type when not NULL, the handler, the status of its return
 * value), without gRPC, a socket or a server. tsr_rpc_reply_fanout answers TSR_EUNAVAILABLE
 * on such a call (there is no queue); tsr_rpc_reply_remaining_ms is unbounded;
 * tsr_rpc_reply_method gives path (borrowed). Fills *out (code, status message or NULL,
 * response bytes on OK or NULL; tsr__rpc_detached_close frees them) and returns out->code. */
typedef struct tsr__rpc_detached {
    int code;      /* gRPC status */
    char *msg;     /* owned; NULL = none */
    uint8_t *resp; /* owned; NULL = empty */
    size_t len;
} tsr__rpc_detached;
int tsr__rpc_run_detached(const char *path, tsr_rpc_handler_fn fn, void *ctx,
                          const ProtobufCMessageDescriptor *req_type, const uint8_t *req,
                          size_t len, tsr__rpc_detached *out);
void tsr__rpc_detached_close(tsr__rpc_detached *d);

/* A typed method bound to its app (rpc_typed.c); a server keeps one per typed method. */
struct tsr__rpc_binding {
    const tsr_rpc_method *m;
    void *app;
};

/* Registers fn with a copy of *b as its ctx (kept in the server's method table, so it
 * lives as long as the server) and req_type for the nesting check (NULL = none). As
 * tsr_rpc_server_add_method otherwise. */
int tsr__rpc_server_add_bound(tsr_rpc_server *s, const char *path, tsr_rpc_handler_fn fn,
                              const struct tsr__rpc_binding *b, unsigned flags,
                              const ProtobufCMessageDescriptor *req_type);

/* tsr_rpc_reply_error with a va_list. */
int tsr__rpc_reply_verror(tsr_rpc_reply *r, int grpc_code, const char *fmt, va_list ap);

/* The status code set on r so far (TSR_RPC_OK when none). */
int tsr__rpc_reply_code(const tsr_rpc_reply *r);

/* For tests and fuzz harnesses: tsr__rpc_run_detached for the typed method m with app. */
int tsr__rpc_run_typed_detached(const tsr_rpc_method *m, void *app, const uint8_t *req,
                                size_t len, tsr__rpc_detached *out);

#endif
