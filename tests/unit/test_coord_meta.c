/*
 * test_coord_meta — the etcd mirror of the streamed-write log (coordinator/meta.c,
 * tsr__meta_log_put / _fetch) against a real one-member etcd: a round is logged whole
 * (one chunk, and 2.5 MiB in three chunks), a put repeated with the same bytes settles as
 * logged (what a try whose answer was lost does), another round at a taken seq and a put
 * whose fence fails are refused (TSR_ESTATE, nothing changed), and with etcd gone the put
 * gives up after its wait with an outcome-unknown error, not a refusal. Exit 77 (SKIP)
 * without etcd.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "etcd_test_util.h"
#include "core/clock.h"
#include "core/mem.h"
#include "meta.h"

typedef struct got {
    uint8_t *buf;
    size_t len;
    int n;
} got;

static int keep(void *ud, const uint8_t *buf, size_t len, tsr_error *err)
{
    got *g = ud;
    (void)err;
    free(g->buf);
    g->buf = tsr_xmalloc(len ? len : 1);
    memcpy(g->buf, buf, len);
    g->len = len;
    g->n++;
    return 0;
}

/* The record at seq equals buf (n records: 1), or there is none (buf NULL). */
static void expect_record(tsr__meta *m, int64_t seq, const uint8_t *buf, size_t len)
{
    got g = {0};
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr__meta_log_fetch(m, 1, seq, keep, &g, &err), 0);
    if (!buf) {
        assert_int_equal(g.n, 0);
    } else {
        assert_int_equal(g.n, 1);
        assert_int_equal(g.len, len);
        assert_memory_equal(g.buf, buf, len);
    }
    free(g.buf);
}

static void test_log_put(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__meta *m = NULL;
    assert_int_equal(tsr__meta_open(E.endpoints, "/t/meta", NULL, 2, &m, &err), 0);
    tsr_etcd *e = tsr_etcd_open(E.endpoints, NULL, 2000, &err);
    assert_non_null(e);
    assert_int_equal(tsr_etcd_put(e, "/t/meta/leader", "me", 2, 0, NULL, &err), 0);
    tsr_etcd_cmp fence = {"/t/meta/leader", TSR_ETCD_VALUE, 0, "me", 2};

    uint8_t small[100], other[100];
    for (size_t i = 0; i < sizeof small; i++) {
        small[i] = (uint8_t)i;
        other[i] = (uint8_t)(255 - i);
    }
    assert_int_equal(tsr__meta_log_put(m, 1, 1, small, sizeof small, &fence, 1, 1000, &err), 0);
    expect_record(m, 1, small, sizeof small);
    /* the same bytes again: an earlier try landed, its answer lost -> logged */
    assert_int_equal(tsr__meta_log_put(m, 1, 1, small, sizeof small, &fence, 1, 1000, &err), 0);
    /* another round at a taken seq: refused, the kept round untouched */
    assert_int_equal(tsr__meta_log_put(m, 1, 1, other, sizeof other, &fence, 1, 1000, &err),
                     TSR_ESTATE);
    assert_non_null(strstr(err.msg, "the seq holds another round"));
    expect_record(m, 1, small, sizeof small);

    /* a record of three chunks (1 MiB each at most) */
    size_t big_len = (size_t)5 << 19; /* 2.5 MiB */
    uint8_t *big = tsr_xmalloc(big_len), *big2 = tsr_xmalloc(big_len);
    for (size_t i = 0; i < big_len; i++) {
        big[i] = (uint8_t)(i * 7 + 3);
        big2[i] = (uint8_t)(i * 5 + 1);
    }
    assert_int_equal(tsr__meta_log_put(m, 1, 2, big, big_len, &fence, 1, 1000, &err), 0);
    expect_record(m, 2, big, big_len);
    assert_int_equal(tsr__meta_log_put(m, 1, 2, big, big_len, &fence, 1, 1000, &err), 0);
    assert_int_equal(tsr__meta_log_put(m, 1, 2, big2, big_len, &fence, 1, 1000, &err),
                     TSR_ESTATE);
    expect_record(m, 2, big, big_len); /* no chunk of big2 landed on the completed record */

    /* the fence fails (another leader): refused, nothing at seq 3 */
    assert_int_equal(tsr_etcd_put(e, "/t/meta/leader", "it", 2, 0, NULL, &err), 0);
    assert_int_equal(tsr__meta_log_put(m, 1, 3, small, sizeof small, &fence, 1, 1000, &err),
                     TSR_ESTATE);
    assert_non_null(strstr(err.msg, "not the leader"));
    expect_record(m, 3, NULL, 0);
    assert_int_equal(tsr_etcd_put(e, "/t/meta/leader", "me", 2, 0, NULL, &err), 0);

    /* etcd gone: in doubt after the wait, never a refusal */
    member_kill(0);
    int64_t t0 = tsr_clock_mono_ms();
    int rc = tsr__meta_log_put(m, 1, 3, small, sizeof small, &fence, 1, 400, &err);
    int64_t took = tsr_clock_mono_ms() - t0;
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(rc, TSR_ESTATE);
    assert_non_null(strstr(err.msg, "outcome unknown"));
    assert_true(took >= 400);
    assert_true(took < 30000);

    free(big);
    free(big2);
    tsr_etcd_close(e);
    tsr__meta_close(m);
}

int main(void)
{
    if (!etcd_bin()) {
        printf("SKIP: etcd is not installed (Debian package etcd-server; make deps installs it)\n");
        return 77;
    }
    snprintf(E.dir, sizeof E.dir, "/tmp/tsr-test-meta-%d", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_put),
    };
    int rc = cmocka_run_group_tests_name("coordinator meta: the stream log in etcd", tests,
                                         one_up, down);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", E.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_coord_meta: could not remove %s\n", E.dir);
    return rc;
}
