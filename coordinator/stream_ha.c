/*
 * stream_ha — with --etcd, the coordinator log of streamed writes (stream.c, stream_log.c)
 * is mirrored in etcd (meta.h: PREFIX/stream/<version>/<seq>/), so that a new leader
 * continues the stream where its predecessor stopped: the same overlay (ids streamed since
 * the committed version, their labels and groups), label counter, next seq and per-group
 * seqs, rebuilt by replaying the records exactly as a restart replays the local log.
 *
 * Rules: only the leader mirrors (a follower's log is its own scratch); a round is mirrored
 * after its local append and before any Write reaches a shard, and a round whose mirror
 * failed is cut from the local log and refused (nothing written), so etcd holds every round
 * a shard may have applied. A round etcd refused or left in doubt (meta.h: put settles a
 * lost answer for up to the lease's TTL) stops the rounds until etcd's rounds are read
 * again (ask_readopt below): its seq may be taken, and only etcd can say. The header
 * (seq 0) is mirrored when a version's log is created
 * (before the commit point); the records of a version are dropped when the leader moves
 * past it or aborts it.
 *
 * Threads: called under the stream lock (st.mu) by the writer thread, an update and the
 * leader thread. Calls meta and stream_log only.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "coord.h"
#include "meta.h"
#include "core/log.h"
#include "core/mem.h"
#include "tessera/v1/coord_log.pb-c.h"

static int mirroring(tsr__coord *c)
{
    return c->meta != NULL && tsr__coord_leading(c);
}

int tsr__shlog_mirror(tsr__coord *c, const Tessera__V1__CoordLogRecord *rec, tsr_error *err)
{
    if (!mirroring(c))
        return 0;
    return tsr__shlog_mirror_round(c, rec, err);
}

/* A round etcd refused, or whose outcome etcd did not tell: this leader's next seq may be
 * taken, so no round runs (the writer closed the local log) until the lease thread has
 * adopted etcd's rounds again (leader.c campaign, tsr__stream_readopt) — or, when it is not
 * the leader any more, until its successor did. Sets the request and wakes the lease
 * thread (lead.mu is a leaf lock: taken here under st.mu; leader.c's kick() does the
 * same wake-up, not called from here: leader.c calls this file). */
static void ask_readopt(tsr__coord *c)
{
    atomic_store(&c->lead.readopt, 1);
    pthread_mutex_lock(&c->lead.mu);
    c->lead.kick = 1;
    pthread_cond_broadcast(&c->lead.cv);
    pthread_mutex_unlock(&c->lead.mu);
}

int tsr__shlog_mirror_round(tsr__coord *c, const Tessera__V1__CoordLogRecord *rec,
                            tsr_error *err)
{
    if (!c->meta)
        return 0;
    size_t len = tessera__v1__coord_log_record__get_packed_size(rec);
    uint8_t *buf = tsr_xmalloc(len ? len : 1);
    tessera__v1__coord_log_record__pack(rec, buf);
    /* The fence of the commit transaction (leader.c, tsr__leader_fence), built here so that
     * this file does not call back into leader.c: our term and lease must still own the
     * leader key. A refused round is cut (stream.c); the lease thread steps down when it
     * next reads the key (TTL/3). */
    char key[300];
    tsr__meta_key(c->meta, "/leader", key, sizeof key);
    tsr_etcd_cmp fence[2] = {
        {key, TSR_ETCD_CREATE_REV, atomic_load(&c->lead.term), NULL, 0},
        {key, TSR_ETCD_LEASE, atomic_load(&c->lead.lease), NULL, 0},
    };
    int64_t wait_ms = (int64_t)(c->lead.ttl_s > 0 ? c->lead.ttl_s : 5) * 1000;
    int rc = tsr__meta_log_put(c->meta, (uint64_t)rec->version, rec->seq, buf, len, fence, 2,
                               wait_ms, err);
    /* Test hooks, once per process (tests/integration/test_ha_mirror_doubt.py): the same
     * put again, as a try whose answer was lost; or a landed round taken as in doubt. */
    static atomic_int fired;
    if (rc == 0 && rec->seq > 0 && tsr__coord_test_hook("mirror-answer-lost") &&
        !atomic_exchange(&fired, 1))
        rc = tsr__meta_log_put(c->meta, (uint64_t)rec->version, rec->seq, buf, len, fence, 2,
                               wait_ms, err);
    if (rc == 0 && rec->seq > 0 && tsr__coord_test_hook("mirror-doubt") &&
        !atomic_exchange(&fired, 1))
        rc = tsr_err(err, TSR_EUNAVAILABLE, "test hook mirror-doubt: etcd's answer to seq "
                     "%lld taken as lost", (long long)rec->seq);
    free(buf);
    if (rc && rec->seq > 0)
        ask_readopt(c);
    return rc;
}

void tsr__shlog_drop(tsr__coord *c, uint64_t version)
{
    if (mirroring(c))
        tsr__meta_log_drop(c->meta, version);
}

typedef struct restore {
    tsr__coord *c;
    uint64_t version;
    int fd;
    int64_t size, rounds;
    char path[4200];
} restore;

static int restore_one(void *ud, const uint8_t *buf, size_t len, tsr_error *err)
{
    restore *rs = ud;
    Tessera__V1__CoordLogRecord *rec = tessera__v1__coord_log_record__unpack(NULL, len, buf);
    if (!rec)
        return tsr_err(err, TSR_EFORMAT, "etcd: a stream record of version %" PRIu64 " is not "
                       "a packed tessera.v1.CoordLogRecord", rs->version);
    int rc = 0;
    if ((uint64_t)rec->version != rs->version) {
        rc = tsr_err(err, TSR_EFORMAT, "etcd: a stream record of version %" PRIu64 " names "
                     "version %lld", rs->version, (long long)rec->version);
    } else if (rec->seq == 0) { /* the header: a fresh local log */
        if (rs->fd >= 0)
            close(rs->fd);
        rs->fd = -1;
        if ((rc = tsr__slog_create(rs->c->store, rs->version, rec, err)) == 0)
            rc = tsr__slog_open(rs->c->store, rs->version, &rs->fd, &rs->size, err);
    } else if (rs->fd < 0) {
        rc = tsr_err(err, TSR_EFORMAT, "etcd: stream round %lld of version %" PRIu64 " comes "
                     "before its header", (long long)rec->seq, rs->version);
    } else {
        rc = tsr__slog_append(rs->fd, rs->path, rec, &rs->size, err);
        rs->rounds++;
    }
    tessera__v1__coord_log_record__free_unpacked(rec, NULL);
    return rc;
}

int tsr__shlog_restore(tsr__coord *c, uint64_t version, int *found, tsr_error *err)
{
    *found = 0;
    if (!c->meta || version == 0)
        return 0;
    restore rs = {.c = c, .version = version, .fd = -1};
    tsr__slog_path(c->store, version, rs.path, sizeof rs.path);
    int rc = tsr__meta_log_fetch(c->meta, version, -1, restore_one, &rs, err);
    if (rs.fd >= 0) {
        close(rs.fd);
        *found = rc == 0;
        if (rc == 0)
            tsr_info("stream: the log of version %" PRIu64 " restored from etcd (%lld rounds)",
                     version, (long long)rs.rounds);
    }
    return rc;
}
