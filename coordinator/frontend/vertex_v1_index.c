/*
 * vertex_v1_index — google.cloud.aiplatform.v1.IndexService GetIndex and UpdateIndex, and
 * google.longrunning.Operations/GetOperation, on the coordinator: what the official
 * clients' IndexServiceClient calls to load a batch and read an index's shape
 * (docs/vertex-compat.md).
 *
 * UpdateIndex takes Index.metadata.contentsDeltaUri (a path or a file:// URI; other
 * schemes are refused) and isCompleteOverwrite, and starts the same update as tessera.v1
 * UpdateIndex (tsr__coord_update_start: --batch-root-allow confines the folder). Its
 * google.longrunning.Operation is named `<index name>/operations/<tessera op id>`;
 * GetOperation takes such a name (or the bare id) and answers done = false until the
 * tessera operation ends, then the Index (SUCCEEDED: the new version is live) or a
 * google.rpc.Status with the batch's error (REJECTED: INVALID_ARGUMENT, with the batch
 * report; FAILED: FAILED_PRECONDITION). GetIndex answers from the served snapshot:
 * metadata.config.dimensions / distanceMeasureType as Vertex writes them, indexStats,
 * indexUpdateMethod STREAM_UPDATE (streamed writes and batches are both served).
 *
 *
 * UpsertDatapoints and RemoveDatapoints check the index name, translate the request into
 * tessera.v1's (the datapoints with tsr__vertex_v1_dp_to_tessera, embedding_metadata
 * included; update_mask's paths as they are) and answer through the streamed-write path
 * (tsr__coord_stream_upsert / _remove), which validates and names datapoints[i] and its
 * field; the v1 responses are empty.
 *
 * DESIGN (threads): UpdateIndex and GetOperation run on the polling thread (they only
 * take op_mu, briefly, as tessera.v1's do); GetIndex reads a snapshot reference;
 * UpsertDatapoints and RemoveDatapoints block until their write is durable, on the rpc
 * worker pool (TSR_RPC_LONG).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "frontend.h"
#include "core/mem.h"
#include "google/cloud/aiplatform/v1/index_service.pb-c.h"
#include "google/longrunning/operations.pb-c.h"

typedef Google__Cloud__Aiplatform__V1__Index g_index;
typedef Google__Protobuf__Value g_value;
typedef Google__Protobuf__Struct g_struct;
typedef Google__Protobuf__Struct__FieldsEntry g_entry;

#define INDEX_TYPE_URL "type.googleapis.com/google.cloud.aiplatform.v1.Index"
#define REPORT_MAX 4000 /* bytes of the batch report quoted in a rejected update's status */

static int check_index_name(const char *field, const char *name, tsr_rpc_reply *r)
{
    if (!name || !name[0])
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "%s is empty: give the index's "
                                   "resource name, projects/{project}/locations/{location}/"
                                   "indexes/{index}", field);
    if (!tsr__vertex_resource_ok(name, "indexes/"))
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "%s \"%s\" is not a resource "
                                   "name of the form projects/{project}/locations/{location}/"
                                   "indexes/{index}", field, name);
    return 0;
}

/* The member `key` of the Struct value v, or NULL. */
static const g_value *struct_get(const g_value *v, const char *key)
{
    if (!v || v->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE || !v->struct_value)
        return NULL;
    for (size_t i = 0; i < v->struct_value->n_fields; i++)
        if (v->struct_value->fields[i]->key && strcmp(v->struct_value->fields[i]->key, key) == 0)
            return v->struct_value->fields[i]->value;
    return NULL;
}

/* ---------------------------------------------------------------- the Index message */

/* Storage of one Index answer (everything borrowed or static but these). */
typedef struct index_msg {
    g_index ix;
    Google__Cloud__Aiplatform__V1__IndexStats st;
    g_value meta, config, dims, dist;
    g_struct meta_s, config_s;
    g_entry config_e, dims_e, dist_e;
    g_entry *meta_ev[1], *config_ev[2];
} index_msg;

static const char *vertex_distance(enum tsr__distance d)
{
    return d == TSR_DIST_DOT_PRODUCT ? "DOT_PRODUCT_DISTANCE"
         : d == TSR_DIST_COSINE      ? "COSINE_DISTANCE"
                                     : "SQUARED_L2_DISTANCE";
}

/* Fills m with the served index named `name` (borrowed): metadata {config: {dimensions,
 * distanceMeasureType}}, indexStats of the served snapshot, STREAM_UPDATE. */
static void index_fill(tsr__coord *c, const char *name, index_msg *m)
{
    memset(m, 0, sizeof *m);
    google__cloud__aiplatform__v1__index__init(&m->ix);
    google__cloud__aiplatform__v1__index_stats__init(&m->st);
    m->ix.name = (char *)name;
    m->ix.display_name = (char *)(c->deployed_index_id && c->deployed_index_id[0]
                                  ? c->deployed_index_id : "tessera");
    m->ix.index_update_method =
        GOOGLE__CLOUD__AIPLATFORM__V1__INDEX__INDEX_UPDATE_METHOD__STREAM_UPDATE;
    tsr__snap *sn = tsr__coord_snap_get(c);
    tsr__stream_counts(c, sn, &m->st.vectors_count, &m->st.sparse_vectors_count);
    m->st.shards_count = (int32_t)tsr__snap_live_groups(sn, &c->cfg);
    tsr__snap_unref(sn);
    m->ix.index_stats = &m->st;
    google__protobuf__value__init(&m->dims);
    m->dims.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
    m->dims.number_value = c->cfg.dimensions;
    google__protobuf__value__init(&m->dist);
    m->dist.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
    m->dist.string_value = (char *)vertex_distance(c->cfg.distance);
    google__protobuf__struct__fields_entry__init(&m->dims_e);
    m->dims_e.key = (char *)"dimensions";
    m->dims_e.value = &m->dims;
    google__protobuf__struct__fields_entry__init(&m->dist_e);
    m->dist_e.key = (char *)"distanceMeasureType";
    m->dist_e.value = &m->dist;
    m->config_ev[0] = &m->dims_e;
    m->config_ev[1] = &m->dist_e;
    google__protobuf__struct__init(&m->config_s);
    m->config_s.fields = m->config_ev;
    m->config_s.n_fields = 2;
    google__protobuf__value__init(&m->config);
    m->config.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
    m->config.struct_value = &m->config_s;
    google__protobuf__struct__fields_entry__init(&m->config_e);
    m->config_e.key = (char *)"config";
    m->config_e.value = &m->config;
    m->meta_ev[0] = &m->config_e;
    google__protobuf__struct__init(&m->meta_s);
    m->meta_s.fields = m->meta_ev;
    m->meta_s.n_fields = 1;
    google__protobuf__value__init(&m->meta);
    m->meta.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
    m->meta.struct_value = &m->meta_s;
    m->ix.metadata = &m->meta;
}

/* ---------------------------------------------------------------- handlers */

int tsr__vertex_v1_rpc_get_index(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Google__Cloud__Aiplatform__V1__GetIndexRequest *g =
        google__cloud__aiplatform__v1__get_index_request__unpack(NULL, len, req);
    if (!g)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "GetIndexRequest: malformed "
                                   "protobuf");
    int rc = check_index_name("name", g->name, r);
    if (!rc) {
        index_msg m;
        index_fill(c, g->name, &m);
        rc = tsr_rpc_reply_pack(r, &m.ix.base);
    }
    google__cloud__aiplatform__v1__get_index_request__free_unpacked(g, NULL);
    return rc;
}

/* The local path of contentsDeltaUri u (borrowed from it), or NULL with r set. */
static const char *delta_path(const char *u, tsr_rpc_reply *r)
{
    if (strncmp(u, "file://", 7) == 0) {
        u += 7;
        if (strncmp(u, "localhost/", 10) == 0)
            u += 9;
        if (u[0] == '/')
            return u;
        tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "index.metadata.contentsDeltaUri: "
                            "a file:// URI must name an absolute path (file:///DIR)");
        return NULL;
    }
    const char *colon = strstr(u, "://");
    if (colon) {
        tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "index.metadata.contentsDeltaUri "
                            "\"%s\": only local paths are served (a path or a file:// URI "
                            "inside the coordinator's --batch-root-allow folders), not %.*s://",
                            u, (int)(colon - u), u);
        return NULL;
    }
    return u;
}

int tsr__vertex_v1_rpc_update_index(void *ctx, const uint8_t *req, size_t len,
                                    tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Google__Cloud__Aiplatform__V1__UpdateIndexRequest *g =
        google__cloud__aiplatform__v1__update_index_request__unpack(NULL, len, req);
    if (!g)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpdateIndexRequest: malformed "
                                   "protobuf");
    int rc;
    const g_value *uri = NULL, *ow = NULL;
    if (!g->index) {
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "index is required");
        goto out;
    }
    if ((rc = check_index_name("index.name", g->index->name, r)) != 0)
        goto out;
    uri = struct_get(g->index->metadata, "contentsDeltaUri");
    ow = struct_get(g->index->metadata, "isCompleteOverwrite");
    if (!uri || uri->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE ||
        !uri->string_value[0]) {
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "index.metadata.contentsDeltaUri "
                                 "is required (a string: the batch folder, a path or a file:// "
                                 "URI); Tessera changes nothing else of an index");
        goto out;
    }
    if (ow && ow->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
        ow->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE) {
        rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "index.metadata."
                                 "isCompleteOverwrite must be a boolean");
        goto out;
    }
    const char *path = delta_path(uri->string_value, r);
    if (!path) {
        rc = TSR_EINVAL;
        goto out;
    }
    char id[sizeof ((tsr__op *)0)->id];
    int overwrite = ow && ow->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
                    ow->bool_value;
    if ((rc = tsr__coord_update_start(c, path, overwrite, 0, id, sizeof id, r)) != 0)
        goto out;
    size_t nl = strlen(g->index->name) + strlen(id) + sizeof "/operations/";
    char *name = tsr_xmalloc(nl);
    snprintf(name, nl, "%s/operations/%s", g->index->name, id);
    Google__Longrunning__Operation op = GOOGLE__LONGRUNNING__OPERATION__INIT;
    op.name = name;
    rc = tsr_rpc_reply_pack(r, &op.base);
    free(name);
out:
    google__cloud__aiplatform__v1__update_index_request__free_unpacked(g, NULL);
    return rc;
}

/* The end of the answer for op (done; caller holds op_mu): the Index packed into *any,
 * or the status of a rejected or failed update into *st (msg: new, caller frees). */
static void op_result(tsr__coord *c, const tsr__op *op, const char *index_name,
                      Google__Longrunning__Operation *o, Google__Protobuf__Any *any,
                      Google__Rpc__Status *st, char **msg)
{
    if (op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED) {
        index_msg m;
        index_fill(c, index_name, &m);
        any->type_url = (char *)INDEX_TYPE_URL;
        any->value.len = protobuf_c_message_get_packed_size(&m.ix.base);
        any->value.data = tsr_xmalloc(any->value.len ? any->value.len : 1);
        protobuf_c_message_pack(&m.ix.base, any->value.data);
        o->result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
        o->response = any;
        return;
    }
    int rejected = op->state == TESSERA__V1__OPERATION__STATE__REJECTED;
    const char *rep = op->report_json && rejected ? op->report_json : "";
    size_t n = (op->error ? strlen(op->error) : 0) + strlen(rep) + 64;
    *msg = tsr_xmalloc(n + REPORT_MAX);
    snprintf(*msg, n + REPORT_MAX, "%s%s%.*s%s", op->error ? op->error : "update failed",
             rep[0] ? "; batch report: " : "", REPORT_MAX, rep,
             strlen(rep) > REPORT_MAX ? "..." : "");
    st->code = rejected ? TSR_RPC_INVALID_ARGUMENT : TSR_RPC_FAILED_PRECONDITION;
    st->message = *msg;
    o->result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    o->error = st;
}

int tsr__vertex_v1_rpc_get_operation(void *ctx, const uint8_t *req, size_t len,
                                     tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Google__Longrunning__GetOperationRequest *g =
        google__longrunning__get_operation_request__unpack(NULL, len, req);
    if (!g)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "GetOperationRequest: "
                                   "malformed protobuf");
    /* "<index name>/operations/<id>" or the bare id */
    const char *sep = strstr(g->name, "/operations/");
    const char *id = sep ? sep + strlen("/operations/") : g->name;
    char *index_name = tsr_xstrdup(sep ? g->name : "");
    index_name[sep ? (size_t)(sep - g->name) : 0] = 0;
    Google__Longrunning__Operation o = GOOGLE__LONGRUNNING__OPERATION__INIT;
    Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
    Google__Rpc__Status st = GOOGLE__RPC__STATUS__INIT;
    char *msg = NULL;
    int rc;
    tsr__op *fetched = NULL;
    pthread_mutex_lock(&c->op_mu);
    const tsr__op *op = tsr__coord_op_find(c, id);
    if (!op) { /* with --etcd: an operation another coordinator ran */
        pthread_mutex_unlock(&c->op_mu);
        op = fetched = tsr__oplog_fetch(c, id);
        pthread_mutex_lock(&c->op_mu);
    }
    if (!op) {
        pthread_mutex_unlock(&c->op_mu);
        rc = tsr_rpc_reply_error(r, TSR_RPC_NOT_FOUND, "name: operation \"%s\" not found (the "
                                 "last %d operations are kept, across restarts)", g->name,
                                 TSR__OP_MAX_KEPT);
        goto out;
    }
    o.name = g->name;
    o.done = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED ||
             op->state == TESSERA__V1__OPERATION__STATE__REJECTED ||
             op->state == TESSERA__V1__OPERATION__STATE__FAILED;
    if (o.done)
        op_result(c, op, index_name, &o, &any, &st, &msg);
    pthread_mutex_unlock(&c->op_mu);
    rc = tsr_rpc_reply_pack(r, &o.base);
out:
    tsr__op_free(fetched);
    free(any.value.data);
    free(msg);
    free(index_name);
    google__longrunning__get_operation_request__free_unpacked(g, NULL);
    return rc;
}

/* ---------------------------------------------------------------- streamed writes */

int tsr__vertex_v1_rpc_upsert(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Google__Cloud__Aiplatform__V1__UpsertDatapointsRequest *g =
        google__cloud__aiplatform__v1__upsert_datapoints_request__unpack(NULL, len, req);
    if (!g)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "UpsertDatapointsRequest: "
                                   "malformed protobuf");
    tsr__v1_pool a = {0};
    int rc = check_index_name("index", g->index, r);
    for (size_t i = 0; !rc && i < g->n_datapoints; i++) {
        const Google__Protobuf__Struct *md = g->datapoints[i]->embedding_metadata;
        size_t n = md ? protobuf_c_message_get_packed_size(&md->base) : 0;
        if (n > TSR_METADATA_MAX)
            rc = tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "datapoints[%zu] (id \"%.64s\"): "
                                     "embedding_metadata is %zu bytes serialized, at most %zu",
                                     i, g->datapoints[i]->datapoint_id, n, TSR_METADATA_MAX);
    }
    if (!rc) {
        Tessera__V1__UpsertDatapointsRequest rq = TESSERA__V1__UPSERT_DATAPOINTS_REQUEST__INIT;
        Tessera__V1__FieldMask mask = TESSERA__V1__FIELD_MASK__INIT;
        Tessera__V1__UpsertDatapointsResponse tresp = TESSERA__V1__UPSERT_DATAPOINTS_RESPONSE__INIT;
        rq.n_datapoints = g->n_datapoints;
        rq.datapoints = tsr_xcalloc(g->n_datapoints + 1, sizeof *rq.datapoints);
        for (size_t i = 0; i < g->n_datapoints; i++)
            rq.datapoints[i] = tsr__vertex_v1_dp_to_tessera(&a, g->datapoints[i]);
        if (g->update_mask) {
            mask.paths = g->update_mask->paths;
            mask.n_paths = g->update_mask->n_paths;
            rq.update_mask = &mask;
        }
        rc = tsr__coord_stream_upsert(c, &rq, &tresp, r);
        free(rq.datapoints);
    }
    if (!rc) {
        Google__Cloud__Aiplatform__V1__UpsertDatapointsResponse out =
            GOOGLE__CLOUD__AIPLATFORM__V1__UPSERT_DATAPOINTS_RESPONSE__INIT;
        rc = tsr_rpc_reply_pack(r, &out.base);
    }
    tsr__vertex_v1_pool_free(&a);
    google__cloud__aiplatform__v1__upsert_datapoints_request__free_unpacked(g, NULL);
    return rc;
}

int tsr__vertex_v1_rpc_remove(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r)
{
    tsr__coord *c = ctx;
    Google__Cloud__Aiplatform__V1__RemoveDatapointsRequest *g =
        google__cloud__aiplatform__v1__remove_datapoints_request__unpack(NULL, len, req);
    if (!g)
        return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, "RemoveDatapointsRequest: "
                                   "malformed protobuf");
    int rc = check_index_name("index", g->index, r);
    if (!rc) {
        Tessera__V1__RemoveDatapointsRequest rq = TESSERA__V1__REMOVE_DATAPOINTS_REQUEST__INIT;
        Tessera__V1__RemoveDatapointsResponse tresp = TESSERA__V1__REMOVE_DATAPOINTS_RESPONSE__INIT;
        rq.datapoint_ids = g->datapoint_ids;
        rq.n_datapoint_ids = g->n_datapoint_ids;
        rc = tsr__coord_stream_remove(c, &rq, &tresp, r);
    }
    if (!rc) {
        Google__Cloud__Aiplatform__V1__RemoveDatapointsResponse out =
            GOOGLE__CLOUD__AIPLATFORM__V1__REMOVE_DATAPOINTS_RESPONSE__INIT;
        rc = tsr_rpc_reply_pack(r, &out.base);
    }
    google__cloud__aiplatform__v1__remove_datapoints_request__free_unpacked(g, NULL);
    return rc;
}
