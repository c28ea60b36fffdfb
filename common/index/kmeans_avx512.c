/*
 * kmeans_avx512 — AVX-512 argmin/argmax for the assignment step (dispatched from
 * kmeans_kernels.c). Two passes: a vector min over the row, then the first index that
 * equals it, which gives exactly the scalar result (first index on ties).
 */
#include <immintrin.h>

#include "index/kmeans_int.h"

size_t tsr__argmin_l2_avx512(const float *ip, const float *cn, size_t n)
{
    __m512 best = _mm512_set1_ps(__builtin_inff());
    const __m512 m2 = _mm512_set1_ps(-2.0f);
    size_t j = 0;
    for (; j + 16 <= n; j += 16)
        best = _mm512_min_ps(best, _mm512_fmadd_ps(m2, _mm512_loadu_ps(ip + j),
                                                   _mm512_loadu_ps(cn + j)));
    float bv = _mm512_reduce_min_ps(best);
    for (; j < n; j++) {
        float v = __builtin_fmaf(-2.0f, ip[j], cn[j]);
        if (v < bv)
            bv = v;
    }
    const __m512 target = _mm512_set1_ps(bv);
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 v = _mm512_fmadd_ps(m2, _mm512_loadu_ps(ip + j), _mm512_loadu_ps(cn + j));
        __mmask16 m = _mm512_cmp_ps_mask(v, target, _CMP_EQ_OQ);
        if (m)
            return j + (size_t)__builtin_ctz(m);
    }
    for (; j < n; j++)
        if (__builtin_fmaf(-2.0f, ip[j], cn[j]) == bv)
            return j;
    return 0; /* NaN inputs only */
}

size_t tsr__argmax_avx512(const float *v, size_t n)
{
    __m512 best = _mm512_set1_ps(-__builtin_inff());
    size_t j = 0;
    for (; j + 16 <= n; j += 16)
        best = _mm512_max_ps(best, _mm512_loadu_ps(v + j));
    float bv = _mm512_reduce_max_ps(best);
    for (; j < n; j++)
        if (v[j] > bv)
            bv = v[j];
    const __m512 target = _mm512_set1_ps(bv);
    for (j = 0; j + 16 <= n; j += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + j), target, _CMP_EQ_OQ);
        if (m)
            return j + (size_t)__builtin_ctz(m);
    }
    for (; j < n; j++)
        if (v[j] == bv)
            return j;
    return 0;
}
