/*
 * oplog — the coordinator's operations survive a restart.
 *
 * Every UpdateIndex operation has a record `DATA/operations/<id>.pb`: a packed
 * tessera.v1.Operation, written whole and atomically (tsr_store_aux_write) when the
 * operation is accepted, when staging starts, right after the commit point, and when it
 * ends. While an operation runs, the record's `version` is the version it is going to
 * produce (0 before staging); once it has ended it is the version it produced, as
 * GetOperation says. The newest TSR__OP_MAX_KEPT records are kept, older ones removed with the
 * in-memory entry.
 *
 * At start (tsr__oplog_load, before the server listens) the records come back into the
 * operations table, so GetOperation answers for operations of an earlier run. A record
 * that had not ended was interrupted by the stop or crash of the coordinator; it is
 * resolved by where the update got to, which the store says exactly:
 *   - CURRENT names its target version or a later one: the update passed its commit
 *     point (the flip of CURRENT), the shards are brought to that version by reconcile,
 *     so it SUCCEEDED;
 *   - otherwise it FAILED ("interrupted ... before its commit point"); the version that was
 *     served stays served, and shards that staged or prepared it are aborted by reconcile.
 * The resolved record is written back. A record that cannot be read is named in a warning
 * and left on disk (it is not ours to delete); its operation is then unknown to GetOperation.
 *
 * Threads: tsr__oplog_load runs before any other thread. tsr__oplog_save is called by the
 * thread that owns the operation at that moment (the UpdateIndex handler while it creates
 * it, then the update thread), so writes of one record never race; it takes op_mu only to
 * pack the record.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "meta.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"

#define OPLOG_DIR "operations"
#define OPLOG_MAX_RECORD (64u << 20) /* a record holds a batch report; far more than one */

/* The records' home: etcd with --etcd (any coordinator answers GetOperation), else
 * DATA/operations/. */
static int aux_write(tsr__coord *c, const char *name, const void *buf, size_t len,
                     tsr_error *err)
{
    return c->meta ? tsr__meta_aux_write(c->meta, OPLOG_DIR, name, buf, len, err)
                   : tsr_store_aux_write(c->store, OPLOG_DIR, name, buf, len, err);
}

static int aux_list(tsr__coord *c, char ***names, size_t *n, tsr_error *err)
{
    return c->meta ? tsr__meta_aux_list(c->meta, OPLOG_DIR, names, n, err)
                   : tsr_store_aux_list(c->store, OPLOG_DIR, names, n, err);
}

static int aux_read(tsr__coord *c, const char *name, void **buf, size_t *len, tsr_error *err)
{
    return c->meta ? tsr__meta_aux_read(c->meta, OPLOG_DIR, name, OPLOG_MAX_RECORD, buf, len, err)
                   : tsr_store_aux_read(c->store, OPLOG_DIR, name, OPLOG_MAX_RECORD, buf, len,
                                        err);
}

static int aux_remove(tsr__coord *c, const char *name, tsr_error *err)
{
    return c->meta ? tsr__meta_aux_remove(c->meta, OPLOG_DIR, name, err)
                   : tsr_store_aux_remove(c->store, OPLOG_DIR, name, err);
}

static int final_state(int st)
{
    return st == TESSERA__V1__OPERATION__STATE__SUCCEEDED ||
           st == TESSERA__V1__OPERATION__STATE__REJECTED ||
           st == TESSERA__V1__OPERATION__STATE__FAILED;
}

static void record_name(const char *id, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.pb", id);
}

void tsr__op_free(tsr__op *op)
{
    if (!op)
        return;
    free(op->report_json);
    free(op->report_pb);
    free(op->error);
    free(op->batch_root);
    for (size_t i = 0; i < op->nwarnings; i++)
        free(op->warnings[i]);
    free(op->warnings);
    free(op);
}

void tsr__coord_ops_close(tsr__coord *c)
{
    for (size_t i = 0; i < c->nops; i++)
        tsr__op_free(c->ops[i]);
    free(c->ops);
    c->ops = NULL;
    c->nops = 0;
}

void tsr__op_progress_to_pb(const tsr__op *op, Tessera__V1__OperationProgress *pg)
{
    tessera__v1__operation_progress__init(pg);
    pg->files_total = op->files_total;
    pg->files_read = op->files_read;
    pg->records_read = op->records_read;
    pg->shards_total = op->shards_total;
    pg->shards_staged = op->shards_staged;
    pg->shards_prepared = op->shards_prepared;
    pg->shards_committed = op->shards_committed;
    pg->lists_total = op->lists_total;
    pg->lists_moved = op->lists_moved;
    pg->datapoints_moved = op->datapoints_moved;
    pg->bytes_moved = op->bytes_moved;
}

void tsr__op_to_pb(const tsr__op *op, int state, Tessera__V1__Operation *o,
                   Tessera__V1__OperationProgress *pg)
{
    tessera__v1__operation__init(o);
    o->operation_id = (char *)op->id;
    o->state = (Tessera__V1__Operation__State)state;
    tsr__op_progress_to_pb(op, pg);
    o->progress = pg;
    o->report_json = op->report_json ? op->report_json : (char *)"";
    o->report = op->report_pb ? tessera__v1__batch_report__unpack(NULL, op->report_len,
                                                                  op->report_pb)
                              : NULL;
    o->version = final_state(state) ? op->version : op->target;
    o->error = op->error ? op->error : (char *)"";
    o->start_time_ms = op->start_ms;
    o->end_time_ms = op->end_ms;
    o->warnings = op->warnings;
    o->n_warnings = op->nwarnings;
}

/* Packs op as being in `state` (caller holds op_mu); returns a new buffer. */
static uint8_t *pack_op(const tsr__op *op, int state, size_t *len)
{
    Tessera__V1__Operation o;
    Tessera__V1__OperationProgress pg;
    tsr__op_to_pb(op, state, &o, &pg);
    *len = tessera__v1__operation__get_packed_size(&o);
    uint8_t *buf = tsr_xmalloc(*len ? *len : 1);
    tessera__v1__operation__pack(&o, buf);
    if (o.report)
        tessera__v1__batch_report__free_unpacked(o.report, NULL);
    return buf;
}

int tsr__oplog_save(tsr__coord *c, tsr__op *op, int state, int locked, tsr_error *err)
{
    if (!locked)
        pthread_mutex_lock(&c->op_mu);
    size_t len;
    uint8_t *buf = pack_op(op, state ? state : op->state, &len);
    char name[48];
    record_name(op->id, name, sizeof name);
    if (!locked)
        pthread_mutex_unlock(&c->op_mu);
    int rc = aux_write(c, name, buf, len, err);
    free(buf);
    return rc;
}

void tsr__oplog_forget(tsr__coord *c, const tsr__op *op)
{
    char name[48];
    tsr_error err = TSR_ERROR_INIT;
    record_name(op->id, name, sizeof name);
    if (aux_remove(c, name, &err))
        tsr_warn("operation %s: %s", op->id, err.msg);
}

/* A new tsr__op from a record, or NULL (with a warning naming the file). */
static tsr__op *op_from_record(const char *name, const uint8_t *buf, size_t len)
{
    Tessera__V1__Operation *o = tessera__v1__operation__unpack(NULL, len, buf);
    if (!o) {
        tsr_warn("%s/%s: not a packed tessera.v1.Operation (left on disk, operation unknown)",
                 OPLOG_DIR, name);
        return NULL;
    }
    tsr__op *op = NULL;
    char want[48];
    size_t idlen = o->operation_id ? strlen(o->operation_id) : 0;
    if (idlen == 0 || idlen >= sizeof op->id) {
        tsr_warn("%s/%s: operation_id of %zu bytes, expected 1..%zu (left on disk)", OPLOG_DIR,
                 name, idlen, sizeof op->id - 1);
        goto out;
    }
    record_name(o->operation_id, want, sizeof want);
    if (strcmp(want, name) != 0) {
        tsr_warn("%s/%s: holds operation \"%s\" (expected its file to be %s; left on disk)",
                 OPLOG_DIR, name, o->operation_id, want);
        goto out;
    }
    op = tsr_xcalloc(1, sizeof *op);
    memcpy(op->id, o->operation_id, idlen + 1);
    op->state = (int)o->state;
    if (o->progress) {
        op->files_total = o->progress->files_total;
        op->files_read = o->progress->files_read;
        op->records_read = o->progress->records_read;
        op->shards_total = o->progress->shards_total;
        op->shards_staged = o->progress->shards_staged;
        op->shards_prepared = o->progress->shards_prepared;
        op->lists_total = o->progress->lists_total;
        op->lists_moved = o->progress->lists_moved;
        op->datapoints_moved = o->progress->datapoints_moved;
        op->bytes_moved = o->progress->bytes_moved;
        op->shards_committed = o->progress->shards_committed;
    }
    if (o->report_json && *o->report_json)
        op->report_json = tsr_xstrdup(o->report_json);
    if (o->report) {
        op->report_len = tessera__v1__batch_report__get_packed_size(o->report);
        op->report_pb = tsr_xmalloc(op->report_len ? op->report_len : 1);
        tessera__v1__batch_report__pack(o->report, op->report_pb);
    }
    if (final_state(op->state))
        op->version = o->version;
    else
        op->target = o->version;
    if (o->error && *o->error)
        op->error = tsr_xstrdup(o->error);
    op->start_ms = o->start_time_ms;
    op->end_ms = o->end_time_ms;
    if (o->n_warnings) {
        op->warnings = tsr_xcalloc(o->n_warnings, sizeof *op->warnings);
        for (size_t i = 0; i < o->n_warnings; i++)
            op->warnings[op->nwarnings++] = tsr_xstrdup(o->warnings[i] ? o->warnings[i] : "");
    }
out:
    tessera__v1__operation__free_unpacked(o, NULL);
    return op;
}

static const char *state_name(int st)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&tessera__v1__operation__state__descriptor, st);
    return v ? v->name : "UNKNOWN";
}

/* An operation that had not ended when the coordinator stopped: decided by the store. */
static void resolve_interrupted(tsr__coord *c, tsr__op *op, uint64_t current)
{
    char msg[400];
    const char *was = state_name(op->state);
    if (op->target > 0 && current >= (uint64_t)op->target) {
        op->state = TESSERA__V1__OPERATION__STATE__SUCCEEDED;
        op->version = op->target;
        tsr_info("operation %s: the coordinator stopped while it was %s, after its commit point: "
                 "SUCCEEDED, version %lld (shards are brought to it by reconcile)", op->id, was,
                 (long long)op->version);
    } else {
        snprintf(msg, sizeof msg, "interrupted: the coordinator stopped while the update was %s, "
                 "before its commit point; nothing changed (version %llu is served), run the "
                 "update again", was, (unsigned long long)current);
        op->state = TESSERA__V1__OPERATION__STATE__FAILED;
        op->version = 0;
        free(op->error);
        op->error = tsr_xstrdup(msg);
        tsr_warn("operation %s: %s", op->id, msg);
    }
    op->end_ms = tsr_clock_wall_ms();
    tsr_error err = TSR_ERROR_INIT;
    if (tsr__oplog_save(c, op, 0, 1, &err))
        tsr_warn("operation %s: cannot write its resolved record: %s", op->id, err.msg);
}

static int cmp_op(const void *a, const void *b)
{
    const tsr__op *x = *(tsr__op *const *)a, *y = *(tsr__op *const *)b;
    if (x->start_ms != y->start_ms)
        return x->start_ms < y->start_ms ? -1 : 1;
    return strcmp(x->id, y->id);
}

int tsr__oplog_load(tsr__coord *c, uint64_t current, tsr_error *err)
{
    char **names = NULL;
    size_t n = 0;
    int rc = aux_list(c, &names, &n, err);
    if (rc)
        return rc;
    tsr__op **ops = n ? tsr_xcalloc(n, sizeof *ops) : NULL;
    size_t nops = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        if (nl < 4 || strcmp(names[i] + nl - 3, ".pb") != 0) {
            tsr_warn("%s/%s: not an operation record (*.pb); ignored", OPLOG_DIR, names[i]);
            continue;
        }
        void *buf = NULL;
        size_t len = 0;
        tsr_error e = TSR_ERROR_INIT;
        if (aux_read(c, names[i], &buf, &len, &e)) {
            tsr_warn("%s (left on disk, operation unknown)", e.msg);
            continue;
        }
        tsr__op *op = op_from_record(names[i], buf, len);
        free(buf);
        if (op)
            ops[nops++] = op;
    }
    if (nops)
        qsort(ops, nops, sizeof *ops, cmp_op);
    size_t drop = nops > TSR__OP_MAX_KEPT ? nops - TSR__OP_MAX_KEPT : 0;
    for (size_t i = 0; i < nops; i++) {
        unsigned long long seq;
        if (sscanf(ops[i]->id, "op-%llu-", &seq) == 1 && seq > c->op_seq)
            c->op_seq = seq; /* new ids continue after the old ones */
        if (i < drop) {
            tsr__oplog_forget(c, ops[i]);
            tsr__op_free(ops[i]);
            continue;
        }
        if (!final_state(ops[i]->state) && c->meta) {
            tsr__op_free(ops[i]); /* the leader's, running or settled by the next leader */
            continue;
        }
        if (!final_state(ops[i]->state))
            resolve_interrupted(c, ops[i], current);
        c->ops = tsr_xrealloc(c->ops, (c->nops + 1) * sizeof *c->ops);
        c->ops[c->nops++] = ops[i];
    }
    if (c->nops)
        tsr_info("%zu operation(s) of earlier runs loaded from %s/", c->nops, OPLOG_DIR);
    free(ops);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return 0;
}

tsr__op *tsr__oplog_fetch(tsr__coord *c, const char *id)
{
    size_t idlen = id ? strlen(id) : 0;
    if (!c->meta || idlen == 0 || idlen >= sizeof ((tsr__op *)0)->id)
        return NULL;
    char name[48];
    record_name(id, name, sizeof name);
    void *buf = NULL;
    size_t len = 0;
    tsr_error e = TSR_ERROR_INIT;
    if (aux_read(c, name, &buf, &len, &e))
        return NULL;
    tsr__op *op = op_from_record(name, buf, len);
    free(buf);
    return op;
}

void tsr__oplog_settle(tsr__coord *c, uint64_t committed)
{
    char **names = NULL;
    size_t n = 0;
    tsr_error err = TSR_ERROR_INIT;
    if (!c->meta || aux_list(c, &names, &n, &err)) {
        if (c->meta)
            tsr_warn("operations: cannot list them in etcd: %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        void *buf = NULL;
        size_t len = 0;
        tsr__op *op = NULL;
        if (aux_read(c, names[i], &buf, &len, &err) == 0)
            op = op_from_record(names[i], buf, len);
        free(buf);
        pthread_mutex_lock(&c->op_mu);
        unsigned long long seq;
        if (op && sscanf(op->id, "op-%llu-", &seq) == 1 && seq > c->op_seq)
            c->op_seq = seq; /* new ids continue after the other leaders' */
        int mine = 0;
        for (size_t k = 0; op && k < c->nops; k++)
            mine |= strcmp(c->ops[k]->id, op->id) == 0;
        if (op && !mine && !final_state(op->state))
            resolve_interrupted(c, op, committed); /* writes the record back */
        pthread_mutex_unlock(&c->op_mu);
        tsr__op_free(op);
        free(names[i]);
    }
    free(names);
}

tsr__op *tsr__coord_op_find(tsr__coord *c, const char *id)
{
    for (size_t i = 0; id && i < c->nops; i++)
        if (strcmp(c->ops[i]->id, id) == 0)
            return c->ops[i];
    return NULL;
}

