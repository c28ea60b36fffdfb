/*
 * stream — the streamed writes' overlay and version log (this file), with the queue and
 * writer in stream_write.c and catch-up and recovery in stream_recover.c.
 *
 * Streamed writes (docs/streaming.md): tessera.v1 UpsertDatapoints and
 * RemoveDatapoints, and the same entry points for the aiplatform.v1 IndexService.
 *
 *   validate   on the caller's thread: every datapoint as a batch record is
 *              (common/batch tsr_batch_record_check), cosine vectors normalised, lists
 *              assigned (update_plan's tsr__assign_records); all or nothing;
 *   queue      the request waits for the round that takes it;
 *   round      ONE writer thread: takes every queued request (group commit, at most
 *              ROUND_MAX records), resolves ids against the directory (the snapshot's
 *              plus the overlay), gives labels (an id that stays in its group keeps its
 *              label, a moved one gets a new label and a delete of the old one on its old
 *              group), one ShardWriteRequest per touched group with one seq per round;
 *              appends the round to the coordinator log (stream_log.c, fsync), sends Write
 *              to every live replica of each touched group in parallel; a replica that
 *              fails is marked stream_behind (not queried, caught up by reconcile); then
 *              the overlay is updated and the requests are acknowledged;
 *   overlay    id -> entry or tombstone on top of the snapshot's directory, for
 *              ReadIndexDatapoints, GetIndexStats and the next update's plan;
 *   restart    the log of the committed version is replayed into the overlay, the label
 *              counter and the seqs; the writer thread resends every replica what it
 *              missed before its first round.
 *
 * DESIGN (threads, locks): st.mu (the stream lock) is held by the writer for a round, by
 * an update from its plan through its Commit fan-out (update.c), by a reshard move while
 * it plans and sends every group's Stage chunk 0 and again from its catch-up (the rounds
 * it ran meanwhile, carried to the new version: reshard_carry.c) through its Commit
 * fan-out, and by a catch-up (reconcile.c). The overlay is written only under st.mu and
 * st.ov_rw (write); queries read it under st.ov_rw (read), briefly, and take their
 * snapshot inside it so the two agree. The queue has its own q_mu. Lock order:
 * update_mu, st.mu, st.ov_rw, snap_mu; q_mu is never held with another lock.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch/batch.h"
#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"
#include "net/pb_datapoint.h"
#include "tessera/v1/coord_log.pb-c.h"
#include "stream_int.h"

/* ---------------------------------------------------------------- directory */

/* The entry of id now: the overlay's (a tombstone = none), else the snapshot's. Caller
 * holds st.mu or st.ov_rw. */
const tsr__dir_entry *tsr__stream_lookup(const tsr__coord *c, const tsr__snap *sn, const char *id)
{
    if (c->st->ov_version == sn->version) {
        const tsr__dir_entry *e = tsr__dir_find(&c->st->ov, id);
        if (e)
            return e->dead ? NULL : e;
    }
    return tsr__dir_find(&sn->dir, id);
}

tsr__snap *tsr__stream_resolve(tsr__coord *c, char *const *ids, size_t n, tsr__loc *out,
                               int64_t *seqs)
{
    pthread_rwlock_rdlock(&c->st->ov_rw);
    tsr__snap *sn = tsr__coord_snap_get(c);
    for (size_t g = 0; seqs && g <= TSR_COORD_MAX_SHARDS; g++)
        seqs[g] = c->st->ov_version == sn->version && g < c->cfg.nshards ? c->st->grp_seq[g] : 0;
    for (size_t i = 0; i < n; i++) {
        const tsr__dir_entry *e = tsr__stream_lookup(c, sn, ids[i]);
        out[i].found = e != NULL;
        out[i].label = e ? e->label : -1;
        out[i].list = e ? e->list : -1;
        out[i].shard = e ? e->shard : -1;
    }
    pthread_rwlock_unlock(&c->st->ov_rw);
    return sn;
}

void tsr__stream_counts(tsr__coord *c, const tsr__snap *sn, int64_t *ndense, int64_t *nsparse)
{
    pthread_rwlock_rdlock(&c->st->ov_rw);
    int same = c->st->ov_version == sn->version;
    *ndense = sn->ndense + (same ? c->st->d_dense : 0);
    *nsparse = sn->nsparse + (same ? c->st->d_sparse : 0);
    pthread_rwlock_unlock(&c->st->ov_rw);
}

/* Sets id's overlay entry (the writer, under st.mu; takes ov_rw) and the counts. */
void tsr__stream_ov_apply(tsr__coord *c, const tsr__snap *sn, const char *id, int64_t label,
                          int32_t list, int32_t shard, int dense, int sparse, int dead)
{
    const tsr__dir_entry *old = tsr__stream_lookup(c, sn, id);
    if (old) {
        c->st->d_dense -= old->dense;
        c->st->d_sparse -= old->sparse;
    }
    if (!dead) {
        c->st->d_dense += dense != 0;
        c->st->d_sparse += sparse != 0;
    }
    tsr__stream *s = c->st;
    tsr__dir_entry *e = tsr__dir_set(&s->ov, id, label, list, shard, dense, sparse, dead);
    s->ov_records++;
    if (s->ntouched == s->ctouched) {
        s->ctouched = s->ctouched ? s->ctouched * 2 : 1024;
        s->touched = tsr_xrealloc(s->touched, s->ctouched * sizeof *s->touched);
    }
    s->touched[s->ntouched++] = (size_t)(e - s->ov.e);
}

/* The overlay after one logged round (the live round and the replay at start share it). */
void tsr__stream_apply_record(tsr__coord *c, const tsr__snap *sn,
                              const Tessera__V1__CoordLogRecord *rec)
{
    for (size_t k = 0; k < rec->n_writes; k++) {
        const Tessera__V1__CoordLogWrite *lw = rec->writes[k];
        if (!lw->write || lw->group < 0 || (size_t)lw->group >= c->cfg.nshards)
            continue;
        for (size_t u = 0; u < lw->write->n_upserts; u++) {
            const Tessera__V1__StagedUpsert *up = lw->write->upserts[u];
            const Tessera__V1__IndexDatapoint *dp = up->datapoint;
            if (!dp || !dp->datapoint_id)
                continue;
            tsr__stream_ov_apply(c, sn, dp->datapoint_id, up->label, up->list, lw->group,
                     dp->n_feature_vector > 0, dp->sparse_embedding &&
                     dp->sparse_embedding->n_values > 0, 0);
        }
        c->st->grp_seq[lw->group] = rec->seq;
    }
    for (size_t k = 0; k < rec->n_removed_ids; k++)
        tsr__stream_ov_apply(c, sn, rec->removed_ids[k], -1, -1, -1, 0, 0, 1);
    if (rec->seq >= c->st->next_seq)
        c->st->next_seq = rec->seq + 1;
    if (rec->next_label > c->st->next_label)
        c->st->next_label = rec->next_label;
}

/* Sends the round's writes to every live replica of the touched groups; marks the ones that
 * miss it behind; R->failed[g] when no replica of g took it. */

/* A header for the log of version: the stream's counters now, the first n group seqs
 * replaced by seqs[] when given (a catch-up's: the new version's). */
int tsr__stream_write_header(tsr__coord *c, uint64_t version, int64_t next_label,
                             const int64_t *seqs, size_t n, tsr_error *err)
{
    int64_t gs[TSR_COORD_MAX_SHARDS + 1];
    memcpy(gs, c->st->grp_seq, sizeof gs);
    for (size_t g = 0; seqs && g < n && g < TSR_COORD_MAX_SHARDS; g++)
        gs[g] = seqs[g];
    Tessera__V1__CoordLogRecord h = TESSERA__V1__COORD_LOG_RECORD__INIT;
    h.version = (int64_t)version;
    h.next_label = next_label;
    h.next_seq = c->st->next_seq;
    h.group_seq = gs;
    h.n_group_seq = c->cfg.nshards;
    int rc = tsr__slog_create(c->store, version, &h, err);
    return rc ? rc : tsr__shlog_mirror(c, &h, err);
}

/* Removes the logs of other versions than `keep` (a crash between a commit point and the
 * removal of the old log, or before the commit point after the new log's header). */

/* ---------------------------------------------------------------- a move's catch-up */

/* (the rounds carried to the new version: reshard_carry.c) */
int64_t tsr__stream_last_seq(tsr__coord *c)
{
    return c->st->next_seq - 1;
}

uint64_t tsr__stream_log_version(tsr__coord *c)
{
    return c->st->log_fd >= 0 ? c->st->log_version : 0;
}

int64_t tsr__stream_log_offset(tsr__coord *c)
{
    return c->st->log_fd >= 0 ? c->st->log_bytes : 0;
}

/* ---------------------------------------------------------------- updates */

void tsr__stream_freeze(tsr__coord *c) { pthread_mutex_lock(&c->st->mu); }
void tsr__stream_thaw(tsr__coord *c) { pthread_mutex_unlock(&c->st->mu); }

int64_t tsr__stream_group_seq(tsr__coord *c, size_t g)
{
    return g < c->cfg.nshards ? c->st->grp_seq[g] : 0;
}

tsr__snap *tsr__stream_snap_seqs(tsr__coord *c, int64_t *seqs, size_t cap, int64_t *last)
{
    pthread_rwlock_rdlock(&c->st->ov_rw);
    tsr__snap *sn = tsr__coord_snap_get(c);
    int same = c->st->ov_version == sn->version;
    for (size_t g = 0; g < cap; g++)
        seqs[g] = same && g < c->cfg.nshards ? c->st->grp_seq[g] : 0;
    *last = same ? c->st->next_seq - 1 : -1;
    pthread_rwlock_unlock(&c->st->ov_rw);
    return sn;
}

int tsr__stream_version_begin(tsr__coord *c, uint64_t version, int64_t next_label,
                              const int64_t *seqs, size_t n, tsr_error *err)
{
    return tsr__stream_write_header(c, version, next_label, seqs, n, err);
}

/* Removes version's local coordinator log (not its mirror in etcd). */
static void remove_log(tsr__coord *c, uint64_t version)
{
    char path[4200];
    tsr__slog_path(c->store, version, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        tsr_warn("%s: cannot remove: %s", path, strerror(errno));
}

void tsr__stream_version_abort(tsr__coord *c, uint64_t version)
{
    remove_log(c, version);
    tsr__shlog_drop(c, version);
}

void tsr__stream_publish(tsr__coord *c, tsr__snap *ns, const int64_t *seqs, size_t n,
                         int carried)
{
    tsr__stream *s = c->st;
    uint64_t old = s->log_version, v = ns->version;
    int64_t folded = s->ov_records;
    pthread_rwlock_wrlock(&s->ov_rw);
    s->next_label = ns->next_label;
    for (size_t g = 0; seqs && g < n && g < TSR_COORD_MAX_SHARDS; g++)
        s->grp_seq[g] = seqs[g]; /* with the snapshot: queries on N never demand N+1's */
    tsr__snap *was = tsr__coord_snap_swap(c, ns);
    tsr__dir ov = s->ov; /* freed below, outside the lock the queries read it under */
    tsr__dir_init(&s->ov);
    s->ov_version = v;
    s->ov_records = s->d_dense = s->d_sparse = 0;
    s->ntouched = 0;
    pthread_rwlock_unlock(&s->ov_rw);
    tsr__dir_close(&ov);
    tsr__snap_unref(was); /* an update's base ref keeps it: update.c retires it */
    if (s->log_fd >= 0)
        close(s->log_fd);
    s->log_fd = -1;
    s->log_version = 0;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr__slog_open(c->store, v, &s->log_fd, &s->log_bytes, &err) == 0)
        s->log_version = v;
    else /* streamed writes answer UNAVAILABLE until a restart creates it */
        tsr_error_log("stream: %s", err.msg);
    if (old && old != v) { /* folded into v: the old log is not needed ... */
        remove_log(c, old);
        if (!carried) /* ... nor its mirror, unless v's record names rounds of it */
            tsr__shlog_drop(c, old);
    }
    if (v > 2 && old != v - 2) /* a carried mirror two versions back (kept for v - 1) */
        tsr__shlog_drop(c, v - 2);
    if (folded)
        tsr_info("stream: version %llu folds %lld streamed writes", (unsigned long long)v,
                 (long long)folded);
    tsr_metrics_gauge_set("tessera_stream_log_bytes", NULL, (double)s->log_bytes);
    tsr_metrics_gauge_set("tessera_stream_overlay_records", NULL, 0);
}

int64_t tsr__stream_overlay_records(tsr__coord *c)
{
    pthread_rwlock_rdlock(&c->st->ov_rw);
    int64_t n = c->st->ov_records;
    pthread_rwlock_unlock(&c->st->ov_rw);
    return n;
}

int tsr__stream_fold_due(tsr__coord *c)
{
    pthread_rwlock_rdlock(&c->st->ov_rw);
    int due = c->cfg.stream_fold_records > 0 &&
              c->st->ov_records >= (int64_t)c->cfg.stream_fold_records;
    pthread_rwlock_unlock(&c->st->ov_rw);
    return due;
}
