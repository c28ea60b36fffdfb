/*
 * reconcile — keeps every shard on the coordinator's CURRENT version (DESIGN "Batch
 * update": after a crash, the coordinator's CURRENT decides). One background thread, every
 * second (sooner when signalled), asks each shard for Stats and:
 *   - a staged or prepared version above CURRENT → Abort (an update that never reached
 *     the commit point); CURRENT itself still staging → Abort (a replica an update left
 *     out under update_min_replicas; it is then lagging and re-seeded as below);
 *   - CURRENT held as PREPARED but not current → Commit (the coordinator flipped, then
 *     died or lost the shard before Commit reached it);
 *   - prepared versions below CURRENT → Abort;
 *   - a replica that does not hold CURRENT is marked lagging (queries skip it); when a
 *     sibling replica of its group holds CURRENT, it is re-seeded from that sibling (Read
 *     at CURRENT → Stage on an empty base → Prepare → Commit); without one it is logged
 *     as an error (the coordinator holds no vectors to re-stage it from). The mark clears
 *     as soon as it holds CURRENT again.
 * It also sends the delayed Release(below = CURRENT) once in-flight queries planned on the
 * previous version have had search_deadline_ms to finish.
 *
 * DESIGN (threads): takes update_mu for a pass, so it never touches a version an update
 * is building; rec_mu/rec_cv only for sleeping and the release schedule.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"

#define RESYNC_RETRY_MS 5000

int tsr__reconcile_action(int64_t V, int64_t version, int state, int current)
{
    int pending = state == TESSERA__V1__SHARD_VERSION__STATE__STAGING ||
                  state == TESSERA__V1__SHARD_VERSION__STATE__PREPARED;
    if (version == V && state == TESSERA__V1__SHARD_VERSION__STATE__PREPARED && !current)
        return TSR_REC_COMMIT;
    /* above CURRENT: an update that never committed; V itself still staging: a replica
     * left out of V (update_min_replicas) — neither can serve */
    if (pending && !current &&
        (version != V || state == TESSERA__V1__SHARD_VERSION__STATE__STAGING))
        return TSR_REC_ABORT;
    if (version == V)
        return TSR_REC_HOLDS; /* held (serving, not current): it can answer V */
    return TSR_REC_KEEP;
}

size_t tsr__reconcile_resync_from(int need, int64_t *resync_at_ms, int64_t now,
                                  const char *holds, size_t first, size_t n)
{
    if (!need || now < *resync_at_ms)
        return SIZE_MAX;
    size_t from = SIZE_MAX;
    for (size_t j = 0; j < n && from == SIZE_MAX; j++)
        if (holds[first + j])
            from = first + j;
    if (from != SIZE_MAX)
        *resync_at_ms = now + RESYNC_RETRY_MS;
    return from;
}

int64_t tsr__reconcile_pause_ms(int off)
{
    return off ? 300 : 1000;
}

/* Commit / Abort / Release(v) to replica k (flat index). */
static int call_version(tsr__coord *c, size_t k, const char *what, int64_t v)
{
    char method[64];
    snprintf(method, sizeof method, TSR_SHARD_SVC "%s", what);
    size_t len;
    uint8_t *buf = tsr__coord_pack_version(c, what, v, 0, &len);
    const tsr__replica *r = &c->rep[k];
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    double t0 = tsr_metrics_now();
    int code = tsr_rpc_call(r->ch, method, buf, len, c->cfg.stage_deadline_ms, &res);
    tsr__replica_note(c, k, method, code, tsr_metrics_now() - t0);
    if (code != TSR_RPC_OK)
        tsr_warn("reconcile: shard %zu replica %zu (%s): %s(%lld): %s: %s", r->group, r->index,
                 r->addr, what, (long long)v, tsr_rpc_code_name(code), res.message);
    else
        tsr_info("reconcile: shard %zu replica %zu (%s): %s(%lld) done", r->group, r->index,
                 r->addr, what, (long long)v);
    tsr_rpc_result_close(&res);
    free(buf);
    return code;
}

/* Re-seeds replica k, which does not hold the served version sn->version (a replaced or
 * wiped disk, a restore from an old backup), from sibling `from` that does: every label the
 * directory places on the group is Read from the sibling at V and Staged on k as V with an
 * empty base (the template and the plan's own_lists in chunk 0), then Prepare and Commit.
 * The result is the sibling's data exactly (the shard re-encodes the same raw vectors).
 * Runs under update_mu (no update meanwhile). Returns 0 or a TSR code (k is left with V
 * aborted, retried on a later pass). */
static int resync(tsr__coord *c, size_t k, size_t from, const tsr__snap *sn)
{
    const tsr__replica *r = &c->rep[k], *src = &c->rep[from];
    int64_t V = (int64_t)sn->version;
    size_t g = r->group, nlist = sn->tmpl ? sn->tmpl->nlist : 0;
    size_t chunk = (size_t)c->cfg.stage_chunk < 5000 ? (size_t)c->cfg.stage_chunk : 5000;
    int64_t t0 = tsr_clock_mono_ms();
    /* no streamed write meanwhile; the labels are the directory's plus the stream's, and
     * the copy holds every write up to the group's last seq */
    tsr__stream_freeze(c);
    tsr__snap *view = tsr__stream_base(c, sn);
    const tsr__dir *dir = view ? &view->dir : &sn->dir;
    int64_t base_seq = tsr__stream_group_seq(c, g);
    /* the group's labels and lists, and the lists it owns */
    size_t n = 0;
    for (size_t i = 0; i < dir->n; i++)
        n += (size_t)dir->e[i].shard == g;
    int64_t *labels = tsr_xcalloc(n + 1, sizeof *labels);
    int32_t *own = tsr_xcalloc(nlist + 1, sizeof *own);
    size_t nown = 0, j = 0;
    for (size_t i = 0; i < dir->n; i++)
        if ((size_t)dir->e[i].shard == g)
            labels[j++] = dir->e[i].label;
    tsr__stream_base_free(view);
    for (size_t l = 0; l < nlist; l++)
        if ((size_t)sn->plan[l] == g)
            own[nown++] = (int32_t)l;
    tsr_warn("reconcile: shard %zu replica %zu (%s): re-seeding version %lld from replica %zu "
             "(%s): %zu datapoints", g, r->index, r->addr, (long long)V, src->index, src->addr,
             n);
    call_version(c, k, "Abort", V); /* a leftover partial staging of V */
    int rc = 0;
    char what[64] = "";
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (size_t off = 0, ch = 0; rc == 0 && (off < n || ch == 0); off += chunk, ch++) {
        size_t m = n - off < chunk ? n - off : chunk;
        Tessera__V1__ShardReadResponse *rd = NULL;
        if (m) {
            Tessera__V1__ShardReadRequest rq = TESSERA__V1__SHARD_READ_REQUEST__INIT;
            rq.version = V;
            rq.labels = labels + off;
            rq.n_labels = m;
            int code = tsr_rpc_call_pb(src->ch, TSR_SHARD_SVC "Read", &rq.base,
                                       &tessera__v1__shard_read_response__descriptor,
                                       c->cfg.stage_deadline_ms, (ProtobufCMessage **)&rd, &res);
            if (code != TSR_RPC_OK || !rd || rd->n_datapoints != m) {
                snprintf(what, sizeof what, "Read from replica %zu", src->index);
                rc = TSR_EUNAVAILABLE;
                if (rd)
                    tessera__v1__shard_read_response__free_unpacked(rd, NULL);
                break;
            }
        }
        Tessera__V1__StageRequest st = TESSERA__V1__STAGE_REQUEST__INIT;
        st.version = V;
        st.leader_term = tsr__coord_term(c);
        st.base_version = 0;
        st.chunk = (int32_t)ch;
        if (ch == 0) {
            st.base_stream_seq = base_seq;
            st.template_faiss.data = sn->tmpl_bytes;
            st.template_faiss.len = sn->tmpl_len;
            st.own_lists = own;
            st.n_own_lists = nown;
        }
        Tessera__V1__StagedUpsert *su = tsr_xcalloc(m + 1, sizeof *su);
        Tessera__V1__StagedUpsert **sup = tsr_xcalloc(m + 1, sizeof *sup);
        size_t nu = 0;
        for (size_t i = 0; i < m; i++) {
            Tessera__V1__ShardDatapoint *d = rd->datapoints[i];
            if (!d->found || !d->datapoint)
                continue; /* the sibling lacks it too: nothing to copy */
            tessera__v1__staged_upsert__init(&su[nu]);
            su[nu].label = d->label;
            su[nu].list = d->list;
            su[nu].datapoint = d->datapoint;
            sup[nu] = &su[nu];
            nu++;
        }
        st.upserts = sup;
        st.n_upserts = nu;
        size_t len = 0;
        uint8_t *buf = tsr_rpc_pack(&st.base, &len);
        double t1 = tsr_metrics_now();
        int code = tsr_rpc_call(r->ch, TSR_SHARD_SVC "Stage", buf, len, c->cfg.stage_deadline_ms,
                                &res);
        tsr__replica_note(c, k, TSR_SHARD_SVC "Stage", code, tsr_metrics_now() - t1);
        if (code != TSR_RPC_OK) {
            snprintf(what, sizeof what, "Stage chunk %zu", ch);
            rc = tsr_rpc_error_from_status(code);
        }
        free(buf);
        free(su);
        free(sup);
        if (rd)
            tessera__v1__shard_read_response__free_unpacked(rd, NULL);
    }
    if (rc == 0) {
        Tessera__V1__PrepareRequest pq = TESSERA__V1__PREPARE_REQUEST__INIT;
        pq.version = V;
        pq.leader_term = tsr__coord_term(c);
        Tessera__V1__PrepareResponse *pr = NULL;
        int code = tsr_rpc_call_pb(r->ch, TSR_SHARD_SVC "Prepare", &pq.base,
                                   &tessera__v1__prepare_response__descriptor,
                                   c->cfg.stage_deadline_ms, (ProtobufCMessage **)&pr, &res);
        if (code != TSR_RPC_OK || !pr || !pr->ready) {
            snprintf(what, sizeof what, "Prepare");
            rc = code != TSR_RPC_OK ? tsr_rpc_error_from_status(code) : TSR_ESTATE;
        }
        if (pr)
            tessera__v1__prepare_response__free_unpacked(pr, NULL);
    }
    if (rc == 0 && call_version(c, k, "Commit", V) != TSR_RPC_OK) {
        snprintf(what, sizeof what, "Commit");
        rc = TSR_EUNAVAILABLE;
    }
    if (rc) {
        tsr_warn("reconcile: shard %zu replica %zu (%s): re-seeding version %lld failed at %s: "
                 "%s: %s (retried later)", g, r->index, r->addr, (long long)V, what,
                 tsr_rpc_code_name(res.code), res.message ? res.message : "");
        call_version(c, k, "Abort", V);
        tsr_metrics_counter_add("tessera_shard_resyncs_total", "result=failed", 1);
    } else {
        tsr_info("reconcile: shard %zu replica %zu (%s): re-seeded at version %lld from replica "
                 "%zu in %lld ms", g, r->index, r->addr, (long long)V, src->index,
                 (long long)(tsr_clock_mono_ms() - t0));
        tsr_metrics_counter_add("tessera_shard_resyncs_total", "result=ok", 1);
    }
    tsr_rpc_result_close(&res);
    tsr__stream_thaw(c);
    free(labels);
    free(own);
    return rc;
}

/* A follower's pass (the shards are the leader's to change): Stats from every replica; one
 * that serves the version but has applied fewer streamed rounds of its group than this
 * coordinator followed from etcd (a replica killed or cut while the leader wrote; the
 * leader resends what it missed) is marked stream_behind, so this coordinator's queries
 * go to a sibling until it has them (read-your-writes on every coordinator; tests/chaos
 * found followers querying such a replica). A replica that does not answer is marked too:
 * when it is back it is not queried before a pass saw its seq. */
static int observe_once(tsr__coord *c)
{
    tsr__snap *sn = tsr__coord_snap_get(c);
    int64_t V = (int64_t)sn->version;
    tsr__snap_unref(sn);
    size_t R = c->nrep;
    int off = 0;
    tsr_rpc_fanout_call *calls = tsr_xcalloc(R ? R : 1, sizeof *calls);
    for (size_t k = 0; k < R; k++) {
        calls[k].ch = c->rep[k].ch;
        calls[k].method = TSR_SHARD_SVC "Stats";
        calls[k].timeout_ms = c->cfg.search_deadline_ms;
        tsr_rpc_result_init(&calls[k].result);
    }
    tsr_rpc_fanout(calls, R);
    for (size_t k = 0; k < R; k++) {
        tsr__replica *r = &c->rep[k];
        tsr_rpc_result *res = &calls[k].result;
        Tessera__V1__ShardStatsResponse *st = (Tessera__V1__ShardStatsResponse *)(void *)
            tsr_rpc_result_unpack(res, &tessera__v1__shard_stats_response__descriptor, NULL);
        tsr_rpc_result_close(res);
        if (!st) {
            atomic_store(&r->stream_behind, 1);
            off++;
            continue;
        }
        tsr__stream_freeze(c);
        int64_t want = tsr__stream_group_seq(c, r->group);
        tsr__stream_thaw(c);
        int behind = st->current_version == V && st->stream_seq < want;
        atomic_store(&r->stream_behind, behind);
        off += behind;
        tessera__v1__shard_stats_response__free_unpacked(st, NULL);
    }
    free(calls);
    return off;
}

int tsr__coord_reconcile_once(tsr__coord *c)
{
    tsr__snap *sn = tsr__coord_snap_get(c);
    int64_t V = (int64_t)sn->version;
    int off = 0;
    size_t R = c->nrep;
    char *holds = tsr_xcalloc(R ? R : 1, 1); /* answered this pass and holds V */
    char *need = tsr_xcalloc(R ? R : 1, 1);  /* answered, below V and without it */
    int64_t *applied = tsr_xcalloc(R ? R : 1, sizeof *applied); /* serves V: its stream seq */
    for (size_t k = 0; k < R; k++)
        applied[k] = -1;
    /* Stats from every replica at once: a hung one costs one deadline, not one each */
    tsr_rpc_fanout_call *calls = tsr_xcalloc(R ? R : 1, sizeof *calls);
    for (size_t k = 0; k < R; k++) {
        calls[k].ch = tsr__replica_removed(c, k) ? NULL : c->rep[k].ch; /* NULL: not called */
        calls[k].method = TSR_SHARD_SVC "Stats";
        calls[k].timeout_ms = c->cfg.search_deadline_ms;
        tsr_rpc_result_init(&calls[k].result);
    }
    double t0 = tsr_metrics_now();
    tsr_rpc_fanout(calls, R);
    double secs = tsr_metrics_now() - t0;
    for (size_t k = 0; k < R; k++) {
        tsr__replica *r = &c->rep[k];
        tsr_rpc_result *res = &calls[k].result;
        if (tsr__replica_removed(c, k)) { /* its group was removed: nothing to reconcile */
            tsr_rpc_result_close(res);
            continue;
        }
        tsr__replica_note(c, k, TSR_SHARD_SVC "Stats", res->code, secs);
        Tessera__V1__ShardStatsResponse *st = (Tessera__V1__ShardStatsResponse *)(void *)
            tsr_rpc_result_unpack(res, &tessera__v1__shard_stats_response__descriptor, NULL);
        tsr_rpc_result_close(res);
        if (!st) {
            off++;
            continue;
        }
        atomic_store(&r->version, st->current_version);
        applied[k] = st->current_version == V && V > 0 ? st->stream_seq : -1;
        atomic_store(&r->vectors, st->vectors_count);
        atomic_store(&r->sparse, st->sparse_vectors_count);
        atomic_store(&r->lists, (long long)st->n_lists);
        int has_v = st->current_version == V, ok = st->current_version == V;
        for (size_t i = 0; i < st->n_versions; i++) {
            const Tessera__V1__ShardVersion *sv = st->versions[i];
            int act = tsr__reconcile_action(V, sv->version, (int)sv->state, sv->current);
            if (act == TSR_REC_COMMIT) {
                has_v = 1;
                ok = call_version(c, k, "Commit", V) == TSR_RPC_OK;
                if (ok)
                    atomic_store(&r->version, V);
            } else if (act == TSR_REC_ABORT) {
                call_version(c, k, "Abort", sv->version);
            } else if (act == TSR_REC_HOLDS) {
                has_v = 1;
            }
        }
        int lag = !has_v && V > 0;
        holds[k] = (char)!lag;
        if (atomic_exchange(&r->lagging, lag) != lag || lag) {
            static int64_t last_log;
            if (!lag) {
                tsr_info("reconcile: shard %zu replica %zu (%s) holds version %lld again",
                         r->group, r->index, r->addr, (long long)V);
            } else if (tsr_clock_mono_ms() - last_log > 10000) {
                last_log = tsr_clock_mono_ms();
                tsr_error_log("reconcile: shard %zu replica %zu (%s) serves version %lld and "
                              "does not hold the coordinator's version %lld: not queried; "
                              "re-seeded from a sibling replica when one holds it, otherwise "
                              "re-apply the data with a complete overwrite)",
                              r->group, r->index, r->addr, (long long)st->current_version,
                              (long long)V);
            }
        }
        off += !ok;
        if (lag && st->current_version < V)
            need[k] = 1;
        tessera__v1__shard_stats_response__free_unpacked(st, NULL);
    }
    /* replicas that serve V but missed streamed writes: resend them from the log */
    for (size_t k = 0; k < R; k++)
        if (applied[k] >= 0 && tsr__stream_catch_up(c, k, applied[k]) != 0)
            off++;
    free(applied);
    /* lagging replicas with a sibling that holds V: re-seed them from it (at most one
     * attempt per replica every RESYNC_RETRY_MS, so a failing copy is not a busy loop) */
    for (size_t k = 0; k < R; k++) {
        const tsr__group *gr = &c->grp[c->rep[k].group];
        size_t from = tsr__reconcile_resync_from(need[k], &c->rep[k].resync_at_ms,
                                                 tsr_clock_mono_ms(), holds, gr->first,
                                                 gr->n);
        if (from == SIZE_MAX)
            continue;
        if (resync(c, k, from, sn) == 0) {
            atomic_store(&c->rep[k].lagging, 0);
            atomic_store(&c->rep[k].version, V);
            off--;
        }
    }
    free(need);
    free(holds);
    free(calls);
    tsr__snap_unref(sn);
    return off;
}

/* Release(below) to every replica in one parallel fan-out with the short search deadline:
 * a hung replica must not hold reconcile for stage_deadline_ms. A replica that misses it
 * keeps its old versions until the next Release (or drops them on its own timeout). */
static void release_all(tsr__coord *c, int64_t below)
{
    size_t S = c->cfg.nshards, len = 0;
    uint8_t *one = tsr__coord_pack_version(c, "Release", below, 0, &len);
    uint8_t **bufs = tsr_xcalloc(S ? S : 1, sizeof *bufs);
    size_t *lens = tsr_xcalloc(S ? S : 1, sizeof *lens);
    for (size_t s = 0; s < S; s++) {
        bufs[s] = one;
        lens[s] = len;
    }
    tsr_error err = TSR_ERROR_INIT;
    size_t bad = tsr__coord_all_fanout(c, TSR_SHARD_SVC "Release", bufs, lens, NULL,
                                       c->cfg.search_deadline_ms, NULL, NULL, &err);
    if (bad)
        tsr_warn("reconcile: Release(below %lld): %zu replica(s) missed it: %s",
                 (long long)below, bad, err.msg);
    free(one);
    free(bufs);
    free(lens);
}

void tsr__coord_schedule_release(tsr__coord *c, uint64_t below)
{
    pthread_mutex_lock(&c->rec_mu);
    c->release_below = below;
    c->release_at_ms = tsr_clock_mono_ms() + c->cfg.search_deadline_ms + 1000;
    pthread_mutex_unlock(&c->rec_mu);
}

static void *rec_main(void *p)
{
    tsr__coord *c = p;
    int off = 1;
    for (;;) {
        pthread_mutex_lock(&c->rec_mu);
        if (c->stopping) {
            pthread_mutex_unlock(&c->rec_mu);
            break;
        }
        int64_t rel_at = c->release_at_ms;
        uint64_t below = c->release_below;
        pthread_mutex_unlock(&c->rec_mu);
        /* followers leave the shards to the leader (leader.c) */
        if (tsr__coord_leading(c) && pthread_mutex_trylock(&c->update_mu) == 0) {
            off = tsr__coord_reconcile_once(c);
            if (rel_at && tsr_clock_mono_ms() >= rel_at) {
                release_all(c, (int64_t)below);
                pthread_mutex_lock(&c->rec_mu);
                if (c->release_at_ms == rel_at)
                    c->release_at_ms = 0;
                pthread_mutex_unlock(&c->rec_mu);
            }
            pthread_mutex_unlock(&c->update_mu);
        } else if (c->meta && !tsr__coord_leading(c)) {
            off = observe_once(c);
        }
        pthread_mutex_lock(&c->rec_mu);
        if (!c->stopping) {
            /* rec_cv waits on CLOCK_MONOTONIC (tsr_clock_cond_init in main.c) */
            struct timespec ts = tsr_clock_mono_timespec(tsr__reconcile_pause_ms(off));
            pthread_cond_timedwait(&c->rec_cv, &c->rec_mu, &ts);
        }
        pthread_mutex_unlock(&c->rec_mu);
    }
    return NULL;
}

int tsr__coord_reconcile_start(tsr__coord *c)
{
    return pthread_create(&c->rec_thread, NULL, rec_main, c) == 0 ? 0 : TSR_EINTERNAL;
}

void tsr__coord_reconcile_stop(tsr__coord *c)
{
    pthread_mutex_lock(&c->rec_mu);
    c->stopping = 1;
    pthread_cond_broadcast(&c->rec_cv);
    pthread_mutex_unlock(&c->rec_mu);
    pthread_join(c->rec_thread, NULL);
}
