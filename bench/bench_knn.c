/*
 * bench_knn — the coarse step alone (`make bench-knn`): tsr_knn of the queries against an
 * index file's coarse centroids, k = nprobe nearest lists, the way the coordinator and
 * the in-process engine call it (centroid norms given, one BLAS thread), with its scalar
 * row scan (TSR_SIMD=scalar) and with the AVX-512 one, alternated round by round in one
 * process so that both see the same machine. Prints a markdown table: per k and queries
 * per call, microseconds per query (median of the rounds) for each path and their ratio.
 * Both paths give the same lists and distances bit for bit (tests/unit/test_knn.c); this
 * checks it again on the real data and exits 1 if not. From k = 32 the scalar path
 * selects; the AVX-512 one keeps the heap for L2 up to k = 127 (knn.c SELECT_MIN_K_WIDE).
 *
 * usage: bench_knn --index F.faiss --queries Q.fvecs [--k 1,10,16,32,64,128] [--batch 1,32]
 *                  [--rounds 7]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "index/faiss_io.h"
#include "index/knn.h"
#include "index/vecs_io.h"

#define MAX_LIST 16
#define MAX_ROUNDS 31

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_knn: %s: %s\n", what, msg);
    exit(1);
}

/* "1,10,16" -> v (at most MAX_LIST values, each 1..max); returns the count. */
static size_t parse_list(const char *opt, const char *s, size_t *v, size_t max)
{
    size_t n = 0;
    while (*s) {
        char *end;
        unsigned long long x = strtoull(s, &end, 10);
        if (end == s || x < 1 || x > max || n == MAX_LIST || (*end && *end != ','))
            die(opt, "expected a comma-separated list of positive integers");
        v[n++] = (size_t)x;
        s = *end ? end + 1 : end;
    }
    if (n == 0)
        die(opt, "empty list");
    return n;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One pass over every whole call of `batch` queries; microseconds per query. */
static double pass(const tsr_ivfpq *ix, const float *xq, size_t nq, size_t batch, size_t k,
                   const float *norms, float *D, int64_t *I)
{
    tsr_error err = TSR_ERROR_INIT;
    size_t d = (size_t)ix->d, done = 0;
    double t0 = now_us();
    for (size_t q = 0; q + batch <= nq; q += batch, done += batch)
        if (tsr_knn(xq + q * d, batch, ix->centroids, ix->nlist, d, ix->metric, k, norms,
                    D + q * k, I + q * k, &err) != 0)
            die("tsr_knn", err.msg);
    return (now_us() - t0) / (double)done;
}

int main(int argc, char **argv)
{
    const char *index = NULL, *queries = NULL;
    size_t ks[MAX_LIST] = {1, 10, 16, 32, 64, 128}, nk = 6;
    size_t bs[MAX_LIST] = {1, 32}, nb = 2, rounds = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: bench_knn --index F.faiss --queries Q.fvecs [--k 1,10,16,32,64,128] "
                   "[--batch 1,32] [--rounds 7]\n");
            return 0;
        }
        if (i + 1 >= argc)
            die(a, "needs a value");
        const char *v = argv[++i];
        if (!strcmp(a, "--index"))
            index = v;
        else if (!strcmp(a, "--queries"))
            queries = v;
        else if (!strcmp(a, "--k"))
            nk = parse_list(a, v, ks, 1024);
        else if (!strcmp(a, "--batch"))
            nb = parse_list(a, v, bs, 1024);
        else if (!strcmp(a, "--rounds")) {
            size_t r[MAX_LIST];
            if (parse_list(a, v, r, MAX_ROUNDS) != 1)
                die(a, "expected one number of rounds");
            rounds = r[0];
        }
        else
            die(a, "unknown option (see --help)");
    }
    if (!index || !queries)
        die("usage", "--index and --queries are required (see --help)");
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = NULL;
    float *xq = NULL;
    size_t nq = 0, d = 0;
    if (tsr_faiss_read_file(index, &ix, &err))
        die(index, err.msg);
    if (tsr_fvecs_read(queries, &xq, &nq, &d, &err))
        die(queries, err.msg);
    if (d != (size_t)ix->d)
        die(queries, "dimension differs from the index");
    tsr_blas_set_threads(1);
    float *norms = tsr_xmalloc(ix->nlist * sizeof *norms);
    tsr_knn_norms(ix->centroids, ix->nlist, d, norms);
    size_t kmax = 1;
    for (size_t i = 0; i < nk; i++)
        kmax = ks[i] > kmax ? ks[i] : kmax;
    float *D0 = tsr_xmalloc(nq * kmax * sizeof *D0), *D1 = tsr_xmalloc(nq * kmax * sizeof *D1);
    int64_t *I0 = tsr_xmalloc(nq * kmax * sizeof *I0), *I1 = tsr_xmalloc(nq * kmax * sizeof *I1);
    for (size_t ki = 0; ki < nk; ki++) /* warm-up: page faults, BLAS buffers, caches */
        pass(ix, xq, nq, bs[0], ks[ki], norms, D0, I0);

    printf("Coarse step (tsr_knn): %zu queries x %zu centroids, d = %zu, one BLAS thread; "
           "median of %zu alternated rounds, us per query\n\n", nq, ix->nlist, d, rounds);
    printf("| k (nprobe) | queries/call | scalar row scan | AVX-512 row scan | AVX-512 / scalar |"
           " same lists and distances |\n|---:|---:|---:|---:|---:|---|\n");
    int all_same = 1;
    for (size_t bi = 0; bi < nb; bi++)
        for (size_t ki = 0; ki < nk; ki++) {
            size_t k = ks[ki], b = bs[bi];
            double t[2][MAX_ROUNDS];
            for (size_t r = 0; r < rounds; r++)
                for (int p = 0; p < 2; p++) { /* alternated, the first path per round too */
                    int scalar = (int)((r + (size_t)p) % 2 == 0);
                    if (scalar)
                        setenv("TSR_SIMD", "scalar", 1);
                    else
                        unsetenv("TSR_SIMD");
                    t[scalar ? 0 : 1][r] = pass(ix, xq, nq, b, k, norms, scalar ? D0 : D1,
                                                scalar ? I0 : I1);
                }
            unsetenv("TSR_SIMD");
            size_t n = nq / b * b * k;
            int same = !memcmp(I0, I1, n * sizeof *I0) && !memcmp(D0, D1, n * sizeof *D0);
            all_same &= same;
            qsort(t[0], rounds, sizeof(double), dcmp);
            qsort(t[1], rounds, sizeof(double), dcmp);
            double s = t[0][rounds / 2], w = t[1][rounds / 2];
            printf("| %zu | %zu | %.2f | %.2f | %.2f | %s |\n", k, b, s, w, w / s,
                   same ? "yes" : "NO");
        }
    free(norms);
    free(D0);
    free(D1);
    free(I0);
    free(I1);
    free(xq);
    tsr_ivfpq_destroy(ix);
    return all_same ? 0 : 1;
}
