/*
 * reshard — the planning half of AddShardGroup / RemoveShardGroup (docs/resharding.md):
 * the new partition plan (the balance rule below), the next version's directory, and for
 * each group the work of an ordinary two-phase update — the records of the lists that
 * change owner, read from their old owners with Shard.Read, are upserts on their new
 * group (same labels, same lists), and deletes on the old one. update.c then stages,
 * prepares, flips (plan and version together: the plan is a file of the version) and
 * commits them exactly as an UpdateIndex, so crash recovery is the update's: the
 * committed version decides.
 *
 * The rule (moving as few lists as the balance allows): loads are dense datapoints per
 * group. Remove: the removed group's lists, largest first, each to the least loaded
 * remaining group. Then (add and remove) greedy: while the most loaded group is above
 * 110 % of the mean or the least loaded below 90 %, move from the most to the least loaded
 * the one list whose size s (0 < s < their difference) brings the two closest together;
 * stop when no list improves the pair. Sparse-only ids follow tsr__group_of (hash of the
 * id over the groups not removed).
 *
 * DESIGN (threads): runs on the update thread under update_mu. The plan runs under the
 * stream lock (no streamed write meanwhile: the directory it reads is the one at seq S);
 * the read (tsr__reshard_read) runs without it (docs/resharding.md "Writes during a
 * move": writes flow on the old plan, the catch-up carries them) and takes st.ov_rw
 * (tsr__stream_resolve) to tell a label removed since from a missing one; the directory
 * rebuild (tsr__reshard_redir) runs under the stream lock again. Takes op_mu only to
 * publish progress.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "core/log.h"
#include "core/mem.h"
#include "index/faiss_io.h"
#include "net/pb_datapoint.h"

#define READ_CHUNK 2000      /* labels per Shard.Read call */
#define BAL_SLACK 0.10       /* the ±10 % band */

static void push_up(tsr__shard_work *w, size_t i)
{
    if (w->nups == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 64;
        w->ups = tsr_xrealloc(w->ups, w->cap * sizeof *w->ups);
    }
    w->ups[w->nups++] = i;
}

static void push_del(tsr__shard_work *w, int64_t label, int32_t list)
{
    if (w->ndels == w->dcap) {
        w->dcap = w->dcap ? w->dcap * 2 : 64;
        w->dels = tsr_xrealloc(w->dels, w->dcap * sizeof *w->dels);
    }
    Tessera__V1__StagedDelete *d = &w->dels[w->ndels++];
    tessera__v1__staged_delete__init(d);
    d->label = label;
    d->list = list;
}

static const int64_t *g_size;
static int by_size_desc(const void *a, const void *b)
{
    int64_t x = g_size[*(const size_t *)a], y = g_size[*(const size_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Greedy balancing of plan over the live groups (see the top). */
static void balance(int32_t *plan, const int64_t *size, size_t nlist, int64_t *load,
                    const uint8_t *live, size_t S)
{
    for (size_t iter = 0; iter < 4 * nlist + 16; iter++) {
        int64_t total = 0;
        size_t nl = 0, gmax = S, gmin = S;
        for (size_t g = 0; g < S; g++) {
            if (!live[g])
                continue;
            total += load[g];
            nl++;
            if (gmax == S || load[g] > load[gmax])
                gmax = g;
            if (gmin == S || load[g] < load[gmin])
                gmin = g;
        }
        if (nl < 2)
            return;
        double mean = (double)total / (double)nl;
        if ((double)load[gmax] <= mean * (1 + BAL_SLACK) &&
            (double)load[gmin] >= mean * (1 - BAL_SLACK))
            return;
        int64_t diff = load[gmax] - load[gmin], best_gap = diff;
        size_t best = nlist;
        for (size_t l = 0; l < nlist; l++) {
            if (plan[l] != (int32_t)gmax || size[l] <= 0 || size[l] >= diff)
                continue;
            int64_t gap = llabs(diff - 2 * size[l]);
            if (gap < best_gap) {
                best_gap = gap;
                best = l;
            }
        }
        if (best == nlist)
            return;
        plan[best] = (int32_t)gmin;
        load[gmax] -= size[best];
        load[gmin] += size[best];
    }
}

int32_t *tsr__reshard_balance_plan(const int32_t *old, const int64_t *size, size_t nlist,
                                   const uint8_t *live, size_t S, int rm)
{
    int32_t *plan = tsr_xmalloc((nlist ? nlist : 1) * sizeof *plan);
    memcpy(plan, old, nlist * sizeof *plan);
    int64_t *load = tsr_xcalloc(S ? S : 1, sizeof *load);
    size_t *order = tsr_xcalloc(nlist ? nlist : 1, sizeof *order);
    for (size_t l = 0; l < nlist; l++) {
        order[l] = l;
        if ((size_t)plan[l] < S)
            load[plan[l]] += size[l];
    }
    if (rm >= 0) {
        g_size = size;
        qsort(order, nlist, sizeof *order, by_size_desc);
        for (size_t i = 0; i < nlist; i++) {
            size_t l = order[i], to = S;
            if (plan[l] != rm)
                continue;
            for (size_t g = 0; g < S; g++)
                if (live[g] && (to == S || load[g] < load[to]))
                    to = g;
            plan[l] = (int32_t)to;
            load[rm] -= size[l];
            load[to] += size[l];
        }
    }
    balance(plan, size, nlist, load, live, S);
    free(load);
    free(order);
    return plan;
}

/* The new plan of base for the groups 0 .. S-1 without rm (-1: none): list sizes from its
 * directory, live groups from the config. */
static int32_t *new_plan(const tsr__snap *base, const tsr__coord_config *cfg, size_t S, int rm)
{
    size_t nlist = base->tmpl->nlist;
    int64_t *size = tsr_xcalloc(nlist, sizeof *size);
    uint8_t *live = tsr_xcalloc(S, 1);
    for (size_t i = 0; i < base->dir.n; i++)
        if (base->dir.e[i].list >= 0 && (size_t)base->dir.e[i].list < nlist)
            size[base->dir.e[i].list]++;
    for (size_t g = 0; g < S; g++)
        live[g] = !cfg->retired[g] && (int)g != rm;
    int32_t *plan = tsr__reshard_balance_plan(base->plan, size, nlist, live, S, rm);
    free(size);
    free(live);
    return plan;
}

/* Publishes the progress (op_mu). */
static void progress(tsr__coord *c, tsr__op *op, int64_t lists_total, int64_t lists_moved,
                     int64_t dps, int64_t bytes)
{
    pthread_mutex_lock(&c->op_mu);
    op->lists_total = lists_total;
    op->lists_moved = lists_moved;
    op->datapoints_moved = dps;
    op->bytes_moved = bytes;
    op->records_read = dps;
    pthread_mutex_unlock(&c->op_mu);
}

typedef struct moved {
    size_t from, to;
    int64_t label;
    int32_t list;
    char *id;          /* owned */
} moved;

struct tsr__reshard_moves {
    moved *mv;
    size_t nmv, S;
    int64_t lists_total;
};

void tsr__reshard_moves_free(tsr__reshard_moves *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nmv; i++)
        free(m->mv[i].id);
    free(m->mv);
    free(m);
}

/* 1 when the id of a moved label no longer names that label (a streamed write after the
 * plan removed it or moved it to another label): the catch-up carries that write, so the
 * label is not read. Only when writes flow during the read (catchup). */
static int label_changed(tsr__coord *c, const moved *m)
{
    tsr__loc loc;
    char *ids[1] = {m->id};
    tsr__snap *sn = tsr__stream_resolve(c, ids, 1, &loc, NULL);
    tsr__snap_unref(sn);
    return !loc.found || loc.label != m->label;
}

/* Reads the moved datapoints from their old groups (version base) into b's records and
 * each new group's upserts. Returns 0 or an error naming the group. catchup: writes flow
 * meanwhile, so a label a later write removed is skipped (label_changed), not an error. */
static int read_moved(tsr__coord *c, tsr__op *op, uint64_t version, const moved *mv,
                      size_t nmv, size_t S, int64_t lists_total, tsr__upd_plan *p, tsr_batch *b,
                      int catchup, tsr_error *err)
{
    int rc = 0;
    int64_t bytes = 0;
    b->records = tsr_xcalloc(nmv + 1, sizeof *b->records);
    size_t *pos = tsr_xcalloc(S, sizeof *pos);          /* next index into mv per group */
    tsr__gcall *calls = tsr_xcalloc(S, sizeof *calls);
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    size_t **idx = tsr_xcalloc(S, sizeof *idx);          /* mv indices of each call */
    int64_t *labels = tsr_xcalloc(READ_CHUNK, sizeof *labels);
    for (size_t g = 0; g < S; g++)
        idx[g] = tsr_xcalloc(READ_CHUNK, sizeof **idx);
    for (;;) {
        size_t n = 0, want[TSR_COORD_MAX_SHARDS];
        for (size_t g = 0; g < S; g++) {
            size_t k = 0;
            for (; pos[g] < nmv && k < READ_CHUNK; pos[g]++)
                if (mv[pos[g]].from == g) {
                    idx[g][k] = pos[g];
                    labels[k++] = mv[pos[g]].label;
                }
            if (!k)
                continue;
            Tessera__V1__ShardReadRequest rq = TESSERA__V1__SHARD_READ_REQUEST__INIT;
            rq.version = (int64_t)version;
            rq.labels = labels;
            rq.n_labels = k;
            size_t len = 0;
            bufs[n] = tsr_rpc_pack(&rq.base, &len);
            calls[n].group = g;
            calls[n].req = bufs[n];
            calls[n].len = len;
            want[n] = k;
            tsr_rpc_result_init(&calls[n].result);
            n++;
        }
        if (!n)
            break;
        tsr__coord_group_fanout(c, TSR_SHARD_SVC "Read", calls, n,
                                c->cfg.stage_deadline_ms);
        for (size_t i = 0; i < n; i++) {
            size_t g = calls[i].group;
            tsr_rpc_result *res = &calls[i].result;
            Tessera__V1__ShardReadResponse *rr = NULL;
            if (res->code == TSR_RPC_OK)
                rr = tessera__v1__shard_read_response__unpack(NULL, res->len, res->data);
            if (!rc && (!rr || rr->n_datapoints != want[i]))
                rc = tsr_err(err, TSR_EUNAVAILABLE, "shard %zu (%s): Read of the moved lists "
                             "failed: %s: %s", g, c->cfg.shards[g],
                             tsr_rpc_code_name(res->code),
                             res->code == TSR_RPC_OK ? "malformed response"
                             : res->message ? res->message : "");
            for (size_t j = 0; !rc && j < want[i]; j++) {
                const Tessera__V1__ShardDatapoint *sd = rr->datapoints[j];
                const moved *m = &mv[idx[g][j]];
                if ((!sd->found || !sd->datapoint) && catchup && label_changed(c, m))
                    continue; /* removed or replaced after the plan: the catch-up's */
                if (!sd->found || !sd->datapoint || sd->label != m->label) {
                    rc = tsr_err(err, TSR_ESTATE, "shard %zu (%s): label %lld of list %d is "
                                 "not in its version %llu (the directory places it there)", g,
                                 c->cfg.shards[g], (long long)m->label, (int)m->list,
                                 (unsigned long long)version);
                    break;
                }
                enum tsr_rec_error type;
                char msg[256];
                tsr_datapoint *dp = &b->records[b->nrecords];
                if (tsr_pb_datapoint_record(sd->datapoint, dp, &type, msg, sizeof msg)) {
                    tsr_datapoint_close(dp);
                    rc = tsr_err(err, TSR_EFORMAT, "shard %zu: label %lld: %s", g,
                                 (long long)m->label, msg);
                    break;
                }
                bytes += (int64_t)protobuf_c_message_get_packed_size(&sd->datapoint->base);
                push_up(&p->w[m->to], b->nrecords++);
                push_del(&p->w[m->from], m->label, m->list);
            }
            if (rr)
                tessera__v1__shard_read_response__free_unpacked(rr, NULL);
            tsr_rpc_result_close(res);
            free(bufs[i]);
            bufs[i] = NULL;
        }
        if (rc)
            break;
        int64_t lm = nmv ? (int64_t)((double)lists_total * (double)b->nrecords / (double)nmv)
                         : lists_total;
        progress(c, op, lists_total, lm, (int64_t)b->nrecords, bytes);
    }
    for (size_t g = 0; g < S; g++)
        free(idx[g]);
    free(idx);
    free(labels);
    free(bufs);
    free(calls);
    free(pos);
    return rc;
}

int tsr__reshard_plan(tsr__coord *c, tsr__op *op, const tsr__snap *base, int rm,
                      tsr__upd_plan *p, tsr__reshard_moves **moves, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    size_t S = cfg->nshards, nlist = base->tmpl->nlist;
    memset(p, 0, sizeof *p);
    p->nshards = S;
    p->w = tsr_xcalloc(S, sizeof *p->w);
    tsr_ivfpq *tmpl = NULL;
    moved *mv = NULL;
    int rc = tsr_faiss_read_mem(base->tmpl_bytes, base->tmpl_len, &tmpl, err);
    if (rc)
        goto out;
    *moves = NULL;
    tsr__snap *ns = p->ns = tsr__snap_create();
    ns->version = base->version + 1;
    if ((rc = tsr__snap_set_template(ns, tmpl, err)))
        goto out;
    tmpl = NULL;
    ns->plan = new_plan(base, cfg, S, rm);
    ns->plan_kind = base->plan_kind;
    ns->ngroups = S;
    ns->next_label = base->next_label;
    for (size_t g = 0; g < S; g++)
        ns->retired[g] = cfg->retired[g] || (int)g == rm;
    /* the groups as they are once this version is committed (rm retired; until then it
     * is still called) */
    ns->groups = tsr__coord_config_groups_text(cfg, rm, &ns->groups_len);
    int64_t lists_total = 0;
    for (size_t l = 0; l < nlist; l++)
        lists_total += ns->plan[l] != base->plan[l];
    mv = tsr_xcalloc(base->dir.n + 1, sizeof *mv);
    size_t nmv = 0;
    for (size_t i = 0; i < base->dir.n; i++) {
        const tsr__dir_entry *e = &base->dir.e[i];
        int32_t to = tsr__group_of(ns, e->list, e->id, S);
        if (to != e->shard && e->shard >= 0 && (size_t)e->shard < S)
            mv[nmv++] = (moved){(size_t)e->shard, (size_t)to, e->label, e->list,
                                tsr_xstrdup(e->id)};
        tsr__dir_add(&ns->dir, e->id, e->label, e->list, to, e->dense, e->sparse);
        ns->ndense += e->dense;
        ns->nsparse += e->sparse;
    }
    tsr_info("reshard %s: version %llu: %lld list(s), %zu datapoint(s) change group", op->id,
             (unsigned long long)ns->version, (long long)lists_total, nmv);
    progress(c, op, lists_total, 0, 0, 0);
    tsr__reshard_moves *m = tsr_xcalloc(1, sizeof *m);
    *m = (tsr__reshard_moves){mv, nmv, S, lists_total};
    *moves = m;
    mv = NULL;
out:
    tsr_ivfpq_destroy(tmpl);
    free(mv);
    if (rc)
        tsr__upd_plan_close(p);
    return rc;
}

int tsr__reshard_read(tsr__coord *c, tsr__op *op, uint64_t version,
                      const tsr__reshard_moves *m, tsr__upd_plan *p, tsr_batch *b, int catchup,
                      tsr_error *err)
{
    return read_moved(c, op, version, m->mv, m->nmv, m->S, m->lists_total, p, b, catchup, err);
}

void tsr__reshard_redir(tsr__snap *ns, const tsr__snap *view, size_t S)
{
    tsr__dir_close(&ns->dir);
    tsr__dir_init(&ns->dir);
    ns->ndense = ns->nsparse = 0;
    for (size_t i = 0; i < view->dir.n; i++) {
        const tsr__dir_entry *e = &view->dir.e[i];
        int32_t to = tsr__group_of(ns, e->list, e->id, S);
        tsr__dir_add(&ns->dir, e->id, e->label, e->list, to, e->dense, e->sparse);
        ns->ndense += e->dense;
        ns->nsparse += e->sparse;
    }
    if (view->next_label > ns->next_label)
        ns->next_label = view->next_label;
}

int tsr__reshard_fresh_check(tsr__coord *c, size_t g, tsr_error *err)
{
    size_t S = c->cfg.nshards;
    uint8_t **bufs = tsr_xcalloc(S, sizeof *bufs);
    size_t *lens = tsr_xcalloc(S, sizeof *lens);
    ProtobufCMessage **resps = tsr_xcalloc(c->nrep ? c->nrep : 1, sizeof *resps);
    Tessera__V1__ShardStatsRequest rq = TESSERA__V1__SHARD_STATS_REQUEST__INIT;
    bufs[g] = tsr_rpc_pack(&rq.base, &lens[g]);
    int rc = 0;
    if (tsr__coord_all_fanout(c, TSR_SHARD_SVC "Stats", bufs, lens, NULL,
                              c->cfg.search_deadline_ms,
                              &tessera__v1__shard_stats_response__descriptor, resps, err))
        rc = err->code ? err->code : TSR_EUNAVAILABLE;
    for (size_t j = 0; j < c->grp[g].n && !rc; j++) {
        size_t k = c->grp[g].first + j;
        const Tessera__V1__ShardStatsResponse *sr = (Tessera__V1__ShardStatsResponse *)resps[k];
        if (sr->current_version != 0) {
            rc = tsr_err(err, TSR_ESTATE, "new group replica %s serves version %lld: a new "
                         "group must start empty (a fresh --data folder)", c->rep[k].addr,
                         (long long)sr->current_version);
            break;
        }
        /* a staged or prepared leftover (an earlier move that crashed before its commit
         * point): dropped, as reconcile drops them on the groups it knows */
        for (size_t v = 0; v < sr->n_versions && !rc; v++) {
            if (sr->versions[v]->state != TESSERA__V1__SHARD_VERSION__STATE__STAGING &&
                sr->versions[v]->state != TESSERA__V1__SHARD_VERSION__STATE__PREPARED)
                continue;
            Tessera__V1__AbortRequest ab = TESSERA__V1__ABORT_REQUEST__INIT;
            ab.version = sr->versions[v]->version;
            ab.leader_term = tsr__coord_term(c);
            size_t len = 0;
            uint8_t *buf = tsr_rpc_pack(&ab.base, &len);
            tsr_rpc_result res;
            tsr_rpc_result_init(&res);
            tsr_rpc_call(c->rep[k].ch, TSR_SHARD_SVC "Abort", buf, len,
                         c->cfg.search_deadline_ms, &res);
            if (res.code != TSR_RPC_OK)
                rc = tsr_err(err, TSR_EUNAVAILABLE, "new group replica %s: Abort(%lld) of a "
                             "leftover version: %s: %s", c->rep[k].addr, (long long)ab.version,
                             tsr_rpc_code_name(res.code), res.message ? res.message : "");
            else
                tsr_info("new group replica %s: leftover version %lld aborted", c->rep[k].addr,
                         (long long)ab.version);
            tsr_rpc_result_close(&res);
            free(buf);
        }
    }
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(resps[k], NULL); /* accepts NULL */
    free(resps);
    free(bufs[g]);
    free(bufs);
    free(lens);
    return rc;
}
