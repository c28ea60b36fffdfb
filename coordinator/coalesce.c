/*
 * coalesce — concurrent FindNeighbors requests share shard calls (docs/coordinator.md
 * "Coalesced shard calls"). Each request plans one ShardSearchRequest per shard group it
 * touches; with few calls in flight to a group the request's call goes out at once (no
 * added latency), but once `coalesce_inflight` calls per replica are in flight to the
 * group, further requests' calls wait in the group's queue, and when a call of the group
 * completes the whole queue goes out as ONE ShardSearchRequest. The shard searches a
 * request's queries in one pass, and one call — two protobuf ends, HTTP/2 frames, a
 * completion-queue wake-up at each end — is paid once per batch instead of once per
 * request: on a saturated 2-core machine that overhead was most of a single query's CPU
 * (docs/performance.md "Cluster throughput").
 *
 * Bytes, not messages: a ShardSearchRequest is only `repeated ShardQuery queries = 1`,
 * and protobuf concatenates repeated fields, so the batch's request is the requests'
 * bytes one after another; the reply (`repeated ShardQueryResult results = 1`, in
 * request order) is cut back into each request's own results by walking its top-level
 * fields (split_reply). Every query carries its own version, lists, restricts and
 * read-your-writes demand, so a coalesced query is answered exactly as alone.
 *
 * Failures: a batch of one is an ordinary group call (failover to the group's other
 * replicas and the read-your-writes demand lowering, replica.c). A batch of several
 * fails over to other replicas the same way; if it still fails — any status: one
 * request's bad query, a replica behind one request's demand, its earliest deadline —
 * every request of it is sent again alone with the time it has left, so each gets the
 * answer or the error it would have had without coalescing.
 *
 * DESIGN (threads, ownership): submit runs on the polling thread of the FindNeighbors
 * handler; a batch's completion on whichever polling thread completes its last call
 * (tsr_rpc_server_fanout). tsr__coalescer.mu guards the group's queue and in-flight count;
 * it is a leaf, never held while calling out (a call that cannot start completes on the
 * starting thread, see run). An entry belongs to its request; the queue and then a batch
 * borrow it until its done callback, which is the last thing that touches it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"

/* At most this many ShardQuery messages in one coalesced call (a request with more goes
 * alone). The per-call cost is amortized well before it (docs/performance.md "Cluster
 * throughput": at 256, requests of 32 queries at 16 in flight lost 5-15 % against no
 * coalescing — the shard searches a call's queries one after another and the coordinator
 * merges none of them before the whole call is back). */
#define CO_MAX_QUERIES 64

/* run's hand-off between the starting thread and the completion (see run). */
enum { B_STARTING, B_STARTED, B_DONE };

typedef struct cobatch {
    tsr__coord *c;
    size_t group;
    tsr__centry *head; /* entries, in queue order */
    size_t n;
    tsr__gcall own;    /* a batch of several: the concatenated request */
    uint8_t *buf;
    atomic_int state;
} cobatch;

static void run(tsr__coord *c, size_t s, tsr__centry *list);

void tsr__coalesce_init(tsr__coord *c)
{
    c->co = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *c->co);
    for (size_t s = 0; s < TSR_COORD_MAX_SHARDS; s++)
        pthread_mutex_init(&c->co[s].mu, NULL);
}

void tsr__coalesce_close(tsr__coord *c)
{
    if (!c->co)
        return;
    for (size_t s = 0; s < TSR_COORD_MAX_SHARDS; s++)
        pthread_mutex_destroy(&c->co[s].mu);
    free(c->co);
    c->co = NULL;
}

int tsr__coalesce_on(const tsr__coord *c)
{
    return c->co && atomic_load(&c->srv) && c->cfg.coalesce_inflight > 0;
}

/* Calls group s may have in flight before requests queue. */
static int limit_of(const tsr__coord *c, size_t s)
{
    size_t n = c->grp[s].n;
    return c->cfg.coalesce_inflight * (int)(n ? n : 1);
}

/* The next batch of group s's queue (up to CO_MAX_QUERIES queries, at least one entry),
 * or NULL — and then the group has one call fewer in flight. */
static tsr__centry *take_next(tsr__coord *c, size_t s)
{
    tsr__coalescer *g = &c->co[s];
    pthread_mutex_lock(&g->mu);
    tsr__centry *list = g->head, *last = NULL;
    if (!list) {
        g->inflight--;
        pthread_mutex_unlock(&g->mu);
        return NULL;
    }
    size_t nq = 0;
    for (tsr__centry *e = list; e && (!last || nq + e->nq <= CO_MAX_QUERIES); e = e->next) {
        nq += e->nq;
        last = e;
    }
    g->head = last->next;
    if (!g->head)
        g->tail = NULL;
    last->next = NULL;
    pthread_mutex_unlock(&g->mu);
    return list;
}

void tsr__coalesce_submit(tsr__coord *c, tsr__centry *e)
{
    size_t s = e->call->group;
    tsr__coalescer *g = &c->co[s];
    e->next = NULL;
    pthread_mutex_lock(&g->mu);
    if (g->inflight < limit_of(c, s)) {
        g->inflight++;
        pthread_mutex_unlock(&g->mu);
        run(c, s, e);
        return;
    }
    if (g->tail)
        g->tail->next = e;
    else
        g->head = e;
    g->tail = e;
    pthread_mutex_unlock(&g->mu);
}

/* The entries' results, cut from the batch's reply: each gets its own queries' results,
 * as the bytes of a ShardSearchResponse. Returns 0, or -1 when the reply is not a list of
 * field-1 results as many as the batch's queries. */
static int split_reply(cobatch *b, const uint8_t *p, size_t len)
{
    size_t want = 0;
    for (tsr__centry *e = b->head; e; e = e->next)
        want += e->nq;
    size_t *at = tsr_xmalloc((want + 1) * sizeof *at), k = 0;
    if (tsr_rpc_split_repeated(p, len, 1, at, want) != (long)want) {
        free(at);
        return -1;
    }
    at[want] = len;
    for (tsr__centry *e = b->head; e; e = e->next) {
        tsr_rpc_result *r = &e->call->result;
        tsr_rpc_result_close(r);
        r->code = TSR_RPC_OK;
        r->len = at[k + e->nq] - at[k];
        r->data = tsr_xmalloc(r->len ? r->len : 1);
        memcpy(r->data, p + at[k], r->len);
        k += e->nq;
        e->call->replica = b->own.replica;
        e->call->attempts = b->own.attempts;
    }
    free(at);
    return 0;
}

/* r becomes a failure with code and message (what it held is dropped). */
static void set_failed(tsr_rpc_result *r, int code, const char *message)
{
    tsr_rpc_result_close(r);
    r->code = code;
    r->message = tsr_xstrdup(message ? message : "");
}

static void alone_fin(void *ud, tsr__gcall *calls, size_t n)
{
    tsr__centry *e = ud;
    (void)calls;
    (void)n;
    e->done(e->ud, e->call);
}

/* A failed batch's entry, sent again by itself with the time it has left. */
static void alone(tsr__coord *c, tsr__centry *e, const tsr_rpc_result *why)
{
    int64_t left = e->deadline - tsr_clock_mono_ms();
    tsr_rpc_server *srv = atomic_load(&c->srv);
    if (left > 0 && tsr__coord_group_fanout_server(c, srv, TSR_SHARD_SVC "Search", e->call, 1,
                                                   left, alone_fin, e) == 0)
        return;
    set_failed(&e->call->result, why->code, why->message);
    e->done(e->ud, e->call);
}

/* Delivers a completed batch to its entries and frees it. */
static void deliver(cobatch *b)
{
    tsr__coord *c = b->c;
    tsr__centry *e = b->head, *next;
    if (b->n == 1) {
        e->done(e->ud, e->call);
    } else if (b->own.result.code == TSR_RPC_OK &&
               split_reply(b, b->own.result.data, b->own.result.len) == 0) {
        char lbl[32];
        snprintf(lbl, sizeof lbl, "shard=%zu", b->group);
        tsr_metrics_counter_add("tessera_coalesced_calls_total", lbl, 1);
        tsr_metrics_counter_add("tessera_coalesced_requests_total", lbl, (double)b->n);
        for (; e; e = next) {
            next = e->next; /* e may be freed by its done */
            e->done(e->ud, e->call);
        }
    } else {
        if (b->own.result.code == TSR_RPC_OK)
            set_failed(&b->own.result, TSR_RPC_INTERNAL, "malformed coalesced Search response");
        tsr_log_every(TSR_LOG_INFO, "coalesce-retry", 10000, "shard %zu: a coalesced Search "
                      "of %zu requests failed (%s: %s): each sent again alone", b->group, b->n,
                      tsr_rpc_code_name(b->own.result.code), b->own.result.message);
        for (; e; e = next) {
            next = e->next;
            alone(c, e, &b->own.result);
        }
    }
    tsr_rpc_result_close(&b->own.result);
    free(b->buf);
    free(b);
}

static void batch_fin(void *ud, tsr__gcall *calls, size_t n)
{
    cobatch *b = ud;
    (void)calls;
    (void)n;
    if (atomic_exchange(&b->state, B_DONE) == B_STARTING)
        return; /* completed on the starting thread: run continues it */
    tsr__centry *next = take_next(b->c, b->group); /* keep the group busy first */
    run(b->c, b->group, next);
    deliver(b);
}

/* Starts list as one call of group s, which holds one of the group's in-flight slots; as
 * long as a batch completes on this thread (it could not be sent), delivers it and goes
 * on with the queue, so no completion recurses into the next. */
static void run(tsr__coord *c, size_t s, tsr__centry *list)
{
    while (list) {
        cobatch *b = tsr_xcalloc(1, sizeof *b);
        b->c = c;
        b->group = s;
        b->head = list;
        atomic_init(&b->state, B_STARTING);
        int64_t now = tsr_clock_mono_ms(), dl = INT64_MAX;
        size_t len = 0;
        for (tsr__centry *e = list; e; e = e->next) {
            b->n++;
            len += e->call->len;
            if (e->deadline < dl)
                dl = e->deadline;
        }
        tsr__gcall *gc = list->call;
        if (b->n > 1) {
            b->buf = tsr_xmalloc(len ? len : 1);
            size_t off = 0;
            for (tsr__centry *e = list; e; e = e->next) {
                memcpy(b->buf + off, e->call->req, e->call->len);
                off += e->call->len;
            }
            gc = &b->own;
            gc->group = s;
            gc->req = b->buf;
            gc->len = len;
            gc->demand = NULL; /* a failure is retried per request, each with its own */
            tsr_rpc_result_init(&gc->result);
        }
        int64_t tmo = dl - now;
        int rc = tmo > 0 ? tsr__coord_group_fanout_server(c, atomic_load(&c->srv),
                                                          TSR_SHARD_SVC "Search", gc, 1, tmo,
                                                          batch_fin, b)
                         : TSR_ETIMEOUT;
        if (rc == 0 && atomic_exchange(&b->state, B_STARTED) != B_DONE)
            return; /* batch_fin continues on a polling thread */
        if (rc == TSR_ETIMEOUT) /* nothing sent: the batch fails as a whole */
            set_failed(&gc->result, TSR_RPC_DEADLINE_EXCEEDED, "Deadline Exceeded");
        else if (rc != 0)
            set_failed(&gc->result, TSR_RPC_UNAVAILABLE, "cannot start the shard call");
        list = take_next(c, s);
        deliver(b);
    }
}
