/*
 * test_metrics — the metrics registry (counters, gauges, labels, escaping, type clashes,
 * histogram buckets, the text format) including concurrent increments and series creation
 * from many threads, the HTTP request parser and router on buffers, and the libuv
 * listener over real sockets: /metrics, /healthz, 404, 405, 400 on garbage, 431 on an
 * oversized head, idle connections closed, connection limit, stop while clients are open.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "net/metrics.h"
#include "net/metrics_http.h"

static int setup(void **state)
{
    tsr_metrics_reset();
    return 0;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void test_counter_gauge(void **state)
{
    tsr_metrics_counter_add("tessera_test_total", "type=a", 1);
    tsr_metrics_counter_add("tessera_test_total", "type=a", 2.5);
    tsr_metrics_counter_add("tessera_test_total", "type=b", 1);
    tsr_metrics_counter_add("tessera_test_total", "type=b", -1); /* dropped */
    assert_true(tsr_metrics_value("tessera_test_total", "type=a") == 3.5);
    assert_true(tsr_metrics_value("tessera_test_total", "type=b") == 1);
    assert_true(isnan(tsr_metrics_value("tessera_test_total", "type=c")));
    tsr_metrics_gauge_set("tessera_g", NULL, 7);
    tsr_metrics_gauge_add("tessera_g", "", -2);
    assert_true(tsr_metrics_value("tessera_g", NULL) == 5);
    /* type clash: a gauge sample on a counter family is dropped */
    tsr_metrics_gauge_set("tessera_test_total", "type=a", 100);
    assert_true(tsr_metrics_value("tessera_test_total", "type=a") == 3.5);
    /* bad names and labels are dropped, never crash */
    tsr_metrics_counter_add("9bad", NULL, 1);
    tsr_metrics_counter_add("bad-name", NULL, 1);
    tsr_metrics_counter_add("tessera_x", "noequals", 1);
    tsr_metrics_counter_add("tessera_x", "a=1,", 1);
    tsr_metrics_counter_add("tessera_x", "__r=1", 1);
    tsr_metrics_counter_add("tessera_x", "1a=1", 1);
    tsr_metrics_counter_add(NULL, NULL, 1);
    tsr_metrics_histogram_observe("tessera_h", "le=1", 1);

    size_t len;
    char *out = tsr_metrics_render(&len);
    assert_non_null(out);
    assert_int_equal(strlen(out), len);
    assert_true(contains(out, "# TYPE tessera_test_total counter\n"));
    assert_true(contains(out, "tessera_test_total{type=\"a\"} 3.5\n"));
    assert_true(contains(out, "tessera_test_total{type=\"b\"} 1\n"));
    assert_true(contains(out, "# TYPE tessera_g gauge\ntessera_g 5\n"));
    assert_true(contains(out, "# HELP tessera_g Tessera metric tessera_g.\n"));
    assert_false(contains(out, "tessera_x"));
    assert_false(contains(out, "9bad"));
    /* 1 negative + 1 clash + 6 bad + 1 NULL + 1 le label */
    assert_true(contains(out, "tessera_metrics_dropped_total 10\n"));
    /* HELP for a family precedes its TYPE and its samples */
    char *help = strstr(out, "# HELP tessera_test_total"), *type = strstr(out, "# TYPE tessera_test_total");
    assert_non_null(help);
    assert_true(help < type && type < strstr(out, "tessera_test_total{"));
    free(out);
}

static void test_escaping_and_help(void **state)
{
    assert_int_equal(tsr_metrics_describe("tessera_esc", TSR_METRIC_GAUGE, "Line one\nback\\slash"), 0);
    assert_int_equal(tsr_metrics_describe("tessera_esc", TSR_METRIC_COUNTER, "x"), TSR_EINVAL);
    tsr_metrics_gauge_set("tessera_esc", "path=a\"b\\c\nd,z=", 0.1);
    char *out = tsr_metrics_render(NULL);
    assert_true(contains(out, "# HELP tessera_esc Line one\\nback\\\\slash\n"));
    assert_true(contains(out, "tessera_esc{path=\"a\\\"b\\\\c\\nd\",z=\"\"} 0.1\n"));
    free(out);
    tsr_metrics_gauge_set("tessera_special", "k=nan", NAN);
    tsr_metrics_gauge_set("tessera_special", "k=pinf", INFINITY);
    tsr_metrics_gauge_set("tessera_special", "k=ninf", -INFINITY);
    tsr_metrics_gauge_set("tessera_special", "k=big", 1e300);
    out = tsr_metrics_render(NULL);
    assert_true(contains(out, "tessera_special{k=\"nan\"} NaN\n"));
    assert_true(contains(out, "tessera_special{k=\"pinf\"} +Inf\n"));
    assert_true(contains(out, "tessera_special{k=\"ninf\"} -Inf\n"));
    assert_true(contains(out, "tessera_special{k=\"big\"} 1e+300\n"));
    /* series sorted by labels */
    assert_true(strstr(out, "k=\"big\"") < strstr(out, "k=\"nan\""));
    free(out);
}

static void test_histogram(void **state)
{
    /* 0.0003 → le=0.0005; 0.001 → le=0.001 (bounds are inclusive); 0.003 → 0.005; 20 → +Inf */
    double v[] = {0.0003, 0.001, 0.003, 20};
    for (int i = 0; i < 4; i++) tsr_metrics_histogram_observe("tessera_lat_seconds", "m=x", v[i]);
    assert_true(tsr_metrics_value("tessera_lat_seconds", "m=x") == 4);
    char *out = tsr_metrics_render(NULL);
    assert_true(contains(out, "# TYPE tessera_lat_seconds histogram\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"0.0005\"} 1\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"0.001\"} 2\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"0.0025\"} 2\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"0.005\"} 3\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"10\"} 3\n"));
    assert_true(contains(out, "tessera_lat_seconds_bucket{m=\"x\",le=\"+Inf\"} 4\n"));
    assert_true(contains(out, "tessera_lat_seconds_sum{m=\"x\"} 20.0043\n"));
    assert_true(contains(out, "tessera_lat_seconds_count{m=\"x\"} 4\n"));
    free(out);
    tsr_metrics_histogram_observe("tessera_nolabel_seconds", NULL, 0.2);
    out = tsr_metrics_render(NULL);
    assert_true(contains(out, "tessera_nolabel_seconds_bucket{le=\"0.25\"} 1\n"));
    assert_true(contains(out, "tessera_nolabel_seconds_sum 0.2\ntessera_nolabel_seconds_count 1\n"));
    free(out);
    /* bucket bounds strictly increase */
    for (int i = 1; i < TSR_METRICS_NBUCKETS; i++)
        assert_true(tsr_metrics_buckets[i] > tsr_metrics_buckets[i - 1]);
}

static void test_domain_hooks(void **state)
{
    tsr_metrics_rpc_observe("/tessera.v1.Shard/Search", 0, 0.0004);
    tsr_metrics_rpc_observe("/tessera.v1.Shard/Search", 14, 0.2);
    tsr_metrics_rpc_observe("/a,b", 99, 0.1); /* ',' in a value is replaced */
    tsr_metrics_shard_call_observe("10.0.0.1:7001", "/tessera.v1.Shard/Search", 4, 1.5);
    tsr_metrics_shard_up("10.0.0.1:7001", 0);
    tsr_metrics_version_set(42);
    tsr_metrics_index_size(1000, 17);
    tsr_metrics_update_phase("stage");
    tsr_metrics_update_records(500);
    tsr_metrics_update_done("aborted", "EIO");
    char *out = tsr_metrics_render(NULL);
    assert_true(contains(out, "tessera_rpc_requests_total{method=\"/tessera.v1.Shard/Search\",code=\"OK\"} 1\n"));
    assert_true(contains(out, "tessera_rpc_requests_total{method=\"/tessera.v1.Shard/Search\",code=\"UNAVAILABLE\"} 1\n"));
    assert_true(contains(out, "tessera_rpc_requests_total{method=\"/a_b\",code=\"UNKNOWN\"} 1\n"));
    assert_true(contains(out, "tessera_rpc_duration_seconds_count{method=\"/tessera.v1.Shard/Search\"} 2\n"));
    assert_true(contains(out, "# HELP tessera_rpc_requests_total RPCs this process served"));
    assert_true(contains(out, "tessera_shard_calls_total{shard=\"10.0.0.1:7001\",method=\"/tessera.v1.Shard/Search\",code=\"DEADLINE_EXCEEDED\"} 1\n"));
    assert_true(contains(out, "tessera_shard_up{shard=\"10.0.0.1:7001\"} 0\n"));
    assert_true(contains(out, "tessera_version 42\n"));
    assert_true(contains(out, "tessera_vectors 1000\n"));
    assert_true(contains(out, "tessera_lists 17\n"));
    assert_true(contains(out, "tessera_update_phase{phase=\"idle\"} 1\n"));
    assert_true(contains(out, "tessera_update_phase{phase=\"stage\"} 0\n"));
    assert_true(contains(out, "tessera_update_records_total 500\n"));
    assert_true(contains(out, "tessera_updates_total{result=\"aborted\"} 1\n"));
    assert_true(contains(out, "tessera_update_errors_total{type=\"EIO\"} 1\n"));
    assert_true(contains(out, "tessera_process_start_time_seconds "));
    assert_true(contains(out, "tessera_metrics_dropped_total 0\n"));
    free(out);
    assert_string_equal(tsr_metrics_code_name(8), "RESOURCE_EXHAUSTED");
    assert_string_equal(tsr_metrics_code_name(-1), "UNKNOWN");
}

static int collector_calls;
static void collector(void *ud)
{
    collector_calls++;
    tsr_metrics_gauge_set("tessera_collected", NULL, *(double *)ud);
}

static void test_collector(void **state)
{
    double v = 3;
    assert_int_equal(tsr_metrics_add_collector(collector, &v), 0);
    char *out = tsr_metrics_render(NULL);
    assert_true(contains(out, "tessera_collected 3\n"));
    free(out);
    v = 4;
    out = tsr_metrics_render(NULL);
    assert_true(contains(out, "tessera_collected 4\n"));
    free(out);
    assert_int_equal(collector_calls, 2);
    int rc = 0;
    for (int i = 0; i < 20 && rc == 0; i++) rc = tsr_metrics_add_collector(collector, &v);
    assert_int_equal(rc, TSR_ELIMIT);
}

#define NTHREADS 8
#define NITER 100000
static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    char l[32];
    snprintf(l, sizeof l, "t=%d", id);
    for (int i = 0; i < NITER; i++) {
        tsr_metrics_counter_add("tessera_conc_total", NULL, 1);
        tsr_metrics_counter_add("tessera_conc_total", l, 1);
        tsr_metrics_gauge_add("tessera_conc_gauge", NULL, 0.5);
        tsr_metrics_histogram_observe("tessera_conc_seconds", NULL, (i % 100) * 0.001);
        if (i % 1000 == 0) { /* series creation racing with lookups */
            char l2[48];
            snprintf(l2, sizeof l2, "i=%d", i / 1000);
            tsr_metrics_counter_add("tessera_conc_created_total", l2, 1);
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)i);
    /* render concurrently too */
    for (int r = 0; r < 20; r++) free(tsr_metrics_render(NULL));
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    assert_true(tsr_metrics_value("tessera_conc_total", NULL) == (double)NTHREADS * NITER);
    for (int i = 0; i < NTHREADS; i++) {
        char l[32];
        snprintf(l, sizeof l, "t=%d", i);
        assert_true(tsr_metrics_value("tessera_conc_total", l) == NITER);
    }
    assert_true(tsr_metrics_value("tessera_conc_gauge", NULL) == 0.5 * NTHREADS * NITER);
    assert_true(tsr_metrics_value("tessera_conc_seconds", NULL) == (double)NTHREADS * NITER);
    for (int i = 0; i < NITER / 1000; i++) {
        char l2[48];
        snprintf(l2, sizeof l2, "i=%d", i);
        assert_true(tsr_metrics_value("tessera_conc_created_total", l2) == NTHREADS);
    }
    char *out = tsr_metrics_render(NULL);
    char want[128];
    snprintf(want, sizeof want, "tessera_conc_seconds_count %d\n", NTHREADS * NITER);
    assert_true(contains(out, want));
    free(out);
}

static void test_registry_full(void **state)
{
    char l[32];
    for (int i = 0; i < TSR_METRICS_MAX_SERIES + 10; i++) {
        snprintf(l, sizeof l, "i=%d", i);
        tsr_metrics_counter_add("tessera_many_total", l, 1);
    }
    /* some were dropped (the registry holds the process start gauge too), none crashed */
    assert_true(isnan(tsr_metrics_value("tessera_many_total", "i=4105")));
    assert_true(tsr_metrics_value("tessera_many_total", "i=0") == 1);
    char *out = tsr_metrics_render(NULL);
    assert_non_null(out);
    assert_false(contains(out, "tessera_metrics_dropped_total 0\n"));
    free(out);
}

/* ---- parser --------------------------------------------------------------------------- */

static int parse(const char *s, tsr_http_request *r) { return tsr_http_parse_request(s, strlen(s), r); }

static void test_parser(void **state)
{
    tsr_http_request r;
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &r), TSR_HTTP_DONE);
    assert_string_equal(r.method, "GET");
    assert_string_equal(r.path, "/metrics");
    assert_int_equal(r.minor, 1);
    assert_int_equal(r.head_len, strlen("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert_int_equal(parse("GET /metrics?x=1 HTTP/1.0\n\n", &r), TSR_HTTP_DONE);
    assert_string_equal(r.path, "/metrics");
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n", &r), TSR_HTTP_INCOMPLETE);
    assert_int_equal(parse("GET /met", &r), TSR_HTTP_INCOMPLETE);
    assert_int_equal(parse("", &r), TSR_HTTP_INCOMPLETE);
    assert_int_equal(parse("\x16\x03\x01\x02", &r), TSR_HTTP_BAD); /* a TLS hello */
    assert_int_equal(parse("GET  /metrics HTTP/1.1\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET metrics HTTP/1.1\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET /metrics HTTP/2.0\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET /metrics HTTP/1.1 \r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET /metrics\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("G(T / HTTP/1.1\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET / HTTP/1.1\r\nno colon\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET / HTTP/1.1\r\n folded: x\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("GET / HTTP/1.1\r\nA: \x01\r\n\r\n", &r), TSR_HTTP_BAD);
    assert_int_equal(parse("VERYLONGMETHODNAMEX / HTTP/1.1\r\n\r\n", &r), TSR_HTTP_BAD);
    /* embedded NUL in the request line */
    assert_int_equal(tsr_http_parse_request("GET /\0 HTTP/1.1\r\n\r\n", 20, &r), TSR_HTTP_BAD);
    /* a long path is refused, not truncated */
    char big[TSR_METRICS_HTTP_MAX_REQUEST + 100];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /", 5);
    assert_int_equal(tsr_http_parse_request(big, 400, &r), TSR_HTTP_INCOMPLETE);
    memcpy(big + 300, " HTTP/1.1\r\n\r\n", 13);
    assert_int_equal(tsr_http_parse_request(big, 313, &r), TSR_HTTP_BAD);
    /* oversized head */
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    assert_int_equal(tsr_http_parse_request(big, sizeof big, &r), TSR_HTTP_TOO_LARGE);
    assert_int_equal(tsr_http_parse_request(big, TSR_METRICS_HTTP_MAX_REQUEST - 1, &r), TSR_HTTP_INCOMPLETE);

    size_t len;
    char *resp;
    parse("GET /healthz HTTP/1.1\r\n\r\n", &r);
    resp = tsr_http_respond(TSR_HTTP_DONE, &r, 1, &len);
    assert_true(strncmp(resp, "HTTP/1.1 200 OK\r\n", 17) == 0 && contains(resp, "\r\n\r\nok\n"));
    free(resp);
    resp = tsr_http_respond(TSR_HTTP_DONE, &r, 0, &len);
    assert_true(strncmp(resp, "HTTP/1.1 503 ", 13) == 0);
    free(resp);
    parse("HEAD /metrics HTTP/1.1\r\n\r\n", &r);
    resp = tsr_http_respond(TSR_HTTP_DONE, &r, 1, &len);
    assert_true(contains(resp, "text/plain; version=0.0.4"));
    assert_int_equal(strlen(resp), len);
    assert_true(len >= 4 && memcmp(resp + len - 4, "\r\n\r\n", 4) == 0); /* no body */
    free(resp);
    parse("POST /metrics HTTP/1.1\r\n\r\n", &r);
    resp = tsr_http_respond(TSR_HTTP_DONE, &r, 1, &len);
    assert_true(strncmp(resp, "HTTP/1.1 405 ", 13) == 0 && contains(resp, "Allow: GET, HEAD"));
    free(resp);
    parse("GET /nope HTTP/1.1\r\n\r\n", &r);
    resp = tsr_http_respond(TSR_HTTP_DONE, &r, 1, &len);
    assert_true(strncmp(resp, "HTTP/1.1 404 ", 13) == 0);
    free(resp);
    resp = tsr_http_respond(TSR_HTTP_BAD, NULL, 1, &len);
    assert_true(strncmp(resp, "HTTP/1.1 400 ", 13) == 0);
    free(resp);
    resp = tsr_http_respond(TSR_HTTP_TOO_LARGE, NULL, 1, &len);
    assert_true(strncmp(resp, "HTTP/1.1 431 ", 13) == 0);
    free(resp);
}

/* ---- listener over sockets -------------------------------------------------------------- */

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Reads until EOF or timeout_ms; returns malloc'ed text (possibly empty); *eof set on EOF. */
static char *read_all(int fd, int timeout_ms, int *eof)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    *eof = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) break;
        if (len == cap) {
            cap *= 2;
            b = realloc(b, cap + 1);
        }
        ssize_t n = recv(fd, b + len, cap - len, 0);
        if (n <= 0) {
            *eof = 1;
            break;
        }
        len += (size_t)n;
    }
    b[len] = 0;
    return b;
}

static char *fetch(int port, const char *req, size_t reqlen)
{
    int fd = connect_to(port), eof;
    assert_int_equal(send(fd, req, reqlen, MSG_NOSIGNAL), (ssize_t)reqlen);
    char *r = read_all(fd, 3000, &eof);
    assert_true(eof); /* the server closes after answering */
    close(fd);
    return r;
}

static int health_flag = 1;
static int healthy_cb(void *ud) { return *(int *)ud; }

static double now_s(void) { return tsr_metrics_now(); }

static void test_listener(void **state)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_metrics_http_opts o;
    tsr_metrics_http_opts_init(&o);
    o.listen = "127.0.0.1:0";
    o.idle_ms = 300;
    o.max_conns = 4;
    o.healthy = healthy_cb;
    o.healthy_ud = &health_flag;
    tsr_metrics_http *h = tsr_metrics_http_create(&o, &err);
    assert_non_null(h);
    int port = tsr_metrics_http_port(h);
    assert_true(port > 0);

    tsr_metrics_rpc_observe("/tessera.v1.Shard/Search", 0, 0.001);
    const char *g = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    char *r = fetch(port, g, strlen(g));
    assert_true(strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0);
    assert_true(contains(r, "Content-Type: text/plain; version=0.0.4"));
    assert_true(contains(r, "tessera_rpc_requests_total{method=\"/tessera.v1.Shard/Search\",code=\"OK\"} 1\n"));
    free(r);
    /* the figures move between scrapes */
    tsr_metrics_rpc_observe("/tessera.v1.Shard/Search", 0, 0.001);
    r = fetch(port, g, strlen(g));
    assert_true(contains(r, "code=\"OK\"} 2\n"));
    free(r);

    r = fetch(port, "GET /healthz HTTP/1.0\r\n\r\n", 25);
    assert_true(strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0);
    free(r);
    health_flag = 0;
    r = fetch(port, "GET /healthz HTTP/1.0\r\n\r\n", 25);
    assert_true(strncmp(r, "HTTP/1.1 503 ", 13) == 0);
    free(r);
    health_flag = 1;
    r = fetch(port, "GET /x HTTP/1.1\r\n\r\n", 19);
    assert_true(strncmp(r, "HTTP/1.1 404 ", 13) == 0);
    free(r);
    r = fetch(port, "\x00\xff garbage\r\n\r\n", 14);
    assert_true(strncmp(r, "HTTP/1.1 400 ", 13) == 0);
    free(r);

    /* request split over several sends */
    int fd = connect_to(port), eof;
    send(fd, "GET /heal", 9, MSG_NOSIGNAL);
    usleep(20000);
    send(fd, "thz HTTP/1.1\r\n", 14, MSG_NOSIGNAL);
    usleep(20000);
    send(fd, "\r\n", 2, MSG_NOSIGNAL);
    r = read_all(fd, 3000, &eof);
    assert_true(eof && strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0);
    free(r);
    close(fd);

    /* oversized head: 431, the connection closes (the rest is never read) */
    char *big = malloc(3 * TSR_METRICS_HTTP_MAX_REQUEST);
    memset(big, 'a', 3 * TSR_METRICS_HTTP_MAX_REQUEST);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    fd = connect_to(port);
    send(fd, big, TSR_METRICS_HTTP_MAX_REQUEST + 10, MSG_NOSIGNAL);
    r = read_all(fd, 3000, &eof);
    assert_true(strncmp(r, "HTTP/1.1 431 ", 13) == 0);
    free(r);
    close(fd);
    free(big);

    /* idle connections are closed after idle_ms */
    double t0 = now_s();
    fd = connect_to(port);
    send(fd, "GET / HTT", 9, MSG_NOSIGNAL);
    r = read_all(fd, 3000, &eof);
    double dt = now_s() - t0;
    assert_true(eof);
    assert_int_equal(strlen(r), 0);
    assert_true(dt >= 0.25 && dt < 2.0);
    free(r);
    close(fd);

    /* connection limit: 4 idle ones held, a 5th is closed without an answer, and after
     * the idle ones time out the listener serves again */
    int held[4];
    for (int i = 0; i < 4; i++) held[i] = connect_to(port);
    usleep(50000);
    fd = connect_to(port);
    send(fd, g, strlen(g), MSG_NOSIGNAL);
    r = read_all(fd, 2000, &eof);
    assert_true(eof);
    assert_false(contains(r, "200 OK"));
    free(r);
    close(fd);
    usleep(400000);
    r = fetch(port, g, strlen(g));
    assert_true(strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0);
    free(r);
    for (int i = 0; i < 4; i++) close(held[i]);

    /* stop with clients connected */
    int open1 = connect_to(port);
    send(open1, "GET", 3, MSG_NOSIGNAL);
    usleep(20000);
    tsr_metrics_http_destroy(h);
    r = read_all(open1, 2000, &eof);
    assert_true(eof);
    free(r);
    close(open1);
}

static void test_listener_errors(void **state)
{
    tsr_error err = TSR_ERROR_INIT;
    assert_null(tsr_metrics_http_start("nonsense", &err));
    assert_int_equal(err.code, TSR_EINVAL);
    assert_null(tsr_metrics_http_start("127.0.0.1:99999", &err));
    assert_null(tsr_metrics_http_start("example.com:80", &err));
    assert_true(contains(err.msg, "IP literal"));
    tsr_metrics_http *a = tsr_metrics_http_start("127.0.0.1:0", &err);
    assert_non_null(a);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tsr_metrics_http_port(a));
    tsr_error_clear(&err);
    assert_null(tsr_metrics_http_start(addr, &err)); /* port in use */
    assert_int_equal(err.code, TSR_EUNAVAILABLE);
    tsr_metrics_http_destroy(a);
    tsr_metrics_http_destroy(NULL);
    /* start/stop quickly many times: no leak, no hang */
    for (int i = 0; i < 20; i++) tsr_metrics_http_destroy(tsr_metrics_http_start("localhost:0", &err));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_counter_gauge, setup),
        cmocka_unit_test_setup(test_escaping_and_help, setup),
        cmocka_unit_test_setup(test_histogram, setup),
        cmocka_unit_test_setup(test_domain_hooks, setup),
        cmocka_unit_test_setup(test_collector, setup),
        cmocka_unit_test_setup(test_concurrent, setup),
        cmocka_unit_test_setup(test_registry_full, setup),
        cmocka_unit_test_setup(test_parser, setup),
        cmocka_unit_test_setup(test_listener, setup),
        cmocka_unit_test_setup(test_listener_errors, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
