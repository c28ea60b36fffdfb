/*
 * state — the coordinator's immutable version snapshot (template, partition plan, id
 * directory, label counter) and its on-disk form in a common/store/store version directory:
 *
 *   template.faiss  the trained IwPQ without vectors (common/index/faiss_io)
 *   plan            text: "tessera-plan 1\n<kind> <nlist> <nshards>\n" then one shard per list
 *   directory       binary: "TSRD" u32 1 | i64 next_label | u64 n | n × (u32 len, id bytes,
 *                   i64 label, i32 list, i32 shard, u8 dense, u8 sparse)
 *
 * plus the store's MANIFEST (sizes + CRC-32), verified before a version is loaded.
 * The served snapshot is read and swapped through tsr__coord_snap_get/set (here, beside
 * the snapshot, so every other file reaches it without going through main.c).
 * The plan builders: balanced (greedy largest list first onto the least-loaded shard)
 * and locality (k-means of the centroids into S groups, each group onto its own shard
 * while it stays within 10 % of the mean load, the rest balanced).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "index/faiss_io.h"
#include "index/kmeans.h"
#include "index/knn.h"
#include "core/hash.h"
#include "core/mem.h"

/* ---------------------------------------------------------------- directory */

uint64_t tsr__hash_str(const char *s)
{
    /* decides the shard of a record without a list: never change (core/hash.h) */
    return tsr_fnv1a64_str(TSR_FNV1A64_BASIS_ROUTE, s);
}

void tsr__dir_init(tsr__dir *d) { memset(d, 0, sizeof *d); }

void tsr__dir_close(tsr__dir *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->e[i].id);
    free(d->e);
    free(d->slot);
    memset(d, 0, sizeof *d);
}

static void dir_rehash(tsr__dir *d, size_t nslots)
{
    free(d->slot);
    d->slot = tsr_xcalloc(nslots, sizeof *d->slot);
    d->mask = nslots - 1;
    for (size_t i = 0; i < d->n; i++) {
        size_t h = tsr__hash_str(d->e[i].id) & d->mask;
        while (d->slot[h])
            h = (h + 1) & d->mask;
        d->slot[h] = (uint32_t)(i + 1);
    }
}

/* The slot of id (its entry is d->e[d->slot[h] - 1]), or -1. */
static ptrdiff_t dir_slot(const tsr__dir *d, const char *id)
{
    if (!d->slot)
        return -1;
    size_t h = tsr__hash_str(id) & d->mask;
    while (d->slot[h]) {
        if (strcmp(d->e[d->slot[h] - 1].id, id) == 0)
            return (ptrdiff_t)h;
        h = (h + 1) & d->mask;
    }
    return -1;
}

const tsr__dir_entry *tsr__dir_find(const tsr__dir *d, const char *id)
{
    ptrdiff_t h = dir_slot(d, id);
    return h < 0 ? NULL : &d->e[d->slot[h] - 1];
}

void tsr__dir_add(tsr__dir *d, const char *id, int64_t label, int32_t list, int32_t shard,
                  int dense, int sparse)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 1024;
        d->e = tsr_xrealloc(d->e, d->cap * sizeof *d->e);
    }
    tsr__dir_entry *e = &d->e[d->n++];
    e->id = tsr_xstrdup(id);
    e->label = label;
    e->list = list;
    e->shard = shard;
    e->dense = (uint8_t)(dense != 0);
    e->sparse = (uint8_t)(sparse != 0);
    e->dead = 0;
    if (!d->slot || d->n * 2 > d->mask + 1) {
        size_t ns = 2048;
        while (ns < d->n * 4)
            ns *= 2;
        dir_rehash(d, ns);
        return;
    }
    size_t h = tsr__hash_str(id) & d->mask;
    while (d->slot[h])
        h = (h + 1) & d->mask;
    d->slot[h] = (uint32_t)d->n;
}

tsr__dir_entry *tsr__dir_set(tsr__dir *d, const char *id, int64_t label, int32_t list,
                             int32_t shard, int dense, int sparse, int dead)
{
    tsr__dir_entry *e = (tsr__dir_entry *)tsr__dir_find(d, id);
    if (!e) {
        tsr__dir_add(d, id, label, list, shard, dense, sparse);
        e = &d->e[d->n - 1];
    }
    e->label = label;
    e->list = list;
    e->shard = shard;
    e->dense = (uint8_t)(dense != 0);
    e->sparse = (uint8_t)(sparse != 0);
    e->dead = (uint8_t)(dead != 0);
    return e;
}

int tsr__dir_remove(tsr__dir *d, const char *id)
{
    ptrdiff_t at = dir_slot(d, id);
    if (at < 0)
        return 0;
    size_t hole = (size_t)at, i = d->slot[hole] - 1;
    /* backward-shift deletion (linear probing keeps no tombstone): every slot after the
     * hole in its run whose home is not cyclically in (hole, j] moves into the hole */
    for (size_t j = (hole + 1) & d->mask; d->slot[j]; j = (j + 1) & d->mask) {
        size_t home = tsr__hash_str(d->e[d->slot[j] - 1].id) & d->mask;
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            d->slot[hole] = d->slot[j];
            hole = j;
        }
    }
    d->slot[hole] = 0;
    free(d->e[i].id);
    size_t last = d->n - 1;
    if (i != last) { /* the last entry fills the gap: its slot points at i now */
        d->e[i] = d->e[last];
        size_t h = tsr__hash_str(d->e[i].id) & d->mask;
        while (d->slot[h] != last + 1)
            h = (h + 1) & d->mask;
        d->slot[h] = (uint32_t)(i + 1);
    }
    d->n--;
    return 1;
}

/* ---------------------------------------------------------------- snapshot */

tsr__snap *tsr__snap_create(void)
{
    tsr__snap *s = tsr_xcalloc(1, sizeof *s);
    atomic_init(&s->refs, 1);
    tsr__dir_init(&s->dir);
    return s;
}

size_t tsr__snap_groups(const tsr__snap *s, const tsr__coord_config *cfg)
{
    return s->ngroups ? s->ngroups : cfg->nshards;
}

size_t tsr__snap_live_groups(const tsr__snap *s, const tsr__coord_config *cfg)
{
    size_t n = tsr__snap_groups(s, cfg), live = 0;
    for (size_t g = 0; g < n; g++)
        live += g >= TSR_COORD_MAX_SHARDS || !s->retired[g];
    return live;
}

void tsr__snap_unref(tsr__snap *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    tsr_ivfpq_destroy(s->tmpl);
    free(s->tmpl_bytes);
    free(s->cent_norms);
    free(s->plan);
    free(s->groups);
    tsr__dir_close(&s->dir);
    free(s);
}

/* The served snapshot: snap_mu is held only to copy the pointer and bump the count (or
 * swap it), never across a call (coord.h: lock order). */
tsr__snap *tsr__coord_snap_get(tsr__coord *c)
{
    pthread_mutex_lock(&c->snap_mu);
    tsr__snap *s = c->snap;
    atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&c->snap_mu);
    return s;
}

tsr__snap *tsr__coord_snap_swap(tsr__coord *c, tsr__snap *s)
{
    pthread_mutex_lock(&c->snap_mu);
    tsr__snap *old = c->snap;
    c->snap = s;
    pthread_mutex_unlock(&c->snap_mu);
    return old;
}

void tsr__coord_snap_set(tsr__coord *c, tsr__snap *s)
{
    tsr__snap_unref(tsr__coord_snap_swap(c, s));
}

void tsr__snap_retire(tsr__snap *s, int64_t wait_ms)
{
    struct timespec ms = {0, 1000000};
    for (int64_t t = 0; s && t < wait_ms && atomic_load(&s->refs) > 1; t++)
        nanosleep(&ms, NULL);
    tsr__snap_unref(s);
}

int tsr__coord_leading(tsr__coord *c)
{
    return c->meta == NULL || atomic_load(&c->lead.leading);
}

int tsr__coord_readopt_pending(tsr__coord *c)
{
    return atomic_load(&c->lead.readopt);
}

int64_t tsr__coord_term(tsr__coord *c)
{
    return c->meta ? atomic_load(&c->lead.term) : 0;
}

int tsr__coord_refuse_follower(tsr__coord *c, tsr_rpc_reply *r)
{
    if (tsr__coord_leading(c))
        return 0;
    char addr[sizeof c->lead.addr], why[sizeof c->lead.etcd_err];
    pthread_mutex_lock(&c->lead.mu);
    memcpy(addr, c->lead.addr, sizeof addr);
    memcpy(why, c->lead.etcd_err, sizeof why);
    pthread_mutex_unlock(&c->lead.mu);
    if (!addr[0] && why[0])
        return tsr_rpc_reply_error(r, TSR_RPC_UNAVAILABLE, "not the leader: no leader elected "
                                   "yet (etcd unreachable: %s)", why);
    if (!addr[0])
        return tsr_rpc_reply_error(r, TSR_RPC_UNAVAILABLE, "not the leader: no leader elected "
                                   "yet");
    return tsr_rpc_reply_error(r, TSR_RPC_UNAVAILABLE, "not the leader: the leader is %s", addr);
}

int tsr__snap_set_template(tsr__snap *s, tsr_ivfpq *tmpl, tsr_error *err)
{
    /* The template carries no vectors: empty every list before serializing. */
    for (size_t l = 0; l < tmpl->nlist; l++)
        tmpl->lists[l].size = 0;
    tmpl->ntotal = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = tsr_faiss_write_mem(tmpl, &buf, &len, err);
    if (rc)
        return rc;
    tsr_ivfpq_destroy(s->tmpl);
    free(s->tmpl_bytes);
    free(s->cent_norms);
    s->tmpl = tmpl;
    s->tmpl_bytes = buf;
    s->tmpl_len = len;
    s->cent_norms = tsr_xmalloc(tmpl->nlist * sizeof(float));
    tsr_knn_norms(tmpl->centroids, tmpl->nlist, (size_t)tmpl->d, s->cent_norms);
    return 0;
}

static void put(uint8_t **b, size_t *n, size_t *cap, const void *p, size_t len)
{
    if (*n + len > *cap) {
        while (*n + len > *cap)
            *cap = *cap ? *cap * 2 : 4096;
        *b = tsr_xrealloc(*b, *cap);
    }
    memcpy(*b + *n, p, len);
    *n += len;
}

int tsr__snap_save(const tsr__snap *s, tsr_store *st, tsr_error *err)
{
    tsr_store_txn *t = NULL;
    int rc = tsr_store_begin(st, s->version, &t, err);
    if (rc)
        return rc;
    if ((rc = tsr_store_txn_write_file(t, "template.faiss", s->tmpl_bytes, s->tmpl_len, err)))
        goto fail;
    /* plan */
    size_t nlist = s->tmpl->nlist;
    size_t cap = 64 + nlist * 8, n = 0;
    char *pt = tsr_xmalloc(cap);
    n += (size_t)snprintf(pt, cap, "tessera-plan 1\n%s %zu\n",
                          s->plan_kind == TSR_PLAN_LOCALITY ? "locality" : "balanced", nlist);
    for (size_t l = 0; l < nlist; l++)
        n += (size_t)snprintf(pt + n, cap - n, "%d\n", (int)s->plan[l]);
    rc = tsr_store_txn_write_file(t, "plan", pt, n, err);
    free(pt);
    if (rc)
        goto fail;
    /* directory */
    uint8_t *b = NULL;
    size_t bn = 0, bcap = 0;
    uint32_t u32 = 1;
    put(&b, &bn, &bcap, "TSRD", 4);
    put(&b, &bn, &bcap, &u32, 4);
    put(&b, &bn, &bcap, &s->next_label, 8);
    uint64_t cnt = s->dir.n;
    put(&b, &bn, &bcap, &cnt, 8);
    for (size_t i = 0; i < s->dir.n; i++) {
        const tsr__dir_entry *e = &s->dir.e[i];
        u32 = (uint32_t)strlen(e->id);
        put(&b, &bn, &bcap, &u32, 4);
        put(&b, &bn, &bcap, e->id, u32);
        put(&b, &bn, &bcap, &e->label, 8);
        put(&b, &bn, &bcap, &e->list, 4);
        put(&b, &bn, &bcap, &e->shard, 4);
        put(&b, &bn, &bcap, &e->dense, 1);
        put(&b, &bn, &bcap, &e->sparse, 1);
    }
    rc = tsr_store_txn_write_file(t, "directory", b, bn, err);
    free(b);
    if (rc)
        goto fail;
    if (s->groups && (rc = tsr_store_txn_write_file(t, "groups", s->groups, s->groups_len, err)))
        goto fail;
    return tsr_store_commit(t, err);
fail:
    tsr_store_abort(t);
    return rc;
}

int tsr__snap_load(tsr_store *st, uint64_t version, tsr__snap **out, tsr_error *err)
{
    *out = NULL;
    int rc = tsr_store_verify(st, version, err);
    if (rc)
        return rc;
    void *tb = NULL, *pb = NULL, *db = NULL;
    size_t tl = 0, pl = 0, dl = 0;
    tsr__snap *s = tsr__snap_create();
    s->version = version;
    tsr_ivfpq *ix = NULL;
    if ((rc = tsr_store_read_file(st, version, "template.faiss", (size_t)1 << 34, &tb, &tl, err)) ||
        (rc = tsr_store_read_file(st, version, "plan", (size_t)1 << 30, &pb, &pl, err)) ||
        (rc = tsr_store_read_file(st, version, "directory", (size_t)1 << 36, &db, &dl, err)))
        goto fail;
    if ((rc = tsr_faiss_read_mem(tb, tl, &ix, err)))
        goto fail;
    if ((rc = tsr__snap_set_template(s, ix, err))) {
        tsr_ivfpq_destroy(ix);
        goto fail;
    }
    /* plan */
    char kind[32];
    size_t nlist = 0;
    const char *p = pb;
    int used = 0;
    if (sscanf(p, "tessera-plan 1\n%31s %zu\n%n", kind, &nlist, &used) != 2 || used <= 0 ||
        nlist != s->tmpl->nlist) {
        rc = tsr_err(err, TSR_EFORMAT, "v%llu/plan: bad header (expected \"tessera-plan 1\" and "
                     "nlist %zu)", (unsigned long long)version, s->tmpl->nlist);
        goto fail;
    }
    s->plan_kind = strcmp(kind, "locality") == 0 ? TSR_PLAN_LOCALITY : TSR_PLAN_BALANCED;
    s->plan = tsr_xmalloc(nlist * sizeof *s->plan);
    p += used;
    for (size_t l = 0; l < nlist; l++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= TSR_COORD_MAX_SHARDS) {
            rc = tsr_err(err, TSR_EFORMAT, "v%llu/plan: entry %zu: expected a shard number",
                         (unsigned long long)version, l);
            goto fail;
        }
        s->plan[l] = (int32_t)v;
        p = end;
    }
    /* directory */
    const uint8_t *d = db, *end = (const uint8_t *)db + dl;
    uint32_t fmt;
    uint64_t cnt;
    if (dl < 24 || memcmp(d, "TSRD", 4) != 0) {
        rc = tsr_err(err, TSR_EFORMAT, "v%llu/directory: bad magic", (unsigned long long)version);
        goto fail;
    }
    memcpy(&fmt, d + 4, 4);
    memcpy(&s->next_label, d + 8, 8);
    memcpy(&cnt, d + 16, 8);
    d += 24;
    if (fmt != 1 || cnt > dl / 22) {
        rc = tsr_err(err, TSR_EFORMAT, "v%llu/directory: bad format %u or count %llu",
                     (unsigned long long)version, fmt, (unsigned long long)cnt);
        goto fail;
    }
    char *idbuf = NULL;
    for (uint64_t i = 0; i < cnt; i++) {
        uint32_t len;
        if ((size_t)(end - d) < 4)
            goto trunc;
        memcpy(&len, d, 4);
        d += 4;
        if ((size_t)(end - d) < (size_t)len + 18)
            goto trunc;
        idbuf = tsr_xstrndup((const char *)d, len);
        d += len;
        int64_t label;
        int32_t list, shard;
        memcpy(&label, d, 8);
        memcpy(&list, d + 8, 4);
        memcpy(&shard, d + 12, 4);
        tsr__dir_add(&s->dir, idbuf, label, list, shard, d[16], d[17]);
        s->ndense += d[16] != 0;
        s->nsparse += d[17] != 0;
        d += 18;
        free(idbuf);
    }
    free(tb);
    free(pb);
    free(db);
    /* the groups after a reshard (absent before any) */
    void *gb = NULL;
    size_t gl = 0;
    rc = tsr_store_read_file(st, version, "groups", (size_t)1 << 20, &gb, &gl, err);
    if (rc == TSR_ENOTFOUND) {
        tsr_error_clear(err);
    } else if (rc) {
        tsr__snap_unref(s);
        return rc;
    } else {
        s->groups = gb;
        s->groups_len = gl;
        const char *q = gb;
        size_t g = 0;
        q = strchr(q, '\n'); /* header */
        q = q ? strchr(q + 1, '\n') : NULL; /* count */
        while (q && *++q && g < TSR_COORD_MAX_SHARDS) {
            s->retired[g++] = strncmp(q, "retired ", 8) == 0;
            q = strchr(q, '\n');
        }
        s->ngroups = g;
    }
    *out = s;
    return 0;
trunc:
    rc = tsr_err(err, TSR_EFORMAT, "v%llu/directory: truncated at offset %zu",
                 (unsigned long long)version, (size_t)(d - (const uint8_t *)db));
fail:
    free(tb);
    free(pb);
    free(db);
    tsr__snap_unref(s);
    return rc;
}

/* ---------------------------------------------------------------- plans */

static void balance(const int64_t *sizes, const size_t *order, size_t n, size_t nshards,
                    int64_t *load, int32_t *plan)
{
    for (size_t i = 0; i < n; i++) {
        size_t best = 0;
        for (size_t s = 1; s < nshards; s++)
            if (load[s] < load[best])
                best = s;
        plan[order[i]] = (int32_t)best;
        load[best] += sizes[order[i]];
    }
}

static const int64_t *g_sizes;
static int by_size_desc(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (g_sizes[x] != g_sizes[y])
        return g_sizes[x] > g_sizes[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void tsr__plan_build(enum tsr__plan_kind kind, const tsr_ivfpq *tmpl, const int64_t *sizes,
                     size_t nshards, uint64_t seed, int32_t *plan)
{
    size_t nlist = tmpl->nlist;
    size_t *order = tsr_xmalloc(nlist * sizeof *order);
    int64_t *load = tsr_xcalloc(nshards, sizeof *load);
    /* +1 so that empty lists still spread (each counts a little) */
    int64_t *sz = tsr_xmalloc(nlist * sizeof *sz);
    int64_t total = 0;
    for (size_t l = 0; l < nlist; l++) {
        sz[l] = sizes[l] + 1;
        total += sz[l];
        order[l] = l;
    }
    /* qsort with a global is fine: plans are built by the one update thread */
    g_sizes = sz;
    qsort(order, nlist, sizeof *order, by_size_desc);
    if (kind == TSR_PLAN_LOCALITY && nshards > 1 && nlist >= nshards) {
        int64_t *grp = tsr_xmalloc(nlist * sizeof *grp);
        float *cent = tsr_xmalloc(nshards * (size_t)tmpl->d * sizeof(float));
        tsr_kmeans_params kp;
        tsr_kmeans_params_default(&kp);
        kp.seed = seed;
        kp.quiet = 1;
        kp.max_points_per_centroid = 0;
        kp.metric = tmpl->metric;
        tsr_error e = TSR_ERROR_INIT;
        int ok = tsr_kmeans_train(&kp, tmpl->centroids, nlist, (size_t)tmpl->d, nshards, cent,
                                  NULL, &e) == 0 &&
                 tsr_kmeans_assign(tmpl->centroids, nlist, (size_t)tmpl->d, cent, nshards, NULL,
                                   tmpl->metric, 1, grp, NULL, &e) == 0;
        if (ok) {
            int64_t cap = total / (int64_t)nshards + total / (int64_t)nshards / 10 + 1;
            size_t nrest = 0;
            size_t *rest = tsr_xmalloc(nlist * sizeof *rest);
            for (size_t i = 0; i < nlist; i++) {
                size_t l = order[i];
                size_t g = (size_t)grp[l] % nshards;
                if (load[g] + sz[l] <= cap) {
                    plan[l] = (int32_t)g;
                    load[g] += sz[l];
                } else {
                    rest[nrest++] = l;
                }
            }
            balance(sz, rest, nrest, nshards, load, plan);
            free(rest);
        } else {
            memset(load, 0, nshards * sizeof *load);
            balance(sz, order, nlist, nshards, load, plan);
        }
        free(grp);
        free(cent);
    } else {
        balance(sz, order, nlist, nshards, load, plan);
    }
    free(sz);
    free(load);
    free(order);
}
