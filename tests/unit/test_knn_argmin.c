/*
 * test_knn_argmin — tsr_knn with k = 1 (the 8-lane scan of the coarse step at nprobe 1
 * and of the k-means assignment) against a sequential reference.
 *
 * Small integer coordinates make every product and norm exact in float whatever the
 * order of the sgemm, so the reference can recompute the very distances and require the
 * same winner: the first (smallest) index among exact ties, across the 16-lane groups, the
 * scalar tail and the 1024-column blocks; rows with NaN and infinite coordinates never
 * win (unless nothing else can).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/knn.h"

static unsigned urand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

static void run(size_t n, size_t ny, size_t d, unsigned seed, int specials)
{
    unsigned s = seed;
    float *x = malloc(n * d * sizeof(float)), *y = malloc(ny * d * sizeof(float));
    float *D = malloc(n * sizeof(float));
    int64_t *I = malloc(n * sizeof(int64_t));
    /* few distinct values: many exact ties between database rows */
    for (size_t i = 0; i < n * d; i++)
        x[i] = (float)(urand(&s) % 5) - 2.0f;
    for (size_t i = 0; i < ny * d; i++)
        y[i] = (float)(urand(&s) % 3) - 1.0f;
    if (specials) {
        for (size_t j = 0; j < ny; j += 97)
            y[j * d + urand(&s) % d] = NAN;
        for (size_t j = 5; j < ny; j += 131)
            y[j * d] = INFINITY;
    }
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_knn(x, n, y, ny, d, TSR_METRIC_L2, 1, NULL, D, I, &err), 0);
    float *yn = malloc(ny * sizeof(float)), *xn = malloc(n * sizeof(float));
    tsr_knn_norms(y, ny, d, yn);
    tsr_knn_norms(x, n, d, xn);
    for (size_t i = 0; i < n; i++) {
        float best = INFINITY;
        int64_t bi = -1;
        for (size_t j = 0; j < ny; j++) {
            float ip = 0;
            for (size_t t = 0; t < d; t++)
                ip += x[i * d + t] * y[j * d + t];
            float v = xn[i] + yn[j] - 2 * ip;
            if (v < best) {
                best = v;
                bi = (int64_t)j;
            }
        }
        if (bi >= 0 && best < 0)
            best = 0;
        if (I[i] != bi)
            fail_msg("query %zu: label %lld, reference %lld (%g vs %g)", i, (long long)I[i],
                     (long long)bi, D[i], best);
        if (bi >= 0)
            assert_true(D[i] == best);
    }
    free(x);
    free(y);
    free(D);
    free(I);
    free(yn);
    free(xn);
}

/* Each case with the AVX-512 scan (where the CPU has it) and the scalar one. */
static void both(size_t n, size_t ny, size_t d, unsigned seed, int specials)
{
    unsetenv("TSR_SIMD");
    run(n, ny, d, seed, specials);
    setenv("TSR_SIMD", "scalar", 1);
    run(n, ny, d, seed, specials);
    unsetenv("TSR_SIMD");
}

static void test_ties(void **st)
{
    (void)st;
    both(300, 2500, 8, 1, 0);  /* 3 column blocks, a tail of 4, 3 row blocks */
    both(7, 37, 4, 2, 0);      /* two 16-lane groups and a tail */
    both(5, 7, 3, 3, 0);       /* tail only */
    both(130, 1031, 16, 4, 0); /* 64 groups of 16 and a tail of 7 */
}

static void test_specials(void **st)
{
    (void)st;
    both(200, 2100, 6, 5, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_specials),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
