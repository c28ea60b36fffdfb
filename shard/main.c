/*
 * tessera-shard — one shard of a Tessera cluster: loads the CURRENT version of its data
 * directory (or starts empty at version 0), serves tessera.v1.Shard (Search, Read,
 * Stage/Prepare/Commit/Abort/Release, Stats) and grpc.health.v1.Health over gRPC, and
 * stops gracefully on SIGTERM / SIGINT.
 *
 * DESIGN (threads): main blocks SIGINT/SIGTERM before any thread starts (so every rpc
 * thread inherits the mask) and waits for them with sigwait; the rpc module owns the
 * polling and worker threads; the shard state (update.c) is shared by handlers under the
 * rules in shard.h.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rpc.h"
#include "metrics_http.h"
#include "shard.h"
#include "shard_service.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera-shard --listen ADDR --data DIR [--threads T] [--workers W]\n"
            "\n"
            "Serves one shard of a Tessera cluster (service tessera.v1.Shard + grpc health).\n"
            "  --listen ADDR   address to listen on, e.g. 127.0.0.1:7101 (port 0 = any free port;\n"
            "                  the chosen port is logged)\n"
            "  --data DIR      data directory: CURRENT and v<N>/{slice.faiss, meta, vectors.f32,\n"
            "                  MANIFEST}; created when missing (then the shard starts empty at\n"
            "                  version 0 and receives its first version through Stage/Prepare/Commit)\n"
            "  --metrics-listen A  serve Prometheus /metrics and /healthz on A (e.g. 0.0.0.0:9100)\n"
            "  --threads T     gRPC polling threads (default: 1 on one core, else 2)\n"
            "  --workers W     worker threads for Stage/Prepare/Commit/Abort/Release (default 2)\n"
            "  --help          this text\n");
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *data = NULL, *mlisten = NULL;
    tsr_metrics_http *mh = NULL;
    int threads = 0, workers = 2;
    tsr_log_set_program("tessera-shard");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera-shard: %s needs a value (or unknown option)\n\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (strcmp(a, "--listen") == 0) {
            listen = v;
        } else if (strcmp(a, "--data") == 0) {
            data = v;
        } else if (strcmp(a, "--metrics-listen") == 0) {
            mlisten = v;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "--workers") == 0) {
            long n = strtol(v, &end, 10);
            if (*v == 0 || *end != 0 || n < 1 || n > 64) {
                fprintf(stderr, "tessera-shard: %s %s: expected 1..64\n", a, v);
                return 2;
            }
            if (a[2] == 't')
                threads = (int)n;
            else
                workers = (int)n;
        } else {
            fprintf(stderr, "tessera-shard: unknown option %s\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (listen == NULL || data == NULL) {
        fprintf(stderr, "tessera-shard: --listen and --data are required\n\n");
        usage(stderr);
        return 2;
    }

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    int code = 1;
    tsr_error err = TSR_ERROR_INIT;
    tsr__shard shard;
    tsr_rpc_server *srv = NULL;
    if (tsr__shard_open(&shard, data, &err) != 0) {
        tsr_error_log("cannot open %s: %s", data, err.msg);
        tsr__shard_close(&shard);
        return 1;
    }
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.listen = listen;
    o.cqs = threads;
    o.workers = workers;
    if ((srv = tsr_rpc_server_create(&o, &err)) == NULL) {
        tsr_error_log("cannot listen on %s: %s", listen, err.msg);
        goto out;
    }
    if (tsr_shard_service_register(srv, &shard) != 0 || tsr_rpc_server_start(srv, &err) != 0) {
        tsr_error_log("cannot start the server: %s", err.msg);
        goto out;
    }
    tsr_rpc_server_set_health(srv, "tessera.v1.Shard", TSR_RPC_HEALTH_SERVING);
    if (mlisten != NULL && (mh = tsr_metrics_http_start(mlisten, &err)) == NULL) {
        tsr_error_log("cannot serve metrics on %s: %s", mlisten, err.msg);
        goto out;
    }
    tsr_info("listening on %s (port %d), data %s", listen, tsr_rpc_server_port(srv), data);
    int sig = 0;
    sigwait(&set, &sig);
    tsr_info("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    code = 0;
out:
    tsr_metrics_http_destroy(mh);
    tsr_rpc_server_destroy(srv);
    tsr__shard_close(&shard);
    return code;
}
