/*
 * knn — blocked sgemm brute force (see knn.h).
 *
 * For a block of queries and a block of database vectors, sgemm computes all inner
 * products at once; L2 distances follow from ||x||^2 + ||y||^2 - 2<x,y>. Each query keeps a
 * k-heap (k = 1 is a plain running minimum, the k-means case).
 */
#include "knn.h"

#include <cblas.h>
#undef I /* <complex.h>, pulled in by OpenBLAS, defines I */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

enum { BLOCK_X = 1024, BLOCK_Y = 1024 };

void tsr_blas_set_threads(int threads)
{
    openblas_set_num_threads(threads > 0 ? threads : 1);
}

void tsr_knn_norms(const float *x, size_t n, size_t d, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const float *r = x + i * d;
        float s = 0;
        for (size_t j = 0; j < d; j++)
            s += r[j] * r[j];
        out[i] = s;
    }
}

/* "a is worse than b" in the heap order: the root holds the worst kept result. */
static inline int worse(float da, int64_t ia, float db, int64_t ib, int larger_better)
{
    if (da != db)
        return larger_better ? da < db : da > db;
    return ia > ib;
}

/* Replace the root of a k-heap (root = worst) and sift down. */
static void heap_replace(float *D, int64_t *I, size_t k, float d, int64_t id, int lb)
{
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        float wd = d;
        int64_t wi = id;
        if (l < k && worse(D[l], I[l], wd, wi, lb)) {
            w = l;
            wd = D[l];
            wi = I[l];
        }
        if (r < k && worse(D[r], I[r], wd, wi, lb))
            w = r;
        if (w == i)
            break;
        D[i] = D[w];
        I[i] = I[w];
        i = w;
    }
    D[i] = d;
    I[i] = id;
}

/* Sort a heap's contents best first (simple: k is small). */
static void heap_sort_out(float *D, int64_t *I, size_t k, int lb)
{
    for (size_t i = 1; i < k; i++) {
        float d = D[i];
        int64_t id = I[i];
        size_t j = i;
        while (j > 0 && worse(D[j - 1], I[j - 1], d, id, lb)) {
            D[j] = D[j - 1];
            I[j] = I[j - 1];
            j--;
        }
        D[j] = d;
        I[j] = id;
    }
}

int tsr_knn(const float *x, size_t n, const float *y, size_t ny, size_t d,
            enum tsr_metric metric, size_t k, const float *y_norms, float *D, int64_t *I,
            tsr_error *err)
{
    int rc = 0;
    int lb = metric == TSR_METRIC_IP;
    float init = lb ? -INFINITY : INFINITY;
    float *ip = NULL, *xn = NULL, *yn_own = NULL;
    if (k == 0 || n == 0)
        return 0;
    for (size_t i = 0; i < n * k; i++) {
        D[i] = init;
        I[i] = -1;
    }
    if (ny == 0)
        return 0;
    ip = tsr_try_malloc((size_t)BLOCK_X * BLOCK_Y, sizeof(float));
    xn = tsr_try_malloc(BLOCK_X, sizeof(float));
    if (ip == NULL || xn == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "knn: out of memory");
        goto cleanup;
    }
    const float *yn = y_norms;
    if (!lb && yn == NULL) {
        yn_own = tsr_try_malloc(ny, sizeof(float));
        if (yn_own == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "knn: out of memory for %zu norms", ny);
            goto cleanup;
        }
        tsr_knn_norms(y, ny, d, yn_own);
        yn = yn_own;
    }
    for (size_t x0 = 0; x0 < n; x0 += BLOCK_X) {
        size_t nx = n - x0 < BLOCK_X ? n - x0 : BLOCK_X;
        if (!lb)
            tsr_knn_norms(x + x0 * d, nx, d, xn);
        for (size_t y0 = 0; y0 < ny; y0 += BLOCK_Y) {
            size_t nyb = ny - y0 < BLOCK_Y ? ny - y0 : BLOCK_Y;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nx, (int)nyb, (int)d, 1.0f,
                        x + x0 * d, (int)d, y + y0 * d, (int)d, 0.0f, ip, (int)nyb);
            for (size_t i = 0; i < nx; i++) {
                float *Dq = D + (x0 + i) * k;
                int64_t *Iq = I + (x0 + i) * k;
                const float *row = ip + i * nyb;
                if (k == 1) {
                    float best = Dq[0];
                    int64_t bi = Iq[0];
                    for (size_t j = 0; j < nyb; j++) {
                        float v = lb ? row[j] : xn[i] + yn[y0 + j] - 2 * row[j];
                        if (lb ? v > best : v < best) {
                            best = v;
                            bi = (int64_t)(y0 + j);
                        }
                    }
                    Dq[0] = best;
                    Iq[0] = bi;
                    continue;
                }
                for (size_t j = 0; j < nyb; j++) {
                    float v = lb ? row[j] : xn[i] + yn[y0 + j] - 2 * row[j];
                    int64_t id = (int64_t)(y0 + j);
                    if (worse(Dq[0], Iq[0], v, id, lb))
                        heap_replace(Dq, Iq, k, v, id, lb);
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        heap_sort_out(D + i * k, I + i * k, k, lb);
    if (!lb) /* rounding can make an exact match slightly negative */
        for (size_t i = 0; i < n * k; i++)
            if (D[i] < 0)
                D[i] = 0;
cleanup:
    free(ip);
    free(xn);
    free(yn_own);
    return rc;
}
