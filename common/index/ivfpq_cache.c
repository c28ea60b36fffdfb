/*
 * ivfpq_cache — the search cache of an index (ivfpq_search_int.h, tsr__search_cache):
 * derived data built once on first use from the lists as they are then: per stored vector
 * the ADC term ||y||^2 + 2<c, y> (L2 by_residual; also for lists held by the caller:
 * tsr_ivfpq_list_terms), the transposed PQ centroids of the per-query tables, the coarse
 * centroids' norms, and the prefilter's transposed blocks of every list (with the centroid
 * ranks for dsub = 1).
 *
 * DESIGN (threads): the cache is published once with an atomic pointer under `cache_lock`
 * (double-checked), the only lock of this file; read-only afterwards.
 */
#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "index/knn.h"
#include "core/mem.h"

/* ---- search cache: per stored vector ||y||^2 + 2<c, y> (L2 by_residual) ---------------- */

typedef tsr__search_cache search_cache;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static void cache_free(search_cache *c)
{
    if (c == NULL)
        return;
    free(c->sizes);
    free(c->offsets);
    free(c->term);
    free(c->ct);
    free(c->tcodes);
    free(c->toffsets);
    tsr__ranks_unref(c->rk);
    free(c->ct_r);
    free(c->cnorms);
    free(c);
}

void tsr__ivfpq_search_cache_free(tsr_ivfpq *ix)
{
    if (ix == NULL)
        return;
    cache_free(ix->search_cache);
    ix->search_cache = NULL;
}

void tsr_ivfpq_search_invalidate(tsr_ivfpq *ix)
{
    tsr__ivfpq_search_cache_free(ix);
}

/* P[m][j] = ||c_mj||^2 + 2 <cent_m, c_mj> of list l: the same per-entry table as Faiss's
 * precomputed table type 1, so sum_m P[m][code_m] = ||y||^2 + 2 <cent, y>. */
static void list_table(const tsr_ivfpq *ix, size_t l, float *P)
{
    const tsr_pq *pq = &ix->pq;
    const float *cent = ix->centroids + l * (size_t)ix->d;
    for (size_t m = 0; m < pq->M; m++) {
        const float *cm = cent + m * pq->dsub;
        for (size_t j = 0; j < pq->ksub; j++) {
            const float *cj = pq->centroids + (m * pq->ksub + j) * pq->dsub;
            P[m * pq->ksub + j] = tsr__dot(cj, cj, pq->dsub) + 2.0f * tsr__dot(cm, cj, pq->dsub);
        }
    }
}

void tsr_ivfpq_terms_from_table(const tsr_ivfpq *ix, const float *P, const uint8_t *codes,
                                size_t n, float *term)
{
    const tsr_pq *pq = &ix->pq;
    if (pq->nbits == 8)
        tsr__scan8_scalar(P, pq->M, codes, n, NULL, 0.0f, term);
    else
        tsr__scan_generic(P, pq, codes, n, NULL, 0.0f, term);
}

/* Terms of n codes of list l (see tsr_ivfpq_list_terms); P is M * ksub scratch. */
static void list_terms(const tsr_ivfpq *ix, size_t l, const uint8_t *codes, size_t n,
                       float *P, float *term)
{
    list_table(ix, l, P);
    tsr_ivfpq_terms_from_table(ix, P, codes, n, term);
}

int tsr_ivfpq_list_table(const tsr_ivfpq *ix, size_t list, float *P, tsr_error *err)
{
    if (!tsr_ivfpq_has_terms(ix) || list >= ix->nlist || ix->pq.centroids == NULL ||
        ix->centroids == NULL)
        return tsr_err(err, TSR_EINVAL, "list_table: list %zu of %zu, or no terms for this "
                       "index (metric %d, by_residual %d)", list, ix->nlist, (int)ix->metric,
                       ix->by_residual);
    list_table(ix, list, P);
    return 0;
}

int tsr_ivfpq_has_terms(const tsr_ivfpq *ix)
{
    return ix->metric == TSR_METRIC_L2 && ix->by_residual;
}

int tsr_ivfpq_list_terms(const tsr_ivfpq *ix, size_t list, const uint8_t *codes, size_t n,
                         float *term, tsr_error *err)
{
    if (!tsr_ivfpq_has_terms(ix) || list >= ix->nlist || ix->pq.centroids == NULL ||
        ix->centroids == NULL)
        return tsr_err(err, TSR_EINVAL, "list_terms: list %zu of %zu, or no terms for this "
                       "index (metric %d, by_residual %d)", list, ix->nlist, (int)ix->metric,
                       ix->by_residual);
    if (n == 0)
        return 0;
    float *P = tsr_try_malloc(ix->pq.M * ix->pq.ksub, sizeof(float));
    if (P == NULL)
        return tsr_err(err, TSR_ENOMEM, "list_terms: out of memory for a %zu x %zu table",
                       ix->pq.M, ix->pq.ksub);
    list_terms(ix, list, codes, n, P, term);
    free(P);
    return 0;
}

/* The transposed copy is built only where a filter kernel will use it. */
static int filter_wanted(const tsr_pq *pq)
{
    return pq->nbits == 8 && pq->M <= 256 && tsr__filter_env() != 0;
}

/* The prefilter reads ~16 KB from each of nprobe lists scattered over the copy: with
 * 4 KB pages nearly every list costs TLB misses (two-level page walks in a VM), so the
 * copy asks for transparent huge pages (2 MB aligned; madvise is a hint: without THP it
 * is an ordinary allocation). Freed with free(). */
static void *alloc_huge(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        size_t r = (bytes + huge - 1) / huge * huge;
        if (r >= bytes && posix_memalign(&p, huge, r) == 0) {
            (void)madvise(p, r, MADV_HUGEPAGE);
            return p;
        }
        return NULL;
    }
    return tsr_try_aligned(bytes ? bytes : 1, 1);
}

/* Bytes of one prefilter block: M rows of TSR__FBLOCK code bytes, then the block's
 * terms when the variant has them (a multiple of 64: blocks stay 64-aligned). */
size_t tsr__fblock_size(size_t M, int has_term)
{
    return M * TSR__FBLOCK + (has_term ? TSR__FBLOCK * sizeof(float) : 0);
}

static size_t fblock_bytes(const search_cache *c, size_t M)
{
    return tsr__fblock_size(M, c->term != NULL);
}

/* Transposes n codes (and their terms, when term is non-NULL; each code byte mapped
 * through rank when it is non-NULL) into dst, blocks of bsz bytes (tsr__fblock_size),
 * zeroed by the caller. */
void tsr__transpose_list(const uint8_t *codes, const float *term, size_t n, size_t M,
                         size_t bsz, const uint8_t *rank, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t *bp = dst + i / TSR__FBLOCK * bsz;
        const uint8_t *code = codes + i * M;
        for (size_t m = 0; m < M; m++)
            bp[m * TSR__FBLOCK + i % TSR__FBLOCK] = rank ? rank[m * 256 + code[m]] : code[m];
        if (term != NULL)
            memcpy(bp + M * TSR__FBLOCK + i % TSR__FBLOCK * sizeof(float), term + i,
                   sizeof(float));
    }
}

static search_cache *cache_build(const tsr_ivfpq *ix, tsr_error *err)
{
    const tsr_pq *pq = &ix->pq;
    search_cache *c = calloc(1, sizeof *c);
    float *P = NULL;
    if (c == NULL)
        goto oom;
    c->nlist = ix->nlist;
    c->sizes = tsr_try_malloc(ix->nlist, sizeof(size_t));
    c->offsets = tsr_try_malloc(ix->nlist, sizeof(size_t));
    if (c->sizes == NULL || c->offsets == NULL)
        goto oom;
    size_t total = 0;
    for (size_t l = 0; l < ix->nlist; l++) {
        c->sizes[l] = ix->lists[l].size;
        c->offsets[l] = total;
        total += ix->lists[l].size;
    }
    c->ct = tsr_try_aligned(pq->M * pq->ksub, pq->dsub * sizeof(float));
    if (c->ct == NULL)
        goto oom;
    if (ix->metric == TSR_METRIC_L2) {
        c->cnorms = tsr_try_malloc(ix->nlist ? ix->nlist : 1, sizeof(float));
        if (c->cnorms == NULL)
            goto oom;
        tsr_knn_norms(ix->centroids, ix->nlist, (size_t)ix->d, c->cnorms);
    }
    for (size_t m = 0; m < pq->M; m++)
        for (size_t t = 0; t < pq->dsub; t++)
            for (size_t j = 0; j < pq->ksub; j++)
                c->ct[(m * pq->dsub + t) * pq->ksub + j] =
                    pq->centroids[(m * pq->ksub + j) * pq->dsub + t];
    if (ix->metric == TSR_METRIC_L2 && ix->by_residual) {
        c->term = tsr_try_malloc(total ? total : 1, sizeof(float));
        P = tsr_try_malloc(pq->M * pq->ksub, sizeof(float));
        if (c->term == NULL || P == NULL)
            goto oom;
        for (size_t l = 0; l < ix->nlist; l++) {
            const tsr_invlist *L = &ix->lists[l];
            if (L->size == 0)
                continue;
            float *t = c->term + c->offsets[l];
            list_terms(ix, l, L->codes, L->size, P, t);
            for (size_t i = 0; i < L->size; i++) {
                float a = fabsf(t[i]);
                if (!(a <= c->tmax)) /* NaN: never filter (tmax = inf) */
                    c->tmax = a == a ? a : INFINITY;
            }
        }
    }
    if (tsr__ranks_new(pq, &c->rk) != 0)
        goto oom;
    if (c->rk != NULL) { /* dsub = 1: the blocks hold ranks, their tables are in rank order */
        const uint8_t *rank = tsr__ranks_rank(c->rk);
        if ((c->ct_r = tsr_try_aligned(pq->M * 256, sizeof(float))) == NULL)
            goto oom;
        for (size_t m = 0; m < pq->M; m++)
            for (size_t j = 0; j < 256; j++)
                c->ct_r[m * 256 + rank[m * 256 + j]] = c->ct[m * 256 + j];
    }
    if (filter_wanted(pq)) {
        /* One stream per list for the prefilter: each block holds its codes transposed
         * and then (L2 by_residual) its 64 terms, so a list is read front to back. */
        size_t bytes = 0, bsz = fblock_bytes(c, pq->M);
        c->toffsets = tsr_try_malloc(ix->nlist, sizeof(size_t));
        if (c->toffsets == NULL)
            goto oom;
        for (size_t l = 0; l < ix->nlist; l++) {
            size_t nb = (ix->lists[l].size + TSR__FBLOCK - 1) / TSR__FBLOCK, add;
            c->toffsets[l] = bytes;
            if (tsr_mul_ok(nb, bsz, &add) != 0 || bytes + add < bytes)
                goto oom;
            bytes += add;
        }
        c->tbytes = bytes;
        c->tcodes = alloc_huge(bytes);
        if (c->tcodes == NULL)
            goto oom;
        memset(c->tcodes, 0, bytes);
        for (size_t l = 0; l < ix->nlist; l++)
            tsr__transpose_list(ix->lists[l].codes, c->term ? c->term + c->offsets[l] : NULL,
                                ix->lists[l].size, pq->M, bsz,
                                c->rk ? tsr__ranks_rank(c->rk) : NULL,
                                c->tcodes + c->toffsets[l]);
    }
    free(P);
    return c;
oom:
    free(P);
    cache_free(c);
    tsr_err(err, TSR_ENOMEM, "search: out of memory for the search cache (%zu lists)",
            ix->nlist);
    return NULL;
}

const search_cache *tsr__search_cache_get(const tsr_ivfpq *cix, tsr_error *err)
{
    /* The cache is derived data; building it does not change the index as observed by
     * callers, hence the cast away from const. */
    tsr_ivfpq *ix = (tsr_ivfpq *)cix;
    search_cache *c = __atomic_load_n((search_cache **)&ix->search_cache, __ATOMIC_ACQUIRE);
    if (c != NULL)
        return c;
    pthread_mutex_lock(&cache_lock);
    c = ix->search_cache;
    if (c == NULL) {
        c = cache_build(ix, err);
        if (c != NULL)
            __atomic_store_n((search_cache **)&ix->search_cache, c, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cache_lock);
    return c;
}

int tsr_ivfpq_search_prepare(tsr_ivfpq *ix, tsr_error *err)
{
    /* The kernel calibration (once per process, a few ms) belongs to preparing too: it
     * would otherwise land in the first search (a tenth of a 2000-query batch at
     * nprobe 1). */
    (void)tsr_ivfpq_search_simd_auto();
    return tsr__search_cache_get(ix, err) != NULL ? 0 : (err ? err->code : TSR_ENOMEM);
}
