/*
 * kmeans_kernels — scalar argmin/argmax of the assignment step and the run-time choice of
 * the AVX-512 versions (kmeans_avx512.c). Set TSR_NO_SIMD=1 to force the scalar path.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "index/kmeans_int.h"
#include "core/cpu.h"
#include "core/testing.h"

size_t tsr__argmin_l2_scalar(const float *ip, const float *cn, size_t n)
{
    size_t b = 0;
    float bv = cn[0] - 2 * ip[0];
    for (size_t j = 1; j < n; j++) {
        float v = cn[j] - 2 * ip[j];
        if (v < bv) {
            bv = v;
            b = j;
        }
    }
    return b;
}

size_t tsr__argmax_scalar(const float *v, size_t n)
{
    size_t b = 0;
    for (size_t j = 1; j < n; j++)
        if (v[j] > v[b])
            b = j;
    return b;
}

/* Decided once, lazily, by whichever k-means thread gets here first; the training threads
 * race to it, so it is atomic (they all compute the same value; TSan flagged the plain int). */
static atomic_int use_avx512 = -1;

static int simd_ok(void)
{
    int v = atomic_load_explicit(&use_avx512, memory_order_relaxed);
    if (v < 0) {
        const char *e = tsr_test_knob(TSR_KNOB_NO_SIMD);
        v = !(e != NULL && *e && *e != '0') && tsr_cpu_has(TSR_CPU_AVX512);
        atomic_store_explicit(&use_avx512, v, memory_order_relaxed);
    }
    return v;
}

size_t tsr__argmin_l2(const float *ip, const float *cn, size_t n)
{
    return simd_ok() ? tsr__argmin_l2_avx512(ip, cn, n) : tsr__argmin_l2_scalar(ip, cn, n);
}

size_t tsr__argmax(const float *v, size_t n)
{
    return simd_ok() ? tsr__argmax_avx512(v, n) : tsr__argmax_scalar(v, n);
}

int tsr__cmp_vi(const void *a, const void *b)
{
    const tsr__vi *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}
