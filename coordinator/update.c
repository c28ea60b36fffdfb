/*
 * update — UpdateIndex and GetOperation: the two-phase versioned batch update of DESIGN
 * "Batch update", run on one background thread per operation (one at a time).
 *
 *   READING    common/batch/batch loads and validates the batch (max_invalid_records); a
 *              rejected batch ends REJECTED with its report and nothing changes;
 *   (train)    no index yet: the template comes from --template or is trained from the
 *              batch's dense vectors (common/index/ivfpq_build, seeded), and the plan is built
 *              from the batch's list sizes; a complete overwrite keeps the template and
 *              the plan (documented in docs/coordinator.md);
 *   assign     nearest centroid (tsr_ivfpq_assign = Faiss add's assignment) → list →
 *              shard by the plan; sparse-only → hash(id) % S; labels from the directory
 *              or the counter; an id moving to another shard is deleted on the old one;
 *   STAGING    Stage chunks for N+1 to every shard (chunk 0 carries own_lists and, on an
 *              empty base, the template), one fan-out per chunk round;
 *   PREPARING  Prepare(N+1) on every shard, all must be ready;
 *   commit     write the coordinator's v(N+1) (template.faiss, plan, directory, MANIFEST)
 *              and flip CURRENT — the commit point — then publish the new snapshot;
 *   COMMITTING Commit(N+1) to every shard (a shard that misses it is fixed by reconcile).
 * Any failure before the flip aborts N+1 on every shard; N stays served.
 *
 * DESIGN (threads): the handler only creates the operation and starts the thread; the
 * thread holds update_mu for the whole update; op fields are written under op_mu and read
 * by GetOperation under op_mu.
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

/* ---------------------------------------------------------------- report -> pb */

static void report_to_pb(const tsr_batch_report *r, uint8_t **out, size_t *outlen)
{
    Tessera__V1__BatchReport br = TESSERA__V1__BATCH_REPORT__INIT;
    br.valid_records = (int64_t)r->valid;
    br.invalid_records = (int64_t)r->invalid;
    br.deleted_ids = (int64_t)r->deletes;
    br.rejected = r->rejected != 0;
    Tessera__V1__BatchFileReport *fr = tsr_xcalloc(r->nfiles + 1, sizeof *fr);
    Tessera__V1__BatchFileReport **frp = tsr_xcalloc(r->nfiles + 1, sizeof *frp);
    size_t nerr = 0;
    for (size_t i = 0; i < r->nfiles; i++)
        nerr += r->files[i].nerrors + (r->files[i].file_error != NULL);
    nerr += r->nerrors;
    Tessera__V1__BatchRecordError *er = tsr_xcalloc(nerr + 1, sizeof *er);
    Tessera__V1__BatchRecordError **erp = tsr_xcalloc(nerr + 1, sizeof *erp);
    size_t ne = 0;
    for (size_t i = 0; i < r->nfiles; i++) {
        const tsr_batch_file_report *f = &r->files[i];
        tessera__v1__batch_file_report__init(&fr[i]);
        fr[i].file = f->name;
        fr[i].valid_records = (int64_t)f->valid;
        fr[i].invalid_records = (int64_t)f->invalid;
        frp[i] = &fr[i];
        if (f->file_error) {
            tessera__v1__batch_record_error__init(&er[ne]);
            er[ne].file = f->name;
            er[ne].error_type = (char *)"FILE_ERROR";
            er[ne].message = f->file_error;
            erp[ne] = &er[ne];
            ne++;
        }
        for (size_t j = 0; j < f->nerrors; j++) {
            tessera__v1__batch_record_error__init(&er[ne]);
            er[ne].file = f->name;
            er[ne].where = (int64_t)f->errors[j].where;
            er[ne].error_type = (char *)tsr_rec_error_name(f->errors[j].type);
            er[ne].message = f->errors[j].msg;
            erp[ne] = &er[ne];
            ne++;
        }
    }
    for (size_t j = 0; j < r->nerrors; j++) {
        tessera__v1__batch_record_error__init(&er[ne]);
        er[ne].file = (char *)"";
        er[ne].error_type = (char *)"BATCH_ERROR";
        er[ne].message = r->errors[j];
        erp[ne] = &er[ne];
        ne++;
    }
    Tessera__V1__ErrorTypeCount tc[TSR_REC__COUNT], *tcp[TSR_REC__COUNT];
    size_t nt = 0;
    for (int t = 0; t < TSR_REC__COUNT; t++) {
        if (!r->type_counts[t])
            continue;
        tessera__v1__error_type_count__init(&tc[nt]);
        tc[nt].error_type = (char *)tsr_rec_error_name((enum tsr_rec_error)t);
        tc[nt].count = (int64_t)r->type_counts[t];
        tcp[nt] = &tc[nt];
        nt++;
    }
    br.files = frp;
    br.n_files = r->nfiles;
    br.errors = erp;
    br.n_errors = ne;
    br.error_counts = tcp;
    br.n_error_counts = nt;
    *out = tsr_rpc_pack(&br.base, outlen);
    free(fr);
    free(frp);
    free(er);
    free(erp);
}

/* ---------------------------------------------------------------- op helpers */

static void op_set(tsr__coord *c, tsr__op *op, int state)
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

/* Adds a line to op's warnings (GetOperation, `tessera update`). */
static void op_warn(tsr__coord *c, tsr__op *op, const char *w)
{
    pthread_mutex_lock(&c->op_mu);
    op->warnings = tsr_xrealloc(op->warnings, (op->nwarnings + 1) * sizeof *op->warnings);
    op->warnings[op->nwarnings++] = tsr_xstrdup(w);
    pthread_mutex_unlock(&c->op_mu);
}

/* Ends the operation; code is the TSR error code of a failure (for the metrics). */
static void op_finish(tsr__coord *c, tsr__op *op, int state, const char *error, int64_t version,
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
static size_t fan(tsr__coord *c, const char *method, uint8_t **bufs, size_t *lens,
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
    uint8_t *one = NULL;
    size_t len = 0;
    char method[64];
    snprintf(method, sizeof method, TSR_SHARD_SVC "%s", what);
    if (strcmp(what, "Prepare") == 0) {
        Tessera__V1__PrepareRequest m = TESSERA__V1__PREPARE_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        m.build_cpu_percent = cpu_pct;
        one = tsr_rpc_pack(&m.base, &len);
    } else if (strcmp(what, "Commit") == 0) {
        Tessera__V1__CommitRequest m = TESSERA__V1__COMMIT_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        one = tsr_rpc_pack(&m.base, &len);
    } else {
        Tessera__V1__AbortRequest m = TESSERA__V1__ABORT_REQUEST__INIT;
        m.version = version;
        m.leader_term = tsr__coord_term(c);
        one = tsr_rpc_pack(&m.base, &len);
    }
    for (size_t s = 0; s < S; s++) {
        bufs[s] = one;
        lens[s] = len;
    }
    size_t bad = fan(c, method, bufs, lens, skip, timeout_ms, rdesc, resps, err);
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

/* ---------------------------------------------------------------- the update */

/* One update between its phases. */
typedef struct upd {
    tsr__coord *c;
    tsr__op *op;
    tsr_batch *b;               /* borrowed */
    tsr__snap *base;            /* ref: the version the update starts from */
    tsr__upd_plan p;            /* the next snapshot and each group's work */
    int64_t newv;
    char *out;                  /* per replica: left out of newv (update_min_replicas) */
    int staged_any;             /* shards may hold part of newv: a failure aborts it */
    int fresh;                  /* a reshard's new group (staged on an empty base), or -1 */
    int catchup;                /* a reshard move: chunk 0 alone under the stream lock with
                                   capture_delta, the records from chunk 1 without it
                                   (docs/resharding.md "Writes during a move"); a fold:
                                   its one chunk with capture_delta */
    int reshard;                /* a reshard move (its catch-up rebuilds the directory) */
    size_t ov_mark;             /* a fold: its directory holds the overlay up to this mark
                                   (tsr__stream_overlay_copy) */
    const int64_t *next_seqs;   /* after a catch-up: newv's group seqs (p.nshards), which
                                   its log header and its publication install */
    int64_t carry_after;        /* a fold: the seq S its slices hold the writes up to */
    int64_t term;               /* the leader term it began in: it commits only under it */
} upd;

/* What upd_stage sends: every chunk (an update), or a move's chunk 0 alone (no record:
 * the lists, the template of a fresh group, base_stream_seq, capture_delta) then its
 * records from chunk 1. */
enum { STAGE_ALL, STAGE_HEAD, STAGE_REST };

/* A warning naming the batch's delete ids that the base version does not hold. */
static void warn_unknown_deletes(upd *u)
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
static int upd_plan(upd *u, int overlay, tsr_error *err)
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
 * past chunk 0). STAGE_HEAD: chunk 0 without records; STAGE_REST: round r is chunk r + 1. */
static uint8_t *stage_request(const upd *u, size_t s, size_t r, int part, const int32_t *own,
                              size_t nown, size_t *len)
{
    const tsr__shard_work *w = &u->p.w[s];
    const tsr__snap *ns = u->p.ns;
    size_t chunk = (size_t)u->c->cfg.stage_chunk;
    size_t u0 = r * chunk, d0 = r * chunk, cn = part == STAGE_REST ? r + 1 : r;
    if (part == STAGE_HEAD)
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
static size_t stage_rounds(const upd *u)
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
static int upd_stage(upd *u, int part, tsr_error *err)
{
    tsr__coord *c = u->c;
    size_t S = u->p.nshards, nlist = u->p.ns->tmpl->nlist;
    if (part != STAGE_REST) {
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
    if (part != STAGE_REST) {
        u->staged_any = 1;
        op_mark_staged(c, u->op);
    }
    int rc = 0;
    size_t rounds = part == STAGE_HEAD ? 1 : stage_rounds(u);
    for (size_t r = 0; r < rounds && rc == 0; r++) {
        for (size_t s = 0; s < S; s++)
            bufs[s] = stage_request(u, s, r, part, own[s], nown[s], &lens[s]);
        size_t bad = fan(c, TSR_SHARD_SVC "Stage", bufs, lens, u->out, c->cfg.stage_deadline_ms,
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
    if (rc || part == STAGE_HEAD)
        return rc;
    op_set_shards(c, u->op, &u->op->shards_staged, (int)S,
                  TESSERA__V1__OPERATION__STATE__PREPARING);
    op_save(c, u->op, 0);
    tsr__coord_crash_point("staged");
    return 0;
}

/* PREPARING: every replica not left out must be ready (or be left out, within
 * update_min_replicas); then the ones left out are aborted. */
static int upd_prepare(upd *u, tsr_error *err)
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
static void drop_uncommitted(tsr__coord *c, upd *u, const char *why)
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
static int upd_flip(upd *u, tsr_error *err)
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
            if (atomic_load(&c->lead.readopt))
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
    op_set(c, u->op, TESSERA__V1__OPERATION__STATE__COMMITTING);
    op_save(c, u->op, 0);
    return 0;
}

/* COMMITTING: Commit(newv) to every replica not left out (one that misses it is fixed by
 * reconcile), then the delayed Release and the removal of old stored versions (the
 * previous one stays as a fallback). Nothing here fails the update. */
static void upd_commit(upd *u)
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
static void upd_cleanup(upd *u, int rc)
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
static int upd_catch_up(upd *u, int64_t seq0, int64_t off0, int64_t *gseq, tsr_error *err)
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

/* Runs the update, phase by phase; returns the final state and fills err / *version.
 *
 * Streamed writes wait (queued) from the plan through the Commit fan-out: the plan's base
 * and each group's base_stream_seq stay true, and no Write reaches a shard between the flip
 * and its Commit. A fold with catchup set (no records; docs/streaming.md "Writes during a
 * fold") holds them only for its Stage, and from its catch-up through its Commit fan-out: each group's Stage has capture_delta, so its Prepare folds the delta of seq S
 * while writes go on to the served version, and the rounds after S are carried to newv
 * before the flip, as a reshard move's are. A batch keeps the lock all along: the model
 * applies it at its commit point, after every write acknowledged before it. */
static int run_update(tsr__coord *c, tsr__op *op, tsr_batch *b, int catchup,
                      int64_t *version, tsr_error *err)
{
    upd u = {.c = c, .op = op, .b = b, .fresh = -1, .catchup = catchup && b->nrecords == 0 &&
                                                               b->ndeletes == 0,
             .term = tsr__coord_term(c)};
    int64_t seq0 = 0, off0 = 0, *gseq = NULL;
    int locked = 0;
    int64_t t[7] = {tsr_clock_mono_ms(), 0, 0, 0, 0, 0, 0}; /* the phases' ends, for the log */
    if (!u.catchup) {
        tsr__stream_lock(c);
        locked = 1;
    }
    /* the served snapshot changes only by a commit point, and update_mu is ours: a fold
     * plans on it before the lock (the overlay goes onto its directory after its Prepare
     * and at its catch-up, tsr__stream_overlay_copy / _finish), so writes wait only for
     * its Stage */
    u.base = tsr__coord_snap_get(c);
    u.newv = (int64_t)u.base->version + 1;
    u.out = tsr_xcalloc(c->nrep ? c->nrep : 1, 1);
    int rc = upd_plan(&u, !u.catchup, err);
    if (!locked) {
        tsr__stream_lock(c);
        locked = 1;
    }
    if (rc == 0 && u.catchup) {
        seq0 = u.carry_after = tsr__stream_last_seq(c);
        off0 = tsr__stream_log_offset(c);
        gseq = tsr_xcalloc(u.p.nshards + 1, sizeof *gseq);
        for (size_t g = 0; g < u.p.nshards; g++) /* each group's staged seq (chunk 0) */
            gseq[g] = tsr__stream_group_seq(c, g);
    }
    t[1] = tsr_clock_mono_ms();
    if (rc == 0)
        rc = upd_stage(&u, STAGE_ALL, err);
    if (rc == 0 && u.catchup) {
        tsr__stream_unlock(c); /* writes flow on the served version meanwhile */
        locked = 0;
    }
    t[2] = tsr_clock_mono_ms();
    if (rc == 0)
        rc = upd_prepare(&u, err);
    if (rc == 0 && u.catchup) /* the directory: the overlay so far, with writes flowing */
        u.ov_mark = tsr__stream_overlay_copy(c, u.base, u.p.ns);
    if (!locked) { /* the catch-up, the flip and the Commit fan-out: writes wait again */
        tsr__stream_lock(c);
        locked = 1;
    }
    t[3] = tsr_clock_mono_ms();
    if (rc == 0 && u.catchup && (rc = upd_catch_up(&u, seq0, off0, gseq, err)) == 0) {
        tsr__coord_crash_point("caught-up"); /* the rounds on N+1, not yet the flip */
        tsr_test_sleep(TSR_KNOB_COORD_SLOW_FLIP_MS, "the fold's flip after its catch-up");
    }
    t[4] = tsr_clock_mono_ms();
    if (rc == 0)
        rc = upd_flip(&u, err);
    t[5] = tsr_clock_mono_ms();
    if (rc == 0) {
        upd_commit(&u);
        *version = u.newv;
        t[6] = tsr_clock_mono_ms();
        if (u.catchup)
            tsr_info("update %s: version %lld: plan %lld ms, stage %lld, prepare %lld, "
                     "catch-up %lld, commit point %lld, commit fan-out %lld (streamed writes "
                     "flowed during the plan and the prepare)", op->id,
                     (long long)u.newv, (long long)(t[1] - t[0]), (long long)(t[2] - t[1]),
                     (long long)(t[3] - t[2]), (long long)(t[4] - t[3]),
                     (long long)(t[5] - t[4]), (long long)(t[6] - t[5]));
        else
            tsr_info("update %s: version %lld: plan %lld ms, stage %lld, prepare %lld, commit "
                     "point %lld, commit fan-out %lld (streamed writes waited all along)",
                     op->id, (long long)u.newv, (long long)(t[1] - t[0]),
                     (long long)(t[2] - t[1]), (long long)(t[3] - t[2]),
                     (long long)(t[5] - t[3]), (long long)(t[6] - t[5]));
    }
    upd_cleanup(&u, rc);
    tsr__stream_unlock(c);
    /* the base a success replaced is freed here, not by the last query on it */
    tsr__snap_retire(u.base, rc ? 0 : TSR__SNAP_RETIRE_MS);
    free(gseq);
    return rc ? TESSERA__V1__OPERATION__STATE__FAILED : TESSERA__V1__OPERATION__STATE__SUCCEEDED;
}

typedef struct upd_arg {
    tsr__coord *c;
    tsr__op *op;
    char *root;          /* owned: the resolved batch_root to load; NULL = a fold (no
                            records: every group builds the next version from its delta) */
    const char *confine; /* the allowed folder it is in (borrowed from c) */
} upd_arg;

static void *update_main(void *p)
{
    /* reading the batch, the plan and the waits run below the query threads: an update
     * (a fold too) takes the CPU the queries leave (core/parallel.h) */
    tsr_thread_background();
    upd_arg *a = p;
    tsr__coord *c = a->c;
    tsr__op *op = a->op;
    char *root = a->root;
    tsr_batch_options bo = {(size_t)c->cfg.dimensions, (uint64_t)op->max_invalid, 0,
                            a->confine};
    free(a);
    tsr_error err = TSR_ERROR_INIT;
    op_set(c, op, TESSERA__V1__OPERATION__STATE__READING);
    tsr_metrics_update_phase("validate");
    tsr_batch *b = NULL;
    int rc = 0;
    if (root)
        rc = tsr_batch_load(root, &bo, &b, &err);
    else /* a fold: an empty batch, the streamed writes come from the stream's base */
        b = tsr_xcalloc(1, sizeof *b);
    int fold = root == NULL;
    free(root);
    if (b && !fold) {
        char *js = tsr_batch_report_json(&b->report);
        pthread_mutex_lock(&c->op_mu);
        op->report_json = js;
        report_to_pb(&b->report, &op->report_pb, &op->report_len);
        op->files_total = op->files_read = (int64_t)b->report.nfiles;
        op->records_read = (int64_t)b->report.records; /* valid + invalid */
        pthread_mutex_unlock(&c->op_mu);
        /* records counts the delete files' lines already (adding deletes counted them twice) */
        tsr_metrics_update_records(b->report.records);
    }
    if (rc == TSR_EREJECTED) {
        op_finish(c, op, TESSERA__V1__OPERATION__STATE__REJECTED,
                  b && b->report.reason[0] ? b->report.reason : "batch rejected", 0, rc);
    } else if (rc) {
        op_finish(c, op, TESSERA__V1__OPERATION__STATE__FAILED, err.msg, 0, rc);
    } else {
        int64_t version = 0;
        pthread_mutex_lock(&c->update_mu);
        int st = run_update(c, op, b, fold, &version, &err);
        pthread_mutex_unlock(&c->update_mu);
        op_finish(c, op, st, st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? NULL : err.msg,
                  version, err.code);
    }
    tsr_batch_destroy(b);
    return NULL;
}

/* ---------------------------------------------------------------- resharding */

/* Waits ms (a removed group keeps answering the queries planned before the flip). */
static void drain_wait(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
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
    upd u = {.c = c, .op = op, .fresh = -1, .catchup = 1, .reshard = 1,
             .term = tsr__coord_term(c)};
    tsr_batch *b = tsr_xcalloc(1, sizeof *b);
    tsr__reshard_moves *mv = NULL;
    int64_t seq0 = 0, off0 = 0, *gseq = tsr_xcalloc(TSR_COORD_MAX_SHARDS + 1, sizeof *gseq);
    tsr__stream_lock(c); /* the plan and every chunk 0 at one seq S */
    int locked = 1;
    int64_t t0 = tsr_clock_mono_ms(), t1 = 0, t2 = 0, t3 = 0, t4 = 0;
    u.base = tsr__coord_snap_get(c);
    u.newv = (int64_t)u.base->version + 1;
    int rc = 0;
    if (u.base->version == 0 || !u.base->plan)
        rc = tsr_err(err, TSR_ESTATE, "no index yet: create it with UpdateIndex first");
    if (!rc && n) {
        if ((rc = tsr__coord_config_add_group(&c->cfg, (const char *const *)addrs, n, err)) == 0) {
            u.fresh = (int)c->cfg.nshards - 1;
            if ((rc = tsr__coord_group_append(c, err))) {
                tsr__coord_group_retire(c, (size_t)u.fresh); /* its slot stays, unused */
                u.fresh = -1;
            } else {
                rc = tsr__reshard_fresh_check(c, (size_t)u.fresh, err);
            }
        }
    }
    c->cfg.resharded = 1;
    u.out = tsr_xcalloc((size_t)TSR_COORD_MAX_SHARDS * TSR_COORD_MAX_REPLICAS, 1);
    pthread_mutex_lock(&c->op_mu);
    op->shards_total = (int)c->cfg.nshards;
    pthread_mutex_unlock(&c->op_mu);
    tsr__snap *view = rc ? NULL : tsr__stream_base(c, u.base);
    if (!rc)
        rc = tsr__reshard_plan(c, op, view ? view : u.base, rm, &u.p, &mv, err);
    tsr__stream_base_free(view);
    u.b = b;
    if (rc == 0) {
        seq0 = u.carry_after = tsr__stream_last_seq(c);
        off0 = tsr__stream_log_offset(c);
        for (size_t g = 0; g < u.p.nshards; g++) /* each group's staged seq (chunk 0) */
            gseq[g] = (int)g == u.fresh ? 0 : tsr__stream_group_seq(c, g);
        rc = upd_stage(&u, STAGE_HEAD, err);
    }
    if (rc == 0) {
        tsr__stream_unlock(c); /* writes flow on the served version meanwhile */
        locked = 0;
        t1 = tsr_clock_mono_ms();
        rc = tsr__reshard_read(c, op, u.base->version, mv, &u.p, b, 1, err);
    }
    if (rc == 0)
        rc = upd_stage(&u, STAGE_REST, err);
    if (rc == 0)
        rc = upd_prepare(&u, err);
    if (!locked) { /* the catch-up, the flip and the Commit fan-out: writes wait again */
        tsr__stream_lock(c);
        t2 = tsr_clock_mono_ms();
    }
    if (rc == 0 && (rc = upd_catch_up(&u, seq0, off0, gseq, err)) == 0)
        tsr__coord_crash_point("caught-up"); /* the rounds on N+1, not yet the flip */
    t3 = tsr_clock_mono_ms();
    if (rc == 0)
        rc = upd_flip(&u, err);
    t4 = tsr_clock_mono_ms();
    if (rc == 0) {
        upd_commit(&u);
        *version = u.newv;
        pthread_mutex_lock(&c->op_mu);
        op->lists_moved = op->lists_total;
        pthread_mutex_unlock(&c->op_mu);
    }
    if (rc && u.fresh >= 0) /* the added group serves nothing: out of every later call */
        tsr__coord_group_retire(c, (size_t)u.fresh);
    upd_cleanup(&u, rc);
    tsr__stream_unlock(c);
    if (t2) /* docs/resharding.md "Writes during a move": what streamed writes waited for */
        tsr_info("reshard %s: streamed writes held %lld ms for the plan and chunk 0, then "
                 "flowing %lld ms (read, staging, Prepare), held %lld ms from the catch-up "
                 "through the Commit fan-out (catch-up and directory %lld ms, flip %lld ms, "
                 "Commit fan-out %lld ms)", op->id, (long long)(t1 - t0), (long long)(t2 - t1),
                 (long long)(tsr_clock_mono_ms() - t2), (long long)(t3 - t2),
                 (long long)(t4 - t3), (long long)(tsr_clock_mono_ms() - t4));
    /* the base a success replaced is freed here, not by the last query on it */
    tsr__snap_retire(u.base, rc ? 0 : TSR__SNAP_RETIRE_MS);
    tsr__reshard_moves_free(mv);
    free(gseq);
    if (rc == 0 && rm >= 0) {
        /* queries planned on the old version may still call it: drain, then retire */
        drain_wait(c->cfg.search_deadline_ms);
        tsr__coord_group_retire(c, (size_t)rm);
        tsr_info("reshard %s: shard group %d removed (its processes may be stopped)", op->id,
                 rm);
    }
    tsr_batch_destroy(b);
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
    op_set(c, op, TESSERA__V1__OPERATION__STATE__READING);
    int64_t version = 0;
    pthread_mutex_lock(&c->update_mu);
    int st = run_reshard(c, op, a->addrs, a->n, a->rm, &version, &err);
    pthread_mutex_unlock(&c->update_mu);
    op_finish(c, op, st, st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? NULL : err.msg,
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
static int reshard_start(tsr__coord *c, char *const *addrs, size_t n, int64_t rm,
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
    if (c->upd_thread_live) {
        pthread_join(c->upd_thread, NULL);
        c->upd_thread_live = 0;
    }
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-%llu-%lld", (unsigned long long)++c->op_seq,
             (long long)(tsr_clock_wall_ms() % 1000000));
    op->state = TESSERA__V1__OPERATION__STATE__PENDING;
    op->batch_root = tsr_xstrdup(what);
    op->start_ms = tsr_clock_wall_ms();
    op->shards_total = (int)c->cfg.nshards;
    if (c->nops == TSR__OP_MAX_KEPT) {
        tsr__oplog_forget(c, c->ops[0]);
        tsr__op_free(c->ops[0]);
        memmove(c->ops, c->ops + 1, (c->nops - 1) * sizeof *c->ops);
        c->nops--;
    }
    c->ops = tsr_xrealloc(c->ops, (c->nops + 1) * sizeof *c->ops);
    c->ops[c->nops++] = op;
    c->busy = 1;
    tsr_error serr = TSR_ERROR_INIT;
    if (tsr__oplog_save(c, op, 0, 1, &serr))
        tsr_warn("reshard %s: cannot write its operation record: %s", op->id, serr.msg);
    rs_arg *a = tsr_xcalloc(1, sizeof *a);
    a->c = c;
    a->op = op;
    a->n = n;
    a->rm = n ? -1 : (int)rm;
    a->addrs = tsr_xcalloc(n + 1, sizeof *a->addrs);
    for (size_t i = 0; i < n; i++)
        a->addrs[i] = tsr_xstrdup(addrs[i]);
    if (pthread_create(&c->upd_thread, NULL, reshard_main, a) != 0) {
        for (size_t i = 0; i < n; i++)
            free(a->addrs[i]);
        free(a->addrs);
        free(a);
        c->busy = 0;
        op->state = TESSERA__V1__OPERATION__STATE__FAILED;
        op->error = tsr_xstrdup("cannot start the update thread");
    } else {
        c->upd_thread_live = 1;
    }
    snprintf(id, cap, "%s", op->id);
    tsr_info("reshard %s: %s", op->id, what);
    pthread_mutex_unlock(&c->op_mu);
    return 0;
}

static int reshard_reply(tsr_rpc_reply *r, const char *id, uint32_t group)
{
    Tessera__V1__ReshardResponse resp = TESSERA__V1__RESHARD_RESPONSE__INIT;
    resp.operation_id = (char *)id;
    resp.group = group;
    return tsr_rpc_reply_pack(r, &resp.base);
}

int tsr__coord_rpc_add_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__AddShardGroupRequest *rq =
        tessera__v1__add_shard_group_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "AddShardGroupRequest: "
                                   "malformed protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    uint32_t group = 0;
    int rc;
    if (rq->n_replicas == 0)
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "replicas: empty (expected the "
                                 "new group's \"host:port\" addresses)");
    else
        rc = reshard_start(c, rq->replicas, rq->n_replicas, -1, &group, id, sizeof id, r);
    if (!rc)
        rc = reshard_reply(r, id, group);
    tessera__v1__add_shard_group_request__free_unpacked(rq, NULL);
    return rc;
}

int tsr__coord_rpc_remove_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__RemoveShardGroupRequest *rq =
        tessera__v1__remove_shard_group_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "RemoveShardGroupRequest: "
                                   "malformed protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    uint32_t group = 0;
    int rc = reshard_start(c, NULL, 0, (int64_t)rq->group, &group, id, sizeof id, r);
    if (!rc)
        rc = reshard_reply(r, id, group);
    tessera__v1__remove_shard_group_request__free_unpacked(rq, NULL);
    return rc;
}

/* ---------------------------------------------------------------- handlers */

/* The batch_root of a request must resolve inside a --batch-root-allow folder
 * (docs/security.md). Returns 0 with *root (new: the resolved path to load) and *within,
 * or a negative code with PERMISSION_DENIED set on r. */
static int confine_root(tsr__coord *c, const char *batch_root, char **root, const char **within,
                        tsr_rpc_reply *r)
{
    if (c->nbatch_allow == 0)
        return tsr_rpc_reply_error(r, TSR_RPC_PERMISSION_DENIED, "this coordinator accepts no "
                                   "batch_root: start it with --batch-root-allow DIR (the "
                                   "folder that holds the batches)");
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_batch_confine(batch_root, c->batch_allow, c->nbatch_allow, root, within, &err);
    if (rc == TSR_EREJECTED)
        return tsr_rpc_reply_error(r, TSR_RPC_PERMISSION_DENIED, "%s; more with "
                                   "--batch-root-allow DIR", err.msg);
    if (rc)
        return tsr_rpc_reply_from_error(r, &err);
    return 0;
}

/* Creates the operation and starts its thread (op_mu held, not busy). root: owned, NULL for
 * a fold. */
static void op_start(tsr__coord *c, const char *batch_root, char *root, const char *within,
                     int overwrite, int32_t max_invalid, char *id, size_t cap);

int tsr__coord_update_start(tsr__coord *c, const char *batch_root, int overwrite,
                            int32_t max_invalid, char *id, size_t cap, tsr_rpc_reply *r)
{
    int rc = tsr__leader_check(c, r);
    if (rc)
        return rc;
    if (!batch_root || !batch_root[0])
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "batch_root is empty");
    if (max_invalid < 0)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "max_invalid_records = %d is "
                                   "negative", max_invalid);
    char *root = NULL;
    const char *within = NULL;
    rc = confine_root(c, batch_root, &root, &within, r);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->op_mu);
    if (c->busy || c->closing) {
        pthread_mutex_unlock(&c->op_mu);
        free(root);
        return tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, c->closing ? "shutting down"
                                   : "update in progress");
    }
    op_start(c, batch_root, root, within, overwrite, max_invalid, id, cap);
    pthread_mutex_unlock(&c->op_mu);
    return 0;
}

static void op_start(tsr__coord *c, const char *batch_root, char *root, const char *within,
                     int overwrite, int32_t max_invalid, char *id, size_t cap)
{
    if (c->upd_thread_live) {
        pthread_join(c->upd_thread, NULL); /* finished: busy is 0 */
        c->upd_thread_live = 0;
    }
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-%llu-%lld", (unsigned long long)++c->op_seq,
             (long long)(tsr_clock_wall_ms() % 1000000));
    op->state = TESSERA__V1__OPERATION__STATE__PENDING;
    op->batch_root = tsr_xstrdup(batch_root);
    op->overwrite = overwrite;
    op->max_invalid = max_invalid;
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
    tsr_error serr = TSR_ERROR_INIT;
    if (tsr__oplog_save(c, op, 0, 1, &serr)) /* accepted = on disk (op_mu held: one fsync) */
        tsr_warn("update %s: cannot write its operation record: %s", op->id, serr.msg);
    upd_arg *a = tsr_xmalloc(sizeof *a);
    a->c = c;
    a->op = op;
    a->root = root;
    a->confine = within;
    if (pthread_create(&c->upd_thread, NULL, update_main, a) != 0) {
        free(a->root);
        free(a);
        c->busy = 0;
        op->state = TESSERA__V1__OPERATION__STATE__FAILED;
        op->error = tsr_xstrdup("cannot start the update thread");
    } else {
        c->upd_thread_live = 1;
    }
    snprintf(id, cap, "%s", op->id);
    if (root)
        tsr_info("update %s: batch_root %s%s, max_invalid_records %d", op->id, op->batch_root,
                 op->overwrite ? " (complete overwrite)" : "", max_invalid);
}

/* ---------------------------------------------------------------- background fold */

#define FOLD_RETRY_MS 10000       /* after a fold that did not empty the overlay (it failed) */
#define FOLD_RETRY_MAX_MS 600000  /* doubled each time, up to this */

/* Starts a fold (an update with no records) when the stream's overlay passed
 * stream_fold_records and no update runs. A fold that failed (a replica down: the update
 * needs them all) is retried after FOLD_RETRY_MS, doubled while it keeps failing, so a
 * long outage does not fill the operations table with failed folds. */
static void fold_maybe(tsr__coord *c, int64_t *next_at, int64_t *backoff, uint64_t *last_v)
{
    tsr__snap *sn = tsr__coord_snap_get(c);
    uint64_t v = sn->version;
    tsr__snap_unref(sn);
    if (!tsr__coord_leading(c) || !tsr__stream_fold_due(c) || tsr_clock_mono_ms() < *next_at)
        return;
    pthread_mutex_lock(&c->op_mu);
    if (!c->busy && !c->closing) {
        if (*last_v == v) { /* the last fold did not produce a version */
            *backoff = *backoff ? *backoff * 2 : FOLD_RETRY_MS;
            if (*backoff > FOLD_RETRY_MAX_MS)
                *backoff = FOLD_RETRY_MAX_MS;
            *next_at = tsr_clock_mono_ms() + *backoff;
            *last_v = 0;
            pthread_mutex_unlock(&c->op_mu);
            tsr_warn("stream fold: the last fold did not commit; the next one in %lld s",
                     (long long)(*backoff / 1000));
            return;
        }
        if (*last_v && *last_v != v)
            *backoff = 0; /* the last fold committed */
        *last_v = v;
        char id[sizeof ((tsr__op *)0)->id];
        op_start(c, "(stream fold)", NULL, NULL, 0, 0, id, sizeof id);
        tsr_info("update %s: stream fold: the overlay holds %d or more streamed writes",
                 id, c->cfg.stream_fold_records);
        tsr_metrics_counter_add("tessera_stream_folds_total", NULL, 1);
    }
    pthread_mutex_unlock(&c->op_mu);
}

static void *fold_main(void *p)
{
    tsr__coord *c = p;
    int64_t next_at = 0, backoff = 0;
    uint64_t last_v = 0; /* the version the running / last fold started from; 0 = none */
    for (;;) {
        pthread_mutex_lock(&c->op_mu);
        int closing = c->closing;
        pthread_mutex_unlock(&c->op_mu);
        if (closing)
            break;
        pthread_mutex_lock(&c->op_mu);
        int busy = c->busy;
        pthread_mutex_unlock(&c->op_mu);
        if (!busy)
            fold_maybe(c, &next_at, &backoff, &last_v);
        usleep(200 * 1000);
    }
    return NULL;
}

int tsr__coord_fold_start(tsr__coord *c)
{
    if (pthread_create(&c->fold_thread, NULL, fold_main, c) != 0)
        return TSR_EINTERNAL;
    c->fold_live = 1;
    return 0;
}

void tsr__coord_fold_stop(tsr__coord *c)
{
    if (c->fold_live) /* it ends within 200 ms of `closing` */
        pthread_join(c->fold_thread, NULL);
    c->fold_live = 0;
}

/* UpdateIndex with fold_stream: the background fold's update, on demand (the same op,
 * counted in tessera_stream_folds_total). Returns 0 or a negative code with the status
 * set on r. */
static int fold_request(tsr__coord *c, const Tessera__V1__UpdateIndexRequest *rq, char *id,
                        size_t cap, tsr_rpc_reply *r)
{
    int rc = tsr__leader_check(c, r);
    if (rc)
        return rc;
    if ((rq->batch_root && rq->batch_root[0]) || rq->is_complete_overwrite ||
        rq->max_invalid_records)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "fold_stream takes no batch: "
                                   "batch_root, is_complete_overwrite and max_invalid_records "
                                   "must be unset");
    tsr__snap *sn = tsr__coord_snap_get(c);
    uint64_t v = sn->version;
    tsr__snap_unref(sn);
    int64_t n = tsr__stream_overlay_records(c);
    if (v == 0 || n == 0)
        return tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, "nothing to fold: %s",
                                   v == 0 ? "no index yet"
                                          : "no streamed write since the served version");
    pthread_mutex_lock(&c->op_mu);
    if (c->busy || c->closing) {
        pthread_mutex_unlock(&c->op_mu);
        return tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, c->closing ? "shutting down"
                                   : "update in progress");
    }
    op_start(c, "(stream fold)", NULL, NULL, 0, 0, id, cap);
    pthread_mutex_unlock(&c->op_mu);
    tsr_info("update %s: stream fold on request: the overlay holds %lld streamed writes", id,
             (long long)n);
    tsr_metrics_counter_add("tessera_stream_folds_total", NULL, 1);
    return 0;
}

int tsr__coord_rpc_update(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__UpdateIndexRequest *rq = tessera__v1__update_index_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpdateIndexRequest: malformed "
                                   "protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    int rc = rq->fold_stream ? fold_request(c, rq, id, sizeof id, r)
                             : tsr__coord_update_start(c, rq->batch_root,
                                                       rq->is_complete_overwrite,
                                                       rq->max_invalid_records, id, sizeof id, r);
    if (!rc) {
        Tessera__V1__UpdateIndexResponse resp = TESSERA__V1__UPDATE_INDEX_RESPONSE__INIT;
        resp.operation_id = id;
        rc = tsr_rpc_reply_pack(r, &resp.base);
    }
    tessera__v1__update_index_request__free_unpacked(rq, NULL);
    return rc;
}

tsr__op *tsr__coord_op_find(tsr__coord *c, const char *id)
{
    for (size_t i = 0; id && i < c->nops; i++)
        if (strcmp(c->ops[i]->id, id) == 0)
            return c->ops[i];
    return NULL;
}

int tsr__coord_rpc_get_operation(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__GetOperationRequest *rq =
        tessera__v1__get_operation_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "GetOperationRequest: malformed "
                                   "protobuf");
    int rc;
    tsr__op *fetched = NULL;
    pthread_mutex_lock(&c->op_mu);
    tsr__op *op = tsr__coord_op_find(c, rq->operation_id);
    if (!op) { /* with --etcd: an operation another coordinator ran */
        pthread_mutex_unlock(&c->op_mu);
        op = fetched = tsr__oplog_fetch(c, rq->operation_id);
        pthread_mutex_lock(&c->op_mu);
    }
    if (!op) {
        pthread_mutex_unlock(&c->op_mu);
        rc = tsr_rpc_reply_error(r, TSR_RPC_NOT_FOUND, "operation \"%s\" not found (the last %d "
                                 "operations are kept, across restarts)",
                                 rq->operation_id ? rq->operation_id : "", TSR__OP_MAX_KEPT);
        tessera__v1__get_operation_request__free_unpacked(rq, NULL);
        return rc;
    }
    Tessera__V1__Operation o;
    Tessera__V1__OperationProgress pg;
    tsr__op_to_pb(op, op->state, &o, &pg);
    o.version = op->version; /* the API: produced (SUCCEEDED), else 0 — never the target */
    rc = tsr_rpc_reply_pack(r, &o.base);
    pthread_mutex_unlock(&c->op_mu);
    if (o.report)
        tessera__v1__batch_report__free_unpacked(o.report, NULL);
    tsr__op_free(fetched);
    tessera__v1__get_operation_request__free_unpacked(rq, NULL);
    return rc;
}
