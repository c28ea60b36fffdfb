/*
 * test_coord_update — the shard-free phases of an update (coordinator/update_plan.c):
 *   - the first update trains the template from the batch (deterministic for a seed),
 *     builds a plan, gives labels 0..n-1, routes every dense record to the group its
 *     list is planned on and every sparse-only record to hash(id) % S; nothing deleted;
 *   - a delta on top keeps the template and plan, reuses the label of an updated id, keeps
 *     the untouched ids, drops deleted ones (a delete to the group that held it), and an id
 *     that changes group is deleted on its old one;
 *   - a complete overwrite keeps only the batch's ids and stages on an empty base;
 *   - cosine normalises the batch's vectors; too small a first batch is refused, naming
 *     the fix (--template).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord.h"
#include "coord_test_util.h"
#include "core/mem.h"

#define D 8

static void config(tsr__coord_config *cfg, size_t nshards)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->dimensions = D;
    cfg->distance = TSR_DIST_SQUARED_L2;
    cfg->nlist = 8;
    cfg->pq_m = 2;
    cfg->pq_nbits = 8;
    cfg->nprobe = 2;
    cfg->nshards = nshards;
    cfg->plan = TSR_PLAN_BALANCED;
    cfg->seed = 5;
}

/* A batch of records "r0000".. (dense, every 10th sparse-only) and deletes, sorted as
 * tsr_batch_load leaves them. */
static tsr_batch *batch(size_t n, unsigned seed, const char *const *dels, size_t ndels)
{
    tsr_batch *b = tsr_xcalloc(1, sizeof *b);
    b->records = tsr_xcalloc(n ? n : 1, sizeof *b->records);
    b->nrecords = n;
    float *x = coord_test_vectors(n ? n : 1, D, seed);
    for (size_t i = 0; i < n; i++) {
        tsr_datapoint *r = &b->records[i];
        char id[32];
        snprintf(id, sizeof id, "r%04zu", i);
        r->id = tsr_xstrdup(id);
        if (i % 10 == 9) {
            r->nsparse = 1;
            r->sparse_dims = tsr_xcalloc(1, sizeof *r->sparse_dims);
            r->sparse_vals = tsr_xcalloc(1, sizeof *r->sparse_vals);
            r->sparse_vals[0] = 1;
        } else {
            r->dense = tsr_xmalloc(D * sizeof(float));
            r->ndense = D;
            memcpy(r->dense, x + i * D, D * sizeof(float));
        }
    }
    free(x);
    b->deletes = tsr_xcalloc(ndels ? ndels : 1, sizeof *b->deletes);
    for (size_t i = 0; i < ndels; i++)
        b->deletes[i] = tsr_xstrdup(dels[i]);
    b->ndeletes = ndels;
    return b;
}

static void batch_free(tsr_batch *b)
{
    for (size_t i = 0; i < b->nrecords; i++)
        tsr_datapoint_close(&b->records[i]);
    for (size_t i = 0; i < b->ndeletes; i++)
        free(b->deletes[i]);
    free(b->records);
    free(b->deletes);
    free(b);
}

static size_t total_ups(const tsr__upd_plan *p)
{
    size_t n = 0;
    for (size_t s = 0; s < p->nshards; s++)
        n += p->w[s].nups;
    return n;
}

static size_t total_dels(const tsr__upd_plan *p)
{
    size_t n = 0;
    for (size_t s = 0; s < p->nshards; s++)
        n += p->w[s].ndels;
    return n;
}

/* Every upsert is routed where the directory of the new snapshot says. */
static void check_routing(const tsr__upd_plan *p, const tsr_batch *b)
{
    for (size_t s = 0; s < p->nshards; s++)
        for (size_t k = 0; k < p->w[s].nups; k++) {
            const tsr_datapoint *r = &b->records[p->w[s].ups[k]];
            const tsr__dir_entry *e = tsr__dir_find(&p->ns->dir, r->id);
            assert_non_null(e);
            assert_int_equal(e->shard, (int32_t)s);
            if (r->dense) {
                assert_true(e->list >= 0 && (size_t)e->list < p->ns->tmpl->nlist);
                assert_int_equal(p->ns->plan[e->list], (int32_t)s);
            } else {
                assert_int_equal(e->list, -1);
                assert_int_equal(s, tsr__hash_str(r->id) % p->nshards);
            }
        }
}

static void test_first_then_delta(void **state)
{
    (void)state;
    tsr__coord_config cfg;
    config(&cfg, 3);
    tsr_error err = TSR_ERROR_INIT;
    tsr__snap *base = tsr__snap_create();
    tsr_batch *b = batch(400, 1, NULL, 0);
    tsr__upd_plan p;
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, base, b, 0, &p, &err), 0);
    assert_int_equal(p.ns->version, 1);
    assert_true(p.overwrite); /* no index yet: staged on an empty base */
    assert_int_equal(p.ns->tmpl->nlist, 8);
    assert_int_equal(p.ns->dir.n, 400);
    assert_int_equal(p.ns->next_label, 400);
    assert_int_equal(p.ns->ndense, 360);
    assert_int_equal(p.ns->nsparse, 40);
    assert_int_equal(total_ups(&p), 400);
    assert_int_equal(total_dels(&p), 0);
    check_routing(&p, b);

    /* the same batch again gives the same template (seeded training) */
    tsr__upd_plan p2;
    tsr_batch *b2 = batch(400, 1, NULL, 0);
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, base, b2, 0, &p2, &err), 0);
    assert_int_equal(p2.ns->tmpl_len, p.ns->tmpl_len);
    assert_memory_equal(p2.ns->tmpl_bytes, p.ns->tmpl_bytes, p.ns->tmpl_len);
    tsr__upd_plan_close(&p2);
    batch_free(b2);

    /* delta on version 1: r0000..r0049 again (new vectors), r0100 and r0109 deleted, an
     * unknown id deleted (ignored) */
    tsr__snap *v1 = p.ns;
    p.ns = NULL;
    tsr__upd_plan_close(&p);
    const char *dels[] = {"nope", "r0100", "r0109"};
    tsr_batch *d = batch(50, 9, dels, 3);
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, v1, d, 0, &p, &err), 0);
    assert_int_equal(p.ns->version, 2);
    assert_false(p.overwrite);
    assert_memory_equal(p.ns->tmpl_bytes, v1->tmpl_bytes, v1->tmpl_len);
    assert_memory_equal(p.ns->plan, v1->plan, 8 * sizeof *v1->plan);
    assert_int_equal(p.ns->dir.n, 400 - 2);
    assert_int_equal(p.ns->next_label, 400); /* updated ids keep their labels */
    for (size_t i = 0; i < 50; i++) {
        const tsr__dir_entry *e = tsr__dir_find(&p.ns->dir, d->records[i].id);
        assert_int_equal(e->label, tsr__dir_find(&v1->dir, d->records[i].id)->label);
    }
    assert_null(tsr__dir_find(&p.ns->dir, "r0100"));
    assert_null(tsr__dir_find(&p.ns->dir, "r0109"));
    assert_non_null(tsr__dir_find(&p.ns->dir, "r0399"));
    assert_int_equal(p.ndeleted, 2);
    assert_int_equal(total_ups(&p), 50);
    assert_int_equal(total_dels(&p), 2 + (size_t)p.nmoved);
    check_routing(&p, d);
    /* a delete goes to the group that held the id; a moved id is deleted on its old group */
    const tsr__dir_entry *gone = tsr__dir_find(&v1->dir, "r0100");
    int found = 0;
    for (size_t k = 0; k < p.w[gone->shard].ndels; k++)
        found += p.w[gone->shard].dels[k].label == gone->label;
    assert_int_equal(found, 1);
    tsr__upd_plan_close(&p);
    batch_free(d);

    /* complete overwrite: only the batch's ids, empty base, labels continue */
    tsr_batch *o = batch(20, 3, NULL, 0);
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, v1, o, 1, &p, &err), 0);
    assert_true(p.overwrite);
    assert_int_equal(p.ns->dir.n, 20);
    assert_int_equal(total_dels(&p), 0);
    assert_int_equal(p.nmoved, 0);
    check_routing(&p, o);
    tsr__upd_plan_close(&p);
    batch_free(o);

    tsr__snap_unref(v1);
    tsr__snap_unref(base);
    batch_free(b);
}

static void test_cosine_and_small(void **state)
{
    (void)state;
    tsr__coord_config cfg;
    config(&cfg, 2);
    cfg.distance = TSR_DIST_COSINE;
    tsr_error err = TSR_ERROR_INIT;
    tsr__snap *base = tsr__snap_create();
    tsr_batch *b = batch(300, 4, NULL, 0);
    tsr__upd_plan p;
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, base, b, 0, &p, &err), 0);
    for (size_t i = 0; i < b->nrecords; i++) {
        if (!b->records[i].dense)
            continue;
        double s = 0;
        for (size_t j = 0; j < D; j++)
            s += (double)b->records[i].dense[j] * b->records[i].dense[j];
        assert_true(fabs(s - 1.0) < 1e-4);
    }
    tsr__upd_plan_close(&p);
    tsr__upd_plan_close(&p); /* closing twice is harmless */
    batch_free(b);

    /* a first batch with fewer than 2^pq_nbits dense vectors cannot train */
    tsr_batch *small = batch(100, 5, NULL, 0);
    assert_int_equal(tsr__upd_plan_build(&cfg, NULL, base, small, 0, &p, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "--template"));
    assert_null(p.ns);
    assert_null(p.w);
    batch_free(small);
    tsr__snap_unref(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_then_delta),
        cmocka_unit_test(test_cosine_and_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
