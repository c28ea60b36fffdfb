/*
 * rpc_typed — typed unary handlers over rpc.h: a method is registered with its request and
 * response protobuf-c descriptors, and its handler receives the decoded request and fills
 * the response. The layer does, for every call and the same way for every method:
 *
 *   1. size: a request longer than the method's max_request is answered RESOURCE_EXHAUSTED
 *      "<Request>: request of N bytes exceeds the limit of M bytes", before anything is
 *      allocated (gRPC core already refuses requests over the server's max_message);
 *   2. nesting: a request type that can nest (a recursive type such as
 *      google.protobuf.Struct, found from the descriptors at registration) is walked first
 *      (tsr_rpc_too_deep): deeper than TSR_RPC_MAX_DEPTH → INVALID_ARGUMENT;
 *   3. decode: a request that does not unpack → INVALID_ARGUMENT
 *      "<Request>: malformed protobuf";
 *   4. the handler runs with the request and an empty response (the descriptor's init);
 *   5. status: 0 → the response is packed (larger than max_message → RESOURCE_EXHAUSTED);
 *      a negative TSR code → the status tsr_rpc_status_from_error maps err->code to (the
 *      returned code when err was not set), with err->msg as the message, unless the
 *      handler chose a status itself with tsr_rpc_ctx_error (that one stands);
 *   6. free: the method's resp_free(resp), then the deferred cleanups
 *      (tsr_rpc_ctx_defer, last registered first), then the request
 *      (protobuf_c_message_free_unpacked) and the call's storage.
 * No handler unpacks, packs or frees its messages by hand.
 *
 *   TSR_RPC_HANDLER(h_stats, Tessera__V1__ShardStatsRequest, Tessera__V1__ShardStatsResponse)
 *   {
 *       tsr__shard *s = tsr_rpc_ctx_app(ctx);
 *       resp->current_version = ...;
 *       if (bad) return tsr_err(err, TSR_EINVAL, "ShardStatsRequest.x: ...");
 *       return 0;
 *   }
 *   static const tsr_rpc_method methods[] = {
 *       {"/tessera.v1.Shard/Stats", &tessera__v1__shard_stats_request__descriptor,
 *        &tessera__v1__shard_stats_response__descriptor, h_stats, NULL, 0, 0},
 *   };
 *   tsr_rpc_server_add_typed(srv, methods, 1, shard);
 *
 * OWNERSHIP (the contract of every typed handler)
 * - The request is the layer's: borrowed by the handler, valid until step 6, so the
 *   response may point into it (strings, arrays) without copying.
 * - The response struct is the layer's storage, valid until step 6. What the handler
 *   attaches to it (arrays, strings, sub-messages) is the handler's: it may point at
 *   static, request or reference-counted data, or at allocations that the method's
 *   resp_free releases. resp_free runs after packing and also after a failure, so it must
 *   accept a response the handler filled only in part (fields still at their init values;
 *   an unset string field points at the static protobuf_c_empty_string: a string the
 *   handler allocates is better released by a deferred cleanup).
 *   References the response borrows from (a version snapshot, a lock) are released by a
 *   deferred cleanup (tsr_rpc_ctx_defer), which runs after packing.
 * - A handler that returns an error leaves whatever it attached for resp_free / its
 *   cleanups: nothing is packed.
 *
 * THREADS: as rpc.h's raw handlers (TSR_RPC_LONG in flags for work that blocks). The
 * method table and ctx->app are borrowed for the server's life; handlers for one method
 * run concurrently.
 *
 * ASYNCHRONOUS REPLIES: a handler that answers later calls tsr_rpc_ctx_hold and returns;
 * whoever finishes (any thread) fills the response (tsr_rpc_ctx_resp) and calls
 * tsr_rpc_ctx_release, which runs steps 5 and 6 and sends the reply. After hold the
 * handler does not touch ctx, the request or the response again. Typed handlers do not
 * use tsr_rpc_reply_fanout (its done callback would answer after step 6): hold, then fan
 * out with tsr_rpc_server_fanout and release from its done.
 */
#ifndef TSR_RPC_TYPED_H
#define TSR_RPC_TYPED_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "core/error.h"
#include "net/rpc.h"

/* One call, as a typed handler sees it (owned by the layer). */
typedef struct tsr_rpc_ctx tsr_rpc_ctx;

/* A typed handler: rq and resp have the method's request and response types (write it
 * with TSR_RPC_HANDLER to get them typed). Returns 0, or a negative TSR code with err set
 * (the status is mapped from err->code, the message is err->msg). */
typedef int (*tsr_rpc_typed_fn)(tsr_rpc_ctx *ctx, const ProtobufCMessage *rq,
                                ProtobufCMessage *resp, tsr_error *err);

/* Defines a typed handler `name` whose body sees `const Req *rq` and `Resp *resp` (a thunk
 * converts from the generic tsr_rpc_typed_fn; `ctx` and `err` as there). */
#define TSR_RPC_HANDLER(name, Req, Resp)                                                    \
    static int name##_typed(tsr_rpc_ctx *ctx, const Req *rq, Resp *resp, tsr_error *err);  \
    static int name(tsr_rpc_ctx *ctx, const ProtobufCMessage *rq, ProtobufCMessage *resp,   \
                    tsr_error *err)                                                         \
    {                                                                                       \
        return name##_typed(ctx, (const Req *)(const void *)rq, (Resp *)(void *)resp, err); \
    }                                                                                       \
    static int name##_typed(tsr_rpc_ctx *ctx, const Req *rq, Resp *resp, tsr_error *err)

/* A typed method (static storage: borrowed for the server's life). */
typedef struct tsr_rpc_method {
    const char *path;                          /* "/pkg.Service/Method" */
    const ProtobufCMessageDescriptor *req;     /* request type */
    const ProtobufCMessageDescriptor *resp;    /* response type */
    tsr_rpc_typed_fn fn;
    /* Frees what fn attached to resp (not resp itself); NULL = nothing to free. */
    void (*resp_free)(void *resp);
    unsigned flags;     /* TSR_RPC_LONG */
    size_t max_request; /* bytes; 0 = no limit below the server's max_message */
} tsr_rpc_method;

/* Registers n typed methods with app (borrowed, returned by tsr_rpc_ctx_app). Only before
 * start. Returns 0 or TSR_EINVAL (a bad path or descriptor, a duplicate, after start). */
int tsr_rpc_server_add_typed(tsr_rpc_server *s, const tsr_rpc_method *m, size_t n, void *app);

/* ---- inside a typed handler (ctx is valid until the reply is sent) ---- */

void *tsr_rpc_ctx_app(const tsr_rpc_ctx *ctx);              /* the registration's app */
const tsr_rpc_method *tsr_rpc_ctx_method(const tsr_rpc_ctx *ctx);
/* The request as received (borrowed, valid as the request), e.g. to log it verbatim. */
const uint8_t *tsr_rpc_ctx_raw(const tsr_rpc_ctx *ctx, size_t *len);
/* Deadline and cancellation: as tsr_rpc_reply_remaining_ms / tsr_rpc_reply_cancelled. */
int64_t tsr_rpc_ctx_remaining_ms(const tsr_rpc_ctx *ctx);
int tsr_rpc_ctx_cancelled(const tsr_rpc_ctx *ctx);
/* The server that received the call (NULL for a detached call), for tsr_rpc_server_fanout. */
tsr_rpc_server *tsr_rpc_ctx_server(const tsr_rpc_ctx *ctx);
/* The underlying reply, for the raw API's helpers that set a status on it
 * (tsr_rpc_reply_error): a status set there stands (step 5). Not for packing. */
tsr_rpc_reply *tsr_rpc_ctx_reply(tsr_rpc_ctx *ctx);

/* Sets the status (code != OK) with a printf message, as tsr_rpc_reply_error; returns the
 * matching negative TSR code, so `return tsr_rpc_ctx_error(ctx, ...)` reads well. For the
 * statuses no TSR code maps to (INVALID_ARGUMENT from a TSR_EFORMAT, RESOURCE_EXHAUSTED
 * for memory, ABORTED ...). */
int tsr_rpc_ctx_error(tsr_rpc_ctx *ctx, int grpc_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Runs fn(arg) after the response is packed (or the call failed), last registered first.
 * At most 8 per call. Returns 0, or TSR_ELIMIT (then fn is not registered: clean up
 * yourself). */
#define TSR_RPC_MAX_DEFER 8
int tsr_rpc_ctx_defer(tsr_rpc_ctx *ctx, void (*fn)(void *), void *arg);

/* Replies with msg (of the method's response type) instead of resp: for a response built
 * elsewhere (a function that returns its own message). free_fn(msg) runs after packing,
 * as a deferred cleanup (NULL = msg stays the caller's). Returns 0, or TSR_EINVAL (another
 * type) / TSR_ELIMIT (no cleanup slot left), msg not taken. */
int tsr_rpc_ctx_set_resp(tsr_rpc_ctx *ctx, ProtobufCMessage *msg, void (*free_fn)(void *));

/* Replies with these bytes (taken: malloc'ed, freed with free()) instead of packing resp,
 * for a reply already serialized elsewhere. */
void tsr_rpc_ctx_reply_raw(tsr_rpc_ctx *ctx, uint8_t *buf, size_t len);

/* Asynchronous reply (file comment). hold: 0, or TSR_EINVAL / TSR_EUNAVAILABLE as
 * tsr_rpc_reply_hold (not held then). release: once, from any thread: rc and err as a
 * handler's return (err may be NULL). resp: the response to fill before release. */
int tsr_rpc_ctx_hold(tsr_rpc_ctx *ctx);
ProtobufCMessage *tsr_rpc_ctx_resp(tsr_rpc_ctx *ctx);
void tsr_rpc_ctx_release(tsr_rpc_ctx *ctx, int rc, const tsr_error *err);

/* 1 when a message of type d can contain itself (directly or through sub-messages), so its
 * nesting depth is chosen by the sender. */
int tsr_rpc_type_recursive(const ProtobufCMessageDescriptor *d);

#endif
