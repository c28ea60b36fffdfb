/*
 * test_ivfpq_search — the IVFPQ scan against a naive double-precision reference.
 *
 * A small index is built in memory (random coarse and PQ centroids, vectors encoded by
 * brute force here), then for L2/IP x by_residual 0/1 x nbits 8/4 (and an M that is not
 * a multiple of 4, for the SIMD tails) every available SIMD path is compared with the
 * reference and with the scalar path; plus search vs search_preassigned, the accept
 * filter, k larger than the candidates, max_codes, threads and bad list numbers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h" /* white-box: the kernels */
#include "index/knn.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

typedef struct fixture {
    tsr_ivfpq *ix;
    size_t nb, nq;
    float *xb, *xq;
} fixture;

/* Encodes v (d floats) with pq by brute force into code (zeroed first). */
static void encode(const tsr_pq *pq, const float *v, uint8_t *code)
{
    memset(code, 0, pq->code_size);
    for (size_t m = 0; m < pq->M; m++) {
        size_t best = 0;
        double bd = INFINITY;
        for (size_t j = 0; j < pq->ksub; j++) {
            double s = 0;
            for (size_t t = 0; t < pq->dsub; t++) {
                double u = v[m * pq->dsub + t] - pq->centroids[(m * pq->ksub + j) * pq->dsub + t];
                s += u * u;
            }
            if (s < bd) {
                bd = s;
                best = j;
            }
        }
        tsr_pq_code_put(code, m, pq->nbits, (uint32_t)best);
    }
}

static fixture make(int d, size_t nlist, size_t M, size_t nbits, enum tsr_metric metric,
                    int by_residual, size_t nb, size_t nq)
{
    fixture f;
    unsigned s = 99 + (unsigned)(M * 7 + nbits * 3 + (size_t)metric * 5 + (size_t)by_residual);
    tsr_error err = TSR_ERROR_INIT;
    f.ix = tsr_ivfpq_create(d, nlist, M, nbits, metric, by_residual, &err);
    assert_non_null(f.ix);
    f.ix->is_trained = 1;
    f.nb = nb;
    f.nq = nq;
    for (size_t i = 0; i < nlist * (size_t)d; i++)
        f.ix->centroids[i] = frand(&s) * 8.0f + 2.0f; /* off-origin, like real data */
    for (size_t i = 0; i < (size_t)d * f.ix->pq.ksub; i++)
        f.ix->pq.centroids[i] = by_residual ? frand(&s) * 2.0f : frand(&s) * 10.0f + 2.0f;
    f.xb = malloc(nb * (size_t)d * sizeof(float));
    f.xq = malloc(nq * (size_t)d * sizeof(float));
    for (size_t i = 0; i < nb; i++) {
        size_t c = (i * 7919) % nlist;
        for (int t = 0; t < d; t++)
            f.xb[i * d + t] = f.ix->centroids[c * d + t] + frand(&s) * 2.0f;
    }
    for (size_t i = 0; i < nq; i++) {
        size_t c = (i * 104729) % nlist;
        for (int t = 0; t < d; t++)
            f.xq[i * d + t] = f.ix->centroids[c * d + t] + frand(&s) * 2.0f;
    }
    /* assign to the nearest centroid (by the index metric, as Faiss's add) and encode */
    float *r = malloc((size_t)d * sizeof(float));
    uint8_t *code = malloc(f.ix->code_size);
    for (size_t i = 0; i < nb; i++) {
        size_t best = 0;
        double bd = 0;
        for (size_t c = 0; c < nlist; c++) {
            double a = 0;
            for (int t = 0; t < d; t++) {
                double u = f.xb[i * d + t], v = f.ix->centroids[c * d + t];
                a += metric == TSR_METRIC_L2 ? (u - v) * (u - v) : -u * v;
            }
            if (c == 0 || a < bd) {
                bd = a;
                best = c;
            }
        }
        for (int t = 0; t < d; t++)
            r[t] = f.xb[i * d + t] - (by_residual ? f.ix->centroids[best * d + t] : 0.0f);
        encode(&f.ix->pq, r, code);
        int64_t id = (int64_t)i * 3 + 1; /* labels are not offsets */
        assert_int_equal(tsr_invlist_append(&f.ix->lists[best], f.ix->code_size, 1, code, &id), 0);
        f.ix->ntotal++;
    }
    free(r);
    free(code);
    return f;
}

static void fixture_free(fixture *f)
{
    tsr_ivfpq_destroy(f->ix);
    free(f->xb);
    free(f->xq);
}

/* Reference distance of stored entry (list, ofs) to query x, in double. */
static double ref_dist(const tsr_ivfpq *ix, const float *x, size_t list, size_t ofs)
{
    const tsr_pq *pq = &ix->pq;
    const uint8_t *code = ix->lists[list].codes + ofs * ix->code_size;
    double a = 0;
    for (size_t m = 0; m < pq->M; m++) {
        uint32_t j = tsr_pq_code_get(code, m, pq->nbits);
        for (size_t t = 0; t < pq->dsub; t++) {
            size_t dd = m * pq->dsub + t;
            double y = pq->centroids[(m * pq->ksub + j) * pq->dsub + t] +
                       (ix->by_residual ? ix->centroids[list * ix->d + dd] : 0.0);
            a += ix->metric == TSR_METRIC_L2 ? (x[dd] - y) * (x[dd] - y) : x[dd] * y;
        }
    }
    return a;
}

typedef struct cand {
    double d;
    int64_t id;
} cand;

static int ip_order;
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    double dx = ip_order ? -x->d : x->d, dy = ip_order ? -y->d : y->d;
    if (dx != dy)
        return dx < dy ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int accept_odd(void *ctx, int64_t label)
{
    (*(size_t *)ctx)++;
    return (label / 3) % 2 == 1;
}

/* Checks D/I of query q against the naive reference over the given probed lists. */
static void check_query(const tsr_ivfpq *ix, const float *x, const int64_t *lists,
                        size_t nprobe, size_t k, const float *D, const int64_t *I, int odd_only)
{
    size_t ncand = 0;
    for (size_t p = 0; p < nprobe; p++)
        if (lists[p] >= 0)
            ncand += ix->lists[lists[p]].size;
    cand *c = malloc((ncand + 1) * sizeof *c);
    size_t nc = 0;
    for (size_t p = 0; p < nprobe; p++) {
        if (lists[p] < 0)
            continue;
        const tsr_invlist *L = &ix->lists[lists[p]];
        for (size_t o = 0; o < L->size; o++) {
            if (odd_only && (L->ids[o] / 3) % 2 != 1)
                continue;
            c[nc].d = ref_dist(ix, x, (size_t)lists[p], o);
            c[nc].id = L->ids[o];
            nc++;
        }
    }
    ip_order = ix->metric == TSR_METRIC_IP;
    qsort(c, nc, sizeof *c, cand_cmp);
    for (size_t r = 0; r < k; r++) {
        if (r >= nc) {
            assert_int_equal(I[r], -1);
            assert_true(isinf(D[r]) && (ip_order ? D[r] < 0 : D[r] > 0));
            continue;
        }
        double tol = 1e-4 * (fabs(c[r].d) + 1.0);
        if (fabs(D[r] - c[r].d) > tol)
            fail_msg("rank %zu: distance %g, reference %g (id %lld vs %lld)", r, D[r], c[r].d,
                     (long long)I[r], (long long)c[r].id);
        assert_true(I[r] >= 0);
        if (odd_only)
            assert_int_equal((I[r] / 3) % 2, 1);
    }
    free(c);
}

/* ---- the public scanner over the index's own lists ---- */
typedef struct scan_ctx {
    float *scores;
    size_t n, cap;
    float thr;     /* threshold the sink returns */
    float maxseen; /* largest score offered */
} scan_ctx;

static float collect_sink(void *ctx, size_t i, float score)
{
    scan_ctx *c = ctx;
    (void)i;
    if (c->n < c->cap)
        c->scores[c->n] = score;
    c->n++;
    if (score > c->maxseen)
        c->maxseen = score;
    return c->thr;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Every code of the probed lists is offered once with thr = +inf, the k best scores are
 * the search's distances (bit for bit for L2: same kernels, same base; IP by_residual: the
 * search recomputes <x, c>, the scanner takes it from the coarse step), and with a finite
 * threshold only codes at or under it are offered. */
static void check_scanner(const tsr_ivfpq *ix, const float *xq, size_t nq, const int64_t *cl,
                          const float *cd, size_t nprobe, size_t k, const float *D0)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq_scanner *sc = tsr_ivfpq_scanner_create(ix, TSR_SIMD_AUTO, &err);
    assert_non_null(sc);
    int ip = ix->metric == TSR_METRIC_IP;
    size_t d = (size_t)ix->d;
    for (size_t q = 0; q < nq; q++) {
        size_t total = 0;
        for (size_t p = 0; p < nprobe; p++)
            total += ix->lists[cl[q * nprobe + p]].size;
        scan_ctx c = {malloc((total ? total : 1) * sizeof(float)), 0, total, INFINITY,
                      -INFINITY};
        tsr_ivfpq_scanner_set_query(sc, xq + q * d);
        for (size_t p = 0; p < nprobe; p++) {
            const tsr_invlist *L = &ix->lists[cl[q * nprobe + p]];
            float *term = NULL;
            if (tsr_ivfpq_has_terms(ix)) {
                term = malloc((L->size ? L->size : 1) * sizeof(float));
                assert_int_equal(tsr_ivfpq_list_terms(ix, (size_t)cl[q * nprobe + p],
                                                      L->codes, L->size, term, &err), 0);
            }
            float base = tsr_ivfpq_scanner_base(sc, cd[q * nprobe + p]);
            assert_true(tsr_ivfpq_scanner_scan(sc, L->codes, L->size, term, base, INFINITY,
                                               collect_sink, &c) == INFINITY);
            free(term);
        }
        assert_int_equal(c.n, total);
        qsort(c.scores, total, sizeof(float), cmp_float);
        for (size_t r = 0; r < k && r < total; r++) {
            float want = ip ? -D0[q * k + r] : D0[q * k + r];
            if (!ip || !ix->by_residual)
                assert_true(c.scores[r] == want);
            else
                assert_true(fabsf(c.scores[r] - want) <= 1e-5f * (fabsf(want) + 1.0f));
        }
        /* a finite threshold: the median; nothing above it is offered */
        if (total > 0) {
            float thr = c.scores[total / 2];
            size_t under = 0;
            while (under < total && c.scores[under] <= thr)
                under++;
            scan_ctx c2 = {NULL, 0, 0, thr, -INFINITY};
            for (size_t p = 0; p < nprobe; p++) {
                const tsr_invlist *L = &ix->lists[cl[q * nprobe + p]];
                float *term = NULL;
                if (tsr_ivfpq_has_terms(ix)) {
                    term = malloc((L->size ? L->size : 1) * sizeof(float));
                    assert_int_equal(tsr_ivfpq_list_terms(ix, (size_t)cl[q * nprobe + p],
                                                          L->codes, L->size, term, &err), 0);
                }
                tsr_ivfpq_scanner_scan(sc, L->codes, L->size, term,
                                       tsr_ivfpq_scanner_base(sc, cd[q * nprobe + p]), thr,
                                       collect_sink, &c2);
                free(term);
            }
            assert_true(c2.maxseen <= thr);
            assert_int_equal(c2.n, under);
        }
        free(c.scores);
    }
    tsr_ivfpq_scanner_destroy(sc);
    if (!tsr_ivfpq_has_terms(ix)) /* terms are refused where they do not apply */
        assert_int_not_equal(tsr_ivfpq_list_terms(ix, 0, NULL, 0, NULL, &err), 0);
}

static void run_variant(int d, size_t M, size_t nbits, enum tsr_metric metric, int by_residual)
{
    const size_t nlist = 8, nprobe = 3, k = 10;
    fixture f = make(d, nlist, M, nbits, metric, by_residual, 1500, 40);
    tsr_ivfpq *ix = f.ix;
    size_t nq = f.nq;
    tsr_error err = TSR_ERROR_INIT;
    float *cd = malloc(nq * nprobe * sizeof(float));
    int64_t *cl = malloc(nq * nprobe * sizeof(int64_t));
    assert_int_equal(tsr_knn(f.xq, nq, ix->centroids, nlist, (size_t)d, metric, nprobe, NULL,
                             cd, cl, &err), 0);
    float *D0 = malloc(nq * k * sizeof(float)), *D = malloc(nq * 200 * sizeof(float));
    int64_t *I0 = malloc(nq * k * sizeof(int64_t)), *I = malloc(nq * 200 * sizeof(int64_t));
    tsr_ivfpq_search_opts o;
    tsr_ivfpq_search_opts_init(&o);
    o.nprobe = nprobe;

    /* scalar path vs the reference */
    o.simd = TSR_SIMD_SCALAR;
    assert_int_equal(tsr_ivfpq_search(ix, nq, f.xq, k, &o, D0, I0, &err), 0);
    for (size_t q = 0; q < nq; q++)
        check_query(ix, f.xq + q * d, cl + q * nprobe, nprobe, k, D0 + q * k, I0 + q * k, 0);

    /* every SIMD path vs the scalar one */
    enum tsr_simd paths[] = {TSR_SIMD_AVX2, TSR_SIMD_AVX512, TSR_SIMD_AUTO};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!tsr_ivfpq_search_simd_supported(paths[p])) {
            printf("    (%s not supported here, skipped)\n", tsr_ivfpq_search_simd_name(paths[p]));
            continue;
        }
        o.simd = paths[p];
        assert_int_equal(tsr_ivfpq_search(ix, nq, f.xq, k, &o, D, I, &err), 0);
        size_t same = 0;
        for (size_t q = 0; q < nq; q++) {
            same += memcmp(I + q * k, I0 + q * k, k * sizeof(int64_t)) == 0;
            if (getenv("TSR_TEST_VERBOSE") && memcmp(I + q * k, I0 + q * k, k * sizeof(int64_t)))
                for (size_t r = 0; r < k; r++)
                    printf("q%zu r%zu %lld %.9g | %lld %.9g\n", q, r, (long long)I0[q * k + r],
                           D0[q * k + r], (long long)I[q * k + r], D[q * k + r]);
            assert_memory_equal(D + q * k, D0 + q * k, k * sizeof(float));
        }
        /* every kernel sums in the same order: bit-identical results */
        if (same < nq)
            fail_msg("%s: %zu of %zu queries differ from scalar", tsr_ivfpq_search_simd_name(paths[p]),
                     nq - same, nq);
    }
    o.simd = TSR_SIMD_AUTO;
    check_scanner(ix, f.xq, nq, cl, cd, nprobe, k, D0);

    /* search_preassigned with the same lists gives the same answer; with lists shuffled
     * and one dropped, the answer matches the reference over those lists */
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                  &err), 0);
    o.simd = TSR_SIMD_SCALAR;
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                  &err), 0);
    assert_memory_equal(I, I0, nq * k * sizeof(int64_t));
    assert_memory_equal(D, D0, nq * k * sizeof(float));
    o.simd = TSR_SIMD_AUTO;
    for (size_t q = 0; q < nq; q++) {
        int64_t t = cl[q * nprobe];
        float td = cd[q * nprobe];
        cl[q * nprobe] = cl[q * nprobe + 2];
        cd[q * nprobe] = cd[q * nprobe + 2];
        cl[q * nprobe + 2] = t;
        cd[q * nprobe + 2] = td;
        cl[q * nprobe + 1] = -1;
    }
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                  &err), 0);
    for (size_t q = 0; q < nq; q++)
        check_query(ix, f.xq + q * d, cl + q * nprobe, nprobe, k, D + q * k, I + q * k, 0);

    /* threads: same answer */
    o.threads = 2;
    float *D2 = malloc(nq * k * sizeof(float));
    int64_t *I2 = malloc(nq * k * sizeof(int64_t));
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D2, I2,
                                                  &err), 0);
    assert_memory_equal(I2, I, nq * k * sizeof(int64_t));
    assert_memory_equal(D2, D, nq * k * sizeof(float));
    o.threads = 1;

    /* filter: only odd (label / 3); called far less often than there are codes */
    size_t calls = 0, codes = 0;
    o.accept = accept_odd;
    o.accept_ctx = &calls;
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                  &err), 0);
    for (size_t q = 0; q < nq; q++) {
        check_query(ix, f.xq + q * d, cl + q * nprobe, nprobe, k, D + q * k, I + q * k, 1);
        for (size_t p = 0; p < nprobe; p++)
            if (cl[q * nprobe + p] >= 0)
                codes += ix->lists[cl[q * nprobe + p]].size;
    }
    /* (the lists were reordered worst-first above, so many candidates improve the heap) */
    if (!(calls >= k && calls < codes * 3 / 4))
        fail_msg("filter called %zu times for %zu codes", calls, codes);
    o.accept = NULL;

    /* k larger than the candidates: padded with -1 / inf */
    int64_t *cl1 = malloc(nq * sizeof(int64_t));
    float *cd1 = malloc(nq * sizeof(float));
    for (size_t q = 0; q < nq; q++) {
        cl1[q] = cl[q * nprobe];
        cd1[q] = cd[q * nprobe];
    }
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, 200, 1, cl1, cd1, &o, D, I,
                                                  &err), 0);
    for (size_t q = 0; q < nq; q++)
        check_query(ix, f.xq + q * d, cl1 + q, 1, 200, D + q * 200, I + q * 200, 0);
    free(cl1);
    free(cd1);

    /* max_codes = 1: only the first probed list is scanned */
    o.max_codes = 1;
    o.nprobe = nprobe;
    assert_int_equal(tsr_ivfpq_search(ix, nq, f.xq, k, &o, D, I, &err), 0);
    o.nprobe = 1;
    o.max_codes = 0;
    assert_int_equal(tsr_ivfpq_search(ix, nq, f.xq, k, &o, D2, I2, &err), 0);
    assert_memory_equal(I2, I, nq * k * sizeof(int64_t));

    /* bad list number */
    cl[0] = (int64_t)nlist;
    assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                  &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "nlist"));

    /* a list changed after the cache was built: an error, then fine after invalidate */
    if (ix->lists[0].size > 0) {
        assert_int_equal(tsr_invlist_append(&ix->lists[0], ix->code_size, 1, ix->lists[0].codes,
                                            &ix->lists[0].ids[0]), 0);
        cl[0] = 0;
        int rc = tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I, &err);
        assert_int_equal(rc, TSR_ESTATE);
        tsr_ivfpq_search_invalidate(ix);
        assert_int_equal(tsr_ivfpq_search_preassigned(ix, nq, f.xq, k, nprobe, cl, cd, &o, D, I,
                                                      &err), 0);
    }

    free(D2);
    free(I2);
    free(D0);
    free(I0);
    free(D);
    free(I);
    free(cd);
    free(cl);
    fixture_free(&f);
}

/* The quantized prefilter (8-bit codes, nprobe >= 2): with the scalar filter kernel
 * (TSR_SEARCH_FILTER=scalar), the default one (AVX-512 VBMI where present, else AVX2),
 * the AVX2 one (TSR_SIMD=avx2), and the process capped as a CPU without AVX-512
 * (TSR_SIMD_MAX=avx2: its own choices among what is left) or without any SIMD
 * (TSR_SIMD_MAX=scalar: no prefilter, the scalar scan), and with dsub = 1 the nibble stage
 * (the group stage: groups of 16 with the AVX2 kernel, of 4 with VBMI; TSR_SEARCH_NIBBLE=0
 * without it, =scalar / =scalar6 the scalar group kernels), the same labels and
 * bit-identical
 * distances as without it (TSR_SEARCH_FILTER=0), and the
 * reference; for every metric / residual variant, an M that is not a multiple of 4, k
 * from 1 to more than a block, the accept filter and two threads. */
static void filter_case(int d, size_t M, enum tsr_metric metric, int by_residual)
{
    const size_t nlist = 16, nprobe = 12;
    enum { NMO = 10 };
    const char *modes[NMO] = {"0", "scalar", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const char *simds[NMO] = {NULL, NULL, NULL, "avx2", NULL, NULL, "avx2", NULL, NULL, NULL};
    const char *caps[NMO] = {NULL, NULL, NULL, NULL, "avx2", "scalar", NULL, NULL, NULL, NULL};
    const char *nibs[NMO] = {NULL, NULL, NULL, NULL, NULL, NULL, "0", "scalar", "scalar6", "0"};
    fixture f[NMO];
    for (int mo = 0; mo < NMO; mo++) {
        /* one index per mode: the transposed copy is built with the cache (under the
         * mode's cap: none without a filter kernel) */
        if (caps[mo])
            setenv("TSR_SIMD_MAX", caps[mo], 1);
        f[mo] = make(d, nlist, M, 8, metric, by_residual, 3000, 30);
        unsetenv("TSR_SIMD_MAX");
        /* Pull the lists together (any centroids make a valid index): the answers then
         * spread over several lists and many codes come close to the heap top, so the
         * bound is really put to the test (not only codes far off). */
        unsigned s = 5;
        for (size_t i = 0; i < nlist * (size_t)d; i++)
            f[mo].ix->centroids[i] = f[mo].ix->centroids[i] * 0.02f + frand(&s) * 0.5f;
        for (size_t i = 0; i < f[mo].nq * (size_t)d; i++)
            f[mo].xq[i] = frand(&s) * 2.0f;
    }
    const size_t ks[] = {1, 10, 70};
    size_t nq = f[0].nq;
    tsr_error err = TSR_ERROR_INIT;
    for (size_t ki = 0; ki < 3; ki++) {
        size_t k = ks[ki];
        for (int acc = 0; acc < 2; acc++) {
            float *D[NMO];
            int64_t *I[NMO];
            for (int mo = 0; mo < NMO; mo++) {
                D[mo] = malloc(nq * k * sizeof(float));
                I[mo] = malloc(nq * k * sizeof(int64_t));
                tsr_ivfpq_search_opts o;
                tsr_ivfpq_search_opts_init(&o);
                o.nprobe = nprobe;
                o.threads = acc ? 1 : 2; /* (accept_odd counts without atomics) */
                size_t calls = 0;
                if (acc) {
                    o.accept = accept_odd;
                    o.accept_ctx = &calls;
                }
                if (modes[mo])
                    setenv("TSR_SEARCH_FILTER", modes[mo], 1);
                else
                    unsetenv("TSR_SEARCH_FILTER");
                if (simds[mo])
                    setenv("TSR_SIMD", simds[mo], 1);
                if (caps[mo])
                    setenv("TSR_SIMD_MAX", caps[mo], 1);
                if (nibs[mo])
                    setenv("TSR_SEARCH_NIBBLE", nibs[mo], 1);
                assert_int_equal(tsr_ivfpq_search(f[mo].ix, nq, f[mo].xq, k, &o, D[mo], I[mo],
                                                  &err), 0);
                unsetenv("TSR_SEARCH_FILTER");
                unsetenv("TSR_SIMD");
                unsetenv("TSR_SIMD_MAX");
                unsetenv("TSR_SEARCH_NIBBLE");
            }
            for (int mo = 1; mo < NMO; mo++) {
                assert_memory_equal(I[0], I[mo], nq * k * sizeof(int64_t));
                assert_memory_equal(D[0], D[mo], nq * k * sizeof(float));
            }
            float *cd = malloc(nq * nprobe * sizeof(float));
            int64_t *cl = malloc(nq * nprobe * sizeof(int64_t));
            assert_int_equal(tsr_knn(f[2].xq, nq, f[2].ix->centroids, nlist, (size_t)d, metric,
                                     nprobe, NULL, cd, cl, &err), 0);
            for (size_t q = 0; q < nq; q++)
                check_query(f[2].ix, f[2].xq + q * (size_t)d, cl + q * nprobe, nprobe, k,
                            D[2] + q * k, I[2] + q * k, acc);
            for (int mo = 0; mo < NMO; mo++) {
                free(D[mo]);
                free(I[mo]);
            }
            free(cd);
            free(cl);
        }
    }
    for (int mo = 0; mo < NMO; mo++)
        fixture_free(&f[mo]);
}

static void test_filter(void **st)
{
    (void)st;
    filter_case(64, 64, TSR_METRIC_L2, 1);
    filter_case(16, 16, TSR_METRIC_IP, 1); /* dsub = 1: the nibble stage, every metric form */
    filter_case(16, 16, TSR_METRIC_IP, 0);
    filter_case(8, 8, TSR_METRIC_L2, 0);
    filter_case(64, 32, TSR_METRIC_L2, 1);
    filter_case(16, 8, TSR_METRIC_L2, 0);
    filter_case(32, 16, TSR_METRIC_IP, 1);
    filter_case(24, 6, TSR_METRIC_IP, 0);
    filter_case(18, 9, TSR_METRIC_L2, 1);
}

/* Answers of nq queries (a reference D0/I0 and one under test D/I) and nq bounds. */
typedef struct answers {
    float *D0, *D, *b;
    int64_t *I0, *I;
} answers;

/* ... and the options of the bounds tests (nprobe 8) into *o. */
static answers answers_new(size_t nq, size_t k, tsr_ivfpq_search_opts *o)
{
    answers a = {malloc(nq * k * sizeof(float)), malloc(nq * k * sizeof(float)),
                 malloc(nq * sizeof(float)), malloc(nq * k * sizeof(int64_t)),
                 malloc(nq * k * sizeof(int64_t))};
    assert_true(a.D0 && a.D && a.b && a.I0 && a.I);
    tsr_ivfpq_search_opts_init(o);
    o->nprobe = 8;
    return a;
}

static void answers_free(answers *a)
{
    free(a->D0);
    free(a->D);
    free(a->b);
    free(a->I0);
    free(a->I);
}

/* opts.bounds: with each query's own k-th result as its bound the answer is the same bytes;
 * with its 5th, exactly the results within it (the same ones, in the same places) and
 * empty slots after; NaN is no bound. With the prefilter (dsub = 1 and 4) and without. */
static void bounds_case(int d, size_t M, enum tsr_metric metric, int by_residual)
{
    const size_t nlist = 16, k = 10, nq = 60;
    fixture f = make(d, nlist, M, 8, metric, by_residual, 3000, nq);
    tsr_error err = TSR_ERROR_INIT;
    int ip = metric == TSR_METRIC_IP;
    tsr_ivfpq_search_opts o;
    answers a = answers_new(nq, k, &o);
    float *D0 = a.D0, *D = a.D, *b = a.b;
    int64_t *I0 = a.I0, *I = a.I;
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D0, I0, &err), 0);
    o.bounds = b;
    for (size_t q = 0; q < nq; q++)
        b[q] = D0[q * k + k - 1];
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), 0);
    assert_memory_equal(I, I0, nq * k * sizeof *I);
    assert_memory_equal(D, D0, nq * k * sizeof *D);
    for (size_t q = 0; q < nq; q++)
        b[q] = NAN;
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), 0);
    assert_memory_equal(I, I0, nq * k * sizeof *I);
    for (size_t q = 0; q < nq; q++)
        b[q] = D0[q * k + 4];
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), 0);
    size_t kept = 0;
    for (size_t q = 0; q < nq; q++)
        for (size_t r = 0; r < k; r++) {
            int within = ip ? D0[q * k + r] >= b[q] : D0[q * k + r] <= b[q];
            if (within) {
                assert_int_equal(I[q * k + r], I0[q * k + r]);
                assert_true(D[q * k + r] == D0[q * k + r]);
                kept++;
            } else {
                assert_int_equal(I[q * k + r], -1);
                assert_true(D[q * k + r] == (ip ? -INFINITY : INFINITY));
            }
        }
    assert_true(kept >= 5 * nq);
    answers_free(&a);
    fixture_free(&f);
}

static void test_bounds(void **st)
{
    (void)st;
    bounds_case(16, 16, TSR_METRIC_L2, 1); /* dsub = 1: the group kernel, rows' ends */
    bounds_case(16, 16, TSR_METRIC_IP, 0);
    bounds_case(32, 8, TSR_METRIC_L2, 0);
    bounds_case(32, 8, TSR_METRIC_IP, 1);
}

/* bounds with an IwQR refine: refused (they bound the PQ scan, whose k * k_factor results
 * the refine re-ranks, so a bound on the k-th would drop candidates the refine needs), with
 * a message, and nothing is written; with no_refine (the PQ scan alone) they apply as on
 * any index. */
static void test_bounds_refine(void **st)
{
    (void)st;
    const size_t k = 10, nq = 20, nb = 2000, d = 16;
    fixture f = make((int)d, 16, 4, 8, TSR_METRIC_L2, 1, nb, nq);
    tsr_error err = TSR_ERROR_INIT;
    unsigned s = 7;
    f.ix->is_refine = 1;
    f.ix->k_factor = 4.0f;
    assert_int_equal(tsr_pq_init(&f.ix->refine_pq, d, 4, 8, &err), 0);
    for (size_t i = 0; i < d * 256; i++)
        f.ix->refine_pq.centroids[i] = frand(&s);
    f.ix->refine_codes_n = (3 * nb + 1) * f.ix->refine_pq.code_size; /* labels 3i + 1 */
    f.ix->refine_codes = malloc(f.ix->refine_codes_n);
    for (size_t i = 0; i < f.ix->refine_codes_n; i++)
        f.ix->refine_codes[i] = (uint8_t)(i * 31 + 7);
    tsr_ivfpq_search_opts o;
    answers a = answers_new(nq, k, &o);
    float *D0 = a.D0, *D = a.D, *b = a.b;
    int64_t *I0 = a.I0, *I = a.I;
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), 0); /* refined */
    o.no_refine = 1;
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D0, I0, &err), 0);
    for (size_t q = 0; q < nq; q++)
        b[q] = D0[q * k + k - 1];
    o.bounds = b;
    o.no_refine = 0;
    memset(D, 0x5a, nq * k * sizeof(float));
    memset(I, 0x5a, nq * k * sizeof(int64_t));
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "IwQR"));
    for (size_t i = 0; i < nq * k * sizeof(float); i++)
        assert_int_equal(((const uint8_t *)D)[i], 0x5a);
    for (size_t i = 0; i < nq * k * sizeof(int64_t); i++)
        assert_int_equal(((const uint8_t *)I)[i], 0x5a);
    o.no_refine = 1;
    assert_int_equal(tsr_ivfpq_search(f.ix, nq, f.xq, k, &o, D, I, &err), 0);
    assert_memory_equal(I, I0, nq * k * sizeof *I);
    assert_memory_equal(D, D0, nq * k * sizeof *D);
    answers_free(&a);
    fixture_free(&f);
}

static void test_l2_res_8(void **st) { (void)st; run_variant(16, 4, 8, TSR_METRIC_L2, 1); }
static void test_l2_nores_8(void **st) { (void)st; run_variant(16, 4, 8, TSR_METRIC_L2, 0); }
static void test_ip_res_8(void **st) { (void)st; run_variant(16, 4, 8, TSR_METRIC_IP, 1); }
static void test_ip_nores_8(void **st) { (void)st; run_variant(16, 4, 8, TSR_METRIC_IP, 0); }
static void test_l2_res_4(void **st) { (void)st; run_variant(16, 8, 4, TSR_METRIC_L2, 1); }
static void test_ip_nores_4(void **st) { (void)st; run_variant(16, 8, 4, TSR_METRIC_IP, 0); }
static void test_l2_res_m6(void **st) { (void)st; run_variant(24, 6, 8, TSR_METRIC_L2, 1); }
static void test_ip_res_m16(void **st) { (void)st; run_variant(32, 16, 8, TSR_METRIC_IP, 1); }
static void test_l2_nores_m9_5(void **st) { (void)st; run_variant(18, 9, 5, TSR_METRIC_L2, 0); }
static void test_ip_res_nbits1(void **st) { (void)st; run_variant(16, 8, 1, TSR_METRIC_IP, 1); }
/* dsub = 1 (M = d): the shape of PQ64 on d = 64, the benches' index */
static void test_l2_res_dsub1(void **st) { (void)st; run_variant(16, 16, 8, TSR_METRIC_L2, 1); }
static void test_ip_nores_dsub1(void **st) { (void)st; run_variant(16, 16, 8, TSR_METRIC_IP, 0); }
static void test_l2_nores_dsub1(void **st) { (void)st; run_variant(16, 16, 8, TSR_METRIC_L2, 0); }

/* The kernels directly, on random tables and codes, lengths not multiples of 16. */
static void test_kernels(void **st)
{
    (void)st;
    unsigned s = 3;
    for (size_t M = 1; M <= 67; M += 11) {
        size_t n = 77;
        float *T = malloc(M * 256 * sizeof(float)), *term = malloc(n * sizeof(float));
        uint8_t *codes = malloc(n * M);
        float *o0 = malloc(n * sizeof(float)), *o1 = malloc(n * sizeof(float));
        for (size_t i = 0; i < M * 256; i++)
            T[i] = frand(&s);
        for (size_t i = 0; i < n * M; i++)
            codes[i] = (uint8_t)(frand(&s) * 512.0f + 256.0f);
        for (size_t i = 0; i < n; i++)
            term[i] = frand(&s);
        tsr__scan8_scalar(T, M, codes, n, term, 0.5f, o0);
        for (size_t i = 0; i < n; i++) {
            double r = 0.5 + term[i];
            for (size_t m = 0; m < M; m++)
                r += T[m * 256 + codes[i * M + m]];
            assert_true(fabs(o0[i] - r) < 1e-4);
        }
        if (tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX2)) {
            tsr__scan8_avx2(T, M, codes, n, term, 0.5f, o1);
            for (size_t i = 0; i < n; i++)
                assert_true(o0[i] == o1[i]);
            tsr__scan8_avx2(T, M, codes, n, NULL, 0.0f, o1);
            tsr__scan8_scalar(T, M, codes, n, NULL, 0.0f, o0);
            for (size_t i = 0; i < n; i++)
                assert_true(o0[i] == o1[i]);
        }
        tsr__scan8_scalar(T, M, codes, n, term, 0.5f, o0);
        if (tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX512)) {
            tsr__scan8_avx512(T, M, codes, n, term, 0.5f, o1);
            for (size_t i = 0; i < n; i++)
                assert_true(o0[i] == o1[i]);
        }
        free(T);
        free(term);
        free(codes);
        free(o0);
        free(o1);
    }
}

static void test_simd_env(void **st)
{
    (void)st;
    setenv("TSR_SIMD", "scalar", 1);
    assert_int_equal(tsr_ivfpq_search_simd_auto(), TSR_SIMD_SCALAR);
    setenv("TSR_SIMD", "avx2", 1);
    if (tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX2))
        assert_int_equal(tsr_ivfpq_search_simd_auto(), TSR_SIMD_AVX2);
    unsetenv("TSR_SIMD");
    assert_true(tsr_ivfpq_search_simd_supported(tsr_ivfpq_search_simd_auto()));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),       cmocka_unit_test(test_simd_env),
        cmocka_unit_test(test_l2_res_8),      cmocka_unit_test(test_l2_nores_8),
        cmocka_unit_test(test_ip_res_8),      cmocka_unit_test(test_ip_nores_8),
        cmocka_unit_test(test_filter),        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_bounds_refine),
        cmocka_unit_test(test_l2_res_4),      cmocka_unit_test(test_ip_nores_4),
        cmocka_unit_test(test_l2_res_m6),     cmocka_unit_test(test_ip_res_m16),
        cmocka_unit_test(test_l2_nores_m9_5), cmocka_unit_test(test_ip_res_nbits1),
        cmocka_unit_test(test_l2_res_dsub1), cmocka_unit_test(test_ip_nores_dsub1),
        cmocka_unit_test(test_l2_nores_dsub1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
