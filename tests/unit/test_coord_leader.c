/*
 * test_coord_leader — leadership (coordinator/leader.c, state.c). The lease thread's
 * decisions with plain inputs: its period and margin from the TTL, when a leader whose
 * renewals etcd did not confirm must step down (before its lease can expire), and what the
 * leader key read from etcd means (ours: keep; another term's: step down and follow it; our
 * old lease still holding it after we stepped down: release it). Then against a real
 * one-member etcd (exit 77, SKIP, without one) and a real gRPC call: a coordinator that
 * won the key (the election's transaction) passes its commit fence (tsr__leader_fence),
 * writes are accepted; once another coordinator holds the key its fenced commit is refused
 * by etcd, it steps down (tsr__leader_lost: not leading, no leader address, the term kept
 * for the shard calls), and a write to it is refused with UNAVAILABLE naming the leader
 * (or saying none is elected yet, or why etcd could not be asked). Without --etcd it
 * always leads, term 0, fence empty.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "etcd_test_util.h"
#include "coord.h"
#include "core/clock.h"
#include "core/mem.h"
#include "meta.h"

static void test_timing(void **state)
{
    (void)state;
    /* period ttl/3 (at least 200 ms), margin ttl/5 (at least 1 s) */
    assert_int_equal(tsr__lead_period_ms(6), 2000);
    assert_int_equal(tsr__lead_period_ms(0), 200);
    assert_int_equal(tsr__lead_margin_ms(10), 2000);
    assert_int_equal(tsr__lead_margin_ms(2), 1000);
    /* ttl 10 s: a leader whose last confirmed renewal was sent 8 s ago may still lead,
     * past 8 s it steps down (2 s before etcd can give the key to another) */
    int64_t ok_at = 50000;
    assert_false(tsr__lead_renewal_late(ok_at + 7999, ok_at, 10));
    assert_false(tsr__lead_renewal_late(ok_at + 8000, ok_at, 10));
    assert_true(tsr__lead_renewal_late(ok_at + 8001, ok_at, 10));
    /* ttl 2 s: margin 1 s */
    assert_false(tsr__lead_renewal_late(ok_at + 1000, ok_at, 2));
    assert_true(tsr__lead_renewal_late(ok_at + 1001, ok_at, 2));
    /* always before the lease could expire, for every ttl */
    for (int ttl = 1; ttl <= 120; ttl++) {
        assert_true(tsr__lead_renewal_late(ok_at + (int64_t)ttl * 1000, ok_at, ttl));
        assert_true(tsr__lead_period_ms(ttl) < (int64_t)ttl * 1000 ||
                    tsr__lead_period_ms(ttl) == 200);
    }
}

static void test_key_verdict(void **state)
{
    (void)state;
    const int64_t term = 40, lease = 77;
    /* leading, the key is our term's: nothing to do */
    assert_int_equal(tsr__lead_key_verdict(1, term, lease, 40, 77), 0);
    /* leading, the key is another term's (ours expired, another won): step down, follow */
    assert_int_equal(tsr__lead_key_verdict(1, term, lease, 41, 90),
                     TSR_LEAD_STEP_DOWN | TSR_LEAD_FOLLOW);
    /* following: the key names the leader */
    assert_int_equal(tsr__lead_key_verdict(0, term, lease, 41, 90), TSR_LEAD_FOLLOW);
    assert_int_equal(tsr__lead_key_verdict(0, 0, 0, 41, 90), TSR_LEAD_FOLLOW);
    /* not leading but our lease still holds the key (we stepped down when etcd was
     * unreachable past our margin): release it, do not follow ourselves */
    assert_int_equal(tsr__lead_key_verdict(0, term, lease, 40, 77), TSR_LEAD_RELEASE);
    /* no lease of ours: a key without a lease is not ours */
    assert_int_equal(tsr__lead_key_verdict(0, 0, 0, 41, 0), TSR_LEAD_FOLLOW);
}

/* ------------------------------------------------------------- with etcd and gRPC */

static tsr__coord C;

static int h_write(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    (void)req;
    (void)len;
    int rc = tsr__coord_refuse_follower(ctx, reply);
    if (rc)
        return rc;
    return tsr_rpc_reply_copy(reply, "ok", 2);
}

/* One write through a real server; returns its code, the message into msg. */
static int write_call(tsr_rpc_channel *ch, char *msg, size_t cap)
{
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    int code = tsr_rpc_call(ch, "/test.Coord/Write", "w", 1, 5000, &res);
    snprintf(msg, cap, "%s", res.message ? res.message : "");
    tsr_rpc_result_close(&res);
    return code;
}

static void test_without_etcd(void **state)
{
    (void)state;
    tsr__coord c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.lead.mu, NULL);
    atomic_store(&c.lead.term, 9);
    assert_true(tsr__coord_leading(&c));
    assert_int_equal(tsr__coord_term(&c), 0);
    tsr_etcd_cmp cmp[2];
    assert_int_equal(tsr__leader_fence(&c, cmp), 0);
    tsr__leader_lost(&c, "test"); /* no-op */
    assert_true(tsr__coord_leading(&c));
    pthread_mutex_destroy(&c.lead.mu);
}

static void test_fence_and_refusal(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    memset(&C, 0, sizeof C);
    pthread_mutex_init(&C.lead.mu, NULL);
    assert_int_equal(tsr__meta_open(E.endpoints, "/t/lead", NULL, 2, &C.meta, &err), 0);
    C.lead.ttl_s = 2;
    C.lead.advertise = "10.0.0.1:9000";
    /* a real server whose write handler refuses on a follower */
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    tsr_rpc_server *srv = tsr_rpc_server_create(&o, &err);
    assert_non_null(srv);
    assert_int_equal(tsr_rpc_server_add_method(srv, "/test.Coord/Write", h_write, &C, 0), 0);
    assert_int_equal(tsr_rpc_server_start(srv, &err), 0);
    char t[64], msg[512];
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(srv));
    tsr_rpc_channel *ch = tsr_rpc_channel_create(t, NULL, &err);
    assert_non_null(ch);

    /* not elected: writes refused, no leader known */
    assert_false(tsr__coord_leading(&C));
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_UNAVAILABLE);
    assert_string_equal(msg, "not the leader: no leader elected yet");
    snprintf(C.lead.etcd_err, sizeof C.lead.etcd_err, "connection refused");
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_UNAVAILABLE);
    assert_non_null(strstr(msg, "etcd unreachable: connection refused"));
    C.lead.etcd_err[0] = 0;

    /* the election's transaction, as campaign runs it: key absent -> ours with our lease */
    char key[300];
    tsr__meta_key(C.meta, "/leader", key, sizeof key);
    int64_t lease = 0, granted = 0, rev = 0;
    assert_int_equal(tsr_etcd_lease_grant(C.meta->fast, 10, &lease, &granted, &err), 0);
    tsr_etcd_cmp absent = {key, TSR_ETCD_CREATE_REV, 0, NULL, 0};
    tsr_etcd_op put = {0, key, C.lead.advertise, strlen(C.lead.advertise), lease};
    int ok = 0;
    assert_int_equal(tsr_etcd_txn(C.meta->fast, &absent, 1, &put, 1, &ok, &rev, &err), 0);
    assert_true(ok);
    atomic_store(&C.lead.lease, lease);
    atomic_store(&C.lead.term, rev);
    atomic_store(&C.lead.leading, 1);
    snprintf(C.lead.addr, sizeof C.lead.addr, "%s", C.lead.advertise);
    assert_true(tsr__coord_leading(&C));
    assert_int_equal(tsr__coord_term(&C), rev);
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_OK);

    /* its commit, fenced: applied while the key is its term's */
    char vkey[300];
    tsr__meta_key(C.meta, "/version", vkey, sizeof vkey);
    tsr_etcd_cmp fence[2];
    assert_int_equal(tsr__leader_fence(&C, fence), 2);
    tsr_etcd_op commit = {0, vkey, "5", 1, 0};
    assert_int_equal(tsr_etcd_txn(C.meta->etcd, fence, 2, &commit, 1, &ok, NULL, &err), 0);
    assert_true(ok);

    /* another coordinator holds the key now (ours was lost and it won) */
    int64_t lease2 = 0;
    assert_int_equal(tsr_etcd_lease_revoke(C.meta->fast, lease, &err), 0);
    assert_int_equal(tsr_etcd_lease_grant(C.meta->fast, 10, &lease2, &granted, &err), 0);
    tsr_etcd_op put2 = {0, key, "10.0.0.2:9000", 13, lease2};
    int64_t rev2 = 0;
    assert_int_equal(tsr_etcd_txn(C.meta->fast, &absent, 1, &put2, 1, &ok, &rev2, &err), 0);
    assert_true(ok);
    /* our fenced commit is refused by etcd: nothing written */
    tsr_etcd_op commit6 = {0, vkey, "6", 1, 0};
    assert_int_equal(tsr__leader_fence(&C, fence), 2);
    assert_int_equal(tsr_etcd_txn(C.meta->etcd, fence, 2, &commit6, 1, &ok, NULL, &err), 0);
    assert_false(ok);
    tsr_etcd_kv kv;
    assert_int_equal(tsr_etcd_get(C.meta->etcd, vkey, &kv, NULL, &err), 0);
    assert_memory_equal(kv.value, "5", 1);
    tsr_etcd_kvs_free(&kv, 1);
    /* what the lease thread reads: step down, follow the new leader */
    assert_int_equal(tsr_etcd_get(C.meta->fast, key, &kv, NULL, &err), 0);
    int v = tsr__lead_key_verdict(1, rev, lease, kv.create_rev, kv.lease);
    tsr_etcd_kvs_free(&kv, 1);
    assert_int_equal(v, TSR_LEAD_STEP_DOWN | TSR_LEAD_FOLLOW);
    tsr__leader_lost(&C, "the leader key is not ours any more");
    assert_false(tsr__coord_leading(&C));
    assert_int_equal(tsr__coord_term(&C), rev); /* kept: newer shards refuse it */
    assert_string_equal(C.lead.addr, "");
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_UNAVAILABLE);
    assert_string_equal(msg, "not the leader: no leader elected yet");
    snprintf(C.lead.addr, sizeof C.lead.addr, "10.0.0.2:9000"); /* FOLLOW */
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_UNAVAILABLE);
    assert_string_equal(msg, "not the leader: the leader is 10.0.0.2:9000");
    /* a leader known: named, even when our last lease call failed */
    snprintf(C.lead.etcd_err, sizeof C.lead.etcd_err, "deadline exceeded");
    assert_int_equal(write_call(ch, msg, sizeof msg), TSR_RPC_UNAVAILABLE);
    assert_string_equal(msg, "not the leader: the leader is 10.0.0.2:9000");

    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(srv);
    tsr__meta_close(C.meta);
    pthread_mutex_destroy(&C.lead.mu);
}

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_key_verdict),
        cmocka_unit_test(test_without_etcd),
    };
    int rc = cmocka_run_group_tests_name("leadership decisions", pure, NULL, NULL);
    if (!etcd_bin()) {
        printf("SKIP: etcd is not installed (Debian package etcd-server; make deps installs it)\n");
        return rc ? rc : 77;
    }
    snprintf(E.dir, sizeof E.dir, "/tmp/tsr-test-lead-%d", (int)getpid());
    const struct CMUnitTest withetcd[] = {
        cmocka_unit_test(test_fence_and_refusal),
    };
    rc |= cmocka_run_group_tests_name("leadership with etcd", withetcd, one_up, down);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", E.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_coord_leader: could not remove %s\n", E.dir);
    return rc;
}
