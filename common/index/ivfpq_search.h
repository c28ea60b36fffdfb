/*
 * ivfpq_search — search of an in-memory IVFPQ index with the semantics of Faiss 1.7.3
 * IndexIVFPQ::search / search_preassigned (and IndexIVFPQR for IwQR files).
 *
 * Distances (x = query, c = the probed list's centroid, y = the PQ reconstruction):
 *   L2, by_residual:  ||x - c||^2 (the coarse distance)  +  (||y||^2 + 2<c, y>)  -  2<x, y>
 *   IP, by_residual:  <x, c> (the coarse distance)       +  <x, y>
 *   by_residual = 0:  plain ADC on x: sum_m ||x_m - c_m,j||^2 (L2) or <x_m, c_m,j> (IP)
 * The middle L2 term does not depend on the query; it is computed once per stored vector
 * and kept in ix->search_cache, so a query needs one M x 2^nbits table that does not
 * depend on the list (Faiss's precomputed table type 1 rebuilds a table per probed list;
 * both give the same value up to float rounding, which only reorders exact near-ties).
 *
 * Results are sorted best first (L2 ascending, IP descending), ties broken by the smaller
 * label; missing results are label -1 with distance +inf (L2) / -inf (IP), as Faiss.
 *
 * IwQR (ix->is_refine): k_factor * k candidates from the PQ scan are re-ranked by
 * ||x - c - y - r||^2 with r the refine-PQ reconstruction of the label's refine code,
 * exactly as Faiss's IndexIVFPQR::search_preassigned.
 *
 * A/B knobs of test builds only (core/testing.h; results never change, only speed; an
 * operator caps the level with TSR_SIMD_MAX instead): TSR_SIMD=scalar|avx2|avx512 forces a
 * scan kernel (scalar: the plain scalar scan, no prefilter; avx2: the AVX2 scan and the
 * AVX2 prefilter kernel, as on a CPU without AVX-512 VBMI), TSR_SEARCH_FILTER=0|scalar
 * turns the quantized prefilter off or forces its scalar kernel (read when the cache is
 * built and at each search).
 *
 * Thread safety: concurrent searches on one index are safe. The search cache is built on
 * first use (under a lock) from the lists as they are then; an index must not be modified
 * while searched, and after modifying lists call tsr_ivfpq_search_invalidate (a scan
 * that finds a list whose size differs from the cache fails with TSR_ESTATE).
 */
#ifndef TSR_IVFPQ_SEARCH_H
#define TSR_IVFPQ_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/ivfpq.h"

/* Which scan kernel to use. AUTO: the env var TSR_SIMD (scalar|avx2|avx512) if set,
 * else the fastest the CPU supports (measured once per process). */
enum tsr_simd { TSR_SIMD_AUTO = 0, TSR_SIMD_SCALAR = 1, TSR_SIMD_AVX2 = 2, TSR_SIMD_AVX512 = 3 };

/* Filter: return nonzero to accept `label`. Called only for candidates whose distance
 * would put them into the current top-k (so rejected-by-distance codes cost nothing);
 * may be called from several threads at once when threads > 1. */
typedef int (*tsr_accept_fn)(void *ctx, int64_t label);

/* Search options. Initialize with tsr_ivfpq_search_opts_init; every field added later
 * defaults to "off" when zero, so zero-initialized structs stay valid. */
typedef struct tsr_ivfpq_search_opts {
    size_t nprobe;         /* lists to probe (search only); 0 = ix->nprobe; clamped to nlist */
    int threads;           /* worker threads for a batch; <= 1 = the calling thread only */
    tsr_accept_fn accept;  /* optional filter (NULL = accept all) */
    void *accept_ctx;      /* passed to accept for every query ... */
    void *const *accept_ctxs; /* ... unless this is non-NULL: accept_ctxs[i] for query i */
    size_t max_codes;      /* stop a query after scanning this many codes (whole lists,
                              as Faiss's max_codes); 0 = unlimited */
    float k_factor;        /* IwQR: candidates per result; 0 = the file's k_factor */
    int no_refine;         /* IwQR: nonzero = return the PQ scan results unrefined */
    enum tsr_simd simd;    /* scan kernel; TSR_SIMD_AUTO by default */
    const float *bounds;   /* optional, one per query (borrowed): query i returns only
                              results within bounds[i] (L2: distance <= b, IP: product >= b;
                              NaN = no bound), its other slots empty (-1) as for a short
                              list. A bound known beforehand (e.g. the k-th distance of a
                              first round over part of the lists) lets the scan skip what
                              cannot enter; with b at least as loose as the query's k-th
                              result the answer is the one without it. Not with an IwQR
                              refine (TSR_EINVAL): it bounds the PQ scan. */
} tsr_ivfpq_search_opts;

void tsr_ivfpq_search_opts_init(tsr_ivfpq_search_opts *o);

/* Searches n queries x (n*d floats, borrowed): the opts->nprobe nearest lists by the
 * coarse quantizer, then the scan. D (n*k floats) and I (n*k labels) are caller-allocated.
 * Returns 0 or a TSR_E* code with err set. */
int tsr_ivfpq_search(const tsr_ivfpq *ix, size_t n, const float *x, size_t k,
                     const tsr_ivfpq_search_opts *opts, float *D, int64_t *I,
                     tsr_error *err);

/* As Faiss's search_preassigned: lists (n*nprobe list numbers, -1 = no list, skipped) and
 * coarse_dis (n*nprobe coarse distances: ||x - c||^2 for L2, <x, c> for IP; only used
 * when by_residual) are given by the caller (borrowed). opts->nprobe is ignored.
 * A list number >= nlist is TSR_EINVAL. */
int tsr_ivfpq_search_preassigned(const tsr_ivfpq *ix, size_t n, const float *x, size_t k,
                                 size_t nprobe, const int64_t *lists,
                                 const float *coarse_dis, const tsr_ivfpq_search_opts *opts,
                                 float *D, int64_t *I, tsr_error *err);

/* Builds the search cache now (otherwise the first search does it). Idempotent. */
int tsr_ivfpq_search_prepare(tsr_ivfpq *ix, tsr_error *err);

/* Drops the search cache (after lists changed); the next search rebuilds it. Not safe
 * while other threads search the index. */
void tsr_ivfpq_search_invalidate(tsr_ivfpq *ix);

/* ---- scanning lists held outside the index ------------------------------------------
 * The pieces of search_preassigned for a caller that keeps its own inverted lists (the
 * shard's copy-on-write version snapshots) and its own collector (filters, crowding,
 * re-rank). Scores are "smaller is better": the L2 distance, or minus the inner product,
 * computed exactly as tsr_ivfpq_search computes them (same kernels, same rounding). */

typedef struct tsr_ivfpq_scanner tsr_ivfpq_scanner;

/* Returns a new scanner over ix (borrowed: must outlive the scanner; only its quantizers
 * are used, not its lists), or NULL with err set. One scanner per thread. */
tsr_ivfpq_scanner *tsr_ivfpq_scanner_create(const tsr_ivfpq *ix, enum tsr_simd simd,
                                            tsr_error *err);
void tsr_ivfpq_scanner_destroy(tsr_ivfpq_scanner *s); /* accepts NULL */

/* Sets the query (d floats, copied: the tables are built from the copy when a scan first
 * needs them, one per code layout in use). */
void tsr_ivfpq_scanner_set_query(tsr_ivfpq_scanner *s, const float *x);

/* The score offset of a list from its coarse distance (||x - c||^2 for L2, <x, c> for IP;
 * ignored without by_residual). */
float tsr_ivfpq_scanner_base(const tsr_ivfpq_scanner *s, float coarse_dis);

/* Called for each code whose score is <= the current threshold, with its position i in
 * the list; returns the new threshold (a collector's worst kept score, +inf while it is
 * not full). */
typedef float (*tsr_ivfpq_sink_fn)(void *ctx, size_t i, float score);

/* Scans n codes (n * code_size bytes) of one list: score_i = base + term[i] +
 * sum_m T[m][code_m]; term is the list's tsr_ivfpq_list_terms (NULL when
 * tsr_ivfpq_has_terms is 0). thr is the initial threshold; returns the final one. */
float tsr_ivfpq_scanner_scan(tsr_ivfpq_scanner *s, const uint8_t *codes, size_t n,
                             const float *term, float base, float thr,
                             tsr_ivfpq_sink_fn sink, void *ctx);

/* ---- the quantized prefilter for a list held by the caller ---------------------------
 * What `tessera index search` scans with from nprobe 2 on (docs/performance.md, Search):
 * the list's codes transposed by blocks of 64 (and their terms), a per-query table
 * quantized to bytes, and a lower bound of 64 scores at a time; only codes whose bound is
 * within a rounding margin of the threshold get the exact score. A code it skips has a
 * score above the threshold at that point, so, as long as the sink's threshold never
 * increases (a collector's worst kept score), the sink sees the same (i, score) calls in
 * the same order, with the same bits, as tsr_ivfpq_scanner_scan. */

typedef struct tsr_ivfpq_flist tsr_ivfpq_flist;

/* Builds the prefilter data of one list of n codes (n * code_size bytes) and their terms
 * (NULL when tsr_ivfpq_has_terms is 0), all copied: M * 64 + 256 bytes per block of 64
 * codes. It holds everything a scan reads, so a caller may keep it as the list's only copy
 * of the codes and terms (tsr_ivfpq_scanner_scan_flist, tsr_ivfpq_flist_codes). *out is set
 * to NULL (and 0 returned) for codes of other than 8 bits, M > 256 or n == 0; it is built
 * whichever kernel runs (the prefilter itself needs AVX-512 VBMI, AVX2 or
 * TSR_SEARCH_FILTER=scalar, and is off with TSR_SEARCH_FILTER=0 or TSR_SIMD=scalar).
 * Returns 0 or TSR_ENOMEM. */
int tsr_ivfpq_flist_build(const tsr_ivfpq *ix, const uint8_t *codes, size_t n,
                          const float *term, tsr_ivfpq_flist **out, tsr_error *err);
void tsr_ivfpq_flist_free(tsr_ivfpq_flist *f); /* accepts NULL */
size_t tsr_ivfpq_flist_bytes(const tsr_ivfpq_flist *f); /* heap bytes; 0 for NULL */
size_t tsr_ivfpq_flist_size(const tsr_ivfpq_flist *f);  /* codes held; 0 for NULL */

/* Codes i0 .. i0+n-1 of f back in Faiss order (n * code_size bytes into codes, unless
 * NULL) and their terms (n floats into term, unless NULL or f was built without terms):
 * byte for byte what tsr_ivfpq_flist_build was given. i0 + n <= tsr_ivfpq_flist_size. */
void tsr_ivfpq_flist_codes(const tsr_ivfpq_flist *f, size_t i0, size_t n, uint8_t *codes,
                           float *term);

/* As tsr_ivfpq_scanner_scan on the codes and terms fl was built from (sink positions are
 * positions in the list), reading only fl: with the prefilter when prefilter is nonzero
 * and the scanner has a filter kernel (pass 0 when one list is probed: see
 * tsr_ivfpq_scanner_scan_filtered), else the plain kernel on each block put back in Faiss
 * order. Either way the sink sees the same (i, score) calls, with the same bits, as
 * tsr_ivfpq_scanner_scan; its threshold must not increase. fl NULL = an empty list. */
float tsr_ivfpq_scanner_scan_flist(tsr_ivfpq_scanner *s, const tsr_ivfpq_flist *fl,
                                   int prefilter, float base, float thr, tsr_ivfpq_sink_fn sink,
                                   void *ctx);

/* As tsr_ivfpq_scanner_scan, with the prefilter when fl (built from exactly these codes
 * and terms) is non-NULL and the scanner has a filter kernel; otherwise the plain scan.
 * The sink contract is the same; its threshold must not increase. The quantized table is
 * made on the first filtered list of a query (~1 us), so pass fl = NULL when one list is
 * probed. */
float tsr_ivfpq_scanner_scan_filtered(tsr_ivfpq_scanner *s, const uint8_t *codes, size_t n,
                                      const float *term, const tsr_ivfpq_flist *fl,
                                      float base, float thr, tsr_ivfpq_sink_fn sink,
                                      void *ctx);

/* 1 when scores need a per-vector term (L2 with by_residual), else 0. */
int tsr_ivfpq_has_terms(const tsr_ivfpq *ix);

/* term[i] = ||y_i||^2 + 2<c_list, y_i> for n codes of list `list` (y_i the PQ
 * reconstruction; only when tsr_ivfpq_has_terms). Returns 0 or TSR_ENOMEM/TSR_EINVAL. */
int tsr_ivfpq_list_terms(const tsr_ivfpq *ix, size_t list, const uint8_t *codes, size_t n,
                         float *term, tsr_error *err);

/* The same in two steps, for a caller that adds codes to a list a few at a time (the
 * shard's streamed delta) and keeps the table: P (ix->pq.M * ix->pq.ksub floats, caller
 * allocated) gets list's table; tsr_ivfpq_terms_from_table then gives exactly the terms
 * tsr_ivfpq_list_terms gives. TSR_EINVAL as tsr_ivfpq_list_terms. */
int tsr_ivfpq_list_table(const tsr_ivfpq *ix, size_t list, float *P, tsr_error *err);
void tsr_ivfpq_terms_from_table(const tsr_ivfpq *ix, const float *P, const uint8_t *codes,
                                size_t n, float *term);

/* The kernel AUTO resolves to, and whether a given one can run on this CPU. */
enum tsr_simd tsr_ivfpq_search_simd_auto(void);
int tsr_ivfpq_search_simd_supported(enum tsr_simd s);
const char *tsr_ivfpq_search_simd_name(enum tsr_simd s);

#endif
