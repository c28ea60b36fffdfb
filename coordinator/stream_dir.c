/*
 * stream_dir — the streamed writes as directories, for updates (update.c) and re-seeds
 * (reconcile.c): the served version's directory with the overlay applied (the base an
 * update plans on), and a fold's two-step copy of the overlay onto the directory of the
 * version it builds (docs/streaming.md "Writes during a fold").
 *
 * Threads: tsr__stream_base and tsr__stream_overlay_finish under the stream lock (st.mu;
 * the overlay is the writer's otherwise); tsr__stream_overlay_copy without it, taking the
 * overlay's lock (ov_rw) as a reader per ONTO_CHUNK entries, by the update thread, which
 * holds update_mu (the served snapshot cannot change). Calls state.c (the directory) only.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "stream_int.h"
#include "core/log.h"

tsr__snap *tsr__stream_base(tsr__coord *c, const tsr__snap *sn)
{
    tsr__stream *s = c->st;
    if (s->ov_version != sn->version || s->ov.n == 0)
        return NULL;
    tsr__snap *v = tsr__snap_create();
    v->version = sn->version;
    v->tmpl = sn->tmpl;
    v->tmpl_bytes = sn->tmpl_bytes;
    v->tmpl_len = sn->tmpl_len;
    v->cent_norms = sn->cent_norms;
    v->plan = sn->plan;
    v->plan_kind = sn->plan_kind;
    memcpy(v->retired, sn->retired, sizeof v->retired);
    v->ngroups = sn->ngroups;
    v->next_label = s->next_label;
    for (size_t i = 0; i < sn->dir.n; i++) {
        const tsr__dir_entry *e = &sn->dir.e[i];
        if (!tsr__dir_find(&s->ov, e->id))
            tsr__dir_add(&v->dir, e->id, e->label, e->list, e->shard, e->dense, e->sparse);
    }
    for (size_t i = 0; i < s->ov.n; i++) {
        const tsr__dir_entry *e = &s->ov.e[i];
        if (!e->dead)
            tsr__dir_add(&v->dir, e->id, e->label, e->list, e->shard, e->dense, e->sparse);
    }
    v->ndense = sn->ndense + s->d_dense;
    v->nsparse = sn->nsparse + s->d_sparse;
    return v;
}

/* One overlay entry onto ns's directory. */
static void onto(tsr__snap *ns, const tsr__dir_entry *e)
{
    if (e->dead)
        tsr__dir_remove(&ns->dir, e->id);
    else
        tsr__dir_set(&ns->dir, e->id, e->label, e->list, e->shard, e->dense, e->sparse, 0);
}

#define ONTO_CHUNK 4096 /* overlay entries per hold of ov_rw (read) */

size_t tsr__stream_overlay_copy(tsr__coord *c, const tsr__snap *sn, tsr__snap *ns)
{
    tsr__stream *s = c->st;
    pthread_rwlock_rdlock(&s->ov_rw);
    size_t mark = s->ntouched; /* every entry written after it is re-applied at _finish */
    int same = s->ov_version == sn->version;
    pthread_rwlock_unlock(&s->ov_rw);
    if (!same)
        return 0;
    for (size_t i = 0;;) {
        pthread_rwlock_rdlock(&s->ov_rw);
        size_t n = s->ov.n, end = i + ONTO_CHUNK < n ? i + ONTO_CHUNK : n;
        for (; i < end; i++)
            onto(ns, &s->ov.e[i]);
        pthread_rwlock_unlock(&s->ov_rw);
        if (i >= n)
            break;
    }
    /* tests: writes in this sleep come after the mark (test_stream_fold.py) */
    tsr_test_sleep(TSR_KNOB_COORD_SLOW_FOLD_DIR_MS, "the fold's directory copy");
    return mark;
}

void tsr__stream_overlay_finish(tsr__coord *c, const tsr__snap *sn, tsr__snap *ns, size_t mark)
{
    tsr__stream *s = c->st;
    if (s->ov_version != sn->version)
        return;
    for (size_t k = mark; k < s->ntouched; k++) /* the later of two writes of an id wins */
        onto(ns, &s->ov.e[s->touched[k]]);
    ns->ndense = sn->ndense + s->d_dense;
    ns->nsparse = sn->nsparse + s->d_sparse;
    if (s->next_label > ns->next_label)
        ns->next_label = s->next_label;
}

void tsr__stream_base_free(tsr__snap *v)
{
    if (!v)
        return;
    v->tmpl = NULL;
    v->tmpl_bytes = NULL;
    v->cent_norms = NULL;
    v->plan = NULL;
    tsr__snap_unref(v);
}
