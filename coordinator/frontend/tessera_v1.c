/*
 * tessera_v1 — the tessera.v1 Coordinator service's handlers (proto/tessera/v1): adapters
 * that decode a request, call the subsystem that answers it and encode the reply.
 *
 *   FindNeighbors, ReadIndexDatapoints   the read path (query.h)
 *   GetIndexStats                        the groups' Shard.Stats fan-out, the snapshot,
 *                                        the stream's counts, operations, leadership
 *   UpsertDatapoints, RemoveDatapoints   streamed writes (stream.h; TSR_RPC_LONG)
 *   UpdateIndex, GetOperation            updates and folds (update.h), operations (ops.h)
 *   AddShardGroup, RemoveShardGroup      reshard moves (update.h)
 *
 * Errors of the subsystems are tsr_error, mapped to a gRPC status here
 * (tsr__coord_reply_error) or set on the reply by the subsystem's entry point.
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

int tsr__coord_rpc_read(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__ReadIndexDatapointsRequest *rq =
        tessera__v1__read_index_datapoints_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "ReadIndexDatapointsRequest: "
                                   "malformed protobuf");
    Tessera__V1__ReadIndexDatapointsResponse *out = NULL;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr__coord_read(c, rq->ids, rq->n_ids, tsr_rpc_reply_remaining_ms(r), &out, &err);
    if (rc == 0)
        rc = tsr_rpc_reply_pack(r, &out->base);
    else
        rc = tsr__coord_reply_error(r, &err);
    tsr__coord_read_free(out);
    tessera__v1__read_index_datapoints_request__free_unpacked(rq, NULL);
    return rc;
}

/* ---------------------------------------------------------------- GetIndexStats */

int tsr__coord_rpc_stats(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    size_t S = c->cfg.nshards;
    (void)req;
    (void)len;
    tsr__snap *sn = tsr__coord_snap_get(c);
    tsr__arena a = {0};
    tsr__gcall *calls = tsr__ar(&a, S, sizeof *calls);
    int64_t tmo = c->cfg.search_deadline_ms;
    if (tsr_rpc_reply_remaining_ms(r) < tmo)
        tmo = tsr_rpc_reply_remaining_ms(r);
    for (size_t s = 0; s < S; s++) {
        calls[s].group = s;
        tsr_rpc_result_init(&calls[s].result);
    }
    tsr__coord_group_fanout(c, TSR_SHARD_SVC "Stats", calls, S, tmo);
    Tessera__V1__GetIndexStatsResponse out = TESSERA__V1__GET_INDEX_STATS_RESPONSE__INIT;
    Tessera__V1__ShardIndexStats *st = tsr__ar(&a, S, sizeof *st);
    out.shards = tsr__ar(&a, S, sizeof *out.shards);
    out.n_shards = S;
    out.shards_count = (int32_t)tsr__snap_live_groups(sn, &c->cfg); /* shards: every number */
    out.version = (int64_t)sn->version;
    out.dimensions = c->cfg.dimensions;
    out.distance = (char *)tsr__distance_name(c->cfg.distance);
    out.nlist = sn->tmpl ? (int32_t)sn->tmpl->nlist : c->cfg.nlist;
    tsr__stream_counts(c, sn, &out.vectors_count, &out.sparse_vectors_count);
    long long q = atomic_load(&c->queries);
    out.queries_served = q;
    out.mean_shards_touched = q ? (double)atomic_load(&c->shards_touched) / (double)q : 0.0;
    out.plan = (char *)(sn->plan_kind == TSR_PLAN_LOCALITY ? "locality" : "balanced");
    if (sn->plan && sn->version) {
        int64_t *load = tsr__ar(&a, S, sizeof *load);
        for (size_t i = 0; i < sn->dir.n; i++)
            if (sn->dir.e[i].list >= 0 && (size_t)sn->dir.e[i].shard < S)
                load[sn->dir.e[i].shard]++;
        int64_t mx = 0;
        for (size_t s = 0; s < S; s++)
            mx = load[s] > mx ? load[s] : mx;
        out.plan_imbalance = sn->ndense ? (double)mx * (double)S / (double)sn->ndense : 0.0;
    }
    for (size_t s = 0; s < S; s++) {
        tessera__v1__shard_index_stats__init(&st[s]);
        st[s].address = c->cfg.shards[s]; /* names the group (its first replica) */
        st[s].removed = c->cfg.retired && __atomic_load_n(&c->cfg.retired[s], __ATOMIC_ACQUIRE);
        out.shards[s] = &st[s];
        tsr_rpc_result *res = &calls[s].result;
        if (res->code == TSR_RPC_OK) {
            Tessera__V1__ShardStatsResponse *sr =
                tessera__v1__shard_stats_response__unpack(NULL, res->len, res->data);
            if (sr) {
                st[s].available = 1;
                st[s].vectors_count = sr->vectors_count;
                st[s].sparse_vectors_count = sr->sparse_vectors_count;
                st[s].version = sr->current_version;
                st[s].anonymous_bytes = sr->anonymous_bytes;
                st[s].mapped_bytes = sr->mapped_bytes;
                tessera__v1__shard_stats_response__free_unpacked(sr, NULL);
            }
        }
        tsr_rpc_result_close(res);
    }
    Tessera__V1__OperationProgress pg = TESSERA__V1__OPERATION_PROGRESS__INIT;
    char opid[sizeof ((tsr__op *)0)->id] = "";
    pthread_mutex_lock(&c->op_mu);
    const tsr__op *lop = c->nops ? c->ops[c->nops - 1] : NULL;
    if (lop) {
        snprintf(opid, sizeof opid, "%s", lop->id);
        out.last_operation_state = (Tessera__V1__Operation__State)lop->state;
        pg.files_total = lop->files_total;
        pg.files_read = lop->files_read;
        pg.records_read = lop->records_read;
        pg.shards_total = lop->shards_total;
        pg.shards_staged = lop->shards_staged;
        pg.shards_prepared = lop->shards_prepared;
        pg.shards_committed = lop->shards_committed;
        pg.lists_total = lop->lists_total;
        pg.lists_moved = lop->lists_moved;
        pg.datapoints_moved = lop->datapoints_moved;
        pg.bytes_moved = lop->bytes_moved;
        out.last_operation_progress = &pg;
    }
    pthread_mutex_unlock(&c->op_mu);
    out.last_operation_id = opid;
    char leader[256];
    char **members = NULL;
    size_t nmembers = 0;
    tsr__leader_members(c, &members, &nmembers, leader, sizeof leader);
    out.coordinators = members;
    out.n_coordinators = nmembers;
    out.leader = leader;
    int rc = tsr_rpc_reply_pack(r, &out.base);
    for (size_t i = 0; i < nmembers; i++)
        free(members[i]);
    free(members);
    tsr__ar_free(&a);
    tsr__snap_unref(sn);
    return rc;
}

/* ---------------------------------------------------------------- streamed writes */

/* tessera.v1 handlers (TSR_RPC_LONG: they wait for their round). */
int tsr__coord_rpc_upsert(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    Tessera__V1__UpsertDatapointsRequest *rq =
        tessera__v1__upsert_datapoints_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpsertDatapointsRequest: "
                                   "malformed protobuf");
    Tessera__V1__UpsertDatapointsResponse resp = TESSERA__V1__UPSERT_DATAPOINTS_RESPONSE__INIT;
    int rc = tsr__coord_stream_upsert(ctx, rq, &resp, r);
    if (rc == 0)
        rc = tsr_rpc_reply_pack(r, &resp.base);
    tessera__v1__upsert_datapoints_request__free_unpacked(rq, NULL);
    return rc;
}

int tsr__coord_rpc_remove(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    Tessera__V1__RemoveDatapointsRequest *rq =
        tessera__v1__remove_datapoints_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "RemoveDatapointsRequest: "
                                   "malformed protobuf");
    Tessera__V1__RemoveDatapointsResponse resp = TESSERA__V1__REMOVE_DATAPOINTS_RESPONSE__INIT;
    int rc = tsr__coord_stream_remove(ctx, rq, &resp, r);
    if (rc == 0)
        rc = tsr_rpc_reply_pack(r, &resp.base);
    tessera__v1__remove_datapoints_request__free_unpacked(rq, NULL);
    return rc;
}

/* ---------------------------------------------------------------- updates, operations, moves */

static int reshard_reply(tsr_rpc_reply *r, const char *id, uint32_t group)
{
    Tessera__V1__ReshardResponse resp = TESSERA__V1__RESHARD_RESPONSE__INIT;
    resp.operation_id = (char *)id;
    resp.group = group;
    return tsr_rpc_reply_pack(r, &resp.base);
}

int tsr__coord_rpc_add_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__AddShardGroupRequest *rq =
        tessera__v1__add_shard_group_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "AddShardGroupRequest: "
                                   "malformed protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    uint32_t group = 0;
    int rc;
    if (rq->n_replicas == 0)
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "replicas: empty (expected the "
                                 "new group's \"host:port\" addresses)");
    else
        rc = tsr__reshard_start(c, rq->replicas, rq->n_replicas, -1, &group, id, sizeof id, r);
    if (!rc)
        rc = reshard_reply(r, id, group);
    tessera__v1__add_shard_group_request__free_unpacked(rq, NULL);
    return rc;
}

int tsr__coord_rpc_remove_group(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__RemoveShardGroupRequest *rq =
        tessera__v1__remove_shard_group_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "RemoveShardGroupRequest: "
                                   "malformed protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    uint32_t group = 0;
    int rc = tsr__reshard_start(c, NULL, 0, (int64_t)rq->group, &group, id, sizeof id, r);
    if (!rc)
        rc = reshard_reply(r, id, group);
    tessera__v1__remove_shard_group_request__free_unpacked(rq, NULL);
    return rc;
}

int tsr__coord_rpc_update(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__UpdateIndexRequest *rq = tessera__v1__update_index_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpdateIndexRequest: malformed "
                                   "protobuf");
    char id[sizeof ((tsr__op *)0)->id];
    int rc = rq->fold_stream ? tsr__coord_fold_request(c, rq, id, sizeof id, r)
                             : tsr__coord_update_start(c, rq->batch_root,
                                                       rq->is_complete_overwrite,
                                                       rq->max_invalid_records, id, sizeof id, r);
    if (!rc) {
        Tessera__V1__UpdateIndexResponse resp = TESSERA__V1__UPDATE_INDEX_RESPONSE__INIT;
        resp.operation_id = id;
        rc = tsr_rpc_reply_pack(r, &resp.base);
    }
    tessera__v1__update_index_request__free_unpacked(rq, NULL);
    return rc;
}

int tsr__coord_rpc_get_operation(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Tessera__V1__GetOperationRequest *rq =
        tessera__v1__get_operation_request__unpack(NULL, len, req);
    if (!rq)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "GetOperationRequest: malformed "
                                   "protobuf");
    int rc;
    tsr__op *fetched = NULL;
    pthread_mutex_lock(&c->op_mu);
    tsr__op *op = tsr__coord_op_find(c, rq->operation_id);
    if (!op) { /* with --etcd: an operation another coordinator ran */
        pthread_mutex_unlock(&c->op_mu);
        op = fetched = tsr__oplog_fetch(c, rq->operation_id);
        pthread_mutex_lock(&c->op_mu);
    }
    if (!op) {
        pthread_mutex_unlock(&c->op_mu);
        rc = tsr_rpc_reply_error(r, TSR_RPC_NOT_FOUND, "operation \"%s\" not found (the last %d "
                                 "operations are kept, across restarts)",
                                 rq->operation_id ? rq->operation_id : "", TSR__OP_MAX_KEPT);
        tessera__v1__get_operation_request__free_unpacked(rq, NULL);
        return rc;
    }
    Tessera__V1__Operation o;
    Tessera__V1__OperationProgress pg;
    tsr__op_to_pb(op, op->state, &o, &pg);
    o.version = op->version; /* the API: produced (SUCCEEDED), else 0 — never the target */
    rc = tsr_rpc_reply_pack(r, &o.base);
    pthread_mutex_unlock(&c->op_mu);
    if (o.report)
        tessera__v1__batch_report__free_unpacked(o.report, NULL);
    tsr__op_free(fetched);
    tessera__v1__get_operation_request__free_unpacked(rq, NULL);
    return rc;
}
