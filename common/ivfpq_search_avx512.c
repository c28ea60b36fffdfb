/*
 * ivfpq_search_avx512 — the 8-bit ADC scan kernel with AVX-512 gathers, 16 codes at a
 * time (compiled with AVX-512 flags; called only when the CPU has AVX-512F/BW/VL/DQ).
 *
 * Same scheme and the same summation order as the AVX2 kernel (bit-identical to the
 * scalar kernel): a dword gather fetches 4 code bytes of each of 16 codes, and each byte
 * indexes its sub-quantizer's row of the table with a float gather.
 */
#include "ivfpq_search.h"

#include <immintrin.h>

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
