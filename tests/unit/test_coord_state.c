/*
 * test_coord_state — the coordinator's snapshot parts without a server (libtsr_coord.a):
 * the id directory (add, find, growth past its first table, missing ids; remove against a
 * model through random add / set / remove rounds, every id found or not as the model
 * says, with small tables whose probe runs wrap around their end), the plan
 * builders (balanced: every list on a valid group, loads within one list of each other;
 * locality: lists of one centroid cluster together on one group; both deterministic),
 * and a snapshot's save to and load from a store (template, plan, directory, counters),
 * with the served-snapshot accessors (tsr__coord_snap_get/set, reference counts); the
 * shard groups a reshard stores with a version (groups_text / set_groups round trip, an
 * added group, a removed one, malformed texts refused with the line named, drop_groups);
 * tsr__snap_retire waiting for a query's hold, and giving up on one that outlasts it.
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

/* tsr__dir_remove: random rounds of add / set / remove of ids from a pool checked against
 * a model: every present id found with its label, every removed one absent, n the
 * model's count. Pool 0 holds ids whose home slot (2048 slots: the table stays that size
 * under 1024 entries) is one of the last 8 or the first 7, so probe runs are long and wrap
 * around the table's end; pools 1 and 2 are plain ids (600, 3000: the table grows). */
static void test_dir_remove(void **state)
{
    (void)state;
    enum { POOL = 3000, ROUNDS = 40000 };
    int64_t *model = calloc(POOL, sizeof *model); /* label + 1, 0 = absent */
    char (*ids)[24] = calloc(POOL, sizeof *ids);
    assert_non_null(model);
    assert_non_null(ids);
    uint64_t x = 88172645463325252ull;
    for (int seed = 0; seed < 3; seed++) {
        size_t pool = 0, hi = 0, lo = 0;
        for (size_t k = 0; pool < (seed == 0 ? 200 : seed == 1 ? 600 : POOL); k++) {
            snprintf(ids[pool], sizeof ids[pool], "k%zu", k);
            size_t home = tsr__hash_str(ids[pool]) & 2047;
            if (seed == 0 && home >= 2040 && hi < 120)
                hi++, pool++;
            else if (seed == 0 && home <= 6 && lo < 80)
                lo++, pool++;
            else if (seed != 0)
                pool++;
        }
        tsr__dir d;
        tsr__dir_init(&d);
        memset(model, 0, POOL * sizeof *model);
        size_t present = 0;
        for (int r = 0; r < ROUNDS; r++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t i = (size_t)(x % pool);
            if ((x >> 32) % 3 == 0) { /* remove */
                assert_int_equal(tsr__dir_remove(&d, ids[i]), model[i] != 0);
                present -= model[i] != 0;
                model[i] = 0;
            } else { /* add or overwrite (the overlay's set) */
                present += model[i] == 0;
                tsr__dir_set(&d, ids[i], r, (int32_t)(i % 5), 0, 1, 0, 0);
                model[i] = r + 1;
            }
            assert_int_equal(d.n, present);
            if (r % 97 == 0 || r + 1 == ROUNDS)
                for (size_t k = 0; k < pool; k++) {
                    const tsr__dir_entry *e = tsr__dir_find(&d, ids[k]);
                    if (model[k]) {
                        assert_non_null(e);
                        assert_int_equal(e->label, model[k] - 1);
                    } else {
                        assert_null(e);
                    }
                }
        }
        if (seed == 0)
            assert_int_equal(d.mask, 2047); /* the wrap-around case ran on 2048 slots */
        tsr__dir_close(&d);
    }
    free(ids);
    free(model);
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

/* A query thread's hold on a retired snapshot: it releases when `go` is set (0 = at once
 * after a short sleep). released is set just before its unref. */
typedef struct holder {
    tsr__snap *s;
    atomic_int go, released;
    int wait_go;
} holder;

static void *holder_run(void *arg)
{
    holder *h = arg;
    struct timespec ms = {0, 1000000};
    if (h->wait_go)
        while (!atomic_load(&h->go))
            nanosleep(&ms, NULL);
    else
        for (int i = 0; i < 20; i++)
            nanosleep(&ms, NULL);
    atomic_store(&h->released, 1);
    tsr__snap_unref(h->s); /* the last reference when retire gave up waiting */
    return NULL;
}

/* tsr__snap_retire: with a query still on the snapshot it waits for the query to let go
 * (then the retiring thread frees it), up to wait_ms (then the query frees it); wait 0
 * is a plain unref. Freed exactly once in each case: the sanitizer build (make test-san)
 * reports a leak, a double free or a use after free. */
static void test_snap_retire(void **state)
{
    (void)state;
    tsr__snap_retire(tsr__snap_create(), 0); /* the only reference: freed at once */
    tsr__snap_retire(NULL, 100);             /* nothing to drop */

    /* a query lets go within the wait: retire returns only after it did */
    holder a = {.s = tsr__snap_create(), .wait_go = 0};
    atomic_fetch_add(&a.s->refs, 1);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, holder_run, &a), 0);
    tsr__snap_retire(a.s, 60000);
    assert_int_equal(atomic_load(&a.released), 1);
    pthread_join(t, NULL);

    /* a query that holds on past the wait: retire gives up, the query frees it */
    holder b = {.s = tsr__snap_create(), .wait_go = 1};
    atomic_fetch_add(&b.s->refs, 1);
    assert_int_equal(pthread_create(&t, NULL, holder_run, &b), 0);
    tsr__snap_retire(b.s, 20); /* returns although the holder waits for `go` */
    assert_int_equal(atomic_load(&b.released), 0);
    atomic_store(&b.go, 1);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&b.released), 1);
}

static void test_groups_text(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__coord_config a;
    memset(&a, 0, sizeof a);
    const char *g0[] = {"10.0.0.1:7001", "10.0.0.2:7001"}, *g1[] = {"h1:7001"},
               *g2[] = {"h2:7001"};
    assert_int_equal(tsr__coord_config_add_group(&a, g0, 2, &err), 0);
    assert_int_equal(tsr__coord_config_add_group(&a, g1, 1, &err), 0);
    assert_int_equal(tsr__coord_config_add_group(&a, g2, 1, &err), 0);
    /* an address already in a live group is refused */
    assert_int_equal(tsr__coord_config_add_group(&a, g1, 1, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "also a replica"));
    size_t len = 0;
    char *t = tsr__coord_config_groups_text(&a, 1, &len); /* group 1 written as removed */
    assert_string_equal(t, "tessera-groups 1\n3\nlive 10.0.0.1:7001 10.0.0.2:7001\n"
                           "retired h1:7001\nlive h2:7001\n");
    tsr__coord_config b;
    memset(&b, 0, sizeof b);
    const char *one[] = {"x:1"};
    assert_int_equal(tsr__coord_config_add_group(&b, one, 1, &err), 0);
    assert_int_equal(tsr__coord_config_set_groups(&b, t, len, &err), 0);
    assert_int_equal(b.nshards, 3);
    assert_int_equal(b.nreplicas[0], 2);
    assert_string_equal(b.replicas[0][1], "10.0.0.2:7001");
    assert_true(b.retired[1] && !b.retired[0] && !b.retired[2]);
    assert_true(b.resharded);
    /* a removed group's address may come back as a new group */
    assert_int_equal(tsr__coord_config_add_group(&b, g1, 1, &err), 0);
    assert_int_equal(b.nshards, 4);
    free(t);
    static const char *bad[] = {
        "", "tessera-groups 2\n1\nlive a:1\n", "tessera-groups 1\n0\n",
        "tessera-groups 1\n999\nlive a:1\n", "tessera-groups 1\n2\nlive a:1\n",
        "tessera-groups 1\n1\nmaybe a:1\n", "tessera-groups 1\n1\nlive\n",
        "tessera-groups 1\n2\nlive a:1\nlive a:1\n",
        "tessera-groups 1\n1\nlive a:1 a:2 a:3 a:4 a:5 a:6 a:7 a:8 a:9 a:10 a:11 a:12 a:13 "
        "a:14 a:15 a:16 a:17\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tsr_error_clear(&err);
        assert_int_not_equal(tsr__coord_config_set_groups(&b, bad[i], strlen(bad[i]), &err), 0);
        assert_true(err.msg[0] != 0);
        assert_int_equal(b.nshards, 4); /* unchanged */
    }
    /* a follower drops failed adds of its own (drop_groups) and takes the committed
     * version's groups under those numbers; the dropped lists are freed at close */
    tsr__coord_config_drop_groups(&b, 2);
    assert_int_equal(b.nshards, 2);
    assert_int_equal(b.ndropped, 2);
    const char *g3[] = {"h3:7001"};
    assert_int_equal(tsr__coord_config_add_group(&b, g3, 1, &err), 0);
    assert_int_equal(b.nshards, 3);
    assert_string_equal(b.shards[2], "h3:7001");
    tsr__coord_config_drop_groups(&b, 5); /* nothing above: no-op */
    assert_int_equal(b.nshards, 3);
    tsr__coord_config_close(&a);
    tsr__coord_config_close(&b);
    assert_null(b.dropped);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir),
        cmocka_unit_test(test_dir_remove),
        cmocka_unit_test(test_plan_balanced),
        cmocka_unit_test(test_plan_locality),
        cmocka_unit_test(test_snap_save_load),
        cmocka_unit_test(test_groups_text),
        cmocka_unit_test(test_snap_retire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
