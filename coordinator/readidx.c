/*
 * readidx — read-your-writes on every coordinator (etcd's ReadIndex idea): once a streamed
 * write returned OK, every later FindNeighbors, ReadIndexDatapoints and Match on ANY
 * coordinator of the cluster sees it (docs/coordinator.md "Query path", docs/ha.md).
 *
 * Two halves:
 *   - the watch: a follower learns rounds from its etcd watch, which may lag. Before it
 *     plans a query it reads etcd linearizably (meta.c tsr__meta_stream_head: the committed
 *     version and the newest round etcd holds of it) and waits until its own served
 *     version and followed rounds reach that point. A round is in etcd before any replica
 *     has it and before its write is acknowledged, so every write acknowledged before the
 *     query arrived is then in the follower's overlay (or folded into a newer version).
 *     Concurrent queries share one read: a query waits for a read that STARTED after it
 *     arrived (an older read may miss a write acknowledged just before the query), and
 *     starts one itself when none is in flight. The leader skips this: it knows every
 *     round it acknowledged. When no etcd member answers (the fast client's deadline,
 *     0.3-1.5 s per member; every batch of queries tries again: a window without reads
 *     after a failure would let a follower answer stale right after an etcd election,
 *     when the leader acknowledges again), the query goes on from what it has: no
 *     leader acknowledges a round while etcd is unreachable (each is mirrored first), so
 *     only a write acknowledged just before the loss and not yet delivered can be missed;
 *     issue 16 wants queries to go on without etcd quorum (test_ha_etcd_loss).
 *   - the replicas: every ShardQuery demands min_stream_seq = the last seq this
 *     coordinator logged or followed for the shard's group (stream.c
 *     tsr__stream_snap_seqs); a replica below it waits up to 100 ms (a Write in flight),
 *     then refuses with FAILED_PRECONDITION "... applied seq N" (shard/service.c). The
 *     fan-out (replica.c) then asks a sibling within the same deadline (it does not mark
 *     it stream_behind: a Write in flight is not a missed one, and that flag stops the
 *     replica's Writes; reconcile's Stats pass marks one really behind). When EVERY replica of the
 *     group refused, it asks the one with the highest N again with the demand lowered to
 *     N. Why that is safe: the leader acknowledges a write only after, in each group the
 *     write touched, at least one replica applied it (its Write returned OK after the
 *     shard's fdatasync; stream.c ack: a group with none answers UNAVAILABLE, not OK), and a
 *     replica's applied seq of a version never goes down (its write-ahead log is replayed
 *     at restart). So for every acknowledged write of seq S on group g, some replica of g
 *     has applied >= S, and the highest N over all replicas of g is >= S: the replica
 *     with that N has every acknowledged write of the group. The demand can be above every
 *     N only for a round not acknowledged yet (in flight, or its leader died between the
 *     mirror and the Write): not owed to the query. Replicas that did not answer at all do
 *     not count: a group with one refused and one silent replica fails the query
 *     (UNAVAILABLE), as the silent one may be the only one with the write.
 *
 * Threads: tsr__coord_read_index runs on the caller's thread (an rpc polling thread for
 * FindNeighbors: it holds it for the etcd read, ~1 ms, and at most 1 s while the watch
 * lags), under ri_mu only (a leaf lock: no other lock is taken with it; the etcd read and
 * the waits are outside it). Calls meta and stream.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "meta.h"
#include "core/clock.h"
#include "core/log.h"

#define RI_WATCH_WAIT_MS 1000 /* the longest a query waits for the watch */

int tsr__coord_ri_on(int what)
{
    static atomic_int on = -1;
    int v = atomic_load(&on);
    if (v < 0) { /* the test hooks that show the tests fail without it */
        v = tsr__coord_test_hook("no-read-index") ? 0
            : tsr__coord_test_hook("no-demand") ? TSR_RI_WATCH
            : TSR_RI_WATCH | TSR_RI_DEMAND;
        atomic_store(&on, v);
    }
    return (v & what) != 0;
}

/* The newest (version, seq) in etcd, from a read that started after this call began. */
static int read_head(tsr__coord *c, uint64_t *v, int64_t *seq, tsr_error *err)
{
    pthread_mutex_lock(&c->ri_mu);
    /* a read in flight started before we arrived: we need the one after it */
    int64_t want = c->ri_started + 1;
    while (c->ri_done < want) {
        if (c->ri_inflight) {
            pthread_cond_wait(&c->ri_cv, &c->ri_mu);
            continue;
        }
        int64_t n = ++c->ri_started;
        c->ri_inflight = 1;
        pthread_mutex_unlock(&c->ri_mu);
        uint64_t rv = 0;
        int64_t rs = 0;
        tsr_error e = TSR_ERROR_INIT;
        int rc = tsr__meta_stream_head(c->meta, &rv, &rs, &e);
        pthread_mutex_lock(&c->ri_mu);
        c->ri_done = n;
        c->ri_inflight = 0;
        c->ri_rc = rc;
        c->ri_version = rv;
        c->ri_seq = rs;
        snprintf(c->ri_msg, sizeof c->ri_msg, "%.200s", rc ? e.msg : "");
        pthread_cond_broadcast(&c->ri_cv);
    }
    int rc = c->ri_rc;
    *v = c->ri_version;
    *seq = c->ri_seq;
    if (rc)
        tsr_err(err, TSR_EUNAVAILABLE, "etcd: %s", c->ri_msg);
    pthread_mutex_unlock(&c->ri_mu);
    return rc ? TSR_EUNAVAILABLE : 0;
}

int tsr__coord_read_index(tsr__coord *c, int64_t remaining_ms, tsr_error *err)
{
    if (!c->meta || tsr__coord_leading(c) || !tsr__coord_ri_on(TSR_RI_WATCH))
        return 0;
    uint64_t v = 0;
    int64_t seq = 0;
    tsr_error e = TSR_ERROR_INIT;
    if (read_head(c, &v, &seq, &e) != 0) {
        /* etcd cannot be read (no quorum, cut off): no leader can acknowledge a round now
         * (each is mirrored first), so only a write acknowledged just before the loss and
         * not delivered by the watch yet can be missed. Queries go on from what this
         * follower has (docs/ha.md, issue 16 acceptance 4: no quorum, queries go on). */
        tsr_log_every(TSR_LOG_WARN, "readidx", 10000, "read index: %s; queries are answered "
                      "from the rounds this follower has (read-your-writes unconfirmed)",
                      e.msg);
        return 0;
    }
    int64_t wait = remaining_ms < RI_WATCH_WAIT_MS ? remaining_ms : RI_WATCH_WAIT_MS;
    int64_t until = tsr_clock_mono_ms() + (wait > 0 ? wait : 0);
    for (;;) {
        int64_t seqs[1], last = -1;
        tsr__snap *sn = tsr__stream_snap_seqs(c, seqs, 0, &last);
        uint64_t served = sn->version;
        tsr__snap_unref(sn);
        if (served > v || (served == v && (seq == 0 || last >= seq)))
            return 0;
        if (tsr__coord_leading(c)) /* won meanwhile: it adopted etcd's rounds to lead */
            return 0;
        if (tsr_clock_mono_ms() >= until)
            return tsr_err(err, TSR_EUNAVAILABLE, "this coordinator follows the leader and "
                           "its etcd watch has not delivered the streamed writes acknowledged "
                           "so far (etcd: version %" PRIu64 " round %lld; here: version %"
                           PRIu64 " round %lld) after %lld ms; retry, or ask the leader",
                           v, (long long)seq, served, (long long)last, (long long)wait);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
