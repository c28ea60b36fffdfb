/*
 * scan — one query on one version snapshot: the ADC scan of the probed lists with the
 * compiled filter, the local crowded top-k, the optional exact re-rank with the stored raw
 * vectors, and the exact sparse dot-product top-k over all the version's datapoints
 * (common/query/sparse's inverted index, built per version).
 *
 * The scan is common/index/ivfpq_search's (tsr_ivfpq_scanner: the kernels and the arithmetic of
 * `tessera index search`): score = base + term + sum_m T[m][code_m] with the per-query
 * table T, the list's per-code terms (L2 by_residual, kept in tsr__list) and the base from
 * the coordinator's coarse distance. This is Faiss's IndexIVFPQ::search_preassigned up to
 * float rounding in the last bits (SPEC §1; the Faiss interop bar is met), for the lists
 * and coarse distances the coordinator sends. From 2 probes on it runs with the quantized
 * prefilter (the list's transposed blocks, tsr__list.fl), which only skips codes that
 * could not enter a collector: the answers are bit-identical with it or without.
 *
 * Collectors (common/query/topk, total order: score, then the smaller label, so a distributed
 * answer is the single-node answer even with ties): without crowding a bounded heap of k;
 * with crowding (SPEC §3) the per-shard crowded collector (at most `crowd` per tag, an
 * untagged datapoint never limited), whose answer contains every item of the global
 * greedy answer that lives on this shard; with re-rank a heap of `candidates` (with
 * crowding, united with a crowded collector of `candidates`, so one tag cannot fill them
 * and leave fewer than k results), re-scored with the raw vectors, then the greedy
 * crowding pass. The filter is tested only for
 * codes that would enter the collector.
 *
 * Thread-safety: reads only immutable snapshot data; everything else is per call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/ivfpq_search.h"
#include "core/mem.h"
#include "shard.h"
#include "query/sparse.h"
#include "query/topk.h"

void tsr__encode(const tsr__tmpl *t, const float *x, int32_t list, uint8_t *code)
{
    const tsr_ivfpq *ix = t->ix;
    const tsr_pq *pq = &ix->pq;
    const float *yc = ix->by_residual ? ix->centroids + (size_t)list * (size_t)ix->d : NULL;
    for (size_t m = 0; m < pq->M; m++) {
        float best = INFINITY;
        uint32_t bj = 0;
        for (size_t j = 0; j < pq->ksub; j++) {
            const float *c = pq->centroids + (m * pq->ksub + j) * pq->dsub;
            float s = 0;
            for (size_t q = 0; q < pq->dsub; q++) {
                size_t dim = m * pq->dsub + q;
                float r = x[dim] - (yc ? yc[dim] : 0.0f) - c[q];
                s += r * r;
            }
            if (s < best)
                best = s, bj = (uint32_t)j;
        }
        tsr_pq_code_put(code, m, pq->nbits, bj);
    }
}

/* The collectors a scan feeds: a plain heap (tag = row) and/or the crowded one. Without
 * re-rank exactly one of them; with re-rank and crowding both (the candidates are their
 * union: the plain heap keeps the re-rank exact where it covers, the crowded one holds
 * enough tags that crowding cannot leave fewer than k results). */
typedef struct sink {
    tsr_topk *heap;         /* plain or re-rank candidates; NULL when only crowd */
    tsr_crowd_topk *crowd;  /* crowding; NULL otherwise */
    const tsr__version *v;
    const tsr__list *l;
    size_t row0;
    const tsr_filter *filter; /* NULL = all pass */
    int64_t passed;
    int oom;
} sink;

static inline float topk_thr(const tsr_topk *t)
{
    return t->n < t->k ? INFINITY : t->h[0].dist;
}

/* The scan's threshold: the looser of the collectors' (a code worse than it enters none). */
static inline float sink_thr(const sink *k)
{
    float a = k->heap ? topk_thr(k->heap) : -INFINITY;
    float b = k->crowd ? topk_thr(&k->crowd->heap) : -INFINITY;
    return a > b ? a : b;
}

static float sink_fn(void *ctx, size_t i, float s)
{
    sink *k = ctx;
    int64_t label = k->l->ids[i];
    int to_heap = k->heap && tsr_topk_would_enter(k->heap, s, label);
    int to_crowd = k->crowd && tsr_crowd_topk_would_enter(k->crowd, s, label);
    if (!to_heap && !to_crowd)
        return sink_thr(k);
    uint32_t row = (uint32_t)(k->row0 + i);
    if (k->filter && !tsr_filter_match(k->filter, k->v->meta, row))
        return sink_thr(k);
    k->passed++;
    if (to_heap)
        tsr_topk_push(k->heap, s, row, label);
    if (to_crowd && tsr_crowd_topk_push(k->crowd, s, tsr_filter_meta_crowding(k->v->meta, row),
                                        label) == TSR_ENOMEM)
        k->oom = 1;
    return sink_thr(k);
}

/* hits (best first, scores) -> res->dense with rows and real distances. rows: the rows
 * of the hits, or NULL to look them up by label. */
static int emit(const tsr__version *v, const tsr_hit *h, size_t n, const uint32_t *rows,
                int negate, tsr__qresult *res, tsr_error *err)
{
    res->dense = tsr_try_malloc(n ? n : 1, sizeof(tsr__hit));
    if (res->dense == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu results", n);
    for (size_t i = 0; i < n; i++) {
        uint32_t row;
        if (rows) {
            row = rows[i];
        } else if (tsr_filter_meta_find(v->meta, h[i].label, &row) != 0) {
            return tsr_err(err, TSR_EINTERNAL, "dense hit label %lld has no row",
                           (long long)h[i].label);
        }
        res->dense[i] = (tsr__hit){h[i].label, negate ? -h[i].dist : h[i].dist, row};
    }
    res->ndense = n;
    return 0;
}

static int cmp_label(const void *a, const void *b)
{
    int64_t x = ((const tsr_hit *)a)->label, y = ((const tsr_hit *)b)->label;
    return (x > y) - (x < y);
}

/* Appends to hits / rows (*n of them, from the plain heap; room for crowd's too) the
 * crowded collector's candidates that are not there yet, with their rows looked up. */
static int add_crowded(const tsr__version *v, tsr_crowd_topk *crowd, tsr_hit *hits,
                       uint32_t *rows, size_t *n, tsr_error *err)
{
    size_t n0 = *n, m = crowd->heap.n;
    tsr_hit *c = tsr_try_malloc(m ? m : 1, sizeof *c), *sorted = NULL;
    if (c == NULL || (sorted = tsr_try_malloc(n0 ? n0 : 1, sizeof *sorted)) == NULL) {
        free(c);
        return tsr_err(err, TSR_ENOMEM, "out of memory for the candidates");
    }
    m = tsr_crowd_topk_extract(crowd, c);
    memcpy(sorted, hits, n0 * sizeof *sorted);
    qsort(sorted, n0, sizeof *sorted, cmp_label);
    int rc = 0;
    for (size_t i = 0; i < m && rc == 0; i++) {
        if (bsearch(&c[i], sorted, n0, sizeof *sorted, cmp_label))
            continue;
        if (tsr_filter_meta_find(v->meta, c[i].label, &rows[*n]) != 0) {
            rc = tsr_err(err, TSR_EINTERNAL, "dense hit label %lld has no row",
                         (long long)c[i].label);
            break;
        }
        hits[(*n)++] = c[i];
    }
    free(c);
    free(sorted);
    return rc;
}

static int dense_part(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                      tsr_error *err)
{
    const tsr__tmpl *t = v->tmpl;
    const tsr_ivfpq *ix = t->ix;
    size_t d = (size_t)ix->d;
    int l2 = ix->metric == TSR_METRIC_L2;
    int crowding = q->crowd && q->crowd < q->k;
    size_t rerank = q->candidates ? (q->candidates > q->k ? q->candidates : q->k) : 0;
    int rc = 0;
    tsr_topk heap = {0};
    tsr_crowd_topk crowd = {0};
    tsr_hit *hits = NULL, *sel = NULL;
    uint32_t *rows = NULL;
    tsr_ivfpq_scanner *sc = NULL;
    sink k = {0};
    k.v = v;
    k.filter = q->filter && !tsr_filter_matches_all(q->filter) ? q->filter : NULL;
    if (crowding) {
        if (tsr_crowd_topk_init(&crowd, rerank ? rerank : q->k, q->crowd, 0) != 0)
            goto nomem;
        k.crowd = &crowd;
    }
    if (!crowding || rerank) {
        if (tsr_topk_init(&heap, rerank ? rerank : q->k, 0) != 0)
            goto nomem;
        k.heap = &heap;
    }
    if (q->k == 0 || (q->filter && tsr_filter_matches_none(q->filter)))
        goto finish;
    if ((sc = tsr_ivfpq_scanner_create(ix, TSR_SIMD_AUTO, err)) == NULL) {
        rc = err ? err->code : TSR_ENOMEM;
        goto out;
    }
    tsr_ivfpq_scanner_set_query(sc, q->x);
    float thr = INFINITY;
    for (size_t p = 0; p < q->nprobe; p++) {
        size_t li = (size_t)q->lists[p];
        const tsr__list *l = v->lists[li];
        if (l == NULL || l->n == 0)
            continue;
        k.l = l;
        k.row0 = v->row0[li];
        /* With the prefilter from 2 probes on, as `tessera index search`: sink_fn's
         * threshold (the looser collector's worst kept score) never increases, so the
         * sink sees the same codes with the same scores as without it. */
        thr = tsr_ivfpq_scanner_scan_filtered(sc, l->codes, l->n, l->term,
                                              q->nprobe >= 2 ? l->fl : NULL,
                                              tsr_ivfpq_scanner_base(sc, q->coarse[p]), thr,
                                              sink_fn, &k);
        res->codes_scanned += (int64_t)l->n;
    }
    res->passed += k.passed;
    if (k.oom)
        goto nomem;
finish:
    if (k.crowd && !rerank) { /* crowded, no re-rank: the collector's answer is the greedy pass */
        if ((hits = tsr_try_malloc(q->k ? q->k : 1, sizeof *hits)) == NULL)
            goto nomem;
        size_t n = tsr_crowd_topk_extract(&crowd, hits);
        rc = emit(v, hits, n, NULL, !l2, res, err);
        goto out;
    }
    size_t n = heap.n + (k.crowd ? crowd.heap.n : 0);
    if ((hits = tsr_try_malloc(n ? n : 1, sizeof *hits)) == NULL ||
        (rows = tsr_try_malloc(n ? n : 1, sizeof *rows)) == NULL)
        goto nomem;
    n = tsr_topk_extract(&heap, hits);
    for (size_t i = 0; i < n; i++)
        rows[i] = hits[i].tag;
    if (k.crowd && (rc = add_crowded(v, &crowd, hits, rows, &n, err)) != 0)
        goto out;
    if (!rerank) {
        rc = emit(v, hits, n < q->k ? n : q->k, rows, !l2, res, err);
        goto out;
    }
    /* Exact re-rank of the candidates with the stored raw vectors, then the greedy
     * crowding pass (c = 0: the first k). Tags become crowding tags. */
    for (size_t i = 0; i < n; i++) {
        uint32_t row = rows[i];
        const float *y = v->row_rec[row]->dp.dense;
        float s = 0;
        if (l2) {
            for (size_t j = 0; j < d; j++) {
                float df = q->x[j] - y[j];
                s += df * df;
            }
        } else {
            for (size_t j = 0; j < d; j++)
                s += q->x[j] * y[j];
            s = -s;
        }
        hits[i].dist = s;
        hits[i].tag = crowding ? tsr_filter_meta_crowding(v->meta, row) : TSR_TOPK_NOTAG;
    }
    tsr_hits_sort(hits, n, 0);
    size_t take = n < q->k ? n : q->k, nsel = 0;
    if ((sel = tsr_try_malloc(take ? take : 1, sizeof *sel)) == NULL ||
        tsr_crowd_select(hits, n, q->k, crowding ? q->crowd : 0, sel, &nsel) != 0)
        goto nomem;
    rc = emit(v, sel, nsel, NULL, !l2, res, err);
    goto out;
nomem:
    rc = tsr_err(err, TSR_ENOMEM, "out of memory for the candidates");
out:
    tsr_ivfpq_scanner_destroy(sc);
    tsr_topk_close(&heap);
    tsr_crowd_topk_close(&crowd);
    free(hits);
    free(sel);
    free(rows);
    return rc;
}

static int sparse_part(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                       tsr_error *err)
{
    size_t k = q->sparse_k ? q->sparse_k : q->k;
    if (v->sparse_ix == NULL || (q->filter && tsr_filter_matches_none(q->filter)))
        return 0;
    tsr_hit *out = tsr_try_malloc(k, sizeof *out);
    res->sparse = tsr_try_malloc(k, sizeof(tsr__hit));
    if (out == NULL || res->sparse == NULL) {
        free(out);
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu sparse results", k);
    }
    size_t n = 0;
    /* Exact dot-product top-k over the inverted index, with the filter and the greedy
     * crowding pass (common/query/sparse); rows are this version's filter rows. */
    int rc = tsr_sparse_search(v->sparse_ix, q->sp_dims, q->sp_vals, q->nsp, k, q->crowd,
                               q->filter, v->meta, out, &n, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint32_t row;
        if (tsr_filter_meta_find(v->meta, out[i].label, &row) != 0) {
            rc = tsr_err(err, TSR_EINTERNAL, "sparse hit label %lld has no row",
                         (long long)out[i].label);
            break;
        }
        res->sparse[res->nsparse++] = (tsr__hit){out[i].label, out[i].dist, row};
    }
    free(out);
    return rc;
}

int tsr__search_one(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                    tsr_error *err)
{
    memset(res, 0, sizeof *res);
    int rc = 0;
    if (q->x && v->tmpl && (rc = dense_part(v, q, res, err)) != 0)
        return rc;
    if (q->nsp && (rc = sparse_part(v, q, res, err)) != 0)
        return rc;
    return 0;
}

void tsr__qresult_close(tsr__qresult *r)
{
    free(r->dense);
    free(r->sparse);
    memset(r, 0, sizeof *r);
}
