/*
 * test_coord_state — the coordinator's snapshot parts without a server (libtsr_coord.a):
 * the id directory (add, find, growth past its first table, missing ids), the plan
 * builders (balanced: every list on a valid group, loads within one list of each other;
 * locality: lists of one centroid cluster together on one group; both deterministic),
 * and a snapshot's save to and load from a store (template, plan, directory, counters),
 * with the served-snapshot accessors (tsr__coord_snap_get/set, reference counts).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coord.h"
#include "coord_test_util.h"
#include "core/mem.h"

static void test_dir(void **state)
{
    (void)state;
    tsr__dir d;
    tsr__dir_init(&d);
    char id[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "id-%d", i);
        tsr__dir_add(&d, id, 100 + i, i % 7, i % 3, i % 2, i % 5 == 0);
    }
    assert_int_equal(d.n, 5000);
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "id-%d", i);
        const tsr__dir_entry *e = tsr__dir_find(&d, id);
        assert_non_null(e);
        assert_string_equal(e->id, id);
        assert_int_equal(e->label, 100 + i);
        assert_int_equal(e->list, i % 7);
        assert_int_equal(e->shard, i % 3);
        assert_int_equal(e->dense, i % 2);
        assert_int_equal(e->sparse, i % 5 == 0);
    }
    assert_null(tsr__dir_find(&d, "id-5000"));
    assert_null(tsr__dir_find(&d, ""));
    tsr__dir_close(&d);
    tsr__dir_init(&d);
    assert_null(tsr__dir_find(&d, "id-1")); /* empty directory */
    tsr__dir_close(&d);
}

static void test_plan_balanced(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    size_t nlist = 37, S = 4;
    tsr_ivfpq *t = tsr_ivfpq_create(8, nlist, 2, 8, TSR_METRIC_L2, 1, &err);
    assert_non_null(t);
    int64_t sizes[37];
    int64_t maxsz = 0;
    for (size_t l = 0; l < nlist; l++) {
        sizes[l] = (int64_t)((l * 7919) % 101);
        if (sizes[l] + 1 > maxsz)
            maxsz = sizes[l] + 1;
    }
    int32_t plan[37], again[37];
    tsr__plan_build(TSR_PLAN_BALANCED, t, sizes, S, 1, plan);
    tsr__plan_build(TSR_PLAN_BALANCED, t, sizes, S, 1, again);
    assert_memory_equal(plan, again, sizeof plan);
    int64_t load[4] = {0};
    for (size_t l = 0; l < nlist; l++) {
        assert_true(plan[l] >= 0 && (size_t)plan[l] < S);
        load[plan[l]] += sizes[l] + 1; /* the builder counts an empty list as 1 */
    }
    int64_t lo = load[0], hi = load[0];
    for (size_t s = 1; s < S; s++) {
        lo = load[s] < lo ? load[s] : lo;
        hi = load[s] > hi ? load[s] : hi;
    }
    assert_true(hi - lo <= maxsz); /* greedy largest-first: within one list */
    /* one group: everything on it */
    tsr__plan_build(TSR_PLAN_BALANCED, t, sizes, 1, 1, plan);
    for (size_t l = 0; l < nlist; l++)
        assert_int_equal(plan[l], 0);
    tsr_ivfpq_destroy(t);
}

static void test_plan_locality(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    size_t nlist = 16, S = 2, d = 4;
    tsr_ivfpq *t = tsr_ivfpq_create((int)d, nlist, 2, 8, TSR_METRIC_L2, 1, &err);
    assert_non_null(t);
    /* two far-apart clusters of 8 centroids: lists 0..7 near 0, 8..15 near 100 */
    for (size_t l = 0; l < nlist; l++)
        for (size_t j = 0; j < d; j++)
            t->centroids[l * d + j] = (l < 8 ? 0.0f : 100.0f) + (float)((l * 3 + j) % 5) * 0.1f;
    int64_t sizes[16];
    for (size_t l = 0; l < nlist; l++)
        sizes[l] = 10;
    int32_t plan[16];
    tsr__plan_build(TSR_PLAN_LOCALITY, t, sizes, S, 42, plan);
    for (size_t l = 1; l < 8; l++)
        assert_int_equal(plan[l], plan[0]);
    for (size_t l = 9; l < 16; l++)
        assert_int_equal(plan[l], plan[8]);
    assert_int_not_equal(plan[0], plan[8]);
    tsr_ivfpq_destroy(t);
}

static void test_snap_save_load(void **state)
{
    (void)state;
    char dir[512];
    coord_test_tmpdir(dir, sizeof dir, "tsr-coord-state");
    tsr_error err = TSR_ERROR_INIT;
    tsr_store *st = NULL;
    assert_int_equal(tsr_store_create(dir, &st, &err), 0);
    tsr__snap *s = coord_test_snapshot(3, 8, 2, &err);
    assert_non_null(s);
    char id[32];
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof id, "doc/%04d", i);
        tsr__dir_add(&s->dir, id, i, i % 8, s->plan[i % 8], 1, i % 3 == 0);
    }
    s->next_label = 300;
    s->ndense = 300;
    s->nsparse = 100;
    assert_int_equal(tsr__snap_save(s, st, &err), 0);
    assert_int_equal(tsr_store_set_current(st, 3, &err), 0);
    tsr__snap *l = NULL;
    assert_int_equal(tsr__snap_load(st, 3, &l, &err), 0);
    assert_int_equal(l->version, 3);
    assert_int_equal(l->tmpl->nlist, 8);
    assert_int_equal(l->tmpl_len, s->tmpl_len);
    assert_memory_equal(l->tmpl_bytes, s->tmpl_bytes, s->tmpl_len);
    assert_memory_equal(l->plan, s->plan, 8 * sizeof *s->plan);
    assert_int_equal(l->plan_kind, s->plan_kind);
    assert_int_equal(l->next_label, 300);
    assert_int_equal(l->dir.n, 300);
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof id, "doc/%04d", i);
        const tsr__dir_entry *e = tsr__dir_find(&l->dir, id);
        assert_non_null(e);
        assert_int_equal(e->label, i);
        assert_int_equal(e->list, i % 8);
        assert_int_equal(e->sparse, i % 3 == 0);
    }
    /* a version that was never written does not load */
    tsr__snap *none = NULL;
    assert_int_not_equal(tsr__snap_load(st, 4, &none, &err), 0);
    assert_null(none);

    /* the served snapshot: get takes a reference, set swaps and drops the old one */
    tsr__coord c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.snap_mu, NULL);
    c.snap = s;
    tsr__snap *g = tsr__coord_snap_get(&c);
    assert_ptr_equal(g, s);
    assert_int_equal(atomic_load(&s->refs), 2);
    tsr__coord_snap_set(&c, l); /* drops c's reference to s; g still holds one */
    assert_int_equal(atomic_load(&s->refs), 1);
    tsr__snap *g2 = tsr__coord_snap_get(&c);
    assert_ptr_equal(g2, l);
    tsr__snap_unref(g2);
    tsr__snap_unref(g);
    tsr__snap_unref(c.snap);
    pthread_mutex_destroy(&c.snap_mu);
    tsr_store_destroy(st);
    coord_test_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir),
        cmocka_unit_test(test_plan_balanced),
        cmocka_unit_test(test_plan_locality),
        cmocka_unit_test(test_snap_save_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
