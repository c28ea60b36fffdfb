/*
 * leader — with --etcd, several coordinators serve one index and exactly one of them, the
 * leader, runs updates, reconcile, the fold and streamed writes (docs/coordinator.md
 * "Leader, followers, failover").
 *
 * Two threads per coordinator. The lease thread wakes every ttl/3 (at least 200 ms):
 *   - lease: granted with --etcd-ttl, renewed each wake-up; PREFIX/members/<advertise> is
 *     attached to it (the live coordinators GetIndexStats lists). A lease that etcd says is
 *     gone (expired or revoked) is replaced by a new one.
 *   - election: a coordinator with a lease and no leadership creates PREFIX/leader =
 *     advertise address, attached to its lease, in a transaction conditional on the key's
 *     absence (create revision 0). Success: the key's create revision is our TERM. Else the
 *     key names the leader, which write refusals quote. The term's start-up that follows
 *     (the committed version, the predecessor's streamed rounds adopted from etcd, the
 *     replicas caught up) can take longer than the TTL (tens of thousands of rounds): a
 *     keeper thread renews the lease meanwhile, so the winner does not lose its key to its
 *     own start-up (a chaos run saw "elected" then "stepping down (the lease expired)").
 *     A follower campaigns as soon as the watcher sees the key deleted (the leader's lease
 *     expired or was revoked) or replaced: the watcher "kicks" the lease thread. The periodic campaign is then a slow
 *     safety net (every 3 wake-ups); while the watch is down it runs every wake-up.
 *   - stepping down: the leader re-reads the key each wake-up and steps down when it is not
 *     its own any more; it also steps down by its own clock when no renewal succeeded for
 *     ttl minus a margin (max(1 s, ttl/5)), before etcd can expire the lease and let another
 *     coordinator win (a leader cut off from etcd stops acting before its successor starts).
 *     A fenced commit that fails (update.c) steps down at once too.
 *   - compaction (--etcd-compact S, leader only): every S seconds etcd's history is
 *     compacted below the revision read S seconds earlier.
 * The watcher holds one etcd watch stream on PREFIX/version, PREFIX/stream/ and
 * PREFIX/leader (the lease thread's reads are the fallback while it is down); when
 * PREFIX/version names a newer version than the served one (a follower, or a coordinator
 * that just won and must start from it), the version is fetched (meta.c: from the local
 * cache or etcd), loaded and published (stream.c) — queries never touch etcd, they read
 * the snapshot this thread moves. A broken stream resumes from the revision after the
 * last event of each key; when compaction removed that revision, the keys are read again
 * and the watch restarts from the current revision.
 * A new leader thereby settles an interrupted update by the committed version in etcd:
 * it serves that version, and reconcile (which runs on the leader only) aborts what shards
 * staged or prepared above it and commits it where it is prepared.
 *
 * A version that changes the shard groups (a reshard: its "groups" file, which the commit
 * transaction carries like the plan) is served only after the groups it adds have
 * channels here (replica.c tsr__coord_groups_follow); a group it removes is cut after the
 * queries planned before it drained (search_deadline_ms), or at once when we win.
 *
 * Fencing: the term is the create revision of our leader key; every shard call carries it
 * (tsr__coord_term) and the commit transaction compares it (tsr__leader_fence).
 *
 * Threads: the lease thread is the only writer of leading/term/lease; follow_mu serializes
 * the two threads' moves of the snapshot; others read them atomically.
 * addr, stop, kick and the pending retirements are under lead.mu. Calls: meta, oplog,
 * replica, state, stream (tsr__stream_freeze is taken to publish; when the version changes
 * the groups, update_mu is taken first, by trylock, in the order of coord.h; no other lock
 * of coord.h is held with them here).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "dirshard.h"
#include "meta.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "tessera/v1/coord_log.pb-c.h"

int64_t tsr__lead_period_ms(int ttl_s)
{
    int64_t p = (int64_t)ttl_s * 1000 / 3;
    return p < 200 ? 200 : p;
}

int64_t tsr__lead_margin_ms(int ttl_s)
{
    int64_t m = (int64_t)ttl_s * 1000 / 5;
    return m < 1000 ? 1000 : m;
}

int tsr__lead_renewal_late(int64_t now, int64_t ok_at, int ttl_s)
{
    return now - ok_at > (int64_t)ttl_s * 1000 - tsr__lead_margin_ms(ttl_s);
}

int tsr__lead_key_verdict(int leading, int64_t term, int64_t lease, int64_t key_rev,
                          int64_t key_lease)
{
    int v = 0;
    if (leading && key_rev != term) {
        v |= TSR_LEAD_STEP_DOWN;
        leading = 0;
    }
    int stale = !leading && lease && key_lease == lease;
    if (!leading && !stale)
        v |= TSR_LEAD_FOLLOW;
    if (stale)
        v |= TSR_LEAD_RELEASE;
    return v;
}

static int64_t period_ms(const tsr__coord *c)
{
    return tsr__lead_period_ms(c->lead.ttl_s);
}

static void set_addr(tsr__coord *c, const char *a)
{
    pthread_mutex_lock(&c->lead.mu);
    snprintf(c->lead.addr, sizeof c->lead.addr, "%s", a);
    pthread_mutex_unlock(&c->lead.mu);
}

void tsr__leader_lost(tsr__coord *c, const char *why)
{
    if (!c->meta || !atomic_exchange(&c->lead.leading, 0))
        return;
    set_addr(c, ""); /* term stays: our calls still carry it and newer shards refuse them */
    tsr_warn("leader: stepping down (%s)", why);
}

size_t tsr__leader_fence(tsr__coord *c, tsr_etcd_cmp *cmp)
{
    if (!c->meta)
        return 0;
    static __thread char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    cmp[0] = (tsr_etcd_cmp){key, TSR_ETCD_CREATE_REV, atomic_load(&c->lead.term), NULL, 0};
    cmp[1] = (tsr_etcd_cmp){key, TSR_ETCD_LEASE, atomic_load(&c->lead.lease), NULL, 0};
    return 2;
}

static void follow_locked(tsr__coord *c);

typedef struct follow_ud {
    tsr__coord *c;
    int gap;
    int strict; /* one round of a watch event: not applied past a hole */
} follow_ud;

static int follow_one(void *ud, const uint8_t *buf, size_t len, tsr_error *err)
{
    follow_ud *f = ud;
    (void)err;
    Tessera__V1__CoordLogRecord *rec = tessera__v1__coord_log_record__unpack(NULL, len, buf);
    if (rec) {
        f->gap |= tsr__stream_follow(f->c, rec, f->strict);
        tessera__v1__coord_log_record__free_unpacked(rec, NULL);
    }
    return 0;
}

/* A follower: the streamed rounds of version v the leader mirrored (seq -1: all of them).
 * One round (seq >= 0) that comes after a gap — an event missed, or a fetch that failed —
 * makes it fetch every round of v (those it has are skipped) and is itself applied only in
 * that order (strict): a follower never serves an overlay with a hole in it (tests/chaos
 * found one that did, for good — twice: on Dec 5 the round after the hole was applied
 * first, and the refetch then skipped the missing ones as already applied). */
static void follow_stream(tsr__coord *c, uint64_t v, int64_t seq)
{
    tsr_error err = TSR_ERROR_INIT;
    follow_ud f = {c, 0, seq >= 0};
    if (v && tsr__meta_log_fetch(c->meta, v, seq, follow_one, &f, &err))
        tsr_warn("leader: the streamed writes of version %" PRIu64 " from etcd: %s", v, err.msg);
    else if (seq >= 0 && f.gap)
        follow_stream(c, v, -1);
}

/* Moves the served snapshot to the version etcd holds when it is newer (either thread). */
static void follow(tsr__coord *c)
{
    pthread_mutex_lock(&c->lead.follow_mu);
    follow_locked(c);
    pthread_mutex_unlock(&c->lead.follow_mu);
}

static void follow_locked(tsr__coord *c)
{
    tsr_error err = TSR_ERROR_INIT;
    uint64_t v = 0;
    int64_t rev = 0;
    if (tsr__meta_read_version(c->meta, &v, &rev, &err))
        return; /* etcd unreachable: keep serving what we have */
    tsr__snap *cur = tsr__coord_snap_get(c);
    uint64_t served = cur->version;
    tsr__snap_unref(cur);
    if (v <= served)
        return;
    tsr__snap *ns = NULL;
    uint64_t want = v; /* tsr__meta_sync rewrites v (0 when it failed early) */
    /* A load that failed is not tried again at every watch event (every streamed round
     * is one): each try lists the whole directory from the shards. The chaos run's full
     * disk made a follower list it every ~20 ms (Dec 6); now 100 ms doubling to 2 s. */
    int64_t now = tsr_clock_mono_ms();
    if (want == c->lead.follow_failed_v && now < c->lead.follow_retry_ms)
        return;
    if (tsr__meta_sync(c->meta, c->store, tsr__dir_rebuild, c, &v, &err) ||
        tsr__snap_load(c->store, v, &ns, &err)) {
        int64_t b = want == c->lead.follow_failed_v ? c->lead.follow_backoff_ms * 2 : 100;
        c->lead.follow_backoff_ms = b < 2000 ? b : 2000;
        c->lead.follow_failed_v = want;
        c->lead.follow_retry_ms = now + c->lead.follow_backoff_ms;
        tsr_error_log("leader: cannot load version %" PRIu64 " from etcd (next try in %lld "
                      "ms): %s", v ? v : want, (long long)c->lead.follow_backoff_ms, err.msg);
        return;
    }
    c->lead.follow_failed_v = 0;
    /* A version with a groups file (a reshard, docs/resharding.md): its groups are ours
     * before it is served, so a query planned on it can call every group it names. The
     * groups change only under update_mu: when a move of ours is still running (we were
     * deposed during it), this waits for the next poll rather than block the thread. */
    uint8_t retire[TSR_COORD_MAX_SHARDS] = {0};
    int grouped = ns->groups != NULL;
    if (grouped && pthread_mutex_trylock(&c->update_mu) != 0) {
        tsr_debug("leader: version %" PRIu64 " changes the groups; an update of ours still "
                  "runs: the next poll moves", v);
        tsr__snap_unref(ns);
        return;
    }
    tsr__stream_freeze(c);
    if (grouped && tsr__coord_groups_follow(c, ns, retire, &err)) {
        tsr__stream_thaw(c);
        pthread_mutex_unlock(&c->update_mu);
        tsr_error_log("leader: version %" PRIu64 " from etcd not served: %s", v, err.msg);
        tsr__snap_unref(ns);
        return;
    }
    if (tsr__stream_version_begin(c, v, ns->next_label, NULL, 0, &err))
        tsr_warn("leader: version %" PRIu64 ": the stream log: %s", v, err.msg);
    tsr__stream_publish(c, ns, NULL, 0, 0);
    tsr__stream_thaw(c);
    if (grouped)
        pthread_mutex_unlock(&c->update_mu);
    size_t nret = 0;
    pthread_mutex_lock(&c->lead.mu);
    for (size_t g = 0; g < TSR_COORD_MAX_SHARDS; g++)
        if (retire[g]) {
            c->lead.retire[g] = 1;
            nret++;
        }
    if (nret) /* queries planned on the version before may still call them: drain first */
        c->lead.retire_at_ms = tsr_clock_mono_ms() + c->cfg.search_deadline_ms;
    pthread_mutex_unlock(&c->lead.mu);
    tsr_info("now serving version %" PRIu64 " (committed in etcd)%s", v,
             nret ? "; a removed shard group is no longer called once the queries planned "
                    "before it drained" : "");
    follow_stream(c, v, -1); /* rounds the leader streamed on it before we moved */
}

/* Cuts the replicas of the groups a followed version removed (docs/resharding.md) once
 * their drain time passed, or at once with now_too (this coordinator is about to lead:
 * its fan-outs must not call them). Lease thread. */
static void retire_due(tsr__coord *c, int now_too)
{
    pthread_mutex_lock(&c->lead.mu);
    int due = c->lead.retire_at_ms &&
              (now_too || tsr_clock_mono_ms() >= c->lead.retire_at_ms);
    pthread_mutex_unlock(&c->lead.mu);
    /* the groups change only under update_mu; an update of ours still running (deposed
     * during it) keeps them pending until a later tick rather than block this thread */
    if (!due || pthread_mutex_trylock(&c->update_mu) != 0)
        return;
    uint8_t cut[TSR_COORD_MAX_SHARDS];
    pthread_mutex_lock(&c->lead.mu);
    memcpy(cut, c->lead.retire, sizeof cut);
    memset(c->lead.retire, 0, sizeof c->lead.retire);
    c->lead.retire_at_ms = 0;
    pthread_mutex_unlock(&c->lead.mu);
    for (size_t g = 0; g < TSR_COORD_MAX_SHARDS && g < c->cfg.nshards; g++)
        if (cut[g]) {
            tsr__coord_group_retire(c, g);
            tsr_info("shard group %zu removed (a followed version): no longer called", g);
        }
    pthread_mutex_unlock(&c->update_mu);
}

static void set_etcd_err(tsr__coord *c, const char *msg)
{
    pthread_mutex_lock(&c->lead.mu);
    snprintf(c->lead.etcd_err, sizeof c->lead.etcd_err, "%.*s",
             (int)sizeof c->lead.etcd_err - 1, msg);
    pthread_mutex_unlock(&c->lead.mu);
}

/* The lease: granted when missing, else renewed; members key put with a new one. ok_at:
 * when the last renewal that succeeded was SENT (etcd's TTL counts from later). */
static void keep_lease(tsr__coord *c, int64_t *ok_at)
{
    tsr_error err = TSR_ERROR_INIT;
    int64_t lease = atomic_load(&c->lead.lease), ttl = 0;
    if (lease) {
        int64_t sent = tsr_clock_mono_ms();
        int rc = tsr_etcd_lease_keepalive(c->meta->fast, lease, &ttl, &err);
        set_etcd_err(c, rc == 0 || rc == TSR_ENOTFOUND ? "" : err.msg);
        if (rc == 0) {
            *ok_at = sent;
            return;
        }
        if (rc != TSR_ENOTFOUND) {
            if (atomic_load(&c->lead.leading) &&
                tsr__lead_renewal_late(tsr_clock_mono_ms(), *ok_at, c->lead.ttl_s))
                tsr__leader_lost(c, "etcd did not renew the lease in time");
            return;
        }
        tsr__leader_lost(c, "the lease expired");
        atomic_store(&c->lead.lease, 0);
    }
    int64_t granted = 0;
    int64_t t0 = tsr_clock_mono_ms();
    int rc = tsr_etcd_lease_grant(c->meta->fast, c->lead.ttl_s, &lease, &granted, &err);
    set_etcd_err(c, rc ? err.msg : "");
    if (rc)
        return;
    char key[600];
    tsr__meta_key(c->meta, "/members/", key, 300);
    strncat(key, c->lead.advertise, sizeof key - strlen(key) - 1);
    if (tsr_etcd_put(c->meta->fast, key, c->lead.advertise, strlen(c->lead.advertise), lease,
                     NULL, &err))
        tsr_warn("leader: %s: %s", key, err.msg);
    atomic_store(&c->lead.lease, lease);
    *ok_at = t0;
}

/* The leader reads etcd's streamed rounds again (lead.readopt: a round etcd refused or
 * left in doubt, stream_ha.c; or an adoption that failed): the local log, overlay and
 * next seq become etcd's, and every replica is caught up from them (a round that did land
 * in etcd although its writer gave up on it reaches the shards now). Rounds wait on the
 * stream lock meanwhile; until it works they are refused (the log is closed). */
static void readopt(tsr__coord *c)
{
    tsr_error err = TSR_ERROR_INIT;
    if (tsr__stream_readopt(c, &err)) {
        tsr_warn("leader: re-reading etcd's streamed rounds: %s (retried)", err.msg);
        return;
    }
    atomic_store(&c->lead.readopt, 0);
    tsr_info("leader: etcd's streamed rounds read again; streamed writes go on");
}

/* ---------------------------------------------------------------- the start-up keeper */

/* Renews `lease` every period on a thread of its own while the lease thread runs a won
 * term's start-up (campaign). etcd clients are safe to share (net/etcd.h). */
typedef struct keeper {
    tsr__coord *c;
    int64_t lease;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, renewed, failed;
    pthread_t th;
    int started;
} keeper;

static void *keeper_main(void *p)
{
    keeper *k = p;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + period_ms(k->c) * 1000000;
        ts.tv_sec += (time_t)(ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        if (pthread_cond_timedwait(&k->cv, &k->mu, &ts) != ETIMEDOUT || k->stop)
            continue;
        pthread_mutex_unlock(&k->mu);
        tsr_error err = TSR_ERROR_INIT;
        int64_t ttl = 0;
        int rc = tsr_etcd_lease_keepalive(k->c->meta->fast, k->lease, &ttl, &err);
        pthread_mutex_lock(&k->mu);
        if (rc == 0)
            k->renewed++;
        else
            k->failed++; /* the lease thread's next renewal decides (keep_lease) */
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

static void keeper_start(keeper *k, tsr__coord *c, int64_t lease)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    k->lease = lease;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->started = pthread_create(&k->th, NULL, keeper_main, k) == 0;
    if (!k->started)
        tsr_warn("leader: no thread to renew the lease during the term's start-up");
}

static void keeper_stop(keeper *k, int64_t ms)
{
    if (k->started) {
        pthread_mutex_lock(&k->mu);
        k->stop = 1;
        pthread_cond_signal(&k->cv);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->th, NULL);
    }
    if (k->renewed || k->failed)
        tsr_info("leader: the term's start-up took %lld ms (lease renewed %d times meanwhile%s)",
                 (long long)ms, k->renewed, k->failed ? ", some renewals failed" : "");
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
}

/* Campaigns (no leadership) or checks the leader key is still ours (leadership). */
static void campaign(tsr__coord *c)
{
    tsr_error err = TSR_ERROR_INIT;
    char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    int64_t lease = atomic_load(&c->lead.lease);
    if (!atomic_load(&c->lead.leading) && lease) {
        const char *a = c->lead.advertise;
        tsr_etcd_cmp cmp = {key, TSR_ETCD_CREATE_REV, 0, NULL, 0};
        tsr_etcd_op op = {0, key, a, strlen(a), lease};
        int ok = 0;
        int64_t rev = 0;
        if (tsr_etcd_txn(c->meta->fast, &cmp, 1, &op, 1, &ok, &rev, &err) == 0 && ok) {
            keeper k; /* the start-up below may outlast the TTL */
            int64_t t0 = tsr_clock_mono_ms();
            keeper_start(&k, c, lease);
            /* test hook: a start-up as long as adopting a long stream (test_ha_slow_start) */
            tsr_test_sleep(TSR_KNOB_COORD_SLOW_START_MS, "the term's start-up");
            follow(c); /* start from the committed version, then act */
            retire_due(c, 1); /* groups it removed: out of our fan-outs before we lead */
            if (tsr__stream_adopt(c, &err)) { /* its predecessor's streamed writes */
                tsr_error_log("leader: the streamed writes of the served version: %s "
                              "(streamed writes are refused until a retry works)", err.msg);
                atomic_store(&c->lead.readopt, 1);
            } else {
                atomic_store(&c->lead.readopt, 0);
            }
            tsr__snap *sn = tsr__coord_snap_get(c);
            tsr__oplog_settle(c, sn->version); /* updates its predecessor left running */
            tsr__snap_unref(sn);
            atomic_store(&c->lead.term, rev);
            tsr__stream_catch_up_all(c); /* with our term: replicas the old leader left behind */
            keeper_stop(&k, tsr_clock_mono_ms() - t0);
            set_addr(c, a);
            atomic_store(&c->lead.leading, 1);
            tsr_info("leader: elected (term %lld)", (long long)rev);
            pthread_cond_broadcast(&c->rec_cv); /* reconcile: settle the shards now */
            return;
        }
    }
    if (atomic_load(&c->lead.leading) && atomic_load(&c->lead.readopt))
        readopt(c);
    tsr_etcd_kv kv;
    int rc = tsr_etcd_get(c->meta->fast, key, &kv, NULL, &err);
    if (rc == 0) {
        int v = tsr__lead_key_verdict(atomic_load(&c->lead.leading),
                                      atomic_load(&c->lead.term), lease, kv.create_rev,
                                      kv.lease);
        if (v & TSR_LEAD_STEP_DOWN)
            tsr__leader_lost(c, "the leader key is not ours any more");
        if (v & TSR_LEAD_FOLLOW)
            set_addr(c, (const char *)kv.value);
        tsr_etcd_kvs_free(&kv, 1);
        if (v & TSR_LEAD_RELEASE) {
            /* we stepped down (e.g. etcd was unreachable past our margin) but our lease
             * outlived it and still holds the key: give it up, a fresh election follows */
            atomic_store(&c->lead.lease, 0);
            if (tsr_etcd_lease_revoke(c->meta->fast, lease, &err) == 0)
                tsr_info("leader: the key of a term we gave up is released (lease revoked)");
        }
    } else if (rc == TSR_ENOTFOUND) {
        tsr__leader_lost(c, "the leader key is gone");
        set_addr(c, "");
    }
}

/* Refreshes the cached list of live coordinators (GetIndexStats reads it, not etcd). */
static void read_members(tsr__coord *c)
{
    char pre[320];
    tsr__meta_key(c->meta, "/members/", pre, sizeof pre);
    tsr_etcd_kv *kvs = NULL;
    size_t m = 0;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_etcd_get_prefix(c->meta->fast, pre, 32, &kvs, &m, NULL, &err))
        return;
    pthread_mutex_lock(&c->lead.mu);
    c->lead.nmembers = 0;
    for (size_t i = 0; i < m && i < 32; i++)
        snprintf(c->lead.members[c->lead.nmembers++], sizeof c->lead.members[0], "%s",
                 (const char *)kvs[i].value);
    pthread_mutex_unlock(&c->lead.mu);
    tsr_etcd_kvs_free(kvs, m);
    free(kvs);
}

/* The watcher asks the lease thread to campaign now (PREFIX/leader changed). */
static void kick(tsr__coord *c)
{
    pthread_mutex_lock(&c->lead.mu);
    c->lead.kick = 1;
    pthread_cond_broadcast(&c->lead.cv);
    pthread_mutex_unlock(&c->lead.mu);
}

/* The leader compacts etcd's history below the revision it read one interval ago (a
 * watcher up to one interval behind is not cut off; one further behind re-reads, see
 * watch_main). *prev: the revision read last tick (0: none yet, or we did not lead). */
static void compact_tick(tsr__coord *c, int64_t *prev)
{
    if (!atomic_load(&c->lead.leading)) {
        *prev = 0;
        return;
    }
    char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    tsr_etcd_kv kv;
    int64_t rev = 0;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_etcd_get(c->meta->fast, key, &kv, &rev, &err);
    if (rc == 0)
        tsr_etcd_kvs_free(&kv, 1);
    else if (rc != TSR_ENOTFOUND)
        return; /* etcd unreachable: the next tick tries again */
    int already = 0;
    if (*prev > 0 && tsr_etcd_compact(c->meta->fast, *prev, &already, &err) != 0)
        tsr_warn("leader: compacting etcd's history below revision %lld: %s", (long long)*prev,
                 err.msg);
    else if (*prev > 0 && !already)
        tsr_debug("leader: etcd history compacted below revision %lld", (long long)*prev);
    if (rev > 0)
        *prev = rev;
}

/* The lease thread: lease renewal, members and the fallback read of PREFIX/version every
 * period; the election then too while leading or while the watch on PREFIX/leader is down,
 * else every 3 periods (a safety net: the watcher's kick campaigns at once); compaction
 * every compact_s seconds. */
static void *lead_main(void *p)
{
    tsr__coord *c = p;
    int64_t now = tsr_clock_mono_ms(), ok_at = now, next = now, poll_at = now, crev = 0;
    int64_t cms = (int64_t)c->lead.compact_s * 1000, compact_at = now + cms;
    for (;;) {
        pthread_mutex_lock(&c->lead.mu);
        int kicked = c->lead.kick;
        c->lead.kick = 0;
        pthread_mutex_unlock(&c->lead.mu);
        now = tsr_clock_mono_ms();
        if (now >= next) {
            keep_lease(c, &ok_at);
            if (kicked || now >= poll_at || atomic_load(&c->lead.leading) ||
                !atomic_load(&c->lead.lwatch)) {
                campaign(c);
                poll_at = now + 3 * period_ms(c);
            }
            read_members(c);
            if (!atomic_load(&c->lead.leading))
                follow(c);
            retire_due(c, 0);
            next = now + period_ms(c);
        } else if (kicked) {
            campaign(c); /* the leader key changed: an election now, not at the next poll */
        }
        if (cms && now >= compact_at) {
            compact_tick(c, &crev);
            compact_at = now + cms;
        }
        pthread_mutex_lock(&c->lead.mu);
        if (!c->lead.stop && !c->lead.kick) {
            int64_t wake = cms && compact_at < next ? compact_at : next;
            struct timespec ts = tsr_clock_mono_timespec(wake - tsr_clock_mono_ms()); /* <0: 0 */
            pthread_cond_timedwait(&c->lead.cv, &c->lead.mu, &ts);
        }
        int stop = c->lead.stop;
        pthread_mutex_unlock(&c->lead.mu);
        if (stop)
            break;
    }
    return NULL;
}

static int stopping(tsr__coord *c)
{
    pthread_mutex_lock(&c->lead.mu);
    int s = c->lead.stop;
    pthread_mutex_unlock(&c->lead.mu);
    return s;
}

/* A stream key event: a record's completion mark ".../stream/<v>/<seq>/n" is applied. */
static void stream_event(tsr__coord *c, const tsr_etcd_event *e, size_t plen)
{
    unsigned long long v = 0;
    long long seq = 0;
    int used = 0;
    if (e->deleted || sscanf(e->kv.key + plen, "%llu/%lld/n%n", &v, &seq, &used) != 2 ||
        e->kv.key[plen + (size_t)used] != 0 || atomic_load(&c->lead.leading))
        return;
    tsr__snap *sn = tsr__coord_snap_get(c);
    uint64_t served = sn->version;
    tsr__snap_unref(sn);
    if (v > served)
        follow(c); /* moves, then fetches every round of v */
    else if (v == served)
        follow_stream(c, v, seq);
}

/* The watcher's keys, in this order on its one stream. */
enum { W_VERSION, W_STREAM, W_LEADER, W_N };

typedef struct watcher {
    char key[W_N][320];
    size_t n;               /* W_N, or W_LEADER with TSR_LEADER_WATCH=0 (the election polled) */
    int64_t from[W_N];      /* where the next open starts each key (0: re-read first) */
} watcher;

/* Opens the watch stream: from where the last one stopped when it can (nothing missed or
 * repeated), else from a fresh read of the store's revision R (every key from R + 1) and
 * *reread set: the caller then reads what the watch does not replay. A resume point that
 * compaction removed (TSR_ESTATE) falls back to the fresh read: the keys' current state is
 * read again and the watch restarts from the current revision. NULL when etcd is down. */
static tsr_etcd_watch *watch_start(tsr__coord *c, watcher *wt, int *reread)
{
    tsr_error err = TSR_ERROR_INIT;
    *reread = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        if (!wt->from[0]) {
            tsr_etcd_kv kv;
            int64_t rev = 0;
            int rc = tsr_etcd_get(c->meta->etcd, wt->key[W_VERSION], &kv, &rev, &err);
            if (rc == 0)
                tsr_etcd_kvs_free(&kv, 1);
            else if (rc != TSR_ENOTFOUND || rev <= 0)
                return NULL;
            for (size_t i = 0; i < wt->n; i++)
                wt->from[i] = rev + 1;
            *reread = 1;
        }
        tsr_etcd_watch_key keys[W_N];
        for (size_t i = 0; i < wt->n; i++)
            keys[i] = (tsr_etcd_watch_key){wt->key[i], i == W_STREAM, wt->from[i]};
        tsr_etcd_watch *w = NULL;
        int rc = tsr_etcd_watch_open_keys(c->meta->etcd, keys, wt->n, &w, &err);
        if (rc == 0) {
            tsr_info("leader: watching %s/{version,stream/%s} on etcd %s from revision %lld",
                     c->meta->prefix, wt->n > W_LEADER ? ",leader" : "",
                     tsr_etcd_watch_member(w), (long long)wt->from[W_VERSION]);
            return w;
        }
        memset(wt->from, 0, sizeof wt->from);
        if (rc != TSR_ESTATE)
            return NULL;
        tsr_info("leader: the watch could not resume (%s): re-reading from the current "
                 "revision", err.msg);
    }
    return NULL;
}

/* After a fresh (re)start of the watch: what it does not replay is read. */
static void watch_caught_up(tsr__coord *c, const watcher *wt)
{
    if (!atomic_load(&c->lead.leading)) { /* changes between the reads and the watch */
        follow(c);
        tsr__snap *sn = tsr__coord_snap_get(c);
        uint64_t v = sn->version;
        tsr__snap_unref(sn);
        tsr_error err = TSR_ERROR_INIT;
        if (!c->lead.adopted) {
            /* First contact since the start: etcd's rounds replace the local log, whose
             * last round may never have reached etcd (killed between the append and the
             * mirror) — a follower keeping it would skip the real round of that seq
             * (tests/integration/test_ha_round_logged.py). */
            if (tsr__stream_adopt(c, &err))
                tsr_warn("leader: the streamed writes of version %" PRIu64 " from etcd: %s",
                         v, err.msg);
            else
                c->lead.adopted = 1;
        }
        follow_stream(c, v, -1);
    }
    if (wt->n > W_LEADER)
        kick(c); /* the leader key as it is now */
}

/* The watcher: one stream on PREFIX/version (a follower moves as soon as it changes),
 * PREFIX/stream/ (a follower replays the leader's streamed rounds) and PREFIX/leader (a
 * deleted or replaced leader key makes the lease thread campaign at once). While it is
 * down the lease thread's periodic reads are the fallback. */
static void *watch_main(void *p)
{
    tsr__coord *c = p;
    watcher wt;
    memset(&wt, 0, sizeof wt);
    tsr__meta_key(c->meta, "/version", wt.key[W_VERSION], sizeof wt.key[0]);
    tsr__meta_key(c->meta, "/stream/", wt.key[W_STREAM], sizeof wt.key[0]);
    tsr__meta_key(c->meta, "/leader", wt.key[W_LEADER], sizeof wt.key[0]);
    const char *lw = tsr_test_knob(TSR_KNOB_LEADER_WATCH); /* "0": the election polled (bench) */
    wt.n = lw && strcmp(lw, "0") == 0 ? W_LEADER : W_N;
    size_t plen = strlen(wt.key[W_STREAM]);
    tsr_etcd_watch *w = NULL;
    while (!stopping(c)) {
        tsr_error err = TSR_ERROR_INIT;
        if (!w) {
            int reread = 0;
            if (!(w = watch_start(c, &wt, &reread))) {
                pthread_mutex_lock(&c->lead.mu);
                if (!c->lead.stop) {
                    struct timespec ts = tsr_clock_mono_timespec(500);
                    pthread_cond_timedwait(&c->lead.cv, &c->lead.mu, &ts);
                }
                pthread_mutex_unlock(&c->lead.mu);
                continue;
            }
            atomic_store(&c->lead.lwatch, wt.n > W_LEADER);
            if (reread)
                watch_caught_up(c, &wt);
        }
        tsr_etcd_event *ev = NULL;
        size_t n = 0;
        int rc = tsr_etcd_watch_next(w, 250, &ev, &n, &err);
        if (rc == TSR_ETIMEOUT)
            continue;
        if (rc) { /* the member went away, or compaction cut the watch off */
            if (rc == TSR_ESTATE)
                tsr_info("leader: the watch could not resume (%s): re-reading from the "
                         "current revision", err.msg);
            else
                tsr_warn("leader: the watch on etcd %s ended: %s", tsr_etcd_watch_member(w),
                         err.msg);
            atomic_store(&c->lead.lwatch, 0);
            for (size_t i = 0; i < wt.n; i++)
                wt.from[i] = rc == TSR_ESTATE ? 0 : tsr_etcd_watch_resume_rev(w, i);
            tsr_etcd_watch_close(w);
            w = NULL;
            continue;
        }
        int moved = 0, leader = 0;
        for (size_t i = 0; i < n; i++) {
            if (ev[i].watch == W_VERSION)
                moved = 1;
            else if (ev[i].watch == W_STREAM)
                stream_event(c, &ev[i], plen);
            else if (ev[i].watch == W_LEADER)
                leader = 1;
        }
        tsr_etcd_events_free(ev, n);
        if (leader)
            kick(c);
        if (moved && !atomic_load(&c->lead.leading))
            follow(c);
    }
    atomic_store(&c->lead.lwatch, 0);
    tsr_etcd_watch_close(w);
    return NULL;
}

int tsr__leader_start(tsr__coord *c)
{
    if (!c->meta)
        return 0;
    pthread_mutex_lock(&c->lead.mu);
    int rc = pthread_create(&c->lead.thread, NULL, lead_main, c);
    c->lead.live = rc == 0;
    if (rc == 0) /* without the watcher, followers still move on the periodic read */
        c->lead.wlive = pthread_create(&c->lead.wthread, NULL, watch_main, c) == 0;
    pthread_mutex_unlock(&c->lead.mu);
    return rc ? TSR_EINTERNAL : 0;
}

void tsr__leader_stop(tsr__coord *c)
{
    if (!c->meta)
        return;
    pthread_mutex_lock(&c->lead.mu);
    c->lead.stop = 1;
    pthread_cond_broadcast(&c->lead.cv);
    int live = c->lead.live, wlive = c->lead.wlive;
    pthread_mutex_unlock(&c->lead.mu);
    if (live)
        pthread_join(c->lead.thread, NULL);
    if (wlive)
        pthread_join(c->lead.wthread, NULL);
    atomic_store(&c->lead.leading, 0);
    int64_t lease = atomic_exchange(&c->lead.lease, 0);
    tsr_error err = TSR_ERROR_INIT;
    if (lease && tsr_etcd_lease_revoke(c->meta->fast, lease, &err) == 0)
        tsr_info("leader: lease revoked (leadership and membership released)");
}

void tsr__leader_members(tsr__coord *c, char ***addrs, size_t *n, char *leader, size_t cap)
{
    *addrs = NULL;
    *n = 0;
    pthread_mutex_lock(&c->lead.mu);
    snprintf(leader, cap, "%s", c->meta ? c->lead.addr : "");
    if (c->meta) {
        *addrs = tsr_xcalloc(c->lead.nmembers + 1, sizeof **addrs);
        for (size_t i = 0; i < c->lead.nmembers; i++)
            (*addrs)[i] = tsr_xstrdup(c->lead.members[i]);
        *n = c->lead.nmembers;
    }
    pthread_mutex_unlock(&c->lead.mu);
}

int tsr__leader_check(tsr__coord *c, tsr_rpc_reply *r)
{
    if (!c->meta)
        return 0;
    int rc = tsr__coord_refuse_follower(c, r);
    if (rc)
        return rc;
    char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    tsr_etcd_kv kv;
    tsr_error err = TSR_ERROR_INIT;
    rc = tsr_etcd_get(c->meta->fast, key, &kv, NULL, &err);
    if (rc && rc != TSR_ENOTFOUND)
        return tsr_rpc_reply_error(r, TSR_RPC_UNAVAILABLE, "etcd unreachable, no update starts "
                                   "(queries go on from version being served): %s", err.msg);
    int ours = rc == 0 && kv.create_rev == atomic_load(&c->lead.term);
    if (rc == 0)
        tsr_etcd_kvs_free(&kv, 1);
    if (!ours)
        tsr__leader_lost(c, "the leader key is not ours any more");
    return tsr__coord_refuse_follower(c, r);
}
