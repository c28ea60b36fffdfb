/*
 * ops — operations (UpdateIndex, AddShardGroup, RemoveShardGroup, folds) and their log
 * (oplog.c): the kept operations, their records on disk (DATA/operations/) or in etcd,
 * and their GetOperation form.
 *
 * Owns: tsr__op (one per operation; the table tsr__coord.ops of at most TSR__OP_MAX_KEPT).
 * Locks: op_mu guards the table, `busy` (one operation at a time) and `closing`; it is
 * taken after update_mu and the stream lock, before the overlay lock and snap_mu.
 */
#ifndef TSR_COORD_OPS_H
#define TSR_COORD_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "tessera/v1/tessera.pb-c.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* ---- operations ---------------------------------------------------------------------- */
typedef struct tsr__op {
    char id[32];
    int state;                  /* Tessera__V1__Operation__State */
    int64_t files_total, files_read, records_read;
    int shards_total, shards_staged, shards_prepared, shards_committed;
    int64_t lists_total, lists_moved, datapoints_moved, bytes_moved; /* a reshard */
    char *report_json;          /* owned */
    uint8_t *report_pb;         /* owned; packed tessera.v1.BatchReport */
    size_t report_len;
    int64_t version;            /* produced (SUCCEEDED), else 0 */
    int64_t target;             /* the version it is going to produce, once staging began */
    char *error;                /* owned */
    int64_t start_ms, end_ms;   /* wall clock (tsr_clock_wall_ms): shown and stored */
    char **warnings;            /* owned, nwarnings lines (e.g. a replica left out) */
    size_t nwarnings;
    int staged;                 /* staging began (a failure then aborts N+1) */
    /* inputs */
    char *batch_root;
    int overwrite;
    int64_t max_invalid;
} tsr__op;

#define TSR__OP_MAX_KEPT 64    /* operations remembered (in memory and in the oplog) */

void tsr__op_free(tsr__op *op); /* accepts NULL */

/* op's progress into *pg (GetOperation, GetIndexStats' last operation). Caller holds op_mu. */
void tsr__op_progress_to_pb(const tsr__op *op, Tessera__V1__OperationProgress *pg);

/* The GetOperation answer for op as being in `state` into *o (its progress in *pg, strings
 * borrowed from op; o->report, when set, is new: the caller frees it with
 * tessera__v1__batch_report__free_unpacked). Caller holds op_mu. */
void tsr__op_to_pb(const tsr__op *op, int state, Tessera__V1__Operation *o,
                   Tessera__V1__OperationProgress *pg);



/* oplog.c: operation records in DATA/operations/ (see there). save: writes op's record as
 * being in `state` (0: op->state; an update records its end before GetOperation shows it;
 * locked: the caller holds op_mu); forget: removes it; load: at start, before serving,
 * fills c->ops from the records and resolves interrupted ones against `current` (the
 * version CURRENT names, 0 for none). */
int tsr__oplog_save(struct tsr__coord *c, tsr__op *op, int state, int locked,
                    tsr_error *err);
void tsr__oplog_forget(struct tsr__coord *c, const tsr__op *op);
int tsr__oplog_load(struct tsr__coord *c, uint64_t current, tsr_error *err);
/* With --etcd (records in etcd): fetch: the record of operation id as a new tsr__op
 * (tsr__op_free it), NULL when unknown or without --etcd (GetOperation on a coordinator that
 * did not run it). settle: a new leader resolves the records of operations that had not
 * ended (their leader died) against the committed version, as tsr__oplog_load does at
 * start, and continues the op ids after theirs. load with --etcd keeps only ended ones. */
tsr__op *tsr__oplog_fetch(struct tsr__coord *c, const char *id);
void tsr__oplog_settle(struct tsr__coord *c, uint64_t committed);

/* The kept operation with that id, or NULL (id may be NULL). Caller holds op_mu. */
tsr__op *tsr__coord_op_find(tsr__coord *c, const char *id);

void tsr__coord_ops_close(tsr__coord *c);

#endif
