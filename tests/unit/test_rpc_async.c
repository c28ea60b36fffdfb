/*
 * test_rpc_async — the asynchronous fan-out of the rpc server (tsr_rpc_reply_fanout): a
 * handler starts client calls on the server's own completion queue and returns; the reply
 * is sent by the polling thread that completes the last call. In-process server and
 * client over loopback (127.0.0.1, ephemeral ports).
 *
 * The key case runs the server with ONE polling thread and the handler fanning out to the
 * same server: a blocking fan-out would hold the only poller and every sub-call would wait
 * for its deadline (5 s); the asynchronous one answers in milliseconds. Also: a done
 * callback that starts a second round, results of calls that cannot be sent / hit a dead
 * port / hit their deadline, an error returned by done, a zero-call fan-out, misuse,
 * shutdown with a fan-out in flight, and concurrent clients on two queues of two pollers.
 * Held replies with server fan-outs (tsr_rpc_reply_hold / _release, tsr_rpc_server_fanout:
 * the coordinator's coalesced shard calls): released from the fan-out's done on one
 * poller and racing the handler's return on two, released before the handler returned
 * (nothing could be sent: done runs inline), misuse, and shutdown with one in flight.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "net/rpc.h"

#define ECHO "/tessera.test.Async/Echo"
#define SLOW "/tessera.test.Async/Slow"
#define FAN "/tessera.test.Async/Fan"
#define CHAIN "/tessera.test.Async/Chain"
#define MIXED "/tessera.test.Async/Mixed"
#define FAILDONE "/tessera.test.Async/FailDone"
#define ZERO "/tessera.test.Async/Zero"
#define MISUSE "/tessera.test.Async/Misuse"
#define HELD "/tessera.test.Async/Held"
#define HELDNULL "/tessera.test.Async/HeldNull"
#define HELDMISUSE "/tessera.test.Async/HeldMisuse"

#define MAXN 16

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct srv_ctx {
    tsr_rpc_channel *self; /* a channel to this same server */
    tsr_rpc_channel *dead; /* a channel to a port nobody listens on */
} srv_ctx;

/* One fan-out's state, owned by the handler until done frees it. */
typedef struct fan_state {
    srv_ctx *sc;
    tsr_rpc_fanout_call calls[MAXN];
    char req[MAXN][32];
    size_t n;
    int round;
    int misuse_rc[2];
} fan_state;

static int h_echo(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    return tsr_rpc_reply_copy(reply, req, len);
}

/* Sleeps the number of ms in the request (text), then echoes. */
static int h_slow(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    char buf[32] = {0};
    if (len)
        memcpy(buf, req, len < sizeof buf - 1 ? len : sizeof buf - 1);
    double t0 = now_ms();
    while (now_ms() - t0 < atol(buf) && !tsr_rpc_reply_cancelled(reply))
        usleep(2000);
    return tsr_rpc_reply_copy(reply, req, len);
}

static size_t req_count(const uint8_t *req, size_t len)
{
    char buf[16] = {0};
    if (len)
        memcpy(buf, req, len < sizeof buf - 1 ? len : sizeof buf - 1);
    long n = atol(buf);
    return n < 1 ? 1 : n > MAXN ? MAXN : (size_t)n;
}

static fan_state *fan_new(srv_ctx *sc, size_t n, const char *method, const char *prefix,
                          int64_t timeout_ms)
{
    fan_state *f = calloc(1, sizeof *f);
    f->sc = sc;
    f->n = n;
    for (size_t i = 0; i < n; i++) {
        snprintf(f->req[i], sizeof f->req[i], "%s%zu", prefix, i);
        f->calls[i].ch = sc->self;
        f->calls[i].method = method;
        f->calls[i].req = f->req[i];
        f->calls[i].req_len = strlen(f->req[i]);
        f->calls[i].timeout_ms = timeout_ms;
        tsr_rpc_result_init(&f->calls[i].result);
    }
    return f;
}

static void fan_free(fan_state *f)
{
    for (size_t i = 0; i < f->n; i++)
        tsr_rpc_result_close(&f->calls[i].result);
    free(f);
}

/* Replies with the sub-results joined by '|': "CODE:data" each. */
static int reply_joined(tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n, const char *head)
{
    char out[2048];
    size_t o = (size_t)snprintf(out, sizeof out, "%s", head);
    for (size_t i = 0; i < n && o < sizeof out; i++)
        o += (size_t)snprintf(out + o, sizeof out - o, "%s%s:%.*s", i ? "|" : "",
                              tsr_rpc_code_name(calls[i].result.code),
                              (int)calls[i].result.len,
                              calls[i].result.data ? (const char *)calls[i].result.data : "");
    return tsr_rpc_reply_copy(r, out, o < sizeof out ? o : sizeof out - 1);
}

static int fan_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    fan_state *f = ud;
    assert_ptr_equal(calls, f->calls);
    assert_int_equal(n, f->n);
    int rc = reply_joined(r, calls, n, "");
    fan_free(f);
    return rc;
}

/* FAN "N": N calls to ECHO on this same server, joined. */
static int h_fan(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    fan_state *f = fan_new(ctx, req_count(req, len), ECHO, "part", 5000);
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, fan_done, f);
    if (rc)
        fan_free(f);
    return rc;
}

/* CHAIN: round 1 = 2 echo calls; its done starts round 2 = 3 calls; the reply has both. */
static char chain_round1[512];
static pthread_mutex_t chain_mu = PTHREAD_MUTEX_INITIALIZER;

static int chain_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    fan_state *f = ud;
    if (f->round == 1) {
        char head[512];
        size_t o = 0;
        for (size_t i = 0; i < n; i++)
            o += (size_t)snprintf(head + o, sizeof head - o, "%.*s,", (int)calls[i].result.len,
                                  (const char *)calls[i].result.data);
        pthread_mutex_lock(&chain_mu);
        snprintf(chain_round1, sizeof chain_round1, "%s", head);
        pthread_mutex_unlock(&chain_mu);
        srv_ctx *sc = f->sc;
        fan_free(f);
        fan_state *g = fan_new(sc, 3, ECHO, "second", 5000);
        g->round = 2;
        int rc = tsr_rpc_reply_fanout(r, g->calls, g->n, chain_done, g);
        if (rc)
            fan_free(g);
        return rc;
    }
    pthread_mutex_lock(&chain_mu);
    char head[600];
    snprintf(head, sizeof head, "r1=%s r2=", chain_round1);
    pthread_mutex_unlock(&chain_mu);
    int rc = reply_joined(r, calls, n, head);
    fan_free(f);
    return rc;
}

static int h_chain(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    fan_state *f = fan_new(ctx, 2, ECHO, "first", 5000);
    f->round = 1;
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, chain_done, f);
    if (rc)
        fan_free(f);
    return rc;
}

/* MIXED: [0] ECHO ok, [1] no channel, [2] a dead port, [3] SLOW 2000 ms with a 100 ms
 * deadline, [4] no method. */
static int h_mixed(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    srv_ctx *sc = ctx;
    fan_state *f = fan_new(sc, 5, ECHO, "m", 5000);
    f->calls[1].ch = NULL;
    f->calls[2].ch = sc->dead;
    f->calls[3].method = SLOW;
    snprintf(f->req[3], sizeof f->req[3], "2000");
    f->calls[3].req_len = 4;
    f->calls[3].timeout_ms = 100;
    f->calls[4].method = NULL;
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, fan_done, f);
    if (rc)
        fan_free(f);
    return rc;
}

/* FAILDONE: done sets an error status after a successful sub-call. */
static int faildone_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    fan_state *f = ud;
    (void)n;
    int rc = tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, "sub-call said %.*s",
                                 (int)calls[0].result.len, (const char *)calls[0].result.data);
    fan_free(f);
    return rc;
}

static int h_faildone(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    fan_state *f = fan_new(ctx, 1, ECHO, "x", 5000);
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, faildone_done, f);
    if (rc)
        fan_free(f);
    return rc;
}

/* ZERO: a fan-out of no calls: done runs once the handler has returned. */
static int zero_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    int *handler_returned = ud;
    assert_null(calls);
    assert_int_equal(n, 0);
    if (!*handler_returned)
        return tsr_rpc_reply_error(r, TSR_RPC_INTERNAL, "done ran before the handler returned");
    free(handler_returned);
    return tsr_rpc_reply_copy(r, "zero", 4);
}

static int h_zero(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    (void)req;
    (void)len;
    int *flag = calloc(1, sizeof *flag);
    int rc = tsr_rpc_reply_fanout(reply, NULL, 0, zero_done, flag);
    *flag = 1;
    return rc;
}

/* MISUSE: a second fan-out while one is pending, and done NULL, are refused. */
static int misuse_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    fan_state *f = ud;
    char head[64];
    snprintf(head, sizeof head, "%d,%d;", f->misuse_rc[0], f->misuse_rc[1]);
    int rc = reply_joined(r, calls, n, head);
    fan_free(f);
    return rc;
}

static int h_misuse(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    fan_state *f = fan_new(ctx, 1, ECHO, "y", 5000);
    fan_state *g = fan_new(ctx, 1, ECHO, "z", 5000);
    f->misuse_rc[1] = tsr_rpc_reply_fanout(reply, g->calls, 1, NULL, g);
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, misuse_done, f);
    if (rc) {
        fan_free(f);
        fan_free(g);
        return rc;
    }
    f->misuse_rc[0] = tsr_rpc_reply_fanout(reply, g->calls, 1, misuse_done, g);
    fan_free(g);
    return 0;
}

/* ------------------------------------------------------------------- fixtures -- */

/* ---- held replies and server fan-outs ---- */

typedef struct held_state {
    fan_state *f;
    tsr_rpc_reply *reply;
} held_state;

static void held_done(void *ud, tsr_rpc_fanout_call *calls, size_t n)
{
    held_state *h = ud;
    assert_ptr_equal(calls, h->f->calls);
    assert_int_equal(n, h->f->n);
    tsr_rpc_reply *r = h->reply;
    int rc = reply_joined(r, calls, n, "held:");
    fan_free(h->f);
    free(h);
    tsr_rpc_reply_release(r, rc);
}

/* HELD "N": holds the reply, N calls to ECHO as a server fan-out; its done releases. */
static int held_start(srv_ctx *sc, tsr_rpc_reply *reply, size_t n, int null_channels)
{
    assert_int_equal(tsr_rpc_reply_hold(reply), 0);
    held_state *h = calloc(1, sizeof *h);
    h->f = fan_new(sc, n, ECHO, "h", 5000);
    h->reply = reply;
    for (size_t i = 0; null_channels && i < n; i++)
        h->f->calls[i].ch = NULL;
    int rc = tsr_rpc_server_fanout(tsr_rpc_reply_server(reply), h->f->calls, n, held_done, h);
    assert_int_equal(rc, 0);
    return 0;
}

static int h_held(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    return held_start(ctx, reply, req_count(req, len), 0);
}

/* HELDNULL: nothing can be sent, so done (and the release) runs before the fan-out and the
 * handler return; the reply goes out when the handler returns. */
static int h_heldnull(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    return held_start(ctx, reply, 2, 1);
}

/* HELDMISUSE: a second hold, a fan-out on a held reply, a server fan-out without done. */
static int h_heldmisuse(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    (void)req;
    (void)len;
    tsr_rpc_fanout_call c;
    memset(&c, 0, sizeof c);
    tsr_rpc_result_init(&c.result);
    assert_int_equal(tsr_rpc_reply_hold(reply), 0);
    int a = tsr_rpc_reply_hold(reply);
    int b = tsr_rpc_server_fanout(tsr_rpc_reply_server(reply), &c, 1, NULL, NULL);
    char out[64];
    int n = snprintf(out, sizeof out, "%d,%d", a, b);
    int rc = tsr_rpc_reply_copy(reply, out, (size_t)n);
    tsr_rpc_reply_release(reply, rc);
    return 0;
}

typedef struct fixture {
    tsr_rpc_server *srv;
    srv_ctx sc;
    tsr_rpc_channel *client;
} fixture;

static fixture *fixture_start(int cqs, int pollers)
{
    fixture *fx = calloc(1, sizeof *fx);
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.cqs = cqs;
    o.pollers = pollers;
    o.workers = 2;
    fx->srv = tsr_rpc_server_create(&o, &err);
    assert_non_null(fx->srv);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, ECHO, h_echo, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, SLOW, h_slow, NULL, TSR_RPC_LONG), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, FAN, h_fan, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, CHAIN, h_chain, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, MIXED, h_mixed, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, FAILDONE, h_faildone, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, ZERO, h_zero, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, MISUSE, h_misuse, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, HELD, h_held, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, HELDNULL, h_heldnull, &fx->sc, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, HELDMISUSE, h_heldmisuse, &fx->sc, 0),
                     0);
    /* The handlers' channels exist before the polling threads start (the hand-over through
     * gRPC core would be invisible to ThreadSanitizer), as in the coordinator. */
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(fx->srv));
    fx->sc.self = tsr_rpc_channel_create(target, NULL, &err);
    fx->client = tsr_rpc_channel_create(target, NULL, &err);
    /* a port that was just free: bind a server, take its port, destroy it */
    tsr_rpc_server_opts_init(&o);
    tsr_rpc_server *tmp = tsr_rpc_server_create(&o, &err);
    assert_non_null(tmp);
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(tmp));
    tsr_rpc_server_destroy(tmp);
    fx->sc.dead = tsr_rpc_channel_create(target, NULL, &err);
    assert_non_null(fx->sc.self);
    assert_non_null(fx->client);
    assert_non_null(fx->sc.dead);
    assert_int_equal(tsr_rpc_server_start(fx->srv, &err), 0);
    return fx;
}

static void fixture_stop(fixture *fx)
{
    tsr_rpc_server_destroy(fx->srv);
    tsr_rpc_channel_destroy(fx->client);
    tsr_rpc_channel_destroy(fx->sc.self);
    tsr_rpc_channel_destroy(fx->sc.dead);
    free(fx);
}

static void call_text(fixture *fx, const char *method, const char *req, int64_t tmo,
                      tsr_rpc_result *res)
{
    tsr_rpc_call(fx->client, method, req, strlen(req), tmo, res);
}

static void assert_reply(const tsr_rpc_result *res, const char *want)
{
    if (res->code != TSR_RPC_OK)
        fail_msg("%s: %s", tsr_rpc_code_name(res->code), res->message);
    if (res->len != strlen(want) || memcmp(res->data, want, res->len) != 0)
        fail_msg("reply \"%.*s\", expected \"%s\"", (int)res->len,
                 res->data ? (const char *)res->data : "", want);
}

/* -------------------------------------------------------------------- tests -- */

static void test_self_fanout_one_poller(void **state)
{
    (void)state;
    fixture *fx = fixture_start(1, 1);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    double t0 = now_ms();
    call_text(fx, FAN, "4", 10000, &res);
    double ms = now_ms() - t0;
    assert_reply(&res, "OK:part0|OK:part1|OK:part2|OK:part3");
    /* a blocking fan-out would hold the only poller: each sub-call would wait 5 s */
    if (ms > 2500)
        fail_msg("fan-out on one poller took %.0f ms", ms);
    for (int i = 0; i < 200; i++) {
        call_text(fx, FAN, "3", 10000, &res);
        assert_reply(&res, "OK:part0|OK:part1|OK:part2");
    }
    tsr_rpc_result_close(&res);
    fixture_stop(fx);
}

static void test_chain(void **state)
{
    (void)state;
    fixture *fx = fixture_start(1, 1);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    call_text(fx, CHAIN, "", 10000, &res);
    assert_reply(&res, "r1=first0,first1, r2=OK:second0|OK:second1|OK:second2");
    tsr_rpc_result_close(&res);
    fixture_stop(fx);
}

static void test_mixed_results(void **state)
{
    (void)state;
    fixture *fx = fixture_start(1, 1);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    double t0 = now_ms();
    call_text(fx, MIXED, "", 10000, &res);
    double ms = now_ms() - t0;
    assert_reply(&res, "OK:m0|UNAVAILABLE:|UNAVAILABLE:|DEADLINE_EXCEEDED:|UNAVAILABLE:");
    /* the slow sub-call is cut at its 100 ms deadline, not waited for (2 s) */
    if (ms > 1500)
        fail_msg("mixed fan-out took %.0f ms", ms);
    tsr_rpc_result_close(&res);
    fixture_stop(fx);
}

static void test_done_error_zero_misuse(void **state)
{
    (void)state;
    fixture *fx = fixture_start(1, 1);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    call_text(fx, FAILDONE, "", 10000, &res);
    assert_int_equal(res.code, TSR_RPC_FAILED_PRECONDITION);
    assert_string_equal(res.message, "sub-call said x0");
    call_text(fx, ZERO, "", 10000, &res);
    assert_reply(&res, "zero");
    call_text(fx, MISUSE, "", 10000, &res);
    char want[64];
    snprintf(want, sizeof want, "%d,%d;OK:y0", TSR_EINVAL, TSR_EINVAL);
    assert_reply(&res, want);
    tsr_rpc_result_close(&res);
    fixture_stop(fx);
}

typedef struct thr_arg {
    fixture *fx;
    int calls, bad;
} thr_arg;

static void *client_thread(void *p)
{
    thr_arg *a = p;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (int i = 0; i < a->calls; i++) {
        const char *want = "OK:part0|OK:part1|OK:part2|OK:part3|OK:part4";
        call_text(a->fx, FAN, "5", 10000, &res);
        if (res.code != TSR_RPC_OK || res.len != strlen(want) ||
            memcmp(res.data, want, res.len) != 0)
            a->bad++;
    }
    tsr_rpc_result_close(&res);
    return NULL;
}

/* 4 client threads of 150 calls each running fn against two queues of two pollers; every
 * reply as expected. */
static void run_clients_two_queues(void *(*fn)(void *))
{
    fixture *fx = fixture_start(2, 2);
    pthread_t th[4];
    thr_arg a[4];
    for (int t = 0; t < 4; t++) {
        a[t] = (thr_arg){fx, 150, 0};
        assert_int_equal(pthread_create(&th[t], NULL, fn, &a[t]), 0);
    }
    int bad = 0;
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        bad += a[t].bad;
    }
    assert_int_equal(bad, 0);
    fixture_stop(fx);
}

static void test_concurrent_two_queues(void **state)
{
    (void)state;
    run_clients_two_queues(client_thread);
}

typedef struct slow_call {
    fixture *fx;
    tsr_rpc_result res;
} slow_call;

static int slowfan_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    return fan_done(ud, r, calls, n);
}

static int h_slowfan(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    fan_state *f = fan_new(ctx, 1, SLOW, "", 5000);
    snprintf(f->req[0], sizeof f->req[0], "300");
    f->calls[0].req_len = 3;
    int rc = tsr_rpc_reply_fanout(reply, f->calls, f->n, slowfan_done, f);
    if (rc)
        fan_free(f);
    return rc;
}

static void *slow_client(void *p)
{
    slow_call *s = p;
    tsr_rpc_call(s->fx->client, "/tessera.test.Async/SlowFan", "", 0, 10000, &s->res);
    return NULL;
}

/* Server destroyed while a fan-out waits for a 300 ms sub-call: shutdown waits for it
 * (the grace period), the client gets the reply, nothing leaks or crashes. */
static void test_shutdown_with_fanout_in_flight(void **state)
{
    (void)state;
    fixture *fx = calloc(1, sizeof *fx);
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.cqs = 1;
    o.pollers = 1;
    fx->srv = tsr_rpc_server_create(&o, &err);
    assert_non_null(fx->srv);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, SLOW, h_slow, NULL, TSR_RPC_LONG), 0);
    assert_int_equal(
        tsr_rpc_server_add_method(fx->srv, "/tessera.test.Async/SlowFan", h_slowfan, &fx->sc, 0),
        0);
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(fx->srv));
    fx->sc.self = tsr_rpc_channel_create(target, NULL, &err);
    fx->client = tsr_rpc_channel_create(target, NULL, &err);
    assert_int_equal(tsr_rpc_server_start(fx->srv, &err), 0);
    slow_call s = {fx, {0}};
    tsr_rpc_result_init(&s.res);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_client, &s), 0);
    usleep(100 * 1000); /* the fan-out is in flight */
    tsr_rpc_server_destroy(fx->srv);
    pthread_join(th, NULL);
    assert_reply(&s.res, "OK:300");
    tsr_rpc_result_close(&s.res);
    tsr_rpc_channel_destroy(fx->client);
    tsr_rpc_channel_destroy(fx->sc.self);
    free(fx);
}

static void test_held_one_poller(void **state)
{
    (void)state;
    fixture *fx = fixture_start(1, 1);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    double t0 = now_ms();
    for (int i = 0; i < 200; i++) {
        call_text(fx, HELD, "3", 10000, &res);
        assert_reply(&res, "held:OK:h0|OK:h1|OK:h2");
    }
    /* the server fan-out runs on the only poller without blocking it */
    if (now_ms() - t0 > 5000)
        fail_msg("200 held calls took %.0f ms", now_ms() - t0);
    call_text(fx, HELDNULL, "", 10000, &res);
    assert_reply(&res, "held:UNAVAILABLE:|UNAVAILABLE:");
    call_text(fx, HELDMISUSE, "", 10000, &res);
    char want[64];
    snprintf(want, sizeof want, "%d,%d", TSR_EINVAL, TSR_EINVAL);
    assert_reply(&res, want);
    tsr_rpc_result_close(&res);
    fixture_stop(fx);
}

static void *held_client(void *p)
{
    thr_arg *a = p;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (int i = 0; i < a->calls; i++) {
        const char *want = "held:OK:h0|OK:h1|OK:h2|OK:h3";
        call_text(a->fx, i % 5 ? HELD : HELDNULL, i % 5 ? "4" : "", 10000, &res);
        if (!(i % 5))
            want = "held:UNAVAILABLE:|UNAVAILABLE:";
        if (res.code != TSR_RPC_OK || res.len != strlen(want) ||
            memcmp(res.data, want, res.len) != 0)
            a->bad++;
    }
    tsr_rpc_result_close(&res);
    return NULL;
}

/* Two queues of two pollers: a server fan-out's done (the release) may run on another
 * poller before the handler that held the reply has returned. */
static void test_held_concurrent(void **state)
{
    (void)state;
    run_clients_two_queues(held_client);
}

static int h_heldslow(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    assert_int_equal(tsr_rpc_reply_hold(reply), 0);
    held_state *h = calloc(1, sizeof *h);
    h->f = fan_new(ctx, 1, SLOW, "", 5000);
    snprintf(h->f->req[0], sizeof h->f->req[0], "300");
    h->f->calls[0].req_len = 3;
    h->reply = reply;
    assert_int_equal(tsr_rpc_server_fanout(tsr_rpc_reply_server(reply), h->f->calls, 1,
                                           held_done, h), 0);
    return 0;
}

static void *heldslow_client(void *p)
{
    slow_call *s = p;
    tsr_rpc_call(s->fx->client, "/tessera.test.Async/HeldSlow", "", 0, 10000, &s->res);
    return NULL;
}

/* Server destroyed while a held reply waits for a server fan-out's 300 ms sub-call:
 * shutdown waits for the fan-out, the client gets the reply; after shutdown a server
 * fan-out is refused. */
static void test_shutdown_with_held_in_flight(void **state)
{
    (void)state;
    fixture *fx = calloc(1, sizeof *fx);
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    fx->srv = tsr_rpc_server_create(&o, &err);
    assert_non_null(fx->srv);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, SLOW, h_slow, NULL, TSR_RPC_LONG), 0);
    assert_int_equal(tsr_rpc_server_add_method(fx->srv, "/tessera.test.Async/HeldSlow",
                                               h_heldslow, &fx->sc, 0), 0);
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(fx->srv));
    fx->sc.self = tsr_rpc_channel_create(target, NULL, &err);
    fx->client = tsr_rpc_channel_create(target, NULL, &err);
    tsr_rpc_fanout_call c;
    memset(&c, 0, sizeof c);
    assert_int_equal(tsr_rpc_server_fanout(fx->srv, &c, 0, held_done, NULL), TSR_EUNAVAILABLE);
    assert_int_equal(tsr_rpc_server_start(fx->srv, &err), 0);
    slow_call s = {fx, {0}};
    tsr_rpc_result_init(&s.res);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, heldslow_client, &s), 0);
    usleep(100 * 1000);
    tsr_rpc_server_shutdown(fx->srv);
    pthread_join(th, NULL);
    assert_reply(&s.res, "held:OK:300");
    assert_int_equal(tsr_rpc_server_fanout(fx->srv, &c, 0, held_done, NULL), TSR_EUNAVAILABLE);
    tsr_rpc_result_close(&s.res);
    tsr_rpc_server_destroy(fx->srv);
    tsr_rpc_channel_destroy(fx->client);
    tsr_rpc_channel_destroy(fx->sc.self);
    free(fx);
}

static void test_split_repeated(void **state)
{
    (void)state;
    size_t at[4];
    const uint8_t ok[] = {0x0a, 2, 'a', 'b', 0x0a, 0, 0x0a, 3, 'x', 'y', 'z'};
    assert_int_equal(tsr_rpc_split_repeated(ok, sizeof ok, 1, at, 4), 3);
    assert_int_equal(at[0], 0);
    assert_int_equal(at[1], 4);
    assert_int_equal(at[2], 6);
    assert_int_equal(tsr_rpc_split_repeated(ok, sizeof ok, 1, at, 2), -1); /* over cap */
    assert_int_equal(tsr_rpc_split_repeated(ok, sizeof ok, 2, at, 4), -1); /* other field */
    assert_int_equal(tsr_rpc_split_repeated(ok, 0, 1, at, 4), 0);
    assert_int_equal(tsr_rpc_split_repeated(NULL, 0, 1, at, 4), 0);
    const uint8_t longer[] = {0x0a, 5, 'a', 'b'};
    assert_int_equal(tsr_rpc_split_repeated(longer, sizeof longer, 1, at, 4), -1);
    const uint8_t varint[] = {0x0a, 1, 'a', 0x08, 1}; /* field 1 as a varint */
    assert_int_equal(tsr_rpc_split_repeated(varint, sizeof varint, 1, at, 4), -1);
    const uint8_t cut[] = {0x0a, 0x80}; /* length varint cut */
    assert_int_equal(tsr_rpc_split_repeated(cut, sizeof cut, 1, at, 4), -1);
    /* a two-byte length */
    uint8_t big[3 + 200];
    big[0] = 0x0a;
    big[1] = 0x80 | (200 & 0x7f);
    big[2] = 200 >> 7;
    memset(big + 3, 'q', 200);
    assert_int_equal(tsr_rpc_split_repeated(big, sizeof big, 1, at, 4), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_fanout_one_poller),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_mixed_results),
        cmocka_unit_test(test_done_error_zero_misuse),
        cmocka_unit_test(test_concurrent_two_queues),
        cmocka_unit_test(test_shutdown_with_fanout_in_flight),
        cmocka_unit_test(test_held_one_poller),
        cmocka_unit_test(test_held_concurrent),
        cmocka_unit_test(test_shutdown_with_held_in_flight),
        cmocka_unit_test(test_split_repeated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
