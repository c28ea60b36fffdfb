/*
 * bench_rpc — the cost of one RPC through common/net/rpc over loopback, with a trivial
 * handler (echo), server and client in one process (like a shard and the coordinator on
 * one machine, sharing its cores).
 *
 * Prints one table: sequential latency p50/p90/p99 and calls/s; then throughput with
 * 16 calls in flight two ways: 16 client threads each calling in a loop, and repeated
 * fan-outs of 16 calls on one queue (the coordinator's pattern). Optional TLS.
 *
 * --chain N: the floor of what a coordinator adds, with no work at all. Three processes on
 * loopback: this client, a relay server R (fork) and an echo server E (fork). Query by
 * query, interleaved, it times: a raw TCP ping-pong of the same bytes with a forked
 * process (TCP_NODELAY; the socket floor); one echo call to E (one gRPC hop); a fan-out
 * of N echo calls to E from the client ("direct"); one call to R whose handler fans the
 * request out to E N times asynchronously (tsr_rpc_reply_fanout) and replies with the
 * first answer ("via relay"); and a Health/Check to R (the bare extra hop).
 * relay − direct is the coordinator's added latency without its planning and merge.
 *
 *   bench_rpc [--seconds S] [--size BYTES] [--inflight N] [--cqs N] [--pollers N] [--long]
 *             [--tls-cert F --tls-key F] [--chain N [--queries Q]]
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net/rpc.h"

#define ECHO "/tessera.bench.Echo/Echo"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int h_echo(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    return tsr_rpc_reply_copy(reply, req, len);
}

/* Resident set size in KiB (Linux), -1 if unknown. */
static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct thr {
    tsr_rpc_channel *ch;
    const uint8_t *buf;
    size_t size;
    double until;
    long calls, errors;
};

static void *client_loop(void *arg)
{
    struct thr *t = arg;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    while (now_s() < t->until) {
        if (tsr_rpc_call(t->ch, ECHO, t->buf, t->size, 5000, &res) != TSR_RPC_OK ||
            res.len != t->size)
            t->errors++;
        t->calls++;
    }
    tsr_rpc_result_close(&res);
    return NULL;
}

/* ------------------------------------------------------------------ --chain mode -- */

#define RELAY "/tessera.bench.Echo/Relay"
#define HEALTH "/grpc.health.v1.Health/Check"

typedef struct relay_ctx {
    tsr_rpc_channel *echo;
    int fan;
} relay_ctx;

typedef struct relay_state {
    tsr_rpc_fanout_call calls[64];
    uint8_t *req;
    int n;
} relay_state;

static int relay_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n)
{
    relay_state *st = ud;
    int rc = calls[0].result.code == TSR_RPC_OK
                 ? tsr_rpc_reply_copy(r, calls[0].result.data, calls[0].result.len)
                 : tsr_rpc_reply_error(r, calls[0].result.code, "%s", calls[0].result.message);
    for (size_t i = 0; i < n; i++)
        tsr_rpc_result_close(&calls[i].result);
    free(st->req);
    free(st);
    return rc;
}

/* R's handler: the request to E, fan times, asynchronously; replies with the first answer. */
static int h_relay(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    relay_ctx *rc = ctx;
    relay_state *st = calloc(1, sizeof *st);
    st->req = malloc(len ? len : 1);
    if (len)
        memcpy(st->req, req, len);
    st->n = rc->fan;
    for (int i = 0; i < st->n; i++) {
        st->calls[i].ch = rc->echo;
        st->calls[i].method = ECHO;
        st->calls[i].req = st->req;
        st->calls[i].req_len = len;
        st->calls[i].timeout_ms = 5000;
        tsr_rpc_result_init(&st->calls[i].result);
    }
    int e = tsr_rpc_reply_fanout(reply, st->calls, (size_t)st->n, relay_done, st);
    if (e) {
        free(st->req);
        free(st);
    }
    return e;
}

/* Forks a server process (echo, or relay to echo_port when > 0); returns its port, and
 * its pid in *pid. The child serves until its stdin pipe closes. */
static int fork_server(int cqs, int pollers, int echo_port, int fan, pid_t *pid, int *keep_fd)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down))
        return -1;
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        close(up[0]);
        close(down[1]);
        tsr_error err = TSR_ERROR_INIT;
        tsr_rpc_server_opts so;
        tsr_rpc_server_opts_init(&so);
        so.cqs = cqs;
        so.pollers = pollers;
        tsr_rpc_server *srv = tsr_rpc_server_create(&so, &err);
        if (!srv)
            _exit(1);
        relay_ctx rc = {NULL, fan};
        tsr_rpc_server_add_method(srv, ECHO, h_echo, NULL, 0);
        if (echo_port > 0) {
            char t[64];
            snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", echo_port);
            rc.echo = tsr_rpc_channel_create(t, NULL, &err);
            tsr_rpc_server_add_method(srv, RELAY, h_relay, &rc, 0);
        }
        if (tsr_rpc_server_start(srv, &err))
            _exit(1);
        int port = tsr_rpc_server_port(srv);
        if (write(up[1], &port, sizeof port) != sizeof port)
            _exit(1);
        char c;
        while (read(down[0], &c, 1) > 0)
            ;
        tsr_rpc_server_destroy(srv);
        tsr_rpc_channel_destroy(rc.echo);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    int port = -1;
    if (read(up[0], &port, sizeof port) != sizeof port)
        port = -1;
    close(up[0]);
    *pid = p;
    *keep_fd = down[1];
    return port;
}

/* A forked TCP echo process for the socket floor; returns a connected socket. */
static int tcp_pair(size_t size, pid_t *pid)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        return -1;
    pid_t p = fork();
    if (p == 0) {
        int s = accept(ls, NULL, NULL), one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint8_t *b = malloc(size);
        for (;;) {
            size_t got = 0;
            while (got < size) {
                ssize_t k = read(s, b + got, size - got);
                if (k <= 0)
                    _exit(0);
                got += (size_t)k;
            }
            if (write(s, b, size) != (ssize_t)size)
                _exit(0);
        }
    }
    close(ls);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (connect(s, (struct sockaddr *)&a, sizeof a))
        return -1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *pid = p;
    return s;
}

static double tcp_round(int s, uint8_t *buf, size_t size)
{
    double a = now_s();
    if (write(s, buf, size) != (ssize_t)size)
        return -1;
    size_t got = 0;
    while (got < size) {
        ssize_t k = read(s, buf + got, size - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return now_s() - a;
}

static void row(const char *name, double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_d);
    printf("%-44s %10.1f %10.1f %10.1f\n", name, v[n / 2] * 1e6, v[n * 9 / 10] * 1e6,
           v[n * 99 / 100] * 1e6);
}

static int chain_main(int fan, size_t nq, size_t size, int cqs, int pollers)
{
    pid_t pe, pr, pt;
    int ke, kr;
    int eport = fork_server(cqs, pollers, 0, 0, &pe, &ke);
    int rport = eport > 0 ? fork_server(cqs, pollers, eport, fan, &pr, &kr) : -1;
    int ts = tcp_pair(size, &pt);
    if (eport <= 0 || rport <= 0 || ts < 0) {
        fprintf(stderr, "bench_rpc: cannot start the chain processes\n");
        return 1;
    }
    tsr_error err = TSR_ERROR_INIT;
    char t[64];
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", eport);
    tsr_rpc_channel *ce = tsr_rpc_channel_create(t, NULL, &err);
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", rport);
    tsr_rpc_channel *cr = tsr_rpc_channel_create(t, NULL, &err);
    uint8_t *buf = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i++)
        buf[i] = (uint8_t)i;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    tsr_rpc_fanout_call fc[64];
    memset(fc, 0, sizeof fc);
    for (int i = 0; i < fan; i++) {
        fc[i] = (tsr_rpc_fanout_call){ce, ECHO, buf, size, 5000, {0}, NULL};
        tsr_rpc_result_init(&fc[i].result);
    }
    double *lt = calloc(nq, sizeof *lt), *l1 = calloc(nq, sizeof *l1),
           *ld = calloc(nq, sizeof *ld), *lr = calloc(nq, sizeof *lr),
           *lh = calloc(nq, sizeof *lh), *dif = calloc(nq, sizeof *dif);
    long errors = 0;
    for (size_t w = 0; w < 200; w++) { /* connect and warm up */
        errors += tsr_rpc_call(cr, RELAY, buf, size, 5000, &res) != TSR_RPC_OK;
        errors += (long)tsr_rpc_fanout(fc, (size_t)fan);
    }
    for (size_t q = 0; q < nq; q++) {
        for (int r = 0; r < 5; r++) { /* rotate the order */
            int which = (int)((q + (size_t)r) % 5);
            double a = now_s();
            if (which == 0) {
                lt[q] = tcp_round(ts, buf, size);
                errors += lt[q] < 0;
            } else if (which == 1) {
                errors += tsr_rpc_call(ce, ECHO, buf, size, 5000, &res) != TSR_RPC_OK;
                l1[q] = now_s() - a;
            } else if (which == 2) {
                errors += (long)tsr_rpc_fanout(fc, (size_t)fan);
                ld[q] = now_s() - a;
            } else if (which == 3) {
                errors += tsr_rpc_call(cr, RELAY, buf, size, 5000, &res) != TSR_RPC_OK ||
                          res.len != size;
                lr[q] = now_s() - a;
            } else {
                errors += tsr_rpc_call(cr, HEALTH, NULL, 0, 5000, &res) != TSR_RPC_OK;
                lh[q] = now_s() - a;
            }
        }
        dif[q] = lr[q] - ld[q];
    }
    double load[3] = {0};
    if (getloadavg(load, 3) < 1)
        load[0] = -1;
    printf("rpc chain, %zu-byte echo, fan-out %d, %zu queries interleaved, server cqs=%d "
           "pollers=%d (0=default), load %.2f\n",
           size, fan, nq, cqs, pollers, load[0]);
    printf("%-44s %10s %10s %10s\n", "path", "p50 us", "p90 us", "p99 us");
    row("TCP ping-pong, two processes (socket floor)", lt, nq);
    row("one gRPC call to E", l1, nq);
    row("Health/Check to R (the bare extra hop)", lh, nq);
    char label[80];
    snprintf(label, sizeof label, "direct: fan-out of %d to E", fan);
    row(label, ld, nq);
    snprintf(label, sizeof label, "via relay R (async fan-out of %d to E)", fan);
    row(label, lr, nq);
    row("relay - direct, per query", dif, nq);
    printf("errors: %ld\n", errors);
    for (int i = 0; i < fan; i++)
        tsr_rpc_result_close(&fc[i].result);
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ce);
    tsr_rpc_channel_destroy(cr);
    close(ke);
    close(kr);
    close(ts);
    kill(pt, SIGTERM);
    waitpid(pe, NULL, 0);
    waitpid(pr, NULL, 0);
    waitpid(pt, NULL, 0);
    free(buf);
    free(lt);
    free(l1);
    free(ld);
    free(lr);
    free(lh);
    free(dif);
    return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
    double seconds = 3;
    size_t size = 1024;
    int inflight = 16, cqs = 0, pollers = 0, longh = 0, chain = 0;
    size_t queries = 3000;
    const char *cert = NULL, *key = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--inflight") && i + 1 < argc)
            inflight = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cqs") && i + 1 < argc)
            cqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pollers") && i + 1 < argc)
            pollers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chain") && i + 1 < argc)
            chain = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--queries") && i + 1 < argc)
            queries = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--long"))
            longh = 1;
        else if (!strcmp(argv[i], "--tls-cert") && i + 1 < argc)
            cert = argv[++i];
        else if (!strcmp(argv[i], "--tls-key") && i + 1 < argc)
            key = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_rpc [--seconds S] [--size BYTES] [--inflight N] [--cqs N] "
                    "[--pollers N] [--long] [--tls-cert F --tls-key F] [--chain N [--queries "
                    "Q]]\n");
            return 2;
        }
    }
    if (chain) {
        if (chain < 1 || chain > 64 || queries < 10 || queries > 1000000 || size < 1 ||
            size > (1u << 20)) {
            fprintf(stderr, "bench_rpc: --chain 1..64, --queries 10..1e6, --size 1..1 MiB\n");
            return 2;
        }
        return chain_main(chain, queries, size, cqs, pollers);
    }
    if (inflight < 1 || inflight > 1024) {
        fprintf(stderr, "bench_rpc: --inflight must be 1..1024\n");
        return 2;
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts so;
    tsr_rpc_server_opts_init(&so);
    so.cqs = cqs;
    so.pollers = pollers;
    so.tls_cert_file = cert;
    so.tls_key_file = key;
    tsr_rpc_server *srv = tsr_rpc_server_create(&so, &err);
    if (!srv) {
        fprintf(stderr, "bench_rpc: %s\n", err.msg);
        return 1;
    }
    tsr_rpc_server_add_method(srv, ECHO, h_echo, NULL, longh ? TSR_RPC_LONG : 0);
    if (tsr_rpc_server_start(srv, &err) != 0) {
        fprintf(stderr, "bench_rpc: %s\n", err.msg);
        return 1;
    }
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(srv));
    tsr_rpc_client_opts co;
    tsr_rpc_client_opts_init(&co);
    if (cert) {
        co.tls_ca_file = cert;
        co.tls_server_name = "localhost";
    }
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, &co, &err);
    if (!ch) {
        fprintf(stderr, "bench_rpc: %s\n", err.msg);
        return 1;
    }
    uint8_t *buf = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i++)
        buf[i] = (uint8_t)i;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (int i = 0; i < 200; i++) /* connect and warm up */
        tsr_rpc_call(ch, ECHO, buf, size, 5000, &res);

    long rss0 = rss_kib();

    /* sequential */
    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    long errors = 0;
    double t_end = now_s() + seconds, t0 = now_s();
    while (n < cap) {
        double a = now_s();
        if (a >= t_end)
            break;
        if (tsr_rpc_call(ch, ECHO, buf, size, 5000, &res) != TSR_RPC_OK || res.len != size)
            errors++;
        lat[n++] = now_s() - a;
    }
    double seq_dt = now_s() - t0;
    qsort(lat, n, sizeof *lat, cmp_d);

    /* N client threads */
    pthread_t *th = calloc((size_t)inflight, sizeof *th);
    struct thr *ts = calloc((size_t)inflight, sizeof *ts);
    double until = now_s() + seconds;
    t0 = now_s();
    for (int i = 0; i < inflight; i++) {
        ts[i] = (struct thr){ch, buf, size, until, 0, 0};
        pthread_create(&th[i], NULL, client_loop, &ts[i]);
    }
    long thr_calls = 0;
    for (int i = 0; i < inflight; i++) {
        pthread_join(th[i], NULL);
        thr_calls += ts[i].calls;
        errors += ts[i].errors;
    }
    double thr_dt = now_s() - t0;

    /* repeated fan-outs of N on one queue */
    tsr_rpc_fanout_call *fc = calloc((size_t)inflight, sizeof *fc);
    for (int i = 0; i < inflight; i++) {
        tsr_rpc_result_init(&fc[i].result);
        fc[i].ch = ch;
        fc[i].method = ECHO;
        fc[i].req = buf;
        fc[i].req_len = size;
        fc[i].timeout_ms = 5000;
    }
    long fan_calls = 0, fans = 0;
    double *fan_lat = malloc(cap * sizeof *fan_lat);
    t_end = now_s() + seconds;
    t0 = now_s();
    while ((size_t)fans < cap) {
        double a = now_s();
        if (a >= t_end)
            break;
        errors += (long)tsr_rpc_fanout(fc, (size_t)inflight);
        fan_lat[fans++] = now_s() - a;
        fan_calls += inflight;
    }
    double fan_dt = now_s() - t0;
    qsort(fan_lat, (size_t)fans, sizeof *fan_lat, cmp_d);

    printf("rpc loopback, %zu-byte echo, %s handler, %s, server cqs=%d pollers=%d "
           "(0=default)\n",
           size, longh ? "worker-pool" : "inline", cert ? "TLS" : "plaintext", cqs, pollers);
    printf("%-34s %10s %10s %10s %12s\n", "mode", "p50 us", "p90 us", "p99 us", "calls/s");
    printf("%-34s %10.1f %10.1f %10.1f %12.0f\n", "sequential (1 in flight)", lat[n / 2] * 1e6,
           lat[n * 9 / 10] * 1e6, lat[n * 99 / 100] * 1e6, n / seq_dt);
    char label[64];
    snprintf(label, sizeof label, "%d client threads", inflight);
    printf("%-34s %10s %10s %10s %12.0f\n", label, "-", "-", "-", thr_calls / thr_dt);
    snprintf(label, sizeof label, "fan-out of %d (per fan-out)", inflight);
    printf("%-34s %10.1f %10.1f %10.1f %12.0f\n", label, fan_lat[fans / 2] * 1e6,
           fan_lat[fans * 9 / 10] * 1e6, fan_lat[fans * 99 / 100] * 1e6, fan_calls / fan_dt);
    printf("calls made: %ld; process RSS (server + client) after warm-up %ld KiB, at the end "
           "%ld KiB\n",
           (long)n + thr_calls + fan_calls, rss0, rss_kib());
    printf("errors: %ld\n", errors);

    for (int i = 0; i < inflight; i++)
        tsr_rpc_result_close(&fc[i].result);
    free(fc);
    free(fan_lat);
    free(th);
    free(ts);
    free(lat);
    free(buf);
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(srv);
    return errors ? 1 : 0;
}
