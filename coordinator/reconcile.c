/*
 * reconcile — keeps every shard on the coordinator's CURRENT version (DESIGN "Batch
 * update": after a crash, the coordinator's CURRENT decides). One background thread, every
 * second (sooner when signalled), asks each shard for Stats and:
 *   - a staged or prepared version above CURRENT → Abort (an update that never reached
 *     the commit point);
 *   - CURRENT held as PREPARED but not current → Commit (the coordinator flipped, then
 *     died or lost the shard before Commit reached it);
 *   - prepared versions below CURRENT → Abort;
 *   - a replica that does not hold CURRENT is marked lagging (queries skip it) and logged
 *     as an error (the coordinator holds no vectors to re-stage it from); the mark clears
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
#include "log.h"
#include "mem.h"
#include "metrics.h"

/* Commit / Abort / Release(v) to replica k (flat index). */
static int call_version(tsr__coord *c, size_t k, const char *what, int64_t v)
{
    char method[64];
    snprintf(method, sizeof method, TSR_SHARD_SVC "%s", what);
    uint8_t *buf;
    size_t len;
    if (strcmp(what, "Commit") == 0) {
        Tessera__V1__CommitRequest m = TESSERA__V1__COMMIT_REQUEST__INIT;
        m.version = v;
        buf = tsr_rpc_pack(&m.base, &len);
    } else if (strcmp(what, "Abort") == 0) {
        Tessera__V1__AbortRequest m = TESSERA__V1__ABORT_REQUEST__INIT;
        m.version = v;
        buf = tsr_rpc_pack(&m.base, &len);
    } else {
        Tessera__V1__ReleaseRequest m = TESSERA__V1__RELEASE_REQUEST__INIT;
        m.below_version = v;
        buf = tsr_rpc_pack(&m.base, &len);
    }
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

int tsr__coord_reconcile_once(tsr__coord *c)
{
    tsr__snap *sn = tsr__coord_snap_get(c);
    int64_t V = (int64_t)sn->version;
    tsr__snap_unref(sn);
    int off = 0;
    size_t R = c->nrep;
    /* Stats from every replica at once: a hung one costs one deadline, not one each */
    tsr_rpc_fanout_call *calls = tsr_xcalloc(R ? R : 1, sizeof *calls);
    for (size_t k = 0; k < R; k++) {
        calls[k].ch = c->rep[k].ch;
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
        tsr__replica_note(c, k, TSR_SHARD_SVC "Stats", res->code, secs);
        Tessera__V1__ShardStatsResponse *st = NULL;
        if (res->code == TSR_RPC_OK)
            st = tessera__v1__shard_stats_response__unpack(NULL, res->len, res->data);
        tsr_rpc_result_close(res);
        if (!st) {
            off++;
            continue;
        }
        atomic_store(&r->version, st->current_version);
        atomic_store(&r->vectors, st->vectors_count);
        atomic_store(&r->sparse, st->sparse_vectors_count);
        atomic_store(&r->lists, (long long)st->n_lists);
        int has_v = st->current_version == V, ok = st->current_version == V;
        for (size_t i = 0; i < st->n_versions; i++) {
            const Tessera__V1__ShardVersion *sv = st->versions[i];
            int pending = sv->state == TESSERA__V1__SHARD_VERSION__STATE__STAGING ||
                          sv->state == TESSERA__V1__SHARD_VERSION__STATE__PREPARED;
            if (sv->version == V && sv->state == TESSERA__V1__SHARD_VERSION__STATE__PREPARED &&
                !sv->current) {
                has_v = 1;
                ok = call_version(c, k, "Commit", V) == TSR_RPC_OK;
                if (ok)
                    atomic_store(&r->version, V);
            } else if (pending && !sv->current && sv->version != V) {
                call_version(c, k, "Abort", sv->version);
            } else if (sv->version == V) {
                has_v = 1; /* held (serving, not current): it can answer V */
            }
        }
        int lag = !has_v && V > 0;
        if (atomic_exchange(&r->lagging, lag) != lag || lag) {
            static int64_t last_log;
            if (!lag) {
                tsr_info("reconcile: shard %zu replica %zu (%s) holds version %lld again",
                         r->group, r->index, r->addr, (long long)V);
            } else if (tsr__now_ms() - last_log > 10000) {
                last_log = tsr__now_ms();
                tsr_error_log("reconcile: shard %zu replica %zu (%s) serves version %lld and "
                              "does not hold the coordinator's version %lld: not queried; it "
                              "cannot be repaired from here (copy a sibling replica's version "
                              "directory, or re-apply the data with a complete overwrite)",
                              r->group, r->index, r->addr, (long long)st->current_version,
                              (long long)V);
            }
        }
        off += !ok;
        tessera__v1__shard_stats_response__free_unpacked(st, NULL);
    }
    free(calls);
    return off;
}

void tsr__coord_schedule_release(tsr__coord *c, uint64_t below)
{
    pthread_mutex_lock(&c->rec_mu);
    c->release_below = below;
    c->release_at_ms = tsr__now_ms() + c->cfg.search_deadline_ms + 1000;
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
        if (pthread_mutex_trylock(&c->update_mu) == 0) {
            off = tsr__coord_reconcile_once(c);
            if (rel_at && tsr__now_ms() >= rel_at) {
                for (size_t k = 0; k < c->nrep; k++)
                    call_version(c, k, "Release", (int64_t)below);
                pthread_mutex_lock(&c->rec_mu);
                if (c->release_at_ms == rel_at)
                    c->release_at_ms = 0;
                pthread_mutex_unlock(&c->rec_mu);
            }
            pthread_mutex_unlock(&c->update_mu);
        }
        pthread_mutex_lock(&c->rec_mu);
        if (!c->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ms = off ? 300 : 1000;
            ts.tv_nsec += ms * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
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
