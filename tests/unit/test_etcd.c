/*
 * test_etcd — common/net/etcd (and rpc's streaming calls, which its watches use) against
 * real etcd processes from Debian's etcd-server: a one-member cluster for the API (reads,
 * prefix reads, puts, deletes, compare-and-swap transactions, leases that expire and that
 * are revoked, watches from a revision, a watch timeout that loses nothing, several keys
 * watched on one stream, history compaction and a watch from a compacted revision, a watch
 * whose user never blocks in gRPC, driven by an in-process server's pollers) and a
 * three-member cluster where one member is killed (requests fail over; a dead endpoint in
 * the list is skipped; every endpoint dead = UNAVAILABLE naming each).
 * Without the etcd binary the test exits 77 (SKIP) and says so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd_test_util.h"
#include "net/etcd.h"

static tsr_etcd *client(void)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_etcd *e = tsr_etcd_open(E.endpoints, NULL, 2000, &err);
    assert_non_null(e);
    return e;
}

static void test_kv(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    int64_t rev1, rev2;
    assert_int_equal(tsr_etcd_put(e, "/t/a", "one", 3, 0, &rev1, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/t/b", "two\0x", 5, 0, &rev2, &err), 0);
    assert_true(rev2 > rev1);
    assert_int_equal(tsr_etcd_put(e, "/u", "other", 5, 0, NULL, &err), 0);
    tsr_etcd_kv kv;
    assert_int_equal(tsr_etcd_get(e, "/t/b", &kv, NULL, &err), 0);
    assert_int_equal(kv.len, 5);
    assert_memory_equal(kv.value, "two\0x", 5);
    assert_int_equal(kv.mod_rev, rev2);
    assert_int_equal(kv.version, 1);
    tsr_etcd_kvs_free(&kv, 1);
    assert_int_equal(tsr_etcd_get(e, "/t/none", &kv, NULL, &err), TSR_ENOTFOUND);
    tsr_etcd_kv *kvs;
    size_t n;
    assert_int_equal(tsr_etcd_get_prefix(e, "/t/", 0, &kvs, &n, NULL, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "/t/a");
    assert_string_equal(kvs[1].key, "/t/b");
    tsr_etcd_kvs_free(kvs, n);
    free(kvs);
    int64_t deleted;
    assert_int_equal(tsr_etcd_delete(e, "/t/", 1, &deleted, NULL, &err), 0);
    assert_int_equal(deleted, 2);
    assert_int_equal(tsr_etcd_get(e, "/t/a", &kv, NULL, &err), TSR_ENOTFOUND);
    assert_int_equal(tsr_etcd_get(e, "/u", &kv, NULL, &err), 0);
    tsr_etcd_kvs_free(&kv, 1);
    tsr_etcd_close(e);
}

static void test_txn(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    /* create if absent: the election's building block */
    tsr_etcd_cmp absent = {"/x/leader", TSR_ETCD_CREATE_REV, 0, NULL, 0};
    tsr_etcd_op put = {0, "/x/leader", "c1", 2, 0};
    int ok = -1;
    assert_int_equal(tsr_etcd_txn(e, &absent, 1, &put, 1, &ok, NULL, &err), 0);
    assert_int_equal(ok, 1);
    tsr_etcd_op put2 = {0, "/x/leader", "c2", 2, 0};
    assert_int_equal(tsr_etcd_txn(e, &absent, 1, &put2, 1, &ok, NULL, &err), 0);
    assert_int_equal(ok, 0);
    /* compare-and-swap on the mod revision, two keys at once */
    tsr_etcd_kv kv;
    assert_int_equal(tsr_etcd_get(e, "/x/leader", &kv, NULL, &err), 0);
    assert_string_equal((char *)kv.value, "c1");
    tsr_etcd_cmp cas[2] = {{"/x/leader", TSR_ETCD_MOD_REV, kv.mod_rev, NULL, 0},
                           {"/x/leader", TSR_ETCD_VALUE, 0, "c1", 2}};
    tsr_etcd_op ops[2] = {{0, "/x/version", "7", 1, 0}, {1, "/x/old", NULL, 0, 0}};
    assert_int_equal(tsr_etcd_txn(e, cas, 2, ops, 2, &ok, NULL, &err), 0);
    assert_int_equal(ok, 1);
    assert_int_equal(tsr_etcd_put(e, "/x/leader", "c3", 2, 0, NULL, &err), 0);
    tsr_etcd_op ops2 = {0, "/x/version", "8", 1, 0};
    assert_int_equal(tsr_etcd_txn(e, cas, 1, &ops2, 1, &ok, NULL, &err), 0);
    assert_int_equal(ok, 0); /* stale mod revision: a deposed writer cannot commit */
    tsr_etcd_kvs_free(&kv, 1);
    assert_int_equal(tsr_etcd_get(e, "/x/version", &kv, NULL, &err), 0);
    assert_string_equal((char *)kv.value, "7");
    tsr_etcd_kvs_free(&kv, 1);
    tsr_etcd_close(e);
}

static void test_lease(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    int64_t id, ttl;
    assert_int_equal(tsr_etcd_lease_grant(e, 2, &id, &ttl, &err), 0);
    assert_true(ttl >= 2);
    assert_int_equal(tsr_etcd_put(e, "/l/held", "me", 2, id, NULL, &err), 0);
    for (int i = 0; i < 6; i++) { /* 3 s > the ttl: kept alive */
        assert_int_equal(tsr_etcd_lease_keepalive(e, id, &ttl, &err), 0);
        assert_true(ttl > 0);
        usleep(500 * 1000);
    }
    tsr_etcd_kv kv;
    assert_int_equal(tsr_etcd_get(e, "/l/held", &kv, NULL, &err), 0);
    assert_int_equal(kv.lease, id);
    tsr_etcd_kvs_free(&kv, 1);
    assert_int_equal(tsr_etcd_lease_revoke(e, id, &err), 0);
    assert_int_equal(tsr_etcd_get(e, "/l/held", &kv, NULL, &err), TSR_ENOTFOUND);
    /* a lease nobody renews expires and takes its keys */
    assert_int_equal(tsr_etcd_lease_grant(e, 1, &id, &ttl, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/l/gone", "x", 1, id, NULL, &err), 0);
    int rc = 0;
    for (int t = 0; t < 60; t++) {
        usleep(100 * 1000);
        if ((rc = tsr_etcd_get(e, "/l/gone", &kv, NULL, &err)) == TSR_ENOTFOUND)
            break;
        tsr_etcd_kvs_free(&kv, 1);
    }
    assert_int_equal(rc, TSR_ENOTFOUND);
    assert_int_equal(tsr_etcd_lease_keepalive(e, id, &ttl, &err), TSR_ENOTFOUND);
    tsr_etcd_close(e);
}

static void test_watch(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    int64_t rev;
    assert_int_equal(tsr_etcd_put(e, "/w/before", "0", 1, 0, &rev, &err), 0);
    /* changes made between a read and its watch are not missed: watch from rev + 1 */
    assert_int_equal(tsr_etcd_put(e, "/w/a", "1", 1, 0, NULL, &err), 0);
    tsr_etcd_watch *w;
    assert_int_equal(tsr_etcd_watch_open(e, "/w/", 1, rev + 1, &w, &err), 0);
    tsr_etcd_event *ev;
    size_t n;
    assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ev[0].kv.key, "/w/a");
    assert_int_equal(ev[0].deleted, 0);
    tsr_etcd_events_free(ev, n);
    /* nothing happens: a timeout, and the pending receive is kept */
    assert_int_equal(tsr_etcd_watch_next(w, 200, &ev, &n, &err), TSR_ETIMEOUT);
    assert_int_equal(tsr_etcd_put(e, "/w/b", "2", 1, 0, NULL, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/other", "x", 1, 0, NULL, &err), 0);
    assert_int_equal(tsr_etcd_delete(e, "/w/a", 0, NULL, NULL, &err), 0);
    size_t seen = 0;
    const char *want[2] = {"/w/b", "/w/a"};
    while (seen < 2) {
        assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
        for (size_t i = 0; i < n; i++, seen++) {
            assert_true(seen < 2);
            assert_string_equal(ev[i].kv.key, want[seen]);
            assert_int_equal(ev[i].deleted, seen == 1);
        }
        tsr_etcd_events_free(ev, n);
    }
    tsr_etcd_watch_close(w);
    tsr_etcd_close(e);
}

/* Several keys on one stream: each event says which; the resume revision moves past it. */
static void test_watch_keys(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    tsr_etcd_watch_key keys[2] = {{"/m/a", 0, 0}, {"/m/b/", 1, 0}};
    tsr_etcd_watch *w;
    assert_int_equal(tsr_etcd_watch_open_keys(e, keys, 2, &w, &err), 0);
    assert_int_equal(tsr_etcd_watch_resume_rev(w, 0), 0); /* "from now": not resumable */
    int64_t r1, r2, r3;
    assert_int_equal(tsr_etcd_put(e, "/m/b/x", "1", 1, 0, &r1, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/m/a", "2", 1, 0, &r2, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/m/c", "-", 1, 0, NULL, &err), 0); /* not watched */
    assert_int_equal(tsr_etcd_delete(e, "/m/a", 0, NULL, &r3, &err), 0);
    size_t want_watch[3] = {1, 0, 0}, seen = 0;
    while (seen < 3) {
        tsr_etcd_event *ev;
        size_t n;
        assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
        for (size_t i = 0; i < n; i++, seen++) {
            assert_true(seen < 3);
            assert_int_equal(ev[i].watch, want_watch[seen]);
            assert_int_equal(ev[i].deleted, seen == 2);
        }
        tsr_etcd_events_free(ev, n);
    }
    assert_int_equal(tsr_etcd_watch_resume_rev(w, 0), r3 + 1);
    assert_int_equal(tsr_etcd_watch_resume_rev(w, 1), r1 + 1);
    tsr_etcd_watch_close(w);
    /* too many or no keys: refused with a message */
    assert_int_equal(tsr_etcd_watch_open_keys(e, keys, 0, &w, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "keys"));
    tsr_etcd_close(e);
}

/* Compaction: the history below a revision goes, a watch from there is refused (TSR_ESTATE),
 * compacting again is "already", a future revision is invalid. */
static void test_compact(void **state)
{
    (void)state;
    tsr_etcd *e = client();
    tsr_error err = TSR_ERROR_INIT;
    int64_t r1, r2, r3;
    assert_int_equal(tsr_etcd_put(e, "/c/k", "1", 1, 0, &r1, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/c/k", "2", 1, 0, &r2, &err), 0);
    assert_int_equal(tsr_etcd_put(e, "/c/k", "3", 1, 0, &r3, &err), 0);
    int already = -1;
    assert_int_equal(tsr_etcd_compact(e, r2, &already, &err), 0);
    assert_int_equal(already, 0);
    assert_int_equal(tsr_etcd_compact(e, r2, &already, &err), 0);
    assert_int_equal(already, 1);
    assert_int_equal(tsr_etcd_compact(e, r1, &already, &err), 0);
    assert_int_equal(already, 1);
    assert_int_equal(tsr_etcd_compact(e, r3 + 1000, &already, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "future"));
    assert_int_equal(tsr_etcd_compact(e, 0, NULL, &err), TSR_EINVAL);
    /* a watch from a compacted revision: TSR_ESTATE, at the open or at the first wait */
    tsr_etcd_watch_key keys[2] = {{"/c/other", 0, r3}, {"/c/k", 0, r1}};
    tsr_etcd_watch *w = NULL;
    int rc = tsr_etcd_watch_open_keys(e, keys, 2, &w, &err);
    if (rc == 0) {
        tsr_etcd_event *ev;
        size_t n;
        rc = tsr_etcd_watch_next(w, 2000, &ev, &n, &err);
        tsr_etcd_watch_close(w);
    }
    assert_int_equal(rc, TSR_ESTATE);
    assert_non_null(strstr(err.msg, "compacted"));
    /* from the current revision it works: the key's latest value */
    assert_int_equal(tsr_etcd_watch_open(e, "/c/k", 0, r3, &w, &err), 0);
    tsr_etcd_event *ev;
    size_t n;
    assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal((char *)ev[0].kv.value, "3");
    tsr_etcd_events_free(ev, n);
    tsr_etcd_watch_close(w);
    tsr_etcd_close(e);
}

/* streams_nowait (the coordinator's etcd channels): the watch's user never blocks in
 * gRPC's queue, a server's pollers in the same process do the I/O. With a server running:
 * events arrive (20 in a row: none is lost), a wait times out and loses nothing, a first
 * endpoint that is dead is skipped (a call that must wait for a connection: what aborts
 * core with a GRPC_CQ_NON_POLLING queue), closing returns. */
static void test_watch_nowait(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts so;
    tsr_rpc_server_opts_init(&so);
    so.listen = "127.0.0.1:0";
    tsr_rpc_server *srv = tsr_rpc_server_create(&so, &err);
    assert_non_null(srv);
    assert_int_equal(tsr_rpc_server_start(srv, &err), 0);
    tsr_rpc_client_opts co;
    tsr_rpc_client_opts_init(&co);
    co.streams_nowait = 1;
    char eps[320];
    snprintf(eps, sizeof eps, "127.0.0.1:%d,%s", free_port(), E.endpoints);
    tsr_etcd *e = tsr_etcd_open(eps, &co, 2000, &err);
    assert_non_null(e);
    tsr_etcd_watch_key keys[2] = {{"/cb/a", 0, 0}, {"/cb/b/", 1, 0}};
    tsr_etcd_watch *w;
    assert_int_equal(tsr_etcd_watch_open_keys(e, keys, 2, &w, &err), 0);
    tsr_etcd_event *ev;
    size_t n;
    assert_int_equal(tsr_etcd_watch_next(w, 200, &ev, &n, &err), TSR_ETIMEOUT);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(tsr_etcd_put(e, "/cb/b/0", "x", 1, 0, NULL, &err), 0);
        assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
        tsr_etcd_events_free(ev, n);
    }
    assert_int_equal(tsr_etcd_put(e, "/cb/b/1", "x", 1, 0, NULL, &err), 0);
    assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0].watch, 1);
    assert_string_equal(ev[0].kv.key, "/cb/b/1");
    tsr_etcd_events_free(ev, n);
    assert_int_equal(tsr_etcd_delete(e, "/cb/a", 0, NULL, NULL, &err), 0); /* no event */
    assert_int_equal(tsr_etcd_put(e, "/cb/a", "y", 1, 0, NULL, &err), 0);
    assert_int_equal(tsr_etcd_watch_next(w, 2000, &ev, &n, &err), 0);
    assert_int_equal(ev[0].watch, 0);
    tsr_etcd_events_free(ev, n);
    tsr_etcd_watch_close(w);
    tsr_etcd_close(e);
    tsr_rpc_server_destroy(srv);
}

static void test_failover(void **state)
{
    (void)state;
    cluster_start(3);
    tsr_error err = TSR_ERROR_INIT;
    /* a dead endpoint first in the list is skipped */
    char eps[320];
    snprintf(eps, sizeof eps, "127.0.0.1:%d,%s", free_port(), E.endpoints);
    tsr_etcd *e = tsr_etcd_open(eps, NULL, 1000, &err);
    assert_non_null(e);
    assert_int_equal(tsr_etcd_put(e, "/f/k", "1", 1, 0, NULL, &err), 0);
    /* kill the member that answered (m0, the first live one in the list): the two others
     * still make a quorum */
    member_kill(0);
    int rc = -1;
    for (int t = 0; t < 50 && rc; t++) { /* a new raft leader may take an election */
        rc = tsr_etcd_put(e, "/f/k", "2", 1, 0, NULL, &err);
        if (rc)
            usleep(100 * 1000);
    }
    assert_int_equal(rc, 0);
    tsr_etcd_kv kv;
    assert_int_equal(tsr_etcd_get(e, "/f/k", &kv, NULL, &err), 0);
    assert_string_equal((char *)kv.value, "2");
    tsr_etcd_kvs_free(&kv, 1);
    tsr_etcd_close(e);
    /* every endpoint dead: UNAVAILABLE, naming each */
    char dead[128];
    int p1 = free_port(), p2 = free_port();
    snprintf(dead, sizeof dead, "127.0.0.1:%d,127.0.0.1:%d", p1, p2);
    e = tsr_etcd_open(dead, NULL, 500, &err);
    assert_non_null(e);
    assert_int_equal(tsr_etcd_put(e, "/f/k", "3", 1, 0, NULL, &err), TSR_EUNAVAILABLE);
    char a1[32], a2[32];
    snprintf(a1, sizeof a1, ":%d", p1);
    snprintf(a2, sizeof a2, ":%d", p2);
    assert_non_null(strstr(err.msg, a1));
    assert_non_null(strstr(err.msg, a2));
    tsr_etcd_close(e);
    /* malformed endpoint lists are refused with a message */
    assert_null(tsr_etcd_open("", NULL, 0, &err));
    assert_non_null(strstr(err.msg, "none given"));
    assert_null(tsr_etcd_open("localhost", NULL, 0, &err));
    assert_non_null(strstr(err.msg, "host:port"));
    cluster_stop();
}

int main(void)
{
    if (!etcd_bin()) {
        printf("SKIP: etcd is not installed (Debian package etcd-server; make deps installs it)\n");
        return 77;
    }
    snprintf(E.dir, sizeof E.dir, "/tmp/tsr-test-etcd-%d", (int)getpid());
    const struct CMUnitTest one[] = {
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_txn),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_watch_keys),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_watch_nowait),
    };
    const struct CMUnitTest three[] = {
        cmocka_unit_test(test_failover),
    };
    int rc = cmocka_run_group_tests_name("etcd, one member", one, one_up, down);
    rc += cmocka_run_group_tests_name("etcd, three members", three, NULL, down);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", E.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_etcd: could not remove %s\n", E.dir);
    return rc;
}
