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
 * Ticking mode (the channel's streams_nowait, rpc.h): a thread blocked in
 * grpc_completion_queue_next is one of core's pollers, and under epoll1 the pollers hand
 * the polling over to each other on every event of the process: a watch waiting for
 * minutes was woken ~11 times per query of the coordinator (docs/performance.md
 * "Metadata backend"). In this mode pump() never blocks in core: it takes what has
 * completed without waiting (a zero deadline) and sleeps TICK_MS between looks, so the
 * server's pollers do the stream's I/O and the completions wait in the queue for the
 * next look (at most TICK_MS later). Two other ways were tried and dropped: a
 * GRPC_CQ_NON_POLLING queue aborts core 1.51 (polling_entity.cc "pollset != nullptr")
 * when a call on it must wait for a connection; a callback queue (completions signalled
 * to a condition variable) lost completions now and then in test_etcd (the watch never
 * saw an event again), cause not found.
 */
#include "net/rpc.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "core/clock.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/rpc_int.h"

#define TICK_MS 10

enum { OP_OPEN, OP_STATUS, OP_SEND, OP_RECV, OP_N };

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
    int tick;                   /* ticking mode: pump never blocks in core */
};

/* Takes every completion that is ready, without waiting. */
static void take_ready(tsr_rpc_stream *st)
{
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(st->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC),
                                                   NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return;
        TSR_TSAN_ACQUIRE(ev.tag);
        *(int *)ev.tag = 1;
    }
}

/* Ticking mode's pump: looks every TICK_MS until done[which] or timeout_ms (< 0: none). */
static int pump_ticking(tsr_rpc_stream *st, int which, int64_t timeout_ms)
{
    int64_t end = timeout_ms < 0 ? INT64_MAX : tsr_clock_mono_ms() + timeout_ms;
    for (;;) {
        take_ready(st);
        if (st->done[which])
            return 1;
        int64_t left = end - tsr_clock_mono_ms();
        if (left <= 0)
            return 0;
        int64_t ms = left < TICK_MS ? left : TICK_MS;
        struct timespec ts = {0, (long)ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Waits until st->done[which] or timeout_ms (< 0 = no limit). Returns 1 when done. */
static int pump(tsr_rpc_stream *st, int which, int64_t timeout_ms)
{
    if (st->tick)
        return pump_ticking(st, which, timeout_ms);
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
    st->done[which] = 0;
    TSR_TSAN_RELEASE(&st->done[which]);
    if (grpc_call_start_batch(st->call, ops, n, &st->done[which], NULL) != GRPC_CALL_OK) {
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
    st->cq = grpc_completion_queue_create_for_next(NULL);
    const char *poll = tsr_test_knob(TSR_KNOB_RPC_STREAM_POLL); /* "1": blocking waits (benchmarks) */
    st->tick = ch->streams_nowait && !(poll && strcmp(poll, "1") == 0);
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
    if (st->done[OP_STATUS])
        return ended(st, err);
    if (st->started[OP_SEND] && !st->done[OP_SEND])
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
    if (st->done[OP_STATUS])
        return ended(st, err);
    return 0;
}

int tsr_rpc_stream_recv(tsr_rpc_stream *st, int64_t timeout_ms, uint8_t **msg, size_t *len,
                        tsr_error *err)
{
    *msg = NULL;
    *len = 0;
    if (!st->started[OP_RECV] || st->done[OP_RECV]) {
        if (st->done[OP_STATUS] && !st->started[OP_RECV])
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
    while (grpc_completion_queue_next(st->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
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
    free(st);
}
