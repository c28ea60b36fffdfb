/*
 * bench_rpc — the cost of one RPC through common/rpc over loopback, with a trivial
 * handler (echo), server and client in one process (like a shard and the coordinator on
 * one machine, sharing its cores).
 *
 * Prints one table: sequential latency p50/p90/p99 and calls/s; then throughput with
 * 16 calls in flight two ways: 16 client threads each calling in a loop, and repeated
 * fan-outs of 16 calls on one queue (the coordinator's pattern). Optional TLS.
 *
 *   bench_rpc [--seconds S] [--size BYTES] [--inflight N] [--cqs N] [--long]
 *             [--tls-cert F --tls-key F]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc.h"

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

int main(int argc, char **argv)
{
    double seconds = 3;
    size_t size = 1024;
    int inflight = 16, cqs = 0, longh = 0;
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
        else if (!strcmp(argv[i], "--long"))
            longh = 1;
        else if (!strcmp(argv[i], "--tls-cert") && i + 1 < argc)
            cert = argv[++i];
        else if (!strcmp(argv[i], "--tls-key") && i + 1 < argc)
            key = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_rpc [--seconds S] [--size BYTES] [--inflight N] [--cqs N] "
                    "[--long] [--tls-cert F --tls-key F]\n");
            return 2;
        }
    }
    if (inflight < 1 || inflight > 1024) {
        fprintf(stderr, "bench_rpc: --inflight must be 1..1024\n");
        return 2;
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server_opts so;
    tsr_rpc_server_opts_init(&so);
    so.cqs = cqs;
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

    printf("rpc loopback, %zu-byte echo, %s handler, %s, server cqs=%d (0=default)\n", size,
           longh ? "worker-pool" : "inline", cert ? "TLS" : "plaintext", cqs);
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
