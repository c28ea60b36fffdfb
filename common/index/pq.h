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

#include "core/error.h"

typedef struct tsr_pq {
    size_t d;          /* vector dimension */
    size_t M;          /* number of sub-quantizers; d % M == 0 */
    size_t nbits;      /* bits per sub-code, 1..16 */
    size_t dsub;       /* d / M */
    size_t ksub;       /* 1 << nbits */
    size_t code_size;  /* (M * nbits + 7) / 8 */
    float *centroids;  /* owned: M * ksub * dsub floats */
} tsr_pq;

/* Reads sub-code m of a packed code (Faiss's PQDecoderGeneric bit order: sub-codes are
 * packed least-significant bit first, each nbits wide). */
static inline uint32_t tsr_pq_code_get(const uint8_t *code, size_t m, size_t nbits)
{
    if (nbits == 8)
        return code[m];
    size_t bit = m * nbits;
    uint32_t v = 0;
    for (size_t b = 0; b < nbits; b++, bit++)
        v |= (uint32_t)((code[bit >> 3] >> (bit & 7)) & 1u) << b;
    return v;
}

/* Writes sub-code m into a packed code (code must be zeroed before the first write). */
static inline void tsr_pq_code_put(uint8_t *code, size_t m, size_t nbits, uint32_t v)
{
    if (nbits == 8) {
        code[m] = (uint8_t)v;
        return;
    }
    size_t bit = m * nbits;
    for (size_t b = 0; b < nbits; b++, bit++)
        if ((v >> b) & 1u)
            code[bit >> 3] |= (uint8_t)(1u << (bit & 7));
}

/* Sets the shape and allocates zeroed centroids; TSR_EINVAL on a bad shape. */
int tsr_pq_init(tsr_pq *pq, size_t d, size_t M, size_t nbits, tsr_error *err);
void tsr_pq_close(tsr_pq *pq); /* frees centroids; safe on a zeroed struct */

#endif
