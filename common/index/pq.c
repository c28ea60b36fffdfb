/*
 * pq — product quantizer shape and storage (training in pq_train.c, encoding and tables
 * in pq_code.c).
 */
#include "index/pq.h"

#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

int tsr_pq_init(tsr_pq *pq, size_t d, size_t M, size_t nbits, tsr_error *err)
{
    memset(pq, 0, sizeof *pq);
    if (d == 0 || M == 0 || d % M != 0)
        return tsr_err(err, TSR_EINVAL, "PQ: d=%zu is not a positive multiple of M=%zu", d, M);
    if (nbits == 0 || nbits > 16)
        return tsr_err(err, TSR_EINVAL, "PQ: nbits=%zu, expected 1..16", nbits);
    pq->d = d;
    pq->M = M;
    pq->nbits = nbits;
    pq->dsub = d / M;
    pq->ksub = (size_t)1 << nbits;
    pq->code_size = (M * nbits + 7) / 8;
    pq->centroids = tsr_try_calloc(d, pq->ksub * sizeof(float));
    if (pq->centroids == NULL)
        return tsr_err(err, TSR_ENOMEM, "PQ: out of memory for %zu x %zu centroids", pq->ksub, d);
    return 0;
}

void tsr_pq_close(tsr_pq *pq)
{
    free(pq->centroids);
    memset(pq, 0, sizeof *pq);
}
