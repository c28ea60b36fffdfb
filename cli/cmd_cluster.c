/*
 * cmd_cluster — `tessera cluster up`: a local cluster supervisor on libuv.
 *
 * It starts S tessera-shard processes and then one tessera-coordinator on loopback
 * (uv_spawn), each with its own data directory and log file under --data. With
 * --etcd-local M it first starts an M-member etcd cluster (the etcd found in PATH or
 * /usr/bin/etcd; data under DIR/etcd-<j>) and --coordinators N coordinators, all with
 * --etcd on it (docs/ha.md): one leader, N-1 followers, each announced on stdout as
 * "cluster: coordinator-<i> listening on ADDR". Start-up is
 * checked, not assumed: before anything starts, every port must be free and no running
 * process may hold one of the data directories (cluster_check.c); "listening" is printed
 * only once every process answered grpc.health.v1 Check with SERVING (the shards first,
 * so the coordinator's first query finds them); a process that exits before it ever
 * served ends the run with status 1 and the tail of its log (a bind error, a data
 * directory in use, a bad config: restarting would loop forever). A process that served
 * once and then exits is restarted with a short backoff (so a crash loop does not spin).
 * On SIGINT or SIGTERM every child gets SIGTERM (SIGKILL after a grace period). Shard
 * groups added with `tessera cluster add-group` (DIR/groups.json, cluster_groups.c) start
 * with the shards; one added while it runs is started within GROUPS_POLL_MS.
 *
 * DESIGN: everything runs on the one libuv loop thread (process handles, timers, signal
 * handles; the start-up health checks are short blocking calls on that thread, each with
 * a deadline of HEALTH_CALL_MS); there is no other thread, hence no locking. Each child
 * is a `child` struct owned by the supervisor for the whole run.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "cli.h"
#include "core/cmdline.h"
#include "core/mem.h"
#include "net/rpc.h"

#define PROG "tessera cluster up"

enum {
    MAX_SHARDS = 64,
    MAX_COORDS = 9,
    MAX_ETCD = 9,
    STOP_GRACE_MS = 5000,
    HEALTH_POLL_MS = 200,   /* start-up: how often a starting process is asked */
    HEALTH_CALL_MS = 500,   /* deadline of one Health/Check */
    TAIL_LINES = 12,        /* lines of a failed process's log printed */
    GROUPS_POLL_MS = 500    /* how often DIR/groups.json is looked at once started */
};

typedef struct child {
    const char *name;   /* "coordinator", "shard-0", ... (owned by the supervisor) */
    char **args;        /* argv for uv_spawn, NULL-terminated (owned) */
    char *log_path;     /* owned */
    char *target;       /* owned: "127.0.0.1:PORT", asked for health */
    const char *service; /* health service name that says it serves */
    int plain;          /* no TLS on its port (etcd): health-checked without it */
    long log_off;       /* size of the log before this run: where its lines start */
    uv_process_t proc;
    uv_timer_t restart_timer;
    int running;
    int healthy;        /* answered SERVING once: from then on an exit means a restart */
    int launched;       /* start_child was called once */
    int restarts;
    int term_sent;      /* stopping: SIGTERM was sent */
    uint64_t started_ms;
} child;

typedef struct supervisor {
    uv_loop_t *loop;
    /* etcd members 0..netcd-1, then the shards, then the coordinators from first_coord */
    child kids[MAX_ETCD + MAX_SHARDS + TSR_CLUSTER_MAX_GROUPS + MAX_COORDS];
    int nkids, nshards, netcd, ncoords, first_coord;
    int stopping;
    int starting;       /* 1 until every process answered SERVING once */
    int exit_code;      /* 0, or 1 when the cluster could not start */
    int alive;
    uint64_t start_deadline_ms;
    tsr_rpc_client_opts health_opts, plain_opts;
    const char *cfg, *data, *mlisten, *tls_mode;
    uv_signal_t sigint, sigterm;
    uv_timer_t kill_timer, health_timer, groups_timer;
    const struct cluster_plan *plan; /* for the groups added while it runs */
    int metric_shards;               /* shards with a metrics port: the config's */
    struct timespec groups_mtime;    /* DIR/groups.json as last read */
    ino_t groups_ino;
} supervisor;

static supervisor sup;

static void start_child(child *c);
static void on_groups_timer(uv_timer_t *t);

static void on_restart_timer(uv_timer_t *t)
{
    child *c = t->data;
    if (!sup.stopping)
        start_child(c);
}

static void on_kill_timer(uv_timer_t *t)
{
    (void)t;
    for (int i = 0; i < sup.nkids; i++)
        if (sup.kids[i].running && sup.kids[i].term_sent) {
            fprintf(stderr, PROG ": %s did not stop within %d ms of SIGTERM; killing it "
                            "(SIGKILL; its log: %s)\n", sup.kids[i].name, STOP_GRACE_MS,
                    sup.kids[i].log_path);
            uv_process_kill(&sup.kids[i].proc, SIGKILL);
        }
}

/* SIGTERM to what may stop now, each given STOP_GRACE_MS (then SIGKILL): first the
 * shards and coordinators (the coordinators use etcd until they exit), then the etcd
 * members one at a time. An etcd leader on SIGTERM hands its leadership to a live member
 * first; members stopped all at once left the last leader handing over to a stopped one
 * and then in elections without a quorum until the grace period killed it. One at a
 * time, each hand-over finds its successor alive and the last member has no peer left to
 * wait for. */
static void stop_next(void)
{
    int others = 0, sent = 0;
    for (int i = sup.netcd; i < sup.nkids; i++) {
        child *c = &sup.kids[i];
        if (c->running && !c->term_sent) {
            uv_process_kill(&c->proc, SIGTERM);
            c->term_sent = sent = 1;
        }
        others += c->running;
    }
    for (int j = 0; j < sup.netcd && !others && !sent; j++) {
        child *c = &sup.kids[j];
        if (c->running && c->term_sent)
            return; /* wait for it */
        if (c->running) {
            uv_process_kill(&c->proc, SIGTERM);
            c->term_sent = sent = 1;
        }
    }
    if (sent)
        uv_timer_start(&sup.kill_timer, on_kill_timer, STOP_GRACE_MS, 0);
}

/* Stops every child (stop_next); the loop ends when the last one exited. */
static void stop_all(void)
{
    if (sup.stopping)
        return;
    sup.stopping = 1;
    uv_timer_stop(&sup.health_timer);
    uv_timer_stop(&sup.groups_timer);
    for (int i = 0; i < sup.nkids; i++)
        uv_timer_stop(&sup.kids[i].restart_timer);
    if (sup.alive == 0)
        uv_stop(sup.loop);
    else
        stop_next();
}

/* The cluster cannot start: say why (with what the process itself logged), stop the
 * others and end with exit status 1. */
static void start_failed(child *c, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s %s; the cluster is not started\n", c->name, why);
    fprintf(stderr, PROG ": last lines of %s:\n", c->log_path);
    tsr_cluster_print_log_tail(stderr, "  | ", c->log_path, c->log_off, TAIL_LINES);
    fflush(stderr);
    sup.exit_code = 1;
    stop_all();
}

/* "exited with status N" or "was killed by signal 9 (SIGKILL)", for the restart and
 * start-failure lines (libuv reports both numbers; only one of them means something). */
static const char *describe_exit(char *buf, size_t cap, int64_t status, int sig)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
        {SIGSEGV, "SIGSEGV"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
        {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}};
    if (sig == 0) {
        snprintf(buf, cap, "exited with status %lld", (long long)status);
        return buf;
    }
    const char *name = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig)
            name = names[i].name;
    if (name)
        snprintf(buf, cap, "was killed by signal %d (%s)", sig, name);
    else
        snprintf(buf, cap, "was killed by signal %d", sig);
    return buf;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
    char how[64];
    child *c = p->data;
    c->running = 0;
    sup.alive--;
    uv_close((uv_handle_t *)p, NULL);
    if (sup.stopping) {
        fprintf(stderr, PROG ": %s stopped\n", c->name);
        if (sup.alive == 0) {
            uv_timer_stop(&sup.kill_timer);
            uv_stop(sup.loop);
        } else {
            stop_next();
        }
        return;
    }
    if (!c->healthy) { /* bind error, data directory in use, bad config: no restart loop */
        start_failed(c, "%s during start-up", describe_exit(how, sizeof how, status, term_signal));
        return;
    }
    /* It served once: restart, sooner if it had run for a while. */
    uint64_t ran = uv_now(sup.loop) - c->started_ms;
    uint64_t delay = ran > 10000 ? 200 : (uint64_t)(500 * (c->restarts < 8 ? c->restarts + 1 : 8));
    fprintf(stderr, PROG ": %s %s; restarting in %llu ms (log %s)\n", c->name,
            describe_exit(how, sizeof how, status, term_signal), (unsigned long long)delay,
            c->log_path);
    c->restarts++;
    uv_timer_start(&c->restart_timer, on_restart_timer, delay, 0);
}

static void start_child(child *c)
{
    c->launched = 1;
    int fd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, PROG ": %s: cannot open log %s: %s\n", c->name, c->log_path,
                strerror(errno));
        if (!c->healthy) {
            sup.exit_code = 1;
            stop_all();
        }
        return;
    }
    if (!c->healthy)
        c->log_off = tsr_cluster_log_size(c->log_path);
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
        if (!c->healthy) {
            sup.exit_code = 1;
            stop_all();
            return;
        }
        c->restarts++;
        uv_timer_start(&c->restart_timer, on_restart_timer, 1000, 0);
        return;
    }
    c->running = 1;
    c->started_ms = uv_now(sup.loop);
    sup.alive++;
}

static void print_listening(void)
{
    child *co = &sup.kids[sup.first_coord];
    printf(PROG ": coordinator listening on %s (config %s%s)\n", co->target, sup.cfg,
           sup.tls_mode);
    if (sup.netcd > 0) { /* the high-availability layout (docs/ha.md) */
        for (int i = 0; i < sup.ncoords; i++)
            printf("cluster: %s listening on %s\n", co[i].name, co[i].target);
        for (int j = 0; j < sup.netcd; j++)
            printf("cluster: %s listening on %s (etcd client URL http://%s)\n",
                   sup.kids[j].name, sup.kids[j].target, sup.kids[j].target);
    }
    for (int i = sup.netcd; i < sup.netcd + sup.nshards; i++)
        printf(PROG ": %s listening on %s\n", sup.kids[i].name, sup.kids[i].target);
    if (sup.mlisten)
        printf(PROG ": metrics on %s (coordinator), the next ports for shard-0..%d\n",
               sup.mlisten, sup.metric_shards - 1);
    printf(PROG ": logs in %s/logs; Ctrl-C stops the cluster\n", sup.data);
    fflush(stdout);
}

/* Start-up: etcd and the shards first; once each answered SERVING, the coordinators (so
 * that their first query finds them); once they answered SERVING, "listening" is true. */
static void on_health_timer(uv_timer_t *t)
{
    (void)t;
    if (sup.stopping || !sup.starting)
        return;
    int backends_ready = 1, all_ready = 1;
    for (int i = 0; i < sup.nkids; i++) {
        child *c = &sup.kids[i];
        if (i >= sup.first_coord && !backends_ready)
            break;
        if (i >= sup.first_coord && !c->launched) {
            start_child(c);
            all_ready = 0;
            continue;
        }
        if (!c->healthy && c->running &&
            tsr_cluster_health(c->target, c->service,
                               c->plain ? &sup.plain_opts : &sup.health_opts, HEALTH_CALL_MS))
            c->healthy = 1;
        if (sup.stopping)
            return;
        if (i < sup.first_coord)
            backends_ready &= c->healthy;
        all_ready &= c->healthy;
    }
    if (backends_ready && all_ready) {
        sup.starting = 0;
        uv_timer_stop(&sup.health_timer);
        print_listening();
        uv_timer_start(&sup.groups_timer, on_groups_timer, 0, GROUPS_POLL_MS);
        return;
    }
    if (uv_now(sup.loop) > sup.start_deadline_ms) {
        for (int i = 0; i < sup.nkids; i++)
            if (!sup.kids[i].healthy) {
                start_failed(&sup.kids[i], "did not answer a health check within the start-up "
                                           "timeout (--start-timeout)");
                return;
            }
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    if (sup.stopping)
        return;
    fprintf(stderr, PROG ": signal %d, stopping %d processes\n", signum, sup.alive);
    stop_all();
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

/* The etcd members run as `tessera __cluster-child PPID ETCD ARGS...`, which leaves the
 * supervisor's process group and then execs etcd: a Ctrl-C in the terminal (SIGINT to the
 * whole foreground group) or a kill of the group then reaches the supervisor, the shards
 * and the coordinators but not etcd, which the supervisor stops one member at a time once
 * the coordinators exited (stop_next). PR_SET_PDEATHSIG (kept across execve) ends the
 * member when the supervisor dies without stopping it (kill -9). */
int tsr_cluster_exec_child(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    pid_t want = (pid_t)strtol(argv[1], NULL, 10);
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != want)
        return 1; /* the supervisor is gone already */
    execv(argv[2], argv + 2);
    fprintf(stderr, "tessera: cannot run %s: %s\n", argv[2], strerror(errno));
    return 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera cluster up --data DIR [--shards S] [--port P] [--config FILE]\n"
            "                          [--dimensions D --distance M --nlist N --pq-m M --nprobe P]\n"
            "                          [--metrics-listen HOST:PORT] [--start-timeout SECONDS]\n"
            "                          [--coordinators N --etcd-local M]\n"
            "  Starts S shards (default 4) on 127.0.0.1:P+1..P+S and, once they answer, a\n"
            "  coordinator on 127.0.0.1:P (default 7000), each with its data and log under DIR.\n"
            "  Before starting anything it checks that every port is free and that no running\n"
            "  process holds one of DIR's data directories (their LOCK files). \"listening\" is\n"
            "  printed once every process answered grpc.health.v1 Check with SERVING. A process\n"
            "  that exits before it ever served ends cluster up (status 1) with the last lines\n"
            "  of its log; one that served and then died is restarted (with a short backoff).\n"
            "  Ctrl-C (SIGINT) or SIGTERM stops them all.\n"
            "  Without --config, DIR/coordinator.json is written from the flags (defaults:\n"
            "  --dimensions 64 --distance SQUARED_L2 --nlist 64 --pq-m 16 --nprobe 8); an existing\n"
            "  DIR/coordinator.json is reused as is: a flag that contradicts it (or --config's\n"
            "  file), e.g. --dimensions 128 on a folder at 64, or other shard ports, stops the\n"
            "  start with both values (use another --data for a new index).\n"
            "  Shard groups added with `tessera cluster add-group --data DIR` (kept in\n"
            "  DIR/groups.json) start with the shards and are supervised like them.\n"
            "  --metrics-listen HOST:PORT  Prometheus /metrics: the coordinator on HOST:PORT,\n"
            "                  shard i on HOST:PORT+1+i (docs/operations.md \"Metrics\").\n"
            "  --start-timeout SECONDS  how long start-up may take, 1..86400 (default 120).\n"
            "  High availability (docs/ha.md): --etcd-local M starts an M-member etcd cluster\n"
            "  (etcd from PATH or /usr/bin/etcd; data in DIR/etcd-<j>) and --coordinators N\n"
            "  coordinators with --etcd on it: one leader takes the writes, all answer reads.\n"
            "  coordinator-0 is on P, coordinator-i (i >= 1) on P+S+i, etcd member j's client\n"
            "  and peer ports on P+S+N+2j and the next one; each announced on stdout as\n"
            "  \"cluster: coordinator-<i> listening on ADDR\". --coordinators > 1 needs\n"
            "  --etcd-local. Ranges: --coordinators 1..9, --etcd-local 1..9 (3 or 5 to survive\n"
            "  the loss of 1 or 2 members); env TSR_ETCD names another etcd executable.\n"
            "  TLS (docs/operations.md): --tls-cert FILE --tls-key FILE --tls-ca FILE makes every\n"
            "  port TLS-only with that certificate (it must name 127.0.0.1 or the name given with\n"
            "  --tls-server-name); the coordinator verifies the shards with --tls-ca. --mtls also\n"
            "  requires client certificates signed by --tls-ca on every port (the coordinator\n"
            "  presents the same certificate to the shards: it needs clientAuth usage or none).\n"
            "  Security (docs/security.md): --auth-tokens FILE hands the token file to the\n"
            "  coordinator (clients then need --token-file) and protects the shards too: they\n"
            "  accept only the coordinator, which sends them the peer token DIR/peer-token\n"
            "  (made on the first run, mode 0600); batch roots are accepted inside DIR\n"
            "  and inside each --batch-root-allow FOLDER (repeatable).\n"
            "  Ranges: --shards 1..64, --port 1..65535 (P+S <= 65535), --dimensions 1..65536,\n"
            "  --nlist 1..1048576, --pq-m 1..65536, --nprobe 1..1048576.\n"
            "Exit status: 0 after SIGINT or SIGTERM stopped the cluster, 1 when it cannot start\n"
            "(a port in use, a data directory in use, a process that failed at start-up, the\n"
            "config file), 2 on usage errors (flags, TLS files).\n");
}

/* --metrics-listen HOST:PORT → host (in buf) and port; 0, or -1 when malformed. */
static int split_host_port(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= hostlen)
        return -1;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 1 || p > 65535)
        return -1;
    const char *h = s, *he = colon;
    if (*h == '[' && he[-1] == ']') { /* [::1]:9100 */
        h++;
        he--;
    }
    snprintf(host, hostlen, "%.*s", (int)(he - h), h);
    *port = (int)p;
    return 0;
}

/* Every port the cluster will listen on must be free, and no process may hold one of the
 * data directories it will open: checked before anything starts (a second cluster on the
 * same ports or the same DIR must not start, nor write into the other's logs). Returns 0,
 * or 1 after printing what is in use. */
/* The role of port P+i: coordinator(-0), shard-k, coordinator-k, etcd-k (client/peer). */
static void port_role(int i, int shards, int coords, int netcd, char *buf, size_t cap)
{
    if (i == 0)
        snprintf(buf, cap, netcd ? "coordinator-0" : "coordinator");
    else if (i <= shards)
        snprintf(buf, cap, "shard-%d", i - 1);
    else if (i < shards + coords)
        snprintf(buf, cap, "coordinator-%d", i - shards);
    else
        snprintf(buf, cap, "etcd-%d %s", (i - shards - coords) / 2,
                 (i - shards - coords) % 2 ? "peer" : "client");
    (void)netcd;
}

static int preflight_groups(const char *data, const tsr_cluster_group *g, int n)
{
    char why[128], dir[PATH_MAX + 48];
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/%s", data, g[i].name);
        if (tsr_cluster_port_free("127.0.0.1", g[i].port, why, sizeof why) != 0) {
            fprintf(stderr, PROG ": port %d (%s, an added group of %s/groups.json) is in use: "
                            "%s\n", g[i].port, g[i].name, data, why);
            return 1;
        }
        if (tsr_cluster_dir_locked(dir)) {
            fprintf(stderr, PROG ": data directory %s is in use by another process (is a "
                            "cluster already running on --data %s?)\n", dir, data);
            return 1;
        }
    }
    return 0;
}

static int preflight(const char *data, int port, int shards, int coords, int netcd,
                     const char *mhost, int mport)
{
    char why[128], dir[PATH_MAX + 32];
    int last = shards + coords - 1 + 2 * netcd; /* ports P..P+last */
    int mlast = shards + coords - 1;            /* metrics: no etcd */
    for (int i = 0; i <= last; i++) {
        char role[48];
        port_role(i, shards, coords, netcd, role, sizeof role);
        if (tsr_cluster_port_free("127.0.0.1", port + i, why, sizeof why) != 0) {
            fprintf(stderr,
                    PROG ": port %d (%s) is in use: %s; the cluster needs 127.0.0.1:%d..%d "
                         "(pick another --port)\n",
                    port + i, role, why, port, port + last);
            return 1;
        }
        if (mhost && i <= mlast && tsr_cluster_port_free(mhost, mport + i, why, sizeof why)) {
            fprintf(stderr,
                    PROG ": metrics port %s:%d is in use: %s; --metrics-listen needs ports "
                         "%d..%d (pick another one)\n",
                    mhost, mport + i, why, mport, mport + mlast);
            return 1;
        }
    }
    for (int i = 0; i < shards + coords; i++) {
        if (i < shards)
            snprintf(dir, sizeof dir, "%s/shard-%d", data, i);
        else if (netcd)
            snprintf(dir, sizeof dir, "%s/coordinator-%d", data, i - shards);
        else
            snprintf(dir, sizeof dir, "%s/coordinator", data);
        if (tsr_cluster_dir_locked(dir)) {
            fprintf(stderr,
                    PROG ": data directory %s is in use by another process (its LOCK is held: "
                         "is a cluster already running on --data %s?); stop it or pick another "
                         "--data\n",
                    dir, data);
            return 1;
        }
    }
    return 0;
}

/* What a cluster is made of, from the flags. */
typedef struct cluster_plan {
    const char *data, *bindir, *cfg;
    int port, shards, coords, netcd;
    const char *etcd; /* the etcd executable when netcd > 0 */
    const char *mhost; /* NULL = no metrics */
    int mport;
    const cluster_tls *tls;
    char **coord_extra; /* --auth-tokens, --batch-root-allow for the coordinator */
    const char *peer_token; /* DIR/peer-token for the shards (with --auth-tokens), or NULL */
    const tsr_cluster_group *groups; /* added groups kept in DIR/groups.json */
    int ngroups;
} cluster_plan;

static void add_metrics(char **v, const cluster_plan *pl, int i)
{
    if (!pl->mhost)
        return;
    char m[300];
    snprintf(m, sizeof m, strchr(pl->mhost, ':') ? "[%s]:%d" : "%s:%d", pl->mhost, pl->mport + i);
    argv_add(v, "--metrics-listen", m, (char *)NULL);
}

/* The etcd members of --etcd-local: kids 0..netcd-1, client port P+S+N+2j, peer port
 * the next; data in DIR/etcd-<j> (a restarted member finds its data and rejoins). Their
 * client addresses go to endpoints (for the coordinators' --etcd). */
static void plan_etcd(const cluster_plan *pl, char *endpoints, size_t cap)
{
    char cluster[MAX_ETCD * 64] = "", item[64], dir[PATH_MAX + 32], curl[64], purl[64];
    int base = pl->port + pl->shards + pl->coords;
    endpoints[0] = '\0';
    for (int j = 0; j < pl->netcd; j++) {
        snprintf(item, sizeof item, "%setcd-%d=http://127.0.0.1:%d", j ? "," : "", j,
                 base + 2 * j + 1);
        strncat(cluster, item, sizeof cluster - strlen(cluster) - 1);
        snprintf(item, sizeof item, "%s127.0.0.1:%d", j ? "," : "", base + 2 * j);
        strncat(endpoints, item, cap - strlen(endpoints) - 1);
    }
    for (int j = 0; j < pl->netcd; j++) {
        child *k = &sup.kids[sup.nkids++];
        char name[32], path[PATH_MAX + 64];
        snprintf(name, sizeof name, "etcd-%d", j);
        snprintf(dir, sizeof dir, "%s/%s", pl->data, name);
        snprintf(curl, sizeof curl, "http://127.0.0.1:%d", base + 2 * j);
        snprintf(purl, sizeof purl, "http://127.0.0.1:%d", base + 2 * j + 1);
        k->name = tsr_xstrdup(name);
        k->target = tsr_xstrdup(curl + 7);
        k->service = "";
        k->plain = 1;
        k->args = argv_new();
        char exe[PATH_MAX + 32], ppid[24];
        snprintf(exe, sizeof exe, "%s/tessera", pl->bindir);
        snprintf(ppid, sizeof ppid, "%ld", (long)getpid());
        argv_add(k->args, exe, TSR_CLUSTER_CHILD_CMD, ppid, pl->etcd, "--name", name, "--data-dir", dir, "--listen-client-urls",
                 curl, "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                 "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                 "--initial-cluster-state", "new", "--initial-cluster-token", "tessera-local",
                 (char *)NULL);
        snprintf(path, sizeof path, "%s/logs/%s.log", pl->data, name);
        k->log_path = tsr_xstrdup(path);
        uv_timer_init(sup.loop, &k->restart_timer);
        k->restart_timer.data = k;
    }
    sup.netcd = pl->netcd;
}

/* A shard or coordinator child at sup.kids[sup.nkids] (its data in DIR/name, its log in
 * DIR/logs/name.log); coord: the coordinator index, or -1 for a shard; metrics: the offset
 * of its --metrics-listen port, or -1 for none. */
static child *plan_server(const cluster_plan *pl, const char *name, int port, int coord,
                          int metrics, const char *endpoints)
{
    char path[PATH_MAX + 64], exe[PATH_MAX + 32], addr[64], dir[PATH_MAX + 32];
    child *k = &sup.kids[sup.nkids++];
    snprintf(dir, sizeof dir, "%s/%s", pl->data, name);
    mkdir(dir, 0755);
    snprintf(exe, sizeof exe, "%s/%s", pl->bindir,
             coord >= 0 ? "tessera-coordinator" : "tessera-shard");
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    k->name = tsr_xstrdup(name);
    k->target = tsr_xstrdup(addr);
    k->service = coord >= 0 ? "tessera.v1.VectorSearch" : "tessera.v1.Shard";
    k->args = argv_new();
    argv_add(k->args, exe, "--listen", addr, "--data", dir, (char *)NULL);
    if (coord >= 0) {
        argv_add(k->args, "--config", pl->cfg, (char *)NULL);
        if (pl->netcd)
            argv_add(k->args, "--etcd", endpoints, "--advertise", addr, (char *)NULL);
        add_coord_tls(k->args, pl->tls);
        for (char **a = pl->coord_extra; *a; a++)
            argv_add(k->args, *a, (char *)NULL);
    } else {
        add_shard_tls(k->args, pl->tls);
        if (pl->peer_token)
            argv_add(k->args, "--peer-token-file", pl->peer_token, (char *)NULL);
    }
    if (metrics >= 0)
        add_metrics(k->args, pl, metrics);
    snprintf(path, sizeof path, "%s/logs/%s.log", pl->data, name);
    k->log_path = tsr_xstrdup(path);
    uv_timer_init(sup.loop, &k->restart_timer);
    k->restart_timer.data = k;
    return k;
}

/* Fills sup.kids: the etcd members, the shards and the groups of DIR/groups.json, then
 * the coordinators (they start once the others answer). */
static void plan_children(const cluster_plan *pl)
{
    char endpoints[MAX_ETCD * 32], name[32];
    plan_etcd(pl, endpoints, sizeof endpoints);
    for (int i = 0; i < pl->shards; i++) {
        snprintf(name, sizeof name, "shard-%d", i);
        plan_server(pl, name, pl->port + 1 + i, -1, 1 + i, endpoints);
    }
    for (int i = 0; i < pl->ngroups; i++) /* added groups: no metrics port */
        plan_server(pl, pl->groups[i].name, pl->groups[i].port, -1, -1, endpoints);
    for (int ci = 0; ci < pl->coords; ci++) {
        snprintf(name, sizeof name, pl->netcd ? "coordinator-%d" : "coordinator", ci);
        plan_server(pl, name, ci == 0 ? pl->port : pl->port + pl->shards + ci, ci,
                    ci ? pl->shards + ci : 0, endpoints);
    }
    sup.nshards = pl->shards + pl->ngroups;
    sup.ncoords = pl->coords;
    sup.first_coord = pl->netcd + pl->shards + pl->ngroups;
}

/* Every GROUPS_POLL_MS once started: a group that `tessera cluster add-group` wrote to
 * DIR/groups.json and that is not running yet is started (and from then on supervised
 * like the shards: restarted when it exits). */
static void on_groups_timer(uv_timer_t *t)
{
    (void)t;
    char path[PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/groups.json", sup.data);
    if (sup.stopping || stat(path, &st) != 0 ||
        (st.st_mtim.tv_sec == sup.groups_mtime.tv_sec &&
         st.st_mtim.tv_nsec == sup.groups_mtime.tv_nsec && st.st_ino == sup.groups_ino))
        return;
    sup.groups_mtime = st.st_mtim;
    sup.groups_ino = st.st_ino;
    tsr_cluster_group g[TSR_CLUSTER_MAX_GROUPS];
    int n = tsr_cluster_groups_read(sup.data, g, TSR_CLUSTER_MAX_GROUPS);
    for (int i = 0; i < n; i++) {
        int known = 0;
        for (int j = 0; j < sup.nkids && !known; j++)
            known = strcmp(sup.kids[j].name, g[i].name) == 0;
        if (known)
            continue;
        if (sup.nkids == (int)(sizeof sup.kids / sizeof sup.kids[0])) {
            fprintf(stderr, PROG ": %s: no room for %s\n", path, g[i].name);
            break;
        }
        child *k = plan_server(sup.plan, g[i].name, g[i].port, -1, -1, NULL);
        k->healthy = 1; /* `cluster add-group` checks that it answers; an exit restarts it */
        printf(PROG ": %s (an added group) starting on %s (log %s)\n", k->name, k->target,
               k->log_path);
        fflush(stdout);
        start_child(k);
    }
}

/* Runs the supervisor until the cluster stopped; returns the exit status. */
static int supervise(int start_timeout_s)
{
    uv_timer_init(sup.loop, &sup.kill_timer);
    uv_timer_init(sup.loop, &sup.health_timer);
    uv_timer_init(sup.loop, &sup.groups_timer);
    uv_signal_init(sup.loop, &sup.sigint);
    uv_signal_init(sup.loop, &sup.sigterm);
    uv_signal_start(&sup.sigint, on_signal, SIGINT);
    uv_signal_start(&sup.sigterm, on_signal, SIGTERM);
    sup.starting = 1;
    sup.start_deadline_ms = uv_now(sup.loop) + (uint64_t)start_timeout_s * 1000;
    if (sup.netcd)
        printf(PROG ": starting %d etcd members and %d shards, then %d coordinators (logs in "
               "%s/logs)\n", sup.netcd, sup.nshards, sup.ncoords, sup.data);
    else
        printf(PROG ": starting %d shards, then the coordinator (logs in %s/logs)\n",
               sup.nshards, sup.data);
    fflush(stdout);
    for (int i = 0; i < sup.first_coord && !sup.stopping; i++)
        start_child(&sup.kids[i]);
    if (!sup.stopping)
        uv_timer_start(&sup.health_timer, on_health_timer, HEALTH_POLL_MS, HEALTH_POLL_MS);
    if (!sup.stopping || sup.alive > 0)
        uv_run(sup.loop, UV_RUN_DEFAULT);
    /* Close the remaining handles so the loop can be closed cleanly. */
    for (int i = 0; i < sup.nkids; i++)
        uv_close((uv_handle_t *)&sup.kids[i].restart_timer, NULL);
    uv_close((uv_handle_t *)&sup.kill_timer, NULL);
    uv_close((uv_handle_t *)&sup.health_timer, NULL);
    uv_close((uv_handle_t *)&sup.groups_timer, NULL);
    uv_close((uv_handle_t *)&sup.sigint, NULL);
    uv_close((uv_handle_t *)&sup.sigterm, NULL);
    uv_run(sup.loop, UV_RUN_DEFAULT);
    uv_loop_close(sup.loop);
    for (int i = 0; i < sup.nkids; i++) {
        for (char **a = sup.kids[i].args; *a; a++)
            free(*a);
        free(sup.kids[i].args);
        free(sup.kids[i].log_path);
        free(sup.kids[i].target);
        free((char *)sup.kids[i].name);
    }
    fprintf(stderr, PROG ": %s\n", sup.exit_code ? "could not start the cluster" : "stopped");
    return sup.exit_code;
}

/* The etcd executable: $TSR_ETCD when set, else the first "etcd" in PATH, else
 * /usr/bin/etcd. 0, or -1 when none is executable. */
static int find_etcd(char *buf, size_t cap)
{
    const char *env = getenv("TSR_ETCD");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return access(buf, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0) {
            snprintf(buf, cap, "%.*s/etcd", (int)n, path);
            if (access(buf, X_OK) == 0)
                return 0;
        }
        path += n + (path[n] == ':');
    }
    snprintf(buf, cap, "/usr/bin/etcd");
    return access(buf, X_OK) == 0 ? 0 : -1;
}

/* Directory of this executable (bin/tessera → bin/tessera-shard beside it). */
static int own_dir(char *buf, size_t cap)
{
    size_t sz = cap;
    if (uv_exepath(buf, &sz) != 0) {
        fprintf(stderr, PROG ": cannot find my own path\n");
        return -1;
    }
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    return 0;
}

/* Checks the TLS flags and makes the paths absolute (tls_paths owns them). 0 or 2. */
static int resolve_tls(cluster_tls *tls, char *tls_paths[3])
{
    if ((tls->cert || tls->key || tls->ca || tls->name || tls->mtls) &&
        !(tls->cert && tls->key && tls->ca)) {
        fprintf(stderr, PROG ": TLS needs all of --tls-cert, --tls-key and --tls-ca\n");
        return 2;
    }
    if (!tls->cert)
        return 0;
    tsr_error err = TSR_ERROR_INIT;
    tsr_cmdline_tls chk = {tls->cert, "--tls-cert", tls->key, "--tls-key", tls->ca, "--tls-ca"};
    if (tsr_cmdline_check_tls(&chk, 1, &err) != 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return 2;
    }
    /* absolute, as the children may log them */
    tls_paths[0] = abs_path(tls->cert);
    tls_paths[1] = abs_path(tls->key);
    tls_paths[2] = abs_path(tls->ca);
    if (!tls_paths[0] || !tls_paths[1] || !tls_paths[2]) {
        fprintf(stderr, PROG ": TLS files: %s\n", strerror(errno));
        return 2;
    }
    tls->cert = tls_paths[0];
    tls->key = tls_paths[1];
    tls->ca = tls_paths[2];
    return 0;
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
    const char *data = NULL, *config = NULL, *mlisten = NULL;
    tsr_cluster_flags fl = {0}; /* 0 / NULL: not given (cluster_config.c) */
    int start_timeout = 120, coords = 1, netcd = 0;
    const tsr_cmdline_opt opts[] = {
        {"--coordinators", TSR_CMDLINE_INT, &coords, 1, MAX_COORDS, 0},
        {"--etcd-local", TSR_CMDLINE_INT, &netcd, 1, MAX_ETCD, 0},
        {"--data", TSR_CMDLINE_STR, &data, 0, 0, 1},
        {"--shards", TSR_CMDLINE_INT, &fl.shards, 1, MAX_SHARDS, 0},
        {"--port", TSR_CMDLINE_INT, &fl.port, 1, 65535, 0},
        {"--config", TSR_CMDLINE_STR, &config, 0, 0, 0},
        {"--dimensions", TSR_CMDLINE_INT, &fl.dims, 1, 65536, 0},
        {"--distance", TSR_CMDLINE_STR, &fl.distance, 0, 0, 0},
        {"--nlist", TSR_CMDLINE_INT, &fl.nlist, 1, 1 << 20, 0},
        {"--pq-m", TSR_CMDLINE_INT, &fl.pq_m, 1, 65536, 0},
        {"--nprobe", TSR_CMDLINE_INT, &fl.nprobe, 1, 1 << 20, 0},
        {"--metrics-listen", TSR_CMDLINE_STR, &mlisten, 0, 0, 0},
        {"--start-timeout", TSR_CMDLINE_INT, &start_timeout, 1, 86400, 0},
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
    tsr_cluster_flags_defaults(&fl);
    int port = fl.port, shards = fl.shards;
    if (coords > 1 && netcd == 0) {
        fprintf(stderr, PROG ": --coordinators %d needs --etcd-local M: several coordinators "
                "share their state in etcd (docs/ha.md)\n", coords);
        return 2;
    }
    if (port + shards + coords - 1 + 2 * netcd > 65535) {
        fprintf(stderr, PROG ": --port %d with --shards %d, --coordinators %d and --etcd-local "
                "%d: the ports pass 65535\n", port, shards, coords, netcd);
        return 2;
    }
    char etcd[PATH_MAX] = "";
    if (netcd && find_etcd(etcd, sizeof etcd) != 0) {
        fprintf(stderr, PROG ": --etcd-local needs etcd, which is not installed (%s is not an "
                "executable; searched $TSR_ETCD, PATH, /usr/bin/etcd): apt-get install "
                "etcd-server, or run without --etcd-local\n", etcd[0] ? etcd : "etcd");
        return 1;
    }
    char mhost[256];
    int mport = 0;
    if (mlisten && (split_host_port(mlisten, mhost, sizeof mhost, &mport) != 0 ||
                    mport + shards > 65535)) {
        fprintf(stderr,
                PROG ": --metrics-listen %s: expected HOST:PORT with PORT+%d <= 65535 (the "
                     "shards take the next ports)\n",
                mlisten, shards);
        return 2;
    }
    char *tls_paths[3] = {NULL, NULL, NULL};
    char bindir[PATH_MAX], cfg[PATH_MAX + 32];
    code = resolve_tls(&tls, tls_paths);
    if (code == 0 && own_dir(bindir, sizeof bindir) != 0)
        code = 1;
    tsr_cluster_group groups[TSR_CLUSTER_MAX_GROUPS];
    int ngroups = 0;
    if (code == 0 && (ngroups = tsr_cluster_groups_read(data, groups, TSR_CLUSTER_MAX_GROUPS)) < 0)
        code = 1;
    if (code == 0)
        code = preflight(data, port, shards, coords, netcd, mlisten ? mhost : NULL, mport);
    if (code == 0)
        code = tsr_cluster_check_layout(data, netcd);
    if (code == 0)
        code = preflight_groups(data, groups, ngroups);
    if (code == 0)
        code = tsr_cluster_prepare_config(data, config, cfg, sizeof cfg, &fl);
    char **coord_extra = argv_new();
    char peer_token[PATH_MAX + 32];
    if (code == 0) /* after tsr_cluster_prepare_config: DIR exists, so it resolves */
        code = add_coord_security(coord_extra, data, auth_tokens, &allow);
    /* with tokens every port needs one: the shards accept only the coordinator's */
    if (code == 0 && auth_tokens && (code = tsr_cluster_peer_token(data, peer_token,
                                                                   sizeof peer_token)) == 0)
        argv_add(coord_extra, "--peer-token-file", peer_token, (char *)NULL);
    tsr_cmdline_list_free(&allow);
    if (code == 0) {
        memset(&sup, 0, sizeof sup);
        sup.loop = uv_default_loop();
        sup.cfg = cfg;
        sup.data = data;
        sup.mlisten = mlisten;
        sup.tls_mode = tls.cert ? (tls.mtls ? ", mutual TLS" : ", TLS") : "";
        tsr_rpc_client_opts_init(&sup.health_opts);
        sup.health_opts.no_watch = 1;
        tsr_rpc_client_opts_init(&sup.plain_opts);
        sup.plain_opts.no_watch = 1;
        sup.health_opts.tls_ca_file = tls.ca;
        sup.health_opts.tls_server_name = tls.name;
        if (tls.mtls) {
            sup.health_opts.tls_cert_file = tls.cert;
            sup.health_opts.tls_key_file = tls.key;
        }
        cluster_plan pl = {data, bindir, cfg, port, shards, coords, netcd, etcd,
                           mlisten ? mhost : NULL, mport, &tls, coord_extra,
                           auth_tokens ? peer_token : NULL, groups, ngroups};
        sup.plan = &pl;
        sup.metric_shards = shards;
        plan_children(&pl);
        /* for `cluster add-group`: this process, and the first port past the layout */
        code = tsr_cluster_state_write(data, port, shards, port + shards + coords + 2 * netcd)
                   ? 1 : supervise(start_timeout);
    }
    for (char **a = coord_extra; *a; a++)
        free(*a);
    free(coord_extra);
    for (int i = 0; i < 3; i++)
        free(tls_paths[i]);
    return code;
}
