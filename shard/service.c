/*
 * service — the tessera.v1.Shard RPC handlers: decode and validate each request
 * (malformed protobuf, wrong dimension, unknown or duplicate list, k out of 1..10000,
 * empty query → INVALID_ARGUMENT with a message naming the query and field; a version the
 * shard does not hold → FAILED_PRECONDITION), run it on an immutable version snapshot
 * (scan.c) or on the update state (update.c), and encode the reply.
 *
 * DESIGN (threads): Search, Read, List and Stats run on the rpc polling threads (short;
 * Search, Read and List take only a version (and delta) reference, Stats only table_mu);
 * Stage, Prepare, Commit, Abort, Release and Write run on the rpc worker pool (TSR_RPC_LONG):
 * they parse chunks, build and fsync a version, or append to and fdatasync the log.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"
#include "net/pb_datapoint.h"
#include "net/rpc.h"
#include "shard.h"
#include "shard_service.h"

#define MAX_QUERIES 10000

static int bad(tsr_rpc_reply *r, const char *fmt, const char *what, size_t i)
{
    return tsr_rpc_reply_error(r, TSR_RPC_INVALID_ARGUMENT, fmt, i, what);
}

/* Per-request cache of version references (a batch usually names one version). */
typedef struct vcache {
    int64_t ver[8];
    tsr__version *v[8];
    tsr__delta *d[8]; /* the version's delta snapshot taken with it (one per request) */
    size_t n;
    tsr__scan_cache scan; /* the call's scanner, for an index of one of these versions */
} vcache;

static tsr__version *vc_get(tsr__shard *s, vcache *c, int64_t version, const tsr__delta **dp)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->ver[i] == version) {
            *dp = c->d[i];
            return c->v[i];
        }
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(s, version, &d);
    if (v && c->n < 8) {
        c->ver[c->n] = version;
        c->d[c->n] = d;
        c->v[c->n++] = v;
    } else if (v) {
        /* More than 8 distinct versions in one batch: never happens from the
         * coordinator; refuse rather than leak. */
        tsr__delta_unref(d);
        tsr__version_unref(v);
        return NULL;
    }
    *dp = d;
    return v;
}

static void vc_close(vcache *c)
{
    tsr__scan_cache_close(&c->scan); /* before the versions that own its index */
    for (size_t i = 0; i < c->n; i++) {
        tsr__delta_unref(c->d[i]);
        tsr__version_unref(c->v[i]);
    }
}

static int i32_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct spent {
    int64_t dim;
    float val;
} spent;

static int sp_cmp(const void *a, const void *b)
{
    const spent *x = a, *y = b;
    return x->dim < y->dim ? -1 : x->dim > y->dim;
}

/* Fills a result message from hits; strings and datapoints borrow the version. */
static int fill_hits(const tsr__version *v, const tsr__delta *dl, const tsr__hit *h, size_t n,
                     int want_ids,
                     int want_dps, int64_t **labels, float **dist, char ***tags, char ***ids,
                     Tessera__V1__IndexDatapoint ***dps, size_t *nl, size_t *nd, size_t *nt,
                     size_t *ni, size_t *ndp)
{
    *labels = tsr_try_malloc(n + 1, sizeof(int64_t));
    *dist = tsr_try_malloc(n + 1, sizeof(float));
    *tags = tsr_try_malloc(n + 1, sizeof(char *));
    if (!*labels || !*dist || !*tags)
        return TSR_ENOMEM;
    if (want_ids && (*ids = tsr_try_malloc(n + 1, sizeof(char *))) == NULL)
        return TSR_ENOMEM;
    if (want_dps && (*dps = tsr_try_calloc(n + 1, sizeof(void *))) == NULL)
        return TSR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const tsr__rec *r = tsr__row_rec(v, dl, h[i].row);
        (*labels)[i] = h[i].label;
        (*dist)[i] = h[i].dist;
        (*tags)[i] = r->dp.crowding_tag ? r->dp.crowding_tag : (char *)"";
        if (want_ids)
            (*ids)[i] = r->dp.id;
        if (want_dps) {
            (*dps)[i] = tsr_pb_datapoint_new(&r->dp);
            if ((*dps)[i] == NULL)
                return TSR_ENOMEM;
            *ndp = i + 1;
        }
    }
    *nl = *nd = *nt = n;
    if (want_ids)
        *ni = n;
    return 0;
}

static void free_result(Tessera__V1__ShardQueryResult *r)
{
    if (r == NULL)
        return;
    free(r->labels);
    free(r->distances);
    free(r->crowding_tags);
    free(r->sparse_labels);
    free(r->sparse_scores);
    free(r->sparse_crowding_tags);
    free(r->ids);
    free(r->sparse_ids);
    free(r->unknown_namespaces); /* the strings are the request's */
    for (size_t i = 0; i < r->n_datapoints; i++)
        tsr_pb_datapoint_delete(r->datapoints[i]);
    free(r->datapoints);
    for (size_t i = 0; i < r->n_sparse_datapoints; i++)
        tsr_pb_datapoint_delete(r->sparse_datapoints[i]);
    free(r->sparse_datapoints);
    free(r);
}

/* What run_query derives from a query before the search, freed by query_parts_free
 * (the same lifetimes as when it was one function). */
typedef struct query_parts {
    int32_t *sorted;        /* the lists, sorted (the duplicate check) */
    spent *sp;              /* the sparse entries, sorted by dimension */
    int64_t *spd;           /* ... duplicates summed: nsp dimensions */
    float *spv;             /* ... and their values */
    size_t nsp;
    tsr_token_restrict *tr; /* the restricts, as the filter module takes them */
    tsr_numeric_query *nq;
    tsr_filter *f;          /* NULL = no filter */
} query_parts;

static void query_parts_free(query_parts *p)
{
    free(p->sorted);
    free(p->sp);
    free(p->spd);
    free(p->spv);
    free(p->tr);
    free(p->nq);
    tsr_filter_destroy(p->f);
}

/* The scalar fields, the dense vector and the lists of query qi against version v (d its
 * dimension, 0 = no template). Returns 0 or sets the reply status. */
static int check_query(tsr_rpc_reply *reply, const tsr__version *v,
                       const Tessera__V1__ShardQuery *q, size_t qi, size_t d, int has_sparse)
{
    if (q->n_vector == 0 && !has_sparse && !q->n_restricts && !q->n_numeric_restricts)
        return bad(reply, "queries[%zu]: empty query (no %s, no sparse, no restricts)",
                   "vector", qi);
    if (q->k <= 0 || q->k > TSR__MAX_K)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].k = %d: must be in 1..%d", qi, q->k, TSR__MAX_K);
    if (q->candidates < 0 || q->candidates > TSR__MAX_K)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].candidates = %d: must be in 0..%d", qi,
                                   q->candidates, TSR__MAX_K);
    if (q->sparse_k < 0 || q->sparse_k > TSR__MAX_K)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].sparse_k = %d: must be in 0..%d", qi,
                                   q->sparse_k, TSR__MAX_K);
    if (q->crowding_limit < 0)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].crowding_limit = %d: must be >= 0", qi,
                                   q->crowding_limit);
    if (q->n_lists != q->n_coarse_distances)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu]: %zu lists but %zu coarse_distances", qi,
                                   q->n_lists, q->n_coarse_distances);
    if (q->n_lists && q->n_vector == 0)
        return bad(reply, "queries[%zu]: lists without a dense %s", "vector", qi);
    if (q->n_vector) {
        if (d && q->n_vector != d)
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].vector: %zu values, the index dimension "
                                       "is %zu", qi, q->n_vector, d);
        for (size_t j = 0; j < q->n_vector; j++)
            if (!isfinite(q->vector[j]))
                return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                           "queries[%zu].vector[%zu]: not a finite number", qi, j);
    }
    if (q->n_lists > v->nlist)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].lists: %zu lists, this shard owns at most %zu",
                                   qi, q->n_lists, v->nlist);
    for (size_t j = 0; j < q->n_lists; j++) {
        int32_t l = q->lists[j];
        if (l < 0 || (size_t)l >= v->nlist || !v->owned[l])
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].lists[%zu] = %d: not a list this shard owns "
                                       "in version %lld", qi, j, l, (long long)v->version);
        if (!isfinite(q->coarse_distances[j]))
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].coarse_distances[%zu]: not a finite number",
                                       qi, j);
    }
    return 0;
}

/* No list named twice (a sorted copy in p->sorted). */
static int check_unique_lists(tsr_rpc_reply *reply, const Tessera__V1__ShardQuery *q,
                              size_t qi, query_parts *p)
{
    if (q->n_lists <= 1)
        return 0;
    p->sorted = tsr_try_malloc(q->n_lists, sizeof *p->sorted);
    if (p->sorted == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(p->sorted, q->lists, q->n_lists * sizeof *p->sorted);
    qsort(p->sorted, q->n_lists, sizeof *p->sorted, i32_cmp);
    for (size_t j = 1; j < q->n_lists; j++)
        if (p->sorted[j] == p->sorted[j - 1])
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].lists: list %d appears twice", qi,
                                       p->sorted[j]);
    return 0;
}

/* The sparse part of the query, sorted by dimension with duplicates summed, as
 * datapoints are (SPEC §2), into p->spd / p->spv / p->nsp. */
static int parse_sparse(tsr_rpc_reply *reply, const Tessera__V1__SparseEmbedding *s, size_t qi,
                        query_parts *p)
{
    if (s->n_values != s->n_dimensions)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu].sparse: %zu values but %zu dimensions", qi,
                                   s->n_values, s->n_dimensions);
    p->sp = tsr_try_malloc(s->n_values, sizeof *p->sp);
    p->spd = tsr_try_malloc(s->n_values, sizeof *p->spd);
    p->spv = tsr_try_malloc(s->n_values, sizeof *p->spv);
    if (!p->sp || !p->spd || !p->spv)
        return tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t j = 0; j < s->n_values; j++) {
        if (!isfinite(s->values[j]))
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].sparse.values[%zu]: not a finite number",
                                       qi, j);
        p->sp[j] = (spent){s->dimensions[j], s->values[j]};
    }
    qsort(p->sp, s->n_values, sizeof *p->sp, sp_cmp);
    for (size_t j = 0; j < s->n_values; j++) {
        if (p->nsp && p->spd[p->nsp - 1] == p->sp[j].dim) {
            p->spv[p->nsp - 1] += p->sp[j].val;
        } else {
            p->spd[p->nsp] = p->sp[j].dim;
            p->spv[p->nsp++] = p->sp[j].val;
        }
    }
    return 0;
}

/* The query's token and numeric restricts compiled against v's dictionary into p->f. */
static int compile_filter(tsr_rpc_reply *reply, const tsr__version *v,
                          const Tessera__V1__ShardQuery *q, size_t qi, query_parts *p)
{
    tsr_error err = TSR_ERROR_INIT;
    p->tr = tsr_try_calloc(q->n_restricts + 1, sizeof *p->tr);
    p->nq = tsr_try_calloc(q->n_numeric_restricts + 1, sizeof *p->nq);
    if (!p->tr || !p->nq)
        return tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t j = 0; j < q->n_restricts; j++) {
        const Tessera__V1__Restriction *r = q->restricts[j];
        p->tr[j].ns = r->namespace_;
        p->tr[j].allow = r->allow_list;
        p->tr[j].nallow = r->n_allow_list;
        p->tr[j].deny = r->deny_list;
        p->tr[j].ndeny = r->n_deny_list;
    }
    for (size_t j = 0; j < q->n_numeric_restricts; j++) {
        const Tessera__V1__NumericRestriction *n = q->numeric_restricts[j];
        tsr_numeric_query *nq = &p->nq[j];
        nq->ns = n->namespace_;
        nq->op = (enum tsr_num_op)n->op;
        switch (n->value_case) {
        case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT:
            nq->type = TSR_NUM_INT, nq->v.i = n->value_int;
            break;
        case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT:
            nq->type = TSR_NUM_FLOAT, nq->v.f = n->value_float;
            break;
        case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE:
            nq->type = TSR_NUM_DOUBLE, nq->v.d = n->value_double;
            break;
        default:
            return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                       "queries[%zu].numeric_restricts[%zu] ('%s'): no value",
                                       qi, j, n->namespace_);
        }
    }
    if (tsr_filter_compile(v->dict, p->tr, q->n_restricts, p->nq, q->n_numeric_restricts,
                           &p->f, &err) != 0)
        return tsr_rpc_reply_error(reply, err.code == TSR_ENOMEM ? TSR_RPC_RESOURCE_EXHAUSTED
                                                                : TSR_RPC_INVALID_ARGUMENT,
                                   "queries[%zu] filters: %s", qi, err.msg);
    return 0;
}

/* Validates query i against version v and runs it into res. Returns 0 or sets the
 * reply status. */
static int run_query(tsr_rpc_reply *reply, const tsr__version *v, const tsr__delta *dl,
                     tsr__scan_cache *scan, const Tessera__V1__ShardQuery *q, size_t qi,
                     tsr__qresult *res)
{
    int rc;
    tsr_error err = TSR_ERROR_INIT;
    query_parts p = {0};
    size_t d = v->tmpl ? (size_t)v->tmpl->ix->d : 0;
    int has_sparse = q->sparse && (q->sparse->n_values || q->sparse->n_dimensions);

    if ((rc = check_query(reply, v, q, qi, d, has_sparse)) != 0 ||
        (rc = check_unique_lists(reply, q, qi, &p)) != 0)
        goto out;
    if (has_sparse && (rc = parse_sparse(reply, q->sparse, qi, &p)) != 0)
        goto out;
    if ((q->n_restricts || q->n_numeric_restricts) &&
        (rc = compile_filter(reply, v, q, qi, &p)) != 0)
        goto out;
    tsr__query sq = {0};
    sq.x = q->n_vector ? q->vector : NULL;
    sq.lists = q->lists;
    sq.coarse = q->coarse_distances;
    sq.nprobe = q->n_lists;
    sq.k = (size_t)q->k;
    sq.candidates = (size_t)q->candidates;
    sq.sparse_k = (size_t)q->sparse_k;
    sq.crowd = (uint32_t)q->crowding_limit;
    sq.filter = p.f;
    sq.sp_dims = p.spd;
    sq.sp_vals = p.spv;
    sq.nsp = p.nsp;
    sq.delta = dl;
    sq.tr = p.tr;
    sq.ntr = p.tr ? q->n_restricts : 0;
    sq.nq = p.nq;
    sq.nnq = p.nq ? q->n_numeric_restricts : 0;
    sq.scan = scan;
    if (tsr__search_one(v, &sq, res, &err) != 0)
        rc = tsr_rpc_reply_from_error(reply, &err);
out:
    query_parts_free(&p);
    return rc;
}

/* Read-your-writes (ShardQuery.min_stream_seq): waits until q's version has applied the
 * demanded stream seq, polling every millisecond for at most APPLIED_WAIT_MS (the leader
 * mirrors a round to etcd before it sends the Write, so a follower coordinator can demand
 * a seq a moment before it arrives). Returns 0 (applied, or a version not held: the query
 * loop answers that), or the handler's return value with FAILED_PRECONDITION in reply,
 * the message ending with "applied seq N" (coordinator/replica.c reads N). A wait holds
 * this polling thread (Writes run on the worker pool: they are not held up by it). */
#define APPLIED_WAIT_MS 100
static int wait_applied(tsr__shard *s, int64_t want_version, int64_t min_seq,
                        const char *what, tsr_rpc_reply *reply)
{
    int64_t t0 = tsr_clock_mono_ms(), applied = 0, version = 0;
    for (;;) {
        tsr__delta *d = NULL;
        tsr__version *v = tsr__shard_get_view(s, want_version, &d);
        if (!v)
            return 0;
        applied = tsr__applied_seq(v, d);
        version = v->version;
        tsr__delta_unref(d);
        tsr__version_unref(v);
        if (applied >= min_seq)
            return 0;
        if (tsr_clock_mono_ms() - t0 >= APPLIED_WAIT_MS)
            break;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return tsr_rpc_reply_error(reply, TSR_RPC_FAILED_PRECONDITION,
                               "%s: stream seq %lld of version %lld not applied "
                               "after %d ms (this replica missed a streamed write, or it is "
                               "still in flight): applied seq %lld", what,
                               (long long)min_seq, (long long)version,
                               APPLIED_WAIT_MS, (long long)applied);
}

/* r->unknown_namespaces: q's namespaces no datapoint of v (and its delta) uses, each
 * once, borrowed from q. Returns 0 or -1 (out of memory). */
static int unknown_namespaces(const tsr__version *v, const tsr__delta *dl,
                              const Tessera__V1__ShardQuery *q, Tessera__V1__ShardQueryResult *r)
{
    size_t n = q->n_restricts + q->n_numeric_restricts;
    if (n == 0)
        return 0;
    if ((r->unknown_namespaces = tsr_try_calloc(n, sizeof *r->unknown_namespaces)) == NULL)
        return -1;
    for (size_t j = 0; j < n; j++) {
        char *ns = j < q->n_restricts ? q->restricts[j]->namespace_
                                      : q->numeric_restricts[j - q->n_restricts]->namespace_;
        int dup = 0;
        for (size_t k = 0; k < r->n_unknown_namespaces && !dup; k++)
            dup = strcmp(r->unknown_namespaces[k], ns) == 0;
        if (!dup && tsr__ns_unknown(v, dl, ns))
            r->unknown_namespaces[r->n_unknown_namespaces++] = ns;
    }
    return 0;
}

static int h_search(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr__shard *s = ctx;
    int rc = 0;
    vcache vc = {0};
    Tessera__V1__ShardSearchResponse resp = TESSERA__V1__SHARD_SEARCH_RESPONSE__INIT;
    Tessera__V1__ShardSearchRequest *rq = tessera__v1__shard_search_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardSearchRequest: malformed protobuf");
    if (rq->n_queries == 0 || rq->n_queries > MAX_QUERIES) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                 "ShardSearchRequest.queries: %zu queries, expected 1..%d",
                                 rq->n_queries, MAX_QUERIES);
        goto out;
    }
    resp.results = tsr_try_calloc(rq->n_queries, sizeof *resp.results);
    if (resp.results == NULL) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    atomic_fetch_add(&s->searches, (int64_t)rq->n_queries);
    for (size_t i = 0; i < rq->n_queries; i++) {
        char what[64];
        snprintf(what, sizeof what, "queries[%zu]", i);
        if (rq->queries[i]->min_stream_seq > 0 &&
            (rc = wait_applied(s, rq->queries[i]->version, rq->queries[i]->min_stream_seq,
                               what, reply)) != 0)
            goto out;
    }
    for (size_t i = 0; i < rq->n_queries; i++) {
        const Tessera__V1__ShardQuery *q = rq->queries[i];
        const tsr__delta *dl = NULL;
        const tsr__version *v = vc_get(s, &vc, q->version, &dl);
        if (v == NULL) {
            int64_t cur = 0;
            tsr__version *c = tsr__shard_get(s, 0);
            if (c)
                cur = c->version;
            tsr__version_unref(c);
            rc = tsr_rpc_reply_error(reply, TSR_RPC_FAILED_PRECONDITION,
                                     "queries[%zu].version %lld: not held by this shard "
                                     "(current %lld)", i, (long long)q->version, (long long)cur);
            goto out;
        }
        tsr__qresult qr;
        memset(&qr, 0, sizeof qr);
        if ((rc = run_query(reply, v, dl, &vc.scan, q, i, &qr)) != 0) {
            tsr__qresult_close(&qr);
            goto out;
        }
        Tessera__V1__ShardQueryResult *r = calloc(1, sizeof *r);
        if (r == NULL) {
            tsr__qresult_close(&qr);
            rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        tessera__v1__shard_query_result__init(r);
        resp.results[resp.n_results++] = r;
        r->codes_scanned = qr.codes_scanned;
        r->candidates_passed = qr.passed;
        if (unknown_namespaces(v, dl, q, r) != 0) {
            tsr__qresult_close(&qr);
            rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        int e1 = fill_hits(v, dl, qr.dense, qr.ndense, q->return_ids, q->return_datapoints,
                           &r->labels, &r->distances, &r->crowding_tags, &r->ids, &r->datapoints,
                           &r->n_labels, &r->n_distances, &r->n_crowding_tags, &r->n_ids,
                           &r->n_datapoints);
        int e2 = e1 ? e1 : fill_hits(v, dl, qr.sparse, qr.nsparse, q->return_ids,
                                     q->return_datapoints, &r->sparse_labels, &r->sparse_scores,
                                     &r->sparse_crowding_tags, &r->sparse_ids,
                                     &r->sparse_datapoints, &r->n_sparse_labels,
                                     &r->n_sparse_scores, &r->n_sparse_crowding_tags,
                                     &r->n_sparse_ids, &r->n_sparse_datapoints);
        tsr__qresult_close(&qr);
        if (e2) {
            rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
    }
    rc = tsr_rpc_reply_pack(reply, &resp.base);
out:
    for (size_t i = 0; i < resp.n_results; i++)
        free_result(resp.results[i]);
    free(resp.results);
    vc_close(&vc);
    tessera__v1__shard_search_request__free_unpacked(rq, NULL);
    return rc;
}

static int h_read(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr__shard *s = ctx;
    int rc = 0;
    Tessera__V1__ShardReadResponse resp = TESSERA__V1__SHARD_READ_RESPONSE__INIT;
    Tessera__V1__ShardReadRequest *rq = tessera__v1__shard_read_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardReadRequest: malformed protobuf");
    tsr__delta *dl = NULL;
    tsr__version *v = NULL;
    if (rq->min_stream_seq > 0 &&
        (rc = wait_applied(s, rq->version, rq->min_stream_seq, "ShardReadRequest", reply)) != 0)
        goto out;
    v = tsr__shard_get_view(s, rq->version, &dl);
    if (v == NULL) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_FAILED_PRECONDITION,
                                 "ShardReadRequest.version %lld: not held by this shard",
                                 (long long)rq->version);
        goto out;
    }
    resp.datapoints = tsr_try_calloc(rq->n_labels + 1, sizeof *resp.datapoints);
    if (resp.datapoints == NULL) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < rq->n_labels; i++) {
        Tessera__V1__ShardDatapoint *o = calloc(1, sizeof *o);
        if (o == NULL) {
            rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        tessera__v1__shard_datapoint__init(o);
        resp.datapoints[resp.n_datapoints++] = o;
        o->label = rq->labels[i];
        o->list = -1;
        /* the delta first; a masked base label is gone */
        const tsr__rec *r = tsr__delta_find(dl, rq->labels[i], NULL);
        if (r == NULL && !(dl && tsr__i64_in(dl->mask, dl->nmask, rq->labels[i])))
            r = tsr__version_find(v, rq->labels[i]);
        if (r) {
            o->found = 1;
            o->list = r->list;
            if ((o->datapoint = tsr_pb_datapoint_new(&r->dp)) == NULL) {
                rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
                goto out;
            }
        }
    }
    rc = tsr_rpc_reply_pack(reply, &resp.base);
out:
    for (size_t i = 0; i < resp.n_datapoints; i++) {
        tsr_pb_datapoint_delete(resp.datapoints[i]->datapoint);
        free(resp.datapoints[i]);
    }
    free(resp.datapoints);
    tsr__delta_unref(dl);
    tsr__version_unref(v);
    tessera__v1__shard_read_request__free_unpacked(rq, NULL);
    return rc;
}

/* List: one page of the version's own records (never its delta), labels ascending from
 * start_label, columnar (shard.proto). The limit is checked before anything is allocated;
 * the page also stops at LIST_PAGE_BYTES of ids so a reply stays well below the message
 * limit. */
#define LIST_MAX 100000
#define LIST_DEFAULT 10000
#define LIST_PAGE_BYTES ((size_t)1 << 20)

static int h_list(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr__shard *s = ctx;
    int rc = 0;
    Tessera__V1__ShardListResponse resp = TESSERA__V1__SHARD_LIST_RESPONSE__INIT;
    tsr__version *v = NULL;
    Tessera__V1__ShardListRequest *rq = tessera__v1__shard_list_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardListRequest: malformed protobuf");
    if (rq->version <= 0 || rq->limit < 0 || rq->limit > LIST_MAX) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                 "ShardListRequest: version %lld (expected > 0), limit %d "
                                 "(expected 0..%d)", (long long)rq->version, (int)rq->limit,
                                 LIST_MAX);
        goto out;
    }
    if ((v = tsr__shard_get(s, rq->version)) == NULL) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_FAILED_PRECONDITION,
                                 "ShardListRequest.version %lld: not held by this shard",
                                 (long long)rq->version);
        goto out;
    }
    size_t lo = 0, hi = v->nrecs; /* the first record with label >= start_label */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->recs[mid]->label < rq->start_label)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t want = rq->limit ? (size_t)rq->limit : LIST_DEFAULT;
    if (want > v->nrecs - lo)
        want = v->nrecs - lo;
    size_t n = 0, bytes = 0; /* the page: n records, their ids' bytes */
    while (n < want && bytes < LIST_PAGE_BYTES) {
        const char *id = v->recs[lo + n]->dp.id;
        bytes += id ? strlen(id) : 0;
        n++;
    }
    resp.labels = tsr_try_calloc(n + 1, sizeof *resp.labels);
    resp.lists = tsr_try_calloc(n + 1, sizeof *resp.lists);
    resp.id_lengths = tsr_try_calloc(n + 1, sizeof *resp.id_lengths);
    resp.flags.data = tsr_try_calloc(n + 1, 1);
    resp.ids.data = tsr_try_calloc(bytes + 1, 1);
    if (!resp.labels || !resp.lists || !resp.id_lengths || !resp.flags.data || !resp.ids.data) {
        rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const tsr__rec *r = v->recs[lo + i];
        size_t l = r->dp.id ? strlen(r->dp.id) : 0;
        resp.labels[i] = r->label;
        resp.lists[i] = r->list;
        resp.flags.data[i] = (uint8_t)((r->dp.dense != NULL) | (r->dp.nsparse > 0) << 1);
        resp.id_lengths[i] = (uint32_t)l;
        if (l)
            memcpy(resp.ids.data + resp.ids.len, r->dp.id, l);
        resp.ids.len += l;
    }
    resp.n_labels = resp.n_lists = resp.n_id_lengths = resp.flags.len = n;
    resp.version = rq->version;
    resp.total = (int64_t)v->nrecs;
    resp.more = lo + n < v->nrecs;
    resp.next_label = resp.more ? v->recs[lo + n]->label : 0;
    rc = tsr_rpc_reply_pack(reply, &resp.base);
out:
    free(resp.labels);
    free(resp.lists);
    free(resp.id_lengths);
    free(resp.flags.data);
    free(resp.ids.data);
    tsr__version_unref(v);
    tessera__v1__shard_list_request__free_unpacked(rq, NULL);
    return rc;
}

static int h_stage(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__StageResponse resp = TESSERA__V1__STAGE_RESPONSE__INIT;
    Tessera__V1__StageRequest *rq = tessera__v1__stage_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "StageRequest: malformed protobuf");
    int rc = tsr__shard_stage(ctx, rq, &resp, &err); /* checks rq->leader_term */
    tessera__v1__stage_request__free_unpacked(rq, NULL);
    if (rc != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    return tsr_rpc_reply_pack(reply, &resp.base);
}

static int h_prepare(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__PrepareResponse resp = TESSERA__V1__PREPARE_RESPONSE__INIT;
    Tessera__V1__PrepareRequest *rq = tessera__v1__prepare_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "PrepareRequest: malformed protobuf");
    int64_t version = rq->version, term = rq->leader_term;
    unsigned pct = rq->build_cpu_percent;
    tessera__v1__prepare_request__free_unpacked(rq, NULL);
    if (tsr__shard_prepare(ctx, term, version, pct, &resp, &err) != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    return tsr_rpc_reply_pack(reply, &resp.base);
}

static int h_commit(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__CommitRequest *rq = tessera__v1__commit_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "CommitRequest: malformed protobuf");
    Tessera__V1__CommitResponse resp = TESSERA__V1__COMMIT_RESPONSE__INIT;
    resp.version = rq->version;
    int64_t term = rq->leader_term;
    tessera__v1__commit_request__free_unpacked(rq, NULL);
    if (tsr__shard_commit(ctx, term, resp.version, &err) != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    return tsr_rpc_reply_pack(reply, &resp.base);
}

static int h_abort(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__AbortRequest *rq = tessera__v1__abort_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "AbortRequest: malformed protobuf");
    int64_t version = rq->version, term = rq->leader_term;
    tessera__v1__abort_request__free_unpacked(rq, NULL);
    if (tsr__shard_abort(ctx, term, version, &err) != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    return 0;
}

static int h_release(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__ReleaseRequest *rq = tessera__v1__release_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ReleaseRequest: malformed protobuf");
    int64_t below = rq->below_version, term = rq->leader_term;
    tessera__v1__release_request__free_unpacked(rq, NULL);
    int64_t vs[TSR__HELD_CAP];
    size_t n = 0;
    if (tsr__shard_release(ctx, term, below, vs, TSR__HELD_CAP, &n, &err) != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    Tessera__V1__ReleaseResponse resp = TESSERA__V1__RELEASE_RESPONSE__INIT;
    resp.versions = vs;
    resp.n_versions = n;
    return tsr_rpc_reply_pack(reply, &resp.base);
}

/* Dense and sparse datapoint counts of v with its delta d. */
static void view_counts(const tsr__version *v, const tsr__delta *d, int64_t *vec, int64_t *sp)
{
    *vec = (int64_t)v->nvectors;
    *sp = (int64_t)v->nsparse;
    if (d) {
        *vec += d->rvec - d->mvec;
        *sp += d->rsparse - d->msparse;
    }
}

/* Stats' memory fields of v with its delta d (nvec dense datapoints). */
static void memory_fields(const tsr__version *v, const tsr__delta *d, int64_t nvec,
                          Tessera__V1__ShardStatsResponse *resp)
{
    uint64_t anon, mapped;
    tsr__version_memory_split(v, d, &anon, &mapped);
    resp->anonymous_bytes = (int64_t)anon;
    resp->mapped_bytes = (int64_t)mapped;
    resp->anonymous_bytes_per_vector = nvec > 0 ? (double)anon / (double)nvec : 0.0;
    resp->mapped_bytes_per_vector = nvec > 0 ? (double)mapped / (double)nvec : 0.0;
}

/* Stats' lists and list_sizes of v with its delta d: the non-empty lists. */
static int stats_lists(const tsr__version *v, const tsr__delta *d,
                       Tessera__V1__ShardStatsResponse *resp, int32_t **lists, int64_t **sizes)
{
    *lists = tsr_try_malloc(v->nlist + 1, sizeof **lists);
    *sizes = tsr_try_calloc(v->nlist + 1, sizeof **sizes);
    if (!*lists || !*sizes)
        return TSR_ENOMEM;
    int64_t *n = *sizes;
    for (size_t i = 0; i < v->nlist; i++)
        n[i] = (v->lists[i] ? (int64_t)v->lists[i]->n : 0) +
               (d && d->lists[i] ? (int64_t)d->lists[i]->n : 0);
    for (size_t j = 0; d && j < d->nmask; j++) {
        const tsr__rec *r = tsr__version_find(v, d->mask[j]);
        if (r && r->list >= 0)
            n[r->list]--;
    }
    for (size_t i = 0; i < v->nlist; i++)
        if (n[i] > 0) {
            (*lists)[resp->n_lists] = (int32_t)i;
            n[resp->n_lists++] = n[i]; /* compacts in place: resp->n_lists <= i */
        }
    resp->lists = *lists;
    resp->list_sizes = *sizes;
    resp->n_list_sizes = resp->n_lists;
    return 0;
}

static int h_write(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__ShardWriteRequest *rq = tessera__v1__shard_write_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardWriteRequest: malformed protobuf");
    Tessera__V1__ShardWriteResponse resp = TESSERA__V1__SHARD_WRITE_RESPONSE__INIT;
    int rc = tsr__shard_term_check(ctx, rq->leader_term, &err);
    if (rc == 0)
        rc = tsr__shard_write(ctx, req, len, rq, &resp, &err);
    tessera__v1__shard_write_request__free_unpacked(rq, NULL);
    if (rc != 0)
        return tsr_rpc_reply_from_error(reply, &err);
    return tsr_rpc_reply_pack(reply, &resp.base);
}

static int h_stats(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *reply)
{
    tsr__shard *s = ctx;
    Tessera__V1__ShardStatsRequest *rq = tessera__v1__shard_stats_request__unpack(NULL, len, req);
    if (rq == NULL)
        return tsr_rpc_reply_error(reply, TSR_RPC_INVALID_ARGUMENT,
                                   "ShardStatsRequest: malformed protobuf");
    tessera__v1__shard_stats_request__free_unpacked(rq, NULL);
    tsr__held held[TSR__HELD_CAP];
    int staging = 0;
    int64_t sv = 0, cur = 0;
    size_t n = tsr__shard_list(s, held, TSR__HELD_CAP, &staging, &sv, &cur);
    Tessera__V1__ShardStatsResponse resp = TESSERA__V1__SHARD_STATS_RESPONSE__INIT;
    Tessera__V1__ShardVersion vers[TSR__HELD_CAP + 1];
    Tessera__V1__ShardVersion *vp[TSR__HELD_CAP + 1];
    const tsr__version *c = NULL;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        tessera__v1__shard_version__init(&vers[i]);
        vers[i].version = held[i].v->version;
        vers[i].state = held[i].state == TSR__PREPARED ? TESSERA__V1__SHARD_VERSION__STATE__PREPARED
                                                       : TESSERA__V1__SHARD_VERSION__STATE__SERVING;
        vers[i].current = held[i].v->version == cur;
        tsr__delta *hd = NULL;
        tsr__version *hv = tsr__shard_get_view(s, held[i].v->version, &hd);
        view_counts(held[i].v, hv == held[i].v ? hd : NULL, &vers[i].vectors_count,
                    &vers[i].sparse_vectors_count);
        tsr__delta_unref(hd);
        tsr__version_unref(hv);
        vp[i] = &vers[i];
        if (vers[i].current)
            c = held[i].v;
        resp.memory_bytes += (int64_t)tsr__version_memory(held[i].v);
        resp.disk_bytes += (int64_t)held[i].v->disk_bytes;
    }
    size_t nv = n;
    if (staging) {
        tessera__v1__shard_version__init(&vers[nv]);
        vers[nv].version = sv;
        vers[nv].state = TESSERA__V1__SHARD_VERSION__STATE__STAGING;
        vp[nv] = &vers[nv];
        nv++;
    }
    resp.versions = vp;
    resp.n_versions = nv;
    resp.current_version = cur;
    int32_t *lists = NULL;
    int64_t *sizes = NULL;
    tsr__delta *cd = NULL;
    tsr__version *cv = c ? tsr__shard_get_view(s, c->version, &cd) : NULL;
    if (cv != c) { /* replaced meanwhile: answer without its delta */
        tsr__delta_unref(cd);
        cd = NULL;
    }
    resp.wal_bytes = atomic_load(&s->wal_bytes);
    if (c) {
        view_counts(c, cd, &resp.vectors_count, &resp.sparse_vectors_count);
        memory_fields(c, cd, resp.vectors_count, &resp);
        resp.stream_seq = tsr__applied_seq(c, cd);
        resp.delta_upserts = cd ? (int64_t)cd->nrecs : 0;
        resp.delta_deletes = cd ? (int64_t)cd->ndeletes : 0;
        if (c->tmpl) {
            resp.dimension = c->tmpl->ix->d;
            resp.nlist = (int32_t)c->nlist;
            resp.metric = c->tmpl->ix->metric == TSR_METRIC_L2 ? "L2" : "IP";
        }
        if (stats_lists(c, cd, &resp, &lists, &sizes) != 0) {
            rc = tsr_rpc_reply_error(reply, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
    }
    rc = tsr_rpc_reply_pack(reply, &resp.base);
out:
    tsr__delta_unref(cd);
    tsr__version_unref(cv);
    free(lists);
    free(sizes);
    for (size_t i = 0; i < n; i++)
        tsr__version_unref(held[i].v);
    return rc;
}

static const struct {
    const char *m;
    tsr_rpc_handler_fn fn;
    unsigned flags;
} methods[] = {
    {"Search", h_search, 0},
    {"Read", h_read, 0},
    {"Stage", h_stage, TSR_RPC_LONG},
    {"Prepare", h_prepare, TSR_RPC_LONG},
    {"Commit", h_commit, TSR_RPC_LONG},
    {"Abort", h_abort, TSR_RPC_LONG},
    {"Release", h_release, TSR_RPC_LONG},
    {"Stats", h_stats, 0},
    {"Write", h_write, TSR_RPC_LONG},
    {"List", h_list, 0},
};

/* The request type whose nesting the server checks before the handler runs: staged and
 * written datapoints carry embedding_metadata, a google.protobuf.Struct (recursive). */
static const ProtobufCMessageDescriptor *req_type_of(const char *m)
{
    if (strcmp(m, "Stage") == 0)
        return &tessera__v1__stage_request__descriptor;
    if (strcmp(m, "Write") == 0)
        return &tessera__v1__shard_write_request__descriptor;
    return NULL;
}

int tsr_shard_service_register(tsr_rpc_server *srv, tsr__shard *s)
{
    char path[128];
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        snprintf(path, sizeof path, "/tessera.v1.Shard/%s", methods[i].m);
        int rc = tsr_rpc_server_add_method(srv, path, methods[i].fn, s, methods[i].flags);
        if (rc != 0)
            return rc;
        const ProtobufCMessageDescriptor *t = req_type_of(methods[i].m);
        if (t && tsr_rpc_server_set_request_type(srv, path, t))
            return TSR_EINTERNAL;
    }
    return 0;
}

tsr_rpc_handler_fn tsr_shard_service_handler(const char *method,
                                             const ProtobufCMessageDescriptor **req_type)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(methods[i].m, method) == 0) {
            *req_type = req_type_of(method);
            return methods[i].fn;
        }
    *req_type = NULL;
    return NULL;
}

/* The /metrics collector (docs/operations.md): the served version's number, dense
 * datapoints and non-empty lists — the same numbers as Stats' current_version,
 * vectors_count and lists, the delta included — the streaming gauges and the memory
 * gauges (Stats' anonymous / mapped bytes, total and per vector; docs/shard.md),
 * read at each scrape on the metrics thread (a version reference only, as a Search
 * takes). */
static void collect(void *ud)
{
    tsr__shard *s = ud;
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(s, 0, &d);
    if (v == NULL)
        return;
    Tessera__V1__ShardStatsResponse st = TESSERA__V1__SHARD_STATS_RESPONSE__INIT;
    int32_t *lists = NULL;
    int64_t *sizes = NULL;
    int64_t vec, sp;
    view_counts(v, d, &vec, &sp);
    if (stats_lists(v, d, &st, &lists, &sizes) == 0) {
        tsr_metrics_version_set((uint64_t)v->version);
        tsr_metrics_index_size((uint64_t)vec, (uint64_t)st.n_lists);
    }
    free(lists);
    free(sizes);
    tsr_metrics_gauge_set("tessera_shard_delta_records", NULL,
                          d ? (double)(d->nrecs + d->ndeletes) : 0.0);
    tsr_metrics_gauge_set("tessera_shard_wal_bytes", NULL, (double)atomic_load(&s->wal_bytes));
    tsr_metrics_gauge_set("tessera_shard_stream_seq", NULL, (double)tsr__applied_seq(v, d));
    memory_fields(v, d, vec, &st);
    tsr_metrics_gauge_set("tessera_shard_anonymous_bytes", NULL, (double)st.anonymous_bytes);
    tsr_metrics_gauge_set("tessera_shard_mapped_bytes", NULL, (double)st.mapped_bytes);
    tsr_metrics_gauge_set("tessera_shard_anonymous_bytes_per_vector", NULL,
                          st.anonymous_bytes_per_vector);
    tsr_metrics_gauge_set("tessera_shard_mapped_bytes_per_vector", NULL,
                          st.mapped_bytes_per_vector);
    tsr__delta_unref(d);
    tsr__version_unref(v);
}

int tsr_shard_metrics_register(tsr__shard *s)
{
    return tsr_metrics_add_collector(collect, s);
}
