/*
 * metrics_http — a small HTTP/1.1 listener on its own libuv loop and thread, serving
 *   GET /metrics   200, Content-Type: text/plain; version=0.0.4 (tsr_metrics_render)
 *   GET /healthz   200 "ok\n" (or 503 "unhealthy\n" when the health callback says so)
 *   anything else  404; other methods 405; a malformed request 400; an oversized one 431.
 * HEAD is answered like GET without a body. Every response closes the connection
 * (Prometheus scrapes open one connection per scrape anyway).
 *
 * HOOK FOR THE OWNERS (one line in main(), after parsing a --metrics-listen flag;
 * the returned object is destroyed at exit, which stops the thread):
 *     tsr_metrics_http *mh = tsr_metrics_http_start("127.0.0.1:9100", &err);
 *     ...  tsr_metrics_http_destroy(mh);
 *   Port 0 picks an ephemeral port: tsr_metrics_http_port(mh).
 *
 * Limits (hostile clients): a request head larger than TSR_METRICS_HTTP_MAX_REQUEST bytes
 * gets 431; a connection that has not completed its request within idle_ms (default
 * 5000) is closed; at most max_conns (default 64) connections at once, more are accepted
 * and closed at once so they cannot pile up in the kernel backlog.
 *
 * DESIGN (threads): the loop, its handles and all connection state belong to the loop
 * thread. tsr_metrics_http_start binds and listens on the caller's thread *before* the
 * loop thread starts (thread creation orders it), so bind errors are reported
 * synchronously; afterwards the only cross-thread contact is uv_async_send on
 * `stop_async` (tsr_metrics_http_destroy), then pthread_join. The health callback and
 * metric collectors run on the loop thread.
 */
#ifndef TSR_METRICS_HTTP_H
#define TSR_METRICS_HTTP_H

#include <stddef.h>

#include "core/error.h"

#define TSR_METRICS_HTTP_MAX_REQUEST 8192

typedef struct tsr_metrics_http tsr_metrics_http;

typedef struct tsr_metrics_http_opts {
    const char *listen; /* "host:port", "[v6]:port" or ":port" (= 127.0.0.1: binding all
                           addresses takes an explicit "0.0.0.0:port"); port 0 = ephemeral */
    int idle_ms;        /* close a connection without a complete request after this; 0 = 5000 */
    int max_conns;      /* 0 = 64 */
    /* Optional: returns nonzero when healthy; runs on the loop thread (must be thread-safe). */
    int (*healthy)(void *ud);
    void *healthy_ud;
} tsr_metrics_http_opts;

void tsr_metrics_http_opts_init(tsr_metrics_http_opts *o);

/* Binds, listens and starts the loop thread. Returns a new listener (caller destroys) or
 * NULL with err set (EINVAL bad address, EUNAVAILABLE cannot bind, ENOMEM). */
tsr_metrics_http *tsr_metrics_http_create(const tsr_metrics_http_opts *o, tsr_error *err);

/* Shorthand for create with defaults and o.listen = listen. */
tsr_metrics_http *tsr_metrics_http_start(const char *listen, tsr_error *err);

/* The bound port (useful with port 0). */
int tsr_metrics_http_port(const tsr_metrics_http *h);

/* Stops the loop (closing every connection), joins the thread, frees. Accepts NULL. */
void tsr_metrics_http_destroy(tsr_metrics_http *h);

/* ---- the request parser, callable on a buffer (fuzzing, tests) ------------------------ */

enum tsr_http_parse {
    TSR_HTTP_INCOMPLETE = 0, /* need more bytes */
    TSR_HTTP_DONE = 1,       /* a complete request head was parsed */
    TSR_HTTP_BAD = -1,       /* malformed: answer 400 */
    TSR_HTTP_TOO_LARGE = -2, /* head exceeds TSR_METRICS_HTTP_MAX_REQUEST: answer 431 */
};

typedef struct tsr_http_request {
    char method[16];  /* "GET", ... (token characters only) */
    char path[256];   /* target without the query string; longer targets → BAD */
    int minor;        /* HTTP/1.<minor> */
    size_t head_len;  /* bytes of the head including the blank line */
} tsr_http_request;

/* Parses the request head at buf[0..len). Borrows buf. Never reads past len. */
int tsr_http_parse_request(const char *buf, size_t len, tsr_http_request *req);

/* Builds the full response for a parsed request (or for a parse result < 0, req may then
 * be NULL). Returns a new buffer (caller frees) and its length, or NULL when out of
 * memory. Exposed so the fuzzer and the tests exercise the routing too. */
char *tsr_http_respond(int parse_result, const tsr_http_request *req, int healthy, size_t *len);

#endif
