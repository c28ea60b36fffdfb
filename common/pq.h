/*
 * pq — product quantizer: M sub-quantizers of 2^nbits centroids over d/M dimensions.
 *
 * Centroids use Faiss's layout (M x ksub x dsub floats, sub-quantizer major), so a PQ
 * read from a Faiss file is used as is. Codes are packed little-endian bit fields as
 * Faiss's PQEncoderGeneric does; nbits = 8 (one byte per sub-quantizer) is the fast path.
 */
#ifndef TSR_PQ_H
#define TSR_PQ_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct tsr_pq {
    size_t d;          /* vector dimension */
    size_t M;          /* number of sub-quantizers; d % M == 0 */
    size_t nbits;      /* bits per sub-code, 1..16 */
    size_t dsub;       /* d / M */
    size_t ksub;       /* 1 << nbits */
    size_t code_size;  /* (M * nbits + 7) / 8 */
    float *centroids;  /* owned: M * ksub * dsub floats */
} tsr_pq;

/* Sets the shape and allocates zeroed centroids; TSR_EINVAL on a bad shape. */
int tsr_pq_init(tsr_pq *pq, size_t d, size_t M, size_t nbits, tsr_error *err);
void tsr_pq_close(tsr_pq *pq); /* frees centroids; safe on a zeroed struct */

#endif
