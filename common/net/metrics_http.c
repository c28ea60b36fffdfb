/*
 * metrics_http — the /metrics and /healthz HTTP/1.1 listener (see metrics_http.h), and its
 * request parser, factored to work on a plain buffer so it can be fuzzed.
 *
 * DESIGN (threads): everything under `struct tsr_metrics_http` except `stop_async` and
 * `thread` is touched only by the loop thread once it runs. Connections are a doubly
 * linked list owned by the loop, so stop can close them all. Each connection has a fixed
 * buffer of TSR_METRICS_HTTP_MAX_REQUEST bytes (no allocation driven by the client) and
 * one timer that bounds its whole life (reading the request and writing the answer).
 */
#include "net/metrics_http.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "net/metrics.h"

/* ---- parser --------------------------------------------------------------------------- */

static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Finds the end of the head (after "\r\n\r\n" or "\n\n"), 0 when not there yet. */
static size_t head_end(const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (b[i] != '\n') continue;
        if (i + 1 < len && b[i + 1] == '\n') return i + 2;
        if (i + 2 < len && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* Parses "METHOD SP target SP HTTP/1.d" in line[0..n) (no line ending). */
static int parse_request_line(const char *line, size_t n, tsr_http_request *req)
{
    size_t i = 0, m = 0;
    while (i < n && is_tchar((unsigned char)line[i])) {
        if (m + 1 >= sizeof req->method) return TSR_HTTP_BAD;
        req->method[m++] = line[i++];
    }
    req->method[m] = 0;
    if (m == 0 || i >= n || line[i] != ' ') return TSR_HTTP_BAD;
    i++;
    size_t t0 = i;
    while (i < n && (unsigned char)line[i] > 0x20 && (unsigned char)line[i] < 0x7f) i++;
    size_t tlen = i - t0;
    if (tlen == 0 || line[t0] != '/' || i >= n || line[i] != ' ') return TSR_HTTP_BAD;
    size_t plen = 0;
    while (plen < tlen && line[t0 + plen] != '?' && line[t0 + plen] != '#') plen++;
    if (plen >= sizeof req->path) return TSR_HTTP_BAD;
    memcpy(req->path, line + t0, plen);
    req->path[plen] = 0;
    i++;
    if (n - i != 8 || memcmp(line + i, "HTTP/1.", 7) != 0) return TSR_HTTP_BAD;
    char d = line[i + 7];
    if (d < '0' || d > '9') return TSR_HTTP_BAD;
    req->minor = d - '0';
    return TSR_HTTP_DONE;
}

/* One header line "name: value" (no line ending). */
static int valid_header(const char *line, size_t n)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)line[i])) i++;
    if (i == 0 || i >= n || line[i] != ':') return 0; /* also rejects obs-fold lines */
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return 0;
    }
    return 1;
}

int tsr_http_parse_request(const char *buf, size_t len, tsr_http_request *req)
{
    memset(req, 0, sizeof *req);
    size_t scan = len < TSR_METRICS_HTTP_MAX_REQUEST ? len : TSR_METRICS_HTTP_MAX_REQUEST;
    /* Judge the request line as soon as it is complete, so garbage is refused early. */
    const char *nl = memchr(buf, '\n', scan);
    if (!nl) {
        for (size_t i = 0; i < scan; i++) /* a request line is printable ASCII */
            if ((unsigned char)buf[i] < 0x20 && buf[i] != '\r') return TSR_HTTP_BAD;
        return scan >= TSR_METRICS_HTTP_MAX_REQUEST ? TSR_HTTP_TOO_LARGE : TSR_HTTP_INCOMPLETE;
    }
    size_t ln = (size_t)(nl - buf);
    if (ln && buf[ln - 1] == '\r') ln--;
    int rc = parse_request_line(buf, ln, req);
    if (rc != TSR_HTTP_DONE) return rc;
    size_t end = head_end(buf, scan);
    if (!end) {
        return scan >= TSR_METRICS_HTTP_MAX_REQUEST ? TSR_HTTP_TOO_LARGE : TSR_HTTP_INCOMPLETE;
    }
    /* Header lines between the request line and the blank line. */
    size_t p = (size_t)(nl - buf) + 1;
    while (p < end) {
        const char *e = memchr(buf + p, '\n', end - p);
        if (!e) return TSR_HTTP_BAD;
        size_t n = (size_t)(e - (buf + p));
        if (n && buf[p + n - 1] == '\r') n--;
        if (n == 0) break; /* the blank line */
        if (!valid_header(buf + p, n)) return TSR_HTTP_BAD;
        p = (size_t)(e - buf) + 1;
    }
    req->head_len = end;
    return TSR_HTTP_DONE;
}

static char *make_response(int status, const char *reason, const char *ctype, const char *extra,
                           const char *body, size_t blen, int head_only, size_t *len)
{
    char hdr[512];
    int hn = snprintf(hdr, sizeof hdr,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                      "Connection: close\r\n\r\n",
                      status, reason, ctype, blen, extra ? extra : "");
    if (hn < 0 || (size_t)hn >= sizeof hdr) return NULL;
    size_t total = (size_t)hn + (head_only ? 0 : blen);
    char *out = malloc(total + 1);
    if (!out) return NULL;
    memcpy(out, hdr, (size_t)hn);
    if (!head_only && blen) memcpy(out + hn, body, blen);
    out[total] = 0;
    *len = total;
    return out;
}

char *tsr_http_respond(int pr, const tsr_http_request *req, int healthy, size_t *len)
{
    static const char text[] = "text/plain; charset=utf-8";
    if (pr == TSR_HTTP_TOO_LARGE || !req) {
        static const char b[] = "request header fields too large\n";
        if (pr != TSR_HTTP_TOO_LARGE) goto bad;
        return make_response(431, "Request Header Fields Too Large", text, NULL, b, sizeof b - 1,
                             0, len);
    }
    if (pr != TSR_HTTP_DONE) goto bad;
    int head = strcmp(req->method, "HEAD") == 0;
    if (!head && strcmp(req->method, "GET") != 0) {
        static const char b[] = "method not allowed\n";
        return make_response(405, "Method Not Allowed", text, "Allow: GET, HEAD\r\n", b,
                             sizeof b - 1, 0, len);
    }
    if (strcmp(req->path, "/metrics") == 0) {
        size_t bl = 0;
        char *body = tsr_metrics_render(&bl);
        if (!body) return NULL;
        char *out = make_response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL,
                                  body, bl, head, len);
        free(body);
        return out;
    }
    if (strcmp(req->path, "/healthz") == 0) {
        if (healthy) return make_response(200, "OK", text, NULL, "ok\n", 3, head, len);
        return make_response(503, "Service Unavailable", text, NULL, "unhealthy\n", 10, head, len);
    }
    {
        static const char b[] = "not found\n";
        return make_response(404, "Not Found", text, NULL, b, sizeof b - 1, head, len);
    }
bad: {
    static const char b[] = "bad request\n";
    return make_response(400, "Bad Request", text, NULL, b, sizeof b - 1, 0, len);
}
}

/* ---- listener ------------------------------------------------------------------------- */

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    struct tsr_metrics_http *h;
    struct conn *prev, *next;
    char *resp;
    size_t len;
    int closing;
    int open_handles;
    char buf[TSR_METRICS_HTTP_MAX_REQUEST];
};

struct tsr_metrics_http {
    uv_loop_t loop;
    uv_tcp_t server;
    uv_async_t stop_async;
    pthread_t thread;
    int thread_started;
    int port;
    int idle_ms, max_conns, nconns;
    int (*healthy)(void *);
    void *healthy_ud;
    struct conn *conns;
};

void tsr_metrics_http_opts_init(tsr_metrics_http_opts *o)
{
    memset(o, 0, sizeof *o);
    o->listen = "127.0.0.1:9100";
}

static void conn_handle_closed(uv_handle_t *hd)
{
    struct conn *c = hd->data;
    if (--c->open_handles == 0) {
        free(c->resp);
        free(c);
    }
}

static void conn_close(struct conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    if (c->prev) c->prev->next = c->next;
    else c->h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->h->nconns--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
}

static void on_timeout(uv_timer_t *t) { conn_close(t->data); }

static void on_shutdown(uv_shutdown_t *r, int status) { conn_close(r->data); }

static void on_write(uv_write_t *w, int status)
{
    struct conn *c = w->data;
    if (c->closing) return;
    if (status < 0 || uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        conn_close(c);
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *b)
{
    struct conn *c = hd->data;
    *b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
}

static void respond(struct conn *c, int pr, const tsr_http_request *req)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
    int healthy = c->h->healthy ? c->h->healthy(c->h->healthy_ud) != 0 : 1;
    c->resp = tsr_http_respond(pr, req, healthy, &c->len);
    if (!c->resp) {
        conn_close(c);
        return;
    }
    uv_buf_t b = uv_buf_init(c->resp, (unsigned)c->len);
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) conn_close(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    struct conn *c = s->data;
    if (c->closing) return;
    if (nread < 0) { /* EOF before a full request, reset, or ENOBUFS */
        conn_close(c);
        return;
    }
    if (nread == 0) return;
    c->len += (size_t)nread;
    tsr_http_request req;
    int pr = tsr_http_parse_request(c->buf, c->len, &req);
    if (pr == TSR_HTTP_INCOMPLETE) return;
    respond(c, pr, pr == TSR_HTTP_DONE ? &req : NULL);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct tsr_metrics_http *h = server->data;
    if (status < 0) return;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) return; /* out of memory: leave it in the backlog, the kernel times it out */
    c->h = h;
    uv_tcp_init(&h->loop, &c->tcp);
    uv_timer_init(&h->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->wreq.data = c->sreq.data = c;
    c->open_handles = 2;
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || h->nconns > h->max_conns) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, (uint64_t)h->idle_ms, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

static void on_stop(uv_async_t *a)
{
    struct tsr_metrics_http *h = a->data;
    while (h->conns) conn_close(h->conns);
    uv_close((uv_handle_t *)&h->server, NULL);
    uv_close((uv_handle_t *)&h->stop_async, NULL);
}

static void *loop_main(void *arg)
{
    struct tsr_metrics_http *h = arg;
    uv_run(&h->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* "host:port", "[v6]:port", ":port". Fills addr. */
static int parse_listen(const char *listen, struct sockaddr_storage *addr, tsr_error *err)
{
    if (!listen) return tsr_err(err, TSR_EINVAL, "metrics listen address: missing");
    const char *colon = strrchr(listen, ':');
    if (!colon) return tsr_err(err, TSR_EINVAL, "metrics listen address '%s': expected host:port", listen);
    char *endp;
    long port = strtol(colon + 1, &endp, 10);
    if (colon[1] == 0 || *endp || port < 0 || port > 65535)
        return tsr_err(err, TSR_EINVAL, "metrics listen address '%s': port must be 0..65535", listen);
    char host[128];
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host) return tsr_err(err, TSR_EINVAL, "metrics listen address '%s': host too long", listen);
    memcpy(host, listen, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
        if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)addr) == 0) return 0;
    } else {
        if (hl == 0) strcpy(host, "127.0.0.1"); /* ":PORT": loopback, never all addresses */
        if (strcmp(host, "localhost") == 0) strcpy(host, "127.0.0.1");
        if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)addr) == 0) return 0;
    }
    return tsr_err(err, TSR_EINVAL,
                   "metrics listen address '%s': host must be an IP literal (or localhost)", listen);
}

tsr_metrics_http *tsr_metrics_http_create(const tsr_metrics_http_opts *o, tsr_error *err)
{
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    if (!o || parse_listen(o->listen, &addr, err) != 0) {
        if (!o) tsr_err(err, TSR_EINVAL, "metrics listener: no options");
        return NULL;
    }
    /* A client that resets mid-response must not kill the process with SIGPIPE. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

    struct tsr_metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        tsr_err(err, TSR_ENOMEM, "metrics listener: out of memory");
        return NULL;
    }
    h->idle_ms = o->idle_ms > 0 ? o->idle_ms : 5000;
    h->max_conns = o->max_conns > 0 ? o->max_conns : 64;
    h->healthy = o->healthy;
    h->healthy_ud = o->healthy_ud;
    int rc = uv_loop_init(&h->loop);
    if (rc != 0) {
        tsr_err(err, TSR_ENOMEM, "metrics listener: uv_loop_init: %s", uv_strerror(rc));
        free(h);
        return NULL;
    }
    uv_tcp_init(&h->loop, &h->server);
    uv_async_init(&h->loop, &h->stop_async, on_stop);
    h->server.data = h->stop_async.data = h;
    rc = uv_tcp_bind(&h->server, (const struct sockaddr *)&addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&h->server, 128, on_connection);
    if (rc != 0) {
        tsr_err(err, TSR_EUNAVAILABLE, "metrics listener: cannot listen on %s: %s", o->listen,
                uv_strerror(rc));
        goto fail;
    }
    struct sockaddr_storage bound;
    int blen = (int)sizeof bound;
    if (uv_tcp_getsockname(&h->server, (struct sockaddr *)&bound, &blen) == 0) {
        if (bound.ss_family == AF_INET6)
            h->port = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
        else
            h->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    }
    if (pthread_create(&h->thread, NULL, loop_main, h) != 0) {
        tsr_err(err, TSR_ENOMEM, "metrics listener: cannot start its thread");
        goto fail;
    }
    h->thread_started = 1;
    return h;
fail:
    uv_close((uv_handle_t *)&h->server, NULL);
    uv_close((uv_handle_t *)&h->stop_async, NULL);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    uv_loop_close(&h->loop);
    free(h);
    return NULL;
}

tsr_metrics_http *tsr_metrics_http_start(const char *listen, tsr_error *err)
{
    tsr_metrics_http_opts o;
    tsr_metrics_http_opts_init(&o);
    o.listen = listen;
    return tsr_metrics_http_create(&o, err);
}

int tsr_metrics_http_port(const tsr_metrics_http *h) { return h ? h->port : 0; }

void tsr_metrics_http_destroy(tsr_metrics_http *h)
{
    if (!h) return;
    if (h->thread_started) {
        uv_async_send(&h->stop_async);
        pthread_join(h->thread, NULL);
    }
    uv_loop_close(&h->loop);
    free(h);
}
