/*
 * test_ivfpq_search_filter — the quantized prefilter of the 8-bit scan in isolation.
 *
 * tsr__quantize_table must give a lower bound that is also tight (the sum of the quantized
 * entries is within M * delta of the exact sum, so the filter really drops codes), and the
 * scalar (the reference), the AVX2 (VPSHUFB) and the AVX-512 VBMI filter kernels must
 * return the same masks and bit-identical bounds for every block length, with and without
 * terms, for limits around the bounds; the AVX2 kernel for every M from 1 to 256, ragged
 * blocks, extreme tables (all 0, all 255: the largest 16-bit sums) and the code bytes at
 * the edges of its nibble slices, with and without bounds (lb NULL). The run-time
 * choice of the kernel (tsr__filter8_choose) follows the CPU and TSR_SIMD /
 * TSR_SEARCH_FILTER. The search-level tests (filter on / off / scalar / AVX2, identical
 * results) are in test_ivfpq_search.c and test_shard_prefilter.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h" /* white-box: the kernels */

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static unsigned urand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* The exact sum in the plain kernels' order, from row-major codes. */
static float exact(const float *T, size_t M, const uint8_t *code)
{
    float out;
    tsr__scan8_scalar(T, M, code, 1, NULL, 0.0f, &out);
    return out;
}

static void test_quantize_bound(void **st)
{
    (void)st;
    unsigned s = 7;
    const size_t Ms[] = {4, 16, 64, 256};
    for (size_t mi = 0; mi < 4; mi++) {
        size_t M = Ms[mi];
        float *T = malloc(M * 256 * sizeof(float));
        uint8_t *Tq = malloc(M * 256);
        /* rows of different spread and offset, like -2 <x_m, c_mj> of real queries */
        for (size_t m = 0; m < M; m++) {
            float sc = 1.0f + (float)(m % 7) * 3.0f, off = frand(&s) * 50.0f;
            for (size_t j = 0; j < 256; j++)
                T[m * 256 + j] = off + sc * frand(&s);
        }
        float qmin, delta, tabs;
        assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 1);
        assert_true(delta > 0 && tabs > 0);
        uint8_t *code = malloc(M);
        for (int r = 0; r < 2000; r++) {
            uint32_t q = 0;
            for (size_t m = 0; m < M; m++) {
                code[m] = (uint8_t)urand(&s);
                q += Tq[m * 256 + code[m]];
            }
            float lb = qmin + delta * (float)q, ex = exact(T, M, code);
            float margin = tabs * (1.0f / 65536.0f);
            if (!(lb <= ex + margin))
                fail_msg("M=%zu: bound %.9g above the exact sum %.9g", M, lb, ex);
            if (!(ex - lb <= (float)M * delta + margin))
                fail_msg("M=%zu: bound %.9g loose by more than M * delta (exact %.9g, "
                         "delta %g)", M, lb, ex, delta);
        }
        /* the extreme entries map to 0 and (in the widest row) to 255 */
        int has0 = 0, has255 = 0;
        for (size_t i = 0; i < M * 256; i++) {
            has0 |= Tq[i] == 0;
            has255 |= Tq[i] == 255;
        }
        assert_true(has0 && has255);
        free(code);
        free(T);
        free(Tq);
    }
}

static void test_quantize_special(void **st)
{
    (void)st;
    const size_t M = 8;
    float T[8 * 256];
    uint8_t Tq[8 * 256];
    float qmin, delta, tabs;
    /* constant rows: the bound is the sum of the constants, exact */
    for (size_t i = 0; i < M * 256; i++)
        T[i] = (float)(i / 256) - 3.0f;
    assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 1);
    for (size_t i = 0; i < M * 256; i++)
        assert_int_equal(Tq[i], 0);
    assert_true(qmin == 4.0f); /* -3 -2 -1 0 1 2 3 4 */
    /* an infinity: no filter */
    T[5 * 256 + 17] = INFINITY;
    assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 0);
    T[5 * 256 + 17] = -INFINITY;
    assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 0);
}

/* The AVX-512 quantizer gives the scalar one's bytes, qmin, delta and tabs: random rows
 * of several spreads and M, constant rows, an infinity (both refuse), a NaN past a row's
 * first 64 entries (both skip it: byte 255), a NaN at entry 0 (both refuse). */
static void test_quantize_avx512(void **st)
{
    (void)st;
    if (!tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX512)) {
        print_message("no AVX-512 on this CPU: the AVX-512 quantizer is not run\n");
        return;
    }
    unsigned s = 11;
    const size_t Ms[] = {1, 3, 16, 64, 255, 256};
    for (size_t mi = 0; mi < 6; mi++) {
        size_t M = Ms[mi];
        float *T = malloc(M * 256 * sizeof(float));
        uint8_t *q0 = malloc(M * 256), *q1 = malloc(M * 256);
        for (int round = 0; round < 5; round++) {
            for (size_t m = 0; m < M; m++) {
                float sc = round == 4 ? 0.0f : 1.0f + (float)((m + round) % 5) * 7.0f;
                float off = frand(&s) * 100.0f;
                for (size_t j = 0; j < 256; j++)
                    T[m * 256 + j] = off + sc * frand(&s);
            }
            if (round == 2)
                T[(M - 1) * 256 + 200] = NAN;
            float a0, b0, c0, a1, b1, c1;
            int r0 = tsr__quantize_table(T, M, q0, &a0, &b0, &c0);
            int r1 = tsr__quantize_table_avx512(T, M, q1, &a1, &b1, &c1);
            assert_int_equal(r0, 1);
            assert_int_equal(r1, 1);
            assert_true(a0 == a1 && b0 == b1 && c0 == c1);
            assert_memory_equal(q0, q1, M * 256);
            if (round == 2)
                assert_int_equal(q1[(M - 1) * 256 + 200], 255);
        }
        T[0] = NAN;
        assert_int_equal(tsr__quantize_table(T, M, q0, &(float){0}, &(float){0}, &(float){0}), 0);
        assert_int_equal(
            tsr__quantize_table_avx512(T, M, q1, &(float){0}, &(float){0}, &(float){0}), 0);
        T[0] = 1.0f;
        T[M * 256 - 1] = -INFINITY;
        assert_int_equal(tsr__quantize_table(T, M, q0, &(float){0}, &(float){0}, &(float){0}), 0);
        assert_int_equal(
            tsr__quantize_table_avx512(T, M, q1, &(float){0}, &(float){0}, &(float){0}), 0);
        free(T);
        free(q0);
        free(q1);
    }
}

/* The AVX2 kernel on Tq (it reads the table in its own layout: a prepared copy). */
static uint64_t filter_avx2(const uint8_t *Tq, size_t M, const uint8_t *blk, size_t n,
                            const float *term, float base, float qmin, float delta, float lim,
                            float *lb)
{
    uint8_t *Tp = aligned_alloc(64, (M * 256 + 63) / 64 * 64);
    memcpy(Tp, Tq, M * 256);
    tsr__filter8_prep_avx2(Tp, M);
    uint64_t m = tsr__filter8_avx2(Tp, M, blk, n, term, base, qmin, delta, lim, lb);
    free(Tp);
    return m;
}

/* Row-major codes to one transposed block (zero padded). */
static void transpose(const uint8_t *codes, size_t M, size_t n, uint8_t *blk)
{
    memset(blk, 0, M * TSR__FBLOCK);
    for (size_t i = 0; i < n; i++)
        for (size_t m = 0; m < M; m++)
            blk[m * TSR__FBLOCK + i] = codes[i * M + m];
}

static void test_filter_kernels(void **st)
{
    (void)st;
    int have512 = tsr__filter8_avx512_supported(), have2 = tsr__filter8_avx2_supported();
    if (!have512)
        fprintf(stderr, "(no AVX-512 VBMI here: its filter kernel is not checked)\n");
    if (!have2)
        fprintf(stderr, "(no AVX2 here: its filter kernel is not checked)\n");
    unsigned s = 11;
    const size_t Ms[] = {1, 3, 8, 64, 200, 256};
    const size_t ns[] = {1, 15, 16, 17, 33, 63, 64};
    for (size_t mi = 0; mi < 6; mi++) {
        size_t M = Ms[mi];
        float *T = malloc(M * 256 * sizeof(float));
        uint8_t *Tq = aligned_alloc(64, (M * 256 + 63) / 64 * 64);
        uint8_t *codes = malloc(M * TSR__FBLOCK);
        uint8_t *blk = aligned_alloc(64, M * TSR__FBLOCK);
        for (size_t i = 0; i < M * 256; i++)
            T[i] = frand(&s) * 10.0f;
        float qmin, delta, tabs;
        assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 1);
        for (size_t ni = 0; ni < 7; ni++) {
            size_t n = ns[ni];
            for (size_t i = 0; i < M * n; i++)
                codes[i] = (uint8_t)urand(&s);
            transpose(codes, M, n, blk);
            float term[TSR__FBLOCK], lb0[TSR__FBLOCK], lb1[TSR__FBLOCK];
            for (size_t i = 0; i < n; i++)
                term[i] = frand(&s) * 4.0f;
            for (int wt = 0; wt < 2; wt++) {
                const float *tp = wt ? term : NULL;
                float base = 1.5f;
                uint64_t m0 = tsr__filter8_scalar(Tq, M, blk, n, tp, base, qmin, delta,
                                                  INFINITY, lb0);
                assert_true(m0 == (n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1));
                for (size_t i = 0; i < n; i++) {
                    /* the bound, from the row-major code */
                    uint32_t q = 0;
                    for (size_t m = 0; m < M; m++)
                        q += Tq[m * 256 + codes[i * M + m]];
                    float want = (base + (tp ? tp[i] : 0.0f)) + (qmin + delta * (float)q);
                    assert_memory_equal(&want, &lb0[i], sizeof want);
                    float ex = (base + (tp ? tp[i] : 0.0f)) + exact(T, M, codes + i * M);
                    assert_true(lb0[i] <= ex + (tabs + 8.0f) * (1.0f / 65536.0f));
                }
                /* limits at, just under and between the bounds */
                for (size_t li = 0; li < n + 2; li++) {
                    float lim = li < n ? lb0[li] : (li == n ? -INFINITY : lb0[0] * 0.5f);
                    if (li < n && li % 2)
                        lim = nextafterf(lim, -INFINITY);
                    uint64_t want = 0;
                    for (size_t i = 0; i < n; i++)
                        if (!(lb0[i] > lim))
                            want |= (uint64_t)1 << i;
                    uint64_t got = tsr__filter8_scalar(Tq, M, blk, n, tp, base, qmin, delta,
                                                       lim, NULL);
                    assert_true(got == want);
                    if (have512) {
                        memset(lb1, 0, sizeof lb1);
                        uint64_t g5 = tsr__filter8_avx512(Tq, M, blk, n, tp, base, qmin,
                                                          delta, lim, lb1);
                        if (g5 != want)
                            fail_msg("M=%zu n=%zu: avx512 mask %llx, scalar %llx", M, n,
                                     (unsigned long long)g5, (unsigned long long)want);
                        assert_memory_equal(lb0, lb1, n * sizeof(float));
                    }
                    if (have2) {
                        memset(lb1, 0, sizeof lb1);
                        uint64_t g2 = filter_avx2(Tq, M, blk, n, tp, base, qmin, delta, lim,
                                                  lb1);
                        if (g2 != want)
                            fail_msg("M=%zu n=%zu: avx2 mask %llx, scalar %llx", M, n,
                                     (unsigned long long)g2, (unsigned long long)want);
                        assert_memory_equal(lb0, lb1, n * sizeof(float));
                        assert_true(filter_avx2(Tq, M, blk, n, tp, base, qmin, delta, lim,
                                                NULL) == want);
                    }
                }
            }
        }
        free(T);
        free(Tq);
        free(codes);
        free(blk);
    }
}

/* A NaN limit keeps everything (!(lb > NaN)), a NaN bound is kept too. */
static void test_filter_nan(void **st)
{
    (void)st;
    const size_t M = 8;
    uint8_t Tq[8 * 256], blk[8 * TSR__FBLOCK];
    memset(Tq, 1, sizeof Tq);
    memset(blk, 0, sizeof blk);
    float term[3] = {0.0f, NAN, 100.0f};
    uint64_t m = tsr__filter8_scalar(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, 50.0f, NULL);
    assert_true(m == 3); /* 8 <= 50, NaN kept, 108 > 50 dropped */
    m = tsr__filter8_scalar(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, NAN, NULL);
    assert_true(m == 7);
    if (tsr__filter8_avx512_supported()) {
        assert_true(tsr__filter8_avx512(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, 50.0f, NULL) ==
                    3);
        assert_true(tsr__filter8_avx512(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, NAN, NULL) == 7);
    }
    if (tsr__filter8_avx2_supported()) {
        assert_true(filter_avx2(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, 50.0f, NULL) == 3);
        assert_true(filter_avx2(Tq, M, blk, 3, term, 0.0f, 0.0f, 1.0f, NAN, NULL) == 7);
        /* -inf drops all but the NaN bound (M = 32) */
        uint8_t Tq2[32 * 256], blk2[32 * TSR__FBLOCK];
        memset(Tq2, 1, sizeof Tq2);
        memset(blk2, 0, sizeof blk2);
        assert_true(filter_avx2(Tq2, 32, blk2, 3, term, 0.0f, 0.0f, 1.0f, -INFINITY, NULL) ==
                    2);
        assert_true(tsr__filter8_scalar(Tq2, 32, blk2, 3, term, 0.0f, 0.0f, 1.0f, -INFINITY,
                                        NULL) == 2);
    }
}

/* Scalar vs AVX2 for every M the prefilter takes (1..256), ragged blocks, random and
 * extreme tables, code bytes at the slice edges, limits at / just under / between the
 * bounds, +-inf and NaN, with and without terms and bounds (lb NULL).
 * Also the AVX-512 VBMI kernel where the CPU has it. */
static void test_filter_avx2_all_m(void **st)
{
    (void)st;
    if (!tsr__filter8_avx2_supported()) {
        fprintf(stderr, "(no AVX2 here: skipped)\n");
        return;
    }
    int have512 = tsr__filter8_avx512_supported();
    unsigned s = 99;
    const size_t ns[] = {1, 7, 8, 9, 31, 32, 33, 63, 64};
    const uint8_t edge[] = {0x00, 0x0f, 0x10, 0x6f, 0x70, 0x7f, 0x80, 0x8f, 0x90, 0xef, 0xf0, 0xff};
    uint8_t *Tq = aligned_alloc(64, 256 * 256), *blk = aligned_alloc(64, 256 * TSR__FBLOCK);
    uint8_t *codes = malloc(256 * TSR__FBLOCK);
    float *T = malloc(256 * 256 * sizeof(float));
    for (size_t M = 1; M <= 256; M++) {
        int kind = (int)(M % 4); /* 0: random T; 1: all 255; 2: all 0; 3: random bytes */
        float qmin = 0.25f, delta = 0.01f, tabs;
        if (kind == 0) {
            for (size_t i = 0; i < M * 256; i++)
                T[i] = frand(&s) * (float)(1 + M % 5);
            assert_int_equal(tsr__quantize_table(T, M, Tq, &qmin, &delta, &tabs), 1);
        } else {
            for (size_t i = 0; i < M * 256; i++)
                Tq[i] = kind == 1 ? 255 : kind == 2 ? 0 : (uint8_t)urand(&s);
        }
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            size_t n = ns[ni];
            for (size_t i = 0; i < M * n; i++)
                codes[i] = (M + ni) % 3 == 0 ? edge[urand(&s) % sizeof edge] : (uint8_t)urand(&s);
            transpose(codes, M, n, blk);
            float term[TSR__FBLOCK], lb0[TSR__FBLOCK], lb1[TSR__FBLOCK];
            for (size_t i = 0; i < n; i++)
                term[i] = frand(&s) * 3.0f;
            const float *tp = (M + ni) % 2 ? term : NULL;
            float base = frand(&s) * 8.0f;
            uint64_t all = tsr__filter8_scalar(Tq, M, blk, n, tp, base, qmin, delta, INFINITY,
                                               lb0);
            assert_true(all == (n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1));
            if (kind == 1) /* the largest sums: 255 M, up to 65280 */
                for (size_t i = 0; i < n; i++)
                    assert_true(lb0[i] == (base + (tp ? tp[i] : 0.0f)) +
                                              (qmin + delta * (float)(255 * M)));
            float lims[8] = {INFINITY, -INFINITY, NAN, lb0[0], nextafterf(lb0[n - 1], -INFINITY),
                             lb0[n / 2], 0.0f, 0.0f};
            float lo = lb0[0], hi = lb0[0];
            for (size_t i = 1; i < n; i++) {
                lo = lb0[i] < lo ? lb0[i] : lo;
                hi = lb0[i] > hi ? lb0[i] : hi;
            }
            lims[6] = lo + (hi - lo) * 0.1f;
            lims[7] = nextafterf(lo, -INFINITY); /* all out */
            for (size_t li = 0; li < 8; li++) {
                uint64_t want = tsr__filter8_scalar(Tq, M, blk, n, tp, base, qmin, delta,
                                                    lims[li], lb0);
                memset(lb1, 0xff, sizeof lb1);
                uint64_t got = filter_avx2(Tq, M, blk, n, tp, base, qmin, delta, lims[li], lb1);
                if (got != want)
                    fail_msg("M=%zu n=%zu lim %zu: avx2 mask %llx, scalar %llx", M, n, li,
                             (unsigned long long)got, (unsigned long long)want);
                assert_memory_equal(lb0, lb1, n * sizeof(float));
                got = filter_avx2(Tq, M, blk, n, tp, base, qmin, delta, lims[li], NULL);
                if (got != want)
                    fail_msg("M=%zu n=%zu lim %zu (lb NULL): avx2 mask %llx, scalar %llx", M,
                             n, li, (unsigned long long)got, (unsigned long long)want);
                if (have512)
                    assert_true(tsr__filter8_avx512(Tq, M, blk, n, tp, base, qmin, delta,
                                                    lims[li], NULL) == want);
            }
        }
    }
    free(Tq);
    free(blk);
    free(codes);
    free(T);
}

/* One block and the bound's parameters, as a kernel takes them. */
typedef struct kblock {
    size_t M;
    const uint8_t *blk;
    size_t n;
    const float *term;
    float base, qmin, delta;
} kblock;

/* SIMD kernel simd gives the masks and bounds of its scalar form ref, bit for bit, on
 * block b with table T: limits +-inf, NaN, at the first, middle and last bound (ref's own)
 * and just under the last; with and without the bounds out. */
static void same_as_scalar(const char *what, tsr__filter8_fn ref, tsr__filter8_fn simd,
                           const uint8_t *T, const kblock *b)
{
    float lb0[TSR__FBLOCK], lb1[TSR__FBLOCK];
    ref(T, b->M, b->blk, b->n, b->term, b->base, b->qmin, b->delta, INFINITY, lb0);
    float lims[6] = {INFINITY, -INFINITY, NAN, lb0[0], lb0[b->n / 2],
                     nextafterf(lb0[b->n - 1], -INFINITY)};
    for (size_t li = 0; li < 6; li++) {
        uint64_t want =
            ref(T, b->M, b->blk, b->n, b->term, b->base, b->qmin, b->delta, lims[li], lb0);
        memset(lb1, 0xff, sizeof lb1);
        uint64_t got =
            simd(T, b->M, b->blk, b->n, b->term, b->base, b->qmin, b->delta, lims[li], lb1);
        if (got != want)
            fail_msg("%s M=%zu n=%zu lim %zu: mask %llx, scalar %llx", what, b->M, b->n, li,
                     (unsigned long long)got, (unsigned long long)want);
        assert_memory_equal(lb0, lb1, b->n * sizeof(float));
        assert_true(simd(T, b->M, b->blk, b->n, b->term, b->base, b->qmin, b->delta, lims[li],
                         NULL) == want);
    }
}

/* The group stage (ivfpq_nibble.c): the group tables hold the minimum of each group of 16
 * (the nibble kernels) and of 4 (the 6-bit ones); the AVX2 nibble and the VBMI 6-bit
 * kernels' masks and bounds are their scalar ones' bit for bit (every M, the tails, limits
 * at / between the bounds, +-inf, NaN, with and without terms and bounds), and the bounds
 * are ordered: groups of 16 <= groups of 4 <= the 8-bit bound of the same quantized table
 * (so they drop nothing the 8-bit kernels keep). Made to fail by a kernel that reads the
 * low nibble, by group tables folded in the wrong order (SSE2) or shifted the wrong way
 * (AVX-512). */
static void test_nibble_kernels(void **st)
{
    (void)st;
    int avx2 = tsr__filter8_avx2_supported(), vbmi = tsr__filter8_avx512_supported();
    unsigned s = 7;
    const size_t ns[] = {1, 8, 31, 33, 63, 64};
    uint8_t *Tq = aligned_alloc(64, 256 * 256), *Tg = aligned_alloc(64, 256 * 16);
    uint8_t *T6 = aligned_alloc(64, 256 * 64), *Tv = aligned_alloc(64, 256 * 64);
    uint8_t *blk = aligned_alloc(64, 256 * TSR__FBLOCK), *codes = malloc(256 * TSR__FBLOCK);
    for (size_t M = 1; M <= 256; M += (M < 8 ? 1 : 7)) {
        for (size_t i = 0; i < M * 256; i++)
            Tq[i] = M % 3 == 0 ? 255 : (uint8_t)urand(&s);
        tsr__group_table(tsr__filter4_scalar, Tq, M, Tg);
        tsr__group_table(tsr__filter6_scalar, Tq, M, T6);
        if (vbmi) { /* the VBMI kernel's table (AVX-512BW) is the plain loop's */
            tsr__group_table(tsr__filter6_avx512, Tq, M, Tv);
            assert_memory_equal(T6, Tv, M * 64);
        }
        for (size_t m = 0; m < M; m++)
            for (size_t j = 0; j < 256; j++) { /* the minimum of each group of 16 / of 4 */
                assert_true(Tg[m * 16 + j / 16] <= Tq[m * 256 + j]);
                assert_true(T6[m * 64 + j / 4] <= Tq[m * 256 + j]);
                if (j % 16 == 15) {
                    size_t k = j - 15;
                    while (k <= j && Tq[m * 256 + k] != Tg[m * 16 + j / 16])
                        k++;
                    assert_true(k <= j);
                }
                if (j % 4 == 3)
                    assert_true(Tq[m * 256 + j - 3] == T6[m * 64 + j / 4] ||
                                Tq[m * 256 + j - 2] == T6[m * 64 + j / 4] ||
                                Tq[m * 256 + j - 1] == T6[m * 64 + j / 4] ||
                                Tq[m * 256 + j] == T6[m * 64 + j / 4]);
            }
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            size_t n = ns[ni];
            for (size_t i = 0; i < M * n; i++)
                codes[i] = (uint8_t)urand(&s);
            transpose(codes, M, n, blk);
            float term[TSR__FBLOCK], lb0[TSR__FBLOCK], lb6[TSR__FBLOCK], lb8[TSR__FBLOCK];
            for (size_t i = 0; i < n; i++)
                term[i] = frand(&s) * 3.0f;
            const float *tp = (M + ni) % 2 ? term : NULL;
            float base = frand(&s) * 8.0f, qmin = -3.5f, delta = 0.02f;
            tsr__filter4_scalar(Tg, M, blk, n, tp, base, qmin, delta, INFINITY, lb0);
            tsr__filter8_scalar(Tq, M, blk, n, tp, base, qmin, delta, INFINITY, lb8);
            tsr__filter6_scalar(T6, M, blk, n, tp, base, qmin, delta, INFINITY, lb6);
            for (size_t i = 0; i < n; i++) /* groups of 16 <= groups of 4 <= 8 bits */
                assert_true(lb0[i] <= lb6[i] && lb6[i] <= lb8[i]);
            const kblock kb = {M, blk, n, tp, base, qmin, delta};
            if (avx2)
                same_as_scalar("nibble avx2", tsr__filter4_scalar, tsr__filter4_avx2, Tg, &kb);
            if (vbmi)
                same_as_scalar("6-bit vbmi", tsr__filter6_scalar, tsr__filter6_avx512, T6, &kb);
        }
    }
    if (!avx2)
        fprintf(stderr, "(no AVX2 here: the AVX2 nibble kernel was not compared)\n");
    if (!vbmi)
        fprintf(stderr, "(no AVX-512 VBMI here: the 6-bit kernel was not compared)\n");
    free(Tv);
    free(T6);
    free(codes);
    free(blk);
    free(Tg);
    free(Tq);
}

/* The group table from the rows' ends (tsr__group_table_sorted): for a table in rank order
 * whose rows are one product each (s x_m times centroids sorted by value: rising rows,
 * falling rows, constant rows, ties, -0 and +0, every row constant), the same Tg bytes and
 * the same qmin, delta and tabs bits as tsr__quantize_table then tsr__group_table, for
 * both group sizes and the VBMI kernel's AVX-512 step; 0 when a row's end is NaN or
 * infinite. Made to fail by taking every group's first entry (falling rows), by rounding
 * instead of truncating, and by a wrong permutation in the AVX-512 step. */
static void test_group_sorted(void **st)
{
    (void)st;
    unsigned s = 11;
    float *T = aligned_alloc(64, 256 * 256 * sizeof(float)), c[256];
    uint8_t *Tq = aligned_alloc(64, 256 * 256), *G1 = aligned_alloc(64, 256 * 64);
    uint8_t *G2 = aligned_alloc(64, 256 * 64);
    const tsr__filter8_fn fns[3] = {tsr__filter4_scalar, tsr__filter6_scalar,
                                    tsr__filter6_avx512}; /* the last: its AVX-512 step */
    const int nf = tsr__filter8_avx512_supported() ? 3 : 2;
    for (int round = 0; round < 24; round++) {
        size_t M = round % 4 == 0 ? 1 : round % 4 == 1 ? 7 : round % 4 == 2 ? 64 : 256;
        float scale = round % 2 ? -1.0f : -2.0f;
        for (size_t m = 0; m < M; m++) {
            for (size_t j = 0; j < 256; j++) /* ties, and both zeros, now and then */
                c[j] = j % 17 == 3 ? 0.25f : j % 29 == 0 ? -0.0f : j % 31 == 0 ? 0.0f
                                                               : frand(&s) * 6.0f;
            for (size_t i = 1; i < 256; i++) /* sorted by value (insertion sort) */
                for (size_t j = i; j > 0 && c[j - 1] > c[j]; j--) {
                    float t = c[j];
                    c[j] = c[j - 1];
                    c[j - 1] = t;
                }
            float x = round >= 20 ? 0.0f : m % 9 == 4 ? 0.0f : frand(&s) * 4.0f;
            for (size_t j = 0; j < 256; j++)
                T[m * 256 + j] = (scale * x) * c[j];
        }
        for (int f = 0; f < nf; f++) {
            float q1, d1, t1, q2 = 1, d2 = 2, t2 = 3;
            size_t row = f ? 64 : 16;
            int r1 = tsr__quantize_table(T, M, Tq, &q1, &d1, &t1);
            tsr__group_table(fns[f], Tq, M, G1);
            int r2 = tsr__group_table_sorted(fns[f], T, M, G2, &q2, &d2, &t2);
            assert_int_equal(r1, 1);
            assert_int_equal(r2, 1);
            assert_memory_equal(G1, G2, M * row);
            assert_memory_equal(&q1, &q2, sizeof q1);
            assert_memory_equal(&d1, &d2, sizeof d1);
            assert_memory_equal(&t1, &t2, sizeof t1);
        }
    }
    float q, d, t;
    T[3 * 256 + 255] = NAN; /* a row's end not finite: no group table */
    assert_int_equal(tsr__group_table_sorted(fns[1], T, 64, G2, &q, &d, &t), 0);
    T[3 * 256 + 255] = 1.0f;
    T[5 * 256] = -INFINITY;
    assert_int_equal(tsr__group_table_sorted(fns[0], T, 64, G2, &q, &d, &t), 0);
    free(G2);
    free(G1);
    free(Tq);
    free(T);
}

/* The ranks: a permutation per sub-quantizer that sorts its centroids by value (ties and
 * NaN in a fixed order); none unless dsub = 1 and 8 bits. */
static void test_nibble_ranks(void **st)
{
    (void)st;
    enum { M = 3 };
    float cent[M * 256];
    unsigned s = 3;
    for (size_t i = 0; i < M * 256; i++)
        cent[i] = i % 256 == 5 ? NAN : i % 256 < 20 ? 1.0f : frand(&s);
    tsr_pq pq;
    memset(&pq, 0, sizeof pq);
    pq.d = M;
    pq.M = M;
    pq.nbits = 8;
    pq.dsub = 1;
    pq.ksub = 256;
    pq.centroids = cent;
    uint8_t rank[M * 256];
    assert_int_equal(tsr__nibble_ranks(&pq, rank), 1);
    for (size_t m = 0; m < M; m++) {
        int seen[256] = {0};
        float by_rank[256];
        for (size_t j = 0; j < 256; j++) {
            assert_int_equal(seen[rank[m * 256 + j]]++, 0);
            by_rank[rank[m * 256 + j]] = cent[m * 256 + j];
        }
        for (size_t r = 1; r < 255; r++) /* the NaN last */
            assert_true(by_rank[r - 1] <= by_rank[r]);
        assert_true(isnan(by_rank[255]));
    }
    pq.dsub = 2;
    assert_int_equal(tsr__nibble_ranks(&pq, rank), 0);
}

/* The run-time choice: AVX2 where the CPU has AVX2 but not VBMI, or when TSR_SIMD=avx2 /
 * opts asks for it; none for a forced scalar path or TSR_SEARCH_FILTER=0; the scalar
 * kernel with TSR_SEARCH_FILTER=scalar. */
static void test_filter_choose(void **st)
{
    (void)st;
    unsetenv("TSR_SIMD");
    unsetenv("TSR_SEARCH_FILTER");
    int v = tsr__filter8_avx512_supported(), a = tsr__filter8_avx2_supported();
    tsr__filter8_fn best = v ? tsr__filter8_avx512 : a ? tsr__filter8_avx2 : NULL;
    tsr__filter8_fn avx2 = a ? tsr__filter8_avx2 : NULL;
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == best);
    assert_true(tsr__filter8_choose(TSR_SIMD_AVX512) == best);
    assert_true(tsr__filter8_choose(TSR_SIMD_AVX2) == avx2);
    assert_true(tsr__filter8_choose(TSR_SIMD_SCALAR) == NULL);
    if (a && !v)
        assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == tsr__filter8_avx2);
    setenv("TSR_SIMD", "avx2", 1);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == avx2);
    setenv("TSR_SIMD", "scalar", 1);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == NULL);
    assert_true(tsr__filter8_choose(TSR_SIMD_AVX2) == avx2); /* the caller's choice wins */
    setenv("TSR_SIMD", "avx512", 1);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == best);
    unsetenv("TSR_SIMD");
    setenv("TSR_SEARCH_FILTER", "0", 1);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == NULL);
    assert_true(tsr__filter8_choose(TSR_SIMD_AVX2) == NULL);
    setenv("TSR_SEARCH_FILTER", "scalar", 1);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == tsr__filter8_scalar);
    assert_true(tsr__filter8_choose(TSR_SIMD_SCALAR) == tsr__filter8_scalar);
    unsetenv("TSR_SEARCH_FILTER");
    /* TSR_SIMD_MAX: the process as on a CPU without AVX-512 (the AVX2 kernel wherever the
     * VBMI one would run, no AVX-512 scan, table or coarse step) or without any SIMD (no
     * prefilter: the plain scalar scan); an unknown value is the scalar cap. */
    setenv("TSR_SIMD_MAX", "avx2", 1);
    assert_false(tsr__filter8_avx512_supported());
    assert_false(tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX512));
    assert_int_equal(tsr__filter8_avx2_supported(), a);
    assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == avx2);
    assert_true(tsr__filter8_choose(TSR_SIMD_AVX512) == avx2);
    assert_true(tsr_ivfpq_search_simd_auto() != TSR_SIMD_AVX512);
    const char *none[] = {"scalar", "sse", "AVX2"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        setenv("TSR_SIMD_MAX", none[i], 1);
        assert_false(tsr__filter8_avx2_supported());
        assert_false(tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX2));
        assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == NULL);
        assert_true(tsr_ivfpq_search_simd_auto() == TSR_SIMD_SCALAR);
        setenv("TSR_SIMD", "avx512", 1); /* forcing a path the cap removed: the automatic one */
        assert_true(tsr_ivfpq_search_simd_auto() == TSR_SIMD_SCALAR);
        unsetenv("TSR_SIMD");
    }
    const char *uncapped[] = {"avx512", ""};
    for (size_t i = 0; i < 2; i++) {
        setenv("TSR_SIMD_MAX", uncapped[i], 1);
        assert_true(tsr__filter8_choose(TSR_SIMD_AUTO) == best);
    }
    unsetenv("TSR_SIMD_MAX");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_bound),
        cmocka_unit_test(test_quantize_special),
        cmocka_unit_test(test_quantize_avx512),
        cmocka_unit_test(test_filter_kernels),
        cmocka_unit_test(test_filter_nan),
        cmocka_unit_test(test_filter_avx2_all_m),
        cmocka_unit_test(test_filter_choose),
        cmocka_unit_test(test_nibble_kernels),
        cmocka_unit_test(test_nibble_ranks),
        cmocka_unit_test(test_group_sorted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
