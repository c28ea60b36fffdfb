/*
 * scan — one query on one version snapshot: the ADC scan of the probed lists with the
 * compiled filter, the local crowded top-k, the optional exact re-rank with the stored raw
 * vectors, and the exact sparse dot-product top-k over all the version's datapoints
 * (common/sparse's inverted index, built per version).
 *
 * The distance maths is Faiss's IndexIVFPQ::search_preassigned (SPEC §1): for L2 with
 * by_residual, dis = coarse_dis + Σ_m (T[list][m][c_m] - 2<x_m, c_m c>) with Faiss's
 * precomputed table type 1 (summed in float, in sub-quantizer order, as Faiss does); for
 * inner product dis = coarse_dis + Σ <x_m, c_m c>; without by_residual dis0 = 0. A query's
 * coarse distances come from the coordinator, so the shard computes exactly what Faiss
 * computes for the same lists.
 *
 * Crowding (SPEC §3): the answer is the greedy pass over the filtered candidates in
 * distance order, skipping a candidate whose tag already has `crowd` results; an
 * untagged datapoint is never limited (TSR_TOPK_NOTAG, as in common/topk). A shard's
 * greedy answer contains every item of the global greedy answer that lives on it, so the
 * coordinator's merge is exact. Without crowding and re-rank a bounded heap of k is kept;
 * with re-rank a heap of `candidates`; with crowding and no re-rank all filtered
 * candidates are kept, sorted, then passed greedily (exact, O(n log n) in the candidates).
 *
 * Thread-safety: reads only immutable snapshot data; everything else is per call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "shard.h"
#include "sparse.h"
#include "topk.h"

/* A candidate's sort key: smaller is better (score = dist for L2, -dist for IP). */
typedef struct cand {
    float s;
    int64_t label;
    uint32_t row;
} cand;

static inline int worse(const cand *a, const cand *b)
{
    return a->s > b->s || (a->s == b->s && a->label > b->label);
}

typedef struct coll {
    cand *c;
    size_t n, cap;
    size_t bound; /* 0 = unbounded (keep all) */
    int oom;
} coll;

static void heap_down(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && worse(&h[l], &h[w]))
            w = l;
        if (r < n && worse(&h[r], &h[w]))
            w = r;
        if (w == i)
            return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void heap_up(cand *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!worse(&h[i], &h[p]))
            return;
        cand t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* Would x enter the collection? (Checked before the filter, which costs more.) */
static inline int coll_wants(const coll *c, float s, int64_t label)
{
    if (c->bound == 0 || c->n < c->bound)
        return 1;
    cand x = {s, label, 0};
    return worse(&c->c[0], &x);
}

static void coll_add(coll *c, float s, int64_t label, uint32_t row)
{
    cand x = {s, label, row};
    if (c->bound && c->n == c->bound) {
        c->c[0] = x;
        heap_down(c->c, c->n, 0);
        return;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        cand *p = tsr_try_realloc(c->c, cap, sizeof *p);
        if (p == NULL) {
            c->oom = 1;
            return;
        }
        c->c = p, c->cap = cap;
    }
    c->c[c->n++] = x;
    if (c->bound)
        heap_up(c->c, c->n - 1);
}

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->s != y->s)
        return x->s < y->s ? -1 : 1;
    return x->label < y->label ? -1 : x->label > y->label;
}

/* Tag counts for the greedy pass: open addressing over at most `want` distinct tags. */
typedef struct tagcount {
    uint32_t *keys, *vals;
    size_t mask;
} tagcount;

static int tc_init(tagcount *t, size_t want)
{
    size_t cap = 16;
    while (cap < 2 * want + 2)
        cap *= 2;
    t->keys = tsr_try_malloc(cap, sizeof(uint32_t));
    t->vals = tsr_try_calloc(cap, sizeof(uint32_t));
    t->mask = cap - 1;
    if (!t->keys || !t->vals)
        return TSR_ENOMEM;
    memset(t->keys, 0xff, cap * sizeof(uint32_t));
    return 0;
}

static uint32_t *tc_slot(tagcount *t, uint32_t key)
{
    size_t i = (key * 2654435761u) & t->mask;
    while (t->keys[i] != UINT32_MAX && t->keys[i] != key)
        i = (i + 1) & t->mask;
    t->keys[i] = key;
    return &t->vals[i];
}

/* Sorts c and keeps the greedy crowded prefix of at most k into hits. */
static int finalize(const tsr__version *v, coll *c, size_t k, uint32_t crowd, int negate,
                    tsr__hit **hits, size_t *nhits)
{
    if (c->n > 1)
        qsort(c->c, c->n, sizeof(cand), cand_cmp);
    size_t take = c->n < k ? c->n : k;
    *hits = tsr_try_malloc(take ? take : 1, sizeof(tsr__hit));
    if (*hits == NULL)
        return TSR_ENOMEM;
    *nhits = 0;
    tagcount tc = {0};
    if (crowd && crowd < k && tc_init(&tc, take) != 0) {
        free(tc.keys);
        free(tc.vals);
        return TSR_ENOMEM;
    }
    for (size_t i = 0; i < c->n && *nhits < k; i++) {
        uint32_t tag = tc.keys ? tsr_filter_meta_crowding(v->meta, c->c[i].row) : TSR_TOPK_NOTAG;
        if (tag != TSR_TOPK_NOTAG) {
            /* An untagged datapoint is never limited (TSR_TOPK_NOTAG, as common/topk). */
            uint32_t *cnt = tc_slot(&tc, tag);
            if (*cnt >= crowd)
                continue;
            (*cnt)++;
        }
        tsr__hit *h = &(*hits)[(*nhits)++];
        h->label = c->c[i].label;
        h->dist = negate ? -c->c[i].s : c->c[i].s;
        h->row = c->c[i].row;
    }
    free(tc.keys);
    free(tc.vals);
    return 0;
}

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

static int dense_part(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                      tsr_error *err)
{
    const tsr__tmpl *t = v->tmpl;
    const tsr_ivfpq *ix = t->ix;
    const tsr_pq *pq = &ix->pq;
    size_t M = pq->M, ksub = pq->ksub, dsub = pq->dsub, d = (size_t)ix->d;
    size_t mk = M * ksub;
    int l2 = ix->metric == TSR_METRIC_L2;
    int rc = 0;
    float *ipx = tsr_try_malloc(mk, sizeof(float));
    float *tab = tsr_try_malloc(mk, sizeof(float));
    float *resid = tsr_try_malloc(d, sizeof(float));
    coll c = {0};
    if (!ipx || !tab || !resid) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for the ADC tables");
        goto out;
    }
    size_t rerank = q->candidates ? (q->candidates > q->k ? q->candidates : q->k) : 0;
    c.bound = rerank ? rerank : (q->crowd && q->crowd < q->k ? 0 : q->k);
    /* <x_m, c_mj> once per query (Faiss's compute_inner_prod_table). */
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < ksub; j++) {
            const float *cc = pq->centroids + (m * ksub + j) * dsub;
            const float *xm = q->x + m * dsub;
            float s = 0;
            for (size_t k = 0; k < dsub; k++)
                s += xm[k] * cc[k];
            ipx[m * ksub + j] = s;
        }
    if (!l2) {
        memcpy(tab, ipx, mk * sizeof(float));
    } else if (!ix->by_residual) {
        for (size_t j = 0; j < mk; j++)
            tab[j] = t->cnorm[j] - 2.0f * ipx[j];
    }
    int filtered = q->filter && !tsr_filter_matches_all(q->filter);
    if (q->filter && tsr_filter_matches_none(q->filter))
        goto finish;
    for (size_t p = 0; p < q->nprobe; p++) {
        size_t li = (size_t)q->lists[p];
        const tsr__list *l = v->lists[li];
        if (l == NULL || l->n == 0)
            continue;
        float dis0 = ix->by_residual ? q->coarse[p] : 0.0f;
        if (l2 && ix->by_residual) {
            if (t->ptab) {
                const float *T = t->ptab + li * mk;
                for (size_t j = 0; j < mk; j++)
                    tab[j] = T[j] - 2.0f * ipx[j];
            } else {
                /* Faiss without a precomputed table: residual table, dis0 = 0. */
                const float *yc = ix->centroids + li * d;
                for (size_t k = 0; k < d; k++)
                    resid[k] = q->x[k] - yc[k];
                for (size_t m = 0; m < M; m++)
                    for (size_t j = 0; j < ksub; j++) {
                        const float *cc = pq->centroids + (m * ksub + j) * dsub;
                        float s = 0;
                        for (size_t k = 0; k < dsub; k++) {
                            float r = resid[m * dsub + k] - cc[k];
                            s += r * r;
                        }
                        tab[m * ksub + j] = s;
                    }
                dis0 = 0.0f;
            }
        }
        size_t row0 = v->row0[li];
        const size_t cs = ix->code_size;
        for (size_t j = 0; j < l->n; j++) {
            const uint8_t *code = l->codes + j * cs;
            float dis = dis0;
            const float *tb = tab;
            if (pq->nbits == 8) {
                for (size_t m = 0; m < M; m++, tb += ksub)
                    dis += tb[code[m]];
            } else {
                for (size_t m = 0; m < M; m++, tb += ksub)
                    dis += tb[tsr_pq_code_get(code, m, pq->nbits)];
            }
            float s = l2 ? dis : -dis;
            int64_t label = l->ids[j];
            if (!coll_wants(&c, s, label))
                continue;
            uint32_t row = (uint32_t)(row0 + j);
            if (filtered && !tsr_filter_match(q->filter, v->meta, row))
                continue;
            res->passed++;
            coll_add(&c, s, label, row);
        }
        res->codes_scanned += (int64_t)l->n;
    }
    if (c.oom) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for the candidates");
        goto out;
    }
    if (rerank) {
        for (size_t i = 0; i < c.n; i++) {
            const float *y = v->row_rec[c.c[i].row]->dp.dense;
            float s = 0;
            if (l2) {
                for (size_t k = 0; k < d; k++) {
                    float df = q->x[k] - y[k];
                    s += df * df;
                }
            } else {
                for (size_t k = 0; k < d; k++)
                    s += q->x[k] * y[k];
                s = -s;
            }
            c.c[i].s = s;
        }
    }
finish:
    if (finalize(v, &c, q->k, q->crowd, !l2, &res->dense, &res->ndense) != 0)
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
out:
    free(ipx);
    free(tab);
    free(resid);
    free(c.c);
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
     * crowding pass (common/sparse); rows are this version's filter rows. */
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
