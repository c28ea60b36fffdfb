/*
 * replica — shard groups of R replicas as the coordinator sees them (docs/coordinator.md
 * "Replicas"): one channel per replica, a health view per replica (consecutive failures,
 * a short back-off after a failure, the channel's connectivity, "lagging" from
 * reconcile), the query-side pick (healthy first, then least outstanding, ties round
 * robin), the failover fan-out that retries a failed call on another replica of the
 * same group within the query's deadline, the all-replica fan-out of the update path,
 * and the coordinator's /metrics collector (shard health, sizes, versions, update
 * progress).
 *
 * DESIGN (threads): every tsr__replica field after the channel is an atomic written by
 * whoever saw a call's outcome (query workers, the update thread, reconcile) and read
 * without a lock. The metrics collector runs on the metrics_http loop thread; it takes
 * op_mu (briefly, to copy the running operation's progress) and snap_mu (through
 * tsr__coord_snap_get), never both at once, and its own coll_mu for the per-version plan
 * cache.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"

/* Back-off after a failed call: 50 ms doubled per consecutive failure, at most 2 s. A
 * replica in back-off is skipped while another one of its group is healthy; reconcile's
 * Stats (every 0.3 s while something is off) clears it as soon as it answers again. */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

void tsr__coord_target_of(const char *addr, char *buf, size_t cap)
{
    int ipv4 = 1, dots = 0;
    const char *colon = strrchr(addr, ':');
    if (!colon || strchr(addr, '/'))
        ipv4 = 0;
    for (const char *p = addr; ipv4 && p < colon; p++) {
        if (*p == '.')
            dots++;
        else if (!isdigit((unsigned char)*p))
            ipv4 = 0;
    }
    if (ipv4 && dots == 3)
        snprintf(buf, cap, "ipv4:%s", addr);
    else
        snprintf(buf, cap, "%s", addr);
}

/* Fills replica slots for group s (its config entry) from c->nrep on; a retired group gets
 * none (n = 0: nothing calls it). */
static int group_open(tsr__coord *c, size_t s, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    size_t first = c->nrep, n = cfg->retired && cfg->retired[s] ? 0 : cfg->nreplicas[s];
    for (size_t j = 0; j < n; j++) {
        tsr__replica *r = &c->rep[first + j];
        r->group = s;
        r->index = j;
        r->addr = cfg->replicas[s][j];
        atomic_init(&r->inflight, 0);
        atomic_init(&r->fails, 0);
        atomic_init(&r->retry_at_ms, 0);
        atomic_init(&r->up, -1);
        atomic_init(&r->down_at_ms, 0);
        atomic_init(&r->lagging, 0);
        atomic_init(&r->stream_behind, 0);
        atomic_init(&r->version, -1);
        atomic_init(&r->vectors, -1);
        atomic_init(&r->sparse, -1);
        atomic_init(&r->lists, -1);
        if (c->no_channels) { /* the fuzz harnesses (coord.h) */
            r->ch = NULL;
            continue;
        }
        char t[512];
        tsr__coord_target_of(r->addr, t, sizeof t);
        if (!(r->ch = tsr_rpc_channel_create(t, &c->shard_opts, err))) {
            for (size_t i = 0; i < j; i++)
                tsr_rpc_channel_destroy(c->rep[first + i].ch);
            return tsr_err_prefix(err, "shard %zu replica %zu (%s)", s, j, r->addr);
        }
    }
    c->grp[s].first = first;
    atomic_init(&c->grp[s].next, 0);
    c->grp[s].n = n;
    c->nrep += n;
    return 0;
}

int tsr__coord_channels_open(tsr__coord *c, const tsr_rpc_client_opts *opts, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    c->shard_opts = *opts;
    /* room for every group and replica there may be: AddShardGroup appends while queries
     * read these arrays without a lock, so they never move */
    c->rep = tsr_xcalloc((size_t)TSR_COORD_MAX_SHARDS * TSR_COORD_MAX_REPLICAS, sizeof *c->rep);
    c->grp = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *c->grp);
    c->nrep = 0;
    for (size_t s = 0; s < cfg->nshards; s++) {
        int rc = group_open(c, s, err);
        if (rc)
            return rc;
    }
    return 0;
}

int tsr__coord_group_append(tsr__coord *c, tsr_error *err)
{
    size_t s = c->cfg.nshards - 1;
    if (c->nrep + c->cfg.nreplicas[s] > (size_t)TSR_COORD_MAX_SHARDS * TSR_COORD_MAX_REPLICAS)
        return tsr_err(err, TSR_ELIMIT, "too many replicas");
    return group_open(c, s, err);
}

void tsr__coord_group_retire(tsr__coord *c, size_t s)
{
    __atomic_store_n(&c->cfg.retired[s], 1, __ATOMIC_RELEASE); /* GetIndexStats reads it */
    c->grp[s].n = 0; /* its replica slots stay (and their channels), never called again */
}

int tsr__coord_groups_follow(tsr__coord *c, const tsr__snap *ns, uint8_t *retire,
                             tsr_error *err)
{
    if (!ns->groups)
        return 0;
    tsr__coord_config ng;
    int rc = tsr__coord_config_parse_groups(ns->groups, ns->groups_len, &ng, err);
    if (rc)
        return tsr_err_prefix(err, "version %llu", (unsigned long long)ns->version);
    tsr__coord_config *cfg = &c->cfg;
    size_t have = cfg->nshards;
    /* Groups above those of the served version were never committed: a failed add of ours
     * when we led (its number kept, retired). The committed version decides what those
     * numbers are: they are dropped here and re-appended from ns (their strings stay
     * allocated until close: a stats reader may hold them). */
    tsr__snap *cur = tsr__coord_snap_get(c);
    size_t served = cur->version ? tsr__snap_groups(cur, cfg) : have;
    tsr__snap_unref(cur);
    if (served < have) {
        size_t s = served;
        while (s < have && cfg->retired[s])
            s++;
        if (s == have) { /* all of them failed adds: never called */
            for (s = served; s < have; s++)
                tsr_info("shard group %zu (%s): a failed add of ours, never committed; "
                         "version %llu names group %zu", s, cfg->shards[s],
                         (unsigned long long)ns->version, s);
            tsr__coord_config_drop_groups(cfg, served);
            have = served;
        }
    }
    if (ng.nshards < have) {
        rc = tsr_err(err, TSR_ESTATE, "version %llu names %zu shard group(s), this coordinator "
                     "has %zu (group numbers are never reused or dropped)",
                     (unsigned long long)ns->version, (size_t)ng.nshards, have);
        goto out;
    }
    for (size_t s = 0; s < have; s++) {
        int same = ng.nreplicas[s] == cfg->nreplicas[s];
        for (size_t j = 0; same && j < ng.nreplicas[s]; j++)
            same = strcmp(ng.replicas[s][j], cfg->replicas[s][j]) == 0;
        if (!same || (cfg->retired[s] && !ng.retired[s])) {
            rc = tsr_err(err, TSR_ESTATE, "version %llu: shard group %zu (%s) is not the group "
                         "%zu this coordinator has (%s%s)", (unsigned long long)ns->version,
                         s, ng.shards[s], s, cfg->shards[s], cfg->retired[s] ? ", removed" : "");
            goto out;
        }
    }
    for (size_t s = 0; s < have; s++)
        if (ng.retired[s] && !cfg->retired[s]) {
            /* out of every plan from ns on; still called by queries planned before it */
            __atomic_store_n(&cfg->retired[s], 1, __ATOMIC_RELEASE);
            retire[s] = 1;
        }
    for (size_t s = have; s < ng.nshards; s++) {
        if ((rc = tsr__coord_config_add_group(cfg, (const char *const *)ng.replicas[s],
                                              ng.nreplicas[s], err)))
            goto out;
        /* retired: e.g. a failed add's number, never called (the slot may be one that
         * drop_groups freed: set either way) */
        __atomic_store_n(&cfg->retired[s], ng.retired[s], __ATOMIC_RELEASE);
        if ((rc = tsr__coord_group_append(c, err))) {
            tsr__coord_group_retire(c, s); /* its slot stays, unused */
            goto out;
        }
        tsr_info("shard group %zu (%s%s) from version %llu%s", s, ng.shards[s],
                 ng.nreplicas[s] > 1 ? ",..." : "", (unsigned long long)ns->version,
                 ng.retired[s] ? " (removed)" : ": channels opened");
    }
    cfg->resharded = 1; /* the groups travel with every version from now on */
out:
    tsr__coord_config_close(&ng);
    return rc;
}

void tsr__coord_channels_close(tsr__coord *c)
{
    for (size_t k = 0; c->rep && k < c->nrep; k++)
        tsr_rpc_channel_destroy(c->rep[k].ch);
    free(c->rep);
    free(c->grp);
    c->rep = NULL;
    c->grp = NULL;
    c->nrep = 0;
}

/* ---------------------------------------------------------------- health */

/* Codes that say "this replica could not answer" (rather than "the request is bad"):
 * they count as a failure of the replica and are worth another replica. */
static int replica_fault(int code)
{
    return code == TSR_RPC_UNAVAILABLE || code == TSR_RPC_DEADLINE_EXCEEDED ||
           code == TSR_RPC_CANCELLED || code == TSR_RPC_RESOURCE_EXHAUSTED ||
           code == TSR_RPC_FAILED_PRECONDITION || code == TSR_RPC_UNKNOWN;
}

/* "/tessera.v1.Shard/Stage" -> "Stage" (for messages); other methods as they are. */
static const char *short_method(const char *method)
{
    size_t n = strlen(TSR_SHARD_SVC);
    return strncmp(method, TSR_SHARD_SVC, n) == 0 ? method + n : method;
}

static void name_of(const tsr__coord *c, size_t k, char *buf, size_t cap)
{
    const tsr__replica *r = &c->rep[k];
    if (c->grp[r->group].n > 1)
        snprintf(buf, cap, "shard %zu replica %zu (%s)", r->group, r->index, r->addr);
    else
        snprintf(buf, cap, "shard %zu (%s)", r->group, r->addr);
}

void tsr__replica_note(tsr__coord *c, size_t k, const char *method, int code, double secs)
{
    tsr__replica *r = &c->rep[k];
    char l[900];
    /* snprintf returns the length it wanted: clamp it, or a long address would put the
     * second part past the end of l (config.c bounds addresses; this stays safe anyway) */
    int o = snprintf(l, 600, "shard=%zu,replica=%zu,address=%s", r->group, r->index, r->addr);
    if (o < 0 || o > 599)
        o = o < 0 ? 0 : 599;
    tsr_metrics_histogram_observe("tessera_shard_call_duration_seconds", l, secs);
    snprintf(l + o, sizeof l - (size_t)o, ",method=%s,code=%s", method,
             tsr_rpc_code_name(code));
    tsr_metrics_counter_add("tessera_shard_calls_total", l, 1);
    if (replica_fault(code)) {
        int f = atomic_fetch_add(&r->fails, 1) + 1;
        /* f - 1 in 0..6 (f wraps negative after 2^31 failures: never a negative shift) */
        int64_t b = (int64_t)BACKOFF_MIN_MS << (f >= 1 && f <= 7 ? f - 1 : 6);
        atomic_store(&r->retry_at_ms, tsr_clock_mono_ms() + (b < BACKOFF_MAX_MS ? b : BACKOFF_MAX_MS));
        /* one line per change of verdict (the exchange picks the one thread that saw it) */
        if (atomic_exchange(&r->up, 0) != 0) {
            char nm[600];
            name_of(c, k, nm, sizeof nm);
            atomic_store(&r->down_at_ms, tsr_clock_mono_ms());
            tsr_warn("%s: %s %s: marked down, %s", nm, short_method(method),
                     tsr_rpc_code_name(code), c->grp[r->group].n > 1
                         ? "queries go to the other replicas"
                         : "no other replica: queries that need this shard fail");
        }
    } else {
        atomic_store(&r->fails, 0);
        if (atomic_exchange(&r->up, 1) == 0) {
            char nm[600];
            name_of(c, k, nm, sizeof nm);
            tsr_info("%s: answers again (down %.1f s)", nm,
                     (double)(tsr_clock_mono_ms() - atomic_load(&r->down_at_ms)) / 1000.0);
        }
    }
}

int tsr__replica_healthy(tsr__coord *c, size_t k, int64_t now_ms)
{
    tsr__replica *r = &c->rep[k];
    if (atomic_load(&r->lagging) || atomic_load(&r->stream_behind))
        return 0;
    if (atomic_load(&r->fails) > 0 && now_ms < atomic_load(&r->retry_at_ms))
        return 0;
    int st = tsr_rpc_channel_state(r->ch, 0);
    return st != TSR_RPC_CONN_TRANSIENT_FAILURE && st != TSR_RPC_CONN_SHUTDOWN;
}

/* The replica of group g to try next among those not in `tried` (bit j = replica j):
 * healthy before unhealthy, then fewest attempts in flight, ties in round-robin order;
 * among unhealthy ones the one whose back-off ends first. */
static size_t pick(tsr__coord *c, size_t g, uint32_t tried, int64_t now)
{
    const tsr__group *gr = &c->grp[g];
    size_t n = gr->n, best = SIZE_MAX;
    int best_h = 0, best_in = 0;
    int64_t best_at = 0;
    unsigned start = n > 1 ? atomic_fetch_add(&c->grp[g].next, 1u) % (unsigned)n : 0;
    for (size_t t = 0; t < n; t++) {
        size_t j = (start + t) % n;
        if (tried & (1u << j))
            continue;
        size_t k = gr->first + j;
        int h = tsr__replica_healthy(c, k, now);
        int in = atomic_load(&c->rep[k].inflight);
        int64_t at = atomic_load(&c->rep[k].retry_at_ms) +
                     (atomic_load(&c->rep[k].lagging) || atomic_load(&c->rep[k].stream_behind)
                          ? 3600000 : 0);
        int better = best == SIZE_MAX || (h && !best_h) ||
                     (h == best_h && h && in < best_in) ||
                     (h == best_h && !h && at < best_at);
        if (better) {
            best = k;
            best_h = h;
            best_in = in;
            best_at = at;
        }
    }
    return best;
}

static int untried_left(const tsr__coord *c, size_t g, uint32_t tried)
{
    for (size_t j = 0; j < c->grp[g].n; j++)
        if (!(tried & (1u << j)))
            return 1;
    return 0;
}

/* One group fan-out in progress: the rounds of attempts (first replicas, then retries on
 * other replicas of the groups whose attempt failed), shared by the blocking and the
 * asynchronous form. */
typedef struct gfan {
    tsr__coord *c;
    const char *method;
    tsr__gcall *calls;
    size_t n;
    int64_t deadline;
    uint32_t *tried;        /* per call: bit j = replica j of its group was tried */
    int *pending;           /* per call: needs (another) attempt */
    size_t *on;             /* per call: replica of the attempt in flight */
    tsr_rpc_fanout_call *fc; /* this round's attempts */
    size_t m;
    /* per call, read-your-writes (readidx.c): replicas that refused as behind (bits, as
     * tried), the highest applied seq among them and its replica (SIZE_MAX: none), whether
     * the demand was lowered once already, and the repacked request (owned) */
    uint32_t *behind;
    int64_t *best_seq;
    size_t *best_rep;
    int *lowered;
    uint8_t **repacked;
    double t0;
    tsr__gfan_fin fin;      /* asynchronous form */
    tsr_rpc_server *srv;    /* server form (no reply): its queue and fin */
    tsr__gfan_sfin sfin;
    void *ud;
} gfan;

static gfan *gf_new(tsr__coord *c, const char *method, tsr__gcall *calls, size_t n,
                    int64_t timeout_ms)
{
    gfan *g = tsr_xcalloc(1, sizeof *g);
    g->c = c;
    g->method = method;
    g->calls = calls;
    g->n = n;
    g->deadline = tsr_clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    g->tried = tsr_xcalloc(n ? n : 1, sizeof *g->tried);
    g->pending = tsr_xcalloc(n ? n : 1, sizeof *g->pending);
    g->on = tsr_xcalloc(n ? n : 1, sizeof *g->on);
    g->fc = tsr_xcalloc(n ? n : 1, sizeof *g->fc);
    g->behind = tsr_xcalloc(n ? n : 1, sizeof *g->behind);
    g->best_seq = tsr_xcalloc(n ? n : 1, sizeof *g->best_seq);
    g->best_rep = tsr_xcalloc(n ? n : 1, sizeof *g->best_rep);
    g->lowered = tsr_xcalloc(n ? n : 1, sizeof *g->lowered);
    g->repacked = tsr_xcalloc(n ? n : 1, sizeof *g->repacked);
    for (size_t i = 0; i < n; i++) {
        g->best_rep[i] = SIZE_MAX;
        g->pending[i] = 1;
        calls[i].attempts = 0;
        calls[i].replica = c->grp[calls[i].group].first;
    }
    return g;
}

static void gf_free(gfan *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->repacked[i]);
    free(g->behind);
    free(g->best_seq);
    free(g->best_rep);
    free(g->lowered);
    free(g->repacked);
    free(g->tried);
    free(g->pending);
    free(g->on);
    free(g->fc);
    free(g);
}

/* Fills g->fc with one attempt per pending call (a replica not tried yet, with a per-attempt
 * deadline that leaves time for another replica). Returns the number of attempts. */
static size_t gf_round(gfan *g)
{
    tsr__coord *c = g->c;
    int64_t now = tsr_clock_mono_ms(), left = g->deadline - now;
    size_t m = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!g->pending[i])
            continue;
        size_t gr = g->calls[i].group;
        if (c->grp[gr].n == 0) { /* a removed group (RemoveShardGroup): nothing to call */
            tsr_rpc_result *res = &g->calls[i].result;
            tsr_rpc_result_close(res);
            res->code = TSR_RPC_UNAVAILABLE;
            res->message = tsr_xstrdup("shard group removed");
            g->pending[i] = 0;
            continue;
        }
        size_t k = pick(c, gr, g->tried[i], now);
        g->tried[i] |= 1u << c->rep[k].index;
        int64_t att = left;
        if (untried_left(c, gr, g->tried[i])) {
            /* keep time for another replica: a hung one must not eat the deadline */
            int64_t a = c->cfg.replica_attempt_ms > 0 ? c->cfg.replica_attempt_ms : left / 2;
            if (a < att)
                att = a;
        }
        if (att < 1)
            att = 1;
        memset(&g->fc[m], 0, sizeof g->fc[m]);
        g->fc[m].ch = c->rep[k].ch;
        g->fc[m].method = g->method;
        g->fc[m].req = g->calls[i].req;
        g->fc[m].req_len = g->calls[i].len;
        g->fc[m].timeout_ms = att;
        g->fc[m].user = (void *)(uintptr_t)i;
        tsr_rpc_result_init(&g->fc[m].result);
        g->on[i] = k;
        atomic_fetch_add(&c->rep[k].inflight, 1);
        m++;
    }
    g->m = m;
    g->t0 = tsr_metrics_now();
    return m;
}

int tsr__coord_behind_of(const tsr_rpc_result *r, int64_t *applied)
{
    if (r->code != TSR_RPC_FAILED_PRECONDITION || !r->message ||
        !strstr(r->message, " not applied after "))
        return 0;
    const char *p = strstr(r->message, "applied seq "), *q = p;
    while (q && (q = strstr(q + 1, "applied seq ")) != NULL)
        p = q; /* the last one */
    long long n = 0;
    if (!p || sscanf(p, "applied seq %lld", &n) != 1)
        return 0;
    *applied = n;
    return 1;
}

/* Replica k refused call i as behind (applied seq `applied`): the best refusal so far is
 * kept for lower_demand. It is NOT marked stream_behind: that flag is the write path's
 * ("missed a round, to be caught up": stream.c skips such a replica's Writes and a group
 * with none left refuses writes), and a refusal here may only mean a Write still in
 * flight past the shard's 100 ms wait — on a loaded machine a group's only replica then
 * refused every streamed write until the next Stats pass (test_reshard, Dec 5). A replica
 * really behind is marked by the leader's Write fan-out, or by reconcile's Stats pass on
 * any coordinator (reconcile.c). */
static void behind_noted(gfan *g, size_t i, size_t k, int64_t applied)
{
    tsr__coord *c = g->c;
    g->behind[i] |= 1u << c->rep[k].index;
    if (g->best_rep[i] == SIZE_MAX || applied > g->best_seq[i]) {
        g->best_seq[i] = applied;
        g->best_rep[i] = k;
    }
    char nm[600];
    name_of(c, k, nm, sizeof nm);
    tsr_log_every(TSR_LOG_WARN, nm, 10000, "%s: behind the streamed writes a query demands "
                  "(applied seq %lld): asked another replica", nm, (long long)applied);
}

/* Every replica of call i's group refused as behind: asks the one with the highest applied
 * seq again with the demand lowered to that seq (readidx.c: it holds every acknowledged
 * write). Once per call. Returns whether a retry was set up. */
static int lower_demand(gfan *g, size_t i)
{
    tsr__coord *c = g->c;
    tsr__gcall *call = &g->calls[i];
    const tsr__group *gr = &c->grp[call->group];
    uint32_t all = gr->n >= 32 ? 0xffffffffu : (1u << gr->n) - 1;
    if (g->lowered[i] || g->best_rep[i] == SIZE_MAX || (g->behind[i] & all) != all)
        return 0;
    g->lowered[i] = 1;
    if (call->demand->descriptor == &tessera__v1__shard_search_request__descriptor) {
        Tessera__V1__ShardSearchRequest *sr = (Tessera__V1__ShardSearchRequest *)call->demand;
        for (size_t j = 0; j < sr->n_queries; j++)
            if (sr->queries[j]->min_stream_seq > g->best_seq[i])
                sr->queries[j]->min_stream_seq = g->best_seq[i];
    } else if (call->demand->descriptor == &tessera__v1__shard_read_request__descriptor) {
        Tessera__V1__ShardReadRequest *rr = (Tessera__V1__ShardReadRequest *)call->demand;
        if (rr->min_stream_seq > g->best_seq[i])
            rr->min_stream_seq = g->best_seq[i];
    } else {
        return 0;
    }
    size_t len = 0;
    free(g->repacked[i]);
    g->repacked[i] = tsr_rpc_pack(call->demand, &len);
    call->req = g->repacked[i];
    call->len = len;
    /* only the best one is left untried */
    g->tried[i] = all & ~(1u << c->rep[g->best_rep[i]].index);
    return 1;
}

/* After a round: records the outcomes, moves the results into the calls and decides the
 * retries. Returns nonzero when another round is needed. */
static int gf_collect(gfan *g)
{
    tsr__coord *c = g->c;
    double secs = tsr_metrics_now() - g->t0;
    int again = 0;
    int64_t now = tsr_clock_mono_ms();
    for (size_t q = 0; q < g->m; q++) {
        size_t i = (size_t)(uintptr_t)g->fc[q].user, k = g->on[i];
        tsr__gcall *call = &g->calls[i];
        atomic_fetch_sub(&c->rep[k].inflight, 1);
        tsr__replica_note(c, k, g->method, g->fc[q].result.code, secs);
        tsr_rpc_result_close(&call->result);
        call->result = g->fc[q].result; /* moves message and data */
        tsr_rpc_result_init(&g->fc[q].result);
        call->replica = k;
        call->attempts++;
        int retry = call->result.code != TSR_RPC_OK && replica_fault(call->result.code) &&
                    untried_left(c, call->group, g->tried[i]) && now < g->deadline;
        int64_t applied = 0;
        if (call->demand && tsr__coord_behind_of(&call->result, &applied)) {
            behind_noted(g, i, k, applied);
            if (!retry && now < g->deadline && lower_demand(g, i))
                retry = 1;
        }
        if (retry) {
            char nm[600], lbl[64];
            name_of(c, k, nm, sizeof nm);
            /* one line per replica every 10 s: under load every query in flight fails over */
            tsr_log_every(TSR_LOG_WARN, nm, 10000, "%s: %s %s: %s; failed over to another "
                          "replica", nm, short_method(g->method),
                          tsr_rpc_code_name(call->result.code), call->result.message);
            snprintf(lbl, sizeof lbl, "shard=%zu", call->group);
            tsr_metrics_counter_add("tessera_shard_failovers_total", lbl, 1);
        }
        g->pending[i] = retry;
        again |= retry;
    }
    return again;
}

size_t tsr__coord_group_fanout(tsr__coord *c, const char *method, tsr__gcall *calls, size_t n,
                               int64_t timeout_ms)
{
    if (n == 0)
        return 0;
    gfan *g = gf_new(c, method, calls, n, timeout_ms);
    for (;;) {
        size_t m = gf_round(g);
        if (m == 0)
            break;
        tsr_rpc_fanout(g->fc, m);
        if (!gf_collect(g))
            break;
    }
    gf_free(g);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += calls[i].result.code != TSR_RPC_OK;
    return bad;
}

/* The attempts of a round that could not be started: no longer in flight (their results,
 * when results_too, are dropped). */
static void gf_unstart(gfan *g, int results_too)
{
    for (size_t q = 0; q < g->m; q++) {
        size_t i = (size_t)(uintptr_t)g->fc[q].user;
        atomic_fetch_sub(&g->c->rep[g->on[i]].inflight, 1);
        if (results_too)
            tsr_rpc_result_close(&g->fc[q].result);
    }
}

static int gf_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *fc, size_t m);
static void gf_sdone(void *ud, tsr_rpc_fanout_call *fc, size_t m);

/* Starts g's current round: on r's queue (the asynchronous form) or as a server fan-out
 * (the server form, r NULL). Returns what the rpc call returned. */
static int gf_start(gfan *g, tsr_rpc_reply *r)
{
    return r ? tsr_rpc_reply_fanout(r, g->fc, g->m, gf_done, g)
             : tsr_rpc_server_fanout(g->srv, g->fc, g->m, gf_sdone, g);
}

/* After a round of either non-blocking form: 1 when retries were started (the round's
 * done callback continues), 0 when every call has its final result. */
static int gf_again(gfan *g, tsr_rpc_reply *r)
{
    if (!gf_collect(g) || gf_round(g) == 0)
        return 0;
    if (gf_start(g, r) == 0)
        return 1;
    gf_unstart(g, 1); /* could not start the retries: the last failures stand */
    return 0;
}

/* tsr_rpc_fanout_done_fn of the asynchronous form: the round has completed. */
static int gf_done(void *ud, tsr_rpc_reply *r, tsr_rpc_fanout_call *fc, size_t m)
{
    gfan *g = ud;
    (void)fc;
    (void)m;
    if (gf_again(g, r))
        return 0;
    tsr__gfan_fin fin = g->fin;
    void *fud = g->ud;
    tsr__gcall *calls = g->calls;
    size_t n = g->n;
    gf_free(g);
    return fin(fud, r, calls, n);
}

/* tsr_rpc_calls_done_fn of the server form: a round has completed. */
static void gf_sdone(void *ud, tsr_rpc_fanout_call *fc, size_t m)
{
    gfan *g = ud;
    (void)fc;
    (void)m;
    if (gf_again(g, NULL))
        return;
    tsr__gfan_sfin fin = g->sfin;
    void *fud = g->ud;
    tsr__gcall *calls = g->calls;
    size_t n = g->n;
    gf_free(g);
    fin(fud, calls, n);
}

/* Both non-blocking forms: the first round, started on r's queue or (r NULL) on srv's. */
static int gf_launch(tsr__coord *c, tsr_rpc_reply *r, tsr_rpc_server *srv, const char *method,
                     tsr__gcall *calls, size_t n, int64_t timeout_ms, tsr__gfan_fin fin,
                     tsr__gfan_sfin sfin, void *ud)
{
    gfan *g = gf_new(c, method, calls, n, timeout_ms);
    g->fin = fin;
    g->srv = srv;
    g->sfin = sfin;
    g->ud = ud;
    gf_round(g);
    int rc = gf_start(g, r);
    if (rc != 0) {
        gf_unstart(g, 0);
        gf_free(g);
    }
    return rc;
}

int tsr__coord_group_fanout_async(tsr__coord *c, tsr_rpc_reply *r, const char *method,
                                  tsr__gcall *calls, size_t n, int64_t timeout_ms,
                                  tsr__gfan_fin fin, void *ud)
{
    return gf_launch(c, r, NULL, method, calls, n, timeout_ms, fin, NULL, ud);
}

int tsr__coord_group_fanout_server(tsr__coord *c, tsr_rpc_server *srv, const char *method,
                                   tsr__gcall *calls, size_t n, int64_t timeout_ms,
                                   tsr__gfan_sfin fin, void *ud)
{
    return gf_launch(c, NULL, srv, method, calls, n, timeout_ms, NULL, fin, ud);
}

size_t tsr__coord_all_fanout(tsr__coord *c, const char *method, uint8_t **bufs, size_t *lens,
                             const char *skip, int64_t timeout_ms,
                             const ProtobufCMessageDescriptor *rdesc, ProtobufCMessage **resps,
                             tsr_error *err)
{
    size_t n = 0, bad = 0;
    tsr_rpc_fanout_call *calls = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *calls);
    for (size_t s = 0; s < c->cfg.nshards; s++) {
        if (!bufs[s])
            continue;
        for (size_t j = 0; j < c->grp[s].n; j++) {
            size_t k = c->grp[s].first + j;
            if (skip && skip[k])
                continue;
            calls[n].ch = c->rep[k].ch;
            calls[n].method = method;
            calls[n].req = bufs[s];
            calls[n].req_len = lens[s];
            calls[n].timeout_ms = timeout_ms;
            calls[n].user = (void *)(uintptr_t)k;
            tsr_rpc_result_init(&calls[n].result);
            n++;
        }
    }
    double t0 = tsr_metrics_now();
    tsr_rpc_fanout(calls, n);
    double secs = tsr_metrics_now() - t0;
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)(uintptr_t)calls[i].user;
        tsr_rpc_result *r = &calls[i].result;
        tsr__replica_note(c, k, method, r->code, secs);
        if (rdesc && resps) /* a reply that does not parse makes r INTERNAL */
            resps[k] = tsr_rpc_result_unpack(r, rdesc, NULL);
        if (r->code != TSR_RPC_OK) {
            if (!bad) {
                char nm[600];
                name_of(c, k, nm, sizeof nm);
                tsr_err(err, tsr_rpc_error_from_status(r->code), "%s: %s %s: %s", nm,
                        short_method(method), tsr_rpc_code_name(r->code),
                        r->message ? r->message : "");
            }
            bad++;
        }
        tsr_rpc_result_close(r);
    }
    free(calls);
    return bad;
}

uint8_t *tsr__coord_pack_version(tsr__coord *c, const char *what, int64_t version,
                                 uint32_t cpu_pct, size_t *len)
{
    if (strcmp(what, "Prepare") == 0) {
        Tessera__V1__PrepareRequest m = TESSERA__V1__PREPARE_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        m.build_cpu_percent = cpu_pct;
        return tsr_rpc_pack(&m.base, len);
    }
    if (strcmp(what, "Commit") == 0) {
        Tessera__V1__CommitRequest m = TESSERA__V1__COMMIT_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        return tsr_rpc_pack(&m.base, len);
    }
    if (strcmp(what, "Abort") == 0) {
        Tessera__V1__AbortRequest m = TESSERA__V1__ABORT_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        return tsr_rpc_pack(&m.base, len);
    }
    Tessera__V1__ReleaseRequest m = TESSERA__V1__RELEASE_REQUEST__INIT;
    m.below_version = version;
    m.leader_term = tsr__coord_term(c);
    return tsr_rpc_pack(&m.base, len);
}

/* ---------------------------------------------------------------- metrics */

static pthread_mutex_t coll_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t plan_version = UINT64_MAX;
static int64_t *plan_vec, *plan_lists;
static size_t plan_n;

static void collect(void *ud)
{
    tsr__coord *c = ud;
    int64_t now = tsr_clock_mono_ms();
    size_t S = c->cfg.nshards;
    char l[700];
    pthread_mutex_lock(&coll_mu);
    for (size_t s = 0; s < S && c->grp; s++) {
        int nup = 0;
        for (size_t j = 0; j < c->grp[s].n; j++) {
            size_t k = c->grp[s].first + j;
            tsr__replica *r = &c->rep[k];
            int h = tsr__replica_healthy(c, k, now);
            nup += h;
            snprintf(l, sizeof l, "shard=%zu,replica=%zu,address=%s", s, j, r->addr);
            tsr_metrics_gauge_set("tessera_shard_up", l, h);
            tsr_metrics_gauge_set("tessera_shard_consecutive_failures", l,
                                  atomic_load(&r->fails));
            tsr_metrics_gauge_set("tessera_shard_lagging", l, atomic_load(&r->lagging));
            tsr_metrics_gauge_set("tessera_shard_stream_behind", l,
                                  atomic_load(&r->stream_behind));
            if (atomic_load(&r->version) >= 0) {
                tsr_metrics_gauge_set("tessera_shard_version", l,
                                      (double)atomic_load(&r->version));
                tsr_metrics_gauge_set("tessera_shard_vectors", l,
                                      (double)atomic_load(&r->vectors));
                tsr_metrics_gauge_set("tessera_shard_sparse_vectors", l,
                                      (double)atomic_load(&r->sparse));
                tsr_metrics_gauge_set("tessera_shard_lists", l, (double)atomic_load(&r->lists));
            }
        }
        snprintf(l, sizeof l, "shard=%zu", s);
        tsr_metrics_gauge_set("tessera_shard_group_up", l, nup > 0);
        tsr_metrics_gauge_set("tessera_shard_replicas_up", l, nup);
        tsr_metrics_gauge_set("tessera_shard_replicas", l, (double)c->grp[s].n);
    }
    /* the plan's view: vectors and lists per shard group of the served version */
    tsr__snap *sn = tsr__coord_snap_get(c);
    tsr_metrics_gauge_set("tessera_version", NULL, (double)sn->version);
    if (sn->version != plan_version) {
        free(plan_vec);
        free(plan_lists);
        plan_n = S;
        plan_vec = tsr_xcalloc(S ? S : 1, sizeof *plan_vec);
        plan_lists = tsr_xcalloc(S ? S : 1, sizeof *plan_lists);
        for (size_t i = 0; i < sn->dir.n; i++)
            if ((size_t)sn->dir.e[i].shard < S)
                plan_vec[sn->dir.e[i].shard]++;
        for (size_t li = 0; sn->plan && sn->tmpl && li < sn->tmpl->nlist; li++)
            if ((size_t)sn->plan[li] < S)
                plan_lists[sn->plan[li]]++;
        plan_version = sn->version;
    }
    tsr__snap_unref(sn);
    for (size_t s = 0; s < plan_n; s++) {
        snprintf(l, sizeof l, "shard=%zu", s);
        tsr_metrics_gauge_set("tessera_plan_vectors", l, (double)plan_vec[s]);
        tsr_metrics_gauge_set("tessera_plan_lists", l, (double)plan_lists[s]);
    }
    pthread_mutex_unlock(&coll_mu);
    /* the running (or last) update's progress */
    pthread_mutex_lock(&c->op_mu);
    tsr__op *op = c->nops ? c->ops[c->nops - 1] : NULL;
    int64_t fr = 0, ft = 0, rr = 0;
    int st[4] = {0, 0, 0, 0}, running = c->busy;
    int64_t rs[4] = {0, 0, 0, 0};
    if (op) {
        rs[0] = op->lists_total;
        rs[1] = op->lists_moved;
        rs[2] = op->datapoints_moved;
        rs[3] = op->bytes_moved;
        fr = op->files_read;
        ft = op->files_total;
        rr = op->records_read;
        st[0] = op->shards_total;
        st[1] = op->shards_staged;
        st[2] = op->shards_prepared;
        st[3] = op->shards_committed;
    }
    pthread_mutex_unlock(&c->op_mu);
    tsr_metrics_gauge_set("tessera_update_running", NULL, running);
    tsr_metrics_gauge_set("tessera_update_files_total", NULL, (double)ft);
    tsr_metrics_gauge_set("tessera_update_files_read", NULL, (double)fr);
    tsr_metrics_gauge_set("tessera_update_records_read", NULL, (double)rr);
    static const char *steps[4] = {"step=total", "step=staged", "step=prepared",
                                   "step=committed"};
    for (int i = 0; i < 4; i++)
        tsr_metrics_gauge_set("tessera_update_shards", steps[i], st[i]);
    tsr_metrics_gauge_set("tessera_reshard_lists", "step=total", (double)rs[0]);
    tsr_metrics_gauge_set("tessera_reshard_lists", "step=moved", (double)rs[1]);
    tsr_metrics_gauge_set("tessera_reshard_datapoints_moved", NULL, (double)rs[2]);
    tsr_metrics_gauge_set("tessera_reshard_bytes_moved", NULL, (double)rs[3]);
}

void tsr__coord_metrics_register(tsr__coord *c)
{
    static const struct {
        const char *name;
        enum tsr_metric_type type;
        const char *help;
    } fam[] = {
        {"tessera_shard_consecutive_failures", TSR_METRIC_GAUGE,
         "Failed calls in a row to this replica, as the coordinator saw them (0 after a success)."},
        {"tessera_shard_lagging", TSR_METRIC_GAUGE,
         "1 when reconcile found the replica without the coordinator's version (not queried)."},
        {"tessera_shard_version", TSR_METRIC_GAUGE,
         "Current version of the replica at its last Stats (reconcile, about every second)."},
        {"tessera_shard_vectors", TSR_METRIC_GAUGE,
         "Dense datapoints in the replica's current version (its last Stats)."},
        {"tessera_shard_sparse_vectors", TSR_METRIC_GAUGE,
         "Sparse datapoints in the replica's current version (its last Stats)."},
        {"tessera_shard_lists", TSR_METRIC_GAUGE,
         "Non-empty IVF lists in the replica's current version (its last Stats)."},
        {"tessera_shard_group_up", TSR_METRIC_GAUGE,
         "1 while at least one replica of the shard group is healthy."},
        {"tessera_shard_replicas_up", TSR_METRIC_GAUGE, "Healthy replicas of the shard group."},
        {"tessera_shard_replicas", TSR_METRIC_GAUGE, "Configured replicas of the shard group."},
        {"tessera_shard_failovers_total", TSR_METRIC_COUNTER,
         "Query-path calls retried on another replica of the group after a replica failed."},
        {"tessera_coalesced_calls_total", TSR_METRIC_COUNTER,
         "Shard Search calls that carried the queries of several FindNeighbors requests."},
        {"tessera_coalesced_requests_total", TSR_METRIC_COUNTER,
         "FindNeighbors requests answered through a coalesced Search call (÷ calls = mean "
         "requests per coalesced call)."},
        {"tessera_plan_vectors", TSR_METRIC_GAUGE,
         "Ids the coordinator's directory places on the shard group (served version)."},
        {"tessera_plan_lists", TSR_METRIC_GAUGE,
         "IVF lists the partition plan gives the shard group."},
        {"tessera_queries_total", TSR_METRIC_COUNTER,
         "Queries (FindNeighbors request entries) the coordinator planned."},
        {"tessera_query_shards_touched_total", TSR_METRIC_COUNTER,
         "Sum over queries of the shard groups that owned a probed list."},
        {"tessera_query_lists_probed_total", TSR_METRIC_COUNTER,
         "Sum over queries of the IVF lists probed."},
        {"tessera_update_running", TSR_METRIC_GAUGE, "1 while an update operation runs."},
        {"tessera_shard_stream_behind", TSR_METRIC_GAUGE,
         "1 when the replica missed a streamed write (not queried until reconcile resent it)."},
        {"tessera_stream_writes_total", TSR_METRIC_COUNTER,
         "Streamed writes acknowledged, by op (upsert: datapoints, remove: ids removed)."},
        {"tessera_stream_rounds_total", TSR_METRIC_COUNTER,
         "Rounds of streamed writes logged and sent (one seq each; group commit)."},
        {"tessera_stream_log_bytes", TSR_METRIC_GAUGE,
         "Bytes of the coordinator log of streamed writes of the served version."},
        {"tessera_stream_overlay_records", TSR_METRIC_GAUGE,
         "Streamed writes since the served version (the overlay; a fold empties it)."},
        {"tessera_stream_folds_total", TSR_METRIC_COUNTER,
         "Background folds started (updates with no records)."},
        {"tessera_stream_catchups_total", TSR_METRIC_COUNTER,
         "Replicas caught up by resending the streamed writes they missed."},
        {"tessera_shard_resyncs_total", TSR_METRIC_COUNTER,
         "Lagging replicas re-seeded from a sibling by reconcile, by result (ok, failed)."},
        {"tessera_update_files_total", TSR_METRIC_GAUGE,
         "Batch files of the running (or last) update."},
        {"tessera_update_files_read", TSR_METRIC_GAUGE,
         "Batch files read so far by the running (or last) update."},
        {"tessera_update_records_read", TSR_METRIC_GAUGE,
         "Batch records read so far by the running (or last) update."},
        {"tessera_reshard_lists", TSR_METRIC_GAUGE,
         "Lists of the running (or last) operation that change shard group (a reshard, "
         "docs/resharding.md), by step: total, moved (read from their old group)."},
        {"tessera_reshard_datapoints_moved", TSR_METRIC_GAUGE,
         "Datapoints the running (or last) reshard read from their old group so far."},
        {"tessera_reshard_bytes_moved", TSR_METRIC_GAUGE,
         "Bytes (packed datapoints) the running (or last) reshard read from their old group."},
        {"tessera_update_shards", TSR_METRIC_GAUGE,
         "Shard groups of the running (or last) update by step: total, staged, prepared, "
         "committed (a group counts when every replica did the step)."},
    };
    static atomic_int done;
    if (atomic_exchange(&done, 1))
        return;
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
        tsr_metrics_describe(fam[i].name, fam[i].type, fam[i].help);
    /* counters that alerts use exist from the start (at 0), not from their first event */
    for (size_t s = 0; s < c->cfg.nshards; s++) {
        char l[32];
        snprintf(l, sizeof l, "shard=%zu", s);
        tsr_metrics_counter_add("tessera_shard_failovers_total", l, 0);
        tsr_metrics_counter_add("tessera_coalesced_calls_total", l, 0);
        tsr_metrics_counter_add("tessera_coalesced_requests_total", l, 0);
    }
    tsr_metrics_counter_add("tessera_shard_resyncs_total", "result=ok", 0);
    tsr_metrics_counter_add("tessera_shard_resyncs_total", "result=failed", 0);
    tsr_metrics_counter_add("tessera_queries_total", NULL, 0);
    tsr_metrics_counter_add("tessera_query_shards_touched_total", NULL, 0);
    tsr_metrics_counter_add("tessera_query_lists_probed_total", NULL, 0);
    tsr_metrics_add_collector(collect, c);
    tsr_metrics_update_phase("idle");
}
