/*
 * stream — streamed writes (stream.c; docs/streaming.md): validation, the write queue,
 * the writer thread's rounds (logged, mirrored, sent to every replica of the touched
 * groups), the overlay directory on top of the served snapshot, catch-up of replicas that
 * missed rounds, and the hooks an update, a reshard move or a fold uses around its commit
 * point (base view, version log, publication).
 *
 * Owns: tsr__stream (tsr__coord.st): the label and seq counters, each group's last seq,
 * the open log file, the overlay, the queue of requests, the writer thread. Locks: the
 * stream lock st.mu (taken with tsr__stream_freeze by an update, a move, a catch-up; held by
 * every round), then op_mu, then st.ov_rw (the overlay; read by queries), then snap_mu;
 * st.q_mu (the queue) is never held with another lock.
 */
#ifndef TSR_COORD_STREAM_H
#define TSR_COORD_STREAM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "net/rpc.h"
#include "snap.h"
#include "tessera/v1/tessera.pb-c.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* The state of streamed writes: opaque (stream_int.h); created by tsr__stream_init and
 * freed by tsr__stream_close. */
typedef struct tsr__stream tsr__stream;

/* stream.c: streamed writes (docs/streaming.md), the entry points of every front end
 * (tessera.v1 UpsertDatapoints / RemoveDatapoints, aiplatform.v1 IndexService's). rq is
 * borrowed; *resp is a zero-initialised response the call fills (scalars only: nothing to
 * free). They block until the write's round is durable and applied (run them on the worker
 * pool: TSR_RPC_LONG). Returns 0 = OK with *resp filled, or a negative TSR code with the
 * gRPC status set on r via tsr_rpc_reply_error: INVALID_ARGUMENT naming datapoints[i], its
 * id and the field; RESOURCE_EXHAUSTED above TSR__STREAM_MAX_PER_REQUEST; FAILED_PRECONDITION
 * without an index; UNAVAILABLE when a touched group has no live replica (nothing written)
 * or lost all of them during the round (outcome unknown, logged, resent by reconcile). */
#define TSR__STREAM_MAX_PER_REQUEST 10000
int tsr__coord_stream_upsert(tsr__coord *c, const Tessera__V1__UpsertDatapointsRequest *rq,
                             Tessera__V1__UpsertDatapointsResponse *resp, tsr_rpc_reply *r);
int tsr__coord_stream_remove(tsr__coord *c, const Tessera__V1__RemoveDatapointsRequest *rq,
                             Tessera__V1__RemoveDatapointsResponse *resp, tsr_rpc_reply *r);

/* ---- stream.c: streamed writes (docs/streaming.md) ---- */
/* At start, after the snapshot is loaded and before serving: replays the log of the
 * committed version (a torn or corrupt tail is cut, with a log line) into the overlay,
 * the label counter, the next seq and each group's last seq; creates the log when it is
 * missing. Returns 0 or an error (the coordinator does not start). */
int tsr__stream_init(tsr__coord *c, tsr_error *err);
/* The writer thread: first brings every replica up to the log (resends what it missed),
 * then runs rounds. stop: queued requests fail UNAVAILABLE, the thread is joined; close
 * frees the state (after stop). */
int tsr__stream_start(tsr__coord *c);
void tsr__stream_stop(tsr__coord *c);
void tsr__stream_close(tsr__coord *c);

/* Where ids live now: per id its label / list / group (found 0: unknown or removed), read
 * on one snapshot consistent with the overlay; returns that snapshot (new ref). */
typedef struct tsr__loc {
    int64_t label;
    int32_t list, shard;
    int found;
} tsr__loc;
tsr__snap *tsr__stream_resolve(tsr__coord *c, char *const *ids, size_t n, tsr__loc *out,
                               int64_t *seqs);
/* The dense and sparse counts of sn with the streamed writes applied on it. */
void tsr__stream_counts(tsr__coord *c, const tsr__snap *sn, int64_t *ndense, int64_t *nsparse);

/* freeze: holds the stream still until thaw (the stream lock st.mu): no round runs, and
 * the overlay, the seqs, the label counter and the log change only by what the caller
 * does (publication, version log, catch-up). Taken by an update from its plan through its
 * Commit fan-out, a reshard move (its head, then its catch-up through its Commit fan-out),
 * a catch-up (reconcile) and a follower moving its snapshot; the lock order is
 * docs/architecture.md's (after update_mu, before op_mu). No other subsystem touches the
 * stream's locks. */
void tsr__stream_freeze(tsr__coord *c);
void tsr__stream_thaw(tsr__coord *c);
/* For an update (update.c) and a re-seed (reconcile.c); the stream frozen. base: NULL when
 * nothing was streamed on sn, else a new snapshot view = sn's directory with the overlay
 * applied and the stream's label counter (template and plan borrowed from sn: free it with
 * tsr__stream_base_free, never snap_unref). */
tsr__snap *tsr__stream_base(tsr__coord *c, const tsr__snap *sn);
void tsr__stream_base_free(tsr__snap *view);
/* A fold's directory (update.c): ns, planned on sn with sn's plan and directory and no
 * record, gets the overlay applied in place (upserts set, removes removed), in two steps:
 * _copy before the stream lock (the caller holds update_mu: sn is served) takes ov_rw as
 * a reader per 4096 entries, so writes go on, and returns a mark; _finish under the
 * stream lock at the catch-up re-applies only the entries written after the mark, and
 * sets sn's counts plus the overlay's and the stream's label counter. The result is the
 * directory tsr__stream_base would give, with O(writes since the mark) under the lock
 * instead of O(directory). */
size_t tsr__stream_overlay_copy(tsr__coord *c, const tsr__snap *sn, tsr__snap *ns);
void tsr__stream_overlay_finish(tsr__coord *c, const tsr__snap *sn, tsr__snap *ns,
                                size_t mark);
/* The last seq logged for group g (StageRequest.base_stream_seq). */
int64_t tsr__stream_group_seq(tsr__coord *c, size_t g);
/* A query's snapshot (a reference) and, read with it under ov_rw, the last seq of each of
 * its groups (seqs[0..cap), 0 when the overlay is not of that version) and *last, the
 * last seq this coordinator has logged or followed for it (-1: not of that version). */
tsr__snap *tsr__stream_snap_seqs(tsr__coord *c, int64_t *seqs, size_t cap, int64_t *last);
/* A reshard move (docs/resharding.md "Writes during a move"; stream lock held): the last
 * seq logged (the move's S, taken when it sends every group's Stage chunk 0). */
int64_t tsr__stream_last_seq(tsr__coord *c);
/* The version of the open coordinator log (0: none is open). Stream lock held. */
uint64_t tsr__stream_log_version(tsr__coord *c);
/* The same moment's size of the coordinator log (where the rounds after S begin). */
int64_t tsr__stream_log_offset(tsr__coord *c);
/* Before the commit point: the log of version (header: the stream's next seq and group
 * seqs, next_label); abort removes it when the update fails. seqs[0..n), when given, are
 * the new version's group seqs (a move's or fold's catch-up: the seq it carried to each
 * group) in place of the stream's. */
int tsr__stream_version_begin(tsr__coord *c, uint64_t version, int64_t next_label,
                              const int64_t *seqs, size_t n, tsr_error *err);
void tsr__stream_version_abort(tsr__coord *c, uint64_t version);
/* The commit point's publication: ns becomes the served snapshot (takes its reference),
 * the overlay empties, the new version's log is opened and the old one removed; seqs[0..n)
 * (a catch-up's, as for version_begin) become the group seqs in the same step, so a query
 * planned on the served version never demands the new one's (they are ahead where a group
 * took no round at the last carried seq: such a demand waited 100 ms on every replica,
 * was refused and asked again — a 207 ms query at every fold's commit point, Dec 6).
 * With --etcd (the leader) the old version's mirrored records are dropped, except when
 * carried: ns's record names rounds of them (meta.h tsr__meta_carry), kept until the next
 * publication; the records two versions back are dropped in any case. */
void tsr__stream_publish(tsr__coord *c, tsr__snap *ns, const int64_t *seqs, size_t n,
                         int carried);
/* A new leader (leader.c), before it acts: when etcd holds the stream records of the
 * served version (its predecessor streamed writes on it), the local log is rewritten from
 * them and the overlay, label counter, next seq and group seqs are rebuilt by replaying it.
 * Takes the stream lock. Returns 0 or an error (streamed writes then stay refused, the
 * log closed, until an adoption works: the lease thread retries, lead.readopt). */
int tsr__stream_adopt(tsr__coord *c, tsr_error *err);
/* The same for a leader that stays one (lead.readopt: a round etcd refused or left in
 * doubt), followed under the same hold of the stream lock by the catch-up of every replica
 * (tsr__stream_catch_up_all): no new round may reach a shard before the rounds it missed
 * (a shard cannot tell a gap from a round of another group). */
int tsr__stream_readopt(tsr__coord *c, tsr_error *err);
/* Every replica that serves the version and is behind the log gets what it missed (one that
 * does not answer is marked behind): at start, and by a coordinator that just won the
 * election, before it leads (a replica that missed a round under the old leader served the
 * old value until reconcile's next pass: a removed id back; tests/chaos seed 2). */
void tsr__stream_catch_up_all(tsr__coord *c);
/* A follower (leader.c): one round rec (borrowed) the leader mirrored in etcd, applied to
 * the overlay when it is of the served version and newer than what was applied (a repeat
 * is ignored), so that reads on a follower see the streamed writes. Takes the stream lock.
 * Returns 1 when rounds are missing before rec: with strict (a watch event's round) rec is
 * then NOT applied and the caller fetches every round of the version and applies them in
 * order with strict 0 (there a seq etcd lacks is a round never completed, so never
 * acknowledged: it is passed over). */
int tsr__stream_follow(tsr__coord *c, const struct Tessera__V1__CoordLogRecord *rec,
                       int strict);
/* 1 when the overlay holds at least stream_fold_records writes (a fold is due). */
int tsr__stream_fold_due(tsr__coord *c);
/* The streamed writes the overlay holds (on the served version). */
int64_t tsr__stream_overlay_records(tsr__coord *c);
/* reconcile: replica k answered Stats with stream_seq applied at the served version; when
 * it is behind the log (or marked behind) the missing rounds of its group are resent in
 * seq order under the stream lock, and the mark cleared. Returns 0 or a TSR code. */
int tsr__stream_catch_up(tsr__coord *c, size_t k, int64_t applied);

#endif
