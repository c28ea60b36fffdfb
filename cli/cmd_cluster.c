/*
 * cmd_cluster — `tessera cluster up`: a local cluster supervisor on libuv.
 *
 * It starts one tessera-coordinator and S tessera-shard processes on loopback (uv_spawn),
 * each with its own data directory and log file under --data, restarts a process that
 * exits unexpectedly (with a short backoff, so a crash loop does not spin), and on SIGINT
 * or SIGTERM stops every child with SIGTERM (SIGKILL after a grace period) and exits.
 *
 * DESIGN: everything runs on the one libuv loop thread (process handles, timers, signal
 * handles); there is no other thread, hence no locking. Each child is a `child` struct
 * owned by the supervisor for the whole run.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "cli.h"
#include "core/cmdline.h"
#include "core/mem.h"

#define PROG "tessera cluster up"

enum { MAX_SHARDS = 64, STOP_GRACE_MS = 5000 };

typedef struct child {
    const char *name;   /* "coordinator", "shard-0", ... (owned by the supervisor) */
    char **args;        /* argv for uv_spawn, NULL-terminated (owned) */
    char *log_path;     /* owned */
    uv_process_t proc;
    uv_timer_t restart_timer;
    int running;
    int restarts;
    uint64_t started_ms;
} child;

typedef struct supervisor {
    uv_loop_t *loop;
    child kids[MAX_SHARDS + 1];
    int nkids;
    int stopping;
    int alive;
    uv_signal_t sigint, sigterm;
    uv_timer_t kill_timer;
} supervisor;

static supervisor sup;

static void start_child(child *c);

static void on_restart_timer(uv_timer_t *t)
{
    child *c = t->data;
    if (!sup.stopping)
        start_child(c);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
    child *c = p->data;
    c->running = 0;
    sup.alive--;
    uv_close((uv_handle_t *)p, NULL);
    if (sup.stopping) {
        fprintf(stderr, PROG ": %s stopped\n", c->name);
        if (sup.alive == 0) {
            uv_timer_stop(&sup.kill_timer);
            uv_stop(sup.loop);
        }
        return;
    }
    /* Unexpected exit: restart, sooner if it had run for a while. */
    uint64_t ran = uv_now(sup.loop) - c->started_ms;
    uint64_t delay = ran > 10000 ? 200 : (uint64_t)(500 * (c->restarts < 8 ? c->restarts + 1 : 8));
    fprintf(stderr, PROG ": %s exited (status %lld, signal %d); restarting in %llu ms (log %s)\n",
            c->name, (long long)status, term_signal, (unsigned long long)delay, c->log_path);
    c->restarts++;
    uv_timer_start(&c->restart_timer, on_restart_timer, delay, 0);
}

static void start_child(child *c)
{
    int fd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, PROG ": %s: cannot open log %s: %s\n", c->name, c->log_path,
                strerror(errno));
        return;
    }
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = fd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = fd;
    uv_process_options_t o;
    memset(&o, 0, sizeof o);
    o.file = c->args[0];
    o.args = c->args;
    o.exit_cb = on_exit_cb;
    o.stdio = stdio;
    o.stdio_count = 3;
    c->proc.data = c;
    int r = uv_spawn(sup.loop, &c->proc, &o);
    close(fd);
    if (r != 0) {
        fprintf(stderr, PROG ": cannot start %s (%s): %s\n", c->name, c->args[0], uv_strerror(r));
        c->restarts++;
        uv_timer_start(&c->restart_timer, on_restart_timer, 1000, 0);
        return;
    }
    c->running = 1;
    c->started_ms = uv_now(sup.loop);
    sup.alive++;
}

static void on_kill_timer(uv_timer_t *t)
{
    (void)t;
    for (int i = 0; i < sup.nkids; i++)
        if (sup.kids[i].running) {
            fprintf(stderr, PROG ": %s did not stop in %d ms; killing\n", sup.kids[i].name,
                    STOP_GRACE_MS);
            uv_process_kill(&sup.kids[i].proc, SIGKILL);
        }
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    if (sup.stopping)
        return;
    sup.stopping = 1;
    fprintf(stderr, PROG ": signal %d, stopping %d processes\n", signum, sup.alive);
    for (int i = 0; i < sup.nkids; i++) {
        uv_timer_stop(&sup.kids[i].restart_timer);
        if (sup.kids[i].running)
            uv_process_kill(&sup.kids[i].proc, SIGTERM);
    }
    if (sup.alive == 0)
        uv_stop(sup.loop);
    else
        uv_timer_start(&sup.kill_timer, on_kill_timer, STOP_GRACE_MS, 0);
}

enum { MAX_ARGS = 64, MAX_ALLOW = 8 };

/* Appends the NULL-terminated strings to the NULL-terminated argv v (MAX_ARGS slots). */
static void argv_add(char **v, ...)
{
    int n = 0;
    while (v[n])
        n++;
    va_list ap;
    va_start(ap, v);
    for (const char *s = va_arg(ap, const char *); s != NULL && n < MAX_ARGS - 1;
         s = va_arg(ap, const char *))
        v[n++] = tsr_xstrdup(s);
    va_end(ap);
}

static char **argv_new(void)
{
    return tsr_xcalloc(MAX_ARGS, sizeof(char *));
}

/* TLS pass-through: the same server certificate on every port, the CA to verify it. */
typedef struct {
    const char *cert, *key, *ca, *name;
    int mtls;
} cluster_tls;

static void add_shard_tls(char **v, const cluster_tls *t)
{
    if (!t->cert)
        return;
    argv_add(v, "--tls-cert", t->cert, "--tls-key", t->key, (char *)NULL);
    if (t->mtls)
        argv_add(v, "--tls-client-ca", t->ca, (char *)NULL);
}

static void add_coord_tls(char **v, const cluster_tls *t)
{
    if (!t->cert)
        return;
    argv_add(v, "--tls-cert", t->cert, "--tls-key", t->key, "--shard-tls-ca", t->ca,
             (char *)NULL);
    if (t->name)
        argv_add(v, "--shard-tls-server-name", t->name, (char *)NULL);
    if (t->mtls)
        argv_add(v, "--tls-client-ca", t->ca, "--shard-tls-cert", t->cert, "--shard-tls-key",
                 t->key, (char *)NULL);
}

/* Absolute path of a file flag (the children run with the same cwd, but logs and ps
 * output are clearer with absolute paths). Returns a new string or NULL (errno set). */
static char *abs_path(const char *p)
{
    char buf[PATH_MAX];
    return realpath(p, buf) ? tsr_xstrdup(buf) : NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera cluster up --data DIR [--shards S] [--port P] [--config FILE]\n"
            "                          [--dimensions D --distance M --nlist N --pq-m M --nprobe P]\n"
            "  Starts a coordinator on 127.0.0.1:P (default 7000) and S shards (default 4) on\n"
            "  ports P+1..P+S, each with its data and log under DIR; restarts a process that\n"
            "  dies; Ctrl-C (SIGINT) or SIGTERM stops them all.\n"
            "  Without --config, DIR/coordinator.json is written from the flags (defaults:\n"
            "  --dimensions 64 --distance SQUARED_L2 --nlist 64 --pq-m 16 --nprobe 8); an existing\n"
            "  DIR/coordinator.json is reused as is.\n"
            "  TLS (docs/operations.md): --tls-cert FILE --tls-key FILE --tls-ca FILE makes every\n"
            "  port TLS-only with that certificate (it must name 127.0.0.1 or the name given with\n"
            "  --tls-server-name); the coordinator verifies the shards with --tls-ca. --mtls also\n"
            "  requires client certificates signed by --tls-ca on every port (the coordinator\n"
            "  presents the same certificate to the shards: it needs clientAuth usage or none).\n"
            "  Security (docs/security.md): --auth-tokens FILE hands the token file to the\n"
            "  coordinator (clients then need --token-file); batch roots are accepted inside DIR\n"
            "  and inside each --batch-root-allow FOLDER (repeatable).\n"
            "  Ranges: --shards 1..64, --port 1..65535 (P+S <= 65535), --dimensions 1..65536,\n"
            "  --nlist 1..1048576, --pq-m 1..65536, --nprobe 1..1048576.\n"
            "Exit status: 0 after SIGINT or SIGTERM stopped the cluster, 1 when it cannot start\n"
            "(data directory, config file), 2 on usage errors (flags, TLS files).\n");
}

static int write_default_config(const char *path, int port, int shards, int dims,
                                const char *distance, int nlist, int pq_m, int nprobe)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"dimensions\": %d,\n  \"distance\": \"%s\",\n  \"nlist\": %d,\n"
               "  \"pq_m\": %d,\n  \"pq_nbits\": 8,\n  \"nprobe\": %d,\n  \"shards\": [",
            dims, distance, nlist, pq_m, nprobe);
    for (int i = 0; i < shards; i++)
        fprintf(f, "%s\"127.0.0.1:%d\"", i ? ", " : "", port + 1 + i);
    fprintf(f, "]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* The coordinator's --auth-tokens and --batch-root-allow: DIR itself and the folders
 * given, absolute. Returns 0 or 2 (a usage error, printed). */
static int add_coord_security(char **v, const char *data, const char *tokens,
                              const tsr_cmdline_list *allow)
{
    if (allow->n > MAX_ALLOW) {
        fprintf(stderr, PROG ": --batch-root-allow: at most %d folders\n", MAX_ALLOW);
        return 2;
    }
    char *p = abs_path(data);
    if (!p) {
        fprintf(stderr, PROG ": %s: %s\n", data, strerror(errno));
        return 2;
    }
    argv_add(v, "--batch-root-allow", p, (char *)NULL);
    free(p);
    for (size_t i = 0; i < allow->n; i++) {
        if (!(p = abs_path(allow->v[i]))) {
            fprintf(stderr, PROG ": --batch-root-allow %s: %s\n", allow->v[i], strerror(errno));
            return 2;
        }
        argv_add(v, "--batch-root-allow", p, (char *)NULL);
        free(p);
    }
    if (tokens) {
        if (!(p = abs_path(tokens))) {
            fprintf(stderr, PROG ": --auth-tokens %s: %s\n", tokens, strerror(errno));
            return 2;
        }
        argv_add(v, "--auth-tokens", p, (char *)NULL);
        free(p);
    }
    return 0;
}

int tsr_cmd_cluster_up(int argc, char **argv)
{
    cluster_tls tls = {0};
    const char *auth_tokens = NULL;
    tsr_cmdline_list allow = {0};
    const char *data = NULL, *config = NULL, *distance = "SQUARED_L2";
    int shards = 4, port = 7000, dims = 64, nlist = 64, pq_m = 16, nprobe = 8;
    const tsr_cmdline_opt opts[] = {
        {"--data", TSR_CMDLINE_STR, &data, 0, 0, 1},
        {"--shards", TSR_CMDLINE_INT, &shards, 1, MAX_SHARDS, 0},
        {"--port", TSR_CMDLINE_INT, &port, 1, 65535, 0},
        {"--config", TSR_CMDLINE_STR, &config, 0, 0, 0},
        {"--dimensions", TSR_CMDLINE_INT, &dims, 1, 65536, 0},
        {"--distance", TSR_CMDLINE_STR, &distance, 0, 0, 0},
        {"--nlist", TSR_CMDLINE_INT, &nlist, 1, 1 << 20, 0},
        {"--pq-m", TSR_CMDLINE_INT, &pq_m, 1, 65536, 0},
        {"--nprobe", TSR_CMDLINE_INT, &nprobe, 1, 1 << 20, 0},
        {"--tls-cert", TSR_CMDLINE_STR, &tls.cert, 0, 0, 0},
        {"--tls-key", TSR_CMDLINE_STR, &tls.key, 0, 0, 0},
        {"--tls-ca", TSR_CMDLINE_STR, &tls.ca, 0, 0, 0},
        {"--tls-server-name", TSR_CMDLINE_STR, &tls.name, 0, 0, 0},
        {"--mtls", TSR_CMDLINE_FLAG, &tls.mtls, 0, 0, 0},
        {"--auth-tokens", TSR_CMDLINE_STR, &auth_tokens, 0, 0, 0},
        {"--batch-root-allow", TSR_CMDLINE_LIST, &allow, 0, 0, 0},
    };
    const tsr_cmdline_spec spec = {PROG, opts, sizeof opts / sizeof opts[0], usage, 0, 1};
    int code;
    if (tsr_cmdline_parse_spec(&spec, argc, argv, NULL, &code))
        return code;
    if (port + shards > 65535) {
        fprintf(stderr, PROG ": --port %d with --shards %d: the shard ports pass 65535\n", port,
                shards);
        return 2;
    }
    if ((tls.cert || tls.key || tls.ca || tls.name || tls.mtls) &&
        !(tls.cert && tls.key && tls.ca)) {
        fprintf(stderr, PROG ": TLS needs all of --tls-cert, --tls-key and --tls-ca\n");
        return 2;
    }
    char *tls_paths[3] = {NULL, NULL, NULL};
    if (tls.cert) {
        tsr_error err = TSR_ERROR_INIT;
        tsr_cmdline_tls chk = {tls.cert, "--tls-cert", tls.key, "--tls-key", tls.ca, "--tls-ca"};
        if (tsr_cmdline_check_tls(&chk, 1, &err) != 0) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            return 2;
        }
    }
    /* Binaries live beside this one (bin/tessera → bin/tessera-shard). */
    char bindir[PATH_MAX];
    size_t sz = sizeof bindir;
    if (uv_exepath(bindir, &sz) != 0) {
        fprintf(stderr, PROG ": cannot find my own path\n");
        return 1;
    }
    char *slash = strrchr(bindir, '/');
    if (slash)
        *slash = '\0';
    if (mkdir(data, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", data, strerror(errno));
        return 1;
    }
    char path[PATH_MAX + 64], exe[PATH_MAX + 32], addr[64];
    snprintf(path, sizeof path, "%s/logs", data);
    mkdir(path, 0755);
    char cfg[PATH_MAX + 32];
    if (config) {
        snprintf(cfg, sizeof cfg, "%s", config);
    } else {
        snprintf(cfg, sizeof cfg, "%s/coordinator.json", data);
        if (access(cfg, R_OK) != 0 &&
            write_default_config(cfg, port, shards, dims, distance, nlist, pq_m, nprobe) != 0)
            return 1;
    }
    if (tls.cert) { /* checked above; absolute, as the children may log them */
        tls_paths[0] = abs_path(tls.cert);
        tls_paths[1] = abs_path(tls.key);
        tls_paths[2] = abs_path(tls.ca);
        if (!tls_paths[0] || !tls_paths[1] || !tls_paths[2]) {
            fprintf(stderr, PROG ": TLS files: %s\n", strerror(errno));
            for (int i = 0; i < 3; i++)
                free(tls_paths[i]);
            return 2;
        }
        tls.cert = tls_paths[0];
        tls.key = tls_paths[1];
        tls.ca = tls_paths[2];
    }
    memset(&sup, 0, sizeof sup);
    sup.loop = uv_default_loop();
    for (int i = 0; i < shards; i++) {
        child *k = &sup.kids[sup.nkids++];
        char name[32], dir[PATH_MAX + 32];
        snprintf(name, sizeof name, "shard-%d", i);
        snprintf(dir, sizeof dir, "%s/%s", data, name);
        mkdir(dir, 0755);
        snprintf(exe, sizeof exe, "%s/tessera-shard", bindir);
        snprintf(addr, sizeof addr, "127.0.0.1:%d", port + 1 + i);
        k->name = tsr_xstrdup(name);
        k->args = argv_new();
        argv_add(k->args, exe, "--listen", addr, "--data", dir, (char *)NULL);
        add_shard_tls(k->args, &tls);
        snprintf(path, sizeof path, "%s/logs/%s.log", data, name);
        k->log_path = tsr_xstrdup(path);
    }
    {
        child *k = &sup.kids[sup.nkids++];
        char dir[PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%s/coordinator", data);
        mkdir(dir, 0755);
        snprintf(exe, sizeof exe, "%s/tessera-coordinator", bindir);
        snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
        k->name = "coordinator";
        k->args = argv_new();
        argv_add(k->args, exe, "--listen", addr, "--data", dir, "--config", cfg, (char *)NULL);
        add_coord_tls(k->args, &tls);
        int sc = add_coord_security(k->args, data, auth_tokens, &allow);
        tsr_cmdline_list_free(&allow);
        if (sc)
            return sc;
        snprintf(path, sizeof path, "%s/logs/coordinator.log", data);
        k->log_path = tsr_xstrdup(path);
    }
    for (int i = 0; i < sup.nkids; i++) {
        uv_timer_init(sup.loop, &sup.kids[i].restart_timer);
        sup.kids[i].restart_timer.data = &sup.kids[i];
        start_child(&sup.kids[i]);
    }
    uv_timer_init(sup.loop, &sup.kill_timer);
    uv_signal_init(sup.loop, &sup.sigint);
    uv_signal_init(sup.loop, &sup.sigterm);
    uv_signal_start(&sup.sigint, on_signal, SIGINT);
    uv_signal_start(&sup.sigterm, on_signal, SIGTERM);
    printf(PROG ": coordinator listening on 127.0.0.1:%d (config %s%s)\n", port, cfg,
           tls.cert ? (tls.mtls ? ", mutual TLS" : ", TLS") : "");
    for (int i = 0; i < shards; i++)
        printf(PROG ": shard-%d listening on 127.0.0.1:%d\n", i, port + 1 + i);
    printf(PROG ": logs in %s/logs; Ctrl-C stops the cluster\n", data);
    fflush(stdout);
    uv_run(sup.loop, UV_RUN_DEFAULT);
    /* Close the remaining handles so the loop can be closed cleanly. */
    for (int i = 0; i < sup.nkids; i++)
        uv_close((uv_handle_t *)&sup.kids[i].restart_timer, NULL);
    uv_close((uv_handle_t *)&sup.kill_timer, NULL);
    uv_close((uv_handle_t *)&sup.sigint, NULL);
    uv_close((uv_handle_t *)&sup.sigterm, NULL);
    uv_run(sup.loop, UV_RUN_DEFAULT);
    uv_loop_close(sup.loop);
    for (int i = 0; i < sup.nkids; i++) {
        for (char **a = sup.kids[i].args; *a; a++)
            free(*a);
        free(sup.kids[i].args);
        free(sup.kids[i].log_path);
        if (i < shards)
            free((char *)sup.kids[i].name);
    }
    for (int i = 0; i < 3; i++)
        free(tls_paths[i]);
    fprintf(stderr, PROG ": stopped\n");
    return 0;
}
