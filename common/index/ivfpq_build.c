/*
 * ivfpq_build — IndexIVFPQ::train and ::add (see ivfpq_build.h, docs/training.md).
 * Threads are the kmeans/pq_code workers; this file only sequences the phases.
 */
#include "index/ivfpq_build.h"

#include <stdlib.h>
#include <string.h>

#include "index/kmeans.h"
#include "core/mem.h"
#include "index/pq_code.h"
#include "index/pq_train.h"

enum { ADD_CHUNK = 65536 };

void tsr_build_params_default(tsr_build_params *p)
{
    memset(p, 0, sizeof *p);
    p->coarse_niter = 10;
    p->pq_niter = 25;
    p->max_points_per_centroid = 256;
    p->seed = 1234;
    p->threads = 1;
}

typedef struct {
    const tsr_build_params *p;
    const char *phase;
} prog;

static void prog_cb(void *ctx, int done, int total)
{
    prog *g = ctx;
    g->p->progress(g->p->progress_ctx, g->phase, (size_t)done, (size_t)total);
}

int tsr_ivfpq_assign(const tsr_ivfpq *ix, const float *x, size_t n, int threads,
                     int64_t *assign, tsr_error *err)
{
    return tsr_kmeans_assign(x, n, (size_t)ix->d, ix->centroids, ix->nlist, NULL, ix->metric,
                             threads, assign, NULL, err);
}

int tsr_ivfpq_train(tsr_ivfpq *ix, const float *x, size_t n, const tsr_build_params *p,
                    tsr_error *err)
{
    int rc = 0;
    size_t d = (size_t)ix->d;
    size_t *idx = NULL;
    float *xs = NULL;
    int64_t *as = NULL;
    if (n < ix->nlist)
        return tsr_err(err, TSR_EINVAL, "train: %zu vectors, need at least nlist = %zu", n,
                       ix->nlist);
    if (n < ix->pq.ksub)
        return tsr_err(err, TSR_EINVAL, "train: %zu vectors, need at least 2^nbits = %zu", n,
                       ix->pq.ksub);

    /* 1. coarse quantizer (Faiss Level1Quantizer::train_q1 with IVF's ClusteringParameters) */
    tsr_kmeans_params kp;
    tsr_kmeans_params_default(&kp);
    kp.niter = p->coarse_niter;
    kp.max_points_per_centroid = p->max_points_per_centroid;
    kp.seed = p->seed;
    kp.metric = ix->metric;
    kp.spherical = ix->metric == TSR_METRIC_IP; /* IndexIVF sets cp.spherical for IP */
    kp.threads = p->threads;
    kp.quiet = p->quiet;
    prog gc = {p, "coarse"}, gp = {p, "pq"};
    if (p->progress != NULL) {
        kp.progress = prog_cb;
        kp.progress_ctx = &gc;
    }
    if ((rc = tsr_kmeans_train(&kp, x, n, d, ix->nlist, ix->centroids, NULL, err)) != 0)
        return tsr_err_prefix(err, "coarse quantizer");
    ix->quantizer_is_trained = 1;

    /* 2. PQ training set (IndexIVFPQ::train_residual: sample, then residuals) */
    size_t cap = p->max_points_per_centroid ? p->max_points_per_centroid * ix->pq.ksub : n;
    size_t ns = n > cap ? cap : n;
    xs = tsr_try_malloc(ns, d * sizeof(float));
    as = tsr_try_malloc(ns, sizeof(int64_t));
    if (xs == NULL || as == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "train: out of memory for %zu training vectors", ns);
        goto cleanup;
    }
    if (ns < n) {
        idx = tsr_try_malloc(ns, sizeof(size_t));
        if (idx == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "train: out of memory");
            goto cleanup;
        }
        if ((rc = tsr_sample_indices(n, ns, p->seed, idx, err)) != 0)
            goto cleanup;
        for (size_t i = 0; i < ns; i++)
            memcpy(xs + i * d, x + idx[i] * d, d * sizeof(float));
    } else {
        memcpy(xs, x, ns * d * sizeof(float));
    }
    if (ix->by_residual) {
        if ((rc = tsr_ivfpq_assign(ix, xs, ns, p->threads, as, err)) != 0)
            goto cleanup;
        for (size_t i = 0; i < ns; i++) {
            const float *c = ix->centroids + (size_t)as[i] * d;
            for (size_t t = 0; t < d; t++)
                xs[i * d + t] -= c[t];
        }
    }
    tsr_pq_train_params pp;
    tsr_pq_train_params_default(&pp);
    pp.niter = p->pq_niter;
    pp.max_points_per_centroid = 0; /* sampled above */
    pp.seed = p->seed;
    pp.threads = p->threads;
    pp.quiet = p->quiet;
    if (p->progress != NULL) {
        pp.progress = prog_cb;
        pp.progress_ctx = &gp;
    }
    if ((rc = tsr_pq_train(&ix->pq, xs, ns, &pp, err)) != 0) {
        tsr_err_prefix(err, "product quantizer");
        goto cleanup;
    }
    ix->is_trained = 1;
cleanup:
    free(idx);
    free(xs);
    free(as);
    return rc;
}

int tsr_ivfpq_add(tsr_ivfpq *ix, const float *x, size_t n, const int64_t *labels,
                  const tsr_build_params *p, tsr_error *err)
{
    int rc = 0;
    size_t d = (size_t)ix->d, cs = ix->code_size;
    if (!ix->is_trained)
        return tsr_err(err, TSR_ESTATE, "add: the index is not trained");
    if (n == 0)
        return 0;
    size_t chunk = n < ADD_CHUNK ? n : ADD_CHUNK;
    int64_t *as = tsr_try_malloc(chunk, sizeof(int64_t));
    float *res = tsr_try_malloc(chunk, d * sizeof(float));
    uint8_t *codes = tsr_try_malloc(chunk, cs ? cs : 1);
    if (as == NULL || res == NULL || codes == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "add: out of memory");
        goto cleanup;
    }
    for (size_t c0 = 0; c0 < n; c0 += chunk) {
        size_t nc = n - c0 < chunk ? n - c0 : chunk;
        const float *xc = x + c0 * d;
        if ((rc = tsr_ivfpq_assign(ix, xc, nc, p->threads, as, err)) != 0)
            goto cleanup;
        const float *src = xc;
        if (ix->by_residual) {
            for (size_t i = 0; i < nc; i++) {
                const float *c = ix->centroids + (size_t)as[i] * d;
                for (size_t t = 0; t < d; t++)
                    res[i * d + t] = xc[i * d + t] - c[t];
            }
            src = res;
        }
        if ((rc = tsr_pq_encode(&ix->pq, src, nc, codes, p->threads, err)) != 0)
            goto cleanup;
        for (size_t i = 0; i < nc; i++) {
            int64_t label = labels != NULL ? labels[c0 + i] : ix->ntotal;
            if (tsr_invlist_append(&ix->lists[as[i]], cs, 1, codes + i * cs, &label) != 0) {
                rc = tsr_err(err, TSR_ENOMEM, "add: out of memory appending to list %lld",
                             (long long)as[i]);
                goto cleanup;
            }
            ix->ntotal++;
        }
        if (p->progress != NULL)
            p->progress(p->progress_ctx, "add", c0 + nc, n);
    }
cleanup:
    free(as);
    free(res);
    free(codes);
    return rc;
}
