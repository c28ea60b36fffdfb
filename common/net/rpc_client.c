/*
 * rpc_client — unary gRPC client on gRPC C core 1.51 (API in rpc.h): channels with
 * keepalive and a reconnect backoff of at least 1 s, one process-wide connectivity
 * watcher, unary calls with deadlines and fan-out of N calls on one completion queue.
 *
 * Call sequence (GRPC_C_CORE.md "Client call sequence"): grpc_channel_create_call on a
 * completion queue taken from a small pool (creating and destroying one per call costs a
 * pollset each time), one batch of six ops (SEND_INITIAL_METADATA, SEND_MESSAGE,
 * SEND_CLOSE_FROM_CLIENT, RECV_INITIAL_METADATA, RECV_MESSAGE, RECV_STATUS_ON_CLIENT); the
 * batch event always succeeds and the outcome is the received status. The request bytes
 * are sent from the caller's buffer without a copy (a static slice): the call is unreffed
 * before tsr_rpc_fanout returns, so core never holds it longer than the caller keeps the
 * buffer. tsr__ccall_start/finish (rpc_int.h) are shared with the server's
 * asynchronous fan-out.
 *
 * DESIGN (watcher thread, queue pool)
 * - Idle channels are not polled by anyone, so a restarted peer would be noticed only at
 *   core's 5 s backup poll. One thread per process (started with the first watched
 *   channel, stopped with the last) calls grpc_channel_check_connectivity_state(ch, 1) on
 *   every channel every WATCH_PERIOD_MS, which keeps idle channels connecting; for a
 *   channel in TRANSIENT_FAILURE it also resets the reconnect backoff every
 *   FAST_RECONNECT_MS, so a restarted peer is found in ~0.1–0.3 s instead of after the
 *   1–2 s backoff. It does not wait in a completion queue: a thread blocked in
 *   grpc_completion_queue_next joins gRPC's rotation of polling threads (epoll1 hands
 *   the one epoll set to another waiting thread on every event, with a wake-up), which
 *   cost every call of the process a wake of the watcher. Sockets are read by whoever
 *   polls: a server's polling threads, a caller waiting for its call; when neither
 *   exists (no server in the process: tsr__rpc_pollers_running == 0) the watcher makes
 *   one zero-timeout poll per period, so a connect that finished is still processed.
 * - W.life_mu serializes the thread's start and stop (watcher_add / _remove); W.mu guards
 *   the channel list and the stop flag. The watcher touches a channel's grpc_channel only
 *   under W.mu and only while it is on the list; destroy unlinks it under W.mu first.
 *   Lock order: life_mu, then mu; P.mu (the queue pool) is taken alone.
 */
#include "net/rpc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "core/log.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/rpc_int.h"

#define WATCH_PERIOD_MS 100
#define FAST_RECONNECT_MS 200
#define CQ_POOL_MAX 64


static struct {
    pthread_mutex_t life_mu; /* the thread's lifetime: held by watcher_add/remove */
    pthread_mutex_t mu;      /* the channel list and stop */
    pthread_cond_t cv;       /* stop requested */
    grpc_completion_queue *cq; /* polling queue for the zero-timeout polls; never has ops */
    pthread_t thread;
    int running, stop;
    struct tsr_rpc_channel *head;
    int nchannels;
} W = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL,
       0, 0, 0, NULL, 0};

/* ------------------------------------------------------------ queue pool -- */

static struct {
    pthread_mutex_t mu;
    grpc_completion_queue *q[CQ_POOL_MAX];
    int n;
    int off;       /* TSR_RPC_CQ_POOL=0: a queue per call, as before (for A/B) */
    long channels; /* alive; the pool is drained when the last one goes */
} P = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, -1, 0};

static grpc_completion_queue *cq_get(void)
{
    pthread_mutex_lock(&P.mu);
    if (P.off < 0) {
        const char *e = tsr_test_knob(TSR_KNOB_RPC_CQ_POOL);
        P.off = e && strcmp(e, "0") == 0;
    }
    grpc_completion_queue *cq = P.n ? P.q[--P.n] : NULL;
    pthread_mutex_unlock(&P.mu);
    return cq ? cq : grpc_completion_queue_create_for_next(NULL);
}

static void cq_drain_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

static void cq_put(grpc_completion_queue *cq)
{
    pthread_mutex_lock(&P.mu);
    if (!P.off && P.n < CQ_POOL_MAX) {
        P.q[P.n++] = cq;
        cq = NULL;
    }
    pthread_mutex_unlock(&P.mu);
    if (cq)
        cq_drain_destroy(cq);
}

static void pool_channel_added(void)
{
    pthread_mutex_lock(&P.mu);
    P.channels++;
    pthread_mutex_unlock(&P.mu);
}

/* The last channel going means no call can run: destroy the pooled queues (each needs
 * gRPC initialized, and the channels hold the grpc_init references). */
static void pool_channel_removed(void)
{
    pthread_mutex_lock(&P.mu);
    if (--P.channels == 0)
        while (P.n > 0)
            cq_drain_destroy(P.q[--P.n]);
    pthread_mutex_unlock(&P.mu);
}

/* ------------------------------------------------------------------------ watcher -- */

/* W.mu held. */
static void watch_tick(struct tsr_rpc_channel *ch, gpr_timespec now)
{
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch->ch, 1);
    if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && ch->fast_reconnect &&
        gpr_time_to_millis(gpr_time_sub(now, ch->last_reset)) >= FAST_RECONNECT_MS) {
        /* Retry a failed peer every FAST_RECONNECT_MS instead of waiting out the backoff
         * (>= 1 s): a refused connect costs one SYN/RST, and a restarted shard is back in
         * service sooner. The connect timeout stays at min_reconnect_backoff_ms. */
        grpc_channel_reset_connect_backoff(ch->ch);
        ch->last_reset = now;
    }
}

static void *watcher_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&W.mu);
    while (!W.stop) {
        gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
        for (struct tsr_rpc_channel *ch = W.head; ch; ch = ch->next)
            watch_tick(ch, now);
        int poll = atomic_load(&tsr__rpc_pollers_running) == 0;
        pthread_mutex_unlock(&W.mu);
        /* Without a server in the process nobody else polls between calls: one
         * zero-timeout poll runs what the sockets have ready (a connect that finished). */
        if (poll)
            grpc_completion_queue_next(W.cq, gpr_now(GPR_CLOCK_MONOTONIC), NULL);
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += (long)WATCH_PERIOD_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&W.mu);
        while (!W.stop && pthread_cond_timedwait(&W.cv, &W.mu, &dl) == 0)
            ;
    }
    pthread_mutex_unlock(&W.mu);
    return NULL;
}

static void watcher_add(struct tsr_rpc_channel *ch)
{
    pthread_mutex_lock(&W.life_mu);
    if (!W.running) {
        grpc_init(); /* the watcher's own reference, released when it stops */
        W.cq = grpc_completion_queue_create_for_next(NULL);
        W.stop = 0;
        pthread_attr_t at;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_destroy(&W.cv);
        pthread_cond_init(&W.cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_attr_init(&at);
        int e = pthread_create(&W.thread, &at, watcher_main, NULL);
        pthread_attr_destroy(&at);
        if (e != 0) {
            cq_drain_destroy(W.cq);
            W.cq = NULL;
            grpc_shutdown();
            pthread_mutex_unlock(&W.life_mu);
            tsr_warn("rpc: cannot start the connectivity watcher; %s is not watched",
                     ch->target);
            return;
        }
        W.running = 1;
    }
    pthread_mutex_lock(&W.mu);
    W.nchannels++;
    ch->watched = 1;
    ch->prev = NULL;
    ch->next = W.head;
    if (W.head)
        W.head->prev = ch;
    W.head = ch;
    watch_tick(ch, gpr_now(GPR_CLOCK_MONOTONIC));
    pthread_mutex_unlock(&W.mu);
    pthread_mutex_unlock(&W.life_mu);
}

/* Unregisters ch and destroys ch->ch. */
static void watcher_remove_and_destroy(struct tsr_rpc_channel *ch)
{
    pthread_mutex_lock(&W.life_mu);
    pthread_mutex_lock(&W.mu);
    if (ch->prev)
        ch->prev->next = ch->next;
    else
        W.head = ch->next;
    if (ch->next)
        ch->next->prev = ch->prev;
    int last = --W.nchannels == 0;
    if (last) {
        W.stop = 1;
        pthread_cond_broadcast(&W.cv);
    }
    pthread_mutex_unlock(&W.mu);
    /* the watcher touches channels only under W.mu, through the list: ch is out of it */
    grpc_channel_destroy(ch->ch);
    ch->ch = NULL;
    if (last) {
        pthread_join(W.thread, NULL);
        cq_drain_destroy(W.cq);
        W.cq = NULL;
        W.running = 0;
        grpc_shutdown();
    }
    pthread_mutex_unlock(&W.life_mu);
}

/* ------------------------------------------------------------------------ channel -- */

void tsr_rpc_client_opts_init(tsr_rpc_client_opts *o)
{
    memset(o, 0, sizeof *o);
}

static grpc_channel_credentials *client_creds(const tsr_rpc_client_opts *o, tsr_error *err)
{
    if (!o->tls_ca_file) {
        if (o->tls_cert_file || o->tls_key_file) {
            tsr_err(err, TSR_EINVAL, "client TLS certificate given without tls_ca_file");
            return NULL;
        }
        return grpc_insecure_credentials_create();
    }
    if (!o->tls_cert_file != !o->tls_key_file) {
        tsr_err(err, TSR_EINVAL, "client TLS needs both tls_cert_file and tls_key_file");
        return NULL;
    }
    grpc_channel_credentials *creds = NULL;
    char *ca = NULL, *cert = NULL, *key = NULL;
    if (!(ca = tsr__rpc_read_file(o->tls_ca_file, "tls_ca_file", err)))
        goto out;
    if (o->tls_cert_file) {
        if (!(cert = tsr__rpc_read_file(o->tls_cert_file, "tls_cert_file", err)))
            goto out;
        if (!(key = tsr__rpc_read_file(o->tls_key_file, "tls_key_file", err)))
            goto out;
    }
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    creds = grpc_ssl_credentials_create_ex(ca, cert ? &pair : NULL, NULL, NULL);
    if (!creds)
        tsr_err(err, TSR_EINVAL, "TLS client credentials rejected (%s)", o->tls_ca_file);
out:
    free(ca);
    free(cert);
    free(key);
    return creds;
}

tsr_rpc_channel *tsr_rpc_channel_create(const char *target, const tsr_rpc_client_opts *opts,
                                        tsr_error *err)
{
    tsr_rpc_client_opts def;
    if (!opts) {
        tsr_rpc_client_opts_init(&def);
        opts = &def;
    }
    if (!target || !*target) {
        tsr_err(err, TSR_EINVAL, "rpc channel: empty target");
        return NULL;
    }
    size_t maxmsg = opts->max_message ? opts->max_message : TSR_RPC_DEFAULT_MAX_MESSAGE;
    if (maxmsg > INT32_MAX)
        maxmsg = INT32_MAX;
    int ka = opts->keepalive_ms == 0 ? 5000 : opts->keepalive_ms;
    int ka_to = opts->keepalive_timeout_ms > 0 ? opts->keepalive_timeout_ms : 3000;
    int minb = opts->min_reconnect_backoff_ms < 1000 ? 1000 : opts->min_reconnect_backoff_ms;
    int maxb = opts->max_reconnect_backoff_ms > 0 ? opts->max_reconnect_backoff_ms : 2000;
    if (maxb < minb)
        maxb = minb;

    grpc_init();
    grpc_channel_credentials *creds = client_creds(opts, err);
    if (!creds) {
        grpc_shutdown();
        return NULL;
    }
    grpc_arg args[16];
    size_t na = 0;
#define IARG(k, v) args[na++] = (grpc_arg){GRPC_ARG_INTEGER, (char *)(k), {.integer = (v)}}
    IARG(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)maxmsg);
    IARG(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)maxmsg);
    if (ka > 0) {
        IARG(GRPC_ARG_KEEPALIVE_TIME_MS, ka);
        IARG(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ka_to);
        IARG(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
        IARG(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    IARG(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, minb);
    IARG(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, minb);
    IARG(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, maxb);
    /* No gRPC retries: rpc sets no retry policy, and callers fail over themselves (the
     * coordinator's replicas); the retry machinery still costs every call ~7-13 % CPU
     * (bench_rpc --chain under perf stat). TSR_RPC_RETRIES=1 turns it back on. */
    {
        const char *e = tsr_test_knob(TSR_KNOB_RPC_RETRIES);
        if (!(e && strcmp(e, "1") == 0))
            IARG(GRPC_ARG_ENABLE_RETRIES, 0);
    }
#undef IARG
    if (opts->tls_ca_file && opts->tls_server_name)
        args[na++] = (grpc_arg){GRPC_ARG_STRING, (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
                                {.string = (char *)opts->tls_server_name}};
    grpc_channel_args ch_args = {na, args};

    struct tsr_rpc_channel *ch = tsr_xcalloc(1, sizeof *ch);
    ch->target = tsr_xstrdup(target);
    ch->ch = grpc_channel_create(target, creds, &ch_args);
    grpc_channel_credentials_release(creds);
    if (!ch->ch) { /* core returns a lame channel rather than NULL, but be safe */
        tsr_err(err, TSR_EINVAL, "rpc channel: cannot create a channel to %s", target);
        free(ch->target);
        free(ch);
        grpc_shutdown();
        return NULL;
    }
    if (opts->bearer_token) {
        size_t n = strlen(opts->bearer_token) + 8;
        ch->auth = tsr_xmalloc(n);
        snprintf(ch->auth, n, "Bearer %s", opts->bearer_token);
        ch->auth_md.key = grpc_slice_from_static_string("authorization");
        ch->auth_md.value = grpc_slice_from_static_string(ch->auth);
    }
    ch->fast_reconnect = !opts->slow_reconnect;
    ch->streams_nowait = opts->streams_nowait;
    ch->last_reset = gpr_time_0(GPR_CLOCK_MONOTONIC);
    pool_channel_added();
    if (!opts->no_watch)
        watcher_add(ch);
    return ch;
}

void tsr_rpc_channel_destroy(tsr_rpc_channel *ch)
{
    if (!ch)
        return;
    if (ch->watched)
        watcher_remove_and_destroy(ch);
    else
        grpc_channel_destroy(ch->ch);
    pool_channel_removed();
    if (ch->auth) {
        explicit_bzero(ch->auth, strlen(ch->auth));
        free(ch->auth);
    }
    free(ch->target);
    free(ch);
    grpc_shutdown();
}

const char *tsr_rpc_channel_target(const tsr_rpc_channel *ch)
{
    return ch->target;
}

void tsr_rpc_channel_reset_backoff(tsr_rpc_channel *ch)
{
    grpc_channel_reset_connect_backoff(ch->ch);
}

int tsr_rpc_channel_state(tsr_rpc_channel *ch, int try_connect)
{
    if (!ch) /* no channel (a coordinator built without one, as the fuzz harnesses do) */
        return TSR_RPC_CONN_SHUTDOWN;
    return (int)grpc_channel_check_connectivity_state(ch->ch, try_connect);
}

/* ------------------------------------------------------------------------- results -- */

void tsr_rpc_result_init(tsr_rpc_result *r)
{
    r->code = TSR_RPC_OK;
    r->message = NULL;
    r->data = NULL;
    r->len = 0;
}

void tsr_rpc_result_close(tsr_rpc_result *r)
{
    free(r->message);
    free(r->data);
    tsr_rpc_result_init(r);
}

int tsr_rpc_result_to_error(const tsr_rpc_result *r, const char *ctx, tsr_error *err)
{
    int code = tsr_rpc_error_from_status(r->code);
    if (code == TSR_OK)
        return TSR_OK;
    const char *m = r->message ? r->message : "";
    if (ctx && *ctx)
        return tsr_err(err, code, "%s: %s%s%s", ctx, tsr_rpc_code_name(r->code), *m ? ": " : "",
                       m);
    return tsr_err(err, code, "%s%s%s", tsr_rpc_code_name(r->code), *m ? ": " : "", m);
}

static void result_set(tsr_rpc_result *r, int code, const char *msg)
{
    tsr_rpc_result_close(r);
    r->code = code;
    r->message = tsr_xstrdup(msg ? msg : "");
}

/* --------------------------------------------------------------------------- calls -- */

int tsr__ccall_start(struct tsr__ccall *cc, tsr_rpc_fanout_call *fc, grpc_completion_queue *cq,
                     void *owner, size_t index)
{
    memset(cc, 0, sizeof *cc);
    cc->kind = TSR__TAG_CLIENT_CALL;
    cc->owner = owner;
    cc->index = index;
    grpc_metadata_array_init(&cc->init_md);
    grpc_metadata_array_init(&cc->trail_md);
    cc->details = grpc_empty_slice();
    if (!fc->ch || !fc->method) {
        cc->unusable = 1;
        return -1;
    }
    grpc_slice path = grpc_slice_from_copied_string(fc->method);
    cc->call = grpc_channel_create_call(fc->ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path, NULL,
                                        tsr__rpc_deadline(fc->timeout_ms), NULL);
    grpc_slice_unref(path);
    if (!cc->call)
        return -1;
    grpc_slice body = fc->req_len ? grpc_slice_from_static_buffer(fc->req, fc->req_len)
                                  : grpc_empty_slice();
    cc->send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (fc->ch->auth) {
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &fc->ch->auth_md;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = cc->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &cc->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &cc->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &cc->trail_md;
    ops[5].data.recv_status_on_client.status = &cc->status;
    ops[5].data.recv_status_on_client.status_details = &cc->details;
    ops[5].data.recv_status_on_client.error_string = &cc->error_string;
    cc->started = 1; /* set before the batch: its event may be handled at once elsewhere */
    TSR_TSAN_RELEASE(cc);
    if (grpc_call_start_batch(cc->call, ops, 6, cc, NULL) != GRPC_CALL_OK) {
        cc->started = 0;
        return -1;
    }
    return 0;
}

void tsr__ccall_finish(struct tsr__ccall *cc, tsr_rpc_fanout_call *fc)
{
    tsr_rpc_result *r = &fc->result;
    if (cc->unusable) {
        result_set(r, TSR_RPC_UNAVAILABLE, fc->ch ? "no method" : "no channel");
    } else if (!cc->started) {
        result_set(r, TSR_RPC_INTERNAL, "could not start the call");
    } else {
        tsr_rpc_result_close(r);
        r->code = (int)cc->status;
        size_t n = GRPC_SLICE_LENGTH(cc->details);
        if (n > TSR_RPC_MAX_STATUS_MESSAGE)
            n = TSR_RPC_MAX_STATUS_MESSAGE;
        r->message = tsr_xmalloc(n + 1);
        if (n)
            memcpy(r->message, GRPC_SLICE_START_PTR(cc->details), n);
        r->message[n] = 0;
        if (cc->status == GRPC_STATUS_OK && cc->recv) {
            grpc_slice s = tsr__rpc_buffer_to_slice(cc->recv);
            size_t len = GRPC_SLICE_LENGTH(s);
            if (len) {
                r->data = tsr_try_malloc(len, 1);
                if (r->data) {
                    memcpy(r->data, GRPC_SLICE_START_PTR(s), len);
                    r->len = len;
                } else {
                    result_set(r, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory for the reply");
                }
            }
            grpc_slice_unref(s);
        }
    }
    if (cc->recv)
        grpc_byte_buffer_destroy(cc->recv);
    if (cc->send)
        grpc_byte_buffer_destroy(cc->send);
    grpc_metadata_array_destroy(&cc->init_md);
    grpc_metadata_array_destroy(&cc->trail_md);
    grpc_slice_unref(cc->details);
    if (cc->error_string)
        gpr_free((void *)cc->error_string);
    if (cc->call)
        grpc_call_unref(cc->call);
    memset(cc, 0, sizeof *cc);
}

/* Set once by tsr_rpc_client_shutdown; read by every fan-out's wait loop. */
static atomic_int client_shutdown;

void tsr_rpc_client_shutdown(void)
{
    atomic_store(&client_shutdown, 1);
}

/* How often a fan-out waiting on its calls looks at client_shutdown. */
#define SHUTDOWN_POLL_MS 200

size_t tsr_rpc_fanout(tsr_rpc_fanout_call *calls, size_t n)
{
    if (n == 0)
        return 0;
    struct tsr__ccall one, *cc = &one;
    if (n > 1)
        cc = tsr_xcalloc(n, sizeof *cc);
    grpc_completion_queue *cq = cq_get();
    size_t outstanding = 0;
    for (size_t i = 0; i < n; i++)
        if (tsr__ccall_start(&cc[i], &calls[i], cq, NULL, i) == 0)
            outstanding++;
    int cancelled = 0;
    while (outstanding > 0) {
        gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                          gpr_time_from_millis(SHUTDOWN_POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(cq, until, NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            TSR_TSAN_ACQUIRE(ev.tag);
            outstanding--;
        }
        if (!cancelled && atomic_load(&client_shutdown)) {
            /* each started call still completes on cq (status CANCELLED), so the loop
             * ends with every call accounted for, as on a deadline */
            for (size_t i = 0; i < n; i++)
                if (cc[i].started && cc[i].call)
                    grpc_call_cancel_with_status(cc[i].call, GRPC_STATUS_CANCELLED,
                                                 "the process is shutting down", NULL);
            cancelled = 1;
        }
    }
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        tsr__ccall_finish(&cc[i], &calls[i]);
        if (calls[i].result.code != TSR_RPC_OK)
            failed++;
    }
    cq_put(cq);
    if (cc != &one)
        free(cc);
    return failed;
}

int tsr_rpc_call(tsr_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                 int64_t timeout_ms, tsr_rpc_result *res)
{
    tsr_rpc_fanout_call fc;
    memset(&fc, 0, sizeof fc);
    fc.ch = ch;
    fc.method = method;
    fc.req = req;
    fc.req_len = req_len;
    fc.timeout_ms = timeout_ms;
    fc.result = *res; /* fanout closes what res held */
    tsr_rpc_fanout(&fc, 1);
    *res = fc.result;
    return res->code;
}

int tsr_rpc_call_pb(tsr_rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                    ProtobufCMessage **resp, tsr_rpc_result *res)
{
    *resp = NULL;
    size_t len = 0;
    uint8_t *buf = tsr_rpc_pack(req, &len);
    if (!buf) {
        result_set(res, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory packing the request");
        return res->code;
    }
    tsr_rpc_call(ch, method, buf, len, timeout_ms, res);
    free(buf);
    if (res->code != TSR_RPC_OK)
        return res->code;
    *resp = protobuf_c_message_unpack(resp_desc, NULL, res->len, res->data);
    free(res->data);
    res->data = NULL;
    res->len = 0;
    if (!*resp)
        result_set(res, TSR_RPC_INTERNAL, "malformed response");
    return res->code;
}

ProtobufCMessage *tsr_rpc_result_unpack(tsr_rpc_result *res, const ProtobufCMessageDescriptor *desc,
                                        ProtobufCAllocator *allocator)
{
    if (res->code != TSR_RPC_OK)
        return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, allocator, res->len, res->data);
    if (!m) {
        char msg[160];
        snprintf(msg, sizeof msg, "malformed %s", desc->short_name);
        result_set(res, TSR_RPC_INTERNAL, msg);
    }
    return m;
}
