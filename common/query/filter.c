/*
 * filter — interning dictionary, per-row restrict metadata and compiled query filters
 * (semantics in filter.h and docs/query-semantics.md).
 *
 * Layout choices, all for a scan that tests many rows against one filter:
 *  - a row's tokens are one sorted run of uint64 keys (ns << 32 | token << 1 | deny) in a
 *    shared arena, so the test is a merge walk of the query's clauses (sorted by ns) with
 *    the row's keys, touching one or two cache lines for typical rows;
 *  - the query's token sets are small sorted uint32 arrays (linear search below 8,
 *    binary search above);
 *  - numeric values are stored as int64 for ints and as double for float/double (a float
 *    widens to double exactly, so "compare as double when types differ" is preserved).
 */
#include "query/filter.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/mem.h"

/* ---- hashing --------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = tsr_fnv1a64(TSR_FNV1A64_BASIS, s, len); /* then a final mix for the low bits */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_label(int64_t x)
{
    uint64_t z = (uint64_t)x + 0x9e3779b97f4a7c15ull; /* splitmix64 finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- dictionary ------------------------------------------------------------------------ */

struct tsr_filter_dict {
    char *arena; /* all strings, each NUL-terminated */
    size_t arena_len, arena_cap;
    size_t *off;    /* per id: offset in arena */
    uint32_t *len;  /* per id: length */
    uint64_t *hash; /* per id: hash (rehash without rereading strings) */
    size_t n, cap;  /* ids used / allocated */
    uint32_t *slot; /* open addressing, TSR_FILTER_NOID = empty */
    size_t mask;    /* slots - 1 (power of two) */
};

tsr_filter_dict *tsr_filter_dict_create(void)
{
    tsr_filter_dict *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->mask = 63;
    d->slot = malloc((d->mask + 1) * sizeof *d->slot);
    if (d->slot == NULL) {
        free(d);
        return NULL;
    }
    memset(d->slot, 0xff, (d->mask + 1) * sizeof *d->slot);
    return d;
}

void tsr_filter_dict_destroy(tsr_filter_dict *d)
{
    if (d == NULL)
        return;
    free(d->arena);
    free(d->off);
    free(d->len);
    free(d->hash);
    free(d->slot);
    free(d);
}

static void *dup_mem(const void *p, size_t n, size_t size)
{
    void *q = tsr_try_malloc(n ? n : 1, size);
    if (q != NULL && n)
        memcpy(q, p, n * size);
    return q;
}

tsr_filter_dict *tsr_filter_dict_clone(const tsr_filter_dict *d)
{
    tsr_filter_dict *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->arena = dup_mem(d->arena, d->arena_len, 1);
    c->off = dup_mem(d->off, d->n, sizeof *d->off);
    c->len = dup_mem(d->len, d->n, sizeof *d->len);
    c->hash = dup_mem(d->hash, d->n, sizeof *d->hash);
    c->slot = dup_mem(d->slot, d->mask + 1, sizeof *d->slot);
    if (!c->arena || !c->off || !c->len || !c->hash || !c->slot) {
        tsr_filter_dict_destroy(c);
        return NULL;
    }
    c->arena_cap = d->arena_len ? d->arena_len : 1; /* dup_mem allocated at least 1 */
    c->arena_len = d->arena_len;
    c->n = c->cap = d->n;
    c->mask = d->mask;
    return c;
}

size_t tsr_filter_dict_size(const tsr_filter_dict *d)
{
    return d->n;
}

static size_t find_slot(const tsr_filter_dict *d, const char *s, size_t len, uint64_t h)
{
    size_t i = (size_t)h & d->mask;
    for (;;) {
        uint32_t id = d->slot[i];
        if (id == TSR_FILTER_NOID)
            return i;
        if (d->hash[id] == h && d->len[id] == len && memcmp(d->arena + d->off[id], s, len) == 0)
            return i;
        i = (i + 1) & d->mask;
    }
}

uint32_t tsr_filter_dict_lookup(const tsr_filter_dict *d, const char *s, size_t len)
{
    if (d == NULL)
        return TSR_FILTER_NOID;
    return d->slot[find_slot(d, s, len, hash_bytes(s, len))];
}

const char *tsr_filter_dict_str(const tsr_filter_dict *d, uint32_t id, size_t *len)
{
    if (d == NULL || id >= d->n)
        return NULL;
    if (len)
        *len = d->len[id];
    return d->arena + d->off[id];
}

static int dict_grow_table(tsr_filter_dict *d)
{
    size_t nslots = (d->mask + 1) * 2;
    uint32_t *slot = tsr_try_malloc(nslots, sizeof *slot);
    if (slot == NULL)
        return TSR_ENOMEM;
    memset(slot, 0xff, nslots * sizeof *slot);
    for (uint32_t id = 0; id < d->n; id++) {
        size_t i = (size_t)d->hash[id] & (nslots - 1);
        while (slot[i] != TSR_FILTER_NOID)
            i = (i + 1) & (nslots - 1);
        slot[i] = id;
    }
    free(d->slot);
    d->slot = slot;
    d->mask = nslots - 1;
    return 0;
}

int tsr_filter_dict_intern(tsr_filter_dict *d, const char *s, size_t len, uint32_t *id)
{
    uint64_t h = hash_bytes(s, len);
    size_t i = find_slot(d, s, len, h);
    if (d->slot[i] != TSR_FILTER_NOID) {
        *id = d->slot[i];
        return 0;
    }
    if (d->n >= TSR_FILTER_MAX_IDS || len > UINT32_MAX - 1)
        return TSR_ELIMIT;
    /* keep the load factor at most 1/2 so probes stay short (and a free slot always
     * exists, which find_slot relies on to terminate) */
    if ((d->n + 1) * 2 > d->mask + 1) {
        if (dict_grow_table(d) != 0)
            return TSR_ENOMEM;
        i = find_slot(d, s, len, h);
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 64;
        size_t *off = tsr_try_realloc(d->off, nc, sizeof *off);
        if (off == NULL)
            return TSR_ENOMEM;
        d->off = off;
        uint32_t *ln = tsr_try_realloc(d->len, nc, sizeof *ln);
        if (ln == NULL)
            return TSR_ENOMEM;
        d->len = ln;
        uint64_t *hs = tsr_try_realloc(d->hash, nc, sizeof *hs);
        if (hs == NULL)
            return TSR_ENOMEM;
        d->hash = hs;
        d->cap = nc;
    }
    if (d->arena_cap - d->arena_len < len + 1) {
        size_t nc = d->arena_cap ? d->arena_cap : 1024;
        while (nc - d->arena_len < len + 1) {
            if (nc > SIZE_MAX / 2)
                return TSR_ENOMEM;
            nc *= 2;
        }
        char *a = realloc(d->arena, nc);
        if (a == NULL)
            return TSR_ENOMEM;
        d->arena = a;
        d->arena_cap = nc;
    }
    uint32_t nid = (uint32_t)d->n;
    memcpy(d->arena + d->arena_len, s, len);
    d->arena[d->arena_len + len] = '\0';
    d->off[nid] = d->arena_len;
    d->len[nid] = (uint32_t)len;
    d->hash[nid] = h;
    d->arena_len += len + 1;
    d->n++;
    d->slot[i] = nid;
    *id = nid;
    return 0;
}

/* ---- per-row metadata ------------------------------------------------------------------ */

typedef struct num_entry {
    uint32_t ns;
    uint32_t is_int;
    union {
        int64_t i;
        double d;
    } v;
} num_entry;

struct tsr_filter_meta {
    tsr_filter_dict *dict;
    size_t n, cap;     /* rows */
    int64_t *labels;   /* per row */
    uint32_t *crowd;   /* per row: tag id */
    size_t *tok_off;   /* n+1 offsets into toks */
    size_t *num_off;   /* n+1 offsets into nums */
    uint64_t *toks;    /* packed keys, sorted within a row */
    size_t ntoks, toks_cap;
    num_entry *nums;   /* sorted by ns within a row */
    size_t nnums, nums_cap;
    uint32_t *lslot;   /* label -> row, open addressing, NOID = empty */
    size_t lmask;
};

#define KEY(ns, tok, deny) (((uint64_t)(ns) << 32) | ((uint64_t)(tok) << 1) | (uint64_t)(deny))
#define KEY_NS(k) ((uint32_t)((k) >> 32))
#define KEY_TOK(k) ((uint32_t)(((k) >> 1) & 0x7fffffffu))
#define KEY_DENY(k) ((uint32_t)((k)&1u))

size_t tsr_filter_meta_bytes(const tsr_filter_meta *m)
{
    if (m == NULL)
        return 0;
    return sizeof *m + m->cap * (sizeof *m->labels + sizeof *m->crowd) +
           (m->cap + 1) * (sizeof *m->tok_off + sizeof *m->num_off) +
           m->toks_cap * sizeof *m->toks + m->nums_cap * sizeof *m->nums +
           (m->lslot ? (m->lmask + 1) * sizeof *m->lslot : 0);
}

tsr_filter_meta *tsr_filter_meta_create(tsr_filter_dict *dict)
{
    tsr_filter_meta *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    m->dict = dict;
    m->tok_off = calloc(1, sizeof *m->tok_off);
    m->num_off = calloc(1, sizeof *m->num_off);
    /* non-NULL arenas from the start: row pointers are arena + offset even when empty */
    m->toks_cap = m->nums_cap = 16;
    m->toks = malloc(m->toks_cap * sizeof *m->toks);
    m->nums = malloc(m->nums_cap * sizeof *m->nums);
    m->lmask = 63;
    m->lslot = malloc((m->lmask + 1) * sizeof *m->lslot);
    if (!m->tok_off || !m->num_off || !m->lslot || !m->toks || !m->nums) {
        tsr_filter_meta_destroy(m);
        return NULL;
    }
    memset(m->lslot, 0xff, (m->lmask + 1) * sizeof *m->lslot);
    return m;
}

void tsr_filter_meta_destroy(tsr_filter_meta *m)
{
    if (m == NULL)
        return;
    free(m->labels);
    free(m->crowd);
    free(m->tok_off);
    free(m->num_off);
    free(m->toks);
    free(m->nums);
    free(m->lslot);
    free(m);
}

size_t tsr_filter_meta_rows(const tsr_filter_meta *m)
{
    return m->n;
}

int64_t tsr_filter_meta_label(const tsr_filter_meta *m, uint32_t row)
{
    return row < m->n ? m->labels[row] : -1;
}

uint32_t tsr_filter_meta_crowding(const tsr_filter_meta *m, uint32_t row)
{
    return row < m->n ? m->crowd[row] : TSR_FILTER_NOID;
}

const tsr_filter_dict *tsr_filter_meta_dict(const tsr_filter_meta *m)
{
    return m->dict;
}

static size_t label_slot(const tsr_filter_meta *m, int64_t label)
{
    size_t i = (size_t)hash_label(label) & m->lmask;
    for (;;) {
        uint32_t r = m->lslot[i];
        if (r == TSR_FILTER_NOID || m->labels[r] == label)
            return i;
        i = (i + 1) & m->lmask;
    }
}

int tsr_filter_meta_find(const tsr_filter_meta *m, int64_t label, uint32_t *row)
{
    uint32_t r = m->lslot[label_slot(m, label)];
    if (r == TSR_FILTER_NOID)
        return -1;
    if (row)
        *row = r;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_num_entry(const void *a, const void *b)
{
    uint32_t x = ((const num_entry *)a)->ns, y = ((const num_entry *)b)->ns;
    return (x > y) - (x < y);
}

static int meta_reserve_rows(tsr_filter_meta *m)
{
    if (m->n < m->cap)
        return 0;
    size_t nc = m->cap ? m->cap * 2 : 256;
    int64_t *l = tsr_try_realloc(m->labels, nc, sizeof *l);
    if (l == NULL)
        return TSR_ENOMEM;
    m->labels = l;
    uint32_t *c = tsr_try_realloc(m->crowd, nc, sizeof *c);
    if (c == NULL)
        return TSR_ENOMEM;
    m->crowd = c;
    size_t *to = tsr_try_realloc(m->tok_off, nc + 1, sizeof *to);
    if (to == NULL)
        return TSR_ENOMEM;
    m->tok_off = to;
    size_t *no = tsr_try_realloc(m->num_off, nc + 1, sizeof *no);
    if (no == NULL)
        return TSR_ENOMEM;
    m->num_off = no;
    m->cap = nc;
    return 0;
}

static int meta_grow_labels(tsr_filter_meta *m)
{
    size_t nslots = (m->lmask + 1) * 2;
    uint32_t *s = tsr_try_malloc(nslots, sizeof *s);
    if (s == NULL)
        return TSR_ENOMEM;
    memset(s, 0xff, nslots * sizeof *s);
    for (uint32_t r = 0; r < m->n; r++) {
        size_t i = (size_t)hash_label(m->labels[r]) & (nslots - 1);
        while (s[i] != TSR_FILTER_NOID)
            i = (i + 1) & (nslots - 1);
        s[i] = r;
    }
    free(m->lslot);
    m->lslot = s;
    m->lmask = nslots - 1;
    return 0;
}

static int intern_cstr(tsr_filter_dict *d, const char *s, uint32_t *id, tsr_error *err,
                       const char *what)
{
    if (s == NULL)
        return tsr_err(err, TSR_EINVAL, "filter: %s is NULL", what);
    int rc = tsr_filter_dict_intern(d, s, strlen(s), id);
    if (rc != 0)
        return tsr_err(err, rc, "filter: cannot intern %s \"%.64s\": %s", what, s,
                       tsr_strerror(rc));
    return 0;
}

int tsr_filter_meta_add(tsr_filter_meta *m, int64_t label, const tsr_datapoint *dp,
                        uint32_t *row, tsr_error *err)
{
    int rc;
    if (m->n >= TSR_FILTER_MAX_IDS)
        return tsr_err(err, TSR_ELIMIT, "filter meta: more than %u rows", TSR_FILTER_MAX_IDS);
    size_t li = label_slot(m, label);
    if (m->lslot[li] != TSR_FILTER_NOID)
        return tsr_err(err, TSR_EINVAL, "filter meta: label %lld added twice", (long long)label);
    if ((m->n + 1) * 2 > m->lmask + 1) { /* load factor <= 1/2: a free slot always exists */
        if (meta_grow_labels(m) != 0)
            return tsr_err(err, TSR_ENOMEM, "filter meta: out of memory for the label table");
        li = label_slot(m, label);
    }
    if ((rc = meta_reserve_rows(m)) != 0)
        return tsr_err(err, rc, "filter meta: out of memory for row %zu", m->n);

    size_t want = 0;
    for (size_t i = 0; i < dp->nrestricts; i++)
        want += dp->restricts[i].nallow + dp->restricts[i].ndeny;
    if (m->toks_cap - m->ntoks < want) {
        size_t nc = m->toks_cap ? m->toks_cap : 1024;
        while (nc - m->ntoks < want)
            nc *= 2;
        uint64_t *t = tsr_try_realloc(m->toks, nc, sizeof *t);
        if (t == NULL)
            return tsr_err(err, TSR_ENOMEM, "filter meta: out of memory for %zu tokens", nc);
        m->toks = t;
        m->toks_cap = nc;
    }
    if (m->nums_cap - m->nnums < dp->nnumeric) {
        size_t nc = m->nums_cap ? m->nums_cap : 256;
        while (nc - m->nnums < dp->nnumeric)
            nc *= 2;
        num_entry *t = tsr_try_realloc(m->nums, nc, sizeof *t);
        if (t == NULL)
            return tsr_err(err, TSR_ENOMEM, "filter meta: out of memory for %zu numerics", nc);
        m->nums = t;
        m->nums_cap = nc;
    }

    /* Write the row's entries past the current end; they become visible only when n is
     * incremented below, so a failure midway leaves the meta unchanged. */
    uint64_t *tk = m->toks + m->ntoks;
    size_t nt = 0;
    for (size_t i = 0; i < dp->nrestricts; i++) {
        const tsr_token_restrict *r = &dp->restricts[i];
        uint32_t ns, tok;
        if ((rc = intern_cstr(m->dict, r->ns, &ns, err, "namespace")) != 0)
            return rc;
        for (size_t j = 0; j < r->nallow; j++) {
            if ((rc = intern_cstr(m->dict, r->allow[j], &tok, err, "token")) != 0)
                return rc;
            tk[nt++] = KEY(ns, tok, 0);
        }
        for (size_t j = 0; j < r->ndeny; j++) {
            if ((rc = intern_cstr(m->dict, r->deny[j], &tok, err, "token")) != 0)
                return rc;
            tk[nt++] = KEY(ns, tok, 1);
        }
    }
    if (nt > 1)
        qsort(tk, nt, sizeof *tk, cmp_u64);
    size_t w = 0;
    for (size_t i = 0; i < nt; i++)
        if (w == 0 || tk[w - 1] != tk[i])
            tk[w++] = tk[i];
    nt = w;

    num_entry *ne = m->nums + m->nnums;
    for (size_t i = 0; i < dp->nnumeric; i++) {
        const tsr_numeric_restrict *nr = &dp->numeric[i];
        uint32_t ns;
        if ((rc = intern_cstr(m->dict, nr->ns, &ns, err, "numeric namespace")) != 0)
            return rc;
        ne[i].ns = ns;
        switch (nr->type) {
        case TSR_NUM_INT:
            ne[i].is_int = 1;
            ne[i].v.i = nr->v.i;
            break;
        case TSR_NUM_FLOAT:
            ne[i].is_int = 0;
            ne[i].v.d = (double)nr->v.f;
            break;
        case TSR_NUM_DOUBLE:
            ne[i].is_int = 0;
            ne[i].v.d = nr->v.d;
            break;
        default:
            return tsr_err(err, TSR_EINVAL, "filter meta: numeric \"%.64s\" has bad type %d",
                           nr->ns, (int)nr->type);
        }
    }
    if (dp->nnumeric > 1)
        qsort(ne, dp->nnumeric, sizeof *ne, cmp_num_entry);

    uint32_t tag = TSR_FILTER_NOID; /* no tag (or ""): never limited by crowding */
    if (dp->crowding_tag != NULL && dp->crowding_tag[0] != '\0' &&
        (rc = intern_cstr(m->dict, dp->crowding_tag, &tag, err, "crowding tag")) != 0)
        return rc;

    uint32_t r = (uint32_t)m->n;
    m->labels[r] = label;
    m->crowd[r] = tag;
    m->ntoks += nt;
    m->nnums += dp->nnumeric;
    m->tok_off[r + 1] = m->ntoks;
    m->num_off[r + 1] = m->nnums;
    m->lslot[li] = r;
    m->n++;
    if (row)
        *row = r;
    return 0;
}

/* ---- compiled filter ------------------------------------------------------------------- */

typedef struct tok_clause {
    uint32_t ns;
    uint32_t a_off, na; /* allow ids in f->ids[a_off .. a_off+na), sorted */
    uint32_t d_off, nd; /* deny ids, sorted */
} tok_clause;

typedef struct num_clause {
    uint32_t ns;
    uint32_t is_int;
    enum tsr_num_op op;
    union {
        int64_t i;
        double d;
    } v;
} num_clause;

struct tsr_filter {
    int all, none;
    tok_clause *tc;
    size_t ntc;
    uint32_t *ids;
    num_clause *nc; /* sorted by ns */
    size_t nnc;
};

void tsr_filter_destroy(tsr_filter *f)
{
    if (f == NULL)
        return;
    free(f->tc);
    free(f->ids);
    free(f->nc);
    free(f);
}

int tsr_filter_matches_all(const tsr_filter *f)
{
    return f == NULL || f->all;
}

int tsr_filter_matches_none(const tsr_filter *f)
{
    return f != NULL && f->none;
}

/* A query term during compilation: kind 0 = "this ns had an allow token", 1 = known allow
 * token, 2 = known deny token. Sorting by (ns, kind, tok) groups a namespace's terms. */
typedef struct qterm {
    uint32_t ns, kind, tok;
} qterm;

static int cmp_qterm(const void *a, const void *b)
{
    const qterm *x = a, *y = b;
    if (x->ns != y->ns)
        return x->ns < y->ns ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return (x->tok > y->tok) - (x->tok < y->tok);
}

static int cmp_num_clause(const void *a, const void *b)
{
    uint32_t x = ((const num_clause *)a)->ns, y = ((const num_clause *)b)->ns;
    return (x > y) - (x < y);
}

int tsr_filter_compile(const tsr_filter_dict *dict, const tsr_token_restrict *r, size_t nr,
                       const tsr_numeric_query *nq, size_t nn, tsr_filter **out,
                       tsr_error *err)
{
    int rc = 0;
    qterm *qt = NULL;
    tsr_filter *f = calloc(1, sizeof *f);
    *out = NULL;
    if (f == NULL)
        return tsr_err(err, TSR_ENOMEM, "filter: out of memory");

    size_t nterms = 0;
    for (size_t i = 0; i < nr; i++) {
        if (r[i].ns == NULL)
            return tsr_filter_destroy(f), tsr_err(err, TSR_EINVAL, "filter: restrict %zu has no namespace", i);
        size_t t = r[i].nallow + r[i].ndeny + 1;
        if (t < r[i].nallow || nterms + t < nterms)
            return tsr_filter_destroy(f), tsr_err(err, TSR_EINVAL, "filter: too many tokens");
        nterms += t;
    }
    qt = tsr_try_malloc(nterms ? nterms : 1, sizeof *qt);
    f->ids = tsr_try_malloc(nterms ? nterms : 1, sizeof *f->ids);
    f->tc = tsr_try_malloc(nr ? nr : 1, sizeof *f->tc);
    f->nc = tsr_try_malloc(nn ? nn : 1, sizeof *f->nc);
    if (!qt || !f->ids || !f->tc || !f->nc) {
        rc = tsr_err(err, TSR_ENOMEM, "filter: out of memory for %zu query tokens", nterms);
        goto fail;
    }

    size_t k = 0;
    for (size_t i = 0; i < nr; i++) {
        const tsr_token_restrict *q = &r[i];
        uint32_t ns = tsr_filter_dict_lookup(dict, q->ns, strlen(q->ns));
        if (ns == TSR_FILTER_NOID) {
            /* No datapoint has tokens in this namespace: allow tokens can match nothing,
             * deny tokens exclude nothing. */
            if (q->nallow > 0)
                f->none = 1;
            continue;
        }
        if (q->nallow > 0)
            qt[k++] = (qterm){ns, 0, 0};
        for (size_t j = 0; j < q->nallow; j++) {
            if (q->allow[j] == NULL) {
                rc = tsr_err(err, TSR_EINVAL, "filter: restrict \"%.64s\" allow token %zu is NULL", q->ns, j);
                goto fail;
            }
            uint32_t t = tsr_filter_dict_lookup(dict, q->allow[j], strlen(q->allow[j]));
            if (t != TSR_FILTER_NOID)
                qt[k++] = (qterm){ns, 1, t};
        }
        for (size_t j = 0; j < q->ndeny; j++) {
            if (q->deny[j] == NULL) {
                rc = tsr_err(err, TSR_EINVAL, "filter: restrict \"%.64s\" deny token %zu is NULL", q->ns, j);
                goto fail;
            }
            uint32_t t = tsr_filter_dict_lookup(dict, q->deny[j], strlen(q->deny[j]));
            if (t != TSR_FILTER_NOID)
                qt[k++] = (qterm){ns, 2, t};
        }
    }
    if (k > 1)
        qsort(qt, k, sizeof *qt, cmp_qterm);
    size_t nid = 0;
    for (size_t i = 0; i < k;) {
        size_t j = i;
        uint32_t ns = qt[i].ns;
        int had_allow = 0;
        tok_clause *c = &f->tc[f->ntc];
        c->ns = ns;
        c->a_off = (uint32_t)nid;
        c->na = c->nd = 0;
        for (; j < k && qt[j].ns == ns && qt[j].kind == 0; j++)
            had_allow = 1;
        for (; j < k && qt[j].ns == ns && qt[j].kind == 1; j++)
            if (c->na == 0 || f->ids[nid - 1] != qt[j].tok)
                f->ids[nid++] = qt[j].tok, c->na++;
        c->d_off = (uint32_t)nid;
        for (; j < k && qt[j].ns == ns && qt[j].kind == 2; j++)
            if (c->nd == 0 || f->ids[nid - 1] != qt[j].tok)
                f->ids[nid++] = qt[j].tok, c->nd++;
        if (had_allow && c->na == 0)
            f->none = 1; /* every allow token of this namespace is unknown */
        if (c->na > 0 || c->nd > 0)
            f->ntc++;
        i = j;
    }

    for (size_t i = 0; i < nn; i++) {
        const tsr_numeric_query *q = &nq[i];
        if (q->ns == NULL) {
            rc = tsr_err(err, TSR_EINVAL, "filter: numeric restrict %zu has no namespace", i);
            goto fail;
        }
        if (q->op < TSR_OP_LESS || q->op > TSR_OP_NOT_EQUAL) {
            rc = tsr_err(err, TSR_EINVAL,
                         "filter: numeric restrict \"%.64s\": operator %d is not one of LESS, "
                         "LESS_EQUAL, EQUAL, GREATER_EQUAL, GREATER, NOT_EQUAL",
                         q->ns, (int)q->op);
            goto fail;
        }
        num_clause *c = &f->nc[f->nnc];
        c->op = q->op;
        switch (q->type) {
        case TSR_NUM_INT:
            c->is_int = 1;
            c->v.i = q->v.i;
            break;
        case TSR_NUM_FLOAT:
            c->is_int = 0;
            c->v.d = (double)q->v.f;
            break;
        case TSR_NUM_DOUBLE:
            c->is_int = 0;
            c->v.d = q->v.d;
            break;
        default:
            rc = tsr_err(err, TSR_EINVAL, "filter: numeric restrict \"%.64s\" has bad type %d",
                         q->ns, (int)q->type);
            goto fail;
        }
        uint32_t ns = tsr_filter_dict_lookup(dict, q->ns, strlen(q->ns));
        if (ns == TSR_FILTER_NOID) {
            f->none = 1; /* no datapoint has a value there */
            continue;
        }
        c->ns = ns;
        f->nnc++;
    }
    if (f->nnc > 1)
        qsort(f->nc, f->nnc, sizeof *f->nc, cmp_num_clause);
    f->all = !f->none && f->ntc == 0 && f->nnc == 0;
    free(qt);
    *out = f;
    return 0;
fail:
    free(qt);
    tsr_filter_destroy(f);
    return rc;
}

static inline int in_set(const uint32_t *s, uint32_t n, uint32_t x)
{
    if (n <= 8) {
        for (uint32_t i = 0; i < n; i++)
            if (s[i] == x)
                return 1;
        return 0;
    }
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s[mid] < x)
            lo = mid + 1;
        else if (s[mid] > x)
            hi = mid;
        else
            return 1;
    }
    return 0;
}

static inline int num_cmp_true(const num_clause *c, const num_entry *e)
{
    int lt, eq;
    if (c->is_int && e->is_int) {
        lt = e->v.i < c->v.i;
        eq = e->v.i == c->v.i;
    } else {
        double a = e->is_int ? (double)e->v.i : e->v.d;
        double b = c->is_int ? (double)c->v.i : c->v.d;
        if (a != a || b != b) /* NaN: only NOT_EQUAL holds, as in IEEE comparisons */
            return c->op == TSR_OP_NOT_EQUAL;
        lt = a < b;
        eq = a == b;
    }
    switch (c->op) {
    case TSR_OP_LESS: return lt;
    case TSR_OP_LESS_EQUAL: return lt || eq;
    case TSR_OP_EQUAL: return eq;
    case TSR_OP_GREATER_EQUAL: return !lt;
    case TSR_OP_GREATER: return !lt && !eq;
    case TSR_OP_NOT_EQUAL: return !eq;
    default: return 0;
    }
}

int tsr_filter_match(const tsr_filter *f, const tsr_filter_meta *m, uint32_t row)
{
    if (f == NULL || f->all)
        return 1;
    if (f->none || row >= m->n)
        return 0;

    const uint64_t *p = m->toks + m->tok_off[row], *end = m->toks + m->tok_off[row + 1];
    for (size_t c = 0; c < f->ntc; c++) {
        const tok_clause *tc = &f->tc[c];
        const uint32_t *allow = f->ids + tc->a_off, *deny = f->ids + tc->d_off;
        uint64_t lo = (uint64_t)tc->ns << 32;
        while (p < end && *p < lo)
            p++;
        int ok = tc->na == 0;
        for (; p < end && KEY_NS(*p) == tc->ns; p++) {
            uint32_t tok = KEY_TOK(*p);
            if (KEY_DENY(*p)) {
                if (in_set(allow, tc->na, tok))
                    return 0; /* datapoint denies a token the query allows */
            } else {
                if (in_set(deny, tc->nd, tok))
                    return 0; /* query denies a token the datapoint has */
                if (!ok && in_set(allow, tc->na, tok))
                    ok = 1;
            }
        }
        if (!ok)
            return 0;
    }

    const num_entry *q = m->nums + m->num_off[row], *qend = m->nums + m->num_off[row + 1];
    for (size_t c = 0; c < f->nnc; c++) {
        const num_clause *nc = &f->nc[c];
        while (q < qend && q->ns < nc->ns)
            q++;
        int ok = 0;
        for (const num_entry *e = q; e < qend && e->ns == nc->ns; e++)
            if (num_cmp_true(nc, e)) {
                ok = 1;
                break;
            }
        if (!ok)
            return 0;
    }
    return 1;
}

int tsr_filter_accept_label(void *ctx, int64_t label)
{
    const tsr_filter_scan *s = ctx;
    uint32_t row;
    if (tsr_filter_matches_none(s->filter))
        return 0;
    if (tsr_filter_meta_find(s->meta, label, &row) != 0)
        return 0;
    return tsr_filter_match(s->filter, s->meta, row);
}
