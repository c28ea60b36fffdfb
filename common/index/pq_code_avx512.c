/*
 * pq_code_avx512 — AVX-512 count of sorted 1-D sub-centroids <= x for the dsub = 1 encode
 * (dispatched from pq_code.c; the scalar binary search gives the same count).
 */
#include <immintrin.h>
#include <stddef.h>

size_t tsr__count_le_avx512(const float *v, size_t k, float x);

/* k is a multiple of 16 */
size_t tsr__count_le_avx512(const float *v, size_t k, float x)
{
    const __m512 xv = _mm512_set1_ps(x);
    size_t c = 0;
    for (size_t j = 0; j < k; j += 16)
        c += (size_t)__builtin_popcount(_mm512_cmp_ps_mask(_mm512_loadu_ps(v + j), xv, _CMP_LE_OQ));
    return c;
}
