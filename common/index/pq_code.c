/*
 * pq_code — PQ encode/decode (see pq_code.h): the batch encoder, the exact one-vector
 * encoder and decoding.
 *
 * DESIGN (threads): the vectors are split into contiguous ranges, one per thread; each
 * thread has its own scratch buffers and writes only the codes of its range.
 */
#include "index/pq_code.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/kmeans_int.h"
#include "core/parallel.h"
#include "core/cpu.h"
#include "index/knn.h"
#include "core/mem.h"
#include "core/testing.h"

enum { ENC_BLOCK = 1024 };


typedef struct {
    const tsr_pq *pq;
    const float *x;
    uint8_t *codes;
    /* dsub = 1: per sub-space sorted sub-centroids and, per sorted position, the first
     * position holding the same value (so equal values resolve to the smallest number) */
    tsr__vi *sorted;         /* M * ksub */
    float *sorted_v;    /* M * ksub: the values of `sorted` alone, for the SIMD count */
    int simd;           /* count with AVX-512 (ksub a multiple of 16, at most 1024) */
    uint32_t *run;      /* M * ksub */
    float *cnorms;      /* M * ksub (dsub > 1) */
    int rc[TSR_PARALLEL_MAX_THREADS];
} enc_ctx;

size_t tsr__count_le_avx512(const float *v, size_t k, float x);

/* Number of sorted centroids <= x (binary search). */
static inline size_t count_le(const tsr__vi *cs, size_t k, float x)
{
    size_t lo = 0, len = k;
    while (len > 0) {
        size_t half = len / 2;
        if (cs[lo + half].v <= x) {
            lo += half + 1;
            len -= half + 1;
        } else {
            len = half;
        }
    }
    return lo;
}

/* Nearest of the sorted 1-D centroids cs[0..k) to x given p = count of centroids <= x;
 * ties to the smaller number. */
static inline uint32_t nearest_1d(const tsr__vi *cs, const uint32_t *run, size_t k, float x, size_t p)
{
    if (p == 0)
        return cs[0].i;
    size_t a = run[p - 1];
    if (p == k)
        return cs[a].i;
    float dl = (x - cs[a].v) * (x - cs[a].v), dh = (cs[p].v - x) * (cs[p].v - x);
    return dh < dl || (dh == dl && cs[p].i < cs[a].i) ? cs[p].i : cs[a].i;
}

static void encode_range(void *arg, size_t begin, size_t end, int tid)
{
    enc_ctx *c = arg;
    const tsr_pq *pq = c->pq;
    size_t M = pq->M, dsub = pq->dsub, ksub = pq->ksub, d = pq->d, cs = pq->code_size;
    memset(c->codes + begin * cs, 0, (end - begin) * cs);
    if (dsub == 1) {
        for (size_t i = begin; i < end; i++) {
            const float *xr = c->x + i * d;
            uint8_t *code = c->codes + i * cs;
            for (size_t m = 0; m < M; m++) {
                const tsr__vi *so = c->sorted + m * ksub;
                float v = xr[m];
                /* NaN compares false everywhere: p = 0 either way */
                size_t p = c->simd ? tsr__count_le_avx512(c->sorted_v + m * ksub, ksub, v)
                                   : count_le(so, ksub, v);
                uint32_t j = nearest_1d(so, c->run + m * ksub, ksub, v, p);
                tsr_pq_code_put(code, m, pq->nbits, j);
            }
        }
        return;
    }
    float *slice = tsr_try_malloc(ENC_BLOCK, dsub * sizeof(float));
    float *scratch = tsr_try_malloc(TSR__ASSIGN_SCRATCH, sizeof(float));
    int64_t *as = tsr_try_malloc(ENC_BLOCK, sizeof(int64_t));
    if (slice == NULL || scratch == NULL || as == NULL) {
        c->rc[tid] = TSR_ENOMEM;
        goto cleanup;
    }
    for (size_t b0 = begin; b0 < end; b0 += ENC_BLOCK) {
        size_t nb = end - b0 < ENC_BLOCK ? end - b0 : ENC_BLOCK;
        for (size_t m = 0; m < M; m++) {
            for (size_t i = 0; i < nb; i++)
                memcpy(slice + i * dsub, c->x + (b0 + i) * d + m * dsub, dsub * sizeof(float));
            tsr__assign_rows(slice, nb, dsub, pq->centroids + m * ksub * dsub, ksub,
                             c->cnorms + m * ksub, 0, scratch, as, NULL);
            for (size_t i = 0; i < nb; i++)
                tsr_pq_code_put(c->codes + (b0 + i) * cs, m, pq->nbits, (uint32_t)as[i]);
        }
    }
cleanup:
    free(slice);
    free(scratch);
    free(as);
}

int tsr_pq_encode(const tsr_pq *pq, const float *x, size_t n, uint8_t *codes, int threads,
                  tsr_error *err)
{
    int rc = 0;
    size_t M = pq->M, ksub = pq->ksub, dsub = pq->dsub;
    enc_ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return tsr_err(err, TSR_ENOMEM, "PQ encode: out of memory");
    c->pq = pq;
    c->x = x;
    c->codes = codes;
    if (dsub == 1) {
        c->sorted = tsr_try_malloc(M * ksub, sizeof(tsr__vi));
        c->run = tsr_try_malloc(M * ksub, sizeof(uint32_t));
        c->sorted_v = tsr_try_malloc(M * ksub, sizeof(float));
        if (c->sorted == NULL || c->run == NULL || c->sorted_v == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "PQ encode: out of memory");
            goto cleanup;
        }
        for (size_t m = 0; m < M; m++) {
            tsr__vi *s = c->sorted + m * ksub;
            uint32_t *r = c->run + m * ksub;
            for (size_t j = 0; j < ksub; j++)
                s[j] = (tsr__vi){pq->centroids[m * ksub + j], (uint32_t)j};
            qsort(s, ksub, sizeof(tsr__vi), tsr__cmp_vi);
            for (size_t j = 0; j < ksub; j++) {
                r[j] = j > 0 && s[j].v == s[j - 1].v ? r[j - 1] : (uint32_t)j;
                c->sorted_v[m * ksub + j] = s[j].v;
            }
        }
        const char *e = tsr_test_knob(TSR_KNOB_NO_SIMD);
        c->simd = ksub % 16 == 0 && ksub <= 1024 && !(e != NULL && *e && *e != '0') &&
                  tsr_cpu_has(TSR_CPU_AVX512);
    } else {
        c->cnorms = tsr_try_malloc(M * ksub, sizeof(float));
        if (c->cnorms == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "PQ encode: out of memory");
            goto cleanup;
        }
        tsr_knn_norms(pq->centroids, M * ksub, dsub, c->cnorms);
    }
    if (threads > 1 && dsub > 1)
        tsr_blas_set_threads(1); /* one BLAS thread inside each of ours */
    tsr_parallel_for(threads, n, encode_range, c);
    for (int t = 0; t < TSR_PARALLEL_MAX_THREADS; t++)
        if (c->rc[t] != 0) {
            rc = tsr_err(err, c->rc[t], "PQ encode: out of memory");
            break;
        }
cleanup:
    free(c->sorted);
    free(c->run);
    free(c->sorted_v);
    free(c->cnorms);
    free(c);
    return rc;
}

/* ---- the exact one-vector encoder ------------------------------------------------- */

struct tsr_pq_encoder {
    const tsr_pq *pq;
    float *t; /* [m][q][j] (M * dsub * ksub floats), or NULL: the plain loop */
};

tsr_pq_encoder *tsr_pq_encoder_create(const tsr_pq *pq, tsr_error *err)
{
    tsr_pq_encoder *e = calloc(1, sizeof *e);
    if (e == NULL)
        goto oom;
    e->pq = pq;
    if (pq->centroids == NULL || pq->dsub > TSR_PQ_ENC_MAX_DSUB || pq->ksub > TSR_PQ_ENC_MAX_KSUB)
        return e;
    if ((e->t = tsr_try_malloc(pq->M * pq->dsub * pq->ksub, sizeof(float))) == NULL)
        goto oom;
    for (size_t m = 0; m < pq->M; m++)
        for (size_t j = 0; j < pq->ksub; j++)
            for (size_t q = 0; q < pq->dsub; q++)
                e->t[(m * pq->dsub + q) * pq->ksub + j] =
                    pq->centroids[(m * pq->ksub + j) * pq->dsub + q];
    return e;
oom:
    free(e);
    tsr_err(err, TSR_ENOMEM, "PQ encoder: out of memory for %zu x %zu sub-centroids", pq->M,
            pq->ksub);
    return NULL;
}

void tsr_pq_encoder_destroy(tsr_pq_encoder *e)
{
    if (e == NULL)
        return;
    free(e->t);
    free(e);
}

int tsr_pq_encoder_fast(const tsr_pq_encoder *e)
{
    return e->t != NULL;
}

typedef float v4sf __attribute__((vector_size(16))); /* GCC/clang vector extension */

/* Sub-space m on the transposed sub-centroids T (dsub x ksub) for the residual r: per
 * sub-centroid j the same sum, in the same order (q ascending from 0), as the plain loop,
 * so the same code; four sub-centroids per vector (lanes are independent: no
 * reassociation). */
static uint32_t encode_sub(const float *T, size_t ds, size_t ks, const float *r)
{
    float dist[TSR_PQ_ENC_MAX_KSUB];
    size_t j = 0;
    for (; j + 4 <= ks; j += 4) {
        v4sf acc = {0.0f, 0.0f, 0.0f, 0.0f};
        for (size_t q = 0; q < ds; q++) {
            v4sf c, rq = {r[q], r[q], r[q], r[q]};
            memcpy(&c, T + q * ks + j, sizeof c);
            v4sf df = rq - c;
            acc += df * df;
        }
        memcpy(dist + j, &acc, sizeof acc);
    }
    for (; j < ks; j++) {
        float s = 0.0f;
        for (size_t q = 0; q < ds; q++) {
            float df = r[q] - T[q * ks + j];
            s += df * df;
        }
        dist[j] = s;
    }
    float best = INFINITY;
    uint32_t bj = 0;
    for (j = 0; j < ks; j++)
        if (dist[j] < best)
            best = dist[j], bj = (uint32_t)j;
    return bj;
}

void tsr_pq_encoder_encode(const tsr_pq_encoder *e, const float *x, const float *y,
                           uint8_t *code)
{
    const tsr_pq *pq = e->pq;
    if (e->t == NULL) {
        tsr_pq_encode_exact(pq, x, y, code);
        return;
    }
    size_t ds = pq->dsub, ks = pq->ksub;
    float r[TSR_PQ_ENC_MAX_DSUB];
    for (size_t m = 0; m < pq->M; m++) {
        /* the residual once: x - y rounds as in the plain loop */
        for (size_t q = 0; q < ds; q++)
            r[q] = x[m * ds + q] - (y ? y[m * ds + q] : 0.0f);
        tsr_pq_code_put(code, m, pq->nbits, encode_sub(e->t + m * ds * ks, ds, ks, r));
    }
}

void tsr_pq_encode_exact(const tsr_pq *pq, const float *x, const float *y, uint8_t *code)
{
    size_t ds = pq->dsub;
    for (size_t m = 0; m < pq->M; m++) {
        float best = INFINITY;
        uint32_t bj = 0;
        for (size_t j = 0; j < pq->ksub; j++) {
            const float *c = pq->centroids + (m * pq->ksub + j) * ds;
            float s = 0;
            for (size_t q = 0; q < ds; q++) {
                size_t dim = m * ds + q;
                float df = x[dim] - (y ? y[dim] : 0.0f) - c[q];
                s += df * df;
            }
            if (s < best)
                best = s, bj = (uint32_t)j;
        }
        tsr_pq_code_put(code, m, pq->nbits, bj);
    }
}

/* ---- decoding --------------------------------------------------------------------- */

void tsr_pq_decode(const tsr_pq *pq, const uint8_t *codes, size_t n, float *x)
{
    size_t M = pq->M, dsub = pq->dsub, ksub = pq->ksub;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *code = codes + i * pq->code_size;
        float *xr = x + i * pq->d;
        for (size_t m = 0; m < M; m++) {
            uint32_t j = tsr_pq_code_get(code, m, pq->nbits);
            memcpy(xr + m * dsub, pq->centroids + (m * ksub + j) * dsub, dsub * sizeof(float));
        }
    }
}
