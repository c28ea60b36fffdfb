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

#include "arena.h"
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

typedef Google__Cloud__Aiplatform__V1__GetIndexRequest g_get_index_req;

TSR_RPC_HANDLER(h_get_index, g_get_index_req, g_index)
{
    (void)resp; /* answered from an index_msg, which holds what the Index points into */
    int rc = check_index_name("name", rq->name, tsr_rpc_ctx_reply(ctx));
    if (rc)
        return rc;
    index_msg *m = tsr_try_malloc(1, sizeof *m);
    if (!m)
        return tsr_err(err, TSR_ELIMIT, "GetIndex: out of memory");
    tsr_rpc_ctx_defer(ctx, free, m);
    index_fill(tsr_rpc_ctx_app(ctx), rq->name, m);
    return tsr_rpc_ctx_set_resp(ctx, &m->ix.base, NULL);
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

typedef Google__Cloud__Aiplatform__V1__UpdateIndexRequest g_update_index_req;

TSR_RPC_HANDLER(h_update_index, g_update_index_req, Google__Longrunning__Operation)
{
    tsr_rpc_reply *r = tsr_rpc_ctx_reply(ctx);
    int rc;
    if (!rq->index)
        return tsr_err(err, TSR_EINVAL, "index is required");
    if ((rc = check_index_name("index.name", rq->index->name, r)) != 0)
        return rc;
    const g_value *uri = struct_get(rq->index->metadata, "contentsDeltaUri");
    const g_value *ow = struct_get(rq->index->metadata, "isCompleteOverwrite");
    if (!uri || uri->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE ||
        !uri->string_value[0])
        return tsr_err(err, TSR_EINVAL, "index.metadata.contentsDeltaUri is required (a string: "
                       "the batch folder, a path or a file:// URI); Tessera changes nothing "
                       "else of an index");
    if (ow && ow->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
        ow->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE)
        return tsr_err(err, TSR_EINVAL, "index.metadata.isCompleteOverwrite must be a boolean");
    const char *path = delta_path(uri->string_value, r);
    if (!path)
        return TSR_EINVAL;
    char id[sizeof ((tsr__op *)0)->id];
    int overwrite = ow && ow->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
                    ow->bool_value;
    if ((rc = tsr__coord_update_start(tsr_rpc_ctx_app(ctx), path, overwrite, 0, id, sizeof id,
                                      r)) != 0)
        return rc;
    size_t nl = strlen(rq->index->name) + strlen(id) + sizeof "/operations/";
    char *name = tsr_try_malloc(nl, 1);
    if (name == NULL)
        return tsr_err(err, TSR_ELIMIT, "UpdateIndex: out of memory");
    tsr_rpc_ctx_defer(ctx, free, name);
    snprintf(name, nl, "%s/operations/%s", rq->index->name, id);
    resp->name = name;
    return 0;
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

/* What a GetOperation answer points into, freed after packing. */
typedef struct op_answer {
    Google__Protobuf__Any any;
    Google__Rpc__Status st;
    char *msg;
    char *index_name;
    tsr__op *fetched;
} op_answer;

static void op_answer_free(void *p)
{
    op_answer *a = p;
    tsr__op_free(a->fetched);
    free(a->any.value.data);
    free(a->msg);
    free(a->index_name);
    free(a);
}

TSR_RPC_HANDLER(h_get_operation, Google__Longrunning__GetOperationRequest,
                Google__Longrunning__Operation)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    op_answer *a = tsr_try_calloc(1, sizeof *a);
    if (!a)
        return tsr_err(err, TSR_ELIMIT, "GetOperation: out of memory");
    tsr_rpc_ctx_defer(ctx, op_answer_free, a);
    google__protobuf__any__init(&a->any);
    google__rpc__status__init(&a->st);
    /* "<index name>/operations/<id>" or the bare id */
    const char *sep = strstr(rq->name, "/operations/");
    const char *id = sep ? sep + strlen("/operations/") : rq->name;
    a->index_name = tsr_xstrdup(sep ? rq->name : "");
    a->index_name[sep ? (size_t)(sep - rq->name) : 0] = 0;
    pthread_mutex_lock(&c->op_mu);
    const tsr__op *op = tsr__coord_op_find(c, id);
    if (!op) { /* with --etcd: an operation another coordinator ran */
        pthread_mutex_unlock(&c->op_mu);
        op = a->fetched = tsr__oplog_fetch(c, id);
        pthread_mutex_lock(&c->op_mu);
    }
    if (!op) {
        pthread_mutex_unlock(&c->op_mu);
        return tsr_err(err, TSR_ENOTFOUND, "name: operation \"%s\" not found (the last %d "
                       "operations are kept, across restarts)", rq->name, TSR__OP_MAX_KEPT);
    }
    resp->name = rq->name; /* the request's: lives until the reply is packed */
    resp->done = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED ||
                 op->state == TESSERA__V1__OPERATION__STATE__REJECTED ||
                 op->state == TESSERA__V1__OPERATION__STATE__FAILED;
    if (resp->done)
        op_result(c, op, a->index_name, resp, &a->any, &a->st, &a->msg);
    pthread_mutex_unlock(&c->op_mu);
    return 0;
}

/* ---------------------------------------------------------------- streamed writes */

typedef Google__Cloud__Aiplatform__V1__UpsertDatapointsRequest g_upsert_req;
typedef Google__Cloud__Aiplatform__V1__UpsertDatapointsResponse g_upsert_resp;

/* The v1 response is empty; the stream sets a refused write's status on the reply. */
TSR_RPC_HANDLER(h_upsert, g_upsert_req, g_upsert_resp)
{
    (void)resp;
    tsr_rpc_reply *r = tsr_rpc_ctx_reply(ctx);
    int rc = check_index_name("index", rq->index, r);
    if (rc)
        return rc;
    for (size_t i = 0; i < rq->n_datapoints; i++) {
        const Google__Protobuf__Struct *md = rq->datapoints[i]->embedding_metadata;
        size_t n = md ? protobuf_c_message_get_packed_size(&md->base) : 0;
        if (n > TSR_METADATA_MAX)
            return tsr_err(err, TSR_EINVAL, "datapoints[%zu] (id \"%.64s\"): embedding_metadata "
                           "is %zu bytes serialized, at most %zu", i,
                           rq->datapoints[i]->datapoint_id, n, (size_t)TSR_METADATA_MAX);
    }
    tsr__arena a = {0};
    Tessera__V1__UpsertDatapointsRequest trq = TESSERA__V1__UPSERT_DATAPOINTS_REQUEST__INIT;
    Tessera__V1__FieldMask mask = TESSERA__V1__FIELD_MASK__INIT;
    Tessera__V1__UpsertDatapointsResponse tresp = TESSERA__V1__UPSERT_DATAPOINTS_RESPONSE__INIT;
    trq.n_datapoints = rq->n_datapoints;
    trq.datapoints = tsr_xcalloc(rq->n_datapoints + 1, sizeof *trq.datapoints);
    for (size_t i = 0; i < rq->n_datapoints; i++)
        trq.datapoints[i] = tsr__vertex_v1_dp_to_tessera(&a, rq->datapoints[i]);
    if (rq->update_mask) {
        mask.paths = rq->update_mask->paths;
        mask.n_paths = rq->update_mask->n_paths;
        trq.update_mask = &mask;
    }
    rc = tsr__coord_stream_upsert(tsr_rpc_ctx_app(ctx), &trq, &tresp, r);
    free(trq.datapoints);
    tsr__ar_free(&a);
    return rc;
}

typedef Google__Cloud__Aiplatform__V1__RemoveDatapointsRequest g_remove_req;
typedef Google__Cloud__Aiplatform__V1__RemoveDatapointsResponse g_remove_resp;

TSR_RPC_HANDLER(h_remove, g_remove_req, g_remove_resp)
{
    (void)resp;
    tsr_rpc_reply *r = tsr_rpc_ctx_reply(ctx);
    int rc = check_index_name("index", rq->index, r);
    if (rc)
        return rc;
    Tessera__V1__RemoveDatapointsRequest trq = TESSERA__V1__REMOVE_DATAPOINTS_REQUEST__INIT;
    Tessera__V1__RemoveDatapointsResponse tresp = TESSERA__V1__REMOVE_DATAPOINTS_RESPONSE__INIT;
    trq.datapoint_ids = rq->datapoint_ids;
    trq.n_datapoint_ids = rq->n_datapoint_ids;
    return tsr__coord_stream_remove(tsr_rpc_ctx_app(ctx), &trq, &tresp, r);
}

/* ---------------------------------------------------------------- the method table */

#define GV1(x) &google__cloud__aiplatform__v1__##x##__descriptor
#define LRO(x) &google__longrunning__##x##__descriptor

/* Nesting checks (UpdateIndex's Index.metadata, UpsertDatapoints' embedding_metadata are
 * google.protobuf.Struct) are found from the descriptors. */
const tsr_rpc_method tsr__vertex_v1_index_methods[] = {
    {TSR_VERTEX_V1_INDEX_SVC "GetIndex", GV1(get_index_request), GV1(index), h_get_index,
     NULL, 0, 0},
    {TSR_VERTEX_V1_INDEX_SVC "UpdateIndex", GV1(update_index_request), LRO(operation),
     h_update_index, NULL, 0, 0},
    {TSR_LRO_SVC "GetOperation", LRO(get_operation_request), LRO(operation), h_get_operation,
     NULL, 0, 0},
    {TSR_VERTEX_V1_INDEX_SVC "UpsertDatapoints", GV1(upsert_datapoints_request),
     GV1(upsert_datapoints_response), h_upsert, NULL, TSR_RPC_LONG, 0},
    {TSR_VERTEX_V1_INDEX_SVC "RemoveDatapoints", GV1(remove_datapoints_request),
     GV1(remove_datapoints_response), h_remove, NULL, TSR_RPC_LONG, 0},
};
const size_t tsr__vertex_v1_index_nmethods =
    sizeof tsr__vertex_v1_index_methods / sizeof tsr__vertex_v1_index_methods[0];
