/*
 * rpc_stream — streaming client calls on gRPC C core (API in rpc.h, "streaming calls").
 *
 * A unary call is one batch of six ops (rpc_client.c). A stream keeps its call open and
 * runs its ops as separate batches on a completion queue of its own:
 *   open   SEND_INITIAL_METADATA (with the channel's bearer token), and at once
 *          RECV_STATUS_ON_CLIENT, which completes when the call ends (either side, a
 *          deadline, a cancel) and carries the status;
 *   send   SEND_MESSAGE, waited for;
 *   recv   RECV_MESSAGE (the first one with RECV_INITIAL_METADATA), which may stay pending
 *          across calls: a receive that timed out is still the one the next call waits for,
 *          so a message is never lost between two waits;
 *   close  grpc_call_cancel, then the queue is pumped until every started batch has come
 *          back — core owns the buffers of a pending batch until then — and destroyed.
 * Core allows one batch of each kind in flight, which the one-user rule guarantees.
 *
 * DESIGN: a batch's tag is the address of its `done` flag in the stream; pump() waits on
 * the queue with grpc_completion_queue_next until a given flag is set or the timeout
 * passes, setting whatever flags complete meanwhile. No locks: a stream has one user.
 *
 * Callback mode (the channel's streams_nonpolling, rpc.h): a user thread that waits in
 * grpc_completion_queue_next is one of core's pollers, and under epoll1 pollers hand the
 * polling over to each other on every event of the process: a watch waiting for minutes
 * was woken ~11 times per query of the server (docs/performance.md "Metadata backend").
 * Then the queue is a callback queue that no thread polls (the server's pollers drive the
 * connection: epoll1 polls every fd from any poller); a batch's tag is a functor that sets
 * its `done` flag under mu and signals cv, and pump() waits on cv. (A GRPC_CQ_NON_POLLING
 * queue would do the same but aborts core — polling_entity.cc "pollset != nullptr" — when
 * a call on it has to wait for a connection.)
 */
#include "net/rpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "core/clock.h"
#include "core/mem.h"
#include "net/rpc_int.h"

enum { OP_OPEN, OP_STATUS, OP_SEND, OP_RECV, OP_N };

/* Callback mode: the tag of batch `which` (OP_N: the queue's shutdown). */
typedef struct op_fn {
    grpc_completion_queue_functor f; /* first: core passes &f */
    struct tsr_rpc_stream *st;
    int which;
} op_fn;

struct tsr_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    int started[OP_N];          /* a batch of that kind was started ... */
    int done[OP_N];             /* ... and has come back */
    grpc_metadata_array init_md, trail_md;
    int init_md_asked;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    /* callback mode only: done[] and shut are written by core's threads under mu */
    int cb;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC */
    op_fn fn[OP_N + 1];
    int shut;                   /* the queue's shutdown has completed */
};

/* Core's completion of a batch (or of the shutdown) of a callback-mode stream. */
static void on_done(grpc_completion_queue_functor *f, int ok)
{
    (void)ok; /* as in polling mode: the outcome is in the received status */
    op_fn *o = (op_fn *)f;
    tsr_rpc_stream *st = o->st;
    pthread_mutex_lock(&st->mu);
    if (o->which == OP_N)
        st->shut = 1;
    else
        st->done[o->which] = 1;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static int is_done(tsr_rpc_stream *st, int which)
{
    if (!st->cb)
        return st->done[which];
    pthread_mutex_lock(&st->mu);
    int d = st->done[which];
    pthread_mutex_unlock(&st->mu);
    return d;
}

/* Callback mode: waits on cv until *flag or timeout_ms (< 0 = no limit). */
static int cb_wait(tsr_rpc_stream *st, int *flag, int64_t timeout_ms)
{
    struct timespec ts = tsr_clock_mono_timespec(timeout_ms ? timeout_ms : 1);
    pthread_mutex_lock(&st->mu);
    while (!*flag) {
        if (timeout_ms < 0)
            pthread_cond_wait(&st->cv, &st->mu);
        else if (pthread_cond_timedwait(&st->cv, &st->mu, &ts) == ETIMEDOUT)
            break;
    }
    int d = *flag;
    pthread_mutex_unlock(&st->mu);
    return d;
}

/* Waits until st->done[which] or timeout_ms (< 0 = no limit). Returns 1 when done. */
static int pump(tsr_rpc_stream *st, int which, int64_t timeout_ms)
{
    if (st->cb)
        return cb_wait(st, &st->done[which], timeout_ms);
    gpr_timespec dl = timeout_ms < 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                                     : tsr__rpc_deadline(timeout_ms ? timeout_ms : 1);
    while (!st->done[which]) {
        grpc_event ev = grpc_completion_queue_next(st->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            return 0;
        if (ev.type == GRPC_OP_COMPLETE) {
            TSR_TSAN_ACQUIRE(ev.tag);
            *(int *)ev.tag = 1;
        } else if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            return 0;
        }
    }
    return 1;
}

static int start(tsr_rpc_stream *st, int which, grpc_op *ops, size_t n)
{
    st->started[which] = 1;
    if (st->cb) {
        pthread_mutex_lock(&st->mu);
        st->done[which] = 0;
        pthread_mutex_unlock(&st->mu);
    } else {
        st->done[which] = 0;
        TSR_TSAN_RELEASE(&st->done[which]);
    }
    void *tag = st->cb ? (void *)&st->fn[which].f : (void *)&st->done[which];
    if (grpc_call_start_batch(st->call, ops, n, tag, NULL) != GRPC_CALL_OK) {
        st->started[which] = 0;
        return -1;
    }
    return 0;
}

/* The error of an ended call: its status and details. */
static int ended(tsr_rpc_stream *st, tsr_error *err)
{
    int code = (int)st->status;
    size_t n = GRPC_SLICE_LENGTH(st->details);
    if (n > TSR_RPC_MAX_STATUS_MESSAGE)
        n = TSR_RPC_MAX_STATUS_MESSAGE;
    int rc = code == TSR_RPC_OK ? TSR_EUNAVAILABLE : tsr_rpc_error_from_status(code);
    return tsr_err(err, rc, "%s: %.*s", code == TSR_RPC_OK ? "stream ended by the peer"
                                                          : tsr_rpc_code_name(code),
                   (int)n, (const char *)GRPC_SLICE_START_PTR(st->details));
}

tsr_rpc_stream *tsr_rpc_stream_open(tsr_rpc_channel *ch, const char *method, int64_t life_ms,
                                    tsr_error *err)
{
    tsr_rpc_stream *st = tsr_xcalloc(1, sizeof *st);
    grpc_metadata_array_init(&st->init_md);
    grpc_metadata_array_init(&st->trail_md);
    st->details = grpc_empty_slice();
    const char *poll = getenv("TSR_RPC_STREAM_POLL"); /* "1": polling mode (benchmarks) */
    st->cb = ch->streams_nonpolling && !(poll && strcmp(poll, "1") == 0);
    if (st->cb) {
        pthread_mutex_init(&st->mu, NULL);
        tsr_clock_cond_init(&st->cv);
        for (int k = 0; k <= OP_N; k++) {
            st->fn[k].f.functor_run = on_done;
            st->fn[k].st = st;
            st->fn[k].which = k;
        }
        st->cq = grpc_completion_queue_create_for_callback(&st->fn[OP_N].f, NULL);
    } else {
        st->cq = grpc_completion_queue_create_for_next(NULL);
    }
    grpc_slice path = grpc_slice_from_copied_string(method);
    st->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, st->cq, path,
                                        NULL, life_ms > 0 ? tsr__rpc_deadline(life_ms)
                                                          : gpr_inf_future(GPR_CLOCK_REALTIME),
                                        NULL);
    grpc_slice_unref(path);
    if (!st->call)
        goto fail;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    if (ch->auth) {
        op.data.send_initial_metadata.count = 1;
        op.data.send_initial_metadata.metadata = &ch->auth_md;
    }
    if (start(st, OP_OPEN, &op, 1))
        goto fail;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &st->trail_md;
    op.data.recv_status_on_client.status = &st->status;
    op.data.recv_status_on_client.status_details = &st->details;
    op.data.recv_status_on_client.error_string = &st->error_string;
    if (start(st, OP_STATUS, &op, 1))
        goto fail;
    return st;
fail:
    tsr_err(err, TSR_EIO, "%s: gRPC core refused to start the call", method);
    tsr_rpc_stream_close(st);
    return NULL;
}

int tsr_rpc_stream_send(tsr_rpc_stream *st, const void *msg, size_t len, int64_t timeout_ms,
                        tsr_error *err)
{
    if (is_done(st, OP_STATUS))
        return ended(st, err);
    if (st->started[OP_SEND] && !is_done(st, OP_SEND))
        return tsr_err(err, TSR_ETIMEOUT, "an earlier send has not completed");
    if (st->send)
        grpc_byte_buffer_destroy(st->send);
    grpc_slice body = len ? grpc_slice_from_copied_buffer(msg, len) : grpc_empty_slice();
    st->send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = st->send;
    if (start(st, OP_SEND, &op, 1))
        return tsr_err(err, TSR_EIO, "gRPC core refused the send");
    if (!pump(st, OP_SEND, timeout_ms))
        return tsr_err(err, TSR_ETIMEOUT, "send not taken within %lld ms",
                       (long long)timeout_ms);
    if (is_done(st, OP_STATUS))
        return ended(st, err);
    return 0;
}

int tsr_rpc_stream_recv(tsr_rpc_stream *st, int64_t timeout_ms, uint8_t **msg, size_t *len,
                        tsr_error *err)
{
    *msg = NULL;
    *len = 0;
    if (!st->started[OP_RECV] || is_done(st, OP_RECV)) {
        if (is_done(st, OP_STATUS) && !st->started[OP_RECV])
            return ended(st, err);
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        size_t n = 0;
        if (!st->init_md_asked) {
            ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
            ops[n++].data.recv_initial_metadata.recv_initial_metadata = &st->init_md;
            st->init_md_asked = 1;
        }
        ops[n].op = GRPC_OP_RECV_MESSAGE;
        ops[n++].data.recv_message.recv_message = &st->recv;
        if (start(st, OP_RECV, ops, n))
            return tsr_err(err, TSR_EIO, "gRPC core refused the receive");
    }
    if (!pump(st, OP_RECV, timeout_ms))
        return tsr_err(err, TSR_ETIMEOUT, "no message within %lld ms", (long long)timeout_ms);
    /* this receive has been consumed: the next call starts another one */
    st->started[OP_RECV] = 0;
    if (!st->recv) {
        pump(st, OP_STATUS, 5000); /* end of stream: the status follows */
        return ended(st, err);
    }
    grpc_slice s = tsr__rpc_buffer_to_slice(st->recv);
    grpc_byte_buffer_destroy(st->recv);
    st->recv = NULL;
    size_t n = GRPC_SLICE_LENGTH(s);
    if (n) {
        *msg = tsr_try_malloc(n, 1);
        if (!*msg) {
            grpc_slice_unref(s);
            return tsr_err(err, TSR_ENOMEM, "out of memory for a %zu-byte message", n);
        }
        memcpy(*msg, GRPC_SLICE_START_PTR(s), n);
        *len = n;
    }
    grpc_slice_unref(s);
    return 0;
}

void tsr_rpc_stream_close(tsr_rpc_stream *st)
{
    if (!st)
        return;
    if (st->call) {
        grpc_call_cancel(st->call, NULL);
        for (int k = 0; k < OP_N; k++)
            if (st->started[k])
                pump(st, k, -1);
    }
    grpc_completion_queue_shutdown(st->cq);
    if (st->cb)
        cb_wait(st, &st->shut, -1);
    else
        while (grpc_completion_queue_next(st->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                          NULL).type != GRPC_QUEUE_SHUTDOWN)
            ;
    if (st->call)
        grpc_call_unref(st->call);
    grpc_completion_queue_destroy(st->cq);
    if (st->send)
        grpc_byte_buffer_destroy(st->send);
    if (st->recv)
        grpc_byte_buffer_destroy(st->recv);
    grpc_metadata_array_destroy(&st->init_md);
    grpc_metadata_array_destroy(&st->trail_md);
    grpc_slice_unref(st->details);
    if (st->error_string)
        gpr_free((void *)st->error_string);
    if (st->cb) {
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
    }
    free(st);
}
