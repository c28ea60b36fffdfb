/*
 * bench_cluster — the C client of `make bench-cluster` (driver: bench/bench_cluster.py).
 *
 * Throughput under concurrency: --inflight client threads, each with one call in flight,
 * take the next --batch queries of the query set (an atomic cursor) until every query is
 * answered; the latency of each call and the wall time give p50 / p99 per call and QPS in
 * queries per second. Two modes, the same loop:
 *   coord   FindNeighbors to the coordinator (--target), --batch queries per call; ids are
 *           "v%06d" (= the row in the file), turned back into labels for the recall;
 *   inproc  tsr_ivfpq_search on the index file in this process, --batch queries per call,
 *           one thread per call (--inflight threads in all): what the same cores give with
 *           no distribution.
 *   ping    grpc.health.v1.Health/Check to --target, one empty call per "query": the rate
 *           at which these cores carry bare calls into the coordinator, the floor under
 *           any request (the driver's bound column).
 *   split   the cluster's division of work without its processes and calls: the coarse
 *           step once per call (tsr_knn), then the probed lists split into --split groups
 *           (list % S, like a plan that ignores geometry), each group searched on its own
 *           (tsr_ivfpq_search_preassigned with the other groups' probes as -1: its own
 *           per-query table, quantization and top-k, as a shard has) and the S top-k
 *           merged: what S partitions cost the engine before any RPC. With
 *           --split-bound first|oracle each query's groups start from a bound on its k-th
 *           distance (tsr_ivfpq_search_opts.bounds), computed before the timed passes and
 *           not counted: "first" the k-th of its nearest list alone (what a first round
 *           to one shard would learn), "oracle" the k-th of the whole search (the most a
 *           bound can give). The labels do not change.
 * A warm-up pass (--warmup queries, same loop) comes first; the timed pass runs the query
 * set --repeat times (for a profile or a steadier figure: the labels are the last round's).
 * The labels (nq * k int64, -1 padded) go to --out for the driver's recall. Prints one
 * JSON object.
 *
 * usage: bench_cluster --mode coord|inproc|ping|split --index F.faiss --queries Q.fvecs
 *                      [--target ADDR] [--nprobe P] [--k K] [--inflight T] [--batch B]
 *                      [--candidates C (-1 = the coordinator's default)] [--nq N]
 *                      [--repeat R (1..1000)] [--warmup W] [--out LABELS]
 *                      [--split S (split mode, 1..16)]
 *                      [--split-bound none|first|oracle (split mode)]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "index/faiss_io.h"
#include "index/ivfpq_search.h"
#include "index/knn.h"
#include "index/vecs_io.h"
#include "net/rpc.h"
#include "query/topk.h"
#include "tessera/v1/tessera.pb-c.h"

#define MAX_THREADS 64
#define MAX_BATCH 256

typedef struct bench {
    int coord;                 /* mode: 1 coord, 2 ping, 0 inproc, 3 split */
    tsr_ivfpq *ix;             /* inproc: the index; coord: only d and nlist are used */
    size_t split;              /* split: the groups */
    float *cnorms;             /* split: the centroids' squared norms (tsr_knn) */
    float *bounds;             /* split: NULL, or nq bounds (--split-bound) */
    tsr_rpc_channel *ch;
    const float *xq;
    size_t d, k, nprobe, batch, nq;
    int candidates;            /* -1 = unset */
    int64_t *labels;           /* nq * k */
    atomic_size_t cursor;
    size_t limit;              /* queries of this pass */
} bench;

typedef struct worker {
    bench *b;
    double *lat;               /* per call, µs */
    size_t nlat, cap, fails;
} worker;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_cluster: %s: %s\n", what, msg);
    exit(1);
}

/* One FindNeighbors of queries [i0, i0+n); labels of the answers into b->labels. */
static int call_coord(bench *b, size_t i0, size_t n, tsr_rpc_result *res)
{
    Tessera__V1__IndexDatapoint dp[MAX_BATCH];
    Tessera__V1__FindNeighborsRequest__Query q[MAX_BATCH], *qs[MAX_BATCH];
    for (size_t j = 0; j < n; j++) {
        tessera__v1__index_datapoint__init(&dp[j]);
        dp[j].feature_vector = (float *)(b->xq + (i0 + j) * b->d);
        dp[j].n_feature_vector = b->d;
        tessera__v1__find_neighbors_request__query__init(&q[j]);
        q[j].datapoint = &dp[j];
        q[j].neighbor_count = (int32_t)b->k;
        q[j].fraction_leaf_nodes_to_search_override = (double)b->nprobe / (double)b->ix->nlist;
        if (b->candidates >= 0) {
            q[j].approximate_case =
                TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__APPROXIMATE_APPROXIMATE_NEIGHBOR_COUNT;
            q[j].approximate_neighbor_count = b->candidates;
        }
        qs[j] = &q[j];
    }
    Tessera__V1__FindNeighborsRequest rq = TESSERA__V1__FIND_NEIGHBORS_REQUEST__INIT;
    rq.queries = qs;
    rq.n_queries = n;
    size_t len;
    uint8_t *buf = tsr_rpc_pack(&rq.base, &len);
    int rc = tsr_rpc_call(b->ch, "/tessera.v1.VectorSearch/FindNeighbors", buf, len, 30000, res);
    free(buf);
    if (rc != TSR_RPC_OK) {
        fprintf(stderr, "bench_cluster: FindNeighbors: %s: %s\n", tsr_rpc_code_name(rc),
                res->message);
        return -1;
    }
    Tessera__V1__FindNeighborsResponse *r =
        tessera__v1__find_neighbors_response__unpack(NULL, res->len, res->data);
    if (!r || r->n_nearest_neighbors != n) {
        if (r)
            tessera__v1__find_neighbors_response__free_unpacked(r, NULL);
        return -1;
    }
    for (size_t j = 0; j < n; j++) {
        int64_t *lab = b->labels + (i0 + j) * b->k;
        const Tessera__V1__FindNeighborsResponse__NearestNeighbors *nn = r->nearest_neighbors[j];
        for (size_t t = 0; t < b->k; t++) {
            const char *id = t < nn->n_neighbors && nn->neighbors[t]->datapoint
                                 ? nn->neighbors[t]->datapoint->datapoint_id : NULL;
            lab[t] = !id ? -1 : id[0] == 'v' ? strtoll(id + 1, NULL, 10) : -2;
        }
    }
    tessera__v1__find_neighbors_response__free_unpacked(r, NULL);
    return 0;
}

/* One Health/Check (ping mode); no labels. */
static int call_ping(bench *b, tsr_rpc_result *res)
{
    static const uint8_t none[1];
    int rc = tsr_rpc_call(b->ch, "/grpc.health.v1.Health/Check", none, 0, 30000, res);
    if (rc != TSR_RPC_OK)
        fprintf(stderr, "bench_cluster: Health/Check: %s: %s\n", tsr_rpc_code_name(rc),
                res->message);
    return rc == TSR_RPC_OK ? 0 : -1;
}

static int call_inproc(bench *b, size_t i0, size_t n)
{
    float D[MAX_BATCH * 100];
    tsr_ivfpq_search_opts so;
    tsr_ivfpq_search_opts_init(&so);
    so.nprobe = b->nprobe;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_ivfpq_search(b->ix, n, b->xq + i0 * b->d, b->k, &so, D, b->labels + i0 * b->k,
                         &err)) {
        fprintf(stderr, "bench_cluster: search: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Split mode: see the file comment. L2 only (checked in main): smaller is better. */
#define MAX_SPLIT 16
static int call_split(bench *b, size_t i0, size_t n)
{
    const tsr_ivfpq *ix = b->ix;
    size_t np = b->nprobe, k = b->k, S = b->split;
    float *cd = tsr_xmalloc(n * np * sizeof *cd), *D = tsr_xmalloc(S * n * k * sizeof *D);
    int64_t *cl = tsr_xmalloc(n * np * sizeof *cl), *gl = tsr_xmalloc(n * np * sizeof *gl);
    int64_t *I = tsr_xmalloc(S * n * k * sizeof *I);
    const float *x = b->xq + i0 * b->d;
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq_search_opts so;
    tsr_ivfpq_search_opts_init(&so);
    so.bounds = b->bounds ? b->bounds + i0 : NULL;
    int rc = tsr_knn(x, n, ix->centroids, ix->nlist, b->d, ix->metric, np, b->cnorms, cd, cl,
                     &err);
    for (size_t g = 0; g < S && rc == 0; g++) {
        for (size_t j = 0; j < n * np; j++)
            gl[j] = cl[j] >= 0 && (size_t)cl[j] % S == g ? cl[j] : -1;
        rc = tsr_ivfpq_search_preassigned(ix, n, x, k, np, gl, cd, &so, D + g * n * k,
                                          I + g * n * k, &err);
    }
    /* the groups' answers merged as the coordinator merges the shards' (query/topk) */
    tsr_hit *h = tsr_xmalloc(S * k * sizeof *h), out[100];
    const tsr_hit *lists[MAX_SPLIT];
    size_t lens[MAX_SPLIT];
    for (size_t q = 0; q < n && rc == 0; q++) {
        for (size_t g = 0; g < S; g++) {
            lists[g] = h + g * k;
            lens[g] = 0;
            for (size_t r = 0; r < k && I[(g * n + q) * k + r] >= 0; r++, lens[g]++)
                h[g * k + r] = (tsr_hit){D[(g * n + q) * k + r], 0, I[(g * n + q) * k + r]};
        }
        size_t nout = 0;
        if ((rc = tsr_topk_merge(lists, lens, S, 0, k, 0, out, &nout)) != 0)
            tsr_err(&err, rc, "merge: out of memory");
        for (size_t r = 0; r < k; r++)
            b->labels[(i0 + q) * k + r] = r < nout ? out[r].label : -1;
    }
    free(h);
    if (rc != 0)
        fprintf(stderr, "bench_cluster: split search: %s\n", err.msg);
    free(cd);
    free(D);
    free(cl);
    free(gl);
    free(I);
    return rc ? -1 : 0;
}

static void *work(void *arg)
{
    worker *w = arg;
    bench *b = w->b;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (;;) {
        size_t i0 = atomic_fetch_add(&b->cursor, b->batch);
        if (i0 >= b->limit)
            break;
        size_t n = b->limit - i0 < b->batch ? b->limit - i0 : b->batch;
        size_t at = i0 % b->nq;          /* the warm-up pass wraps around the query set */
        if (at + n > b->nq)
            n = b->nq - at;
        double t0 = now_us();
        int rc = b->coord == 2   ? call_ping(b, &res)
                 : b->coord == 3 ? call_split(b, at, n)
                 : b->coord      ? call_coord(b, at, n, &res)
                                 : call_inproc(b, at, n);
        double dt = now_us() - t0;
        tsr_rpc_result_close(&res);
        w->fails += rc != 0;
        if (w->nlat == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 1024;
            w->lat = tsr_xrealloc(w->lat, w->cap * sizeof *w->lat);
        }
        w->lat[w->nlat++] = dt;
    }
    return NULL;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs one pass of `limit` queries on `threads` threads; fills lat (sorted, owned). */
static double pass(bench *b, size_t limit, size_t threads, double **lat, size_t *nlat,
                   size_t *fails)
{
    pthread_t th[MAX_THREADS];
    worker w[MAX_THREADS];
    atomic_store(&b->cursor, 0);
    b->limit = limit;
    double t0 = now_us();
    for (size_t t = 0; t < threads; t++) {
        w[t] = (worker){b, NULL, 0, 0, 0};
        if (pthread_create(&th[t], NULL, work, &w[t]))
            die("pthread_create", "failed");
    }
    size_t n = 0;
    for (size_t t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        n += w[t].nlat;
    }
    double wall = now_us() - t0;
    double *all = tsr_xmalloc((n ? n : 1) * sizeof *all);
    *nlat = 0;
    *fails = 0;
    for (size_t t = 0; t < threads; t++) {
        memcpy(all + *nlat, w[t].lat, w[t].nlat * sizeof *all);
        *nlat += w[t].nlat;
        *fails += w[t].fails;
        free(w[t].lat);
    }
    qsort(all, *nlat, sizeof *all, dcmp);
    *lat = all;
    return wall;
}

int main(int argc, char **argv)
{
    const char *mode = NULL, *target = NULL, *index = NULL, *queries = NULL, *out = NULL;
    size_t nprobe = 16, k = 10, threads = 1, batch = 1, nq = 0, warmup = 200, repeat = 1;
    size_t split = 4;
    const char *split_bound = "none";
    int candidates = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: bench_cluster --mode coord|inproc|ping|split --index F --queries Q "
                   "[--target A] [--nprobe P] [--k K<=100] [--inflight T<=64] "
                   "[--batch B<=256] [--candidates C] [--nq N] [--repeat R<=1000] [--warmup W] "
                   "[--out F] "
                   "[--split S<=16] [--split-bound none|first|oracle]\n");
            return 0;
        }
        if (i + 1 >= argc)
            die(a, "needs a value");
        const char *v = argv[++i];
        if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--target")) target = v;
        else if (!strcmp(a, "--index")) index = v;
        else if (!strcmp(a, "--queries")) queries = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--nprobe")) nprobe = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--k")) k = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--inflight")) threads = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--batch")) batch = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--candidates")) candidates = atoi(v);
        else if (!strcmp(a, "--nq")) nq = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--repeat")) repeat = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--warmup")) warmup = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--split")) split = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--split-bound")) split_bound = v;
        else die(a, "unknown option (see --help)");
    }
    int local = mode && (!strcmp(mode, "inproc") || !strcmp(mode, "split"));
    if (!mode || (!local && strcmp(mode, "coord") && strcmp(mode, "ping")) || !index ||
        !queries || (!local && !target) || k < 1 || k > 100 || threads < 1 ||
        threads > MAX_THREADS || repeat < 1 || repeat > 1000 || batch < 1 || batch > MAX_BATCH ||
        nprobe < 1 || split < 1 || split > MAX_SPLIT ||
        (strcmp(split_bound, "none") && strcmp(split_bound, "first") &&
         strcmp(split_bound, "oracle")))
        die("usage", "see --help");
    tsr_blas_set_threads(1);
    tsr_error err = TSR_ERROR_INIT;
    bench b = {0};
    b.coord = !strcmp(mode, "coord")   ? 1
              : !strcmp(mode, "ping")  ? 2
              : !strcmp(mode, "split") ? 3
                                       : 0;
    /* coord and ping read only d and nlist: the search tables are the local modes' */
    if (tsr_faiss_read_file(index, &b.ix, &err) ||
        (local && tsr_ivfpq_search_prepare(b.ix, &err)))
        die(index, err.msg);
    b.split = split;
    if (b.coord == 3) {
        if (b.ix->metric != TSR_METRIC_L2)
            die(index, "split mode merges L2 distances only");
        b.cnorms = tsr_xmalloc(b.ix->nlist * sizeof *b.cnorms);
        tsr_knn_norms(b.ix->centroids, b.ix->nlist, (size_t)b.ix->d, b.cnorms);
    }
    float *xq = NULL;
    size_t nqf = 0, qd = 0;
    if (tsr_fvecs_read(queries, &xq, &nqf, &qd, &err))
        die(queries, err.msg);
    if (qd != (size_t)b.ix->d)
        die(queries, "dimension differs from the index");
    b.xq = xq;
    b.d = qd;
    b.k = k;
    b.nprobe = nprobe < b.ix->nlist ? nprobe : b.ix->nlist;
    b.batch = batch;
    b.candidates = candidates;
    b.nq = nq && nq < nqf ? nq : nqf;
    b.labels = tsr_xmalloc(b.nq * k * sizeof *b.labels);
    if (!local && !(b.ch = tsr_rpc_channel_create(target, NULL, &err)))
        die(target, err.msg);

    if (b.coord == 3 && strcmp(split_bound, "none")) {
        tsr_ivfpq_search_opts so;
        tsr_ivfpq_search_opts_init(&so);
        so.nprobe = !strcmp(split_bound, "first") ? 1 : b.nprobe;
        float *D = tsr_xmalloc(b.nq * k * sizeof *D);
        int64_t *I = tsr_xmalloc(b.nq * k * sizeof *I);
        if (tsr_ivfpq_search(b.ix, b.nq, b.xq, k, &so, D, I, &err))
            die(index, err.msg);
        b.bounds = tsr_xmalloc(b.nq * sizeof *b.bounds);
        for (size_t q = 0; q < b.nq; q++) /* an empty slot's distance is +inf: no bound */
            b.bounds[q] = D[q * k + k - 1];
        free(D);
        free(I);
    }
    double *lat;
    size_t nlat, fails, wfails;
    if (warmup) {
        pass(&b, warmup, threads, &lat, &nlat, &wfails);
        free(lat);
    }
    double wall = pass(&b, b.nq * repeat, threads, &lat, &nlat, &fails);
    if (out && b.coord != 2) { /* ping: no labels */
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(b.labels, sizeof *b.labels, b.nq * k, f) != b.nq * k || fclose(f))
            die(out, "cannot write");
    }
    printf("{\"mode\": \"%s\", \"split_bound\": \"%s\", \"inflight\": %zu, "
           "\"batch\": %zu, \"nprobe\": %zu, "
           "\"candidates\": %d, \"queries\": %zu, \"calls\": %zu, \"fails\": %zu, "
           "\"qps\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f}\n",
           mode, b.coord == 3 ? split_bound : "none", threads, batch, b.nprobe, candidates,
           b.nq * repeat, nlat, fails,
           b.nq * repeat / (wall / 1e6), nlat ? lat[nlat / 2] : 0.0,
           nlat ? lat[(size_t)(0.99 * (double)(nlat - 1))] : 0.0);
    free(lat);
    free(b.labels);
    free(b.cnorms);
    free(b.bounds);
    free(xq);
    if (b.ch)
        tsr_rpc_channel_destroy(b.ch);
    tsr_ivfpq_destroy(b.ix);
    return fails ? 1 : 0;
}
