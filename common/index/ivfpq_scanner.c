/*
 * ivfpq_scanner — the one scan of a query over inverted lists, as Faiss's
 * InvertedListScanner: a scanner per thread holds the query, its per-query tables (built
 * here, tsr__build_table, when a scan first needs them), the quantized table of the
 * prefilter, and scans one list at a time into the caller's sink (tsr__scan_list, the one
 * scan loop). Two callers loop over it: the shard (shard/scan.c, over a version's lists,
 * whose scan blocks tsr_ivfpq_flist are a list's only copy of its codes and terms) and
 * tsr_ivfpq_search (ivfpq_search.c, over an index's lists, whose scan blocks are views of
 * the search cache's: tsr__scanner_view). So a list scanned by either gives the same bits.
 * The kernels are chosen in ivfpq_dispatch.c, the cache is ivfpq_cache.c's. Semantics in
 * ivfpq_search.h.
 *
 * Thread-safety: a scanner belongs to one thread; a flist is immutable once built and may
 * be scanned by any number of scanners at once.
 */
#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

/* The scan blocks of a list (see ivfpq_search.h, tsr_ivfpq_flist_build): a caller's own,
 * or a view of the search cache's (tsr__scanner_view: bytes 0, the ranks not referenced). */
struct tsr_ivfpq_flist {
    size_t n, M, bsz, bytes;
    tsr__ranks *rk;  /* a reference to the ranks the blocks hold instead of code bytes
                        (dsub = 1: the index's, so every block list of one quantizer has
                        them or none has), or NULL */
    int has_term;
    float tmax;      /* max |term| of the list (rounding margin; inf if any NaN) */
    uint8_t *blocks; /* transposed by blocks of TSR__FBLOCK, 64-aligned, zero-padded */
};

/* ---- the scanner --------------------------------------------------------------------- */

/* The tables of a query are built when a scan first needs them: T for codes in Faiss
 * order, Tr (rank order) for scan blocks that hold ranks (dsub = 1: every block list of
 * the index), so a shard whose lists are all blocks builds one table per query. */
struct tsr_ivfpq_scanner {
    const tsr_ivfpq *ix;
    const tsr__search_cache *cache; /* for the transposed PQ centroids */
    tsr__scan8_fn scan8;
    int wide_table;
    float *x;   /* the query (d floats, copied by set_query) */
    float *T;   /* M * ksub */
    float *Tr;  /* M * 256 when the cache has ranks, else NULL */
    int have_T, have_Tr;
    float *dis; /* TSR__SCAN_BLOCK */
    tsr__filter8_fn filter;  /* the prefilter kernel, NULL = none (tsr__filter8_choose) */
    tsr__filter8_fn filter4; /* with ranks: the group kernel instead, or NULL */
    uint8_t *Tq;             /* M * 256 when filter: the block lists' table quantized */
    uint8_t *Tg;             /* M * 64 when filter4: Tq's group minima */
    int sorted;              /* filter4 and rows monotone in rank order (tsr__rows_sorted) */
    int tq_state;            /* for this query: 0 not yet, 1 Tq (and Tg), 2 only Tg, -1 none */
    float qmin, delta, tabs;
    struct tsr__pfcur *pf;   /* the prefetch cursor of the filtered scans, or NULL */
    struct tsr_ivfpq_flist *view; /* tsr__scanner_view's (search cache) list */
};

static const float *table_T(tsr_ivfpq_scanner *s)
{
    if (!s->have_T) {
        tsr__build_table(s->ix, s->cache->ct, s->x, s->T, s->wide_table);
        s->have_T = 1;
    }
    return s->T;
}

/* The table of the block lists: in rank order when the index has ranks. */
static const float *table_blocks(tsr_ivfpq_scanner *s)
{
    if (s->Tr == NULL)
        return table_T(s);
    if (!s->have_Tr) {
        tsr__build_table(s->ix, s->cache->ct_r, s->x, s->Tr, s->wide_table);
        s->have_Tr = 1;
    }
    return s->Tr;
}

tsr_ivfpq_scanner *tsr_ivfpq_scanner_create(const tsr_ivfpq *ix, enum tsr_simd simd,
                                            tsr_error *err)
{
    const enum tsr_simd simd0 = simd;
    if (tsr__ivfpq_check_index(ix, 1, err) != 0)
        return NULL;
    const tsr__search_cache *cache = tsr__search_cache_get(ix, err);
    if (cache == NULL)
        return NULL;
    tsr_ivfpq_scanner *s = calloc(1, sizeof *s);
    if (s == NULL)
        goto oom;
    s->ix = ix;
    s->cache = cache;
    if (simd == TSR_SIMD_AUTO || !tsr_ivfpq_search_simd_supported(simd))
        simd = tsr_ivfpq_search_simd_auto();
    s->wide_table = tsr__wide_table_ok(simd0);
    s->scan8 = tsr__scan8_for(simd);
    s->x = tsr_try_malloc((size_t)ix->d, sizeof(float));
    s->T = tsr_try_aligned(ix->pq.M * ix->pq.ksub, sizeof(float));
    s->dis = tsr_try_aligned(TSR__SCAN_BLOCK, sizeof(float));
    if (s->x == NULL || s->T == NULL || s->dis == NULL)
        goto oom;
    if (cache->rk != NULL && (s->Tr = tsr_try_aligned(ix->pq.M * 256, sizeof(float))) == NULL)
        goto oom;
    if (ix->pq.nbits == 8 && ix->pq.M <= 256 && (s->filter = tsr__filter8_choose(simd0)) != NULL &&
        (s->Tq = tsr_try_aligned(ix->pq.M * 256, 1)) == NULL)
        goto oom;
    if (cache->rk != NULL && (s->filter4 = tsr__filter4_choose(s->filter)) != NULL &&
        (s->Tg = tsr_try_aligned(ix->pq.M * 64, 1)) == NULL)
        goto oom;
    s->sorted = s->filter4 != NULL && tsr__rows_sorted(ix);
    if ((s->view = calloc(1, sizeof *s->view)) == NULL)
        goto oom;
    return s;
oom:
    tsr_ivfpq_scanner_destroy(s);
    tsr_err(err, TSR_ENOMEM, "scanner: out of memory for a %zu x %zu table", ix->pq.M,
            ix->pq.ksub);
    return NULL;
}

void tsr_ivfpq_scanner_destroy(tsr_ivfpq_scanner *s)
{
    if (s == NULL)
        return;
    free(s->x);
    free(s->T);
    free(s->Tr);
    free(s->dis);
    free(s->Tq);
    free(s->Tg);
    free(s->view);
    free(s);
}

void tsr_ivfpq_scanner_set_query(tsr_ivfpq_scanner *s, const float *x)
{
    memcpy(s->x, x, (size_t)s->ix->d * sizeof(float));
    s->have_T = s->have_Tr = 0;
    s->tq_state = 0;
    s->pf = NULL;
}

float tsr_ivfpq_scanner_base(const tsr_ivfpq_scanner *s, float coarse_dis)
{
    if (!s->ix->by_residual)
        return 0.0f;
    return s->ix->metric == TSR_METRIC_IP ? -coarse_dis : coarse_dis;
}

float tsr_ivfpq_scanner_scan(tsr_ivfpq_scanner *s, const uint8_t *codes, size_t n,
                             const float *term, float base, float thr,
                             tsr_ivfpq_sink_fn sink, void *ctx)
{
    return tsr__scan_list(&s->ix->pq, s->scan8, table_T(s), s->dis, codes, n, term, base, NULL,
                          thr, sink, ctx);
}

/* ---- the prefilter of a list held by the caller ------------------------------------- */


int tsr_ivfpq_flist_build(const tsr_ivfpq *ix, const uint8_t *codes, size_t n,
                          const float *term, tsr_ivfpq_flist **out, tsr_error *err)
{
    const tsr_pq *pq = &ix->pq;
    *out = NULL;
    if (n == 0 || pq->nbits != 8 || pq->M > 256)
        return 0;
    tsr__ranks *rk = NULL;
    if (pq->dsub == 1 && pq->ksub == 256) { /* the blocks hold ranks: the cache's */
        const tsr__search_cache *c = tsr__search_cache_get(ix, err);
        if (c == NULL)
            return err ? err->code : TSR_ENOMEM;
        rk = c->rk;
    }
    tsr_ivfpq_flist *f = calloc(1, sizeof *f);
    size_t nb = (n + TSR__FBLOCK - 1) / TSR__FBLOCK;
    if (f == NULL)
        goto oom;
    f->rk = tsr__ranks_ref(rk);
    f->n = n;
    f->M = pq->M;
    f->has_term = term != NULL;
    f->bsz = tsr__fblock_size(pq->M, f->has_term);
    if (tsr_mul_ok(nb, f->bsz, &f->bytes) != 0 ||
        (f->blocks = tsr_try_aligned(f->bytes, 1)) == NULL)
        goto oom;
    memset(f->blocks, 0, f->bytes);
    tsr__transpose_list(codes, term, n, pq->M, f->bsz, f->rk ? tsr__ranks_rank(f->rk) : NULL,
                        f->blocks);
    for (size_t i = 0; term != NULL && i < n; i++) {
        float a = fabsf(term[i]);
        if (!(a <= f->tmax))
            f->tmax = a == a ? a : INFINITY;
    }
    *out = f;
    return 0;
oom:
    tsr_ivfpq_flist_free(f);
    return tsr_err(err, TSR_ENOMEM, "prefilter: out of memory for a list of %zu codes", n);
}

void tsr_ivfpq_flist_free(tsr_ivfpq_flist *f)
{
    if (f == NULL)
        return;
    tsr__ranks_unref(f->rk);
    free(f->blocks);
    free(f);
}

size_t tsr_ivfpq_flist_bytes(const tsr_ivfpq_flist *f)
{
    return f ? f->bytes + sizeof *f : 0;
}

/* The prefilter of scanner s for list fl at base into *f: 1, or 0 when it cannot run
 * (no filter kernel, a table that does not quantize, an infinite margin). The table is
 * quantized once per query, on the first filtered list. */
static int scanner_filt(tsr_ivfpq_scanner *s, const tsr_ivfpq_flist *fl, float base, tsr__filt *f)
{
    const tsr_pq *pq = &s->ix->pq;
    if (s->filter == NULL)
        return 0;
    tsr__filter8_fn fn = fl->rk && s->filter4 ? s->filter4 : s->filter;
    if (s->tq_state == 0 && fn == s->filter4 && s->sorted &&
        tsr__group_table_sorted(fn, table_blocks(s), pq->M, s->Tg, &s->qmin, &s->delta,
                                &s->tabs))
        s->tq_state = 2; /* the group table alone, from the rows' ends */
    if (s->tq_state == 0 || (s->tq_state == 2 && fn != s->filter4)) {
        s->tq_state = tsr__quantize_for(fn, s->wide_table, table_blocks(s), pq->M, s->Tq,
                                        &s->qmin, &s->delta, &s->tabs) ? 1 : -1;
        if (s->tq_state == 1 && s->filter4 != NULL)
            tsr__group_table(s->filter4, s->Tq, pq->M, s->Tg);
    }
    /* The rounding margin, with the list's max |term| (the cache's max for its views). */
    float margin = (fabsf(base) + fl->tmax + 2.0f * s->tabs) * (1.0f / 4096.0f);
    if (s->tq_state < 1 || !(margin < INFINITY))
        return 0;
    *f = (tsr__filt){fn, fn == s->filter4 ? s->Tg : s->Tq, fl->blocks, fl->bsz, s->qmin,
                     s->delta, margin, s->pf};
    return 1;
}

size_t tsr_ivfpq_flist_size(const tsr_ivfpq_flist *f)
{
    return f ? f->n : 0;
}

/* ---- the search cache's blocks as scan blocks (tsr_ivfpq_search's lists) ------------- */

const tsr_ivfpq_flist *tsr__scanner_view(tsr_ivfpq_scanner *s, size_t list)
{
    const tsr__search_cache *c = s->cache;
    if (c->tcodes == NULL)
        return NULL;
    int has_term = c->term != NULL;
    *s->view = (struct tsr_ivfpq_flist){
        .n = c->sizes[list], .M = s->ix->pq.M, .bsz = tsr__fblock_size(s->ix->pq.M, has_term),
        .rk = c->rk, .has_term = has_term, .tmax = c->tmax,
        .blocks = c->tcodes + c->toffsets[list]};
    return s->view;
}

void tsr__scanner_prefetch(tsr_ivfpq_scanner *s, struct tsr__pfcur *pf, const int64_t *lists,
                           size_t np)
{
    const tsr__search_cache *c = s->cache;
    if (c->tcodes == NULL || s->filter == NULL)
        return;
    *pf = (struct tsr__pfcur){c, lists, np, 0, NULL, 0,
                              tsr__fblock_size(s->ix->pq.M, c->term != NULL)};
    tsr__pf_run(pf, TSR__PF_LEAD);
    s->pf = pf;
}

/* Code i of f (Faiss order, f->M bytes) into out. */
static void flist_code(const tsr_ivfpq_flist *f, size_t i, uint8_t *out)
{
    const uint8_t *c = f->blocks + i / TSR__FBLOCK * f->bsz + i % TSR__FBLOCK;
    const uint8_t *un = f->rk ? tsr__ranks_unrank(f->rk) : NULL;
    for (size_t m = 0; m < f->M; m++)
        out[m] = un ? un[m * 256 + c[m * TSR__FBLOCK]] : c[m * TSR__FBLOCK];
}

void tsr_ivfpq_flist_codes(const tsr_ivfpq_flist *f, size_t i0, size_t n, uint8_t *codes,
                           float *term)
{
    for (size_t i = i0; i < i0 + n; i++) {
        const uint8_t *bp = f->blocks + i / TSR__FBLOCK * f->bsz;
        if (codes != NULL)
            flist_code(f, i, codes + (i - i0) * f->M);
        if (term != NULL && f->has_term)
            memcpy(term + (i - i0), bp + f->M * TSR__FBLOCK + i % TSR__FBLOCK * sizeof(float),
                   sizeof(float));
    }
}

float tsr_ivfpq_scanner_scan_flist(tsr_ivfpq_scanner *s, const tsr_ivfpq_flist *fl,
                                   int prefilter, float base, float thr, tsr_ivfpq_sink_fn sink,
                                   void *ctx)
{
    const tsr_pq *pq = &s->ix->pq;
    if (fl == NULL || fl->n == 0)
        return thr;
    tsr__filt f;
    /* the blocks' own table: rank order when they hold ranks (the plain kernels index it
     * with the ranks: the same entries, the same sums) */
    const float *T = fl->rk ? table_blocks(s) : table_T(s);
    if (prefilter && scanner_filt(s, fl, base, &f))
        /* codes are not read on the filtered path; term only says "has terms" */
        return tsr__scan_list(pq, s->scan8, T, s->dis, NULL, fl->n,
                              fl->has_term ? (const float *)(const void *)fl->blocks : NULL,
                              base, &f, thr, sink, ctx);
    /* The plain scan, block by block: each block's codes back in Faiss order (a 64 x M
     * copy, ~1/4 of the kernel's own work) through the same kernel with the same terms,
     * so every score has the bits tsr_ivfpq_scanner_scan gives on the Faiss-order list. */
    uint8_t cb[TSR__FBLOCK * 256];
    const size_t M = pq->M; /* a local: the byte stores below may alias *pq */
    for (size_t b = 0; b < fl->n; b += TSR__FBLOCK) {
        size_t nb = fl->n - b < TSR__FBLOCK ? fl->n - b : TSR__FBLOCK;
        const uint8_t *blk = fl->blocks + b / TSR__FBLOCK * fl->bsz;
        for (size_t m = 0; m < M; m++) {
            const uint8_t *row = blk + m * TSR__FBLOCK;
            for (size_t i = 0; i < nb; i++)
                cb[i * M + m] = row[i];
        }
        const float *tb =
            fl->has_term ? (const float *)(const void *)(blk + pq->M * TSR__FBLOCK) : NULL;
        s->scan8(T, pq->M, cb, nb, tb, base, s->dis);
        for (size_t i = 0; i < nb; i++)
            if (s->dis[i] <= thr)
                thr = sink(ctx, b + i, s->dis[i]);
    }
    return thr;
}

float tsr_ivfpq_scanner_scan_filtered(tsr_ivfpq_scanner *s, const uint8_t *codes, size_t n,
                                      const float *term, const tsr_ivfpq_flist *fl,
                                      float base, float thr, tsr_ivfpq_sink_fn sink,
                                      void *ctx)
{
    const tsr_pq *pq = &s->ix->pq;
    tsr__filt f;
    if (fl != NULL && fl->n == n && fl->has_term == (term != NULL) &&
        scanner_filt(s, fl, base, &f)) /* the exact sums from fl's blocks, with their table */
        return tsr__scan_list(pq, s->scan8, fl->rk ? table_blocks(s) : table_T(s), s->dis,
                              codes, n, term, base, &f, thr, sink, ctx);
    return tsr__scan_list(pq, s->scan8, table_T(s), s->dis, codes, n, term, base, NULL, thr,
                          sink, ctx);
}

/* ---- the per-query table and the scan of one list ------------------------------------ */

/* The per-query table, "smaller is better" (see the file comment), from the transposed
 * centroids so that the inner loop runs over j with unit stride in 4-wide vectors. Each
 * entry is summed over t in order, as the straightforward per-entry dot product. The
 * metric's scale (-1 for IP, -2 for the L2 residual form) is a power of two, so it is
 * folded into x_t: (s x_t) c = s (x_t c) and the sums scale exactly, which saves a
 * second pass over the 64 KB table (it was half of the table time). */
typedef float v4sf __attribute__((vector_size(16)));

void tsr__build_table(const tsr_ivfpq *ix, const float *ct, const float *x, float *T, int wide)
{
    const tsr_pq *pq = &ix->pq;
    const size_t ksub = pq->ksub, dsub = pq->dsub;
    const int mode = ix->metric == TSR_METRIC_IP ? 0 : ix->by_residual ? 1 : 2;
    const float scale = mode == 0 ? -1.0f : -2.0f;
    /* wide: the AVX-512 form (same bits; ~3x faster, a twentieth of a query at nprobe 1) */
    if (wide && mode != 2 && ksub % 16 == 0) {
        tsr__table_avx512(ct, x, pq->M, dsub, ksub, scale, T);
        return;
    }
    const size_t k4 = ksub & ~(size_t)3; /* ksub < 4 only for nbits = 1 */
    for (size_t m = 0; m < pq->M; m++) {
        const float *xm = x + m * dsub;
        const float *cm = ct + m * dsub * ksub;
        float *tab = T + m * ksub;
        if (mode == 2) { /* sum_t (x_t - c_t)^2 */
            for (size_t t = 0; t < dsub; t++) {
                const float *c = cm + t * ksub;
                const float xt = xm[t];
                for (size_t j = 0; j < k4; j += 4) {
                    v4sf cv, tv;
                    memcpy(&cv, c + j, sizeof cv);
                    v4sf dl = xt - cv;
                    if (t == 0) {
                        tv = dl * dl;
                    } else {
                        memcpy(&tv, tab + j, sizeof tv);
                        tv += dl * dl;
                    }
                    memcpy(tab + j, &tv, sizeof tv);
                }
                for (size_t j = k4; j < ksub; j++)
                    tab[j] = (t == 0 ? 0.0f : tab[j]) + (xt - c[j]) * (xt - c[j]);
            }
            continue;
        }
        /* t = 0 initializes, later t accumulate (separate loops: no branch inside) */
        {
            const float xt = scale * xm[0];
            for (size_t j = 0; j < k4; j += 4) {
                v4sf cv;
                memcpy(&cv, cm + j, sizeof cv);
                v4sf tv = xt * cv;
                memcpy(tab + j, &tv, sizeof tv);
            }
            for (size_t j = k4; j < ksub; j++)
                tab[j] = xt * cm[j];
        }
        for (size_t t = 1; t < dsub; t++) {
            const float *c = cm + t * ksub;
            const float xt = scale * xm[t];
            for (size_t j = 0; j < k4; j += 4) {
                v4sf cv, tv;
                memcpy(&cv, c + j, sizeof cv);
                memcpy(&tv, tab + j, sizeof tv);
                tv += xt * cv;
                memcpy(tab + j, &tv, sizeof tv);
            }
            for (size_t j = k4; j < ksub; j++)
                tab[j] += xt * c[j];
        }
    }
}

void tsr__pf_run(struct tsr__pfcur *c, size_t bytes)
{
    while (bytes > 0) {
        if (c->left == 0) {
            if (c->p >= c->np)
                return;
            int64_t l = c->lists[c->p++];
            if (l < 0 || (size_t)l >= c->ca->nlist)
                continue;
            c->at = c->ca->tcodes + c->ca->toffsets[l];
            c->left = (c->ca->sizes[l] + TSR__FBLOCK - 1) / TSR__FBLOCK * c->bsz;
            continue;
        }
        size_t take = bytes < c->left ? bytes : c->left;
        for (size_t o = 0; o < take; o += 64)
            __builtin_prefetch(c->at + o);
        c->at += take;
        c->left -= take;
        bytes -= take;
    }
}

/* The scan of one list: block distances by the kernel, then only the codes that could
 * enter (score <= thr) go to the sink, which returns the new threshold. The one scan
 * loop of every search. */
float tsr__scan_list(const tsr_pq *pq, tsr__scan8_fn scan8, const float *T, float *dis,
                     const uint8_t *codes, size_t n, const float *term, float base,
                     const tsr__filt *f, float thr, tsr__sink_fn sink, void *ctx)
{
    if (f != NULL) {
        /* Block by block of TSR__FBLOCK codes: the bound for all, the exact distance only
         * for the codes whose bound is within the margin of the heap top (a fraction of
         * a percent on the bench data from the second list on). A code the filter drops
         * has a distance > thr, so it could not have entered, and thr only decreases:
         * the sink sees the same candidates in the same order as without the filter. */
        const size_t bsz = f->bsz;
        for (size_t b = 0; b < n; b += TSR__FBLOCK) {
            size_t nb = n - b < TSR__FBLOCK ? n - b : TSR__FBLOCK;
            const uint8_t *blk = f->blocks + b / TSR__FBLOCK * bsz;
            const float *tb = term ? (const float *)(const void *)(blk + pq->M * TSR__FBLOCK)
                                   : NULL;
            if (f->pf != NULL)
                tsr__pf_run(f->pf, bsz);
            uint64_t mask = thr < INFINITY
                                ? f->fn(f->Tq, pq->M, blk, nb, tb, base, f->qmin, f->delta,
                                        thr + f->margin, NULL)
                                : (nb == 64 ? ~(uint64_t)0 : ((uint64_t)1 << nb) - 1);
            while (mask) {
                size_t i = (size_t)__builtin_ctzll(mask);
                mask &= mask - 1;
                float d = (base + (tb ? tb[i] : 0.0f)) +
                          tsr__filter8_exact(T, pq->M, blk, i);
                if (d <= thr)
                    thr = sink(ctx, b + i, d);
            }
        }
        return thr;
    }
    for (size_t b = 0; b < n; b += TSR__SCAN_BLOCK) {
        size_t nb = n - b < TSR__SCAN_BLOCK ? n - b : TSR__SCAN_BLOCK;
        const uint8_t *cb = codes + b * pq->code_size;
        const float *tb = term ? term + b : NULL;
        if (pq->nbits == 8)
            scan8(T, pq->M, cb, nb, tb, base, dis);
        else
            tsr__scan_generic(T, pq, cb, nb, tb, base, dis);
        for (size_t i = 0; i < nb; i++)
            if (dis[i] <= thr)
                thr = sink(ctx, b + i, dis[i]);
    }
    return thr;
}


int tsr__ivfpq_check_index(const tsr_ivfpq *ix, size_t k, tsr_error *err)
{
    const tsr_pq *pq = &ix->pq;
    if (ix->d <= 0 || pq->d != (size_t)ix->d || pq->M == 0 || pq->centroids == NULL ||
        ix->centroids == NULL || ix->lists == NULL || ix->code_size != pq->code_size)
        return tsr_err(err, TSR_EINVAL, "search: index is not a trained IVFPQ (d=%d, pq d=%zu,"
                       " code_size=%zu, pq code_size=%zu)", ix->d, pq->d, ix->code_size,
                       pq->code_size);
    if (ix->metric != TSR_METRIC_L2 && ix->metric != TSR_METRIC_IP)
        return tsr_err(err, TSR_EUNSUPPORTED, "search: metric %d", (int)ix->metric);
    if (ix->is_refine && (ix->refine_pq.d != (size_t)ix->d || ix->refine_pq.centroids == NULL))
        return tsr_err(err, TSR_EINVAL, "search: IwQR refine PQ has d=%zu, index d=%d",
                       ix->refine_pq.d, ix->d);
    if (k > ((size_t)1 << 30))
        return tsr_err(err, TSR_EINVAL, "search: k=%zu is too large", k);
    return 0;
}

