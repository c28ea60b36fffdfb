/*
 * topk — ranking building blocks of the query path (SPEC §3): a bounded heap of the k best
 * (distance, label) hits for "smaller is better" (L2) and "larger is better" (dot product),
 * the greedy crowding pass, a per-shard crowded top-k collector whose union over shards
 * always contains the global crowded answer, a k-way merge of sorted lists (optionally
 * with the crowding pass), and reciprocal rank fusion of a dense and a sparse list.
 *
 * Order: hit a ranks before hit b when its distance is better, and on equal distances
 * when its label is smaller. This total order is used everywhere (heap, merge, crowding,
 * brute force in tests), so a distributed answer is bit-for-bit the single-node answer
 * even with ties. Distances are compared with < on floats; NaN distances must not be fed.
 *
 * Crowding tags are uint32 ids (a tsr_filter_dict id on a shard; the coordinator interns
 * the tag strings the shards return). The limit c means: at most c hits per tag; c == 0 or
 * c >= k means no limit. A hit without a crowding tag (TSR_TOPK_NOTAG; the shards send ""
 * for it) is never limited: it behaves like a tag of its own.
 */
#ifndef TSR_TOPK_H
#define TSR_TOPK_H

#include <stddef.h>
#include <stdint.h>

#include "core/heap.h"

#define TSR_TOPK_NOTAG UINT32_MAX /* == TSR_FILTER_NOID: no crowding tag, never limited */

typedef struct tsr_hit {
    float dist;
    uint32_t tag;  /* crowding tag id; any value when crowding is off */
    int64_t label;
} tsr_hit;

/* 1 when a ranks strictly before b: the order of core/heap.h (the index engine's k-heap)
 * with its default tie rule, so a shard's hits rank as its scan ranked them. */
static inline int tsr_hit_better(const tsr_hit *a, const tsr_hit *b, int larger_better)
{
    return tsr_heap_worse(larger_better ? TSR_HEAP_LARGER_BETTER : 0, b->dist, b->label,
                          a->dist, a->label);
}

/* Sorts best first (the total order above). */
void tsr_hits_sort(tsr_hit *h, size_t n, int larger_better);

/* ---- bounded top-k heap (caller-embedded) --------------------------------------------- */
typedef struct tsr_topk {
    size_t k, n;
    int larger_better;
    tsr_hit *h; /* owned; heap with the worst kept hit at h[0] */
} tsr_topk;

/* k may be 0 (keeps nothing). k entries are allocated up front, so a caller bounds a k
 * that comes from a request (e.g. by the number of candidates). Returns 0 or TSR_ENOMEM. */
int tsr_topk_init(tsr_topk *t, size_t k, int larger_better);
void tsr_topk_close(tsr_topk *t);
void tsr_topk_reset(tsr_topk *t); /* empties, keeps k and memory */

/* 1 when a hit (dist, label) would enter the heap now. Lets a scan skip the filter test
 * (and the label lookup) for candidates that cannot make it. */
static inline int tsr_topk_would_enter(const tsr_topk *t, float dist, int64_t label)
{
    if (t->n < t->k)
        return 1;
    if (t->k == 0)
        return 0;
    tsr_hit x = {dist, 0, label};
    return tsr_hit_better(&x, &t->h[0], t->larger_better);
}

/* Offers a hit; returns 1 when kept. */
int tsr_topk_push(tsr_topk *t, float dist, uint32_t tag, int64_t label);

/* Sorts the kept hits best first into out[0..n) (out may alias nothing in t) and returns
 * n. The heap is left empty. */
size_t tsr_topk_extract(tsr_topk *t, tsr_hit *out);

/* ---- greedy crowding pass --------------------------------------------------------------- */

/* SPEC §3 crowding: over sorted[0..n) (best first) take hits in order, skipping one whose
 * tag already has c taken, until k are taken. Writes them to out (capacity k, must not
 * alias sorted) and their count to *nout. c == 0 or c >= k: the first min(n, k).
 * Returns 0 or TSR_ENOMEM. */
int tsr_crowd_select(const tsr_hit *sorted, size_t n, size_t k, size_t c, tsr_hit *out,
                     size_t *nout);

/* ---- per-shard crowded top-k collector ------------------------------------------------------
 * Accepts candidates in any order and keeps at most k hits, at most c per tag, such that
 * tsr_crowd_topk_extract returns exactly tsr_crowd_select over all the candidates offered.
 * Why a shard's answer is enough for the global one is argued in topk.c. */
typedef struct tsr_crowd_topk {
    tsr_topk heap;     /* the kept set R (worst at the root) */
    size_t c;          /* 0 = no limit */
    uint32_t *slot_tag; /* per-tag counts in R, open addressing */
    uint32_t *slot_cnt;
    size_t mask, used; /* slots - 1; occupied slots (including count 0) */
} tsr_crowd_topk;

int tsr_crowd_topk_init(tsr_crowd_topk *t, size_t k, size_t c, int larger_better);
void tsr_crowd_topk_close(tsr_crowd_topk *t);
static inline int tsr_crowd_topk_would_enter(const tsr_crowd_topk *t, float dist, int64_t label)
{
    return tsr_topk_would_enter(&t->heap, dist, label);
}
/* Offers a hit; returns 1 when kept, 0 when not, TSR_ENOMEM. */
int tsr_crowd_topk_push(tsr_crowd_topk *t, float dist, uint32_t tag, int64_t label);
/* Best first into out (capacity k); returns the count; leaves t empty. */
size_t tsr_crowd_topk_extract(tsr_crowd_topk *t, tsr_hit *out);

/* ---- k-way merge --------------------------------------------------------------------------- */

/* Merges nlists lists, each sorted best first, into the k best (with the crowding pass
 * when 0 < c < k) into out (capacity k); count in *nout. Labels are assumed distinct
 * across lists. Returns 0 or TSR_ENOMEM. */
int tsr_topk_merge(const tsr_hit *const *lists, const size_t *lens, size_t nlists,
                   int larger_better, size_t k, size_t c, tsr_hit *out, size_t *nout);

/* ---- reciprocal rank fusion ------------------------------------------------------------------ */

#define TSR_RRF_K0 60.0 /* the customary RRF constant (Cormack et al.); see docs */

typedef struct tsr_rrf_hit {
    double score;       /* alpha/(k0+rank_dense) + (1-alpha)/(k0+rank_sparse) */
    int64_t label;
    uint32_t tag;
    int in_dense, in_sparse;
    float dist;         /* dense distance when in_dense */
    float sparse_dist;  /* sparse dot product when in_sparse */
    uint32_t rank_dense, rank_sparse; /* 1-based, shared by ties; 0 when absent */
} tsr_rrf_hit;

/* Fuses a dense list and a sparse list (each sorted best first) with weight alpha in
 * [0, 1] and constant k0 (> 0; use TSR_RRF_K0). The rank of a hit in a list is 1 + the
 * number of hits of that list with a strictly better value (competition ranking: equal
 * distances, or equal sparse scores, share a rank). A label in both lists gets both terms;
 * a label absent from a list contributes 0 for it; a label whose only list has weight 0 is
 * left out (alpha == 1 is dense only, alpha == 0 is sparse only). Results sorted by score
 * descending, ties by dense rank (in the dense list before not in it), then label
 * ascending; the crowding pass applied when 0 < c < k (tags are taken from the dense hit,
 * else the sparse hit), at most k into out. The output depends only on the two lists, not
 * on k (top-k is the prefix of top-(k+1) for the same lists). Returns 0, TSR_EINVAL (alpha
 * or k0 out of range), TSR_ENOMEM. */
int tsr_rrf_fuse(const tsr_hit *dense, size_t nd, const tsr_hit *sparse, size_t ns,
                 double alpha, double k0, size_t k, size_t c, tsr_rrf_hit *out,
                 size_t *nout);

#endif
