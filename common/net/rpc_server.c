/*
 * rpc_server — a generic unary gRPC server on gRPC C core 1.51 (API in rpc.h).
 *
 * One state machine per call, the call context's address is the tag
 * (GRPC_C_CORE.md "Server call sequence"):
 *   REQUESTED  grpc_server_request_call armed on a queue; on its event a new request is
 *              armed first, then the method is looked up: unknown → final batch with
 *              UNIMPLEMENTED; known → batch {RECV_MESSAGE}
 *   READING    ok=0 or no message: the client went away → free. Otherwise run the
 *              handler here (short) or hand the call to the worker pool (TSR_RPC_LONG)
 *   SENDING    final batch {SEND_INITIAL_METADATA, SEND_MESSAGE (if OK),
 *              SEND_STATUS_FROM_SERVER, RECV_CLOSE_ON_SERVER}; on its event free all.
 *   FANOUT     (tsr_rpc_reply_fanout) the handler started client calls on this call's
 *              queue and returned; their events come to the same pollers (tagged
 *              struct tsr__ccall, told apart from call contexts by their first member);
 *              the thread whose event completes the fan-out runs the done callback, which
 *              replies (SENDING) or starts another fan-out.
 *   HELD       (tsr_rpc_reply_hold) the handler or done callback returned without an
 *              answer; whoever comes last of its return and tsr_rpc_reply_release (any
 *              thread; an atomic count of 2) settles and sends (SENDING).
 *   Server fan-outs (tsr_rpc_server_fanout) are client calls on a server queue owned by
 *   no call (struct afan with owner NULL): the thread that completes the last runs their
 *   done; each counts as one in `alive`, so shutdown waits for it.
 * Only one batch is outstanding per call at any time, so the event of a call is handled
 * by exactly one thread and the call context needs no lock. A fan-out's client calls
 * complete on any poller of the queue, concurrently: each fills only its own result, and
 * an atomic count (calls in flight + 1 held by the code that started them until it has
 * returned) decides which thread continues, so the handler and done never overlap.
 *
 * DESIGN (threads, ownership, locks)
 * - `pollers` (default 1) polling threads per completion queue (`cqs` queues, default 1) block in
 *   grpc_completion_queue_next and run the state machine (and short handlers).
 *   `workers` threads run LONG handlers and start the final batch themselves
 *   (grpc_call_start_batch is thread-safe).
 * - LONG calls: a LONG call runs on the polling thread that received it when another
 *   polling thread of the same queue is free (slot->avail > 1, taken with a CAS), so at
 *   least one thread always polls every queue; otherwise it goes to the worker pool.
 *   Running it in place saves the hand-off (queue + futex wake of a worker + a context
 *   switch on the critical path, tens to ~150 µs on a loaded 2-core machine, measured by
 *   bench/bench_e2e.c through the coordinator). TSR_RPC_INLINE_LONG=0 in the environment
 *   turns it off (every LONG call through the pool, as before), for A/B measurements.
 * - Why few pollers: gRPC 1.51's epoll1 engine has one epoll set per process and one
 *   designated polling thread at a time; when it returns from epoll_wait it wakes another
 *   waiting thread to poll in its place (a futex wake and often a context switch), and an
 *   event for a queue whose thread did not read it wakes that thread too. Every extra
 *   thread blocked in grpc_completion_queue_next adds wake-ups to every call; the
 *   coordinator runs one queue with one poller and never blocks it (asynchronous fan-out).
 * - A call context is owned by whichever thread handles its current event; it is handed
 *   to a worker through the work queue; it is freed by the thread handling its last event.
 *   During a fan-out it is owned by the fan-out (the thread that completes it).
 * - Authorization (rpc.h): checked in on_event when the call arrives, before its message
 *   is read; a refused call goes straight to the final batch, as an unknown method does.
 *   s->auth_mu (rwlock) guards s->tokens only and is taken around the check; it is a leaf.
 * - s->mu guards: stopping, alive (number of call contexts, including armed requests),
 *   shutdown_seen, and health. arm() holds s->mu around grpc_server_request_call so that a
 *   request is never armed after grpc_server_shutdown_and_notify (that aborts in core).
 *   s->wq_mu guards the work queue. Lock order: wq_mu is never held while taking mu or
 *   calling into gRPC.
 * - Shutdown (exactly as GRPC_C_CORE.md says): stopping flag + shutdown_and_notify under
 *   mu; wait grace_ms for the tag; cancel_all_calls; wait for the tag and for alive == 0
 *   (running handlers included); stop workers; shut the queues down; pollers drain until
 *   GRPC_QUEUE_SHUTDOWN and exit; join; destroy server and queues; grpc_shutdown.
 */
#include "net/rpc.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "core/log.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/metrics.h"
#include "net/rpc_int.h"

#define MAX_METHODS 64
#define MAX_HEALTH 32
#define HEALTH_NAME_MAX 128
#define HEALTH_CHECK_PATH "/grpc.health.v1.Health/Check"
/* Default polling threads per completion queue, and queues: one of each. Every further
 * polling thread adds wake-ups to every event (see "Why few pollers" above); measured with
 * bench/bench_e2e.c through the coordinator and the shards (docs/performance.md "End to
 * end"): one poller per process halved the bare hop and cut the shard calls by ~40 %. With
 * one, LONG handlers always run on the worker pool. */
#define POLLERS_PER_CQ 1
#define DEFAULT_CQS 1
#define MAX_POLLERS_PER_CQ 8

struct method {
    char *path;
    size_t path_len;
    tsr_rpc_handler_fn fn;
    void *ctx;
    unsigned flags;
    int role; /* level a call needs (rpc.h "authorization"); INT_MAX = the highest */
    const ProtobufCMessageDescriptor *req_type; /* NULL = no nesting check */
    struct tsr__rpc_binding bound; /* a typed method's ctx (tsr__rpc_server_add_bound) */
};

struct slot {
    struct tsr_rpc_server *srv;
    grpc_completion_queue *cq;
    pthread_t threads[MAX_POLLERS_PER_CQ];
    int nthreads;      /* started */
    atomic_int avail;  /* of them, not running a LONG handler inline */
};

enum call_state { CS_REQUESTED, CS_READING, CS_SENDING };

struct call;

struct tsr_rpc_reply {
    struct call *call;
    grpc_slice resp;
    int has_resp;
    int code;  /* TSR_RPC_OK unless an error was set */
    char *msg; /* status message or NULL */
};

/* An asynchronous fan-out of one call (tsr_rpc_reply_fanout). `left` counts the client
 * calls still in flight plus one held by the code that started it until that code has
 * returned (the handler or a done callback): whoever brings it to zero runs done. */
struct afan {
    struct call *owner;         /* NULL: a server fan-out (tsr_rpc_server_fanout) */
    tsr_rpc_fanout_call *calls; /* the caller's, borrowed */
    size_t n;
    atomic_size_t left;
    tsr_rpc_fanout_done_fn done;
    tsr_rpc_calls_done_fn sdone; /* a server fan-out's */
    struct tsr_rpc_server *srv;  /* a server fan-out's (counted in srv->alive) */
    void *ud;
    struct tsr__ccall cc[];
};

struct call {
    int kind; /* TSR__TAG_SERVER_CALL; must stay first (rpc_int.h) */
    enum call_state state;
    struct tsr_rpc_server *srv;
    struct slot *slot;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array req_md;
    grpc_byte_buffer *recv;
    const struct method *m;
    grpc_slice req;
    int has_req;
    grpc_byte_buffer *send;
    grpc_slice status_details;
    int has_status_details;
    int client_cancelled; /* RECV_CLOSE_ON_SERVER output */
    struct tsr_rpc_reply reply;
    struct afan *fan;  /* the fan-out in flight, or NULL */
    /* tsr_rpc_reply_hold: 0 = not held; else 2 at the hold, one taken when the handler
     * returns and one by tsr_rpc_reply_release; whoever takes the last sends the reply */
    atomic_int hold;
    int held_rc;       /* the rc given to tsr_rpc_reply_release */
    double t0;         /* when the call arrived (tsr_metrics_now), for the latency metric */
    struct call *next; /* work queue link */
};

struct health_entry {
    char name[HEALTH_NAME_MAX];
    int status;
};

struct tsr_rpc_server {
    grpc_server *server;
    struct slot *slots;
    int nslots;
    int port;
    size_t max_message;
    int grace_ms;
    int pending_per_cq;
    int pollers_per_cq;

    struct method methods[MAX_METHODS];
    int nmethods;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on shutdown_seen and on alive reaching 0 */
    int started, stopping, shutdown_done, destroyed_grpc;
    int shutdown_seen;
    long alive;
    atomic_int cancelling;
    struct health_entry health[MAX_HEALTH];
    int nhealth;
    char shutdown_tag; /* its address is the shutdown_and_notify tag */

    int inline_long; /* LONG calls may run on the receiving poller (see DESIGN) */
    char *wrong_port_hint; /* tsr_rpc_server_opts.wrong_port_hint (NULL = none) */
    atomic_uint next_slot; /* tsr_rpc_server_fanout's round robin over the queues */

    /* authorization: the token set (NULL = none), swapped by set_tokens under auth_mu
     * (write), read by the pollers under auth_mu (read); a leaf lock */
    pthread_rwlock_t auth_mu;
    tsr_rpc_tokens *tokens;

    /* worker pool */
    pthread_mutex_t wq_mu;
    pthread_cond_t wq_cv;
    struct call *wq_head, *wq_tail;
    int wq_len, wq_max, wq_stop;
    pthread_t *workers;
    int nworkers, nworkers_started;
};

static void send_final(struct call *c);

/* ------------------------------------------------------------------ call contexts -- */

static void reply_clear_resp(struct tsr_rpc_reply *r)
{
    if (r->has_resp) {
        grpc_slice_unref(r->resp);
        r->has_resp = 0;
    }
}

/* One call context or server fan-out fewer (shutdown waits for none). */
static void alive_drop(struct tsr_rpc_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->alive--;
    if (s->alive == 0)
        pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void destroy_call(struct call *c)
{
    struct tsr_rpc_server *s = c->srv;
    if (c->call)
        grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->req_md);
    if (c->recv)
        grpc_byte_buffer_destroy(c->recv);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    if (c->has_req)
        grpc_slice_unref(c->req);
    if (c->has_status_details)
        grpc_slice_unref(c->status_details);
    reply_clear_resp(&c->reply);
    free(c->reply.msg);
    free(c);
    alive_drop(s);
}

/* Arms one grpc_server_request_call on slot's queue (never after shutdown began). */
static void arm(struct slot *slot)
{
    struct tsr_rpc_server *s = slot->srv;
    struct call *c = calloc(1, sizeof *c);
    if (!c) {
        tsr_error_log("rpc: out of memory arming a call slot");
        return;
    }
    c->kind = TSR__TAG_SERVER_CALL;
    c->srv = s;
    c->slot = slot;
    c->state = CS_REQUESTED;
    c->reply.call = c;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->req_md);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        grpc_call_details_destroy(&c->details);
        grpc_metadata_array_destroy(&c->req_md);
        free(c);
        return;
    }
    s->alive++;
    TSR_TSAN_RELEASE(c);
    grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->req_md,
                                                 slot->cq, slot->cq, c);
    if (e != GRPC_CALL_OK) {
        s->alive--;
        pthread_mutex_unlock(&s->mu);
        tsr_error_log("rpc: grpc_server_request_call failed (%d)", (int)e);
        grpc_call_details_destroy(&c->details);
        grpc_metadata_array_destroy(&c->req_md);
        free(c);
        return;
    }
    pthread_mutex_unlock(&s->mu);
}

static const struct method *find_method(const struct tsr_rpc_server *s, grpc_slice path)
{
    size_t n = GRPC_SLICE_LENGTH(path);
    const uint8_t *p = GRPC_SLICE_START_PTR(path);
    for (int i = 0; i < s->nmethods; i++)
        if (s->methods[i].path_len == n && memcmp(s->methods[i].path, p, n) == 0)
            return &s->methods[i];
    return NULL;
}

/* 1 when a method of the path's service ("/pkg.Service/") is registered here. */
static int serves_service_of(const struct tsr_rpc_server *s, grpc_slice path)
{
    size_t n = GRPC_SLICE_LENGTH(path);
    const char *p = (const char *)GRPC_SLICE_START_PTR(path);
    const char *slash = n > 1 ? memchr(p + 1, '/', n - 1) : NULL;
    if (!slash)
        return 0;
    size_t svc = (size_t)(slash - p) + 1; /* "/pkg.Service/" */
    for (int i = 0; i < s->nmethods; i++)
        if (s->methods[i].path_len > svc && memcmp(s->methods[i].path, p, svc) == 0)
            return 1;
    return 0;
}

/* The UNIMPLEMENTED message: the path, and the server's wrong-port hint when the path's
 * service is not one this server serves (a coordinator method sent to a shard's port). */
static void unknown_method_message(const struct tsr_rpc_server *s, grpc_slice path, char *buf,
                                   size_t cap)
{
    size_t n = GRPC_SLICE_LENGTH(path);
    int shown = (int)(n > 200 ? 200 : n);
    const char *p = (const char *)GRPC_SLICE_START_PTR(path);
    if (s->wrong_port_hint && !serves_service_of(s, path))
        snprintf(buf, cap, "unknown method %.*s: %s", shown, p, s->wrong_port_hint);
    else
        snprintf(buf, cap, "unknown method %.*s", shown, p);
}

static void set_status(struct tsr_rpc_reply *r, int code, const char *msg)
{
    free(r->msg);
    r->code = code;
    size_t n = strlen(msg);
    if (n > TSR_RPC_MAX_STATUS_MESSAGE)
        n = TSR_RPC_MAX_STATUS_MESSAGE;
    r->msg = tsr_xstrndup(msg, n);
    reply_clear_resp(r);
}

/* The status after a handler or a done callback returned rc. */
static void settle(struct call *c, int rc)
{
    struct tsr_rpc_reply *r = &c->reply;
    if (r->code == TSR_RPC_OK && rc < 0)
        set_status(r, tsr_rpc_status_from_error(rc), tsr_strerror(rc));
    if (r->code == TSR_RPC_OK && r->has_resp && GRPC_SLICE_LENGTH(r->resp) > c->srv->max_message) {
        char buf[160];
        snprintf(buf, sizeof buf, "reply of %zu bytes exceeds the maximum message size %zu",
                 (size_t)GRPC_SLICE_LENGTH(r->resp), c->srv->max_message);
        set_status(r, TSR_RPC_RESOURCE_EXHAUSTED, buf);
    }
}

/* The handler or done callback that ran last returned rc: sends the reply, unless it is
 * held (tsr_rpc_reply_hold) — then that return is one of the hold's two takes and whoever
 * takes the last (this or tsr_rpc_reply_release) sends it. */
static void reply_done(struct call *c, int rc)
{
    if (atomic_load(&c->hold)) {
        if (atomic_fetch_sub(&c->hold, 1) == 1) {
            settle(c, c->held_rc);
            send_final(c);
        }
        return;
    }
    settle(c, rc);
    send_final(c);
}

/* Runs done callbacks while the fan-out they wait for has completed; then sends the
 * reply. Called by the thread that brought c->fan->left to zero. */
static void fan_complete(struct call *c)
{
    for (;;) {
        struct afan *f = c->fan;
        c->fan = NULL;
        int rc = f->done(f->ud, &c->reply, f->calls, f->n);
        free(f);
        if (c->fan) { /* the callback started another fan-out: release its hold */
            if (atomic_fetch_sub(&c->fan->left, 1) == 1)
                continue;
            return;
        }
        reply_done(c, rc);
        return;
    }
}

/* Runs the handler; sends the reply unless it started a fan-out (then the thread that
 * completes the fan-out continues). c may be gone when this returns. */
static void run_handler(struct call *c)
{
    struct tsr_rpc_reply *r = &c->reply;
    const uint8_t *p = c->has_req ? GRPC_SLICE_START_PTR(c->req) : NULL;
    size_t n = c->has_req ? GRPC_SLICE_LENGTH(c->req) : 0;
    if (n == 0)
        p = NULL;
    int rc;
    if (c->m->req_type && tsr_rpc_too_deep(c->m->req_type, p, n, TSR_RPC_MAX_DEPTH))
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "%s: sub-messages nest deeper "
                                 "than %d levels", c->m->req_type->short_name,
                                 TSR_RPC_MAX_DEPTH);
    else
        rc = c->m->fn(c->m->ctx, p, n, r);
    if (c->fan) {
        if (atomic_fetch_sub(&c->fan->left, 1) == 1)
            fan_complete(c);
        return;
    }
    reply_done(c, rc);
}

/* A server fan-out has completed: its done runs, then it is gone. */
static void sfan_complete(struct afan *f)
{
    struct tsr_rpc_server *s = f->srv;
    f->sdone(f->ud, f->calls, f->n);
    free(f);
    alive_drop(s);
}

/* The event of a client call started by tsr_rpc_reply_fanout or tsr_rpc_server_fanout. */
static void on_client_event(struct tsr__ccall *cc)
{
    struct afan *f = cc->owner;
    tsr__ccall_finish(cc, &f->calls[cc->index]);
    if (atomic_fetch_sub(&f->left, 1) == 1) {
        if (f->owner)
            fan_complete(f->owner);
        else
            sfan_complete(f);
    }
}

/* ------------------------------------------------------------------- worker pool -- */

/* Queues a LONG call; returns 0, or -1 when the queue is full or stopping. */
static int enqueue(struct tsr_rpc_server *s, struct call *c)
{
    pthread_mutex_lock(&s->wq_mu);
    if (s->wq_stop || s->wq_len >= s->wq_max) {
        pthread_mutex_unlock(&s->wq_mu);
        return -1;
    }
    c->next = NULL;
    if (s->wq_tail)
        s->wq_tail->next = c;
    else
        s->wq_head = c;
    s->wq_tail = c;
    s->wq_len++;
    pthread_cond_signal(&s->wq_cv);
    pthread_mutex_unlock(&s->wq_mu);
    return 0;
}

static void *worker_main(void *arg)
{
    struct tsr_rpc_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->wq_mu);
        while (!s->wq_head && !s->wq_stop)
            pthread_cond_wait(&s->wq_cv, &s->wq_mu);
        struct call *c = s->wq_head;
        if (!c) { /* stopping and empty */
            pthread_mutex_unlock(&s->wq_mu);
            return NULL;
        }
        s->wq_head = c->next;
        if (!s->wq_head)
            s->wq_tail = NULL;
        s->wq_len--;
        pthread_mutex_unlock(&s->wq_mu);
        if (atomic_load(&s->cancelling)) { /* shutdown past its grace: do not start work */
            set_status(&c->reply, TSR_RPC_UNAVAILABLE, "server shutting down");
            send_final(c);
        } else {
            run_handler(c); /* sends the reply (now or after its fan-out) */
        }
    }
}

/* ------------------------------------------------------------------- state machine -- */

static void send_final(struct call *c)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    struct tsr_rpc_reply *r = &c->reply;
    /* Unknown methods share one label so a hostile client cannot mint series. */
    tsr_metrics_rpc_observe(c->m ? c->m->path : "unknown", r->code, tsr_metrics_now() - c->t0);

    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 0;
    n++;
    if (r->code == TSR_RPC_OK) {
        grpc_slice body = r->has_resp ? grpc_slice_ref(r->resp) : grpc_empty_slice();
        c->send = grpc_raw_byte_buffer_create(&body, 1);
        grpc_slice_unref(body);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->send;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = (grpc_status_code)r->code;
    if (r->msg) {
        c->status_details = grpc_slice_from_copied_string(r->msg);
        c->has_status_details = 1;
        ops[n].data.send_status_from_server.status_details = &c->status_details;
    }
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->client_cancelled;
    n++;
    c->state = CS_SENDING;
    grpc_call *call = c->call; /* c may be freed by a poller as soon as the batch starts */
    TSR_TSAN_RELEASE(c);
    grpc_call_error e = grpc_call_start_batch(call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        tsr_error_log("rpc: final batch failed to start (%d)", (int)e);
        destroy_call(c);
    }
}

/* Takes this queue's permission to run a LONG handler in place: succeeds only while
 * another of its polling threads stays free. */
static int take_poller(struct slot *sl)
{
    int a = atomic_load(&sl->avail);
    while (a > 1)
        if (atomic_compare_exchange_weak(&sl->avail, &a, a - 1))
            return 1;
    return 0;
}

/* Checks the call against the token set; on refusal sends the status and returns 0 (the
 * call is then owned by its final batch). */
static int authorized(struct tsr_rpc_server *s, struct call *c)
{
    char msg[256];
    int code = TSR_RPC_OK;
    pthread_rwlock_rdlock(&s->auth_mu);
    if (s->tokens)
        code = tsr__rpc_auth_check(s->tokens, &c->req_md, c->m ? c->m->role : INT_MAX, msg,
                                   sizeof msg);
    pthread_rwlock_unlock(&s->auth_mu);
    if (code == TSR_RPC_OK)
        return 1;
    set_status(&c->reply, code, msg);
    send_final(c);
    return 0;
}

static void on_event(struct call *c, int ok)
{
    struct tsr_rpc_server *s = c->srv;
    switch (c->state) {
    case CS_REQUESTED: {
        if (!ok) { /* server shutting down: the armed request is failed */
            destroy_call(c);
            return;
        }
        arm(c->slot); /* re-arm first, so new calls are not delayed by this one */
        c->t0 = tsr_metrics_now();
        c->m = find_method(s, c->details.method);
        if (!authorized(s, c))
            return;
        if (!c->m) {
            char buf[768];
            unknown_method_message(s, c->details.method, buf, sizeof buf);
            set_status(&c->reply, TSR_RPC_UNIMPLEMENTED, buf);
            /* one line per method name a minute (a client may call it in a loop) */
            tsr_log_every(TSR_LOG_WARN, buf, 60000, "rpc: %s: answered UNIMPLEMENTED", buf);
            send_final(c);
            return;
        }
        c->state = CS_READING;
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &c->recv;
        grpc_call *call = c->call;
        TSR_TSAN_RELEASE(c);
        grpc_call_error e = grpc_call_start_batch(call, &op, 1, c, NULL);
        if (e != GRPC_CALL_OK) {
            tsr_error_log("rpc: RECV_MESSAGE batch failed to start (%d)", (int)e);
            destroy_call(c);
        }
        return;
    }
    case CS_READING:
        if (!ok) { /* client cancelled or its deadline passed */
            destroy_call(c);
            return;
        }
        if (!c->recv) {
            set_status(&c->reply, TSR_RPC_INVALID_ARGUMENT, "no request message");
            send_final(c);
            return;
        }
        c->req = tsr__rpc_buffer_to_slice(c->recv);
        c->has_req = 1;
        grpc_byte_buffer_destroy(c->recv);
        c->recv = NULL;
        if (c->m->flags & TSR_RPC_LONG) {
            struct slot *sl = c->slot;
            if (s->inline_long && take_poller(sl)) {
                if (atomic_load(&s->cancelling)) {
                    set_status(&c->reply, TSR_RPC_UNAVAILABLE, "server shutting down");
                    send_final(c);
                } else {
                    run_handler(c); /* c may be gone after this */
                }
                atomic_fetch_add(&sl->avail, 1);
                return;
            }
            if (enqueue(s, c) != 0) {
                set_status(&c->reply, TSR_RPC_RESOURCE_EXHAUSTED,
                           "server busy: too many long calls queued");
                send_final(c);
            }
            return;
        }
        run_handler(c);
        return;
    case CS_SENDING:
        destroy_call(c);
        return;
    }
}

static void *poller_main(void *arg)
{
    struct slot *slot = arg;
    struct tsr_rpc_server *s = slot->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(slot->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                   NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->mu);
            s->shutdown_seen = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        TSR_TSAN_ACQUIRE(ev.tag);
        if (*(const int *)ev.tag == TSR__TAG_CLIENT_CALL)
            on_client_event(ev.tag);
        else
            on_event(ev.tag, ev.success);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ health -- */

static struct health_entry *health_find(struct tsr_rpc_server *s, const char *name, size_t n)
{
    for (int i = 0; i < s->nhealth; i++)
        if (strlen(s->health[i].name) == n && memcmp(s->health[i].name, name, n) == 0)
            return &s->health[i];
    return NULL;
}

int tsr_rpc_server_set_health(tsr_rpc_server *s, const char *service, int status)
{
    if (!service)
        service = "";
    size_t n = strlen(service);
    if (n >= HEALTH_NAME_MAX)
        return TSR_EINVAL;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    struct health_entry *e = health_find(s, service, n);
    if (!e) {
        if (s->nhealth >= MAX_HEALTH) {
            rc = TSR_ELIMIT;
            goto out;
        }
        e = &s->health[s->nhealth++];
        memcpy(e->name, service, n + 1);
    }
    e->status = status;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int health_check(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    struct tsr_rpc_server *s = ctx;
    Grpc__Health__V1__HealthCheckRequest *rq =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "HealthCheckRequest: malformed protobuf");
    const char *name = rq->service ? rq->service : "";
    int found = 0, status = 0;
    pthread_mutex_lock(&s->mu);
    struct health_entry *e = health_find(s, name, strlen(name));
    if (e) {
        found = 1;
        status = e->status;
    }
    pthread_mutex_unlock(&s->mu);
    int rc;
    if (!found) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_NOT_FOUND, "unknown service \"%.128s\"", name);
    } else {
        Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
        rc = tsr_rpc_reply_pack(reply, &resp.base);
    }
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
    return rc;
}

/* ------------------------------------------------------------------------ server -- */

void tsr_rpc_server_opts_init(tsr_rpc_server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->listen = "127.0.0.1:0";
}

static grpc_server_credentials *server_creds(const tsr_rpc_server_opts *o, tsr_error *err)
{
    if (!o->tls_cert_file && !o->tls_key_file) {
        if (o->tls_client_ca_file) {
            tsr_err(err, TSR_EINVAL, "tls_client_ca_file needs tls_cert_file and tls_key_file");
            return NULL;
        }
        return grpc_insecure_server_credentials_create();
    }
    if (!o->tls_cert_file || !o->tls_key_file) {
        tsr_err(err, TSR_EINVAL, "TLS needs both tls_cert_file and tls_key_file");
        return NULL;
    }
    grpc_server_credentials *creds = NULL;
    char *cert = NULL, *key = NULL, *ca = NULL;
    if (!(cert = tsr__rpc_read_file(o->tls_cert_file, "tls_cert_file", err)))
        goto out;
    if (!(key = tsr__rpc_read_file(o->tls_key_file, "tls_key_file", err)))
        goto out;
    if (o->tls_client_ca_file &&
        !(ca = tsr__rpc_read_file(o->tls_client_ca_file, "tls_client_ca_file", err)))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    creds = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!creds)
        tsr_err(err, TSR_EINVAL, "TLS server credentials rejected (%s, %s)", o->tls_cert_file,
                o->tls_key_file);
out:
    free(cert);
    free(key);
    free(ca);
    return creds;
}

/* Frees what the server owns once its grpc server and queues are gone (a listen that
 * failed in create, or destroy after shutdown), then its gRPC reference. */
static void server_free(tsr_rpc_server *s)
{
    for (int i = 0; i < s->nmethods; i++)
        free(s->methods[i].path);
    free(s->workers);
    free(s->slots);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->wq_mu);
    pthread_cond_destroy(&s->wq_cv);
    pthread_rwlock_destroy(&s->auth_mu);
    tsr_rpc_tokens_free(s->tokens);
    free(s->wrong_port_hint);
    free(s);
    grpc_shutdown();
}

tsr_rpc_server *tsr_rpc_server_create(const tsr_rpc_server_opts *o, tsr_error *err)
{
    tsr_rpc_server_opts def;
    if (!o) {
        tsr_rpc_server_opts_init(&def);
        o = &def;
    }
    if (!o->listen || !*o->listen) {
        tsr_err(err, TSR_EINVAL, "rpc server: empty listen address");
        return NULL;
    }
    if (o->cqs < 0 || o->cqs > 64 || o->workers < 0 || o->workers > 1024 || o->max_queued < 0 ||
        o->pending_per_cq < 0 || o->pending_per_cq > 4096 || o->pollers < 0 ||
        o->pollers > MAX_POLLERS_PER_CQ) {
        tsr_err(err, TSR_EINVAL, "rpc server: cqs (0..64), pollers (0..8), workers (0..1024), "
                                 "max_queued, pending_per_cq (0..4096) out of range");
        return NULL;
    }
    grpc_server_credentials *creds = server_creds(o, err);
    if (!creds)
        return NULL;

    tsr_rpc_server *s = tsr_xcalloc(1, sizeof *s);
    s->max_message = o->max_message ? o->max_message : TSR_RPC_DEFAULT_MAX_MESSAGE;
    if (s->max_message > INT32_MAX)
        s->max_message = INT32_MAX;
    s->grace_ms = o->grace_ms == 0 ? 2000 : (o->grace_ms < 0 ? 0 : o->grace_ms);
    s->pending_per_cq = o->pending_per_cq ? o->pending_per_cq : 16;
    s->nslots = o->cqs ? o->cqs : DEFAULT_CQS;
    s->pollers_per_cq = o->pollers ? o->pollers : POLLERS_PER_CQ;
    const char *ev = tsr_test_knob(TSR_KNOB_RPC_CQS);
    if (ev && atoi(ev) >= 1 && atoi(ev) <= 64)
        s->nslots = atoi(ev);
    ev = tsr_test_knob(TSR_KNOB_RPC_POLLERS);
    if (ev && atoi(ev) >= 1 && atoi(ev) <= MAX_POLLERS_PER_CQ)
        s->pollers_per_cq = atoi(ev);
    s->nworkers = o->workers ? o->workers : 4;
    s->wq_max = o->max_queued ? o->max_queued : 1024;
    const char *il = tsr_test_knob(TSR_KNOB_RPC_INLINE_LONG);
    s->inline_long = !(il && strcmp(il, "0") == 0);
    s->wrong_port_hint = o->wrong_port_hint ? tsr_xstrdup(o->wrong_port_hint) : NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->wq_mu, NULL);
    pthread_cond_init(&s->wq_cv, NULL);
    pthread_rwlock_init(&s->auth_mu, NULL);

    grpc_init();

    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = (int)s->max_message}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = (int)s->max_message}},
        /* Accept the clients' keepalive pings (rpc_client sends them every 5 s, also
         * without calls); without these the server answers with GOAWAY too_many_pings. */
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         {.integer = 1000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PING_STRIKES, {.integer = 0}},
        /* Two servers on one port must fail, not share it silently. */
        {GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
    };
    grpc_channel_args ch_args = {sizeof args / sizeof args[0], args};
    s->server = grpc_server_create(&ch_args, NULL);
    s->slots = tsr_xcalloc((size_t)s->nslots, sizeof *s->slots);
    for (int i = 0; i < s->nslots; i++) {
        s->slots[i].srv = s;
        s->slots[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->server, s->slots[i].cq, NULL);
    }
    s->port = grpc_server_add_http2_port(s->server, o->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        tsr_err(err, TSR_EUNAVAILABLE, "rpc server: cannot listen on %s (in use or invalid)",
                o->listen);
        /* Never started: start it with no threads so shutdown_and_notify completes. */
        grpc_server_start(s->server);
        grpc_server_shutdown_and_notify(s->server, s->slots[0].cq, &s->shutdown_tag);
        grpc_server_cancel_all_calls(s->server);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(
                s->slots[0].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->shutdown_tag)
                break;
        }
        for (int i = 0; i < s->nslots; i++) {
            grpc_completion_queue_shutdown(s->slots[i].cq);
            while (grpc_completion_queue_next(s->slots[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                              NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        }
        grpc_server_destroy(s->server);
        for (int i = 0; i < s->nslots; i++)
            grpc_completion_queue_destroy(s->slots[i].cq);
        server_free(s);
        return NULL;
    }
    /* Health is built in; methods registered later cannot shadow it (duplicate check). */
    tsr_rpc_server_add_method(s, HEALTH_CHECK_PATH, health_check, s, 0);
    s->methods[s->nmethods - 1].role = 0; /* always open */
    return s;
}

int tsr_rpc_server_add_method(tsr_rpc_server *s, const char *path, tsr_rpc_handler_fn fn,
                              void *ctx, unsigned flags)
{
    if (!path || path[0] != '/' || !strchr(path + 1, '/') || !fn)
        return TSR_EINVAL;
    if (s->started || s->nmethods >= MAX_METHODS)
        return TSR_EINVAL;
    size_t n = strlen(path);
    for (int i = 0; i < s->nmethods; i++)
        if (s->methods[i].path_len == n && memcmp(s->methods[i].path, path, n) == 0)
            return TSR_EINVAL;
    struct method *m = &s->methods[s->nmethods++];
    m->path = tsr_xstrdup(path);
    m->path_len = n;
    m->fn = fn;
    m->ctx = ctx;
    m->flags = flags;
    m->role = INT_MAX;
    m->req_type = NULL;
    return 0;
}

int tsr__rpc_server_add_bound(tsr_rpc_server *s, const char *path, tsr_rpc_handler_fn fn,
                              const struct tsr__rpc_binding *b, unsigned flags,
                              const ProtobufCMessageDescriptor *req_type)
{
    int rc = tsr_rpc_server_add_method(s, path, fn, NULL, flags);
    if (rc != 0)
        return rc;
    struct method *m = &s->methods[s->nmethods - 1]; /* the table never moves */
    m->bound = *b;
    m->ctx = &m->bound;
    m->req_type = req_type;
    return 0;
}

int tsr_rpc_server_set_role(tsr_rpc_server *s, const char *path, int level)
{
    if (s->started || !path || level < 0)
        return TSR_EINVAL;
    for (int i = 0; i < s->nmethods; i++)
        if (strcmp(s->methods[i].path, path) == 0) {
            if (strcmp(path, HEALTH_CHECK_PATH) == 0)
                return TSR_EINVAL; /* stays open */
            s->methods[i].role = level;
            return 0;
        }
    return TSR_EINVAL;
}

int tsr_rpc_server_set_request_type(tsr_rpc_server *s, const char *path,
                                    const ProtobufCMessageDescriptor *desc)
{
    if (s->started || !path)
        return TSR_EINVAL;
    for (int i = 0; i < s->nmethods; i++)
        if (strcmp(s->methods[i].path, path) == 0) {
            s->methods[i].req_type = desc;
            return 0;
        }
    return TSR_EINVAL;
}

void tsr_rpc_server_set_tokens(tsr_rpc_server *s, tsr_rpc_tokens *t)
{
    pthread_rwlock_wrlock(&s->auth_mu);
    tsr_rpc_tokens *old = s->tokens;
    s->tokens = t;
    pthread_rwlock_unlock(&s->auth_mu);
    tsr_rpc_tokens_free(old);
}

int tsr_rpc_server_start(tsr_rpc_server *s, tsr_error *err)
{
    if (s->started)
        return tsr_err(err, TSR_ESTATE, "rpc server: already started");
    s->started = 1;
    grpc_server_start(s->server);
    tsr_rpc_server_set_health(s, "", TSR_RPC_HEALTH_SERVING);
    for (int i = 0; i < s->nslots; i++)
        for (int k = 0; k < s->pending_per_cq; k++)
            arm(&s->slots[i]);
    s->workers = tsr_xcalloc((size_t)s->nworkers, sizeof *s->workers);
    for (int i = 0; i < s->nworkers; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0)
            break;
        s->nworkers_started++;
    }
    for (int i = 0; i < s->nslots; i++) {
        struct slot *sl = &s->slots[i];
        for (int k = 0; k < s->pollers_per_cq; k++)
            if (pthread_create(&sl->threads[sl->nthreads], NULL, poller_main, sl) == 0)
                sl->nthreads++;
        atomic_store(&sl->avail, sl->nthreads);
        atomic_fetch_add(&tsr__rpc_pollers_running, sl->nthreads);
    }
    if (s->nworkers_started == 0 || !s->slots[0].nthreads)
        return tsr_err(err, TSR_EINTERNAL, "rpc server: cannot create threads");
    return 0;
}

int tsr_rpc_server_port(const tsr_rpc_server *s)
{
    return s->port;
}

/* Waits on s->cv (s->mu held) until *flag or the absolute monotonic deadline. */
static void wait_until(tsr_rpc_server *s, const int *flag, const struct timespec *dl)
{
    while (!*flag) {
        int rc = dl ? pthread_cond_timedwait(&s->cv, &s->mu, dl) : pthread_cond_wait(&s->cv, &s->mu);
        if (rc == ETIMEDOUT)
            return;
    }
}

void tsr_rpc_server_shutdown(tsr_rpc_server *s)
{
    if (!s->started) {
        /* Shutdown of a never-started server: start it (no calls can have arrived) so
         * that the same sequence applies. */
        tsr_error ignored = TSR_ERROR_INIT;
        tsr_rpc_server_start(s, &ignored);
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        /* another thread is or was shutting down; wait for it to finish */
        while (!s->shutdown_done)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    for (int i = 0; i < s->nhealth; i++)
        s->health[i].status = TSR_RPC_HEALTH_NOT_SERVING;
    s->stopping = 1;
    grpc_server_shutdown_and_notify(s->server, s->slots[0].cq, &s->shutdown_tag);

    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += s->grace_ms / 1000;
    dl.tv_nsec += (long)(s->grace_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    wait_until(s, &s->shutdown_seen, &dl);
    if (!s->shutdown_seen) {
        atomic_store(&s->cancelling, 1);
        pthread_mutex_unlock(&s->mu);
        grpc_server_cancel_all_calls(s->server);
        pthread_mutex_lock(&s->mu);
        wait_until(s, &s->shutdown_seen, NULL);
    }
    while (s->alive > 0) /* running handlers, final batches, failed armed requests */
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&s->wq_mu);
    s->wq_stop = 1;
    pthread_cond_broadcast(&s->wq_cv);
    pthread_mutex_unlock(&s->wq_mu);
    for (int i = 0; i < s->nworkers_started; i++)
        pthread_join(s->workers[i], NULL);

    for (int i = 0; i < s->nslots; i++) {
        atomic_fetch_sub(&tsr__rpc_pollers_running, s->slots[i].nthreads);
        grpc_completion_queue_shutdown(s->slots[i].cq);
    }
    for (int i = 0; i < s->nslots; i++) {
        if (s->slots[i].nthreads) {
            for (int k = 0; k < s->slots[i].nthreads; k++)
                pthread_join(s->slots[i].threads[k], NULL);
        } else { /* no poller: drain here */
            while (grpc_completion_queue_next(s->slots[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                              NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        }
    }
    grpc_server_destroy(s->server);
    s->server = NULL;
    for (int i = 0; i < s->nslots; i++)
        grpc_completion_queue_destroy(s->slots[i].cq);

    pthread_mutex_lock(&s->mu);
    s->shutdown_done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void tsr_rpc_server_destroy(tsr_rpc_server *s)
{
    if (!s)
        return;
    tsr_rpc_server_shutdown(s);
    server_free(s);
}

/* ------------------------------------------------------------------------- reply -- */

void tsr_rpc_reply_set(tsr_rpc_reply *r, uint8_t *buf, size_t len)
{
    reply_clear_resp(r);
    if (!buf)
        return;
    if (len == 0) {
        free(buf);
        return;
    }
    r->resp = grpc_slice_new(buf, len, free);
    r->has_resp = 1;
}

int tsr_rpc_reply_copy(tsr_rpc_reply *r, const void *data, size_t len)
{
    reply_clear_resp(r);
    if (len == 0)
        return 0;
    uint8_t *p = tsr_try_malloc(len, 1);
    if (!p)
        return TSR_ENOMEM;
    memcpy(p, data, len);
    tsr_rpc_reply_set(r, p, len);
    return 0;
}

int tsr_rpc_reply_pack(tsr_rpc_reply *r, const ProtobufCMessage *msg)
{
    reply_clear_resp(r);
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > r->call->srv->max_message)
        return tsr_rpc_reply_error(r, TSR_RPC_RESOURCE_EXHAUSTED,
                                   "reply of %zu bytes exceeds the maximum message size %zu", n,
                                   r->call->srv->max_message);
    if (n == 0)
        return 0;
    uint8_t *p = tsr_try_malloc(n, 1);
    if (!p)
        return tsr_rpc_reply_error(r, TSR_RPC_RESOURCE_EXHAUSTED,
                                   "out of memory packing a reply of %zu bytes", n);
    protobuf_c_message_pack(msg, p);
    tsr_rpc_reply_set(r, p, n);
    return 0;
}

int tsr_rpc_reply_error(tsr_rpc_reply *r, int grpc_code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tsr__rpc_reply_verror(r, grpc_code, fmt, ap);
    va_end(ap);
    return rc;
}

int tsr__rpc_reply_verror(tsr_rpc_reply *r, int grpc_code, const char *fmt, va_list ap)
{
    char buf[TSR_RPC_MAX_STATUS_MESSAGE + 1];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (grpc_code == TSR_RPC_OK || grpc_code < 0 || grpc_code > 16)
        grpc_code = TSR_RPC_INTERNAL;
    set_status(r, grpc_code, buf);
    int e = tsr_rpc_error_from_status(grpc_code);
    return e < 0 ? e : TSR_EINTERNAL;
}

int tsr_rpc_reply_from_error(tsr_rpc_reply *r, const tsr_error *err)
{
    int code = err && err->code < 0 ? err->code : TSR_EINTERNAL;
    const char *msg = err && err->msg[0] ? err->msg : tsr_strerror(code);
    set_status(r, tsr_rpc_status_from_error(code), msg);
    return code;
}

int tsr_rpc_reply_fanout(tsr_rpc_reply *r, tsr_rpc_fanout_call *calls, size_t n,
                         tsr_rpc_fanout_done_fn done, void *ud)
{
    struct call *c = r->call;
    if (c->fan || !done || (n && !calls))
        return TSR_EINVAL;
    if (!c->slot) /* a detached call (tsr__rpc_run_detached): no queue to fan out on */
        return TSR_EUNAVAILABLE;
    if (n > ((size_t)1 << 20))
        return TSR_ELIMIT;
    struct afan *f = tsr_try_malloc(1, sizeof *f + n * sizeof f->cc[0]);
    if (!f)
        return TSR_ENOMEM;
    f->owner = c;
    f->calls = calls;
    f->n = n;
    f->done = done;
    f->ud = ud;
    atomic_init(&f->left, n + 1); /* + the hold of the code running now */
    c->fan = f;
    TSR_TSAN_RELEASE(f);
    size_t unstarted = 0;
    for (size_t i = 0; i < n; i++)
        if (tsr__ccall_start(&f->cc[i], &calls[i], c->slot->cq, f, i) != 0) {
            tsr__ccall_finish(&f->cc[i], &calls[i]);
            unstarted++;
        }
    /* never zero here: the hold is released when the handler or callback returns */
    if (unstarted)
        atomic_fetch_sub(&f->left, unstarted);
    return 0;
}

int tsr_rpc_reply_hold(tsr_rpc_reply *r)
{
    struct call *c = r->call;
    if (c->fan || atomic_load(&c->hold))
        return TSR_EINVAL;
    if (!c->slot) /* a detached call: it replies when its handler returns */
        return TSR_EUNAVAILABLE;
    c->held_rc = 0;
    atomic_store(&c->hold, 2);
    return 0;
}

void tsr_rpc_reply_release(tsr_rpc_reply *r, int rc)
{
    struct call *c = r->call;
    c->held_rc = rc;
    if (atomic_fetch_sub(&c->hold, 1) == 1) {
        settle(c, rc);
        send_final(c);
    }
}

tsr_rpc_server *tsr_rpc_reply_server(const tsr_rpc_reply *r)
{
    return r->call->slot ? r->call->srv : NULL;
}

int tsr_rpc_server_fanout(tsr_rpc_server *s, tsr_rpc_fanout_call *calls, size_t n,
                          tsr_rpc_calls_done_fn done, void *ud)
{
    if (!s || !done || (n && !calls))
        return TSR_EINVAL;
    if (n > ((size_t)1 << 20))
        return TSR_ELIMIT;
    struct afan *f = tsr_try_malloc(1, sizeof *f + n * sizeof f->cc[0]);
    if (!f)
        return TSR_ENOMEM;
    pthread_mutex_lock(&s->mu);
    if (!s->started || s->stopping || !s->nslots) {
        pthread_mutex_unlock(&s->mu);
        free(f);
        return TSR_EUNAVAILABLE;
    }
    s->alive++; /* shutdown waits for this fan-out's done (its calls have deadlines) */
    pthread_mutex_unlock(&s->mu);
    struct slot *sl = &s->slots[atomic_fetch_add(&s->next_slot, 1) % (unsigned)s->nslots];
    f->owner = NULL;
    f->calls = calls;
    f->n = n;
    f->done = NULL;
    f->sdone = done;
    f->srv = s;
    f->ud = ud;
    atomic_init(&f->left, n + 1); /* + the hold of this function until it returns */
    TSR_TSAN_RELEASE(f);
    size_t unstarted = 0;
    for (size_t i = 0; i < n; i++)
        if (tsr__ccall_start(&f->cc[i], &calls[i], sl->cq, f, i) != 0) {
            tsr__ccall_finish(&f->cc[i], &calls[i]);
            unstarted++;
        }
    if (atomic_fetch_sub(&f->left, unstarted + 1) == unstarted + 1)
        sfan_complete(f); /* nothing was started, or all completed already */
    return 0;
}

int64_t tsr_rpc_reply_remaining_ms(const tsr_rpc_reply *r)
{
    return tsr__rpc_remaining_ms(r->call->details.deadline);
}

int tsr_rpc_reply_cancelled(const tsr_rpc_reply *r)
{
    return atomic_load(&r->call->srv->cancelling);
}

int tsr__rpc_reply_code(const tsr_rpc_reply *r)
{
    return r->code;
}

const char *tsr_rpc_reply_method(const tsr_rpc_reply *r)
{
    return r->call->m ? r->call->m->path : "";
}

/* ---------------------------------------------------------------- detached calls -- */

int tsr__rpc_run_detached(const char *path, tsr_rpc_handler_fn fn, void *ctx,
                          const ProtobufCMessageDescriptor *req_type, const uint8_t *req,
                          size_t len, tsr__rpc_detached *out)
{
    memset(out, 0, sizeof *out);
    struct tsr_rpc_server *srv = tsr_xcalloc(1, sizeof *srv);
    struct call *c = tsr_xcalloc(1, sizeof *c);
    struct method m = {.path = (char *)path, .path_len = strlen(path), .fn = fn, .ctx = ctx,
                       .req_type = req_type};
    srv->max_message = TSR_RPC_DEFAULT_MAX_MESSAGE;
    atomic_init(&srv->cancelling, 0);
    c->kind = TSR__TAG_SERVER_CALL;
    c->srv = srv;
    c->m = &m;
    c->details.deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    c->reply.call = c;
    struct tsr_rpc_reply *r = &c->reply;
    if (len == 0)
        req = NULL;
    int rc;
    if (req_type && tsr_rpc_too_deep(req_type, req, len, TSR_RPC_MAX_DEPTH))
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "%s: sub-messages nest deeper "
                                 "than %d levels", req_type->short_name, TSR_RPC_MAX_DEPTH);
    else
        rc = fn(ctx, req, len, r);
    settle(c, rc);
    out->code = r->code;
    out->msg = r->msg;
    r->msg = NULL;
    if (r->code == TSR_RPC_OK && r->has_resp) {
        out->len = GRPC_SLICE_LENGTH(r->resp);
        out->resp = tsr_xmalloc(out->len);
        memcpy(out->resp, GRPC_SLICE_START_PTR(r->resp), out->len);
    }
    reply_clear_resp(r);
    free(c);
    free(srv);
    return out->code;
}

void tsr__rpc_detached_close(tsr__rpc_detached *d)
{
    free(d->resp);
    free(d->msg);
    memset(d, 0, sizeof *d);
}
