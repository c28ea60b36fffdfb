/*
 * test_shard_delta — streamed-write delta snapshots (shard/delta.c): an upsert of a new
 * label, of a base label (masked and replaced), a delete of a base label (masked), of a
 * delta label (gone, masked only if the base has it), of an unknown label (ignored), a
 * label twice in one write (the later copy wins); counts and deletes held; an older
 * snapshot is never modified and untouched lists are shared; a delta record's PQ code and
 * ADC term are byte-identical to the same record's in a base list (and tsr__encode's fast
 * path gives the plain loop's codes); crowding tag ids
 * (the base dict's id, else a delta id, stable per string); folding a delta into an edit
 * set (the staged edits win) builds the expected version, copying the delta's codes
 * byte for byte what encoding gives; random writes against a model:
 * every snapshot's labels, counts, deletes held and record bytes, after later writes
 * appended to the shared record buffer (new labels) or copied it (replaced / deleted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "shard_test_util.h"

typedef struct fixture {
    tsr__tmpl *tmpl;
    tsr__version *empty, *v1;
    float *x;
    size_t n;
} fixture;

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tu_index();
    assert_non_null(ix);
    f->tmpl = tsr__tmpl_from_index(ix, &err);
    f->empty = tsr__version_empty(&err);
    f->n = 40;
    f->x = tu_data(f->n + 20, 99);
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(f->n + 1, sizeof *e.ups);
    for (size_t i = 0; i < f->n; i++) /* labels 0, 2, 4, ... */
        e.ups[e.nups++] = tu_rec((int64_t)(2 * i), (int32_t)(i % TNLIST), f->x + i * TD);
    e.ups[0]->dp.crowding_tag = tsr_xstrdup("a");
    assert_int_equal(tsr__version_build(f->empty, f->tmpl, &e, 1, &f->v1, &err), 0);
    tsr__edits_close(&e);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr__version_unref(f->v1);
    tsr__version_unref(f->empty);
    tsr__tmpl_unref(f->tmpl);
    free(f->x);
    free(f);
    return 0;
}

static tsr__delta *apply(fixture *f, const tsr__delta *old, tsr__rec **ups, size_t nups,
                         const int64_t *dels, size_t ndels, int64_t seq)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr__delta *d = NULL;
    assert_int_equal(tsr__delta_apply(f->v1, old, ups, nups, dels, ndels, seq, &d, &err), 0);
    for (size_t i = 0; i < nups; i++)
        tsr__rec_unref(ups[i]); /* the delta holds its own refs */
    return d;
}

static size_t dlist_n(const tsr__delta *d, size_t li)
{
    return d->lists[li] ? d->lists[li]->n : 0;
}

static void test_semantics(void **state)
{
    fixture *f = *state;
    tsr__rec *u1[] = {tu_rec(101, 1, f->x + 41 * TD), tu_rec(4, 2, f->x + 42 * TD)};
    int64_t del1[] = {6, 5555};
    tsr__delta *d1 = apply(f, NULL, u1, 2, del1, 2, 3);
    assert_int_equal(d1->seq, 3);
    assert_int_equal(d1->nrecs, 2);
    assert_int_equal(d1->recs[0]->label, 4);
    assert_int_equal(d1->recs[1]->label, 101);
    assert_int_equal(d1->nmask, 2);
    assert_int_equal(d1->mask[0], 4);
    assert_int_equal(d1->mask[1], 6);
    assert_int_equal(d1->ndeletes, 1);
    assert_int_equal(d1->rvec, 2);
    assert_int_equal(d1->mvec, 2);
    assert_int_equal(dlist_n(d1, 1), 1);
    assert_int_equal(dlist_n(d1, 2), 1);
    assert_int_equal(dlist_n(d1, 0) + dlist_n(d1, 3), 0);

    /* 101 moves to list 3; base label 4's delta record is deleted (stays masked) */
    tsr__rec *u2[] = {tu_rec(101, 3, f->x + 43 * TD)};
    int64_t del2[] = {4};
    tsr__delta *d2 = apply(f, d1, u2, 1, del2, 1, 4);
    assert_int_equal(d2->nrecs, 1);
    assert_int_equal(d2->recs[0]->list, 3);
    assert_int_equal(d2->nmask, 2);
    assert_int_equal(d2->ndeletes, 2);
    assert_int_equal(dlist_n(d2, 1) + dlist_n(d2, 2), 0);
    assert_int_equal(dlist_n(d2, 3), 1);
    assert_int_equal(d2->rvec, 1);
    /* the older snapshot is unchanged */
    assert_int_equal(d1->nrecs, 2);
    assert_int_equal(dlist_n(d1, 1), 1);
    assert_int_equal(d1->ndeletes, 1);

    /* a delta-only label deleted: gone, not masked; a label twice in one write: the
     * later copy wins; an untouched list is shared */
    tsr__rec *u3[] = {tu_rec(300, 0, f->x + 44 * TD), tu_rec(300, 1, f->x + 45 * TD)};
    int64_t del3[] = {101};
    tsr__delta *d3 = apply(f, d2, u3, 2, del3, 1, 5);
    assert_int_equal(d3->nrecs, 1);
    assert_int_equal(d3->recs[0]->label, 300);
    assert_int_equal(d3->recs[0]->list, 1);
    assert_int_equal(d3->nmask, 2);
    assert_int_equal(dlist_n(d3, 0) + dlist_n(d3, 3), 0);
    assert_int_equal(dlist_n(d3, 1), 1);
    tsr__rec *u4[] = {tu_rec(400, 2, f->x + 46 * TD)};
    tsr__delta *d4 = apply(f, d3, u4, 1, NULL, 0, 6);
    assert_ptr_equal(d4->lists[1], d3->lists[1]);
    assert_int_equal(dlist_n(d4, 2), 1);
    assert_non_null(tsr__delta_find(d4, 400, NULL));
    assert_null(tsr__delta_find(d4, 101, NULL));
    tsr__delta_unref(d1);
    tsr__delta_unref(d2);
    tsr__delta_unref(d3);
    tsr__delta_unref(d4);
}

/* A record's code and ADC term in a delta list equal those it gets in a base list. */
static void test_codes_match_base(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    size_t cs = f->tmpl->ix->code_size;
    for (int32_t li = 0; li < TNLIST; li++) {
        tsr__rec *r = tu_rec(500 + li, li, f->x + (50 + (size_t)li) * TD);
        tsr__edits e = {0};
        e.ups = tsr_xcalloc(2, sizeof *e.ups);
        e.ups[e.nups++] = tsr__rec_ref(r);
        tsr__version *v2 = NULL;
        assert_int_equal(tsr__version_build(f->v1, NULL, &e, 2, &v2, &err), 0);
        tsr__edits_close(&e);
        tsr__rec *ups[] = {r};
        tsr__delta *d = apply(f, NULL, ups, 1, NULL, 0, 1);
        const tsr__list *bl = v2->lists[li], *dl = d->lists[li];
        assert_non_null(dl);
        size_t j = 0;
        while (j < bl->n && bl->ids[j] != 500 + li)
            j++;
        assert_true(j < bl->n);
        /* the base list's code and term, from its scan blocks (its only copy) */
        assert_non_null(bl->fl);
        uint8_t code[TM];
        float term;
        tsr_ivfpq_flist_codes(bl->fl, j, 1, code, &term);
        assert_int_equal(cs, TM);
        assert_memory_equal(dl->codes, code, cs);
        assert_memory_equal(&dl->term[0], &term, sizeof(float));
        tsr__delta_unref(d);
        tsr__version_unref(v2);
    }
}

/* tsr__encode (the PQ encoder's transposed fast path) gives the plain loop's codes. */
static void test_encode_paths(void **state)
{
    fixture *f = *state;
    assert_true(tsr_pq_encoder_fast(f->tmpl->enc));
    const tsr_ivfpq *ix = f->tmpl->ix;
    size_t cs = f->tmpl->ix->code_size;
    uint8_t a[64], b[64];
    assert_true(cs <= sizeof a);
    uint32_t seed = 5;
    for (size_t i = 0; i < f->n + 20; i++)
        for (int32_t li = 0; li < TNLIST; li++) {
            float x[TD];
            for (size_t j = 0; j < TD; j++)
                x[j] = f->x[i * TD + j] + tu_rand(&seed) * (float)li;
            memset(a, 0, cs);
            memset(b, 0, cs);
            tsr__encode(f->tmpl, x, li, a);
            tsr_pq_encode_exact(&ix->pq, x,
                                ix->by_residual ? ix->centroids + (size_t)li * TD : NULL, b);
            assert_memory_equal(a, b, cs);
        }
}

static void test_tags(void **state)
{
    fixture *f = *state;
    tsr__rec *a = tu_rec(601, 0, f->x), *z1 = tu_rec(603, 1, f->x), *z2 = tu_rec(605, 2, f->x),
             *none = tu_rec(607, 3, f->x), *y = tu_rec(609, 3, f->x);
    a->dp.crowding_tag = tsr_xstrdup("a");
    z1->dp.crowding_tag = tsr_xstrdup("zz");
    z2->dp.crowding_tag = tsr_xstrdup("zz");
    y->dp.crowding_tag = tsr_xstrdup("yy");
    tsr__rec *ups[] = {a, z1, z2, none, y};
    for (size_t i = 0; i < 5; i++)
        tsr__rec_ref(ups[i]);
    tsr__delta *d = apply(f, NULL, ups, 5, NULL, 0, 1);
    uint32_t base_a = tsr_filter_meta_crowding(f->v1->meta, 0); /* label 0 has tag "a" */
    assert_int_equal(a->tag, base_a);
    assert_true(z1->tag & TSR__DTAG_BIT);
    assert_int_equal(z1->tag, z2->tag);
    assert_true(y->tag & TSR__DTAG_BIT);
    assert_int_not_equal(y->tag, z1->tag);
    assert_int_equal(none->tag, TSR_FILTER_NOID);
    for (size_t i = 0; i < 5; i++)
        tsr__rec_unref(ups[i]);
    tsr__delta_unref(d);
}

static void test_fold(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    /* delta: 8 replaced, 101 new, 12 deleted, 14 replaced */
    tsr__rec *du[] = {tu_rec(8, 1, f->x + 41 * TD), tu_rec(101, 2, f->x + 42 * TD),
                      tu_rec(14, 3, f->x + 43 * TD)};
    int64_t dd[] = {12};
    tsr__delta *d = apply(f, NULL, du, 3, dd, 1, 7);
    /* staged: 8 replaced again (wins), 14 deleted (wins), 10 deleted */
    tsr__rec *staged8 = tu_rec(8, 0, f->x + 44 * TD);
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(2, sizeof *e.ups);
    e.ups[e.nups++] = staged8;
    e.dels = tsr_xcalloc(2, sizeof *e.dels);
    e.dels[e.ndels++] = 10;
    e.dels[e.ndels++] = 14;
    assert_int_equal(tsr__delta_fold(d, &e, &err), 0);
    tsr__version *v2 = NULL;
    assert_int_equal(tsr__version_build(f->v1, NULL, &e, 2, &v2, &err), 0);
    tsr__edits_close(&e);
    assert_ptr_equal(tsr__version_find(v2, 8), staged8);
    assert_int_equal(tsr__version_find(v2, 8)->list, 0);
    assert_non_null(tsr__version_find(v2, 101));
    assert_null(tsr__version_find(v2, 10));
    assert_null(tsr__version_find(v2, 12));
    assert_null(tsr__version_find(v2, 14));
    assert_non_null(tsr__version_find(v2, 16));
    assert_int_equal(v2->nrecs, f->n + 1 - 3);
    assert_int_equal(v2->nvectors, f->n + 1 - 3);
    tsr__version_unref(v2);
    tsr__delta_unref(d);
    /* an empty delta folds to nothing */
    tsr__edits e2 = {0};
    assert_int_equal(tsr__delta_fold(NULL, &e2, &err), 0);
    assert_int_equal(e2.nups + e2.ndels, 0);
}

/* The build copies the codes of the base delta's records (e.src, as fold_delta sets it)
 * instead of encoding their vectors again: the version equals, list by list (labels,
 * codes, ADC terms), the one built from the same edits with every vector encoded; a
 * staged upsert of a delta label (another vector, another list) is encoded, not copied;
 * several writes put a list's delta entries out of label order. */
static void test_fold_codes(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__delta *d = NULL;
    int64_t next = 1001;
    for (int w = 0; w < 4; w++) { /* labels descending within a list across writes */
        tsr__rec *ups[12];
        for (size_t k = 0; k < 12; k++) {
            int64_t lab = w % 2 ? 3000 - next : next;
            next++;
            ups[k] = tu_rec(lab, (int32_t)((k + (size_t)w) % TNLIST),
                            f->x + ((k * 7 + (size_t)w * 3) % (f->n + 20)) * TD);
        }
        int64_t del[] = {2 * (int64_t)w + 4}; /* base labels */
        tsr__delta *d2 = apply(f, d, ups, 12, del, 1, w + 1);
        tsr__delta_unref(d);
        d = d2;
    }
    tsr__version *v[2] = {NULL, NULL};
    for (int pass = 0; pass < 2; pass++) {
        tsr__edits e = {0};
        e.ups = tsr_xcalloc(2, sizeof *e.ups); /* staged: label 1001 again, elsewhere */
        e.ups[e.nups++] = tu_rec(1001, 2, f->x + 45 * TD);
        assert_int_equal(tsr__delta_fold(d, &e, &err), 0);
        if (pass == 0)
            e.src = tsr__delta_ref(d);
        assert_int_equal(tsr__version_build(f->v1, NULL, &e, 2, &v[pass], &err), 0);
        tsr__edits_close(&e);
    }
    size_t cs = f->tmpl->ix->code_size, compared = 0;
    uint8_t a[TM], b[TM];
    float ta, tb;
    for (size_t li = 0; li < TNLIST; li++) {
        const tsr__list *la = v[0]->lists[li], *lb = v[1]->lists[li];
        assert_true((la == NULL) == (lb == NULL));
        if (la == NULL)
            continue;
        assert_int_equal(la->n, lb->n);
        assert_memory_equal(la->ids, lb->ids, la->n * sizeof(int64_t));
        for (size_t j = 0; j < la->n; j++) {
            assert_non_null(la->fl);
            tsr_ivfpq_flist_codes(la->fl, j, 1, a, &ta);
            tsr_ivfpq_flist_codes(lb->fl, j, 1, b, &tb);
            assert_memory_equal(a, b, cs);
            assert_memory_equal(&ta, &tb, sizeof ta);
            compared++;
        }
    }
    assert_int_equal(compared, v[1]->nvectors);
    assert_int_equal(v[0]->nvectors, f->n - 4 + 48);
    assert_int_equal(tsr__version_find(v[0], 1001)->list, 2);
    tsr__version_unref(v[0]);
    tsr__version_unref(v[1]);
    tsr__delta_unref(d);
}

/* Random writes (new labels past the last, replacements and deletes of delta and base
 * labels) checked against a model after every write, and every older snapshot checked
 * again at the end (appends to a shared buffer must not show in an older snapshot). */
#define RW_STEPS 300
#define RW_MAXL 4000
static void test_random_vs_model(void **state)
{
    fixture *f = *state;
    static uint8_t in_recs[RW_STEPS + 1][RW_MAXL], masked[RW_MAXL];
    static size_t n_of[RW_STEPS + 1], del_of[RW_STEPS + 1];
    tsr__delta *snap[RW_STEPS + 1] = {0};
    uint64_t rng = 12345;
    int64_t next = 1001;
    size_t appended = 0, copied = 0;
    for (int st = 1; st <= RW_STEPS; st++) {
        memcpy(in_recs[st], in_recs[st - 1], RW_MAXL);
        tsr__rec *ups[8];
        int64_t dels[8], used[16];
        size_t nu = 0, nd = 0, nused = 0;
        size_t k = 1 + (size_t)((rng = rng * 6364136223846793005ULL + 1) >> 61);
        for (size_t i = 0; i < k; i++) {
            rng = rng * 6364136223846793005ULL + 1;
            unsigned r = (unsigned)(rng >> 33) % 10;
            int64_t l;
            if (r < 6 && next < RW_MAXL)
                l = next++;                                        /* a new label */
            else if (r < 8)
                l = 1001 + (int64_t)((rng >> 40) % (uint64_t)(next - 1001)); /* a delta one */
            else
                l = 2 * (int64_t)((rng >> 40) % f->n);             /* a base one */
            int dup = 0;
            for (size_t j = 0; j < nused; j++)
                dup |= used[j] == l;
            if (dup)
                continue;
            used[nused++] = l;
            if ((rng >> 20) % 4 == 0) {
                dels[nd++] = l;
                in_recs[st][l] = 0;
            } else {
                ups[nu++] = tu_rec(l, (int32_t)((rng >> 24) % TNLIST), f->x + (l % 60) * TD);
                in_recs[st][l] = 1;
            }
            if (l < 2 * (int64_t)f->n)
                masked[l] = 1;
        }
        snap[st] = apply(f, snap[st - 1], ups, nu, dels, nd, st);
        if (snap[st - 1] && snap[st]->rbuf == snap[st - 1]->rbuf)
            appended++;
        else
            copied++;
        size_t n = 0, both = 0, nm = 0;
        for (int64_t l = 0; l < RW_MAXL; l++) {
            n += in_recs[st][l];
            nm += masked[l];
            both += masked[l] && in_recs[st][l];
        }
        n_of[st] = n;
        del_of[st] = nm - both;
        const tsr__delta *d = snap[st];
        assert_int_equal(d->nrecs, n);
        assert_int_equal(d->nmask, nm);
        assert_int_equal(d->ndeletes, nm - both);
        assert_int_equal(d->rvec, (int64_t)n);
        uint64_t anon = 0, mapped = 0;
        for (size_t i = 0; i < d->nrecs; i++)
            tsr__rec_bytes(d->recs[i], &anon, &mapped);
        assert_int_equal(d->rec_anon, anon);
        assert_int_equal(d->rec_mapped, mapped);
    }
    /* a write on an older snapshot (not its buffer's tip: the shard never does it, but a
     * failed apply leaves the buffer past the tip) must not overwrite the newer one's */
    int bs = RW_STEPS;
    while (bs > 1 && snap[bs]->rbuf != snap[bs - 1]->rbuf)
        bs--;
    assert_true(bs > 1); /* snap[bs] appended to snap[bs - 1]'s buffer */
    tsr__rec *br[] = {tu_rec(RW_MAXL + 1, 0, f->x)};
    tsr__delta *branch = apply(f, snap[bs - 1], br, 1, NULL, 0, RW_STEPS + 1);
    assert_int_equal(branch->nrecs, n_of[bs - 1] + 1);
    assert_int_equal(branch->recs[branch->nrecs - 1]->label, RW_MAXL + 1);
    tsr__delta_unref(branch);
    for (int st = 1; st <= RW_STEPS; st++) {
        const tsr__delta *d = snap[st];
        assert_int_equal(d->nrecs, n_of[st]);
        assert_int_equal(d->ndeletes, del_of[st]);
        size_t i = 0;
        for (int64_t l = 0; l < RW_MAXL; l++)
            if (in_recs[st][l]) {
                assert_true(i < d->nrecs);
                assert_int_equal(d->recs[i++]->label, l);
            }
        size_t rows = 0;
        for (size_t li = 0; li < TNLIST; li++)
            rows += dlist_n(d, li);
        assert_int_equal(rows, n_of[st]);
    }
    assert_true(appended > RW_STEPS / 10); /* both paths ran */
    assert_true(copied > RW_STEPS / 10);
    for (int st = 1; st <= RW_STEPS; st++)
        tsr__delta_unref(snap[st]);
}

static void test_empty_version_refused(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__delta *d = NULL;
    int64_t del[] = {1};
    assert_int_equal(tsr__delta_apply(f->empty, NULL, NULL, 0, del, 1, 1, &d, &err), TSR_ESTATE);
    assert_null(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_codes_match_base, setup, teardown),
        cmocka_unit_test_setup_teardown(test_encode_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fold_codes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_vs_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_version_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
