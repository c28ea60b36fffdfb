/*
 * coord — internals shared by the files of tessera-coordinator (tsr__coord_* names).
 *
 *   config.c     the JSON config (jansson), defaults, validation
 *   state.c      immutable version snapshots: template, partition plan, id directory;
 *                their on-disk form (common/store/store) and the plan builders
 *   update_plan.c  an update's shard-free half: template, assignment, plan, directory,
 *                per-group work
 *   update.c     UpdateIndex: background two-phase update (its shard phases), GetOperation;
 *                AddShardGroup / RemoveShardGroup run the same phases (docs/resharding.md)
 *   reshard.c    a move's plan: the balance rule, the moved records read from old owners
 *   reshard_carry.c  a move's catch-up: the rounds streamed during it, re-routed by the
 *                new plan, written to the prepared new version before the flip
 *   oplog.c      operations: their records on disk (survive a restart), free, to protobuf
 *   query.c      FindNeighbors, ReadIndexDatapoints, GetIndexStats (fan-out + merge);
 *                errors are tsr_error, mapped to a gRPC status in the handlers only
 *   vertex.c     the Vertex MatchService front end on the query path
 *                (google.cloud.aiplatform.container.v1, private endpoints)
 *   vertex_v1.c  google.cloud.aiplatform.v1.MatchService (the official clients' API) on
 *                the query path; IndexService's other methods answer UNIMPLEMENTED
 *   vertex_v1_index.c  google.cloud.aiplatform.v1.IndexService GetIndex, UpdateIndex and
 *                google.longrunning.Operations/GetOperation on the update path;
 *                UpsertDatapoints and RemoveDatapoints on the streamed-write path
 *   stream.c     streamed writes (UpsertDatapoints, RemoveDatapoints): validation, the
 *                queue, the writer thread's rounds, the overlay directory, catch-up of
 *                replicas that missed writes, the hooks of updates (docs/streaming.md)
 *   stream_log.c the coordinator log's files: framing, append + fsync, scan
 *   reconcile.c  shard reconciliation to the coordinator's CURRENT, delayed Release
 *   replica.c    shard groups of R replicas: channels, health, balancing, failover,
 *                all-replica fan-outs; the coordinator's /metrics collector
 *   meta.c       the metadata backend: local folder or etcd (PREFIX/version, the version's
 *                files in chunks); the commit point of an update with --etcd (meta.h)
 *   leader.c     with --etcd: lease, member key, election of the leader, stepping down,
 *                following PREFIX/version and the mirrored stream (followers)
 *   stream_ha.c  with --etcd: the coordinator log mirrored in etcd, restored by a new leader
 *   main.c       command line, server, signals
 *
 * Calls run one way (tests/tools/callgraph.py coordinator derives this from the objects and
 * fails on a loop): config, meta, state, stream_log call no other file of the folder;
 * oplog -> meta; leader -> meta, oplog, replica, state, stream;
 * replica -> config, state; stream -> replica, state, stream_ha, stream_log, update_plan;
 * stream_ha -> meta, state, stream_log; reconcile -> replica, state, stream;
 * query -> config, leader, replica, state, stream; update_plan -> config, state;
 * update -> leader, meta, oplog, reconcile, replica, reshard, reshard_carry, state, stream,
 * update_plan; reshard -> config, replica, state, stream, update_plan;
 * reshard_carry -> replica, state, stream_log, update_plan;
 * vertex -> query; vertex_v1 -> vertex, query; vertex_v1_index -> config, oplog, update,
 * state, stream, vertex, vertex_v1;
 * main -> all of them, and nothing calls main.c. Everything but main.c is
 * libtsr_coord.a (mk/coordinator.mk), which the test_coord_* unit tests link.
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

#include "batch/batch.h"
#include "core/error.h"
#include "core/testing.h"
#include "index/ivfpq.h"
#include "net/etcd.h"
#include "net/rpc.h"
#include "store/store.h"
#include "tessera/v1/shard.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"

#define TSR_COORD_MAX_SHARDS 256
#define TSR_COORD_MAX_REPLICAS 16
#define TSR_COORD_MAX_CANDIDATES 10000   /* a shard's limit on k and candidates */
#define TSR_COORD_DEFAULT_APPROX 100     /* config approximate_neighbor_count (docs/config.md) */
#define TSR_COORD_DEFAULT_RRF_DEPTH 100  /* config rrf_depth (docs/query-semantics.md) */

enum tsr__distance { TSR_DIST_SQUARED_L2 = 0, TSR_DIST_DOT_PRODUCT, TSR_DIST_COSINE };
enum tsr__plan_kind { TSR_PLAN_BALANCED = 0, TSR_PLAN_LOCALITY };

typedef struct tsr__coord_config {
    int dimensions;
    enum tsr__distance distance;
    int nlist, pq_m, pq_nbits, nprobe;
    _Atomic size_t nshards; /* shard groups (atomic: AddShardGroup grows it while queries,
                               stats and metrics read it) */
    char **shards;          /* owned: "host:port" naming each group (its first replica) */
    size_t *nreplicas;      /* owned: replicas per group (>= 1) */
    char ***replicas;       /* owned: replicas[s][j] = "host:port" of replica j of group s */
    uint8_t *retired;       /* owned: retired[s] = 1: removed by RemoveShardGroup (owns no
                               list, not called); the arrays above have room for
                               TSR_COORD_MAX_SHARDS groups so AddShardGroup never moves them */
    char ***dropped;        /* owned: replica lists of groups drop_groups removed (kept
                               until close: a stats reader may still hold them) */
    size_t *dropped_n;      /* owned: the length of each */
    size_t ndropped;
    int resharded;          /* the groups differ from the config file (a reshard): every
                               version stores them (file "groups") and a restart uses those */
    int replica_attempt_ms; /* per-attempt deadline while another replica is left; 0 = half
                               the query's deadline */
    enum tsr__plan_kind plan;
    int search_deadline_ms, stage_deadline_ms;
    int max_k, max_queries;
    uint64_t seed;
    int stage_chunk;        /* upserts per Stage chunk */
    int update_min_replicas; /* replicas per group an update needs (0 = all); the others are
                                left out of the version and re-seeded by reconcile */
    int default_k;
    int approximate_neighbor_count; /* candidates per shard re-ranked exactly when a query
                                       does not set its own; 0 = PQ distances */
    int rrf_depth;          /* depth of the dense and of the sparse list of a hybrid (RRF)
                               query: max(k, rrf_depth), independent of k below it */
    int stream_fold_records; /* overlay size that starts a background fold (0 = never) */
    int stream_write_deadline_ms; /* one Shard.Write of a streamed round */
    int coalesce_inflight;  /* Search calls per replica of a group in flight before further
                               FindNeighbors queue and share one call (coalesce.c); 0 = off */
    int fold_prepare_parallel; /* replicas a fold's Prepare builds at once (0 = all) */
    int fold_build_cpu_percent; /* share of a core a fold's build may use (100 = unpaced) */
} tsr__coord_config;

/* Parses the config file. Returns 0 or TSR_EINVAL/TSR_EIO with err naming the key. */
int tsr__coord_config_load(const char *path, tsr__coord_config *cfg, tsr_error *err);
void tsr__coord_config_close(tsr__coord_config *cfg);
const char *tsr__distance_name(enum tsr__distance d);
/* Resharding (docs/resharding.md). add_group: appends a group of n replicas (addresses
 * copied; checked like the config's; TSR_EINVAL naming the problem). groups_text: the
 * groups as the text of a version's "groups" file, group also_retired (-1: none) written
 * as retired too (new, *len bytes; caller frees).
 * set_groups: replaces the groups by those of such a text (before any thread reads them;
 * TSR_EFORMAT naming the line); parse_groups: such a text into out's group arrays only
 * (close out with tsr__coord_config_close). */
int tsr__coord_config_add_group(tsr__coord_config *cfg, const char *const *addr, size_t n,
                                tsr_error *err);
char *tsr__coord_config_groups_text(const tsr__coord_config *cfg, int also_retired,
                                    size_t *len);
int tsr__coord_config_set_groups(tsr__coord_config *cfg, const char *text, size_t len,
                                 tsr_error *err);
int tsr__coord_config_parse_groups(const char *text, size_t len, tsr__coord_config *out,
                                   tsr_error *err);
/* Drops the groups keep .. nshards-1 (retired ones: failed adds never committed, see
 * tsr__coord_groups_follow): nshards becomes keep; their lists are freed at close. */
void tsr__coord_config_drop_groups(tsr__coord_config *cfg, size_t keep);

/* ---- directory: string id -> (label, list, shard) ------------------------------------ */
typedef struct tsr__dir_entry {
    char *id;        /* owned by the directory */
    int64_t label;
    int32_t list;    /* -1 = sparse-only */
    int32_t shard;
    uint8_t dense, sparse;
    uint8_t dead;    /* stream overlay only: a tombstone (the id was removed) */
} tsr__dir_entry;

typedef struct tsr__dir {
    tsr__dir_entry *e;   /* owned; entries (unordered), deleted ones removed by rebuild */
    size_t n, cap;
    uint32_t *slot;      /* open addressing: index+1 into e, 0 = empty */
    size_t mask;
} tsr__dir;

void tsr__dir_init(tsr__dir *d);
void tsr__dir_close(tsr__dir *d);
/* Entry of id or NULL (borrowed). */
const tsr__dir_entry *tsr__dir_find(const tsr__dir *d, const char *id);
/* Adds an entry (id copied); the id must not be present. */
void tsr__dir_add(tsr__dir *d, const char *id, int64_t label, int32_t list, int32_t shard,
                  int dense, int sparse);
/* Adds the entry or, when id is present, overwrites its fields (the overlay's upsert);
 * returns it (valid until the next add). */
tsr__dir_entry *tsr__dir_set(tsr__dir *d, const char *id, int64_t label, int32_t list, int32_t shard,
                  int dense, int sparse, int dead);
/* Removes id's entry (the last entry takes its place: entries are unordered); 1 when it
 * was there, else 0. O(1) expected: no tombstone, the probe run is shifted back. */
int tsr__dir_remove(tsr__dir *d, const char *id);
uint64_t tsr__hash_str(const char *s);

/* ---- snapshot ---------------------------------------------------------------------- */
typedef struct tsr__snap {
    atomic_int refs;
    uint64_t version;        /* 0 = no index yet */
    tsr_ivfpq *tmpl;         /* owned; trained, no vectors; NULL at version 0 */
    uint8_t *tmpl_bytes;     /* owned; template.faiss bytes */
    size_t tmpl_len;
    float *cent_norms;       /* owned; ||c||^2 per list (L2 coarse step) */
    int32_t *plan;           /* owned; nlist entries: list -> shard */
    enum tsr__plan_kind plan_kind;
    tsr__dir dir;
    int64_t next_label;
    int64_t ndense, nsparse;
    char *groups;            /* owned; the shard groups (config groups_text) stored with the
                                version after a reshard (file "groups"); NULL = the config's */
    size_t groups_len;
    size_t ngroups;          /* shard groups at this version (its plan and directory name no
                                other); 0 = the config's count (tsr__snap_groups) */
    uint8_t retired[TSR_COORD_MAX_SHARDS]; /* 1: a group RemoveShardGroup removed (owns no
                                list and no sparse-only id) */
} tsr__snap;

tsr__snap *tsr__snap_create(void);
/* The shard groups of s's version: the bound of every per-group array a reader of s sizes
 * (AddShardGroup grows the config's count while queries on older snapshots still run). */
size_t tsr__snap_groups(const tsr__snap *s, const tsr__coord_config *cfg);
void tsr__snap_unref(tsr__snap *s); /* accepts NULL */
/* Sets tmpl (takes ownership), its bytes, norms. */
int tsr__snap_set_template(tsr__snap *s, tsr_ivfpq *tmpl, tsr_error *err);
/* Writes version s->version into the store (template.faiss, plan, directory, MANIFEST)
 * and does not touch CURRENT. */
int tsr__snap_save(const tsr__snap *s, tsr_store *st, tsr_error *err);
/* Loads a committed version (verified against its MANIFEST). */
int tsr__snap_load(tsr_store *st, uint64_t version, tsr__snap **out, tsr_error *err);
/* Plans list -> shard from list sizes (sizes: nlist counts). */
void tsr__plan_build(enum tsr__plan_kind kind, const tsr_ivfpq *tmpl, const int64_t *sizes,
                     size_t nshards, uint64_t seed, int32_t *plan);

/* ---- update_plan.c: the half of an update that talks to no shard -------------------- */
typedef struct tsr__shard_work {
    size_t *ups;                /* owned; indices into the batch's records */
    size_t nups, cap;
    Tessera__V1__StagedDelete *dels; /* owned */
    size_t ndels, dcap;
} tsr__shard_work;

#define TSR__UPD_UNKNOWN_KEPT 5 /* unknown delete ids an update's warning names */

typedef struct tsr__upd_plan {
    tsr__snap *ns;              /* owned ref: the next snapshot (base version + 1), unsaved */
    tsr__shard_work *w;         /* owned; nshards entries: what each group stages */
    size_t nshards;
    int overwrite;              /* staged on an empty base (complete overwrite, or the first) */
    int64_t nmoved, ndeleted;   /* ids moved between groups; ids deleted */
    int64_t nunknown;           /* delete ids the base version does not hold (ignored) */
    size_t unknown[TSR__UPD_UNKNOWN_KEPT]; /* the first of them: indices into b->deletes */
} tsr__upd_plan;

/* Plans the update of base (borrowed) by batch b (borrowed; for the cosine distance its
 * dense vectors are normalised in place): template, list of each record, plan, directory,
 * and per group the upserts and deletes. overwrite: the request's is_complete_overwrite;
 * tmpl_path: --template (NULL = train from b when there is no index yet). Returns 0 with
 * *p filled (tsr__upd_plan_close it) or an error code with err set (*p closed). */
int tsr__upd_plan_build(const tsr__coord_config *cfg, const char *tmpl_path,
                        const tsr__snap *base, tsr_batch *b, int overwrite, tsr__upd_plan *p,
                        tsr_error *err);
void tsr__upd_plan_close(tsr__upd_plan *p); /* accepts a closed plan */

/* The pieces of the plan the streamed writes reuse (stream.c): the cosine normalisation
 * (in place), the list of each record (-1: no dense vector; threads for the assignment),
 * the group of a list (-1: hash of the id). */
void tsr__normalize(float *v, size_t d);
int tsr__assign_records(const tsr_ivfpq *tmpl, const tsr_datapoint *recs, size_t n, size_t d,
                        int threads, int64_t *assign, tsr_error *err);
int32_t tsr__group_of(const tsr__snap *s, int32_t list, const char *id, size_t nshards);

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

/* The GetOperation answer for op as being in `state` into *o (its progress in *pg, strings
 * borrowed from op; o->report, when set, is new: the caller frees it with
 * tessera__v1__batch_report__free_unpacked). Caller holds op_mu. */
void tsr__op_to_pb(const tsr__op *op, int state, Tessera__V1__Operation *o,
                   Tessera__V1__OperationProgress *pg);

struct tsr__coord;

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

/* ---- replicas ------------------------------------------------------------------------ */
typedef struct tsr__replica {
    size_t group, index;        /* shard group and replica number within it */
    const char *addr;           /* borrowed from the config */
    tsr_rpc_channel *ch;        /* owned */
    atomic_int inflight;        /* query attempts in flight on it (least-outstanding pick) */
    atomic_int fails;           /* consecutive failed calls; 0 after a success */
    atomic_llong retry_at_ms;   /* after a failure: not picked (if another is) before this
                                   (tsr_clock_mono_ms) */
    atomic_int up;              /* last verdict exported to /metrics: -1 unknown, 0, 1;
                                   each change 0 <-> 1 is one log line */
    atomic_llong down_at_ms;    /* when up last became 0 (tsr_clock_mono_ms) */
    atomic_int lagging;         /* reconcile: it does not hold the coordinator's version */
    atomic_int stream_behind;   /* it missed a streamed write (a failed Write): not queried
                                   and not written to until reconcile caught it up */
    atomic_llong version;       /* current version from its last Stats, -1 unknown */
    atomic_llong vectors, sparse, lists; /* from its last Stats */
    int64_t resync_at_ms;       /* reconcile thread only: next re-seed attempt (mono) */
} tsr__replica;

typedef struct tsr__group {
    size_t first;
    _Atomic size_t n;             /* replicas first .. first + n - 1 of tsr__coord.rep; n = 0:
                                   a group RemoveShardGroup removed (its replica slots stay,
                                   never called: tsr__replica_removed) */
    atomic_uint next;           /* round-robin cursor for ties */
} tsr__group;

/* ---- stream.c: the state of streamed writes (docs/streaming.md) --------------------- */
struct tsr__sreq;
typedef struct tsr__stream {
    pthread_mutex_t mu;         /* the stream lock: held by a round (writer thread), by an
                                   update from its plan through its Commit fan-out, by a
                                   reshard move for its plan and Stage chunk 0, then from
                                   its catch-up through its Commit fan-out (not while it
                                   reads, stages and prepares), by a catch-up (reconcile) */
    /* under mu */
    int64_t next_label;         /* the label counter (the snapshot's plus the stream's) */
    int64_t next_seq;           /* the seq of the next round (> every seq ever logged) */
    int64_t *grp_seq;           /* owned; nshards: the last seq logged for each group */
    uint64_t log_version;       /* version of the open log file (0: none) */
    int log_fd;                 /* -1: none */
    int64_t log_bytes;          /* its size */
    /* the overlay: written under mu and ov_rw (write), read under ov_rw (read) */
    pthread_rwlock_t ov_rw;
    tsr__dir ov;                /* id -> entry or tombstone, on top of the snapshot's dir */
    uint64_t ov_version;        /* the version it applies on */
    int64_t ov_records;         /* streamed writes since that version (fold threshold) */
    int64_t d_dense, d_sparse;  /* change of the snapshot's counts */
    size_t *touched;            /* owned; the index in ov of the entry each write set, in
                                   order (a fold's catch-up re-applies the ones after its
                                   mark: tsr__stream_overlay_finish) */
    size_t ntouched, ctouched;
    /* the queue of requests: under q_mu */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv, done_cv;
    struct tsr__sreq *head, *tail;
    int stop, started;
    pthread_t thread;
} tsr__stream;

/* ---- leader.c: the election on etcd (docs/coordinator.md "Leader") ------------------- */
typedef struct tsr__lead {
    const char *advertise;      /* borrowed (main): how clients and peers reach this one */
    int ttl_s;                  /* --etcd-ttl */
    atomic_int leading;         /* 1 while this coordinator holds the leader key */
    atomic_llong term;          /* the leader key's create revision while leading, else 0 */
    atomic_llong lease;         /* our lease (0: none) */
    pthread_mutex_t mu;         /* addr, cv */
    char addr[256];             /* under mu: the leader's advertise address ("" = none) */
    char etcd_err[256];         /* under mu: why the last lease call failed ("" = it did not) */
    char members[32][128];      /* under mu: PREFIX/members/ as last read (GetIndexStats) */
    size_t nmembers;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC: the thread's sleep; stop and kick wake it */
    int stop, live, wlive;      /* under mu */
    int kick;                   /* under mu: the watcher saw PREFIX/leader change: campaign now */
    atomic_int lwatch;          /* 1 while the watch on PREFIX/leader is up (the election's
                                   poll is then only a slow safety net) */
    atomic_int readopt;         /* 1: etcd's streamed rounds must be read again before the
                                   next round (a round etcd refused or left in doubt, set by
                                   stream_ha.c; or the adoption at election failed): the
                                   lease thread adopts them while leading, until it works */
    int adopted;                /* watcher thread only: etcd's rounds replaced the local
                                   log once since the start (watch_caught_up) */
    int compact_s;              /* --etcd-compact: the leader compacts etcd's history every
                                   compact_s seconds (0 = never) */
    pthread_t thread, wthread;  /* the lease/election thread; the watcher (PREFIX/version,
                                   PREFIX/stream/, PREFIX/leader on one stream) */
    pthread_mutex_t follow_mu;  /* serializes moving the snapshot (both threads) */
    uint64_t follow_failed_v;   /* under follow_mu: the version whose load last failed, */
    int64_t follow_retry_ms;    /* not tried again before this (tsr_clock_mono_ms) */
    int64_t follow_backoff_ms;  /* 100 ms doubling to 2 s while it keeps failing */
    /* under mu: groups a followed version removed, whose replicas are cut once the queries
     * planned before it drained (retire_at_ms, tsr_clock_mono_ms; 0 = none pending) */
    uint8_t retire[TSR_COORD_MAX_SHARDS];
    int64_t retire_at_ms;
} tsr__lead;

/* ---- coalesce.c: concurrent FindNeighbors share shard calls ------------------------- */
/* One FindNeighbors request's call to one group, as the coalescer sees it. */
typedef struct tsr__centry tsr__centry;
struct tsr__centry {
    struct tsr__gcall *call; /* group, req, len, demand in; result, replica, attempts out */
    size_t nq;         /* ShardQuery messages in call->req */
    int64_t deadline;  /* tsr_clock_mono_ms */
    void (*done)(void *ud, struct tsr__gcall *call); /* once, on a polling thread (or in
                                                        submit when nothing could be sent) */
    void *ud;
    tsr__centry *next; /* the group's queue (coalesce.c) */
};
typedef struct tsr__coalescer {
    pthread_mutex_t mu;     /* a leaf: guards the two below */
    int inflight;           /* Search calls of the coalescer out to the group */
    tsr__centry *head, *tail; /* requests waiting for a call */
} tsr__coalescer;

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

    tsr__stream st;             /* streamed writes (stream.c) */

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

tsr__snap *tsr__coord_snap_get(tsr__coord *c);          /* new ref; caller unrefs */
/* 1 when replica slot k belongs to a removed group (RemoveShardGroup): loops over every
 * replica slot (reconcile, catch-up, the update's bookkeeping) skip it. */
static inline int tsr__replica_removed(const tsr__coord *c, size_t k)
{
    return c->grp[c->rep[k].group].n == 0;
}
/* state.c: 0 when this coordinator may write (no --etcd, or it is the leader); else the
 * write is refused on r with UNAVAILABLE "not the leader: the leader is ADDR" (or "no
 * leader elected yet") and trailing metadata tessera-leader, and a negative code returned. */
int tsr__coord_refuse_follower(tsr__coord *c, tsr_rpc_reply *r);
/* state.c: the leader term its shard calls carry (Stage, Prepare, Commit, Abort, Release,
 * Write): 0 without --etcd; with it the last term this coordinator won (kept after it
 * stepped down, so shards that saw a newer one refuse it). */
int64_t tsr__coord_term(tsr__coord *c);
/* state.c: 1 when this coordinator runs updates, reconcile and writes. */
int tsr__coord_leading(tsr__coord *c);

/* leader.c: with --etcd, the thread that keeps our lease and member key, campaigns for
 * PREFIX/leader, steps down when the lease is lost (or not renewed within ttl - margin by
 * our own clock), and moves the served snapshot when PREFIX/version changes (followers;
 * a new leader first). start: 0 or a TSR code; stop revokes the lease (leadership passes
 * at once). Both are no-ops without --etcd. */
int tsr__leader_start(tsr__coord *c);
void tsr__leader_stop(tsr__coord *c);
/* The compares that fence the commit transaction (leader key's create revision == our
 * term, its lease == ours) into cmp (2 entries); returns how many (0 without --etcd). */
size_t tsr__leader_fence(tsr__coord *c, tsr_etcd_cmp *cmp);
/* Steps down at once (a fenced commit failed: another leader exists); why is logged. */
void tsr__leader_lost(tsr__coord *c, const char *why);
/* The live coordinators (PREFIX/members/<addr>, as the leader thread last read them: no
 * etcd call) into *addrs (caller frees each and the array), *n; the leader's address into
 * leader (cap bytes, "" = none). Without --etcd: none and "". */
void tsr__leader_members(tsr__coord *c, char ***addrs, size_t *n, char *leader, size_t cap);
/* Before an update starts (fail fast): 0 without --etcd, or when this coordinator leads and
 * etcd confirms its leader key; else the refusal is set on r (UNAVAILABLE "etcd
 * unreachable ..." or "not the leader: ...") and a negative code returned. */
int tsr__leader_check(tsr__coord *c, tsr_rpc_reply *r);

void tsr__coord_snap_set(tsr__coord *c, tsr__snap *s);  /* takes s's reference */
/* The same, returning the snapshot it replaced with the served reference (the caller
 * drops it, e.g. with tsr__snap_retire). */
tsr__snap *tsr__coord_snap_swap(tsr__coord *c, tsr__snap *s);
/* Drops the caller's reference to a snapshot no longer served, freeing it on the CALLING
 * thread once the queries planned on it let go (polled every ms for up to wait_ms; past
 * that, the last of them frees it; 0 = a plain unref). A snapshot of 1M ids is ~1M
 * strings: freed by the query that held it last, that query waited tens of ms at every
 * commit point. An update retires its base after releasing the stream lock (update.c): a
 * success replaced it; a failure's base is still served (wait 0). */
#define TSR__SNAP_RETIRE_MS 200
void tsr__snap_retire(tsr__snap *s, int64_t wait_ms);

/* update.c: starts the update of batch_root (confined by --batch-root-allow) on its
 * thread, as tessera.v1 UpdateIndex does. Returns 0 with the new operation's id copied into
 * id (cap bytes), or a negative code with the error set on r (INVALID_ARGUMENT,
 * PERMISSION_DENIED, FAILED_PRECONDITION while another update runs). */
int tsr__coord_update_start(tsr__coord *c, const char *batch_root, int overwrite,
                            int32_t max_invalid, char *id, size_t cap, tsr_rpc_reply *r);
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

/* The background fold (update.c): a thread that starts an update with no records (batch_root
 * "(stream fold)") when the stream's overlay passes stream_fold_records and no update runs.
 * stop: after `closing` is set (it ends within 200 ms); accepts a fold never started. */
int tsr__coord_fold_start(tsr__coord *c);
void tsr__coord_fold_stop(tsr__coord *c);
/* The kept operation with that id, or NULL (id may be NULL). Caller holds op_mu. */
tsr__op *tsr__coord_op_find(tsr__coord *c, const char *id);

/* Handlers (rpc.h signature) */
int tsr__coord_rpc_find_neighbors(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_read(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_stats(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_update(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_get_operation(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
/* update.c: tessera.v1 AddShardGroup / RemoveShardGroup (docs/resharding.md): start a move
 * on the update thread (leader only, one operation at a time). */
int tsr__coord_rpc_add_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_remove_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);

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
/* stream.c: tessera.v1 UpsertDatapoints / RemoveDatapoints (TSR_RPC_LONG, role admin). */
int tsr__coord_rpc_upsert(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__coord_rpc_remove(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);

/* The one mapping of the query path's errors to a gRPC status (err->code; 0 counts as
 * INTERNAL), used by the RPC handlers only: status_of gives the code, reply_error sends
 * it with err->msg. */
int tsr__coord_status_of(const tsr_error *err);
int tsr__coord_reply_error(tsr_rpc_reply *r, const tsr_error *err);

/* The query path, reusable by other front ends (Vertex MatchService): answers rq (borrowed)
 * within remaining_ms. On success *out is a new response (caller frees with
 * tsr__coord_response_free). On failure returns a negative TSR code with err set (a
 * front end maps it with tsr__coord_status_of). */
int tsr__coord_find_neighbors(tsr__coord *c, const Tessera__V1__FindNeighborsRequest *rq,
                              int64_t remaining_ms, Tessera__V1__FindNeighborsResponse **out,
                              tsr_error *err);
void tsr__coord_response_free(Tessera__V1__FindNeighborsResponse *r);

/* ReadIndexDatapoints, reusable likewise (Vertex BatchGetEmbeddings and embedding_id): the
 * stored datapoints of ids (borrowed) on one snapshot, within remaining_ms. On success *out
 * is a new response (found ids in request order, unknown ids omitted; caller frees with
 * tsr__coord_read_free). On failure a negative TSR code with err set. */
int tsr__coord_read(tsr__coord *c, char *const *ids, size_t n_ids, int64_t remaining_ms,
                    Tessera__V1__ReadIndexDatapointsResponse **out, tsr_error *err);
void tsr__coord_read_free(Tessera__V1__ReadIndexDatapointsResponse *r);

/* vertex.c: google.cloud.aiplatform.container.v1.MatchService (docs/vertex-compat.md);
 * register with TSR_RPC_LONG. */
#define TSR_VERTEX_SVC "/google.cloud.aiplatform.container.v1.MatchService/"
int tsr__vertex_rpc_match(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__vertex_rpc_batch_match(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__vertex_rpc_batch_get_embeddings(void *ctx, const uint8_t *req, size_t len,
                                         tsr_rpc_reply *r);
/* The int64 crowding_attribute Vertex reports for a Tessera crowding tag (borrowed; NULL or
 * "" = no tag = 0): the number itself when the tag is a canonical decimal int64, else
 * FNV-1a 64 of the tag's bytes with the top bit cleared (docs/vertex-compat.md). */
int64_t tsr__vertex_crowding_attribute(const char *tag);
/* 1 when s is the resource name "projects/P/locations/L/<kind>X" with non-empty segments
 * and nothing after X; kind is e.g. "indexEndpoints/" or "indexes/". */
int tsr__vertex_resource_ok(const char *s, const char *kind);
/* 0 when the deployed_index_id id (borrowed; NULL or "" = any) is served here: always
 * without --deployed-index-id, else only that id. Otherwise TSR_ENOTFOUND with err naming
 * the field, prefixed by where ("" or e.g. "requests[2]: "). */
int tsr__vertex_check_index(const tsr__coord *c, const char *id, const char *where,
                            tsr_error *err);

/* vertex_v1.c: google.cloud.aiplatform.v1.MatchService (docs/vertex-compat.md); register
 * with TSR_RPC_LONG. The unimplemented handler takes the method's full name (static
 * storage) as ctx and answers UNIMPLEMENTED saying what Tessera serves instead. */
#define TSR_VERTEX_V1_SVC "/google.cloud.aiplatform.v1.MatchService/"
#define TSR_VERTEX_V1_INDEX_SVC "/google.cloud.aiplatform.v1.IndexService/"
int tsr__vertex_v1_rpc_find_neighbors(void *ctx, const uint8_t *req, size_t len,
                                      tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_read(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_unimplemented(void *ctx, const uint8_t *req, size_t len,
                                     tsr_rpc_reply *r);
/* The allocations of one v1 -> tessera.v1 translation (free with tsr__vertex_v1_pool_free;
 * start zeroed). */
typedef struct tsr__v1_pool {
    void **p;
    size_t n, cap;
} tsr__v1_pool;
void tsr__vertex_v1_pool_free(tsr__v1_pool *a);
/* The tessera.v1 IndexDatapoint for the v1 one g (same fields and numbers): it borrows every
 * string, array and the embedding_metadata of g (which must outlive it); its structs are
 * a's. Used for queries and for UpsertDatapoints' datapoints. */
struct Google__Cloud__Aiplatform__V1__IndexDatapoint;
Tessera__V1__IndexDatapoint *tsr__vertex_v1_dp_to_tessera(
    tsr__v1_pool *a, const struct Google__Cloud__Aiplatform__V1__IndexDatapoint *g);

/* vertex_v1_index.c: IndexService GetIndex (role query), UpdateIndex (admin) and
 * google.longrunning.Operations/GetOperation (query); no TSR_RPC_LONG needed (they take
 * op_mu briefly and a snapshot reference). UpsertDatapoints and RemoveDatapoints (admin)
 * block on the streamed write (tsr__coord_stream_*): register them with TSR_RPC_LONG. */
#define TSR_LRO_SVC "/google.longrunning.Operations/"
int tsr__vertex_v1_rpc_get_index(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_update_index(void *ctx, const uint8_t *req, size_t len,
                                    tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_get_operation(void *ctx, const uint8_t *req, size_t len,
                                     tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_upsert(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);
int tsr__vertex_v1_rpc_remove(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);

/* Test-only crash points (TSR_COORD_CRASH_AT=staged|prepared|saved|flipped|committed, and
 * caught-up: a reshard move's catch-up done, before its flip). Test builds only
 * (core/testing.h): nothing in a release build. */
#define tsr__coord_crash_point(step) tsr_test_crash(TSR_KNOB_COORD_CRASH_AT, step)
/* Test-only: 1 when TSR_COORD_CRASH_AT names this hook. Besides the crash points, one
 * planted bug for the chaos checker (tests/chaos, docs/reliability.md "Chaos"):
 * "plant-ack-unlogged" makes the stream writer acknowledge each round without appending it
 * to the coordinator log or mirroring it in etcd (it still sends it to the shards). Never
 * set outside that demonstration. Two more, each once per process, for the etcd mirror of a
 * streamed round (stream_ha.c): "mirror-answer-lost" puts a mirrored round again (a try
 * whose answer was lost: it must settle as logged), "mirror-doubt" takes a mirrored
 * round's answer as lost (outcome unknown: the leader must re-read etcd's rounds). Test
 * builds only (core/testing.h): 0 in a release build. */
#define tsr__coord_test_hook(name) tsr_test_is(TSR_KNOB_COORD_CRASH_AT, name)

/* ---- readidx.c: read-your-writes on every coordinator (docs/coordinator.md) ---- */
/* Whether a half is on: TSR_RI_WATCH (a follower's etcd read and watch wait) or
 * TSR_RI_DEMAND (min_stream_seq in every ShardQuery). Both are, except under the test hooks
 * (TSR_COORD_CRASH_AT) no-read-index (neither) and no-demand (the watch half only). */
enum { TSR_RI_WATCH = 1, TSR_RI_DEMAND = 2 };
int tsr__coord_ri_on(int what);
/* A follower with --etcd, before it plans a query: one linearizable etcd read of the
 * newest round (shared with the queries that arrived before it started), then a wait of at
 * most min(1 s, remaining_ms) for the watch to deliver that round. 0 (also at once on the
 * leader, without etcd, with the hook off, or when etcd cannot be read: logged), or
 * TSR_EUNAVAILABLE with err set (the watch did not deliver in time). Blocks. */
int tsr__coord_read_index(tsr__coord *c, int64_t remaining_ms, tsr_error *err);
/* replica.c: whether a Search result is a replica's "behind" refusal; *applied = its N. */
int tsr__coord_behind_of(const tsr_rpc_result *r, int64_t *applied);

/* ---- replica.c ---- */
/* Opens one channel per replica (opts borrowed, may be NULL = plaintext defaults). Returns
 * 0 or an error naming the replica. tsr__coord_channels_close accepts a partial open. */
int tsr__coord_channels_open(tsr__coord *c, const tsr_rpc_client_opts *opts, tsr_error *err);
void tsr__coord_channels_close(tsr__coord *c);
/* Resharding (update thread, under update_mu and the stream lock): append: opens the
 * replicas of the config's last group (just added) and makes the group callable; retire:
 * group s is removed (its replicas are no longer called; config retired[s] set). */
int tsr__coord_group_append(tsr__coord *c, tsr_error *err);
void tsr__coord_group_retire(tsr__coord *c, size_t s);
/* A follower with --etcd (leader.c, before it publishes a version ns it learnt from etcd;
 * under update_mu and the stream lock): makes the groups match ns's "groups" file (NULL:
 * nothing to do). Groups the version adds are appended (their channels opened) so that
 * queries planned on ns can call them; a group ns removes is marked retired in the config
 * at once and set in retire[] (TSR_COORD_MAX_SHARDS entries): the caller cuts its replicas
 * (tsr__coord_group_retire) only after the queries planned on the older version drained.
 * Groups of ours above the served version's (failed adds when we led: retired, never
 * committed) give way to ns's. Returns 0, or TSR_ESTATE naming the group when ns's groups
 * are not an extension of ours (a group renumbered or its replicas changed): nothing
 * published then. */
int tsr__coord_groups_follow(tsr__coord *c, const tsr__snap *ns, uint8_t *retire,
                             tsr_error *err);
/* "127.0.0.1:7001" -> "ipv4:127.0.0.1:7001"; other forms as they are. */
void tsr__coord_target_of(const char *addr, char *buf, size_t cap);
/* Records the outcome of one call to replica k (health, failure count, metrics). */
void tsr__replica_note(tsr__coord *c, size_t k, const char *method, int code, double secs);
/* Healthy for queries: no recent failure, channel not in TRANSIENT_FAILURE, not lagging. */
int tsr__replica_healthy(tsr__coord *c, size_t k, int64_t now_ms); /* now: tsr_clock_mono_ms */

/* One call per shard group, answered by one of its replicas (balanced over healthy ones;
 * on UNAVAILABLE, a per-attempt deadline, CANCELLED, RESOURCE_EXHAUSTED or
 * FAILED_PRECONDITION (version not held) retried on another replica of the group within
 * timeout_ms). Inputs: group, req/len (borrowed). Outputs: result (init it; closed and
 * refilled), replica (flat index of the replica that gave the result), attempts. */
typedef struct tsr__gcall {
    size_t group;
    const void *req;
    size_t len;
    tsr_rpc_result result;
    size_t replica;
    int attempts;
    /* Search or Read with a min_stream_seq (NULL otherwise): the unpacked request (a
     * ShardSearchRequest or ShardReadRequest). When every replica of the group refused it
     * as behind ("applied seq N"), the fan-out lowers the demand to the highest N and asks
     * that replica again (readidx.c explains why that is safe); the repacked request is
     * the fan-out's. */
    ProtobufCMessage *demand;
} tsr__gcall;
/* Sends all n calls in parallel; returns the number whose final code is not OK. */
size_t tsr__coord_group_fanout(tsr__coord *c, const char *method, tsr__gcall *calls, size_t n,
                               int64_t timeout_ms);

/* The same without blocking, from inside an rpc handler (tsr_rpc_reply_fanout on the
 * server's queue): starts the first attempts and returns; retries start from the polling
 * thread that sees a round complete; when every call has its final result, fin(ud, r,
 * calls, n) runs on a polling thread, and what it returns is the handler's return value
 * (it fills r). method, calls and their requests are borrowed until then. Returns 0 (fin
 * will run exactly once) or a negative TSR code (nothing started, fin will not run). */
typedef int (*tsr__gfan_fin)(void *ud, tsr_rpc_reply *r, tsr__gcall *calls, size_t n);
int tsr__coord_group_fanout_async(tsr__coord *c, tsr_rpc_reply *r, const char *method,
                                  tsr__gcall *calls, size_t n, int64_t timeout_ms,
                                  tsr__gfan_fin fin, void *ud);
/* The same owned by no call (tsr_rpc_server_fanout on srv's queues): fin(ud, calls, n)
 * runs once on a polling thread — or before this returns when nothing could be sent.
 * Returns 0, or a negative TSR code (nothing started, fin will not run). */
typedef void (*tsr__gfan_sfin)(void *ud, tsr__gcall *calls, size_t n);
int tsr__coord_group_fanout_server(tsr__coord *c, tsr_rpc_server *srv, const char *method,
                                   tsr__gcall *calls, size_t n, int64_t timeout_ms,
                                   tsr__gfan_sfin fin, void *ud);

/* coalesce.c (DESIGN there): the coalescer's slots (with the groups) and their end. */
void tsr__coalesce_init(tsr__coord *c);
void tsr__coalesce_close(tsr__coord *c);
/* Nonzero when FindNeighbors goes through the coalescer: a server is set and
 * coalesce_inflight > 0. */
int tsr__coalesce_on(const tsr__coord *c);
/* Sends e's call now, or queues it to share the group's next call; e->done runs once with
 * e->call's result filled, as tsr__coord_group_fanout would have. e is borrowed until
 * then. */
void tsr__coalesce_submit(tsr__coord *c, tsr__centry *e);

/* The same request bufs[s] (NULL = skip group s) to EVERY replica of each group, in one
 * parallel fan-out (updates: a version is the group's only when its replicas have it),
 * except replicas k with skip[k] set (skip may be NULL). When rdesc is set, the reply of
 * replica k is unpacked into resps[k] (nrep entries, caller frees; NULL for a failed
 * call). Returns the number of replica calls that failed; the first failure is in err,
 * naming the group and the replica. */
size_t tsr__coord_all_fanout(tsr__coord *c, const char *method, uint8_t **bufs, size_t *lens,
                             const char *skip, int64_t timeout_ms,
                             const ProtobufCMessageDescriptor *rdesc, ProtobufCMessage **resps,
                             tsr_error *err);
/* Registers the /metrics collector (once per process). */
void tsr__coord_metrics_register(tsr__coord *c);

/* Reconcile */
int tsr__coord_reconcile_start(tsr__coord *c);
void tsr__coord_reconcile_stop(tsr__coord *c);
/* One pass: bring every shard to the coordinator's version. Returns shards still off. */
int tsr__coord_reconcile_once(tsr__coord *c);
void tsr__coord_schedule_release(tsr__coord *c, uint64_t below);
void tsr__coord_ops_close(tsr__coord *c);

/* ---- stream_log.c: the coordinator log's files (framing, append, scan) ---- */
struct Tessera__V1__CoordLogRecord;
/* DATA/stream and DATA/stream/v<version>.log into buf. */
void tsr__slog_dir(const tsr_store *st, char *buf, size_t cap);
void tsr__slog_path(const tsr_store *st, uint64_t version, char *buf, size_t cap);
/* rec as `u32 len | u32 crc32 | payload` (new buffer, *len bytes). */
uint8_t *tsr__slog_frame(const struct Tessera__V1__CoordLogRecord *rec, size_t *len);
/* Creates (replaces) the log of version with its header hdr only, durably (fsync, rename,
 * fsync of DATA/stream). */
int tsr__slog_create(const tsr_store *st, uint64_t version,
                     const struct Tessera__V1__CoordLogRecord *hdr, tsr_error *err);
/* Opens the log of version for appending: *fd and its *size. TSR_ENOTFOUND when missing. */
int tsr__slog_open(const tsr_store *st, uint64_t version, int *fd, int64_t *size,
                   tsr_error *err);
/* Appends rec and fsyncs; *size grows by the record. On failure the file is cut back to
 * *size (what names the file in messages). */
int tsr__slog_append(int fd, const char *what, const struct Tessera__V1__CoordLogRecord *rec,
                     int64_t *size, tsr_error *err);
/* Calls fn(ud, record, offset) for each good record of path in order from byte start (0,
 * or the end of a record: tsr__stream_log_offset; past the end = from 0) (fn returns
 * nonzero to stop). *good: bytes of the good prefix; why: empty, or what is wrong after it
 * (a torn or corrupt tail). Returns 0, TSR_ENOTFOUND (no file) or TSR_EIO. */
typedef int (*tsr__slog_fn)(void *ud, const struct Tessera__V1__CoordLogRecord *rec,
                            int64_t offset);
int tsr__slog_scan(const char *path, int64_t start, tsr__slog_fn fn, void *ud, int64_t *good,
                   char *why, size_t whycap, tsr_error *err);

/* ---- stream_ha.c: the coordinator log mirrored in etcd (--etcd; the leader only) ---- */
/* mirror: rec into etcd (0 without --etcd or when not leading); drop: version's records;
 * restore: the local log of version rewritten from etcd's records (*found 0: etcd holds
 * none, the local log is untouched). */
int tsr__shlog_mirror(tsr__coord *c, const struct Tessera__V1__CoordLogRecord *rec,
                      tsr_error *err);
/* A round of the stream writer: with --etcd always mirrored (fenced), whether or not this
 * coordinator still believes it leads — a leader that stepped down by its own clock while
 * rounds were queued used to skip the mirror (a follower's rule) and acknowledge them
 * (tests/chaos, seed 1: seqs reused by the successor). The fence refuses it when another
 * coordinator holds the leader key. */
int tsr__shlog_mirror_round(tsr__coord *c, const struct Tessera__V1__CoordLogRecord *rec,
                            tsr_error *err);
void tsr__shlog_drop(tsr__coord *c, uint64_t version);
int tsr__shlog_restore(tsr__coord *c, uint64_t version, int *found, tsr_error *err);

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

/* For an update (update.c) and a re-seed (reconcile.c); caller holds the stream lock
 * (lock/unlock = st.mu). base: NULL when nothing was streamed on sn, else a new snapshot
 * view = sn's directory with the overlay applied and the stream's label counter (template
 * and plan borrowed from sn: free it with tsr__stream_base_free, never snap_unref). */
void tsr__stream_lock(tsr__coord *c);
void tsr__stream_unlock(tsr__coord *c);
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

#define TSR_SHARD_SVC "/tessera.v1.Shard/"

#endif
