/*
 * leader — leadership (leader.c, state.c, readidx.c; docs/coordinator.md "Leader"): with
 * --etcd, the lease, the member key, the election, stepping down, following the leader's
 * versions and mirrored rounds as a follower, refusing writes on a follower, the term
 * shard calls carry, and a follower's read index. Without --etcd this coordinator always
 * leads and every call here is a no-op that says so.
 *
 * Owns: tsr__lead (tsr__coord.lead) and the read-index state (ri_*). Locks: lead.mu is a
 * leaf (taken last, e.g. under the stream lock by stream_ha.c); lead.follow_mu serializes
 * moving the snapshot, taken before update_mu and the stream lock; ri_mu is a leaf.
 */
#ifndef TSR_COORD_LEADER_H
#define TSR_COORD_LEADER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coord_config.h"
#include "core/error.h"
#include "net/etcd.h"
#include "net/rpc.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

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
/* state.c: 1 while etcd's streamed rounds must be read again before the next round
 * (lead.readopt: a round etcd refused or left in doubt); a fold then commits its
 * directory as a blob rather than carrying rounds the local log may lack. */
int tsr__coord_readopt_pending(tsr__coord *c);

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

#endif
