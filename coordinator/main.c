/*
 * tessera-coordinator — the front of a Tessera cluster: holds the trained quantizer, the
 * partition plan and the id directory of the served version, serves
 * tessera.v1.VectorSearch (FindNeighbors, ReadIndexDatapoints, UpdateIndex, GetOperation,
 * GetIndexStats) and grpc.health.v1.Health, and drives the shards (docs/coordinator.md).
 *
 * DESIGN (threads): SIGINT/SIGTERM post a semaphore that main waits on (common/core/cmdline.h:
 * not sigwait, because OpenBLAS starts a thread from a library constructor, before main can
 * block anything, and a signal delivered to that thread would kill the process without a
 * graceful stop); rpc owns the polling and worker threads; an update runs on its own
 * thread, reconciliation on another (coord.h has the lock order).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/clock.h"
#include "core/cmdline.h"
#include "coord.h"
#include "frontend/frontend.h"
#include "dirshard.h"
#include "meta.h"
#include "net/metrics_http.h"
#include "net/server_flags.h"
#include "core/log.h"
#include "core/mem.h"
#include "google/cloud/aiplatform/v1/index_service.pb-c.h"
#include "google/cloud/aiplatform/v1/match_service.pb-c.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera-coordinator --listen ADDR --data DIR --config FILE [--template F.faiss]\n"
            "                           [--threads T] [--workers W] [--metrics-listen ADDR]\n"
            "                           [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]\n"
            "                           [--shard-tls-ca FILE [--shard-tls-cert FILE --shard-tls-key FILE]\n"
            "                            [--shard-tls-server-name NAME]] [--max-message BYTES]\n"
            "                           [--auth-tokens FILE | --insecure-no-auth]\n"
            "                           [--batch-root-allow DIR]... [--peer-token-file FILE]\n"
            "                           [--etcd ENDPOINTS [--etcd-prefix P] [--etcd-ttl S]\n"
            "                            [--etcd-compact S] [--advertise HOST:PORT] [--etcd-ca FILE\n"
            "                            [--etcd-cert FILE --etcd-key FILE]]]\n"
            "\n"
            "Serves tessera.v1.VectorSearch and the Vertex AI MatchService\n"
            "(google.cloud.aiplatform.container.v1: Match, BatchMatch, BatchGetEmbeddings;\n"
            "google.cloud.aiplatform.v1: FindNeighbors, ReadIndexDatapoints, IndexService\n"
            "GetIndex, UpdateIndex, UpsertDatapoints, RemoveDatapoints;\n"
            "docs/vertex-compat.md) in front of the shards named in the config.\n"
            "  --listen ADDR       address to listen on, e.g. 127.0.0.1:7000 (port 0 = any free\n"
            "                      port; the chosen port is logged as \"(port N)\")\n"
            "  --data DIR          data directory: CURRENT and v<N>/{template.faiss, plan,\n"
            "                      directory, MANIFEST}; created when missing\n"
            "  --config FILE       JSON config (docs/config.md): dimensions, distance, nlist, pq_m,\n"
            "                      pq_nbits, nprobe, shards, plan, deadlines, limits, seed\n"
            "  --template F.faiss  trained Faiss IndexIVFPQ to use when the index is created\n"
            "                      (otherwise the first UpdateIndex trains one from its batch)\n"
            "  --metrics-listen A  serve Prometheus /metrics and /healthz on A (e.g. 127.0.0.1:9100;\n"
            "                      \":9100\" is loopback too; 0.0.0.0:9100 exposes it to the network)\n"
            "  --auth-tokens FILE  lines \"<role> <token>\" (role query or admin; '#' comments): every\n"
            "                      call but health needs \"authorization: Bearer <token>\"; query\n"
            "                      may search and read, admin may also update. SIGHUP re-reads it\n"
            "                      (docs/security.md)\n"
            "  --insecure-no-auth  serve without tokens on a non-loopback --listen (without tokens\n"
            "                      the coordinator otherwise refuses any address but loopback)\n"
            "  --batch-root-allow DIR  a folder batch roots may be in (repeatable); a batch_root\n"
            "                      must resolve (symlinks and .. followed) inside one; none given =\n"
            "                      UpdateIndex is refused with PERMISSION_DENIED\n"
            "  --peer-token-file FILE  send the bare token in FILE to the shards (they run with the\n"
            "                      same --peer-token-file)\n"
            "  --deployed-index-id ID  Vertex MatchService: answer only this deployed_index_id\n"
            "                      (others get NOT_FOUND; default: any; docs/vertex-compat.md)\n"
            "  --threads T         gRPC polling threads, one completion queue each (default 1)\n"
            "  --workers W         worker threads for UpdateIndex, Read, Stats, MatchService (8)\n"
            "  --tls-cert FILE     PEM certificate chain: the public port speaks TLS only\n"
            "  --tls-key FILE      PEM private key of --tls-cert (unencrypted)\n"
            "  --tls-client-ca FILE  mutual TLS: require client certificates signed by this CA\n"
            "  --shard-tls-ca FILE   dial the shards over TLS, verifying them against this CA\n"
            "  --shard-tls-cert FILE --shard-tls-key FILE\n"
            "                      client certificate for shards that require mutual TLS\n"
            "  --shard-tls-server-name NAME  name to check in the shards' certificates instead\n"
            "                      of the host of each shard address (e.g. when they are IPs)\n"
            "  --max-message BYTES largest request or reply on the public port (default 64M;\n"
            "                      K/M/G suffixes); larger requests get RESOURCE_EXHAUSTED (the\n"
            "                      shard channels keep 64M: shard replies carry candidates)\n"
            "  --etcd ENDPOINTS    keep the committed version, its plan, template and directory\n"
            "                      in etcd v3 (comma list of host:port); several coordinators\n"
            "                      then serve one index, one of them elected leader (runs\n"
            "                      updates and writes; followers refuse them with UNAVAILABLE\n"
            "                      \"not the leader: the leader is ADDR\"). Without it: --data\n"
            "                      alone (docs/coordinator.md \"Metadata backends\")\n"
            "  --etcd-prefix P     key prefix of this index in etcd (default /tessera/default)\n"
            "  --etcd-ttl S        leader lease TTL in seconds (default 5): a dead leader is\n"
            "                      replaced within about S + 1 s\n"
            "  --etcd-compact S    the leader compacts etcd's history every S seconds, below\n"
            "                      the revision it read S seconds earlier (default 300; 0 =\n"
            "                      never: then compact etcd yourself, docs/operations.md)\n"
            "  --advertise H:P     how clients and the other coordinators reach this one\n"
            "                      (default: --listen with its bound port; required when\n"
            "                      --listen is 0.0.0.0 or [::])\n"
            "  --etcd-ca FILE      dial etcd over TLS, verifying it against this CA\n"
            "  --etcd-cert FILE --etcd-key FILE  client certificate for etcd (mutual TLS)\n"
            "  --help              this text;  --version  the release\n"
            "Env: TSR_LOG_LEVEL=debug|info|warn|error; TSR_SIMD_MAX=avx2|scalar caps the\n"
            "SIMD kernels; TSR_BACKGROUND_NICE=0..19|idle the background threads' priority\n"
            "(docs/operations.md).\n");
}

/* The served version's plan and directory name shard groups by number: every number
 * must be a group of the config. A config with fewer groups than the stored version
 * (a group removed) would otherwise start, and the next update would index its per-group
 * arrays with the missing groups' numbers (out of bounds). */
static int check_shards(const tsr__snap *sn, uint64_t v, size_t nshards, tsr_error *err)
{
    for (size_t l = 0; sn->plan && sn->tmpl && l < sn->tmpl->nlist; l++)
        if (sn->plan[l] < 0 || (size_t)sn->plan[l] >= nshards)
            return tsr_err(err, TSR_EINVAL, "version %llu (CURRENT): its plan puts list %zu on "
                           "shard %d but the config has %zu shard group(s); shard groups may "
                           "not be removed or reordered", (unsigned long long)v, l,
                           (int)sn->plan[l], nshards);
    for (size_t i = 0; i < sn->dir.n; i++)
        if (sn->dir.e[i].shard < 0 || (size_t)sn->dir.e[i].shard >= nshards)
            return tsr_err(err, TSR_EINVAL, "version %llu (CURRENT): its directory places id "
                           "\"%.64s\" on shard %d but the config has %zu shard group(s); shard "
                           "groups may not be removed or reordered", (unsigned long long)v,
                           sn->dir.e[i].id, (int)sn->dir.e[i].shard, nshards);
    return 0;
}

/* Client channel options: TLS files, server name, bearer token (borrowed; NULL = none). */
static void client_opts(tsr_rpc_client_opts *o, const char *ca, const char *cert,
                        const char *key, const char *name, const char *token)
{
    tsr_rpc_client_opts_init(o);
    o->tls_ca_file = ca;
    o->tls_cert_file = cert;
    o->tls_key_file = key;
    o->tls_server_name = name;
    o->bearer_token = token;
}

/* --etcd and its companions. */
typedef struct etcd_args {
    const char *endpoints, *prefix;
    int ttl, compact;
    const char *ca, *cert, *key, *advertise;
} etcd_args;

/* Opens the etcd backend (TLS like the shard channels). Returns 0 or an error. */
static int open_meta(tsr__coord *c, const etcd_args *a, tsr_error *err)
{
    tsr_cmdline_tls t = {a->cert, "--etcd-cert", a->key, "--etcd-key", a->ca, "--etcd-ca"};
    if (tsr_cmdline_check_tls(&t, 1, err))
        return TSR_EINVAL;
    tsr_rpc_client_opts o;
    client_opts(&o, a->ca, a->cert, a->key, NULL, NULL);
    o.streams_nowait = 1; /* the watch thread stays out of the query path's polling */
    int rc = tsr__meta_open(a->endpoints, a->prefix, &o, a->ttl, &c->meta, err);
    if (rc) {
        char why[sizeof err->msg];
        memcpy(why, err->msg, sizeof why);
        tsr_err(err, rc, "--etcd %s: %s", a->endpoints, why);
    }
    return rc;
}

/* --advertise, or the listen address with its bound port when it names one host (not
 * 0.0.0.0 / [::]). Returns 0 or -1 (logged). */
static int advertise_of(const char *listen, const char *adv, int port, char *buf, size_t cap)
{
    if (adv) {
        snprintf(buf, cap, "%s", adv);
        return 0;
    }
    const char *colon = strrchr(listen, ':');
    size_t hl = colon ? (size_t)(colon - listen) : 0;
    if (!colon || hl == 0 || strncmp(listen, "0.0.0.0", hl) == 0 ||
        strncmp(listen, "[::]", hl) == 0) {
        tsr_error_log("--etcd needs --advertise HOST:PORT when --listen %s names no single "
                      "host (how clients and the other coordinators reach this one)", listen);
        return -1;
    }
    snprintf(buf, cap, "%.*s:%d", (int)hl, listen, port);
    return 0;
}

static int load_state(tsr__coord *c, const char *data);

/* --etcd (when given), the served version and operations, the stream's log. Returns 0,
 * or -1 with the exit code in *code (logged). */
static int load_all(tsr__coord *c, const etcd_args *ea, const char *data, int *code)
{
    tsr_error err = TSR_ERROR_INIT;
    if (ea->endpoints && open_meta(c, ea, &err)) {
        tsr_error_log("%s", err.msg);
        *code = 2;
        return -1;
    }
    if (load_state(c, data) != 0)
        return -1;
    if (tsr__stream_init(c, &err)) {
        tsr_error_log("%s: the coordinator log of streamed writes: %s", data, err.msg);
        return -1;
    }
    return 0;
}

/* With --etcd: the advertise address into buf, then the leader thread. Returns 0, or the
 * exit code (logged). */
static int start_leader(tsr__coord *c, const etcd_args *ea, const char *listen, int port,
                        char *buf, size_t cap)
{
    if (advertise_of(listen, ea->advertise, port, buf, cap))
        return 2;
    c->lead.advertise = buf;
    c->lead.ttl_s = ea->ttl;
    c->lead.compact_s = ea->compact;
    if (tsr__leader_start(c)) {
        tsr_error_log("cannot start the leader thread");
        return 1;
    }
    tsr_info("etcd %s, prefix %s: advertised as %s, lease TTL %d s, history compacted every "
             "%d s (0: never)", ea->endpoints, c->meta->prefix, buf, ea->ttl, ea->compact);
    return 0;
}

/* After a reshard the served version stores the shard groups (docs/resharding.md): they
 * replace the config file's "shards". Returns 0 (also when the version has none) or a
 * TSR code with err set. */
static int stored_groups(tsr__coord *c, uint64_t v, tsr_error *err)
{
    if (!c->snap->groups)
        return 0;
    int rc = tsr__coord_config_set_groups(&c->cfg, c->snap->groups, c->snap->groups_len, err);
    if (rc == 0)
        tsr_info("shard groups from version %llu (a reshard), not the config file's "
                 "\"shards\": %zu group(s)", (unsigned long long)v, (size_t)c->cfg.nshards);
    return rc;
}

/* The committed version into the cache (tsr__meta_sync). With --etcd its directory may
 * have to be listed from the shards (dirshard.h): a shard still starting, or a listing
 * refused, is retried for up to SYNC_WAIT_MS before the start fails (a stop signal is
 * seen after it). */
#define SYNC_WAIT_MS 30000
static int sync_version(tsr__coord *c, uint64_t *cur, tsr_error *err)
{
    int64_t until = tsr_clock_mono_ms() + SYNC_WAIT_MS;
    for (;;) {
        int rc = tsr__meta_sync(c->meta, c->store, tsr__dir_rebuild, c, cur, err);
        if (rc == 0 || !c->meta || rc == TSR_ENOTFOUND || tsr_clock_mono_ms() >= until)
            return rc;
        tsr_warn("etcd: the committed version is not loaded yet (%s); trying again in 1 s",
                 err->msg);
        tsr_error_clear(err);
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
}

/* Opens the data directory, loads the version CURRENT names (or starts empty) and the
 * operation records. Returns 0, or -1 with the reason logged. */
static int load_state(tsr__coord *c, const char *data)
{
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_store_create(data, &c->store, &err)) {
        tsr_error_log("cannot open %s: %s", data, err.msg);
        return -1;
    }
    uint64_t cur = 0;
    int rc = sync_version(c, &cur, &err);
    if (rc == 0 && cur == 0)
        rc = TSR_ENOTFOUND;
    if (rc == TSR_ENOTFOUND) {
        c->snap = tsr__snap_create();
        tsr_info("data %s: no version yet (the first UpdateIndex creates the index)", data);
    } else if (rc) {
        tsr_error_log("%s: %s: %s", data, c->meta ? "etcd" : "CURRENT", err.msg);
        return -1;
    } else if (tsr__snap_load(c->store, cur, &c->snap, &err)) {
        tsr_error_log("%s: version %llu (CURRENT) does not load: %s", data,
                      (unsigned long long)cur, err.msg);
        return -1;
    } else if (stored_groups(c, cur, &err)) {
        tsr_error_log("%s: version %llu: %s", data, (unsigned long long)cur, err.msg);
        return -1;
    } else if ((c->snap->ngroups = c->cfg.nshards),
               check_shards(c->snap, cur, c->cfg.nshards, &err)) {
        tsr_error_log("%s: %s", data, err.msg);
        return -1;
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
    if (tsr__oplog_load(c, cur, &err)) {
        tsr_error_log("%s: operations: %s", data, err.msg);
        return -1;
    }
    return 0;
}

/* Roles of --auth-tokens (levels 1, 2 of rpc.h "authorization"). */
static const char *const roles[] = {"query", "admin"};
#define ROLE_QUERY 1

/* Loads --auth-tokens: logs the reason and returns NULL when the file is bad. */
static tsr_rpc_tokens *load_tokens(const char *path)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_tokens *t = NULL;
    if (tsr_rpc_tokens_load(path, roles, 2, &t, &err) != 0) {
        tsr_error_log("--auth-tokens: %s", err.msg);
        return NULL;
    }
    tsr_info("--auth-tokens %s: %zu query and %zu admin token(s)", path,
             tsr_rpc_tokens_count(t, 1), tsr_rpc_tokens_count(t, 2));
    return t;
}

static void log_security(const char *auth_tokens, int insecure, char **allowed, size_t n)
{
    if (!auth_tokens)
        tsr_warn("no --auth-tokens: serving WITHOUT authentication (%s)",
                 insecure ? "--insecure-no-auth" : "allowed on a loopback address only");
    if (n == 0)
        tsr_info("no --batch-root-allow: UpdateIndex refuses every batch_root");
    for (size_t i = 0; i < n; i++)
        tsr_info("batch roots allowed under %s", allowed[i]);
}

static void free_security(char **allowed, tsr_cmdline_list *allow, char *peer_token)
{
    for (size_t i = 0; allowed && i < allow->n; i++)
        free(allowed[i]);
    free(allowed);
    tsr_cmdline_list_free(allow);
    if (peer_token) {
        explicit_bzero(peer_token, strlen(peer_token));
        free(peer_token);
    }
}

/* The authentication flags go together; protected mode (Redis's model): without tokens,
 * only a loopback address is served. Reads --peer-token-file into *peer_token. Returns 0
 * or -1 (logged). */
static int check_auth_flags(const char *listen, const char *auth_tokens, int insecure,
                            const char *peer_token_file, char **peer_token)
{
    tsr_error err = TSR_ERROR_INIT;
    if (auth_tokens && insecure) {
        tsr_error_log("--auth-tokens and --insecure-no-auth exclude each other");
        return -1;
    }
    if (!auth_tokens && !insecure && !tsr_rpc_addr_is_loopback(listen)) {
        tsr_error_log("--listen %s is not a loopback address and no --auth-tokens FILE is "
                      "given: anyone who reaches the port could update or empty the index. "
                      "Give --auth-tokens FILE (docs/security.md), or --insecure-no-auth to "
                      "serve without authentication anyway", listen);
        return -1;
    }
    if (peer_token_file && tsr_rpc_token_read(peer_token_file, peer_token, &err) != 0) {
        tsr_error_log("--peer-token-file: %s", err.msg);
        return -1;
    }
    return 0;
}

/* Waits for SIGINT/SIGTERM (returned); each SIGHUP meanwhile re-reads --auth-tokens, and a
 * bad file keeps the tokens loaded before. */
static int wait_stop(tsr_rpc_server *srv, const char *auth_tokens)
{
    int sig;
    while ((sig = tsr_cmdline_stop_wait()) == SIGHUP) {
        tsr_rpc_tokens *t;
        if (!auth_tokens)
            tsr_info("SIGHUP: no --auth-tokens file to re-read");
        else if ((t = load_tokens(auth_tokens)) != NULL)
            tsr_rpc_server_set_tokens(srv, t);
        else
            tsr_error_log("SIGHUP: --auth-tokens %s is bad; keeping the tokens loaded before",
                          auth_tokens);
    }
    return sig;
}

/* --batch-root-allow: each folder resolved (it must exist). Returns 0 or -1 (logged). */
static int resolve_allowed(const tsr_cmdline_list *l, char ***out)
{
    *out = tsr_xcalloc(l->n + 1, sizeof **out);
    for (size_t i = 0; i < l->n; i++) {
        char *rp = realpath(l->v[i], NULL);
        struct stat st;
        if (!rp || stat(rp, &st) != 0 || !S_ISDIR(st.st_mode)) {
            tsr_error_log("--batch-root-allow %s: %s", l->v[i],
                          rp ? "not a folder" : strerror(errno));
            free(rp);
            return -1;
        }
        (*out)[i] = rp;
    }
    return 0;
}

/* Registers google.cloud.aiplatform.v1: MatchService's FindNeighbors and
 * ReadIndexDatapoints (role query); IndexService's GetIndex (query), UpdateIndex,
 * UpsertDatapoints and RemoveDatapoints (admin) with
 * google.longrunning.Operations/GetOperation (query); IndexService's other methods,
 * which answer UNIMPLEMENTED naming what Tessera serves instead (role admin, the default).
 * Returns 0 or a TSR code. */
static int add_vertex_v1_methods(tsr_rpc_server *srv, tsr__coord *c)
{
    static const char *const index_methods[] = {
        TSR_VERTEX_V1_INDEX_SVC "CreateIndex", TSR_VERTEX_V1_INDEX_SVC "ListIndexes",
        TSR_VERTEX_V1_INDEX_SVC "DeleteIndex"};
    if (tsr_rpc_server_add_typed(srv, tsr__vertex_v1_methods, tsr__vertex_v1_nmethods, c) ||
        tsr_rpc_server_set_role(srv, TSR_VERTEX_V1_SVC "FindNeighbors", ROLE_QUERY) ||
        tsr_rpc_server_set_role(srv, TSR_VERTEX_V1_SVC "ReadIndexDatapoints", ROLE_QUERY) ||
        tsr_rpc_server_add_typed(srv, tsr__vertex_v1_index_methods,
                                 tsr__vertex_v1_index_nmethods, c) ||
        tsr_rpc_server_set_role(srv, TSR_VERTEX_V1_INDEX_SVC "GetIndex", ROLE_QUERY) ||
        tsr_rpc_server_set_role(srv, TSR_LRO_SVC "GetOperation", ROLE_QUERY))
        return TSR_EINTERNAL;
    for (size_t i = 0; i < sizeof index_methods / sizeof index_methods[0]; i++)
        if (tsr_rpc_server_add_method(srv, index_methods[i], tsr__vertex_v1_rpc_unimplemented,
                                      (void *)(index_methods[i] + 1), 0))
            return TSR_EINTERNAL;
    return 0;
}

/* Registers the coordinator's methods on srv. Returns 0 or a TSR code. */
static int add_methods(tsr_rpc_server *srv, tsr__coord *c)
{
#define SVC "/tessera.v1.VectorSearch/"
    /* FindNeighbors fans out asynchronously (tsr_rpc_reply_fanout): it runs on the
     * polling thread and never blocks, so it is not TSR_RPC_LONG */
    if (tsr_rpc_server_add_method(srv, SVC "FindNeighbors", tsr__coord_rpc_find_neighbors, c,
                                  0) ||
        /* the typed ones (frontend/tessera_v1.c's table: flags, nesting checks) */
        tsr_rpc_server_add_typed(srv, tsr__tessera_v1_methods, tsr__tessera_v1_nmethods, c) ||
        tsr_rpc_server_add_typed(srv, tsr__vertex_methods, tsr__vertex_nmethods, c))
        return TSR_EINTERNAL;
    /* role query: the read side; every other method (UpdateIndex and later writes) needs
     * admin, the default of a method without a role */
    static const char *const query_methods[] = {
        SVC "FindNeighbors", SVC "ReadIndexDatapoints", SVC "GetIndexStats", SVC "GetOperation",
        TSR_VERTEX_SVC "Match", TSR_VERTEX_SVC "BatchMatch",
        TSR_VERTEX_SVC "BatchGetEmbeddings"};
    for (size_t i = 0; i < sizeof query_methods / sizeof query_methods[0]; i++)
        if (tsr_rpc_server_set_role(srv, query_methods[i], ROLE_QUERY))
            return TSR_EINTERNAL;
    /* IndexDatapoint.embedding_metadata is a google.protobuf.Struct (recursive); the typed
     * methods' nesting checks are found from their descriptors */
    if (tsr_rpc_server_set_request_type(srv, SVC "FindNeighbors",
                                        &tessera__v1__find_neighbors_request__descriptor) ||
        tsr_rpc_server_set_request_type(srv, SVC "UpsertDatapoints",
                                        &tessera__v1__upsert_datapoints_request__descriptor))
        return TSR_EINTERNAL;
#undef SVC
    return add_vertex_v1_methods(srv, c);
}

/* Creates and starts the server with the coordinator's methods and the token set t (the
 * server takes it, also on failure: NULL = none). Returns it, or NULL (logged). */
static tsr_rpc_server *start_server(tsr__coord *c, const tsr_rpc_server_opts *opts,
                                    tsr_rpc_tokens *t)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts o1 = *opts, *o = &o1;
    o1.wrong_port_hint = "this port is the tessera coordinator (tessera.v1.VectorSearch, the "
                         "Vertex MatchService); tessera.v1.Shard is served by each "
                         "tessera-shard on its own port (`tessera stats` lists them)";
    tsr_rpc_server *srv = tsr_rpc_server_create(o, &err);
    if (!srv) {
        tsr_error_log("cannot listen on %s: %s", o->listen, err.msg);
        tsr_rpc_tokens_free(t);
        return NULL;
    }
    tsr_rpc_server_set_tokens(srv, t);
    tsr__coalesce_init(c);
    atomic_store(&c->srv, srv); /* the coalescer's queues (coalesce.c) */
    if (add_methods(srv, c) || tsr_rpc_server_start(srv, &err)) {
        tsr_error_log("cannot start the server: %s", err.msg);
        atomic_store(&c->srv, NULL);
        tsr_rpc_server_destroy(srv);
        tsr__coalesce_close(c);
        return NULL;
    }
    tsr_rpc_server_set_health(srv, "tessera.v1.VectorSearch", TSR_RPC_HEALTH_SERVING);
    tsr_rpc_server_set_health(srv, "google.cloud.aiplatform.container.v1.MatchService",
                              TSR_RPC_HEALTH_SERVING);
    tsr_rpc_server_set_health(srv, "google.cloud.aiplatform.v1.MatchService",
                              TSR_RPC_HEALTH_SERVING);
    return srv;
}

/* The coordinator's state before anything is loaded: locks, the reconcile condition
 * variable (on CLOCK_MONOTONIC), the flags that name its template and deployed index. */
static tsr__coord *coord_new(const char *tmpl, const char *deployed)
{
    tsr__coord *c = tsr_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->snap_mu, NULL);
    pthread_mutex_init(&c->update_mu, NULL);
    pthread_mutex_init(&c->op_mu, NULL);
    pthread_mutex_init(&c->rec_mu, NULL);
    pthread_mutex_init(&c->lead.mu, NULL);
    pthread_mutex_init(&c->lead.follow_mu, NULL);
    pthread_mutex_init(&c->ri_mu, NULL);
    pthread_cond_init(&c->ri_cv, NULL);
    tsr_clock_cond_init(&c->lead.cv);
    tsr_clock_cond_init(&c->rec_cv); /* reconcile sleeps on CLOCK_MONOTONIC */
    c->template_path = tmpl;
    c->deployed_index_id = deployed;
    return c;
}

/* Starts the fold and reconcile threads (a failure is logged: the coordinator serves
 * without them). Returns 1 when reconcile runs. */
static int start_background(tsr__coord *c)
{
    if (tsr__coord_fold_start(c) != 0)
        tsr_error_log("cannot start the fold thread: streamed writes are folded only by batch "
                      "updates");
    if (tsr__coord_reconcile_start(c) == 0)
        return 1;
    tsr_error_log("cannot start the reconcile thread: shards are not repaired and old "
                  "versions are not released until a restart");
    return 0;
}

/* How long a stop waits for a running update before cancelling its shard calls. */
#define UPDATE_STOP_GRACE_S 5

/* pthread_join with a bound: 0 when t ended (joined) within secs, else nonzero (t runs
 * on, not joined). */
static int join_within(pthread_t t, int secs)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += secs;
    return pthread_timedjoin_np(t, NULL, &until);
}

/* Stops what runs (a running update is joined — its shard calls cancelled when it has not
 * ended within UPDATE_STOP_GRACE_S —, then the stream writer, reconcile (client calls
 * cancelled from there on), the metrics listener and the server) and frees the
 * coordinator; every argument may be unset (NULL / 0). */
static void coord_close(tsr__coord *c, int rec_started, tsr_metrics_http *mh,
                        tsr_rpc_server *srv)
{
    pthread_mutex_lock(&c->op_mu);
    c->closing = 1;
    pthread_mutex_unlock(&c->op_mu);
    tsr__leader_stop(c); /* first: the lease is revoked, another leader takes over */
    tsr__coord_fold_stop(c); /* before the join: it may start an update */
    pthread_mutex_lock(&c->op_mu);
    int live = c->upd_thread_live;
    pthread_mutex_unlock(&c->op_mu);
    if (live && join_within(c->upd_thread, UPDATE_STOP_GRACE_S) != 0) {
        /* a Stage or Prepare of a large version may take minutes: its calls are cancelled,
         * the update fails before its commit point (or, after it, leaves Commits to
         * reconcile), and the next start settles the shards as after a kill -9
         * (docs/coordinator.md "Reconciliation and crashes") */
        tsr_warn("stopping: the running update did not end within %d s; cancelling its "
                 "shard calls", UPDATE_STOP_GRACE_S);
        tsr_rpc_client_shutdown();
        pthread_join(c->upd_thread, NULL);
    }
    tsr__stream_stop(c); /* queued writes fail UNAVAILABLE; the writer is joined */
    tsr_rpc_client_shutdown(); /* reconcile may be in a long call (a re-seed's copy) */
    if (rec_started)
        tsr__coord_reconcile_stop(c);
    tsr_metrics_http_destroy(mh);
    tsr_rpc_server_destroy(srv);
    atomic_store(&c->srv, NULL);
    tsr__coalesce_close(c);
    tsr__coord_channels_close(c);
    tsr__stream_close(c);
    tsr__snap_unref(c->snap);
    tsr__coord_ops_close(c);
    tsr_store_destroy(c->store);
    tsr__meta_close(c->meta);
    tsr__coord_config_close(&c->cfg);
    free(c);
}

int main(int argc, char **argv)
{
    tsr_server_flags sf;
    const char *config = NULL, *tmpl = NULL, *deployed = NULL;
    const char *sh_ca = NULL, *sh_cert = NULL, *sh_key = NULL, *sh_name = NULL;
    const char *auth_tokens = NULL;
    tsr_cmdline_list allow = {0};
    char **allowed = NULL;
    char *peer_token = NULL;
    tsr_metrics_http *mh = NULL;
    int ec;
    etcd_args ea = {NULL, NULL, 5, 300, NULL, NULL, NULL, NULL};
    char advertise[300]; /* the leader thread borrows it until coord_close */
    tsr_cmdline_stop_init(); /* first: a SIGTERM while loading still stops cleanly */
    tsr_log_set_program("tessera-coordinator");
    tsr_server_flags_init(&sf, 8);
    const tsr_cmdline_opt opts[] = { /* besides the flags every server takes */
        {"--config", TSR_CMDLINE_STR, &config, 0, 0, 1},
        {"--template", TSR_CMDLINE_STR, &tmpl, 0, 0, 0},
        {"--deployed-index-id", TSR_CMDLINE_STR, &deployed, 0, 0, 0},
        {"--shard-tls-ca", TSR_CMDLINE_STR, &sh_ca, 0, 0, 0},
        {"--shard-tls-cert", TSR_CMDLINE_STR, &sh_cert, 0, 0, 0},
        {"--shard-tls-key", TSR_CMDLINE_STR, &sh_key, 0, 0, 0},
        {"--shard-tls-server-name", TSR_CMDLINE_STR, &sh_name, 0, 0, 0},
        {"--auth-tokens", TSR_CMDLINE_STR, &auth_tokens, 0, 0, 0},
        {"--batch-root-allow", TSR_CMDLINE_LIST, &allow, 0, 0, 0},
        {"--etcd", TSR_CMDLINE_STR, &ea.endpoints, 0, 0, 0},
        {"--etcd-prefix", TSR_CMDLINE_STR, &ea.prefix, 0, 0, 0},
        {"--etcd-ttl", TSR_CMDLINE_INT, &ea.ttl, 2, 600, 0},
        {"--etcd-compact", TSR_CMDLINE_INT, &ea.compact, 0, 86400, 0},
        {"--etcd-ca", TSR_CMDLINE_STR, &ea.ca, 0, 0, 0},
        {"--etcd-cert", TSR_CMDLINE_STR, &ea.cert, 0, 0, 0},
        {"--etcd-key", TSR_CMDLINE_STR, &ea.key, 0, 0, 0},
        {"--advertise", TSR_CMDLINE_STR, &ea.advertise, 0, 0, 0},
    };
    if (tsr_server_flags_parse(&sf, "tessera-coordinator", argc, argv, opts,
                               sizeof opts / sizeof opts[0], usage, &ec))
        return ec;
    tsr_cmdline_hup_init(); /* SIGHUP re-reads --auth-tokens instead of killing us */
    tsr_error err = TSR_ERROR_INIT;
    tsr_cmdline_tls shtls = {sh_cert, "--shard-tls-cert", sh_key, "--shard-tls-key", sh_ca,
                             "--shard-tls-ca"};
    if (tsr_server_flags_check_tls(&sf, &err) != 0 ||
        tsr_cmdline_check_tls(&shtls, 1, &err) != 0) {
        tsr_error_log("%s", err.msg);
        return 2;
    }
    if (sh_name && !sh_ca) {
        tsr_error_log("--shard-tls-server-name needs --shard-tls-ca");
        tsr_cmdline_list_free(&allow);
        return 2;
    }
    if (check_auth_flags(sf.listen, auth_tokens, sf.insecure, sf.peer_token_file,
                         &peer_token) != 0) {
        tsr_cmdline_list_free(&allow);
        return 2;
    }
    /* coordinator -> shard channels (borrowed strings from argv). Their max message stays
     * the default: a shard's reply carries re-rank candidates and can be larger than the
     * client's reply, and a refused shard reply would surface as an unavailable shard. */
    tsr_rpc_client_opts shard_opts;
    client_opts(&shard_opts, sh_ca, sh_cert, sh_key, sh_name, peer_token);

    int code = 1;
    tsr__coord *c = coord_new(tmpl, deployed);
    tsr_rpc_server *srv = NULL;
    int rec_started = 0;
    tsr_rpc_tokens *tokens = NULL;
    if (resolve_allowed(&allow, &allowed) != 0 ||
        (auth_tokens && !(tokens = load_tokens(auth_tokens)))) {
        code = 2;
        goto out;
    }
    c->batch_allow = (const char *const *)allowed;
    c->nbatch_allow = allow.n;
    if (tsr__coord_config_load(config, &c->cfg, &err)) {
        tsr_error_log("config: %s", err.msg);
        code = 2;
        goto out;
    }
    c->shard_opts = shard_opts; /* a directory listed from the shards at start (dirshard.h) */
    if (load_all(c, &ea, sf.data, &code))
        goto out;
    if (tsr__coord_channels_open(c, &shard_opts, &err)) {
        tsr_error_log("%s", err.msg);
        goto out;
    }
    if (tsr__stream_start(c) && (tsr_error_log("cannot start the stream writer thread"), 1))
        goto out;
    tsr__coord_metrics_register(c);
    tsr_rpc_server_opts o;
    tsr_server_flags_server_opts(&sf, &o);
    /* One queue with one polling thread by default: FindNeighbors never blocks
     * (asynchronous fan-out), and every further polling thread costs thread wake-ups on
     * each event (docs/performance.md "End to end"); the other fan-outs are TSR_RPC_LONG
     * and run on the workers. */
    o.cqs = sf.threads ? sf.threads : 1;
    o.pollers = 1;
    srv = start_server(c, &o, tokens); /* it owns the tokens now */
    tokens = NULL;
    if (!srv)
        goto out;
    if (sf.metrics_listen != NULL &&
        (mh = tsr_metrics_http_start(sf.metrics_listen, &err)) == NULL) {
        tsr_error_log("cannot serve metrics on %s: %s", sf.metrics_listen, err.msg);
        goto out;
    }
    if (ea.endpoints && (code = start_leader(c, &ea, sf.listen, tsr_rpc_server_port(srv),
                                             advertise, sizeof advertise)) != 0)
        goto out;
    code = 1;
    rec_started = start_background(c);
    /* the server is live: an UpdateIndex may already swap c->snap, so read it through
     * snap_mu and a reference (a bare c->snap->version races with the swap and can read
     * the freed snapshot) */
    tsr__snap *sn = tsr__coord_snap_get(c);
    tsr_info("listening on %s (port %d) %s, data %s, %zu shards%s, version %llu", sf.listen,
             tsr_rpc_server_port(srv),
             sf.tls_ca ? "mutual TLS" : sf.tls_cert ? "TLS" : "plaintext", sf.data,
             c->cfg.nshards,
             sh_ca ? (sh_cert ? " over mutual TLS" : " over TLS") : "",
             (unsigned long long)sn->version);
    tsr__snap_unref(sn);
    log_security(auth_tokens, sf.insecure, allowed, allow.n);
    int sig = wait_stop(srv, auth_tokens);
    tsr_info("%s: shutting down", tsr_cmdline_signame(sig));
    code = 0;
out:
    coord_close(c, rec_started, mh, srv);
    tsr_rpc_tokens_free(tokens);
    free_security(allowed, &allow, peer_token);
    return code;
}
