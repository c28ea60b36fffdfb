/*
 * update_plan — the half of an update that talks to no shard: from a validated batch and
 * the served snapshot to the next snapshot and what each shard group must stage.
 *
 *   template   the base version's; with no index yet --template or one trained from the
 *              batch's dense vectors (common/index/ivfpq_build, seeded);
 *   assign     nearest centroid (tsr_ivfpq_assign = Faiss add's assignment) of every dense
 *              record; sparse-only records get no list (-1);
 *   plan       the base's when the list count is unchanged, else built from the batch's
 *              list sizes (tsr__plan_build);
 *   route      the directory of the next version (ids kept from the base unless
 *              overwritten or deleted, then the batch's) and per shard group the upserts
 *              and deletes: list -> shard by the plan, sparse-only -> hash(id) % S, labels
 *              from the directory or the counter, an id moving to another shard deleted on
 *              its old one.
 * Pure computation on borrowed inputs (the batch's vectors normalised in place for the
 * cosine distance): the unit tests run it without shards (tests/unit/test_coord_update.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch/batch.h"
#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "index/faiss_io.h"
#include "index/ivfpq_build.h"

static void push_up(tsr__shard_work *w, size_t i)
{
    if (w->nups == w->cap)
        w->ups = tsr_xrealloc(w->ups, (w->cap = w->cap ? w->cap * 2 : 256) * sizeof *w->ups);
    w->ups[w->nups++] = i;
}

static void push_del(tsr__shard_work *w, int64_t label, int32_t list)
{
    if (w->ndels == w->dcap)
        w->dels = tsr_xrealloc(w->dels, (w->dcap = w->dcap ? w->dcap * 2 : 64) * sizeof *w->dels);
    Tessera__V1__StagedDelete *d = &w->dels[w->ndels++];
    tessera__v1__staged_delete__init(d);
    d->label = label;
    d->list = list;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static int cmp_rec(const void *key, const void *rec)
{
    return strcmp((const char *)key, ((const tsr_datapoint *)rec)->id);
}

void tsr__normalize(float *v, size_t d)
{
    double s = 0;
    for (size_t i = 0; i < d; i++)
        s += (double)v[i] * v[i];
    if (s > 0) {
        float inv = (float)(1.0 / sqrt(s));
        for (size_t i = 0; i < d; i++)
            v[i] *= inv;
    }
}

/* The template of the next version (new, *out): a copy of base's; without one, the file
 * tmpl_path (checked against the config); without that, trained from b's dense vectors. */
static int get_template(const tsr__coord_config *cfg, const char *tmpl_path,
                        const tsr__snap *base, const tsr_batch *b, tsr_ivfpq **out,
                        tsr_error *err)
{
    enum tsr_metric metric = cfg->distance == TSR_DIST_SQUARED_L2 ? TSR_METRIC_L2 : TSR_METRIC_IP;
    if (base->tmpl)
        return tsr_faiss_read_mem(base->tmpl_bytes, base->tmpl_len, out, err);
    if (tmpl_path) {
        int rc = tsr_faiss_read_file(tmpl_path, out, err);
        if (rc)
            return rc;
        tsr_ivfpq *ix = *out;
        if (ix->d != cfg->dimensions || ix->metric != metric || !ix->is_trained) {
            rc = tsr_err(err, TSR_EINVAL, "--template %s: d=%d metric=%s trained=%d, but the "
                         "config says dimensions=%d distance=%s", tmpl_path, ix->d,
                         ix->metric == TSR_METRIC_L2 ? "L2" : "IP", ix->is_trained,
                         cfg->dimensions, tsr__distance_name(cfg->distance));
            tsr_ivfpq_destroy(ix);
            *out = NULL;
            return rc;
        }
        if ((int)ix->nlist != cfg->nlist)
            tsr_info("template nlist %zu overrides config nlist %d", ix->nlist, cfg->nlist);
        return 0;
    }
    size_t nd = 0, d = (size_t)cfg->dimensions;
    for (size_t i = 0; i < b->nrecords; i++)
        nd += b->records[i].dense != NULL;
    if (nd < (size_t)cfg->nlist || nd < ((size_t)1 << cfg->pq_nbits))
        return tsr_err(err, TSR_EINVAL, "cannot train the index: the first batch has %zu dense "
                       "vectors, at least max(nlist = %d, 2^pq_nbits = %d) are needed (or start "
                       "the coordinator with --template F.faiss)", nd, cfg->nlist,
                       1 << cfg->pq_nbits);
    float *x = tsr_try_malloc(nd * d, sizeof(float));
    if (!x)
        return tsr_err(err, TSR_ENOMEM, "training: %zu vectors", nd);
    size_t j = 0;
    for (size_t i = 0; i < b->nrecords; i++)
        if (b->records[i].dense)
            memcpy(x + (j++) * d, b->records[i].dense, d * sizeof(float));
    tsr_ivfpq *ix = tsr_ivfpq_create(cfg->dimensions, (size_t)cfg->nlist, (size_t)cfg->pq_m,
                                     (size_t)cfg->pq_nbits, metric, 1, err);
    if (!ix) {
        free(x);
        return err->code ? err->code : TSR_EINVAL;
    }
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.seed = cfg->seed;
    bp.quiet = 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    bp.threads = ncpu > 0 ? (int)ncpu : 1;
    int64_t t0 = tsr_clock_mono_ms();
    int rc = tsr_ivfpq_train(ix, x, nd, &bp, err);
    free(x);
    if (rc) {
        tsr_ivfpq_destroy(ix);
        return rc;
    }
    ix->nprobe = (size_t)cfg->nprobe;
    tsr_info("trained the index from %zu vectors (nlist %d, pq_m %d, seed %llu) in %lld ms", nd,
             cfg->nlist, cfg->pq_m, (unsigned long long)cfg->seed,
             (long long)(tsr_clock_mono_ms() - t0));
    *out = ix;
    return 0;
}

int tsr__assign_records(const tsr_ivfpq *tmpl, const tsr_datapoint *recs, size_t n, size_t d,
                        int threads, int64_t *assign, tsr_error *err)
{
    size_t nd = 0;
    for (size_t i = 0; i < n; i++)
        nd += recs[i].dense != NULL;
    if (!nd) {
        for (size_t i = 0; i < n; i++)
            assign[i] = -1;
        return 0;
    }
    float *x = tsr_try_malloc(nd * d, sizeof(float));
    if (!x)
        return tsr_err(err, TSR_ENOMEM, "assignment of %zu vectors", nd);
    int64_t *a = tsr_xcalloc(nd, sizeof *a);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (recs[i].dense)
            memcpy(x + (j++) * d, recs[i].dense, d * sizeof(float));
    int rc = tsr_ivfpq_assign(tmpl, x, nd, threads > 0 ? threads : 1, a, err);
    free(x);
    if (rc == 0) {
        j = 0;
        for (size_t i = 0; i < n; i++)
            assign[i] = recs[i].dense ? a[j++] : -1;
    }
    free(a);
    return rc;
}

/* The list of each record (-1: no dense vector) into assign (b->nrecords entries). */
static int assign_lists(const tsr_ivfpq *tmpl, const tsr_batch *b, size_t d, int64_t *assign,
                        tsr_error *err)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return tsr__assign_records(tmpl, b->records, b->nrecords, d, ncpu > 0 ? (int)ncpu : 1,
                               assign, err);
}

int32_t tsr__group_of(const tsr__snap *s, int32_t list, const char *id, size_t nshards)
{
    if (list >= 0)
        return s->plan[list];
    size_t g = (size_t)(tsr__hash_str(id) % nshards);
    for (size_t i = 0; i < nshards && s->retired[g]; i++) /* the next group not removed */
        g = (g + 1) % nshards;
    return (int32_t)g;
}

/* ns's plan: base's when it has the same lists, else built from the batch's list sizes. */
static void plan_lists(const tsr__coord_config *cfg, const tsr__snap *base,
                       const tsr_batch *b, const int64_t *assign, tsr__snap *ns)
{
    size_t nlist = ns->tmpl->nlist;
    ns->plan = tsr_xmalloc(nlist * sizeof *ns->plan);
    if (base->plan && base->tmpl && base->tmpl->nlist == nlist) {
        memcpy(ns->plan, base->plan, nlist * sizeof *ns->plan);
        ns->plan_kind = base->plan_kind;
        return;
    }
    int64_t *sizes = tsr_xcalloc(nlist, sizeof *sizes);
    for (size_t i = 0; i < b->nrecords; i++)
        if (assign[i] >= 0)
            sizes[assign[i]]++;
    tsr__plan_build(cfg->plan, ns->tmpl, sizes, cfg->nshards, cfg->seed, ns->plan);
    ns->plan_kind = cfg->plan;
    free(sizes);
}

/* The directory of p->ns and each group's upserts and deletes. keep_base: the request is
 * not a complete overwrite (ids of base the batch does not touch stay). */
static void route(const tsr__snap *base, const tsr_batch *b, const int64_t *assign,
                  int keep_base, tsr__upd_plan *p)
{
    tsr__snap *ns = p->ns;
    size_t S = p->nshards;
    ns->next_label = base->next_label;
    if (keep_base) {
        for (size_t i = 0; i < base->dir.n; i++) {
            const tsr__dir_entry *e = &base->dir.e[i];
            if (b->nrecords && /* a fold's batch is empty (records NULL) */
                bsearch(e->id, b->records, b->nrecords, sizeof *b->records, cmp_rec))
                continue;
            if (b->ndeletes && bsearch(&e->id, b->deletes, b->ndeletes, sizeof *b->deletes,
                                       cmp_str))
                continue;
            tsr__dir_add(&ns->dir, e->id, e->label, e->list, e->shard, e->dense, e->sparse);
        }
    }
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *r = &b->records[i];
        const tsr__dir_entry *old = tsr__dir_find(&base->dir, r->id);
        int64_t label = old ? old->label : ns->next_label++;
        int32_t list = (int32_t)assign[i];
        int32_t shard = tsr__group_of(ns, list, r->id, S);
        if (old && !p->overwrite && old->shard != shard && (size_t)old->shard < S) {
            push_del(&p->w[old->shard], old->label, old->list);
            p->nmoved++;
        }
        push_up(&p->w[shard], i);
        tsr__dir_add(&ns->dir, r->id, label, list, shard, r->dense != NULL, r->nsparse > 0);
    }
    for (size_t i = 0; i < b->ndeletes; i++) {
        const tsr__dir_entry *old = tsr__dir_find(&base->dir, b->deletes[i]);
        if (old == NULL) { /* not in the index: nothing to delete, said in a warning */
            if (p->nunknown < TSR__UPD_UNKNOWN_KEPT)
                p->unknown[p->nunknown] = i;
            p->nunknown++;
        } else if (!p->overwrite && (size_t)old->shard < S) {
            push_del(&p->w[old->shard], old->label, old->list);
            p->ndeleted++;
        }
    }
    for (size_t i = 0; i < ns->dir.n; i++) {
        ns->ndense += ns->dir.e[i].dense;
        ns->nsparse += ns->dir.e[i].sparse;
    }
}

int tsr__upd_plan_build(const tsr__coord_config *cfg, const char *tmpl_path,
                        const tsr__snap *base, tsr_batch *b, int overwrite, tsr__upd_plan *p,
                        tsr_error *err)
{
    size_t d = (size_t)cfg->dimensions;
    memset(p, 0, sizeof *p);
    p->nshards = cfg->nshards;
    p->w = tsr_xcalloc(p->nshards ? p->nshards : 1, sizeof *p->w);
    p->overwrite = overwrite || base->version == 0;
    tsr_ivfpq *tmpl = NULL;
    int64_t *assign = NULL;
    int rc;
    if (cfg->distance == TSR_DIST_COSINE)
        for (size_t i = 0; i < b->nrecords; i++)
            if (b->records[i].dense)
                tsr__normalize(b->records[i].dense, d);
    if ((rc = get_template(cfg, tmpl_path, base, b, &tmpl, err)))
        goto out;
    assign = tsr_xcalloc(b->nrecords + 1, sizeof *assign);
    if ((rc = assign_lists(tmpl, b, d, assign, err)))
        goto out;
    p->ns = tsr__snap_create();
    p->ns->version = base->version + 1;
    p->ns->ngroups = cfg->nshards;
    if (cfg->resharded) /* the groups travel with every version after a reshard */
        p->ns->groups = tsr__coord_config_groups_text(cfg, -1, &p->ns->groups_len);
    for (size_t g = 0; g < cfg->nshards; g++)
        p->ns->retired[g] = cfg->retired ? cfg->retired[g] : 0; /* (a config made by hand) */
    if ((rc = tsr__snap_set_template(p->ns, tmpl, err)))
        goto out;
    tmpl = NULL;
    plan_lists(cfg, base, b, assign, p->ns);
    route(base, b, assign, !overwrite, p);
out:
    tsr_ivfpq_destroy(tmpl);
    free(assign);
    if (rc)
        tsr__upd_plan_close(p);
    return rc;
}

void tsr__upd_plan_close(tsr__upd_plan *p)
{
    for (size_t s = 0; p->w && s < p->nshards; s++) {
        free(p->w[s].ups);
        free(p->w[s].dels);
    }
    free(p->w);
    tsr__snap_unref(p->ns);
    memset(p, 0, sizeof *p);
}
