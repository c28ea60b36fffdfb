/*
 * vertex — google.cloud.aiplatform.container.v1.MatchService on the coordinator: Match,
 * BatchMatch and BatchGetEmbeddings, the gRPC API Vertex AI Vector Search serves on a
 * deployed index's private endpoint, so that client code written for Vertex works against
 * Tessera by changing the endpoint (docs/vertex-compat.md).
 *
 * Nothing here searches: every MatchRequest is validated with Vertex's field names,
 * translated into a tessera.v1 FindNeighborsRequest.Query and answered by the coordinator's
 * own query path (tsr__coord_find_neighbors: fan-out, exact merge, crowding, filters, RRF,
 * re-rank), and BatchGetEmbeddings / embedding_id go through tsr__coord_read. The replies
 * borrow their strings and arrays from those responses, which stay alive until the reply
 * is packed.
 *
 * DESIGN (threads): the handlers run on the rpc worker pool (TSR_RPC_LONG, they fan out)
 * and share nothing but the coordinator, which they only read through the query path.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "coord.h"
#include "frontend.h"
#include "google/cloud/aiplatform/container/v1/match_service.pb-c.h"
#include "core/hash.h"
#include "core/mem.h"

typedef Google__Cloud__Aiplatform__Container__V1__MatchRequest vx_match_req;
typedef Google__Cloud__Aiplatform__Container__V1__MatchResponse vx_match_resp;
typedef Google__Cloud__Aiplatform__Container__V1__MatchResponse__Neighbor vx_neighbor;
typedef Google__Cloud__Aiplatform__Container__V1__Embedding vx_embedding;
typedef Google__Cloud__Aiplatform__Container__V1__Namespace vx_namespace;
typedef Google__Cloud__Aiplatform__Container__V1__NumericNamespace vx_numeric;
typedef Google__Cloud__Aiplatform__Container__V1__SparseEmbedding vx_sparse;
typedef Google__Cloud__Aiplatform__Container__V1__BatchMatchRequest vx_batch_req;
typedef Google__Cloud__Aiplatform__Container__V1__BatchMatchRequest__BatchMatchRequestPerIndex
    vx_batch_req_idx;
typedef Google__Cloud__Aiplatform__Container__V1__BatchMatchResponse vx_batch_resp;
typedef Google__Cloud__Aiplatform__Container__V1__BatchMatchResponse__BatchMatchResponsePerIndex
    vx_batch_resp_idx;
typedef Google__Cloud__Aiplatform__Container__V1__BatchGetEmbeddingsRequest vx_get_req;
typedef Google__Cloud__Aiplatform__Container__V1__BatchGetEmbeddingsResponse vx_get_resp;

#define VX(x) google__cloud__aiplatform__container__v1__##x
#define VX_OP(x) GOOGLE__CLOUD__AIPLATFORM__CONTAINER__V1__NUMERIC_NAMESPACE__OPERATOR__##x
#define VX_VAL(x) GOOGLE__CLOUD__AIPLATFORM__CONTAINER__V1__NUMERIC_NAMESPACE__VALUE_VALUE_##x

/* BatchMatch bounds (the work and the reply grow with them; protobuf-c has already
 * allocated the request, these keep the rest proportionate). */
#define VX_MAX_INDEXES 1000
#define VX_MAX_BATCH 10000

/* ---------------------------------------------------------------- the call's storage */

struct tsr__vertex_call {
    tsr__arena a;
    Tessera__V1__FindNeighborsResponse **fn;
    size_t nfn, capfn;
    Tessera__V1__ReadIndexDatapointsResponse **rd;
    size_t nrd, caprd;
};

static void call_free(void *p)
{
    tsr__vertex_call *k = p;
    tsr__ar_free(&k->a);
    for (size_t i = 0; i < k->nfn; i++)
        tsr__coord_response_free(k->fn[i]);
    for (size_t i = 0; i < k->nrd; i++)
        tsr__coord_read_free(k->rd[i]);
    free(k->fn);
    free(k->rd);
    free(k);
}

tsr__vertex_call *tsr__vertex_call_new(tsr_rpc_ctx *ctx)
{
    tsr__vertex_call *k = tsr_try_calloc(1, sizeof *k);
    if (k)
        tsr_rpc_ctx_defer(ctx, call_free, k);
    return k;
}

tsr__arena *tsr__vertex_call_arena(tsr__vertex_call *k)
{
    return &k->a;
}

void tsr__vertex_keep_fn(tsr__vertex_call *k, Tessera__V1__FindNeighborsResponse *r)
{
    if (k->nfn == k->capfn)
        k->fn = tsr_xrealloc(k->fn, (k->capfn = k->capfn ? k->capfn * 2 : 8) * sizeof *k->fn);
    k->fn[k->nfn++] = r;
}

void tsr__vertex_keep_rd(tsr__vertex_call *k, Tessera__V1__ReadIndexDatapointsResponse *r)
{
    if (k->nrd == k->caprd)
        k->rd = tsr_xrealloc(k->rd, (k->caprd = k->caprd ? k->caprd * 2 : 8) * sizeof *k->rd);
    k->rd[k->nrd++] = r;
}

/* ---------------------------------------------------------------- crowding attribute */

int tsr__vertex_resource_ok(const char *s, const char *kind)
{
    const char *const lit[] = {"projects/", "locations/", kind};
    for (size_t i = 0; i < 3; i++) {
        size_t l = strlen(lit[i]);
        if (strncmp(s, lit[i], l) != 0)
            return 0;
        s += l;
        const char *slash = strchr(s, '/');
        if (*s == 0 || *s == '/' || (i < 2 && !slash) || (i == 2 && slash))
            return 0;
        s = i < 2 ? slash + 1 : s;
    }
    return 1;
}

int64_t tsr__vertex_crowding_attribute(const char *tag)
{
    if (!tag || !tag[0])
        return 0;
    /* canonical decimal int64: optional '-', no leading zeros, no '+', no spaces, no "-0" */
    const char *p = tag;
    if (*p == '-')
        p++;
    int canon = *p >= '0' && *p <= '9' && !(p[0] == '0' && (p[1] || p != tag)) &&
                strlen(p) <= 19;
    for (const char *q = p; canon && *q; q++)
        canon = *q >= '0' && *q <= '9';
    if (canon) {
        errno = 0;
        char *end;
        long long v = strtoll(tag, &end, 10);
        if (errno == 0 && *end == 0)
            return (int64_t)v;
    }
    /* any other tag: FNV-1a 64 of its bytes with the top bit cleared (stable, >= 0) */
    uint64_t h = tsr_fnv1a64_str(TSR_FNV1A64_BASIS, tag); /* sent to clients: core/hash.h */
    return (int64_t)(h & 0x7fffffffffffffffull);
}

/* ---------------------------------------------------------------- validation */

int tsr__vertex_check_index(const tsr__coord *c, const char *id, const char *where,
                            tsr_error *err)
{
    const char *want = c->deployed_index_id;
    if (!want || !want[0] || !id || !id[0] || strcmp(id, want) == 0)
        return 0;
    return tsr_err(err, TSR_ENOTFOUND, "%sdeployed_index_id \"%s\" is not served "
                "here (this cluster serves \"%s\")", where, id, want);
}

/* where: "" or "requests[i].requests[j]: " to prefix messages with. */
static int check_match(const tsr__coord *c, const vx_match_req *m, const char *where,
                       tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    const vx_sparse *sp = m->sparse_embedding;
    if (sp && sp->n_float_val != sp->n_dimension)
        return tsr_err(err, TSR_EINVAL, "%ssparse_embedding has %zu float_val and %zu dimension",
                    where, sp->n_float_val, sp->n_dimension);
    size_t nsp = sp ? sp->n_float_val : 0;
    int has_id = m->embedding_id && m->embedding_id[0];
    if (m->n_float_val == 0 && !has_id && nsp == 0)
        return tsr_err(err, TSR_EINVAL, "%sempty query: float_val, embedding_id and "
                    "sparse_embedding are all empty", where);
    if (m->n_float_val && m->n_float_val != (size_t)cfg->dimensions)
        return tsr_err(err, TSR_EINVAL, "%sfloat_val has %zu values, the index has dimensions "
                    "%d", where, m->n_float_val, cfg->dimensions);
    for (size_t j = 0; j < m->n_float_val; j++)
        if (!isfinite(m->float_val[j]))
            return tsr_err(err, TSR_EINVAL, "%sfloat_val[%zu] is not finite", where, j);
    for (size_t j = 0; j < nsp; j++)
        if (!isfinite(sp->float_val[j]))
            return tsr_err(err, TSR_EINVAL, "%ssparse_embedding.float_val[%zu] is not finite",
                        where, j);
    if (m->num_neighbors < 0 || m->num_neighbors > cfg->max_k)
        return tsr_err(err, TSR_EINVAL, "%snum_neighbors = %d, expected 1..%d (0 = default %d)",
                    where, m->num_neighbors, cfg->max_k, cfg->default_k);
    if (m->per_crowding_attribute_num_neighbors < 0)
        return tsr_err(err, TSR_EINVAL, "%sper_crowding_attribute_num_neighbors = %d is "
                    "negative", where, m->per_crowding_attribute_num_neighbors);
    if (m->approx_num_neighbors < 0 || m->approx_num_neighbors > TSR_COORD_MAX_CANDIDATES)
        return tsr_err(err, TSR_EINVAL, "%sapprox_num_neighbors = %d, expected 0..%d", where,
                    m->approx_num_neighbors, TSR_COORD_MAX_CANDIDATES);
    if (m->leaf_nodes_to_search_percent_override < 0 ||
        m->leaf_nodes_to_search_percent_override > 100)
        return tsr_err(err, TSR_EINVAL, "%sleaf_nodes_to_search_percent_override = %d, expected "
                    "0..100", where, m->leaf_nodes_to_search_percent_override);
    double f = m->fraction_leaf_nodes_to_search_override;
    if (!(f >= 0.0 && f <= 1.0))
        return tsr_err(err, TSR_EINVAL, "%sfraction_leaf_nodes_to_search_override = %g, "
                    "expected (0, 1] (0 = the index default)", where, f);
    if (m->ranking_case == GOOGLE__CLOUD__AIPLATFORM__CONTAINER__V1__MATCH_REQUEST__RANKING_RRF) {
        double a = m->rrf ? m->rrf->alpha : 1.0;
        if (!(a >= 0.0 && a <= 1.0))
            return tsr_err(err, TSR_EINVAL, "%srrf.alpha = %g, expected 0..1", where, a);
    }
    for (size_t j = 0; j < m->n_restricts; j++)
        if (!m->restricts[j]->name || !m->restricts[j]->name[0])
            return tsr_err(err, TSR_EINVAL, "%srestricts[%zu].name is empty", where, j);
    for (size_t j = 0; j < m->n_numeric_restricts; j++) {
        const vx_numeric *n = m->numeric_restricts[j];
        if (!n->name || !n->name[0])
            return tsr_err(err, TSR_EINVAL, "%snumeric_restricts[%zu].name is empty", where, j);
        if (n->value_case != VX_VAL(INT) && n->value_case != VX_VAL(FLOAT) &&
            n->value_case != VX_VAL(DOUBLE))
            return tsr_err(err, TSR_EINVAL, "%snumeric_restricts[%zu] (%s) has no value_int/"
                        "value_float/value_double", where, j, n->name);
        switch (n->op) {
        case VX_OP(LESS): case VX_OP(LESS_EQUAL): case VX_OP(EQUAL):
        case VX_OP(GREATER_EQUAL): case VX_OP(GREATER): case VX_OP(NOT_EQUAL):
            break;
        case VX_OP(OPERATOR_UNSPECIFIED):
            return tsr_err(err, TSR_EINVAL, "%snumeric_restricts[%zu] (%s): op is "
                        "OPERATOR_UNSPECIFIED (expected LESS, LESS_EQUAL, EQUAL, GREATER_EQUAL, "
                        "GREATER or NOT_EQUAL)", where, j, n->name);
        default:
            return tsr_err(err, TSR_EINVAL, "%snumeric_restricts[%zu] (%s): unknown op %d",
                        where, j, n->name, (int)n->op);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- request translation */

static Tessera__V1__NumericRestriction__Operator map_op(int op)
{
    switch (op) {
    case VX_OP(LESS): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__LESS;
    case VX_OP(LESS_EQUAL): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__LESS_EQUAL;
    case VX_OP(EQUAL): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__EQUAL;
    case VX_OP(GREATER_EQUAL): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__GREATER_EQUAL;
    case VX_OP(GREATER): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__GREATER;
    case VX_OP(NOT_EQUAL): return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__NOT_EQUAL;
    default: return TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__OPERATOR_UNSPECIFIED;
    }
}

/* Fills q (borrowing from m and from stored, the datapoint of embedding_id or NULL). */
static void to_query(tsr__arena *a, const vx_match_req *m, const Tessera__V1__IndexDatapoint *stored,
                     Tessera__V1__FindNeighborsRequest__Query *q)
{
    tessera__v1__find_neighbors_request__query__init(q);
    Tessera__V1__IndexDatapoint *dp = tsr__ar(a, 1, sizeof *dp);
    tessera__v1__index_datapoint__init(dp);
    q->datapoint = dp;
    if (m->n_float_val) {
        dp->feature_vector = m->float_val;
        dp->n_feature_vector = m->n_float_val;
    } else if (stored) {
        dp->feature_vector = stored->feature_vector;
        dp->n_feature_vector = stored->n_feature_vector;
    }
    if (m->sparse_embedding && m->sparse_embedding->n_float_val) {
        Tessera__V1__SparseEmbedding *se = tsr__ar(a, 1, sizeof *se);
        tessera__v1__sparse_embedding__init(se);
        se->values = m->sparse_embedding->float_val;
        se->n_values = m->sparse_embedding->n_float_val;
        se->dimensions = m->sparse_embedding->dimension;
        se->n_dimensions = m->sparse_embedding->n_dimension;
        dp->sparse_embedding = se;
    }
    if (m->n_restricts) {
        dp->restricts = tsr__ar(a, m->n_restricts, sizeof *dp->restricts);
        dp->n_restricts = m->n_restricts;
        for (size_t j = 0; j < m->n_restricts; j++) {
            const vx_namespace *ns = m->restricts[j];
            Tessera__V1__Restriction *r = tsr__ar(a, 1, sizeof *r);
            tessera__v1__restriction__init(r);
            r->namespace_ = ns->name;
            r->allow_list = ns->allow_tokens;
            r->n_allow_list = ns->n_allow_tokens;
            r->deny_list = ns->deny_tokens;
            r->n_deny_list = ns->n_deny_tokens;
            dp->restricts[j] = r;
        }
    }
    if (m->n_numeric_restricts) {
        dp->numeric_restricts = tsr__ar(a, m->n_numeric_restricts, sizeof *dp->numeric_restricts);
        dp->n_numeric_restricts = m->n_numeric_restricts;
        for (size_t j = 0; j < m->n_numeric_restricts; j++) {
            const vx_numeric *n = m->numeric_restricts[j];
            Tessera__V1__NumericRestriction *r = tsr__ar(a, 1, sizeof *r);
            tessera__v1__numeric_restriction__init(r);
            r->namespace_ = n->name;
            r->op = map_op(n->op);
            if (n->value_case == VX_VAL(INT)) {
                r->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT;
                r->value_int = n->value_int;
            } else if (n->value_case == VX_VAL(FLOAT)) {
                r->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT;
                r->value_float = n->value_float;
            } else {
                r->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE;
                r->value_double = n->value_double;
            }
            dp->numeric_restricts[j] = r;
        }
    }
    q->neighbor_count = m->num_neighbors;
    q->per_crowding_attribute_neighbor_count = m->per_crowding_attribute_num_neighbors;
    /* Vertex: 0 = the index's approximateNeighborsCount (here the config's
     * approximate_neighbor_count), so only a positive count is passed on */
    if (m->approx_num_neighbors > 0) {
        q->approximate_case =
            TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__APPROXIMATE_APPROXIMATE_NEIGHBOR_COUNT;
        q->approximate_neighbor_count = m->approx_num_neighbors;
    }
    /* the fraction wins; the deprecated percent is the fallback */
    if (m->fraction_leaf_nodes_to_search_override > 0)
        q->fraction_leaf_nodes_to_search_override = m->fraction_leaf_nodes_to_search_override;
    else if (m->leaf_nodes_to_search_percent_override > 0)
        q->fraction_leaf_nodes_to_search_override =
            m->leaf_nodes_to_search_percent_override / 100.0;
    if (m->ranking_case == GOOGLE__CLOUD__AIPLATFORM__CONTAINER__V1__MATCH_REQUEST__RANKING_RRF) {
        Tessera__V1__FindNeighborsRequest__Query__RRF *rrf = tsr__ar(a, 1, sizeof *rrf);
        tessera__v1__find_neighbors_request__query__rrf__init(rrf);
        rrf->alpha = m->rrf ? m->rrf->alpha : 1.0f;
        q->ranking_case = TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF;
        q->rrf = rrf;
    }
}

/* ---------------------------------------------------------------- response translation */

static const char *tag_of(const Tessera__V1__IndexDatapoint *dp)
{
    return dp && dp->crowding_tag ? dp->crowding_tag->crowding_attribute : NULL;
}

/* An Embedding borrowing from dp. */
static vx_embedding *to_embedding(tsr__arena *a, const Tessera__V1__IndexDatapoint *dp)
{
    vx_embedding *e = tsr__ar(a, 1, sizeof *e);
    VX(embedding__init)(e);
    e->id = dp->datapoint_id;
    e->float_val = dp->feature_vector;
    e->n_float_val = dp->n_feature_vector;
    e->crowding_attribute = tsr__vertex_crowding_attribute(tag_of(dp));
    e->embedding_metadata = dp->embedding_metadata; /* the same google.protobuf.Struct */
    if (dp->sparse_embedding && dp->sparse_embedding->n_values) {
        vx_sparse *s = tsr__ar(a, 1, sizeof *s);
        VX(sparse_embedding__init)(s);
        s->float_val = dp->sparse_embedding->values;
        s->n_float_val = dp->sparse_embedding->n_values;
        s->dimension = dp->sparse_embedding->dimensions;
        s->n_dimension = dp->sparse_embedding->n_dimensions;
        e->sparse_embedding = s;
    }
    if (dp->n_restricts) {
        e->restricts = tsr__ar(a, dp->n_restricts, sizeof *e->restricts);
        e->n_restricts = dp->n_restricts;
        for (size_t j = 0; j < dp->n_restricts; j++) {
            const Tessera__V1__Restriction *r = dp->restricts[j];
            vx_namespace *ns = tsr__ar(a, 1, sizeof *ns);
            VX(namespace__init)(ns);
            ns->name = r->namespace_;
            ns->allow_tokens = r->allow_list;
            ns->n_allow_tokens = r->n_allow_list;
            ns->deny_tokens = r->deny_list;
            ns->n_deny_tokens = r->n_deny_list;
            e->restricts[j] = ns;
        }
    }
    if (dp->n_numeric_restricts) {
        e->numeric_restricts = tsr__ar(a, dp->n_numeric_restricts, sizeof *e->numeric_restricts);
        for (size_t j = 0; j < dp->n_numeric_restricts; j++) {
            const Tessera__V1__NumericRestriction *r = dp->numeric_restricts[j];
            vx_numeric *n = tsr__ar(a, 1, sizeof *n);
            VX(numeric_namespace__init)(n);
            n->name = r->namespace_;
            if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT) {
                n->value_case = VX_VAL(INT);
                n->value_int = r->value_int;
            } else if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT) {
                n->value_case = VX_VAL(FLOAT);
                n->value_float = r->value_float;
            } else if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE) {
                n->value_case = VX_VAL(DOUBLE);
                n->value_double = r->value_double;
            }
            e->numeric_restricts[e->n_numeric_restricts++] = n;
        }
    }
    return e;
}

static vx_match_resp *to_match_resp(tsr__arena *a,
                                    const Tessera__V1__FindNeighborsResponse__NearestNeighbors *nn,
                                    int embeddings)
{
    vx_match_resp *mr = tsr__ar(a, 1, sizeof *mr);
    VX(match_response__init)(mr);
    size_t n = nn ? nn->n_neighbors : 0;
    mr->neighbor = tsr__ar(a, n, sizeof *mr->neighbor);
    mr->n_neighbor = n;
    if (embeddings)
        mr->embeddings = tsr__ar(a, n, sizeof *mr->embeddings);
    for (size_t t = 0; t < n; t++) {
        const Tessera__V1__FindNeighborsResponse__Neighbor *nb = nn->neighbors[t];
        vx_neighbor *v = tsr__ar(a, 1, sizeof *v);
        VX(match_response__neighbor__init)(v);
        if (nb->datapoint)
            v->id = nb->datapoint->datapoint_id;
        v->distance = nb->distance;
        v->sparse_distance = nb->sparse_distance;
        v->crowding_attribute = tsr__vertex_crowding_attribute(tag_of(nb->datapoint));
        mr->neighbor[t] = v;
        if (embeddings && nb->datapoint)
            mr->embeddings[mr->n_embeddings++] = to_embedding(a, nb->datapoint);
    }
    return mr;
}

/* ---------------------------------------------------------------- one index's requests */

static int64_t remaining(tsr_rpc_reply *r)
{
    return tsr_rpc_reply_remaining_ms(r);
}

/* Answers n MatchRequests against the index: *out gets n MatchResponses (allocated in call,
 * borrowing from responses kept in call). prefix(i) names request i in messages: "" for
 * Match, "requests[k].requests[i]: " for BatchMatch (index k; k < 0 = Match). */
static int answer(tsr__coord *c, tsr__vertex_call *call, const vx_match_req *const *ms,
                  size_t n, long k, tsr_rpc_reply *r, vx_match_resp ***out, tsr_error *err)
{
    tsr__arena *a = &call->a;
    char where[64] = "";
    for (size_t i = 0; i < n; i++) {
        if (k >= 0)
            snprintf(where, sizeof where, "requests[%ld].requests[%zu]: ", k, i);
        int rc = check_match(c, ms[i], where, err);
        if (rc)
            return rc;
    }
    /* embedding_id: one read for every request that needs a stored vector */
    const Tessera__V1__IndexDatapoint **stored = tsr__ar(a, n, sizeof *stored);
    char **ids = tsr__ar(a, n, sizeof *ids);
    size_t *who = tsr__ar(a, n, sizeof *who), nid = 0;
    for (size_t i = 0; i < n; i++)
        if (ms[i]->n_float_val == 0 && ms[i]->embedding_id && ms[i]->embedding_id[0]) {
            who[nid] = i;
            ids[nid++] = ms[i]->embedding_id;
        }
    if (nid) {
        Tessera__V1__ReadIndexDatapointsResponse *rd = NULL;
        int rc = tsr__coord_read(c, ids, nid, remaining(r), &rd, err);
        if (rc)
            return rc;
        tsr__vertex_keep_rd(call, rd);
        /* found ids come back in request order, unknown ones omitted */
        size_t p = 0;
        for (size_t j = 0; j < nid; j++) {
            if (p < rd->n_datapoints && strcmp(rd->datapoints[p]->datapoint_id, ids[j]) == 0)
                stored[who[j]] = rd->datapoints[p++];
            if (k >= 0)
                snprintf(where, sizeof where, "requests[%ld].requests[%zu]: ", k, who[j]);
            if (!stored[who[j]])
                return tsr_err(err, TSR_ENOTFOUND, "%sembedding_id \"%s\" is not in "
                            "the index", where, ids[j]);
            if (stored[who[j]]->n_feature_vector == 0)
                return tsr_err(err, TSR_EINVAL, "%sembedding_id \"%s\" is "
                            "a sparse-only datapoint: it has no dense embedding to query with",
                            where, ids[j]);
        }
    }
    *out = tsr__ar(a, n, sizeof **out);
    size_t chunk = c->cfg.max_queries > 0 ? (size_t)c->cfg.max_queries : 1;
    for (size_t s = 0; s < n; s += chunk) {
        size_t m = n - s < chunk ? n - s : chunk;
        Tessera__V1__FindNeighborsRequest rq = TESSERA__V1__FIND_NEIGHBORS_REQUEST__INIT;
        rq.queries = tsr__ar(a, m, sizeof *rq.queries);
        rq.n_queries = m;
        for (size_t i = 0; i < m; i++) {
            rq.queries[i] = tsr__ar(a, 1, sizeof **rq.queries);
            to_query(a, ms[s + i], stored[s + i], rq.queries[i]);
            rq.return_full_datapoint |= ms[s + i]->embedding_enabled;
        }
        int64_t left = remaining(r);
        if (left <= 0)
            return tsr_err(err, TSR_ETIMEOUT, "deadline exceeded before "
                        "the search");
        Tessera__V1__FindNeighborsResponse *fr = NULL;
        int rc = tsr__coord_find_neighbors(c, &rq, left, &fr, err);
        if (rc)
            return rc;
        tsr__vertex_keep_fn(call, fr);
        for (size_t i = 0; i < m; i++)
            (*out)[s + i] = to_match_resp(a, i < fr->n_nearest_neighbors
                                                 ? fr->nearest_neighbors[i] : NULL,
                                          ms[s + i]->embedding_enabled);
    }
    return 0;
}

/* ---------------------------------------------------------------- handlers */

TSR_RPC_HANDLER(h_match, vx_match_req, vx_match_resp)
{
    (void)resp; /* answer() builds the response in the arena */
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    tsr__vertex_call *call = tsr__vertex_call_new(ctx);
    if (!call)
        return tsr_err(err, TSR_ELIMIT, "MatchRequest: out of memory");
    vx_match_resp **out = NULL;
    int rc = tsr__vertex_check_index(c, rq->deployed_index_id, "", err);
    if (!rc)
        rc = answer(c, call, &rq, 1, -1, tsr_rpc_ctx_reply(ctx), &out, err);
    return rc ? rc : tsr_rpc_ctx_set_resp(ctx, &out[0]->base, NULL);
}

TSR_RPC_HANDLER(h_batch_match, vx_batch_req, vx_batch_resp)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    size_t total = 0;
    for (size_t k = 0; k < rq->n_requests; k++)
        total += rq->requests[k]->n_requests;
    if (rq->n_requests > VX_MAX_INDEXES || total > VX_MAX_BATCH)
        return tsr_err(err, TSR_EINVAL, "BatchMatchRequest: %zu indexes and %zu requests, at "
                       "most %d and %d per call", rq->n_requests, total, VX_MAX_INDEXES,
                       VX_MAX_BATCH);
    tsr__vertex_call *call = tsr__vertex_call_new(ctx);
    if (!call)
        return tsr_err(err, TSR_ELIMIT, "BatchMatchRequest: out of memory");
    tsr__arena *a = &call->a;
    resp->responses = tsr__ar(a, rq->n_requests, sizeof *resp->responses);
    resp->n_responses = rq->n_requests;
    /* one entry per index, in order; a failing index gets its status and no responses,
     * the others are answered as usual */
    for (size_t k = 0; k < rq->n_requests; k++) {
        const vx_batch_req_idx *ix = rq->requests[k];
        vx_batch_resp_idx *o = tsr__ar(a, 1, sizeof *o);
        VX(batch_match_response__batch_match_response_per_index__init)(o);
        o->deployed_index_id = ix->deployed_index_id;
        Google__Rpc__Status *st = tsr__ar(a, 1, sizeof *st);
        google__rpc__status__init(st);
        o->status = st;
        resp->responses[k] = o;
        tsr_error ierr = TSR_ERROR_INIT;
        char where[48];
        snprintf(where, sizeof where, "requests[%zu]: ", k);
        int rc = tsr__vertex_check_index(c, ix->deployed_index_id, where, &ierr);
        vx_match_resp **mr = NULL;
        if (!rc && ix->n_requests)
            rc = answer(c, call, (const vx_match_req *const *)ix->requests, ix->n_requests,
                        (long)k, tsr_rpc_ctx_reply(ctx), &mr, &ierr);
        if (rc) {
            st->code = tsr__coord_status_of(&ierr);
            st->message = strcpy(tsr__ar(a, strlen(ierr.msg) + 1, 1), ierr.msg);
            continue;
        }
        o->responses = mr;
        o->n_responses = mr ? ix->n_requests : 0;
    }
    return 0;
}

TSR_RPC_HANDLER(h_batch_get_embeddings, vx_get_req, vx_get_resp)
{
    tsr__coord *c = tsr_rpc_ctx_app(ctx);
    tsr__vertex_call *call = tsr__vertex_call_new(ctx);
    if (!call)
        return tsr_err(err, TSR_ELIMIT, "BatchGetEmbeddingsRequest: out of memory");
    tsr__arena *a = &call->a;
    int rc = tsr__vertex_check_index(c, rq->deployed_index_id, "", err);
    Tessera__V1__ReadIndexDatapointsResponse *rd = NULL;
    if (!rc)
        rc = tsr__coord_read(c, rq->id, rq->n_id, tsr_rpc_ctx_remaining_ms(ctx), &rd, err);
    if (rc)
        return rc;
    tsr__vertex_keep_rd(call, rd);
    resp->embeddings = tsr__ar(a, rd->n_datapoints, sizeof *resp->embeddings);
    resp->n_embeddings = rd->n_datapoints;
    for (size_t i = 0; i < rd->n_datapoints; i++)
        resp->embeddings[i] = to_embedding(a, rd->datapoints[i]);
    return 0;
}

#define VXD(x) &google__cloud__aiplatform__container__v1__##x##__descriptor

/* All TSR_RPC_LONG (they block on the core's read and search). */
const tsr_rpc_method tsr__vertex_methods[] = {
    {TSR_VERTEX_SVC "Match", VXD(match_request), VXD(match_response), h_match, NULL,
     TSR_RPC_LONG, 0},
    {TSR_VERTEX_SVC "BatchMatch", VXD(batch_match_request), VXD(batch_match_response),
     h_batch_match, NULL, TSR_RPC_LONG, 0},
    {TSR_VERTEX_SVC "BatchGetEmbeddings", VXD(batch_get_embeddings_request),
     VXD(batch_get_embeddings_response), h_batch_get_embeddings, NULL, TSR_RPC_LONG, 0},
};
const size_t tsr__vertex_nmethods = sizeof tsr__vertex_methods / sizeof tsr__vertex_methods[0];
