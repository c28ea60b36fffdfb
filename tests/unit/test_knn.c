/*
 * test_knn — blocked sgemm kNN against a naive double-precision reference; the k-heap's
 * AVX-512 candidate blocks against its scalar loop (same bits); fvecs/ivecs round trip and
 * rejection of malformed files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "index/knn.h"
#include "index/vecs_io.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void check_metric(enum tsr_metric metric, size_t n, size_t ny, size_t d, size_t k)
{
    unsigned s = 7;
    float *x = malloc(n * d * sizeof(float)), *y = malloc(ny * d * sizeof(float));
    for (size_t i = 0; i < n * d; i++)
        x[i] = frand(&s);
    for (size_t i = 0; i < ny * d; i++)
        y[i] = frand(&s);
    float *D = malloc(n * k * sizeof(float));
    int64_t *I = malloc(n * k * sizeof(int64_t));
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_knn(x, n, y, ny, d, metric, k, NULL, D, I, &err), 0);
    double *ref = malloc(ny * sizeof(double));
    size_t kk = k < ny ? k : ny;
    for (size_t q = 0; q < n; q++) {
        for (size_t j = 0; j < ny; j++) {
            double a = 0;
            for (size_t t = 0; t < d; t++) {
                double u = x[q * d + t], v = y[j * d + t];
                a += metric == TSR_METRIC_L2 ? (u - v) * (u - v) : u * v;
            }
            ref[j] = a;
        }
        for (size_t r = 0; r < kk; r++) {
            int64_t id = I[q * k + r];
            assert_true(id >= 0 && (size_t)id < ny);
            assert_true(fabs(ref[id] - D[q * k + r]) < 1e-4);
            if (r > 0) {
                if (metric == TSR_METRIC_L2)
                    assert_true(D[q * k + r] >= D[q * k + r - 1]);
                else
                    assert_true(D[q * k + r] <= D[q * k + r - 1]);
            }
        }
        /* nothing clearly better than the last kept result was left out */
        size_t better = 0;
        double last = ref[I[q * k + kk - 1]];
        for (size_t j = 0; j < ny; j++)
            if (metric == TSR_METRIC_L2 ? ref[j] < last - 1e-5 : ref[j] > last + 1e-5)
                better++;
        assert_true(better < kk);
        for (size_t r = ny; r < k; r++)
            assert_int_equal(I[q * k + r], -1);
    }
    free(ref);
    free(x);
    free(y);
    free(D);
    free(I);
}

static void test_knn_l2(void **state)
{
    (void)state;
    check_metric(TSR_METRIC_L2, 50, 3000, 24, 10);
    check_metric(TSR_METRIC_L2, 1100, 70, 8, 1);
}

static void test_knn_ip(void **state)
{
    (void)state;
    check_metric(TSR_METRIC_IP, 30, 2100, 16, 5);
    check_metric(TSR_METRIC_IP, 3, 4, 16, 9); /* k > ny: -1 padding */
}

/* Large k (the selection path: k >= 32) on coordinates in {0, 0.5, ..., 2}: every product
 * and sum is exact in float, so the exact reference order (distance, then the smaller
 * label; many ties) must come out label for label, whatever the algorithm. */
static int ref_cmp_l2(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static void check_exact_ties(enum tsr_metric metric, size_t n, size_t ny, size_t d, size_t k)
{
    unsigned s = 11;
    float *x = malloc(n * d * sizeof(float)), *y = malloc(ny * d * sizeof(float));
    for (size_t i = 0; i < n * d; i++)
        x[i] = 0.5f * (float)((s = s * 1103515245u + 12345u) >> 16 & 3);
    for (size_t i = 0; i < ny * d; i++)
        y[i] = 0.5f * (float)((s = s * 1103515245u + 12345u) >> 16 & 3);
    float *D = malloc(n * k * sizeof(float));
    int64_t *I = malloc(n * k * sizeof(int64_t));
    double *ref = malloc(2 * ny * sizeof(double));
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_knn(x, n, y, ny, d, metric, k, NULL, D, I, &err), 0);
    for (size_t q = 0; q < n; q++) {
        for (size_t j = 0; j < ny; j++) {
            double a = 0;
            for (size_t t = 0; t < d; t++) {
                double u = x[q * d + t], v = y[j * d + t];
                a += metric == TSR_METRIC_L2 ? (u - v) * (u - v) : u * v;
            }
            ref[2 * j] = metric == TSR_METRIC_L2 ? a : -a; /* smaller is better */
            ref[2 * j + 1] = (double)j;
        }
        qsort(ref, ny, 2 * sizeof(double), ref_cmp_l2);
        for (size_t r = 0; r < k; r++) {
            if (r >= ny) {
                assert_int_equal(I[q * k + r], -1);
                continue;
            }
            assert_int_equal(I[q * k + r], (int64_t)ref[2 * r + 1]);
            double dv = metric == TSR_METRIC_L2 ? ref[2 * r] : -ref[2 * r];
            assert_true(D[q * k + r] == (float)dv);
        }
    }
    free(ref);
    free(x);
    free(y);
    free(D);
    free(I);
}

static void test_knn_large_k(void **state)
{
    (void)state;
    const size_t ks[] = {32, 100, 257, 1999, 2000, 2300};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        check_exact_ties(TSR_METRIC_L2, 20, 2000, 8, ks[i]);
        check_exact_ties(TSR_METRIC_IP, 20, 2000, 8, ks[i]);
    }
    check_exact_ties(TSR_METRIC_L2, 300, 4000, 16, 64); /* several x blocks */
    check_exact_ties(TSR_METRIC_L2, 20, 2000, 8, 10);   /* heap path, same bar */
}

/* The k-heap path with the AVX-512 candidate blocks (k < 32; L2 up to 127) against the
 * scalar loop or selection (TSR_SIMD=scalar): the same labels and distance bits, on data
 * with many equal distances (the tie rule decides), a NaN row (never selected), rows not
 * a multiple of 16, norms given or not, L2 and IP. */
static void test_knn_heap_wide(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512f")) { /* both runs would be the scalar path */
        print_message("no AVX-512F on this CPU: the candidate blocks are not run\n");
        return;
    }
    const size_t n = 37, ny = 1000 + 7, d = 8;
    unsigned s = 5;
    float *x = malloc(n * d * sizeof(float)), *y = malloc(ny * d * sizeof(float));
    float *yn = malloc(ny * sizeof(float));
    for (size_t i = 0; i < n * d; i++)
        x[i] = 0.5f * (float)((s = s * 1103515245u + 12345u) >> 16 & 3);
    for (size_t i = 0; i < ny * d; i++)
        y[i] = 0.5f * (float)((s = s * 1103515245u + 12345u) >> 16 & 7);
    y[500 * d + 3] = NAN;
    tsr_knn_norms(y, ny, d, yn);
    /* 32 .. 127: the AVX-512 heap (L2) against the scalar path's selection */
    const size_t ks[] = {2, 3, 10, 16, 31, 32, 64, 127};
    float *D0 = malloc(n * 127 * sizeof(float)), *D1 = malloc(n * 127 * sizeof(float));
    int64_t *I0 = malloc(n * 127 * sizeof(int64_t)), *I1 = malloc(n * 127 * sizeof(int64_t));
    tsr_error err = TSR_ERROR_INIT;
    for (int metric = 0; metric < 2; metric++) {
        enum tsr_metric m = metric ? TSR_METRIC_IP : TSR_METRIC_L2;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            size_t k = ks[ki];
            for (int norms = 0; norms < 2; norms++) {
                setenv("TSR_SIMD", "scalar", 1);
                assert_int_equal(tsr_knn(x, n, y, ny, d, m, k, norms ? yn : NULL, D0, I0, &err),
                                 0);
                unsetenv("TSR_SIMD");
                assert_int_equal(tsr_knn(x, n, y, ny, d, m, k, norms ? yn : NULL, D1, I1, &err),
                                 0);
                assert_memory_equal(I0, I1, n * k * sizeof *I0);
                assert_memory_equal(D0, D1, n * k * sizeof *D0);
                for (size_t i = 0; i < n * k; i++)
                    assert_int_not_equal(I1[i], 500);
            }
        }
    }
    free(x);
    free(y);
    free(yn);
    free(D0);
    free(D1);
    free(I0);
    free(I1);
}

static void test_vecs_roundtrip(void **state)
{
    (void)state;
    char path[] = "/tmp/tsr_vecs_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i * 0.5f;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_fvecs_write(path, x, 3, 4, &err), 0);
    float *y = NULL;
    size_t n = 0, d = 0;
    assert_int_equal(tsr_fvecs_read(path, &y, &n, &d, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(d, 4);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    /* truncate by one byte: must be a format error, not a crash */
    assert_int_equal(truncate(path, 4 * 5 * 3 - 1), 0);
    assert_int_equal(tsr_fvecs_read(path, &y, &n, &d, &err), TSR_EFORMAT);
    unlink(path);
}

int main(void)
{
    tsr_blas_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_knn_l2),
        cmocka_unit_test(test_knn_ip),
        cmocka_unit_test(test_knn_large_k),
        cmocka_unit_test(test_knn_heap_wide),
        cmocka_unit_test(test_vecs_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
