/*
 * sparse — inverted index build (counting sort of the nonzeros by dimension into CSR)
 * and exact dot-product search (interface in sparse.h).
 *
 * Search accumulates each candidate row's score in double, in query order, so the result
 * does not depend on the index layout. The accumulator is a dense array over all rows
 * when the query touches many postings, and a small hash table when it touches few (a
 * query on rare dimensions must not pay O(rows) for clearing an array).
 */
#include "query/sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

_Static_assert(TSR_FILTER_NOID == TSR_TOPK_NOTAG, "an untagged row must be an untagged hit");

typedef struct triple {
    int64_t dim;
    uint32_t row;
    float val;
} triple;

struct tsr_sparse_builder {
    triple *t;
    size_t n, cap;
};

struct tsr_sparse_index {
    size_t nrows;
    size_t ndims;
    int64_t *dims;  /* sorted, unique */
    size_t *off;    /* ndims + 1 offsets into rows / vals */
    uint32_t *rows; /* ascending within a dimension */
    float *vals;
};

tsr_sparse_builder *tsr_sparse_builder_create(void)
{
    return calloc(1, sizeof(tsr_sparse_builder));
}

void tsr_sparse_builder_destroy(tsr_sparse_builder *b)
{
    if (b == NULL)
        return;
    free(b->t);
    free(b);
}

typedef struct dim_idx {
    int64_t dim;
    size_t idx;
} dim_idx;

static int cmp_dim_idx(const void *a, const void *b)
{
    const dim_idx *x = a, *y = b;
    if (x->dim != y->dim)
        return x->dim < y->dim ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

int tsr_sparse_builder_add(tsr_sparse_builder *b, uint32_t row, const int64_t *dims,
                           const float *vals, size_t n, tsr_error *err)
{
    if (row == UINT32_MAX)
        return tsr_err(err, TSR_EINVAL, "sparse: row %u out of range", row);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(vals[i]))
            return tsr_err(err, TSR_EINVAL, "sparse: row %u dimension %lld has non-finite value",
                           row, (long long)dims[i]);
    if (b->cap - b->n < n) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc - b->n < n) {
            if (nc > SIZE_MAX / 2 / sizeof(triple))
                return tsr_err(err, TSR_ENOMEM, "sparse: too many nonzeros");
            nc *= 2;
        }
        triple *t = tsr_try_realloc(b->t, nc, sizeof *t);
        if (t == NULL)
            return tsr_err(err, TSR_ENOMEM, "sparse: out of memory for %zu nonzeros", nc);
        b->t = t;
        b->cap = nc;
    }
    int sorted = 1;
    for (size_t i = 1; i < n && sorted; i++)
        sorted = dims[i] > dims[i - 1];
    if (sorted) {
        for (size_t i = 0; i < n; i++)
            b->t[b->n++] = (triple){dims[i], row, vals[i]};
        return 0;
    }
    /* Unsorted or with duplicates: sum duplicate dims in input order (like
     * tsr_datapoint_normalize_sparse), so the stored value does not depend on qsort. */
    dim_idx *p = tsr_try_malloc(n, sizeof *p);
    if (p == NULL)
        return tsr_err(err, TSR_ENOMEM, "sparse: out of memory for %zu dims", n);
    for (size_t i = 0; i < n; i++)
        p[i] = (dim_idx){dims[i], i};
    qsort(p, n, sizeof *p, cmp_dim_idx);
    for (size_t i = 0; i < n;) {
        float v = 0.0f;
        size_t j = i;
        for (; j < n && p[j].dim == p[i].dim; j++)
            v += vals[p[j].idx];
        b->t[b->n++] = (triple){p[i].dim, row, v};
        i = j;
    }
    free(p);
    return 0;
}

void tsr_sparse_index_destroy(tsr_sparse_index *ix)
{
    if (ix == NULL)
        return;
    free(ix->dims);
    free(ix->off);
    free(ix->rows);
    free(ix->vals);
    free(ix);
}

/* int64 dim -> dense id, open addressing; grows at load 1/2 */
typedef struct dimmap {
    int64_t *key;
    uint32_t *id; /* UINT32_MAX = empty */
    size_t mask, n;
} dimmap;

static inline size_t dim_hash(int64_t d)
{
    uint64_t z = (uint64_t)d * 0x9e3779b97f4a7c15ull;
    return (size_t)(z ^ (z >> 29));
}

static int dimmap_init(dimmap *m, size_t slots)
{
    m->key = tsr_try_malloc(slots, sizeof *m->key);
    m->id = tsr_try_malloc(slots, sizeof *m->id);
    if (!m->key || !m->id) {
        free(m->key);
        free(m->id);
        return TSR_ENOMEM;
    }
    memset(m->id, 0xff, slots * sizeof *m->id);
    m->mask = slots - 1;
    m->n = 0;
    return 0;
}

static size_t dimmap_slot(const dimmap *m, int64_t d)
{
    size_t i = dim_hash(d) & m->mask;
    while (m->id[i] != UINT32_MAX && m->key[i] != d)
        i = (i + 1) & m->mask;
    return i;
}

static int dimmap_grow(dimmap *m)
{
    dimmap g;
    if ((m->mask + 1) > SIZE_MAX / 4 || dimmap_init(&g, (m->mask + 1) * 2) != 0)
        return TSR_ENOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->id[i] != UINT32_MAX) {
            size_t j = dimmap_slot(&g, m->key[i]);
            g.key[j] = m->key[i];
            g.id[j] = m->id[i];
        }
    g.n = m->n;
    free(m->key);
    free(m->id);
    *m = g;
    return 0;
}

typedef struct posting {
    uint32_t row;
    float val;
} posting;

static int cmp_posting(const void *a, const void *b)
{
    uint32_t x = ((const posting *)a)->row, y = ((const posting *)b)->row;
    return (x > y) - (x < y);
}

typedef struct dim_rank {
    int64_t dim;
    uint32_t id;
} dim_rank;

static int cmp_dim_rank(const void *a, const void *b)
{
    int64_t x = ((const dim_rank *)a)->dim, y = ((const dim_rank *)b)->dim;
    return (x > y) - (x < y);
}

/* Build in O(M + D log D) for M nonzeros over D distinct dims: map dims to dense ids with
 * a hash table, counting-sort the nonzeros by id (stable, so rows stay in insertion order,
 * which is ascending when rows are added in order), sort only the D distinct dims, and
 * sort a posting list by row only when it is not already ascending. */
int tsr_sparse_builder_finish(tsr_sparse_builder *b, size_t nrows, tsr_sparse_index **out,
                              tsr_error *err)
{
    int rc = 0;
    size_t M = b->n;
    uint32_t *ids = NULL;
    size_t *cnt = NULL;
    dim_rank *dr = NULL;
    posting *pl = NULL;
    dimmap dm = {0};
    tsr_sparse_index *ix = NULL;
    *out = NULL;
    for (size_t i = 0; i < M; i++)
        if (b->t[i].row >= nrows)
            return tsr_err(err, TSR_EINVAL, "sparse: row %u added but the index has %zu rows",
                           b->t[i].row, nrows);
    if (dimmap_init(&dm, 1024) != 0)
        goto nomem;
    ids = tsr_try_malloc(M ? M : 1, sizeof *ids);
    if (ids == NULL)
        goto nomem;
    for (size_t i = 0; i < M; i++) {
        size_t s = dimmap_slot(&dm, b->t[i].dim);
        if (dm.id[s] == UINT32_MAX) {
            if (dm.n >= UINT32_MAX - 1) {
                rc = tsr_err(err, TSR_ELIMIT, "sparse: too many distinct dimensions");
                goto fail;
            }
            dm.key[s] = b->t[i].dim;
            dm.id[s] = (uint32_t)dm.n++;
            if (dm.n * 2 > dm.mask + 1) {
                if (dimmap_grow(&dm) != 0)
                    goto nomem;
                s = dimmap_slot(&dm, b->t[i].dim);
            }
        }
        ids[i] = dm.id[s];
    }
    size_t D = dm.n;
    dr = tsr_try_malloc(D ? D : 1, sizeof *dr);
    cnt = tsr_try_calloc(D + 1, sizeof *cnt);
    pl = tsr_try_malloc(M ? M : 1, sizeof *pl);
    ix = calloc(1, sizeof *ix);
    if (!dr || !cnt || !pl || !ix)
        goto nomem;
    for (size_t i = 0; i <= dm.mask; i++)
        if (dm.id[i] != UINT32_MAX)
            dr[dm.id[i]] = (dim_rank){dm.key[i], dm.id[i]};
    if (D > 1)
        qsort(dr, D, sizeof *dr, cmp_dim_rank);
    /* renumber the ids by the dims' sorted order, counting nonzeros per dim */
    uint32_t *rank = tsr_try_malloc(D ? D : 1, sizeof *rank);
    if (rank == NULL)
        goto nomem;
    for (size_t r = 0; r < D; r++)
        rank[dr[r].id] = (uint32_t)r;
    for (size_t i = 0; i < M; i++) {
        ids[i] = rank[ids[i]];
        cnt[ids[i] + 1]++;
    }
    free(rank);
    for (size_t r = 0; r < D; r++)
        cnt[r + 1] += cnt[r];
    /* cnt[r] = start of dim rank r; place stably using a moving cursor copy */
    ix->off = tsr_try_malloc(D + 1, sizeof *ix->off);
    if (ix->off == NULL)
        goto nomem;
    memcpy(ix->off, cnt, (D + 1) * sizeof *cnt);
    for (size_t i = 0; i < M; i++)
        pl[cnt[ids[i]]++] = (posting){b->t[i].row, b->t[i].val};
    /* per list: sort by row when needed, sum repeated rows, compact */
    ix->dims = tsr_try_malloc(D ? D : 1, sizeof *ix->dims);
    ix->rows = tsr_try_malloc(M ? M : 1, sizeof *ix->rows);
    ix->vals = tsr_try_malloc(M ? M : 1, sizeof *ix->vals);
    if (!ix->dims || !ix->rows || !ix->vals)
        goto nomem;
    size_t w = 0;
    for (size_t r = 0; r < D; r++) {
        size_t lo = ix->off[r], hi = ix->off[r + 1];
        int sorted = 1;
        for (size_t i = lo + 1; i < hi && sorted; i++)
            sorted = pl[i].row > pl[i - 1].row;
        if (!sorted)
            qsort(pl + lo, hi - lo, sizeof *pl, cmp_posting);
        ix->dims[r] = dr[r].dim;
        ix->off[r] = w;
        for (size_t i = lo; i < hi; i++) {
            if (w > ix->off[r] && ix->rows[w - 1] == pl[i].row) {
                ix->vals[w - 1] += pl[i].val;
                continue;
            }
            ix->rows[w] = pl[i].row;
            ix->vals[w] = pl[i].val;
            w++;
        }
    }
    ix->off[D] = w;
    ix->ndims = D;
    ix->nrows = nrows;
    b->n = 0;
    *out = ix;
    ix = NULL;
    goto done;
nomem:
    rc = tsr_err(err, TSR_ENOMEM, "sparse: out of memory building an index of %zu nonzeros", M);
fail:
    tsr_sparse_index_destroy(ix);
done:
    free(ids);
    free(cnt);
    free(dr);
    free(pl);
    free(dm.key);
    free(dm.id);
    return rc;
}

int tsr_sparse_index_build(const tsr_datapoint *dps, size_t n, tsr_sparse_index **out,
                           tsr_error *err)
{
    int rc;
    *out = NULL;
    if (n >= UINT32_MAX)
        return tsr_err(err, TSR_ELIMIT, "sparse: %zu rows is too many", n);
    tsr_sparse_builder *b = tsr_sparse_builder_create();
    if (b == NULL)
        return tsr_err(err, TSR_ENOMEM, "sparse: out of memory");
    for (size_t i = 0; i < n; i++)
        if ((rc = tsr_sparse_builder_add(b, (uint32_t)i, dps[i].sparse_dims, dps[i].sparse_vals,
                                         dps[i].nsparse, err)) != 0)
            goto done;
    rc = tsr_sparse_builder_finish(b, n, out, err);
done:
    tsr_sparse_builder_destroy(b);
    return rc;
}

size_t tsr_sparse_index_rows(const tsr_sparse_index *ix)
{
    return ix->nrows;
}

size_t tsr_sparse_index_nnz(const tsr_sparse_index *ix)
{
    return ix->off[ix->ndims];
}

size_t tsr_sparse_index_ndims(const tsr_sparse_index *ix)
{
    return ix->ndims;
}

/* index of dim in ix->dims or SIZE_MAX */
static size_t find_dim(const tsr_sparse_index *ix, int64_t dim)
{
    size_t lo = 0, hi = ix->ndims;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->dims[mid] < dim)
            lo = mid + 1;
        else if (ix->dims[mid] > dim)
            hi = mid;
        else
            return mid;
    }
    return SIZE_MAX;
}

/* Accumulator: dense (score per row + seen flags) or hashed (row -> score). Both keep the
 * list of touched rows in first-touch order. */
typedef struct accum {
    int dense;
    double *score;   /* dense: nrows; hashed: slots */
    uint8_t *seen;   /* dense only */
    uint32_t *key;   /* hashed only: row + 1, 0 = empty */
    size_t mask;
    uint32_t *touched;
    size_t ntouched;
} accum;

static void accum_close(accum *a)
{
    free(a->score);
    free(a->seen);
    free(a->key);
    free(a->touched);
}

static int accum_init(accum *a, size_t nrows, size_t postings)
{
    memset(a, 0, sizeof *a);
    size_t maxt = postings < nrows ? postings : nrows;
    a->touched = tsr_try_malloc(maxt ? maxt : 1, sizeof *a->touched);
    if (a->touched == NULL)
        return TSR_ENOMEM;
    if (postings * 8 >= nrows) {
        a->dense = 1;
        a->score = tsr_try_calloc(nrows ? nrows : 1, sizeof *a->score);
        a->seen = tsr_try_calloc(nrows ? nrows : 1, 1);
        return a->score && a->seen ? 0 : TSR_ENOMEM;
    }
    size_t slots = 16;
    while (slots < 2 * postings)
        slots *= 2;
    a->mask = slots - 1;
    a->score = tsr_try_malloc(slots, sizeof *a->score);
    a->key = tsr_try_calloc(slots, sizeof *a->key);
    return a->score && a->key ? 0 : TSR_ENOMEM;
}

static inline void accum_add(accum *a, uint32_t row, double v)
{
    if (a->dense) {
        if (!a->seen[row]) {
            a->seen[row] = 1;
            a->touched[a->ntouched++] = row;
        }
        a->score[row] += v;
        return;
    }
    size_t i = (size_t)(((uint64_t)row * 0x9e3779b97f4a7c15ull) >> 32) & a->mask;
    for (;;) {
        if (a->key[i] == row + 1) {
            a->score[i] += v;
            return;
        }
        if (a->key[i] == 0) {
            a->key[i] = row + 1;
            a->score[i] = v;
            a->touched[a->ntouched++] = (uint32_t)i; /* hashed: the slot */
            return;
        }
        i = (i + 1) & a->mask;
    }
}

int tsr_sparse_search(const tsr_sparse_index *ix, const int64_t *qdims, const float *qvals,
                      size_t nq, size_t k, size_t c, const tsr_filter *filter,
                      const tsr_filter_meta *meta, tsr_hit *out, size_t *nout,
                      tsr_error *err)
{
    int rc = 0;
    *nout = 0;
    if (filter != NULL && meta == NULL)
        return tsr_err(err, TSR_EINVAL, "sparse search: a filter needs the rows' metadata");
    if (meta != NULL && tsr_filter_meta_rows(meta) < ix->nrows)
        return tsr_err(err, TSR_EINVAL, "sparse search: metadata has %zu rows, index %zu",
                       tsr_filter_meta_rows(meta), ix->nrows);
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(qvals[i]))
            return tsr_err(err, TSR_EINVAL, "sparse search: query dimension %lld has a non-finite value",
                           (long long)qdims[i]);
    if (k == 0 || nq == 0 || tsr_filter_matches_none(filter))
        return 0;

    size_t postings = 0;
    for (size_t i = 0; i < nq; i++) {
        size_t d = find_dim(ix, qdims[i]);
        if (d != SIZE_MAX)
            postings += ix->off[d + 1] - ix->off[d];
    }
    if (postings == 0)
        return 0;

    accum a;
    tsr_crowd_topk top;
    int have_top = 0;
    if (accum_init(&a, ix->nrows, postings) != 0) {
        rc = tsr_err(err, TSR_ENOMEM, "sparse search: out of memory for %zu postings", postings);
        goto done;
    }
    for (size_t i = 0; i < nq; i++) {
        size_t d = find_dim(ix, qdims[i]);
        if (d == SIZE_MAX)
            continue;
        double q = qvals[i];
        for (size_t p = ix->off[d]; p < ix->off[d + 1]; p++)
            accum_add(&a, ix->rows[p], q * (double)ix->vals[p]);
    }
    /* no more hits than touched rows: a huge k must not allocate a huge heap (decide
     * "c >= k means no limit" on the k asked for, before clamping) */
    if (c >= k)
        c = 0;
    if (k > a.ntouched)
        k = a.ntouched;
    if (tsr_crowd_topk_init(&top, k, c, 1) != 0) {
        rc = tsr_err(err, TSR_ENOMEM, "sparse search: out of memory for k = %zu", k);
        goto done;
    }
    have_top = 1;
    int check = !tsr_filter_matches_all(filter);
    for (size_t t = 0; t < a.ntouched; t++) {
        uint32_t row;
        double s;
        if (a.dense) {
            row = a.touched[t];
            s = a.score[row];
        } else {
            row = a.key[a.touched[t]] - 1;
            s = a.score[a.touched[t]];
        }
        float dist = (float)s;
        int64_t label = meta ? tsr_filter_meta_label(meta, row) : (int64_t)row;
        if (!tsr_crowd_topk_would_enter(&top, dist, label))
            continue;
        if (check && !tsr_filter_match(filter, meta, row))
            continue;
        uint32_t tag = meta ? tsr_filter_meta_crowding(meta, row) : 0;
        if (tsr_crowd_topk_push(&top, dist, tag, label) < 0) {
            rc = tsr_err(err, TSR_ENOMEM, "sparse search: out of memory");
            goto done;
        }
    }
    *nout = tsr_crowd_topk_extract(&top, out);
done:
    if (have_top)
        tsr_crowd_topk_close(&top);
    accum_close(&a);
    return rc;
}
