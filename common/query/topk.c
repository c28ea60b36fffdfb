/*
 * topk — heaps, the greedy crowding pass, the per-shard crowded collector, k-way merge and
 * reciprocal rank fusion (interface and order in topk.h).
 *
 * Exactness of crowding across shards. Fix the total order of topk.h. For a candidate set
 * X let P(X) be the hits that are among the c best of their own tag within X. The greedy
 * pass over X skips a hit exactly when c better hits of its tag were already taken, and
 * before the k-th pick every one of the c best of a tag is taken, so
 *     greedy(X) = the k best of P(X).                                          (1)
 * Lemma: for Y ⊆ X and x ∈ Y, x ∈ greedy(X) implies x ∈ greedy(Y).
 *   x is among the c best of its tag in X, so also in Y: x ∈ P(Y). For a tag t, let
 *   L_t be the hits of P(Y) with tag t better than x and G_t those of P(X). |L_t| ≤ c and
 *   the L_t are |L_t| hits of tag t in X better than x, so the c best of tag t in X contain
 *   at least min(c, |L_t|) = |L_t| hits better than x: |G_t| ≥ |L_t|. Summing over tags,
 *   P(Y) has no more hits better than x than P(X) has, which is < k by (1). So x is among
 *   the k best of P(Y), i.e. in greedy(Y).                                       ∎
 * With Y = a shard's candidates: every hit of the global answer G = greedy(all) is in its
 * own shard's crowded top-k. With Y = U, the union of the shards' crowded top-k lists:
 * G ⊆ greedy(U). If |G| = k both have k hits and are equal. If |G| < k then G = P(all),
 * every shard has |P(shard)| ≤ |P(all)| < k (per tag min(c, n_shard,t) ≤ min(c, n_t)) and
 * returns all of P(shard), which contains the c best of every tag that live on it; so a
 * hit of U outside P(all) has c better hits of its tag in U and is not in P(U): greedy(U)
 * ⊆ P(U) ⊆ P(all) = G. Hence the coordinator's greedy pass over the union of the shards'
 * answers is exactly the single-node answer. The test test_topk checks this on random
 * splits. A hit without a tag (TSR_TOPK_NOTAG) is never limited, which is the same as
 * giving it a tag of its own (c >= 1), so the argument covers it.
 *
 * The collector keeps R = the k best of S, where S is "the c best of every tag seen so
 * far". A hit dropped from R never returns: k hits of S are better than it, and S only
 * changes by a hit being replaced by a better one of the same tag. Every question the
 * update needs ("how many hits of tag t in S are better than x?") concerns hits better
 * than R's worst, which are all in R, so R plus per-tag counts over R is enough.
 */
#include "query/topk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/mem.h"

/* ---- sorting ------------------------------------------------------------------------------- */

static int cmp_small(const void *a, const void *b)
{
    const tsr_hit *x = a, *y = b;
    if (tsr_hit_better(x, y, 0))
        return -1;
    if (tsr_hit_better(y, x, 0))
        return 1;
    return 0;
}

static int cmp_large(const void *a, const void *b)
{
    const tsr_hit *x = a, *y = b;
    if (tsr_hit_better(x, y, 1))
        return -1;
    if (tsr_hit_better(y, x, 1))
        return 1;
    return 0;
}

void tsr_hits_sort(tsr_hit *h, size_t n, int larger_better)
{
    if (n > 1)
        qsort(h, n, sizeof *h, larger_better ? cmp_large : cmp_small);
}

/* ---- heap with the worst at the root ------------------------------------------------------ */
/* Its order is core/heap.h's (tsr_hit_better); its storage is not: the hits are tsr_hit
 * records (distance, crowding tag, label) that callers read in place, the heap fills up
 * from empty (sift-up, no sentinels: a real hit at +inf must still enter) and the crowded
 * collector replaces a hit at any position (fix_at). core/heap is the fixed-size,
 * sentinel-filled form over parallel output arrays that the index kernels need. */

int tsr_topk_init(tsr_topk *t, size_t k, int larger_better)
{
    t->k = k;
    t->n = 0;
    t->larger_better = larger_better ? 1 : 0;
    t->h = tsr_try_malloc(k ? k : 1, sizeof *t->h);
    return t->h ? 0 : TSR_ENOMEM;
}

void tsr_topk_close(tsr_topk *t)
{
    free(t->h);
    t->h = NULL;
    t->n = t->k = 0;
}

void tsr_topk_reset(tsr_topk *t)
{
    t->n = 0;
}

/* worse(a, b): a ranks after b */
#define WORSE(t, a, b) tsr_hit_better((b), (a), (t)->larger_better)

static void sift_up(tsr_topk *t, size_t i)
{
    tsr_hit x = t->h[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!WORSE(t, &x, &t->h[p]))
            break;
        t->h[i] = t->h[p];
        i = p;
    }
    t->h[i] = x;
}

static void sift_down(tsr_topk *t, size_t i)
{
    tsr_hit x = t->h[i];
    size_t n = t->n;
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        const tsr_hit *wh = &x;
        if (l < n && WORSE(t, &t->h[l], wh))
            w = l, wh = &t->h[l];
        if (l + 1 < n && WORSE(t, &t->h[l + 1], wh))
            w = l + 1;
        if (w == i)
            break;
        t->h[i] = t->h[w];
        i = w;
    }
    t->h[i] = x;
}

/* Restores the heap after h[i] changed arbitrarily. */
static void fix_at(tsr_topk *t, size_t i)
{
    if (i > 0 && WORSE(t, &t->h[i], &t->h[(i - 1) / 2]))
        sift_up(t, i);
    else
        sift_down(t, i);
}

int tsr_topk_push(tsr_topk *t, float dist, uint32_t tag, int64_t label)
{
    tsr_hit x = {dist, tag, label};
    if (t->n < t->k) {
        t->h[t->n] = x;
        sift_up(t, t->n++);
        return 1;
    }
    if (t->k == 0 || !tsr_hit_better(&x, &t->h[0], t->larger_better))
        return 0;
    t->h[0] = x;
    sift_down(t, 0);
    return 1;
}

size_t tsr_topk_extract(tsr_topk *t, tsr_hit *out)
{
    size_t n = t->n;
    if (n)
        memcpy(out, t->h, n * sizeof *out);
    tsr_hits_sort(out, n, t->larger_better);
    t->n = 0;
    return n;
}

/* ---- per-tag counters ------------------------------------------------------------------------ */

typedef struct tagcount {
    uint32_t *tag;
    uint32_t *cnt;
    size_t mask, used;
} tagcount;

static int tc_init(tagcount *tc, size_t entries)
{
    size_t slots = 16;
    while (slots < 2 * entries + 2) {
        if (slots > SIZE_MAX / 4)
            return TSR_ENOMEM;
        slots *= 2;
    }
    tc->tag = tsr_try_malloc(slots, sizeof *tc->tag);
    tc->cnt = tsr_try_calloc(slots, sizeof *tc->cnt);
    tc->mask = slots - 1;
    tc->used = 0;
    if (!tc->tag || !tc->cnt) {
        free(tc->tag);
        free(tc->cnt);
        tc->tag = tc->cnt = NULL;
        return TSR_ENOMEM;
    }
    return 0;
}

static void tc_close(tagcount *tc)
{
    free(tc->tag);
    free(tc->cnt);
    tc->tag = tc->cnt = NULL;
}

static inline size_t tc_hash(uint32_t tag)
{
    return (size_t)(((uint64_t)tag * 0x9e3779b97f4a7c15ull) >> 32);
}

/* Count of tag (low 31 bits; the top bit marks a used slot), inserted with count 0 when
 * insert is set, else NULL when absent. The caller keeps used < slots. */
static inline uint32_t *tc_find(tagcount *tc, uint32_t tag, int insert)
{
    size_t i = tc_hash(tag) & tc->mask;
    for (;;) {
        uint32_t c = tc->cnt[i];
        if (!(c & 0x80000000u)) { /* never used */
            if (!insert)
                return NULL;
            tc->tag[i] = tag;
            tc->cnt[i] = 0x80000000u;
            tc->used++;
            return &tc->cnt[i];
        }
        if (tc->tag[i] == tag)
            return &tc->cnt[i];
        i = (i + 1) & tc->mask;
    }
}

/* ---- greedy crowding pass ------------------------------------------------------------------- */

int tsr_crowd_select(const tsr_hit *sorted, size_t n, size_t k, size_t c, tsr_hit *out,
                     size_t *nout)
{
    size_t m = 0;
    if (c == 0 || c >= k) {
        m = n < k ? n : k;
        if (m)
            memcpy(out, sorted, m * sizeof *out);
        *nout = m;
        return 0;
    }
    tagcount tc;
    if (tc_init(&tc, k) != 0)
        return TSR_ENOMEM;
    for (size_t i = 0; i < n && m < k; i++) {
        if (sorted[i].tag != TSR_TOPK_NOTAG) {
            uint32_t *cnt = tc_find(&tc, sorted[i].tag, 1);
            if ((*cnt & 0x7fffffffu) >= c)
                continue;
            (*cnt)++;
        }
        out[m++] = sorted[i];
    }
    tc_close(&tc);
    *nout = m;
    return 0;
}

/* ---- crowded collector --------------------------------------------------------------------- */

static int crowd_tc_rebuild(tsr_crowd_topk *t)
{
    tagcount tc;
    if (tc_init(&tc, 2 * t->heap.k) != 0)
        return TSR_ENOMEM;
    for (size_t i = 0; i < t->heap.n; i++)
        if (t->heap.h[i].tag != TSR_TOPK_NOTAG)
            (*tc_find(&tc, t->heap.h[i].tag, 1))++;
    free(t->slot_tag);
    free(t->slot_cnt);
    t->slot_tag = tc.tag;
    t->slot_cnt = tc.cnt;
    t->mask = tc.mask;
    t->used = tc.used;
    return 0;
}

static tagcount crowd_tc(tsr_crowd_topk *t)
{
    tagcount tc = {t->slot_tag, t->slot_cnt, t->mask, t->used};
    return tc;
}

int tsr_crowd_topk_init(tsr_crowd_topk *t, size_t k, size_t c, int larger_better)
{
    memset(t, 0, sizeof *t);
    if (tsr_topk_init(&t->heap, k, larger_better) != 0)
        return TSR_ENOMEM;
    t->c = (c == 0 || c >= k) ? 0 : c;
    if (t->c && crowd_tc_rebuild(t) != 0) {
        tsr_topk_close(&t->heap);
        return TSR_ENOMEM;
    }
    return 0;
}

void tsr_crowd_topk_close(tsr_crowd_topk *t)
{
    tsr_topk_close(&t->heap);
    free(t->slot_tag);
    free(t->slot_cnt);
    t->slot_tag = t->slot_cnt = NULL;
}

int tsr_crowd_topk_push(tsr_crowd_topk *t, float dist, uint32_t tag, int64_t label)
{
    tsr_topk *h = &t->heap;
    if (t->c == 0)
        return tsr_topk_push(h, dist, tag, label);
    if (!tsr_topk_would_enter(h, dist, label))
        return 0;
    /* keep at most half the slots occupied (stale tags with count 0 included) */
    if (t->used * 2 >= t->mask + 1 && crowd_tc_rebuild(t) != 0)
        return TSR_ENOMEM;
    tsr_hit x = {dist, tag, label};
    tagcount tc = crowd_tc(t);
    uint32_t *cnt = tag == TSR_TOPK_NOTAG ? NULL : tc_find(&tc, tag, 1);
    t->used = tc.used;
    if (cnt != NULL && (*cnt & 0x7fffffffu) >= t->c) {
        /* tag t is full in R: x replaces the worst hit of its tag if it is better */
        size_t w = SIZE_MAX;
        for (size_t i = 0; i < h->n; i++)
            if (h->h[i].tag == tag && (w == SIZE_MAX || WORSE(h, &h->h[i], &h->h[w])))
                w = i;
        if (w == SIZE_MAX || !tsr_hit_better(&x, &h->h[w], h->larger_better))
            return 0;
        h->h[w] = x;
        fix_at(h, w);
        return 1;
    }
    if (h->n == h->k) {
        if (h->h[0].tag != TSR_TOPK_NOTAG)
            (*tc_find(&tc, h->h[0].tag, 0))--;
        h->h[0] = x;
        sift_down(h, 0);
    } else {
        h->h[h->n] = x;
        sift_up(h, h->n++);
    }
    if (cnt != NULL)
        (*cnt)++;
    return 1;
}

size_t tsr_crowd_topk_extract(tsr_crowd_topk *t, tsr_hit *out)
{
    size_t n = tsr_topk_extract(&t->heap, out);
    if (t->c)
        crowd_tc_rebuild(t); /* counts of an empty R; on ENOMEM the next push retries */
    return n;
}

/* ---- k-way merge --------------------------------------------------------------------------- */

typedef struct mhead {
    const tsr_hit *cur, *end;
} mhead;

/* min-heap by "better" over list heads */
static void mh_down(mhead *hh, size_t n, size_t i, int lb)
{
    mhead x = hh[i];
    for (;;) {
        size_t l = 2 * i + 1, b = i;
        const tsr_hit *bh = x.cur;
        if (l < n && tsr_hit_better(hh[l].cur, bh, lb))
            b = l, bh = hh[l].cur;
        if (l + 1 < n && tsr_hit_better(hh[l + 1].cur, bh, lb))
            b = l + 1;
        if (b == i)
            break;
        hh[i] = hh[b];
        i = b;
    }
    hh[i] = x;
}

int tsr_topk_merge(const tsr_hit *const *lists, const size_t *lens, size_t nlists,
                   int larger_better, size_t k, size_t c, tsr_hit *out, size_t *nout)
{
    int lb = larger_better ? 1 : 0;
    int crowd = c != 0 && c < k;
    tagcount tc = {0};
    mhead *hh = tsr_try_malloc(nlists ? nlists : 1, sizeof *hh);
    if (hh == NULL)
        return TSR_ENOMEM;
    if (crowd && tc_init(&tc, k) != 0) {
        free(hh);
        return TSR_ENOMEM;
    }
    size_t n = 0, m = 0;
    for (size_t i = 0; i < nlists; i++)
        if (lens[i] > 0)
            hh[n++] = (mhead){lists[i], lists[i] + lens[i]};
    for (size_t i = n; i-- > 0;)
        mh_down(hh, n, i, lb);
    while (n > 0 && m < k) {
        const tsr_hit *x = hh[0].cur;
        if (crowd && x->tag != TSR_TOPK_NOTAG) {
            uint32_t *cnt = tc_find(&tc, x->tag, 1);
            if ((*cnt & 0x7fffffffu) < c) {
                (*cnt)++;
                out[m++] = *x;
            }
        } else {
            out[m++] = *x;
        }
        if (++hh[0].cur == hh[0].end)
            hh[0] = hh[--n];
        if (n > 0)
            mh_down(hh, n, 0, lb);
    }
    free(hh);
    if (crowd)
        tc_close(&tc);
    *nout = m;
    return 0;
}

/* ---- reciprocal rank fusion ---------------------------------------------------------------- */

typedef struct rrf_entry {
    int64_t label;
    uint32_t src;  /* 0 dense, 1 sparse */
    uint32_t idx;  /* index in its list */
    uint32_t rank; /* 1 + the number of hits of its list with a strictly better value */
} rrf_entry;

static int cmp_rrf_entry(const void *a, const void *b)
{
    const rrf_entry *x = a, *y = b;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Fused order: score descending; ties by dense rank (a hit of the dense list before one
 * that is not in it, a better rank first), then label ascending. */
static int cmp_rrf_hit(const void *a, const void *b)
{
    const tsr_rrf_hit *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    uint32_t rx = x->in_dense ? x->rank_dense : UINT32_MAX;
    uint32_t ry = y->in_dense ? y->rank_dense : UINT32_MAX;
    if (rx != ry)
        return rx < ry ? -1 : 1;
    return (x->label > y->label) - (x->label < y->label);
}

/* Appends the entries of one list (sorted best first) to e at *n: rank = the index + 1 of
 * the first hit with the same value (standard competition ranking, "1224"), so hits the
 * list cannot tell apart share a rank and their order in it does not matter. */
static void rrf_add_list(rrf_entry *e, size_t *n, const tsr_hit *h, size_t nh, uint32_t src)
{
    uint32_t rank = 1;
    for (size_t i = 0; i < nh; i++) {
        if (i > 0 && h[i].dist != h[i - 1].dist)
            rank = (uint32_t)i + 1;
        e[(*n)++] = (rrf_entry){h[i].label, src, (uint32_t)i, rank};
    }
}

int tsr_rrf_fuse(const tsr_hit *dense, size_t nd, const tsr_hit *sparse, size_t ns,
                 double alpha, double k0, size_t k, size_t c, tsr_rrf_hit *out,
                 size_t *nout)
{
    *nout = 0;
    if (!(alpha >= 0.0 && alpha <= 1.0) || !(k0 > 0.0) || isinf(k0))
        return TSR_EINVAL;
    if (nd > UINT32_MAX || ns > UINT32_MAX)
        return TSR_EINVAL;
    size_t ne = (alpha > 0.0 ? nd : 0) + (alpha < 1.0 ? ns : 0);
    rrf_entry *e = tsr_try_malloc(ne ? ne : 1, sizeof *e);
    tsr_rrf_hit *f = tsr_try_malloc(ne ? ne : 1, sizeof *f);
    if (e == NULL || f == NULL) {
        free(e);
        free(f);
        return TSR_ENOMEM;
    }
    size_t n = 0;
    if (alpha > 0.0)
        rrf_add_list(e, &n, dense, nd, 0);
    if (alpha < 1.0)
        rrf_add_list(e, &n, sparse, ns, 1);
    if (n > 1)
        qsort(e, n, sizeof *e, cmp_rrf_entry);
    size_t nf = 0;
    for (size_t i = 0; i < n;) {
        tsr_rrf_hit h;
        memset(&h, 0, sizeof h);
        h.label = e[i].label;
        size_t j = i;
        for (; j < n && e[j].label == h.label; j++) {
            /* a label repeated within one list keeps its best (first) rank */
            if (e[j].src == 0 && !h.in_dense) {
                h.in_dense = 1;
                h.rank_dense = e[j].rank;
                h.dist = dense[e[j].idx].dist;
                h.tag = dense[e[j].idx].tag;
            } else if (e[j].src == 1 && !h.in_sparse) {
                h.in_sparse = 1;
                h.rank_sparse = e[j].rank;
                h.sparse_dist = sparse[e[j].idx].dist;
                if (!h.in_dense)
                    h.tag = sparse[e[j].idx].tag;
            }
        }
        double s = 0.0;
        if (h.in_dense)
            s += alpha / (k0 + (double)h.rank_dense);
        if (h.in_sparse)
            s += (1.0 - alpha) / (k0 + (double)h.rank_sparse);
        h.score = s;
        f[nf++] = h;
        i = j;
    }
    free(e);
    if (nf > 1)
        qsort(f, nf, sizeof *f, cmp_rrf_hit);
    size_t m = 0;
    if (c == 0 || c >= k) {
        m = nf < k ? nf : k;
        if (m)
            memcpy(out, f, m * sizeof *out);
    } else {
        tagcount tc;
        if (tc_init(&tc, k) != 0) {
            free(f);
            return TSR_ENOMEM;
        }
        for (size_t i = 0; i < nf && m < k; i++) {
            if (f[i].tag != TSR_TOPK_NOTAG) {
                uint32_t *cnt = tc_find(&tc, f[i].tag, 1);
                if ((*cnt & 0x7fffffffu) >= c)
                    continue;
                (*cnt)++;
            }
            out[m++] = f[i];
        }
        tc_close(&tc);
    }
    free(f);
    *nout = m;
    return 0;
}
