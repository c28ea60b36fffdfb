/*
 * knn — blocked sgemm brute force (see knn.h).
 *
 * For a block of queries and a block of database vectors, sgemm computes all inner
 * products at once (sgemv for a call with one query); L2 distances follow from
 * ||x||^2 + ||y||^2 - 2<x,y>. Each query keeps a k-heap (k = 1 is a plain running
 * minimum, the k-means case); with AVX-512 the heap looks only at the blocks of 16 values
 * that hold a candidate (knn_avx512.c: the coarse step at nprobe 16 spent ~3 ns per
 * centroid in the scalar loop, ~12 us of a query over 4000 lists).
 */
#include "index/knn.h"
#include "index/knn_int.h"

#include <cblas.h>
#undef I /* <complex.h>, pulled in by OpenBLAS, defines I */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/cpu.h"
#include "core/heap.h"
#include "core/mem.h"
#include "core/testing.h"

enum { BLOCK_X = 1024, BLOCK_Y = 1024 };

/* ip (nx x ny, row-major) = x (nx x d) . y (ny x d)^T. one: the CALL has one query (never
 * a block of a larger call, so that a query's rounding does not depend on where it sits
 * in a batch): sgemv streams y once, where sgemm first packs all of y — 15 vs 61 us for
 * 4000 x 64 on the bench machine, 10 % of a cluster's CPU in the coordinator's coarse step
 * of single queries (perf, docs/performance.md). */
static void products(const float *x, size_t nx, const float *y, size_t ny, size_t d, int one,
                     float *ip)
{
    if (one)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)ny, (int)d, 1.0f, y, (int)d, x, 1,
                    0.0f, ip, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nx, (int)ny, (int)d, 1.0f,
                    x, (int)d, y, (int)d, 0.0f, ip, (int)ny);
}

void tsr_blas_set_threads(int threads)
{
    openblas_set_num_threads(threads > 0 ? threads : 1);
}

/* The sgemm output buffer of the heap path (4 MB): with 4 KB pages its first touch is
 * 1024 page faults, ~16 us each on the benchmark VM (~8 us per query at nprobe 1 when a
 * process searches once: the bench, the CLI). Transparent huge pages make that two
 * faults; madvise is only a hint (without THP this is an ordinary allocation). The
 * blocking itself is unchanged: it decides the sgemm's rounding, i.e. the results. */
static float *alloc_products(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    size_t bytes;
    if (tsr_mul_ok(n, sizeof(float), &bytes) != 0)
        return NULL;
    if (bytes < huge)
        return tsr_try_malloc(n, sizeof(float));
    void *p = NULL;
    bytes = (bytes + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    return p;
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

/* The k-heap of small k: core/heap.h, in this file's order (distance, then the smaller
 * label; the root holds the worst kept result). */
static inline unsigned heap_order(int lb)
{
    return lb ? TSR_HEAP_LARGER_BETTER : 0;
}

/* ---- selection for larger k (the coarse step of a search: k = nprobe) -------------------
 * A k-heap costs k ln(ny/k) sifts of log k levels per query; for k = 256 of 4000 lists that
 * was 10x the sgemm. Instead each (distance, label) becomes one uint64 key whose unsigned
 * order is the total order of this file (distance, then the smaller label; IP distances
 * negated, which is exact), the k smallest keys are selected in expected linear time and
 * only they are sorted. Keys are distinct (labels are), so no tie rule is needed. */

static inline uint64_t order_key(float v, uint32_t j)
{
    uint32_t u;
    v += 0.0f; /* -0 -> +0: equal floats must give equal keys */
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t)u << 32 | j;
}

static inline float key_value(uint64_t key)
{
    uint32_t u = (uint32_t)(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Moves the k smallest of a[0..n) to a[0..k) (any order); k < n. Hoare partitioning
 * around a median of three, iterating into the side holding position k. */
static void select_smallest(uint64_t *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n - 1; /* the k-th smallest (index k - 1) lies in [lo, hi] */
    size_t want = k - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t x = a[lo], y = a[mid], z = a[hi], pv;
        pv = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        size_t i = lo - 1, j = hi + 1; /* classic Hoare: i, j wrap only transiently */
        for (;;) {
            do
                i++;
            while (a[i] < pv);
            do
                j--;
            while (a[j] > pv);
            if (i >= j)
                break;
            uint64_t t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        /* now a[lo..j] <= pv <= a[j+1..hi] */
        if (want <= j)
            hi = j;
        else
            lo = j + 1;
    }
}

/* Sift x down from slot i of the max-heap a[0..n). */
static inline void sift_down(uint64_t *a, size_t i, size_t n, uint64_t x)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && a[c + 1] > a[c])
            c++;
        if (a[c] <= x)
            break;
        a[i] = a[c];
        i = c;
    }
    a[i] = x;
}

static void sort_keys(uint64_t *a, size_t n)
{
    /* heap sort: n is k (hundreds), no recursion, no comparator calls */
    for (size_t s = n / 2; s-- > 0;)
        sift_down(a, s, n, a[s]);
    for (size_t e = n; e-- > 1;) {
        uint64_t x = a[e];
        a[e] = a[0];
        sift_down(a, 0, e, x);
    }
}

/* One query's k best of ny values (row, already distances; NaN never selected). keys has
 * room for 2 * ny. A quickselect over all ny keys mispredicts about every other branch
 * (it was slower than the heap for k = 16), so a pivot a little above the k-th key is
 * estimated from an evenly spaced sample, the keys up to it are compacted without
 * branches, and only those few are selected and sorted. */
static void select_row(const float *v, size_t ny, size_t k, int lb, uint64_t *keys, float *Dq,
                       int64_t *Iq)
{
    size_t n = 0;
    for (size_t j = 0; j < ny; j++) {
        float x = v[j];
        keys[n] = order_key(lb ? -x : x, (uint32_t)j);
        n += x == x;
    }
    size_t take = n < k ? n : k;
    uint64_t *sel = keys;
    if (take < n) {
        enum { NS = 64 };
        uint64_t sample[NS];
        size_t ns = n < NS ? n : NS, c = 0;
        for (size_t i = 0; i < ns; i++)
            sample[i] = keys[i * (n / ns)];
        sort_keys(sample, ns);
        /* rank of the k-th key in the sample, with slack for the sampling error */
        size_t rank = take * ns / n * 2 + 4;
        uint64_t *cand = keys + ny;
        for (;;) {
            if (rank >= ns) { /* the pivot would be the largest: select among all */
                c = 0;
                break;
            }
            uint64_t pv = sample[rank];
            c = 0;
            for (size_t i = 0; i < n; i++) {
                cand[c] = keys[i];
                c += keys[i] <= pv;
            }
            if (c >= take)
                break;
            rank = rank * 2 + 4;
        }
        if (c > 0) {
            sel = cand;
            n = c;
        }
        if (take < n)
            select_smallest(sel, n, take);
    }
    sort_keys(sel, take);
    for (size_t r = 0; r < take; r++) {
        float x = key_value(sel[r]);
        Dq[r] = lb ? -x : x;
        Iq[r] = (int64_t)(sel[r] & 0xffffffffu);
    }
}

/* Queries with k >= SELECT_MIN_K and ny <= SELECT_MAX_NY take the selection path (the
 * scalar heap is faster below: 16 vs 21 us per query at k = 16 of 4000, 32 vs 25 at
 * k = 64). The heap with AVX-512 candidate blocks is faster up to k = 64 (`make
 * bench-knn`, batches of 32: 18 vs 26 us at k = 32, 29 vs 47 at k = 64; 55 vs 41 at
 * k = 128): L2 takes it below SELECT_MIN_K_WIDE. Not IP: there the selection path turns a
 * -0 distance into +0 and the heap keeps it, so the switch would change bits. */
enum {
    SELECT_MIN_K = 32,
    SELECT_MIN_K_WIDE = 128,
    SELECT_MAX_NY = 1 << 20,
    SELECT_IP_FLOATS = 1 << 18
};

static int knn_select(const float *x, size_t n, const float *y, size_t ny, size_t d, size_t k,
                      int lb, const float *yn, float *D, int64_t *I, tsr_error *err)
{
    /* The whole row of a query is needed at once: y is not blocked; x blocks keep the
     * sgemm output around 1 MB (it is written, then read once). */
    size_t bx = SELECT_IP_FLOATS / ny;
    if (bx < 1)
        bx = 1;
    if (bx > BLOCK_X)
        bx = BLOCK_X;
    int rc = 0;
    float *ip = tsr_try_malloc(bx * ny, sizeof(float));
    float *xn = tsr_try_malloc(bx, sizeof(float));
    uint64_t *keys = tsr_try_malloc(2 * ny, sizeof(uint64_t));
    if (ip == NULL || xn == NULL || keys == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "knn: out of memory for %zu x %zu products", bx, ny);
        goto cleanup;
    }
    for (size_t x0 = 0; x0 < n; x0 += bx) {
        size_t nx = n - x0 < bx ? n - x0 : bx;
        if (!lb)
            tsr_knn_norms(x + x0 * d, nx, d, xn);
        products(x + x0 * d, nx, y, ny, d, n == 1, ip);
        for (size_t i = 0; i < nx; i++) {
            float *row = ip + i * ny;
            if (!lb)
                for (size_t j = 0; j < ny; j++)
                    row[j] = xn[i] + yn[j] - 2 * row[j];
            select_row(row, ny, k, lb, keys, D + (x0 + i) * k, I + (x0 + i) * k);
        }
    }
cleanup:
    free(ip);
    free(xn);
    free(keys);
    return rc;
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
    /* AVX-512 for the k = 1 and k-heap scans unless TSR_SIMD forces the scalar or AVX2
     * path (the tests run both) */
    const char *se = tsr_test_knob(TSR_KNOB_SIMD);
    int wide = tsr_cpu_has(TSR_CPU_AVX512) &&
               !(se && (strcmp(se, "scalar") == 0 || strcmp(se, "avx2") == 0));
    if (k >= (wide && !lb ? SELECT_MIN_K_WIDE : SELECT_MIN_K) && ny <= SELECT_MAX_NY) {
        rc = knn_select(x, n, y, ny, d, k, lb, yn, D, I, err);
        goto clamp;
    }
    /* only as large as one block of this call: a single query (the coordinator's coarse
     * step, n = 1) must not pay for a 4 MB buffer — as a huge page its first touch zeroes
     * 2 MB, ~300 us per call (measured by bench-e2e); the blocks, hence the results, are
     * the same whatever the buffer's size */
    size_t bx = n < BLOCK_X ? n : BLOCK_X, by = ny < BLOCK_Y ? ny : BLOCK_Y;
    ip = alloc_products(bx * by);
    xn = tsr_try_malloc(bx, sizeof(float));
    if (ip == NULL || xn == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "knn: out of memory");
        goto cleanup;
    }
    for (size_t x0 = 0; x0 < n; x0 += BLOCK_X) {
        size_t nx = n - x0 < BLOCK_X ? n - x0 : BLOCK_X;
        if (!lb)
            tsr_knn_norms(x + x0 * d, nx, d, xn);
        for (size_t y0 = 0; y0 < ny; y0 += BLOCK_Y) {
            size_t nyb = ny - y0 < BLOCK_Y ? ny - y0 : BLOCK_Y;
            products(x + x0 * d, nx, y + y0 * d, nyb, d, n == 1, ip);
            for (size_t i = 0; i < nx; i++) {
                float *Dq = D + (x0 + i) * k;
                int64_t *Iq = I + (x0 + i) * k;
                const float *row = ip + i * nyb;
                if (k == 1) {
                    float best = Dq[0];
                    int64_t bi = Iq[0];
                    size_t j0 = 0;
                    if (wide && !lb) { /* the same winner, 16 lanes at a time */
                        j0 = nyb & ~(size_t)15;
                        if (j0 > 0)
                            tsr__knn_argmin_avx512(row, yn + y0, xn[i], j0, &best, &bi, y0);
                    }
                    for (size_t j = j0; j < nyb; j++) {
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
                tsr_heap h = {k, heap_order(lb), Dq, Iq, NULL};
                size_t j = 0;
                if (wide) { /* only the blocks with a candidate, 16 lanes at a time */
                    const size_t n16 = nyb & ~(size_t)15;
                    float v16[16];
                    unsigned m;
                    while ((j = tsr__knn_next_cand_avx512(row, lb ? NULL : yn + y0,
                                                          lb ? 0.0f : xn[i], j, n16, Dq[0],
                                                          lb, v16, &m)) < n16) {
                        for (; m; m &= m - 1) {
                            size_t l = (size_t)__builtin_ctz(m);
                            int64_t id = (int64_t)(y0 + j + l);
                            if (tsr_heap_worse(h.order, Dq[0], Iq[0], v16[l], id))
                                tsr_heap_replace_top(&h, v16[l], id, 0);
                        }
                        j += 16;
                    }
                }
                for (; j < nyb; j++) {
                    float v = lb ? row[j] : xn[i] + yn[y0 + j] - 2 * row[j];
                    int64_t id = (int64_t)(y0 + j);
                    if (tsr_heap_worse(h.order, Dq[0], Iq[0], v, id))
                        tsr_heap_replace_top(&h, v, id, 0);
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        tsr_heap h = {k, heap_order(lb), D + i * k, I + i * k, NULL};
        tsr_heap_sort(&h);
    }
clamp:
    if (rc == 0 && !lb) /* rounding can make an exact match slightly negative */
        for (size_t i = 0; i < n * k; i++)
            if (D[i] < 0)
                D[i] = 0;
cleanup:
    free(ip);
    free(xn);
    free(yn_own);
    return rc;
}
