/*
 * knn_avx512 — the k = 1 L2 row scan of knn.c with AVX-512 (compiled with AVX-512 flags;
 * called only when the CPU has AVX-512F). The coarse step at nprobe 1 and the k-means
 * assignment spend a sixth of their time in this argmin over 4000 centroids.
 */
#include "index/knn_int.h"

#include <immintrin.h>
#include <math.h>

/* v_j = (xn + yn[j]) - 2 row[j] for j < n (n % 16 == 0), the exact expression of the
 * scalar scan. Each lane keeps its first strict minimum; among the lanes equal to the
 * overall minimum the smallest index wins: the first occurrence, as the sequential
 * `v < best` scan finds it (NaN never wins). Merges into *best / *bi like that scan. */
void tsr__knn_argmin_avx512(const float *row, const float *yn, float xn, size_t n,
                            float *best, int64_t *bi, size_t y0)
{
    const __m512 vx = _mm512_set1_ps(xn), two = _mm512_set1_ps(2.0f);
    __m512 bv = _mm512_set1_ps(INFINITY);
    __m512i bix = _mm512_setzero_si512();
    __m512i ix = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __mmask16 seen = 0;
    for (size_t j = 0; j < n; j += 16) {
        __m512 v = _mm512_sub_ps(_mm512_add_ps(vx, _mm512_loadu_ps(yn + j)),
                                 _mm512_mul_ps(two, _mm512_loadu_ps(row + j)));
        __mmask16 lt = _mm512_cmp_ps_mask(v, bv, _CMP_LT_OQ);
        bv = _mm512_mask_mov_ps(bv, lt, v);
        bix = _mm512_mask_mov_epi32(bix, lt, ix);
        seen |= lt;
        ix = _mm512_add_epi32(ix, sixteen);
    }
    float vals[16];
    int32_t idx[16];
    _mm512_storeu_ps(vals, bv);
    _mm512_storeu_si512((void *)idx, bix);
    int w = -1;
    for (int l = 0; l < 16; l++) {
        if (!(seen >> l & 1))
            continue;
        if (w < 0 || vals[l] < vals[w] || (vals[l] == vals[w] && idx[l] < idx[w]))
            w = l;
    }
    if (w >= 0 && vals[w] < *best) {
        *best = vals[w];
        *bi = (int64_t)(y0 + (size_t)idx[w]);
    }
}

/* The k-heap scan's candidates (k from 2 up to knn.c's selection threshold), 16 values at
 * a time: from block j on (j and n multiples of 16), the first block with a value that
 * could enter a heap whose worst kept distance is thr — v <= thr for L2 (v = (xn +
 * yn[j]) - 2 row[j], the scalar scan's expression, so the same bits), v >= thr for inner
 * products (lb: v = row[j], yn unused). A NaN is never a candidate, as it never enters
 * the heap. Returns the block's start with its 16 values in v and its candidate lanes in
 * *mask, or n when no block has one. The caller tests each candidate with tsr_heap_worse
 * against the heap as it is then (the lanes are a superset: thr only tightens). */
size_t tsr__knn_next_cand_avx512(const float *row, const float *yn, float xn, size_t j,
                                 size_t n, float thr, int lb, float *v, unsigned *mask)
{
    const __m512 vx = _mm512_set1_ps(xn), two = _mm512_set1_ps(2.0f);
    const __m512 vt = _mm512_set1_ps(thr);
    for (; j < n; j += 16) {
        __m512 r = _mm512_loadu_ps(row + j), x;
        __mmask16 m;
        if (lb) {
            x = r;
            m = _mm512_cmp_ps_mask(x, vt, _CMP_GE_OQ);
        } else {
            x = _mm512_sub_ps(_mm512_add_ps(vx, _mm512_loadu_ps(yn + j)),
                              _mm512_mul_ps(two, r));
            m = _mm512_cmp_ps_mask(x, vt, _CMP_LE_OQ);
        }
        if (m) {
            _mm512_storeu_ps(v, x);
            *mask = m;
            return j;
        }
    }
    return n;
}
