/*
 * test_kmeans — k-means: determinism (same seed → same centroids, any thread count),
 * recovery of well-separated clusters (also in one dimension, the PQ dsub = 1 path),
 * Faiss-style splitting of empty clusters, spherical IP training, the SIMD argmin/argmax
 * against the scalar ones, and assignment against brute force.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "index/kmeans.h"
#include "index/kmeans_int.h"

static float gauss(tsr_rng *r)
{
    float u = tsr_rng_float(r) + 1e-7f, v = tsr_rng_float(r);
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

/* n points around nc random centers (spread `sep`, noise 1); centers returned. */
static float *clustered(size_t n, size_t d, size_t nc, float sep, uint64_t seed, float **centers)
{
    tsr_rng r;
    tsr_rng_seed(&r, seed);
    float *c = malloc(nc * d * sizeof(float)), *x = malloc(n * d * sizeof(float));
    for (size_t i = 0; i < nc * d; i++)
        c[i] = gauss(&r) * sep;
    for (size_t i = 0; i < n; i++) {
        size_t j = i % nc;
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = c[j * d + t] + gauss(&r);
    }
    *centers = c;
    return x;
}

static void test_determinism(void **state)
{
    (void)state;
    float *centers;
    size_t n = 20000, d = 16, k = 50;
    float *x = clustered(n, d, 40, 3, 11, &centers);
    float *a = malloc(k * d * sizeof(float)), *b = malloc(k * d * sizeof(float)),
          *c = malloc(k * d * sizeof(float));
    tsr_kmeans_params p;
    tsr_kmeans_params_default(&p);
    p.niter = 8;
    p.max_points_per_centroid = 100; /* exercise the subsample too */
    p.quiet = 1;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, a, NULL, &err), 0);
    p.threads = 3;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, b, NULL, &err), 0);
    assert_memory_equal(a, b, k * d * sizeof(float));
    p.threads = 1;
    p.seed = 99;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, c, NULL, &err), 0);
    assert_true(memcmp(a, c, k * d * sizeof(float)) != 0);
    free(a);
    free(b);
    free(c);
    free(x);
    free(centers);
}

static void check_recovered(const float *centers, size_t nc, const float *got, size_t d, float tol)
{
    for (size_t j = 0; j < nc; j++) {
        float best = INFINITY;
        for (size_t i = 0; i < nc; i++) {
            float s = 0;
            for (size_t t = 0; t < d; t++) {
                float u = centers[j * d + t] - got[i * d + t];
                s += u * u;
            }
            best = fminf(best, s);
        }
        assert_true(best < tol);
    }
}

/* Lloyd from random points (Faiss's init, no k-means++) cannot move a centroid from one
 * far-away cluster to another, so with k = nc a cluster that got two initial points
 * leaves another one uncovered. The test therefore over-partitions (k = 8 nc, as IVF
 * does) and checks that every true cluster is covered and no centroid straddles two. */
static void test_recovers_clusters(void **state)
{
    (void)state;
    float *centers;
    size_t n = 20000, d = 8, nc = 10, k = 80;
    float *x = clustered(n, d, nc, 30, 5, &centers);
    float *c = malloc(k * d * sizeof(float));
    tsr_kmeans_params p;
    tsr_kmeans_params_default(&p);
    p.quiet = 1;
    tsr_kmeans_stats st;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, c, &st, &err), 0);
    assert_int_equal(st.iterations, 25);
    assert_int_equal(st.n_used, n);
    int64_t *as = malloc(n * sizeof(int64_t));
    assert_int_equal(tsr_kmeans_assign(x, n, d, c, k, NULL, TSR_METRIC_L2, 1, as, NULL, &err), 0);
    int owner[80], covered[10] = {0};
    for (size_t j = 0; j < k; j++)
        owner[j] = -1;
    for (size_t i = 0; i < n; i++) {
        int t = (int)(i % nc);
        if (owner[as[i]] < 0)
            owner[as[i]] = t;
        assert_int_equal(owner[as[i]], t); /* pure */
        covered[t] = 1;
    }
    for (size_t t = 0; t < nc; t++)
        assert_true(covered[t]);
    /* within-cluster scatter only: below the noise variance d per point */
    assert_true(st.objective / (double)n < (double)d);
    /* n == k: the points are the centroids (as in Faiss) */
    float *c10 = malloc(nc * d * sizeof(float));
    p.niter = 10;
    assert_int_equal(tsr_kmeans_train(&p, x, nc, d, nc, c10, NULL, &err), 0); /* n == k */
    assert_memory_equal(c10, x, nc * d * sizeof(float));
    free(c10);
    free(as);
    free(c);
    free(x);
    free(centers);
}

static void test_one_dimension(void **state)
{
    (void)state;
    size_t n = 3000, k = 3;
    float *x = malloc(n * sizeof(float)), c[3];
    tsr_rng r;
    tsr_rng_seed(&r, 3);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i % 3) - 1) * 100.0f + gauss(&r);
    tsr_kmeans_params p;
    tsr_kmeans_params_default(&p);
    p.quiet = 1;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_train(&p, x, n, 1, k, c, NULL, &err), 0);
    float want[3] = {-100, 0, 100};
    check_recovered(want, 3, c, 1, 0.2f);
    /* the 1-D assignment equals the sgemm one on a random problem */
    size_t k2 = 64;
    float *c2 = malloc(k2 * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = gauss(&r);
    assert_int_equal(tsr_kmeans_train(&p, x, n, 1, k2, c2, NULL, &err), 0);
    int64_t *as = malloc(n * sizeof(int64_t));
    float *dist = malloc(n * sizeof(float));
    assert_int_equal(tsr_kmeans_assign(x, n, 1, c2, k2, NULL, TSR_METRIC_L2, 1, as, dist, &err), 0);
    for (size_t i = 0; i < n; i++) {
        float best = INFINITY;
        for (size_t j = 0; j < k2; j++)
            best = fminf(best, (x[i] - c2[j]) * (x[i] - c2[j]));
        float got = (x[i] - c2[as[i]]) * (x[i] - c2[as[i]]);
        assert_true(got <= best + 1e-5f);
    }
    free(as);
    free(dist);
    free(c2);
    free(x);
}

static void test_empty_cluster_split(void **state)
{
    (void)state;
    /* 400 points but only 4 distinct values, 12 clusters: most start or become empty */
    size_t n = 400, d = 4, k = 12;
    float *x = malloc(n * d * sizeof(float)), *c = malloc(k * d * sizeof(float));
    for (size_t i = 0; i < n; i++)
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = (float)((i % 4) * 10 + t + 1);
    tsr_kmeans_params p;
    tsr_kmeans_params_default(&p);
    p.quiet = 1;
    tsr_kmeans_stats st;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, c, &st, &err), 0);
    assert_true(st.nsplit > 0);
    for (size_t i = 0; i < k * d; i++)
        assert_true(isfinite(c[i]));
    /* every centroid is a (perturbed) copy near one of the 4 points */
    for (size_t j = 0; j < k; j++) {
        float best = INFINITY;
        for (size_t q = 0; q < 4; q++) {
            float s = 0;
            for (size_t t = 0; t < d; t++) {
                float u = c[j * d + t] - x[q * d + t];
                s += u * u;
            }
            best = fminf(best, s);
        }
        assert_true(best < 1.0f);
    }
    /* n < k is refused */
    assert_int_equal(tsr_kmeans_train(&p, x, 5, d, 6, c, NULL, &err), TSR_EINVAL);
    free(x);
    free(c);
}

static void test_spherical_ip(void **state)
{
    (void)state;
    float *centers;
    size_t n = 5000, d = 16, k = 20;
    float *x = clustered(n, d, k, 3, 8, &centers);
    float *c = malloc(k * d * sizeof(float));
    tsr_kmeans_params p;
    tsr_kmeans_params_default(&p);
    p.metric = TSR_METRIC_IP;
    p.spherical = 1;
    p.quiet = 1;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_train(&p, x, n, d, k, c, NULL, &err), 0);
    for (size_t j = 0; j < k; j++) {
        float s = 0;
        for (size_t t = 0; t < d; t++)
            s += c[j * d + t] * c[j * d + t];
        assert_true(fabsf(s - 1) < 1e-4f);
    }
    /* IP assignment is the argmax of the inner product */
    int64_t *as = malloc(n * sizeof(int64_t));
    float *dist = malloc(n * sizeof(float));
    assert_int_equal(tsr_kmeans_assign(x, n, d, c, k, NULL, TSR_METRIC_IP, 2, as, dist, &err), 0);
    for (size_t i = 0; i < n; i += 7) {
        float best = -INFINITY;
        for (size_t j = 0; j < k; j++) {
            float s = 0;
            for (size_t t = 0; t < d; t++)
                s += x[i * d + t] * c[j * d + t];
            best = fmaxf(best, s);
        }
        assert_true(dist[i] >= best - 1e-3f);
    }
    free(as);
    free(dist);
    free(c);
    free(x);
    free(centers);
}

static void test_kernels(void **state)
{
    (void)state;
    tsr_rng r;
    tsr_rng_seed(&r, 1);
    float ip[1000], cn[1000];
    for (int rep = 0; rep < 200; rep++) {
        size_t n = 1 + tsr_rng_below(&r, 1000);
        for (size_t j = 0; j < n; j++) {
            /* few distinct values so that ties are frequent */
            ip[j] = (float)tsr_rng_below(&r, 8);
            cn[j] = (float)tsr_rng_below(&r, 8);
        }
        assert_int_equal(tsr__argmin_l2(ip, cn, n), tsr__argmin_l2_scalar(ip, cn, n));
        assert_int_equal(tsr__argmax(ip, n), tsr__argmax_scalar(ip, n));
        if (__builtin_cpu_supports("avx512f")) {
            assert_int_equal(tsr__argmin_l2_avx512(ip, cn, n), tsr__argmin_l2_scalar(ip, cn, n));
            assert_int_equal(tsr__argmax_avx512(ip, n), tsr__argmax_scalar(ip, n));
        }
    }
}

static void test_assign_brute_force(void **state)
{
    (void)state;
    tsr_rng r;
    tsr_rng_seed(&r, 2);
    size_t n = 700, d = 12, k = 1500; /* k spans two centroid blocks */
    float *x = malloc(n * d * sizeof(float)), *c = malloc(k * d * sizeof(float));
    for (size_t i = 0; i < n * d; i++)
        x[i] = gauss(&r);
    for (size_t i = 0; i < k * d; i++)
        c[i] = gauss(&r);
    int64_t *as = malloc(n * sizeof(int64_t));
    float *dist = malloc(n * sizeof(float));
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_kmeans_assign(x, n, d, c, k, NULL, TSR_METRIC_L2, 3, as, dist, &err), 0);
    for (size_t i = 0; i < n; i++) {
        double best = INFINITY;
        for (size_t j = 0; j < k; j++) {
            double s = 0;
            for (size_t t = 0; t < d; t++) {
                double u = (double)x[i * d + t] - c[j * d + t];
                s += u * u;
            }
            if (s < best)
                best = s;
        }
        double got = 0;
        for (size_t t = 0; t < d; t++) {
            double u = (double)x[i * d + t] - c[as[i] * d + t];
            got += u * u;
        }
        assert_true(got <= best + 1e-3);
        assert_true(fabs(dist[i] - got) < 1e-3 * (1 + got));
    }
    free(x);
    free(c);
    free(as);
    free(dist);
}

static void test_sample(void **state)
{
    (void)state;
    size_t out[100], out2[100];
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_sample_indices(1000, 100, 7, out, &err), 0);
    assert_int_equal(tsr_sample_indices(1000, 100, 7, out2, &err), 0);
    assert_memory_equal(out, out2, sizeof out);
    for (size_t i = 1; i < 100; i++)
        assert_true(out[i] > out[i - 1] && out[i] < 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism),        cmocka_unit_test(test_recovers_clusters),
        cmocka_unit_test(test_one_dimension),      cmocka_unit_test(test_empty_cluster_split),
        cmocka_unit_test(test_spherical_ip),       cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_assign_brute_force), cmocka_unit_test(test_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
