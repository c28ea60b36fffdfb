/*
 * ivfpq — the in-memory IVFPQ index: coarse centroids, a product quantizer and nlist
 * inverted lists of (code, int64 label) pairs. It mirrors Faiss's IndexIVFPQ field by
 * field so that faiss_io can read and write it losslessly (byte for byte on rewrite),
 * and it is what search, the shard slices and the coordinator template are made of.
 *
 * Ownership: a tsr_ivfpq owns every array it points to; tsr_ivfpq_destroy frees all.
 */
#ifndef TSR_IVFPQ_H
#define TSR_IVFPQ_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/pq.h"

enum tsr_metric { TSR_METRIC_IP = 0, TSR_METRIC_L2 = 1 };
enum tsr_direct_map { TSR_DM_NONE = 0, TSR_DM_ARRAY = 1, TSR_DM_HASHTABLE = 2 };

typedef struct tsr_invlist {
    size_t size;     /* entries */
    size_t cap;      /* allocated entries */
    uint8_t *codes;  /* owned: cap * code_size bytes */
    int64_t *ids;    /* owned: cap labels */
} tsr_invlist;

typedef struct tsr_ivfpq {
    int d;
    int64_t ntotal;
    int is_trained;
    enum tsr_metric metric;

    size_t nlist;
    size_t nprobe;            /* default nprobe stored in the file */
    char quantizer_fourcc[5]; /* "IxF2" or "IxFI" as read / to write */
    int quantizer_is_trained;
    float *centroids;         /* owned: nlist * d */

    enum tsr_direct_map dm_type;
    int64_t *dm_array;        /* owned: dm_array_n entries (Array type) */
    size_t dm_array_n;
    int64_t *dm_hash;         /* owned: 2 * dm_hash_n (key, value) as read (Hashtable type) */
    size_t dm_hash_n;

    int by_residual;
    size_t code_size;
    tsr_pq pq;

    tsr_invlist *lists;       /* owned: nlist lists */
    char list_type[5];        /* "full"/"sprs" as read by faiss_io ("" if built); informative
                               * only: the writer picks the type by Faiss's rule */

    /* IwQR (IndexIVFPQR) only */
    int is_refine;            /* 1 when read from IwQR */
    tsr_pq refine_pq;
    uint8_t *refine_codes;    /* owned: refine_codes_n bytes */
    size_t refine_codes_n;
    float k_factor;

    /* Derived search data, built lazily by the search module (not serialized). */
    void *search_cache;
} tsr_ivfpq;

/* Returns a new, untrained, empty index; caller destroys. NULL on bad shape (err set). */
tsr_ivfpq *tsr_ivfpq_create(int d, size_t nlist, size_t pq_m, size_t pq_nbits,
                            enum tsr_metric metric, int by_residual, tsr_error *err);
void tsr_ivfpq_destroy(tsr_ivfpq *ix); /* accepts NULL */

/* Appends n (code, label) entries to list `list_no`; TSR_ENOMEM on failure. */
int tsr_invlist_append(tsr_invlist *l, size_t code_size, size_t n, const uint8_t *codes,
                       const int64_t *ids);

#endif
