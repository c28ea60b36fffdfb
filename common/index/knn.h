/*
 * knn — exact brute-force k nearest neighbours of a batch of queries among a set of
 * vectors, with the cross products done by BLAS sgemm in blocks (the coarse step of
 * search, the k-means assignment step, and the exact re-rank reference).
 *
 * L2 results are squared distances, ascending; IP results are inner products, descending.
 * Missing results (k > ny) are label -1 with distance +inf (L2) / -inf (IP). Ties are
 * broken by the smaller label. A call with one query computes its products with sgemv,
 * a larger call with sgemm: the same query's distances may differ in the last bits
 * between the two (as in Faiss, which computes fewer than 20 queries directly and more
 * with BLAS); within one call every query is computed the same way.
 */
#ifndef TSR_KNN_H
#define TSR_KNN_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/ivfpq.h"

/* x: n*d queries, y: ny*d vectors (both borrowed); D, I: n*k outputs (caller-allocated).
 * y_norms: optional precomputed ||y_j||^2 (ny floats, L2 only; NULL = computed here). */
int tsr_knn(const float *x, size_t n, const float *y, size_t ny, size_t d,
            enum tsr_metric metric, size_t k, const float *y_norms, float *D, int64_t *I,
            tsr_error *err);

/* Squared L2 norms of n rows of dimension d into out (n floats). */
void tsr_knn_norms(const float *x, size_t n, size_t d, float *out);

/* Number of threads OpenBLAS may use (1 for single-thread measurements). */
void tsr_blas_set_threads(int threads);

#endif
