/*
 * ivfpq_search_scalar — the scalar reference kernels of the IVFPQ search: the 8-bit ADC
 * scan, the scan for any nbits, the quantized prefilter and the quantizer of its table
 * (contracts in ivfpq_search_int.h). Compiled without SIMD flags, so it runs on any
 * x86-64 (or other) CPU; ivfpq_dispatch.c chooses between these and the SIMD forms
 * (ivfpq_search_avx2.c, ivfpq_search_avx512.c) at run time, and the SIMD forms hand
 * their tails (fewer codes than a vector) to tsr__scan8_scalar. The summation order
 * written here is the contract that makes every kernel bit-identical.
 */
#include "index/ivfpq_search_int.h"

#include <float.h>
#include <math.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* 4-wide vectors of the GCC vector extension (SSE2 on x86-64, no flags needed). */
typedef float v4sf __attribute__((vector_size(16)));
typedef int32_t v4si __attribute__((vector_size(16)));
typedef uint8_t v16qu __attribute__((vector_size(16)));

/* ---- scan kernels ----------------------------------------------------------------- */

static inline uint64_t le64(uint64_t w)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(w);
#else
    return w;
#endif
}

void tsr__scan8_scalar(const float *T, size_t M, const uint8_t *codes, size_t n,
                       const float *term, float base, float *out)
{
    /* This summation order is the contract of every 8-bit kernel (see _avx2.c): four
     * accumulators by m % 4, tail sub-quantizers into the first, ((a0+a1)+(a2+a3)), then
     * (base + term) + sum. It makes all paths bit-identical. base + 0.0f for "no term" is
     * exact. Code bytes are read 8 at a time and split with shifts: one load per lookup
     * instead of two (the scan is bound by loads; measured 12 vs 17 ns per code, M=64). */
    for (size_t i = 0; i < n; i++) {
        const uint8_t *c = codes + i * M;
        /* The codes stream from memory (one 64-byte line per code at M = 64) and the
         * hardware prefetcher does not run far enough ahead: without this the loop
         * stalls on the code load (26 vs 13 ns per code at nprobe 256). A prefetch past
         * the end of the codes is harmless (it never faults). */
        __builtin_prefetch(c + TSR__SCAN_PREFETCH * M);
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        size_t m = 0;
        for (; m + 8 <= M; m += 8) {
            uint64_t w;
            memcpy(&w, c + m, 8);
            w = le64(w);
            const float *t = T + m * 256;
            a0 += t[w & 255];
            a1 += t[256 + ((w >> 8) & 255)];
            a2 += t[512 + ((w >> 16) & 255)];
            a3 += t[768 + ((w >> 24) & 255)];
            a0 += t[1024 + ((w >> 32) & 255)];
            a1 += t[1280 + ((w >> 40) & 255)];
            a2 += t[1536 + ((w >> 48) & 255)];
            a3 += t[1792 + (w >> 56)];
        }
        for (; m + 4 <= M; m += 4) {
            a0 += T[(m + 0) * 256 + c[m + 0]];
            a1 += T[(m + 1) * 256 + c[m + 1]];
            a2 += T[(m + 2) * 256 + c[m + 2]];
            a3 += T[(m + 3) * 256 + c[m + 3]];
        }
        for (; m < M; m++)
            a0 += T[m * 256 + c[m]];
        out[i] = (base + (term ? term[i] : 0.0f)) + ((a0 + a1) + (a2 + a3));
    }
}

/* Any nbits: sub-codes unpacked with the Faiss bit order. */
void tsr__scan_generic(const float *T, const tsr_pq *pq, const uint8_t *codes, size_t n,
                       const float *term, float base, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *c = codes + i * pq->code_size;
        float a = 0;
        for (size_t m = 0; m < pq->M; m++)
            a += T[m * pq->ksub + tsr_pq_code_get(c, m, pq->nbits)];
        out[i] = base + (term ? term[i] : 0.0f) + a;
    }
}

/* ---- the quantized prefilter ------------------------------------------------------ */

/* The quantized prefilter, scalar form (see ivfpq_search_int.h; the AVX-512 VBMI kernel
 * must return the same bits). */
uint64_t tsr__filter8_scalar(const uint8_t *Tq, size_t M, const uint8_t *blk, size_t n,
                             const float *term, float base, float qmin, float delta,
                             float lim, float *lb)
{
    uint64_t mask = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t q = 0;
        for (size_t m = 0; m < M; m++)
            q += Tq[m * 256 + blk[m * TSR__FBLOCK + i]];
        if (tsr__bound_keep(base, term, i, qmin, delta, q, lim, lb))
            mask |= (uint64_t)1 << i;
    }
    return mask;
}

/* Lane-wise min / max / clamp (C has no vector ?:). vmin4(a, b) is a where a < b, else
 * b (so a NaN in a is skipped); vclamp255(v) is v where v < 255, else 255. On x86 these
 * are exactly MINPS / MAXPS (which return the second operand unless the first is
 * smaller / larger: the same bits, also for NaN and signed zeros), one instruction each
 * instead of four (the quantizer took ~10 us per query at M = 64 on Zen 3 with the
 * select form, ~2x that of the AVX2 prefilter's table preparation). */
#if defined(__SSE__)
static inline v4sf vmin4(v4sf a, v4sf b) { return (v4sf)_mm_min_ps((__m128)a, (__m128)b); }
static inline v4sf vmax4(v4sf a, v4sf b) { return (v4sf)_mm_max_ps((__m128)a, (__m128)b); }
#else
static inline v4sf vsel4(v4si m, v4sf a, v4sf b)
{
    v4si r = (m & (v4si)a) | (~m & (v4si)b);
    return (v4sf)r;
}
static inline v4sf vmin4(v4sf a, v4sf b) { return vsel4(a < b, a, b); }
static inline v4sf vmax4(v4sf a, v4sf b) { return vsel4(a > b, a, b); }
#endif
static inline v4sf vclamp255(v4sf v)
{
    const v4sf c = {255.0f, 255.0f, 255.0f, 255.0f};
    return vmin4(v, c);
}

/* Quantizes the table down for the prefilter: Tq[m][j] = floor((T[m][j] - min_m) /
 * delta) clamped to 255, one delta for all m (so the bound is qmin + delta * sum of the
 * bytes), qmin = sum_m min_m. tabs = sum_m max_j |T[m][j]| (rounding margin). Returns 0
 * when the table is not finite (no filter then). */
int tsr__quantize_table(const float *T, size_t M, uint8_t *Tq, float *qmin, float *delta,
                        float *tabs)
{
    float mins[256], maxr = 0, qm = 0, ta = 0;
    for (size_t m = 0; m < M; m++) {
        /* 4-wide min / max with 4 independent chains (a scalar chain of 256 dependent
         * minss/maxss was 15 % of the search at nprobe 64) */
        const float *t = T + m * 256;
        v4sf n0, n1, n2, n3, x0, x1, x2, x3;
        memcpy(&n0, t, 16);
        memcpy(&n1, t + 4, 16);
        memcpy(&n2, t + 8, 16);
        memcpy(&n3, t + 12, 16);
        x0 = n0, x1 = n1, x2 = n2, x3 = n3;
        for (size_t j = 16; j < 256; j += 16) {
            v4sf v0, v1, v2, v3;
            memcpy(&v0, t + j, 16);
            memcpy(&v1, t + j + 4, 16);
            memcpy(&v2, t + j + 8, 16);
            memcpy(&v3, t + j + 12, 16);
            n0 = vmin4(v0, n0);
            n1 = vmin4(v1, n1);
            n2 = vmin4(v2, n2);
            n3 = vmin4(v3, n3);
            x0 = vmax4(v0, x0);
            x1 = vmax4(v1, x1);
            x2 = vmax4(v2, x2);
            x3 = vmax4(v3, x3);
        }
        n0 = vmin4(n1, n0);
        n2 = vmin4(n3, n2);
        n0 = vmin4(n2, n0);
        x0 = vmax4(x1, x0);
        x2 = vmax4(x3, x2);
        x0 = vmax4(x2, x0);
        float mn = n0[0], mx = x0[0];
        for (int r = 1; r < 4; r++) {
            mn = n0[r] < mn ? n0[r] : mn;
            mx = x0[r] > mx ? x0[r] : mx;
        }
        /* The comparisons skip a NaN entry; that is harmless: its byte becomes 255 (see
         * below) and a code using it has a NaN distance on every path, which never
         * enters the heap. Infinities make the bound useless: no filter. */
        if (!tsr__quantize_row(mn, mx, mins, m, &maxr, &ta, &qm))
            return 0;
    }
    float dl, inv;
    tsr__quantize_scale(maxr, &dl, &inv);
    for (size_t m = 0; m < M; m++) {
        const float *t = T + m * 256;
        const float mn = mins[m];
        uint8_t *q = Tq + m * 256;
        /* (t - mn) * inv is in [0, 255 (1 + eps)]; truncation rounds down, the clamp too,
         * so q * delta <= t - mn up to rounding that the margin covers. */
        for (size_t j = 0; j < 256; j += 16) {
            v4sf v[4];
            v4si iv[4];
            for (int r = 0; r < 4; r++) {
                memcpy(&v[r], t + j + 4 * r, 16);
                v[r] = vclamp255((v[r] - mn) * inv); /* also a NaN -> 255 */
                iv[r] = __builtin_convertvector(v[r], v4si);
            }
            /* 16 int32 in 0..255 to 16 bytes (GCC packs these with SSE) */
            v16qu b = {(uint8_t)iv[0][0], (uint8_t)iv[0][1], (uint8_t)iv[0][2],
                       (uint8_t)iv[0][3], (uint8_t)iv[1][0], (uint8_t)iv[1][1],
                       (uint8_t)iv[1][2], (uint8_t)iv[1][3], (uint8_t)iv[2][0],
                       (uint8_t)iv[2][1], (uint8_t)iv[2][2], (uint8_t)iv[2][3],
                       (uint8_t)iv[3][0], (uint8_t)iv[3][1], (uint8_t)iv[3][2],
                       (uint8_t)iv[3][3]};
            memcpy(q + j, &b, 16);
        }
    }
    *qmin = qm;
    *delta = dl;
    *tabs = ta;
    return qm > -INFINITY && qm < INFINITY && ta < INFINITY;
}
