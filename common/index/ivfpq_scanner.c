/*
 * ivfpq_scanner — the scan of lists held by the caller (the shard's): a scanner per thread
 * with the per-query table, and the scan blocks of a list (tsr_ivfpq_flist: the codes and
 * terms transposed by 64 for the quantized prefilter, which the shard keeps as a list's
 * only copy). The arithmetic is the search's (ivfpq_search.c: tsr__build_table,
 * tsr__scan_list, the kernels and their run-time choice), so a list scanned here gives
 * the bits `tessera index search` gives. Semantics in ivfpq_search.h.
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

/* ---- the public scanner (lists held by the caller) --------------------------------- */

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
    free(s);
}

void tsr_ivfpq_scanner_set_query(tsr_ivfpq_scanner *s, const float *x)
{
    memcpy(s->x, x, (size_t)s->ix->d * sizeof(float));
    s->have_T = s->have_Tr = 0;
    s->tq_state = 0;
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

struct tsr_ivfpq_flist {
    size_t n, M, bsz, bytes;
    tsr__ranks *rk;  /* a reference to the ranks the blocks hold instead of code bytes
                        (dsub = 1: the index's, so every block list of one quantizer has
                        them or none has), or NULL */
    int has_term;
    float tmax;      /* max |term| of the list (rounding margin; inf if any NaN) */
    uint8_t *blocks; /* transposed by blocks of TSR__FBLOCK, 64-aligned, zero-padded */
};

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
    /* The rounding margin as in ivfpq_search.c search_one, with the list's own max |term|. */
    float margin = (fabsf(base) + fl->tmax + 2.0f * s->tabs) * (1.0f / 4096.0f);
    if (s->tq_state < 1 || !(margin < INFINITY))
        return 0;
    *f = (tsr__filt){fn, fn == s->filter4 ? s->Tg : s->Tq, fl->blocks, fl->bsz, s->qmin,
                     s->delta, margin, NULL};
    return 1;
}

size_t tsr_ivfpq_flist_size(const tsr_ivfpq_flist *f)
{
    return f ? f->n : 0;
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
