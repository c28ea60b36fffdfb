/*
 * scan — one query on one version snapshot: the ADC scan of the probed lists with the
 * compiled filter, the local crowded top-k, the optional exact re-rank with the stored raw
 * vectors, and the exact sparse dot-product top-k over all the version's datapoints
 * (common/query/sparse's inverted index, built per version).
 *
 * The scan is common/index/ivfpq_scanner's (tsr_ivfpq_scanner: the one scan of lists, which
 * `tessera index search` loops over too, so the same kernels and arithmetic): score = base + term + sum_m T[m][code_m] with the per-query
 * table T, the list's per-code terms (L2 by_residual, kept in tsr__list) and the base from
 * the coordinator's coarse distance. This is Faiss's IndexIVFPQ::search_preassigned up to
 * float rounding in the last bits (SPEC §1; the Faiss interop bar is met), for the lists
 * and coarse distances the coordinator sends. It runs with the quantized prefilter (the
 * list's transposed blocks, tsr__list.fl: a base list's only copy of its codes and terms,
 * which the plain scan, TSR_SEARCH_FILTER=0 or a table that does not quantize, reads
 * block by block back in Faiss order), which only skips codes that could not enter a
 * collector: the answers are bit-identical with it or without. The re-rank reads the raw
 * vectors where the records point: the heap, or the mapped vectors.f32 of a loaded version
 * (page cache).
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
#include "index/pq_code.h"
#include "core/mem.h"
#include "shard.h"
#include "query/sparse.h"
#include "query/topk.h"

/* The code of x in list `list` (the residual to the list's centroid when by_residual):
 * common/index/pq_code's exact one-vector encoder. */
void tsr__encode(const tsr__tmpl *t, const float *x, int32_t list, uint8_t *code)
{
    const tsr_ivfpq *ix = t->ix;
    const float *yc = ix->by_residual ? ix->centroids + (size_t)list * (size_t)ix->d : NULL;
    tsr_pq_encoder_encode(t->enc, x, yc, code);
}

/* The collectors a scan feeds: a plain heap (tag = row) and/or the crowded one. Without
 * re-rank exactly one of them; with re-rank and crowding both (the candidates are their
 * union: the plain heap keeps the re-rank exact where it covers, the crowded one holds
 * enough tags that crowding cannot leave fewer than k results). */
/* The query's filter for delta records (a delta has no filter metadata of its own):
 * compiled, on the first delta candidate, against a per-query dictionary holding the
 * query's own strings, and tested on a row made for the candidate in a per-query
 * metadata (common/query/filter, so the semantics are the base rows' exactly). */
typedef struct dfilter {
    const tsr__query *q;
    tsr_filter_dict *dict;
    tsr_filter_meta *meta;
    tsr_filter *f;
    int state; /* 0 = not built, 1 = built, -1 = out of memory */
} dfilter;

static int dfilter_build(dfilter *df)
{
    const tsr__query *q = df->q;
    int rc = 0;
    uint32_t id;
    if ((df->dict = tsr_filter_dict_create()) == NULL ||
        (df->meta = tsr_filter_meta_create(df->dict)) == NULL)
        return -1;
    for (size_t i = 0; i < q->ntr && rc == 0; i++) {
        const tsr_token_restrict *t = &q->tr[i];
        rc = tsr_filter_dict_intern(df->dict, t->ns, strlen(t->ns), &id);
        for (size_t j = 0; j < t->nallow && rc == 0; j++)
            rc = tsr_filter_dict_intern(df->dict, t->allow[j], strlen(t->allow[j]), &id);
        for (size_t j = 0; j < t->ndeny && rc == 0; j++)
            rc = tsr_filter_dict_intern(df->dict, t->deny[j], strlen(t->deny[j]), &id);
    }
    for (size_t i = 0; i < q->nnq && rc == 0; i++)
        rc = tsr_filter_dict_intern(df->dict, q->nq[i].ns, strlen(q->nq[i].ns), &id);
    if (rc == 0)
        rc = tsr_filter_compile(df->dict, q->tr, q->ntr, q->nq, q->nnq, &df->f, NULL);
    return rc == 0 ? 1 : -1;
}

/* 1 when delta record r passes the query's filter, 0 when not, -1 out of memory. */
static int dfilter_match(dfilter *df, const tsr__rec *r)
{
    if (df == NULL)
        return 1;
    if (df->state == 0)
        df->state = dfilter_build(df);
    if (df->state < 0)
        return -1;
    uint32_t row;
    if (tsr_filter_meta_find(df->meta, r->label, &row) != 0 &&
        tsr_filter_meta_add(df->meta, r->label, &r->dp, &row, NULL) != 0)
        return -1;
    return tsr_filter_match(df->f, df->meta, row);
}

static void dfilter_close(dfilter *df)
{
    tsr_filter_destroy(df->f);
    tsr_filter_meta_destroy(df->meta);
    tsr_filter_dict_destroy(df->dict);
}

typedef struct sink {
    tsr_topk *heap;         /* plain or re-rank candidates; NULL when only crowd */
    tsr_crowd_topk *crowd;  /* crowding; NULL otherwise */
    const tsr__version *v;
    const tsr__list *l;
    size_t row0;
    const tsr_filter *filter; /* NULL = all pass */
    const tsr__delta *dl;   /* the version's delta, NULL when empty */
    const int64_t *mask;    /* its masked base labels (nmask of them) */
    size_t nmask;
    dfilter *df;            /* the filter of delta records; NULL = all pass */
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

/* Whether code i (label `label`) of k->l is a result, and then its search row and its
 * crowding tag (*tag needed only when want_tag). One per kind of list. */
typedef int (*accept_fn)(sink *k, size_t i, int64_t label, int want_tag, uint32_t *row,
                         uint32_t *tag);

/* A base list: not masked by the delta, and passing the filter at its row. */
static inline int accept_base(sink *k, size_t i, int64_t label, int want_tag, uint32_t *row,
                              uint32_t *tag)
{
    if (k->nmask && tsr__i64_in(k->mask, k->nmask, label))
        return 0; /* deleted or replaced by a streamed write */
    *row = (uint32_t)(k->row0 + i);
    if (k->filter && !tsr_filter_match(k->filter, k->v->meta, *row))
        return 0;
    *tag = want_tag ? tsr_filter_meta_crowding(k->v->meta, *row) : 0;
    return 1;
}

/* A delta list: entry i is a delta record (row v->nrows + its index in the delta's
 * records), passing the filter of delta records. */
static inline int accept_delta(sink *k, size_t i, int64_t label, int want_tag, uint32_t *row,
                               uint32_t *tag)
{
    (void)i, (void)want_tag;
    size_t idx;
    const tsr__rec *r = tsr__delta_find(k->dl, label, &idx);
    if (r == NULL)
        return 0;
    int m = dfilter_match(k->df, r);
    if (m < 0)
        k->oom = 1;
    if (m <= 0)
        return 0;
    *row = (uint32_t)(k->v->nrows + idx);
    *tag = r->tag;
    return 1;
}

/* The code at position i of k->l with score s: into the collectors it could enter when
 * accept takes it (asked only then). Returns the new threshold. */
static inline float sink_offer(sink *k, size_t i, float s, accept_fn accept)
{
    int64_t label = k->l->ids[i];
    int to_heap = k->heap && tsr_topk_would_enter(k->heap, s, label);
    int to_crowd = k->crowd && tsr_crowd_topk_would_enter(k->crowd, s, label);
    uint32_t row, tag;
    if ((to_heap || to_crowd) && accept(k, i, label, to_crowd, &row, &tag)) {
        k->passed++;
        if (to_heap)
            tsr_topk_push(k->heap, s, row, label);
        if (to_crowd && tsr_crowd_topk_push(k->crowd, s, tag, label) == TSR_ENOMEM)
            k->oom = 1;
    }
    return sink_thr(k);
}

static float sink_fn(void *ctx, size_t i, float s)
{
    return sink_offer(ctx, i, s, accept_base);
}

static float dsink_fn(void *ctx, size_t i, float s)
{
    return sink_offer(ctx, i, s, accept_delta);
}

/* The search row of label in v with delta dl (a delta record first: it masks the base). */
static int row_of(const tsr__version *v, const tsr__delta *dl, int64_t label, uint32_t *row)
{
    size_t idx;
    if (dl && tsr__delta_find(dl, label, &idx)) {
        *row = (uint32_t)(v->nrows + idx);
        return 0;
    }
    return tsr_filter_meta_find(v->meta, label, row);
}

/* The crowding tag id of a search row. */
static uint32_t tag_of(const tsr__version *v, const tsr__delta *dl, uint32_t row)
{
    return row < v->nrows ? tsr_filter_meta_crowding(v->meta, row)
                          : dl->recs[row - v->nrows]->tag;
}

/* hits (best first, scores) -> res->dense with rows and real distances. rows: the rows
 * of the hits, or NULL to look them up by label. */
static int emit(const tsr__version *v, const tsr__delta *dl, const tsr_hit *h, size_t n,
                const uint32_t *rows, int negate, tsr__qresult *res, tsr_error *err)
{
    res->dense = tsr_try_malloc(n ? n : 1, sizeof(tsr__hit));
    if (res->dense == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu results", n);
    for (size_t i = 0; i < n; i++) {
        uint32_t row;
        if (rows) {
            row = rows[i];
        } else if (row_of(v, dl, h[i].label, &row) != 0) {
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
static int add_crowded(const tsr__version *v, const tsr__delta *dl, tsr_crowd_topk *crowd,
                       tsr_hit *hits, uint32_t *rows, size_t *n, tsr_error *err)
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
        if (row_of(v, dl, c[i].label, &rows[*n]) != 0) {
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
    tsr__scan_cache own = {0}, *scan = q->scan ? q->scan : &own;
    sink k = {0};
    dfilter df = {q, NULL, NULL, NULL, 0};
    const tsr__delta *dl = tsr__delta_empty(q->delta) ? NULL : q->delta;
    k.v = v;
    k.filter = q->filter && !tsr_filter_matches_all(q->filter) ? q->filter : NULL;
    k.dl = dl;
    k.mask = dl ? dl->mask : NULL;
    k.nmask = dl ? dl->nmask : 0;
    k.df = dl && (q->ntr || q->nnq) ? &df : NULL;
    /* A filter that no base row can match may still match a delta record. */
    int base_none = q->filter && tsr_filter_matches_none(q->filter);
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
    if (q->k == 0 || (base_none && dl == NULL))
        goto finish;
    if (scan->ix != ix) { /* the call's scanner is for another index (or none yet) */
        tsr__scan_cache_close(scan);
        if ((scan->sc = tsr_ivfpq_scanner_create(ix, TSR_SIMD_AUTO, err)) == NULL) {
            rc = err ? err->code : TSR_ENOMEM;
            goto out;
        }
        scan->ix = ix;
    }
    sc = scan->sc;
    tsr_ivfpq_scanner_set_query(sc, q->x);
    float thr = INFINITY;
    for (size_t p = 0; p < q->nprobe; p++) {
        size_t li = (size_t)q->lists[p];
        const tsr__list *l = v->lists[li];
        const tsr__list *dlist = dl ? dl->lists[li] : NULL;
        if (dlist && dlist->n) { /* the delta records of the list, scored alike */
            k.l = dlist;
            thr = tsr_ivfpq_scanner_scan_filtered(sc, dlist->codes, dlist->n, dlist->term, NULL,
                                                  tsr_ivfpq_scanner_base(sc, q->coarse[p]), thr,
                                                  dsink_fn, &k);
            res->codes_scanned += (int64_t)dlist->n;
        }
        if (l == NULL || l->n == 0 || base_none)
            continue;
        k.l = l;
        k.row0 = v->row0[li];
        /* With the prefilter from the first probe on (sink_fn's threshold, the looser
         * collector's worst kept score, never increases, so the sink sees the same codes
         * with the same scores as without it). Unlike `tessera index search`, which keeps
         * a Faiss-order copy for one probe, a shard's only copy is the scan blocks, and
         * the plain scan of them copies each block back first: a shard given one list of
         * a query (nprobe 1, or 16 probes over 4 shards) ran 7-31 % fewer queries per
         * second without the prefilter (docs/performance.md, Dec 7). */
        float base = tsr_ivfpq_scanner_base(sc, q->coarse[p]);
        if (l->fl != NULL) /* the list's only copy of its codes: the scan blocks */
            thr = tsr_ivfpq_scanner_scan_flist(sc, l->fl, 1, base, thr, sink_fn, &k);
        else
            thr = tsr_ivfpq_scanner_scan_filtered(sc, l->codes, l->n, l->term, NULL, base, thr,
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
        rc = emit(v, dl, hits, n, NULL, !l2, res, err);
        goto out;
    }
    size_t n = heap.n + (k.crowd ? crowd.heap.n : 0);
    if ((hits = tsr_try_malloc(n ? n : 1, sizeof *hits)) == NULL ||
        (rows = tsr_try_malloc(n ? n : 1, sizeof *rows)) == NULL)
        goto nomem;
    n = tsr_topk_extract(&heap, hits);
    for (size_t i = 0; i < n; i++)
        rows[i] = hits[i].tag;
    if (k.crowd && (rc = add_crowded(v, dl, &crowd, hits, rows, &n, err)) != 0)
        goto out;
    if (!rerank) {
        rc = emit(v, dl, hits, n < q->k ? n : q->k, rows, !l2, res, err);
        goto out;
    }
    /* Exact re-rank of the candidates with the stored raw vectors, then the greedy
     * crowding pass (c = 0: the first k). Tags become crowding tags. */
    for (size_t i = 0; i < n; i++) {
        uint32_t row = rows[i];
        const float *y = tsr__row_rec(v, dl, row)->dp.dense;
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
        hits[i].tag = crowding ? tag_of(v, dl, row) : TSR_TOPK_NOTAG;
    }
    tsr_hits_sort(hits, n, 0);
    size_t take = n < q->k ? n : q->k, nsel = 0;
    if ((sel = tsr_try_malloc(take ? take : 1, sizeof *sel)) == NULL ||
        tsr_crowd_select(hits, n, q->k, crowding ? q->crowd : 0, sel, &nsel) != 0)
        goto nomem;
    rc = emit(v, dl, sel, nsel, NULL, !l2, res, err);
    goto out;
nomem:
    rc = tsr_err(err, TSR_ENOMEM, "out of memory for the candidates");
out:
    dfilter_close(&df);
    tsr__scan_cache_close(&own); /* a query without a call's cache: its own scanner */
    tsr_topk_close(&heap);
    tsr_crowd_topk_close(&crowd);
    free(hits);
    free(sel);
    free(rows);
    return rc;
}

/* The exact sparse dot product of the query with a datapoint (both sorted by dimension),
 * summed in double in query-dimension order as common/query/sparse does; 0 when they
 * share no dimension. */
static int sparse_dot(const tsr__query *q, const tsr_datapoint *dp, float *out)
{
    double s = 0;
    int any = 0;
    for (size_t i = 0, j = 0; i < q->nsp && j < dp->nsparse;) {
        if (q->sp_dims[i] == dp->sparse_dims[j]) {
            s += (double)q->sp_vals[i] * (double)dp->sparse_vals[j];
            any = 1, i++, j++;
        } else if (q->sp_dims[i] < dp->sparse_dims[j]) {
            i++;
        } else {
            j++;
        }
    }
    *out = (float)s;
    return any;
}

/* Sparse top-k over version + delta: the base's candidates (masked ones dropped; without
 * crowding the best k + nmask suffice, with it every one) and the delta's records scored
 * exactly, through one crowded collector as common/query/sparse uses. */
static int sparse_with_delta(const tsr__version *v, const tsr__delta *dl, const tsr__query *q,
                             size_t k, tsr_hit *out, size_t *nout, tsr_error *err)
{
    size_t c = q->crowd && q->crowd < k ? q->crowd : 0, nb = 0;
    tsr_hit *b = NULL;
    tsr_crowd_topk top;
    dfilter df = {q, NULL, NULL, NULL, 0};
    int rc = 0;
    if (tsr_crowd_topk_init(&top, k, c, 1) != 0)
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu sparse results", k);
    if (v->sparse_ix && !(q->filter && tsr_filter_matches_none(q->filter))) {
        size_t kb = c ? v->nrows : k + dl->nmask;
        if (kb > v->nrows)
            kb = v->nrows;
        if ((b = tsr_try_malloc(kb ? kb : 1, sizeof *b)) == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "out of memory for %zu sparse candidates", kb);
            goto out;
        }
        if (kb && (rc = tsr_sparse_search(v->sparse_ix, q->sp_dims, q->sp_vals, q->nsp, kb, 0,
                                          q->filter, v->meta, b, &nb, err)) != 0)
            goto out;
    }
    for (size_t i = 0; i < nb && rc == 0; i++)
        if (!tsr__i64_in(dl->mask, dl->nmask, b[i].label) &&
            tsr_crowd_topk_would_enter(&top, b[i].dist, b[i].label) &&
            tsr_crowd_topk_push(&top, b[i].dist, b[i].tag, b[i].label) < 0)
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < dl->nrecs && rc == 0; i++) {
        const tsr__rec *r = dl->recs[i];
        float s;
        if (r->dp.nsparse == 0 || !sparse_dot(q, &r->dp, &s) ||
            !tsr_crowd_topk_would_enter(&top, s, r->label))
            continue;
        int m = (q->ntr || q->nnq) ? dfilter_match(&df, r) : 1;
        if (m < 0 || (m > 0 && tsr_crowd_topk_push(&top, s, r->tag, r->label) < 0))
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    if (rc == 0)
        *nout = tsr_crowd_topk_extract(&top, out);
out:
    dfilter_close(&df);
    tsr_crowd_topk_close(&top);
    free(b);
    return rc;
}

static int sparse_part(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                       tsr_error *err)
{
    size_t k = q->sparse_k ? q->sparse_k : q->k;
    const tsr__delta *dl = tsr__delta_empty(q->delta) ? NULL : q->delta;
    if (dl == NULL && (v->sparse_ix == NULL || (q->filter && tsr_filter_matches_none(q->filter))))
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
    int rc = dl ? sparse_with_delta(v, dl, q, k, out, &n, err)
                : tsr_sparse_search(v->sparse_ix, q->sp_dims, q->sp_vals, q->nsp, k, q->crowd,
                                    q->filter, v->meta, out, &n, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint32_t row;
        if (row_of(v, dl, out[i].label, &row) != 0) {
            rc = tsr_err(err, TSR_EINTERNAL, "sparse hit label %lld has no row",
                         (long long)out[i].label);
            break;
        }
        res->sparse[res->nsparse++] = (tsr__hit){out[i].label, out[i].dist, row};
    }
    free(out);
    return rc;
}

void tsr__scan_cache_close(tsr__scan_cache *c)
{
    tsr_ivfpq_scanner_destroy(c->sc);
    c->sc = NULL;
    c->ix = NULL;
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
