/*
 * pq_code — product-quantizer encoding (nearest sub-centroid in every sub-space, packed in
 * Faiss's bit order) and decoding (reconstruction from the sub-centroids).
 *
 * Encode paths: dsub = 1 is a binary search in the sorted sub-centroids (exact; Faiss
 * computes all ksub distances per sub-space there); otherwise the sgemm assignment of
 * kmeans on blocks of sub-vectors. Ties go to the smaller sub-centroid number.
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

/* Reconstructs n vectors from codes into x (n * pq->d floats, caller-allocated). */
void tsr_pq_decode(const tsr_pq *pq, const uint8_t *codes, size_t n, float *x);

#endif
