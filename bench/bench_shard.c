/*
 * bench_shard — the cost of the RPC around a shard Search (issue 4, point 7).
 *
 * Builds one shard version in-process (random clustered data, centroids and PQ
 * codebooks sampled from it — the search cost does not depend on how well they are
 * trained), then runs the same queries (same probed lists and coarse distances) two ways:
 *   in-process  tsr__search_one on the snapshot, one query at a time;
 *   rpc         tessera.v1.Shard/Search over loopback gRPC to a server in this process
 *               (real HTTP/2 over TCP), one query per call: sequential (latency) and with
 *               N client threads (throughput).
 * Prints a table (requests/s, p50, p99) and the gap, which is the RPC cost.
 *
 * usage: bench_shard [--n N] [--d D] [--nlist L] [--m M] [--nprobe P] [--k K]
 *                    [--queries Q] [--threads T]
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "index/knn.h"
#include "core/mem.h"
#include "net/rpc.h"
#include "shard.h"
#include "shard_service.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static uint64_t rng_state = 88172645463325252ull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(void)
{
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(2 * M_PI * v));
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(const char *name, double *lat, size_t n, double wall_us, double *p50out)
{
    qsort(lat, n, sizeof *lat, dcmp);
    double p50 = lat[n / 2], p99 = lat[(size_t)(n * 0.99)];
    printf("| %-28s | %10.0f | %8.1f | %8.1f |\n", name, n / (wall_us / 1e6), p50, p99);
    if (p50out)
        *p50out = p50;
}

typedef struct worker {
    tsr_rpc_channel *ch;
    uint8_t **reqs;
    size_t *lens;
    size_t from, to;
    double *lat;
    int fails;
} worker;

static void *run_worker(void *arg)
{
    worker *w = arg;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (size_t i = w->from; i < w->to; i++) {
        double t0 = now_us();
        if (tsr_rpc_call(w->ch, "/tessera.v1.Shard/Search", w->reqs[i], w->lens[i], 10000,
                         &res) != TSR_RPC_OK)
            w->fails++;
        w->lat[i] = now_us() - t0;
    }
    tsr_rpc_result_close(&res);
    return NULL;
}

int main(int argc, char **argv)
{
    size_t n = 100000, d = 64, nlist = 256, M = 16, nprobe = 16, k = 10, nq = 2000;
    int threads = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t v = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--n")) n = v;
        else if (!strcmp(argv[i], "--d")) d = v;
        else if (!strcmp(argv[i], "--nlist")) nlist = v;
        else if (!strcmp(argv[i], "--m")) M = v;
        else if (!strcmp(argv[i], "--nprobe")) nprobe = v;
        else if (!strcmp(argv[i], "--k")) k = v;
        else if (!strcmp(argv[i], "--queries")) nq = v;
        else if (!strcmp(argv[i], "--threads")) threads = (int)v;
        else {
            fprintf(stderr, "bench_shard: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_blas_set_threads(1);
    /* Data: 100 clusters. */
    size_t nc = 100;
    float *cent = tsr_xmalloc(nc * d * sizeof(float));
    float *x = tsr_xmalloc(n * d * sizeof(float));
    float *xq = tsr_xmalloc(nq * d * sizeof(float));
    for (size_t i = 0; i < nc * d; i++)
        cent[i] = 3 * nrand();
    for (size_t i = 0; i < n; i++) {
        size_t c = (size_t)(urand() * nc);
        for (size_t j = 0; j < d; j++)
            x[i * d + j] = cent[c * d + j] + nrand();
    }
    for (size_t i = 0; i < nq; i++) {
        size_t c = (size_t)(urand() * nc);
        for (size_t j = 0; j < d; j++)
            xq[i * d + j] = cent[c * d + j] + nrand();
    }
    tsr_ivfpq *ix = tsr_ivfpq_create((int)d, nlist, M, 8, TSR_METRIC_L2, 1, &err);
    if (ix == NULL) {
        fprintf(stderr, "bench_shard: %s\n", err.msg);
        return 1;
    }
    ix->is_trained = 1;
    for (size_t l = 0; l < nlist; l++)
        memcpy(ix->centroids + l * d, x + ((l * 7919) % n) * d, d * sizeof(float));
    /* PQ codebooks: sub-vectors of residuals of random points. */
    float *I_d = tsr_xmalloc(n * sizeof(float));
    int64_t *I_l = tsr_xmalloc(n * sizeof(int64_t));
    if (tsr_knn(x, n, ix->centroids, nlist, d, TSR_METRIC_L2, 1, NULL, I_d, I_l, &err) != 0) {
        fprintf(stderr, "bench_shard: %s\n", err.msg);
        return 1;
    }
    size_t dsub = d / M;
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < 256; j++) {
            size_t i = (size_t)(urand() * n);
            for (size_t q = 0; q < dsub; q++)
                ix->pq.centroids[(m * 256 + j) * dsub + q] =
                    x[i * d + m * dsub + q] - ix->centroids[I_l[i] * d + m * dsub + q];
        }
    tsr__tmpl *t = tsr__tmpl_from_index(ix, &err);
    tsr__edits e = {0};
    e.ups = tsr_xmalloc(n * sizeof *e.ups);
    for (size_t i = 0; i < n; i++) {
        tsr__rec *r = tsr_xcalloc(1, sizeof *r);
        atomic_init(&r->refs, 1);
        r->label = (int64_t)i;
        r->list = (int32_t)I_l[i];
        char id[32];
        snprintf(id, sizeof id, "id%zu", i);
        r->dp.id = tsr_xstrdup(id);
        r->dp.dense = tsr_xmalloc(d * sizeof(float));
        memcpy(r->dp.dense, x + i * d, d * sizeof(float));
        r->dp.ndense = d;
        e.ups[e.nups++] = r;
    }
    tsr__version *empty = tsr__version_empty(&err), *v = NULL;
    double t0 = now_us();
    if (tsr__version_build(empty, t, &e, 1, &v, &err) != 0) {
        fprintf(stderr, "bench_shard: %s\n", err.msg);
        return 1;
    }
    printf("built a version of %zu vectors (d=%zu, nlist=%zu, M=%zu) in %.2f s\n", n, d, nlist, M,
           (now_us() - t0) / 1e6);
    for (size_t l = 0; l < nlist; l++)
        v->owned[l] = 1;

    /* Coarse step as the coordinator does it. */
    float *cd = tsr_xmalloc(nq * nprobe * sizeof(float));
    int64_t *cl = tsr_xmalloc(nq * nprobe * sizeof(int64_t));
    tsr_knn(xq, nq, ix->centroids, nlist, d, TSR_METRIC_L2, nprobe, NULL, cd, cl, &err);
    int32_t *lists = tsr_xmalloc(nq * nprobe * sizeof(int32_t));
    for (size_t i = 0; i < nq * nprobe; i++)
        lists[i] = (int32_t)cl[i];

    /* In-process. */
    double *lat = tsr_xmalloc(nq * sizeof(double));
    int64_t scanned = 0;
    t0 = now_us();
    for (size_t i = 0; i < nq; i++) {
        tsr__query q = {0};
        q.x = xq + i * d;
        q.lists = lists + i * nprobe;
        q.coarse = cd + i * nprobe;
        q.nprobe = nprobe;
        q.k = k;
        tsr__qresult r;
        double a = now_us();
        tsr__search_one(v, &q, &r, &err);
        lat[i] = now_us() - a;
        scanned += r.codes_scanned;
        tsr__qresult_close(&r);
    }
    double wall = now_us() - t0;
    printf("%zu queries, k=%zu, nprobe=%zu, %.0f codes scanned per query\n\n", nq, k, nprobe,
           (double)scanned / nq);
    printf("| %-28s | %10s | %8s | %8s |\n", "Search, one query per call", "requests/s",
           "p50 µs", "p99 µs");
    printf("|------------------------------|------------|----------|----------|\n");
    double p50_in = 0, p50_rpc = 0;
    stats("in-process (tsr__search_one)", lat, nq, wall, &p50_in);

    /* Serve this version over loopback. */
    tsr__shard s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.table_mu, NULL);
    pthread_mutex_init(&s.update_mu, NULL);
    s.current = tsr__version_ref(v);
    s.held[s.nheld++] = (tsr__held){tsr__version_ref(v), TSR__SERVING};
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    tsr_rpc_server *srv = tsr_rpc_server_create(&o, &err);
    if (srv == NULL || tsr_shard_service_register(srv, &s) != 0 ||
        tsr_rpc_server_start(srv, &err) != 0) {
        fprintf(stderr, "bench_shard: server: %s\n", err.msg);
        return 1;
    }
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(srv));
    uint8_t **reqs = tsr_xmalloc(nq * sizeof *reqs);
    size_t *lens = tsr_xmalloc(nq * sizeof *lens);
    for (size_t i = 0; i < nq; i++) {
        Tessera__V1__ShardQuery q = TESSERA__V1__SHARD_QUERY__INIT, *qp = &q;
        q.version = 1;
        q.vector = xq + i * d;
        q.n_vector = d;
        q.lists = lists + i * nprobe;
        q.n_lists = nprobe;
        q.coarse_distances = cd + i * nprobe;
        q.n_coarse_distances = nprobe;
        q.k = (int32_t)k;
        Tessera__V1__ShardSearchRequest rq = TESSERA__V1__SHARD_SEARCH_REQUEST__INIT;
        rq.queries = &qp;
        rq.n_queries = 1;
        reqs[i] = tsr_rpc_pack(&rq.base, &lens[i]);
    }
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, NULL, &err);
    worker w = {ch, reqs, lens, 0, nq < 200 ? nq : 200, lat, 0};
    run_worker(&w); /* warm-up: connect */
    w.from = 0, w.to = nq;
    t0 = now_us();
    run_worker(&w);
    wall = now_us() - t0;
    stats("rpc loopback, sequential", lat, nq, wall, &p50_rpc);
    int fails = w.fails;

    pthread_t th[64];
    worker ws[64];
    if (threads > 64)
        threads = 64;
    t0 = now_us();
    for (int i = 0; i < threads; i++) {
        ws[i] = (worker){ch, reqs, lens, nq * i / threads, nq * (i + 1) / threads, lat, 0};
        pthread_create(&th[i], NULL, run_worker, &ws[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        fails += ws[i].fails;
    }
    wall = now_us() - t0;
    char name[64];
    snprintf(name, sizeof name, "rpc loopback, %d client threads", threads);
    stats(name, lat, nq, wall, NULL);
    printf("\nRPC cost at p50 (sequential): %.1f µs per Search call; %d failed calls\n",
           p50_rpc - p50_in, fails);

    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(srv);
    for (size_t i = 0; i < nq; i++)
        free(reqs[i]);
    free(reqs);
    free(lens);
    tsr__shard_close(&s);
    tsr__version_unref(v);
    tsr__version_unref(empty);
    tsr__edits_close(&e);
    tsr__tmpl_unref(t);
    free(cent), free(x), free(xq), free(I_d), free(I_l), free(cd), free(cl), free(lists), free(lat);
    return fails ? 1 : 0;
}
