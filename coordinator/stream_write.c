/*
 * stream_write — the write queue and the writer thread of the streamed writes (stream.h;
 * docs/streaming.md): validation on the caller's thread, the queue, and the rounds of the
 * ONE writer thread (group commit, labels, one ShardWriteRequest per touched group,
 * appended to the coordinator log and mirrored before it is sent, then applied to the
 * overlay and acknowledged).
 *
 * DESIGN (threads, locks): a round runs under st.mu (the stream lock); the queue has its
 * own q_mu, never held with another lock.
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

#define ROUND_MAX 10000 /* records per round (group commit cap) */

enum { SREQ_UPSERT = 0, SREQ_REMOVE = 1 };

typedef struct tsr__sreq {
    struct tsr__sreq *next;
    int kind, mask;             /* mask: update_mask all_restricts */
    tsr_datapoint *dps;         /* upsert: owned, n validated records */
    int64_t *lists;             /* upsert: owned, the list of each (-1 sparse-only) */
    char *const *ids;           /* remove: borrowed from the caller's request */
    size_t n;
    /* the result, under q_mu */
    int done, code;             /* code: TSR_RPC_* */
    char msg[700];
    int64_t removed, unknown, version, seq;
} tsr__sreq;

/* ---------------------------------------------------------------- validation */

static void free_dps(tsr_datapoint *dps, size_t n)
{
    for (size_t i = 0; dps && i < n; i++)
        tsr_datapoint_close(&dps[i]);
    free(dps);
}

/* The printable id of a datapoint in a message (cut, never invalid UTF-8 in the reply:
 * bytes >= 0x80 and control bytes become '?'). */
static void id_snip(char *out, size_t cap, const char *id)
{
    size_t j = 0;
    for (size_t i = 0; id && id[i] && j + 4 < cap && i < 80; i++)
        out[j++] = (unsigned char)id[i] < 0x20 || (unsigned char)id[i] >= 0x7f ? '?' : id[i];
    if (id && strlen(id) > 80 && j + 4 < cap) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = 0;
}

/* Validates the upsert request into q (records, lists). Returns 0 or a negative code with
 * the status on r. */
static int upsert_prepare(tsr__coord *c, const tsr__snap *sn,
                          const Tessera__V1__UpsertDatapointsRequest *rq, tsr__sreq *q,
                          tsr_rpc_reply *r)
{
    size_t n = rq->n_datapoints, d = (size_t)c->cfg.dimensions;
    if (rq->update_mask) {
        for (size_t j = 0; j < rq->update_mask->n_paths; j++) {
            const char *p = rq->update_mask->paths[j];
            if (!p || strcmp(p, "all_restricts") != 0) {
                char s[100];
                id_snip(s, sizeof s, p);
                return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "update_mask.paths[%zu] "
                                           "= '%s': the only supported path is all_restricts",
                                           j, s);
            }
            q->mask = 1;
        }
    }
    q->dps = tsr_xcalloc(n + 1, sizeof *q->dps);
    q->lists = tsr_xcalloc(n + 1, sizeof *q->lists);
    q->n = n;
    for (size_t i = 0; i < n; i++) {
        enum tsr_rec_error type = TSR_REC_PARSING_ERROR;
        char msg[600], s[100];
        const Tessera__V1__IndexDatapoint *p = rq->datapoints[i];
        int bad = tsr_pb_datapoint_record(p, &q->dps[i], &type, msg, sizeof msg);
        if (!bad && q->mask)
            bad = tsr_batch_id_check(q->dps[i].id, &type, msg, sizeof msg) ||
                  tsr_batch_restricts_check(&q->dps[i], &type, msg, sizeof msg);
        else if (!bad)
            bad = tsr_batch_record_check(&q->dps[i], d, &type, msg, sizeof msg);
        if (bad) {
            id_snip(s, sizeof s, p->datapoint_id);
            return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "datapoints[%zu] (id '%s'): "
                                       "%s: %s", i, s, tsr_rec_error_name(type), msg);
        }
        if (c->cfg.distance == TSR_DIST_COSINE && q->dps[i].dense && !q->mask)
            tsr__normalize(q->dps[i].dense, d);
    }
    tsr_error err = TSR_ERROR_INIT;
    if (!q->mask && tsr__assign_records(sn->tmpl, q->dps, n, d, 1, q->lists, &err))
        return tsr_rpc_reply_from_error(r, &err);
    return 0;
}

/* ---------------------------------------------------------------- queue */

/* Queues q and waits for its round. */
static void submit(tsr__coord *c, tsr__sreq *q)
{
    tsr__stream *s = c->st;
    pthread_mutex_lock(&s->q_mu);
    if (s->stop || !s->started) {
        q->done = 1;
        q->code = TSR_RPC_UNAVAILABLE;
        snprintf(q->msg, sizeof q->msg, "the coordinator is %s; nothing was written",
                 s->stop ? "shutting down" : "starting");
    } else {
        q->next = NULL;
        if (s->tail)
            s->tail->next = q;
        else
            s->head = q;
        s->tail = q;
        pthread_cond_signal(&s->q_cv);
        while (!q->done)
            pthread_cond_wait(&s->done_cv, &s->q_mu);
    }
    pthread_mutex_unlock(&s->q_mu);
}

/* Ends a request of a round (the writer, before it signals). */
static void finish(tsr__sreq *q, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish(tsr__sreq *q, int code, const char *fmt, ...)
{
    q->code = code;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(q->msg, sizeof q->msg, fmt, ap);
        va_end(ap);
    }
}

static int reply_of(const tsr__sreq *q, tsr_rpc_reply *r)
{
    return q->code == TSR_RPC_OK ? 0 : tsr_rpc_reply_error(r, q->code, "%s", q->msg);
}

/* Common checks of both entry points: a follower refuses, the limit, an index. Returns a
 * new snapshot ref or NULL with the status on r (*rc). */
static tsr__snap *precheck(tsr__coord *c, size_t n, const char *what, tsr_rpc_reply *r, int *rc)
{
    if ((*rc = tsr__coord_refuse_follower(c, r)))
        return NULL;
    if (n > TSR__STREAM_MAX_PER_REQUEST) {
        *rc = tsr_rpc_reply_error(r, TSR_RPC_RESOURCE_EXHAUSTED, "%zu %s in one request, at "
                                  "most %d", n, what, TSR__STREAM_MAX_PER_REQUEST);
        return NULL;
    }
    tsr__snap *sn = tsr__coord_snap_get(c);
    if (sn->version == 0 || !sn->tmpl) {
        tsr__snap_unref(sn);
        *rc = tsr_rpc_reply_error(r, TSR_RPC_FAILED_PRECONDITION, "no index yet: the first "
                                  "UpdateIndex creates it (streamed writes need version >= 1)");
        return NULL;
    }
    return sn;
}

int tsr__coord_stream_upsert(tsr__coord *c, const Tessera__V1__UpsertDatapointsRequest *rq,
                             Tessera__V1__UpsertDatapointsResponse *resp, tsr_rpc_reply *r)
{
    int rc;
    tsr__snap *sn = precheck(c, rq->n_datapoints, "datapoints", r, &rc);
    if (!sn)
        return rc;
    tsr__sreq q;
    memset(&q, 0, sizeof q);
    q.kind = SREQ_UPSERT;
    rc = upsert_prepare(c, sn, rq, &q, r);
    tsr__snap_unref(sn);
    if (rc == 0) {
        submit(c, &q);
        rc = reply_of(&q, r);
    }
    if (rc == 0) {
        resp->upserted = (int64_t)q.n;
        resp->version = q.version;
        resp->stream_seq = q.seq;
    }
    free_dps(q.dps, q.n);
    free(q.lists);
    return rc;
}

int tsr__coord_stream_remove(tsr__coord *c, const Tessera__V1__RemoveDatapointsRequest *rq,
                             Tessera__V1__RemoveDatapointsResponse *resp, tsr_rpc_reply *r)
{
    int rc;
    tsr__snap *sn = precheck(c, rq->n_datapoint_ids, "datapoint_ids", r, &rc);
    if (!sn)
        return rc;
    tsr__snap_unref(sn);
    for (size_t i = 0; i < rq->n_datapoint_ids; i++) {
        enum tsr_rec_error type;
        char msg[300];
        if (tsr_batch_id_check(rq->datapoint_ids[i], &type, msg, sizeof msg))
            return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "datapoint_ids[%zu]: %s: %s",
                                       i, tsr_rec_error_name(type), msg);
    }
    tsr__sreq q;
    memset(&q, 0, sizeof q);
    q.kind = SREQ_REMOVE;
    q.ids = rq->datapoint_ids;
    q.n = rq->n_datapoint_ids;
    submit(c, &q);
    rc = reply_of(&q, r);
    if (rc == 0) {
        resp->removed = q.removed;
        resp->unknown = q.unknown;
        resp->version = q.version;
        resp->stream_seq = q.seq;
    }
    return rc;
}

/* ---------------------------------------------------------------- the round */

typedef struct act {
    tsr_datapoint *dp;          /* NULL = remove; borrowed from a request, or owned */
    int owned;
    int64_t list;
} act;

typedef struct round {
    tsr__coord *c;
    tsr__snap *sn;
    size_t S;
    tsr__sreq **rq;
    size_t nrq;
    char *ok;                   /* per request: taken into the round */
    char *touch;                /* nrq x S: request i touches group g */
    tsr__dir pend;              /* id -> index into act (label field) */
    act *act;
    size_t nact, cap;
    /* per group: the write */
    Tessera__V1__ShardWriteRequest *w;
    Tessera__V1__StagedUpsert **ups;
    Tessera__V1__StagedDelete **dels;
    tsr_pb_datapoint *pb;       /* one per act */
    size_t *ucap, *dcap;        /* per group: capacity of w[g].upserts, w[g].deletes */
    char *failed;               /* per group: no replica took the write */
} round;

/* 1 when group g has a replica writes can go to (holds the version, not behind, its
 * channel not failed). */
static int group_live(tsr__coord *c, size_t g)
{
    for (size_t j = 0; j < c->grp[g].n; j++) {
        const tsr__replica *p = &c->rep[c->grp[g].first + j];
        int st = tsr_rpc_channel_state(p->ch, 0);
        if (!atomic_load(&p->lagging) && !atomic_load(&p->stream_behind) &&
            st != TSR_RPC_CONN_TRANSIENT_FAILURE && st != TSR_RPC_CONN_SHUTDOWN)
            return 1;
    }
    return 0;
}

/* Is id live after the round's earlier actions? *e: its directory entry (NULL when none
 * or when an action of this round decides). */
static int live_now(const round *R, const char *id, const tsr__dir_entry **e, const act **pa)
{
    const tsr__dir_entry *pe = tsr__dir_find(&R->pend, id);
    *e = tsr__stream_lookup(R->c, R->sn, id);
    *pa = pe ? &R->act[pe->label] : NULL;
    if (pe)
        return R->act[pe->label].dp != NULL;
    return *e != NULL;
}

static void set_act(round *R, const char *id, tsr_datapoint *dp, int owned, int64_t list)
{
    tsr__dir_entry *pe = (tsr__dir_entry *)tsr__dir_find(&R->pend, id);
    act *a;
    if (pe) {
        a = &R->act[pe->label];
        if (a->owned && a->dp && a->dp != dp) {
            tsr_datapoint_close(a->dp);
            free(a->dp);
        }
    } else {
        if (R->nact == R->cap)
            R->act = tsr_xrealloc(R->act, (R->cap = R->cap ? R->cap * 2 : 256) * sizeof *R->act);
        tsr__dir_add(&R->pend, id, (int64_t)R->nact, 0, 0, 0, 0);
        a = &R->act[R->nact++];
    }
    a->dp = dp;
    a->owned = owned;
    a->list = list;
}

/* The groups request i may touch: its upserts' new groups and the current groups of its
 * ids. Returns the first group without a live replica, or -1. */
static long touch_groups(round *R, size_t i)
{
    tsr__sreq *q = R->rq[i];
    char *t = R->touch + i * R->S;
    for (size_t j = 0; j < q->n; j++) {
        const char *id = q->kind == SREQ_REMOVE ? q->ids[j] : q->dps[j].id;
        const tsr__dir_entry *e;
        const act *pa;
        live_now(R, id, &e, &pa);
        if (e && (size_t)e->shard < R->S)
            t[e->shard] = 1;
        if (pa && pa->dp) /* an earlier action of this round put it in a group */
            t[tsr__group_of(R->sn, (int32_t)pa->list, id, R->S)] = 1;
        if (q->kind == SREQ_UPSERT && !q->mask)
            t[tsr__group_of(R->sn, (int32_t)q->lists[j], id, R->S)] = 1;
    }
    for (size_t g = 0; g < R->S; g++)
        if (t[g] && !group_live(R->c, g))
            return (long)g;
    return -1;
}

/* update_mask all_restricts: the stored datapoints of request q's ids (the round's own
 * pending version first, else a Shard.Read at the version) with q's restricts; set as the
 * round's actions. Returns 0, or a TSR_RPC code with msg set (nothing set). */
static int mask_merge(round *R, tsr__sreq *q, char *msg, size_t cap)
{
    tsr__coord *c = R->c;
    size_t S = R->S, n = q->n;
    tsr_datapoint *base = tsr_xcalloc(n + 1, sizeof *base);
    int64_t *list = tsr_xcalloc(n + 1, sizeof *list);
    Tessera__V1__ShardReadRequest *rd = tsr_xcalloc(S, sizeof *rd);
    size_t *at = tsr_xcalloc(n + 1, sizeof *at), *grp = tsr_xcalloc(n + 1, sizeof *grp);
    char *need = tsr_xcalloc(n + 1, 1);
    int code = TSR_RPC_OK;
    for (size_t g = 0; g < S; g++) {
        tessera__v1__shard_read_request__init(&rd[g]);
        rd[g].version = (int64_t)R->sn->version;
        rd[g].labels = tsr_xcalloc(n + 1, sizeof(int64_t));
    }
    for (size_t j = 0; j < n; j++) {
        const tsr__dir_entry *e;
        const act *pa;
        char s[100];
        if (!live_now(R, q->dps[j].id, &e, &pa)) {
            id_snip(s, sizeof s, q->dps[j].id);
            snprintf(msg, cap, "datapoints[%zu] (id '%s'): update_mask all_restricts: the index "
                     "holds no datapoint with this id", j, s);
            code = TSR_RPC_INVALID_ARGUMENT;
            goto out;
        }
        if (pa) { /* upserted earlier in this round: its record */
            tsr_datapoint *src = pa->dp;
            tsr_pb_datapoint tmp;
            tsr_pb_datapoint_set(&tmp, src);
            enum tsr_rec_error ty;
            char m[10];
            tsr_pb_datapoint_record(&tmp.dp, &base[j], &ty, m, sizeof m);
            tsr_pb_datapoint_free(&tmp);
            list[j] = pa->list;
        } else {
            need[j] = 1;
            grp[j] = (size_t)e->shard;
            list[j] = e->list;
            at[j] = rd[e->shard].n_labels;
            rd[e->shard].labels[rd[e->shard].n_labels++] = e->label;
        }
    }
    tsr__gcall *calls = tsr_xcalloc(S, sizeof *calls);
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    Tessera__V1__ShardReadResponse **rr = tsr_xcalloc(S, sizeof *rr);
    size_t nc = 0;
    for (size_t g = 0; g < S; g++) {
        if (!rd[g].n_labels)
            continue;
        size_t l = 0;
        bufs[g] = tsr_rpc_pack(&rd[g].base, &l);
        calls[nc].group = g;
        calls[nc].req = bufs[g];
        calls[nc].len = l;
        tsr_rpc_result_init(&calls[nc].result);
        nc++;
    }
    tsr__coord_group_fanout(c, TSR_SHARD_SVC "Read", calls, nc, c->cfg.search_deadline_ms);
    for (size_t k = 0; k < nc; k++) {
        size_t g = calls[k].group;
        tsr_rpc_result *res = &calls[k].result;
        rr[g] = (Tessera__V1__ShardReadResponse *)(void *)
            tsr_rpc_result_unpack(res, &tessera__v1__shard_read_response__descriptor, NULL);
        if ((!rr[g] || rr[g]->n_datapoints != rd[g].n_labels) && code == TSR_RPC_OK) {
            snprintf(msg, cap, "update_mask all_restricts: reading the stored datapoints from "
                     "shard %zu (%s) failed: %s: %s; nothing was written", g, c->cfg.shards[g],
                     tsr_rpc_code_name(res->code), res->message ? res->message : "");
            code = TSR_RPC_UNAVAILABLE;
        }
        tsr_rpc_result_close(res);
        free(bufs[g]);
    }
    for (size_t j = 0; j < n && code == TSR_RPC_OK; j++) {
        if (!need[j])
            continue;
        const Tessera__V1__ShardDatapoint *sd = rr[grp[j]]->datapoints[at[j]];
        enum tsr_rec_error ty;
        char m[10];
        if (!sd->found || !sd->datapoint) {
            snprintf(msg, cap, "update_mask all_restricts: datapoints[%zu]: shard %zu does not "
                     "hold its label (retry; reconcile repairs the shard)", j, grp[j]);
            code = TSR_RPC_UNAVAILABLE;
            break;
        }
        tsr_pb_datapoint_record(sd->datapoint, &base[j], &ty, m, sizeof m);
    }
    for (size_t g = 0; g < S; g++)
        if (rr[g])
            tessera__v1__shard_read_response__free_unpacked(rr[g], NULL);
    free(rr);
    free(bufs);
    free(calls);
    if (code == TSR_RPC_OK) {
        for (size_t j = 0; j < n; j++) { /* the stored record with the request's restricts */
            tsr_datapoint *m = tsr_xmalloc(sizeof *m);
            *m = base[j];
            tsr_datapoint_init(&base[j]);
            tsr_datapoint *src = &q->dps[j];
            tsr_datapoint keep = *m; /* swap the restrict arrays of src and m */
            m->restricts = src->restricts;
            m->nrestricts = src->nrestricts;
            m->numeric = src->numeric;
            m->nnumeric = src->nnumeric;
            src->restricts = keep.restricts;
            src->nrestricts = keep.nrestricts;
            src->numeric = keep.numeric;
            src->nnumeric = keep.nnumeric;
            set_act(R, m->id, m, 1, list[j]);
        }
    }
out:
    for (size_t g = 0; g < S; g++)
        free(rd[g].labels);
    free(rd);
    free_dps(base, n);
    free(list);
    free(at);
    free(grp);
    free(need);
    return code;
}

/* Takes request i into the round (its actions), or ends it now (nothing of it written). */
static void take(round *R, size_t i)
{
    tsr__sreq *q = R->rq[i];
    long dead = touch_groups(R, i);
    if (dead >= 0) {
        finish(q, TSR_RPC_UNAVAILABLE, "shard group %ld (%s) has no live replica: nothing was "
               "written (retry when it is back)", dead, R->c->cfg.shards[dead]);
        return;
    }
    if (q->kind == SREQ_REMOVE) {
        for (size_t j = 0; j < q->n; j++) {
            const tsr__dir_entry *e;
            const act *pa;
            if (live_now(R, q->ids[j], &e, &pa)) {
                q->removed++;
                set_act(R, q->ids[j], NULL, 0, -1);
            } else {
                q->unknown++;
            }
        }
    } else if (q->mask) {
        char msg[sizeof q->msg];
        int code = mask_merge(R, q, msg, sizeof msg);
        if (code) {
            finish(q, code, "%s", msg);
            return;
        }
    } else {
        for (size_t j = 0; j < q->n; j++)
            set_act(R, q->dps[j].id, &q->dps[j], 0, q->lists[j]);
    }
    R->ok[i] = 1;
}

static void push_up(round *R, size_t g, int64_t label, int32_t list, size_t ai)
{
    Tessera__V1__ShardWriteRequest *w = &R->w[g];
    Tessera__V1__StagedUpsert *u = tsr_xmalloc(sizeof *u);
    tessera__v1__staged_upsert__init(u);
    u->label = label;
    u->list = list;
    tsr_pb_datapoint_set(&R->pb[ai], R->act[ai].dp);
    u->datapoint = &R->pb[ai].dp;
    if (w->n_upserts == R->ucap[g])
        w->upserts = tsr_xrealloc(w->upserts, (R->ucap[g] = R->ucap[g] ? R->ucap[g] * 2 : 16) *
                                                  sizeof *w->upserts);
    w->upserts[w->n_upserts++] = u;
}

static void push_del(round *R, size_t g, int64_t label, int32_t list)
{
    Tessera__V1__ShardWriteRequest *w = &R->w[g];
    Tessera__V1__StagedDelete *d = tsr_xmalloc(sizeof *d);
    tessera__v1__staged_delete__init(d);
    d->label = label;
    d->list = list;
    if (w->n_deletes == R->dcap[g])
        w->deletes = tsr_xrealloc(w->deletes, (R->dcap[g] = R->dcap[g] ? R->dcap[g] * 2 : 16) *
                                                  sizeof *w->deletes);
    w->deletes[w->n_deletes++] = d;
}

/* The round's writes: per group the upserts (labels kept in the group, new on a move or
 * for a new id) and deletes, and the log record (writes of the touched groups, removed
 * ids). *next_label advances. */
static void plan_writes(round *R, int64_t seq, int64_t *next_label,
                        Tessera__V1__CoordLogRecord *rec)
{
    size_t S = R->S;
    R->pb = tsr_xcalloc(R->nact + 1, sizeof *R->pb);
    for (size_t g = 0; g < S; g++) {
        tessera__v1__shard_write_request__init(&R->w[g]);
        R->w[g].version = (int64_t)R->sn->version;
        R->w[g].seq = seq;
        R->w[g].leader_term = tsr__coord_term(R->c);
    }
    rec->removed_ids = tsr_xcalloc(R->nact + 1, sizeof *rec->removed_ids);
    for (size_t i = 0; i < R->nact; i++) {
        const char *id = R->pend.e[i].id;
        const act *a = &R->act[i];
        const tsr__dir_entry *old = tsr__stream_lookup(R->c, R->sn, id);
        int oldg = old && (size_t)old->shard < S ? old->shard : -1;
        if (!a->dp) {
            if (oldg >= 0) {
                push_del(R, (size_t)oldg, old->label, old->list);
                rec->removed_ids[rec->n_removed_ids++] = (char *)id;
            }
            continue;
        }
        int32_t g = tsr__group_of(R->sn, (int32_t)a->list, id, S);
        int64_t label = oldg == g ? old->label : (*next_label)++;
        if (oldg >= 0 && oldg != g)
            push_del(R, (size_t)oldg, old->label, old->list);
        push_up(R, (size_t)g, label, (int32_t)a->list, i);
    }
    rec->writes = tsr_xcalloc(S, sizeof *rec->writes);
    for (size_t g = 0; g < S; g++) {
        if (!R->w[g].n_upserts && !R->w[g].n_deletes)
            continue;
        Tessera__V1__CoordLogWrite *lw = tsr_xmalloc(sizeof *lw);
        tessera__v1__coord_log_write__init(lw);
        lw->group = (int32_t)g;
        lw->write = &R->w[g];
        rec->writes[rec->n_writes++] = lw;
    }
    rec->version = (int64_t)R->sn->version;
    rec->seq = seq;
    rec->next_label = *next_label;
}

static void free_writes(round *R, Tessera__V1__CoordLogRecord *rec)
{
    for (size_t g = 0; R->w && g < R->S; g++) {
        for (size_t k = 0; k < R->w[g].n_upserts; k++)
            free(R->w[g].upserts[k]);
        for (size_t k = 0; k < R->w[g].n_deletes; k++)
            free(R->w[g].deletes[k]);
        free(R->w[g].upserts);
        free(R->w[g].deletes);
    }
    for (size_t i = 0; R->pb && i < R->nact; i++)
        tsr_pb_datapoint_free(&R->pb[i]);
    free(R->pb);
    for (size_t k = 0; k < rec->n_writes; k++)
        free(rec->writes[k]);
    free(rec->writes);
    free(rec->removed_ids);
}

static void send_writes(round *R)
{
    tsr__coord *c = R->c;
    size_t S = R->S;
    /* every group of the config (the fan-out and the replica loop index by group; during
     * an add the config has one more than the round's snapshot): none for those past S */
    uint8_t **bufs = tsr_xcalloc(c->cfg.nshards + 1, sizeof *bufs);
    size_t *lens = tsr_xcalloc(c->cfg.nshards + 1, sizeof *lens);
    char *skip = tsr_xcalloc(c->nrep + 1, 1);
    ProtobufCMessage **resps = tsr_xcalloc(c->nrep + 1, sizeof *resps);
    for (size_t g = 0; g < S; g++)
        if (R->w[g].n_upserts || R->w[g].n_deletes)
            bufs[g] = tsr_rpc_pack(&R->w[g].base, &lens[g]);
    for (size_t k = 0; k < c->nrep; k++) {
        tsr__replica *p = &c->rep[k];
        int st = tsr_rpc_channel_state(p->ch, 0);
        skip[k] = atomic_load(&p->lagging) || atomic_load(&p->stream_behind) ||
                  st == TSR_RPC_CONN_TRANSIENT_FAILURE || st == TSR_RPC_CONN_SHUTDOWN;
        if (skip[k] && bufs[p->group]) /* it misses this round: behind until caught up */
            atomic_store(&p->stream_behind, 1);
    }
    tsr_error err = TSR_ERROR_INIT;
    size_t bad = tsr__coord_all_fanout(c, TSR_SHARD_SVC "Write", bufs, lens, skip,
                                       c->cfg.stream_write_deadline_ms,
                                       &tessera__v1__shard_write_response__descriptor, resps,
                                       &err);
    for (size_t g = 0; g < S; g++) {
        if (!bufs[g])
            continue;
        size_t ok = 0;
        for (size_t j = 0; j < c->grp[g].n; j++) {
            size_t k = c->grp[g].first + j;
            if (resps[k])
                ok++;
            else if (!skip[k])
                atomic_store(&c->rep[k].stream_behind, 1);
        }
        R->failed[g] = ok == 0;
    }
    if (bad)
        tsr_warn("stream: seq %lld: %zu replica(s) missed the write (marked behind, caught up "
                 "by reconcile): %s", (long long)R->w[0].seq, bad, err.msg);
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(resps[k], NULL);
    for (size_t g = 0; g < S; g++)
        free(bufs[g]);
    free(bufs);
    free(lens);
    free(skip);
    free(resps);
}

/* Acknowledges the round's requests: OK, or UNAVAILABLE when a group it touched took the
 * write on no replica (logged: reconcile resends it). */
static void ack(round *R, int64_t seq)
{
    for (size_t i = 0; i < R->nrq; i++) {
        tsr__sreq *q = R->rq[i];
        if (!R->ok[i])
            continue;
        long lost = -1;
        for (size_t g = 0; g < R->S && lost < 0; g++)
            if (R->touch[i * R->S + g] && R->failed[g])
                lost = (long)g;
        q->version = (int64_t)R->sn->version;
        q->seq = seq;
        if (lost >= 0) {
            finish(q, TSR_RPC_UNAVAILABLE, "shard group %ld (%s): no replica took the write "
                   "(outcome unknown: the write is logged as seq %lld and is applied when group "
                   "%ld is back; retrying is safe)", lost, R->c->cfg.shards[lost],
                   (long long)seq, lost);
            continue;
        }
        finish(q, TSR_RPC_OK, NULL);
        if (q->kind == SREQ_UPSERT)
            tsr_metrics_counter_add("tessera_stream_writes_total", "op=upsert", (double)q->n);
        else
            tsr_metrics_counter_add("tessera_stream_writes_total", "op=remove",
                                    (double)q->removed);
    }
}

/* One round over the requests rq[0..n) (st.mu held). */
static void run_round(tsr__coord *c, tsr__sreq **rq, size_t n)
{
    tsr__stream *s = c->st;
    round R = {.c = c, .rq = rq, .nrq = n};
    R.sn = tsr__coord_snap_get(c);
    /* the served version's groups: during a move that adds one, the config has it already
     * but nothing of this version may go to it (the catch-up carries it there) */
    R.S = tsr__snap_groups(R.sn, &c->cfg);
    R.ok = tsr_xcalloc(n, 1);
    R.touch = tsr_xcalloc(n * R.S + 1, 1);
    R.failed = tsr_xcalloc(R.S + 1, 1);
    R.w = tsr_xcalloc(R.S + 1, sizeof *R.w);
    R.ucap = tsr_xcalloc(R.S + 1, sizeof *R.ucap);
    R.dcap = tsr_xcalloc(R.S + 1, sizeof *R.dcap);
    tsr__dir_init(&R.pend);
    Tessera__V1__CoordLogRecord rec = TESSERA__V1__COORD_LOG_RECORD__INIT;
    for (size_t i = 0; i < n; i++) {
        if (R.sn->version != s->ov_version || s->log_fd < 0)
            finish(rq[i], TSR_RPC_UNAVAILABLE, "the coordinator log of version %llu is not "
                   "open (see the coordinator's log); nothing was written",
                   (unsigned long long)R.sn->version);
        else
            take(&R, i);
    }
    int64_t seq = s->next_seq, label0 = s->next_label, next_label = s->next_label;
    plan_writes(&R, seq, &next_label, &rec);
    if (rec.n_writes == 0) { /* nothing to write (only unknown ids removed) */
        ack(&R, seq - 1);
        goto out;
    }
    char path[4200];
    tsr__slog_path(c->store, s->log_version, path, sizeof path);
    tsr_error err = TSR_ERROR_INIT;
    int64_t bytes0 = s->log_bytes;
    /* The planted bug of the chaos demonstration (coord.h, tsr__coord_test_hook). */
    int planted = tsr__coord_test_hook("plant-ack-unlogged");
    int mrc = planted ? 0 : tsr__slog_append(s->log_fd, path, &rec, &s->log_bytes, &err);
    if (mrc == 0)
        tsr__coord_crash_point("round-logged"); /* logged here, not yet in etcd */
    int doubt = 0;
    if (mrc == 0 && !planted && (mrc = tsr__shlog_mirror_round(c, &rec, &err)) != 0) {
        /* etcd must hold every round a shard may apply (a new leader replays them). Refused
         * (TSR_ESTATE): it does not. Otherwise in doubt: it may. Either way no round runs
         * until etcd's rounds are read again (stream_ha.c readopt): the local log is cut
         * and closed, and its seq is not reused before etcd says what it holds. */
        doubt = mrc != TSR_ESTATE;
        tsr_error cerr = TSR_ERROR_INIT;
        if (tsr__slog_cut(s->log_fd, path, bytes0, &cerr) != 0)
            tsr_warn("cannot cut the round etcd refused: %s", cerr.msg);
        s->log_bytes = bytes0;
        close(s->log_fd);
        s->log_fd = -1;
        tsr_err_prefix(&err, "etcd");
    }
    if (mrc) {
        s->next_label = label0;
        tsr_error_log("stream: %s", err.msg);
        for (size_t i = 0; i < n; i++)
            if (R.ok[i])
                finish(rq[i], TSR_RPC_UNAVAILABLE, "the coordinator log cannot be written "
                       "(%s); %s", err.msg, doubt ? "outcome unknown: etcd may hold the "
                       "write, which is then applied; retrying is safe" : "nothing was written");
        goto out;
    }
    send_writes(&R);
    pthread_rwlock_wrlock(&s->ov_rw);
    tsr__stream_apply_record(c, R.sn, &rec);
    s->next_label = next_label;
    pthread_rwlock_unlock(&s->ov_rw);
    ack(&R, seq);
    tsr_metrics_counter_add("tessera_stream_rounds_total", NULL, 1);
    tsr_metrics_gauge_set("tessera_stream_log_bytes", NULL, (double)s->log_bytes);
    tsr_metrics_gauge_set("tessera_stream_overlay_records", NULL, (double)s->ov_records);
out:
    free_writes(&R, &rec);
    for (size_t i = 0; i < R.nact; i++)
        if (R.act[i].owned && R.act[i].dp) {
            tsr_datapoint_close(R.act[i].dp);
            free(R.act[i].dp);
        }
    free(R.act);
    tsr__dir_close(&R.pend);
    free(R.ok);
    free(R.touch);
    free(R.failed);
    free(R.w);
    free(R.ucap);
    free(R.dcap);
    tsr__snap_unref(R.sn);
}

static void *writer_main(void *arg)
{
    tsr__coord *c = arg;
    tsr__stream *s = c->st;
    /* Alone, the local log is the truth: replicas are caught up from it at once. With
     * --etcd it is NOT: its last round may never have reached etcd (killed between the
     * local append and the mirror), and a new leader reuses that seq for another round,
     * which every replica would then drop as a resend — an acknowledged write lost
     * (found by make chaos, docs/ha.md). There only the elected leader catches replicas
     * up, from etcd's rounds and with its term (leader.c campaign, after
     * tsr__stream_adopt). */
    if (!c->meta)
        tsr__stream_catch_up_all(c);
    tsr__sreq **batch = tsr_xcalloc(ROUND_MAX + 1, sizeof *batch);
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->q_cv, &s->q_mu);
        if (s->stop) {
            for (tsr__sreq *q = s->head; q; q = q->next) {
                q->done = 1;
                q->code = TSR_RPC_UNAVAILABLE;
                snprintf(q->msg, sizeof q->msg, "the coordinator is shutting down; nothing "
                         "was written");
            }
            s->head = s->tail = NULL;
            pthread_cond_broadcast(&s->done_cv);
            pthread_mutex_unlock(&s->q_mu);
            break;
        }
        size_t n = 0, recs = 0;
        while (s->head && n < ROUND_MAX && (n == 0 || recs + s->head->n <= ROUND_MAX)) {
            tsr__sreq *q = s->head;
            s->head = q->next;
            recs += q->n;
            batch[n++] = q;
        }
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->q_mu);
        pthread_mutex_lock(&s->mu);
        run_round(c, batch, n);
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->q_mu);
        for (size_t i = 0; i < n; i++)
            batch[i]->done = 1;
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->q_mu);
    }
    free(batch);
    return NULL;
}

int tsr__stream_start(tsr__coord *c)
{
    tsr__stream *s = c->st;
    pthread_mutex_lock(&s->q_mu);
    int rc = pthread_create(&s->thread, NULL, writer_main, c) == 0 ? 0 : TSR_EINTERNAL;
    s->started = rc == 0;
    pthread_mutex_unlock(&s->q_mu);
    return rc;
}

void tsr__stream_stop(tsr__coord *c)
{
    tsr__stream *s = c->st;
    if (!s)
        return;
    pthread_mutex_lock(&s->q_mu);
    int started = s->started;
    s->stop = 1;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    if (started)
        pthread_join(s->thread, NULL);
}

void tsr__stream_close(tsr__coord *c)
{
    tsr__stream *s = c->st;
    if (!s)
        return;
    if (s->log_fd > 0)
        close(s->log_fd);
    tsr__dir_close(&s->ov);
    free(s->touched);
    free(s->grp_seq);
    pthread_mutex_destroy(&s->mu);
    pthread_rwlock_destroy(&s->ov_rw);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_cond_destroy(&s->done_cv);
    free(s);
    c->st = NULL;
}
