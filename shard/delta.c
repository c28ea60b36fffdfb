/*
 * delta — building the streamed-write delta snapshots of a version (tsr__delta, shard.h)
 * and folding a delta into the edit set of the next version.
 *
 * A write makes a new snapshot from the old one (copy-on-write): the list pointer array
 * is copied (refs), the mask is merged with the write's changes (one pass), the records
 * are appended to the old snapshot's shared buffer (tsr__recbuf) when the write only adds
 * labels past the last one (new ids: the coordinator's labels grow) or else merged into a
 * new buffer (one pass, a ref per record), and only the lists the write touches are
 * rebuilt (their kept entries copied, the new records PQ-encoded with tsr__encode and
 * their ADC terms computed by tsr_ivfpq_list_terms — the same functions a base list is
 * built with, so a delta record scores exactly as it would in a base list). Counts and
 * bytes follow the changes. The cost of a write is O(nlist pointers + mask + the touched
 * lists + its records), plus O(delta records) when it replaces or deletes one of them,
 * never O(version). (Before the shared buffer every write copied and ref'd every delta
 * record and the old snapshot's release unref'd them all: 40 % of a streaming shard's CPU
 * at a 20k-record delta, docs/performance.md "Streamed writes".)
 *
 * Threads: the caller serializes the builds of one version's deltas (write_mu in
 * stream.c, or the single thread of the start-up replay); v->dtags is touched only here.
 * The snapshots built are immutable once returned.
 */
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "index/ivfpq_search.h"
#include "shard.h"

typedef struct chg {
    int64_t label;
    tsr__rec *rec; /* borrowed; NULL = delete */
    size_t ord;
} chg;

static int chg_cmp(const void *a, const void *b)
{
    const chg *x = a, *y = b;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static int chg_find(const chg *c, size_t n, int64_t label)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c[mid].label == label)
            return 1;
        if (c[mid].label < label)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The crowding tag id of a new delta record r of version v (see tsr__delta). */
static int set_tag(tsr__version *v, tsr__rec *r, tsr_error *err)
{
    const char *t = r->dp.crowding_tag;
    r->tag = TSR_FILTER_NOID;
    if (t == NULL || t[0] == '\0')
        return 0;
    uint32_t id = tsr_filter_dict_lookup(v->dict, t, strlen(t));
    if (id != TSR_FILTER_NOID) {
        r->tag = id;
        return 0;
    }
    if (v->dtags == NULL && (v->dtags = tsr_filter_dict_create()) == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for the delta's crowding tags");
    int rc = tsr_filter_dict_intern(v->dtags, t, strlen(t), &id);
    if (rc != 0)
        return tsr_err(err, rc, "delta crowding tag '%s': cannot intern it", t);
    r->tag = TSR__DTAG_BIT | id;
    return 0;
}

static void count_rec(const tsr__rec *r, int64_t *vec, int64_t *sp, int sign)
{
    if (r->list >= 0)
        *vec += sign;
    if (r->dp.nsparse)
        *sp += sign;
}

/* Counts and bytes of the delta record r into d (sign +1 added, -1 removed). */
static void account(tsr__delta *d, const tsr__rec *r, int sign)
{
    uint64_t anon = 0, mapped = 0;
    tsr__rec_bytes(r, &anon, &mapped);
    count_rec(r, &d->rvec, &d->rsparse, sign);
    d->rec_anon += sign > 0 ? anon : -anon;
    d->rec_mapped += sign > 0 ? mapped : -mapped;
}

/* 1 when the write only adds records that sort after the last one of old, which is the
 * tip of its buffer with room for them: they are appended in place (no copy). */
static int can_append(const tsr__delta *old, const chg *c, size_t nc)
{
    if (old == NULL || old->rbuf == NULL || old->nrecs == 0 || old->nrecs != old->rbuf->n)
        return 0;
    int64_t last = old->recs[old->nrecs - 1]->label;
    size_t add = 0;
    for (size_t j = 0; j < nc; j++) {
        if (c[j].rec) {
            if (c[j].label <= last)
                return 0;
            add++;
        } else if (c[j].label <= last && tsr__delta_find(old, c[j].label, NULL)) {
            return 0; /* deletes a delta record */
        }
    }
    return old->nrecs + add <= old->rbuf->cap;
}

/* Records: old->recs merged with the changes (the last change of a label wins); touched[]
 * gets the lists of removed and added records; counts and bytes follow the changes
 * (O(changes)). Appends to old's buffer when can_append, else copies into a new one
 * (with room to append after it). */
static int merge_recs(const tsr__delta *old, const chg *c, size_t nc, tsr__delta *d,
                      uint8_t *touched, tsr_error *err)
{
    size_t on = old ? old->nrecs : 0;
    if (old) {
        d->rvec = old->rvec, d->rsparse = old->rsparse;
        d->rec_anon = old->rec_anon, d->rec_mapped = old->rec_mapped;
    }
    if (can_append(old, c, nc)) {
        tsr__recbuf *b = old->rbuf;
        for (size_t j = 0; j < nc; j++) {
            if (!c[j].rec)
                continue;
            b->recs[b->n++] = tsr__rec_ref(c[j].rec);
            account(d, c[j].rec, 1);
            if (c[j].rec->list >= 0)
                touched[c[j].rec->list] = 1;
        }
        atomic_fetch_add(&b->refs, 1);
        d->rbuf = b;
        d->recs = b->recs;
        d->nrecs = b->n;
        return 0;
    }
    size_t cap = on + nc + (on + nc) / 2 + 64;
    tsr__recbuf *b = calloc(1, sizeof *b);
    if (b == NULL || (b->recs = tsr_try_malloc(cap, sizeof *b->recs)) == NULL) {
        free(b);
        return tsr_err(err, TSR_ENOMEM, "out of memory for %zu delta records", on + nc);
    }
    atomic_init(&b->refs, 1);
    b->cap = cap;
    d->rbuf = b;
    d->recs = b->recs;
    size_t i = 0, j = 0;
    while (i < on || j < nc) {
        tsr__rec *o = i < on ? old->recs[i] : NULL;
        if (j >= nc || (o && o->label < c[j].label)) {
            b->recs[b->n++] = tsr__rec_ref(o);
            i++;
            continue;
        }
        if (o && o->label == c[j].label) { /* replaced or deleted */
            account(d, o, -1);
            if (o->list >= 0)
                touched[o->list] = 1;
            i++;
        }
        if (c[j].rec) {
            b->recs[b->n++] = tsr__rec_ref(c[j].rec);
            account(d, c[j].rec, 1);
            if (c[j].rec->list >= 0)
                touched[c[j].rec->list] = 1;
        }
        j++;
    }
    d->nrecs = b->n;
    return 0;
}

/* Mask: old->mask plus every changed label the base holds. */
static int merge_mask(const tsr__version *v, const tsr__delta *old, const chg *c, size_t nc,
                      tsr__delta *d, tsr_error *err)
{
    size_t on = old ? old->nmask : 0;
    d->mask = tsr_try_malloc(on + nc + 1, sizeof *d->mask);
    if (d->mask == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for the delta mask");
    if (old) {
        d->mvec = old->mvec;
        d->msparse = old->msparse;
    }
    size_t i = 0, j = 0;
    while (i < on || j < nc) {
        if (j >= nc || (i < on && old->mask[i] < c[j].label)) {
            d->mask[d->nmask++] = old->mask[i++];
            continue;
        }
        if (i < on && old->mask[i] == c[j].label) {
            d->mask[d->nmask++] = old->mask[i++];
            j++;
            continue;
        }
        const tsr__rec *b = tsr__version_find(v, c[j].label);
        if (b) {
            d->mask[d->nmask++] = c[j].label;
            count_rec(b, &d->mvec, &d->msparse, 1);
        }
        j++;
    }
    /* deletes held = masked labels without an upsert in recs; only the changed labels
     * can change side (a masked label stays masked), so O(changes log delta) */
    size_t both = old ? old->nmask - old->ndeletes : 0;
    for (size_t j = 0; j < nc; j++) {
        int64_t l = c[j].label;
        if (old && tsr__i64_in(old->mask, old->nmask, l) && tsr__delta_find(old, l, NULL))
            both--;
        if (c[j].rec && tsr__i64_in(d->mask, d->nmask, l))
            both++;
    }
    d->ndeletes = d->nmask - both;
    return 0;
}

/* The ADC term table of list li (tsr_ivfpq_list_table): the template's cached one, made
 * now when missing and under the cap, else computed into scratch (M * ksub floats). */
static const float *term_table(tsr__tmpl *t, size_t li, float *scratch, tsr_error *err)
{
    size_t bytes = t->ix->pq.M * t->ix->pq.ksub * sizeof(float);
    if (t->ptab == NULL && (t->ptab = tsr_try_calloc(t->ix->nlist, sizeof *t->ptab)) == NULL) {
        tsr_err(err, TSR_ENOMEM, "out of memory for the term tables");
        return NULL;
    }
    if (t->ptab[li])
        return t->ptab[li];
    float *P = scratch;
    if (t->ptab_bytes + bytes <= TSR__PTAB_CAP && (P = malloc(bytes)) != NULL) {
        t->ptab[li] = P;
        t->ptab_bytes += bytes;
    } else {
        P = scratch;
    }
    if (tsr_ivfpq_list_table(t->ix, li, P, err) != 0) {
        if (P != scratch) {
            t->ptab[li] = NULL;
            t->ptab_bytes -= bytes;
            free(P);
        }
        return NULL;
    }
    return P;
}

/* Rebuilds delta list li: the old list's entries whose label did not change, then the
 * new records of that list (in label order). */
static int build_dlist(const tsr__version *v, const tsr__delta *old, const chg *c, size_t nc,
                       tsr__delta *d, size_t li, float *scratch, tsr_error *err)
{
    tsr__tmpl *t = v->tmpl;
    size_t cs = t->ix->code_size;
    const tsr__list *ol = old && old->lists ? old->lists[li] : NULL;
    size_t cap = ol ? ol->n : 0;
    for (size_t j = 0; j < nc; j++)
        cap += c[j].rec && c[j].rec->list == (int32_t)li;
    tsr__list_unref(d->lists[li]);
    d->lists[li] = NULL;
    if (cap == 0)
        return 0;
    tsr__list *l = calloc(1, sizeof *l);
    if (l == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for delta list %zu", li);
    atomic_init(&l->refs, 1);
    d->lists[li] = l;
    int terms = tsr_ivfpq_has_terms(t->ix);
    l->codes = tsr_try_malloc(cap, cs);
    l->ids = tsr_try_malloc(cap, sizeof(int64_t));
    if (!l->codes || !l->ids || (terms && (l->term = tsr_try_malloc(cap, sizeof(float))) == NULL))
        return tsr_err(err, TSR_ENOMEM, "out of memory for delta list %zu (%zu codes)", li, cap);
    for (size_t j = 0; ol && j < ol->n; j++) {
        if (chg_find(c, nc, ol->ids[j]))
            continue;
        memcpy(l->codes + l->n * cs, ol->codes + j * cs, cs);
        if (terms)
            l->term[l->n] = ol->term[j];
        l->ids[l->n++] = ol->ids[j];
    }
    size_t n0 = l->n;
    for (size_t j = 0; j < nc; j++) {
        const tsr__rec *r = c[j].rec;
        if (r == NULL || r->list != (int32_t)li)
            continue;
        memset(l->codes + l->n * cs, 0, cs);
        tsr__encode(t, r->dp.dense, (int32_t)li, l->codes + l->n * cs);
        l->ids[l->n++] = r->label;
    }
    if (l->n == 0) {
        tsr__list_unref(l);
        d->lists[li] = NULL;
        return 0;
    }
    if (terms && l->n > n0) {
        const float *P = term_table(t, li, scratch, err);
        if (P == NULL)
            return err ? err->code : TSR_ENOMEM;
        tsr_ivfpq_terms_from_table(t->ix, P, l->codes + n0 * cs, l->n - n0, l->term + n0);
    }
    return 0;
}

/* The changes of one write, sorted by label, the last one of a label kept. */
static chg *make_changes(tsr__rec *const *ups, size_t nups, const int64_t *dels, size_t ndels,
                         size_t *nc, tsr_error *err)
{
    chg *c = tsr_try_malloc(nups + ndels + 1, sizeof *c);
    if (c == NULL) {
        tsr_err(err, TSR_ENOMEM, "out of memory for %zu changes", nups + ndels);
        return NULL;
    }
    size_t n = 0;
    for (size_t i = 0; i < ndels; i++, n++)
        c[n] = (chg){dels[i], NULL, n};
    for (size_t i = 0; i < nups; i++, n++)
        c[n] = (chg){ups[i]->label, ups[i], n};
    qsort(c, n, sizeof *c, chg_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n && c[i + 1].label == c[i].label)
            continue;
        c[k++] = c[i];
    }
    *nc = k;
    return c;
}

int tsr__delta_apply(tsr__version *v, const tsr__delta *old, tsr__rec *const *ups, size_t nups,
                     const int64_t *dels, size_t ndels, int64_t seq, tsr__delta **out,
                     tsr_error *err)
{
    int rc = TSR_ENOMEM;
    size_t nc = 0;
    uint8_t *touched = NULL;
    float *scratch = NULL;
    chg *c = NULL;
    tsr__delta *d = calloc(1, sizeof *d);
    if (d == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for a delta");
    atomic_init(&d->refs, 1);
    d->seq = seq;
    d->nlist = v->nlist;
    if (v->tmpl == NULL) {
        rc = tsr_err(err, TSR_ESTATE, "version %lld is empty (no template): it takes no "
                     "streamed write", (long long)v->version);
        goto fail;
    }
    for (size_t i = 0; i < nups; i++)
        if ((rc = set_tag(v, ups[i], err)) != 0)
            goto fail;
    d->lists = tsr_try_calloc(v->nlist ? v->nlist : 1, sizeof *d->lists);
    touched = tsr_try_calloc(v->nlist ? v->nlist : 1, 1);
    if (d->lists == NULL || touched == NULL ||
        (c = make_changes(ups, nups, dels, ndels, &nc, err)) == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for a delta");
        goto fail;
    }
    for (size_t i = 0; old && old->lists && i < v->nlist; i++)
        d->lists[i] = old->lists[i] ? (atomic_fetch_add(&old->lists[i]->refs, 1), old->lists[i])
                                    : NULL;
    if ((rc = merge_recs(old, c, nc, d, touched, err)) != 0 ||
        (rc = merge_mask(v, old, c, nc, d, err)) != 0)
        goto fail;
    scratch = tsr_try_malloc(v->tmpl->ix->pq.M * v->tmpl->ix->pq.ksub, sizeof(float));
    if (scratch == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for a term table");
        goto fail;
    }
    for (size_t i = 0; i < v->nlist; i++)
        if (touched[i] && (rc = build_dlist(v, old, c, nc, d, i, scratch, err)) != 0)
            goto fail;
    free(scratch);
    free(c);
    free(touched);
    *out = d;
    return 0;
fail:
    free(scratch);
    free(c);
    free(touched);
    tsr__delta_unref(d);
    return rc;
}

int tsr__delta_fold(const tsr__delta *d, tsr__edits *e, tsr_error *err)
{
    if (tsr__delta_empty(d))
        return 0;
    tsr__rec **ups = tsr_try_malloc(e->nups + d->nrecs + 1, sizeof *ups);
    int64_t *dels = tsr_try_malloc(e->ndels + d->nmask + 1, sizeof *dels);
    if (!ups || !dels) {
        free(ups);
        free(dels);
        return tsr_err(err, TSR_ENOMEM, "out of memory folding %zu delta records", d->nrecs);
    }
    size_t nu = 0, nd = 0, i = 0, j = 0;
    /* upserts: the staged ones, and the delta's whose label the update does not touch */
    while (i < e->nups || j < d->nrecs) {
        tsr__rec *s = i < e->nups ? e->ups[i] : NULL, *r = j < d->nrecs ? d->recs[j] : NULL;
        if (s && (!r || s->label <= r->label)) {
            if (r && r->label == s->label)
                j++;
            ups[nu++] = s; /* the staged copy wins; moves e's ref */
            i++;
        } else {
            if (!tsr__i64_in(e->dels, e->ndels, r->label))
                ups[nu++] = tsr__rec_ref(r);
            j++;
        }
    }
    /* deletes: the staged ones and the masked base labels (a staged upsert of a masked
     * label replaces the base record anyway) */
    for (i = 0, j = 0; i < e->ndels || j < d->nmask;) {
        int64_t x;
        if (j >= d->nmask || (i < e->ndels && e->dels[i] <= d->mask[j])) {
            x = e->dels[i++];
            if (j < d->nmask && d->mask[j] == x)
                j++;
        } else {
            x = d->mask[j++];
        }
        dels[nd++] = x;
    }
    free(e->ups);
    free(e->dels);
    e->ups = ups, e->nups = nu, e->capups = e->nups;
    e->dels = dels, e->ndels = nd, e->capdels = nd;
    return 0;
}
