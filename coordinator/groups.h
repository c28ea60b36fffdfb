/*
 * groups — the shard groups (replica.c, coalesce.c): R replicas per group, their
 * channels, health, balancing and failover, the fan-outs to one replica per group or to
 * every replica, coalesced FindNeighbors calls, the coordinator's /metrics collector.
 *
 * Owns: tsr__coord.rep (every replica, group-major), .grp (room for TSR_COORD_MAX_SHARDS
 * groups: AddShardGroup appends), .co (a coalescer per group slot). Locks: replica health is
 * plain atomics, written by whoever saw a call's outcome and read without a lock (a stale
 * value only makes one query try a dead replica first and fail over); a coalescer's mu is
 * a leaf. Groups are appended or retired only on the update thread under update_mu and the
 * stream lock, or by a follower moving its snapshot (tsr__coord_groups_follow).
 */
#ifndef TSR_COORD_GROUPS_H
#define TSR_COORD_GROUPS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "net/rpc.h"
#include "snap.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

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

#define TSR_SHARD_SVC "/tessera.v1.Shard/"

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

/* The packed shard request what ("Prepare", "Commit", "Abort" or "Release") for version
 * (Release: below_version), fenced by the current leader term; cpu_pct is Prepare's
 * build_cpu_percent. Free it. */
uint8_t *tsr__coord_pack_version(tsr__coord *c, const char *what, int64_t version,
                                 uint32_t cpu_pct, size_t *len);

/* Registers the /metrics collector (once per process). */
void tsr__coord_metrics_register(tsr__coord *c);

#endif
