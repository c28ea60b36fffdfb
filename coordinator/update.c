/*
 * update — UpdateIndex and GetOperation: the two-phase versioned batch update of DESIGN
 * "Batch update", run on one background thread per operation (one at a time).
 *
 *   READING    common/batch loads and validates the batch (max_invalid_records); a
 *              rejected batch ends REJECTED with its report and nothing changes;
 *   (train)    no index yet: the template comes from --template or is trained from the
 *              batch's dense vectors (common/ivfpq_build, seeded), and the plan is built
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batch/batch.h"
#include "coord.h"
#include "index/faiss_io.h"
#include "index/ivfpq_build.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"

void tsr__coord_crash_point(const char *step)
{
    const char *at = getenv("TSR_COORD_CRASH_AT");
    if (at && strcmp(at, step) == 0) {
        tsr_warn("TSR_COORD_CRASH_AT=%s: exiting with 137 (test hook)", step);
        _exit(137);
    }
}

/* ---------------------------------------------------------------- datapoint -> pb */

typedef struct pbdp {
    Tessera__V1__IndexDatapoint dp;
    Tessera__V1__Restriction *rs, **rsp;
    Tessera__V1__NumericRestriction *ns, **nsp;
    Tessera__V1__CrowdingTag tag;
    Tessera__V1__SparseEmbedding sp;
} pbdp;

/* Fills p to describe d (borrowing d's arrays). */
static void dp_to_pb(const tsr_datapoint *d, pbdp *p)
{
    memset(p, 0, sizeof *p);
    tessera__v1__index_datapoint__init(&p->dp);
    p->dp.datapoint_id = d->id;
    if (d->dense) {
        p->dp.feature_vector = d->dense;
        p->dp.n_feature_vector = d->ndense;
    }
    if (d->nrestricts) {
        p->rs = tsr_xcalloc(d->nrestricts, sizeof *p->rs);
        p->rsp = tsr_xcalloc(d->nrestricts, sizeof *p->rsp);
        for (size_t i = 0; i < d->nrestricts; i++) {
            tessera__v1__restriction__init(&p->rs[i]);
            p->rs[i].namespace_ = d->restricts[i].ns;
            p->rs[i].allow_list = d->restricts[i].allow;
            p->rs[i].n_allow_list = d->restricts[i].nallow;
            p->rs[i].deny_list = d->restricts[i].deny;
            p->rs[i].n_deny_list = d->restricts[i].ndeny;
            p->rsp[i] = &p->rs[i];
        }
        p->dp.restricts = p->rsp;
        p->dp.n_restricts = d->nrestricts;
    }
    if (d->nnumeric) {
        p->ns = tsr_xcalloc(d->nnumeric, sizeof *p->ns);
        p->nsp = tsr_xcalloc(d->nnumeric, sizeof *p->nsp);
        for (size_t i = 0; i < d->nnumeric; i++) {
            Tessera__V1__NumericRestriction *n = &p->ns[i];
            tessera__v1__numeric_restriction__init(n);
            n->namespace_ = d->numeric[i].ns;
            if (d->numeric[i].type == TSR_NUM_INT) {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT;
                n->value_int = d->numeric[i].v.i;
            } else if (d->numeric[i].type == TSR_NUM_FLOAT) {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT;
                n->value_float = d->numeric[i].v.f;
            } else {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE;
                n->value_double = d->numeric[i].v.d;
            }
            p->nsp[i] = n;
        }
        p->dp.numeric_restricts = p->nsp;
        p->dp.n_numeric_restricts = d->nnumeric;
    }
    if (d->crowding_tag) {
        tessera__v1__crowding_tag__init(&p->tag);
        p->tag.crowding_attribute = d->crowding_tag;
        p->dp.crowding_tag = &p->tag;
    }
    if (d->nsparse) {
        tessera__v1__sparse_embedding__init(&p->sp);
        p->sp.values = d->sparse_vals;
        p->sp.n_values = d->nsparse;
        p->sp.dimensions = d->sparse_dims;
        p->sp.n_dimensions = d->nsparse;
        p->dp.sparse_embedding = &p->sp;
    }
}

static void pbdp_free(pbdp *p)
{
    free(p->rs);
    free(p->rsp);
    free(p->ns);
    free(p->nsp);
}

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

static size_t fan_version(tsr__coord *c, const char *what, int64_t version, const char *skip,
                          int64_t timeout_ms, const ProtobufCMessageDescriptor *rdesc,
                          ProtobufCMessage **resps, tsr_error *err)
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
        one = tsr_rpc_pack(&m.base, &len);
    } else if (strcmp(what, "Commit") == 0) {
        Tessera__V1__CommitRequest m = TESSERA__V1__COMMIT_REQUEST__INIT;
        m.version = version;
        one = tsr_rpc_pack(&m.base, &len);
    } else {
        Tessera__V1__AbortRequest m = TESSERA__V1__ABORT_REQUEST__INIT;
        m.version = version;
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
    size_t bad = fan_version(c, "Commit", version, out, c->cfg.stage_deadline_ms,
                             &tessera__v1__commit_response__descriptor, resps, err);
    for (size_t k = 0; k < c->nrep; k++) {
        if (!resps[k] && !out[k])
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
        if (out[k] || resps[k] || (bufs && !bufs[c->rep[k].group]))
            continue;
        out[k] = 1;
        char w[700];
        snprintf(w, sizeof w, "shard %zu replica %zu (%s) left out of version %lld: its %s "
                 "failed (reconcile re-seeds it from a sibling replica)", c->rep[k].group,
                 c->rep[k].index, c->rep[k].addr, (long long)version, what);
        tsr_warn("update %s: %s; first failure of the fan-out: %s", op->id, w, err->msg);
        pthread_mutex_lock(&c->op_mu);
        op->warnings = tsr_xrealloc(op->warnings, (op->nwarnings + 1) * sizeof *op->warnings);
        op->warnings[op->nwarnings++] = tsr_xstrdup(w);
        pthread_mutex_unlock(&c->op_mu);
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
        if (fan_version(c, "Abort", version, in, c->cfg.search_deadline_ms, NULL, NULL, &aerr))
            tsr_warn("update %s: Abort(%lld) to a replica left out failed (reconcile aborts "
                     "it when it is back): %s", op->id, (long long)version, aerr.msg);
    }
    free(in);
}

/* ---------------------------------------------------------------- the update */

typedef struct shard_work {
    size_t *ups;        /* indices into batch records */
    size_t nups, cap;
    Tessera__V1__StagedDelete *dels;
    size_t ndels, dcap;
} shard_work;

static void push_up(shard_work *w, size_t i)
{
    if (w->nups == w->cap)
        w->ups = tsr_xrealloc(w->ups, (w->cap = w->cap ? w->cap * 2 : 256) * sizeof *w->ups);
    w->ups[w->nups++] = i;
}

static void push_del(shard_work *w, int64_t label, int32_t list)
{
    if (w->ndels == w->dcap)
        w->dels = tsr_xrealloc(w->dels, (w->dcap = w->dcap ? w->dcap * 2 : 64) * sizeof *w->dels);
    Tessera__V1__StagedDelete *d = &w->dels[w->ndels++];
    tessera__v1__staged_delete__init(d);
    d->label = label;
    d->list = list;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static int cmp_rec(const void *key, const void *rec)
{
    return strcmp((const char *)key, ((const tsr_datapoint *)rec)->id);
}

static void normalize(float *v, size_t d)
{
    double s = 0;
    for (size_t i = 0; i < d; i++)
        s += (double)v[i] * v[i];
    if (s > 0) {
        float inv = (float)(1.0 / sqrt(s));
        for (size_t i = 0; i < d; i++)
            v[i] *= inv;
    }
}

static int get_template(tsr__coord *c, tsr__snap *base, tsr_batch *b, tsr_ivfpq **out,
                        int *fresh, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    enum tsr_metric metric = cfg->distance == TSR_DIST_SQUARED_L2 ? TSR_METRIC_L2 : TSR_METRIC_IP;
    *fresh = 0;
    if (base->tmpl)
        return tsr_faiss_read_mem(base->tmpl_bytes, base->tmpl_len, out, err);
    *fresh = 1;
    if (c->template_path) {
        int rc = tsr_faiss_read_file(c->template_path, out, err);
        if (rc)
            return rc;
        tsr_ivfpq *ix = *out;
        if (ix->d != cfg->dimensions || ix->metric != metric || !ix->is_trained) {
            rc = tsr_err(err, TSR_EINVAL, "--template %s: d=%d metric=%s trained=%d, but the "
                         "config says dimensions=%d distance=%s", c->template_path, ix->d,
                         ix->metric == TSR_METRIC_L2 ? "L2" : "IP", ix->is_trained,
                         cfg->dimensions, tsr__distance_name(cfg->distance));
            tsr_ivfpq_destroy(ix);
            *out = NULL;
            return rc;
        }
        if ((int)ix->nlist != cfg->nlist)
            tsr_info("template nlist %zu overrides config nlist %d", ix->nlist, cfg->nlist);
        return 0;
    }
    size_t nd = 0, d = (size_t)cfg->dimensions;
    for (size_t i = 0; i < b->nrecords; i++)
        nd += b->records[i].dense != NULL;
    if (nd < (size_t)cfg->nlist || nd < ((size_t)1 << cfg->pq_nbits))
        return tsr_err(err, TSR_EINVAL, "cannot train the index: the first batch has %zu dense "
                       "vectors, at least max(nlist = %d, 2^pq_nbits = %d) are needed (or start "
                       "the coordinator with --template F.faiss)", nd, cfg->nlist,
                       1 << cfg->pq_nbits);
    float *x = tsr_try_malloc(nd * d, sizeof(float));
    if (!x)
        return tsr_err(err, TSR_ENOMEM, "training: %zu vectors", nd);
    size_t j = 0;
    for (size_t i = 0; i < b->nrecords; i++)
        if (b->records[i].dense)
            memcpy(x + (j++) * d, b->records[i].dense, d * sizeof(float));
    tsr_ivfpq *ix = tsr_ivfpq_create(cfg->dimensions, (size_t)cfg->nlist, (size_t)cfg->pq_m,
                                     (size_t)cfg->pq_nbits, metric, 1, err);
    if (!ix) {
        free(x);
        return err->code ? err->code : TSR_EINVAL;
    }
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.seed = cfg->seed;
    bp.quiet = 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    bp.threads = ncpu > 0 ? (int)ncpu : 1;
    int64_t t0 = tsr_clock_mono_ms();
    int rc = tsr_ivfpq_train(ix, x, nd, &bp, err);
    free(x);
    if (rc) {
        tsr_ivfpq_destroy(ix);
        return rc;
    }
    ix->nprobe = (size_t)cfg->nprobe;
    tsr_info("trained the index from %zu vectors (nlist %d, pq_m %d, seed %llu) in %lld ms", nd,
             cfg->nlist, cfg->pq_m, (unsigned long long)cfg->seed,
             (long long)(tsr_clock_mono_ms() - t0));
    *out = ix;
    return 0;
}

/* Runs the update; returns the final state and fills err / *version. */
static int run_update(tsr__coord *c, tsr__op *op, tsr_batch *b, int64_t *version,
                      tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    size_t S = cfg->nshards, d = (size_t)cfg->dimensions;
    tsr__snap *base = tsr__coord_snap_get(c);
    tsr__snap *ns = NULL;
    tsr_ivfpq *tmpl = NULL;
    int64_t *assign = NULL;
    shard_work *w = tsr_xcalloc(S, sizeof *w);
    int state = TESSERA__V1__OPERATION__STATE__FAILED;
    int staged_any = 0, fresh = 0;
    int overwrite = op->overwrite || base->version == 0;
    int64_t newv = (int64_t)base->version + 1;
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    size_t *lens = tsr_xcalloc(S, sizeof *lens);
    char *out = tsr_xcalloc(c->nrep ? c->nrep : 1, 1); /* replicas left out of N+1 */
    ProtobufCMessage **sr = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *sr);
    int rc;

    if (cfg->distance == TSR_DIST_COSINE)
        for (size_t i = 0; i < b->nrecords; i++)
            if (b->records[i].dense)
                normalize(b->records[i].dense, d);
    if ((rc = get_template(c, base, b, &tmpl, &fresh, err)))
        goto out;
    size_t nlist = tmpl->nlist;
    /* assignment */
    size_t nd = 0;
    for (size_t i = 0; i < b->nrecords; i++)
        nd += b->records[i].dense != NULL;
    assign = tsr_xcalloc(b->nrecords + 1, sizeof *assign);
    if (nd) {
        float *x = tsr_try_malloc(nd * d, sizeof(float));
        int64_t *a = tsr_xcalloc(nd, sizeof *a);
        if (!x) {
            free(a);
            rc = tsr_err(err, TSR_ENOMEM, "assignment of %zu vectors", nd);
            goto out;
        }
        size_t j = 0;
        for (size_t i = 0; i < b->nrecords; i++)
            if (b->records[i].dense)
                memcpy(x + (j++) * d, b->records[i].dense, d * sizeof(float));
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        rc = tsr_ivfpq_assign(tmpl, x, nd, ncpu > 0 ? (int)ncpu : 1, a, err);
        free(x);
        if (rc) {
            free(a);
            goto out;
        }
        j = 0;
        for (size_t i = 0; i < b->nrecords; i++)
            assign[i] = b->records[i].dense ? a[j++] : -1;
        free(a);
    } else {
        for (size_t i = 0; i < b->nrecords; i++)
            assign[i] = -1;
    }
    /* new snapshot: template, plan */
    ns = tsr__snap_create();
    ns->version = (uint64_t)newv;
    if ((rc = tsr__snap_set_template(ns, tmpl, err)))
        goto out;
    tmpl = NULL;
    ns->plan = tsr_xmalloc(nlist * sizeof *ns->plan);
    if (base->plan && base->tmpl && base->tmpl->nlist == nlist) {
        memcpy(ns->plan, base->plan, nlist * sizeof *ns->plan);
        ns->plan_kind = base->plan_kind;
    } else {
        int64_t *sizes = tsr_xcalloc(nlist, sizeof *sizes);
        for (size_t i = 0; i < b->nrecords; i++)
            if (assign[i] >= 0)
                sizes[assign[i]]++;
        tsr__plan_build(cfg->plan, ns->tmpl, sizes, S, cfg->seed, ns->plan);
        ns->plan_kind = cfg->plan;
        free(sizes);
    }
    /* directory + routing */
    ns->next_label = base->next_label;
    if (!op->overwrite) {
        for (size_t i = 0; i < base->dir.n; i++) {
            const tsr__dir_entry *e = &base->dir.e[i];
            if (bsearch(e->id, b->records, b->nrecords, sizeof *b->records, cmp_rec))
                continue;
            if (b->ndeletes && bsearch(&e->id, b->deletes, b->ndeletes, sizeof *b->deletes,
                                       cmp_str))
                continue;
            tsr__dir_add(&ns->dir, e->id, e->label, e->list, e->shard, e->dense, e->sparse);
        }
    }
    int64_t ndeleted = 0, nmoved = 0;
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *r = &b->records[i];
        const tsr__dir_entry *old = tsr__dir_find(&base->dir, r->id);
        int64_t label = old ? old->label : ns->next_label++;
        int32_t list = (int32_t)assign[i];
        int32_t shard = list >= 0 ? ns->plan[list] : (int32_t)(tsr__hash_str(r->id) % S);
        if (old && !overwrite && old->shard != shard && (size_t)old->shard < S) {
            push_del(&w[old->shard], old->label, old->list);
            nmoved++;
        }
        push_up(&w[shard], i);
        tsr__dir_add(&ns->dir, r->id, label, list, shard, r->dense != NULL, r->nsparse > 0);
    }
    if (!overwrite)
        for (size_t i = 0; i < b->ndeletes; i++) {
            const tsr__dir_entry *old = tsr__dir_find(&base->dir, b->deletes[i]);
            if (old && (size_t)old->shard < S) {
                push_del(&w[old->shard], old->label, old->list);
                ndeleted++;
            }
        }
    for (size_t i = 0; i < ns->dir.n; i++) {
        ns->ndense += ns->dir.e[i].dense;
        ns->nsparse += ns->dir.e[i].sparse;
    }
    tsr_info("update %s: version %lld: %zu upserts (%lld moved between shards), %lld deletes, "
             "%s", op->id, (long long)newv, b->nrecords, (long long)nmoved, (long long)ndeleted,
             overwrite ? "empty base" : "delta");

    /* STAGING */
    pthread_mutex_lock(&c->op_mu);
    op->target = newv;
    op->state = TESSERA__V1__OPERATION__STATE__STAGING;
    pthread_mutex_unlock(&c->op_mu);
    op_save(c, op, 0); /* after a crash from here on, CURRENT >= newv means it committed */
    tsr_metrics_update_phase("stage");
    size_t chunk = (size_t)cfg->stage_chunk;
    size_t rounds = 1;
    for (size_t s = 0; s < S; s++) {
        size_t r1 = (w[s].nups + chunk - 1) / chunk, r2 = (w[s].ndels + chunk - 1) / chunk;
        if (r1 > rounds)
            rounds = r1;
        if (r2 > rounds)
            rounds = r2;
    }
    int32_t **own = tsr_xcalloc(S, sizeof *own);
    size_t *nown = tsr_xcalloc(S, sizeof *nown);
    for (size_t s = 0; s < S; s++)
        own[s] = tsr_xmalloc((nlist + 1) * sizeof(int32_t));
    for (size_t l = 0; l < nlist; l++)
        own[ns->plan[l]][nown[ns->plan[l]]++] = (int32_t)l;
    staged_any = 1;
    pthread_mutex_lock(&c->op_mu);
    op->staged = 1;
    pthread_mutex_unlock(&c->op_mu);
    for (size_t r = 0; r < rounds && rc == 0; r++) {
        for (size_t s = 0; s < S; s++) {
            size_t u0 = r * chunk, d0 = r * chunk;
            if (r > 0 && u0 >= w[s].nups && d0 >= w[s].ndels) {
                bufs[s] = NULL;
                continue;
            }
            Tessera__V1__StageRequest m = TESSERA__V1__STAGE_REQUEST__INIT;
            m.version = newv;
            m.base_version = overwrite ? 0 : (int64_t)base->version;
            m.chunk = (int32_t)r;
            if (r == 0) {
                if (overwrite) {
                    m.template_faiss.data = ns->tmpl_bytes;
                    m.template_faiss.len = ns->tmpl_len;
                }
                m.own_lists = own[s];
                m.n_own_lists = nown[s];
            }
            size_t nu = u0 < w[s].nups ? w[s].nups - u0 : 0;
            if (nu > chunk)
                nu = chunk;
            size_t ndl = d0 < w[s].ndels ? w[s].ndels - d0 : 0;
            if (ndl > chunk)
                ndl = chunk;
            Tessera__V1__StagedUpsert *su = tsr_xcalloc(nu + 1, sizeof *su);
            Tessera__V1__StagedUpsert **sup = tsr_xcalloc(nu + 1, sizeof *sup);
            pbdp *pd = tsr_xcalloc(nu + 1, sizeof *pd);
            Tessera__V1__StagedDelete **sdp = tsr_xcalloc(ndl + 1, sizeof *sdp);
            for (size_t k = 0; k < nu; k++) {
                size_t i = w[s].ups[u0 + k];
                tessera__v1__staged_upsert__init(&su[k]);
                const tsr__dir_entry *e = tsr__dir_find(&ns->dir, b->records[i].id);
                su[k].label = e->label;
                su[k].list = e->list;
                dp_to_pb(&b->records[i], &pd[k]);
                su[k].datapoint = &pd[k].dp;
                sup[k] = &su[k];
            }
            for (size_t k = 0; k < ndl; k++)
                sdp[k] = &w[s].dels[d0 + k];
            m.upserts = sup;
            m.n_upserts = nu;
            m.deletes = sdp;
            m.n_deletes = ndl;
            bufs[s] = tsr_rpc_pack(&m.base, &lens[s]);
            for (size_t k = 0; k < nu; k++)
                pbdp_free(&pd[k]);
            free(pd);
            free(su);
            free(sup);
            free(sdp);
        }
        size_t sbad = fan(c, TSR_SHARD_SVC "Stage", bufs, lens, out, cfg->stage_deadline_ms,
                          &tessera__v1__stage_response__descriptor, sr, err);
        rc = absorb_failures(c, op, "Stage", newv, bufs, sr, out, sbad, err);
        for (size_t k = 0; k < c->nrep; k++) {
            protobuf_c_message_free_unpacked(sr[k], NULL); /* accepts NULL */
            sr[k] = NULL;
        }
        for (size_t s = 0; s < S; s++) {
            free(bufs[s]);
            bufs[s] = NULL;
        }
        pthread_mutex_lock(&c->op_mu);
        op->records_read = (int64_t)b->nrecords;
        pthread_mutex_unlock(&c->op_mu);
    }
    for (size_t s = 0; s < S; s++)
        free(own[s]);
    free(own);
    free(nown);
    if (rc)
        goto out;
    pthread_mutex_lock(&c->op_mu);
    op->shards_staged = (int)S;
    op->state = TESSERA__V1__OPERATION__STATE__PREPARING;
    pthread_mutex_unlock(&c->op_mu);
    op_save(c, op, 0);
    tsr__coord_crash_point("staged");

    /* PREPARING: every replica of every group must be ready */
    tsr_metrics_update_phase("prepare");
    ProtobufCMessage **pr = tsr_xcalloc(c->nrep, sizeof *pr);
    size_t bad = fan_version(c, "Prepare", newv, out, cfg->stage_deadline_ms,
                             &tessera__v1__prepare_response__descriptor, pr, err);
    for (size_t k = 0; k < c->nrep; k++) {
        Tessera__V1__PrepareResponse *p = (Tessera__V1__PrepareResponse *)pr[k];
        if (p && !p->ready) {
            if (!bad++)
                tsr_err(err, TSR_ESTATE, "shard %zu replica %zu (%s): Prepare(%lld) not ready: "
                        "%s", c->rep[k].group, c->rep[k].index, c->rep[k].addr,
                        (long long)newv, p->reason ? p->reason : "");
            protobuf_c_message_free_unpacked(pr[k], NULL);
            pr[k] = NULL; /* failed */
        }
    }
    rc = absorb_failures(c, op, "Prepare", newv, NULL, pr, out, bad, err);
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(pr[k], NULL); /* accepts NULL */
    free(pr);
    if (rc)
        goto out;
    abort_left_out(c, op, newv, out); /* before the flip: they must not commit N+1 */
    pthread_mutex_lock(&c->op_mu);
    op->shards_prepared = (int)S;
    pthread_mutex_unlock(&c->op_mu);
    tsr__coord_crash_point("prepared");

    /* commit point */
    if ((rc = tsr__snap_save(ns, c->store, err)) ||
        (rc = tsr_store_set_current(c->store, (uint64_t)newv, err)))
        goto out;
    staged_any = 0; /* past the commit point: never abort N+1 */
    tsr__coord_crash_point("flipped");
    for (size_t k = 0; k < c->nrep; k++)
        if (out[k]) /* not queried on N+1 until reconcile re-seeded it */
            atomic_store(&c->rep[k].lagging, 1);
    tsr__coord_snap_set(c, ns);
    ns = NULL;
    op_set(c, op, TESSERA__V1__OPERATION__STATE__COMMITTING);
    op_save(c, op, 0);

    /* COMMITTING */
    tsr_metrics_update_phase("commit");
    tsr_metrics_version_set((uint64_t)newv);
    tsr_error cerr = TSR_ERROR_INIT;
    int *missed = tsr_xcalloc(S, sizeof *missed);
    bad = commit_all(c, newv, out, missed, &cerr);
    size_t groups_missed = 0;
    for (size_t s = 0; s < S; s++)
        groups_missed += missed[s] != 0;
    free(missed);
    if (bad) {
        tsr_warn("update %s: %zu replica(s) missed Commit(%lld) (reconcile will retry): %s",
                 op->id, bad, (long long)newv, cerr.msg);
        pthread_mutex_lock(&c->rec_mu);
        pthread_cond_signal(&c->rec_cv);
        pthread_mutex_unlock(&c->rec_mu);
    }
    pthread_mutex_lock(&c->op_mu);
    op->shards_committed = (int)(S - groups_missed);
    pthread_mutex_unlock(&c->op_mu);
    tsr__coord_crash_point("committed");
    tsr__coord_schedule_release(c, (uint64_t)newv);
    /* old stored coordinator versions: keep the previous one as a fallback */
    if (newv >= 3) {
        tsr_error e2 = TSR_ERROR_INIT;
        uint64_t *vs = NULL;
        size_t nv = 0;
        if (tsr_store_list(c->store, &vs, &nv, &e2) == 0) {
            for (size_t i = 0; i < nv; i++)
                if (vs[i] + 1 < (uint64_t)newv)
                    tsr_store_remove(c->store, vs[i], &e2);
            free(vs);
        }
    }
    *version = newv;
    state = TESSERA__V1__OPERATION__STATE__SUCCEEDED;
out:
    if (rc && staged_any) {
        tsr_error aerr = TSR_ERROR_INIT;
        if (fan_version(c, "Abort", newv, NULL, cfg->search_deadline_ms, NULL, NULL, &aerr))
            tsr_warn("update %s: Abort(%lld) failed on some shard (reconcile will retry): %s",
                     op->id, (long long)newv, aerr.msg);
    }
    for (size_t s = 0; s < S; s++) {
        free(w[s].ups);
        free(w[s].dels);
    }
    free(w);
    free(bufs);
    free(lens);
    free(out);
    free(sr);
    free(assign);
    tsr_ivfpq_destroy(tmpl);
    tsr__snap_unref(ns);
    tsr__snap_unref(base);
    return state;
}

typedef struct upd_arg {
    tsr__coord *c;
    tsr__op *op;
} upd_arg;

static void *update_main(void *p)
{
    upd_arg *a = p;
    tsr__coord *c = a->c;
    tsr__op *op = a->op;
    free(a);
    tsr_error err = TSR_ERROR_INIT;
    op_set(c, op, TESSERA__V1__OPERATION__STATE__READING);
    tsr_metrics_update_phase("validate");
    tsr_batch_options bo = {(size_t)c->cfg.dimensions, (uint64_t)op->max_invalid, 0};
    tsr_batch *b = NULL;
    int rc = tsr_batch_load(op->batch_root, &bo, &b, &err);
    if (b) {
        char *js = tsr_batch_report_json(&b->report);
        pthread_mutex_lock(&c->op_mu);
        op->report_json = js;
        report_to_pb(&b->report, &op->report_pb, &op->report_len);
        op->files_total = op->files_read = (int64_t)b->report.nfiles;
        op->records_read = (int64_t)(b->report.valid + b->report.invalid);
        pthread_mutex_unlock(&c->op_mu);
        tsr_metrics_update_records((uint64_t)(b->report.valid + b->report.invalid +
                                              b->report.deletes));
    }
    if (rc == TSR_EREJECTED) {
        op_finish(c, op, TESSERA__V1__OPERATION__STATE__REJECTED,
                  b && b->report.reason[0] ? b->report.reason : "batch rejected", 0, rc);
    } else if (rc) {
        op_finish(c, op, TESSERA__V1__OPERATION__STATE__FAILED, err.msg, 0, rc);
    } else {
        int64_t version = 0;
        pthread_mutex_lock(&c->update_mu);
        int st = run_update(c, op, b, &version, &err);
        pthread_mutex_unlock(&c->update_mu);
        op_finish(c, op, st, st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? NULL : err.msg,
                  version, err.code);
    }
    tsr_batch_destroy(b);
    return NULL;
}

/* ---------------------------------------------------------------- handlers */

int tsr__coord_rpc_update(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__UpdateIndexRequest *rq = tessera__v1__update_index_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpdateIndexRequest: malformed "
                                   "protobuf");
    int rc = 0;
    if (!rq->batch_root || !rq->batch_root[0]) {
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "batch_root is empty");
        goto out;
    }
    if (rq->max_invalid_records < 0) {
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "max_invalid_records = %d is "
                                 "negative", rq->max_invalid_records);
        goto out;
    }
    pthread_mutex_lock(&c->op_mu);
    if (c->busy || c->closing) {
        pthread_mutex_unlock(&c->op_mu);
        rc = tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, c->closing ? "shutting down"
                                 : "update in progress");
        goto out;
    }
    if (c->upd_thread_live) {
        pthread_join(c->upd_thread, NULL); /* finished: busy is 0 */
        c->upd_thread_live = 0;
    }
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-%llu-%lld", (unsigned long long)++c->op_seq,
             (long long)(tsr_clock_wall_ms() % 1000000));
    op->state = TESSERA__V1__OPERATION__STATE__PENDING;
    op->batch_root = tsr_xstrdup(rq->batch_root);
    op->overwrite = rq->is_complete_overwrite;
    op->max_invalid = rq->max_invalid_records;
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
    if (pthread_create(&c->upd_thread, NULL, update_main, a) != 0) {
        free(a);
        c->busy = 0;
        op->state = TESSERA__V1__OPERATION__STATE__FAILED;
        op->error = tsr_xstrdup("cannot start the update thread");
    } else {
        c->upd_thread_live = 1;
    }
    Tessera__V1__UpdateIndexResponse resp = TESSERA__V1__UPDATE_INDEX_RESPONSE__INIT;
    resp.operation_id = op->id;
    tsr_info("update %s: batch_root %s%s, max_invalid_records %d", op->id, op->batch_root,
             op->overwrite ? " (complete overwrite)" : "", rq->max_invalid_records);
    rc = tsr_rpc_reply_pack(r, &resp.base);
    pthread_mutex_unlock(&c->op_mu);
out:
    tessera__v1__update_index_request__free_unpacked(rq, NULL);
    return rc;
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
    pthread_mutex_lock(&c->op_mu);
    tsr__op *op = NULL;
    for (size_t i = 0; i < c->nops; i++)
        if (rq->operation_id && strcmp(c->ops[i]->id, rq->operation_id) == 0)
            op = c->ops[i];
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
    tessera__v1__get_operation_request__free_unpacked(rq, NULL);
    return rc;
}
