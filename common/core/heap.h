/*
 * heap — the bounded (distance, id) heap of every k-best selection: the coarse step
 * (index/knn), the PQ scan and the re-rank (index/ivfpq_search).
 *
 * A k-heap keeps the k best entries seen so far with the WORST at the root, so a candidate
 * is compared with d[0] only, and enters (replacing the root) when it is better. Entries
 * are parallel arrays (d, id, optional aux), because the callers' outputs are: the arrays
 * may be the caller's own output rows, sorted in place at the end.
 *
 * The order is total and given by `order`:
 *   distances: smaller is better, or larger (TSR_HEAP_LARGER_BETTER: inner products);
 *   equal distances: the larger id is worse (ascending ids in the output), or the smaller
 *     (TSR_HEAP_TIE_SMALL_ID_WORSE: descending ids). Faiss orders ties by id like this
 *     (cmp2 of its CMax/CMin heaps): an L2 scan keeps ascending ids, an IP scan (a CMin
 *     heap on the un-negated product, here a min-heap on its negation) descending ones.
 * With a total order the output does not depend on the order of the candidates (among
 * exact (distance, id) duplicates, which one stays is immaterial: they are the same).
 *
 * Header-only on purpose: tsr_heap_worse and tsr_heap_replace_top run once per candidate
 * that beats the root in the search kernels' inner loops; inlined, `order` is a load the
 * compiler hoists, and the search times are those of the per-file copies it replaced.
 */
#ifndef TSR_HEAP_H
#define TSR_HEAP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define TSR_HEAP_LARGER_BETTER 1u      /* larger distances are better (inner product) */
#define TSR_HEAP_TIE_SMALL_ID_WORSE 2u /* on equal distances the smaller id is worse */

/* Caller-embedded; the arrays are borrowed (each of k entries; aux may be NULL). */
typedef struct tsr_heap {
    size_t k;
    unsigned order; /* TSR_HEAP_* flags */
    float *d;
    int64_t *id;
    int64_t *aux; /* optional payload moved with the entries (e.g. a label), or NULL */
} tsr_heap;

/* "a is worse than b" in the total order given by `order`. NaN is never worse nor better
 * than anything, so a NaN candidate never enters a heap. */
static inline __attribute__((always_inline)) int
tsr_heap_worse(unsigned order, float da, int64_t ia, float db, int64_t ib)
{
    /* the tie rule is looked at only on equal distances (rare): one compare per call */
    if (order & TSR_HEAP_LARGER_BETTER)
        return da < db || (da == db && ((order & TSR_HEAP_TIE_SMALL_ID_WORSE) ? ia < ib : ia > ib));
    return da > db || (da == db && ((order & TSR_HEAP_TIE_SMALL_ID_WORSE) ? ia < ib : ia > ib));
}

/* Fills the heap with k sentinel entries worse than any real one: distance +inf (-inf when
 * larger is better), id -1, aux -1. */
static inline void tsr_heap_init(tsr_heap *h)
{
    float worst = (h->order & TSR_HEAP_LARGER_BETTER) ? -INFINITY : INFINITY;
    for (size_t i = 0; i < h->k; i++) {
        h->d[i] = worst;
        h->id[i] = -1;
        if (h->aux)
            h->aux[i] = -1;
    }
}

/* The sift-down of tsr_heap_replace_top for one order; inlined twice there so that the
 * distance direction is a constant in each copy (no test of it per comparison). */
static inline __attribute__((always_inline)) void
tsr__heap_sift(tsr_heap *h, float d, int64_t id, int64_t aux, unsigned o)
{
    size_t i = 0, k = h->k;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, c;
        if (l >= k)
            break;
        c = (r < k && tsr_heap_worse(o, h->d[r], h->id[r], h->d[l], h->id[l])) ? r : l;
        if (!tsr_heap_worse(o, h->d[c], h->id[c], d, id))
            break;
        h->d[i] = h->d[c];
        h->id[i] = h->id[c];
        if (h->aux)
            h->aux[i] = h->aux[c];
        i = c;
    }
    h->d[i] = d;
    h->id[i] = id;
    if (h->aux)
        h->aux[i] = aux;
}

/* Replaces the root (the worst entry) with (d, id, aux) and sifts it down. The caller has
 * checked that the candidate is better than the root. */
static inline void tsr_heap_replace_top(tsr_heap *h, float d, int64_t id, int64_t aux)
{
    unsigned tie = h->order & TSR_HEAP_TIE_SMALL_ID_WORSE;
    if (h->order & TSR_HEAP_LARGER_BETTER)
        tsr__heap_sift(h, d, id, aux, TSR_HEAP_LARGER_BETTER | tie);
    else
        tsr__heap_sift(h, d, id, aux, tie);
}

/* Sorts the entries best first, in place (heap sort: pop the root to the end, k log k).
 * The heap is a plain sorted array afterwards. */
static inline void tsr_heap_sort(tsr_heap *h)
{
    size_t k0 = h->k;
    while (h->k > 1) {
        size_t last = h->k - 1;
        float d = h->d[last];
        int64_t id = h->id[last], aux = h->aux ? h->aux[last] : 0;
        float td = h->d[0];
        int64_t tid = h->id[0], taux = h->aux ? h->aux[0] : 0;
        h->k = last;
        tsr_heap_replace_top(h, d, id, aux);
        h->d[last] = td;
        h->id[last] = tid;
        if (h->aux)
            h->aux[last] = taux;
    }
    h->k = k0;
}

#endif
