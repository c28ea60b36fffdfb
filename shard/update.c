/*
 * update — the shard's version table and its two-phase update (DESIGN "Batch update"):
 * Stage chunks of upserts/deletes for version N+1 on top of a base, Prepare (build N+1
 * beside N, copy-on-write per list, write v<N+1>/ through common/store/store, fsync, check the
 * MANIFEST), Commit (CURRENT := N+1 on disk — the shard's commit point — then swap the
 * current pointer), Abort (drop a staged or prepared version), Release (drop old serving
 * versions once the coordinator plans no more queries on them).
 *
 * Versions held: the current one, older serving ones not yet released (at most
 * TSR__MAX_HELD_VERSIONS; beyond that the oldest is dropped on its own — in-flight
 * queries keep their reference, so nothing breaks under them), and prepared ones. A
 * query naming a prepared version is served from it: the coordinator plans on N+1 only
 * after its own commit point, and its Commit may reach this shard after such a query.
 *
 * On disk at start-up: CURRENT's version is loaded (MANIFEST checked); if it does not
 * check or load, the newest older version that does is served instead (logged). Newer
 * complete versions are prepared ones (they survived a restart, Commit or Abort decides);
 * temporary directories are removed (by common/store/store); older versions except the newest one below current
 * (kept as a fallback) are removed.
 *
 * Catch-up versions (StageRequest.capture_delta, a reshard move: docs/resharding.md
 * "Writes during a move"): chunk 0 keeps the base's delta snapshot whose applied seq it
 * checked, Prepare folds that snapshot (not the base's delta of then), and the version is
 * published prepared with an empty log of its own (stream.c): Writes to the current
 * version are not refused meanwhile, and Writes naming the prepared version carry the
 * rounds it missed. Without the field a staging behaves as before.
 *
 * DESIGN (threads): update_mu serializes every update call (Stage/Prepare run on the
 * rpc worker pool; Commit/Abort/Release are short). table_mu guards `current` and
 * `held` and is held only to look up + ref, or to swap entries: no I/O, no building,
 * no allocation beyond a pointer swap. Queries take only table_mu, briefly. Commit and
 * Prepare's publication take write_mu (stream.c) with no Write in flight. Lock order:
 * update_mu, write_mu, table_mu.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "index/faiss_io.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/mem.h"
#include "core/testing.h"
#include "net/metrics.h"
#include "shard.h"

typedef struct upent {
    tsr__rec *rec; /* ref */
    uint64_t seq;
} upent;

struct tsr__staging {
    int64_t version, base_version;
    int32_t chunks;
    tsr__version *base; /* ref */
    tsr__tmpl *tmpl;    /* ref; NULL = the base's */
    upent *ups;
    size_t nups, capups;
    int64_t *dels;
    size_t ndels, capdels;
    int32_t *drop;
    size_t ndrop;
    int32_t *own;
    size_t nown;
    int have_own;
    uint64_t seq;
    int64_t total_ups, total_dels;
    int64_t stream_seq; /* the base's applied seq at chunk 0 (= base_stream_seq) */
    int capture;        /* chunk 0's capture_delta: a catch-up version */
    tsr__delta *captured; /* ref or NULL (= empty): capture only, the base's delta snapshot
                             at stream_seq, the one Prepare folds */
};

static void staging_free(tsr__staging *st)
{
    if (st == NULL)
        return;
    for (size_t i = 0; i < st->nups; i++)
        tsr__rec_unref(st->ups[i].rec);
    free(st->ups);
    free(st->dels);
    free(st->drop);
    free(st->own);
    tsr__version_unref(st->base);
    tsr__delta_unref(st->captured);
    tsr__tmpl_unref(st->tmpl);
    free(st);
}

/* ------------------------------------------------------------------ table */

/* Caller holds table_mu. */
static tsr__held *find_held(tsr__shard *s, int64_t version)
{
    for (size_t i = 0; i < s->nheld; i++)
        if (s->held[i].v->version == version)
            return &s->held[i];
    return NULL;
}

tsr__version *tsr__shard_get_view(tsr__shard *s, int64_t version, tsr__delta **d)
{
    tsr__version *v = NULL;
    pthread_mutex_lock(&s->table_mu);
    if (version == 0 || version == s->current->version) {
        v = tsr__version_ref(s->current);
    } else {
        tsr__held *h = find_held(s, version);
        if (h)
            v = tsr__version_ref(h->v);
    }
    if (d)
        *d = v ? tsr__delta_ref(v->delta) : NULL;
    pthread_mutex_unlock(&s->table_mu);
    return v;
}

tsr__version *tsr__shard_get(tsr__shard *s, int64_t version)
{
    return tsr__shard_get_view(s, version, NULL);
}

/* Removes held[i] from the table (caller holds table_mu); returns the ref to unref
 * outside the lock. */
static tsr__version *take_held(tsr__shard *s, size_t i)
{
    tsr__version *v = s->held[i].v;
    memmove(&s->held[i], &s->held[i + 1], (s->nheld - i - 1) * sizeof s->held[0]);
    s->nheld--;
    return v;
}

/* Removes version directories nobody needs: below current, not held, except the newest
 * below current (the fallback). Caller holds update_mu. */
static void gc_dirs(tsr__shard *s)
{
    uint64_t *vs = NULL;
    size_t n = 0;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_store_list(s->store, &vs, &n, &err) != 0)
        return;
    uint64_t cur = (uint64_t)s->current->version;
    uint64_t fallback = 0;
    for (size_t i = 0; i < n; i++)
        if (vs[i] < cur)
            fallback = vs[i];
    for (size_t i = 0; i < n; i++) {
        if (vs[i] >= cur || vs[i] == fallback)
            continue;
        pthread_mutex_lock(&s->table_mu);
        int held = find_held(s, (int64_t)vs[i]) != NULL;
        pthread_mutex_unlock(&s->table_mu);
        if (held)
            continue;
        if (tsr_store_remove(s->store, vs[i], &err) != 0)
            tsr_warn("cannot remove version %llu: %s", (unsigned long long)vs[i], err.msg);
    }
    free(vs);
}

/* The bytes of a version directory's files (stats: disk_bytes). */
static uint64_t dir_bytes(const char *vd)
{
    static const char *const files[] = {"slice.faiss", "meta", "vectors.f32", "MANIFEST"};
    char fp[4200];
    uint64_t total = 0;
    for (size_t i = 0; i < 4; i++) {
        struct stat st;
        snprintf(fp, sizeof fp, "%s/%s", vd, files[i]);
        if (stat(fp, &st) == 0)
            total += (uint64_t)st.st_size;
    }
    return total;
}

/* Verifies version against its MANIFEST, then loads it. */
static int load_checked(tsr__shard *s, int64_t version, tsr__version **out, tsr_error *err)
{
    char vd[4096];
    int rc = tsr_store_verify(s->store, (uint64_t)version, err);
    if (rc == 0)
        rc = tsr_store_path(s->store, (uint64_t)version, NULL, vd, sizeof vd, err);
    if (rc == 0)
        rc = tsr__version_load(vd, version, out, err);
    if (rc == 0)
        (*out)->disk_bytes = dir_bytes(vd);
    return rc;
}

int tsr__shard_open(tsr__shard *s, const char *dir, tsr_error *err)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->table_mu, NULL);
    pthread_mutex_init(&s->update_mu, NULL);
    pthread_mutex_init(&s->write_mu, NULL);
    pthread_mutex_init(&s->term_mu, NULL);
    pthread_cond_init(&s->write_cv, NULL);
    s->wal.fd = -1;
    s->dir = strdup(dir);
    if (s->dir == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = tsr_store_create(dir, &s->store, err);
    if (rc != 0)
        return rc;
    uint64_t cur64 = 0, *vs = NULL;
    size_t n = 0;
    rc = tsr_store_current(s->store, &cur64, err);
    if (rc == TSR_ENOTFOUND) {
        cur64 = 0; /* a new data dir */
        tsr_error_clear(err);
    } else if (rc != 0) {
        return rc;
    }
    int64_t cur = (int64_t)cur64;
    if ((rc = tsr_store_list(s->store, &vs, &n, err)) != 0)
        return rc;
    if (cur > 0) {
        tsr_error e = TSR_ERROR_INIT;
        if (load_checked(s, cur, &s->current, &e) != 0) {
            tsr_error_log("version %lld (CURRENT) refused: %s", (long long)cur, e.msg);
            for (size_t i = n; i-- > 0 && s->current == NULL;) {
                if ((int64_t)vs[i] >= cur)
                    continue;
                tsr_error e2 = TSR_ERROR_INIT;
                if (load_checked(s, (int64_t)vs[i], &s->current, &e2) == 0) {
                    /* Make the directory say what is served, and drop the bad version so
                     * that its number can be staged again. */
                    tsr_warn("falling back to version %lld", (long long)vs[i]);
                    /* Only for a version that is provably bad or gone; an I/O or memory
                     * failure may be transient: then the files stay as they are. */
                    if (e.code != TSR_EFORMAT && e.code != TSR_ENOTFOUND)
                        continue;
                    if (tsr_store_set_current(s->store, vs[i], &e2) != 0 ||
                        (e.code == TSR_EFORMAT &&
                         tsr_store_remove(s->store, (uint64_t)cur, &e2) != 0))
                        tsr_warn("after the fallback: %s", e2.msg);
                    else
                        tsr_warn("CURRENT is now version %lld%s", (long long)vs[i],
                                 e.code == TSR_EFORMAT ? "; the corrupt version was removed" : "");
                } else {
                    tsr_error_log("version %lld refused: %s", (long long)vs[i], e2.msg);
                }
            }
        }
    }
    if (s->current == NULL) {
        if (cur > 0)
            tsr_warn("no loadable version at or below %lld: starting empty at version 0",
                     (long long)cur);
        if ((s->current = tsr__version_empty(err)) == NULL) {
            free(vs);
            return err ? err->code : TSR_ENOMEM;
        }
    }
    s->held[s->nheld++] = (tsr__held){tsr__version_ref(s->current), TSR__SERVING};
    /* Newer complete versions: prepared before a restart, waiting for Commit / Abort. */
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)vs[i] <= cur || s->nheld >= TSR__MAX_HELD_VERSIONS)
            continue;
        tsr__version *v = NULL;
        tsr_error e = TSR_ERROR_INIT;
        if (load_checked(s, (int64_t)vs[i], &v, &e) == 0) {
            s->held[s->nheld++] = (tsr__held){v, TSR__PREPARED};
            tsr_info("version %lld is prepared (waiting for Commit or Abort)", (long long)vs[i]);
        } else {
            tsr_error_log("prepared version %lld refused, removing it: %s", (long long)vs[i],
                          e.msg);
            tsr_store_remove(s->store, vs[i], NULL);
        }
    }
    free(vs);
    gc_dirs(s);
    if ((rc = tsr__stream_open(s, err)) != 0)
        return rc;
    tsr_info("serving version %lld: %zu vectors, %zu sparse, %zu records, applied stream seq "
             "%lld", (long long)s->current->version, s->current->nvectors, s->current->nsparse,
             s->current->nrecs, (long long)tsr__applied_seq(s->current, s->current->delta));
    return 0;
}

void tsr__shard_close(tsr__shard *s)
{
    staging_free(s->staging);
    s->staging = NULL;
    tsr__stream_close(s);
    for (size_t i = 0; i < s->nheld; i++)
        tsr__version_unref(s->held[i].v);
    s->nheld = 0;
    tsr__version_unref(s->current);
    s->current = NULL;
    tsr_store_destroy(s->store);
    s->store = NULL;
    free(s->dir);
    s->dir = NULL;
    pthread_mutex_destroy(&s->table_mu);
    pthread_mutex_destroy(&s->update_mu);
    pthread_mutex_destroy(&s->write_mu);
    pthread_mutex_destroy(&s->term_mu);
    pthread_cond_destroy(&s->write_cv);
}

/* ------------------------------------------------------------------ stage */

static int list_ok(const tsr__staging *st, int32_t list)
{
    const tsr__tmpl *t = st->tmpl ? st->tmpl : st->base->tmpl;
    return t && list >= 0 && (size_t)list < t->ix->nlist;
}

/* Checks the version and chunk numbers of a Stage against the version table; *cur gets
 * the current version. Caller holds update_mu. */
static int stage_check_version(tsr__shard *s, const Tessera__V1__StageRequest *rq,
                               int64_t *cur, tsr_error *err)
{
    if (rq->version <= 0)
        return tsr_err(err, TSR_EINVAL, "StageRequest.version %lld: must be > 0",
                       (long long)rq->version);
    if (rq->chunk < 0)
        return tsr_err(err, TSR_EINVAL, "StageRequest.chunk %d: must be >= 0", rq->chunk);
    pthread_mutex_lock(&s->table_mu);
    *cur = s->current->version;
    int exists = find_held(s, rq->version) != NULL;
    pthread_mutex_unlock(&s->table_mu);
    if (rq->version <= *cur || exists)
        return tsr_err(err, TSR_ESTATE, "StageRequest.version %lld: the shard already has "
                       "version %lld%s", (long long)rq->version,
                       (long long)(exists ? rq->version : *cur), exists ? "" : " (current)");
    return 0;
}

/* The template of a new staging from chunk 0's template_faiss (or, without one, the
 * base's, which must exist). */
static int stage_template(tsr__staging *st, const Tessera__V1__StageRequest *rq,
                          tsr_error *err)
{
    int rc;
    if (rq->template_faiss.len > 0) {
        tsr_ivfpq *ix = NULL;
        if ((rc = tsr_faiss_read_mem(rq->template_faiss.data, rq->template_faiss.len, &ix,
                                     err)) != 0) {
            tsr_err_prefix(err, "StageRequest.template_faiss");
            return err ? (err->code = TSR_EINVAL) : TSR_EINVAL;
        }
        if (ix->is_refine || !ix->is_trained) {
            /* the message first: ix is gone after the destroy (a use after free that
             * fuzz_shard_rpc found, tests/fuzz/corpus/fuzz_shard_rpc/crash-2c24b43d...) */
            const char *why = ix->is_refine ? "IwQR is not supported" : "index is not trained";
            tsr_ivfpq_destroy(ix);
            return tsr_err(err, TSR_EINVAL, "StageRequest.template_faiss: %s", why);
        }
        st->tmpl = tsr__tmpl_from_index(ix, err);
        if (st->tmpl == NULL)
            return err ? err->code : TSR_ENOMEM;
    } else if (st->base->tmpl == NULL) {
        return tsr_err(err, TSR_ESTATE, "StageRequest: version %lld has an empty base and chunk "
                       "0 carries no template_faiss", (long long)rq->version);
    }
    return 0;
}

/* The stream seq of a new staging: a base version's applied seq must be the
 * coordinator's base_stream_seq (its delta is folded into the new version); an empty
 * base (complete overwrite) keeps the larger of base_stream_seq and the current
 * version's applied seq, so that resends stay deduplicated. With capture_delta the delta
 * snapshot whose seq was checked is kept (st->captured): the one Prepare folds. */
static int stage_stream_seq(tsr__shard *s, tsr__staging *st, const Tessera__V1__StageRequest *rq,
                            tsr_error *err)
{
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(s, rq->base_version, &d);
    int64_t applied = v ? tsr__applied_seq(v, d) : 0;
    if (st->capture && rq->base_version != 0 && applied == rq->base_stream_seq) {
        st->captured = d; /* immutable (shard/delta.c): later Writes make new snapshots */
        d = NULL;
    }
    tsr__delta_unref(d);
    tsr__version_unref(v);
    if (rq->base_stream_seq < 0)
        return tsr_err(err, TSR_EINVAL, "StageRequest.base_stream_seq %lld: must be >= 0",
                       (long long)rq->base_stream_seq);
    if (rq->base_version != 0 && applied != rq->base_stream_seq)
        return tsr_err(err, TSR_ESTATE, "StageRequest.base_stream_seq %lld: version %lld's "
                       "applied stream seq is %lld", (long long)rq->base_stream_seq,
                       (long long)rq->base_version, (long long)applied);
    if (rq->base_version == 0) {
        tsr__delta *cd = NULL;
        tsr__version *c = tsr__shard_get_view(s, 0, &cd);
        applied = c ? tsr__applied_seq(c, cd) : 0;
        tsr__delta_unref(cd);
        tsr__version_unref(c);
        st->stream_seq = applied > rq->base_stream_seq ? applied : rq->base_stream_seq;
    } else {
        st->stream_seq = rq->base_stream_seq;
    }
    return 0;
}

/* Chunk 0: a new staging on its base, replacing any unfinished one (a coordinator that
 * restarted). Caller holds update_mu. On success *out is the new staging, now
 * s->staging; on error s->staging is NULL. */
static int stage_begin(tsr__shard *s, const Tessera__V1__StageRequest *rq, int64_t cur,
                       tsr__staging **out, tsr_error *err)
{
    int rc;
    tsr__staging *st = s->staging;
    if (st) {
        tsr_warn("staging of version %lld dropped by a new Stage of version %lld",
                 (long long)st->version, (long long)rq->version);
        staging_free(st);
        s->staging = NULL;
        atomic_store(&s->staging_version, 0);
    }
    st = calloc(1, sizeof *st);
    if (st == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    st->version = rq->version;
    st->base_version = rq->base_version;
    st->capture = rq->capture_delta != 0;
    if (rq->base_version == 0) {
        st->base = tsr__version_empty(err);
    } else {
        st->base = tsr__shard_get(s, rq->base_version);
        if (st->base == NULL)
            tsr_err(err, TSR_ESTATE, "StageRequest.base_version %lld: the shard does not "
                    "have it (current %lld)", (long long)rq->base_version, (long long)cur);
    }
    if (st->base == NULL) {
        staging_free(st);
        return err ? err->code : TSR_ESTATE;
    }
    if ((rc = stage_stream_seq(s, st, rq, err)) != 0) {
        staging_free(st);
        return rc;
    }
    if ((rc = stage_template(st, rq, err)) != 0) {
        staging_free(st);
        return rc;
    }
    s->staging = st;
    atomic_store(&s->staging_version, st->version);
    *out = st;
    return 0;
}

/* A later chunk must continue the staging in order, on the same base. */
static int stage_check_next(const tsr__staging *st, const Tessera__V1__StageRequest *rq,
                            tsr_error *err)
{
    if (st == NULL || st->version != rq->version)
        return tsr_err(err, TSR_ESTATE, "StageRequest: chunk %d of version %lld without chunk 0",
                       rq->chunk, (long long)rq->version);
    if (rq->chunk != st->chunks)
        return tsr_err(err, TSR_ESTATE, "StageRequest: chunk %d of version %lld, expected chunk %d",
                       rq->chunk, (long long)rq->version, st->chunks);
    if (rq->base_version != st->base_version)
        return tsr_err(err, TSR_EINVAL, "StageRequest: base_version %lld differs from chunk 0's %lld",
                       (long long)rq->base_version, (long long)st->base_version);
    return 0;
}

/* Validates the whole chunk and converts its upserts to records (recs: n_upserts + 1
 * slots, *nrecs of them filled, refs owned by the caller even on error) before any of it
 * is applied. */
static int stage_convert(const tsr__staging *st, const Tessera__V1__StageRequest *rq,
                         tsr__rec **recs, size_t *nrecs, tsr_error *err)
{
    const tsr__tmpl *t = st->tmpl ? st->tmpl : st->base->tmpl;
    int rc = tsr__convert_edits(t, NULL, rq->upserts, rq->n_upserts, rq->deletes, rq->n_deletes,
                                recs, nrecs, err);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < rq->n_drop_lists; i++)
        if (!list_ok(st, rq->drop_lists[i]))
            return tsr_err(err, TSR_EINVAL, "drop_lists[%zu] %d: not a list", i,
                           rq->drop_lists[i]);
    for (size_t i = 0; i < rq->n_own_lists; i++)
        if (!list_ok(st, rq->own_lists[i]))
            return tsr_err(err, TSR_EINVAL, "own_lists[%zu] %d: not a list", i,
                           rq->own_lists[i]);
    return 0;
}

/* Appends a validated chunk to the staging; takes the refs of recs[0 .. *nrecs) (and
 * sets *nrecs to 0) on success. Nothing is applied when it fails (TSR_ENOMEM). */
static int stage_apply(tsr__staging *st, const Tessera__V1__StageRequest *rq,
                       tsr__rec **recs, size_t *nrecs, tsr_error *err)
{
    upent *nu = tsr_try_realloc(st->ups, st->nups + *nrecs + 1, sizeof *nu);
    int64_t *nd = tsr_try_realloc(st->dels, st->ndels + rq->n_deletes + 1, sizeof *nd);
    int32_t *ndr = tsr_try_realloc(st->drop, st->ndrop + rq->n_drop_lists + 1, sizeof *ndr);
    int32_t *no = tsr_try_realloc(st->own, st->nown + rq->n_own_lists + 1, sizeof *no);
    if (nu) st->ups = nu;
    if (nd) st->dels = nd;
    if (ndr) st->drop = ndr;
    if (no) st->own = no;
    if (!nu || !nd || !ndr || !no)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < *nrecs; i++)
        st->ups[st->nups++] = (upent){recs[i], st->seq++};
    *nrecs = 0;
    for (size_t i = 0; i < rq->n_deletes; i++)
        st->dels[st->ndels++] = rq->deletes[i]->label;
    for (size_t i = 0; i < rq->n_drop_lists; i++)
        st->drop[st->ndrop++] = rq->drop_lists[i];
    for (size_t i = 0; i < rq->n_own_lists; i++)
        st->own[st->nown++] = rq->own_lists[i];
    if (rq->n_own_lists)
        st->have_own = 1;
    st->total_ups += (int64_t)rq->n_upserts;
    st->total_dels += (int64_t)rq->n_deletes;
    st->chunks = rq->chunk + 1;
    return 0;
}

/* Test hook of the crash tests (tests/integration/test_reshard_crash.py): with
 * TSR_SHARD_CRASH_AT=prepare|commit the shard _exit(137)s when that call arrives, as a
 * kill -9 at that step would; =stage when a Stage chunk after chunk 0 arrives (in the
 * middle of a staging: chunk 0 staged, the rest not); catchup|catchup-logged: stream.c's
 * hook, the same common one. */
static void crash_point(const char *step)
{
    tsr_test_crash(TSR_KNOB_SHARD_CRASH_AT, step);
}

/* Takes update_mu and checks the sender's leader term under it (shard.h: the check and
 * the operation are one section). 0 with update_mu held, or the refusal with it released. */
static int update_lock(tsr__shard *s, int64_t term, tsr_error *err)
{
    pthread_mutex_lock(&s->update_mu);
    int rc = tsr__shard_term_check(s, term, err);
    if (rc != 0)
        pthread_mutex_unlock(&s->update_mu);
    return rc;
}

int tsr__shard_stage(tsr__shard *s, const Tessera__V1__StageRequest *rq,
                     Tessera__V1__StageResponse *resp, tsr_error *err)
{
    int rc = 0;
    tsr__rec **recs = NULL;
    size_t nrecs = 0;
    int64_t cur = 0;
    if (rq->chunk > 0)
        crash_point("stage"); /* test hook: in the middle of a staging */
    if ((rc = update_lock(s, rq->leader_term, err)) != 0)
        return rc;
    tsr__staging *st = s->staging;
    if ((rc = stage_check_version(s, rq, &cur, err)) != 0)
        goto out;
    if (st && st->version == rq->version && rq->chunk == st->chunks - 1 && rq->chunk > 0) {
        /* A retry of the last chunk: acknowledged, not applied twice. */
        goto reply;
    }
    if ((rc = rq->chunk == 0 ? stage_begin(s, rq, cur, &st, err)
                             : stage_check_next(st, rq, err)) != 0)
        goto out;
    recs = tsr_try_calloc(rq->n_upserts + 1, sizeof *recs);
    if (recs == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = stage_convert(st, rq, recs, &nrecs, err)) != 0 ||
        (rc = stage_apply(st, rq, recs, &nrecs, err)) != 0)
        goto out;
reply:
    resp->version = st->version;
    resp->chunks_received = st->chunks;
    resp->upserts = st->total_ups;
    resp->deletes = st->total_dels;
out:
    for (size_t i = 0; i < nrecs; i++)
        tsr__rec_unref(recs[i]);
    free(recs);
    pthread_mutex_unlock(&s->update_mu);
    return rc;
}

/* ------------------------------------------------------------------ prepare */

static int up_cmp(const void *a, const void *b)
{
    const upent *x = a, *y = b;
    if (x->rec->label != y->rec->label)
        return x->rec->label < y->rec->label ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int i64_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Turns the staging into an edit set: upserts sorted by label, the last copy of a label
 * wins; deletes sorted, unique. */
static int make_edits(tsr__staging *st, tsr__edits *e, tsr_error *err)
{
    memset(e, 0, sizeof *e);
    if (st->nups > 1)
        qsort(st->ups, st->nups, sizeof *st->ups, up_cmp);
    e->ups = tsr_try_malloc(st->nups + 1, sizeof *e->ups);
    e->dels = tsr_try_malloc(st->ndels + 1, sizeof *e->dels);
    e->drop = tsr_try_malloc(st->ndrop + 1, sizeof *e->drop);
    e->own = tsr_try_malloc(st->nown + 1, sizeof *e->own);
    if (!e->ups || !e->dels || !e->drop || !e->own)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < st->nups; i++) {
        if (i + 1 < st->nups && st->ups[i + 1].rec->label == st->ups[i].rec->label)
            continue;
        e->ups[e->nups++] = tsr__rec_ref(st->ups[i].rec);
    }
    if (st->ndels > 1)
        qsort(st->dels, st->ndels, sizeof *st->dels, i64_cmp);
    for (size_t i = 0; i < st->ndels; i++)
        if (e->ndels == 0 || e->dels[e->ndels - 1] != st->dels[i])
            e->dels[e->ndels++] = st->dels[i];
    if (st->ndrop)
        memcpy(e->drop, st->drop, st->ndrop * sizeof *e->drop);
    e->ndrop = st->ndrop;
    if (st->nown)
        memcpy(e->own, st->own, st->nown * sizeof *e->own);
    e->nown = st->nown;
    e->have_own = st->have_own;
    return 0;
}

/* The base's delta into the edit set (a non-empty base): its applied seq must still be
 * the one Stage checked (a write applied since would be lost by the fold). A catch-up
 * staging folds the snapshot captured at Stage instead: the writes after it stay the
 * coordinator's to carry into the new version (Writes naming it, before its Commit). */
static int fold_delta(tsr__shard *s, const tsr__staging *st, tsr__edits *e, tsr_error *err)
{
    if (st->base_version == 0)
        return 0;
    tsr__delta *d;
    int rc = 0;
    if (st->capture) {
        d = tsr__delta_ref(st->captured);
    } else {
        pthread_mutex_lock(&s->table_mu);
        d = tsr__delta_ref(st->base->delta);
        pthread_mutex_unlock(&s->table_mu);
        int64_t applied = tsr__applied_seq(st->base, d);
        if (applied != st->stream_seq)
            rc = tsr_err(err, TSR_ESTATE, "Prepare(%lld): version %lld's applied stream seq "
                         "is %lld, Stage's base_stream_seq was %lld (writes arrived after "
                         "Stage)", (long long)st->version, (long long)st->base_version,
                         (long long)applied, (long long)st->stream_seq);
    }
    /* the build copies the codes of d's records: e->src takes our reference until then */
    if (rc == 0 && !tsr__delta_empty(d) && (rc = tsr__delta_fold(d, e, err)) == 0) {
        e->src = d;
        return 0;
    }
    tsr__delta_unref(d);
    return rc;
}

/* Test hook of tests/integration/test_coord_stop.py: with TSR_SHARD_SLOW_PREPARE_MS=N
 * (1..600000) a Prepare first sleeps N ms, as the build of a large version would take,
 * while the process keeps answering (keepalives, other calls). */
static void slow_prepare(void)
{
    tsr_test_sleep(TSR_KNOB_SHARD_SLOW_PREPARE_MS, "Prepare");
}

/* The build of a Prepare: the edits (the staged ones plus the base's delta), the new
 * version, its files written, committed and verified in the store. */
static int prepare_build(tsr__shard *s, tsr__staging *st, int64_t version, unsigned paced,
                         tsr__edits *e, tsr__version **out, tsr_error *err)
{
    int rc;
    tsr__version *v = NULL;
    int64_t t[6];
    t[0] = tsr_clock_mono_ms();
    if ((rc = make_edits(st, e, err)) != 0 || (rc = fold_delta(s, st, e, err)) != 0)
        return rc;
    t[1] = tsr_clock_mono_ms();
    if ((rc = tsr__version_build(st->base, st->tmpl, e, version, &v, err)) != 0)
        return rc;
    t[2] = tsr_clock_mono_ms();
    *out = v; /* the caller unrefs it on failure */
    v->stream_seq = st->stream_seq;
    tsr_store_txn *txn = NULL;
    if ((rc = tsr_store_begin(s->store, (uint64_t)version, &txn, err)) != 0)
        return rc;
    if ((rc = tsr__version_write(v, tsr_store_txn_dir(txn), err)) != 0) {
        tsr_store_abort(txn);
        return rc;
    }
    t[3] = tsr_clock_mono_ms();
    /* MANIFEST, fsyncs, rename to v<version>/, fsync of the data dir. */
    if ((rc = tsr_store_commit(txn, err)) != 0)
        return rc;
    t[4] = tsr_clock_mono_ms();
    if ((rc = tsr_store_verify(s->store, (uint64_t)version, err)) != 0) {
        tsr_store_remove(s->store, (uint64_t)version, NULL);
        return rc;
    }
    t[5] = tsr_clock_mono_ms();
    struct timespec cpu = {0, 0}; /* this thread's CPU (the build runs on a thread of its own) */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    /* the phases of a build, for the operator (and the fold's profile, docs/performance.md) */
    char pace[48] = "";
    if (paced)
        snprintf(pace, sizeof pace, ", paced to %u %% of a core", paced);
    tsr_info("Prepare(%lld): built in %lld ms (thread CPU %lld ms%s): edits %lld, lists %lld, "
             "files %lld, fsync and rename %lld, verify %lld", (long long)version,
             (long long)(t[5] - t[0]),
             (long long)cpu.tv_sec * 1000 + cpu.tv_nsec / 1000000, pace,
             (long long)(t[1] - t[0]), (long long)(t[2] - t[1]), (long long)(t[3] - t[2]),
             (long long)(t[4] - t[3]), (long long)(t[5] - t[4]));
    return 0;
}

typedef struct build_job {
    tsr__shard *s;
    tsr__staging *st;
    int64_t version;
    tsr__edits *e;
    tsr__version **out;
    tsr_error *err;
    int64_t *map_ms;
    unsigned cpu_pct; /* PrepareRequest.build_cpu_percent */
    int rc;
} build_job;

/* After a build: the version's bytes on disk and its raw vectors moved from the heap to a
 * mapping of its vectors.f32 (tsr__version_map_vectors reads every vector back: it runs
 * on the build's thread, below the queries). *map_ms gets the mapping's time. */
static void map_built(tsr__shard *s, int64_t version, tsr__version *v, int64_t *map_ms)
{
    char vd[4096];
    *map_ms = 0;
    if (tsr_store_path(s->store, (uint64_t)version, NULL, vd, sizeof vd, NULL) != 0)
        return;
    v->disk_bytes = dir_bytes(vd);
    int64_t t0 = tsr_clock_mono_ms();
    if (v->disk_bytes > 0)
        tsr__version_map_vectors(v, vd);
    *map_ms = tsr_clock_mono_ms() - t0;
}

static void *build_main(void *arg)
{
    build_job *j = arg;
    tsr_thread_background(); /* this thread only (core/parallel.h) */
    unsigned paced = j->cpu_pct > 0 && j->cpu_pct < 100 ? j->cpu_pct : 0;
    tsr_thread_pace(paced / 100.0);
    j->rc = prepare_build(j->s, j->st, j->version, paced, j->e, j->out, j->err);
    if (j->rc == 0)
        map_built(j->s, j->version, *j->out, j->map_ms);
    return NULL;
}

/* prepare_build on a thread of its own at the background priority (nice 10), paced to
 * cpu_pct of a core when 1..99, joined (the caller keeps update_mu): a fold or batch build
 * takes seconds of CPU, and on a machine with few cores the queries served meanwhile
 * (polling threads, default priority) should win the CPU — docs/performance.md "Streamed
 * writes" (the fold's p99). In place (unpaced) when no thread can be started. */
static int prepare_build_niced(tsr__shard *s, tsr__staging *st, int64_t version,
                               unsigned cpu_pct, tsr__edits *e, tsr__version **out,
                               int64_t *map_ms, tsr_error *err)
{
    build_job j = {s, st, version, e, out, err, map_ms, cpu_pct, 0};
    pthread_t th;
    pthread_attr_t at;
    int started = 0;
    if (pthread_attr_init(&at) == 0) {
        pthread_attr_setstacksize(&at, (size_t)8 << 20);
        started = pthread_create(&th, &at, build_main, &j) == 0;
        pthread_attr_destroy(&at);
    }
    if (!started) { /* in place */
        int rc = prepare_build(s, st, version, 0, e, out, err);
        if (rc == 0)
            map_built(s, version, *out, map_ms);
        return rc;
    }
    pthread_join(th, NULL);
    return j.rc;
}

int tsr__shard_prepare(tsr__shard *s, int64_t term, int64_t version, unsigned cpu_pct,
                       Tessera__V1__PrepareResponse *resp, tsr_error *err)
{
    crash_point("prepare");
    slow_prepare();
    int rc = 0;
    tsr__version *v = NULL;
    tsr__edits e = {0};
    if ((rc = update_lock(s, term, err)) != 0)
        return rc;
    pthread_mutex_lock(&s->table_mu);
    tsr__held *h = find_held(s, version);
    if (h) {
        resp->ready = 1;
        resp->vectors_count = (int64_t)h->v->nvectors;
        resp->sparse_vectors_count = (int64_t)h->v->nsparse;
    }
    pthread_mutex_unlock(&s->table_mu);
    if (h)
        goto out; /* already prepared (or serving): idempotent */
    pthread_mutex_lock(&s->table_mu);
    int full = s->nheld >= TSR__HELD_CAP;
    pthread_mutex_unlock(&s->table_mu);
    if (full) {
        rc = tsr_err(err, TSR_ELIMIT, "Prepare(%lld): %d versions held already; Commit, Abort or "
                     "Release some first", (long long)version, TSR__HELD_CAP);
        goto out;
    }
    tsr__staging *st = s->staging;
    if (st == NULL || st->version != version) {
        rc = tsr_err(err, TSR_ESTATE, "Prepare(%lld): no staged version %lld%s", (long long)version,
                     (long long)version, st ? " (another version is staged)" : "");
        goto out;
    }
    int64_t map_ms = 0;
    if ((rc = prepare_build_niced(s, st, version, cpu_pct, &e, &v, &map_ms, err)) != 0)
        goto out;
    if (st->capture) {
        /* A catch-up version: its (empty) log marks it, also after a restart. */
        if ((rc = tsr__stream_catchup_create(s, version, err)) != 0) {
            tsr_store_remove(s->store, (uint64_t)version, NULL);
            goto out;
        }
        v->catchup = 1;
    }
    /* Publish as PREPARED with no Write in flight (write_mu): from here Writes are
     * refused (but for a catch-up version), and one applied during the build would be
     * missing from it. A catch-up version folded what Stage captured: the writes since
     * are the coordinator's to carry into it. */
    tsr__stream_pause(s);
    pthread_mutex_lock(&s->table_mu);
    int64_t applied = tsr__applied_seq(st->base, st->base->delta);
    int moved = st->base_version != 0 && !st->capture && applied != st->stream_seq;
    if (!moved)
        s->held[s->nheld++] = (tsr__held){v, TSR__PREPARED};
    pthread_mutex_unlock(&s->table_mu);
    tsr__stream_resume(s, 0);
    if (moved) {
        tsr_store_remove(s->store, (uint64_t)version, NULL);
        rc = tsr_err(err, TSR_ESTATE, "Prepare(%lld): version %lld's applied stream seq moved "
                     "from %lld to %lld during the build (writes during a fold)",
                     (long long)version, (long long)st->base_version,
                     (long long)st->stream_seq, (long long)applied);
        goto out;
    }
    resp->ready = 1;
    resp->vectors_count = (int64_t)v->nvectors;
    resp->sparse_vectors_count = (int64_t)v->nsparse;
    tsr_info("prepared version %lld: %zu vectors, %zu sparse (%llu bytes on disk; vectors "
             "mapped in %lld ms)%s",
             (long long)version, v->nvectors, v->nsparse, (unsigned long long)v->disk_bytes,
             (long long)map_ms,
             v->catchup ? ", a catch-up version (Writes naming it are taken)" : "");
    v = NULL;
    staging_free(s->staging);
    s->staging = NULL;
    atomic_store(&s->staging_version, 0);
    goto out;
out:
    if (rc != 0 && resp) {
        resp->ready = 0;
    }
    tsr__edits_close(&e);
    tsr__version_unref(v);
    pthread_mutex_unlock(&s->update_mu);
    return rc;
}

/* ------------------------------------------------------------------ commit / abort / release */

/* Drops the oldest non-current serving versions beyond the cap (caller holds update_mu). */
static void enforce_cap(tsr__shard *s)
{
    for (;;) {
        tsr__version *drop = NULL;
        pthread_mutex_lock(&s->table_mu);
        size_t serving = 0, oldest = SIZE_MAX;
        for (size_t i = 0; i < s->nheld; i++)
            if (s->held[i].state == TSR__SERVING) {
                serving++;
                if (s->held[i].v != s->current &&
                    (oldest == SIZE_MAX || s->held[i].v->version < s->held[oldest].v->version))
                    oldest = i;
            }
        if (serving > TSR__MAX_HELD_VERSIONS && oldest != SIZE_MAX)
            drop = take_held(s, oldest);
        pthread_mutex_unlock(&s->table_mu);
        if (drop == NULL)
            return;
        tsr_info("dropping version %lld (more than %d versions held)", (long long)drop->version,
                 TSR__MAX_HELD_VERSIONS);
        tsr__version_unref(drop);
    }
}

int tsr__shard_commit(tsr__shard *s, int64_t term, int64_t version, tsr_error *err)
{
    crash_point("commit");
    int rc = 0;
    tsr__version *old = NULL;
    if ((rc = update_lock(s, term, err)) != 0)
        return rc;
    pthread_mutex_lock(&s->table_mu);
    int64_t cur = s->current->version;
    tsr__held *h = find_held(s, version);
    int prepared = h && h->state == TSR__PREPARED;
    pthread_mutex_unlock(&s->table_mu);
    if (version == cur)
        goto out; /* idempotent */
    if (!prepared) {
        rc = tsr_err(err, TSR_ESTATE, "Commit(%lld): %s (current %lld)", (long long)version,
                     h ? "version is not prepared" : "no such prepared version", (long long)cur);
        goto out;
    }
    if (version < cur) {
        rc = tsr_err(err, TSR_ESTATE, "Commit(%lld): older than the current version %lld",
                     (long long)version, (long long)cur);
        goto out;
    }
    /* The commit point of this shard: CURRENT names the new version on disk. No Write runs
     * meanwhile (write_mu), so none lands in the old version after the switch. */
    tsr__stream_pause(s);
    if ((rc = tsr_store_set_current(s->store, (uint64_t)version, err)) != 0) {
        tsr__stream_resume(s, 0);
        goto out;
    }
    pthread_mutex_lock(&s->table_mu);
    h = find_held(s, version);
    h->state = TSR__SERVING;
    old = s->current;
    s->current = tsr__version_ref(h->v);
    /* The empty version 0 can never be named by a query (0 means "current"): drop it. */
    tsr__version *empty = NULL;
    for (size_t i = 0; i < s->nheld; i++)
        if (s->held[i].v->version == 0) {
            empty = take_held(s, i);
            break;
        }
    int folded = !tsr__delta_empty(old->delta);
    pthread_mutex_unlock(&s->table_mu);
    tsr__stream_resume(s, 1);
    if (folded) {
        atomic_fetch_add(&s->folds, 1);
        tsr_metrics_counter_add("tessera_shard_folds_total", NULL, 1);
    }
    tsr__version_unref(empty);
    tsr_info("committed version %lld (was %lld), applied stream seq %lld", (long long)version,
             (long long)cur, (long long)tsr__applied_seq(s->current, s->current->delta));
    /* Prepared versions older than the new current can never be committed. */
    for (;;) {
        tsr__version *drop = NULL;
        pthread_mutex_lock(&s->table_mu);
        for (size_t i = 0; i < s->nheld; i++)
            if (s->held[i].state == TSR__PREPARED && s->held[i].v->version < version) {
                drop = take_held(s, i);
                break;
            }
        pthread_mutex_unlock(&s->table_mu);
        if (drop == NULL)
            break;
        if (drop->catchup)
            tsr__stream_catchup_remove(s, drop->version);
        tsr__version_unref(drop);
    }
    enforce_cap(s);
    gc_dirs(s);
out:
    tsr__version_unref(old);
    pthread_mutex_unlock(&s->update_mu);
    return rc;
}

int tsr__shard_abort(tsr__shard *s, int64_t term, int64_t version, tsr_error *err)
{
    int rc = 0;
    tsr__version *drop = NULL;
    if ((rc = update_lock(s, term, err)) != 0)
        return rc;
    if (s->staging && s->staging->version == version) {
        staging_free(s->staging);
        s->staging = NULL;
        atomic_store(&s->staging_version, 0);
        tsr_info("aborted staged version %lld", (long long)version);
    }
    pthread_mutex_lock(&s->table_mu);
    if (version == s->current->version) {
        rc = tsr_err(err, TSR_ESTATE, "Abort(%lld): it is the current version", (long long)version);
    } else {
        for (size_t i = 0; i < s->nheld; i++)
            if (s->held[i].v->version == version) {
                if (s->held[i].state != TSR__PREPARED)
                    rc = tsr_err(err, TSR_ESTATE, "Abort(%lld): the version is serving (use "
                                 "Release)", (long long)version);
                else
                    drop = take_held(s, i);
                break;
            }
    }
    pthread_mutex_unlock(&s->table_mu);
    if (drop) {
        tsr_error e = TSR_ERROR_INIT;
        if (drop->catchup)
            tsr__stream_catchup_remove(s, version);
        if (tsr_store_remove(s->store, (uint64_t)version, &e) != 0)
            tsr_warn("Abort(%lld): cannot remove its directory: %s", (long long)version, e.msg);
        tsr_info("aborted prepared version %lld", (long long)version);
        tsr__version_unref(drop);
    }
    pthread_mutex_unlock(&s->update_mu);
    return rc;
}

int tsr__shard_release(tsr__shard *s, int64_t term, int64_t below, int64_t *versions,
                       size_t cap, size_t *n, tsr_error *err)
{
    int rc = update_lock(s, term, err);
    if (rc != 0)
        return rc;
    for (;;) {
        tsr__version *drop = NULL;
        pthread_mutex_lock(&s->table_mu);
        for (size_t i = 0; i < s->nheld; i++)
            if (s->held[i].state == TSR__SERVING && s->held[i].v != s->current &&
                s->held[i].v->version < below) {
                drop = take_held(s, i);
                break;
            }
        pthread_mutex_unlock(&s->table_mu);
        if (drop == NULL)
            break;
        tsr_info("released version %lld", (long long)drop->version);
        tsr__version_unref(drop);
    }
    gc_dirs(s);
    pthread_mutex_lock(&s->table_mu);
    *n = 0;
    for (size_t i = 0; i < s->nheld && *n < cap; i++)
        versions[(*n)++] = s->held[i].v->version;
    pthread_mutex_unlock(&s->table_mu);
    pthread_mutex_unlock(&s->update_mu);
    return 0;
}

size_t tsr__shard_list(tsr__shard *s, tsr__held *out, size_t cap, int *staging_set,
                       int64_t *staging_version, int64_t *current_version)
{
    size_t n = 0;
    pthread_mutex_lock(&s->table_mu);
    for (size_t i = 0; i < s->nheld && n < cap; i++)
        out[n++] = (tsr__held){tsr__version_ref(s->held[i].v), s->held[i].state};
    *current_version = s->current->version;
    pthread_mutex_unlock(&s->table_mu);
    /* Stats must not wait for a Stage: the staged version number is a separate atomic. */
    int64_t sv = atomic_load(&s->staging_version);
    *staging_set = sv != 0;
    *staging_version = sv;
    return n;
}
