/*
 * tessera-shard — one shard of a Tessera cluster: loads the CURRENT version of its data
 * directory (or starts empty at version 0) and replays its write-ahead log, serves
 * tessera.v1.Shard (Search, Read, Stage/Prepare/Commit/Abort/Release, Stats, Write) and
 * grpc.health.v1.Health over gRPC, and stops gracefully on SIGTERM / SIGINT.
 *
 * DESIGN (threads): SIGINT/SIGTERM post a semaphore that main waits on (common/core/cmdline.h
 * says why not sigwait: OpenBLAS starts a thread before main, which a signal mask set in
 * main does not cover); the rpc module owns the polling and worker threads; the shard
 * state (update.c) is shared by handlers under the rules in shard.h.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cmdline.h"
#include "core/log.h"
#include "net/metrics.h"
#include "net/metrics_http.h"
#include "net/rpc.h"
#include "net/server_flags.h"
#include "shard.h"
#include "shard_service.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera-shard --listen ADDR --data DIR [--threads T] [--workers W]\n"
            "                     [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]\n"
            "                     [--max-message BYTES] [--metrics-listen ADDR]\n"
            "                     [--peer-token-file FILE | --insecure-no-auth]\n"
            "\n"
            "Serves one shard of a Tessera cluster (service tessera.v1.Shard + grpc health).\n"
            "  --listen ADDR   address to listen on, e.g. 127.0.0.1:7101 (port 0 = any free port;\n"
            "                  the chosen port is logged)\n"
            "  --data DIR      data directory: CURRENT, v<N>/{slice.faiss, meta, vectors.f32,\n"
            "                  MANIFEST} and wal/v<N>.log (streamed writes); created when missing\n"
            "                  (then the shard starts empty at version 0 and receives its first\n"
            "                  version through Stage/Prepare/Commit)\n"
            "  --metrics-listen A  serve Prometheus /metrics and /healthz on A (e.g. 127.0.0.1:9100;\n"
            "                  \":9100\" is loopback too; 0.0.0.0:9100 exposes it to the network)\n"
            "  --peer-token-file FILE  accept only calls with \"authorization: Bearer <token>\" of\n"
            "                  the bare token in FILE (the coordinator's --peer-token-file); health\n"
            "                  stays open (docs/security.md)\n"
            "  --insecure-no-auth  serve a non-loopback --listen without --peer-token-file or\n"
            "                  --tls-client-ca (otherwise refused: anyone could stage or commit)\n"
            "  --threads T     gRPC polling threads (default 1; one completion queue each)\n"
            "  --workers W     worker threads for Stage/Prepare/Commit/Abort/Release/Write (default 2)\n"
            "  --tls-cert FILE PEM certificate chain: the port speaks TLS only (no plaintext)\n"
            "  --tls-key FILE  PEM private key of --tls-cert (unencrypted)\n"
            "  --tls-client-ca FILE  mutual TLS: require client certificates signed by this CA\n"
            "                  (the coordinator's --shard-tls-cert)\n"
            "  --max-message BYTES  largest request or reply (default 64M; K/M/G suffixes);\n"
            "                  larger requests get RESOURCE_EXHAUSTED\n"
            "  --help          this text;  --version  the release\n"
            "Env: TSR_LOG_LEVEL=debug|info|warn|error; TSR_SIMD_MAX=avx2|scalar caps the\n"
            "SIMD kernels; TSR_BACKGROUND_NICE=0..19|idle the background threads' priority\n"
            "(docs/operations.md).\n");
}

int main(int argc, char **argv)
{
    tsr_server_flags sf; /* the shard takes only the flags every server takes */
    tsr_metrics_http *mh = NULL;
    int ec;
    tsr_cmdline_stop_init(); /* first: a SIGTERM during a long load still stops cleanly */
    tsr_log_set_program("tessera-shard");
    tsr_server_flags_init(&sf, 2);
    if (tsr_server_flags_parse(&sf, "tessera-shard", argc, argv, NULL, 0, usage, &ec))
        return ec;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_server_flags_check_tls(&sf, &err) != 0) {
        tsr_error_log("%s", err.msg);
        return 2;
    }
    /* Only the coordinator may call a shard: it proves itself with the peer token or a
     * client certificate; without either, only a loopback address is served. */
    if (!sf.peer_token_file && !sf.tls_ca && !sf.insecure &&
        !tsr_rpc_addr_is_loopback(sf.listen)) {
        tsr_error_log("--listen %s is not a loopback address and neither --peer-token-file "
                      "nor --tls-client-ca is given: anyone who reaches the port could stage "
                      "or commit data. Give one (docs/security.md), or --insecure-no-auth",
                      sf.listen);
        return 2;
    }
    tsr_rpc_tokens *peer = NULL;
    if (sf.peer_token_file && tsr_rpc_tokens_single(sf.peer_token_file, &peer, &err) != 0) {
        tsr_error_log("--peer-token-file: %s", err.msg);
        return 2;
    }

    int code = 1;
    tsr__shard shard;
    tsr_rpc_server *srv = NULL;
    if (tsr__shard_open(&shard, sf.data, &err) != 0) {
        tsr_error_log("cannot open %s: %s", sf.data, err.msg);
        tsr__shard_close(&shard);
        tsr_rpc_tokens_free(peer);
        return 1;
    }
    tsr_rpc_server_opts o;
    tsr_server_flags_server_opts(&sf, &o);
    o.wrong_port_hint = "this port is a tessera shard (it serves tessera.v1.Shard to the "
                        "coordinator); tessera.v1.VectorSearch and the Vertex MatchService "
                        "are served by tessera-coordinator on its own port (7000 by default)";
    if ((srv = tsr_rpc_server_create(&o, &err)) == NULL) {
        tsr_error_log("cannot listen on %s: %s", sf.listen, err.msg);
        tsr_rpc_tokens_free(peer);
        goto out;
    }
    tsr_rpc_server_set_tokens(srv, peer); /* every method needs it; health stays open */
    if (tsr_shard_service_register(srv, &shard) != 0 || tsr_rpc_server_start(srv, &err) != 0) {
        tsr_error_log("cannot start the server: %s", err.msg);
        goto out;
    }
    tsr_rpc_server_set_health(srv, "tessera.v1.Shard", TSR_RPC_HEALTH_SERVING);
    if (sf.metrics_listen != NULL && tsr_shard_metrics_register(&shard) != 0)
        tsr_warn("metrics: no collector slot left: tessera_version, tessera_vectors and "
                 "tessera_lists are not served");
    if (sf.metrics_listen != NULL &&
        (mh = tsr_metrics_http_start(sf.metrics_listen, &err)) == NULL) {
        tsr_error_log("cannot serve metrics on %s: %s", sf.metrics_listen, err.msg);
        goto out;
    }
    tsr_info("listening on %s (port %d) %s, data %s%s", sf.listen, tsr_rpc_server_port(srv),
             sf.tls_ca ? "mutual TLS" : sf.tls_cert ? "TLS" : "plaintext", sf.data,
             sf.peer_token_file ? ", peer token required" : "");
    if (!sf.peer_token_file && !sf.tls_ca)
        tsr_warn("no --peer-token-file or --tls-client-ca: any client that reaches the port "
                 "is served (%s)", sf.insecure ? "--insecure-no-auth" : "loopback only");
    int sig = tsr_cmdline_stop_wait();
    tsr_info("%s: shutting down", tsr_cmdline_signame(sig));
    code = 0;
out:
    tsr_metrics_http_destroy(mh);
    tsr_rpc_server_destroy(srv);
    tsr__shard_close(&shard);
    return code;
}
