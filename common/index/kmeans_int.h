/*
 * kmeans_int — internals shared by kmeans, pq_train, pq_code and ivfpq_build: the
 * argmin/argmax kernels of the assignment step (scalar in kmeans_kernels.c, AVX-512 in
 * kmeans_avx512.c, chosen at run time). Threads: core/parallel; norms: tsr_knn_norms.
 */
#ifndef TSR_KMEANS_INT_H
#define TSR_KMEANS_INT_H

#include <stddef.h>
#include <stdint.h>

/* Assignment of n rows against k centroids with a caller-provided scratch buffer of
 * TSR__ASSIGN_SCRATCH floats (see tsr_kmeans_assign; ip: 1 for inner product). */
#define TSR__ASSIGN_BLOCK_X 256
#define TSR__ASSIGN_BLOCK_Y 1024
#define TSR__ASSIGN_SCRATCH ((size_t)TSR__ASSIGN_BLOCK_X * TSR__ASSIGN_BLOCK_Y)
void tsr__assign_rows(const float *x, size_t n, size_t d, const float *c, size_t k,
                      const float *cn, int ip, float *buf, int64_t *assign, float *dist);

/* Index of the smallest cn[j] - 2*ip[j] (first on ties), n > 0. */
size_t tsr__argmin_l2(const float *ip, const float *cn, size_t n);
/* Index of the largest v[j] (first on ties), n > 0. */
size_t tsr__argmax(const float *v, size_t n);

/* Scalar reference versions (always available; tested against the dispatched ones). */
size_t tsr__argmin_l2_scalar(const float *ip, const float *cn, size_t n);
size_t tsr__argmax_scalar(const float *v, size_t n);
size_t tsr__argmin_l2_avx512(const float *ip, const float *cn, size_t n);
size_t tsr__argmax_avx512(const float *v, size_t n);

/* A value and its index, sorted by value then index (the one-dimensional k-means and the
 * 1-D PQ encoder sort centroids and points this way); tsr__cmp_vi is qsort's comparator. */
typedef struct {
    float v;
    uint32_t i;
} tsr__vi;
int tsr__cmp_vi(const void *a, const void *b);

#endif
