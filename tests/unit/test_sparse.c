/*
 * test_sparse — the inverted index against brute force: random rows with unsorted and
 * duplicate dims, queries with duplicate dims, both accumulator modes (dense array and
 * hash), filters and crowding through a tsr_filter_meta, argument checks, and the build
 * time of a larger index.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "query/filter.h"
#include "core/mem.h"
#include "query/sparse.h"
#include "query/topk.h"

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static int64_t random_dim(int wide)
{
    if (!wide)
        return rnd() % 64;
    /* rare dims, spread over the whole int64 range including negatives */
    return (int64_t)(((uint64_t)rnd() << 32) | rnd()) | 1;
}

enum { NROWS = 2000 };

typedef struct rows {
    tsr_datapoint dp[NROWS];
} rows;

static void make_rows(rows *r, int wide_share)
{
    for (int i = 0; i < NROWS; i++) {
        tsr_datapoint *d = &r->dp[i];
        tsr_datapoint_init(d);
        size_t n = rnd() % 5 == 0 ? 0 : rnd() % 24;
        d->sparse_dims = tsr_xmalloc((n ? n : 1) * sizeof *d->sparse_dims);
        d->sparse_vals = tsr_xmalloc((n ? n : 1) * sizeof *d->sparse_vals);
        d->nsparse = n;
        for (size_t j = 0; j < n; j++) {
            /* duplicates: sometimes repeat an earlier dim of the row */
            if (j > 0 && rnd() % 6 == 0)
                d->sparse_dims[j] = d->sparse_dims[rnd() % j];
            else
                d->sparse_dims[j] = random_dim((int)(rnd() % 100) < wide_share);
            d->sparse_vals[j] = (float)((int)(rnd() % 2001) - 1000) / 256.0f;
        }
    }
}

static void free_rows(rows *r)
{
    for (int i = 0; i < NROWS; i++)
        tsr_datapoint_close(&r->dp[i]);
}

/* value of dim in row (duplicates summed in input order), *has when present */
static float row_value(const tsr_datapoint *d, int64_t dim, int *has)
{
    float v = 0.0f;
    *has = 0;
    for (size_t j = 0; j < d->nsparse; j++)
        if (d->sparse_dims[j] == dim) {
            v += d->sparse_vals[j];
            *has = 1;
        }
    return v;
}

/* brute force: hits for rows sharing a dim with the query, sorted best first */
static size_t brute(const rows *r, const int64_t *qd, const float *qv, size_t nq,
                    const int *keep, const int64_t *labels, const uint32_t *tags, tsr_hit *out)
{
    size_t n = 0;
    for (int i = 0; i < NROWS; i++) {
        if (keep && !keep[i])
            continue;
        double s = 0.0;
        int any = 0;
        for (size_t q = 0; q < nq; q++) {
            int has;
            float v = row_value(&r->dp[i], qd[q], &has);
            if (has) {
                s += (double)qv[q] * (double)v;
                any = 1;
            }
        }
        if (any)
            out[n++] = (tsr_hit){(float)s, tags ? tags[i] : 0, labels ? labels[i] : i};
    }
    tsr_hits_sort(out, n, 1);
    return n;
}

static void check_equal(const tsr_hit *got, size_t ng, const tsr_hit *want, size_t nw,
                        const char *what, int iter)
{
    if (ng != nw)
        fail_msg("%s %d: %zu hits, want %zu", what, iter, ng, nw);
    for (size_t i = 0; i < ng; i++)
        if (got[i].label != want[i].label || got[i].dist != want[i].dist)
            fail_msg("%s %d: hit %zu = (%lld, %.9g), want (%lld, %.9g)", what, iter, i,
                     (long long)got[i].label, got[i].dist, (long long)want[i].label,
                     want[i].dist);
}

static void test_vs_brute_force(void **state)
{
    static rows r;
    static tsr_hit want[NROWS], got[NROWS];
    for (int variant = 0; variant < 3; variant++) {
        rng_state = 99 + (uint64_t)variant;
        int wide_share = variant * 45; /* 0: dense dims, 45 / 90: mostly rare dims */
        make_rows(&r, wide_share);
        tsr_sparse_index *ix;
        tsr_error err = TSR_ERROR_INIT;
        assert_int_equal(tsr_sparse_index_build(r.dp, NROWS, &ix, &err), 0);
        assert_int_equal(tsr_sparse_index_rows(ix), NROWS);
        for (int iter = 0; iter < 60; iter++) {
            int64_t qd[40];
            float qv[40];
            size_t nq = 1 + rnd() % 30;
            for (size_t q = 0; q < nq; q++) {
                if (q > 0 && rnd() % 5 == 0)
                    qd[q] = qd[rnd() % q]; /* duplicate query dim */
                else if (rnd() % 3 == 0) {
                    /* a dim some row has */
                    const tsr_datapoint *d = &r.dp[rnd() % NROWS];
                    qd[q] = d->nsparse ? d->sparse_dims[rnd() % d->nsparse] : 5;
                } else
                    qd[q] = random_dim((int)(rnd() % 100) < wide_share);
                qv[q] = (float)((int)(rnd() % 201) - 100) / 16.0f;
            }
            size_t k = iter % 9 == 0 ? NROWS : 1 + rnd() % 40;
            size_t nw = brute(&r, qd, qv, nq, NULL, NULL, NULL, want), ng;
            if (nw > k)
                nw = k;
            assert_int_equal(tsr_sparse_search(ix, qd, qv, nq, k, 0, NULL, NULL, got, &ng, &err), 0);
            check_equal(got, ng, want, nw, "search", iter);
        }
        tsr_sparse_index_destroy(ix);
        free_rows(&r);
    }
}

static void test_filter_crowding(void **state)
{
    static rows r;
    static tsr_hit want[NROWS], got[NROWS], crowded[NROWS];
    static int keep[NROWS];
    static int64_t labels[NROWS];
    static uint32_t tags[NROWS];
    rng_state = 5;
    make_rows(&r, 10);
    tsr_filter_dict *dict = tsr_filter_dict_create();
    tsr_filter_meta *meta = tsr_filter_meta_create(dict);
    static const char *tagnames[] = {"t0", "t1", "t2", "t3", "t4"};
    for (int i = 0; i < NROWS; i++) {
        tsr_datapoint m;
        tsr_datapoint_init(&m);
        if (i % 7 != 0) /* every 7th row has no tag: never limited */
            m.crowding_tag = tsr_xstrdup(tagnames[i % 5]);
        if (i % 3 != 0) {
            m.restricts = tsr_xcalloc(1, sizeof *m.restricts);
            m.nrestricts = 1;
            m.restricts[0].ns = tsr_xstrdup("kind");
            m.restricts[0].allow = tsr_xmalloc(sizeof(char *));
            m.restricts[0].allow[0] = tsr_xstrdup(i % 3 == 1 ? "a" : "b");
            m.restricts[0].nallow = 1;
        }
        labels[i] = 100000 - 7 * i; /* label order differs from row order */
        assert_int_equal(tsr_filter_meta_add(meta, labels[i], &m, NULL, NULL), 0);
        tags[i] = tsr_filter_meta_crowding(meta, (uint32_t)i);
        keep[i] = i % 3 == 1;
        tsr_datapoint_close(&m);
    }
    tsr_sparse_index *ix;
    assert_int_equal(tsr_sparse_index_build(r.dp, NROWS, &ix, NULL), 0);

    tsr_token_restrict q = {0};
    char *allow[] = {"a"};
    q.ns = "kind";
    q.allow = allow;
    q.nallow = 1;
    tsr_filter *f;
    assert_int_equal(tsr_filter_compile(dict, &q, 1, NULL, 0, &f, NULL), 0);
    for (int iter = 0; iter < 40; iter++) {
        int64_t qd[16];
        float qv[16];
        size_t nq = 1 + rnd() % 16;
        for (size_t j = 0; j < nq; j++) {
            qd[j] = rnd() % 64;
            qv[j] = (float)((int)(rnd() % 201) - 100) / 16.0f;
        }
        size_t k = 1 + rnd() % 30, c = rnd() % 4, ng, nc;
        size_t nw = brute(&r, qd, qv, nq, keep, labels, tags, want);
        assert_int_equal(tsr_crowd_select(want, nw, k, c, crowded, &nc), 0);
        assert_int_equal(tsr_sparse_search(ix, qd, qv, nq, k, c, f, meta, got, &ng, NULL), 0);
        check_equal(got, ng, crowded, nc, "filtered", iter);
        for (size_t j = 0; j < ng; j++) {
            uint32_t row;
            assert_int_equal(tsr_filter_meta_find(meta, got[j].label, &row), 0);
            assert_int_equal(got[j].tag, tags[row]);
        }
    }
    /* a filter that matches nothing */
    tsr_token_restrict qn = {.ns = "kind", .allow = (char *[]){"zzz"}, .nallow = 1};
    tsr_filter *none;
    assert_int_equal(tsr_filter_compile(dict, &qn, 1, NULL, 0, &none, NULL), 0);
    int64_t qd1 = 3;
    float qv1 = 1.0f;
    size_t ng;
    assert_int_equal(tsr_sparse_search(ix, &qd1, &qv1, 1, 10, 0, none, meta, got, &ng, NULL), 0);
    assert_int_equal(ng, 0);
    /* a filter without metadata is an error */
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_sparse_search(ix, &qd1, &qv1, 1, 10, 0, f, NULL, got, &ng, &err), TSR_EINVAL);
    tsr_filter_destroy(none);
    tsr_filter_destroy(f);
    tsr_sparse_index_destroy(ix);
    tsr_filter_meta_destroy(meta);
    tsr_filter_dict_destroy(dict);
    free_rows(&r);
}

static void test_duplicates_and_errors(void **state)
{
    tsr_sparse_builder *b = tsr_sparse_builder_create();
    tsr_error err = TSR_ERROR_INIT;
    int64_t d0[] = {7, 3, 7, 3, 7};
    float v0[] = {1.0f, 2.0f, 0.5f, -2.0f, 0.25f}; /* 7 -> 1.75, 3 -> 0 (kept: stored zero) */
    int64_t d1[] = {3};
    float v1[] = {4.0f};
    assert_int_equal(tsr_sparse_builder_add(b, 0, d0, v0, 5, &err), 0);
    assert_int_equal(tsr_sparse_builder_add(b, 2, d1, v1, 1, &err), 0);
    tsr_sparse_index *ix;
    assert_int_equal(tsr_sparse_builder_finish(b, 3, &ix, &err), 0);
    assert_int_equal(tsr_sparse_index_nnz(ix), 3);
    assert_int_equal(tsr_sparse_index_ndims(ix), 2);
    int64_t qd[] = {7, 3, 7};
    float qv[] = {1.0f, 1.0f, 1.0f}; /* dim 7 twice: counts twice */
    tsr_hit out[4];
    size_t n;
    assert_int_equal(tsr_sparse_search(ix, qd, qv, 3, 4, 0, NULL, NULL, out, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(out[0].label, 2);
    assert_true(out[0].dist == 4.0f);
    assert_int_equal(out[1].label, 0);
    assert_true(out[1].dist == 3.5f);
    /* empty query, k = 0, unknown dims */
    assert_int_equal(tsr_sparse_search(ix, qd, qv, 0, 4, 0, NULL, NULL, out, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tsr_sparse_search(ix, qd, qv, 3, 0, 0, NULL, NULL, out, &n, &err), 0);
    assert_int_equal(n, 0);
    int64_t unk = 12345;
    assert_int_equal(tsr_sparse_search(ix, &unk, qv, 1, 4, 0, NULL, NULL, out, &n, &err), 0);
    assert_int_equal(n, 0);
    /* an absurd k does not allocate k entries */
    assert_int_equal(tsr_sparse_search(ix, qd, qv, 3, SIZE_MAX / 2, 0, NULL, NULL, out, &n, &err), 0);
    assert_int_equal(n, 2);
    tsr_sparse_index_destroy(ix);
    /* errors */
    float bad[] = {0.0f};
    bad[0] = bad[0] / bad[0];
    assert_int_equal(tsr_sparse_builder_add(b, 0, d1, bad, 1, &err), TSR_EINVAL);
    assert_int_equal(tsr_sparse_builder_add(b, 5, d1, v1, 1, &err), 0);
    assert_int_equal(tsr_sparse_builder_finish(b, 3, &ix, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "row 5"));
    tsr_sparse_builder_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_brute_force),
        cmocka_unit_test(test_filter_crowding),
        cmocka_unit_test(test_duplicates_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
