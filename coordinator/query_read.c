/*
 * query_read — ReadIndexDatapoints on the coordinator: the ids' groups from the
 * directory and the overlay on one snapshot (tsr__stream_resolve), one Shard.Read per
 * group, the stored datapoints in request order. Blocking (TSR_RPC_LONG, worker pool);
 * reusable by every front end (query.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "index/knn.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"
#include "query/topk.h"
#include "arena.h"

/* ---------------------------------------------------------------- ReadIndexDatapoints */

/* The response plus the shard replies its datapoints point into. resp stays first. */
typedef struct rd_out {
    Tessera__V1__ReadIndexDatapointsResponse resp;
    tsr__arena a;
    Tessera__V1__ShardReadResponse **shard_resp;
    size_t nshards;
} rd_out;

void tsr__coord_read_free(Tessera__V1__ReadIndexDatapointsResponse *r)
{
    if (!r)
        return;
    rd_out *o = (rd_out *)r;
    for (size_t s = 0; s < o->nshards; s++)
        if (o->shard_resp[s])
            tessera__v1__shard_read_response__free_unpacked(o->shard_resp[s], NULL);
    tsr__ar_free(&o->a);
    free(o);
}

int tsr__coord_read(tsr__coord *c, char *const *ids, size_t n_ids, int64_t remaining_ms,
                    Tessera__V1__ReadIndexDatapointsResponse **outp, tsr_error *err)
{
    size_t S;
    *outp = NULL;
    if (n_ids > 10000)
        return tsr_err(err, TSR_EINVAL, "%zu ids, at most 10000 per call",
                   n_ids);
    int rc = tsr__coord_read_index(c, remaining_ms, err); /* readidx.c */
    if (rc)
        return rc;
    tsr__loc *loc = tsr_xcalloc(n_ids + 1, sizeof *loc);
    /* the snapshot and the streamed writes on it, read together */
    int64_t gseq[TSR_COORD_MAX_SHARDS + 1];
    tsr__snap *sn = tsr__stream_resolve(c, ids, n_ids, loc, gseq);
    int demand = tsr__coord_ri_on(TSR_RI_DEMAND);
    S = tsr__snap_groups(sn, &c->cfg);
    rd_out *o = tsr_xcalloc(1, sizeof *o);
    tessera__v1__read_index_datapoints_response__init(&o->resp);
    tsr__arena *a = &o->a;
    o->nshards = S;
    o->shard_resp = tsr__ar(a, S, sizeof *o->shard_resp);
    Tessera__V1__ShardReadRequest *sr = tsr__ar(a, S, sizeof *sr);
    int32_t *where = tsr__ar(a, n_ids, sizeof *where); /* shard per id, -1 = unknown */
    size_t *pos = tsr__ar(a, n_ids, sizeof *pos);
    for (size_t s = 0; s < S; s++) {
        tessera__v1__shard_read_request__init(&sr[s]);
        sr[s].version = (int64_t)sn->version;
        sr[s].min_stream_seq = demand && s <= TSR_COORD_MAX_SHARDS ? gseq[s] : 0;
        sr[s].labels = tsr__ar(a, n_ids, sizeof(int64_t));
    }
    for (size_t i = 0; i < n_ids; i++) {
        const tsr__loc *e = &loc[i];
        where[i] = e->found && (size_t)e->shard < S ? e->shard : -1;
        if (where[i] >= 0) {
            pos[i] = sr[e->shard].n_labels;
            sr[e->shard].labels[sr[e->shard].n_labels++] = e->label;
        }
    }
    free(loc);
    tsr__gcall *calls = tsr__ar(a, S, sizeof *calls);
    uint8_t **bufs = tsr__ar(a, S, sizeof *bufs);
    Tessera__V1__ShardReadResponse **resp = o->shard_resp;
    size_t n = 0;
    int64_t tmo = c->cfg.search_deadline_ms;
    if (remaining_ms < tmo)
        tmo = remaining_ms;
    if (tmo < 1)
        tmo = 1;
    for (size_t s = 0; s < S; s++) {
        if (!sr[s].n_labels)
            continue;
        size_t l = 0;
        bufs[s] = tsr_rpc_pack(&sr[s].base, &l);
        calls[n].group = s;
        calls[n].req = bufs[s];
        calls[n].len = l;
        calls[n].demand = &sr[s].base;
        tsr_rpc_result_init(&calls[n].result);
        n++;
    }
    tsr__coord_group_fanout(c, TSR_SHARD_SVC "Read", calls, n, tmo);
    for (size_t k = 0; k < n; k++) {
        size_t s = calls[k].group;
        tsr_rpc_result *res = &calls[k].result;
        free(bufs[s]);
        resp[s] = (Tessera__V1__ShardReadResponse *)(void *)
            tsr_rpc_result_unpack(res, &tessera__v1__shard_read_response__descriptor, NULL);
        if (resp[s] && resp[s]->n_datapoints != sr[s].n_labels) {
            res->code = TSR_RPC_INTERNAL;
            free(res->message);
            res->message = tsr_xstrdup("malformed Read response: a datapoint per label expected");
        }
        if (res->code != TSR_RPC_OK && !rc)
            rc = tsr_err(err, TSR_EUNAVAILABLE, "shard %zu (%s) failed: %s: %s", s,
                     c->cfg.shards[s], tsr_rpc_code_name(res->code),
                     res->message ? res->message : "");
        tsr_rpc_result_close(res);
    }
    if (!rc) {
        o->resp.datapoints = tsr__ar(a, n_ids, sizeof *o->resp.datapoints);
        for (size_t i = 0; i < n_ids; i++) {
            if (where[i] < 0)
                continue;
            Tessera__V1__ShardDatapoint *sd = resp[where[i]]->datapoints[pos[i]];
            if (sd->found && sd->datapoint)
                o->resp.datapoints[o->resp.n_datapoints++] = sd->datapoint;
        }
    }
    tsr__snap_unref(sn);
    if (rc) {
        tsr__coord_read_free(&o->resp);
        return rc;
    }
    *outp = &o->resp;
    return 0;
}
