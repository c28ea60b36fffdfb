/*
 * ivfpq_build — training and filling an IVFPQ index the way Faiss's IndexIVFPQ does:
 *   train: coarse k-means (10 rounds, Faiss's IVF default; spherical with inner-product
 *          assignment for METRIC_INNER_PRODUCT) → centroids; a seeded sample of at most
 *          256 * 2^nbits vectors, each minus its assigned centroid when by_residual;
 *          PQ training on those (25 rounds per sub-space);
 *   add:   nearest centroid (L2) / largest inner product (IP), residual, PQ code, appended
 *          to that list in input order.
 * Deterministic given the seed; the result does not depend on the thread count.
 */
#ifndef TSR_IVFPQ_BUILD_H
#define TSR_IVFPQ_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/ivfpq.h"

typedef struct tsr_build_params {
    int coarse_niter;               /* Faiss IVF: 10 */
    int pq_niter;                   /* Faiss PQ: 25 */
    size_t max_points_per_centroid; /* Faiss: 256 (coarse and PQ samples) */
    uint64_t seed;                  /* Faiss: 1234 */
    int threads;                    /* <= 1: calling thread only */
    int quiet;                      /* no warnings */
    /* optional progress: phase ("coarse", "pq", "add"), units done, units total */
    void (*progress)(void *ctx, const char *phase, size_t done, size_t total);
    void *progress_ctx;
} tsr_build_params;

void tsr_build_params_default(tsr_build_params *p);

/* Trains ix (created by tsr_ivfpq_create, empty) from n vectors x of dimension ix->d
 * (borrowed). Sets centroids, PQ, is_trained. TSR_EINVAL when n < nlist or n < 2^nbits. */
int tsr_ivfpq_train(tsr_ivfpq *ix, const float *x, size_t n, const tsr_build_params *p,
                    tsr_error *err);

/* Adds n vectors with labels (borrowed; NULL = ix->ntotal, ix->ntotal + 1, ...) to a
 * trained ix. On failure some vectors may already be added (ntotal says how many). */
int tsr_ivfpq_add(tsr_ivfpq *ix, const float *x, size_t n, const int64_t *labels,
                  const tsr_build_params *p, tsr_error *err);

/* Nearest list of each of n vectors (the assignment add makes); assign: n entries. */
int tsr_ivfpq_assign(const tsr_ivfpq *ix, const float *x, size_t n, int threads,
                     int64_t *assign, tsr_error *err);

#endif
