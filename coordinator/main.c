/*
 * tessera-coordinator — the front of a Tessera cluster: holds the trained quantizer, the
 * partition plan and the id directory of the served version, serves
 * tessera.v1.VectorSearch (FindNeighbors, ReadIndexDatapoints, UpdateIndex, GetOperation,
 * GetIndexStats) and grpc.health.v1.Health, and drives the shards (docs/coordinator.md).
 *
 * DESIGN (threads): SIGINT/SIGTERM handlers post a semaphore that main waits on. (Not
 * sigwait with the signals blocked: OpenBLAS starts a thread from a library constructor,
 * before main can block anything, and a signal delivered to that thread would take the
 * default action and kill the process without a graceful stop); rpc owns the polling and worker threads; an update runs on its own thread,
 * reconciliation on another (coord.h has the lock order).
 */
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "metrics_http.h"
#include "log.h"
#include "mem.h"

static sem_t stop_sem;
static volatile sig_atomic_t stop_sig;

static void on_signal(int sig)
{
    stop_sig = sig;
    sem_post(&stop_sem); /* async-signal-safe */
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera-coordinator --listen ADDR --data DIR --config FILE [--template F.faiss]\n"
            "                           [--threads T] [--workers W]\n"
            "\n"
            "Serves tessera.v1.VectorSearch in front of the shards named in the config.\n"
            "  --listen ADDR       address to listen on, e.g. 127.0.0.1:7000 (port 0 = any free\n"
            "                      port; the chosen port is logged as \"(port N)\")\n"
            "  --data DIR          data directory: CURRENT and v<N>/{template.faiss, plan,\n"
            "                      directory, MANIFEST}; created when missing\n"
            "  --config FILE       JSON config (docs/config.md): dimensions, distance, nlist, pq_m,\n"
            "                      pq_nbits, nprobe, shards, plan, deadlines, limits, seed\n"
            "  --template F.faiss  trained Faiss IndexIVFPQ to use when the index is created\n"
            "                      (otherwise the first UpdateIndex trains one from its batch)\n"
            "  --metrics-listen A  serve Prometheus /metrics and /healthz on A (e.g. 0.0.0.0:9100)\n"
            "  --deployed-index-id ID  Vertex MatchService: answer only this deployed_index_id\n"
            "                      (others get NOT_FOUND; default: any; docs/vertex-compat.md)\n"
            "  --threads T         gRPC polling threads (default 1 on one core, else 2)\n"
            "  --workers W         worker threads for FindNeighbors and the other fan-outs (8)\n"
            "  --help              this text\n"
            "Env: TSR_LOG_LEVEL=debug|info|warn|error; TSR_COORD_CRASH_AT=staged|prepared|flipped|\n"
            "committed makes an update _exit(137) at that step (crash tests only).\n");
}

tsr__snap *tsr__coord_snap_get(tsr__coord *c)
{
    pthread_mutex_lock(&c->snap_mu);
    tsr__snap *s = c->snap;
    atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&c->snap_mu);
    return s;
}

void tsr__coord_snap_set(tsr__coord *c, tsr__snap *s)
{
    pthread_mutex_lock(&c->snap_mu);
    tsr__snap *old = c->snap;
    c->snap = s;
    pthread_mutex_unlock(&c->snap_mu);
    tsr__snap_unref(old);
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *data = NULL, *config = NULL, *tmpl = NULL, *mlisten = NULL;
    const char *deployed = NULL;
    tsr_metrics_http *mh = NULL;
    int threads = 0, workers = 8;
    tsr_log_set_program("tessera-coordinator");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera-coordinator: %s needs a value (or unknown option)\n\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--listen") == 0)
            listen = v;
        else if (strcmp(a, "--data") == 0)
            data = v;
        else if (strcmp(a, "--config") == 0)
            config = v;
        else if (strcmp(a, "--template") == 0)
            tmpl = v;
        else if (strcmp(a, "--metrics-listen") == 0)
            mlisten = v;
        else if (strcmp(a, "--deployed-index-id") == 0)
            deployed = v;
        else if (strcmp(a, "--threads") == 0 || strcmp(a, "--workers") == 0) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*v == 0 || *end != 0 || n < 1 || n > 64) {
                fprintf(stderr, "tessera-coordinator: %s %s: expected 1..64\n", a, v);
                return 2;
            }
            if (a[2] == 't')
                threads = (int)n;
            else
                workers = (int)n;
        } else {
            fprintf(stderr, "tessera-coordinator: unknown option %s\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!listen || !data || !config) {
        fprintf(stderr, "tessera-coordinator: --listen, --data and --config are required\n\n");
        usage(stderr);
        return 2;
    }

    sem_init(&stop_sem, 0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int code = 1;
    tsr_error err = TSR_ERROR_INIT;
    tsr__coord *c = tsr_xcalloc(1, sizeof *c);
    tsr_rpc_server *srv = NULL;
    int rec_started = 0;
    pthread_mutex_init(&c->snap_mu, NULL);
    pthread_mutex_init(&c->update_mu, NULL);
    pthread_mutex_init(&c->op_mu, NULL);
    pthread_mutex_init(&c->rec_mu, NULL);
    pthread_cond_init(&c->rec_cv, NULL);
    c->template_path = tmpl;
    c->deployed_index_id = deployed;
    if (tsr__coord_config_load(config, &c->cfg, &err)) {
        tsr_error_log("config: %s", err.msg);
        free(c);
        return 2;
    }
    if (tsr_store_create(data, &c->store, &err)) {
        tsr_error_log("cannot open %s: %s", data, err.msg);
        goto out;
    }
    uint64_t cur = 0;
    int rc = tsr_store_current(c->store, &cur, &err);
    if (rc == TSR_ENOTFOUND) {
        c->snap = tsr__snap_create();
        tsr_info("data %s: no version yet (the first UpdateIndex creates the index)", data);
    } else if (rc) {
        tsr_error_log("%s: CURRENT: %s", data, err.msg);
        goto out;
    } else if (tsr__snap_load(c->store, cur, &c->snap, &err)) {
        tsr_error_log("%s: version %llu (CURRENT) does not load: %s", data,
                      (unsigned long long)cur, err.msg);
        goto out;
    } else {
        if (c->snap->tmpl->d != c->cfg.dimensions)
            tsr_warn("version %llu has dimension %d but the config says %d; serving the "
                     "stored index", (unsigned long long)cur, c->snap->tmpl->d,
                     c->cfg.dimensions);
        tsr_info("loaded version %llu: %zu ids (%lld dense, %lld sparse), nlist %zu, plan %s",
                 (unsigned long long)cur, c->snap->dir.n, (long long)c->snap->ndense,
                 (long long)c->snap->nsparse, c->snap->tmpl->nlist,
                 c->snap->plan_kind == TSR_PLAN_LOCALITY ? "locality" : "balanced");
    }
    if (tsr__coord_channels_open(c, NULL, &err)) {
        tsr_error_log("%s", err.msg);
        goto out;
    }
    tsr__coord_metrics_register(c);
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = listen;
    o.cqs = threads;
    o.workers = workers;
    if (!(srv = tsr_rpc_server_create(&o, &err))) {
        tsr_error_log("cannot listen on %s: %s", listen, err.msg);
        goto out;
    }
#define SVC "/tessera.v1.VectorSearch/"
    if (tsr_rpc_server_add_method(srv, SVC "FindNeighbors", tsr__coord_rpc_find_neighbors, c,
                                  TSR_RPC_LONG) ||
        tsr_rpc_server_add_method(srv, SVC "ReadIndexDatapoints", tsr__coord_rpc_read, c,
                                  TSR_RPC_LONG) ||
        tsr_rpc_server_add_method(srv, SVC "GetIndexStats", tsr__coord_rpc_stats, c,
                                  TSR_RPC_LONG) ||
        tsr_rpc_server_add_method(srv, SVC "UpdateIndex", tsr__coord_rpc_update, c, 0) ||
        tsr_rpc_server_add_method(srv, SVC "GetOperation", tsr__coord_rpc_get_operation, c, 0) ||
        tsr_rpc_server_add_method(srv, TSR_VERTEX_SVC "Match", tsr__vertex_rpc_match, c,
                                  TSR_RPC_LONG) ||
        tsr_rpc_server_add_method(srv, TSR_VERTEX_SVC "BatchMatch", tsr__vertex_rpc_batch_match,
                                  c, TSR_RPC_LONG) ||
        tsr_rpc_server_add_method(srv, TSR_VERTEX_SVC "BatchGetEmbeddings",
                                  tsr__vertex_rpc_batch_get_embeddings, c, TSR_RPC_LONG) ||
        tsr_rpc_server_start(srv, &err)) {
        tsr_error_log("cannot start the server: %s", err.msg);
        goto out;
    }
    tsr_rpc_server_set_health(srv, "tessera.v1.VectorSearch", TSR_RPC_HEALTH_SERVING);
    tsr_rpc_server_set_health(srv, "google.cloud.aiplatform.container.v1.MatchService",
                              TSR_RPC_HEALTH_SERVING);
    if (mlisten != NULL && (mh = tsr_metrics_http_start(mlisten, &err)) == NULL) {
        tsr_error_log("cannot serve metrics on %s: %s", mlisten, err.msg);
        goto out;
    }
    if (tsr__coord_reconcile_start(c) == 0)
        rec_started = 1;
    tsr_info("listening on %s (port %d), data %s, %zu shards, version %llu", listen,
             tsr_rpc_server_port(srv), data, c->cfg.nshards,
             (unsigned long long)c->snap->version);
    while (sem_wait(&stop_sem) != 0 && errno == EINTR)
        ;
    tsr_info("%s: shutting down", stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
    code = 0;
out:
    pthread_mutex_lock(&c->op_mu);
    c->closing = 1;
    int live = c->upd_thread_live;
    pthread_mutex_unlock(&c->op_mu);
    if (live)
        pthread_join(c->upd_thread, NULL);
    if (rec_started)
        tsr__coord_reconcile_stop(c);
    tsr_metrics_http_destroy(mh);
    tsr_rpc_server_destroy(srv);
    tsr__coord_channels_close(c);
    tsr__snap_unref(c->snap);
    tsr__coord_ops_close(c);
    tsr_store_destroy(c->store);
    tsr__coord_config_close(&c->cfg);
    free(c);
    return code;
}
