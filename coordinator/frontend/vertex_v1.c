/*
 * vertex_v1 — google.cloud.aiplatform.v1.MatchService on the coordinator: FindNeighbors
 * and ReadIndexDatapoints, the public API Google's official Vertex AI clients
 * (@google-cloud/aiplatform's v1.MatchServiceClient, google-cloud-aiplatform's
 * MatchServiceClient) call, so that code written with them works against Tessera by
 * changing the endpoint (docs/vertex-compat.md). IndexService's methods but UpdateIndex,
 * GetIndex, UpsertDatapoints and RemoveDatapoints (vertex_v1_index.c) answer UNIMPLEMENTED
 * with a message that says what Tessera serves instead.
 *
 * Nothing here searches. tessera.v1's FindNeighbors/ReadIndexDatapoints messages keep the
 * Vertex v1 shapes and field numbers (proto/tessera/v1/tessera.proto), so each request is
 * unpacked with the published messages (proto/google/cloud/aiplatform/v1/), its resource
 * names checked, translated field by field into the tessera.v1 request and answered by the
 * coordinator's own query path (tsr__coord_find_neighbors, tsr__coord_read): an answer
 * here is exactly tessera.v1's for the same query. Replies borrow their strings and
 * arrays from those responses, which stay alive until the reply is packed.
 * IndexDatapoint.embedding_metadata (field 8, a google.protobuf.Struct in both APIs) is
 * passed through as is: ignored in a query (it has no meaning to the search), returned with
 * full datapoints and ReadIndexDatapoints, and stored by UpsertDatapoints
 * (vertex_v1_index.c, which uses tsr__vertex_v1_dp_to_tessera for its datapoints).
 *
 * DESIGN (threads): the handlers run on the rpc worker pool (TSR_RPC_LONG, they block on
 * the fan-out) and share nothing but the coordinator, which they only read through the
 * query path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "coord.h"
#include "frontend.h"
#include "core/mem.h"
#include "google/cloud/aiplatform/v1/match_service.pb-c.h"

typedef Google__Cloud__Aiplatform__V1__IndexDatapoint g_dp;
typedef Google__Cloud__Aiplatform__V1__IndexDatapoint__Restriction g_restr;
typedef Google__Cloud__Aiplatform__V1__IndexDatapoint__NumericRestriction g_num;
typedef Google__Cloud__Aiplatform__V1__IndexDatapoint__SparseEmbedding g_sparse;
typedef Google__Cloud__Aiplatform__V1__IndexDatapoint__CrowdingTag g_tag;
typedef Google__Cloud__Aiplatform__V1__FindNeighborsRequest g_fn_req;
typedef Google__Cloud__Aiplatform__V1__FindNeighborsRequest__Query g_query;
typedef Google__Cloud__Aiplatform__V1__FindNeighborsResponse g_fn_resp;
typedef Google__Cloud__Aiplatform__V1__FindNeighborsResponse__NearestNeighbors g_nn;
typedef Google__Cloud__Aiplatform__V1__FindNeighborsResponse__Neighbor g_neighbor;
typedef Google__Cloud__Aiplatform__V1__ReadIndexDatapointsRequest g_rd_req;
typedef Google__Cloud__Aiplatform__V1__ReadIndexDatapointsResponse g_rd_resp;

#define GV(x) google__cloud__aiplatform__v1__##x
#define G_VAL(x) GOOGLE__CLOUD__AIPLATFORM__V1__INDEX_DATAPOINT__NUMERIC_RESTRICTION__VALUE_VALUE_##x
#define T_VAL(x) TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_##x

/* ---------------------------------------------------------------- resource names */

/* index_endpoint: empty or a well-formed name (any project, location and endpoint: one
 * cluster serves one index); deployed_index_id: as the container MatchService checks it
 * (--deployed-index-id). */
static int check_names(const tsr__coord *c, const char *endpoint, const char *deployed,
                       tsr_error *err)
{
    if (endpoint && endpoint[0] && !tsr__vertex_resource_ok(endpoint, "indexEndpoints/"))
        return tsr_err(err, TSR_EINVAL, "index_endpoint \"%s\" is not a resource name of the "
                       "form projects/{project}/locations/{location}/indexEndpoints/"
                       "{index_endpoint}", endpoint);
    return tsr__vertex_check_index(c, deployed, "", err);
}

/* ---------------------------------------------------------------- request translation */

Tessera__V1__IndexDatapoint *tsr__vertex_v1_dp_to_tessera(tsr__arena *a, const g_dp *g)
{
    Tessera__V1__IndexDatapoint *dp = tsr__ar(a, 1, sizeof *dp);
    tessera__v1__index_datapoint__init(dp);
    dp->datapoint_id = g->datapoint_id;
    dp->feature_vector = g->feature_vector;
    dp->n_feature_vector = g->n_feature_vector;
    if (g->sparse_embedding) {
        Tessera__V1__SparseEmbedding *se = tsr__ar(a, 1, sizeof *se);
        tessera__v1__sparse_embedding__init(se);
        se->values = g->sparse_embedding->values;
        se->n_values = g->sparse_embedding->n_values;
        se->dimensions = g->sparse_embedding->dimensions;
        se->n_dimensions = g->sparse_embedding->n_dimensions;
        dp->sparse_embedding = se;
    }
    dp->restricts = tsr__ar(a, g->n_restricts, sizeof *dp->restricts);
    dp->n_restricts = g->n_restricts;
    for (size_t j = 0; j < g->n_restricts; j++) {
        Tessera__V1__Restriction *r = tsr__ar(a, 1, sizeof *r);
        tessera__v1__restriction__init(r);
        r->namespace_ = g->restricts[j]->namespace_;
        r->allow_list = g->restricts[j]->allow_list;
        r->n_allow_list = g->restricts[j]->n_allow_list;
        r->deny_list = g->restricts[j]->deny_list;
        r->n_deny_list = g->restricts[j]->n_deny_list;
        dp->restricts[j] = r;
    }
    dp->numeric_restricts = tsr__ar(a, g->n_numeric_restricts, sizeof *dp->numeric_restricts);
    dp->n_numeric_restricts = g->n_numeric_restricts;
    for (size_t j = 0; j < g->n_numeric_restricts; j++) {
        const g_num *n = g->numeric_restricts[j];
        Tessera__V1__NumericRestriction *r = tsr__ar(a, 1, sizeof *r);
        tessera__v1__numeric_restriction__init(r);
        r->namespace_ = n->namespace_;
        r->op = (Tessera__V1__NumericRestriction__Operator)n->op; /* same numbers, checked
                                                                  * by the query path */
        if (n->value_case == G_VAL(INT)) {
            r->value_case = T_VAL(INT);
            r->value_int = n->value_int;
        } else if (n->value_case == G_VAL(FLOAT)) {
            r->value_case = T_VAL(FLOAT);
            r->value_float = n->value_float;
        } else if (n->value_case == G_VAL(DOUBLE)) {
            r->value_case = T_VAL(DOUBLE);
            r->value_double = n->value_double;
        }
        dp->numeric_restricts[j] = r;
    }
    if (g->crowding_tag) {
        Tessera__V1__CrowdingTag *t = tsr__ar(a, 1, sizeof *t);
        tessera__v1__crowding_tag__init(t);
        t->crowding_attribute = g->crowding_tag->crowding_attribute;
        dp->crowding_tag = t;
    }
    /* the same google.protobuf.Struct in both APIs; a query's takes no part in the search */
    dp->embedding_metadata = g->embedding_metadata;
    return dp;
}

/* The tessera.v1 request for g (borrowing from it); the query path validates it and names
 * the fields (queries[i]: ...), which are the same in both APIs. */
static void req_to_tessera(tsr__arena *a, const g_fn_req *g, Tessera__V1__FindNeighborsRequest *rq)
{
    tessera__v1__find_neighbors_request__init(rq);
    rq->return_full_datapoint = g->return_full_datapoint;
    rq->queries = tsr__ar(a, g->n_queries, sizeof *rq->queries);
    rq->n_queries = g->n_queries;
    for (size_t i = 0; i < g->n_queries; i++) {
        const g_query *gq = g->queries[i];
        Tessera__V1__FindNeighborsRequest__Query *q = tsr__ar(a, 1, sizeof *q);
        tessera__v1__find_neighbors_request__query__init(q);
        q->datapoint = gq->datapoint ? tsr__vertex_v1_dp_to_tessera(a, gq->datapoint) : NULL;
        q->neighbor_count = gq->neighbor_count;
        q->per_crowding_attribute_neighbor_count = gq->per_crowding_attribute_neighbor_count;
        /* Vertex: unset (0) = the index setting; set = must be > 0 (the query path says so) */
        if (gq->approximate_neighbor_count != 0) {
            q->approximate_case =
                TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__APPROXIMATE_APPROXIMATE_NEIGHBOR_COUNT;
            q->approximate_neighbor_count = gq->approximate_neighbor_count;
        }
        q->fraction_leaf_nodes_to_search_override = gq->fraction_leaf_nodes_to_search_override;
        if (gq->ranking_case == GOOGLE__CLOUD__AIPLATFORM__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF) {
            Tessera__V1__FindNeighborsRequest__Query__RRF *rrf = tsr__ar(a, 1, sizeof *rrf);
            tessera__v1__find_neighbors_request__query__rrf__init(rrf);
            rrf->alpha = gq->rrf ? gq->rrf->alpha : 0.0f;
            q->ranking_case = TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF;
            q->rrf = rrf;
        }
        rq->queries[i] = q;
    }
}

/* ---------------------------------------------------------------- response translation */

/* A Vertex IndexDatapoint borrowing from dp (NULL stays NULL). */
static g_dp *dp_to_vertex(tsr__arena *a, const Tessera__V1__IndexDatapoint *dp)
{
    if (!dp)
        return NULL;
    g_dp *g = tsr__ar(a, 1, sizeof *g);
    GV(index_datapoint__init)(g);
    g->datapoint_id = dp->datapoint_id;
    g->feature_vector = dp->feature_vector;
    g->n_feature_vector = dp->n_feature_vector;
    if (dp->sparse_embedding) {
        g_sparse *s = tsr__ar(a, 1, sizeof *s);
        GV(index_datapoint__sparse_embedding__init)(s);
        s->values = dp->sparse_embedding->values;
        s->n_values = dp->sparse_embedding->n_values;
        s->dimensions = dp->sparse_embedding->dimensions;
        s->n_dimensions = dp->sparse_embedding->n_dimensions;
        g->sparse_embedding = s;
    }
    g->restricts = tsr__ar(a, dp->n_restricts, sizeof *g->restricts);
    g->n_restricts = dp->n_restricts;
    for (size_t j = 0; j < dp->n_restricts; j++) {
        g_restr *r = tsr__ar(a, 1, sizeof *r);
        GV(index_datapoint__restriction__init)(r);
        r->namespace_ = dp->restricts[j]->namespace_;
        r->allow_list = dp->restricts[j]->allow_list;
        r->n_allow_list = dp->restricts[j]->n_allow_list;
        r->deny_list = dp->restricts[j]->deny_list;
        r->n_deny_list = dp->restricts[j]->n_deny_list;
        g->restricts[j] = r;
    }
    g->numeric_restricts = tsr__ar(a, dp->n_numeric_restricts, sizeof *g->numeric_restricts);
    g->n_numeric_restricts = dp->n_numeric_restricts;
    for (size_t j = 0; j < dp->n_numeric_restricts; j++) {
        const Tessera__V1__NumericRestriction *t = dp->numeric_restricts[j];
        g_num *n = tsr__ar(a, 1, sizeof *n);
        GV(index_datapoint__numeric_restriction__init)(n);
        n->namespace_ = t->namespace_;
        n->op = (Google__Cloud__Aiplatform__V1__IndexDatapoint__NumericRestriction__Operator)t->op;
        if (t->value_case == T_VAL(INT)) {
            n->value_case = G_VAL(INT);
            n->value_int = t->value_int;
        } else if (t->value_case == T_VAL(FLOAT)) {
            n->value_case = G_VAL(FLOAT);
            n->value_float = t->value_float;
        } else if (t->value_case == T_VAL(DOUBLE)) {
            n->value_case = G_VAL(DOUBLE);
            n->value_double = t->value_double;
        }
        g->numeric_restricts[j] = n;
    }
    if (dp->crowding_tag) {
        g_tag *t = tsr__ar(a, 1, sizeof *t);
        GV(index_datapoint__crowding_tag__init)(t);
        t->crowding_attribute = dp->crowding_tag->crowding_attribute;
        g->crowding_tag = t;
    }
    g->embedding_metadata = dp->embedding_metadata;
    return g;
}

static void resp_to_vertex(tsr__arena *a, const Tessera__V1__FindNeighborsResponse *t, g_fn_resp *g)
{
    GV(find_neighbors_response__init)(g);
    g->nearest_neighbors = tsr__ar(a, t->n_nearest_neighbors, sizeof *g->nearest_neighbors);
    g->n_nearest_neighbors = t->n_nearest_neighbors;
    for (size_t i = 0; i < t->n_nearest_neighbors; i++) {
        const Tessera__V1__FindNeighborsResponse__NearestNeighbors *tn = t->nearest_neighbors[i];
        g_nn *nn = tsr__ar(a, 1, sizeof *nn);
        GV(find_neighbors_response__nearest_neighbors__init)(nn);
        nn->id = tn->id;
        nn->neighbors = tsr__ar(a, tn->n_neighbors, sizeof *nn->neighbors);
        nn->n_neighbors = tn->n_neighbors;
        for (size_t k = 0; k < tn->n_neighbors; k++) {
            g_neighbor *v = tsr__ar(a, 1, sizeof *v);
            GV(find_neighbors_response__neighbor__init)(v);
            v->datapoint = dp_to_vertex(a, tn->neighbors[k]->datapoint);
            v->distance = tn->neighbors[k]->distance;
            v->sparse_distance = tn->neighbors[k]->sparse_distance;
            nn->neighbors[k] = v;
        }
        g->nearest_neighbors[i] = nn;
    }
}

/* ---------------------------------------------------------------- handlers */

TSR_RPC_HANDLER(h_find_neighbors, g_fn_req, g_fn_resp)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    tsr__vertex_call *k = tsr__vertex_call_new(ctx);
    if (!k)
        return tsr_err(err, TSR_ELIMIT, "FindNeighborsRequest: out of memory");
    int rc = check_names(c, rq->index_endpoint, rq->deployed_index_id, err);
    if (rc)
        return rc;
    tsr__arena *a = tsr__vertex_call_arena(k);
    Tessera__V1__FindNeighborsRequest trq;
    req_to_tessera(a, rq, &trq);
    Tessera__V1__FindNeighborsResponse *fn = NULL;
    rc = tsr__coord_find_neighbors(c, &trq, tsr_rpc_ctx_remaining_ms(ctx), &fn, err);
    tsr__vertex_keep_fn(k, fn);
    if (rc)
        return rc;
    resp_to_vertex(a, fn, resp);
    return 0;
}

TSR_RPC_HANDLER(h_read, g_rd_req, g_rd_resp)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    tsr__vertex_call *k = tsr__vertex_call_new(ctx);
    if (!k)
        return tsr_err(err, TSR_ELIMIT, "ReadIndexDatapointsRequest: out of memory");
    int rc = check_names(c, rq->index_endpoint, rq->deployed_index_id, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < rq->n_ids; i++)
        if (!rq->ids[i][0])
            return tsr_err(err, TSR_EINVAL, "ids[%zu] is empty", i);
    Tessera__V1__ReadIndexDatapointsResponse *rd = NULL;
    rc = tsr__coord_read(c, rq->ids, rq->n_ids, tsr_rpc_ctx_remaining_ms(ctx), &rd, err);
    tsr__vertex_keep_rd(k, rd);
    if (rc)
        return rc;
    tsr__arena *a = tsr__vertex_call_arena(k);
    resp->datapoints = tsr__ar(a, rd->n_datapoints, sizeof *resp->datapoints);
    resp->n_datapoints = rd->n_datapoints;
    for (size_t i = 0; i < rd->n_datapoints; i++)
        resp->datapoints[i] = dp_to_vertex(a, rd->datapoints[i]);
    return 0;
}

/* Both TSR_RPC_LONG (they block on the core's search and read); FindNeighbors' request
 * nests (embedding_metadata): checked, found from its descriptor. */
const tsr_rpc_method tsr__vertex_v1_methods[] = {
    {TSR_VERTEX_V1_SVC "FindNeighbors", &GV(find_neighbors_request__descriptor),
     &GV(find_neighbors_response__descriptor), h_find_neighbors, NULL, TSR_RPC_LONG, 0},
    {TSR_VERTEX_V1_SVC "ReadIndexDatapoints", &GV(read_index_datapoints_request__descriptor),
     &GV(read_index_datapoints_response__descriptor), h_read, NULL, TSR_RPC_LONG, 0},
};
const size_t tsr__vertex_v1_nmethods =
    sizeof tsr__vertex_v1_methods / sizeof tsr__vertex_v1_methods[0];

/* ctx: the method's full name (static storage). */
int tsr__vertex_v1_rpc_unimplemented(void *ctx, const uint8_t *req, size_t len,
                                     tsr_rpc_reply *r)
{
    const char *method = ctx;
    return tsr_rpc_reply_error(r, TSR_RPC_UNIMPLEMENTED, "%s is not served by Tessera yet: "
                               "load and replace data with tessera.v1.VectorSearch/UpdateIndex "
                               "(a batch folder; `tessera update`), read stats with "
                               "tessera.v1.VectorSearch/GetIndexStats; "
                               "google.cloud.aiplatform.v1.MatchService (FindNeighbors, "
                               "ReadIndexDatapoints) and IndexService UpdateIndex, GetIndex, "
                               "UpsertDatapoints and RemoveDatapoints are served "
                               "(docs/vertex-compat.md)", method);
}
