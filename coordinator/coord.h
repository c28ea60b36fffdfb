/*
 * coord — the coordinator handle (tsr__coord) and the map of its subsystems.
 *
 * Each subsystem has its own header: purpose, what it owns, its locks. The lock order of
 * all of them is the table in docs/architecture.md ("The coordinator's subsystems").
 *
 *   coord_config.h  the config and the shard groups' addresses (config.c)
 *   snap.h       the served snapshot and the id directory (state.c)
 *   upd_plan.h   an update's shard-free half (update_plan.c)
 *   ops.h        operations and their log (oplog.c)
 *   groups.h     shard groups: replicas, channels, health, fan-out, coalescing
 *   slog.h       the coordinator log's files and their etcd mirror
 *   stream.h     streamed writes: queue, writer, overlay, catch-up
 *   leader.h     leadership: election, term, refusing writes on a follower, read index
 *   update.h     new versions: update, fold, reshard moves, reconcile
 *   query.h      the read path shared by the front ends
 *   frontend/    the RPC handlers (tessera.v1, Vertex container.v1, aiplatform.v1),
 *                adapters over the subsystems (frontend/frontend.h)
 *
 * Files (by subsystem):
 *
 *   config.c     the JSON config (jansson), defaults, validation; the test hooks
 *   state.c      snapshots: template, partition plan, id directory, their on-disk form
 *                (common/store/store), the plan builders; the served snapshot; the leader
 *                accessors (leading, term, refusing a follower's writes)
 *   stream_dir.c the overlay's application to a directory (an update's base view, a fold)
 *   update_plan.c  an update's shard-free half: template, assignment, plan, directory,
 *                per-group work
 *   txn.c        the version transaction engine (tsr__txn_run): stage, prepare, catch-up,
 *                flip, commit, abort, driven by a planner (txn.h)
 *   update.c     UpdateIndex and the background fold, planners on txn.c
 *   reshard_move.c  AddShardGroup / RemoveShardGroup moves, planners on txn.c
 *   reshard.c    a move's plan: the balance rule, the moved records read from old owners
 *   reshard_carry.c  a move's catch-up: the rounds streamed during it, re-routed by the
 *                new plan, written to the prepared new version before the flip
 *   oplog.c      operations: their records on disk or in etcd, free, to protobuf, lookup
 *   query.c      FindNeighbors: coarse step, fan-out, merge (blocking and async forms);
 *                errors are tsr_error, mapped to a gRPC status by the front ends
 *   query_read.c ReadIndexDatapoints
 *   query_ns.c   FindNeighbors' warnings about restrict namespaces no datapoint uses
 *   arena.c      one request's allocations, freed together
 *   stream.c     the streamed writes' overlay, the version log's header, publication
 *   stream_write.c  the write queue and the writer thread's rounds
 *   stream_recover.c  catch-up of replicas, the log's replay at start, adoption, following
 *   stream_log.c the coordinator log's files: naming, its records on store/applog
 *   stream_ha.c  with --etcd: the coordinator log mirrored in etcd, restored by a new leader
 *   reconcile.c  shard reconciliation to the coordinator's CURRENT, delayed Release
 *   replica.c    shard groups of R replicas: channels, health, balancing, failover,
 *                all-replica fan-outs; the coordinator's /metrics collector
 *   coalesce.c   concurrent FindNeighbors share shard calls
 *   meta.c       the metadata backend: local folder or etcd (PREFIX/version, the version's
 *                files in chunks); the commit point of an update with --etcd (meta.h)
 *   dirshard.c   the id directory rebuilt from the shards (Shard.List; dirshard.h)
 *   leader.c     with --etcd: lease, member key, election of the leader, stepping down,
 *                following PREFIX/version and the mirrored stream (followers)
 *   readidx.c    a follower's read index (read-your-writes on every coordinator)
 *   frontend/    tessera_v1.c (tessera.v1 Coordinator), vertex.c (Vertex private
 *                MatchService), vertex_v1.c / vertex_v1_index.c (aiplatform.v1)
 *   main.c       command line, server, signals
 *
 * Calls run one way (tests/tools/callgraph.py coordinator derives this from the objects and
 * fails on a loop; `make check-layers` prints nothing when it holds). Bottom-up: arena,
 * config, state, stream_log call no other file of the folder; replica -> config, state;
 * coalesce -> replica; dirshard -> config, replica, state; meta -> dirshard;
 * oplog -> meta; stream_ha -> config, meta, state, stream_log;
 * stream -> state, stream_ha, stream_log; stream_recover -> stream and below;
 * stream_write -> stream, stream_recover, replica, update_plan and below;
 * leader -> dirshard, meta, oplog, replica, state, stream, stream_recover;
 * reconcile -> replica, state, stream, stream_dir, stream_recover;
 * reshard, reshard_carry -> replica, state, stream, stream_log, update_plan;
 * txn -> leader, meta, oplog, reconcile, replica, reshard, reshard_carry, state, stream,
 * stream_dir, update_plan; update, reshard_move -> txn and below;
 * query, query_read -> arena, coalesce, query_ns, readidx, replica, state, stream;
 * main -> all of them, and nothing calls main.c. frontend/ calls into the folder and
 * nothing in it calls frontend/ but main.c. Everything but main.c is libtsr_coord.a
 * (mk/coordinator.mk), which the test_coord_* unit tests link.
 *
 * DESIGN (threads): queries run on the rpc worker pool (TSR_RPC_LONG) and read one
 * refcounted, immutable tsr__snap taken with tsr__coord_snap_get (snap_mu is held only to
 * copy the pointer and bump the count). The update thread (one at a time, `busy` under
 * op_mu) builds the next snapshot and publishes it after the commit point
 * (tsr__stream_publish swaps it in), then frees the one it replaced itself once the
 * queries planned on it let go (tsr__snap_retire), so no query pays for that free. The
 * reconcile thread talks to shards only through RPCs and takes
 * update_mu (the same lock an update holds while it runs) so it never aborts a version an
 * update is staging. Streamed writes (stream.c): one writer thread runs rounds under the
 * stream lock st.mu, which an update also holds from its plan through its Commit fan-out
 * (a reshard move: its plan and Stage chunk 0, then its catch-up through its Commit
 * fan-out; docs/resharding.md "Writes during a move") and a catch-up holds while it
 * resends; the overlay is read under st.ov_rw (read) with
 * the snapshot taken inside it. Lock order: update_mu, then st.mu, then op_mu, then
 * st.ov_rw, then snap_mu; st.q_mu (the write queue) is never held with another lock;
 * lead.mu is a leaf (taken last, e.g. under st.mu by stream_ha.c).
 * Replica health
 * (tsr__replica) is plain atomics, written by whoever saw a call's outcome (query
 * threads, the update thread, reconcile) and read without a lock: a stale value only
 * makes one query try a dead replica first and fail over.
 */
#ifndef TSR_COORD_H
#define TSR_COORD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "net/rpc.h"
#include "store/store.h"

#include "coord_config.h"
#include "snap.h"
#include "upd_plan.h"
#include "ops.h"
#include "groups.h"
#include "slog.h"
#include "stream.h"
#include "leader.h"
#include "update.h"
#include "query.h"

/* ---- the coordinator --------------------------------------------------------------- */
typedef struct tsr__coord {
    tsr__coord_config cfg;
    tsr_store *store;
    tsr__replica *rep;          /* owned; every replica of every group (group-major) */
    size_t nrep;
    tsr__group *grp;            /* owned; cfg.nshards groups (room for
                                   TSR_COORD_MAX_SHARDS: AddShardGroup appends) */
    tsr__coalescer *co;         /* owned; one per group slot (TSR_COORD_MAX_SHARDS) */
    _Atomic(tsr_rpc_server *) srv; /* the coordinator's server, set by main before it starts
                                   (borrowed; NULL: no coalescing, e.g. fuzz harnesses) */
    tsr_rpc_client_opts shard_opts; /* how channels to shards are made (strings borrowed
                                   from main) */
    int no_channels;            /* the fuzz harnesses only (never set by the server):
                                   replicas get no channel, every shard call fails at once
                                   as UNAVAILABLE, also for a group AddShardGroup appends
                                   (no connection to, or DNS lookup of, a fuzzed address) */
    const char *template_path;  /* borrowed (argv); used when no version exists */

    pthread_mutex_t snap_mu;
    tsr__snap *snap;            /* owned ref; swapped by an update */

    pthread_mutex_t update_mu;  /* held by an update while it runs, and by reconcile */
    pthread_mutex_t op_mu;      /* ops table and busy */
    tsr__op **ops;
    size_t nops;
    int busy;
    int closing;                /* under op_mu: no new update */
    uint64_t op_seq;
    pthread_t upd_thread;
    int upd_thread_live;
    pthread_t fold_thread;      /* update.c: starts background folds (streamed writes) */
    int fold_live;

    /* reconcile */
    pthread_t rec_thread;
    pthread_mutex_t rec_mu;
    pthread_cond_t rec_cv;
    int stopping;
    int64_t release_at_ms;      /* when to send Release(below = version), on
                                   tsr_clock_mono_ms; 0 = none */
    uint64_t release_below;

    /* Vertex MatchService: the one accepted deployed_index_id (borrowed, argv); NULL =
     * accept any */
    const char *deployed_index_id;

    /* --batch-root-allow: resolved folders (owned by main); a batch_root must resolve inside
     * one (tsr_batch_confine). None = no UpdateIndex is accepted. */
    const char *const *batch_allow;
    size_t nbatch_allow;

    /* metrics */
    atomic_llong queries, shards_touched, lists_probed;

    tsr__stream *st;            /* owned: streamed writes (stream.h; tsr__stream_init creates
                                   it, tsr__stream_close frees it) */

    /* --etcd (meta.h, leader.c): NULL = the local folder backend, always the leader */
    struct tsr__meta *meta;     /* owned */
    tsr__lead lead;
    /* readidx.c: a follower's read index (one etcd read shared by the queries that
     * arrived before it started; all under ri_mu, a leaf lock) */
    pthread_mutex_t ri_mu;
    pthread_cond_t ri_cv;
    int64_t ri_started, ri_done; /* reads started / finished (numbered from 1) */
    int ri_inflight, ri_rc;      /* a read in flight; the last read's outcome (TSR code) */
    uint64_t ri_version;         /* the last read: PREFIX/version and its newest round */
    int64_t ri_seq;
    char ri_msg[256];            /* the last read's error */
} tsr__coord;

/* 1 when replica slot k belongs to a removed group (RemoveShardGroup): loops over every
 * replica slot (reconcile, catch-up, the update's bookkeeping) skip it. */
static inline int tsr__replica_removed(const tsr__coord *c, size_t k)
{
    return c->grp[c->rep[k].group].n == 0;
}

#endif
