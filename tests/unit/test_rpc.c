/*
 * test_rpc — the rpc module end to end: an in-process server and client over loopback
 * (127.0.0.1, ephemeral ports): echo (short and worker-pool handlers), error statuses
 * with messages, TSR error mapping, UNIMPLEMENTED, deadlines with a slow handler, fan-out,
 * many sequential calls, message size limits, health, shutdown with calls in flight,
 * reconnect to a restarted server, TLS (certificates made with the openssl CLI when it
 * exists), the protobuf-c helpers, and the nesting check of recursive request types.
 *
 * Serve mode for the python interop test: TSR_RPC_TEST_SERVE=1 runs the same test server
 * (methods under /tessera.test.Echo/ plus a fake /tessera.v1.Shard/Stats), prints
 * "PORT <n>" on stdout and serves until stdin closes, then shuts down and exits 0.
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

#include "google/protobuf/struct.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "net/rpc.h"
#include "tessera/v1/shard.pb-c.h"

#define ECHO "/tessera.test.Echo/Echo"
#define ECHO_LONG "/tessera.test.Echo/EchoLong"
#define FAIL "/tessera.test.Echo/Fail"
#define FAIL_TSR "/tessera.test.Echo/FailTsr"
#define SLOW "/tessera.test.Echo/Slow"
#define BIG "/tessera.test.Echo/Big"
#define STATS "/tessera.v1.Shard/Stats"
#define HEALTH "/grpc.health.v1.Health/Check"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------- handlers -- */

static int h_echo(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    return tsr_rpc_reply_copy(reply, req, len);
}

/* Fails with INVALID_ARGUMENT and the request text in the message. */
static int h_fail(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_rpc_reply_copy(reply, "ignored", 7); /* an error discards a response */
    return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT, "bad request: %.*s", (int)len,
                               req ? (const char *)req : "");
}

/* Returns a bare TSR code (request "notfound" | "state" | "limit" | "tserr" | other). */
static int h_fail_tsr(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    if (len == 8 && memcmp(req, "notfound", 8) == 0)
        return TSR_ENOTFOUND;
    if (len == 5 && memcmp(req, "state", 5) == 0)
        return TSR_ESTATE;
    if (len == 5 && memcmp(req, "limit", 5) == 0)
        return TSR_ELIMIT;
    if (len == 5 && memcmp(req, "tserr", 5) == 0) {
        tsr_error err = TSR_ERROR_INIT;
        tsr_err(&err, TSR_EUNAVAILABLE, "shard 3 at %s is down", "ipv4:10.0.0.3:7003");
        return tsr_rpc_reply_from_error(reply, &err);
    }
    return TSR_EFORMAT;
}

/* Sleeps the number of ms in the request (text), checking for cancellation, then echoes. */
static int h_slow(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    char buf[32] = {0};
    if (len)
        memcpy(buf, req, len < sizeof buf - 1 ? len : sizeof buf - 1);
    long ms = atol(buf);
    double t0 = now_ms();
    while (now_ms() - t0 < ms) {
        if (tsr_rpc_reply_cancelled(reply))
            return tsr_rpc_reply_error(reply, TSR_RPC_CANCELLED, "stopped early");
        usleep(2000);
    }
    return tsr_rpc_reply_copy(reply, req, len);
}

/* Replies with as many bytes as the request says (text). */
static int h_big(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    char buf[32] = {0};
    if (len)
        memcpy(buf, req, len < sizeof buf - 1 ? len : sizeof buf - 1);
    size_t n = (size_t)atol(buf);
    uint8_t *p = calloc(n ? n : 1, 1);
    if (!p)
        return TSR_ENOMEM;
    tsr_rpc_reply_set(reply, p, n);
    return 0;
}

static int h_stats(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    Tessera__V1__ShardStatsRequest *rq = tessera__v1__shard_stats_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardStatsRequest: malformed protobuf");
    tessera__v1__shard_stats_request__free_unpacked(rq, NULL);
    Tessera__V1__ShardStatsResponse resp = TESSERA__V1__SHARD_STATS_RESPONSE__INIT;
    Tessera__V1__ShardVersion v = TESSERA__V1__SHARD_VERSION__INIT;
    Tessera__V1__ShardVersion *vs[1] = {&v};
    int32_t lists[3] = {1, 5, 9};
    int64_t sizes[3] = {10, 20, 30};
    resp.current_version = 42;
    resp.vectors_count = 60;
    resp.dimension = 64;
    resp.nlist = 16;
    resp.metric = "L2";
    resp.n_lists = 3;
    resp.lists = lists;
    resp.n_list_sizes = 3;
    resp.list_sizes = sizes;
    v.version = 42;
    v.state = TESSERA__V1__SHARD_VERSION__STATE__SERVING;
    v.current = 1;
    v.vectors_count = 60;
    resp.n_versions = 1;
    resp.versions = vs;
    return tsr_rpc_reply_pack(reply, &resp.base);
}

/* --------------------------------------------------------------------- fixture -- */

typedef struct fixture {
    tsr_rpc_server *srv;
    tsr_rpc_channel *ch;
    char target[64];
    int port;
} fixture;

static tsr_rpc_server *make_server(const tsr_rpc_server_opts *o)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server *s = tsr_rpc_server_create(o, &err);
    if (!s) {
        fprintf(stderr, "server create: %s\n", err.msg);
        return NULL;
    }
    assert_int_equal(tsr_rpc_server_add_method(s, ECHO, h_echo, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, ECHO_LONG, h_echo, NULL, TSR_RPC_LONG), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, FAIL, h_fail, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, FAIL_TSR, h_fail_tsr, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, SLOW, h_slow, NULL, TSR_RPC_LONG), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, BIG, h_big, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, STATS, h_stats, NULL, 0), 0);
    if (tsr_rpc_server_start(s, &err) != 0) {
        fprintf(stderr, "server start: %s\n", err.msg);
        tsr_rpc_server_destroy(s);
        return NULL;
    }
    return s;
}

static int setup_opts(void **state, const tsr_rpc_server_opts *o)
{
    fixture *f = calloc(1, sizeof *f);
    f->srv = make_server(o);
    if (!f->srv) {
        free(f);
        return -1;
    }
    f->port = tsr_rpc_server_port(f->srv);
    snprintf(f->target, sizeof f->target, "ipv4:127.0.0.1:%d", f->port);
    tsr_error err = TSR_ERROR_INIT;
    f->ch = tsr_rpc_channel_create(f->target, NULL, &err);
    if (!f->ch) {
        tsr_rpc_server_destroy(f->srv);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup(void **state)
{
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.max_message = 4u << 20;
    return setup_opts(state, &o);
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr_rpc_channel_destroy(f->ch);
    tsr_rpc_server_destroy(f->srv);
    free(f);
    return 0;
}

static int call_str(tsr_rpc_channel *ch, const char *method, const char *req, int64_t ms,
                    tsr_rpc_result *res)
{
    return tsr_rpc_call(ch, method, req, strlen(req), ms, res);
}

/* ----------------------------------------------------------------------- tests -- */

static void test_echo(void **state)
{
    fixture *f = *state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    const char *methods[2] = {ECHO, ECHO_LONG};
    size_t sizes[] = {0, 1, 100, 65536, 1u << 20};
    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t n = sizes[i];
            uint8_t *buf = malloc(n ? n : 1);
            for (size_t j = 0; j < n; j++)
                buf[j] = (uint8_t)(j * 131 + i);
            assert_int_equal(tsr_rpc_call(f->ch, methods[m], buf, n, 5000, &res), TSR_RPC_OK);
            assert_int_equal(res.len, n);
            if (n)
                assert_memory_equal(res.data, buf, n);
            else
                assert_null(res.data);
            assert_string_equal(res.message, "");
            free(buf);
        }
    }
    tsr_rpc_result_close(&res);
}

static void test_error_status(void **state)
{
    fixture *f = *state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(call_str(f->ch, FAIL, "dimension 3, expected 64", 5000, &res),
                     TSR_RPC_INVALID_ARGUMENT);
    assert_string_equal(res.message, "bad request: dimension 3, expected 64");
    assert_null(res.data);

    struct {
        const char *req;
        int code;
        const char *msg;
    } cases[] = {
        {"notfound", TSR_RPC_NOT_FOUND, "not found"},
        {"state", TSR_RPC_FAILED_PRECONDITION, "failed precondition"},
        {"limit", TSR_RPC_RESOURCE_EXHAUSTED, "resource exhausted"},
        {"tserr", TSR_RPC_UNAVAILABLE, "shard 3 at ipv4:10.0.0.3:7003 is down"},
        {"other", TSR_RPC_INTERNAL, "bad file format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(call_str(f->ch, FAIL_TSR, cases[i].req, 5000, &res), cases[i].code);
        assert_string_equal(res.message, cases[i].msg);
    }
    tsr_error err = TSR_ERROR_INIT;
    call_str(f->ch, FAIL_TSR, "tserr", 5000, &res);
    assert_int_equal(tsr_rpc_result_to_error(&res, "shard 0", &err), TSR_EUNAVAILABLE);
    assert_string_equal(err.msg, "shard 0: UNAVAILABLE: shard 3 at ipv4:10.0.0.3:7003 is down");
    tsr_rpc_result_close(&res);
}

static void test_unimplemented(void **state)
{
    fixture *f = *state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(call_str(f->ch, "/tessera.v1.Nope/Nothing", "x", 5000, &res),
                     TSR_RPC_UNIMPLEMENTED);
    assert_non_null(strstr(res.message, "/tessera.v1.Nope/Nothing"));
    /* the server still works afterwards */
    assert_int_equal(call_str(f->ch, ECHO, "after", 5000, &res), TSR_RPC_OK);
    tsr_rpc_result_close(&res);
}

static void test_deadline(void **state)
{
    fixture *f = *state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    double t0 = now_ms();
    assert_int_equal(call_str(f->ch, SLOW, "600", 100, &res), TSR_RPC_DEADLINE_EXCEEDED);
    double dt = now_ms() - t0;
    assert_true(dt >= 90 && dt < 500);
    /* a deadline long enough succeeds */
    assert_int_equal(call_str(f->ch, SLOW, "50", 2000, &res), TSR_RPC_OK);
    assert_int_equal(res.len, 2);
    tsr_rpc_result_close(&res);
}

static void test_fanout(void **state)
{
    fixture *f = *state;
    /* a second server, so the fan-out spans two peers like shards */
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    tsr_rpc_server *s2 = make_server(&o);
    assert_non_null(s2);
    char t2[64];
    snprintf(t2, sizeof t2, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(s2));
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_channel *ch2 = tsr_rpc_channel_create(t2, NULL, &err);
    assert_non_null(ch2);

    tsr_rpc_fanout_call c[8];
    memset(c, 0, sizeof c);
    char reqs[8][16];
    const char *shared = "shared-buffer";
    for (int i = 0; i < 8; i++) {
        tsr_rpc_result_init(&c[i].result);
        snprintf(reqs[i], sizeof reqs[i], "req-%d", i);
        c[i].ch = (i % 2) ? ch2 : f->ch;
        c[i].method = (i % 3 == 0) ? ECHO_LONG : ECHO;
        c[i].req = reqs[i];
        c[i].req_len = strlen(reqs[i]);
        c[i].timeout_ms = 5000;
    }
    c[4].req = c[5].req = shared; /* one buffer for two calls */
    c[4].req_len = c[5].req_len = strlen(shared);
    c[6].method = SLOW; /* its own short deadline */
    c[6].req = "800";
    c[6].req_len = 3;
    c[6].timeout_ms = 100;
    c[7].ch = NULL;
    double t0 = now_ms();
    assert_int_equal(tsr_rpc_fanout(c, 8), 2);
    double dt = now_ms() - t0;
    assert_true(dt < 600); /* did not wait for the slow handler */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(c[i].result.code, TSR_RPC_OK);
        assert_int_equal(c[i].result.len, c[i].req_len);
        assert_memory_equal(c[i].result.data, c[i].req, c[i].req_len);
    }
    assert_int_equal(c[6].result.code, TSR_RPC_DEADLINE_EXCEEDED);
    assert_int_equal(c[7].result.code, TSR_RPC_UNAVAILABLE);
    assert_string_equal(c[7].result.message, "no channel");
    /* reuse the results: fanout closes what they held */
    for (int i = 0; i < 8; i++)
        c[i].ch = f->ch, c[i].method = ECHO, c[i].timeout_ms = 5000;
    assert_int_equal(tsr_rpc_fanout(c, 8), 0);
    for (int i = 0; i < 8; i++)
        tsr_rpc_result_close(&c[i].result);
    assert_int_equal(tsr_rpc_fanout(c, 0), 0);

    tsr_rpc_channel_destroy(ch2);
    tsr_rpc_server_destroy(s2);
}

static void test_many_sequential(void **state)
{
    fixture *f = *state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    char buf[64];
    for (int i = 0; i < 3000; i++) {
        int n = snprintf(buf, sizeof buf, "message %d", i);
        const char *m = (i % 10 == 0) ? ECHO_LONG : ECHO;
        assert_int_equal(tsr_rpc_call(f->ch, m, buf, (size_t)n, 5000, &res), TSR_RPC_OK);
        assert_int_equal(res.len, (size_t)n);
        assert_memory_equal(res.data, buf, (size_t)n);
    }
    tsr_rpc_result_close(&res);
}

/* Several client threads on one channel at once. */
static void *hammer(void *arg)
{
    fixture *f = arg;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    long bad = 0;
    for (int i = 0; i < 300; i++) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "t%d", i);
        if (tsr_rpc_call(f->ch, (i & 1) ? ECHO_LONG : ECHO, buf, (size_t)n, 5000, &res) !=
                TSR_RPC_OK ||
            res.len != (size_t)n || memcmp(res.data, buf, (size_t)n) != 0)
            bad++;
    }
    tsr_rpc_result_close(&res);
    return (void *)bad;
}

static void test_concurrent_clients(void **state)
{
    fixture *f = *state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hammer, f), 0);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        assert_int_equal((long)bad, 0);
    }
}

static void test_message_limits(void **state)
{
    fixture *f = *state; /* server max_message is 4 MiB */
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    size_t n = 5u << 20;
    uint8_t *buf = calloc(n, 1);
    assert_int_equal(tsr_rpc_call(f->ch, ECHO, buf, n, 5000, &res), TSR_RPC_RESOURCE_EXHAUSTED);
    free(buf);
    assert_int_equal(call_str(f->ch, BIG, "5242880", 5000, &res), TSR_RPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(res.message, "exceeds the maximum message size"));
    assert_int_equal(call_str(f->ch, BIG, "3000000", 5000, &res), TSR_RPC_OK);
    assert_int_equal(res.len, 3000000);
    /* still healthy */
    assert_int_equal(call_str(f->ch, ECHO, "ok", 5000, &res), TSR_RPC_OK);
    tsr_rpc_result_close(&res);
}

static int health_status(tsr_rpc_channel *ch, const char *service, int *status)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    rq.service = (char *)service;
    ProtobufCMessage *resp = NULL;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    int code = tsr_rpc_call_pb(ch, HEALTH, &rq.base, &grpc__health__v1__health_check_response__descriptor,
                               2000, &resp, &res);
    *status = -1;
    if (code == TSR_RPC_OK) {
        *status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    tsr_rpc_result_close(&res);
    return code;
}

static void test_health(void **state)
{
    fixture *f = *state;
    int st;
    assert_int_equal(health_status(f->ch, "", &st), TSR_RPC_OK);
    assert_int_equal(st, TSR_RPC_HEALTH_SERVING);
    assert_int_equal(health_status(f->ch, "tessera.v1.Shard", &st), TSR_RPC_NOT_FOUND);
    assert_int_equal(tsr_rpc_server_set_health(f->srv, "tessera.v1.Shard", TSR_RPC_HEALTH_NOT_SERVING), 0);
    assert_int_equal(health_status(f->ch, "tessera.v1.Shard", &st), TSR_RPC_OK);
    assert_int_equal(st, TSR_RPC_HEALTH_NOT_SERVING);
    assert_int_equal(tsr_rpc_server_set_health(f->srv, "tessera.v1.Shard", TSR_RPC_HEALTH_SERVING), 0);
    assert_int_equal(health_status(f->ch, "tessera.v1.Shard", &st), TSR_RPC_OK);
    assert_int_equal(st, TSR_RPC_HEALTH_SERVING);
    /* malformed request */
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(tsr_rpc_call(f->ch, HEALTH, "\xff\xff\xff", 3, 2000, &res),
                     TSR_RPC_INVALID_ARGUMENT);
    assert_non_null(strstr(res.message, "malformed"));
    tsr_rpc_result_close(&res);
}

static void test_protobuf_roundtrip(void **state)
{
    fixture *f = *state;
    Tessera__V1__ShardStatsRequest rq = TESSERA__V1__SHARD_STATS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(tsr_rpc_call_pb(f->ch, STATS, &rq.base, &tessera__v1__shard_stats_response__descriptor,
                                     2000, &m, &res),
                     TSR_RPC_OK);
    Tessera__V1__ShardStatsResponse *r = (Tessera__V1__ShardStatsResponse *)m;
    assert_int_equal(r->current_version, 42);
    assert_int_equal(r->n_lists, 3);
    assert_int_equal(r->list_sizes[2], 30);
    assert_string_equal(r->metric, "L2");
    assert_int_equal(r->n_versions, 1);
    assert_int_equal(r->versions[0]->state, TESSERA__V1__SHARD_VERSION__STATE__SERVING);
    protobuf_c_message_free_unpacked(m, NULL);
    /* a reply that does not parse as the expected type */
    assert_int_equal(tsr_rpc_call_pb(f->ch, BIG, &rq.base, &tessera__v1__shard_stats_response__descriptor,
                                     2000, &m, &res),
                     TSR_RPC_OK); /* empty request → "0" bytes → empty reply parses */
    protobuf_c_message_free_unpacked(m, NULL);
    tsr_rpc_result_close(&res);
}

struct inflight {
    tsr_rpc_channel *ch;
    const char *ms;
    int code[4];
};

static void *inflight_main(void *arg)
{
    struct inflight *a = arg;
    tsr_rpc_fanout_call c[4];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 4; i++) {
        tsr_rpc_result_init(&c[i].result);
        c[i].ch = a->ch;
        c[i].method = SLOW;
        c[i].req = a->ms;
        c[i].req_len = strlen(a->ms);
        c[i].timeout_ms = 10000;
    }
    tsr_rpc_fanout(c, 4);
    for (int i = 0; i < 4; i++) {
        a->code[i] = c[i].result.code;
        tsr_rpc_result_close(&c[i].result);
    }
    return NULL;
}

/* Shutdown within the grace period lets calls in flight finish; past it they are
 * cancelled and the server still stops promptly. */
static void test_shutdown_inflight(void **state)
{
    for (int round = 0; round < 2; round++) {
        tsr_rpc_server_opts o;
        tsr_rpc_server_opts_init(&o);
        o.grace_ms = round == 0 ? 3000 : 100;
        o.workers = round == 0 ? 4 : 1; /* round 1: three calls wait in the worker queue */
        tsr_rpc_server *s = make_server(&o);
        assert_non_null(s);
        char t[64];
        snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(s));
        tsr_error err = TSR_ERROR_INIT;
        tsr_rpc_channel *ch = tsr_rpc_channel_create(t, NULL, &err);
        struct inflight a = {ch, round == 0 ? "300" : "5000", {0}};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, inflight_main, &a), 0);
        usleep(100 * 1000); /* calls reach the handlers */
        double t0 = now_ms();
        tsr_rpc_server_destroy(s);
        double dt = now_ms() - t0;
        pthread_join(th, NULL);
        for (int i = 0; i < 4; i++) {
            if (round == 0)
                assert_int_equal(a.code[i], TSR_RPC_OK);
            else
                assert_int_not_equal(a.code[i], TSR_RPC_OK);
        }
        if (round == 1)
            assert_true(dt < 1500);
        /* the peer is gone: fast UNAVAILABLE, not a hang */
        tsr_rpc_result res;
        tsr_rpc_result_init(&res);
        t0 = now_ms();
        assert_int_equal(call_str(ch, ECHO, "x", 3000, &res), TSR_RPC_UNAVAILABLE);
        assert_true(now_ms() - t0 < 1000);
        tsr_rpc_result_close(&res);
        tsr_rpc_channel_destroy(ch);
    }
}

static void test_restart_reconnect(void **state)
{
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    tsr_rpc_server *s = make_server(&o);
    assert_non_null(s);
    int port = tsr_rpc_server_port(s);
    char addr[64], t[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", port);
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_channel *ch = tsr_rpc_channel_create(t, NULL, &err);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(call_str(ch, ECHO, "a", 3000, &res), TSR_RPC_OK);

    /* a second server on the same port must fail (no silent SO_REUSEPORT sharing) */
    o.listen = addr;
    assert_null(tsr_rpc_server_create(&o, &err));
    assert_int_equal(err.code, TSR_EUNAVAILABLE);

    /* (1) quick restart, no call while it was down: the watcher notices */
    tsr_rpc_server_destroy(s);
    s = make_server(&o);
    assert_non_null(s);
    double t0 = now_ms();
    while (tsr_rpc_channel_state(ch, 0) != TSR_RPC_CONN_READY && now_ms() - t0 < 5000)
        usleep(2000);
    double dt = now_ms() - t0;
    printf("# quick restart: channel READY again after %.0f ms\n", dt);
    assert_true(dt < 1000); /* below the 1 s minimum backoff: the watcher's fast retry */
    assert_int_equal(call_str(ch, ECHO, "c", 3000, &res), TSR_RPC_OK);

    /* (2) down for a while with a failed call (backoff running), then restarted */
    tsr_rpc_server_destroy(s);
    assert_int_equal(call_str(ch, ECHO, "b", 3000, &res), TSR_RPC_UNAVAILABLE);
    usleep(300 * 1000);
    s = make_server(&o);
    assert_non_null(s);
    t0 = now_ms();
    while (tsr_rpc_channel_state(ch, 0) != TSR_RPC_CONN_READY && now_ms() - t0 < 5000)
        usleep(2000);
    dt = now_ms() - t0;
    printf("# restart after a failed connect: READY after %.0f ms (watcher retries every 0.2 s)\n", dt);
    assert_true(dt < 1000);
    assert_int_equal(call_str(ch, ECHO, "d", 3000, &res), TSR_RPC_OK);

    /* (3) the same with reset_backoff when the restart is known */
    tsr_rpc_server_destroy(s);
    assert_int_equal(call_str(ch, ECHO, "e", 3000, &res), TSR_RPC_UNAVAILABLE);
    usleep(300 * 1000);
    s = make_server(&o);
    assert_non_null(s);
    t0 = now_ms();
    tsr_rpc_channel_reset_backoff(ch);
    while (tsr_rpc_channel_state(ch, 1) != TSR_RPC_CONN_READY && now_ms() - t0 < 5000)
        usleep(2000);
    dt = now_ms() - t0;
    printf("# restart with reset_backoff: READY after %.0f ms\n", dt);
    assert_int_equal(call_str(ch, ECHO, "f", 3000, &res), TSR_RPC_OK);
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(s);
}

static void test_api_misuse(void **state)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = "not an address";
    assert_null(tsr_rpc_server_create(&o, &err));
    tsr_rpc_server_opts_init(&o);
    o.tls_cert_file = "/nonexistent/cert.pem";
    assert_null(tsr_rpc_server_create(&o, &err));
    assert_int_equal(err.code, TSR_EINVAL); /* key missing */
    o.tls_key_file = "/nonexistent/key.pem";
    assert_null(tsr_rpc_server_create(&o, &err));
    assert_int_equal(err.code, TSR_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/cert.pem"));

    tsr_rpc_server_opts_init(&o);
    tsr_rpc_server *s = tsr_rpc_server_create(&o, &err);
    assert_non_null(s);
    assert_int_equal(tsr_rpc_server_add_method(s, "nope", h_echo, NULL, 0), TSR_EINVAL);
    assert_int_equal(tsr_rpc_server_add_method(s, HEALTH, h_echo, NULL, 0), TSR_EINVAL);
    assert_int_equal(tsr_rpc_server_add_method(s, ECHO, h_echo, NULL, 0), 0);
    assert_int_equal(tsr_rpc_server_add_method(s, ECHO, h_echo, NULL, 0), TSR_EINVAL);
    tsr_rpc_server_destroy(s); /* never started */
    tsr_rpc_server_destroy(NULL);
    tsr_rpc_channel_destroy(NULL);
    assert_null(tsr_rpc_channel_create("", NULL, &err));

    assert_int_equal(tsr_rpc_status_from_error(TSR_EINVAL), TSR_RPC_INVALID_ARGUMENT);
    assert_int_equal(tsr_rpc_status_from_error(TSR_ENOTFOUND), TSR_RPC_NOT_FOUND);
    assert_int_equal(tsr_rpc_status_from_error(TSR_ESTATE), TSR_RPC_FAILED_PRECONDITION);
    assert_int_equal(tsr_rpc_status_from_error(TSR_EUNAVAILABLE), TSR_RPC_UNAVAILABLE);
    assert_int_equal(tsr_rpc_status_from_error(TSR_ETIMEOUT), TSR_RPC_DEADLINE_EXCEEDED);
    assert_int_equal(tsr_rpc_status_from_error(TSR_ELIMIT), TSR_RPC_RESOURCE_EXHAUSTED);
    assert_int_equal(tsr_rpc_status_from_error(TSR_EIO), TSR_RPC_INTERNAL);
    assert_int_equal(tsr_rpc_status_from_error(TSR_OK), TSR_RPC_OK);
    assert_int_equal(tsr_rpc_error_from_status(TSR_RPC_NOT_FOUND), TSR_ENOTFOUND);
    assert_int_equal(tsr_rpc_error_from_status(TSR_RPC_DEADLINE_EXCEEDED), TSR_ETIMEOUT);
    assert_string_equal(tsr_rpc_code_name(TSR_RPC_UNIMPLEMENTED), "UNIMPLEMENTED");
    assert_string_equal(tsr_rpc_code_name(99), "UNKNOWN_CODE");
}

/* ------------------------------------------------------------------------- TLS -- */

static char tls_dir[256];

static int make_certs(void)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        return -1;
    FILE *p = popen("mktemp -d", "r");
    if (!p)
        return -1;
    int ok = fgets(tls_dir, sizeof tls_dir, p) != NULL;
    pclose(p);
    if (!ok)
        return -1;
    tls_dir[strcspn(tls_dir, "\n")] = 0;
    if (!tls_dir[0])
        return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost -addext basicConstraints=critical,CA:TRUE "
             "-keyout key.pem -out cert.pem >/dev/null 2>&1",
             tls_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void rm_certs(void)
{
    char cmd[512];
    if (tls_dir[0]) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tls_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tls_dir);
    }
}

static void test_tls(void **state)
{
    if (make_certs() != 0) {
        rm_certs();
        skip();
    }
    char cert[300], key[300];
    snprintf(cert, sizeof cert, "%s/cert.pem", tls_dir);
    snprintf(key, sizeof key, "%s/key.pem", tls_dir);
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    tsr_rpc_server *s = make_server(&o);
    assert_non_null(s);
    char t[64];
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(s));
    tsr_rpc_client_opts co;
    tsr_rpc_client_opts_init(&co);
    co.tls_ca_file = cert;
    co.tls_server_name = "localhost";
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_channel *ch = tsr_rpc_channel_create(t, &co, &err);
    assert_non_null(ch);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    assert_int_equal(call_str(ch, ECHO, "secret", 5000, &res), TSR_RPC_OK);
    assert_int_equal(res.len, 6);
    assert_int_equal(call_str(ch, FAIL, "tls", 5000, &res), TSR_RPC_INVALID_ARGUMENT);
    assert_string_equal(res.message, "bad request: tls");
    tsr_rpc_channel_destroy(ch);
    /* a plaintext client cannot talk to a TLS server */
    ch = tsr_rpc_channel_create(t, NULL, &err);
    assert_int_equal(call_str(ch, ECHO, "x", 2000, &res), TSR_RPC_UNAVAILABLE);
    tsr_rpc_channel_destroy(ch);
    /* the wrong server name is refused */
    co.tls_server_name = "other.example";
    ch = tsr_rpc_channel_create(t, &co, &err);
    assert_int_equal(call_str(ch, ECHO, "x", 2000, &res), TSR_RPC_UNAVAILABLE);
    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(s);

    /* mutual TLS: the server requires a client certificate signed by its client CA */
    o.tls_client_ca_file = cert;
    s = make_server(&o);
    assert_non_null(s);
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(s));
    co.tls_server_name = "localhost";
    ch = tsr_rpc_channel_create(t, &co, &err); /* no client certificate */
    assert_int_equal(call_str(ch, ECHO, "x", 2000, &res), TSR_RPC_UNAVAILABLE);
    tsr_rpc_channel_destroy(ch);
    co.tls_cert_file = cert;
    co.tls_key_file = key;
    ch = tsr_rpc_channel_create(t, &co, &err);
    assert_non_null(ch);
    assert_int_equal(call_str(ch, ECHO, "mtls", 5000, &res), TSR_RPC_OK);
    assert_int_equal(res.len, 4);
    tsr_rpc_channel_destroy(ch);
    tsr_rpc_result_close(&res);
    tsr_rpc_server_destroy(s);
    rm_certs();
}

/* ------------------------------------------------------------------ serve mode -- */

static int serve(void)
{
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.max_message = 4u << 20;
    tsr_rpc_server *s = make_server(&o);
    if (!s)
        return 1;
    printf("PORT %d\n", tsr_rpc_server_port(s));
    fflush(stdout);
    char buf[256];
    while (fread(buf, 1, sizeof buf, stdin) > 0)
        ;
    tsr_rpc_server_destroy(s);
    return 0;
}

/* tsr_rpc_too_deep on a google.protobuf.Struct {"a": {"a": ... }} of n objects below the
 * top one (3 message levels each: map entry, Value, Struct), packed by protobuf-c: the
 * smallest max_depth it passes is exactly 3n; non-message fields and malformed bytes pass
 * (the unpack judges those). */
static void test_nesting_depth(void **state)
{
    (void)state;
    enum { N = 100 };
    Google__Protobuf__Struct st[N + 1];
    Google__Protobuf__Struct__FieldsEntry en[N], *enp[N];
    Google__Protobuf__Value va[N];
    for (int i = 0; i <= N; i++)
        google__protobuf__struct__init(&st[i]);
    for (int i = 0; i < N; i++) {
        google__protobuf__struct__fields_entry__init(&en[i]);
        google__protobuf__value__init(&va[i]);
        va[i].kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
        va[i].struct_value = &st[i + 1];
        en[i].key = (char *)"a";
        en[i].value = &va[i];
        enp[i] = &en[i];
        st[i].fields = &enp[i];
        st[i].n_fields = 1;
    }
    size_t len = protobuf_c_message_get_packed_size(&st[0].base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&st[0].base, buf);
    const ProtobufCMessageDescriptor *d = &google__protobuf__struct__descriptor;
    assert_int_equal(tsr_rpc_too_deep(d, buf, len, 3 * N), 0);
    assert_int_equal(tsr_rpc_too_deep(d, buf, len, 3 * N - 1), 1);
    assert_int_equal(tsr_rpc_too_deep(d, buf, len, 0), 1);
    assert_int_equal(tsr_rpc_too_deep(d, buf, 0, 0), 0);
    /* the same bytes read as another message (field 1 a string there): not looked into */
    assert_int_equal(tsr_rpc_too_deep(&grpc__health__v1__health_check_request__descriptor,
                                      buf, len, 0), 0);
    /* cut anywhere: malformed, not too deep */
    for (size_t cut = 0; cut < len; cut += 7)
        (void)tsr_rpc_too_deep(d, buf, cut, 3 * N);
    free(buf);
}

int main(void)
{
    if (getenv("TSR_RPC_TEST_SERVE"))
        return serve();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_echo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unimplemented, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fanout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_sequential, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_message_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health, setup, teardown),
        cmocka_unit_test_setup_teardown(test_protobuf_roundtrip, setup, teardown),
        cmocka_unit_test(test_shutdown_inflight),
        cmocka_unit_test(test_restart_reconnect),
        cmocka_unit_test(test_api_misuse),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_nesting_depth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
