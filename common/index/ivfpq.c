/*
 * ivfpq — lifecycle of the in-memory index and its inverted lists (search lives in
 * ivfpq_search.c over ivfpq_scanner.c, its cache in ivfpq_cache.c, file I/O in faiss_io.c).
 */
#include "index/ivfpq.h"

#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

void tsr__ivfpq_search_cache_free(tsr_ivfpq *ix) __attribute__((weak));

tsr_ivfpq *tsr_ivfpq_create(int d, size_t nlist, size_t pq_m, size_t pq_nbits,
                            enum tsr_metric metric, int by_residual, tsr_error *err)
{
    if (d <= 0 || nlist == 0 || (metric != TSR_METRIC_L2 && metric != TSR_METRIC_IP)) {
        tsr_err(err, TSR_EINVAL, "bad index shape: d=%d nlist=%zu", d, nlist);
        return NULL;
    }
    tsr_ivfpq *ix = calloc(1, sizeof *ix);
    if (ix == NULL) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    ix->d = d;
    ix->metric = metric;
    ix->nlist = nlist;
    ix->nprobe = 1;
    memcpy(ix->quantizer_fourcc, metric == TSR_METRIC_L2 ? "IxF2" : "IxFI", 5);
    ix->by_residual = by_residual ? 1 : 0;
    ix->centroids = tsr_try_calloc(nlist, (size_t)d * sizeof(float));
    ix->lists = tsr_try_calloc(nlist, sizeof(tsr_invlist));
    if (ix->centroids == NULL || ix->lists == NULL) {
        tsr_err(err, TSR_ENOMEM, "out of memory for %zu lists", nlist);
        goto fail;
    }
    if (tsr_pq_init(&ix->pq, (size_t)d, pq_m, pq_nbits, err) != 0)
        goto fail;
    ix->code_size = ix->pq.code_size;
    return ix;
fail:
    tsr_ivfpq_destroy(ix);
    return NULL;
}

void tsr_ivfpq_destroy(tsr_ivfpq *ix)
{
    if (ix == NULL)
        return;
    if (tsr__ivfpq_search_cache_free)
        tsr__ivfpq_search_cache_free(ix);
    if (ix->lists != NULL) {
        for (size_t i = 0; i < ix->nlist; i++) {
            free(ix->lists[i].codes);
            free(ix->lists[i].ids);
        }
    }
    free(ix->lists);
    free(ix->centroids);
    free(ix->dm_array);
    free(ix->dm_hash);
    tsr_pq_close(&ix->pq);
    tsr_pq_close(&ix->refine_pq);
    free(ix->refine_codes);
    free(ix);
}

int tsr_invlist_append(tsr_invlist *l, size_t code_size, size_t n, const uint8_t *codes,
                       const int64_t *ids)
{
    if (n == 0)
        return 0;
    if (l->size + n > l->cap) {
        size_t cap = l->cap ? l->cap : 16;
        while (cap < l->size + n)
            cap *= 2;
        uint8_t *c = tsr_try_realloc(l->codes, cap, code_size ? code_size : 1);
        if (c == NULL)
            return TSR_ENOMEM;
        l->codes = c;
        int64_t *i = tsr_try_realloc(l->ids, cap, sizeof(int64_t));
        if (i == NULL)
            return TSR_ENOMEM;
        l->ids = i;
        l->cap = cap;
    }
    memcpy(l->codes + l->size * code_size, codes, n * code_size);
    memcpy(l->ids + l->size, ids, n * sizeof(int64_t));
    l->size += n;
    return 0;
}
