/*
 * update — UpdateIndex and the background fold, planners on the version transaction
 * (txn.h): the two-phase versioned batch update of DESIGN "Batch update", run on one
 * background thread per operation (one at a time).
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
#include "txn.h"

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

/* ---------------------------------------------------------------- the planner */

/* An update (records, or a fold: none, catchup) on the version transaction (txn.h): the
 * plan of update_plan.c on the served version (a batch: with the streamed writes, the
 * stream frozen), every chunk staged at once. */
static int update_plan(tsr__txn *u, void *ud, tsr_error *err)
{
    (void)ud;
    return tsr__txn_plan(u, !u->catchup, err);
}

/* A fold, after its Prepare: the directory gets the overlay so far, with writes flowing. */
static void update_prepared(tsr__txn *u, void *ud)
{
    (void)ud;
    u->ov_mark = tsr__stream_overlay_copy(u->c, u->base, u->p.ns);
}

static void update_caught_up(tsr__txn *u, void *ud)
{
    (void)u;
    (void)ud;
    tsr_test_sleep(TSR_KNOB_COORD_SLOW_FLIP_MS, "the fold's flip after its catch-up");
}

/* After the commit: where the time went (the stream still frozen, as before). */
static void update_finish(tsr__txn *u, void *ud, int rc)
{
    (void)ud;
    if (rc)
        return;
    const int64_t *t = u->t;
    if (u->catchup)
        tsr_info("update %s: version %lld: plan %lld ms, stage %lld, prepare %lld, "
                 "catch-up %lld, commit point %lld, commit fan-out %lld (streamed writes "
                 "flowed during the plan and the prepare)", u->op->id,
                 (long long)u->newv, (long long)(t[1] - t[0]), (long long)(t[2] - t[1]),
                 (long long)(t[3] - t[2]), (long long)(t[4] - t[3]),
                 (long long)(t[5] - t[4]), (long long)(t[6] - t[5]));
    else
        tsr_info("update %s: version %lld: plan %lld ms, stage %lld, prepare %lld, commit "
                 "point %lld, commit fan-out %lld (streamed writes waited all along)",
                 u->op->id, (long long)u->newv, (long long)(t[1] - t[0]),
                 (long long)(t[2] - t[1]), (long long)(t[3] - t[2]),
                 (long long)(t[5] - t[3]), (long long)(t[6] - t[5]));
}

/* Runs the update; returns the final state and fills err / *version. */
static int run_update(tsr__coord *c, tsr__op *op, tsr_batch *b, int catchup,
                      int64_t *version, tsr_error *err)
{
    tsr__txn u = {.c = c, .op = op, .b = b, .fresh = -1,
                  .catchup = catchup && b->nrecords == 0 && b->ndeletes == 0,
                  .term = tsr__coord_term(c)};
    tsr__txn_planner pl = {.plan_frozen = !u.catchup, .plan = update_plan,
                           .prepared = update_prepared, .caught_up = update_caught_up,
                           .finish = update_finish};
    int rc = tsr__txn_run(&u, &pl, version, err);
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
    tsr__op_set(c, op, TESSERA__V1__OPERATION__STATE__READING);
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
        tsr__op_finish(c, op, TESSERA__V1__OPERATION__STATE__REJECTED,
                  b && b->report.reason[0] ? b->report.reason : "batch rejected", 0, rc);
    } else if (rc) {
        tsr__op_finish(c, op, TESSERA__V1__OPERATION__STATE__FAILED, err.msg, 0, rc);
    } else {
        int64_t version = 0;
        pthread_mutex_lock(&c->update_mu);
        int st = run_update(c, op, b, fold, &version, &err);
        pthread_mutex_unlock(&c->update_mu);
        tsr__op_finish(c, op, st, st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? NULL : err.msg,
                  version, err.code);
    }
    tsr_batch_destroy(b);
    return NULL;
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
    tsr__op *op = tsr__op_begin(c, batch_root);
    op->overwrite = overwrite;
    op->max_invalid = max_invalid;
    upd_arg *a = tsr_xmalloc(sizeof *a);
    a->c = c;
    a->op = op;
    a->root = root;
    a->confine = within;
    if (tsr__op_launch(c, op, "update", update_main, a) != 0) {
        free(a->root);
        free(a);
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
int tsr__coord_fold_request(tsr__coord *c, const Tessera__V1__UpdateIndexRequest *rq, char *id,
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
