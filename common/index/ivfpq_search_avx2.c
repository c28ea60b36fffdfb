/*
 * ivfpq_search_avx2 — the 8-bit ADC scan kernel with AVX2 gathers, 8 codes at a time
 * (compiled with -mavx2 -mfma; called only when the CPU has AVX2, see ivfpq_search.c).
 *
 * For 8 codes and 4 sub-quantizers at once, one dword gather fetches the 4 code bytes
 * of each code; each byte then indexes its sub-quantizer's 256-float row of the table
 * through a float gather. The sums are formed in exactly the order of the scalar kernel
 * (four accumulators by m % 4, tail sub-quantizers into the first, ((a0+a1)+(a2+a3)),
 * then (base + term) + sum), so every path returns bit-identical distances and exact
 * ties stay ties whatever the kernel or the position of a code in a block.
 */
#include "index/ivfpq_search_int.h"

#include <immintrin.h>

void tsr__scan8_avx2(const float *T, size_t M, const uint8_t *codes, size_t n,
                     const float *term, float base, float *out)
{
    size_t M4 = M & ~(size_t)3;
    const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_epi32((int)M));
    const __m256i lo = _mm256_set1_epi32(0xff);
    const __m256 vbase = _mm256_set1_ps(base);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint8_t *c = codes + i * M;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t m = 0; m < M4; m += 4) {
            __m256i v = _mm256_i32gather_epi32((const int *)(c + m), stride, 1);
            const float *t = T + m * 256;
            __m256i j0 = _mm256_and_si256(v, lo);
            __m256i j1 = _mm256_and_si256(_mm256_srli_epi32(v, 8), lo);
            __m256i j2 = _mm256_and_si256(_mm256_srli_epi32(v, 16), lo);
            __m256i j3 = _mm256_srli_epi32(v, 24);
            a0 = _mm256_add_ps(a0, _mm256_i32gather_ps(t, j0, 4));
            a1 = _mm256_add_ps(a1, _mm256_i32gather_ps(t + 256, j1, 4));
            a2 = _mm256_add_ps(a2, _mm256_i32gather_ps(t + 512, j2, 4));
            a3 = _mm256_add_ps(a3, _mm256_i32gather_ps(t + 768, j3, 4));
        }
        if (M4 < M) {
            float s0[8];
            _mm256_storeu_ps(s0, a0);
            for (size_t r = 0; r < 8; r++)
                for (size_t m = M4; m < M; m++)
                    s0[r] += T[m * 256 + c[r * M + m]];
            a0 = _mm256_loadu_ps(s0);
        }
        __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        __m256 b = term ? _mm256_add_ps(vbase, _mm256_loadu_ps(term + i))
                        : _mm256_add_ps(vbase, _mm256_setzero_ps());
        _mm256_storeu_ps(out + i, _mm256_add_ps(b, acc));
    }
    if (i < n)
        tsr__scan8_scalar(T, M, codes + i * M, n - i, term ? term + i : NULL, base, out + i);
}
