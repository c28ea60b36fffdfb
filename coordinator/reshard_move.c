/*
 * reshard_move — AddShardGroup / RemoveShardGroup as operations (docs/resharding.md):
 * checks, the operation's thread, and the move itself, a planner on the version
 * transaction (txn.h) with reshard.c's plan and reshard_carry.c's catch-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batch/batch.h"
#include "coord.h"
#include "meta.h"
#include "core/clock.h"
#include "core/parallel.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"
#include "net/pb_datapoint.h"
#include "txn.h"

/* ---------------------------------------------------------------- resharding */

/* Waits ms (a removed group keeps answering the queries planned before the flip). */
static void drain_wait(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A move's state beside its transaction. */
typedef struct move {
    char **addrs;               /* borrowed: the replicas of an added group (n > 0) */
    size_t n;
    int rm;                     /* the group removed, or -1 */
    tsr_batch *b;               /* owned: the moved records (read after chunk 0) */
    tsr__reshard_moves *mv;     /* owned: the plan's moves */
} move;

/* With the stream frozen: the group added (checked, channels open), the plan of the move
 * on the committed version plus the streamed writes. */
static int move_plan(tsr__txn *u, void *ud, tsr_error *err)
{
    move *m = ud;
    tsr__coord *c = u->c;
    int rc = 0;
    if (u->base->version == 0 || !u->base->plan)
        rc = tsr_err(err, TSR_ESTATE, "no index yet: create it with UpdateIndex first");
    if (!rc && m->n) {
        if ((rc = tsr__coord_config_add_group(&c->cfg, (const char *const *)m->addrs, m->n,
                                              err)) == 0) {
            u->fresh = (int)c->cfg.nshards - 1;
            if ((rc = tsr__coord_group_append(c, err))) {
                tsr__coord_group_retire(c, (size_t)u->fresh); /* its slot stays, unused */
                u->fresh = -1;
            } else {
                rc = tsr__reshard_fresh_check(c, (size_t)u->fresh, err);
            }
        }
    }
    c->cfg.resharded = 1;
    pthread_mutex_lock(&c->op_mu);
    u->op->shards_total = (int)c->cfg.nshards;
    pthread_mutex_unlock(&c->op_mu);
    tsr__snap *view = rc ? NULL : tsr__stream_base(c, u->base);
    if (!rc)
        rc = tsr__reshard_plan(c, u->op, view ? view : u->base, m->rm, &u->p, &m->mv, err);
    tsr__stream_base_free(view);
    u->b = m->b;
    return rc;
}

/* After chunk 0, writes flowing: the moved records read from their old groups. */
static int move_fill(tsr__txn *u, void *ud, tsr_error *err)
{
    move *m = ud;
    return tsr__reshard_read(u->c, u->op, u->base->version, m->mv, &u->p, m->b, 1, err);
}

static void move_finish(tsr__txn *u, void *ud, int rc)
{
    (void)ud;
    if (rc == 0) {
        pthread_mutex_lock(&u->c->op_mu);
        u->op->lists_moved = u->op->lists_total;
        pthread_mutex_unlock(&u->c->op_mu);
    } else if (u->fresh >= 0) { /* the added group serves nothing: out of every later call */
        tsr__coord_group_retire(u->c, (size_t)u->fresh);
    }
}

/* One move (docs/resharding.md): add (addrs, n > 0: a new group appended) or remove group
 * rm; the plan of reshard.c, then the update's phases. Streamed writes wait only while it
 * plans and sends every group's Stage chunk 0 (at seq S), and from its catch-up (the
 * rounds after S carried to the new version) through its Commit fan-out; the read of the
 * moved records, the rest of the staging and Prepare run with writes flowing on the
 * served version ("Writes during a move"). Returns the final state. */
static int run_reshard(tsr__coord *c, tsr__op *op, char **addrs, size_t n, int rm,
                       int64_t *version, tsr_error *err)
{
    tsr__txn u = {.c = c, .op = op, .fresh = -1, .catchup = 1, .reshard = 1,
                  .term = tsr__coord_term(c)};
    move m = {.addrs = addrs, .n = n, .rm = rm, .b = tsr_xcalloc(1, sizeof *m.b)};
    tsr__txn_planner pl = {.plan_frozen = 1, .split_stage = 1, .plan = move_plan,
                           .fill = move_fill, .finish = move_finish, .ud = &m};
    int rc = tsr__txn_run(&u, &pl, version, err);
    const int64_t *t = u.t;
    if (u.t_refrozen) /* docs/resharding.md "Writes during a move": what writes waited for */
        tsr_info("reshard %s: streamed writes held %lld ms for the plan and chunk 0, then "
                 "flowing %lld ms (read, staging, Prepare), held %lld ms from the catch-up "
                 "through the Commit fan-out (catch-up and directory %lld ms, flip %lld ms, "
                 "Commit fan-out %lld ms)", op->id,
                 (long long)(t[TSR__TXN_T_STAGED] - t[TSR__TXN_T_START]),
                 (long long)(u.t_refrozen - t[TSR__TXN_T_STAGED]),
                 (long long)(u.t_thawed - u.t_refrozen),
                 (long long)(t[TSR__TXN_T_CAUGHT] - u.t_refrozen),
                 (long long)(t[TSR__TXN_T_FLIPPED] - t[TSR__TXN_T_CAUGHT]),
                 (long long)(u.t_thawed - t[TSR__TXN_T_FLIPPED]));
    tsr__reshard_moves_free(m.mv);
    if (rc == 0 && rm >= 0) {
        /* queries planned on the old version may still call it: drain, then retire */
        drain_wait(c->cfg.search_deadline_ms);
        tsr__coord_group_retire(c, (size_t)rm);
        tsr_info("reshard %s: shard group %d removed (its processes may be stopped)", op->id,
                 rm);
    }
    tsr_batch_destroy(m.b);
    return rc ? TESSERA__V1__OPERATION__STATE__FAILED : TESSERA__V1__OPERATION__STATE__SUCCEEDED;
}

typedef struct rs_arg {
    tsr__coord *c;
    tsr__op *op;
    char **addrs;                /* owned; n new replicas (add) */
    size_t n;
    int rm;                      /* remove: the group, else -1 */
} rs_arg;

static void *reshard_main(void *p)
{
    rs_arg *a = p;
    tsr__coord *c = a->c;
    tsr__op *op = a->op;
    tsr_error err = TSR_ERROR_INIT;
    tsr_metrics_update_phase("reshard");
    tsr__op_set(c, op, TESSERA__V1__OPERATION__STATE__READING);
    int64_t version = 0;
    pthread_mutex_lock(&c->update_mu);
    int st = run_reshard(c, op, a->addrs, a->n, a->rm, &version, &err);
    pthread_mutex_unlock(&c->update_mu);
    tsr__op_finish(c, op, st, st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? NULL : err.msg,
              version, err.code);
    for (size_t i = 0; i < a->n; i++)
        free(a->addrs[i]);
    free(a->addrs);
    free(a);
    return NULL;
}

/* The request against the groups (caller holds op_mu with no move running). Returns 0 or a
 * negative code with the status set on r. */
static int reshard_check(tsr__coord *c, char *const *addrs, size_t n, int64_t rm,
                         tsr_rpc_reply *r)
{
    if (n == 0 && (rm < 0 || (size_t)rm >= c->cfg.nshards || c->cfg.retired[rm]))
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "group %lld: not a shard group "
                                   "of this index (0 .. %zu, not removed)", (long long)rm,
                                   c->cfg.nshards ? c->cfg.nshards - 1 : 0);
    if (n > TSR_COORD_MAX_REPLICAS)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "replicas: %zu given, at most "
                                   "%d", n, TSR_COORD_MAX_REPLICAS);
    for (size_t i = 0; i < n; i++)
        if (!addrs[i] || !addrs[i][0] || strlen(addrs[i]) > 255)
            return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "replicas[%zu]: expected "
                                       "\"host:port\"", i);
    if (n && c->cfg.nshards >= TSR_COORD_MAX_SHARDS)
        return tsr_rpc_reply_error(r, TSR_RPC_RESOURCE_EXHAUSTED, "at most %d shard groups",
                                   TSR_COORD_MAX_SHARDS);
    if (!n) {
        size_t live = 0;
        for (size_t s = 0; s < c->cfg.nshards; s++)
            live += !c->cfg.retired[s];
        if (live < 2)
            return tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, "group %lld is the last "
                                       "shard group", (long long)rm);
    }
    return 0;
}

/* Starts a move on the update thread (one operation at a time). addrs (borrowed, n > 0):
 * add a group; else remove group rm. Returns 0 with the op id and the group in *group, or a
 * negative code with the status set on r. */
int tsr__reshard_start(tsr__coord *c, char *const *addrs, size_t n, int64_t rm,
                       uint32_t *group, char *id, size_t cap, tsr_rpc_reply *r)
{
    int rc = tsr__leader_check(c, r);
    if (rc) /* a follower refuses naming the leader, as for UpdateIndex */
        return rc;
    pthread_mutex_lock(&c->op_mu);
    if (c->busy || c->closing) {
        pthread_mutex_unlock(&c->op_mu);
        return tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, c->closing ? "shutting down"
                                   : "update in progress");
    }
    /* no move runs (busy is 0 under op_mu): the groups hold still while they are checked */
    rc = reshard_check(c, addrs, n, rm, r);
    if (rc) {
        pthread_mutex_unlock(&c->op_mu);
        return rc;
    }
    char what[300];
    if (n)
        snprintf(what, sizeof what, "(reshard: add group %zu %s%s)", c->cfg.nshards, addrs[0],
                 n > 1 ? ",..." : "");
    else
        snprintf(what, sizeof what, "(reshard: remove group %lld)", (long long)rm);
    *group = n ? (uint32_t)c->cfg.nshards : (uint32_t)rm;
    tsr__op *op = tsr__op_begin(c, what);
    rs_arg *a = tsr_xcalloc(1, sizeof *a);
    a->c = c;
    a->op = op;
    a->n = n;
    a->rm = n ? -1 : (int)rm;
    a->addrs = tsr_xcalloc(n + 1, sizeof *a->addrs);
    for (size_t i = 0; i < n; i++)
        a->addrs[i] = tsr_xstrdup(addrs[i]);
    if (tsr__op_launch(c, op, "reshard", reshard_main, a) != 0) {
        for (size_t i = 0; i < n; i++)
            free(a->addrs[i]);
        free(a->addrs);
        free(a);
    }
    snprintf(id, cap, "%s", op->id);
    tsr_info("reshard %s: %s", op->id, what);
    pthread_mutex_unlock(&c->op_mu);
    return 0;
}
