/*
 * tessera_v1 — the tessera.v1 Coordinator service's handlers (proto/tessera/v1): typed
 * adapters (net/rpc_typed.h: the layer decodes, maps errors, packs and frees) that call the
 * subsystem that answers a request and fill the reply.
 *
 *   FindNeighbors, ReadIndexDatapoints   the read path (query.h)
 *   GetIndexStats                        the groups' Shard.Stats fan-out, the snapshot,
 *                                        the stream's counts, operations, leadership
 *   UpsertDatapoints, RemoveDatapoints   streamed writes (stream.h; TSR_RPC_LONG)
 *   UpdateIndex, GetOperation            updates and folds (update.h), operations (ops.h)
 *   AddShardGroup, RemoveShardGroup      reshard moves (update.h)
 *
 * Errors of the subsystems are tsr_error, mapped to a gRPC status by the layer, or set on
 * the reply by the subsystem's entry point (tsr_rpc_ctx_reply). What a reply points into
 * (the call's arena, the snapshot, an operation under op_mu) is released by deferred
 * cleanups once it is packed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "coord.h"
#include "frontend.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"

/* ---------------------------------------------------------------- the read path */

int tsr__coord_rpc_find_neighbors(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    Tessera__V1__FindNeighborsRequest *rq =
        tessera__v1__find_neighbors_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "FindNeighborsRequest: malformed "
                                   "protobuf");
    return tsr__coord_find_neighbors_reply(ctx, rq, r); /* takes rq */
}

static void read_free(void *out)
{
    tsr__coord_read_free(out);
}

TSR_RPC_HANDLER(h_read, Tessera__V1__ReadIndexDatapointsRequest,
                Tessera__V1__ReadIndexDatapointsResponse)
{
    (void)resp; /* the read path builds its own (with the shard replies it points into) */
    Tessera__V1__ReadIndexDatapointsResponse *out = NULL;
    int rc = tsr__coord_read(tsr_rpc_ctx_app(ctx), rq->ids, rq->n_ids,
                             tsr_rpc_ctx_remaining_ms(ctx), &out, err);
    if (rc == 0 && (rc = tsr_rpc_ctx_set_resp(ctx, &out->base, read_free)) == 0)
        return 0;
    tsr__coord_read_free(out);
    return rc;
}

/* ---------------------------------------------------------------- GetIndexStats */

static void arena_free(void *a)
{
    tsr__ar_free(a);
    free(a);
}

static void snap_unref(void *sn)
{
    tsr__snap_unref(sn);
}

/* The coordinators' addresses of tsr__leader_members. */
static void members_free(void *p)
{
    Tessera__V1__GetIndexStatsResponse *resp = p;
    for (size_t i = 0; i < resp->n_coordinators; i++)
        free(resp->coordinators[i]);
    free(resp->coordinators);
}

/* GetIndexStats' shards: every group's Shard.Stats (st from the call's arena). */
static void stats_shards(tsr__coord *c, tsr__arena *a, int64_t tmo,
                         Tessera__V1__GetIndexStatsResponse *out)
{
    size_t S = c->cfg.nshards;
    tsr__gcall *calls = tsr__ar(a, S, sizeof *calls);
    for (size_t s = 0; s < S; s++) {
        calls[s].group = s;
        tsr_rpc_result_init(&calls[s].result);
    }
    tsr__coord_group_fanout(c, TSR_SHARD_SVC "Stats", calls, S, tmo);
    Tessera__V1__ShardIndexStats *st = tsr__ar(a, S, sizeof *st);
    out->shards = tsr__ar(a, S, sizeof *out->shards);
    out->n_shards = S;
    for (size_t s = 0; s < S; s++) {
        tessera__v1__shard_index_stats__init(&st[s]);
        st[s].address = c->cfg.shards[s]; /* names the group (its first replica) */
        st[s].removed = c->cfg.retired && __atomic_load_n(&c->cfg.retired[s], __ATOMIC_ACQUIRE);
        out->shards[s] = &st[s];
        tsr_rpc_result *res = &calls[s].result;
        Tessera__V1__ShardStatsResponse *sr = (Tessera__V1__ShardStatsResponse *)(void *)
            tsr_rpc_result_unpack(res, &tessera__v1__shard_stats_response__descriptor, NULL);
        if (sr) {
            st[s].available = 1;
            st[s].vectors_count = sr->vectors_count;
            st[s].sparse_vectors_count = sr->sparse_vectors_count;
            st[s].version = sr->current_version;
            st[s].anonymous_bytes = sr->anonymous_bytes;
            st[s].mapped_bytes = sr->mapped_bytes;
            tessera__v1__shard_stats_response__free_unpacked(sr, NULL);
        }
        tsr_rpc_result_close(res);
    }
}

/* GetIndexStats' last operation (its id and progress from the call's arena). */
static void stats_last_op(tsr__coord *c, tsr__arena *a, Tessera__V1__GetIndexStatsResponse *out)
{
    char *opid = tsr__ar(a, 1, sizeof ((tsr__op *)0)->id);
    pthread_mutex_lock(&c->op_mu);
    const tsr__op *lop = c->nops ? c->ops[c->nops - 1] : NULL;
    if (lop) {
        Tessera__V1__OperationProgress *pg = tsr__ar(a, 1, sizeof *pg);
        snprintf(opid, sizeof ((tsr__op *)0)->id, "%s", lop->id);
        out->last_operation_state = (Tessera__V1__Operation__State)lop->state;
        tsr__op_progress_to_pb(lop, pg);
        out->last_operation_progress = pg;
    }
    pthread_mutex_unlock(&c->op_mu);
    out->last_operation_id = opid;
}

#define LEADER_CAP 256

TSR_RPC_HANDLER(h_stats, Tessera__V1__GetIndexStatsRequest, Tessera__V1__GetIndexStatsResponse)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    size_t S = c->cfg.nshards;
    /* what the response points into lives until it is packed: the call's arena, the
     * snapshot, the members' addresses */
    tsr__arena *a = tsr_try_calloc(1, sizeof *a);
    if (!a)
        return tsr_err(err, TSR_ELIMIT, "GetIndexStats: out of memory");
    tsr_rpc_ctx_defer(ctx, arena_free, a);
    tsr__snap *sn = tsr__coord_snap_get(c);
    tsr_rpc_ctx_defer(ctx, snap_unref, sn);
    tsr_rpc_ctx_defer(ctx, members_free, resp);
    int64_t tmo = c->cfg.search_deadline_ms;
    if (tsr_rpc_ctx_remaining_ms(ctx) < tmo)
        tmo = tsr_rpc_ctx_remaining_ms(ctx);
    stats_shards(c, a, tmo, resp);
    resp->shards_count = (int32_t)tsr__snap_live_groups(sn, &c->cfg); /* shards: every number */
    resp->version = (int64_t)sn->version;
    resp->dimensions = c->cfg.dimensions;
    resp->distance = (char *)tsr__distance_name(c->cfg.distance);
    resp->nlist = sn->tmpl ? (int32_t)sn->tmpl->nlist : c->cfg.nlist;
    tsr__stream_counts(c, sn, &resp->vectors_count, &resp->sparse_vectors_count);
    long long q = atomic_load(&c->queries);
    resp->queries_served = q;
    resp->mean_shards_touched = q ? (double)atomic_load(&c->shards_touched) / (double)q : 0.0;
    resp->plan = (char *)(sn->plan_kind == TSR_PLAN_LOCALITY ? "locality" : "balanced");
    if (sn->plan && sn->version) {
        int64_t *load = tsr__ar(a, S, sizeof *load);
        for (size_t i = 0; i < sn->dir.n; i++)
            if (sn->dir.e[i].list >= 0 && (size_t)sn->dir.e[i].shard < S)
                load[sn->dir.e[i].shard]++;
        int64_t mx = 0;
        for (size_t s = 0; s < S; s++)
            mx = load[s] > mx ? load[s] : mx;
        resp->plan_imbalance = sn->ndense ? (double)mx * (double)S / (double)sn->ndense : 0.0;
    }
    stats_last_op(c, a, resp);
    char *leader = tsr__ar(a, 1, LEADER_CAP);
    tsr__leader_members(c, &resp->coordinators, &resp->n_coordinators, leader, LEADER_CAP);
    resp->leader = leader;
    return 0;
}

/* ---------------------------------------------------------------- streamed writes */

/* tessera.v1 handlers (TSR_RPC_LONG: they wait for their round); the stream sets the
 * status of a refused write on the reply itself. */
TSR_RPC_HANDLER(h_upsert, Tessera__V1__UpsertDatapointsRequest,
                Tessera__V1__UpsertDatapointsResponse)
{
    return tsr__coord_stream_upsert(tsr_rpc_ctx_app(ctx), rq, resp, tsr_rpc_ctx_reply(ctx));
}

TSR_RPC_HANDLER(h_remove, Tessera__V1__RemoveDatapointsRequest,
                Tessera__V1__RemoveDatapointsResponse)
{
    return tsr__coord_stream_remove(tsr_rpc_ctx_app(ctx), rq, resp, tsr_rpc_ctx_reply(ctx));
}

/* ---------------------------------------------------------------- updates, operations, moves */

/* The operation id of a started update or move, kept until the reply is packed. */
static char *op_id(tsr_rpc_ctx *ctx)
{
    char *id = tsr_try_calloc(1, sizeof ((tsr__op *)0)->id);
    if (id)
        tsr_rpc_ctx_defer(ctx, free, id);
    return id;
}

/* Starting an update or a move sets its refusal's status on the reply itself. */
TSR_RPC_HANDLER(h_add_group, Tessera__V1__AddShardGroupRequest, Tessera__V1__ReshardResponse)
{
    if (rq->n_replicas == 0)
        return tsr_err(err, TSR_EINVAL, "replicas: empty (expected the new group's "
                       "\"host:port\" addresses)");
    char *id = op_id(ctx);
    if (!id)
        return tsr_err(err, TSR_ELIMIT, "AddShardGroup: out of memory");
    resp->operation_id = id;
    return tsr__reshard_start(tsr_rpc_ctx_app(ctx), rq->replicas, rq->n_replicas, -1,
                              &resp->group, id, sizeof ((tsr__op *)0)->id, tsr_rpc_ctx_reply(ctx));
}

TSR_RPC_HANDLER(h_remove_group, Tessera__V1__RemoveShardGroupRequest,
                Tessera__V1__ReshardResponse)
{
    char *id = op_id(ctx);
    if (!id)
        return tsr_err(err, TSR_ELIMIT, "RemoveShardGroup: out of memory");
    resp->operation_id = id;
    return tsr__reshard_start(tsr_rpc_ctx_app(ctx), NULL, 0, (int64_t)rq->group, &resp->group,
                              id, sizeof ((tsr__op *)0)->id, tsr_rpc_ctx_reply(ctx));
}

TSR_RPC_HANDLER(h_update, Tessera__V1__UpdateIndexRequest, Tessera__V1__UpdateIndexResponse)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    tsr_rpc_reply *r = tsr_rpc_ctx_reply(ctx);
    char *id = op_id(ctx);
    if (!id)
        return tsr_err(err, TSR_ELIMIT, "UpdateIndex: out of memory");
    resp->operation_id = id;
    size_t cap = sizeof ((tsr__op *)0)->id;
    return rq->fold_stream ? tsr__coord_fold_request(c, rq, id, cap, r)
                           : tsr__coord_update_start(c, rq->batch_root, rq->is_complete_overwrite,
                                                     rq->max_invalid_records, id, cap, r);
}

static void op_unlock(void *c)
{
    pthread_mutex_unlock(&((tsr__coord *)c)->op_mu);
}

static void op_free(void *op)
{
    tsr__op_free(op);
}

static void operation_resp_free(void *p)
{
    Tessera__V1__Operation *o = p;
    if (o->report)
        tessera__v1__batch_report__free_unpacked(o->report, NULL);
}

TSR_RPC_HANDLER(h_get_operation, Tessera__V1__GetOperationRequest, Tessera__V1__Operation)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    Tessera__V1__OperationProgress *pg = tsr_try_malloc(1, sizeof *pg);
    if (!pg)
        return tsr_err(err, TSR_ELIMIT, "GetOperation: out of memory");
    tsr_rpc_ctx_defer(ctx, free, pg);
    tsr__op *fetched = NULL;
    pthread_mutex_lock(&c->op_mu);
    tsr__op *op = tsr__coord_op_find(c, rq->operation_id);
    if (!op) { /* with --etcd: an operation another coordinator ran */
        pthread_mutex_unlock(&c->op_mu);
        op = fetched = tsr__oplog_fetch(c, rq->operation_id);
        tsr_rpc_ctx_defer(ctx, op_free, fetched);
        pthread_mutex_lock(&c->op_mu);
    }
    if (!op) {
        pthread_mutex_unlock(&c->op_mu);
        return tsr_err(err, TSR_ENOTFOUND, "operation \"%s\" not found (the last %d "
                       "operations are kept, across restarts)",
                       rq->operation_id ? rq->operation_id : "", TSR__OP_MAX_KEPT);
    }
    /* the answer borrows op's strings: op_mu stays held until it is packed */
    tsr_rpc_ctx_defer(ctx, op_unlock, c);
    tsr__op_to_pb(op, op->state, resp, pg);
    resp->version = op->version; /* the API: produced (SUCCEEDED), else 0 — never the target */
    return 0;
}

/* ---------------------------------------------------------------- the method table */

#define SVC "/tessera.v1.VectorSearch/"
#define METHOD(name, h, req, resp, free_fn, flags)                                       \
    {SVC name, &tessera__v1__##req##__descriptor, &tessera__v1__##resp##__descriptor, h, \
     free_fn, flags, 0}

/* FindNeighbors is not here: its reply is sent by the query path's asynchronous fan-out
 * (tsr_rpc_reply_fanout), registered raw (tsr__coord_rpc_find_neighbors). */
const tsr_rpc_method tsr__tessera_v1_methods[] = {
    METHOD("ReadIndexDatapoints", h_read, read_index_datapoints_request,
           read_index_datapoints_response, NULL, TSR_RPC_LONG),
    METHOD("GetIndexStats", h_stats, get_index_stats_request, get_index_stats_response, NULL,
           TSR_RPC_LONG),
    METHOD("UpdateIndex", h_update, update_index_request, update_index_response, NULL, 0),
    METHOD("GetOperation", h_get_operation, get_operation_request, operation,
           operation_resp_free, 0),
    /* streamed writes wait for their round: worker pool; role admin (the default) */
    METHOD("UpsertDatapoints", h_upsert, upsert_datapoints_request, upsert_datapoints_response,
           NULL, TSR_RPC_LONG),
    METHOD("RemoveDatapoints", h_remove, remove_datapoints_request, remove_datapoints_response,
           NULL, TSR_RPC_LONG),
    METHOD("AddShardGroup", h_add_group, add_shard_group_request, reshard_response, NULL, 0),
    METHOD("RemoveShardGroup", h_remove_group, remove_shard_group_request, reshard_response,
           NULL, 0),
};
const size_t tsr__tessera_v1_nmethods =
    sizeof tsr__tessera_v1_methods / sizeof tsr__tessera_v1_methods[0];
