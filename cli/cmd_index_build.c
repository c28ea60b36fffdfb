/*
 * cmd_index_build — `tessera index build`: trains an IVFPQ index on the input vectors
 * (Faiss's IndexIVFPQ training, see docs/training.md), adds all of them with their row
 * numbers as labels and writes a Faiss IwPQ file that stock Faiss loads.
 *
 * stderr: a progress line while training when stderr is a terminal, then one summary line
 * with the phase timings (train / add / write).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "faiss_io.h"
#include "ivfpq.h"
#include "ivfpq_build.h"
#include "knn.h"
#include "vecs_io.h"

static const char *usage_text =
    "usage: tessera index build --fvecs X.fvecs --nlist N --pq-m M [--pq-nbits 8]\n"
    "                           [--metric l2|ip] [--no-residual] [--seed S] [--threads T]\n"
    "                           --out F.faiss\n\n"
    "Trains an IVFPQ index on the vectors of X.fvecs exactly as Faiss's IndexIVFPQ::train\n"
    "does (coarse k-means: 10 rounds; PQ: k-means per sub-space, 25 rounds; at most 256\n"
    "training points per centroid, seeded sampling), adds every vector with its row number\n"
    "as label and writes a Faiss IwPQ file (loads in stock Faiss with faiss.read_index).\n\n"
    "  --fvecs X          input vectors (TEXMEX fvecs)\n"
    "  --nlist N          coarse lists (k-means centroids)\n"
    "  --pq-m M           PQ sub-quantizers; must divide the dimension\n"
    "  --pq-nbits B       bits per sub-code, 1..16 (default 8)\n"
    "  --metric l2|ip     distance (default l2); ip uses spherical k-means like Faiss\n"
    "  --no-residual      encode the vectors themselves, not their residuals\n"
    "  --seed S           sampling / initialisation seed (default 1234, Faiss's)\n"
    "  --threads T        worker threads (default 1); the result does not depend on T\n"
    "  --out F            output file (written atomically)\n"
    "Tuning (defaults are Faiss's; lower values trade recall for time):\n"
    "  --coarse-niter N   coarse k-means rounds (default 10)\n"
    "  --pq-niter N       PQ k-means rounds (default 25)\n"
    "  --max-points-per-centroid N   training sample cap per centroid (default 256)\n\n"
    "Exit 0 on success, 1 on bad input, 2 on usage errors.\n";

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    if (s == NULL || *s == '\0' || *s == '-') {
        fprintf(stderr, "tessera: index build: %s expects a number (see --help)\n", opt);
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "tessera: index build: %s '%s': expected an integer in %" PRIu64
                        "..%" PRIu64 "\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct {
    double t0;
    int tty;
    const char *last_phase;
} progress_state;

static void progress(void *ctx, const char *phase, size_t done, size_t total)
{
    progress_state *ps = ctx;
    if (!ps->tty)
        return;
    const char *what = strcmp(phase, "coarse") == 0 ? "coarse k-means round"
                       : strcmp(phase, "pq") == 0   ? "PQ sub-space"
                                                    : "adding vectors";
    fprintf(stderr, "\r\033[Ktessera: index build: %s %zu/%zu (%.1f s)", what, done, total,
            now_s() - ps->t0);
    fflush(stderr);
    ps->last_phase = phase;
}

static void progress_end(progress_state *ps)
{
    if (ps->tty && ps->last_phase != NULL) {
        fprintf(stderr, "\r\033[K");
        ps->last_phase = NULL;
    }
}

int tsr_cmd_index_build(int argc, char **argv)
{
    if (tsr_cli_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return 0;
    }
    const char *fvecs = NULL, *out = NULL, *metric_s = "l2";
    uint64_t nlist = 0, pq_m = 0, nbits = 8, seed = 1234, threads = 1;
    uint64_t coarse_niter = 10, pq_niter = 25, max_ppc = 256;
    int by_residual = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0, takes = 1;
        if (strcmp(a, "--fvecs") == 0)
            fvecs = v;
        else if (strcmp(a, "--out") == 0)
            out = v;
        else if (strcmp(a, "--metric") == 0)
            metric_s = v;
        else if (strcmp(a, "--nlist") == 0)
            r = parse_u64(a, v, 1, 1u << 24, &nlist);
        else if (strcmp(a, "--pq-m") == 0)
            r = parse_u64(a, v, 1, 1u << 16, &pq_m);
        else if (strcmp(a, "--pq-nbits") == 0)
            r = parse_u64(a, v, 1, 16, &nbits);
        else if (strcmp(a, "--seed") == 0)
            r = parse_u64(a, v, 0, UINT64_MAX, &seed);
        else if (strcmp(a, "--threads") == 0)
            r = parse_u64(a, v, 1, 256, &threads);
        else if (strcmp(a, "--coarse-niter") == 0)
            r = parse_u64(a, v, 0, 1000, &coarse_niter);
        else if (strcmp(a, "--pq-niter") == 0)
            r = parse_u64(a, v, 0, 1000, &pq_niter);
        else if (strcmp(a, "--max-points-per-centroid") == 0)
            r = parse_u64(a, v, 1, 1u << 20, &max_ppc);
        else if (strcmp(a, "--no-residual") == 0) {
            by_residual = 0;
            takes = 0;
        } else {
            fprintf(stderr, "tessera: index build: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (r != 0)
            return 2;
        if (takes && v == NULL) {
            fprintf(stderr, "tessera: index build: %s expects a value (see --help)\n", a);
            return 2;
        }
        i += takes;
    }
    enum tsr_metric metric;
    if (metric_s != NULL && strcmp(metric_s, "l2") == 0) {
        metric = TSR_METRIC_L2;
    } else if (metric_s != NULL && strcmp(metric_s, "ip") == 0) {
        metric = TSR_METRIC_IP;
    } else {
        fprintf(stderr, "tessera: index build: --metric '%s': expected l2 or ip\n", metric_s);
        return 2;
    }
    if (fvecs == NULL || out == NULL || nlist == 0 || pq_m == 0) {
        fprintf(stderr, "tessera: index build: --fvecs, --nlist, --pq-m and --out are "
                        "required (see --help)\n");
        return 2;
    }

    int rc = 1;
    tsr_error err = TSR_ERROR_INIT;
    float *x = NULL;
    size_t n = 0, d = 0;
    tsr_ivfpq *ix = NULL;
    double t_start = now_s();
    if (tsr_fvecs_read(fvecs, &x, &n, &d, &err) != 0) {
        fprintf(stderr, "tessera: index build: %s\n", err.msg);
        goto cleanup;
    }
    if (d % pq_m != 0) {
        fprintf(stderr, "tessera: index build: --pq-m %" PRIu64 " does not divide the "
                        "dimension %zu of %s\n", pq_m, d, fvecs);
        goto cleanup;
    }
    ix = tsr_ivfpq_create((int)d, (size_t)nlist, (size_t)pq_m, (size_t)nbits, metric,
                          by_residual, &err);
    if (ix == NULL) {
        fprintf(stderr, "tessera: index build: %s\n", err.msg);
        goto cleanup;
    }
    tsr_blas_set_threads((int)threads); /* BLAS fans out only when we do not */
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.seed = seed;
    bp.threads = (int)threads;
    bp.coarse_niter = (int)coarse_niter;
    bp.pq_niter = (int)pq_niter;
    bp.max_points_per_centroid = (size_t)max_ppc;
    progress_state ps = {now_s(), isatty(STDERR_FILENO), NULL};
    bp.progress = progress;
    bp.progress_ctx = &ps;
    double t0 = now_s();
    if (tsr_ivfpq_train(ix, x, n, &bp, &err) != 0) {
        progress_end(&ps);
        fprintf(stderr, "tessera: index build: %s: %s\n", fvecs, err.msg);
        goto cleanup;
    }
    double t1 = now_s();
    if (tsr_ivfpq_add(ix, x, n, NULL, &bp, &err) != 0) {
        progress_end(&ps);
        fprintf(stderr, "tessera: index build: %s\n", err.msg);
        goto cleanup;
    }
    progress_end(&ps);
    double t2 = now_s();
    if (tsr_faiss_write_file(ix, out, &err) != 0) {
        fprintf(stderr, "tessera: index build: %s\n", err.msg);
        goto cleanup;
    }
    double t3 = now_s();
    fprintf(stderr,
            "tessera: index build: %zu x %zu, nlist %" PRIu64 ", PQ %" PRIu64 "x%" PRIu64
            ", %s%s, %" PRIu64 " thread%s: read %.2f s, train %.2f s, add %.2f s, write %.2f s,"
            " total %.2f s -> %s\n",
            n, d, nlist, pq_m, nbits, metric == TSR_METRIC_L2 ? "l2" : "ip",
            by_residual ? "" : ", no residual", threads, threads == 1 ? "" : "s", t0 - t_start,
            t1 - t0, t2 - t1, t3 - t2, t3 - t_start, out);
    rc = 0;
cleanup:
    tsr_ivfpq_destroy(ix);
    free(x);
    return rc;
}
