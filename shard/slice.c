/*
 * slice — the shard's version snapshots: the shared pieces (template, lists, records),
 * building version N+1 from N plus an edit set (copy-on-write per list), and the on-disk
 * form of a version (slice.faiss, meta, vectors.f32; the MANIFEST and the atomic directory commit are
 * common/store/store's). The datapoint <-> protobuf conversions and the validation of
 * edits are convert.c's.
 *
 * On-disk "meta" (little-endian, written raw):
 *   "TSRM" | u32 format = 1 | i64 version | u32 d | u64 nowned | i32 owned[nowned]
 *   | u64 nrecs | nrecs x (u32 len | StagedUpsert protobuf of len bytes)
 * where each StagedUpsert carries label, list and the datapoint without its dense
 * vector. "vectors.f32" holds the dense vectors of the records with list >= 0, d floats
 * each, in meta order. slice.faiss is a complete Faiss IwPQ file (all nlist centroids,
 * only this shard's lists filled); its lists hold the codes, the vectors the raw values
 * for exact re-rank.
 *
 * A built version is immutable; see shard.h for the sharing and thread rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index/faiss_io.h"
#include "index/ivfpq_search.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/parallel.h"
#include "core/log.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/pb_datapoint.h"
#include "shard.h"
#include "query/sparse.h"

/* ------------------------------------------------------------------ shared pieces */

tsr__tmpl *tsr__tmpl_from_index(tsr_ivfpq *ix, tsr_error *err)
{
    tsr__tmpl *t = calloc(1, sizeof *t);
    if (t == NULL) {
        tsr_ivfpq_destroy(ix);
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    atomic_init(&t->refs, 1);
    t->ix = ix;
    /* Lists of a template are never used: every version has its own list pointers. */
    for (size_t i = 0; i < ix->nlist; i++) {
        free(ix->lists[i].codes);
        free(ix->lists[i].ids);
        memset(&ix->lists[i], 0, sizeof ix->lists[i]);
    }
    ix->ntotal = 0;
    const tsr_pq *pq = &ix->pq;
    if ((t->enc = tsr_pq_encoder_create(pq, err)) == NULL) {
        tsr__tmpl_unref(t);
        return NULL;
    }
    /* The scanner cache (transposed PQ centroids) now rather than under the first query
     * (a template without quantizers fails later, at its first scan). */
    if (ix->pq.centroids && ix->centroids && tsr_ivfpq_search_prepare(ix, err) != 0) {
        tsr__tmpl_unref(t);
        return NULL;
    }
    return t;
}

tsr__tmpl *tsr__tmpl_ref(tsr__tmpl *t)
{
    if (t)
        atomic_fetch_add(&t->refs, 1);
    return t;
}

void tsr__tmpl_unref(tsr__tmpl *t)
{
    if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    if (t->ptab)
        for (size_t i = 0; i < t->ix->nlist; i++)
            free(t->ptab[i]);
    free(t->ptab);
    tsr_pq_encoder_destroy(t->enc);
    tsr_ivfpq_destroy(t->ix);
    free(t);
}

static tsr__list *list_ref(tsr__list *l)
{
    if (l)
        atomic_fetch_add(&l->refs, 1);
    return l;
}

void tsr__list_unref(tsr__list *l)
{
    if (l == NULL || atomic_fetch_sub(&l->refs, 1) != 1)
        return;
    free(l->codes);
    free(l->ids);
    free(l->term);
    tsr_ivfpq_flist_free(l->fl);
    free(l);
}

/* 1 when lists keep their codes in Faiss order (TSR_SHARD_CODES=faiss: the layout before
 * the scan blocks became the only copy; for comparisons), read at each list build. */
static int codes_faiss_order(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SHARD_CODES);
    return e != NULL && strcmp(e, "faiss") == 0;
}

/* The per-code ADC terms and the scan blocks of a list just filled (see tsr__list): built
 * once, when the list version is made (a version load or a build), and shared by every
 * version that keeps the list. The blocks replace codes and term (freed) when they can be
 * built. */
static int list_terms(const tsr__tmpl *t, size_t list, tsr__list *l, tsr_error *err)
{
    if (l->n == 0)
        return 0;
    if (tsr_ivfpq_has_terms(t->ix)) {
        l->term = tsr_try_malloc(l->n, sizeof(float));
        if (l->term == NULL)
            return tsr_err(err, TSR_ENOMEM, "out of memory for the terms of list %zu (%zu "
                           "codes)", list, l->n);
        int rc = tsr_ivfpq_list_terms(t->ix, list, l->codes, l->n, l->term, err);
        if (rc != 0)
            return rc;
    }
    if (codes_faiss_order())
        return 0;
    int rc = tsr_ivfpq_flist_build(t->ix, l->codes, l->n, l->term, &l->fl, err);
    if (rc == 0 && l->fl != NULL) {
        free(l->codes);
        free(l->term);
        l->codes = NULL, l->term = NULL;
    }
    return rc;
}

/* Code j of list l (code_size cs) into out, from whichever copy l holds. */
static void list_code(const tsr__list *l, size_t j, size_t cs, uint8_t *out)
{
    if (l->fl != NULL)
        tsr_ivfpq_flist_codes(l->fl, j, 1, out, NULL);
    else
        memcpy(out, l->codes + j * cs, cs);
}

tsr__rec *tsr__rec_ref(tsr__rec *r)
{
    if (r)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

void tsr__rec_unref(tsr__rec *r)
{
    if (r == NULL || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    if (r->vmap != NULL) { /* the vector is the mapping's, not the record's */
        r->dp.dense = NULL;
        tsr__vmap_unref(r->vmap);
    }
    tsr_datapoint_close(&r->dp);
    free(r);
}

static atomic_ullong vmap_live; /* bytes of live mappings (tsr__vmap_bytes) */

tsr__vmap *tsr__vmap_ref(tsr__vmap *m)
{
    if (m)
        atomic_fetch_add(&m->refs, 1);
    return m;
}

void tsr__vmap_unref(tsr__vmap *m)
{
    if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    munmap(m->base, m->len);
    atomic_fetch_sub(&vmap_live, (unsigned long long)m->len);
    free(m);
}

uint64_t tsr__vmap_bytes(void)
{
    return atomic_load(&vmap_live);
}

/* Maps the file at path (exactly len > 0 bytes, checked by the caller) read-only. */
static tsr__vmap *vmap_open(const char *path, size_t len, tsr_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tsr_err(err, TSR_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (p == MAP_FAILED) {
        tsr_err(err, e == ENOMEM ? TSR_ENOMEM : TSR_EIO, "%s: mmap of %zu bytes: %s", path,
                len, strerror(e));
        return NULL;
    }
    tsr__vmap *m = calloc(1, sizeof *m);
    if (m == NULL) {
        munmap(p, len);
        tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    atomic_init(&m->refs, 1);
    m->base = p, m->len = len;
    atomic_fetch_add(&vmap_live, (unsigned long long)len);
    return m;
}

/* 1 when raw vectors are copied to the heap at load (TSR_SHARD_VECTORS=heap: the former
 * way, for comparisons), read at each load. */
static int vectors_on_heap(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SHARD_VECTORS);
    return e != NULL && strcmp(e, "heap") == 0;
}

tsr__delta *tsr__delta_ref(tsr__delta *d)
{
    if (d)
        atomic_fetch_add(&d->refs, 1);
    return d;
}

void tsr__delta_unref(tsr__delta *d)
{
    if (d == NULL || atomic_fetch_sub(&d->refs, 1) != 1)
        return;
    if (d->lists)
        for (size_t i = 0; i < d->nlist; i++)
            tsr__list_unref(d->lists[i]);
    free(d->lists);
    tsr__recbuf *b = d->rbuf;
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
        for (size_t i = 0; i < b->n; i++)
            tsr__rec_unref(b->recs[i]);
        free(b->recs);
        free(b);
    }
    free(d->mask);
    free(d);
}

tsr__version *tsr__version_ref(tsr__version *v)
{
    if (v)
        atomic_fetch_add(&v->refs, 1);
    return v;
}

void tsr__version_unref(tsr__version *v)
{
    if (v == NULL || atomic_fetch_sub(&v->refs, 1) != 1)
        return;
    if (v->lists)
        for (size_t i = 0; i < v->nlist; i++)
            tsr__list_unref(v->lists[i]);
    free(v->lists);
    for (size_t i = 0; i < v->nrecs; i++)
        tsr__rec_unref(v->recs[i]);
    free(v->recs);
    free(v->owned);
    tsr_sparse_index_destroy(v->sparse_ix);
    tsr_filter_meta_destroy(v->meta);
    tsr_filter_dict_destroy(v->dict);
    free(v->row0);
    free(v->row_rec);
    tsr__delta_unref(v->delta);
    tsr_filter_dict_destroy(v->dtags);
    tsr__tmpl_unref(v->tmpl);
    free(v);
}

tsr__rec *tsr__version_find(const tsr__version *v, int64_t label)
{
    size_t lo = 0, hi = v->nrecs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t l = v->recs[mid]->label;
        if (l == label)
            return v->recs[mid];
        if (l < label)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Bytes a heap allocation costs beyond its size (glibc: an 8-byte header, 16-byte
 * rounding): counted for the two allocations of every record (the record, its string id). */
#define TSR__MALLOC_OVERHEAD 16

/* Heap bytes of one list. */
static uint64_t list_bytes(const tsr__list *l, size_t cs)
{
    return l->n * ((l->codes ? cs : 0) + sizeof(int64_t) + (l->term ? sizeof(float) : 0)) +
           tsr_ivfpq_flist_bytes(l->fl) + sizeof *l;
}

void tsr__rec_bytes(const tsr__rec *r, uint64_t *anon, uint64_t *mapped)
{
    const tsr_datapoint *dp = &r->dp;
    uint64_t vec = dp->dense ? dp->ndense * sizeof(float) : 0;
    *anon += sizeof(tsr__rec) + strlen(dp->id) + 1 + 2 * TSR__MALLOC_OVERHEAD +
             (r->vmap ? 0 : vec) + dp->nsparse * (sizeof(int64_t) + sizeof(float)) +
             dp->nrestricts * 32 + dp->nnumeric * 32 + dp->nmetadata +
             (dp->crowding_tag ? strlen(dp->crowding_tag) + 1 : 0);
    *mapped += r->vmap ? vec : 0;
}

/* O(nlist): the records' bytes are kept by finish (the version's) and tsr__delta_apply
 * (the delta's), so Stats, which the coordinator's reconcile calls about every second,
 * never walks every record (it did: ~5 % of a streaming shard's CPU at 50k records). */
void tsr__version_memory_split(const tsr__version *v, const tsr__delta *d, uint64_t *anon,
                               uint64_t *mapped)
{
    size_t cs = v->tmpl ? v->tmpl->ix->code_size : 0;
    *anon = *mapped = 0;
    for (size_t i = 0; i < v->nlist; i++) {
        if (v->lists[i])
            *anon += list_bytes(v->lists[i], cs);
        if (d && d->lists && d->lists[i])
            *anon += list_bytes(d->lists[i], cs);
    }
    /* the pointer arrays (recs, row_rec), the row starts and the filter rows */
    *anon += v->nrecs * 2 * sizeof(tsr__rec *) + (v->nlist + 1) * sizeof(size_t) +
             tsr_filter_meta_bytes(v->meta);
    *anon += v->rec_anon;
    *mapped += v->rec_mapped;
    if (d) {
        *anon += d->rec_anon;
        *mapped += d->rec_mapped;
    }
}

uint64_t tsr__version_memory(const tsr__version *v)
{
    uint64_t a, m;
    tsr__version_memory_split(v, NULL, &a, &m);
    return a + m;
}

/* Fills counts, rows and the filter metadata of v from its lists and recs; dict is the
 * dictionary to clone (NULL = a new one). */
static int finish(tsr__version *v, const tsr_filter_dict *dict, tsr_error *err)
{
    v->rec_anon = v->rec_mapped = 0;
    for (size_t i = 0; i < v->nrecs; i++)
        tsr__rec_bytes(v->recs[i], &v->rec_anon, &v->rec_mapped);
    v->dict = dict ? tsr_filter_dict_clone(dict) : tsr_filter_dict_create();
    if (v->dict == NULL || (v->meta = tsr_filter_meta_create(v->dict)) == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for the filter metadata");
    v->row0 = tsr_try_calloc(v->nlist + 1, sizeof(size_t));
    v->row_rec = tsr_try_calloc(v->nrecs ? v->nrecs : 1, sizeof(tsr__rec *));
    if (v->row0 == NULL || v->row_rec == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu rows", v->nrecs);
    /* the records' labels side by side: one look-up per list entry without a pointer
     * chase at every step (a fold at 1M: ~275,000 look-ups per shard) */
    int64_t *lab = tsr_try_malloc(v->nrecs + 1, sizeof *lab);
    if (lab == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu rows", v->nrecs);
    for (size_t i = 0; i < v->nrecs; i++)
        lab[i] = v->recs[i]->label;
    size_t row = 0;
    for (size_t i = 0; i < v->nlist; i++) {
        v->row0[i] = row;
        const tsr__list *l = v->lists[i];
        for (size_t j = 0; l && j < l->n; j++) {
            size_t x = tsr__i64_index(lab, v->nrecs, l->ids[j]);
            tsr__rec *r = x < v->nrecs ? v->recs[x] : NULL;
            if (r == NULL || r->list != (int32_t)i || row >= v->nrecs) {
                free(lab);
                return tsr_err(err, TSR_EFORMAT, "list %zu entry %zu: label %lld has no record "
                               "in that list", i, j, (long long)l->ids[j]);
            }
            v->row_rec[row++] = r;
        }
    }
    free(lab);
    v->row0[v->nlist] = row;
    v->nvectors = row;
    v->nsparse = 0;
    for (size_t i = 0; i < v->nrecs; i++) {
        tsr__rec *r = v->recs[i];
        if (r->dp.nsparse > 0)
            v->nsparse++;
        if (r->list < 0) {
            if (row >= v->nrecs)
                return tsr_err(err, TSR_EFORMAT, "record count mismatch");
            v->row_rec[row++] = r;
        }
    }
    if (row != v->nrecs)
        return tsr_err(err, TSR_EFORMAT, "%zu records but %zu rows in lists and sparse-only",
                       v->nrecs, row);
    v->nrows = row;
    for (size_t i = 0; i < row; i++) {
        uint32_t got;
        int rc = tsr_filter_meta_add(v->meta, v->row_rec[i]->label, &v->row_rec[i]->dp, &got, err);
        if (rc != 0)
            return rc;
        if (got != i)
            return tsr_err(err, TSR_EINTERNAL, "filter row %u != %zu", got, i);
    }
    if (v->nsparse == 0)
        return 0;
    tsr_sparse_builder *b = tsr_sparse_builder_create();
    if (b == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for the sparse index");
    int rc = 0;
    for (size_t i = 0; i < row && rc == 0; i++) {
        const tsr_datapoint *dp = &v->row_rec[i]->dp;
        if (dp->nsparse)
            rc = tsr_sparse_builder_add(b, (uint32_t)i, dp->sparse_dims, dp->sparse_vals,
                                        dp->nsparse, err);
    }
    if (rc == 0)
        rc = tsr_sparse_builder_finish(b, row, &v->sparse_ix, err);
    tsr_sparse_builder_destroy(b);
    return rc;
}

tsr__version *tsr__version_empty(tsr_error *err)
{
    tsr__version *v = calloc(1, sizeof *v);
    if (v == NULL) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    atomic_init(&v->refs, 1);
    if (finish(v, NULL, err) != 0) {
        tsr__version_unref(v);
        return NULL;
    }
    return v;
}

void tsr__edits_close(tsr__edits *e)
{
    for (size_t i = 0; i < e->nups; i++)
        tsr__rec_unref(e->ups[i]);
    free(e->ups);
    free(e->dels);
    free(e->drop);
    free(e->own);
    tsr__delta_unref(e->src);
    memset(e, 0, sizeof *e);
}

/* Ownership of a new version: the full set when given, else the base's plus the upserts'
 * lists; touched[] gets the upserts' lists, dropped[] the lists it stops owning. */
static void build_ownership(const tsr__version *base, const tsr__edits *e, tsr__version *v,
                            uint8_t *touched, uint8_t *dropped)
{
    if (e->have_own) {
        for (size_t i = 0; i < e->nown; i++)
            v->owned[e->own[i]] = 1;
    } else if (base->owned) {
        memcpy(v->owned, base->owned, v->nlist);
    }
    for (size_t i = 0; i < e->nups; i++)
        if (e->ups[i]->list >= 0) {
            v->owned[e->ups[i]->list] = 1;
            touched[e->ups[i]->list] = 1;
        }
    for (size_t i = 0; i < e->ndrop; i++) {
        v->owned[e->drop[i]] = 0;
        dropped[e->drop[i]] = 1;
    }
    if (base->owned)
        for (size_t i = 0; i < v->nlist; i++)
            if (base->owned[i] && !v->owned[i])
                dropped[i] = 1;
}

/* Records of a new version: base (minus removed, minus dropped lists) merged with the
 * upserts, by label; marks the lists of replaced and deleted records touched. */
static void merge_records(const tsr__version *base, const tsr__edits *e, tsr__version *v,
                          uint8_t *touched, const uint8_t *dropped)
{
    size_t bi = 0, ui = 0;
    while (bi < base->nrecs || ui < e->nups) {
        tsr__rec *b = bi < base->nrecs ? base->recs[bi] : NULL;
        tsr__rec *u = ui < e->nups ? e->ups[ui] : NULL;
        if (u && (!b || u->label <= b->label)) {
            if (b && b->label == u->label) {
                if (b->list >= 0)
                    touched[b->list] = 1;
                bi++;
            }
            v->recs[v->nrecs++] = tsr__rec_ref(u);
            ui++;
            continue;
        }
        bi++;
        if (tsr__i64_in(e->dels, e->ndels, b->label)) {
            if (b->list >= 0)
                touched[b->list] = 1;
            continue;
        }
        if (b->list >= 0 && dropped[b->list])
            continue;
        v->recs[v->nrecs++] = tsr__rec_ref(b);
    }
}

/* What the list builds of one version share: the upserts bucketed by list (those of list
 * i are e->ups[bidx[b0[i]]], ..., e->ups[bidx[b0[i + 1] - 1]], in label order), the sorted
 * labels whose base entries do not stay (every upsert's, wherever it goes, and every
 * delete), and scratch for one bucket. */
typedef struct list_plan {
    size_t *b0, *bidx;
    int64_t *gone;
    size_t ngone;
    size_t *pre; /* per upsert of the bucket: its code's index in the delta list, or SIZE_MAX */
} list_plan;

static void list_plan_close(list_plan *p)
{
    free(p->b0);
    free(p->bidx);
    free(p->gone);
    free(p->pre);
}

static int list_plan_make(const tsr__edits *e, size_t nlist, list_plan *p)
{
    memset(p, 0, sizeof *p);
    p->b0 = tsr_try_calloc(nlist + 2, sizeof *p->b0);
    p->bidx = tsr_try_malloc(e->nups + 1, sizeof *p->bidx);
    p->gone = tsr_try_malloc(e->nups + e->ndels + 1, sizeof *p->gone);
    p->pre = tsr_try_malloc(e->nups + 1, sizeof *p->pre);
    if (!p->b0 || !p->bidx || !p->gone || !p->pre)
        return TSR_ENOMEM;
    for (size_t j = 0; j < e->nups; j++) /* counts at b0[list + 2], then prefix sums */
        if (e->ups[j]->list >= 0 && (size_t)e->ups[j]->list < nlist)
            p->b0[e->ups[j]->list + 2]++;
    for (size_t i = 2; i < nlist + 2; i++)
        p->b0[i] += p->b0[i - 1];
    for (size_t j = 0; j < e->nups; j++) /* stable: label order within a list */
        if (e->ups[j]->list >= 0 && (size_t)e->ups[j]->list < nlist)
            p->bidx[p->b0[e->ups[j]->list + 1]++] = j;
    size_t a = 0, b = 0; /* both sorted and unique: merge */
    while (a < e->nups || b < e->ndels) {
        int64_t x;
        if (b >= e->ndels || (a < e->nups && e->ups[a]->label <= e->dels[b])) {
            x = e->ups[a++]->label;
            if (b < e->ndels && e->dels[b] == x)
                b++;
        } else {
            x = e->dels[b++];
        }
        p->gone[p->ngone++] = x;
    }
    return 0;
}

/* For the upserts of list i that are the base's delta records themselves (e->src holds
 * the delta, encoded with this template): pre[k] = the index of that record's code in the
 * delta's list i, so the build copies it instead of encoding the vector again. */
static void delta_codes(const tsr__edits *e, const list_plan *p, size_t i)
{
    size_t nb = p->b0[i + 1] - p->b0[i];
    const size_t *bk = p->bidx + p->b0[i];
    for (size_t k = 0; k < nb; k++)
        p->pre[k] = SIZE_MAX;
    const tsr__list *dl = e->src && e->src->lists && i < e->src->nlist ? e->src->lists[i] : NULL;
    for (size_t q = 0; dl && nb && q < dl->n; q++) {
        size_t lo = 0, hi = nb; /* the bucket is in label order */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e->ups[bk[mid]]->label < dl->ids[q])
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < nb && e->ups[bk[lo]]->label == dl->ids[q] &&
            e->ups[bk[lo]] == tsr__delta_find(e->src, dl->ids[q], NULL))
            p->pre[lo] = q;
    }
}

/* Rebuilds list i of v: the base list's entries that stay (codes copied, or re-encoded
 * from the raw vectors when the template changed), then the upserts to it in label
 * order, like Faiss's add appends (codes copied from the base's delta when it holds them,
 * same_tmpl). v->lists[i] is NULL when nothing is left. */
static int build_list(const tsr__version *base, const tsr__edits *e, const list_plan *p,
                      tsr__version *v, size_t i, int same_tmpl, tsr_error *err)
{
    const tsr__list *bl = base->lists ? base->lists[i] : NULL;
    size_t cs = v->tmpl->ix->code_size, d = (size_t)v->tmpl->ix->d;
    size_t nb = p->b0[i + 1] - p->b0[i];
    const size_t *bk = p->bidx + p->b0[i];
    size_t cap = (bl ? bl->n : 0) + nb;
    if (cap == 0)
        return 0;
    tsr__list *l = calloc(1, sizeof *l);
    if (l == NULL)
        goto nomem;
    atomic_init(&l->refs, 1);
    v->lists[i] = l;
    l->codes = tsr_try_malloc(cap, cs);
    l->ids = tsr_try_malloc(cap, sizeof(int64_t));
    if (!l->codes || !l->ids)
        goto nomem;
    for (size_t j = 0; bl && j < bl->n; j++) {
        int64_t lab = bl->ids[j];
        if (tsr__i64_in(p->gone, p->ngone, lab))
            continue;
        if (same_tmpl) {
            list_code(bl, j, cs, l->codes + l->n * cs);
        } else {
            tsr__rec *r = tsr__version_find(base, lab);
            if (r == NULL || r->dp.dense == NULL)
                return tsr_err(err, TSR_EINTERNAL, "label %lld: no raw vector to re-encode",
                               (long long)lab);
            memset(l->codes + l->n * cs, 0, cs);
            tsr__encode(v->tmpl, r->dp.dense, (int32_t)i, l->codes + l->n * cs);
        }
        l->ids[l->n++] = lab;
    }
    if (same_tmpl)
        delta_codes(e, p, i);
    for (size_t k = 0; k < nb; k++) {
        tsr__rec *u = e->ups[bk[k]];
        if (u->dp.ndense != d)
            return tsr_err(err, TSR_EINVAL, "label %lld: dense vector has %zu values, the index "
                           "dimension is %zu", (long long)u->label, u->dp.ndense, d);
        if (same_tmpl && p->pre[k] != SIZE_MAX) {
            memcpy(l->codes + l->n * cs, e->src->lists[i]->codes + p->pre[k] * cs, cs);
        } else {
            memset(l->codes + l->n * cs, 0, cs);
            tsr__encode(v->tmpl, u->dp.dense, (int32_t)i, l->codes + l->n * cs);
        }
        l->ids[l->n++] = u->label;
    }
    if (l->n == 0) {
        tsr__list_unref(l);
        v->lists[i] = NULL;
        return 0;
    }
    return list_terms(v->tmpl, i, l, err);
nomem:
    return tsr_err(err, TSR_ENOMEM, "out of memory building version %lld",
                   (long long)v->version);
}

int tsr__version_build(const tsr__version *base, tsr__tmpl *tmpl, const tsr__edits *e,
                       int64_t version, tsr__version **out, tsr_error *err)
{
    int rc = TSR_ENOMEM;
    uint8_t *touched = NULL, *dropped = NULL;
    list_plan plan = {0};
    tsr__version *v = calloc(1, sizeof *v);
    if (v == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    atomic_init(&v->refs, 1);
    v->version = version;
    v->tmpl = tsr__tmpl_ref(tmpl ? tmpl : base->tmpl);
    if (v->tmpl == NULL) {
        rc = tsr_err(err, TSR_ESTATE, "version %lld: no template (the base is empty and "
                     "chunk 0 carried no template_faiss)", (long long)version);
        goto fail;
    }
    const tsr_ivfpq *ix = v->tmpl->ix;
    size_t d = (size_t)ix->d;
    v->nlist = ix->nlist;
    int same_tmpl = base->tmpl == v->tmpl;
    if (base->tmpl && (base->nlist != v->nlist || (size_t)base->tmpl->ix->d != d)) {
        rc = tsr_err(err, TSR_EINVAL, "template shape d=%zu nlist=%zu differs from the base's "
                     "d=%d nlist=%zu", d, v->nlist, base->tmpl->ix->d, base->nlist);
        goto fail;
    }
    v->lists = tsr_try_calloc(v->nlist, sizeof(tsr__list *));
    v->owned = tsr_try_calloc(v->nlist, 1);
    touched = tsr_try_calloc(v->nlist, 1);
    dropped = tsr_try_calloc(v->nlist, 1);
    v->recs = tsr_try_malloc(base->nrecs + e->nups + 1, sizeof(tsr__rec *));
    if (!v->lists || !v->owned || !touched || !dropped || !v->recs) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory building version %lld", (long long)version);
        goto fail;
    }
    if (list_plan_make(e, v->nlist, &plan) != 0) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory building version %lld", (long long)version);
        goto fail;
    }
    build_ownership(base, e, v, touched, dropped);
    merge_records(base, e, v, touched, dropped);
    /* Lists: share what is untouched, rebuild the rest. */
    for (size_t i = 0; i < v->nlist; i++) {
        if (dropped[i] && !v->owned[i])
            continue;
        if (!touched[i] && same_tmpl) {
            v->lists[i] = list_ref(base->lists ? base->lists[i] : NULL);
            continue;
        }
        if ((rc = build_list(base, e, &plan, v, i, same_tmpl, err)) != 0)
            goto fail;
        tsr_thread_pause(); /* a paced build (core/parallel.h) rests between lists */
    }
    if ((rc = finish(v, base->dict, err)) != 0)
        goto fail;
    free(touched);
    free(dropped);
    list_plan_close(&plan);
    *out = v;
    return 0;
fail:
    free(touched);
    free(dropped);
    list_plan_close(&plan);
    tsr__version_unref(v);
    return rc;
}

/* ------------------------------------------------------------------ files */

/* Size limits of a version's files when loaded (each file is read whole).
 * vectors.f32 holds d floats for each record with a list, and those are exactly the
 * entries of slice.faiss's lists: its size is known before it is read (SLICE_VECTORS_MAX
 * only caps the product). meta holds, per record, the datapoint without its dense vector
 * (id, restricts, crowding tag, sparse values), so its size has no bound in the format
 * itself; SLICE_META_MAX allows 16M records at a generous 4 KiB each, beyond what one shard
 * holds in memory (a version is loaded whole), and refuses a wrong or damaged file before
 * allocating for it. */
#define SLICE_META_MAX ((size_t)1 << 36) /* 64 GiB */

/* Reads a whole file of a version (at most max bytes). */
static int read_all(const char *path, size_t max, uint8_t **out, size_t *n, tsr_error *err)
{
    char *b;
    int rc = tsr_file_read(path, max, 0, &b, n, err);
    *out = (uint8_t *)b;
    return rc;
}

/* vectors.f32 of v (lists loaded), at most its exact size (d floats per list entry):
 * mapped (*vm a new mapping, *out its bytes) unless it is empty or TSR_SHARD_VECTORS=heap,
 * else read whole (*vm NULL, *out owned). */
static int read_vectors(const char *path, const tsr__version *v, size_t d, uint8_t **out,
                        size_t *n, tsr__vmap **vm, tsr_error *err)
{
    size_t nvec = 0, max;
    struct stat st;
    *vm = NULL;
    for (size_t i = 0; i < v->nlist; i++)
        nvec += v->lists[i] ? v->lists[i]->n : 0;
    if (tsr_mul_ok(nvec, d * sizeof(float), &max) != 0)
        max = SIZE_MAX;
    if (!vectors_on_heap() && stat(path, &st) == 0 && st.st_size > 0 &&
        (uint64_t)st.st_size <= max) {
        if ((*vm = vmap_open(path, (size_t)st.st_size, err)) == NULL)
            return err ? err->code : TSR_EIO;
        *out = (*vm)->base, *n = (*vm)->len;
        return 0;
    }
    int rc = read_all(path, max, out, n, err);
    if (rc == TSR_ELIMIT) /* more vectors than slice.faiss has entries: a bad version */
        rc = err ? (err->code = TSR_EFORMAT) : TSR_EFORMAT;
    return rc;
}

int tsr__version_write(const tsr__version *v, const char *dir, tsr_error *err)
{
    char path[4096];
    int rc = 0;
    tsr_buf meta = TSR_BUF_INIT;
    tsr_file_writer fw = {.fd = -1}; /* slice.faiss, then vectors.f32 */
    uint8_t *tmp = NULL;
    tsr_invlist *lists = NULL;
    const tsr_ivfpq *tix = v->tmpl->ix;

    /* slice.faiss: a shallow view of the template with this version's lists. */
    tsr_ivfpq view = *tix;
    lists = tsr_try_calloc(v->nlist, sizeof *lists);
    if (lists == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    view.lists = lists;
    view.ntotal = 0;
    view.search_cache = NULL;
    /* Lists held as scan blocks get their codes back in Faiss order for the file (one
     * buffer for all of them, freed once the file is made). */
    size_t nfl = 0, cs = tix->code_size, at = 0;
    for (size_t i = 0; i < v->nlist; i++)
        if (v->lists[i] && v->lists[i]->fl)
            nfl += v->lists[i]->n;
    if (nfl > 0 && (tmp = tsr_try_malloc(nfl, cs)) == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for %zu codes to write %s/slice.faiss",
                     nfl, dir);
        goto out;
    }
    for (size_t i = 0; i < v->nlist; i++)
        if (v->lists[i]) {
            const tsr__list *l = v->lists[i];
            lists[i].size = lists[i].cap = l->n;
            lists[i].codes = l->codes;
            if (l->fl) {
                tsr_ivfpq_flist_codes(l->fl, 0, l->n, tmp + at * cs, NULL);
                lists[i].codes = tmp + at * cs;
                at += l->n;
            }
            lists[i].ids = l->ids;
            view.ntotal += (int64_t)l->n;
        }
    /* slice.faiss and vectors.f32 go to disk as they are made, through a 1 MiB buffer:
     * built whole in memory first they were ~20 + ~70 MB of fresh pages per shard at 1M x
     * 64, faulted in and copied by every growth while the queries run (docs/performance.md
     * "the fold's build: fewer cycles, then paced") */
    snprintf(path, sizeof path, "%s/slice.faiss", dir);
    if ((rc = tsr_file_writer_open(&fw, path, (size_t)1 << 20, err)) != 0 ||
        (rc = tsr_faiss_write_to(&view, &fw, err)) != 0 ||
        (rc = tsr_file_writer_close(&fw, err)) != 0)
        goto out;
    free(tmp);
    tmp = NULL;

    /* meta + vectors.f32 */
    uint32_t fmt = 1, d = (uint32_t)tix->d;
    uint64_t nowned = 0;
    tsr_buf_add(&meta, "TSRM", 4);
    tsr_buf_add(&meta, &fmt, 4);
    tsr_buf_add(&meta, &v->version, 8);
    tsr_buf_add(&meta, &d, 4);
    for (size_t i = 0; i < v->nlist; i++)
        nowned += v->owned[i];
    tsr_buf_add(&meta, &nowned, 8);
    for (size_t i = 0; i < v->nlist; i++)
        if (v->owned[i]) {
            int32_t li = (int32_t)i;
            tsr_buf_add(&meta, &li, 4);
        }
    uint64_t nrecs = v->nrecs;
    tsr_buf_add(&meta, &nrecs, 8);
    snprintf(path, sizeof path, "%s/vectors.f32", dir);
    if ((rc = tsr_file_writer_open(&fw, path, (size_t)1 << 20, err)) != 0)
        goto out;
    for (size_t i = 0; i < v->nrecs; i++) {
        const tsr__rec *r = v->recs[i];
        Tessera__V1__IndexDatapoint *p = tsr_pb_datapoint_new(&r->dp);
        if (p == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            goto out;
        }
        p->n_feature_vector = 0;
        p->feature_vector = NULL;
        Tessera__V1__StagedUpsert up = TESSERA__V1__STAGED_UPSERT__INIT;
        up.label = r->label;
        up.list = r->list;
        up.datapoint = p;
        size_t len = tessera__v1__staged_upsert__get_packed_size(&up);
        uint32_t l32 = (uint32_t)len;
        tsr_buf_add(&meta, &l32, 4);
        if (tsr_buf_reserve(&meta, len) != 0) {
            tsr_pb_datapoint_delete(p);
            rc = tsr_err(err, TSR_ENOMEM, "out of memory for the metadata");
            goto out;
        }
        meta.len += tessera__v1__staged_upsert__pack(&up, (uint8_t *)meta.p + meta.len);
        meta.p[meta.len] = '\0'; /* tsr_buf's NUL after the last byte */
        tsr_pb_datapoint_delete(p);
        if (r->list >= 0 &&
            (rc = tsr_file_writer_add(&fw, r->dp.dense, (size_t)d * sizeof(float), err)) != 0)
            goto out;
    }
    if ((rc = tsr_file_writer_close(&fw, err)) != 0)
        goto out;
    if (meta.oom) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for the metadata");
        goto out;
    }
    snprintf(path, sizeof path, "%s/meta", dir);
    if ((rc = tsr_file_write_sync(path, meta.p, meta.len, err)) != 0)
        goto out;
    if (v->stream_seq > 0) { /* "stream": "TSRS" | i64 folded seq */
        uint8_t sb[12];
        memcpy(sb, "TSRS", 4);
        memcpy(sb + 4, &v->stream_seq, 8);
        snprintf(path, sizeof path, "%s/stream", dir);
        rc = tsr_file_write_sync(path, sb, sizeof sb, err);
    }
out:
    free(lists);
    free(tmp);
    free(meta.p);
    tsr_file_writer_abort(&fw);
    return rc;
}

/* A copy of record r (one ref) whose raw vector is vec (d floats in mapping vm), or NULL
 * when out of memory: the datapoint goes through its stored form (as a load does). */
static tsr__rec *rec_mapped_copy(const tsr__rec *r, const float *vec, size_t d, tsr__vmap *vm)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__IndexDatapoint *p = tsr_pb_datapoint_new(&r->dp);
    tsr__rec *nr = p ? calloc(1, sizeof *nr) : NULL;
    if (nr == NULL) {
        tsr_pb_datapoint_delete(p);
        return NULL;
    }
    p->n_feature_vector = 0;
    p->feature_vector = NULL;
    int rc = tsr__dp_from_proto(p, 0, &nr->dp, &err);
    tsr_pb_datapoint_delete(p);
    if (rc != 0) {
        tsr_datapoint_close(&nr->dp);
        free(nr);
        return NULL;
    }
    atomic_init(&nr->refs, 1);
    nr->label = r->label, nr->list = r->list, nr->tag = r->tag;
    nr->dp.dense = (float *)vec;
    nr->dp.ndense = d;
    nr->vmap = tsr__vmap_ref(vm);
    return nr;
}

void tsr__version_map_vectors(tsr__version *v, const char *dir)
{
    char path[4096];
    struct stat st;
    if (vectors_on_heap() || v->tmpl == NULL)
        return;
    size_t d = (size_t)v->tmpl->ix->d, n = 0, heap = 0, off = 0, done = 0;
    for (size_t i = 0; i < v->nrecs; i++)
        if (v->recs[i]->list >= 0) {
            n++;
            heap += v->recs[i]->vmap == NULL;
        }
    snprintf(path, sizeof path, "%s/vectors.f32", dir);
    if (heap == 0 || stat(path, &st) != 0 || (uint64_t)st.st_size != (uint64_t)n * d * 4)
        return;
    tsr_error err = TSR_ERROR_INIT;
    tsr__vmap *vm = vmap_open(path, (size_t)st.st_size, &err);
    if (vm == NULL) {
        tsr_warn("version %lld: raw vectors stay on the heap: %s", (long long)v->version,
                 err.msg);
        return;
    }
    for (size_t i = 0; i < v->nrecs; i++) { /* vectors.f32 is in record order */
        tsr__rec *r = v->recs[i];
        if (r->list < 0)
            continue;
        const float *vec = (const float *)(const void *)((const uint8_t *)vm->base + off);
        off += d * sizeof(float);
        if (r->vmap != NULL)
            continue;
        tsr__rec *nr = NULL;
        if (r->dp.dense == NULL || memcmp(vec, r->dp.dense, d * sizeof(float)) != 0 ||
            (nr = rec_mapped_copy(r, vec, d, vm)) == NULL)
            break; /* not what was written, or out of memory: the rest stays on the heap */
        v->recs[i] = nr;
        tsr__rec_unref(r);
        done++;
    }
    for (size_t li = 0; done > 0 && li < v->nlist; li++) /* list rows: the new records */
        for (size_t j = 0; v->lists[li] && j < v->lists[li]->n; j++)
            v->row_rec[v->row0[li] + j] = tsr__version_find(v, v->lists[li]->ids[j]);
    if (done > 0) { /* the records' bytes moved from the heap to the mapping */
        v->rec_anon = v->rec_mapped = 0;
        for (size_t i = 0; i < v->nrecs; i++)
            tsr__rec_bytes(v->recs[i], &v->rec_anon, &v->rec_mapped);
    }
    tsr__vmap_unref(vm);
    if (done < heap)
        tsr_warn("version %lld: %zu of %zu raw vectors stay on the heap", (long long)v->version,
                 heap - done, heap);
}

static int rec_cmp(const void *a, const void *b)
{
    int64_t x = (*(tsr__rec *const *)a)->label, y = (*(tsr__rec *const *)b)->label;
    return x < y ? -1 : x > y;
}

/* slice.faiss of a version directory into v: the lists (moved out of the file's index),
 * the template and the lists' terms; *d gets the dimension. */
static int load_slice_index(const char *dir, tsr__version *v, size_t *d, tsr_error *err)
{
    char path[4096];
    int rc;
    tsr_ivfpq *ix = NULL;
    snprintf(path, sizeof path, "%s/slice.faiss", dir);
    if ((rc = tsr_faiss_read_file(path, &ix, err)) != 0)
        return rc;
    v->nlist = ix->nlist;
    v->lists = tsr_try_calloc(v->nlist, sizeof(tsr__list *));
    v->owned = tsr_try_calloc(v->nlist, 1);
    if (!v->lists || !v->owned)
        goto nomem;
    for (size_t i = 0; i < ix->nlist; i++) {
        tsr_invlist *il = &ix->lists[i];
        if (il->size == 0)
            continue;
        tsr__list *l = calloc(1, sizeof *l);
        if (l == NULL)
            goto nomem;
        atomic_init(&l->refs, 1);
        l->n = il->size, l->codes = il->codes, l->ids = il->ids;
        memset(il, 0, sizeof *il);
        v->lists[i] = l;
    }
    *d = (size_t)ix->d;
    v->tmpl = tsr__tmpl_from_index(ix, err);
    if (v->tmpl == NULL)
        return err ? err->code : TSR_ENOMEM;
    for (size_t i = 0; i < v->nlist; i++)
        if (v->lists[i] && (rc = list_terms(v->tmpl, i, v->lists[i], err)) != 0)
            return rc;
    return 0;
nomem:
    tsr_ivfpq_destroy(ix);
    return tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
}

/* A cursor over the bytes of a version's meta file (format in tsr__version_save). */
typedef struct meta_rd {
    const char *dir;
    const uint8_t *p;
    size_t n, off;
} meta_rd;

static int meta_need(const meta_rd *m, size_t n, const char *what, tsr_error *err)
{
    if (m->n - m->off < n)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: offset %zu: %s truncated", m->dir, m->off,
                       what);
    return 0;
}

/* The meta header and the owned lists (into v->owned); *nrecs gets the record count,
 * checked against the bytes left. */
static int load_meta_header(meta_rd *m, int64_t version, size_t d, tsr__version *v,
                            uint64_t *nrecs, tsr_error *err)
{
    int rc;
    const char *dir = m->dir;
    if ((rc = meta_need(m, 4 + 4 + 8 + 4 + 8, "header", err)) != 0)
        return rc;
    uint32_t fmt, md;
    int64_t mver;
    uint64_t nowned;
    if (memcmp(m->p, "TSRM", 4) != 0)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: offset 0: magic is not TSRM", dir);
    memcpy(&fmt, m->p + 4, 4);
    memcpy(&mver, m->p + 8, 8);
    memcpy(&md, m->p + 16, 4);
    memcpy(&nowned, m->p + 20, 8);
    m->off = 28;
    if (fmt != 1 || md != d || mver != version)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: format %u, d %u, version %lld; expected 1, "
                       "%zu, %lld", dir, fmt, md, (long long)mver, d, (long long)version);
    if (nowned > v->nlist)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: offset 20: %llu owned lists > nlist %zu", dir,
                       (unsigned long long)nowned, v->nlist);
    if ((rc = meta_need(m, (size_t)(nowned * 4 + 8), "owned lists", err)) != 0)
        return rc;
    for (uint64_t i = 0; i < nowned; i++, m->off += 4) {
        int32_t li;
        memcpy(&li, m->p + m->off, 4);
        if (li < 0 || (size_t)li >= v->nlist)
            return tsr_err(err, TSR_EFORMAT, "%s/meta: offset %zu: owned list %d out of range",
                           dir, m->off, li);
        v->owned[li] = 1;
    }
    memcpy(nrecs, m->p + m->off, 8);
    m->off += 8;
    if (*nrecs > (m->n - m->off) / 4)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: %llu records do not fit in the file", dir,
                       (unsigned long long)*nrecs);
    return 0;
}

/* Record i from the meta cursor into v->recs (with its raw vector from vectors.f32 at
 * *voff when it is in a list). */
static int load_record(meta_rd *m, uint64_t i, size_t d, const uint8_t *vb, size_t vn,
                       tsr__vmap *vm, size_t *voff, tsr__version *v, tsr_error *err)
{
    int rc;
    const char *dir = m->dir;
    uint32_t len;
    if ((rc = meta_need(m, 4, "record length", err)) != 0)
        return rc;
    memcpy(&len, m->p + m->off, 4);
    m->off += 4;
    if ((rc = meta_need(m, len, "record", err)) != 0)
        return rc;
    Tessera__V1__StagedUpsert *up = tessera__v1__staged_upsert__unpack(NULL, len, m->p + m->off);
    if (up == NULL)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: offset %zu: record %llu does not parse", dir,
                       m->off, (unsigned long long)i);
    m->off += len;
    tsr__rec *r = calloc(1, sizeof *r);
    if (r == NULL) {
        tessera__v1__staged_upsert__free_unpacked(up, NULL);
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
    }
    atomic_init(&r->refs, 1);
    r->label = up->label;
    r->list = up->list;
    rc = tsr__dp_from_proto(up->datapoint, d, &r->dp, err);
    tessera__v1__staged_upsert__free_unpacked(up, NULL);
    v->recs[v->nrecs++] = r;
    if (rc != 0)
        return rc;
    if (r->list >= (int32_t)v->nlist || r->list < -1)
        return tsr_err(err, TSR_EFORMAT, "%s/meta: record %llu: list %d out of range", dir,
                       (unsigned long long)i, r->list);
    if (r->list >= 0) {
        if (vn - *voff < d * sizeof(float))
            return tsr_err(err, TSR_EFORMAT, "%s/vectors.f32: truncated at record %llu", dir,
                           (unsigned long long)i);
        if (vm != NULL) { /* 4-byte aligned: the mapping is page-aligned, *voff % 4 == 0 */
            r->dp.dense = (float *)(void *)(vb + *voff);
            r->vmap = tsr__vmap_ref(vm);
        } else {
            r->dp.dense = tsr_try_malloc(d, sizeof(float));
            if (r->dp.dense == NULL)
                return tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
            memcpy(r->dp.dense, vb + *voff, d * sizeof(float));
        }
        r->dp.ndense = d;
        *voff += d * sizeof(float);
    }
    return 0;
}

/* The optional "stream" file of a version directory: the folded stream seq (0 without). */
static int load_stream_seq(const char *dir, tsr__version *v, tsr_error *err)
{
    char path[4096], *b = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/stream", dir);
    int rc = tsr_file_read(path, 64, TSR_FILE_NOTFOUND, &b, &n, err);
    if (rc == TSR_ENOTFOUND) {
        if (err)
            tsr_error_clear(err);
        return 0;
    }
    if (rc != 0)
        return rc;
    if (n != 12 || memcmp(b, "TSRS", 4) != 0) {
        free(b);
        return tsr_err(err, TSR_EFORMAT, "%s: %zu bytes, expected \"TSRS\" and a seq", path, n);
    }
    memcpy(&v->stream_seq, b + 4, 8);
    free(b);
    if (v->stream_seq < 0)
        return tsr_err(err, TSR_EFORMAT, "%s: negative seq", path);
    return 0;
}

int tsr__version_load(const char *dir, int64_t version, tsr__version **out, tsr_error *err)
{
    char path[4096];
    int rc;
    uint8_t *mb = NULL, *vb = NULL;
    tsr__vmap *vm = NULL; /* vb is vm's when mapped (each record with a vector holds a ref) */
    size_t mn = 0, vn = 0, d = 0;
    tsr__version *v = calloc(1, sizeof *v);
    if (v == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    atomic_init(&v->refs, 1);
    v->version = version;
    if ((rc = load_slice_index(dir, v, &d, err)) != 0)
        goto fail;

    snprintf(path, sizeof path, "%s/meta", dir);
    if ((rc = read_all(path, SLICE_META_MAX, &mb, &mn, err)) != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/vectors.f32", dir);
    if ((rc = read_vectors(path, v, d, &vb, &vn, &vm, err)) != 0)
        goto fail;
    meta_rd m = {dir, mb, mn, 0};
    uint64_t nrecs = 0;
    if ((rc = load_meta_header(&m, version, d, v, &nrecs, err)) != 0)
        goto fail;
    v->recs = tsr_try_calloc(nrecs ? nrecs : 1, sizeof(tsr__rec *));
    if (v->recs == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
        goto fail;
    }
    size_t voff = 0;
    for (uint64_t i = 0; i < nrecs; i++)
        if ((rc = load_record(&m, i, d, vb, vn, vm, &voff, v, err)) != 0)
            goto fail;
    if (voff != vn || m.off != mn) {
        rc = tsr_err(err, TSR_EFORMAT, "%s: trailing bytes in meta (%zu/%zu) or vectors.f32 "
                     "(%zu/%zu)", dir, m.off, mn, voff, vn);
        goto fail;
    }
    if (v->nrecs > 1)
        qsort(v->recs, v->nrecs, sizeof *v->recs, rec_cmp);
    for (size_t i = 1; i < v->nrecs; i++)
        if (v->recs[i]->label == v->recs[i - 1]->label) {
            rc = tsr_err(err, TSR_EFORMAT, "%s/meta: label %lld twice", dir,
                         (long long)v->recs[i]->label);
            goto fail;
        }
    if ((rc = finish(v, NULL, err)) != 0) {
        tsr_err_prefix(err, "%s", dir);
        goto fail;
    }
    if ((rc = load_stream_seq(dir, v, err)) != 0)
        goto fail;
    free(mb);
    if (vm == NULL)
        free(vb);
    tsr__vmap_unref(vm);
#ifdef __GLIBC__
    /* The Faiss-order codes freed list by list as the scan blocks were built, and the
     * parse buffers, leave free heap pages between live ones: give them back. */
    malloc_trim(0);
#endif
    *out = v;
    return 0;
fail:
    free(mb);
    if (vm == NULL)
        free(vb);
    tsr__vmap_unref(vm);
    tsr__version_unref(v);
    return rc;
}
