/*
 * pq_train — product-quantizer training (see pq_train.h).
 *
 * DESIGN (threads): sub-spaces are independent k-means problems, so the M sub-spaces are
 * split into contiguous ranges, one per thread; each thread owns its slice buffer and
 * writes only its own sub-spaces' centroids. Progress is reported from thread 0 with an
 * atomic counter of finished sub-spaces.
 */
#include "index/pq_train.h"

#include <stdlib.h>
#include <string.h>

#include "index/kmeans.h"
#include "core/parallel.h"
#include "core/log.h"
#include "core/mem.h"

void tsr_pq_train_params_default(tsr_pq_train_params *p)
{
    memset(p, 0, sizeof *p);
    p->niter = 25;
    p->max_points_per_centroid = 256;
    p->seed = 1234;
    p->threads = 1;
}

typedef struct {
    tsr_pq *pq;
    const float *x;
    size_t n;
    const tsr_pq_train_params *p;
    int rc[TSR_PARALLEL_MAX_THREADS];
    tsr_error err[TSR_PARALLEL_MAX_THREADS];
    int done;
} train_ctx;

static void train_range(void *arg, size_t begin, size_t end, int tid)
{
    train_ctx *c = arg;
    tsr_pq *pq = c->pq;
    size_t n = c->n, dsub = pq->dsub, d = pq->d;
    float *slice = tsr_try_malloc(n, dsub * sizeof(float));
    if (slice == NULL) {
        c->rc[tid] = tsr_err(&c->err[tid], TSR_ENOMEM, "PQ training: out of memory for %zu x %zu",
                             n, dsub);
        return;
    }
    tsr_kmeans_params kp;
    tsr_kmeans_params_default(&kp);
    kp.niter = c->p->niter;
    kp.max_points_per_centroid = 0; /* the caller's sample is already small enough */
    kp.seed = c->p->seed;
    kp.threads = 1;
    kp.quiet = 1;
    for (size_t m = begin; m < end; m++) {
        for (size_t i = 0; i < n; i++)
            memcpy(slice + i * dsub, c->x + i * d + m * dsub, dsub * sizeof(float));
        int rc = tsr_kmeans_train(&kp, slice, n, dsub, pq->ksub,
                                  pq->centroids + m * pq->ksub * dsub, NULL, &c->err[tid]);
        if (rc != 0) {
            c->rc[tid] = tsr_err_prefix(&c->err[tid], "PQ sub-space %zu", m);
            break;
        }
        int done = __atomic_add_fetch(&c->done, 1, __ATOMIC_RELAXED);
        if (tid == 0 && c->p->progress != NULL)
            c->p->progress(c->p->progress_ctx, done, (int)pq->M);
    }
    free(slice);
}

int tsr_pq_train(tsr_pq *pq, const float *x, size_t n, const tsr_pq_train_params *p,
                 tsr_error *err)
{
    int rc = 0;
    float *xs_own = NULL;
    size_t *idx = NULL;
    train_ctx *c = NULL;
    if (n < pq->ksub)
        return tsr_err(err, TSR_EINVAL,
                       "PQ training: %zu training vectors, need at least 2^nbits = %zu", n,
                       pq->ksub);
    const float *xs = x;
    size_t ns = n;
    if (p->max_points_per_centroid > 0 && n > p->max_points_per_centroid * pq->ksub) {
        ns = p->max_points_per_centroid * pq->ksub;
        idx = tsr_try_malloc(ns, sizeof(size_t));
        xs_own = tsr_try_malloc(ns, pq->d * sizeof(float));
        if (idx == NULL || xs_own == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "PQ training: out of memory for %zu vectors", ns);
            goto cleanup;
        }
        if ((rc = tsr_sample_indices(n, ns, p->seed, idx, err)) != 0)
            goto cleanup;
        for (size_t i = 0; i < ns; i++)
            memcpy(xs_own + i * pq->d, x + idx[i] * pq->d, pq->d * sizeof(float));
        xs = xs_own;
    } else if (!p->quiet && n < 39 * pq->ksub) {
        tsr_warn("PQ training: %zu vectors for %zu sub-centroids; %zu are advised", n, pq->ksub,
                 39 * pq->ksub);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "PQ training: out of memory");
        goto cleanup;
    }
    c->pq = pq;
    c->x = xs;
    c->n = ns;
    c->p = p;
    tsr_parallel_for(p->threads, pq->M, train_range, c);
    for (int t = 0; t < TSR_PARALLEL_MAX_THREADS; t++) {
        if (c->rc[t] != 0) {
            rc = c->rc[t];
            if (err != NULL)
                *err = c->err[t];
            break;
        }
    }
cleanup:
    free(c);
    free(idx);
    free(xs_own);
    return rc;
}
