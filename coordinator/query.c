/*
 * query — the read side of tessera.v1.VectorSearch on the coordinator: FindNeighbors
 * (validate, normalize for COSINE, coarse step with tsr_knn on all centroids, nprobe
 * nearest lists per query, group by shard through the plan, one Shard.Search per shard in
 * parallel with a deadline, merge with the greedy crowding pass, sparse merge, RRF),
 * ReadIndexDatapoints is query_read.c, GetIndexStats the tessera.v1 front end's.
 *
 * Every query of a request is planned on one snapshot, and every ShardQuery names its
 * version, so the whole answer comes from that version (response.version).
 *
 * DESIGN (threads): FindNeighbors runs on the rpc polling thread that received it and
 * never waits for a shard (on a follower with --etcd it waits for the read index before
 * planning: readidx.c, one shared etcd read and at most 1 s for the watch): fnq_plan (validation, coarse step, per-shard requests) runs in the
 * handler, the shard calls go out with tsr__coord_group_fanout_async (tsr_rpc_reply_fanout
 * on the server's own completion queue: retries on other replicas start from the poller
 * that sees an attempt fail), and fnq_finish (merge, reply) runs on the polling thread
 * that completes the last shard call. The state between the two (fn_async) is owned by
 * whichever of those threads runs; they never overlap. The blocking form
 * (tsr__coord_find_neighbors, for MatchService on the worker pool) is the same three steps
 * with tsr__coord_group_fanout. ReadIndexDatapoints and GetIndexStats block (TSR_RPC_LONG,
 * worker pool). All read only the immutable snapshot they took a reference on; no lock is
 * held across an RPC.
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
#include "query_ns.h"

/* the query set approximate_neighbor_count (a one-field oneof: proto3 presence) */
#define TSR_APPROX_SET TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__APPROXIMATE_APPROXIMATE_NEIGHBOR_COUNT

/* protobuf-c allocator on an arena (unpacked messages are then freed with the arena, never
 * with free_unpacked). */
static void *pb_ar_alloc(void *ud, size_t size)
{
    return tsr__ar(ud, 1, size);
}

static void pb_ar_free(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

/* The response plus everything it borrows. resp must stay the first member. */
typedef struct fn_out {
    Tessera__V1__FindNeighborsResponse resp;
    tsr__arena a;
    ProtobufCAllocator pba; /* on a: the shard replies are unpacked into the tsr__arena */
    ProtobufCMessage **shard_resp;
    size_t nshards;
} fn_out;

void tsr__coord_response_free(Tessera__V1__FindNeighborsResponse *r)
{
    if (!r)
        return;
    fn_out *o = (fn_out *)r;
    tsr__ar_free(&o->a); /* shard_resp and the unpacked replies included */
    free(o);
}

/* ---------------------------------------------------------------- tag interning */

typedef struct tagmap {
    const char **key;
    uint32_t *val;
    size_t mask;
    uint32_t n;
} tagmap;

static void tagmap_init(tagmap *m, size_t expect, tsr__arena *a)
{
    size_t ns = 16;
    while (ns < expect * 2)
        ns *= 2;
    m->key = tsr__ar(a, ns, sizeof *m->key);
    m->val = tsr__ar(a, ns, sizeof *m->val);
    m->mask = ns - 1;
    m->n = 0;
}

static uint32_t tag_id(tagmap *m, const char *s)
{
    if (!s || !s[0])
        return TSR_TOPK_NOTAG;
    size_t h = tsr__hash_str(s) & m->mask;
    while (m->key[h]) {
        if (strcmp(m->key[h], s) == 0)
            return m->val[h];
        h = (h + 1) & m->mask;
    }
    m->key[h] = s;
    m->val[h] = m->n++;
    return m->val[h];
}

/* ---------------------------------------------------------------- candidates lookup */

typedef struct cand {
    int64_t label;
    uint32_t shard, idx;
    int sparse;
} cand;

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return x->sparse - y->sparse;
}

static const cand *find_cand(const cand *cs, size_t n, int64_t label, int sparse)
{
    cand key = {label, 0, 0, sparse};
    return bsearch(&key, cs, n, sizeof *cs, cmp_cand);
}

/* ---------------------------------------------------------------- validation */

static int check_query(const tsr__coord *c, const Tessera__V1__FindNeighborsRequest__Query *q,
                       size_t i, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    const Tessera__V1__IndexDatapoint *dp = q->datapoint;
    if (!dp)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: datapoint is missing", i);
    size_t nsp = dp->sparse_embedding ? dp->sparse_embedding->n_values : 0;
    if (dp->sparse_embedding &&
        dp->sparse_embedding->n_values != dp->sparse_embedding->n_dimensions)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: sparse_embedding has %zu values and %zu "
                   "dimensions", i, dp->sparse_embedding->n_values,
                   dp->sparse_embedding->n_dimensions);
    if (dp->n_feature_vector == 0 && nsp == 0)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: empty query: no feature_vector and no "
                   "sparse_embedding", i);
    if (dp->n_feature_vector && dp->n_feature_vector != (size_t)cfg->dimensions)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: feature_vector has %zu values, the index "
                   "has dimensions %d", i, dp->n_feature_vector, cfg->dimensions);
    for (size_t j = 0; j < dp->n_feature_vector; j++)
        if (!isfinite(dp->feature_vector[j]))
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: feature_vector[%zu] is not finite", i, j);
    for (size_t j = 0; j < nsp; j++)
        if (!isfinite(dp->sparse_embedding->values[j]))
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: sparse_embedding.values[%zu] is not "
                       "finite", i, j);
    if (q->neighbor_count < 0 || q->neighbor_count > cfg->max_k)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: neighbor_count = %d, expected 1..%d (max_k; "
                   "0 = default %d)", i, q->neighbor_count, cfg->max_k, cfg->default_k);
    if (q->per_crowding_attribute_neighbor_count < 0)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: per_crowding_attribute_neighbor_count = %d "
                   "is negative", i, q->per_crowding_attribute_neighbor_count);
    if (q->approximate_neighbor_count < 0 || q->approximate_neighbor_count > TSR_COORD_MAX_CANDIDATES)
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: approximate_neighbor_count = %d, expected "
                   "0..%d", i, q->approximate_neighbor_count, TSR_COORD_MAX_CANDIDATES);
    double f = q->fraction_leaf_nodes_to_search_override;
    if (!(f >= 0.0 && f <= 1.0))
        return tsr_err(err, TSR_EINVAL, "queries[%zu]: fraction_leaf_nodes_to_search_override = "
                   "%g, expected (0, 1] (0 = the index default)", i, f);
    if (q->ranking_case == TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF) {
        double a = q->rrf ? q->rrf->alpha : 1.0;
        if (!(a >= 0.0 && a <= 1.0))
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: rrf.alpha = %g, expected 0..1", i, a);
    }
    for (size_t j = 0; j < dp->n_restricts; j++)
        if (!dp->restricts[j]->namespace_ || !dp->restricts[j]->namespace_[0])
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: restricts[%zu].namespace is empty", i, j);
    for (size_t j = 0; j < dp->n_numeric_restricts; j++) {
        const Tessera__V1__NumericRestriction *n = dp->numeric_restricts[j];
        if (!n->namespace_ || !n->namespace_[0])
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: numeric_restricts[%zu].namespace is "
                       "empty", i, j);
        if (n->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE__NOT_SET)
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: numeric_restricts[%zu] (%s) has no "
                       "value_int/value_float/value_double", i, j, n->namespace_);
        if (n->op == TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__OPERATOR_UNSPECIFIED)
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: numeric_restricts[%zu] (%s): op is "
                       "unset (LESS, LESS_EQUAL, EQUAL, GREATER_EQUAL, GREATER, NOT_EQUAL)", i, j,
                       n->namespace_);
        if ((int)n->op < 1 || (int)n->op > 6)
            return tsr_err(err, TSR_EINVAL, "queries[%zu]: numeric_restricts[%zu]: unknown op %d",
                       i, j, (int)n->op);
    }
    return 0;
}

/* Restricts of one query with repeated namespaces merged (the shard wants one entry per
 * namespace). Strings are borrowed from the request. */
static void merge_restricts(const Tessera__V1__IndexDatapoint *dp, tsr__arena *a,
                            Tessera__V1__Restriction ***out, size_t *nout)
{
    size_t n = dp->n_restricts, m = 0;
    *out = NULL;
    *nout = 0;
    if (!n)
        return;
    Tessera__V1__Restriction **r = tsr__ar(a, n, sizeof *r);
    for (size_t i = 0; i < n; i++) {
        const Tessera__V1__Restriction *x = dp->restricts[i];
        size_t j = 0;
        while (j < m && strcmp(r[j]->namespace_, x->namespace_) != 0)
            j++;
        if (j == m) {
            /* count the totals of this namespace */
            size_t na = 0, nd = 0;
            for (size_t k = i; k < n; k++)
                if (strcmp(dp->restricts[k]->namespace_, x->namespace_) == 0) {
                    na += dp->restricts[k]->n_allow_list;
                    nd += dp->restricts[k]->n_deny_list;
                }
            r[m] = tsr__ar(a, 1, sizeof **r);
            tessera__v1__restriction__init(r[m]);
            r[m]->namespace_ = x->namespace_;
            r[m]->allow_list = tsr__ar(a, na, sizeof(char *));
            r[m]->deny_list = tsr__ar(a, nd, sizeof(char *));
            m++;
        }
        for (size_t k = 0; k < x->n_allow_list; k++)
            r[j]->allow_list[r[j]->n_allow_list++] = x->allow_list[k];
        for (size_t k = 0; k < x->n_deny_list; k++)
            r[j]->deny_list[r[j]->n_deny_list++] = x->deny_list[k];
    }
    *out = r;
    *nout = m;
}

/* ---------------------------------------------------------------- FindNeighbors */

typedef struct qplan {
    size_t k, c, cand;
    size_t depth; /* hits asked of each list: k, or max(k, rrf_depth) for a hybrid query */
    size_t lc;    /* crowding of each list: c, or 0 for a hybrid query (crowded after fusion) */
    int has_dense, has_sparse, rrf;
    double alpha;
    size_t nprobe;
    const float *x;            /* normalized vector (row of X) or NULL */
    Tessera__V1__Restriction **rs;
    size_t nrs;
    int probe_ns; /* names a namespace not known in use: ask every live group (query_ns.c) */
} qplan;

/* A FindNeighbors between its plan and its merge: what the shard fan-out needs and what
 * the merge reads afterwards. Everything but the snapshot reference lives in o's arena. */
typedef struct fnq {
    tsr__coord *c;
    const Tessera__V1__FindNeighborsRequest *rq; /* borrowed */
    tsr__snap *sn;                               /* reference */
    fn_out *o;
    qplan *qp;
    Tessera__V1__ShardSearchRequest *sreq;
    size_t **qmap; /* shard query j -> request query i */
    size_t *slot;  /* (i, s) -> j + 1, 0 = not sent */
    tsr__gcall *calls;
    uint8_t **bufs;
    size_t ncalls;
    int64_t tmo;
} fnq;

/* The plan of each query of rq into qp (nq entries): k, crowding, candidates, nprobe (of
 * nlist), merged restricts. Returns the number of dense queries. */
static size_t plan_queries(const tsr__coord_config *cfg,
                           const Tessera__V1__FindNeighborsRequest *rq, size_t nlist, tsr__arena *a,
                           qplan *qp)
{
    size_t ndq = 0;
    for (size_t i = 0; i < rq->n_queries; i++) {
        const Tessera__V1__FindNeighborsRequest__Query *q = rq->queries[i];
        const Tessera__V1__IndexDatapoint *dp = q->datapoint;
        qplan *p = &qp[i];
        p->k = q->neighbor_count ? (size_t)q->neighbor_count : (size_t)cfg->default_k;
        p->c = (size_t)q->per_crowding_attribute_neighbor_count;
        p->cand = q->approximate_case == TSR_APPROX_SET ? (size_t)q->approximate_neighbor_count
                                                    : (size_t)cfg->approximate_neighbor_count;
        p->has_dense = dp->n_feature_vector > 0;
        p->has_sparse = dp->sparse_embedding && dp->sparse_embedding->n_values > 0;
        p->rrf = q->ranking_case == TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF;
        p->alpha = p->rrf && q->rrf ? q->rrf->alpha : 1.0;
        /* A hybrid query fuses two lists of a fixed depth, so its ranking does not depend on
         * k below rrf_depth (docs/query-semantics.md). */
        p->depth = p->k;
        p->lc = p->c;
        if (p->has_dense && p->has_sparse && p->rrf) {
            /* each list ranked in full (true ranks), crowding only in the fused pass */
            if ((size_t)cfg->rrf_depth > p->depth)
                p->depth = (size_t)cfg->rrf_depth;
            p->lc = 0;
        }
        double f = q->fraction_leaf_nodes_to_search_override;
        p->nprobe = f > 0 ? (size_t)ceil(f * (double)nlist - 1e-9) : (size_t)cfg->nprobe;
        if (p->nprobe < 1)
            p->nprobe = 1;
        if (p->nprobe > nlist)
            p->nprobe = nlist;
        merge_restricts(dp, a, &p->rs, &p->nrs);
        ndq += p->has_dense;
    }
    return ndq;
}

/* The coarse step of the ndq dense queries (normalised for cosine; qp[i].x set): the
 * maxp nearest lists of each into *CD / *CI (ndq x maxp, in the arena). */
static int coarse_step(const tsr__coord_config *cfg, const tsr__snap *sn,
                       const Tessera__V1__FindNeighborsRequest *rq, qplan *qp, size_t ndq,
                       size_t maxp, tsr__arena *a, float **CD, int64_t **CI, tsr_error *err)
{
    size_t d = (size_t)cfg->dimensions, nlist = sn->tmpl->nlist;
    float *X = tsr__ar(a, ndq * d, sizeof *X);
    *CD = tsr__ar(a, ndq * maxp, sizeof **CD);
    *CI = tsr__ar(a, ndq * maxp, sizeof **CI);
    size_t j = 0;
    for (size_t i = 0; i < rq->n_queries; i++) {
        if (!qp[i].has_dense)
            continue;
        float *row = X + j * d;
        memcpy(row, rq->queries[i]->datapoint->feature_vector, d * sizeof(float));
        if (cfg->distance == TSR_DIST_COSINE) {
            double s = 0;
            for (size_t t = 0; t < d; t++)
                s += (double)row[t] * row[t];
            if (s > 0)
                for (size_t t = 0; t < d; t++)
                    row[t] = (float)(row[t] / sqrt(s));
        }
        qp[i].x = row;
        j++;
    }
    tsr_error e = TSR_ERROR_INIT;
    if (tsr_knn(X, ndq, sn->tmpl->centroids, nlist, d, sn->tmpl->metric, maxp,
                sn->tmpl->metric == TSR_METRIC_L2 ? sn->cent_norms : NULL, *CD, *CI, &e))
        return tsr_err(err, TSR_EINTERNAL, "coarse step: %s", e.msg);
    return 0;
}

/* One call per group with queries: its packed request into bufs[s] (owned by the caller)
 * and calls. Returns the number of calls. */
static size_t pack_calls(Tessera__V1__ShardSearchRequest *sreq, size_t S, tsr__gcall *calls,
                         uint8_t **bufs)
{
    size_t ncalls = 0;
    for (size_t s = 0; s < S; s++) {
        if (!sreq[s].n_queries)
            continue;
        size_t len = 0;
        bufs[s] = tsr_rpc_pack(&sreq[s].base, &len);
        calls[ncalls].group = s;
        calls[ncalls].req = bufs[s];
        calls[ncalls].len = len;
        calls[ncalls].demand = &sreq[s].base;
        tsr_rpc_result_init(&calls[ncalls].result);
        ncalls++;
    }
    return ncalls;
}

/* Read-your-writes (readidx.c): a follower first catches up with etcd; then the snapshot
 * and, read with it, the seq each of its groups' shard queries demand (gseq, room for
 * TSR_COORD_MAX_SHARDS + 1; all 0 under the test hooks no-read-index and no-demand). */
static int plan_snap(tsr__coord *c, int64_t remaining_ms, int64_t *gseq, tsr__snap **snp,
                     tsr_error *err)
{
    int rc = tsr__coord_read_index(c, remaining_ms, err);
    if (rc)
        return rc;
    int64_t last = -1;
    tsr__snap *sn = tsr__stream_snap_seqs(c, gseq, TSR_COORD_MAX_SHARDS + 1, &last);
    if (!tsr__coord_ri_on(TSR_RI_DEMAND))
        memset(gseq, 0, (TSR_COORD_MAX_SHARDS + 1) * sizeof *gseq);
    if (sn->version == 0) {
        tsr__snap_unref(sn);
        return tsr_err(err, TSR_ESTATE, "the index is empty: no version "
                   "yet (apply a batch with UpdateIndex first)");
    }
    *snp = sn;
    return 0;
}

/* The shard query of plan p (query datapoint dp) for one group, on the arena: its nl
 * probed lists with their coarse distances (none: sparse-only, or a namespace-only
 * query), at the version and the group's demanded stream seq; full: return_datapoints. */
static Tessera__V1__ShardQuery *shard_query(tsr__arena *a, const qplan *p,
                                            const Tessera__V1__IndexDatapoint *dp,
                                            uint64_t version, int64_t seq, size_t d,
                                            int32_t *lists, float *cds, size_t nl, int full)
{
    Tessera__V1__ShardQuery *sq = tsr__ar(a, 1, sizeof *sq);
    tessera__v1__shard_query__init(sq);
    sq->version = (int64_t)version;
    sq->min_stream_seq = seq;
    if (nl) {
        sq->vector = (float *)p->x;
        sq->n_vector = d;
        sq->lists = lists;
        sq->n_lists = nl;
        sq->coarse_distances = cds;
        sq->n_coarse_distances = nl;
    }
    sq->k = (int32_t)p->depth;
    sq->candidates = (int32_t)p->cand;
    sq->restricts = p->rs;
    sq->n_restricts = p->nrs;
    sq->numeric_restricts = dp->numeric_restricts;
    sq->n_numeric_restricts = dp->n_numeric_restricts;
    sq->crowding_limit = (int32_t)p->lc;
    if (p->has_sparse) {
        sq->sparse = dp->sparse_embedding;
        sq->sparse_k = (int32_t)p->depth;
    }
    sq->return_ids = 1;
    sq->return_datapoints = full;
    sq->check_namespaces = p->probe_ns;
    return sq;
}

/* Validates rq, takes a snapshot, runs the coarse step and packs one ShardSearchRequest
 * per touched shard into q. Returns 0, or a negative code with err set (nothing
 * held). */
static int fnq_plan(tsr__coord *c, const Tessera__V1__FindNeighborsRequest *rq,
                    int64_t remaining_ms, fnq *q, tsr_error *err)
{
    const tsr__coord_config *cfg = &c->cfg;
    size_t S, d = (size_t)cfg->dimensions; /* S: the snapshot's groups, below */
    size_t nq = rq->n_queries;
    memset(q, 0, sizeof *q);
    if (nq == 0)
        return tsr_err(err, TSR_EINVAL, "queries is empty");
    if (nq > (size_t)cfg->max_queries)
        return tsr_err(err, TSR_EINVAL, "%zu queries in one request, at most "
                   "max_queries_per_request = %d", nq, cfg->max_queries);
    for (size_t i = 0; i < nq; i++) {
        int rc = check_query(c, rq->queries[i], i, err);
        if (rc)
            return rc;
    }
    int64_t gseq[TSR_COORD_MAX_SHARDS + 1];
    tsr__snap *sn = NULL;
    int rc = plan_snap(c, remaining_ms, gseq, &sn, err);
    if (rc)
        return rc;
    S = tsr__snap_groups(sn, cfg);
    fn_out *o = tsr_xcalloc(1, sizeof *o);
    tessera__v1__find_neighbors_response__init(&o->resp);
    tsr__arena *a = &o->a;
    o->nshards = S;
    o->shard_resp = tsr__ar(a, S, sizeof *o->shard_resp);
    o->pba = (ProtobufCAllocator){pb_ar_alloc, pb_ar_free, a};
    size_t nlist = sn->tmpl->nlist;

    /* plans and the coarse step for the dense queries */
    qplan *qp = tsr__ar(a, nq, sizeof *qp);
    size_t ndq = plan_queries(cfg, rq, nlist, a, qp), maxp = 0;
    for (size_t i = 0; i < nq; i++)
        if (qp[i].has_dense && qp[i].nprobe > maxp)
            maxp = qp[i].nprobe;
    float *CD = NULL;
    int64_t *CI = NULL;
    if (ndq && (rc = coarse_step(cfg, sn, rq, qp, ndq, maxp, a, &CD, &CI, err)))
        goto fail;

    /* per-shard requests */
    Tessera__V1__ShardSearchRequest *sreq = tsr__ar(a, S, sizeof *sreq);
    size_t **qmap = tsr__ar(a, S, sizeof *qmap);      /* shard query j -> request query i */
    size_t *slot = tsr__ar(a, nq * S, sizeof *slot);  /* (i, s) -> j + 1, 0 = not sent */
    long long touched = 0, probed = 0;
    for (size_t s = 0; s < S; s++) {
        tessera__v1__shard_search_request__init(&sreq[s]);
        sreq[s].queries = tsr__ar(a, nq, sizeof *sreq[s].queries);
        qmap[s] = tsr__ar(a, nq, sizeof **qmap);
    }
    size_t dj = 0;
    for (size_t i = 0; i < nq; i++) {
        qplan *p = &qp[i];
        const Tessera__V1__IndexDatapoint *dp = rq->queries[i]->datapoint;
        const float *cd = p->has_dense ? CD + dj * maxp : NULL;
        const int64_t *ci = p->has_dense ? CI + dj * maxp : NULL;
        if (p->has_dense)
            dj++;
        p->probe_ns = tsr__query_ns_probe(dp);
        for (size_t s = 0; s < S; s++) {
            size_t nl = 0;
            int32_t *lists = NULL;
            float *cds = NULL;
            if (p->has_dense) {
                for (size_t t = 0; t < p->nprobe; t++)
                    nl += ci[t] >= 0 && sn->plan[ci[t]] == (int32_t)s;
                if (nl) {
                    lists = tsr__ar(a, nl, sizeof *lists);
                    cds = tsr__ar(a, nl, sizeof *cds);
                    size_t u = 0;
                    for (size_t t = 0; t < p->nprobe; t++)
                        if (ci[t] >= 0 && sn->plan[ci[t]] == (int32_t)s) {
                            lists[u] = (int32_t)ci[t];
                            cds[u++] = cd[t];
                        }
                    touched++;
                    probed += (long long)nl;
                }
            }
            /* sparse: every group that may hold a sparse datapoint at sn's version, never
             * one sn's version removed (it owns nothing, and is no longer called); a
             * namespace to check (query_ns.c): every live group, at least a namespace-only
             * query (no vector, no lists) */
            if (!nl && (!(p->has_sparse || p->probe_ns) || sn->retired[s]))
                continue;
            Tessera__V1__ShardQuery *sq =
                shard_query(a, p, dp, sn->version, s <= TSR_COORD_MAX_SHARDS ? gseq[s] : 0, d,
                            lists, cds, nl, rq->return_full_datapoint);
            size_t j = sreq[s].n_queries++;
            sreq[s].queries[j] = sq;
            qmap[s][j] = i;
            slot[i * S + s] = j + 1;
        }
    }
    atomic_fetch_add(&c->queries, (long long)nq);
    atomic_fetch_add(&c->shards_touched, touched);
    atomic_fetch_add(&c->lists_probed, probed);
    tsr_metrics_counter_add("tessera_queries_total", NULL, (double)nq);
    tsr_metrics_counter_add("tessera_query_shards_touched_total", NULL, (double)touched);
    tsr_metrics_counter_add("tessera_query_lists_probed_total", NULL, (double)probed);

    /* fan-out */
    int64_t tmo = cfg->search_deadline_ms;
    if (remaining_ms < tmo)
        tmo = remaining_ms;
    if (tmo < 1)
        tmo = 1;
    tsr__gcall *calls = tsr__ar(a, S, sizeof *calls);
    uint8_t **bufs = tsr__ar(a, S, sizeof *bufs);
    size_t ncalls = pack_calls(sreq, S, calls, bufs);
    q->c = c;
    q->rq = rq;
    q->sn = sn;
    q->o = o;
    q->qp = qp;
    q->sreq = sreq;
    q->qmap = qmap;
    q->slot = slot;
    q->calls = calls;
    q->bufs = bufs;
    q->ncalls = ncalls;
    q->tmo = tmo;
    return 0;
fail:
    tsr__snap_unref(sn);
    tsr__coord_response_free(&o->resp);
    return rc ? rc : TSR_EINTERNAL;
}

/* Releases everything q holds (a plan that will not be finished, or a failed merge). */
static void fnq_drop(fnq *q)
{
    for (size_t k = 0; k < q->ncalls; k++) {
        free(q->bufs[q->calls[k].group]);
        q->bufs[q->calls[k].group] = NULL;
        tsr_rpc_result_close(&q->calls[k].result);
    }
    tsr__snap_unref(q->sn);
    tsr__coord_response_free(&q->o->resp);
    memset(q, 0, sizeof *q);
}

/* The answer for fused hit h of query i: distances, and the datapoint (the shard's full
 * one when asked for, else id and crowding tag) from the candidate it came from. */
static Tessera__V1__FindNeighborsResponse__Neighbor *neighbor_of(const fnq *q, size_t i,
                                                                 const tsr_rrf_hit *h,
                                                                 const cand *cs, size_t ncs)
{
    fn_out *o = q->o;
    tsr__arena *a = &o->a;
    size_t S = q->o->nshards, *slot = q->slot;
    Tessera__V1__FindNeighborsResponse__Neighbor *nb = tsr__ar(a, 1, sizeof *nb);
    tessera__v1__find_neighbors_response__neighbor__init(nb);
    const cand *cd = find_cand(cs, ncs, h->label, h->in_dense ? 0 : 1);
    const cand *cs2 = find_cand(cs, ncs, h->label, 1);
    nb->distance = h->in_dense ? h->dist : 0.0;
    nb->sparse_only = !h->in_dense;
    if (cs2) {
        Tessera__V1__ShardQueryResult *res2 =
            ((Tessera__V1__ShardSearchResponse *)o->shard_resp[cs2->shard])
                ->results[slot[i * S + cs2->shard] - 1];
        nb->sparse_distance = res2->sparse_scores[cs2->idx];
    }
    if (!cd)
        return nb;
    Tessera__V1__ShardQueryResult *res =
        ((Tessera__V1__ShardSearchResponse *)o->shard_resp[cd->shard])
            ->results[slot[i * S + cd->shard] - 1];
    Tessera__V1__IndexDatapoint *full = NULL;
    if (q->rq->return_full_datapoint)
        full = cd->sparse ? (cd->idx < res->n_sparse_datapoints ? res->sparse_datapoints[cd->idx]
                                                                : NULL)
                          : (cd->idx < res->n_datapoints ? res->datapoints[cd->idx] : NULL);
    if (full) {
        nb->datapoint = full;
        return nb;
    }
    Tessera__V1__IndexDatapoint *dp = tsr__ar(a, 1, sizeof *dp);
    tessera__v1__index_datapoint__init(dp);
    dp->datapoint_id = cd->sparse ? res->sparse_ids[cd->idx] : res->ids[cd->idx];
    const char *tag = cd->sparse
        ? (cd->idx < res->n_sparse_crowding_tags ? res->sparse_crowding_tags[cd->idx] : "")
        : (cd->idx < res->n_crowding_tags ? res->crowding_tags[cd->idx] : "");
    if (tag && tag[0]) {
        Tessera__V1__CrowdingTag *ct = tsr__ar(a, 1, sizeof *ct);
        tessera__v1__crowding_tag__init(ct);
        ct->crowding_attribute = (char *)tag;
        dp->crowding_tag = ct;
    }
    nb->datapoint = dp;
    return nb;
}

/* The shard replies of q into o->shard_resp (failed[s] set for a group that gave none,
 * its name into missing). Returns 0, or an error when a failed group served a query that
 * does not allow partial answers. */
static int collect_shards(fnq *q, int *failed, char **missing, size_t *nmissing,
                          tsr_error *err)
{
    tsr__coord *c = q->c;
    const tsr__coord_config *cfg = &c->cfg;
    const Tessera__V1__FindNeighborsRequest *rq = q->rq;
    fn_out *o = q->o;
    Tessera__V1__ShardSearchRequest *sreq = q->sreq;
    size_t **qmap = q->qmap;
    tsr__gcall *calls = q->calls;
    uint8_t **bufs = q->bufs;
    size_t ncalls = q->ncalls;
    int rc = 0;
    for (size_t k = 0; k < ncalls; k++) {
        size_t s = calls[k].group;
        tsr_rpc_result *r = &calls[k].result;
        free(bufs[s]);
        bufs[s] = NULL;
        if (r->code == TSR_RPC_OK) {
            o->shard_resp[s] = protobuf_c_message_unpack(&tessera__v1__shard_search_response__descriptor,
                                                         &o->pba, r->len, r->data);
            Tessera__V1__ShardSearchResponse *sr =
                (Tessera__V1__ShardSearchResponse *)o->shard_resp[s];
            if (!sr || sr->n_results != sreq[s].n_queries) {
                r->code = TSR_RPC_INTERNAL;
                free(r->message);
                r->message = tsr_xstrdup("malformed Search response");
            }
        }
        if (r->code != TSR_RPC_OK) {
            failed[s] = 1;
            int need = 0;
            for (size_t j = 0; j < sreq[s].n_queries; j++)
                need |= !rq->queries[qmap[s][j]]->allow_partial;
            if (need && !rc) {
                int st = r->code == TSR_RPC_INVALID_ARGUMENT ? TSR_EINTERNAL : TSR_EUNAVAILABLE;
                const tsr__replica *rp = &c->rep[calls[k].replica];
                if (c->grp[s].n > 1)
                    rc = tsr_err(err, st, "shard %zu (%s) failed on %d replica(s), last "
                             "%s: %s: %s", s, cfg->shards[s], calls[k].attempts, rp->addr,
                             tsr_rpc_code_name(r->code), r->message ? r->message : "");
                else
                    rc = tsr_err(err, st, "shard %zu (%s) failed: %s: %s", s,
                             cfg->shards[s], tsr_rpc_code_name(r->code),
                             r->message ? r->message : "");
            }
            missing[(*nmissing)++] = cfg->shards[s];
        }
        tsr_rpc_result_close(r);
    }
    return rc;
}

/* The warnings of query i about namespaces no live group uses (query_ns.c), appended to
 * the response's (on its arena). Only when every live group answered. */
static void ns_warnings(fnq *q, size_t i, const int *failed)
{
    fn_out *o = q->o;
    size_t S = o->nshards, nres = 0;
    int complete = 1;
    const Tessera__V1__ShardQueryResult **res = tsr__ar(&o->a, S, sizeof *res);
    for (size_t s = 0; s < S; s++) {
        if (q->sn->retired[s])
            continue;
        if (!q->slot[i * S + s] || failed[s]) {
            complete = 0;
            continue;
        }
        res[nres++] = ((Tessera__V1__ShardSearchResponse *)o->shard_resp[s])
                          ->results[q->slot[i * S + s] - 1];
    }
    const Tessera__V1__IndexDatapoint *dp = q->rq->queries[i]->datapoint;
    size_t cap = dp->n_restricts + dp->n_numeric_restricts;
    char **w = tsr__ar(&o->a, cap, sizeof *w);
    size_t nw = tsr__query_ns_settle(dp, i, res, nres, complete, w, cap);
    if (!nw)
        return;
    char **all = tsr__ar(&o->a, o->resp.n_warnings + nw, sizeof *all);
    for (size_t k = 0; k < o->resp.n_warnings; k++)
        all[k] = o->resp.warnings[k];
    for (size_t k = 0; k < nw; k++) {
        tsr__ar_own(&o->a, w[k]);
        all[o->resp.n_warnings + k] = w[k];
    }
    o->resp.warnings = all;
    o->resp.n_warnings += nw;
}

/* After the fan-out (q->calls have their results): unpacks the shard replies and merges.
 * Releases everything q holds; on success *outp is the response (caller frees with
 * tsr__coord_response_free). */
static int fnq_finish(fnq *q, Tessera__V1__FindNeighborsResponse **outp, tsr_error *err)
{
    tsr__coord *c = q->c;
    const tsr__coord_config *cfg = &c->cfg;
    const Tessera__V1__FindNeighborsRequest *rq = q->rq;
    tsr__snap *sn = q->sn;
    fn_out *o = q->o;
    tsr__arena *a = &o->a;
    size_t S = o->nshards, nq = rq->n_queries;
    int larger = cfg->distance != TSR_DIST_SQUARED_L2;
    qplan *qp = q->qp;
    size_t *slot = q->slot;
    *outp = NULL;
    int *failed = tsr__ar(a, S, sizeof *failed);
    char **missing = tsr__ar(a, S, sizeof *missing);
    size_t nmissing = 0;
    int rc = collect_shards(q, failed, missing, &nmissing, err);
    if (rc)
        goto fail;

    /* merge */
    o->resp.nearest_neighbors = tsr__ar(a, nq, sizeof *o->resp.nearest_neighbors);
    o->resp.n_nearest_neighbors = nq;
    o->resp.missing_shards = missing;
    o->resp.n_missing_shards = nmissing;
    o->resp.version = (int64_t)sn->version;
    for (size_t i = 0; i < nq; i++) {
        qplan *p = &qp[i];
        Tessera__V1__FindNeighborsResponse__NearestNeighbors *nn = tsr__ar(a, 1, sizeof *nn);
        tessera__v1__find_neighbors_response__nearest_neighbors__init(nn);
        nn->id = rq->queries[i]->datapoint->datapoint_id;
        o->resp.nearest_neighbors[i] = nn;
        const tsr_hit **dl = tsr__ar(a, S, sizeof *dl), **sl = tsr__ar(a, S, sizeof *sl);
        size_t *dn = tsr__ar(a, S, sizeof *dn), *sn_ = tsr__ar(a, S, sizeof *sn_);
        size_t ndl = 0, nsl = 0, total = 0;
        for (size_t s = 0; s < S; s++) {
            if (!slot[i * S + s] || failed[s])
                continue;
            Tessera__V1__ShardQueryResult *res =
                ((Tessera__V1__ShardSearchResponse *)o->shard_resp[s])->results[slot[i * S + s] - 1];
            total += res->n_labels + res->n_sparse_labels;
        }
        tagmap tm;
        tagmap_init(&tm, total + 1, a);
        cand *cs = tsr__ar(a, total + 1, sizeof *cs);
        size_t ncs = 0;
        for (size_t s = 0; s < S; s++) {
            if (!slot[i * S + s] || failed[s])
                continue;
            Tessera__V1__ShardQueryResult *res =
                ((Tessera__V1__ShardSearchResponse *)o->shard_resp[s])->results[slot[i * S + s] - 1];
            size_t n = res->n_labels;
            if (n && res->n_distances == n && res->n_ids == n) {
                tsr_hit *h = tsr__ar(a, n, sizeof *h);
                for (size_t t = 0; t < n; t++) {
                    h[t].dist = res->distances[t];
                    h[t].label = res->labels[t];
                    h[t].tag = tag_id(&tm, t < res->n_crowding_tags ? res->crowding_tags[t] : "");
                    cs[ncs++] = (cand){res->labels[t], (uint32_t)s, (uint32_t)t, 0};
                }
                dl[ndl] = h;
                dn[ndl++] = n;
            }
            n = res->n_sparse_labels;
            if (n && res->n_sparse_scores == n && res->n_sparse_ids == n) {
                tsr_hit *h = tsr__ar(a, n, sizeof *h);
                for (size_t t = 0; t < n; t++) {
                    h[t].dist = res->sparse_scores[t];
                    h[t].label = res->sparse_labels[t];
                    h[t].tag = tag_id(&tm, t < res->n_sparse_crowding_tags
                                               ? res->sparse_crowding_tags[t] : "");
                    cs[ncs++] = (cand){res->sparse_labels[t], (uint32_t)s, (uint32_t)t, 1};
                }
                sl[nsl] = h;
                sn_[nsl++] = n;
            }
        }
        qsort(cs, ncs, sizeof *cs, cmp_cand);
        tsr_hit *dh = tsr__ar(a, p->depth, sizeof *dh), *sh = tsr__ar(a, p->depth, sizeof *sh);
        size_t nd = 0, ns = 0;
        if (tsr_topk_merge(dl, dn, ndl, larger, p->depth, p->lc, dh, &nd) ||
            tsr_topk_merge(sl, sn_, nsl, 1, p->depth, p->lc, sh, &ns)) {
            rc = tsr_err(err, TSR_ELIMIT, "out of memory in the merge");
            goto fail;
        }
        tsr_rrf_hit *fh = tsr__ar(a, p->k, sizeof *fh);
        size_t nf = 0;
        if (p->has_dense && p->has_sparse && p->rrf) {
            if (tsr_rrf_fuse(dh, nd, sh, ns, p->alpha, TSR_RRF_K0, p->k, p->c, fh, &nf)) {
                rc = tsr_err(err, TSR_EINTERNAL, "rrf fusion failed");
                goto fail;
            }
        } else if (p->has_dense) {
            for (size_t t = 0; t < nd; t++) {
                fh[nf].label = dh[t].label;
                fh[nf].in_dense = 1;
                fh[nf].dist = dh[t].dist;
                nf++;
            }
        } else {
            for (size_t t = 0; t < ns; t++) {
                fh[nf].label = sh[t].label;
                fh[nf].in_sparse = 1;
                fh[nf].sparse_dist = sh[t].dist;
                nf++;
            }
        }
        nn->neighbors = tsr__ar(a, nf, sizeof *nn->neighbors);
        nn->n_neighbors = nf;
        for (size_t t = 0; t < nf; t++)
            nn->neighbors[t] = neighbor_of(q, i, &fh[t], cs, ncs);
        if (p->probe_ns)
            ns_warnings(q, i, failed);
    }
    tsr__snap_unref(sn);
    *outp = &o->resp;
    return 0;
fail:
    fnq_drop(q);
    return rc ? rc : TSR_EINTERNAL;
}

int tsr__coord_find_neighbors(tsr__coord *c, const Tessera__V1__FindNeighborsRequest *rq,
                              int64_t remaining_ms, Tessera__V1__FindNeighborsResponse **outp,
                              tsr_error *err)
{
    fnq q;
    *outp = NULL;
    int rc = fnq_plan(c, rq, remaining_ms, &q, err);
    if (rc)
        return rc;
    tsr__coord_group_fanout(c, TSR_SHARD_SVC "Search", q.calls, q.ncalls, q.tmo);
    return fnq_finish(&q, outp, err);
}

int tsr__coord_reply_error(tsr_rpc_reply *r, const tsr_error *err)
{
    return tsr_rpc_reply_error(r, tsr__coord_status_of(err), "%s", err->msg);
}

int tsr__coord_status_of(const tsr_error *err)
{
    return tsr_rpc_status_from_error(err->code ? err->code : TSR_EINTERNAL);
}

/* FindNeighbors without blocking (DESIGN at the top): the state of one call between its
 * plan, on the polling thread that received it, and its merge, on the polling thread that
 * sees the last shard reply. */
typedef struct fn_async {
    Tessera__V1__FindNeighborsRequest *rq; /* owned */
    fnq q;
    tsr_error err;
    /* coalesced (coalesce.c): the held reply, one entry per shard call, calls not done */
    tsr_rpc_reply *r;
    tsr__centry *ents;
    atomic_size_t left;
} fn_async;

static int fn_reply(tsr_rpc_reply *r, int rc, Tessera__V1__FindNeighborsResponse *out,
                    const tsr_error *err)
{
    if (rc == 0)
        rc = tsr_rpc_reply_pack(r, &out->base);
    else
        rc = tsr__coord_reply_error(r, err);
    tsr__coord_response_free(out);
    return rc;
}

static int fn_async_fin(void *ud, tsr_rpc_reply *r, tsr__gcall *calls, size_t n)
{
    fn_async *f = ud;
    (void)calls;
    (void)n;
    Tessera__V1__FindNeighborsResponse *out = NULL;
    int rc = fnq_finish(&f->q, &out, &f->err);
    rc = fn_reply(r, rc, out, &f->err);
    tessera__v1__find_neighbors_request__free_unpacked(f->rq, NULL);
    free(f);
    return rc;
}

/* A coalesced shard call of f is done; the last one merges and releases the reply. */
static void fn_co_done(void *ud, tsr__gcall *call)
{
    fn_async *f = ud;
    (void)call;
    if (atomic_fetch_sub(&f->left, 1) != 1)
        return;
    tsr_rpc_reply *r = f->r;
    free(f->ents);
    int rc = fn_async_fin(f, r, NULL, 0); /* frees f */
    tsr_rpc_reply_release(r, rc);
}

/* Hands f's shard calls to the coalescer (the reply is held until the last is done).
 * Returns 0, or nonzero when the reply cannot be held (then nothing was sent). */
static int fn_coalesce(tsr__coord *c, tsr_rpc_reply *r, fn_async *f)
{
    fnq *q = &f->q;
    if (q->ncalls == 0 || tsr_rpc_reply_hold(r) != 0)
        return -1;
    int64_t dl = tsr_clock_mono_ms() + (q->tmo > 0 ? q->tmo : 1);
    f->r = r;
    f->ents = tsr_xcalloc(q->ncalls, sizeof *f->ents);
    atomic_init(&f->left, q->ncalls);
    size_t n = q->ncalls;
    tsr__centry *ents = f->ents;
    for (size_t k = 0; k < n; k++) {
        ents[k].call = &q->calls[k];
        ents[k].nq = q->sreq[q->calls[k].group].n_queries;
        ents[k].deadline = dl;
        ents[k].done = fn_co_done;
        ents[k].ud = f;
    }
    for (size_t k = 0; k < n; k++) /* f may be gone once the last is submitted */
        tsr__coalesce_submit(c, &ents[k]);
    return 0;
}

int tsr__coord_find_neighbors_reply(tsr__coord *c, Tessera__V1__FindNeighborsRequest *rq,
                                    tsr_rpc_reply *r)
{
    fn_async *f = tsr_xcalloc(1, sizeof *f);
    f->rq = rq;
    int rc = fnq_plan(c, rq, tsr_rpc_reply_remaining_ms(r), &f->q, &f->err);
    if (rc == 0 && tsr__coalesce_on(c) && fn_coalesce(c, r, f) == 0)
        return 0; /* held: released by the last fn_co_done */
    if (rc == 0) {
        rc = tsr__coord_group_fanout_async(c, r, TSR_SHARD_SVC "Search", f->q.calls,
                                           f->q.ncalls, f->q.tmo, fn_async_fin, f);
        if (rc == 0)
            return 0; /* the reply is sent after fn_async_fin */
        fnq_drop(&f->q); /* nothing started (out of memory) */
        rc = tsr_err(&f->err, TSR_ELIMIT, "cannot start the shard fan-out: %s",
                     tsr_strerror(rc));
    }
    rc = fn_reply(r, rc, NULL, &f->err);
    tessera__v1__find_neighbors_request__free_unpacked(rq, NULL);
    free(f);
    return rc;
}
