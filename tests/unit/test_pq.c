/*
 * test_pq — PQ training, encoding and decoding, and IVFPQ train/add: encode equals the
 * brute-force nearest sub-centroid (dsub = 1 binary-search path and sgemm path; nbits 8,
 * 6 and 4), exact round trip of vectors made of sub-centroids, small reconstruction error,
 * determinism across seeds and thread counts; the one-vector encoder (tsr_pq_encoder) gives
 * the plain loop's codes (tsr_pq_encode_exact), with and without a residual, and the nearest
 * sub-centroid.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/ivfpq.h"
#include "index/ivfpq_build.h"
#include "index/kmeans.h"
#include "index/pq.h"
#include "index/pq_code.h"
#include "index/pq_train.h"

static float gauss(tsr_rng *r)
{
    float u = tsr_rng_float(r) + 1e-7f, v = tsr_rng_float(r);
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

static float *data(size_t n, size_t d, uint64_t seed)
{
    tsr_rng r;
    tsr_rng_seed(&r, seed);
    float *c = malloc(20 * d * sizeof(float)), *x = malloc(n * d * sizeof(float));
    for (size_t i = 0; i < 20 * d; i++)
        c[i] = gauss(&r) * 2;
    for (size_t i = 0; i < n; i++) {
        size_t j = tsr_rng_below(&r, 20);
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = c[j * d + t] + gauss(&r);
    }
    free(c);
    return x;
}

static double sub_dist(const tsr_pq *pq, const float *x, size_t m, size_t j)
{
    double s = 0;
    for (size_t t = 0; t < pq->dsub; t++) {
        double u = (double)x[m * pq->dsub + t] - pq->centroids[(m * pq->ksub + j) * pq->dsub + t];
        s += u * u;
    }
    return s;
}

static void check_encode(size_t d, size_t M, size_t nbits)
{
    size_t n = 4000;
    float *x = data(n, d, 1 + d + M + nbits);
    tsr_pq pq;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_pq_init(&pq, d, M, nbits, &err), 0);
    tsr_pq_train_params p;
    tsr_pq_train_params_default(&p);
    p.niter = 10;
    p.quiet = 1;
    assert_int_equal(tsr_pq_train(&pq, x, n, &p, &err), 0);
    uint8_t *codes = malloc(n * pq.code_size), *codes2 = malloc(n * pq.code_size);
    assert_int_equal(tsr_pq_encode(&pq, x, n, codes, 1, &err), 0);
    assert_int_equal(tsr_pq_encode(&pq, x, n, codes2, 3, &err), 0);
    assert_memory_equal(codes, codes2, n * pq.code_size);
    /* nearest sub-centroid, checked in double precision */
    for (size_t i = 0; i < n; i++) {
        const float *xr = x + i * d;
        for (size_t m = 0; m < M; m++) {
            uint32_t got = tsr_pq_code_get(codes + i * pq.code_size, m, nbits);
            assert_true(got < pq.ksub);
            double dg = sub_dist(&pq, xr, m, got), best = INFINITY;
            for (size_t j = 0; j < pq.ksub; j++)
                best = fmin(best, sub_dist(&pq, xr, m, j));
            assert_true(dg <= best + 1e-4 * (1 + best));
        }
    }
    /* the one-vector encoder: its transposed path = the plain loop, x and x - y */
    tsr_pq_encoder *enc = tsr_pq_encoder_create(&pq, &err);
    assert_non_null(enc);
    assert_true(tsr_pq_encoder_fast(enc));
    for (size_t i = 0; i + 1 < n; i += 7) {
        uint8_t a[64] = {0}, b[64] = {0};
        const float *xr = x + i * d, *yr = i % 2 ? x + (i + 1) * d : NULL;
        tsr_pq_encoder_encode(enc, xr, yr, a);
        tsr_pq_encode_exact(&pq, xr, yr, b);
        assert_memory_equal(a, b, pq.code_size);
        if (yr != NULL)
            continue;
        for (size_t m = 0; m < M; m++) {
            double dg = sub_dist(&pq, xr, m, tsr_pq_code_get(a, m, nbits)), best = INFINITY;
            for (size_t j = 0; j < pq.ksub; j++)
                best = fmin(best, sub_dist(&pq, xr, m, j));
            assert_true(dg <= best + 1e-4 * (1 + best));
        }
    }
    tsr_pq_encoder_destroy(enc);
    /* reconstruction error well below the data variance */
    float *y = malloc(n * d * sizeof(float));
    tsr_pq_decode(&pq, codes, n, y);
    double e = 0, v = 0;
    for (size_t i = 0; i < n * d; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        v += (double)x[i] * x[i];
    }
    assert_true(e < 0.5 * v);
    /* vectors made of sub-centroids encode to exactly those sub-centroids (when distinct)
     * and decode back exactly */
    tsr_rng r;
    tsr_rng_seed(&r, 5);
    for (size_t i = 0; i < 200; i++) {
        uint8_t want[64] = {0};
        float z[64];
        for (size_t m = 0; m < M; m++) {
            uint32_t j = (uint32_t)tsr_rng_below(&r, pq.ksub);
            tsr_pq_code_put(want, m, nbits, j);
            memcpy(z + m * pq.dsub, pq.centroids + (m * pq.ksub + j) * pq.dsub,
                   pq.dsub * sizeof(float));
        }
        uint8_t got[64];
        float back[64];
        assert_int_equal(tsr_pq_encode(&pq, z, 1, got, 1, &err), 0);
        tsr_pq_decode(&pq, got, 1, back);
        assert_memory_equal(back, z, d * sizeof(float));
        (void)want;
    }
    free(y);
    free(codes);
    free(codes2);
    free(x);
    tsr_pq_close(&pq);
}

static void test_encode_dsub1_nbits8(void **state) { (void)state; check_encode(16, 16, 8); }
static void test_encode_dsub4_nbits8(void **state) { (void)state; check_encode(32, 8, 8); }
static void test_encode_dsub2_nbits6(void **state) { (void)state; check_encode(16, 8, 6); }
static void test_encode_dsub1_nbits4(void **state) { (void)state; check_encode(8, 8, 4); }
static void test_encode_dsub8_nbits4(void **state) { (void)state; check_encode(32, 4, 4); }

static void test_train_determinism(void **state)
{
    (void)state;
    size_t n = 3000, d = 16;
    float *x = data(n, d, 9);
    tsr_pq a, b;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_pq_init(&a, d, 4, 8, &err), 0);
    assert_int_equal(tsr_pq_init(&b, d, 4, 8, &err), 0);
    tsr_pq_train_params p;
    tsr_pq_train_params_default(&p);
    p.niter = 5;
    p.quiet = 1;
    p.max_points_per_centroid = 10; /* exercise the sample: 2560 of 3000 */
    assert_int_equal(tsr_pq_train(&a, x, n, &p, &err), 0);
    p.threads = 3;
    assert_int_equal(tsr_pq_train(&b, x, n, &p, &err), 0);
    assert_memory_equal(a.centroids, b.centroids, d * 256 * sizeof(float));
    assert_int_equal(tsr_pq_train(&a, x, 100, &p, &err), TSR_EINVAL); /* n < ksub */
    tsr_pq_close(&a);
    tsr_pq_close(&b);
    free(x);
}

static tsr_ivfpq *build(const float *x, size_t n, size_t d, enum tsr_metric metric, int res,
                        int threads)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tsr_ivfpq_create((int)d, 20, 4, 8, metric, res, &err);
    assert_non_null(ix);
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.threads = threads;
    bp.quiet = 1;
    bp.pq_niter = 8;
    assert_int_equal(tsr_ivfpq_train(ix, x, n, &bp, &err), 0);
    assert_int_equal(tsr_ivfpq_add(ix, x, n, NULL, &bp, &err), 0);
    return ix;
}

static void test_ivfpq_build(void **state)
{
    (void)state;
    size_t n = 6000, d = 16;
    float *x = data(n, d, 4);
    for (int metric = 0; metric < 2; metric++) {
        for (int res = 0; res < 2; res++) {
            tsr_ivfpq *a = build(x, n, d, (enum tsr_metric)metric, res, 1);
            tsr_ivfpq *b = build(x, n, d, (enum tsr_metric)metric, res, 2);
            assert_int_equal(a->ntotal, (int64_t)n);
            assert_true(a->is_trained);
            assert_memory_equal(a->centroids, b->centroids, 20 * d * sizeof(float));
            assert_memory_equal(a->pq.centroids, b->pq.centroids, d * 256 * sizeof(float));
            size_t total = 0;
            int64_t *assign = malloc(n * sizeof(int64_t));
            tsr_error err = TSR_ERROR_INIT;
            assert_int_equal(tsr_ivfpq_assign(a, x, n, 1, assign, &err), 0);
            for (size_t l = 0; l < a->nlist; l++) {
                assert_int_equal(a->lists[l].size, b->lists[l].size);
                assert_memory_equal(a->lists[l].codes, b->lists[l].codes,
                                    a->lists[l].size * a->code_size);
                for (size_t e = 0; e < a->lists[l].size; e++) {
                    int64_t id = a->lists[l].ids[e];
                    assert_true(id >= 0 && (size_t)id < n);
                    assert_int_equal(assign[id], (int64_t)l); /* in its nearest list */
                    if (e > 0)
                        assert_true(id > a->lists[l].ids[e - 1]); /* input order */
                }
                total += a->lists[l].size;
            }
            assert_int_equal(total, n);
            if (metric == TSR_METRIC_IP) /* spherical coarse centroids */
                for (size_t l = 0; l < a->nlist; l++) {
                    float s = 0;
                    for (size_t t = 0; t < d; t++)
                        s += a->centroids[l * d + t] * a->centroids[l * d + t];
                    assert_true(fabsf(s - 1) < 1e-4f);
                }
            free(assign);
            tsr_ivfpq_destroy(a);
            tsr_ivfpq_destroy(b);
        }
    }
    /* too few vectors */
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tsr_ivfpq_create((int)d, 20, 4, 8, TSR_METRIC_L2, 1, &err);
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.quiet = 1;
    assert_int_equal(tsr_ivfpq_train(ix, x, 100, &bp, &err), TSR_EINVAL);
    assert_int_equal(tsr_ivfpq_add(ix, x, 10, NULL, &bp, &err), TSR_ESTATE);
    tsr_ivfpq_destroy(ix);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_dsub1_nbits8), cmocka_unit_test(test_encode_dsub4_nbits8),
        cmocka_unit_test(test_encode_dsub2_nbits6), cmocka_unit_test(test_encode_dsub1_nbits4),
        cmocka_unit_test(test_encode_dsub8_nbits4), cmocka_unit_test(test_train_determinism),
        cmocka_unit_test(test_ivfpq_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
