/*
 * pq_train — trains a product quantizer like Faiss's ProductQuantizer::train (default
 * train type): at most max_points_per_centroid * ksub training vectors (seeded sample),
 * then for each of the M sub-spaces an independent k-means with ksub centroids (Faiss's
 * Clustering defaults: 25 rounds, seed 1234, L2) on that slice of the vectors.
 */
#ifndef TSR_PQ_TRAIN_H
#define TSR_PQ_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/pq.h"

typedef struct tsr_pq_train_params {
    int niter;                      /* k-means rounds per sub-space (Faiss: 25) */
    size_t max_points_per_centroid; /* sample at most this * ksub vectors (Faiss: 256) */
    uint64_t seed;                  /* Faiss: 1234 */
    int threads;                    /* sub-spaces are trained in parallel */
    int quiet;
    void (*progress)(void *ctx, int done, int total); /* sub-spaces done of M */
    void *progress_ctx;
} tsr_pq_train_params;

void tsr_pq_train_params_default(tsr_pq_train_params *p);

/* Trains pq (shape already set by tsr_pq_init) from n vectors x of dimension pq->d
 * (borrowed). TSR_EINVAL when n < ksub. */
int tsr_pq_train(tsr_pq *pq, const float *x, size_t n, const tsr_pq_train_params *p,
                 tsr_error *err);

#endif
