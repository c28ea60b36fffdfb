/*
 * test_coord_replica — replica selection and failover of the shard groups
 * (coordinator/replica.c) with real channels to in-process fake shards: one group of three
 * replicas, each a tsr_rpc_server whose /tessera.v1.Shard/Search answers with its own
 * replica number, or fails with the code the test sets (a shard's answer is what the test
 * needs; no shard process is started in a unit test). Checked: a failed call marks the
 * replica down with a back-off that doubles from 50 ms up to 2 s and a success clears it
 * (tsr__replica_note, tsr__replica_healthy); a group call that hits a replica answering
 * UNAVAILABLE fails over to another one of the group and gets its answer, the failed one
 * is then avoided while in back-off; a request error (INVALID_ARGUMENT) is not failed over;
 * lagging and stream_behind replicas are not picked while a healthy one is left; the
 * replica with the fewest calls in flight is picked; every replica failing ends the call
 * after one attempt on each; a removed group answers "shard group removed" without a call;
 * tsr__coord_behind_of parses a shard's "behind" refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord.h"
#include "core/clock.h"
#include "core/mem.h"

#define NR 3

/* A fake shard replica: answers Search with its number (one byte), or fails with code. */
typedef struct fake {
    tsr_rpc_server *srv;
    int number;
    atomic_int code; /* TSR_RPC_OK or the failure to answer */
    atomic_int calls;
    char addr[64];
} fake;

static fake F[NR];
static tsr__coord C;

static int h_search(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    fake *f = ctx;
    (void)req;
    (void)len;
    atomic_fetch_add(&f->calls, 1);
    int code = atomic_load(&f->code);
    if (code != TSR_RPC_OK)
        return tsr_rpc_reply_error(reply, code, "fake replica %d fails", f->number);
    uint8_t b = (uint8_t)f->number;
    return tsr_rpc_reply_copy(reply, &b, 1);
}

static int setup(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    memset(&C, 0, sizeof C);
    const char *addrs[NR];
    for (int i = 0; i < NR; i++) {
        tsr_rpc_server_opts o;
        tsr_rpc_server_opts_init(&o);
        o.listen = "127.0.0.1:0";
        F[i].number = i;
        atomic_init(&F[i].code, TSR_RPC_OK);
        atomic_init(&F[i].calls, 0);
        F[i].srv = tsr_rpc_server_create(&o, &err);
        if (!F[i].srv || tsr_rpc_server_add_method(F[i].srv, TSR_SHARD_SVC "Search", h_search,
                                                   &F[i], 0) ||
            tsr_rpc_server_start(F[i].srv, &err)) {
            fprintf(stderr, "fake shard: %s\n", err.msg);
            return -1;
        }
        snprintf(F[i].addr, sizeof F[i].addr, "127.0.0.1:%d", tsr_rpc_server_port(F[i].srv));
        addrs[i] = F[i].addr;
    }
    if (tsr__coord_config_add_group(&C.cfg, addrs, NR, &err)) {
        fprintf(stderr, "config: %s\n", err.msg);
        return -1;
    }
    C.cfg.replica_attempt_ms = 2000;
    tsr_rpc_client_opts co;
    tsr_rpc_client_opts_init(&co);
    if (tsr__coord_channels_open(&C, &co, &err)) {
        fprintf(stderr, "channels: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tsr__coord_channels_close(&C);
    tsr__coord_config_close(&C.cfg);
    for (int i = 0; i < NR; i++)
        tsr_rpc_server_destroy(F[i].srv);
    return 0;
}

/* Every replica healthy, answering, nothing in flight, counters zeroed. */
static void reset(void)
{
    for (int i = 0; i < NR; i++) {
        atomic_store(&F[i].code, TSR_RPC_OK);
        atomic_store(&F[i].calls, 0);
        tsr__replica *r = &C.rep[i];
        atomic_store(&r->fails, 0);
        atomic_store(&r->retry_at_ms, 0);
        atomic_store(&r->inflight, 0);
        atomic_store(&r->lagging, 0);
        atomic_store(&r->stream_behind, 0);
        atomic_store(&r->up, -1);
    }
}

/* One group call; returns the replica number that answered (-1: a failure, code in *code). */
static int call_once(int *code, int *attempts, size_t *replica)
{
    tsr__gcall gc;
    memset(&gc, 0, sizeof gc);
    gc.group = 0;
    gc.req = "q";
    gc.len = 1;
    tsr_rpc_result_init(&gc.result);
    size_t bad = tsr__coord_group_fanout(&C, TSR_SHARD_SVC "Search", &gc, 1, 10000);
    *code = gc.result.code;
    *attempts = gc.attempts;
    if (replica)
        *replica = gc.replica;
    int who = -1;
    if (gc.result.code == TSR_RPC_OK) {
        assert_int_equal(bad, 0);
        assert_int_equal(gc.result.len, 1);
        who = ((const uint8_t *)gc.result.data)[0];
    } else {
        assert_int_equal(bad, 1);
    }
    tsr_rpc_result_close(&gc.result);
    return who;
}

static void test_health_backoff(void **state)
{
    (void)state;
    reset();
    tsr__replica *r = &C.rep[1];
    int64_t want = 50;
    for (int f = 1; f <= 9; f++) {
        int64_t t0 = tsr_clock_mono_ms();
        tsr__replica_note(&C, 1, TSR_SHARD_SVC "Search", TSR_RPC_UNAVAILABLE, 0.001);
        int64_t t1 = tsr_clock_mono_ms();
        assert_int_equal(atomic_load(&r->fails), f);
        assert_int_equal(atomic_load(&r->up), 0);
        int64_t at = atomic_load(&r->retry_at_ms);
        /* the back-off: 50 ms doubling per consecutive failure, at most 2 s */
        assert_true(at >= t0 + want && at <= t1 + want);
        assert_false(tsr__replica_healthy(&C, 1, t1));
        assert_true(tsr__replica_healthy(&C, 1, at)); /* tried again once it ends */
        want = want * 2 > 2000 ? 2000 : want * 2;
    }
    /* a request error is not the replica's fault: no failure counted */
    tsr__replica_note(&C, 1, TSR_SHARD_SVC "Search", TSR_RPC_INVALID_ARGUMENT, 0.001);
    assert_int_equal(atomic_load(&r->fails), 0);
    assert_int_equal(atomic_load(&r->up), 1);
    assert_true(tsr__replica_healthy(&C, 1, tsr_clock_mono_ms()));
    /* every code a replica cannot answer with counts as its failure */
    int faults[] = {TSR_RPC_DEADLINE_EXCEEDED, TSR_RPC_CANCELLED, TSR_RPC_RESOURCE_EXHAUSTED,
                    TSR_RPC_FAILED_PRECONDITION, TSR_RPC_UNKNOWN};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        tsr__replica_note(&C, 1, TSR_SHARD_SVC "Search", faults[i], 0.001);
        assert_int_equal(atomic_load(&r->fails), (int)i + 1);
    }
    tsr__replica_note(&C, 1, TSR_SHARD_SVC "Search", TSR_RPC_OK, 0.001);
    assert_int_equal(atomic_load(&r->fails), 0);
    assert_true(tsr__replica_healthy(&C, 1, tsr_clock_mono_ms()));
    /* lagging or behind the stream: not healthy whatever its calls did */
    atomic_store(&r->lagging, 1);
    assert_false(tsr__replica_healthy(&C, 1, tsr_clock_mono_ms()));
    atomic_store(&r->lagging, 0);
    atomic_store(&r->stream_behind, 1);
    assert_false(tsr__replica_healthy(&C, 1, tsr_clock_mono_ms()));
    atomic_store(&r->stream_behind, 0);
}

static void test_balanced(void **state)
{
    (void)state;
    reset();
    int seen[NR] = {0};
    for (int i = 0; i < 30; i++) {
        int code, att;
        int who = call_once(&code, &att, NULL);
        assert_int_equal(code, TSR_RPC_OK);
        assert_int_equal(att, 1);
        seen[who]++;
    }
    /* healthy replicas with nothing in flight take turns */
    for (int i = 0; i < NR; i++)
        assert_int_equal(seen[i], 10);
}

static void test_failover(void **state)
{
    (void)state;
    reset();
    atomic_store(&F[0].code, TSR_RPC_UNAVAILABLE);
    int failed_over = 0;
    for (int i = 0; i < 12; i++) {
        int code, att;
        size_t rep;
        int who = call_once(&code, &att, &rep);
        assert_int_equal(code, TSR_RPC_OK);
        assert_int_not_equal(who, 0);
        assert_int_equal(rep, (size_t)who);
        if (att == 2)
            failed_over++;
        else
            assert_int_equal(att, 1);
    }
    /* round-robin reached replica 0, and then it was skipped while in back-off (50 ms,
     * doubling: a slow machine may see it end once or twice; without it, 4 of 12) */
    assert_int_equal(atomic_load(&F[0].calls), failed_over);
    assert_true(failed_over >= 1 && failed_over <= 2);
    assert_int_equal(atomic_load(&C.rep[0].up), 0);
    assert_true(atomic_load(&C.rep[0].fails) >= failed_over);
    /* it answers again: once its back-off ended it is picked again and marked up */
    atomic_store(&F[0].code, TSR_RPC_OK);
    atomic_store(&C.rep[0].retry_at_ms, 0);
    int back = 0;
    for (int i = 0; i < 6; i++) {
        int code, att;
        back += call_once(&code, &att, NULL) == 0;
    }
    assert_true(back >= 1);
    assert_int_equal(atomic_load(&C.rep[0].up), 1);
    assert_int_equal(atomic_load(&C.rep[0].fails), 0);
}

static void test_no_failover_on_request_error(void **state)
{
    (void)state;
    reset();
    for (int i = 0; i < NR; i++)
        atomic_store(&F[i].code, TSR_RPC_INVALID_ARGUMENT);
    int code, att;
    assert_int_equal(call_once(&code, &att, NULL), -1);
    assert_int_equal(code, TSR_RPC_INVALID_ARGUMENT);
    assert_int_equal(att, 1);
    assert_int_equal(atomic_load(&F[0].calls) + atomic_load(&F[1].calls) +
                         atomic_load(&F[2].calls), 1);
}

static void test_all_down(void **state)
{
    (void)state;
    reset();
    for (int i = 0; i < NR; i++)
        atomic_store(&F[i].code, TSR_RPC_UNAVAILABLE);
    int code, att;
    assert_int_equal(call_once(&code, &att, NULL), -1);
    assert_int_equal(code, TSR_RPC_UNAVAILABLE);
    assert_int_equal(att, NR); /* each replica once, none twice */
    for (int i = 0; i < NR; i++)
        assert_int_equal(atomic_load(&F[i].calls), 1);
}

static void test_lagging_skipped(void **state)
{
    (void)state;
    reset();
    atomic_store(&C.rep[0].lagging, 1);
    atomic_store(&C.rep[1].stream_behind, 1);
    for (int i = 0; i < 9; i++) {
        int code, att;
        assert_int_equal(call_once(&code, &att, NULL), 2);
        assert_int_equal(att, 1);
    }
    assert_int_equal(atomic_load(&F[0].calls), 0);
    assert_int_equal(atomic_load(&F[1].calls), 0);
    /* the only healthy one fails: a lagging one still answers rather than nothing */
    atomic_store(&F[2].code, TSR_RPC_UNAVAILABLE);
    int code, att;
    int who = call_once(&code, &att, NULL);
    assert_int_equal(code, TSR_RPC_OK);
    assert_true(who == 0 || who == 1);
    assert_int_equal(att, 2);
}

static void test_least_outstanding(void **state)
{
    (void)state;
    reset();
    atomic_store(&C.rep[0].inflight, 5);
    atomic_store(&C.rep[2].inflight, 3);
    for (int i = 0; i < 6; i++) {
        int code, att;
        assert_int_equal(call_once(&code, &att, NULL), 1);
    }
    atomic_store(&C.rep[1].inflight, 4); /* now replica 2 has the fewest */
    for (int i = 0; i < 6; i++) {
        int code, att;
        assert_int_equal(call_once(&code, &att, NULL), 2);
    }
    /* among replicas all in back-off, the one whose back-off ends first */
    reset();
    int64_t now = tsr_clock_mono_ms();
    for (int i = 0; i < NR; i++)
        atomic_store(&C.rep[i].fails, 1);
    atomic_store(&C.rep[0].retry_at_ms, now + 60000);
    atomic_store(&C.rep[1].retry_at_ms, now + 20000);
    atomic_store(&C.rep[2].retry_at_ms, now + 40000);
    for (int i = 0; i < 3; i++) {
        int code, att;
        assert_int_equal(call_once(&code, &att, NULL), 1);
        atomic_store(&C.rep[1].fails, 1); /* the success cleared it: back in back-off */
    }
}

static void test_removed_group(void **state)
{
    (void)state;
    reset();
    size_t n = C.grp[0].n;
    C.grp[0].n = 0;
    int code, att;
    tsr__gcall gc;
    memset(&gc, 0, sizeof gc);
    gc.req = "q";
    gc.len = 1;
    tsr_rpc_result_init(&gc.result);
    assert_int_equal(tsr__coord_group_fanout(&C, TSR_SHARD_SVC "Search", &gc, 1, 1000), 1);
    code = gc.result.code;
    att = gc.attempts;
    assert_int_equal(code, TSR_RPC_UNAVAILABLE);
    assert_string_equal(gc.result.message, "shard group removed");
    assert_int_equal(att, 0);
    tsr_rpc_result_close(&gc.result);
    C.grp[0].n = n;
    for (int i = 0; i < NR; i++)
        assert_int_equal(atomic_load(&F[i].calls), 0);
}

static void test_behind_of(void **state)
{
    (void)state;
    tsr_rpc_result r;
    tsr_rpc_result_init(&r);
    int64_t applied = -1;
    r.code = TSR_RPC_FAILED_PRECONDITION;
    r.message = (char *)"Search: stream seq 12 of version 3 not applied after 100 ms (this "
                        "replica missed a streamed write, or it is still in flight): applied "
                        "seq 9";
    assert_true(tsr__coord_behind_of(&r, &applied));
    assert_int_equal(applied, 9);
    r.message = (char *)"Read of applied seq 3: stream seq 12 of version 3 not applied "
                        "after 100 ms (...): applied seq 11";
    assert_true(tsr__coord_behind_of(&r, &applied));
    assert_int_equal(applied, 11); /* the last one */
    r.message = (char *)"version 4 not held";
    assert_false(tsr__coord_behind_of(&r, &applied));
    r.code = TSR_RPC_UNAVAILABLE;
    r.message = (char *)"Search: stream seq 12 of version 3 not applied after 100 ms: "
                        "applied seq 9";
    assert_false(tsr__coord_behind_of(&r, &applied));
    r.message = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_backoff),
        cmocka_unit_test(test_balanced),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_no_failover_on_request_error),
        cmocka_unit_test(test_all_down),
        cmocka_unit_test(test_lagging_skipped),
        cmocka_unit_test(test_least_outstanding),
        cmocka_unit_test(test_removed_group),
        cmocka_unit_test(test_behind_of),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
