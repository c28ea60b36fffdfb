/*
 * ivfpq_search_int — internals of the IVFPQ search shared inside index/: the scan and
 * prefilter kernels and the cache hook of ivfpq.c. Not a public API (files outside
 * common/index/ use ivfpq_search.h; white-box unit tests may include this).
 *
 * Who defines what (no file calls back into one that calls it):
 *   ivfpq_search_scalar.c   the scalar reference kernels (always built, no SIMD flags)
 *   ivfpq_search_avx2.c     tsr__scan8_avx2 (AVX2 flags; its tail is the scalar kernel),
 *                           tsr__filter8_avx2 and its table layout (VPSHUFB)
 *   ivfpq_search_avx512.c   tsr__scan8_avx512, tsr__filter8_avx512, tsr__table_avx512,
 *                           tsr__quantize_table_avx512
 *                           (AVX-512 flags; its tail is the scalar kernel)
 *   ivfpq_nibble.c          the nibble stage's ranks, group table and scalar kernel
 *   ivfpq_dispatch.c        the run-time choice of a kernel (and its env knobs)
 *   ivfpq_cache.c           the search cache (terms, transposed centroids, scan blocks)
 *   ivfpq_scanner.c         the scanner: per-query tables, the one scan loop
 *                           (tsr__scan_list), the scan blocks of lists held by the caller
 *   ivfpq_search.c          tsr_ivfpq_search: the coarse step, then per query a loop over
 *                           the probed lists with the scanner into a heap; IwQR; threads
 * A search reads: ivfpq_search.c -> ivfpq_scanner.c -> the kernels; the scanner's setup
 * asks ivfpq_dispatch.c (which kernel) and ivfpq_cache.c (the cache) once per scanner.
 * Every kernel of one kind returns bit-identical results: the SIMD forms follow the
 * summation order of the scalar form (see tsr__scan8_scalar), so the choice of kernel
 * changes speed only.
 */
#ifndef TSR_IVFPQ_SEARCH_INT_H
#define TSR_IVFPQ_SEARCH_INT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "index/ivfpq.h"
#include "index/ivfpq_search.h"
#include "index/pq.h"

/* Called by tsr_ivfpq_destroy (weak symbol in ivfpq.c). */
void tsr__ivfpq_search_cache_free(tsr_ivfpq *ix);

/* Codes ahead that the scalar kernel prefetches (one 64-byte line per code at M = 64;
 * ~100 ns of memory latency at ~10 ns per code). */
#define TSR__SCAN_PREFETCH 12

/* ---- 8-bit scan kernels ------------------------------------------------------------
 * out[i] = base + (term ? term[i] : 0) + sum_m T[m * 256 + codes[i * M + m]], i < n.
 * Every kernel is declared with the one signature (its definition spells it out). */
typedef void tsr__scan8_kernel(const float *T, size_t M, const uint8_t *codes, size_t n,
                               const float *term, float base, float *out);
typedef tsr__scan8_kernel *tsr__scan8_fn;
tsr__scan8_kernel tsr__scan8_scalar, tsr__scan8_avx2, tsr__scan8_avx512;

/* Any nbits (sub-codes unpacked with the Faiss bit order; T is M x ksub):
 * out[i] = base + (term ? term[i] : 0) + sum_m T[m * ksub + code_m], i < n. */
void tsr__scan_generic(const float *T, const tsr_pq *pq, const uint8_t *codes, size_t n,
                       const float *term, float base, float *out);

/* ---- the quantized prefilter ---------------------------------------------------------
 * Codes of a list are kept in the search cache transposed by blocks of TSR__FBLOCK:
 * byte m of code i of a block at blk[m * TSR__FBLOCK + i]. Tq (M x 256 bytes) is the
 * per-query table quantized down (Tq[m][j] * delta + qmin_m <= T[m][j]), so
 *   lb_i = (base + term_i) + (qmin + delta * (float)Q_i),  Q_i = sum_m Tq[m][code_i[m]]
 * (qmin = sum_m qmin_m) is a lower bound of the distance up to float rounding. Returns the
 * mask of codes i < n (n <= TSR__FBLOCK) with !(lb_i > lim); lb (NULL or n floats) gets
 * the bounds. Both kernels return bit-identical masks and bounds. */
#define TSR__FBLOCK 64
typedef uint64_t tsr__filter_kernel(const uint8_t *Tq, size_t M, const uint8_t *blk, size_t n,
                                    const float *term, float base, float qmin, float delta,
                                    float lim, float *lb);
typedef tsr__filter_kernel *tsr__filter8_fn;
/* The scalar and the AVX-512 VBMI 8-bit kernels (all the filter kernels below, the group
 * kernels of the nibble stage included, are declared with this one signature). */
tsr__filter_kernel tsr__filter8_scalar, tsr__filter8_avx512;
/* 1 when the CPU runs tsr__filter8_avx512 (AVX-512 F, BW and VBMI). */
int tsr__filter8_avx512_supported(void);
/* The AVX2 form (VPSHUFB, ivfpq_search_avx2.c): the same masks and bounds, but it reads
 * the table in its own layout: Tp = Tq after tsr__filter8_prep_avx2(Tq, M) (in place,
 * once per query). */
tsr__filter_kernel tsr__filter8_avx2;
void tsr__filter8_prep_avx2(uint8_t *Tq, size_t M);
/* 1 when the CPU runs tsr__filter8_avx2 (AVX2). */
int tsr__filter8_avx2_supported(void);
/* ---- the nibble stage (ivfpq_nibble.c; dsub = 1, 8-bit codes) --------------------------
 * The search cache then stores each code byte as the rank of its centroid among the
 * sub-quantizer's 256 sorted by value (tsr__nibble_ranks; in the transposed blocks only:
 * the cache's copy and the scan blocks of lists held by the caller, whose
 * tsr_ivfpq_flist_codes maps them back), and a scan of those blocks builds its tables in
 * rank order (T and Tq entries bit-identical, only placed at the rank), so
 * tsr__filter8_exact gives the same distances. Tg (M x 16 bytes, tsr__nibble_table) is the
 * minimum of each group of 16 consecutive ranks of Tq, and
 *   lb4_i = (base + term_i) + (qmin + delta * (float)Q4_i),  Q4_i = sum_m Tg[m][rank_i[m] >> 4]
 * with Q4_i <= Q_i, and every step of the float formula is monotonic: lb4 <= lb, so a
 * code it drops the 8-bit kernels would have dropped too (the same margin covers it). The
 * kernels have tsr__filter8_fn's signature with Tg in place of Tq; the AVX2 one takes one
 * VPSHUFB per 32 codes and sub-quantizer (the 8-bit one 16). */
int tsr__nibble_ranks(const tsr_pq *pq, uint8_t *rank); /* M x 256; 0 = not dsub 1 / 8 bits */
/* The ranks as a shared, reference-counted object: the search cache holds one, and every
 * scan block list (tsr_ivfpq_flist) built from the index one more, so a list outlives a
 * cache that is rebuilt (the ranks are a function of the PQ centroids only). new: *out =
 * NULL (and 0) unless dsub = 1 and 8 bits; TSR_ENOMEM. unref accepts NULL. rank: M x 256
 * (rank[m * 256 + code]); unrank: the code of each rank. */
typedef struct tsr__ranks tsr__ranks;
int tsr__ranks_new(const tsr_pq *pq, tsr__ranks **out);
tsr__ranks *tsr__ranks_ref(tsr__ranks *r);
void tsr__ranks_unref(tsr__ranks *r);
const uint8_t *tsr__ranks_rank(const tsr__ranks *r);
const uint8_t *tsr__ranks_unrank(const tsr__ranks *r);
void tsr__nibble_table(const uint8_t *Tq, size_t M, uint8_t *Tg);
tsr__filter_kernel tsr__filter4_scalar, tsr__filter4_avx2;
/* The same with groups of 4 ranks (the top 6 bits: Tg is M x 64 bytes), for AVX-512 VBMI,
 * where one VPERMB looks 64 codes up in a 64-entry row (the 8-bit kernel: two VPERMT2B
 * and a blend over four table loads); a tighter bound than groups of 16. */
tsr__filter_kernel tsr__filter6_scalar, tsr__filter6_avx512;
/* The group table of group kernel fn (a filter4 or filter6 kernel) from Tq: M x 16 or
 * M x 64 bytes (callers size Tg M x 64). */
void tsr__group_table(tsr__filter8_fn fn, const uint8_t *Tq, size_t M, uint8_t *Tg);
/* The 6-bit (VBMI) kernel's group table with AVX-512BW (tsr__group_table calls it). */
void tsr__group6_avx512(const uint8_t *Tq, size_t M, uint8_t *Tg);
/* Whether ix's per-query table, in rank order, is monotone in every row: one dimension per
 * sub-quantizer and the one-product forms (IP, L2 by_residual: T[m][r] = s x_m c_m(r) with
 * the centroids sorted by value; a rounded product keeps the order). */
int tsr__rows_sorted(const tsr_ivfpq *ix);
/* For such a table T (rank order): group kernel fn's table Tg with the qmin, delta and tabs
 * that tsr__quantize_table followed by tsr__group_table give, the same bytes and bits,
 * without Tq: a row's min and max are its ends and, quantizing being monotone, a group's
 * minimum is the quantized entry at its low end (M = 64, groups of 4: 0.7 us against 2.6
 * for the two steps; a shard pays this once per query). Returns 0 (nothing usable: run
 * the generic path) when an end of a row is NaN or infinite, or the sums are not finite,
 * like tsr__quantize_table. */
int tsr__group_table_sorted(tsr__filter8_fn fn, const float *T, size_t M, uint8_t *Tg,
                            float *qmin, float *delta, float *tabs);
/* Its quantization step for groups of 4 with AVX-512F (fn = the VBMI kernel): row m's group
 * minima at offset at[m] of each group. */
void tsr__group_sorted_avx512(const float *T, size_t M, const float *mins, const uint8_t *at,
                              float inv, uint8_t *Tg);
/* The group kernel a search uses with the 8-bit kernel f8 (NULL = none): the AVX2 nibble
 * kernel with the AVX2 kernel, the 6-bit one with the VBMI kernel, unless
 * TSR_SEARCH_NIBBLE=0 (none), =scalar or =scalar6 (the scalar group kernels, with any f8:
 * tests). */
tsr__filter8_fn tsr__filter4_choose(tsr__filter8_fn f8);

/* The plain 8-bit scan kernel of a SIMD level (the scalar one for AUTO / SCALAR). */
tsr__scan8_fn tsr__scan8_for(enum tsr_simd s);
/* tsr__quantize_table (the AVX-512 form when wide), then the kernel fn's own layout of
 * the table (the AVX2 8-bit kernel reads slice differences). Returns what
 * tsr__quantize_table returns. */
int tsr__quantize_for(tsr__filter8_fn fn, int wide, const float *T, size_t M, uint8_t *Tq,
                      float *qmin, float *delta, float *tabs);
/* The scalar kernels' last step for code i of a block, from its table sum q: the bound
 * (into lb[i] unless lb is NULL) and 1 when the code is kept (!(bound > lim)). One
 * definition, so every scalar kernel forms the bound the same way. */
static inline int tsr__bound_keep(float base, const float *term, size_t i, float qmin,
                                  float delta, uint32_t q, float lim, float *lb)
{
    float l = (base + (term ? term[i] : 0.0f)) + (qmin + delta * (float)q);
    if (lb != NULL)
        lb[i] = l;
    return !(l > lim);
}

/* The filter kernel a search or scanner asked for `asked` uses (NULL = the plain scan), as
 * ivfpq_dispatch.c chooses it at run time: TSR_SEARCH_FILTER=0 none, =scalar the scalar
 * kernel; else none for a forced scalar path (asked or TSR_SIMD=scalar), the AVX2 kernel
 * for a forced AVX2 path or a CPU with AVX2 but not VBMI, the VBMI kernel otherwise. */
tsr__filter8_fn tsr__filter8_choose(enum tsr_simd asked);

/* sum_m T[m][code[m]] of code `lane` of a transposed block, in tsr__scan8_scalar's
 * order (accumulator m % 4, the sub-quantizers past the last multiple of 4 into the
 * first): the filter's survivors get exactly the plain kernels' distances. Inline: it
 * runs once per code that passes the filter. */
static inline float tsr__filter8_exact(const float *T, size_t M, const uint8_t *blk,
                                       size_t lane)
{
    const uint8_t *c = blk + lane;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t m = 0;
    for (; m + 4 <= M; m += 4) {
        a0 += T[(m + 0) * 256 + c[(m + 0) * TSR__FBLOCK]];
        a1 += T[(m + 1) * 256 + c[(m + 1) * TSR__FBLOCK]];
        a2 += T[(m + 2) * 256 + c[(m + 2) * TSR__FBLOCK]];
        a3 += T[(m + 3) * 256 + c[(m + 3) * TSR__FBLOCK]];
    }
    for (; m < M; m++)
        a0 += T[m * 256 + c[m * TSR__FBLOCK]];
    return (a0 + a1) + (a2 + a3);
}

/* Quantizes a per-query table T (M <= 256 rows of 256 floats) down to Tq for the filter:
 * Tq[m][j] = floor((T[m][j] - min_m) / delta) clamped to 255, one delta for all rows,
 * *qmin = sum_m min_m, *tabs = sum_m max_j |T[m][j]| (for the rounding margin). Returns
 * 0 when T has an infinity (no filter then), else 1. */
int tsr__quantize_table(const float *T, size_t M, uint8_t *Tq, float *qmin, float *delta,
                        float *tabs);

/* Both quantizers' shared arithmetic (the same operations, so the same bits): row m's
 * min and max into the running sums (0 when not finite: no filter), then the scale. */
static inline int tsr__quantize_row(float mn, float mx, float *mins, size_t m, float *maxr,
                                    float *ta, float *qm)
{
    if (!(mn > -INFINITY && mx < INFINITY))
        return 0;
    mins[m] = mn;
    *maxr = mx - mn > *maxr ? mx - mn : *maxr;
    *ta += fabsf(mn) > fabsf(mx) ? fabsf(mn) : fabsf(mx);
    *qm += mn;
    return 1;
}

static inline void tsr__quantize_scale(float maxr, float *dl, float *inv)
{
    *dl = maxr / 255.0f;
    *inv = *dl > 0 ? 1.0f / *dl : 0.0f;
    if (!(*dl >= FLT_MIN && *inv < INFINITY)) { /* all rows (nearly) constant: bound = qmin */
        *dl = 1.0f;
        *inv = 0.0f;
    }
}
/* The same with AVX-512F (the same bytes, qmin, delta and tabs for a finite table; a
 * table with a NaN among a row's first 64 entries returns 0): a shard quantizes once per
 * query per shard, ~14 % of the machine in a cluster profile of batches (Dec 6). */
int tsr__quantize_table_avx512(const float *T, size_t M, uint8_t *Tq, float *qmin,
                               float *delta, float *tabs);

/* ---- the per-query table ---------------------------------------------------------------
 * The table for IP and L2 by_residual (see tsr__build_table in ivfpq_scanner.c), bit-identical
 * to the generic code; ksub % 16 == 0, AVX-512F. */
void tsr__table_avx512(const float *ct, const float *x, size_t M, size_t dsub, size_t ksub,
                       float scale, float *T);

/* ---- what the search (ivfpq_search.c), the scanner (ivfpq_scanner.c), the search cache
 * (ivfpq_cache.c) and the kernel choice (ivfpq_dispatch.c) share ------------------------ */

/* TSR_SEARCH_FILTER: 0 = no prefilter ("0"), 1 = the scalar kernel ("scalar", tests),
 * 2 = the AVX-512 VBMI kernel where the CPU has it, 3 = else the AVX2 one, else 0. */
int tsr__filter_env(void);

/* sum_i a_i b_i in i order (the search's, and the cache's terms, summation order). */
static inline float tsr__dot(const float *a, const float *b, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* The search cache of an index (derived data, built once on first use under a lock and
 * published with an atomic pointer; read-only afterwards; freed with the index or by
 * tsr_ivfpq_search_invalidate): per stored vector ||y||^2 + 2<c, y> (L2 by_residual),
 * the transposed PQ centroids, the prefilter's transposed codes. */
typedef struct tsr__search_cache {
    size_t nlist;
    size_t *sizes;    /* list sizes the cache was built from */
    size_t *offsets;  /* start of each list in term[] */
    float *term;      /* ntotal floats; NULL when the variant needs no term */
    float *ct;        /* PQ centroids transposed to M x dsub x ksub (table building) */
    float tmax;       /* max |term| over all vectors (rounding margin; inf if any NaN) */
    /* The quantized prefilter (8-bit codes, M <= 256; see ivfpq_search_int.h): */
    uint8_t *tcodes;  /* NULL or a copy of the codes, transposed by blocks of TSR__FBLOCK
                         (zero-padded); list l's blocks at toffsets[l], M * TSR__FBLOCK
                         bytes each, 64-aligned */
    size_t *toffsets; /* nlist byte offsets into tcodes */
    tsr__ranks *rk;   /* NULL, or (dsub = 1, 8 bits) the centroid ranks: tcodes and the
                         scan blocks hold rank[m][code] instead of the code byte */
    float *ct_r;      /* with rk: ct with centroid j of sub-quantizer m at its rank */
    size_t tbytes;    /* size of tcodes */
    float *cnorms;    /* L2: ||c||^2 of the nlist coarse centroids (the coarse step's y
                         norms: recomputed per call they were ~310 us of a single query's
                         ~430 us at nprobe 16, 1M x 64, IVF4000); NULL for IP */
} tsr__search_cache;

/* The cache of ix (built on first use), or NULL with err set (out of memory). */
const tsr__search_cache *tsr__search_cache_get(const tsr_ivfpq *ix, tsr_error *err);
/* 0, or an error for an index the search cannot serve (not trained, k too large). */
int tsr__ivfpq_check_index(const tsr_ivfpq *ix, size_t k, tsr_error *err);
/* The per-query table T (M x ksub, "smaller is better") of query x from the transposed
 * centroids ct (the cache's ct, or ct_r for rank order); wide = the AVX-512 form (same
 * bits). */
void tsr__build_table(const tsr_ivfpq *ix, const float *ct, const float *x, float *T, int wide);
/* 1 when a search asked for `asked` may build the table with AVX-512. */
int tsr__wide_table_ok(enum tsr_simd asked);
/* Bytes of one prefilter block of M sub-quantizers (with the 64 terms when has_term), and
 * the transposition of n codes (their terms when term != NULL; code bytes mapped through
 * rank[m * 256 + byte] when rank != NULL) into blocks of bsz bytes, zeroed by the caller. */
size_t tsr__fblock_size(size_t M, int has_term);
void tsr__transpose_list(const uint8_t *codes, const float *term, size_t n, size_t M,
                         size_t bsz, const uint8_t *rank, uint8_t *dst);

#define TSR__SCAN_BLOCK 256 /* distances computed per kernel call */

/* A prefetch cursor that runs ahead of the prefilter through the search cache's blocks of
 * the probed lists, across list boundaries (a list is ~16 KB at M = 64: the hardware
 * prefetcher does not cross into the next one, and random 16 KB chunks read at about a
 * third of the sequential bandwidth). tsr__pf_run prefetches the next `bytes`. */
typedef struct tsr__pfcur {
    const tsr__search_cache *ca;
    const int64_t *lists;
    size_t np, p;          /* next probe to enter */
    const uint8_t *at;     /* next line to prefetch ... */
    size_t left;           /* ... and bytes left of the current list */
    size_t bsz;
} tsr__pfcur;
#ifndef TSR__PF_LEAD
#define TSR__PF_LEAD 16384 /* bytes the prefetch cursor runs ahead of the prefilter */
#endif
void tsr__pf_run(tsr__pfcur *c, size_t bytes);

/* The scanner over an index's own lists (tsr_ivfpq_search): list `list` of the scanner's
 * index as scan blocks, a view of the search cache's (valid until the next call; NULL when
 * the cache has no blocks: no prefilter kernel); and, for one query, the prefetch cursor
 * of its np probed lists (pf: the caller's, live until the next set_query; nothing when
 * the scanner has no prefilter). */
const tsr_ivfpq_flist *tsr__scanner_view(tsr_ivfpq_scanner *s, size_t list);
void tsr__scanner_prefetch(tsr_ivfpq_scanner *s, tsr__pfcur *pf, const int64_t *lists,
                           size_t np);

/* A sink gets the position and the score of a code that could enter, and returns the new
 * threshold (which never increases). */
typedef float (*tsr__sink_fn)(void *ctx, size_t i, float score);

/* The prefilter for one list: the kernel, the quantized table (or the nibble stage's
 * group table), the list's transposed blocks and their size, the table's offset and step,
 * the rounding margin and the prefetch cursor (NULL = none). */
typedef struct tsr__filt {
    tsr__filter8_fn fn;
    const uint8_t *Tq;
    const uint8_t *blocks;
    size_t bsz;
    float qmin, delta, margin;
    struct tsr__pfcur *pf;
} tsr__filt;

/* The scan of one list: without f, block distances by scan8 (dis: TSR__SCAN_BLOCK floats
 * of scratch) and the codes with score <= thr to the sink; with f, the prefilter's bound
 * per block and the exact sum (tsr__filter8_exact on f->blocks) only for the codes it
 * keeps. The same codes reach the sink with the same scores either way. Returns thr. */
float tsr__scan_list(const tsr_pq *pq, tsr__scan8_fn scan8, const float *T, float *dis,
                     const uint8_t *codes, size_t n, const float *term, float base,
                     const tsr__filt *f, float thr, tsr__sink_fn sink, void *ctx);

#endif
