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

#include "batch/batch.h"
#include "cli.h"
#include "core/cmdline.h"
#include "index/faiss_io.h"
#include "index/idmap.h"
#include "index/ivfpq.h"
#include "index/ivfpq_build.h"
#include "index/knn.h"
#include "index/vecs_io.h"

#define PROG "tessera index build"

static const char *usage_text =
    "usage: tessera index build (--fvecs X.fvecs | --batch-root DIR --dimensions D)\n"
    "                           --nlist N --pq-m M [--pq-nbits 8] [--metric l2|ip]\n"
    "                           [--no-residual] [--seed S] [--threads T] --out F.faiss\n\n"
    "Trains an IVFPQ index on the input vectors exactly as Faiss's IndexIVFPQ::train does\n"
    "(coarse k-means: 10 rounds; PQ: k-means per sub-space, 25 rounds; at most 256\n"
    "training points per centroid, seeded sampling), adds every vector and writes a Faiss\n"
    "IwPQ file (loads in stock Faiss with faiss.read_index).\n\n"
    "  --fvecs X          input vectors (TEXMEX fvecs); labels are row numbers\n"
    "  --batch-root DIR   a Vertex AI batch (SPEC 2) of dimension D: the records with a\n"
    "                     dense embedding, in id order, get labels 0..n-1; their ids are\n"
    "                     written to F.faiss.ids, one per line in label order (docs/training.md)\n"
    "  --max-invalid-records N   with --batch-root: skip up to N invalid records (default 0)\n"
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

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
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
    fprintf(stderr, "\r\033[K" PROG ": %s %zu/%zu (%.1f s)", what, done, total,
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

/* Loads a batch and gathers its dense records (id order) into *x (new, n*dims floats)
 * and *ids (new array of borrowed pointers into the batch). Prints what went wrong. */
static int load_batch(const char *root, size_t dims, uint64_t max_invalid, int threads,
                      tsr_batch **batch, float **x, size_t *n, char ***ids)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_batch_options o = {dims, max_invalid, (unsigned)threads, NULL};
    int rc = tsr_batch_load(root, &o, batch, &err);
    if (*batch == NULL) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return -1;
    }
    if (rc != 0) {
        tsr_batch_report_text(&(*batch)->report, stderr);
        fprintf(stderr, PROG ": %s: batch rejected\n", root);
        return -1;
    }
    tsr_batch *b = *batch;
    if (b->report.warnings_total > 0) /* e.g. duplicate ids: say which copy was kept */
        tsr_batch_report_text(&b->report, stderr);
    size_t nd = 0;
    for (size_t i = 0; i < b->nrecords; i++)
        nd += b->records[i].dense != NULL;
    if (b->nrecords > nd)
        fprintf(stderr, PROG ": %zu sparse-only records are not in the IVF "
                        "index (it holds dense embeddings only)\n", b->nrecords - nd);
    if (b->ndeletes > 0)
        fprintf(stderr, PROG ": %zu deleted ids ignored: a new index has nothing "
                        "to delete\n", b->ndeletes);
    if (nd == 0) {
        fprintf(stderr, PROG ": %s: no record with a dense embedding\n", root);
        return -1;
    }
    *x = malloc(nd * dims * sizeof(float));
    *ids = malloc(nd * sizeof(char *));
    if (*x == NULL || *ids == NULL) {
        fprintf(stderr, PROG ": out of memory for %zu vectors\n", nd);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *r = &b->records[i];
        if (r->dense == NULL)
            continue;
        memcpy(*x + k * dims, r->dense, dims * sizeof(float));
        (*ids)[k++] = r->id;
    }
    *n = nd;
    return 0;
}

static void usage(FILE *f)
{
    fputs(usage_text, f);
}

int tsr_cmd_index_build(int argc, char **argv)
{
    const char *fvecs = NULL, *out = NULL, *metric_s = "l2", *root = NULL;
    uint64_t dims = 0, max_invalid = 0;
    uint64_t nlist = 0, pq_m = 0, nbits = 8, seed = 1234;
    uint64_t coarse_niter = 10, pq_niter = 25, max_ppc = 256;
    int threads = 1, no_residual = 0;
    const tsr_cmdline_opt opts[] = {
        {"--fvecs", TSR_CMDLINE_STR, &fvecs, 0, 0, 0},
        {"--batch-root", TSR_CMDLINE_STR, &root, 0, 0, 0},
        {"--dimensions", TSR_CMDLINE_UINT64, &dims, 1, 1 << 20, 0},
        {"--max-invalid-records", TSR_CMDLINE_UINT64, &max_invalid, 0, -1, 0},
        {"--nlist", TSR_CMDLINE_UINT64, &nlist, 1, 1 << 24, 1},
        {"--pq-m", TSR_CMDLINE_UINT64, &pq_m, 1, 1 << 16, 1},
        {"--pq-nbits", TSR_CMDLINE_UINT64, &nbits, 1, 16, 0},
        {"--metric", TSR_CMDLINE_STR, &metric_s, 0, 0, 0},
        {"--no-residual", TSR_CMDLINE_FLAG, &no_residual, 0, 0, 0},
        {"--seed", TSR_CMDLINE_UINT64, &seed, 0, -1, 0},
        {"--threads", TSR_CMDLINE_INT, &threads, 1, 256, 0},
        {"--out", TSR_CMDLINE_STR, &out, 0, 0, 1},
        {"--coarse-niter", TSR_CMDLINE_UINT64, &coarse_niter, 0, 1000, 0},
        {"--pq-niter", TSR_CMDLINE_UINT64, &pq_niter, 0, 1000, 0},
        {"--max-points-per-centroid", TSR_CMDLINE_UINT64, &max_ppc, 1, 1 << 20, 0},
    };
    const tsr_cmdline_spec spec = {PROG, opts, sizeof opts / sizeof opts[0], usage, 0, 1};
    int code;
    if (tsr_cmdline_parse_spec(&spec, argc, argv, NULL, &code))
        return code;
    int by_residual = !no_residual;
    enum tsr_metric metric;
    if (strcmp(metric_s, "l2") == 0) {
        metric = TSR_METRIC_L2;
    } else if (strcmp(metric_s, "ip") == 0) {
        metric = TSR_METRIC_IP;
    } else {
        fprintf(stderr, PROG ": --metric: expected l2 or ip, got '%s'\n", metric_s);
        return 2;
    }
    if ((fvecs == NULL) == (root == NULL)) {
        fprintf(stderr, PROG ": give one of --fvecs or --batch-root (see '" PROG " --help')\n");
        return 2;
    }
    if ((root != NULL) != (dims != 0)) {
        fprintf(stderr, PROG ": --batch-root and --dimensions go together (see '" PROG
                        " --help')\n");
        return 2;
    }

    int rc = 1;
    tsr_error err = TSR_ERROR_INIT;
    float *x = NULL;
    size_t n = 0, d = 0;
    tsr_ivfpq *ix = NULL;
    tsr_batch *batch = NULL;
    char **ids = NULL;
    char *ids_path = NULL;
    const char *input = fvecs != NULL ? fvecs : root;
    double t_start = now_s(), c_start = cpu_s();
    if (fvecs != NULL) {
        if (tsr_fvecs_read(fvecs, &x, &n, &d, &err) != 0) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            goto cleanup;
        }
    } else if (load_batch(root, (size_t)dims, max_invalid, threads, &batch, &x, &n, &ids) != 0) {
        goto cleanup;
    } else {
        d = (size_t)dims;
        size_t pl = strlen(out);
        ids_path = malloc(pl + 5);
        if (ids_path == NULL)
            goto cleanup;
        memcpy(ids_path, out, pl);
        memcpy(ids_path + pl, ".ids", 5);
    }
    if (d % pq_m != 0) {
        fprintf(stderr, PROG ": --pq-m %" PRIu64 " does not divide the "
                        "dimension %zu of %s\n", pq_m, d, input);
        goto cleanup;
    }
    ix = tsr_ivfpq_create((int)d, (size_t)nlist, (size_t)pq_m, (size_t)nbits, metric,
                          by_residual, &err);
    if (ix == NULL) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        goto cleanup;
    }
    tsr_blas_set_threads(threads); /* BLAS fans out only when we do not */
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.seed = seed;
    bp.threads = threads;
    bp.coarse_niter = (int)coarse_niter;
    bp.pq_niter = (int)pq_niter;
    bp.max_points_per_centroid = (size_t)max_ppc;
    progress_state ps = {now_s(), isatty(STDERR_FILENO), NULL};
    bp.progress = progress;
    bp.progress_ctx = &ps;
    double t0 = now_s(), c0 = cpu_s();
    if (tsr_ivfpq_train(ix, x, n, &bp, &err) != 0) {
        progress_end(&ps);
        fprintf(stderr, PROG ": %s: %s\n", input, err.msg);
        goto cleanup;
    }
    double t1 = now_s(), c1 = cpu_s();
    if (tsr_ivfpq_add(ix, x, n, NULL, &bp, &err) != 0) {
        progress_end(&ps);
        fprintf(stderr, PROG ": %s\n", err.msg);
        goto cleanup;
    }
    progress_end(&ps);
    double t2 = now_s(), c2 = cpu_s();
    if (tsr_faiss_write_file(ix, out, &err) != 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        goto cleanup;
    }
    if (ids_path != NULL && tsr_idmap_write(ids_path, ids, n, &err) != 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        goto cleanup;
    }
    double t3 = now_s(), c3 = cpu_s();
    fprintf(stderr,
            PROG ": %zu x %zu, nlist %" PRIu64 ", PQ %" PRIu64 "x%" PRIu64
            ", %s%s, %d thread%s: read %.2f s, train %.2f s, add %.2f s, write %.2f s,"
            " total %.2f s (CPU: train %.2f s, add %.2f s, total %.2f s) -> %s\n",
            n, d, nlist, pq_m, nbits, metric == TSR_METRIC_L2 ? "l2" : "ip",
            by_residual ? "" : ", no residual", threads, threads == 1 ? "" : "s", t0 - t_start,
            t1 - t0, t2 - t1, t3 - t2, t3 - t_start, c1 - c0, c2 - c1, c3 - c_start, out);
    rc = 0;
cleanup:
    tsr_ivfpq_destroy(ix);
    free(x);
    free(ids); /* the strings belong to the batch */
    free(ids_path);
    tsr_batch_destroy(batch);
    return rc;
}
