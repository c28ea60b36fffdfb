/*
 * test_coord_coalesce — coalesced FindNeighbors shard calls (coordinator/coalesce.c) against
 * an in-process fake shard (a tsr_rpc_server whose Search answers each ShardQuery with one
 * result whose only label is the query's version, and fails a call holding a query of
 * negative version; a gate holds its answers so calls stay in flight). One group of one
 * replica, coalesce_inflight 1. Checked: below the limit a request's call goes out at once
 * (no wait); at the limit further requests queue, and when the call in flight completes
 * the whole queue goes out as ONE call whose reply is cut back into each request's own
 * results, in order; a batch holds at most 64 queries (more wait for the next call); a
 * failed batch sends each request again alone, so the good ones get their answers and
 * the bad one its own error; the in-flight count returns to 0.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "coord.h"
#include "core/clock.h"
#include "core/mem.h"

static tsr_rpc_server *shard, *own;
static tsr__coord C;

/* the fake shard's log of calls: queries per call, and the gate */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int gate_open = 1, ncalls, waiting;
static size_t call_nq[64];

static int h_search(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    Tessera__V1__ShardSearchRequest *sr =
        tessera__v1__shard_search_request__unpack(NULL, len, req);
    if (!sr)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT, "malformed");
    pthread_mutex_lock(&mu);
    if (ncalls < 64)
        call_nq[ncalls] = sr->n_queries;
    ncalls++;
    waiting++;
    pthread_cond_broadcast(&cv);
    while (!gate_open)
        pthread_cond_wait(&cv, &mu);
    waiting--;
    pthread_mutex_unlock(&mu);
    int rc = 0;
    for (size_t i = 0; i < sr->n_queries; i++)
        if (sr->queries[i]->version < 0)
            rc = tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT, "bad query %lld",
                                     (long long)sr->queries[i]->version);
    if (rc == 0) {
        Tessera__V1__ShardSearchResponse resp = TESSERA__V1__SHARD_SEARCH_RESPONSE__INIT;
        resp.n_results = sr->n_queries;
        resp.results = tsr_xcalloc(sr->n_queries + 1, sizeof *resp.results);
        Tessera__V1__ShardQueryResult *rs = tsr_xcalloc(sr->n_queries + 1, sizeof *rs);
        int64_t *labels = tsr_xcalloc(sr->n_queries + 1, sizeof *labels);
        for (size_t i = 0; i < sr->n_queries; i++) {
            tessera__v1__shard_query_result__init(&rs[i]);
            labels[i] = sr->queries[i]->version;
            rs[i].n_labels = 1;
            rs[i].labels = &labels[i];
            resp.results[i] = &rs[i];
        }
        rc = tsr_rpc_reply_pack(reply, &resp.base);
        free(labels);
        free(rs);
        free(resp.results);
    }
    tessera__v1__shard_search_request__free_unpacked(sr, NULL);
    return rc;
}

static int h_none(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)ctx;
    (void)req;
    (void)len;
    return tsr_rpc_reply_copy(reply, "", 0);
}

static void gate(int open)
{
    pthread_mutex_lock(&mu);
    gate_open = open;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_calls(int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl); /* cv: the default clock */
    dl.tv_sec += 10;
    pthread_mutex_lock(&mu);
    while (ncalls < n && pthread_cond_timedwait(&cv, &mu, &dl) == 0)
        ;
    int got = ncalls;
    pthread_mutex_unlock(&mu);
    assert_true(got >= n);
}

/* One FindNeighbors request's call: nq queries of versions first, first+1, ... */
typedef struct req {
    tsr__gcall call;
    tsr__centry e;
    uint8_t *buf;
    atomic_int done;
} req;

static void on_done(void *ud, tsr__gcall *call)
{
    req *r = ud;
    assert_ptr_equal(call, &r->call);
    atomic_store(&r->done, 1);
}

static void req_init(req *r, int64_t first, size_t nq)
{
    memset(r, 0, sizeof *r);
    Tessera__V1__ShardSearchRequest m = TESSERA__V1__SHARD_SEARCH_REQUEST__INIT;
    Tessera__V1__ShardQuery *q = tsr_xcalloc(nq, sizeof *q), **qp = tsr_xcalloc(nq, sizeof *qp);
    for (size_t i = 0; i < nq; i++) {
        tessera__v1__shard_query__init(&q[i]);
        q[i].version = first + (int64_t)i;
        qp[i] = &q[i];
    }
    m.n_queries = nq;
    m.queries = qp;
    size_t len = 0;
    r->buf = tsr_rpc_pack(&m.base, &len);
    free(q);
    free(qp);
    r->call.group = 0;
    r->call.req = r->buf;
    r->call.len = len;
    tsr_rpc_result_init(&r->call.result);
    r->e.call = &r->call;
    r->e.nq = nq;
    r->e.deadline = tsr_clock_mono_ms() + 20000;
    r->e.done = on_done;
    r->e.ud = r;
}

/* Waits for r's done, then checks it got exactly its own queries' results. */
static void req_check(req *r, int64_t first, size_t nq)
{
    for (int i = 0; i < 20000 && !atomic_load(&r->done); i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&r->done));
    assert_int_equal(r->call.result.code, TSR_RPC_OK);
    Tessera__V1__ShardSearchResponse *resp = tessera__v1__shard_search_response__unpack(
        NULL, r->call.result.len, r->call.result.data);
    assert_non_null(resp);
    assert_int_equal(resp->n_results, nq);
    for (size_t i = 0; i < nq; i++) {
        assert_int_equal(resp->results[i]->n_labels, 1);
        assert_int_equal(resp->results[i]->labels[0], first + (int64_t)i);
    }
    tessera__v1__shard_search_response__free_unpacked(resp, NULL);
}

static void req_close(req *r)
{
    tsr_rpc_result_close(&r->call.result);
    free(r->buf);
}

static int setup(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    shard = tsr_rpc_server_create(&o, &err);
    if (!shard || tsr_rpc_server_add_method(shard, TSR_SHARD_SVC "Search", h_search, NULL,
                                            TSR_RPC_LONG) ||
        tsr_rpc_server_start(shard, &err))
        return -1;
    own = tsr_rpc_server_create(&o, &err); /* the coordinator's: its queues run the calls */
    if (!own || tsr_rpc_server_add_method(own, "/test.T/None", h_none, NULL, 0) ||
        tsr_rpc_server_start(own, &err))
        return -1;
    memset(&C, 0, sizeof C);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tsr_rpc_server_port(shard));
    const char *a[1] = {addr};
    if (tsr__coord_config_add_group(&C.cfg, a, 1, &err))
        return -1;
    C.cfg.coalesce_inflight = 1;
    tsr_rpc_client_opts co;
    tsr_rpc_client_opts_init(&co);
    if (tsr__coord_channels_open(&C, &co, &err))
        return -1;
    tsr__coalesce_init(&C);
    atomic_store(&C.srv, own);
    return tsr__coalesce_on(&C) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    gate(1);
    tsr_rpc_server_destroy(own);
    tsr__coalesce_close(&C);
    tsr__coord_channels_close(&C);
    tsr__coord_config_close(&C.cfg);
    tsr_rpc_server_destroy(shard);
    return 0;
}

static void reset_log(void)
{
    pthread_mutex_lock(&mu);
    ncalls = 0;
    memset(call_nq, 0, sizeof call_nq);
    pthread_mutex_unlock(&mu);
}

/* The fake shard's answers held and one request's call in flight (the group at its
 * limit): what the requests submitted next queue behind. */
static void one_in_flight(req *r0, int64_t first, size_t nq)
{
    reset_log();
    gate(0);
    req_init(r0, first, nq);
    tsr__coalesce_submit(&C, &r0->e);
    wait_calls(1);
}

static void test_alone_then_batch(void **state)
{
    (void)state;
    req r[4];
    one_in_flight(&r[0], 100, 2); /* below the limit: out at once */
    req_init(&r[1], 200, 1);
    req_init(&r[2], 300, 3);
    req_init(&r[3], 400, 1);
    for (int i = 1; i < 4; i++)
        tsr__coalesce_submit(&C, &r[i].e); /* at the limit: queued */
    pthread_mutex_lock(&mu);
    assert_int_equal(ncalls, 1);
    pthread_mutex_unlock(&mu);
    assert_int_equal(C.co[0].inflight, 1);
    assert_non_null(C.co[0].head);
    gate(1);
    req_check(&r[0], 100, 2);
    req_check(&r[1], 200, 1);
    req_check(&r[2], 300, 3);
    req_check(&r[3], 400, 1);
    pthread_mutex_lock(&mu);
    assert_int_equal(ncalls, 2); /* the three queued ones as ONE call */
    assert_int_equal(call_nq[0], 2);
    assert_int_equal(call_nq[1], 5);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < 200 && C.co[0].inflight; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(C.co[0].inflight, 0);
    assert_null(C.co[0].head);
    for (int i = 0; i < 4; i++)
        req_close(&r[i]);
}

static void test_batch_cap(void **state)
{
    (void)state;
    req r[4];
    one_in_flight(&r[0], 1000, 1);
    req_init(&r[1], 2000, 40);
    req_init(&r[2], 3000, 24); /* 40 + 24 = 64: one batch */
    req_init(&r[3], 4000, 1);  /* 65 > 64: the next */
    for (int i = 1; i < 4; i++)
        tsr__coalesce_submit(&C, &r[i].e);
    gate(1);
    req_check(&r[1], 2000, 40);
    req_check(&r[2], 3000, 24);
    req_check(&r[3], 4000, 1);
    req_check(&r[0], 1000, 1);
    pthread_mutex_lock(&mu);
    assert_int_equal(ncalls, 3);
    assert_int_equal(call_nq[1], 64);
    assert_int_equal(call_nq[2], 1);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < 4; i++)
        req_close(&r[i]);
}

static void test_failed_batch_alone(void **state)
{
    (void)state;
    req r[4];
    one_in_flight(&r[0], 10, 1);
    req_init(&r[1], 20, 2);
    req_init(&r[2], -5, 1); /* the shard refuses any call holding it */
    req_init(&r[3], 30, 1);
    for (int i = 1; i < 4; i++)
        tsr__coalesce_submit(&C, &r[i].e);
    gate(1);
    req_check(&r[0], 10, 1);
    req_check(&r[1], 20, 2);
    req_check(&r[3], 30, 1);
    for (int i = 0; i < 20000 && !atomic_load(&r[2].done); i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&r[2].done));
    assert_int_equal(r[2].call.result.code, TSR_RPC_INVALID_ARGUMENT);
    assert_non_null(strstr(r[2].call.result.message, "bad query -5"));
    pthread_mutex_lock(&mu);
    /* the first, the batch of three, then each of the three alone */
    assert_int_equal(ncalls, 5);
    assert_int_equal(call_nq[1], 4);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < 4; i++)
        req_close(&r[i]);
}

int main(void)
{
    alarm(120); /* a failed test leaves requests in flight: end rather than hang */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_then_batch),
        cmocka_unit_test(test_batch_cap),
        cmocka_unit_test(test_failed_batch_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
