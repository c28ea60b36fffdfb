/*
 * kmeans — seeded, deterministic Lloyd k-means that follows Faiss's Clustering (1.7.3):
 * subsample to at most max_points_per_centroid * k points, initialise from k distinct
 * sampled points, then niter rounds of (assign every point to its nearest centroid with
 * BLAS sgemm; move each centroid to the mean of its points; split empty clusters the way
 * Faiss does; renormalise when spherical). Also the nearest-centroid assignment used by
 * IVF add and PQ encode.
 *
 * The result depends only on the input, the parameters and the seed — not on the thread
 * count: assignment is per point, and every centroid's sum is accumulated in point order
 * by exactly one thread.
 */
#ifndef TSR_KMEANS_H
#define TSR_KMEANS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/ivfpq.h"

typedef struct tsr_kmeans_params {
    int niter;                      /* Lloyd iterations (Faiss Clustering: 25; IVF: 10) */
    size_t max_points_per_centroid; /* subsample above k * this (Faiss: 256); 0 = never */
    size_t min_points_per_centroid; /* warn below k * this (Faiss: 39) */
    uint64_t seed;                  /* Faiss: 1234 */
    enum tsr_metric metric;         /* assignment: nearest (L2) or largest inner product */
    int spherical;                  /* renormalise centroids to unit length each round */
    int threads;                    /* worker threads (<= 1: the calling thread only) */
    int quiet;                      /* no warnings on stderr */
    /* optional: called after each round with (ctx, rounds done, niter) */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} tsr_kmeans_params;

typedef struct tsr_kmeans_stats {
    size_t n_used;    /* training points after subsampling */
    int iterations;   /* rounds run */
    size_t nsplit;    /* empty clusters re-seeded over all rounds */
    double objective; /* sum of distances (L2) / inner products (IP) of the last round */
} tsr_kmeans_stats;

/* Faiss Clustering defaults: niter 25, max 256, min 39, seed 1234, L2, not spherical. */
void tsr_kmeans_params_default(tsr_kmeans_params *p);

/* Trains k centroids of dimension d from n points x (borrowed, n*d floats) into
 * centroids (caller-allocated, k*d floats). stats may be NULL. TSR_EINVAL when n < k. */
int tsr_kmeans_train(const tsr_kmeans_params *p, const float *x, size_t n, size_t d, size_t k,
                     float *centroids, tsr_kmeans_stats *stats, tsr_error *err);

/* For each of n points x, the nearest of k centroids (L2) or the one with the largest inner
 * product (IP); ties go to the smaller centroid number. assign: n entries; dist: optional
 * n floats (squared L2 distance / inner product). c_norms: optional ||c||^2 (k floats, L2
 * only; NULL = computed here). threads <= 1 runs on the calling thread. */
int tsr_kmeans_assign(const float *x, size_t n, size_t d, const float *centroids, size_t k,
                      const float *c_norms, enum tsr_metric metric, int threads,
                      int64_t *assign, float *dist, tsr_error *err);

/* Deterministic generator (xoshiro256** seeded with splitmix64), exposed for the
 * samplers of pq_train and ivfpq_build so that every module draws the same way. */
typedef struct tsr_rng {
    uint64_t s[4];
} tsr_rng;
void tsr_rng_seed(tsr_rng *r, uint64_t seed);
uint64_t tsr_rng_next(tsr_rng *r);
size_t tsr_rng_below(tsr_rng *r, size_t n); /* uniform in [0, n), n > 0 */
float tsr_rng_float(tsr_rng *r);            /* uniform in [0, 1) */

/* Picks m distinct indices of [0, n) (m <= n) into out, ascending: the first m entries of a
 * seeded Fisher-Yates shuffle, sorted. Returns TSR_ENOMEM on allocation failure. */
int tsr_sample_indices(size_t n, size_t m, uint64_t seed, size_t *out, tsr_error *err);

#endif
