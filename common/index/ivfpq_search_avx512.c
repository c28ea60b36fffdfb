/*
 * ivfpq_search_avx512 — the 8-bit ADC scan kernel with AVX-512 gathers, 16 codes at a
 * time (compiled with AVX-512 flags; called only when the CPU has AVX-512F/BW/VL/DQ).
 *
 * Same scheme and the same summation order as the AVX2 kernel (bit-identical to the
 * scalar kernel): a dword gather fetches 4 code bytes of each of 16 codes, and each byte
 * indexes its sub-quantizer's row of the table with a float gather.
 *
 * Also the quantized prefilter with VPERMT2B (AVX-512 VBMI; compiled for it with a target
 * attribute and called only when tsr__filter8_avx512_supported says the CPU has it), and
 * the per-query table and its quantization for that prefilter, 16 floats at a time.
 */
#include "index/ivfpq_search_int.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "core/cpu.h"

void tsr__scan8_avx512(const float *T, size_t M, const uint8_t *codes, size_t n,
                       const float *term, float base, float *out)
{
    size_t M4 = M & ~(size_t)3;
    const __m512i stride = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)M));
    const __m512i lo = _mm512_set1_epi32(0xff);
    const __m512 vbase = _mm512_set1_ps(base);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const uint8_t *c = codes + i * M;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t m = 0; m < M4; m += 4) {
            __m512i v = _mm512_i32gather_epi32(stride, (const void *)(c + m), 1);
            const float *t = T + m * 256;
            __m512i j0 = _mm512_and_si512(v, lo);
            __m512i j1 = _mm512_and_si512(_mm512_srli_epi32(v, 8), lo);
            __m512i j2 = _mm512_and_si512(_mm512_srli_epi32(v, 16), lo);
            __m512i j3 = _mm512_srli_epi32(v, 24);
            a0 = _mm512_add_ps(a0, _mm512_i32gather_ps(j0, t, 4));
            a1 = _mm512_add_ps(a1, _mm512_i32gather_ps(j1, t + 256, 4));
            a2 = _mm512_add_ps(a2, _mm512_i32gather_ps(j2, t + 512, 4));
            a3 = _mm512_add_ps(a3, _mm512_i32gather_ps(j3, t + 768, 4));
        }
        if (M4 < M) {
            float s0[16];
            _mm512_storeu_ps(s0, a0);
            for (size_t r = 0; r < 16; r++)
                for (size_t m = M4; m < M; m++)
                    s0[r] += T[m * 256 + c[r * M + m]];
            a0 = _mm512_loadu_ps(s0);
        }
        __m512 acc = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        __m512 b = term ? _mm512_add_ps(vbase, _mm512_loadu_ps(term + i))
                        : _mm512_add_ps(vbase, _mm512_setzero_ps());
        _mm512_storeu_ps(out + i, _mm512_add_ps(b, acc));
    }
    if (i < n)
        tsr__scan8_scalar(T, M, codes + i * M, n - i, term ? term + i : NULL, base, out + i);
}

/* The end of a VBMI prefilter kernel: the 16-bit sums al / ah (unpacklo / unpackhi of the
 * looked-up bytes) back in code order, then the bounds (into lb unless NULL) and the mask,
 * formed as tsr__filter8_scalar forms them. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static inline uint64_t
vbmi_block_mask(__m512i al, __m512i ah, const float *term, size_t n, float base, float qmin,
                float delta, float lim, float *lb)
{
    /* unpack{lo,hi} work per 128-bit lane: word w of al is code 16 (w / 8) + w % 8, of
     * ah code 16 (w / 8) + 8 + w % 8. Back to code order (index bit 5 selects ah). */
    static const uint16_t perm[64] = {
        0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39,
        8,  9,  10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47,
        16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55,
        24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};
    __m512i qa = _mm512_permutex2var_epi16(al, _mm512_loadu_si512((const void *)perm), ah);
    __m512i qb = _mm512_permutex2var_epi16(al, _mm512_loadu_si512((const void *)(perm + 32)),
                                           ah);
    const __m512 vbase = _mm512_set1_ps(base), vqmin = _mm512_set1_ps(qmin),
                 vdelta = _mm512_set1_ps(delta), vlim = _mm512_set1_ps(lim);
    uint64_t mask = 0;
    for (size_t g = 0; g < 4; g++) {
        size_t i0 = g * 16;
        if (i0 >= n)
            break;
        size_t nv = n - i0 < 16 ? n - i0 : 16;
        __mmask16 vm = (__mmask16)((1u << nv) - 1);
        __m512i q16 = g < 2 ? qa : qb;
        __m256i h = (g & 1) ? _mm512_extracti64x4_epi64(q16, 1) : _mm512_castsi512_si256(q16);
        __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(h));
        __m512 cb = term ? _mm512_add_ps(vbase, _mm512_maskz_loadu_ps(vm, term + i0))
                         : _mm512_add_ps(vbase, _mm512_setzero_ps());
        __m512 l = _mm512_add_ps(cb, _mm512_add_ps(vqmin, _mm512_mul_ps(vdelta, qf)));
        if (lb != NULL)
            _mm512_mask_storeu_ps(lb + i0, vm, l);
        __mmask16 k = _mm512_mask_cmp_ps_mask(vm, l, vlim, _CMP_NGT_UQ);
        mask |= (uint64_t)k << i0;
    }
    return mask;
}

/* The quantized prefilter (see ivfpq_search_int.h): for each sub-quantizer, one 64-byte row
 * of a transposed block holds the code bytes of 64 codes; two VPERMT2B look them up in
 * the two 128-byte halves of the quantized table row and a blend by bit 7 picks the
 * half, so 64 lookups cost ~4 instructions instead of 64 loads. The bytes are summed in
 * 16-bit lanes (M <= 256: at most 65280) and the bound is formed in float exactly as
 * tsr__filter8_scalar forms it (same operations, same order: bit-identical). */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) uint64_t
tsr__filter8_avx512(const uint8_t *Tq, size_t M, const uint8_t *blk, size_t n,
                    const float *term, float base, float qmin, float delta, float lim,
                    float *lb)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i al = zero, ah = zero;
    for (size_t m = 0; m < M; m++) {
        __m512i idx = _mm512_loadu_si512((const void *)(blk + m * TSR__FBLOCK));
        const uint8_t *t = Tq + m * 256;
        __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)t), idx,
                                              _mm512_loadu_si512((const void *)(t + 64)));
        __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(t + 128)),
                                              idx,
                                              _mm512_loadu_si512((const void *)(t + 192)));
        __m512i v = _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
        al = _mm512_add_epi16(al, _mm512_unpacklo_epi8(v, zero));
        ah = _mm512_add_epi16(ah, _mm512_unpackhi_epi8(v, zero));
    }
    return vbmi_block_mask(al, ah, term, n, base, qmin, delta, lim, lb);
}

/* The 6-bit group stage (ivfpq_search_int.h): the ranks shifted right by 2 within 16-bit
 * lanes leave each byte's top 6 bits in its low 6 (VPERMB ignores the two above), one
 * VPERMB per 64 codes and sub-quantizer; sums and bounds as tsr__filter8_avx512's. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) uint64_t
tsr__filter6_avx512(const uint8_t *Tg, size_t M, const uint8_t *blk, size_t n,
                    const float *term, float base, float qmin, float delta, float lim,
                    float *lb)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i al = zero, ah = zero;
    for (size_t m = 0; m < M; m++) {
        __m512i idx =
            _mm512_srli_epi16(_mm512_loadu_si512((const void *)(blk + m * TSR__FBLOCK)), 2);
        __m512i v =
            _mm512_permutexvar_epi8(idx, _mm512_loadu_si512((const void *)(Tg + m * 64)));
        al = _mm512_add_epi16(al, _mm512_unpacklo_epi8(v, zero));
        ah = _mm512_add_epi16(ah, _mm512_unpackhi_epi8(v, zero));
    }
    return vbmi_block_mask(al, ah, term, n, base, qmin, delta, lim, lb);
}

/* The 6-bit kernel's group table (ivfpq_nibble.c tsr__group_table): the minimum of each
 * 4-byte lane by two shifted mins, its low byte kept by VPMOVDB; 16 groups per load. */
__attribute__((target("avx512f,avx512bw"))) void tsr__group6_avx512(const uint8_t *Tq,
                                                                    size_t M, uint8_t *Tg)
{
    for (size_t i = 0; i < M * 4; i++) {
        __m512i x = _mm512_loadu_si512((const void *)(Tq + i * 64));
        x = _mm512_min_epu8(x, _mm512_srli_epi32(x, 8));
        x = _mm512_min_epu8(x, _mm512_srli_epi32(x, 16));
        _mm_storeu_si128((__m128i *)(void *)(Tg + i * 16), _mm512_cvtepi32_epi8(x));
    }
}

/* The quantization step of tsr__group_table_sorted for groups of 4 (the VBMI kernel's):
 * each group's minimum entry (at offset at[m] of the group) picked from 64 floats by two
 * VPERMT2PS and a lane shuffle (16 groups; a gather was ~3x slower here), then
 * tsr__quantize_table_avx512's operations on it: (v - mins[m]) * inv, MINPS against 255,
 * truncation, VPMOVDB. The same bytes as the scalar step. */
__attribute__((target("avx512f"))) void tsr__group_sorted_avx512(const float *T, size_t M,
                                                                 const float *mins,
                                                                 const uint8_t *at, float inv,
                                                                 uint8_t *Tg)
{
    const __m512 vinv = _mm512_set1_ps(inv), c255 = _mm512_set1_ps(255.0f);
    /* lanes 0..7: entries 0, 4, 8, 12 of the first operand, then of the second */
    const __m512i step = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    for (size_t m = 0; m < M; m++) {
        const __m512i idx = _mm512_add_epi32(step, _mm512_set1_epi32(at[m]));
        const __m512 mn = _mm512_set1_ps(mins[m]);
        for (size_t c = 0; c < 4; c++) {
            const float *t = T + m * 256 + c * 64;
            __m512 lo = _mm512_permutex2var_ps(_mm512_loadu_ps(t), idx, _mm512_loadu_ps(t + 16));
            __m512 hi =
                _mm512_permutex2var_ps(_mm512_loadu_ps(t + 32), idx, _mm512_loadu_ps(t + 48));
            __m512 v = _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
            v = _mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(v, mn), vinv), c255);
            _mm_storeu_si128((__m128i *)(void *)(Tg + m * 64 + c * 16),
                             _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
        }
    }
}

int tsr__filter8_avx512_supported(void)
{
    return tsr_cpu_has(TSR_CPU_AVX512_VBMI);
}

/* The per-query table of the scaled-dot forms (IP, L2 by_residual), 16 entries at a time
 * with the 16 accumulators of a 256-entry row in registers: T[m][j] = s x_0 c_0j, then
 * + s x_t c_tj for t = 1 .. dsub - 1, each a multiply then an add, in this order: the
 * same operations as tsr__build_table's 4-wide loop, so the same bits. ksub % 16 == 0. */
void tsr__table_avx512(const float *ct, const float *x, size_t M, size_t dsub, size_t ksub,
                       float scale, float *T)
{
    for (size_t m = 0; m < M; m++) {
        const float *xm = x + m * dsub;
        const float *cm = ct + m * dsub * ksub;
        float *tab = T + m * ksub;
        for (size_t j0 = 0; j0 < ksub; j0 += 256) {
            size_t nj = ksub - j0 < 256 ? ksub - j0 : 256; /* a multiple of 16 */
            __m512 acc[16];
            const __m512 x0 = _mm512_set1_ps(scale * xm[0]);
            for (size_t g = 0; g < nj / 16; g++)
                acc[g] = _mm512_mul_ps(x0, _mm512_loadu_ps(cm + j0 + g * 16));
            for (size_t t = 1; t < dsub; t++) {
                const __m512 xt = _mm512_set1_ps(scale * xm[t]);
                const float *c = cm + t * ksub + j0;
                for (size_t g = 0; g < nj / 16; g++)
                    acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(xt, _mm512_loadu_ps(c + g * 16)));
            }
            for (size_t g = 0; g < nj / 16; g++)
                _mm512_storeu_ps(tab + j0 + g * 16, acc[g]);
        }
    }
}

/* tsr__quantize_table 16 lanes at a time: the same per-row min and max (min and max are
 * exact, so their order does not matter for finite tables), the same float operations for
 * delta, qmin, tabs and each byte, so the same bytes. A NaN entry: the scalar kernel's
 * running min / max skip it unless it is the row's first entry (then no filter); here
 * unless it is among its first 64 (no filter then either). Both are valid bounds: the
 * search results are the same (test_ivfpq_search compares every kernel). */
int tsr__quantize_table_avx512(const float *T, size_t M, uint8_t *Tq, float *qmin,
                               float *delta, float *tabs)
{
    float mins[256], maxr = 0, qm = 0, ta = 0;
    for (size_t m = 0; m < M; m++) {
        const float *t = T + m * 256;
        __m512 n0 = _mm512_loadu_ps(t), n1 = _mm512_loadu_ps(t + 16);
        __m512 n2 = _mm512_loadu_ps(t + 32), n3 = _mm512_loadu_ps(t + 48);
        __m512 x0 = n0, x1 = n1, x2 = n2, x3 = n3;
        for (size_t j = 64; j < 256; j += 64) {
            __m512 v0 = _mm512_loadu_ps(t + j), v1 = _mm512_loadu_ps(t + j + 16);
            __m512 v2 = _mm512_loadu_ps(t + j + 32), v3 = _mm512_loadu_ps(t + j + 48);
            n0 = _mm512_min_ps(v0, n0); /* a NaN v keeps n (VMINPS returns the 2nd) */
            n1 = _mm512_min_ps(v1, n1);
            n2 = _mm512_min_ps(v2, n2);
            n3 = _mm512_min_ps(v3, n3);
            x0 = _mm512_max_ps(v0, x0);
            x1 = _mm512_max_ps(v1, x1);
            x2 = _mm512_max_ps(v2, x2);
            x3 = _mm512_max_ps(v3, x3);
        }
        /* a NaN still in a lane is a NaN among the first 64: make the row non-finite */
        __m512 nn = _mm512_min_ps(_mm512_min_ps(n0, n1), _mm512_min_ps(n2, n3));
        __m512 xx = _mm512_max_ps(_mm512_max_ps(x0, x1), _mm512_max_ps(x2, x3));
        __mmask16 nan = _mm512_cmp_ps_mask(n0, n0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(n1, n1, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(n2, n2, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(n3, n3, _CMP_UNORD_Q);
        if (nan)
            return 0;
        float mn = _mm512_reduce_min_ps(nn), mx = _mm512_reduce_max_ps(xx);
        if (!tsr__quantize_row(mn, mx, mins, m, &maxr, &ta, &qm))
            return 0;
    }
    float dl, inv;
    tsr__quantize_scale(maxr, &dl, &inv);
    const __m512 c255 = _mm512_set1_ps(255.0f), vinv = _mm512_set1_ps(inv);
    for (size_t m = 0; m < M; m++) {
        const float *t = T + m * 256;
        const __m512 vmn = _mm512_set1_ps(mins[m]);
        uint8_t *q = Tq + m * 256;
        for (size_t j = 0; j < 256; j += 16) {
            /* (t - mn) * inv clamped to 255 (a NaN -> 255: VMINPS returns the 2nd), then
             * truncated: the scalar kernel's operations */
            __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(t + j), vmn), vinv);
            v = _mm512_min_ps(v, c255);
            _mm_storeu_si128((__m128i *)(void *)(q + j),
                             _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
        }
    }
    *qmin = qm;
    *delta = dl;
    *tabs = ta;
    return qm > -INFINITY && qm < INFINITY && ta < INFINITY;
}
