/*
 * rpc_typed — typed unary handlers (API and contract in rpc_typed.h): one raw handler,
 * typed_call, serves every typed method; its ctx is the method's binding (method + app),
 * kept in the server's method table (tsr__rpc_server_add_bound).
 *
 * DESIGN: a call's context and its response storage are one allocation, made after the
 * size check and the request's unpack succeed. A held call (tsr_rpc_ctx_hold) is finished
 * by tsr_rpc_ctx_release, possibly on another thread and possibly before the handler has
 * returned; `refs` (2 at the hold: the handler's return and the release) decides who frees
 * the context, as rpc_server.c does for the reply itself. Nothing here takes a lock.
 */
#include "net/rpc_typed.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "net/rpc_int.h"

struct tsr_rpc_ctx {
    const tsr_rpc_method *m;
    void *app;
    tsr_rpc_reply *reply;
    const uint8_t *raw;
    size_t raw_len;
    ProtobufCMessage *rq;
    ProtobufCMessage *resp; /* points into this allocation (after the struct) */
    ProtobufCMessage *own;  /* tsr_rpc_ctx_set_resp: packed instead of resp */
    uint8_t *raw_reply;     /* tsr_rpc_ctx_reply_raw; NULL = pack resp */
    size_t raw_reply_len;
    int raw_reply_set;
    atomic_int refs; /* 0 = not held; see DESIGN */
    tsr_error err;
    size_t ndefer;
    struct {
        void (*fn)(void *);
        void *arg;
    } defer[TSR_RPC_MAX_DEFER];
};

/* ------------------------------------------------------------------ registration -- */

/* Depth-first walk of message fields from d; 1 when a type on the path is met again. */
static int reaches(const ProtobufCMessageDescriptor *d, const ProtobufCMessageDescriptor **path,
                   size_t depth)
{
    for (size_t i = 0; i < depth; i++)
        if (path[i] == d)
            return 1;
    if (depth >= 64) /* deeper than any real schema: treat as recursive (checked) */
        return 1;
    path[depth] = d;
    for (unsigned f = 0; f < d->n_fields; f++)
        if (d->fields[f].type == PROTOBUF_C_TYPE_MESSAGE &&
            reaches(d->fields[f].descriptor, path, depth + 1))
            return 1;
    return 0;
}

int tsr_rpc_type_recursive(const ProtobufCMessageDescriptor *d)
{
    const ProtobufCMessageDescriptor *path[64];
    return reaches(d, path, 0);
}

static int typed_call(void *bctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply);

int tsr_rpc_server_add_typed(tsr_rpc_server *s, const tsr_rpc_method *m, size_t n, void *app)
{
    for (size_t i = 0; i < n; i++) {
        if (!m[i].path || !m[i].fn || !m[i].req || !m[i].resp ||
            m[i].req->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC ||
            m[i].resp->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
            return TSR_EINVAL;
        struct tsr__rpc_binding b = {.m = &m[i], .app = app};
        const ProtobufCMessageDescriptor *deep = tsr_rpc_type_recursive(m[i].req) ? m[i].req
                                                                                  : NULL;
        int rc = tsr__rpc_server_add_bound(s, m[i].path, typed_call, &b, m[i].flags, deep);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------- calls -- */

/* Steps 5 and 6 of rpc_typed.h: the status and response, then everything freed but ctx. */
static int finish(tsr_rpc_ctx *c, int rc, const tsr_error *err)
{
    tsr_rpc_reply *r = c->reply;
    int code = tsr__rpc_reply_code(r);
    if (rc == 0 && code != TSR_RPC_OK) { /* a status set with tsr_rpc_ctx_error stands */
        rc = tsr_rpc_error_from_status(code);
    } else if (rc == 0) {
        if (c->raw_reply_set) {
            tsr_rpc_reply_set(r, c->raw_reply, c->raw_reply_len);
            c->raw_reply = NULL;
        } else {
            rc = tsr_rpc_reply_pack(r, c->own ? c->own : c->resp);
        }
    } else if (code == TSR_RPC_OK) {
        if (err && err->code < 0)
            rc = tsr_rpc_reply_from_error(r, err);
        else
            rc = tsr_rpc_reply_error(r, tsr_rpc_status_from_error(rc), "%s: %s",
                                     c->m->req->short_name, tsr_strerror(rc));
    }
    free(c->raw_reply);
    if (c->m->resp_free)
        c->m->resp_free(c->resp);
    while (c->ndefer > 0) {
        c->ndefer--;
        c->defer[c->ndefer].fn(c->defer[c->ndefer].arg);
    }
    protobuf_c_message_free_unpacked(c->rq, NULL);
    c->rq = NULL;
    return rc;
}

static int typed_call(void *bctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    const struct tsr__rpc_binding *b = bctx;
    const tsr_rpc_method *m = b->m;
    if (m->max_request && len > m->max_request)
        return tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED,
                                   "%s: request of %zu bytes exceeds the limit of %zu bytes",
                                   m->req->short_name, len, m->max_request);
    ProtobufCMessage *rq = protobuf_c_message_unpack(m->req, NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT, "%s: malformed protobuf",
                                   m->req->short_name);
    size_t head = (sizeof(tsr_rpc_ctx) + 15) & ~(size_t)15;
    tsr_rpc_ctx *c = tsr_try_calloc(1, head + m->resp->sizeof_message);
    if (!c) {
        protobuf_c_message_free_unpacked(rq, NULL);
        return tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "%s: out of memory",
                                   m->req->short_name);
    }
    c->m = m;
    c->app = b->app;
    c->reply = reply;
    c->raw = req;
    c->raw_len = len;
    c->rq = rq;
    c->resp = (ProtobufCMessage *)(void *)((uint8_t *)c + head);
    protobuf_c_message_init(m->resp, c->resp);
    atomic_init(&c->refs, 0);
    int rc = m->fn(c, rq, c->resp, &c->err);
    if (atomic_load(&c->refs)) { /* held: the release finishes; the last of us frees */
        if (atomic_fetch_sub(&c->refs, 1) == 1)
            free(c);
        return 0;
    }
    rc = finish(c, rc, &c->err);
    free(c);
    return rc;
}

void *tsr_rpc_ctx_app(const tsr_rpc_ctx *ctx)
{
    return ctx->app;
}

const tsr_rpc_method *tsr_rpc_ctx_method(const tsr_rpc_ctx *ctx)
{
    return ctx->m;
}

const uint8_t *tsr_rpc_ctx_raw(const tsr_rpc_ctx *ctx, size_t *len)
{
    *len = ctx->raw_len;
    return ctx->raw;
}

int64_t tsr_rpc_ctx_remaining_ms(const tsr_rpc_ctx *ctx)
{
    return tsr_rpc_reply_remaining_ms(ctx->reply);
}

int tsr_rpc_ctx_cancelled(const tsr_rpc_ctx *ctx)
{
    return tsr_rpc_reply_cancelled(ctx->reply);
}

tsr_rpc_server *tsr_rpc_ctx_server(const tsr_rpc_ctx *ctx)
{
    return tsr_rpc_reply_server(ctx->reply);
}

tsr_rpc_reply *tsr_rpc_ctx_reply(tsr_rpc_ctx *ctx)
{
    return ctx->reply;
}

int tsr_rpc_ctx_error(tsr_rpc_ctx *ctx, int grpc_code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tsr__rpc_reply_verror(ctx->reply, grpc_code, fmt, ap);
    va_end(ap);
    return rc;
}

int tsr_rpc_ctx_defer(tsr_rpc_ctx *ctx, void (*fn)(void *), void *arg)
{
    if (ctx->ndefer >= TSR_RPC_MAX_DEFER)
        return TSR_ELIMIT;
    ctx->defer[ctx->ndefer].fn = fn;
    ctx->defer[ctx->ndefer].arg = arg;
    ctx->ndefer++;
    return 0;
}

int tsr_rpc_ctx_set_resp(tsr_rpc_ctx *ctx, ProtobufCMessage *msg, void (*free_fn)(void *))
{
    if (!msg || msg->descriptor != ctx->m->resp)
        return TSR_EINVAL;
    if (free_fn && tsr_rpc_ctx_defer(ctx, free_fn, msg) != 0)
        return TSR_ELIMIT;
    ctx->own = msg;
    return 0;
}

void tsr_rpc_ctx_reply_raw(tsr_rpc_ctx *ctx, uint8_t *buf, size_t len)
{
    free(ctx->raw_reply);
    ctx->raw_reply = buf;
    ctx->raw_reply_len = len;
    ctx->raw_reply_set = 1;
}

int tsr_rpc_ctx_hold(tsr_rpc_ctx *ctx)
{
    int rc = tsr_rpc_reply_hold(ctx->reply);
    if (rc == 0)
        atomic_store(&ctx->refs, 2);
    return rc;
}

ProtobufCMessage *tsr_rpc_ctx_resp(tsr_rpc_ctx *ctx)
{
    return ctx->resp;
}

void tsr_rpc_ctx_release(tsr_rpc_ctx *ctx, int rc, const tsr_error *err)
{
    tsr_rpc_reply *r = ctx->reply;
    rc = finish(ctx, rc, err);
    if (atomic_fetch_sub(&ctx->refs, 1) == 1)
        free(ctx);
    tsr_rpc_reply_release(r, rc);
}

/* ---------------------------------------------------------------- detached calls -- */

int tsr__rpc_run_typed_detached(const tsr_rpc_method *m, void *app, const uint8_t *req,
                                size_t len, tsr__rpc_detached *out)
{
    struct tsr__rpc_binding b = {.m = m, .app = app};
    return tsr__rpc_run_detached(m->path, typed_call, &b,
                                 tsr_rpc_type_recursive(m->req) ? m->req : NULL, req, len, out);
}
