/*
 * txn — the version transaction (txn.c): one new version of the index taken through its
 * phases on every replica of every group, for an update (update.c), a reshard move
 * (reshard_move.c) and a fold of the streamed writes:
 *
 *   plan      tsr__txn_plan: the next snapshot and each group's work (upd_plan.h);
 *   stage     tsr__txn_stage: Stage chunks of newv to every replica not left out;
 *   prepare   tsr__txn_prepare: Prepare(newv), every group must be ready;
 *   catch-up  tsr__txn_catch_up: a move's or fold's streamed rounds carried to newv;
 *   flip      tsr__txn_flip: the coordinator's v(newv) and CURRENT (the commit point,
 *             fenced by the leader term with --etcd), then the publication;
 *   commit    tsr__txn_commit: Commit(newv) to every replica (reconcile fixes a miss);
 *   cleanup   tsr__txn_cleanup: a failure before the flip aborts newv everywhere.
 *
 * tsr__txn_run drives them in that order for a planner (tsr__txn_planner: its plan and
 * a few hooks): UpdateIndex and the fold (update.c), AddShardGroup / RemoveShardGroup
 * (reshard_move.c). It runs on the update thread, which holds update_mu throughout; the
 * engine freezes the stream (stream.h) where the planner's kind says. The operation's
 * progress is written under op_mu (ops.h).
 * Also the operation helpers the planners share (tsr__op_begin and tsr__op_launch to start
 * one on the update thread, tsr__op_set, tsr__op_finish) and the all-replica fan-out with
 * update_min_replicas (tsr__txn_fan).
 */
#ifndef TSR_COORD_TXN_H
#define TSR_COORD_TXN_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"

/* The steps tsr__txn_run times: start, planned (and frozen), staged (chunk 0 of a move),
 * prepared (and frozen again), caught up, flipped, committed. */
enum { TSR__TXN_T_START, TSR__TXN_T_PLANNED, TSR__TXN_T_STAGED, TSR__TXN_T_PREPARED,
       TSR__TXN_T_CAUGHT, TSR__TXN_T_FLIPPED, TSR__TXN_T_COMMITTED, TSR__TXN_NT };

/* One new version between its phases. */
typedef struct tsr__txn {
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
    /* set by tsr__txn_run (tsr_clock_mono_ms), for the planners' log lines */
    int64_t t[TSR__TXN_NT];     /* the ends of its steps (TSR__TXN_T_*) */
    int64_t t_refrozen;         /* when the stream froze again for the catch-up (0: never) */
    int64_t t_thawed;           /* when the stream thawed at the end */
} tsr__txn;

/* What tsr__txn_stage sends: every chunk (an update), or a move's chunk 0 alone (no record:
 * the lists, the template of a fresh group, base_stream_seq, capture_delta) then its
 * records from chunk 1. */
enum { TSR__STAGE_ALL, TSR__STAGE_HEAD, TSR__STAGE_REST };

void tsr__op_set(tsr__coord *c, tsr__op *op, int state);

/* Ends the operation; code is the TSR error code of a failure (for the metrics). */
void tsr__op_finish(tsr__coord *c, tsr__op *op, int state, const char *error, int64_t version,
                    int code);

/* A new operation for the update thread, with op_mu held and the coordinator neither busy
 * nor closing: joins the previous update thread (finished, as busy is 0), adds a PENDING
 * operation whose batch_root is what to the kept table (forgetting the oldest when it is
 * full) and marks the coordinator busy. The caller sets its own fields of the operation,
 * then calls tsr__op_launch. */
tsr__op *tsr__op_begin(tsr__coord *c, const char *what);

/* Writes op's record (accepted = on disk; a failure is logged as "<kind> <id>: ...") and
 * runs fn(arg) on the update thread; op_mu held. -1 when the thread cannot start: op is
 * FAILED, the coordinator no longer busy, and arg is still the caller's to free. */
int tsr__op_launch(tsr__coord *c, tsr__op *op, const char *kind, void *(*fn)(void *),
                   void *arg);

/* Fan-out of one packed request per shard group (bufs[s] NULL = skip s) to every replica
 * of the group. Returns the number of failed replica calls; the first failure's message
 * goes into err. resps (when set) has one entry per replica (c->nrep). */
size_t tsr__txn_fan(tsr__coord *c, const char *method, uint8_t **bufs, size_t *lens,
                    const char *skip, int64_t timeout_ms, const ProtobufCMessageDescriptor *rdesc,
                    ProtobufCMessage **resps, tsr_error *err);

/* The planning phase (update_plan.c). overlay: the base is the committed version plus the
 * streamed writes on it (stream lock held); else the committed version alone (a fold with
 * a catch-up, whose directory gets the overlay at its catch-up). */
int tsr__txn_plan(tsr__txn *u, int overlay, tsr_error *err);

/* STAGING: the chunks of newv (part: all, or a move's chunk 0 / the rest) to every replica
 * not left out, one fan-out per round. */
int tsr__txn_stage(tsr__txn *u, int part, tsr_error *err);

/* PREPARING: every replica not left out must be ready (or be left out, within
 * update_min_replicas); then the ones left out are aborted. */
int tsr__txn_prepare(tsr__txn *u, tsr_error *err);

/* The commit point: the coordinator's v(newv) on disk, CURRENT flipped, the snapshot
 * published. Past a success newv is never aborted. */
int tsr__txn_flip(tsr__txn *u, tsr_error *err);

/* COMMITTING: Commit(newv) to every replica not left out (one that misses it is fixed by
 * reconcile), then the delayed Release and the removal of old stored versions (the
 * previous one stays as a fallback). Nothing here fails the update. */
void tsr__txn_commit(tsr__txn *u);

/* Cleanup: a failure after staging began aborts newv on every shard (N stays served). */
void tsr__txn_cleanup(tsr__txn *u, int rc);

/* The catch-up of a fold or a move (stream lock held, after Prepare): the rounds logged
 * since its chunk 0 (seq0) carried to newv by its plan, the next version's directory
 * made the served one with every streamed write (a fold: its plan's copy of the served
 * directory gets the overlay, O(overlay); a move: rebuilt, every id routed by the new
 * plan), and the groups' last seqs of newv noted for the flip (gseq: the staged ones on
 * entry, newv's on return; the served version keeps its own until the flip). */
int tsr__txn_catch_up(tsr__txn *u, int64_t seq0, int64_t off0, int64_t *gseq, tsr_error *err);



/* A planner: what one kind of version change adds to the transaction (update.c: an
 * UpdateIndex or a fold; reshard_move.c: a move). tsr__txn_run calls its hooks in order;
 * ud is passed to each. */
typedef struct tsr__txn_planner {
    /* 1: the plan runs with the stream frozen (an update with records, a move); 0: before
     * it (a fold: it plans on the served version, the overlay joins at its catch-up) */
    int plan_frozen;
    /* 1: Stage sends chunk 0 alone with the stream frozen, then fill (stream thawed), then
     * the rest (a move); 0: every chunk in one go */
    int split_stage;
    /* u->base and u->newv are set: fill u->p (and u->b). Returns 0 or an error code. */
    int (*plan)(tsr__txn *u, void *ud, tsr_error *err);
    /* optional, after chunk 0 with the stream thawed: the records of the rest (a move's
     * read of the moved records). */
    int (*fill)(tsr__txn *u, void *ud, tsr_error *err);
    /* optional, after a successful Prepare of a catch-up, the stream thawed (a fold copies
     * the overlay into its directory). */
    void (*prepared)(tsr__txn *u, void *ud);
    /* optional, after a successful catch-up, before the flip (the stream frozen). */
    void (*caught_up)(tsr__txn *u, void *ud);
    /* optional, the stream frozen, after the commit (rc 0) or a failure (rc set), before the
     * cleanup aborts what a failure staged. */
    void (*finish)(tsr__txn *u, void *ud, int rc);
    void *ud;
} tsr__txn_planner;

/* The version transaction, driven by pl: freeze the stream (before or after the plan, as
 * pl says), take the served snapshot as the base (u->base, u->newv = its version + 1),
 * plan, stage, for a catch-up (u->catchup) thaw while Stage's rest and Prepare run and
 * freeze again for the catch-up, then flip (the commit point) and commit; any failure
 * before the flip aborts newv (tsr__txn_cleanup). Holds update_mu's caller's word that no
 * other version change runs. On return the stream is thawed and the base retired. u: c,
 * op, fresh, catchup, reshard and term set, the rest zero. Returns 0 (*version = newv) or
 * an error code with err set. */
int tsr__txn_run(tsr__txn *u, const tsr__txn_planner *pl, int64_t *version, tsr_error *err);

#endif
