/*
 * ivfpq_nibble — the prefilter's group stage for one dimension per sub-quantizer (dsub = 1,
 * 8-bit codes): the centroid ranks the search cache and the scan blocks store instead of
 * the code bytes, the per-query group tables (16 groups of 16 ranks: the nibble kernels;
 * 64 groups of 4: the 6-bit ones; from the quantized table, or straight from the float
 * table's row ends when its rows are linear in the value), and the scalar kernels (the
 * references of the AVX2 nibble kernel in ivfpq_search_avx2.c and the VBMI 6-bit one in
 * ivfpq_search_avx512.c).
 * Contract in ivfpq_search_int.h ("the nibble stage").
 *
 * Why it is tight: with dsub = 1 a sub-quantizer's 256 centroids are numbers; sorted, 16
 * consecutive ranks are an interval of values, and the per-query table is linear in the
 * value (L2 by_residual and IP: -2 x c and -x c) or a parabola ((x - c)^2), so its minimum
 * over the interval is close to every entry. On the bench data (1M x 64, PQ64, nprobe 64)
 * the group bound of 3.5 % of the codes is within the 10th distance, against 100 % with
 * groups of raw code numbers (docs/performance.md, "The nibble stage").
 *
 * Thread-safety: pure functions.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "index/ivfpq_search_int.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct rank_ent {
    float v;
    uint32_t j;
} rank_ent;

/* Total order: by value, NaN after every number, then by centroid number (any order gives
 * a valid bound; this one is deterministic). */
static int rank_cmp(const void *a, const void *b)
{
    const rank_ent *x = a, *y = b;
    int xn = x->v != x->v, yn = y->v != y->v;
    if (xn != yn)
        return xn - yn;
    if (!xn && x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

int tsr__nibble_ranks(const tsr_pq *pq, uint8_t *rank)
{
    if (pq->dsub != 1 || pq->nbits != 8 || pq->ksub != 256)
        return 0;
    rank_ent e[256];
    for (size_t m = 0; m < pq->M; m++) {
        for (uint32_t j = 0; j < 256; j++)
            e[j] = (rank_ent){pq->centroids[m * 256 + j], j};
        qsort(e, 256, sizeof *e, rank_cmp);
        for (uint32_t r = 0; r < 256; r++)
            rank[m * 256 + e[r].j] = (uint8_t)r;
    }
    return 1;
}

/* The group tables: the minimum of each group of g consecutive bytes of every 256-byte
 * row of Tq (g = 16: M x 16 bytes; g = 4: M x 64). Per query at M = 64 the plain loops
 * took ~1.2 us (groups of 16) and ~4.5 us (groups of 4: 13 % of a shard's CPU under
 * batches of queries). Groups of 16 with SSE2 (every x86-64): the 16 groups of a row in
 * 16 registers folded pairwise by unpack and min; after four rounds byte i of the one
 * register left is the minimum of group i. Groups of 4 for the VBMI kernel:
 * tsr__group6_avx512. test_nibble_kernels checks every entry against Tq. */
#if defined(__SSE2__)
#define FOLD(w)                                                                            \
    static __m128i fold##w(__m128i a, __m128i b)                                           \
    {                                                                                      \
        return _mm_min_epu8(_mm_unpacklo_epi##w(a, b), _mm_unpackhi_epi##w(a, b));         \
    }
FOLD(8)
FOLD(16)
FOLD(32)
FOLD(64)
#undef FOLD

static __m128i load16(const uint8_t *r)
{
    return _mm_loadu_si128((const __m128i *)(const void *)r);
}

/* Groups 0..7 of 16 bytes at r folded into one register: byte g and g + 8 are halves of
 * group g's minimum. */
static __m128i fold_8_groups(const uint8_t *r)
{
    __m128i a = fold8(load16(r), load16(r + 16)), b = fold8(load16(r + 32), load16(r + 48));
    __m128i c = fold8(load16(r + 64), load16(r + 80)), d = fold8(load16(r + 96), load16(r + 112));
    return fold32(fold16(a, b), fold16(c, d));
}
#endif

void tsr__nibble_table(const uint8_t *Tq, size_t M, uint8_t *Tg)
{
    for (size_t m = 0; m < M; m++) {
        const uint8_t *r = Tq + m * 256;
#if defined(__SSE2__)
        _mm_storeu_si128((__m128i *)(void *)(Tg + m * 16),
                         fold64(fold_8_groups(r), fold_8_groups(r + 128)));
#else
        for (size_t g = 0; g < 16; g++) {
            uint8_t mn = r[g * 16];
            for (size_t j = 1; j < 16; j++)
                mn = r[g * 16 + j] < mn ? r[g * 16 + j] : mn;
            Tg[m * 16 + g] = mn;
        }
#endif
    }
}

void tsr__group_table(tsr__filter8_fn fn, const uint8_t *Tq, size_t M, uint8_t *Tg)
{
    if (fn == tsr__filter6_avx512) {
        tsr__group6_avx512(Tq, M, Tg);
        return;
    }
    if (fn != tsr__filter6_scalar) {
        tsr__nibble_table(Tq, M, Tg);
        return;
    }
    for (size_t m = 0; m < M; m++) /* groups of 4 ranks: 64 minima per sub-quantizer */
        for (size_t g = 0; g < 64; g++) {
            const uint8_t *r = Tq + m * 256 + g * 4;
            uint8_t a = r[0] < r[1] ? r[0] : r[1], b = r[2] < r[3] ? r[2] : r[3];
            Tg[m * 64 + g] = a < b ? a : b;
        }
}

int tsr__rows_sorted(const tsr_ivfpq *ix)
{
    return ix->pq.dsub == 1 && (ix->metric == TSR_METRIC_IP || ix->by_residual);
}

/* Byte of v as tsr__quantize_table makes it: (v - mn) * inv, at most 255 (MINPS order:
 * a NaN gives 255), truncated. */
static uint8_t quantize_one(float v, float mn, float inv)
{
    float f = (v - mn) * inv;
    f = f < 255.0f ? f : 255.0f;
    return (uint8_t)(int32_t)f;
}

int tsr__group_table_sorted(tsr__filter8_fn fn, const float *T, size_t M, uint8_t *Tg,
                            float *qmin, float *delta, float *tabs)
{
    float mins[256], maxr = 0, qm = 0, ta = 0, dl, inv;
    const size_t g = fn == tsr__filter6_scalar || fn == tsr__filter6_avx512 ? 4 : 16;
    if (M > 256)
        return 0;
    for (size_t m = 0; m < M; m++) { /* a monotone row's extremes are its ends */
        float a = T[m * 256], b = T[m * 256 + 255];
        if (a != a || b != b ||
            !tsr__quantize_row(a < b ? a : b, a < b ? b : a, mins, m, &maxr, &ta, &qm))
            return 0;
    }
    tsr__quantize_scale(maxr, &dl, &inv);
    uint8_t at[256]; /* where each group's minimum is: its first entry, or its last */
    for (size_t m = 0; m < M; m++)
        at[m] = T[m * 256] <= T[m * 256 + 255] ? 0 : (uint8_t)(g - 1);
    if (fn == tsr__filter6_avx512) {
        tsr__group_sorted_avx512(T, M, mins, at, inv, Tg);
    } else {
        for (size_t m = 0; m < M; m++)
            for (size_t i = 0; i < 256 / g; i++)
                Tg[m * (256 / g) + i] = quantize_one(T[m * 256 + i * g + at[m]], mins[m], inv);
    }
    *qmin = qm;
    *delta = dl;
    *tabs = ta;
    return qm > -INFINITY && qm < INFINITY && ta < INFINITY;
}

/* The scalar group kernels: row entries per sub-quantizer, the rank shifted by shift. */
static uint64_t group_scalar(const uint8_t *Tg, size_t row, unsigned shift, size_t M,
                             const uint8_t *blk, size_t n, const float *term, float base,
                             float qmin, float delta, float lim, float *lb)
{
    uint64_t mask = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t q = 0;
        for (size_t m = 0; m < M; m++)
            q += Tg[m * row + (blk[m * TSR__FBLOCK + i] >> shift)];
        if (tsr__bound_keep(base, term, i, qmin, delta, q, lim, lb))
            mask |= (uint64_t)1 << i;
    }
    return mask;
}

uint64_t tsr__filter6_scalar(const uint8_t *Tg, size_t M, const uint8_t *blk, size_t n,
                             const float *term, float base, float qmin, float delta,
                             float lim, float *lb)
{
    return group_scalar(Tg, 64, 2, M, blk, n, term, base, qmin, delta, lim, lb);
}

uint64_t tsr__filter4_scalar(const uint8_t *Tg, size_t M, const uint8_t *blk, size_t n,
                             const float *term, float base, float qmin, float delta,
                             float lim, float *lb)
{
    return group_scalar(Tg, 16, 4, M, blk, n, term, base, qmin, delta, lim, lb);
}

struct tsr__ranks {
    atomic_size_t refs;
    uint8_t *rank;   /* M x 256: rank[m * 256 + code] */
    uint8_t *unrank; /* M x 256: the code of a rank */
};

int tsr__ranks_new(const tsr_pq *pq, tsr__ranks **out)
{
    *out = NULL;
    if (pq->dsub != 1 || pq->nbits != 8 || pq->ksub != 256)
        return 0;
    tsr__ranks *r = calloc(1, sizeof *r);
    if (r == NULL)
        return TSR_ENOMEM;
    atomic_init(&r->refs, 1);
    if ((r->rank = malloc(pq->M * 256)) == NULL || (r->unrank = malloc(pq->M * 256)) == NULL) {
        tsr__ranks_unref(r);
        return TSR_ENOMEM;
    }
    tsr__nibble_ranks(pq, r->rank);
    for (size_t m = 0; m < pq->M; m++)
        for (size_t j = 0; j < 256; j++)
            r->unrank[m * 256 + r->rank[m * 256 + j]] = (uint8_t)j;
    *out = r;
    return 0;
}

tsr__ranks *tsr__ranks_ref(tsr__ranks *r)
{
    if (r != NULL)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

void tsr__ranks_unref(tsr__ranks *r)
{
    if (r == NULL || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    free(r->rank);
    free(r->unrank);
    free(r);
}

const uint8_t *tsr__ranks_rank(const tsr__ranks *r)
{
    return r->rank;
}

const uint8_t *tsr__ranks_unrank(const tsr__ranks *r)
{
    return r->unrank;
}
