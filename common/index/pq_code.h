/*
 * pq_code — product-quantizer encoding (nearest sub-centroid in every sub-space, packed in
 * Faiss's bit order) and decoding (reconstruction from the sub-centroids).
 *
 * Two encoders of one quantizer, for two callers with different needs:
 *  - tsr_pq_encode, batches (building an index): dsub = 1 is a binary search in the sorted
 *    sub-centroids (exact; Faiss computes all ksub distances per sub-space there; the count
 *    with AVX-512 unless TSR_NO_SIMD is set); otherwise the sgemm assignment of kmeans on
 *    blocks of sub-vectors (||x||^2 + ||c||^2 - 2<x, c>).
 *  - tsr_pq_encoder, one vector at a time with an optional residual (a shard's records):
 *    the exact sums sum_q ((x_q - y_q) - c_q)^2, in q order, on the transposed
 *    sub-centroids four at a time (tsr_pq_encode_exact: the plain loop, the same codes).
 * Their codes can differ where two sub-centroids are within rounding of each other (the
 * sgemm form rounds differently; a shard's stored codes must not change), so both stay.
 * Ties go to the smaller sub-centroid number.
 */
#ifndef TSR_PQ_CODE_H
#define TSR_PQ_CODE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "index/pq.h"

/* Encodes n vectors x (n * pq->d floats, borrowed) into codes (n * pq->code_size bytes,
 * caller-allocated). threads <= 1: calling thread only. Same codes for any thread count. */
int tsr_pq_encode(const tsr_pq *pq, const float *x, size_t n, uint8_t *codes, int threads,
                  tsr_error *err);

/* The exact one-vector encoder: the PQ sub-centroids transposed per sub-space ([m][q][j]),
 * immutable once made, usable from any number of threads. create: NULL with err set on
 * out of memory; for dsub > TSR_PQ_ENC_MAX_DSUB or ksub > TSR_PQ_ENC_MAX_KSUB (or pq without
 * centroids) an encoder without the transposed copy, which encodes by the plain loop.
 * pq is borrowed and must outlive the encoder. */
#define TSR_PQ_ENC_MAX_DSUB 256
#define TSR_PQ_ENC_MAX_KSUB 4096
typedef struct tsr_pq_encoder tsr_pq_encoder;
tsr_pq_encoder *tsr_pq_encoder_create(const tsr_pq *pq, tsr_error *err);
void tsr_pq_encoder_destroy(tsr_pq_encoder *e); /* accepts NULL */
/* 1 when e encodes on the transposed copy (the fast path), 0 by the plain loop. */
int tsr_pq_encoder_fast(const tsr_pq_encoder *e);

/* The code (pq->code_size bytes, zeroed by the caller) of x - y (d floats each; y NULL =
 * x itself: a residual is taken per sub-space as (x_q - y_q), then - c_q): per sub-space
 * the sub-centroid j minimizing sum_q ((x_q - y_q) - c_j,q)^2, summed in q order, ties (and
 * all-infinite sums) to the smallest j. tsr_pq_encode_exact is the plain loop, without an
 * encoder; both give the same code. */
void tsr_pq_encoder_encode(const tsr_pq_encoder *e, const float *x, const float *y,
                           uint8_t *code);
void tsr_pq_encode_exact(const tsr_pq *pq, const float *x, const float *y, uint8_t *code);

/* Reconstructs n vectors from codes into x (n * pq->d floats, caller-allocated). */
void tsr_pq_decode(const tsr_pq *pq, const uint8_t *codes, size_t n, float *x);

#endif
