/*
 * service — the tessera.v1.Shard RPC handlers: decode and validate each request
 * (malformed protobuf, wrong dimension, unknown or duplicate list, k out of 1..10000,
 * empty query → INVALID_ARGUMENT with a message naming the query and field; a version the
 * shard does not hold → FAILED_PRECONDITION), run it on an immutable version snapshot
 * (scan.c) or on the update state (update.c), and fill the reply. Typed handlers
 * (net/rpc_typed.h): the layer decodes, checks nesting, maps errors, packs and frees; each
 * method's resp_free frees what its handler attached, and references a reply borrows from
 * (version snapshots) are released by deferred cleanups after packing.
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
#include "net/rpc_typed.h"
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
    if (q->n_vector == 0 && !has_sparse &&
        !(q->check_namespaces && (q->n_restricts || q->n_numeric_restricts)))
        return bad(reply, "queries[%zu]: empty query (no %s, no sparse, no namespaces to check)",
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

/* RESOURCE_EXHAUSTED "out of memory" (no TSR code maps to it with that message). */
static int oom(tsr_rpc_ctx *ctx)
{
    return tsr_rpc_ctx_error(ctx, TSR_RPC_RESOURCE_EXHAUSTED, "out of memory");
}

static void search_resp_free(void *p)
{
    Tessera__V1__ShardSearchResponse *resp = p;
    for (size_t i = 0; i < resp->n_results; i++)
        free_result(resp->results[i]);
    free(resp->results);
}

static void vc_free(void *p)
{
    vc_close(p);
    free(p);
}

TSR_RPC_HANDLER(h_search, Tessera__V1__ShardSearchRequest, Tessera__V1__ShardSearchResponse)
{
    tsr__shard *s = tsr_rpc_ctx_app(ctx);
    tsr_rpc_reply *reply = tsr_rpc_ctx_reply(ctx);
    int rc;
    if (rq->n_queries == 0 || rq->n_queries > MAX_QUERIES)
        return tsr_err(err, TSR_EINVAL, "ShardSearchRequest.queries: %zu queries, expected 1..%d",
                       rq->n_queries, MAX_QUERIES);
    /* the versions the results borrow strings from: released after the reply is packed */
    vcache *vc = tsr_try_calloc(1, sizeof *vc);
    if (vc == NULL)
        return oom(ctx);
    tsr_rpc_ctx_defer(ctx, vc_free, vc); /* the first of the call: never refused */
    resp->results = tsr_try_calloc(rq->n_queries, sizeof *resp->results);
    if (resp->results == NULL)
        return oom(ctx);
    atomic_fetch_add(&s->searches, (int64_t)rq->n_queries);
    for (size_t i = 0; i < rq->n_queries; i++) {
        char what[64];
        snprintf(what, sizeof what, "queries[%zu]", i);
        if (rq->queries[i]->min_stream_seq > 0 &&
            (rc = wait_applied(s, rq->queries[i]->version, rq->queries[i]->min_stream_seq,
                               what, reply)) != 0)
            return rc;
    }
    for (size_t i = 0; i < rq->n_queries; i++) {
        const Tessera__V1__ShardQuery *q = rq->queries[i];
        const tsr__delta *dl = NULL;
        const tsr__version *v = vc_get(s, vc, q->version, &dl);
        if (v == NULL) {
            int64_t cur = 0;
            tsr__version *c = tsr__shard_get(s, 0);
            if (c)
                cur = c->version;
            tsr__version_unref(c);
            return tsr_err(err, TSR_ESTATE, "queries[%zu].version %lld: not held by this shard "
                           "(current %lld)", i, (long long)q->version, (long long)cur);
        }
        tsr__qresult qr;
        memset(&qr, 0, sizeof qr);
        if ((rc = run_query(reply, v, dl, &vc->scan, q, i, &qr)) != 0) {
            tsr__qresult_close(&qr);
            return rc;
        }
        Tessera__V1__ShardQueryResult *r = calloc(1, sizeof *r);
        if (r == NULL) {
            tsr__qresult_close(&qr);
            return oom(ctx);
        }
        tessera__v1__shard_query_result__init(r);
        resp->results[resp->n_results++] = r;
        r->codes_scanned = qr.codes_scanned;
        r->candidates_passed = qr.passed;
        if (q->check_namespaces && unknown_namespaces(v, dl, q, r) != 0) {
            tsr__qresult_close(&qr);
            return oom(ctx);
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
        if (e2)
            return oom(ctx);
    }
    return 0;
}

static void read_resp_free(void *p)
{
    Tessera__V1__ShardReadResponse *resp = p;
    for (size_t i = 0; i < resp->n_datapoints; i++) {
        tsr_pb_datapoint_delete(resp->datapoints[i]->datapoint);
        free(resp->datapoints[i]);
    }
    free(resp->datapoints);
}

static void unref_version(void *v)
{
    tsr__version_unref(v);
}

static void unref_delta(void *d)
{
    tsr__delta_unref(d);
}

TSR_RPC_HANDLER(h_read, Tessera__V1__ShardReadRequest, Tessera__V1__ShardReadResponse)
{
    tsr__shard *s = tsr_rpc_ctx_app(ctx);
    int rc;
    if (rq->min_stream_seq > 0 &&
        (rc = wait_applied(s, rq->version, rq->min_stream_seq, "ShardReadRequest",
                           tsr_rpc_ctx_reply(ctx))) != 0)
        return rc;
    tsr__delta *dl = NULL;
    tsr__version *v = tsr__shard_get_view(s, rq->version, &dl);
    if (v == NULL)
        return tsr_err(err, TSR_ESTATE, "ShardReadRequest.version %lld: not held by this shard",
                       (long long)rq->version);
    /* the datapoints may borrow from the view: released after the reply is packed */
    tsr_rpc_ctx_defer(ctx, unref_version, v);
    tsr_rpc_ctx_defer(ctx, unref_delta, dl);
    resp->datapoints = tsr_try_calloc(rq->n_labels + 1, sizeof *resp->datapoints);
    if (resp->datapoints == NULL)
        return oom(ctx);
    for (size_t i = 0; i < rq->n_labels; i++) {
        Tessera__V1__ShardDatapoint *o = calloc(1, sizeof *o);
        if (o == NULL)
            return oom(ctx);
        tessera__v1__shard_datapoint__init(o);
        resp->datapoints[resp->n_datapoints++] = o;
        o->label = rq->labels[i];
        o->list = -1;
        /* the delta first; a masked base label is gone */
        const tsr__rec *r = tsr__delta_find(dl, rq->labels[i], NULL);
        if (r == NULL && !(dl && tsr__i64_in(dl->mask, dl->nmask, rq->labels[i])))
            r = tsr__version_find(v, rq->labels[i]);
        if (r) {
            o->found = 1;
            o->list = r->list;
            if ((o->datapoint = tsr_pb_datapoint_new(&r->dp)) == NULL)
                return oom(ctx);
        }
    }
    return 0;
}

/* List: one page of the version's own records (never its delta), labels ascending from
 * start_label, columnar (shard.proto). The limit is checked before anything is allocated;
 * the page also stops at LIST_PAGE_BYTES of ids so a reply stays well below the message
 * limit. */
#define LIST_MAX 100000
#define LIST_DEFAULT 10000
#define LIST_PAGE_BYTES ((size_t)1 << 20)

static void list_resp_free(void *p)
{
    Tessera__V1__ShardListResponse *resp = p;
    free(resp->labels);
    free(resp->lists);
    free(resp->id_lengths);
    free(resp->flags.data);
    free(resp->ids.data);
}

/* The page of v from start_label (at most limit entries, 0 = LIST_DEFAULT) into resp
 * (copies: nothing borrows v). */
static int list_page(const tsr__version *v, int64_t start_label, int32_t limit,
                     Tessera__V1__ShardListResponse *resp)
{
    size_t lo = 0, hi = v->nrecs; /* the first record with label >= start_label */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->recs[mid]->label < start_label)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t want = limit ? (size_t)limit : LIST_DEFAULT;
    if (want > v->nrecs - lo)
        want = v->nrecs - lo;
    size_t n = 0, bytes = 0; /* the page: n records, their ids' bytes */
    while (n < want && bytes < LIST_PAGE_BYTES) {
        const char *id = v->recs[lo + n]->dp.id;
        bytes += id ? strlen(id) : 0;
        n++;
    }
    resp->labels = tsr_try_calloc(n + 1, sizeof *resp->labels);
    resp->lists = tsr_try_calloc(n + 1, sizeof *resp->lists);
    resp->id_lengths = tsr_try_calloc(n + 1, sizeof *resp->id_lengths);
    resp->flags.data = tsr_try_calloc(n + 1, 1);
    resp->ids.data = tsr_try_calloc(bytes + 1, 1);
    if (!resp->labels || !resp->lists || !resp->id_lengths || !resp->flags.data ||
        !resp->ids.data)
        return TSR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const tsr__rec *r = v->recs[lo + i];
        size_t l = r->dp.id ? strlen(r->dp.id) : 0;
        resp->labels[i] = r->label;
        resp->lists[i] = r->list;
        resp->flags.data[i] = (uint8_t)((r->dp.dense != NULL) | (r->dp.nsparse > 0) << 1);
        resp->id_lengths[i] = (uint32_t)l;
        if (l)
            memcpy(resp->ids.data + resp->ids.len, r->dp.id, l);
        resp->ids.len += l;
    }
    resp->n_labels = resp->n_lists = resp->n_id_lengths = resp->flags.len = n;
    resp->total = (int64_t)v->nrecs;
    resp->more = lo + n < v->nrecs;
    resp->next_label = resp->more ? v->recs[lo + n]->label : 0;
    return 0;
}

TSR_RPC_HANDLER(h_list, Tessera__V1__ShardListRequest, Tessera__V1__ShardListResponse)
{
    tsr__shard *s = tsr_rpc_ctx_app(ctx);
    if (rq->version <= 0 || rq->limit < 0 || rq->limit > LIST_MAX)
        return tsr_err(err, TSR_EINVAL, "ShardListRequest: version %lld (expected > 0), limit %d "
                       "(expected 0..%d)", (long long)rq->version, (int)rq->limit, LIST_MAX);
    tsr__version *v = tsr__shard_get(s, rq->version);
    if (v == NULL)
        return tsr_err(err, TSR_ESTATE, "ShardListRequest.version %lld: not held by this shard",
                       (long long)rq->version);
    int rc = list_page(v, rq->start_label, rq->limit, resp);
    tsr__version_unref(v);
    if (rc != 0)
        return oom(ctx);
    resp->version = rq->version;
    return 0;
}

TSR_RPC_HANDLER(h_stage, Tessera__V1__StageRequest, Tessera__V1__StageResponse)
{
    return tsr__shard_stage(tsr_rpc_ctx_app(ctx), rq, resp, err); /* checks rq->leader_term */
}

TSR_RPC_HANDLER(h_prepare, Tessera__V1__PrepareRequest, Tessera__V1__PrepareResponse)
{
    return tsr__shard_prepare(tsr_rpc_ctx_app(ctx), rq->leader_term, rq->version,
                              rq->build_cpu_percent, resp, err);
}

TSR_RPC_HANDLER(h_commit, Tessera__V1__CommitRequest, Tessera__V1__CommitResponse)
{
    resp->version = rq->version;
    return tsr__shard_commit(tsr_rpc_ctx_app(ctx), rq->leader_term, rq->version, err);
}

TSR_RPC_HANDLER(h_abort, Tessera__V1__AbortRequest, Tessera__V1__AbortResponse)
{
    return tsr__shard_abort(tsr_rpc_ctx_app(ctx), rq->leader_term, rq->version, err);
}

static void release_resp_free(void *p)
{
    free(((Tessera__V1__ReleaseResponse *)p)->versions);
}

TSR_RPC_HANDLER(h_release, Tessera__V1__ReleaseRequest, Tessera__V1__ReleaseResponse)
{
    if ((resp->versions = tsr_try_malloc(TSR__HELD_CAP, sizeof *resp->versions)) == NULL)
        return oom(ctx);
    return tsr__shard_release(tsr_rpc_ctx_app(ctx), rq->leader_term, rq->below_version,
                              resp->versions, TSR__HELD_CAP, &resp->n_versions, err);
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

TSR_RPC_HANDLER(h_write, Tessera__V1__ShardWriteRequest, Tessera__V1__ShardWriteResponse)
{
    tsr__shard *s = tsr_rpc_ctx_app(ctx);
    size_t len;
    const uint8_t *raw = tsr_rpc_ctx_raw(ctx, &len); /* logged verbatim */
    int rc = tsr__shard_term_check(s, rq->leader_term, err);
    return rc != 0 ? rc : tsr__shard_write(s, raw, len, rq, resp, err);
}

/* Stats' versions (held ones and the staging one), kept until the reply is packed. */
typedef struct stats_versions {
    Tessera__V1__ShardVersion vers[TSR__HELD_CAP + 1];
    Tessera__V1__ShardVersion *vp[TSR__HELD_CAP + 1];
} stats_versions;

static void stats_resp_free(void *p)
{
    Tessera__V1__ShardStatsResponse *resp = p;
    free(resp->lists);
    free(resp->list_sizes);
}

/* Stats' fields of the current version c (its delta snapshot taken now). */
static int stats_current(tsr__shard *s, const tsr__version *c,
                         Tessera__V1__ShardStatsResponse *resp)
{
    tsr__delta *cd = NULL;
    tsr__version *cv = tsr__shard_get_view(s, c->version, &cd);
    if (cv != c) { /* replaced meanwhile: answer without its delta */
        tsr__delta_unref(cd);
        cd = NULL;
    }
    view_counts(c, cd, &resp->vectors_count, &resp->sparse_vectors_count);
    memory_fields(c, cd, resp->vectors_count, resp);
    resp->stream_seq = tsr__applied_seq(c, cd);
    resp->delta_upserts = cd ? (int64_t)cd->nrecs : 0;
    resp->delta_deletes = cd ? (int64_t)cd->ndeletes : 0;
    if (c->tmpl) {
        resp->dimension = c->tmpl->ix->d;
        resp->nlist = (int32_t)c->nlist;
        resp->metric = c->tmpl->ix->metric == TSR_METRIC_L2 ? "L2" : "IP";
    }
    int32_t *lists = NULL;
    int64_t *sizes = NULL;
    int rc = stats_lists(c, cd, resp, &lists, &sizes);
    if (rc != 0) { /* not attached to resp */
        free(lists);
        free(sizes);
    }
    tsr__delta_unref(cd);
    tsr__version_unref(cv);
    return rc;
}

TSR_RPC_HANDLER(h_stats, Tessera__V1__ShardStatsRequest, Tessera__V1__ShardStatsResponse)
{
    tsr__shard *s = tsr_rpc_ctx_app(ctx);
    stats_versions *sv = tsr_try_malloc(1, sizeof *sv);
    if (sv == NULL)
        return oom(ctx);
    tsr_rpc_ctx_defer(ctx, free, sv);
    tsr__held held[TSR__HELD_CAP];
    int staging = 0;
    int64_t staging_version = 0, cur = 0;
    size_t n = tsr__shard_list(s, held, TSR__HELD_CAP, &staging, &staging_version, &cur);
    const tsr__version *c = NULL;
    for (size_t i = 0; i < n; i++) {
        Tessera__V1__ShardVersion *sv_i = &sv->vers[i];
        tessera__v1__shard_version__init(sv_i);
        sv_i->version = held[i].v->version;
        sv_i->state = held[i].state == TSR__PREPARED ? TESSERA__V1__SHARD_VERSION__STATE__PREPARED
                                                     : TESSERA__V1__SHARD_VERSION__STATE__SERVING;
        sv_i->current = held[i].v->version == cur;
        tsr__delta *hd = NULL;
        tsr__version *hv = tsr__shard_get_view(s, held[i].v->version, &hd);
        view_counts(held[i].v, hv == held[i].v ? hd : NULL, &sv_i->vectors_count,
                    &sv_i->sparse_vectors_count);
        tsr__delta_unref(hd);
        tsr__version_unref(hv);
        sv->vp[i] = sv_i;
        if (sv_i->current)
            c = held[i].v;
        resp->memory_bytes += (int64_t)tsr__version_memory(held[i].v);
        resp->disk_bytes += (int64_t)held[i].v->disk_bytes;
    }
    size_t nv = n;
    if (staging) {
        tessera__v1__shard_version__init(&sv->vers[nv]);
        sv->vers[nv].version = staging_version;
        sv->vers[nv].state = TESSERA__V1__SHARD_VERSION__STATE__STAGING;
        sv->vp[nv] = &sv->vers[nv];
        nv++;
    }
    resp->versions = sv->vp;
    resp->n_versions = nv;
    resp->current_version = cur;
    resp->wal_bytes = atomic_load(&s->wal_bytes);
    int rc = c ? stats_current(s, c, resp) : 0;
    for (size_t i = 0; i < n; i++)
        tsr__version_unref(held[i].v);
    return rc != 0 ? oom(ctx) : 0;
}

#define SHARD_SVC "/tessera.v1.Shard/"
#define METHOD(name, h, req, resp, free_fn, flags)                                         \
    {SHARD_SVC name, &tessera__v1__##req##__descriptor, &tessera__v1__##resp##__descriptor, \
     h, free_fn, flags, 0}

/* Staged and written datapoints carry embedding_metadata, a google.protobuf.Struct: the
 * layer checks the nesting of Stage and Write requests (rpc_typed.h). */
static const tsr_rpc_method methods[] = {
    METHOD("Search", h_search, shard_search_request, shard_search_response, search_resp_free,
           0),
    METHOD("Read", h_read, shard_read_request, shard_read_response, read_resp_free, 0),
    METHOD("Stage", h_stage, stage_request, stage_response, NULL, TSR_RPC_LONG),
    METHOD("Prepare", h_prepare, prepare_request, prepare_response, NULL, TSR_RPC_LONG),
    METHOD("Commit", h_commit, commit_request, commit_response, NULL, TSR_RPC_LONG),
    METHOD("Abort", h_abort, abort_request, abort_response, NULL, TSR_RPC_LONG),
    METHOD("Release", h_release, release_request, release_response, release_resp_free,
           TSR_RPC_LONG),
    METHOD("Stats", h_stats, shard_stats_request, shard_stats_response, stats_resp_free, 0),
    METHOD("Write", h_write, shard_write_request, shard_write_response, NULL, TSR_RPC_LONG),
    METHOD("List", h_list, shard_list_request, shard_list_response, list_resp_free, 0),
};

int tsr_shard_service_register(tsr_rpc_server *srv, tsr__shard *s)
{
    return tsr_rpc_server_add_typed(srv, methods, sizeof methods / sizeof methods[0], s);
}

const tsr_rpc_method *tsr_shard_service_method(const char *method)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(methods[i].path + strlen(SHARD_SVC), method) == 0)
            return &methods[i];
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
