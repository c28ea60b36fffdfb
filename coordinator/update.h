/*
 * update — new versions (update.c, reshard.c, reshard_carry.c, reconcile.c): UpdateIndex's
 * background two-phase update (stage, prepare, flip, commit), the background fold of the
 * streamed writes, AddShardGroup / RemoveShardGroup moves (docs/resharding.md), and
 * reconcile, which brings every shard to the coordinator's version.
 *
 * Locks: update_mu is held by an update while it runs and by reconcile's passes (it comes
 * first in the lock order); the update thread takes the stream lock from its plan through
 * its Commit fan-out; op_mu for the operation's progress.
 */
#ifndef TSR_COORD_UPDATE_H
#define TSR_COORD_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "batch/batch.h"
#include "core/error.h"
#include "net/rpc.h"
#include "ops.h"
#include "snap.h"
#include "upd_plan.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* update.c: starts the update of batch_root (confined by --batch-root-allow) on its
 * thread, as tessera.v1 UpdateIndex does. Returns 0 with the new operation's id copied into
 * id (cap bytes), or a negative code with the error set on r (INVALID_ARGUMENT,
 * PERMISSION_DENIED, FAILED_PRECONDITION while another update runs). */
int tsr__coord_update_start(tsr__coord *c, const char *batch_root, int overwrite,
                            int32_t max_invalid, char *id, size_t cap, tsr_rpc_reply *r);

/* The background fold (update.c): a thread that starts an update with no records (batch_root
 * "(stream fold)") when the stream's overlay passes stream_fold_records and no update runs.
 * stop: after `closing` is set (it ends within 200 ms); accepts a fold never started. */
int tsr__coord_fold_start(tsr__coord *c);
void tsr__coord_fold_stop(tsr__coord *c);

/* reshard.c: the plan of a move on base (borrowed: the committed version plus the streamed
 * writes) over the config's groups (an added one already appended) without rm (-1: none):
 * p->ns (next version: new plan, directory, groups) and *moves, the datapoints whose group
 * changes (free with tsr__reshard_moves_free). Caller holds the stream lock. Progress on
 * op. Returns 0, or an error code with err set (p closed, *moves NULL). */
typedef struct tsr__reshard_moves tsr__reshard_moves;
int tsr__reshard_plan(tsr__coord *c, tsr__op *op, const tsr__snap *base, int rm,
                      tsr__upd_plan *p, tsr__reshard_moves **moves, tsr_error *err);
void tsr__reshard_moves_free(tsr__reshard_moves *m);
/* The moved records read from their old groups at version into b (records only; indices
 * in p's upserts; the old groups' deletes). catchup: streamed writes run meanwhile (no
 * stream lock held), and a label a write removed since the plan is skipped rather than
 * an error (the catch-up carries that write). Returns 0 or an error naming the group. */
int tsr__reshard_read(tsr__coord *c, tsr__op *op, uint64_t version,
                      const tsr__reshard_moves *m, tsr__upd_plan *p, tsr_batch *b, int catchup,
                      tsr_error *err);
/* ns's directory rebuilt from view (the committed version with the streamed writes up to
 * the catch-up's seq T, tsr__stream_base) routed by ns's plan over S groups; counts and
 * next_label follow. Caller holds the stream lock. */
void tsr__reshard_redir(tsr__snap *ns, const tsr__snap *view, size_t S);
/* reshard_carry.c, the move's catch-up (stream lock held, after Prepare): the rounds
 * logged on the served version after seq `from` (the move's S) up to the last one (T)
 * re-routed by ns's plan (a record of a moved list to its new owner, not the old one) and
 * sent in seq order (consecutive rounds merged per group, the seq of the last one) as
 * Writes naming the prepared catch-up version newv to every replica not skipped (skip:
 * per replica, may be NULL). sent[g] (ns's groups) gets the last seq
 * carried to group g (left as is when none). Returns 0, or the first failure (err names
 * the seq and the replica): the move fails. from_off: the log's size when seq `from` was
 * the last (tsr__stream_log_offset): the scan starts there, not at the top of the log. */
int tsr__reshard_carry(tsr__coord *c, uint64_t newv, const tsr__snap *ns, int64_t from,
                       int64_t from_off,
                       const char *skip, int64_t *sent, tsr_error *err);
/* reshard.c: before a new group g is staged: every replica answers Stats, serves no
 * version (else TSR_ESTATE: a new group starts empty), and its staged or prepared
 * leftovers (a move that crashed before its commit point) are aborted. */
int tsr__reshard_fresh_check(tsr__coord *c, size_t g, tsr_error *err);

/* Reconcile */
int tsr__coord_reconcile_start(tsr__coord *c);
void tsr__coord_reconcile_stop(tsr__coord *c);
/* One pass: bring every shard to the coordinator's version. Returns shards still off. */
int tsr__coord_reconcile_once(tsr__coord *c);
void tsr__coord_schedule_release(tsr__coord *c, uint64_t below);

/* Starts a move on the update thread (one operation at a time). addrs (borrowed, n > 0):
 * add a group; else remove group rm. Returns 0 with the op id and the group in *group, or a
 * negative code with the status set on r. */
int tsr__reshard_start(tsr__coord *c, char *const *addrs, size_t n, int64_t rm,
                       uint32_t *group, char *id, size_t cap, tsr_rpc_reply *r);
/* UpdateIndex with fold_stream: the background fold's update, on demand (the same op,
 * counted in tessera_stream_folds_total). Returns 0 or a negative code with the status
 * set on r. */
int tsr__coord_fold_request(tsr__coord *c, const Tessera__V1__UpdateIndexRequest *rq, char *id,
                            size_t cap, tsr_rpc_reply *r);

#endif
