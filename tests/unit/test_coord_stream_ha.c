/*
 * test_coord_stream_ha — the streamed-write log's mirror in etcd (coordinator/stream_ha.c)
 * against a real one-member etcd (exit 77, SKIP, without one): a leader holding the leader
 * key mirrors a version's header and rounds, and another coordinator's store restores the
 * local log from them (the same records in order, *found set); a follower mirrors nothing
 * through tsr__shlog_mirror, but a writer's round (tsr__shlog_mirror_round) is always put,
 * fenced; once another coordinator holds the key the fenced round is refused (nothing in
 * etcd) and the lease thread is asked to re-read etcd's rounds (lead.readopt, kick) — for
 * a round, not for a version's header;
 * dropping a version removes its records (restore finds none and leaves the local log);
 * records of another version or a round before its header are refused by name (and the
 * log is not reported found).
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
#include "coord_test_util.h"
#include "core/mem.h"
#include "meta.h"
#include "tessera/v1/coord_log.pb-c.h"

static char tmp[512];

static void rec_init(Tessera__V1__CoordLogRecord *r, int64_t v, int64_t seq)
{
    tessera__v1__coord_log_record__init(r);
    r->version = v;
    r->seq = seq;
    r->next_label = 1000 + seq;
    r->next_seq = seq + 1;
}

/* A coordinator with --etcd (prefix /t/ha), a store under tmp/name, not leading. */
static void coord_open(tsr__coord *c, const char *name)
{
    tsr_error err = TSR_ERROR_INIT;
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lead.mu, NULL);
    pthread_cond_init(&c->lead.cv, NULL);
    c->lead.ttl_s = 2;
    char d[700];
    snprintf(d, sizeof d, "%s/%s", tmp, name);
    assert_int_equal(tsr_store_create(d, &c->store, &err), 0);
    assert_int_equal(tsr__meta_open(E.endpoints, "/t/ha", NULL, 2, &c->meta, &err), 0);
}

static void coord_close(tsr__coord *c)
{
    tsr__meta_close(c->meta);
    tsr_store_destroy(c->store);
    pthread_cond_destroy(&c->lead.cv);
    pthread_mutex_destroy(&c->lead.mu);
}

/* c wins the leader key (the election's transaction) with a lease of its own. */
static void win(tsr__coord *c, const char *addr)
{
    tsr_error err = TSR_ERROR_INIT;
    char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    int64_t lease = 0, granted = 0, rev = 0;
    assert_int_equal(tsr_etcd_lease_grant(c->meta->fast, 10, &lease, &granted, &err), 0);
    tsr_etcd_cmp absent = {key, TSR_ETCD_CREATE_REV, 0, NULL, 0};
    tsr_etcd_op put = {0, key, addr, strlen(addr), lease};
    int ok = 0;
    assert_int_equal(tsr_etcd_txn(c->meta->fast, &absent, 1, &put, 1, &ok, &rev, &err), 0);
    assert_true(ok);
    atomic_store(&c->lead.lease, lease);
    atomic_store(&c->lead.term, rev);
    atomic_store(&c->lead.leading, 1);
}

typedef struct seen {
    int64_t seq[16], next_label[16];
    int n;
} seen;

static int collect(void *ud, const Tessera__V1__CoordLogRecord *rec, int64_t offset)
{
    seen *s = ud;
    (void)offset;
    if (s->n < 16) {
        s->seq[s->n] = rec->seq;
        s->next_label[s->n] = rec->next_label;
    }
    s->n++;
    return 0;
}

static seen local_log(tsr__coord *c, uint64_t v)
{
    tsr_error err = TSR_ERROR_INIT;
    char path[4200], why[256];
    tsr__slog_path(c->store, v, path, sizeof path);
    seen s;
    memset(&s, 0, sizeof s);
    int64_t good = 0;
    int rc = tsr__slog_scan(path, 0, collect, &s, &good, why, sizeof why, &err);
    if (rc == TSR_ENOTFOUND)
        s.n = -1;
    else
        assert_int_equal(rc, 0);
    return s;
}

static void test_mirror_restore(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__coord a, b;
    coord_open(&a, "a");
    coord_open(&b, "b");
    Tessera__V1__CoordLogRecord r;

    /* a follower mirrors nothing (its log is its own scratch) */
    rec_init(&r, 3, 0);
    assert_int_equal(tsr__shlog_mirror(&a, &r, &err), 0);
    int found = 1;
    assert_int_equal(tsr__shlog_restore(&b, 3, &found, &err), 0);
    assert_false(found);

    /* the leader mirrors the header and three rounds */
    win(&a, "10.0.0.1:9000");
    assert_int_equal(tsr__shlog_mirror(&a, &r, &err), 0);
    for (int64_t s = 1; s <= 3; s++) {
        rec_init(&r, 3, s);
        assert_int_equal(tsr__shlog_mirror_round(&a, &r, &err), 0);
    }
    assert_int_equal(atomic_load(&a.lead.readopt), 0);
    /* another coordinator's local log of version 3 rebuilt from etcd, in order */
    assert_int_equal(tsr__shlog_restore(&b, 3, &found, &err), 0);
    assert_true(found);
    seen s = local_log(&b, 3);
    assert_int_equal(s.n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s.seq[i], i);
        assert_int_equal(s.next_label[i], 1000 + i);
    }

    /* another coordinator takes the key: a's round is refused by the fence, nothing
     * lands, and the lease thread is asked to re-read etcd's rounds */
    char key[300];
    tsr__meta_key(a.meta, "/leader", key, sizeof key);
    assert_int_equal(tsr_etcd_lease_revoke(a.meta->fast, atomic_load(&a.lead.lease), &err), 0);
    win(&b, "10.0.0.2:9000");
    rec_init(&r, 3, 4);
    assert_int_not_equal(tsr__shlog_mirror_round(&a, &r, &err), 0);
    assert_int_equal(atomic_load(&a.lead.readopt), 1);
    assert_int_equal(a.lead.kick, 1);
    assert_int_equal(tsr__shlog_restore(&b, 3, &found, &err), 0);
    s = local_log(&b, 3);
    assert_int_equal(s.n, 4); /* round 4 is not in etcd */
    /* the first round of a version too; a header refused is the update's failure, not a
     * round in doubt: no re-read asked */
    atomic_store(&a.lead.readopt, 0);
    a.lead.kick = 0;
    rec_init(&r, 5, 0);
    assert_int_not_equal(tsr__shlog_mirror_round(&a, &r, &err), 0);
    assert_int_equal(atomic_load(&a.lead.readopt), 0);
    assert_int_equal(a.lead.kick, 0);
    rec_init(&r, 5, 1);
    assert_int_not_equal(tsr__shlog_mirror_round(&a, &r, &err), 0);
    assert_int_equal(atomic_load(&a.lead.readopt), 1);
    assert_int_equal(tsr__shlog_restore(&b, 5, &found, &err), 0);
    assert_false(found);

    /* the new leader drops version 3's records: restore finds none, the local log stays */
    tsr__shlog_drop(&b, 3);
    assert_int_equal(tsr__shlog_restore(&b, 3, &found, &err), 0);
    assert_false(found);
    s = local_log(&b, 3);
    assert_int_equal(s.n, 4);
    /* version 0 (nothing committed) is never restored */
    assert_int_equal(tsr__shlog_restore(&b, 0, &found, &err), 0);
    assert_false(found);
    assert_int_equal(tsr_etcd_lease_revoke(b.meta->fast, atomic_load(&b.lead.lease), &err), 0);
    coord_close(&a);
    coord_close(&b);
}

static void test_restore_refuses(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__coord a;
    coord_open(&a, "c");
    win(&a, "10.0.0.3:9000");
    /* a round of version 7 with no header before it */
    Tessera__V1__CoordLogRecord r;
    rec_init(&r, 7, 1);
    assert_int_equal(tsr__shlog_mirror_round(&a, &r, &err), 0);
    int found = 1;
    assert_int_equal(tsr__shlog_restore(&a, 7, &found, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "comes before its header"));
    assert_false(found);
    assert_int_equal(local_log(&a, 7).n, -1); /* no local log made */
    /* a record under version 8 that names version 9 (put unfenced: meta.c's own put) */
    tsr_error e2 = TSR_ERROR_INIT;
    tsr_etcd_cmp nofence[1];
    size_t len = 0;
    rec_init(&r, 9, 0);
    uint8_t *buf = tsr_rpc_pack(&r.base, &len);
    assert_int_equal(tsr__meta_log_put(a.meta, 8, 0, buf, len, nofence, 0, 5000, &e2), 0);
    free(buf);
    assert_int_equal(tsr__shlog_restore(&a, 8, &found, &e2), TSR_EFORMAT);
    assert_non_null(strstr(e2.msg, "names version 9"));
    assert_false(found);
    /* a header, then a record naming another version: refused, not found */
    tsr_error e3 = TSR_ERROR_INIT;
    rec_init(&r, 10, 0);
    assert_int_equal(tsr__shlog_mirror_round(&a, &r, &e3), 0);
    rec_init(&r, 11, 1);
    buf = tsr_rpc_pack(&r.base, &len);
    assert_int_equal(tsr__meta_log_put(a.meta, 10, 1, buf, len, nofence, 0, 5000, &e3), 0);
    free(buf);
    found = 1;
    assert_int_equal(tsr__shlog_restore(&a, 10, &found, &e3), TSR_EFORMAT);
    assert_false(found);
    tsr_etcd_lease_revoke(a.meta->fast, atomic_load(&a.lead.lease), &err);
    coord_close(&a);
}

int main(void)
{
    if (!etcd_bin()) {
        printf("SKIP: etcd is not installed (Debian package etcd-server; make deps installs it)\n");
        return 77;
    }
    snprintf(E.dir, sizeof E.dir, "/tmp/tsr-test-ha-%d", (int)getpid());
    coord_test_tmpdir(tmp, sizeof tmp, "tsr-test-stream-ha");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirror_restore),
        cmocka_unit_test(test_restore_refuses),
    };
    int rc = cmocka_run_group_tests_name("stream log mirror in etcd", tests, one_up, down);
    coord_test_rmtree(tmp);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", E.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_coord_stream_ha: could not remove %s\n", E.dir);
    return rc;
}
