/*
 * stream_recover — the streamed writes after a failure (stream.h): catch-up of replicas
 * that missed rounds (reconcile, the writer's start, a new leader), the replay of the
 * coordinator log at start, a new leader's adoption of etcd's rounds, and a follower's
 * application of the rounds the leader mirrored. All under the stream lock st.mu.
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

/* ---------------------------------------------------------------- catch-up */

typedef struct resend {
    tsr__coord *c;
    size_t k, g;
    int64_t applied, upto;
    size_t sent;
    int code;
    char msg[1200];
} resend;

static int resend_one(void *ud, const Tessera__V1__CoordLogRecord *rec, int64_t off)
{
    resend *rs = ud;
    (void)off;
    if (rec->seq <= rs->applied || rec->seq > rs->upto)
        return 0;
    for (size_t i = 0; i < rec->n_writes; i++) {
        const Tessera__V1__CoordLogWrite *lw = rec->writes[i];
        if (lw->group != (int32_t)rs->g || !lw->write)
            continue;
        tsr_rpc_result res;
        tsr_rpc_result_init(&res);
        ProtobufCMessage *out = NULL;
        lw->write->leader_term = tsr__coord_term(rs->c); /* logged under an older term */
        int code = tsr_rpc_call_pb(rs->c->rep[rs->k].ch, TSR_SHARD_SVC "Write", &lw->write->base,
                                   &tessera__v1__shard_write_response__descriptor,
                                   rs->c->cfg.stream_write_deadline_ms, &out, &res);
        protobuf_c_message_free_unpacked(out, NULL); /* accepts NULL */
        if (code != TSR_RPC_OK) {
            rs->code = code;
            snprintf(rs->msg, sizeof rs->msg, "Write seq %lld: %s: %s", (long long)rec->seq,
                     tsr_rpc_code_name(code), res.message ? res.message : "");
        }
        tsr_rpc_result_close(&res);
        if (code != TSR_RPC_OK)
            return 1;
        rs->sent++;
    }
    return 0;
}

/* Resends replica k the rounds of its group above applied (st.mu held). */
static int catch_up_locked(tsr__coord *c, size_t k, int64_t applied)
{
    tsr__replica *p = &c->rep[k];
    resend rs = {.c = c, .k = k, .g = p->group, .applied = applied,
                 .upto = c->st->grp_seq[p->group]};
    if (applied < rs.upto) {
        char path[4200], why[300];
        int64_t good = 0;
        tsr_error err = TSR_ERROR_INIT;
        tsr__slog_path(c->store, c->st->log_version, path, sizeof path);
        int rc = tsr__slog_scan(path, 0, resend_one, &rs, &good, why, sizeof why, &err);
        if (rc) {
            rs.code = TSR_RPC_INTERNAL;
            snprintf(rs.msg, sizeof rs.msg, "%s", err.msg);
        }
        if (rs.code != TSR_RPC_OK) {
            atomic_store(&p->stream_behind, 1);
            tsr_warn("stream: shard %zu replica %zu (%s): catching up from seq %lld failed (%s); "
                     "retried by reconcile", p->group, p->index, p->addr, (long long)applied,
                     rs.msg);
            return tsr_rpc_error_from_status(rs.code);
        }
        tsr_info("stream: shard %zu replica %zu (%s): caught up from seq %lld to %lld (%zu "
                 "writes resent)", p->group, p->index, p->addr, (long long)applied,
                 (long long)rs.upto, rs.sent);
        tsr_metrics_counter_add("tessera_stream_catchups_total", NULL, 1);
    }
    if (atomic_exchange(&p->stream_behind, 0))
        tsr_info("stream: shard %zu replica %zu (%s) is up to date (seq %lld): queried and "
                 "written again", p->group, p->index, p->addr, (long long)rs.upto);
    return 0;
}

/* Stats of replica k: its applied seq at the stream's version, or -1 (no answer, or it
 * does not serve that version). */
static int64_t applied_seq(tsr__coord *c, size_t k)
{
    Tessera__V1__ShardStatsRequest rq = TESSERA__V1__SHARD_STATS_REQUEST__INIT;
    Tessera__V1__ShardStatsResponse *st = NULL;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    int code = tsr_rpc_call_pb(c->rep[k].ch, TSR_SHARD_SVC "Stats", &rq.base,
                               &tessera__v1__shard_stats_response__descriptor,
                               c->cfg.search_deadline_ms, (ProtobufCMessage **)&st, &res);
    tsr_rpc_result_close(&res);
    int64_t a = -1;
    if (code == TSR_RPC_OK && st && (uint64_t)st->current_version == c->st->log_version)
        a = st->stream_seq;
    if (st)
        tessera__v1__shard_stats_response__free_unpacked(st, NULL);
    return a;
}

int tsr__stream_catch_up(tsr__coord *c, size_t k, int64_t applied)
{
    tsr__stream *s = c->st;
    tsr__replica *p = &c->rep[k];
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    int behind = atomic_load(&p->stream_behind);
    if (s->log_version == 0 || (!behind && applied >= s->grp_seq[p->group]))
        goto out;
    /* fresh under the lock: the Stats reconcile saw may predate the last rounds */
    applied = applied_seq(c, k);
    if (applied < 0) {
        rc = TSR_EUNAVAILABLE;
        goto out;
    }
    rc = catch_up_locked(c, k, applied);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* At start, before the first round: every replica that serves the version and is behind
 * the log gets what it missed; one that does not answer is marked behind (reconcile
 * catches it up when it is back). */
static void catch_up_all_locked(tsr__coord *c)
{
    tsr__stream *s = c->st;
    for (size_t k = 0; s->log_version && k < c->nrep; k++) {
        if (tsr__replica_removed(c, k))
            continue;
        int64_t a = applied_seq(c, k);
        if (a < 0) {
            if (s->grp_seq[c->rep[k].group] > 0)
                atomic_store(&c->rep[k].stream_behind, 1);
            continue;
        }
        catch_up_locked(c, k, a);
    }
}

static void catch_up_all(tsr__coord *c)
{
    pthread_mutex_lock(&c->st->mu);
    catch_up_all_locked(c);
    pthread_mutex_unlock(&c->st->mu);
}

/* ---------------------------------------------------------------- the writer thread */

void tsr__stream_catch_up_all(tsr__coord *c)
{
    catch_up_all(c);
}

/* ---------------------------------------------------------------- start-up */

typedef struct replay {
    tsr__coord *c;
    const tsr__snap *sn;
    int64_t rounds;
} replay;

static int replay_one(void *ud, const Tessera__V1__CoordLogRecord *rec, int64_t off)
{
    replay *rp = ud;
    tsr__stream *s = rp->c->st;
    (void)off;
    if ((uint64_t)rec->version != rp->sn->version)
        return 0; /* not of this version: ignored */
    if (rec->seq == 0) { /* the header */
        if (rec->next_seq > s->next_seq)
            s->next_seq = rec->next_seq;
        if (rec->next_label > s->next_label)
            s->next_label = rec->next_label;
        for (size_t g = 0; g < rec->n_group_seq && g < rp->c->cfg.nshards; g++)
            s->grp_seq[g] = rec->group_seq[g];
        return 0;
    }
    tsr__stream_apply_record(rp->c, rp->sn, rec);
    rp->rounds++;
    return 0;
}

static void remove_stale_logs(tsr__coord *c, uint64_t keep)
{
    char d[4096], path[4400];
    tsr__slog_dir(c->store, d, sizeof d);
    DIR *dh = opendir(d);
    if (!dh)
        return;
    struct dirent *de;
    while ((de = readdir(dh)) != NULL) {
        unsigned long long v = 0;
        char tail[8] = "";
        if (sscanf(de->d_name, "v%llu.%7s", &v, tail) != 2 || strcmp(tail, "log") != 0 ||
            v == keep)
            continue;
        snprintf(path, sizeof path, "%s/%s", d, de->d_name);
        if (unlink(path) == 0)
            tsr_info("stream: removed %s (not the committed version's log)", path);
    }
    closedir(dh);
}

static int load_log(tsr__coord *c, const tsr__snap *sn, tsr_error *err);

int tsr__stream_init(tsr__coord *c, tsr_error *err)
{
    if (!c->st)
        c->st = tsr_xcalloc(1, sizeof *c->st);
    tsr__stream *s = c->st;
    pthread_mutex_init(&s->mu, NULL);
    pthread_rwlock_init(&s->ov_rw, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    tsr__dir_init(&s->ov);
    s->log_fd = -1;
    s->grp_seq = tsr_xcalloc(TSR_COORD_MAX_SHARDS + 1, sizeof *s->grp_seq); /* room for AddShardGroup */
    /* the families exist from the start (a scrape shows 0, not nothing) */
    tsr_metrics_counter_add("tessera_stream_writes_total", "op=upsert", 0);
    tsr_metrics_counter_add("tessera_stream_writes_total", "op=remove", 0);
    tsr_metrics_counter_add("tessera_stream_rounds_total", NULL, 0);
    tsr_metrics_counter_add("tessera_stream_folds_total", NULL, 0);
    tsr_metrics_counter_add("tessera_stream_catchups_total", NULL, 0);
    const tsr__snap *sn = c->snap;
    s->next_label = sn->next_label;
    s->next_seq = 1;
    s->ov_version = sn->version;
    remove_stale_logs(c, sn->version);
    if (sn->version == 0)
        return 0;
    return load_log(c, sn, err);
}

/* Replays the log of sn's version into the (empty) overlay and the counters, creating it
 * when missing, and opens it for appending. */
static int load_log(tsr__coord *c, const tsr__snap *sn, tsr_error *err)
{
    tsr__stream *s = c->st;
    char path[4200], why[300];
    int64_t good = 0;
    replay rp = {c, sn, 0};
    tsr__slog_path(c->store, sn->version, path, sizeof path);
    int rc = tsr__slog_scan_cut(path, replay_one, &rp, &good, why, sizeof why, err);
    if (rc == TSR_ENOTFOUND) {
        tsr_error_clear(err);
        if ((rc = tsr__stream_write_header(c, sn->version, s->next_label, NULL, 0, err)))
            return rc;
    } else if (rc) {
        return rc;
    } /* a bad tail (why) was cut and logged by the scan: a round cut by a crash is never
       * acknowledged */
    if ((rc = tsr__slog_open(c->store, sn->version, &s->log_fd, &s->log_bytes, err)))
        return rc;
    s->log_version = sn->version;
    if (rp.rounds)
        tsr_info("stream: replayed %lld rounds of version %llu: %zu ids in the overlay, next "
                 "seq %lld", (long long)rp.rounds, (unsigned long long)sn->version, s->ov.n,
                 (long long)s->next_seq);
    tsr_metrics_gauge_set("tessera_stream_log_bytes", NULL, (double)s->log_bytes);
    tsr_metrics_gauge_set("tessera_stream_overlay_records", NULL, (double)s->ov_records);
    return 0;
}

int tsr__stream_follow(tsr__coord *c, const Tessera__V1__CoordLogRecord *rec, int strict)
{
    tsr__stream *s = c->st;
    int gap = 0;
    tsr__stream_freeze(c);
    tsr__snap *sn = tsr__coord_snap_get(c);
    if (rec->seq > 0 && (uint64_t)rec->version == sn->version && s->ov_version == sn->version &&
        rec->seq >= s->next_seq) {
        gap = rec->seq > s->next_seq;
        /* strict: not past a hole — applying it would move next_seq over the missing
         * rounds, and the refetch that follows would then skip them as already applied
         * (a follower lost them for good: the Dec 5 60-minute chaos run) */
        if (!(gap && strict)) {
            pthread_rwlock_wrlock(&s->ov_rw);
            tsr__stream_apply_record(c, sn, rec);
            pthread_rwlock_unlock(&s->ov_rw);
        }
    }
    tsr__snap_unref(sn);
    tsr__stream_thaw(c);
    return gap;
}

static int adopt_locked(tsr__coord *c, tsr_error *err);

int tsr__stream_adopt(tsr__coord *c, tsr_error *err)
{
    tsr__stream_freeze(c);
    int rc = adopt_locked(c, err);
    tsr__stream_thaw(c);
    return rc;
}

int tsr__stream_readopt(tsr__coord *c, tsr_error *err)
{
    tsr__stream_freeze(c);
    int rc = adopt_locked(c, err);
    if (rc == 0)
        catch_up_all_locked(c); /* before any new round: a shard cannot see a seq gap */
    tsr__stream_thaw(c);
    return rc;
}

static int adopt_locked(tsr__coord *c, tsr_error *err)
{
    tsr__stream *s = c->st;
    tsr__snap *sn = tsr__coord_snap_get(c);
    int found = 0;
    int rc = tsr__shlog_restore(c, sn->version, &found, err);
    if (rc && s->log_fd >= 0) { /* the local log is stale: refuse rounds, never reuse labels */
        close(s->log_fd);
        s->log_fd = -1;
    }
    if (rc == 0 && found) {
        if (s->log_fd >= 0)
            close(s->log_fd);
        s->log_fd = -1;
        s->log_version = 0;
        pthread_rwlock_wrlock(&s->ov_rw);
        tsr__dir_close(&s->ov);
        tsr__dir_init(&s->ov);
        s->ov_version = sn->version;
        s->ov_records = s->d_dense = s->d_sparse = 0;
        s->ntouched = 0;
        s->next_label = sn->next_label;
        s->next_seq = 1;
        memset(s->grp_seq, 0, c->cfg.nshards * sizeof *s->grp_seq);
        rc = load_log(c, sn, err);
        pthread_rwlock_unlock(&s->ov_rw);
    }
    tsr__snap_unref(sn);
    return rc;
}
