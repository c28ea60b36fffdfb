/*
 * bench_e2e — the C client of `make bench-e2e` (driver: bench/bench_e2e.py).
 *
 * For the same queries, at the same nprobe, one query at a time, it times three paths and
 * interleaves them query by query (so machine noise hits all three alike):
 *   inproc   tsr_ivfpq_search on the whole index file in this process (one thread);
 *   direct   what the coordinator does, but done here: the coarse step (tsr_knn on the
 *            template's centroids), the probed lists grouped by shard through the
 *            coordinator's plan file, one Shard.Search per touched shard in parallel
 *            (tsr_rpc_fanout), unpack and tsr_topk_merge — "the sum of the parts";
 *   coord    one FindNeighbors call to the coordinator (tsr_rpc_call), unpacked;
 *   hop      one grpc.health.v1.Health/Check to the coordinator (an inline handler: the
 *            bare cost of one more loopback RPC, no work).
 * coord − direct is what the coordinator process adds (one more loopback hop, the
 * server's own fan-out of the shard calls, the request/response protobufs, its planning and
 * merge).
 * Then a throughput run: --threads client threads sending FindNeighbors back to back.
 * It checks that the three paths return the same top-k ids (labels = ids "v%06d").
 * Prints one JSON object on stdout.
 *
 * usage: bench_e2e --coord ADDR --shards A,B,C,D --index F.faiss --plan PLANFILE
 *                  --queries Q.fvecs --nprobe P [--k K] [--version V] [--nq N]
 *                  [--warmup W] [--threads T]
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "index/faiss_io.h"
#include "index/ivfpq_search.h"
#include "index/knn.h"
#include "core/mem.h"
#include "net/rpc.h"
#include "tessera/v1/shard.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"
#include "query/topk.h"
#include "index/vecs_io.h"

#define MAXS 64

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, size_t n, double p)
{
    size_t i = (size_t)(p * (double)n);
    return sorted[i >= n ? n - 1 : i];
}

/* {"p50":..,"p99":..,"mean":..,"qps":..} of n latencies (µs); sorts a copy */
static void emit(const char *name, const double *lat, size_t n, double wall_us, int comma)
{
    double *s = tsr_xmalloc(n * sizeof *s), sum = 0;
    memcpy(s, lat, n * sizeof *s);
    qsort(s, n, sizeof *s, dcmp);
    for (size_t i = 0; i < n; i++)
        sum += s[i];
    printf("\"%s\": {\"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
           "\"qps\": %.1f}%s\n", name, pct(s, n, 0.5), pct(s, n, 0.9), pct(s, n, 0.99), sum / n,
           n / (wall_us / 1e6), comma ? "," : "");
    free(s);
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_e2e: %s: %s\n", what, msg);
    exit(1);
}

typedef struct ctx {
    tsr_ivfpq *ix;
    float *cnorm;
    int32_t *plan;
    size_t nshards, d, k, nprobe;
    int64_t version;
    tsr_rpc_channel *coord, *sh[MAXS];
    float *xq;
} ctx;

/* FindNeighbors request of query i (one query), packed. */
static uint8_t *pack_fn(const ctx *c, size_t i, size_t *len)
{
    Tessera__V1__IndexDatapoint dp = TESSERA__V1__INDEX_DATAPOINT__INIT;
    dp.feature_vector = c->xq + i * c->d;
    dp.n_feature_vector = c->d;
    Tessera__V1__FindNeighborsRequest__Query q = TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__INIT;
    q.datapoint = &dp;
    q.neighbor_count = (int32_t)c->k;
    q.fraction_leaf_nodes_to_search_override = (double)c->nprobe / (double)c->ix->nlist;
    Tessera__V1__FindNeighborsRequest__Query *qs[1] = {&q};
    Tessera__V1__FindNeighborsRequest rq = TESSERA__V1__FIND_NEIGHBORS_REQUEST__INIT;
    rq.queries = qs;
    rq.n_queries = 1;
    return tsr_rpc_pack(&rq.base, len);
}

/* coord path; labels out (k, -1 padded). Returns 0 or -1. */
static int run_coord(const ctx *c, size_t i, int64_t *labels, tsr_rpc_result *res)
{
    size_t len;
    uint8_t *buf = pack_fn(c, i, &len);
    int rc = tsr_rpc_call(c->coord, "/tessera.v1.VectorSearch/FindNeighbors", buf, len, 10000,
                          res);
    free(buf);
    if (rc != TSR_RPC_OK) {
        fprintf(stderr, "bench_e2e: FindNeighbors: %s: %s\n", tsr_rpc_code_name(rc),
                res->message);
        return -1;
    }
    Tessera__V1__FindNeighborsResponse *r =
        tessera__v1__find_neighbors_response__unpack(NULL, res->len, res->data);
    if (!r || r->n_nearest_neighbors != 1) {
        if (r)
            tessera__v1__find_neighbors_response__free_unpacked(r, NULL);
        return -1;
    }
    for (size_t t = 0; t < c->k; t++)
        labels[t] = -1;
    Tessera__V1__FindNeighborsResponse__NearestNeighbors *nn = r->nearest_neighbors[0];
    for (size_t t = 0; t < nn->n_neighbors && t < c->k; t++) {
        const char *id = nn->neighbors[t]->datapoint ? nn->neighbors[t]->datapoint->datapoint_id
                                                     : NULL;
        labels[t] = id && id[0] == 'v' ? strtoll(id + 1, NULL, 10) : -2;
    }
    tessera__v1__find_neighbors_response__free_unpacked(r, NULL);
    return 0;
}

/* direct path: coarse + fan-out to the shards + merge. */
static int run_direct(const ctx *c, size_t i, int64_t *labels, size_t *touched)
{
    size_t S = c->nshards, P = c->nprobe, d = c->d;
    const float *x = c->xq + i * d;
    float cd[1024];
    int64_t ci[1024];
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_knn(x, 1, c->ix->centroids, c->ix->nlist, d, c->ix->metric, P,
                c->ix->metric == TSR_METRIC_L2 ? c->cnorm : NULL, cd, ci, &err))
        die("coarse step", err.msg);
    int32_t lists[MAXS][1024];
    float cds[MAXS][1024];
    size_t nl[MAXS] = {0};
    for (size_t t = 0; t < P; t++) {
        if (ci[t] < 0)
            continue;
        size_t s = (size_t)c->plan[ci[t]];
        lists[s][nl[s]] = (int32_t)ci[t];
        cds[s][nl[s]++] = cd[t];
    }
    tsr_rpc_fanout_call calls[MAXS];
    uint8_t *bufs[MAXS];
    size_t n = 0;
    for (size_t s = 0; s < S; s++) {
        if (!nl[s])
            continue;
        Tessera__V1__ShardQuery q = TESSERA__V1__SHARD_QUERY__INIT;
        q.version = c->version;
        q.vector = (float *)x;
        q.n_vector = d;
        q.lists = lists[s];
        q.n_lists = nl[s];
        q.coarse_distances = cds[s];
        q.n_coarse_distances = nl[s];
        q.k = (int32_t)c->k;
        q.return_ids = 1; /* as the coordinator asks */
        Tessera__V1__ShardQuery *qs[1] = {&q};
        Tessera__V1__ShardSearchRequest rq = TESSERA__V1__SHARD_SEARCH_REQUEST__INIT;
        rq.queries = qs;
        rq.n_queries = 1;
        size_t len;
        bufs[n] = tsr_rpc_pack(&rq.base, &len);
        calls[n] = (tsr_rpc_fanout_call){c->sh[s], "/tessera.v1.Shard/Search", bufs[n], len,
                                         10000, {0}, NULL};
        tsr_rpc_result_init(&calls[n].result);
        n++;
    }
    *touched = n;
    tsr_rpc_fanout(calls, n);
    tsr_hit hits[MAXS][1024];
    const tsr_hit *hl[MAXS];
    size_t hn[MAXS];
    int bad = 0;
    for (size_t j = 0; j < n; j++) {
        free(bufs[j]);
        tsr_rpc_result *r = &calls[j].result;
        hn[j] = 0;
        hl[j] = hits[j];
        if (r->code != TSR_RPC_OK) {
            fprintf(stderr, "bench_e2e: Search: %s: %s\n", tsr_rpc_code_name(r->code), r->message);
            bad = 1;
        } else {
            Tessera__V1__ShardSearchResponse *sr =
                tessera__v1__shard_search_response__unpack(NULL, r->len, r->data);
            if (!sr || sr->n_results != 1) {
                bad = 1;
            } else {
                Tessera__V1__ShardQueryResult *qr = sr->results[0];
                for (size_t t = 0; t < qr->n_labels && t < 1024; t++)
                    hits[j][hn[j]++] = (tsr_hit){qr->distances[t], TSR_TOPK_NOTAG, qr->labels[t]};
            }
            if (sr)
                tessera__v1__shard_search_response__free_unpacked(sr, NULL);
        }
        tsr_rpc_result_close(r);
    }
    tsr_hit out[1024];
    size_t nout = 0;
    tsr_topk_merge(hl, hn, n, c->ix->metric != TSR_METRIC_L2, c->k, 0, out, &nout);
    for (size_t t = 0; t < c->k; t++)
        labels[t] = t < nout ? out[t].label : -1;
    return bad ? -1 : 0;
}

typedef struct thr {
    const ctx *c;
    size_t from, to, fails;
} thr;

static void *coord_worker(void *arg)
{
    thr *w = arg;
    int64_t lab[1024];
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (size_t i = w->from; i < w->to; i++)
        w->fails += run_coord(w->c, i, lab, &res) != 0;
    tsr_rpc_result_close(&res);
    return NULL;
}

static int32_t *read_plan(const char *path, size_t nlist, size_t *nshards)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die(path, "cannot open");
    char kind[32];
    size_t n;
    if (fscanf(f, "tessera-plan 1 %31s %zu", kind, &n) != 2 || n != nlist)
        die(path, "bad header or nlist differs from the index");
    int32_t *p = tsr_xmalloc(n * sizeof *p);
    int mx = 0;
    for (size_t l = 0; l < n; l++) {
        if (fscanf(f, "%d", &p[l]) != 1 || p[l] < 0 || p[l] >= MAXS)
            die(path, "bad entry");
        mx = p[l] > mx ? p[l] : mx;
    }
    fclose(f);
    *nshards = (size_t)mx + 1;
    return p;
}

int main(int argc, char **argv)
{
    const char *coord = NULL, *shards = NULL, *index = NULL, *plan = NULL, *queries = NULL;
    size_t nprobe = 16, k = 10, nq = 0, warmup = 200, threads = 4;
    int64_t version = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--coord")) coord = v;
        else if (!strcmp(a, "--shards")) shards = v;
        else if (!strcmp(a, "--index")) index = v;
        else if (!strcmp(a, "--plan")) plan = v;
        else if (!strcmp(a, "--queries")) queries = v;
        else if (!strcmp(a, "--nprobe")) nprobe = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--k")) k = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--nq")) nq = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--warmup")) warmup = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--threads")) threads = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--version")) version = strtoll(v, NULL, 10);
        else {
            fprintf(stderr, "bench_e2e: unknown option %s\n", a);
            return 2;
        }
    }
    if (!coord || !shards || !index || !plan || !queries || k < 1 || k > 1000 || nprobe < 1 ||
        nprobe > 1024 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: bench_e2e --coord A --shards A,B,.. --index F --plan P "
                        "--queries Q [--nprobe P<=1024] [--k K<=1000] [--nq N] [--threads T]\n");
        return 2;
    }
    tsr_blas_set_threads(1);
    tsr_error err = TSR_ERROR_INIT;
    ctx c = {0};
    if (tsr_faiss_read_file(index, &c.ix, &err) || tsr_ivfpq_search_prepare(c.ix, &err))
        die(index, err.msg);
    c.d = (size_t)c.ix->d;
    c.k = k;
    c.nprobe = nprobe < c.ix->nlist ? nprobe : c.ix->nlist;
    c.version = version;
    c.cnorm = tsr_xmalloc(c.ix->nlist * sizeof(float));
    tsr_knn_norms(c.ix->centroids, c.ix->nlist, c.d, c.cnorm);
    size_t nplan = 0;
    c.plan = read_plan(plan, c.ix->nlist, &nplan);
    size_t qd = 0, nqf = 0;
    if (tsr_fvecs_read(queries, &c.xq, &nqf, &qd, &err))
        die(queries, err.msg);
    if (qd != c.d)
        die(queries, "dimension differs from the index");
    if (!nq || nq > nqf)
        nq = nqf;
    if (!(c.coord = tsr_rpc_channel_create(coord, NULL, &err)))
        die(coord, err.msg);
    char *sl = tsr_xstrdup(shards), *save = NULL;
    for (char *t = strtok_r(sl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (c.nshards == MAXS)
            die("--shards", "too many");
        if (!(c.sh[c.nshards++] = tsr_rpc_channel_create(t, NULL, &err)))
            die(t, err.msg);
    }
    free(sl);
    if (nplan > c.nshards)
        die("--shards", "fewer shards than the plan uses");

    float *D = tsr_xmalloc(k * sizeof *D);
    int64_t *IA = tsr_xmalloc(k * sizeof *IA), *IB = tsr_xmalloc(k * sizeof *IB),
            *IC = tsr_xmalloc(k * sizeof *IC);
    double *la = tsr_xmalloc(nq * sizeof *la), *lb = tsr_xmalloc(nq * sizeof *lb),
           *lc = tsr_xmalloc(nq * sizeof *lc), *ldiff = tsr_xmalloc(nq * sizeof *ldiff),
           *lh = tsr_xmalloc(nq * sizeof *lh);
    tsr_ivfpq_search_opts so;
    tsr_ivfpq_search_opts_init(&so);
    so.nprobe = c.nprobe;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    size_t touched = 0, tsum = 0, same_ab = 0, same_ac = 0, fails = 0;

    /* warm-up: connections, caches, page faults on every side */
    for (size_t w = 0; w < warmup; w++) {
        size_t i = w % nq, t;
        tsr_ivfpq_search(c.ix, 1, c.xq + i * c.d, k, &so, D, IA, &err);
        fails += run_direct(&c, i, IB, &t) != 0;
        fails += run_coord(&c, i, IC, &res) != 0;
    }
    double wa = 0, wb = 0, wc = 0, wh = 0;
    for (size_t i = 0; i < nq; i++) {
        /* rotate the order so that none of the paths always runs right after another */
        for (int r = 0; r < 4; r++) {
            int which = (int)((i + (size_t)r) % 4);
            double t0 = now_us();
            if (which == 0) {
                if (tsr_ivfpq_search(c.ix, 1, c.xq + i * c.d, k, &so, D, IA, &err))
                    die("search", err.msg);
                la[i] = now_us() - t0;
                wa += la[i];
            } else if (which == 1) {
                fails += run_direct(&c, i, IB, &touched) != 0;
                lb[i] = now_us() - t0;
                wb += lb[i];
                tsum += touched;
            } else if (which == 2) {
                fails += run_coord(&c, i, IC, &res) != 0;
                lc[i] = now_us() - t0;
                wc += lc[i];
            } else {
                /* the bare hop: Health/Check runs inline on the coordinator's poller */
                fails += tsr_rpc_call(c.coord, "/grpc.health.v1.Health/Check", NULL, 0, 10000,
                                      &res) != TSR_RPC_OK;
                lh[i] = now_us() - t0;
                wh += lh[i];
            }
        }
        ldiff[i] = lc[i] - lb[i];
        same_ab += memcmp(IA, IB, k * sizeof *IA) == 0;
        same_ac += memcmp(IA, IC, k * sizeof *IA) == 0;
    }
    tsr_rpc_result_close(&res);

    /* throughput through the coordinator with `threads` client threads */
    pthread_t th[64];
    thr tw[64];
    double t0 = now_us();
    for (size_t t = 0; t < threads; t++) {
        tw[t] = (thr){&c, nq * t / threads, nq * (t + 1) / threads, 0};
        pthread_create(&th[t], NULL, coord_worker, &tw[t]);
    }
    for (size_t t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        fails += tw[t].fails;
    }
    double wt = now_us() - t0;

    double *sd = tsr_xmalloc(nq * sizeof *sd);
    memcpy(sd, ldiff, nq * sizeof *sd);
    qsort(sd, nq, sizeof *sd, dcmp);
    printf("{\n\"queries\": %zu, \"nprobe\": %zu, \"k\": %zu, \"nlist\": %zu, \"shards\": %zu,\n",
           nq, c.nprobe, k, c.ix->nlist, c.nshards);
    emit("inproc", la, nq, wa, 1);
    emit("direct", lb, nq, wb, 1);
    emit("coord", lc, nq, wc, 1);
    emit("hop", lh, nq, wh, 1);
    printf("\"coord_threads\": %zu, \"coord_threads_qps\": %.1f,\n", threads, nq / (wt / 1e6));
    printf("\"paired_diff_p50_us\": %.1f, \"direct_mean_shards_touched\": %.3f,\n",
           pct(sd, nq, 0.5), (double)tsum / (double)nq);
    printf("\"same_topk_inproc_direct\": %zu, \"same_topk_inproc_coord\": %zu, \"failures\": %zu\n}\n",
           same_ab, same_ac, fails);

    free(sd);
    free(la);
    free(lb);
    free(lc);
    free(ldiff);
    free(lh);
    free(D);
    free(IA);
    free(IB);
    free(IC);
    for (size_t s = 0; s < c.nshards; s++)
        tsr_rpc_channel_destroy(c.sh[s]);
    tsr_rpc_channel_destroy(c.coord);
    free(c.xq);
    free(c.plan);
    free(c.cnorm);
    tsr_ivfpq_destroy(c.ix);
    return fails ? 1 : 0;
}
