/*
 * txn — the version transaction's phases (txn.h): stage, prepare, catch-up, flip,
 * commit, abort; the operation helpers and the update_min_replicas fan-out they share.
 * The planners that drive it: update.c (UpdateIndex, folds), reshard_move.c (moves).
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

/* ---------------------------------------------------------------- op helpers */

void tsr__op_set(tsr__coord *c, tsr__op *op, int state)
{
    pthread_mutex_lock(&c->op_mu);
    op->state = state;
    pthread_mutex_unlock(&c->op_mu);
}

/* Writes op's record (oplog.c); a failure is logged, the update goes on: the record only
 * matters after a restart, and the log says it is missing. */
static void op_save(tsr__coord *c, tsr__op *op, int state)
{
    tsr_error err = TSR_ERROR_INIT;
    if (tsr__oplog_save(c, op, state, 0, &err))
        tsr_warn("update %s: cannot write its operation record: %s", op->id, err.msg);
}

/* ---------------------------------------------------------------- starting an operation */

tsr__op *tsr__op_begin(tsr__coord *c, const char *what)
{
    if (c->upd_thread_live) {
        pthread_join(c->upd_thread, NULL); /* finished: busy is 0 */
        c->upd_thread_live = 0;
    }
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-%llu-%lld", (unsigned long long)++c->op_seq,
             (long long)(tsr_clock_wall_ms() % 1000000));
    op->state = TESSERA__V1__OPERATION__STATE__PENDING;
    op->batch_root = tsr_xstrdup(what);
    op->start_ms = tsr_clock_wall_ms();
    op->shards_total = (int)c->cfg.nshards;
    if (c->nops == TSR__OP_MAX_KEPT) { /* forget the oldest finished one */
        tsr__oplog_forget(c, c->ops[0]);
        tsr__op_free(c->ops[0]);
        memmove(c->ops, c->ops + 1, (c->nops - 1) * sizeof *c->ops);
        c->nops--;
    }
    c->ops = tsr_xrealloc(c->ops, (c->nops + 1) * sizeof *c->ops);
    c->ops[c->nops++] = op;
    c->busy = 1;
    return op;
}

int tsr__op_launch(tsr__coord *c, tsr__op *op, const char *kind, void *(*fn)(void *),
                   void *arg)
{
    tsr_error serr = TSR_ERROR_INIT;
    if (tsr__oplog_save(c, op, 0, 1, &serr)) /* accepted = on disk (op_mu held: one fsync) */
        tsr_warn("%s %s: cannot write its operation record: %s", kind, op->id, serr.msg);
    if (pthread_create(&c->upd_thread, NULL, fn, arg) != 0) {
        c->busy = 0;
        op->state = TESSERA__V1__OPERATION__STATE__FAILED;
        op->error = tsr_xstrdup("cannot start the update thread");
        return -1;
    }
    c->upd_thread_live = 1;
    return 0;
}

/* Adds a line to op's warnings (GetOperation, `tessera update`). */
static void op_warn(tsr__coord *c, tsr__op *op, const char *w)
{
    pthread_mutex_lock(&c->op_mu);
    op->warnings = tsr_xrealloc(op->warnings, (op->nwarnings + 1) * sizeof *op->warnings);
    op->warnings[op->nwarnings++] = tsr_xstrdup(w);
    pthread_mutex_unlock(&c->op_mu);
}

/* Ends the operation; code is the TSR error code of a failure (for the metrics). */
void tsr__op_finish(tsr__coord *c, tsr__op *op, int state, const char *error, int64_t version,
                    int code)
{
    pthread_mutex_lock(&c->op_mu);
    if (error)
        op->error = tsr_xstrdup(error);
    op->version = version;
    op->end_ms = tsr_clock_wall_ms();
    int staged = op->staged;
    pthread_mutex_unlock(&c->op_mu);
    op_save(c, op, state); /* on disk before any client can see the end */
    pthread_mutex_lock(&c->op_mu);
    op->state = state;
    c->busy = 0; /* with the state: a client that saw the end may start the next update */
    pthread_mutex_unlock(&c->op_mu);
    if (state == TESSERA__V1__OPERATION__STATE__SUCCEEDED) {
        tsr_metrics_update_done("committed", NULL);
        tsr_info("update %s: SUCCEEDED, version %lld in %lld ms", op->id, (long long)version,
                 (long long)(op->end_ms - op->start_ms));
    } else {
        int rej = state == TESSERA__V1__OPERATION__STATE__REJECTED;
        tsr_metrics_update_done(rej ? "rejected" : staged ? "aborted" : "failed",
                                tsr_errcode_name(rej ? TSR_EREJECTED
                                                      : code ? code : TSR_EINTERNAL));
        tsr_warn("update %s: %s%s%s", op->id, rej ? "REJECTED" : "FAILED", error ? ": " : "",
                 error ? error : "");
    }
}

/* ---------------------------------------------------------------- shard calls */

/* Fan-out of one packed request per shard group (bufs[s] NULL = skip s) to every replica
 * of the group. Returns the number of failed replica calls; the first failure's message
 * goes into err. resps (when set) has one entry per replica (c->nrep). */
size_t tsr__txn_fan(tsr__coord *c, const char *method, uint8_t **bufs, size_t *lens,
                    const char *skip, int64_t timeout_ms, const ProtobufCMessageDescriptor *rdesc,
                    ProtobufCMessage **resps, tsr_error *err)
{
    return tsr__coord_all_fanout(c, method, bufs, lens, skip, timeout_ms, rdesc, resps, err);
}

static size_t fan_version(tsr__coord *c, const char *what, int64_t version, uint32_t cpu_pct,
                          const char *skip, int64_t timeout_ms,
                          const ProtobufCMessageDescriptor *rdesc, ProtobufCMessage **resps,
                          tsr_error *err)
{
    size_t S = c->cfg.nshards;
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    size_t *lens = tsr_xcalloc(S, sizeof *lens);
    size_t len = 0;
    char method[64];
    snprintf(method, sizeof method, TSR_SHARD_SVC "%s", what);
    uint8_t *one = tsr__coord_pack_version(c, what, version, cpu_pct, &len);
    for (size_t s = 0; s < S; s++) {
        bufs[s] = one;
        lens[s] = len;
    }
    size_t bad = tsr__txn_fan(c, method, bufs, lens, skip, timeout_ms, rdesc, resps, err);
    free(one);
    free(bufs);
    free(lens);
    return bad;
}

/* Commit(version) to every replica not left out; missed[s] counts the replicas of group s
 * that did not take it. Returns the number of failed replica calls. */
static size_t commit_all(tsr__coord *c, int64_t version, const char *out, int *missed,
                         tsr_error *err)
{
    ProtobufCMessage **resps = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *resps);
    size_t bad = fan_version(c, "Commit", version, 0, out, c->cfg.stage_deadline_ms,
                             &tessera__v1__commit_response__descriptor, resps, err);
    for (size_t k = 0; k < c->nrep; k++) {
        if (!resps[k] && !out[k] && !tsr__replica_removed(c, k))
            missed[c->rep[k].group]++;
        else
            protobuf_c_message_free_unpacked(resps[k], NULL);
    }
    free(resps);
    return bad;
}

/* update_min_replicas: after a fan-out of `what` to the groups with bufs[s] set (bufs NULL:
 * every group) and the replicas not yet left out (out[k] = 0), resps[k] NULL marks a
 * failed replica. Returns 0 when there was no failure, or when update_min_replicas lets
 * every failed replica be left out of this version (out[k] = 1, a warning on op each)
 * while each group keeps enough replicas; otherwise the error code, with err naming the
 * failure (and the group that fell short). Frees nothing. */
static int absorb_failures(tsr__coord *c, tsr__op *op, const char *what, int64_t version,
                           uint8_t **bufs, ProtobufCMessage **resps, char *out, size_t bad,
                           tsr_error *err)
{
    if (!bad)
        return 0;
    int code = err->code ? err->code : TSR_EUNAVAILABLE;
    int min = c->cfg.update_min_replicas;
    if (min <= 0)
        return code;
    for (size_t s = 0; s < c->cfg.nshards; s++) {
        if (bufs && !bufs[s])
            continue;
        const tsr__group *g = &c->grp[s];
        size_t need = (size_t)min < g->n ? (size_t)min : g->n, ok = 0;
        for (size_t j = 0; j < g->n; j++)
            ok += !out[g->first + j] && resps[g->first + j] != NULL;
        if (ok < need) {
            char first[sizeof err->msg];
            snprintf(first, sizeof first, "%s", err->msg);
            return tsr_err(err, code, "update_min_replicas %d: shard %zu has %zu of %zu "
                           "replicas left for version %lld (first failure of the %s fan-out: "
                           "%s)", min, s, ok, g->n, (long long)version, what, first);
        }
    }
    for (size_t k = 0; k < c->nrep; k++) {
        if (out[k] || resps[k] || (bufs && !bufs[c->rep[k].group]) ||
            tsr__replica_removed(c, k))
            continue;
        out[k] = 1;
        char w[700];
        snprintf(w, sizeof w, "shard %zu replica %zu (%s) left out of version %lld: its %s "
                 "failed (reconcile re-seeds it from a sibling replica)", c->rep[k].group,
                 c->rep[k].index, c->rep[k].addr, (long long)version, what);
        tsr_warn("update %s: %s; first failure of the fan-out: %s", op->id, w, err->msg);
        op_warn(c, op, w);
    }
    tsr_error_clear(err);
    return 0;
}

/* Abort(version) to the replicas left out (they may have staged part of it, or be
 * unreachable: best effort, reconcile aborts a leftover later). An update whose every
 * replica is in (the usual case) sends nothing. */
static void abort_left_out(tsr__coord *c, tsr__op *op, int64_t version, const char *out)
{
    char *in = tsr_xcalloc(c->nrep ? c->nrep : 1, 1);
    size_t nout = 0;
    for (size_t k = 0; k < c->nrep; k++) {
        in[k] = !out[k];
        nout += out[k] != 0;
    }
    if (nout) {
        tsr_error aerr = TSR_ERROR_INIT;
        if (fan_version(c, "Abort", version, 0, in, c->cfg.search_deadline_ms, NULL, NULL, &aerr))
            tsr_warn("update %s: Abort(%lld) to a replica left out failed (reconcile aborts "
                     "it when it is back): %s", op->id, (long long)version, aerr.msg);
    }
    free(in);
}

/* ---------------------------------------------------------------- op progress */

/* Each takes op_mu for one change GetOperation may read. */
static void op_begin_staging(tsr__coord *c, tsr__op *op, int64_t target)
{
    pthread_mutex_lock(&c->op_mu);
    op->target = target;
    op->state = TESSERA__V1__OPERATION__STATE__STAGING;
    pthread_mutex_unlock(&c->op_mu);
}

static void op_mark_staged(tsr__coord *c, tsr__op *op)
{
    pthread_mutex_lock(&c->op_mu);
    op->staged = 1;
    pthread_mutex_unlock(&c->op_mu);
}

static void op_set_records(tsr__coord *c, tsr__op *op, int64_t n)
{
    pthread_mutex_lock(&c->op_mu);
    op->records_read = n;
    pthread_mutex_unlock(&c->op_mu);
}

static void op_set_shards(tsr__coord *c, tsr__op *op, int *field, int n, int state)
{
    pthread_mutex_lock(&c->op_mu);
    *field = n;
    if (state)
        op->state = state;
    pthread_mutex_unlock(&c->op_mu);
}

/* Wakes reconcile now (a replica missed Commit). */
static void reconcile_kick(tsr__coord *c)
{
    pthread_mutex_lock(&c->rec_mu);
    pthread_cond_signal(&c->rec_cv);
    pthread_mutex_unlock(&c->rec_mu);
}

/* A warning naming the batch's delete ids that the base version does not hold. */
static void warn_unknown_deletes(tsr__txn *u)
{
    char w[1024];
    int64_t n = u->p.nunknown;
    int o = snprintf(w, sizeof w, "%lld deleted id%s not in the index (version %llu), "
                     "ignored:", (long long)n, n == 1 ? " is" : "s are",
                     (unsigned long long)u->base->version);
    size_t shown = n < TSR__UPD_UNKNOWN_KEPT ? (size_t)n : TSR__UPD_UNKNOWN_KEPT;
    for (size_t i = 0; i < shown && o > 0 && (size_t)o < sizeof w; i++)
        o += snprintf(w + o, sizeof w - (size_t)o, "%s '%.80s'", i ? "," : "",
                      u->b->deletes[u->p.unknown[i]]);
    if (o > 0 && (size_t)o < sizeof w && (int64_t)shown < n)
        snprintf(w + o, sizeof w - (size_t)o, ", ...");
    tsr_warn("update %s: %s", u->op->id, w);
    op_warn(u->c, u->op, w);
}

/* The planning phase (update_plan.c). overlay: the base is the committed version plus the
 * streamed writes on it (stream lock held); else the committed version alone (a fold with
 * a catch-up, whose directory gets the overlay at its catch-up). */
int tsr__txn_plan(tsr__txn *u, int overlay, tsr_error *err)
{
    tsr__snap *view = overlay ? tsr__stream_base(u->c, u->base) : NULL;
    int rc = tsr__upd_plan_build(&u->c->cfg, u->c->template_path, view ? view : u->base, u->b,
                                 u->op->overwrite, &u->p, err);
    tsr__stream_base_free(view);
    if (rc)
        return rc;
    tsr_info("update %s: version %lld: %zu upserts (%lld moved between shards), %lld deletes, "
             "%s", u->op->id, (long long)u->newv, u->b->nrecords, (long long)u->p.nmoved,
             (long long)u->p.ndeleted, u->p.overwrite ? "empty base" : "delta");
    if (u->p.nunknown)
        warn_unknown_deletes(u);
    return 0;
}

/* Stage round r of part for group s (chunk 0 carries own_lists and, on an empty base, the
 * template): a new packed StageRequest, or NULL when group s has nothing left (a round
 * past chunk 0). TSR__STAGE_HEAD: chunk 0 without records; TSR__STAGE_REST: round r is chunk r + 1. */
static uint8_t *stage_request(const tsr__txn *u, size_t s, size_t r, int part, const int32_t *own,
                              size_t nown, size_t *len)
{
    const tsr__shard_work *w = &u->p.w[s];
    const tsr__snap *ns = u->p.ns;
    size_t chunk = (size_t)u->c->cfg.stage_chunk;
    size_t u0 = r * chunk, d0 = r * chunk, cn = part == TSR__STAGE_REST ? r + 1 : r;
    if (part == TSR__STAGE_HEAD)
        u0 = w->nups, d0 = w->ndels; /* no record */
    if (cn > 0 && u0 >= w->nups && d0 >= w->ndels)
        return NULL;
    Tessera__V1__StageRequest m = TESSERA__V1__STAGE_REQUEST__INIT;
    m.version = u->newv;
    m.leader_term = tsr__coord_term(u->c);
    int empty = u->p.overwrite || (int)s == u->fresh;
    m.base_version = empty ? 0 : (int64_t)u->base->version;
    m.chunk = (int32_t)cn;
    if (cn == 0) {
        m.capture_delta = u->catchup;
        /* the shard folds its delta of the base: it must have applied exactly this */
        m.base_stream_seq = (int)s == u->fresh ? 0 : tsr__stream_group_seq(u->c, s);
        if (empty) {
            m.template_faiss.data = ns->tmpl_bytes;
            m.template_faiss.len = ns->tmpl_len;
        }
        m.own_lists = (int32_t *)own;
        m.n_own_lists = nown;
    }
    size_t nu = u0 < w->nups ? w->nups - u0 : 0;
    if (nu > chunk)
        nu = chunk;
    size_t ndl = d0 < w->ndels ? w->ndels - d0 : 0;
    if (ndl > chunk)
        ndl = chunk;
    Tessera__V1__StagedUpsert *su = tsr_xcalloc(nu + 1, sizeof *su);
    Tessera__V1__StagedUpsert **sup = tsr_xcalloc(nu + 1, sizeof *sup);
    tsr_pb_datapoint *pd = tsr_xcalloc(nu + 1, sizeof *pd);
    Tessera__V1__StagedDelete **sdp = tsr_xcalloc(ndl + 1, sizeof *sdp);
    for (size_t k = 0; k < nu; k++) {
        const tsr_datapoint *rec = &u->b->records[w->ups[u0 + k]];
        tessera__v1__staged_upsert__init(&su[k]);
        const tsr__dir_entry *e = tsr__dir_find(&ns->dir, rec->id);
        su[k].label = e->label;
        su[k].list = e->list;
        tsr_pb_datapoint_set(&pd[k], rec);
        su[k].datapoint = &pd[k].dp;
        sup[k] = &su[k];
    }
    for (size_t k = 0; k < ndl; k++)
        sdp[k] = &w->dels[d0 + k];
    m.upserts = sup;
    m.n_upserts = nu;
    m.deletes = sdp;
    m.n_deletes = ndl;
    uint8_t *buf = tsr_rpc_pack(&m.base, len);
    for (size_t k = 0; k < nu; k++)
        tsr_pb_datapoint_free(&pd[k]);
    free(pd);
    free(su);
    free(sup);
    free(sdp);
    return buf;
}

/* Stage rounds: the most chunks any group needs (at least one: chunk 0 names the lists). */
static size_t stage_rounds(const tsr__txn *u)
{
    size_t chunk = (size_t)u->c->cfg.stage_chunk, rounds = 1;
    for (size_t s = 0; s < u->p.nshards; s++) {
        const tsr__shard_work *w = &u->p.w[s];
        size_t r1 = (w->nups + chunk - 1) / chunk, r2 = (w->ndels + chunk - 1) / chunk;
        if (r1 > rounds)
            rounds = r1;
        if (r2 > rounds)
            rounds = r2;
    }
    return rounds;
}

/* STAGING: the chunks of newv (part: all, or a move's chunk 0 / the rest) to every replica
 * not left out, one fan-out per round. */
int tsr__txn_stage(tsr__txn *u, int part, tsr_error *err)
{
    tsr__coord *c = u->c;
    size_t S = u->p.nshards, nlist = u->p.ns->tmpl->nlist;
    if (part != TSR__STAGE_REST) {
        op_begin_staging(c, u->op, u->newv);
        op_save(c, u->op, 0); /* after a crash from here on, CURRENT >= newv means it committed */
        tsr_metrics_update_phase("stage");
    }
    int32_t **own = tsr_xcalloc(S, sizeof *own);
    size_t *nown = tsr_xcalloc(S, sizeof *nown);
    for (size_t s = 0; s < S; s++)
        own[s] = tsr_xmalloc((nlist + 1) * sizeof(int32_t));
    for (size_t l = 0; l < nlist; l++)
        own[u->p.ns->plan[l]][nown[u->p.ns->plan[l]]++] = (int32_t)l;
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    size_t *lens = tsr_xcalloc(S, sizeof *lens);
    ProtobufCMessage **sr = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *sr);
    if (part != TSR__STAGE_REST) {
        u->staged_any = 1;
        op_mark_staged(c, u->op);
    }
    int rc = 0;
    size_t rounds = part == TSR__STAGE_HEAD ? 1 : stage_rounds(u);
    for (size_t r = 0; r < rounds && rc == 0; r++) {
        for (size_t s = 0; s < S; s++)
            bufs[s] = stage_request(u, s, r, part, own[s], nown[s], &lens[s]);
        size_t bad = tsr__txn_fan(c, TSR_SHARD_SVC "Stage", bufs, lens, u->out, c->cfg.stage_deadline_ms,
                         &tessera__v1__stage_response__descriptor, sr, err);
        rc = absorb_failures(c, u->op, "Stage", u->newv, bufs, sr, u->out, bad, err);
        for (size_t k = 0; k < c->nrep; k++) {
            protobuf_c_message_free_unpacked(sr[k], NULL); /* accepts NULL */
            sr[k] = NULL;
        }
        for (size_t s = 0; s < S; s++) {
            free(bufs[s]);
            bufs[s] = NULL;
        }
        op_set_records(c, u->op, (int64_t)u->b->nrecords);
    }
    for (size_t s = 0; s < S; s++)
        free(own[s]);
    free(own);
    free(nown);
    free(bufs);
    free(lens);
    free(sr);
    if (rc || part == TSR__STAGE_HEAD)
        return rc;
    op_set_shards(c, u->op, &u->op->shards_staged, (int)S,
                  TESSERA__V1__OPERATION__STATE__PREPARING);
    op_save(c, u->op, 0);
    tsr__coord_crash_point("staged");
    return 0;
}

/* PREPARING: every replica not left out must be ready (or be left out, within
 * update_min_replicas); then the ones left out are aborted. */
int tsr__txn_prepare(tsr__txn *u, tsr_error *err)
{
    tsr__coord *c = u->c;
    tsr_metrics_update_phase("prepare");
    ProtobufCMessage **pr = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *pr);
    /* A fold's Prepare goes to fold_prepare_parallel replicas at a time (default 1): its
     * writes flow meanwhile, so a longer fold costs nothing, and one shard building at a
     * time leaves the cores to the queries (p99 during a fold at 1M: 10.5-15.6 ms one at a
     * time against 14.5-18.7 ms all at once, four runs each, docs/performance.md), and its
     * build is paced to fold_build_cpu_percent of a core. An update's Prepare holds the
     * streamed writes: all at once, unpaced. */
    int fold = u->catchup && !u->reshard;
    size_t par = fold ? (size_t)c->cfg.fold_prepare_parallel : 0, bad = 0;
    uint32_t pct = fold ? (uint32_t)c->cfg.fold_build_cpu_percent : 0;
    if (par == 0 || par > c->nrep)
        par = c->nrep; /* one round: every replica not left out */
    char *skip = tsr_xmalloc(c->nrep ? c->nrep : 1);
    for (size_t k0 = 0; k0 < c->nrep; k0 += par) {
        for (size_t k = 0; k < c->nrep; k++)
            skip[k] = u->out[k] || k < k0 || k >= k0 + par;
        tsr_error e = TSR_ERROR_INIT;
        size_t b = fan_version(c, "Prepare", u->newv, pct, skip, c->cfg.stage_deadline_ms,
                               &tessera__v1__prepare_response__descriptor, pr, &e);
        if (b && !bad)
            *err = e;
        bad += b;
    }
    free(skip);
    for (size_t k = 0; k < c->nrep; k++) {
        Tessera__V1__PrepareResponse *p = (Tessera__V1__PrepareResponse *)pr[k];
        if (p && !p->ready) {
            if (!bad++)
                tsr_err(err, TSR_ESTATE, "shard %zu replica %zu (%s): Prepare(%lld) not ready: "
                        "%s", c->rep[k].group, c->rep[k].index, c->rep[k].addr,
                        (long long)u->newv, p->reason ? p->reason : "");
            protobuf_c_message_free_unpacked(pr[k], NULL);
            pr[k] = NULL; /* failed */
        }
    }
    int rc = absorb_failures(c, u->op, "Prepare", u->newv, NULL, pr, u->out, bad, err);
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(pr[k], NULL); /* accepts NULL */
    free(pr);
    if (rc)
        return rc;
    abort_left_out(c, u->op, u->newv, u->out); /* before the flip: they must not commit */
    op_set_shards(c, u->op, &u->op->shards_prepared, (int)u->p.nshards, 0);
    tsr__coord_crash_point("prepared");
    return 0;
}

/* Removes the store's v(newv) that no commit point made a version: CURRENT (and with
 * --etcd the version key) still names N, so it was never served. It is left by an etcd
 * commit that was refused (this leader deposed mid-update) or by a crash between the save
 * and the flip, and it would make every later save of newv fail "version already
 * committed" (the Dec 5 60-minute chaos run: 19 minutes of refused updates). When etcd's
 * answer was lost and the commit did land, the removed copy is the cache a follower
 * rebuilds (meta.c tsr__meta_sync). */
static void drop_uncommitted(tsr__coord *c, tsr__txn *u, const char *why)
{
    tsr_error e = TSR_ERROR_INIT;
    if (tsr_store_remove(c->store, (uint64_t)u->newv, &e) == 0)
        tsr_warn("update %s: removed the stored version %lld of %s", u->op->id,
                 (long long)u->newv, why);
    else if (e.code != TSR_ENOTFOUND)
        tsr_warn("update %s: %s", u->op->id, e.msg);
}

/* The commit point: the coordinator's v(newv) on disk, CURRENT flipped, the snapshot
 * published. Past a success newv is never aborted. */
int tsr__txn_flip(tsr__txn *u, tsr_error *err)
{
    tsr__coord *c = u->c;
    int rc;
    tsr_etcd_cmp lead[2];
    size_t nlead = tsr__leader_fence(c, lead);
    tsr__meta_carry carry = {0}; /* a fold with --etcd: the rounds its record names */
    /* never under a newer term (docs/ha.md "A term change mid-update") */
    if (nlead > 0 && lead[0].num != u->term)
        return tsr_err(err, TSR_ESTATE, "update %s: leader term %lld became %lld: not committed",
                       u->op->id, (long long)u->term, (long long)lead[0].num);
    drop_uncommitted(c, u, "an earlier try that did not commit");
    if ((rc = tsr__snap_save(u->p.ns, c->store, err)) ||
        (rc = tsr__stream_version_begin(c, (uint64_t)u->newv, u->p.ns->next_label,
                                        u->next_seqs, u->p.nshards, err)))
        return rc;
    tsr__coord_crash_point("saved"); /* v(newv) stored, not the commit point yet */
    if (c->meta) { /* the commit point is the etcd transaction; CURRENT is a cache */
        /* the writes a catch-up carried sit in the shards' delta of newv, not in its
         * slices, so Shard.List alone cannot rebuild its directory. A fold's rounds went
         * to the same groups as logged: its record names them (seqs (S, T] of the base
         * version's mirrored log, kept in etcd while newv serves) and a rebuild applies
         * them onto the listing (dirshard.c). A reshard move re-routed them: its directory
         * still goes to etcd as a blob (docs/ha.md "Folds with --etcd"), as does a fold's
         * while the stream waits for etcd's rounds to be read again (the local log may
         * then lack a round etcd kept). */
        int64_t upto = tsr__stream_last_seq(c); /* T: the stream lock is ours */
        int blob = u->catchup && u->reshard;
        if (u->catchup && !u->reshard && upto > u->carry_after) {
            if (tsr__coord_readopt_pending(c))
                blob = 1;
            else
                carry = (tsr__meta_carry){u->base->version, u->carry_after, upto};
        }
        if ((rc = tsr__meta_commit(c->meta, c->store, (uint64_t)u->newv, blob, &carry, lead,
                                   nlead, err))) {
            if (rc == TSR_ESTATE)
                tsr__leader_lost(c, err->msg);
            drop_uncommitted(c, u, "its commit failed");
            return rc;
        }
        tsr_error e2 = TSR_ERROR_INIT;
        if (tsr_store_set_current(c->store, (uint64_t)u->newv, &e2))
            tsr_warn("update %s: committed version %lld in etcd but the local cache's "
                     "CURRENT was not flipped: %s", u->op->id, (long long)u->newv, e2.msg);
    } else if ((rc = tsr_store_set_current(c->store, (uint64_t)u->newv, err))) {
        return rc;
    }
    u->staged_any = 0;
    tsr__coord_crash_point("flipped");
    for (size_t k = 0; k < c->nrep; k++)
        if (u->out[k]) /* not queried on newv until reconcile re-seeded it */
            atomic_store(&c->rep[k].lagging, 1);
    /* the snapshot, the overlay emptied and newv's group seqs, at once */
    tsr__stream_publish(c, u->p.ns, u->next_seqs, u->p.nshards, carry.from != 0);
    u->p.ns = NULL;
    tsr__op_set(c, u->op, TESSERA__V1__OPERATION__STATE__COMMITTING);
    op_save(c, u->op, 0);
    return 0;
}

/* COMMITTING: Commit(newv) to every replica not left out (one that misses it is fixed by
 * reconcile), then the delayed Release and the removal of old stored versions (the
 * previous one stays as a fallback). Nothing here fails the update. */
void tsr__txn_commit(tsr__txn *u)
{
    tsr__coord *c = u->c;
    size_t S = u->p.nshards;
    tsr_metrics_update_phase("commit");
    tsr_metrics_version_set((uint64_t)u->newv);
    tsr_error cerr = TSR_ERROR_INIT;
    int *missed = tsr_xcalloc(S ? S : 1, sizeof *missed);
    size_t bad = commit_all(c, u->newv, u->out, missed, &cerr);
    size_t groups_missed = 0;
    for (size_t s = 0; s < S; s++)
        groups_missed += missed[s] != 0;
    free(missed);
    if (bad) {
        tsr_warn("update %s: %zu replica(s) missed Commit(%lld) (reconcile will retry): %s",
                 u->op->id, bad, (long long)u->newv, cerr.msg);
        reconcile_kick(c);
    }
    op_set_shards(c, u->op, &u->op->shards_committed, (int)(S - groups_missed), 0);
    tsr__coord_crash_point("committed");
    tsr__coord_schedule_release(c, (uint64_t)u->newv);
    if (u->newv >= 3) {
        tsr_error e2 = TSR_ERROR_INIT;
        uint64_t *vs = NULL;
        size_t nv = 0;
        if (tsr_store_list(c->store, &vs, &nv, &e2) == 0) {
            for (size_t i = 0; i < nv; i++)
                if (vs[i] + 1 < (uint64_t)u->newv)
                    tsr_store_remove(c->store, vs[i], &e2);
            free(vs);
        }
    }
}

/* Cleanup: a failure after staging began aborts newv on every shard (N stays served). */
void tsr__txn_cleanup(tsr__txn *u, int rc)
{
    if (rc)
        tsr__stream_version_abort(u->c, (uint64_t)u->newv);
    if (rc && u->staged_any) {
        tsr_error aerr = TSR_ERROR_INIT;
        if (fan_version(u->c, "Abort", u->newv, 0, NULL, u->c->cfg.search_deadline_ms, NULL, NULL,
                        &aerr))
            tsr_warn("update %s: Abort(%lld) failed on some shard (reconcile will retry): %s",
                     u->op->id, (long long)u->newv, aerr.msg);
    }
    tsr__upd_plan_close(&u->p);
    free(u->out);
}

/* The catch-up of a fold or a move (stream lock held, after Prepare): the rounds logged
 * since its chunk 0 (seq0) carried to newv by its plan, the next version's directory
 * made the served one with every streamed write (a fold: its plan's copy of the served
 * directory gets the overlay, O(overlay); a move: rebuilt, every id routed by the new
 * plan), and the groups' last seqs of newv noted for the flip (gseq: the staged ones on
 * entry, newv's on return; the served version keeps its own until the flip). */
int tsr__txn_catch_up(tsr__txn *u, int64_t seq0, int64_t off0, int64_t *gseq, tsr_error *err)
{
    tsr__coord *c = u->c;
    tsr_metrics_update_phase("catch-up");
    int rc = tsr__reshard_carry(c, (uint64_t)u->newv, u->p.ns, seq0, off0, u->out, gseq,
                                err);
    if (rc)
        return rc;
    if (!u->reshard) { /* a fold: same plan, no record; the overlay mostly put on already */
        tsr__stream_overlay_finish(c, u->base, u->p.ns, u->ov_mark);
    } else {
        tsr__snap *view = tsr__stream_base(c, u->base);
        if (view) /* the writes after seq0 are not in the plan's directory */
            tsr__reshard_redir(u->p.ns, view, u->p.nshards);
        tsr__stream_base_free(view);
    }
    u->next_seqs = gseq;
    return 0;
}

/* ---------------------------------------------------------------- the engine */

/* Streamed writes wait (frozen) from the plan through the Commit fan-out: the plan's base
 * and each group's base_stream_seq stay true, and no Write reaches a shard between the flip
 * and its Commit. A catch-up (u->catchup: a fold with no records, docs/streaming.md
 * "Writes during a fold", or a move) holds them only for its plan (a move) and Stage chunk
 * 0, and from its catch-up through its Commit fan-out: each group's Stage has
 * capture_delta, so its Prepare folds the delta of seq S while writes go on to the served
 * version, and the rounds after S are carried to newv before the flip. A batch keeps the
 * stream frozen all along: the model applies it at its commit point, after every write
 * acknowledged before it. */
int tsr__txn_run(tsr__txn *u, const tsr__txn_planner *pl, int64_t *version, tsr_error *err)
{
    tsr__coord *c = u->c;
    int64_t seq0 = 0, off0 = 0, *gseq = tsr_xcalloc(TSR_COORD_MAX_SHARDS + 1, sizeof *gseq);
    int frozen = 0;
    u->t[TSR__TXN_T_START] = tsr_clock_mono_ms();
    if (pl->plan_frozen) {
        tsr__stream_freeze(c);
        frozen = 1;
    }
    /* the served snapshot changes only by a commit point, and update_mu is ours: a fold
     * plans on it before the freeze (the overlay goes onto its directory after its Prepare
     * and at its catch-up, tsr__stream_overlay_copy / _finish), so writes wait only for
     * its Stage */
    u->base = tsr__coord_snap_get(c);
    u->newv = (int64_t)u->base->version + 1;
    u->out = tsr_xcalloc((size_t)TSR_COORD_MAX_SHARDS * TSR_COORD_MAX_REPLICAS, 1);
    int rc = pl->plan(u, pl->ud, err);
    if (!frozen) {
        tsr__stream_freeze(c);
        frozen = 1;
    }
    if (rc == 0 && u->catchup) {
        seq0 = u->carry_after = tsr__stream_last_seq(c);
        off0 = tsr__stream_log_offset(c);
        for (size_t g = 0; g < u->p.nshards; g++) /* each group's staged seq (chunk 0) */
            gseq[g] = (int)g == u->fresh ? 0 : tsr__stream_group_seq(c, g);
    }
    u->t[TSR__TXN_T_PLANNED] = tsr_clock_mono_ms();
    if (rc == 0)
        rc = tsr__txn_stage(u, pl->split_stage ? TSR__STAGE_HEAD : TSR__STAGE_ALL, err);
    if (rc == 0 && u->catchup) {
        tsr__stream_thaw(c); /* writes flow on the served version meanwhile */
        frozen = 0;
    }
    u->t[TSR__TXN_T_STAGED] = tsr_clock_mono_ms();
    if (rc == 0 && pl->fill)
        rc = pl->fill(u, pl->ud, err);
    if (rc == 0 && pl->split_stage)
        rc = tsr__txn_stage(u, TSR__STAGE_REST, err);
    if (rc == 0)
        rc = tsr__txn_prepare(u, err);
    if (rc == 0 && u->catchup && pl->prepared)
        pl->prepared(u, pl->ud);
    if (!frozen) { /* the catch-up, the flip and the Commit fan-out: writes wait again */
        tsr__stream_freeze(c);
        frozen = 1;
        u->t_refrozen = tsr_clock_mono_ms();
    }
    u->t[TSR__TXN_T_PREPARED] = tsr_clock_mono_ms();
    if (rc == 0 && u->catchup && (rc = tsr__txn_catch_up(u, seq0, off0, gseq, err)) == 0) {
        tsr__coord_crash_point("caught-up"); /* the rounds on N+1, not yet the flip */
        if (pl->caught_up)
            pl->caught_up(u, pl->ud);
    }
    u->t[TSR__TXN_T_CAUGHT] = tsr_clock_mono_ms();
    if (rc == 0)
        rc = tsr__txn_flip(u, err);
    u->t[TSR__TXN_T_FLIPPED] = tsr_clock_mono_ms();
    if (rc == 0) {
        tsr__txn_commit(u);
        *version = u->newv;
        u->t[TSR__TXN_T_COMMITTED] = tsr_clock_mono_ms();
    }
    if (pl->finish)
        pl->finish(u, pl->ud, rc);
    tsr__txn_cleanup(u, rc);
    tsr__stream_thaw(c);
    u->t_thawed = tsr_clock_mono_ms();
    /* the base a success replaced is freed here, not by the last query on it */
    tsr__snap_retire(u->base, rc ? 0 : TSR__SNAP_RETIRE_MS);
    free(gseq);
    return rc;
}

