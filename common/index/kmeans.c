/*
 * kmeans — Lloyd k-means after Faiss's Clustering (see kmeans.h and docs/training.md).
 *
 * Assignment: blocks of points x blocks of centroids, inner products by sgemm, then a
 * running argmin of ||c||^2 - 2<x,c> (L2; ||x||^2 is the same for every centroid) or
 * argmax of <x,c> (IP). In one dimension (PQ with dsub = 1, the seed configuration) sgemm
 * with K = 1 wastes almost all of its work, so points are sorted once and each round is a
 * merge against the sorted centroids: the nearest centroid is one of the two neighbours.
 *
 * DESIGN (threads): tsr_parallel_for (core/parallel) splits an index range into one contiguous chunk per
 * thread; each thread writes only its own outputs (assignments of its points, sums of its
 * centroids), so there is no lock. BLAS is called single-threaded from each worker.
 */
#include "index/kmeans.h"

#include <cblas.h>
#undef I /* <complex.h>, pulled in by OpenBLAS, defines I */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/kmeans_int.h"
#include "index/knn.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/mem.h"

enum { BLOCK_X = TSR__ASSIGN_BLOCK_X, BLOCK_Y = TSR__ASSIGN_BLOCK_Y };
#define SPLIT_EPS (1.0f / 1024.0f)

/* ---- random numbers ------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tsr_rng_seed(tsr_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tsr_rng_next(tsr_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

size_t tsr_rng_below(tsr_rng *r, size_t n)
{
    /* Lemire's multiply-shift; the bias (n / 2^64) is irrelevant for sampling. */
    return (size_t)(((unsigned __int128)tsr_rng_next(r) * n) >> 64);
}

float tsr_rng_float(tsr_rng *r)
{
    return (float)(tsr_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

int tsr_sample_indices(size_t n, size_t m, uint64_t seed, size_t *out, tsr_error *err)
{
    size_t *perm = tsr_try_malloc(n ? n : 1, sizeof(size_t));
    if (perm == NULL)
        return tsr_err(err, TSR_ENOMEM, "sampling: out of memory for %zu indices", n);
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    tsr_rng r;
    tsr_rng_seed(&r, seed);
    for (size_t i = 0; i < m; i++) { /* partial Fisher-Yates: perm[0..m) is the sample */
        size_t j = i + tsr_rng_below(&r, n - i);
        size_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(out, perm, m * sizeof(size_t));
    free(perm);
    qsort(out, m, sizeof(size_t), cmp_size);
    return 0;
}

/* ---- assignment ----------------------------------------------------------------------- */

typedef struct {
    const float *x, *c, *cn;
    size_t d, k;
    int ip;
    int64_t *assign;
    float *dist;
    float *scratch; /* per thread TSR__ASSIGN_SCRATCH floats */
} assign_ctx;

void tsr__assign_rows(const float *x, size_t n, size_t d, const float *c, size_t k,
                      const float *cn, int ip, float *buf, int64_t *assign, float *dist)
{
    for (size_t x0 = 0; x0 < n; x0 += BLOCK_X) {
        size_t nx = n - x0 < BLOCK_X ? n - x0 : BLOCK_X;
        float best[BLOCK_X];
        int64_t bi[BLOCK_X];
        for (size_t i = 0; i < nx; i++) {
            best[i] = ip ? -INFINITY : INFINITY;
            bi[i] = 0;
        }
        for (size_t y0 = 0; y0 < k; y0 += BLOCK_Y) {
            size_t ny = k - y0 < BLOCK_Y ? k - y0 : BLOCK_Y;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nx, (int)ny, (int)d, 1.0f,
                        x + x0 * d, (int)d, c + y0 * d, (int)d, 0.0f, buf, (int)ny);
            for (size_t i = 0; i < nx; i++) {
                const float *row = buf + i * ny;
                size_t j = ip ? tsr__argmax(row, ny) : tsr__argmin_l2(row, cn + y0, ny);
                float v = ip ? row[j] : cn[y0 + j] - 2 * row[j];
                if (ip ? v > best[i] : v < best[i]) {
                    best[i] = v;
                    bi[i] = (int64_t)(y0 + j);
                }
            }
        }
        for (size_t i = 0; i < nx; i++) {
            assign[x0 + i] = bi[i];
            if (dist != NULL) {
                if (ip) {
                    dist[x0 + i] = best[i];
                } else {
                    const float *xr = x + (x0 + i) * d;
                    float xn = 0;
                    for (size_t t = 0; t < d; t++)
                        xn += xr[t] * xr[t];
                    float v = xn + best[i];
                    dist[x0 + i] = v > 0 ? v : 0;
                }
            }
        }
    }
}

static void assign_range(void *arg, size_t begin, size_t end, int tid)
{
    assign_ctx *a = arg;
    tsr__assign_rows(a->x + begin * a->d, end - begin, a->d, a->c, a->k, a->cn, a->ip,
                     a->scratch + (size_t)tid * TSR__ASSIGN_SCRATCH, a->assign + begin,
                     a->dist != NULL ? a->dist + begin : NULL);
}

int tsr_kmeans_assign(const float *x, size_t n, size_t d, const float *centroids, size_t k,
                      const float *c_norms, enum tsr_metric metric, int threads,
                      int64_t *assign, float *dist, tsr_error *err)
{
    if (n == 0)
        return 0;
    if (k == 0 || d == 0)
        return tsr_err(err, TSR_EINVAL, "assign: k=%zu d=%zu", k, d);
    int nt = threads < 1 ? 1 : threads > TSR_PARALLEL_MAX_THREADS ? TSR_PARALLEL_MAX_THREADS : threads;
    float *own_cn = NULL;
    float *scratch = tsr_try_malloc((size_t)nt, TSR__ASSIGN_SCRATCH * sizeof(float));
    if (scratch == NULL)
        return tsr_err(err, TSR_ENOMEM, "assign: out of memory");
    if (metric == TSR_METRIC_L2 && c_norms == NULL) {
        own_cn = tsr_try_malloc(k, sizeof(float));
        if (own_cn == NULL) {
            free(scratch);
            return tsr_err(err, TSR_ENOMEM, "assign: out of memory for %zu norms", k);
        }
        for (size_t j = 0; j < k; j++) {
            float s = 0;
            for (size_t t = 0; t < d; t++)
                s += centroids[j * d + t] * centroids[j * d + t];
            own_cn[j] = s;
        }
        c_norms = own_cn;
    }
    assign_ctx a = {x, centroids, c_norms, d, k, metric == TSR_METRIC_IP, assign, dist, scratch};
    if (nt > 1) /* our threads split the points; BLAS inside each must not fan out again */
        tsr_blas_set_threads(1);
    tsr_parallel_for(nt, n, assign_range, &a);
    free(own_cn);
    free(scratch);
    return 0;
}

/* ---- one dimension -------------------------------------------------------------------- */


/* Exact 1-D nearest-centroid assignment of sorted points: the nearest centroid is the
 * largest one <= x or the smallest one > x; among equal centroid values the smallest
 * centroid number wins (the order brute force would give). cs: k sorted centroids. */
static void assign_1d_sorted(const tsr__vi *pts, size_t n, const tsr__vi *cs, const size_t *run_start,
                             size_t k, int64_t *assign, float *dist)
{
    size_t p = 0; /* number of centroids <= current x */
    for (size_t t = 0; t < n; t++) {
        float x = pts[t].v;
        while (p < k && cs[p].v <= x)
            p++;
        size_t best;
        float bd;
        if (p == 0) {
            best = 0;
        } else if (p == k) {
            best = run_start[k - 1];
        } else {
            size_t lo = run_start[p - 1];
            float dl = (x - cs[lo].v) * (x - cs[lo].v), dh = (cs[p].v - x) * (cs[p].v - x);
            best = dh < dl || (dh == dl && cs[p].i < cs[lo].i) ? p : lo;
        }
        bd = (x - cs[best].v) * (x - cs[best].v);
        assign[pts[t].i] = cs[best].i;
        if (dist != NULL)
            dist[pts[t].i] = bd;
    }
}

/* ---- training ------------------------------------------------------------------------- */

void tsr_kmeans_params_default(tsr_kmeans_params *p)
{
    memset(p, 0, sizeof *p);
    p->niter = 25;
    p->max_points_per_centroid = 256;
    p->min_points_per_centroid = 39;
    p->seed = 1234;
    p->metric = TSR_METRIC_L2;
    p->threads = 1;
}

typedef struct {
    const float *x;
    size_t n, d;
    const int64_t *assign;
    double *sums;  /* k * d */
    size_t *count; /* k */
} update_ctx;

/* Each thread owns centroids [begin, end) and scans all points in order, so the sums do
 * not depend on the thread count. */
static void update_range(void *arg, size_t begin, size_t end, int tid)
{
    (void)tid;
    update_ctx *u = arg;
    size_t d = u->d;
    memset(u->sums + begin * d, 0, (end - begin) * d * sizeof(double));
    memset(u->count + begin, 0, (end - begin) * sizeof(size_t));
    for (size_t i = 0; i < u->n; i++) {
        size_t c = (size_t)u->assign[i];
        if (c < begin || c >= end)
            continue;
        const float *xr = u->x + i * d;
        double *s = u->sums + c * d;
        for (size_t t = 0; t < d; t++)
            s[t] += xr[t];
        u->count[c]++;
    }
}

static void renorm(float *c, size_t k, size_t d)
{
    for (size_t j = 0; j < k; j++) {
        double s = 0;
        for (size_t t = 0; t < d; t++)
            s += (double)c[j * d + t] * c[j * d + t];
        if (s > 0) {
            float inv = (float)(1.0 / sqrt(s));
            for (size_t t = 0; t < d; t++)
                c[j * d + t] *= inv;
        }
    }
}

/* Faiss's split_clusters: an empty cluster takes a copy of a cluster picked with
 * probability proportional to (size - 1), both moved apart by a relative 1/1024 in
 * alternating directions, and the donor's count is halved between them. */
static size_t split_empty(float *c, size_t k, size_t d, size_t n, size_t *count, tsr_rng *rng)
{
    size_t nsplit = 0;
    if (n <= k)
        return 0;
    for (size_t ci = 0; ci < k; ci++) {
        if (count[ci] != 0)
            continue;
        size_t cj = 0;
        for (;; cj = (cj + 1) % k) {
            float p = ((float)count[cj] - 1.0f) / (float)(n - k);
            if (tsr_rng_float(rng) < p)
                break;
        }
        memcpy(c + ci * d, c + cj * d, d * sizeof(float));
        for (size_t t = 0; t < d; t++) {
            if (t % 2 == 0) {
                c[ci * d + t] *= 1 + SPLIT_EPS;
                c[cj * d + t] *= 1 - SPLIT_EPS;
            } else {
                c[ci * d + t] *= 1 - SPLIT_EPS;
                c[cj * d + t] *= 1 + SPLIT_EPS;
            }
        }
        count[ci] = count[cj] / 2;
        count[cj] -= count[ci];
        nsplit++;
    }
    return nsplit;
}

int tsr_kmeans_train(const tsr_kmeans_params *p, const float *x, size_t n, size_t d, size_t k,
                     float *centroids, tsr_kmeans_stats *stats, tsr_error *err)
{
    int rc = 0;
    float *xs_own = NULL, *dist = NULL, *cn = NULL;
    int64_t *assign = NULL;
    double *sums = NULL;
    size_t *count = NULL, *idx = NULL, *run_start = NULL;
    tsr__vi *pts = NULL, *cs = NULL;
    tsr_kmeans_stats st = {0};
    if (k == 0 || d == 0)
        return tsr_err(err, TSR_EINVAL, "k-means: k=%zu d=%zu, expected both > 0", k, d);
    if (n < k)
        return tsr_err(err, TSR_EINVAL,
                       "k-means: %zu training points, need at least as many as clusters (%zu)",
                       n, k);
    const float *xs = x;
    size_t ns = n;
    if (p->max_points_per_centroid > 0 && k <= SIZE_MAX / p->max_points_per_centroid &&
        n > k * p->max_points_per_centroid) {
        ns = k * p->max_points_per_centroid;
        idx = tsr_try_malloc(ns, sizeof(size_t));
        xs_own = tsr_try_malloc(ns, d * sizeof(float));
        if (idx == NULL || xs_own == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "k-means: out of memory for a %zu-point sample", ns);
            goto cleanup;
        }
        if ((rc = tsr_sample_indices(n, ns, p->seed, idx, err)) != 0)
            goto cleanup;
        for (size_t i = 0; i < ns; i++)
            memcpy(xs_own + i * d, x + idx[i] * d, d * sizeof(float));
        xs = xs_own;
        free(idx);
        idx = NULL;
    } else if (!p->quiet && n < k * p->min_points_per_centroid) {
        tsr_warn("k-means: %zu training points for %zu centroids; %zu (%zu per centroid) "
                 "are advised", n, k, k * p->min_points_per_centroid,
                 p->min_points_per_centroid);
    }
    st.n_used = ns;

    /* initial centroids: k distinct sampled points */
    idx = tsr_try_malloc(k, sizeof(size_t));
    if (idx == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "k-means: out of memory");
        goto cleanup;
    }
    if (ns == k) {
        for (size_t i = 0; i < k; i++)
            idx[i] = i;
    } else if ((rc = tsr_sample_indices(ns, k, p->seed + 1, idx, err)) != 0) {
        goto cleanup;
    }
    /* the sample is sorted; shuffle-free order keeps centroid numbers reproducible */
    for (size_t j = 0; j < k; j++)
        memcpy(centroids + j * d, xs + idx[j] * d, d * sizeof(float));
    if (p->spherical)
        renorm(centroids, k, d);
    if (ns == k)
        goto done; /* Faiss: as many points as centroids, the points are the centroids */

    assign = tsr_try_malloc(ns, sizeof(int64_t));
    dist = tsr_try_malloc(ns, sizeof(float));
    sums = tsr_try_malloc(k, d * sizeof(double));
    count = tsr_try_malloc(k, sizeof(size_t));
    cn = tsr_try_malloc(k, sizeof(float));
    if (assign == NULL || dist == NULL || sums == NULL || count == NULL || cn == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "k-means: out of memory for %zu points", ns);
        goto cleanup;
    }
    int one_d = d == 1 && p->metric == TSR_METRIC_L2 && ns <= UINT32_MAX && k <= UINT32_MAX;
    if (one_d) {
        pts = tsr_try_malloc(ns, sizeof(tsr__vi));
        cs = tsr_try_malloc(k, sizeof(tsr__vi));
        run_start = tsr_try_malloc(k, sizeof(size_t));
        if (pts == NULL || cs == NULL || run_start == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "k-means: out of memory for %zu points", ns);
            goto cleanup;
        }
        for (size_t i = 0; i < ns; i++)
            pts[i] = (tsr__vi){xs[i], (uint32_t)i};
        qsort(pts, ns, sizeof(tsr__vi), tsr__cmp_vi);
    }
    tsr_rng rng;
    tsr_rng_seed(&rng, p->seed ^ 0x5eed5b117ull);
    int nt = p->threads < 1 ? 1 : p->threads;
    for (int it = 0; it < p->niter; it++) {
        if (one_d) {
            for (size_t j = 0; j < k; j++)
                cs[j] = (tsr__vi){centroids[j], (uint32_t)j};
            qsort(cs, k, sizeof(tsr__vi), tsr__cmp_vi);
            for (size_t j = 0; j < k; j++)
                run_start[j] = j > 0 && cs[j].v == cs[j - 1].v ? run_start[j - 1] : j;
            assign_1d_sorted(pts, ns, cs, run_start, k, assign, dist);
        } else {
            if (p->metric == TSR_METRIC_L2)
                tsr_knn_norms(centroids, k, d, cn);
            if ((rc = tsr_kmeans_assign(xs, ns, d, centroids, k, cn, p->metric, nt, assign, dist,
                                        err)) != 0)
                goto cleanup;
        }
        double obj = 0;
        for (size_t i = 0; i < ns; i++)
            obj += dist[i];
        st.objective = obj;
        update_ctx u = {xs, ns, d, assign, sums, count};
        tsr_parallel_for(nt, k, update_range, &u);
        for (size_t j = 0; j < k; j++) {
            if (count[j] == 0)
                continue; /* split below */
            double inv = 1.0 / (double)count[j];
            for (size_t t = 0; t < d; t++)
                centroids[j * d + t] = (float)(sums[j * d + t] * inv);
        }
        st.nsplit += split_empty(centroids, k, d, ns, count, &rng);
        if (p->spherical)
            renorm(centroids, k, d);
        st.iterations = it + 1;
        if (p->progress != NULL)
            p->progress(p->progress_ctx, it + 1, p->niter);
    }
done:
    if (stats != NULL)
        *stats = st;
cleanup:
    free(xs_own);
    free(idx);
    free(assign);
    free(dist);
    free(sums);
    free(count);
    free(cn);
    free(pts);
    free(cs);
    free(run_start);
    return rc;
}
