/*
 * stream — the shard side of streamed writes (docs/streaming.md "On the shard"): the
 * Write call (validate whole, deduplicate by seq, append to the version's write-ahead
 * log, fdatasync by group commit, apply to the version's delta, publish), the start-up
 * replay of the current version's log, and the switch of the log at Commit.
 *
 * Seq: a version's applied seq is its delta's seq, or the seq folded into it (its
 * "stream" file) while it has no delta. A Write with a seq at or below the last appended
 * one is acknowledged without being applied again (it waits until that seq is applied).
 *
 * Group commit: a Write appends under write_mu, then either becomes the leader (no sync
 * running: it fdatasyncs with write_mu released, covering every append made before it
 * started) or waits for the running sync; Writes are applied in append order (tickets).
 * A failed fdatasync or apply leaves the log ahead of the delta: the shard then refuses
 * every further Write ("broken") until a restart replays the log.
 *
 * Catch-up versions (update.c, StageRequest.capture_delta): a prepared version with a log
 * of its own, wal/v<N+1>.log, created empty at its Prepare. Writes naming it are appended
 * and fdatasync'ed one at a time under write_mu (its only writer is the coordinator's
 * catch-up), then applied to its delta; Writes to the current version are not refused
 * while it waits. Its Commit makes its log the current one (open_log appends to it); its
 * Abort removes the log; at start-up a held prepared version with a log is replayed and
 * marked a catch-up version again.
 *
 * DESIGN (threads): Writes run on the rpc worker pool. write_mu guards the log and the
 * fields of tsr__shard marked so; a delta is published by one pointer swap under
 * table_mu (readers take their reference there). Lock order: update_mu, write_mu,
 * table_mu.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/metrics.h"
#include "shard.h"

static void wal_path(const tsr__shard *s, int64_t version, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/wal/v%" PRId64 ".log", s->dir, version);
}

/* A ref to the current version (its delta pointer is read under write_mu: only a
 * writer holding it changes it). */
static tsr__version *current(tsr__shard *s)
{
    pthread_mutex_lock(&s->table_mu);
    tsr__version *v = tsr__version_ref(s->current);
    pthread_mutex_unlock(&s->table_mu);
    return v;
}

static void publish(tsr__shard *s, tsr__version *v, tsr__delta *nd)
{
    pthread_mutex_lock(&s->table_mu);
    tsr__delta *old = v->delta;
    v->delta = nd;
    pthread_mutex_unlock(&s->table_mu);
    tsr__delta_unref(old);
}

/* A prepared version newer than the current one (a fold waiting for Commit or Abort);
 * a catch-up version does not count: the writes it misses are the coordinator's to carry
 * into it. */
static int64_t prepared_pending(tsr__shard *s)
{
    int64_t p = 0;
    pthread_mutex_lock(&s->table_mu);
    for (size_t i = 0; i < s->nheld; i++)
        if (s->held[i].state == TSR__PREPARED && s->held[i].v->version > s->current->version &&
            !s->held[i].v->catchup)
            p = s->held[i].v->version;
    pthread_mutex_unlock(&s->table_mu);
    return p;
}

/* A ref to the prepared catch-up version `version` (newer than the current one), or NULL. */
static tsr__version *catchup_version(tsr__shard *s, int64_t version)
{
    tsr__version *v = NULL;
    pthread_mutex_lock(&s->table_mu);
    for (size_t i = 0; i < s->nheld; i++)
        if (s->held[i].v->version == version && s->held[i].state == TSR__PREPARED &&
            s->held[i].v->catchup && version > s->current->version)
            v = tsr__version_ref(s->held[i].v);
    pthread_mutex_unlock(&s->table_mu);
    return v;
}

/* Validates rq against version v (whole) and converts it: recs (n_upserts + 1 slots) and
 * dels (n_deletes + 1). */
static int check_write(const tsr__version *v, const Tessera__V1__ShardWriteRequest *rq,
                       tsr__rec **recs, size_t *nrecs, int64_t *dels, tsr_error *err)
{
    if (rq->version != v->version)
        return tsr_err(err, TSR_ESTATE, "ShardWriteRequest.version %lld: the shard's current "
                       "version is %lld", (long long)rq->version, (long long)v->version);
    if (rq->seq <= 0)
        return tsr_err(err, TSR_EINVAL, "ShardWriteRequest.seq %lld: must be > 0",
                       (long long)rq->seq);
    if (v->tmpl == NULL)
        return tsr_err(err, TSR_ESTATE, "ShardWriteRequest: version %lld is empty (no index "
                       "yet): a first version comes through Stage/Prepare/Commit",
                       (long long)v->version);
    int rc = tsr__convert_edits(v->tmpl, v->owned, rq->upserts, rq->n_upserts, rq->deletes,
                                rq->n_deletes, recs, nrecs, err);
    if (rc != 0) {
        tsr_err_prefix(err, "ShardWriteRequest");
        return rc;
    }
    for (size_t i = 0; i < rq->n_deletes; i++)
        dels[i] = rq->deletes[i]->label;
    return 0;
}

static void set_broken(tsr__shard *s, const char *why)
{
    if (!s->broken)
        tsr_error_log("streamed writes refused until a restart: %s", why);
    s->broken = 1;
    snprintf(s->broken_msg, sizeof s->broken_msg, "%.200s", why);
    pthread_cond_broadcast(&s->write_cv);
}

/* Group commit: returns once the log is durable up to end (caller holds write_mu). */
static void sync_to(tsr__shard *s, uint64_t end)
{
    while (!s->broken && s->synced < end) {
        if (s->syncing) {
            pthread_cond_wait(&s->write_cv, &s->write_mu);
            continue;
        }
        s->syncing = 1;
        uint64_t target = s->wal.size;
        int fd = s->wal.fd;
        char path[sizeof s->wal.path];
        memcpy(path, s->wal.path, sizeof path);
        pthread_mutex_unlock(&s->write_mu);
        tsr_error e = TSR_ERROR_INIT;
        int rc = tsr_applog_sync_fd(fd, path, &e);
        pthread_mutex_lock(&s->write_mu);
        s->syncing = 0;
        if (rc != 0)
            set_broken(s, e.msg);
        else if (target > s->synced)
            s->synced = target;
        pthread_cond_broadcast(&s->write_cv);
    }
}

/* Appends, syncs and applies one validated write (caller holds write_mu). */
static int append_apply(tsr__shard *s, tsr__version *v, const uint8_t *raw, size_t len,
                        const Tessera__V1__ShardWriteRequest *rq, tsr__rec **recs,
                        size_t nrecs, const int64_t *dels, tsr_error *err)
{
    int rc = tsr_applog_append(&s->wal, raw, len, 0, err);
    if (rc != 0) {
        if (rc == TSR_ESTATE)
            set_broken(s, err ? err->msg : "a failed append");
        return rc;
    }
    atomic_store(&s->wal_bytes, (int64_t)s->wal.size);
    uint64_t end = s->wal.size, ticket = ++s->tickets;
    s->appended_seq = rq->seq;
    s->inflight++;
    sync_to(s, end);
    while (!s->broken && s->applied_tickets != ticket - 1)
        pthread_cond_wait(&s->write_cv, &s->write_mu);
    if (s->broken) {
        rc = tsr_err(err, TSR_EIO, "ShardWriteRequest seq %lld: the write-ahead log failed "
                     "(%s); the write's outcome is unknown until a restart",
                     (long long)rq->seq, s->broken_msg);
        goto out;
    }
    tsr__delta *nd = NULL;
    if ((rc = tsr__delta_apply(v, v->delta, recs, nrecs, dels, rq->n_deletes, rq->seq, &nd,
                               err)) != 0) {
        set_broken(s, err ? err->msg : "apply failed");
        goto out;
    }
    publish(s, v, nd);
    s->applied_tickets = ticket;
out:
    s->inflight--;
    pthread_cond_broadcast(&s->write_cv);
    return rc;
}

/* Test hook of tests/integration/test_reshard_crash.py: with TSR_SHARD_CRASH_AT=catchup
 * the shard _exit(137)s when a Write naming a prepared catch-up version arrives, with
 * =catchup-logged once that Write is appended to the version's log and fdatasync'ed,
 * before it is applied and acknowledged; as a kill -9 there would. */
static void crash_point(const char *step)
{
    tsr_test_crash(TSR_KNOB_SHARD_CRASH_AT, step);
}

/* A Write naming the prepared catch-up version pv (caller holds write_mu, no pause
 * pending, rq converted against pv): appended to pv's own log and fdatasync'ed right
 * away (one caller, the coordinator's catch-up, one Write at a time: no group commit),
 * then applied to pv's delta. A resend (seq at or below pv's applied seq) is
 * acknowledged without being applied again. */
static int write_catchup(tsr__shard *s, tsr__version *pv, const uint8_t *raw, size_t len,
                         const Tessera__V1__ShardWriteRequest *rq, tsr__rec **recs,
                         size_t nrecs, const int64_t *dels, tsr_error *err)
{
    if (rq->seq <= tsr__applied_seq(pv, pv->delta))
        return 0;
    char path[4200];
    wal_path(s, pv->version, path, sizeof path);
    tsr_applog w;
    int rc = tsr_applog_open(&w, path, TSR__WAL_MAX_RECORD, TSR_APPLOG_CREATE, err);
    if (rc == 0)
        rc = tsr_applog_append(&w, raw, len, TSR_APPLOG_SYNC, err);
    tsr_applog_close(&w);
    if (rc == 0)
        crash_point("catchup-logged"); /* test hook: durable, not acknowledged */
    if (rc != 0) {
        /* the log may hold part of it or all of it: its outcome is known after a restart */
        set_broken(s, err ? err->msg : "a failed append to a catch-up log");
        return rc;
    }
    tsr__delta *nd = NULL;
    if ((rc = tsr__delta_apply(pv, pv->delta, recs, nrecs, dels, rq->n_deletes, rq->seq, &nd,
                               err)) != 0) {
        set_broken(s, err ? err->msg : "apply failed");
        return rc;
    }
    publish(s, pv, nd);
    pthread_cond_broadcast(&s->write_cv);
    return 0;
}

int tsr__shard_write(tsr__shard *s, const uint8_t *raw, size_t len,
                     const Tessera__V1__ShardWriteRequest *rq,
                     Tessera__V1__ShardWriteResponse *resp, tsr_error *err)
{
    int rc = 0;
    size_t nrecs = 0;
    tsr__rec **recs = tsr_try_calloc(rq->n_upserts + 1, sizeof *recs);
    int64_t *dels = tsr_try_malloc(rq->n_deletes + 1, sizeof *dels);
    tsr__version *v = NULL;
    if (!recs || !dels) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto done;
    }
    pthread_mutex_lock(&s->write_mu);
    while (s->pausing)
        pthread_cond_wait(&s->write_cv, &s->write_mu);
    v = current(s);
    if (rq->version != v->version) {
        tsr__version *pv = catchup_version(s, rq->version);
        if (pv != NULL) {
            crash_point("catchup"); /* test hook: on arrival, nothing logged */
            tsr__version_unref(v);
            v = pv;
            if ((rc = check_write(v, rq, recs, &nrecs, dels, err)) != 0)
                goto out;
            if (s->broken) {
                rc = tsr_err(err, TSR_EIO, "ShardWriteRequest: the write-ahead log failed (%s): "
                             "restart the shard", s->broken_msg);
                goto out;
            }
            if ((rc = write_catchup(s, v, raw, len, rq, recs, nrecs, dels, err)) != 0)
                goto out;
            atomic_fetch_add(&s->writes, 1);
            atomic_fetch_add(&s->write_records, (int64_t)(rq->n_upserts + rq->n_deletes));
            tsr_metrics_counter_add("tessera_shard_stream_writes_total", NULL, 1);
            tsr_metrics_counter_add("tessera_shard_stream_records_total", NULL,
                                    (double)(rq->n_upserts + rq->n_deletes));
            goto reply;
        }
    }
    if ((rc = check_write(v, rq, recs, &nrecs, dels, err)) != 0)
        goto out;
    int64_t p = prepared_pending(s);
    if (p) {
        rc = tsr_err(err, TSR_ESTATE, "ShardWriteRequest: version %lld is prepared (a fold of "
                     "version %lld); writes wait for its Commit or Abort", (long long)p,
                     (long long)v->version);
        goto out;
    }
    if (s->broken) {
        rc = tsr_err(err, TSR_EIO, "ShardWriteRequest: the write-ahead log failed (%s): "
                     "restart the shard", s->broken_msg);
        goto out;
    }
    if (rq->seq <= s->appended_seq) {
        /* A resend: acknowledged once that seq is applied, never applied twice. */
        while (!s->broken && tsr__applied_seq(v, v->delta) < rq->seq)
            pthread_cond_wait(&s->write_cv, &s->write_mu);
        if (tsr__applied_seq(v, v->delta) < rq->seq) {
            rc = tsr_err(err, TSR_EIO, "ShardWriteRequest seq %lld: the write-ahead log "
                         "failed (%s) before it was applied", (long long)rq->seq,
                         s->broken_msg);
            goto out;
        }
    } else if ((rc = append_apply(s, v, raw, len, rq, recs, nrecs, dels, err)) != 0) {
        goto out;
    } else {
        atomic_fetch_add(&s->writes, 1);
        atomic_fetch_add(&s->write_records, (int64_t)(rq->n_upserts + rq->n_deletes));
        tsr_metrics_counter_add("tessera_shard_stream_writes_total", NULL, 1);
        tsr_metrics_counter_add("tessera_shard_stream_records_total", NULL,
                                (double)(rq->n_upserts + rq->n_deletes));
    }
reply:
    resp->applied_seq = tsr__applied_seq(v, v->delta);
    resp->delta_records = v->delta ? (int64_t)(v->delta->nrecs + v->delta->ndeletes) : 0;
out:
    pthread_mutex_unlock(&s->write_mu);
done:
    for (size_t i = 0; i < nrecs; i++)
        tsr__rec_unref(recs[i]);
    free(recs);
    free(dels);
    tsr__version_unref(v);
    return rc;
}

/* ------------------------------------------------------------------ start-up */

typedef struct replay_ctx {
    tsr__version *v;
    uint64_t skipped;
} replay_ctx;

/* One log record into the version's delta: refused (so the tail from it is dropped) when
 * it does not parse, names another version or does not validate. */
static int replay_one(void *ctx, const uint8_t *p, size_t n, uint64_t off, tsr_error *err)
{
    (void)off; /* the log names the offset of a refused record itself */
    replay_ctx *c = ctx;
    tsr__version *v = c->v;
    int rc;
    size_t nrecs = 0;
    tsr__rec **recs = NULL;
    int64_t *dels = NULL;
    tsr__delta *nd = NULL;
    Tessera__V1__ShardWriteRequest *rq = tessera__v1__shard_write_request__unpack(NULL, n, p);
    if (rq == NULL)
        return tsr_err(err, TSR_EFORMAT, "not a ShardWriteRequest");
    recs = tsr_try_calloc(rq->n_upserts + 1, sizeof *recs);
    dels = tsr_try_malloc(rq->n_deletes + 1, sizeof *dels);
    if (!recs || !dels) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = check_write(v, rq, recs, &nrecs, dels, err)) != 0) {
        if (rc != TSR_ENOMEM)
            rc = TSR_EFORMAT;
        goto out;
    }
    if (rq->seq <= tsr__applied_seq(v, v->delta)) {
        c->skipped++; /* already applied (a resend logged twice cannot happen; be safe) */
        goto out;
    }
    if ((rc = tsr__delta_apply(v, v->delta, recs, nrecs, dels, rq->n_deletes, rq->seq, &nd,
                               err)) != 0)
        goto out;
    tsr__delta_unref(v->delta); /* no reader yet: the shard is not serving */
    v->delta = nd;
out:
    for (size_t i = 0; i < nrecs; i++)
        tsr__rec_unref(recs[i]);
    free(recs);
    free(dels);
    tessera__v1__shard_write_request__free_unpacked(rq, NULL);
    return rc;
}

/* The log at path into v's delta (replay_one for each record; a torn or corrupt tail or a
 * refused record is logged and cut off; a missing file is an empty log). *nrec: records
 * replayed, *size: the log's size after. */
static int replay_log(tsr__version *v, const char *path, uint64_t *nrec, uint64_t *size,
                      tsr_error *err)
{
    replay_ctx c = {v, 0};
    tsr_applog_scan r;
    int rc = tsr_applog_scan_file(path, 0, TSR__WAL_MAX_RECORD, TSR_APPLOG_CUT, replay_one, &c,
                                  &r, err);
    if (rc == TSR_ENOTFOUND) {
        tsr_error_clear(err);
        rc = 0;
    }
    *nrec = r.nrec;
    *size = rc == 0 ? r.good : 0;
    return rc;
}

int tsr__stream_replay_fresh(tsr__version *v, const char *path, uint64_t *nrec,
                             uint64_t *size, tsr_error *err)
{
    tsr__delta_unref(v->delta);
    v->delta = NULL;
    tsr_filter_dict_destroy(v->dtags);
    v->dtags = NULL;
    return replay_log(v, path, nrec, size, err);
}

/* A held prepared version newer than cur (start-up: no other thread yet). */
static tsr__version *held_prepared(tsr__shard *s, int64_t version)
{
    for (size_t i = 0; i < s->nheld; i++)
        if (s->held[i].state == TSR__PREPARED && s->held[i].v->version == version &&
            version > s->current->version)
            return s->held[i].v;
    return NULL;
}

/* Removes every log but the current version's and those of held prepared versions (the
 * catch-up versions'; older: folded; any other newer one cannot exist). */
static void remove_other_logs(tsr__shard *s, const char *wdir, int64_t cur)
{
    DIR *dir = opendir(wdir);
    if (dir == NULL)
        return;
    struct dirent *de;
    int removed = 0;
    while ((de = readdir(dir)) != NULL) {
        long long ver;
        char tail[8];
        if (sscanf(de->d_name, "v%lld.%7s", &ver, tail) != 2 || strcmp(tail, "log") != 0)
            continue;
        if (ver == cur || held_prepared(s, ver) != NULL)
            continue;
        char path[4200 + 260];
        snprintf(path, sizeof path, "%s/%s", wdir, de->d_name);
        if (ver < cur)
            tsr_info("%s: the log of version %lld, folded into a newer one: removed", path, ver);
        else
            tsr_warn("%s: a log of version %lld, newer than the current %lld (writes only go "
                     "to the current version): removed", path, ver, (long long)cur);
        if (unlink(path) != 0)
            tsr_warn("%s: cannot remove it: %s", path, strerror(errno));
        removed = 1;
    }
    closedir(dir);
    if (removed)
        tsr_file_fsync_dir(wdir, NULL);
}

/* Opens the log of s->current for appending (write_mu held or alone). */
static int open_log(tsr__shard *s, tsr_error *err)
{
    char path[4200], wdir[4200];
    tsr__version *v = s->current;
    tsr_applog_close(&s->wal);
    s->wal_version = 0;
    s->appended_seq = tsr__applied_seq(v, v->delta);
    atomic_store(&s->wal_bytes, 0);
    if (v->tmpl == NULL)
        return 0; /* the empty version takes no write */
    snprintf(wdir, sizeof wdir, "%s/wal", s->dir);
    wal_path(s, v->version, path, sizeof path);
    struct stat st;
    int existed = stat(path, &st) == 0;
    int rc = tsr_applog_open(&s->wal, path, TSR__WAL_MAX_RECORD, TSR_APPLOG_CREATE, err);
    if (rc == 0 && !existed)
        rc = tsr_file_fsync_dir(wdir, err);
    if (rc != 0)
        return rc;
    s->wal_version = v->version;
    s->synced = s->wal.size;
    atomic_store(&s->wal_bytes, (int64_t)s->wal.size);
    return 0;
}

int tsr__stream_open(tsr__shard *s, tsr_error *err)
{
    char wdir[4200], path[4200];
    snprintf(wdir, sizeof wdir, "%s/wal", s->dir);
    if (mkdir(wdir, 0755) != 0 && errno != EEXIST)
        return tsr_err(err, TSR_EIO, "%s: mkdir: %s", wdir, strerror(errno));
    tsr__version *v = s->current;
    remove_other_logs(s, wdir, v->version);
    /* The catch-up versions first: prepared ones with a log (the Writes that carried the
     * rounds they missed; Commit makes that log the current one). */
    for (size_t i = 0; i < s->nheld; i++) {
        tsr__version *pv = s->held[i].v;
        struct stat sb;
        if (s->held[i].state != TSR__PREPARED || pv->version <= v->version || pv->tmpl == NULL)
            continue;
        wal_path(s, pv->version, path, sizeof path);
        if (stat(path, &sb) != 0)
            continue;
        uint64_t nrec = 0, size = 0;
        int rc = replay_log(pv, path, &nrec, &size, err);
        if (rc != 0)
            return rc;
        pv->catchup = 1;
        tsr_info("%s: prepared catch-up version %lld: %llu writes replayed, applied seq %lld",
                 path, (long long)pv->version, (unsigned long long)nrec,
                 (long long)tsr__applied_seq(pv, pv->delta));
    }
    if (v->tmpl != NULL) {
        uint64_t nrec = 0, size = 0;
        wal_path(s, v->version, path, sizeof path);
        int rc = replay_log(v, path, &nrec, &size, err);
        if (rc != 0)
            return rc;
        if (nrec)
            tsr_info("%s: %llu streamed writes replayed (%llu bytes), applied seq %lld, %zu "
                     "delta records", path, (unsigned long long)nrec, (unsigned long long)size,
                     (long long)tsr__applied_seq(v, v->delta),
                     v->delta ? v->delta->nrecs + v->delta->ndeletes : 0);
    }
    return open_log(s, err);
}

int tsr__stream_catchup_create(tsr__shard *s, int64_t version, tsr_error *err)
{
    char path[4200], wdir[4200];
    wal_path(s, version, path, sizeof path);
    snprintf(wdir, sizeof wdir, "%s/wal", s->dir);
    unlink(path); /* a leftover of an earlier Prepare of this number cannot be ours */
    tsr_applog w;
    int rc = tsr_applog_open(&w, path, TSR__WAL_MAX_RECORD, TSR_APPLOG_CREATE, err);
    if (rc == 0)
        rc = tsr_applog_sync(&w, err);
    tsr_applog_close(&w);
    if (rc == 0)
        rc = tsr_file_fsync_dir(wdir, err);
    if (rc != 0)
        unlink(path);
    return rc;
}

void tsr__stream_catchup_remove(tsr__shard *s, int64_t version)
{
    char path[4200];
    wal_path(s, version, path, sizeof path);
    pthread_mutex_lock(&s->write_mu); /* no Write appends to it meanwhile */
    if (unlink(path) != 0 && errno != ENOENT)
        tsr_warn("%s: cannot remove the log of the dropped version %lld: %s", path,
                 (long long)version, strerror(errno));
    pthread_mutex_unlock(&s->write_mu);
}

void tsr__stream_close(tsr__shard *s)
{
    tsr_applog_close(&s->wal);
}

void tsr__stream_pause(tsr__shard *s)
{
    pthread_mutex_lock(&s->write_mu);
    s->pausing++;
    while (s->inflight > 0 || s->syncing)
        pthread_cond_wait(&s->write_cv, &s->write_mu);
}

void tsr__stream_resume(tsr__shard *s, int switched)
{
    if (switched && s->wal_version != s->current->version) {
        char old[sizeof s->wal.path];
        int64_t oldv = s->wal_version;
        memcpy(old, s->wal.path, sizeof old);
        tsr_error e = TSR_ERROR_INIT;
        if (open_log(s, &e) != 0)
            set_broken(s, e.msg);
        if (oldv > 0) {
            /* CURRENT names the new version durably: the old log is folded. */
            if (unlink(old) != 0 && errno != ENOENT)
                tsr_warn("%s: cannot remove the folded log: %s", old, strerror(errno));
            char wdir[4200];
            snprintf(wdir, sizeof wdir, "%s/wal", s->dir);
            tsr_file_fsync_dir(wdir, NULL);
        }
    }
    s->pausing--;
    pthread_cond_broadcast(&s->write_cv);
    pthread_mutex_unlock(&s->write_mu);
}
