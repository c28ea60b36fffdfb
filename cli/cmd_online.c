/*
 * cmd_online — the client commands of `tessera` that talk to a running coordinator over
 * gRPC (tessera.v1.VectorSearch): query, update, read, stats.
 *
 * Output is a human-readable table by default and one JSON document with --json, so that
 * scripts and tests can parse it. Exit codes: 0 success, 1 the server said no (or the
 * batch was rejected), 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/clock.h"
#include "core/cmdline.h"
#include "core/mem.h"
#include "net/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"
#include "index/vecs_io.h"

#define SVC "/tessera.v1.VectorSearch/"

/* ------------------------------------------------------------------ small parsers */

static int parse_floats(const char *s, float **out, size_t *n)
{
    size_t cap = 16, len = 0;
    float *v = tsr_xmalloc(cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        float f = strtof(p, &end);
        if (end == p || errno == ERANGE || !isfinite(f)) {
            free(v);
            return -1;
        }
        if (len == cap)
            v = tsr_xrealloc(v, (cap *= 2) * sizeof *v);
        v[len++] = f;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',')
            p++;
        else if (*p != '\0') {
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = len;
    return len > 0 ? 0 : -1;
}

/* "40:0.1,901:-0.2" */
static int parse_sparse(const char *s, Tessera__V1__SparseEmbedding *se)
{
    size_t cap = 8;
    se->values = tsr_xmalloc(cap * sizeof(float));
    se->dimensions = tsr_xmalloc(cap * sizeof(int64_t));
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long dim = strtoll(p, &end, 10);
        if (end == p || *end != ':' || errno)
            return -1;
        p = end + 1;
        float v = strtof(p, &end);
        if (end == p || !isfinite(v))
            return -1;
        if (se->n_values == cap) {
            cap *= 2;
            se->values = tsr_xrealloc(se->values, cap * sizeof(float));
            se->dimensions = tsr_xrealloc(se->dimensions, cap * sizeof(int64_t));
        }
        se->values[se->n_values] = v;
        se->dimensions[se->n_values] = dim;
        se->n_values++;
        se->n_dimensions++;
        p = end;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
    }
    return se->n_values > 0 ? 0 : -1;
}

typedef struct {
    Tessera__V1__Restriction **v;
    size_t n;
} restrict_list;

static Tessera__V1__Restriction *restriction_for(restrict_list *l, const char *ns, size_t nslen)
{
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->v[i]->namespace_) == nslen && memcmp(l->v[i]->namespace_, ns, nslen) == 0)
            return l->v[i];
    Tessera__V1__Restriction *r = tsr_xmalloc(sizeof *r);
    tessera__v1__restriction__init(r);
    r->namespace_ = tsr_xstrndup(ns, nslen);
    l->v = tsr_xrealloc(l->v, (l->n + 1) * sizeof *l->v);
    l->v[l->n++] = r;
    return r;
}

/* "ns=a,b" into the allow (or deny) list of namespace ns */
static int parse_restrict(restrict_list *l, const char *arg, int deny)
{
    const char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg || eq[1] == '\0')
        return -1;
    Tessera__V1__Restriction *r = restriction_for(l, arg, (size_t)(eq - arg));
    const char *p = eq + 1;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0)
            return -1;
        char ***list = deny ? &r->deny_list : &r->allow_list;
        size_t *n = deny ? &r->n_deny_list : &r->n_allow_list;
        *list = tsr_xrealloc(*list, (*n + 1) * sizeof **list);
        (*list)[(*n)++] = tsr_xstrndup(p, len);
        p += len + (c ? 1 : 0);
    }
    return 0;
}

/* "ns>=3", "ns<2.5", "ns==7", "ns!=1.5f": int when it parses as one, float with an f
 * suffix, double otherwise. */
static Tessera__V1__NumericRestriction *parse_numeric(const char *arg)
{
    static const struct {
        const char *tok;
        Tessera__V1__NumericRestriction__Operator op;
    } ops[] = {
        {"<=", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__LESS_EQUAL},
        {">=", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__GREATER_EQUAL},
        {"!=", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__NOT_EQUAL},
        {"==", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__EQUAL},
        {"=", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__EQUAL},
        {"<", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__LESS},
        {">", TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__GREATER},
    };
    const char *pos = strpbrk(arg, "<>=!");
    if (pos == NULL || pos == arg)
        return NULL;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        size_t tl = strlen(ops[i].tok);
        if (strncmp(pos, ops[i].tok, tl) != 0)
            continue;
        const char *val = pos + tl;
        if (*val == '\0')
            return NULL;
        Tessera__V1__NumericRestriction *nr = tsr_xmalloc(sizeof *nr);
        tessera__v1__numeric_restriction__init(nr);
        nr->namespace_ = tsr_xstrndup(arg, (size_t)(pos - arg));
        nr->op = ops[i].op;
        char *end;
        errno = 0;
        long long iv = strtoll(val, &end, 10);
        if (*end == '\0' && errno == 0) {
            nr->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT;
            nr->value_int = iv;
            return nr;
        }
        double dv = strtod(val, &end);
        if (end != val && (*end == 'f' || *end == 'F') && end[1] == '\0') {
            nr->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT;
            nr->value_float = (float)dv;
            return nr;
        }
        if (end != val && *end == '\0' && isfinite(dv)) {
            nr->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE;
            nr->value_double = dv;
            return nr;
        }
        free(nr->namespace_);
        free(nr);
        return NULL;
    }
    return NULL;
}

/* --tls-* flags of every online command (long-only option codes) */
enum { OPT_TLS_CA = 1000, OPT_TLS_CERT, OPT_TLS_KEY, OPT_TLS_NAME };
#define TLS_LONG_OPTS                                                                      \
    {"tls-ca", 1, 0, OPT_TLS_CA}, {"tls-cert", 1, 0, OPT_TLS_CERT},                        \
        {"tls-key", 1, 0, OPT_TLS_KEY}, {"tls-server-name", 1, 0, OPT_TLS_NAME}
#define TLS_USAGE                                                                          \
    "  --tls-ca FILE          use TLS, trusting this CA (PEM) for the coordinator's certificate\n" \
    "  --tls-cert FILE --tls-key FILE  client certificate (coordinator with mutual TLS)\n"       \
    "  --tls-server-name N    name to check in the certificate instead of ADDR's host\n"
typedef struct {
    const char *ca, *cert, *key, *name;
} tls_flags;

/* Takes one --tls-* option; returns 1 when c was one. */
static int tls_opt(tls_flags *t, int c, const char *arg)
{
    switch (c) {
    case OPT_TLS_CA: t->ca = arg; return 1;
    case OPT_TLS_CERT: t->cert = arg; return 1;
    case OPT_TLS_KEY: t->key = arg; return 1;
    case OPT_TLS_NAME: t->name = arg; return 1;
    default: return 0;
    }
}

/* Opens the channel. Returns NULL on failure with *code = 2 (TLS flags or files are
 * wrong: a usage error) or 1. TSR_TLS_CA / TSR_TLS_SERVER_NAME stand in for --tls-ca /
 * --tls-server-name when those are not given. */
static tsr_rpc_channel *connect_target(const char *target, const tls_flags *t, int *code)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_client_opts o;
    tsr_rpc_client_opts_init(&o);
    o.no_watch = 1; /* one-shot client: no connectivity thread needed */
    o.tls_ca_file = t->ca ? t->ca : getenv("TSR_TLS_CA");
    o.tls_cert_file = t->cert;
    o.tls_key_file = t->key;
    o.tls_server_name = t->name ? t->name : getenv("TSR_TLS_SERVER_NAME");
    if (o.tls_server_name && !o.tls_ca_file) {
        fprintf(stderr, "tessera: --tls-server-name needs --tls-ca\n");
        *code = 2;
        return NULL;
    }
    tsr_cmdline_tls chk = {o.tls_cert_file, "--tls-cert", o.tls_key_file, "--tls-key",
                           o.tls_ca_file, t->ca ? "--tls-ca" : "TSR_TLS_CA"};
    if (tsr_cmdline_check_tls(&chk, 1, &err) != 0) {
        fprintf(stderr, "tessera: %s\n", err.msg);
        *code = 2;
        return NULL;
    }
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, &o, &err);
    if (ch == NULL) {
        fprintf(stderr, "tessera: %s: %s\n", target, err.msg);
        *code = 1;
    }
    return ch;
}

static void print_rpc_failure(const char *what, const char *target, const tsr_rpc_result *res)
{
    fprintf(stderr, "tessera: %s on %s failed: %s: %s\n", what, target,
            tsr_rpc_code_name(res->code), res->message ? res->message : "");
}

/* ------------------------------------------------------------------ datapoint JSON */

static json_t *float_array(const float *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

static json_t *datapoint_json(const Tessera__V1__IndexDatapoint *dp)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(dp->datapoint_id ? dp->datapoint_id : ""));
    if (dp->n_feature_vector)
        json_object_set_new(o, "embedding", float_array(dp->feature_vector, dp->n_feature_vector));
    if (dp->sparse_embedding && dp->sparse_embedding->n_values) {
        json_t *se = json_object(), *dims = json_array();
        json_object_set_new(se, "values",
                            float_array(dp->sparse_embedding->values, dp->sparse_embedding->n_values));
        for (size_t i = 0; i < dp->sparse_embedding->n_dimensions; i++)
            json_array_append_new(dims, json_integer(dp->sparse_embedding->dimensions[i]));
        json_object_set_new(se, "dimensions", dims);
        json_object_set_new(o, "sparse_embedding", se);
    }
    if (dp->n_restricts) {
        json_t *ra = json_array();
        for (size_t i = 0; i < dp->n_restricts; i++) {
            const Tessera__V1__Restriction *r = dp->restricts[i];
            json_t *ro = json_object(), *al = json_array(), *dl = json_array();
            json_object_set_new(ro, "namespace", json_string(r->namespace_));
            for (size_t j = 0; j < r->n_allow_list; j++)
                json_array_append_new(al, json_string(r->allow_list[j]));
            for (size_t j = 0; j < r->n_deny_list; j++)
                json_array_append_new(dl, json_string(r->deny_list[j]));
            json_object_set_new(ro, "allow", al);
            json_object_set_new(ro, "deny", dl);
            json_array_append_new(ra, ro);
        }
        json_object_set_new(o, "restricts", ra);
    }
    if (dp->n_numeric_restricts) {
        json_t *na = json_array();
        for (size_t i = 0; i < dp->n_numeric_restricts; i++) {
            const Tessera__V1__NumericRestriction *r = dp->numeric_restricts[i];
            json_t *ro = json_object();
            json_object_set_new(ro, "namespace", json_string(r->namespace_));
            if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT)
                json_object_set_new(ro, "value_int", json_integer(r->value_int));
            else if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT)
                json_object_set_new(ro, "value_float", json_real(r->value_float));
            else if (r->value_case == TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE)
                json_object_set_new(ro, "value_double", json_real(r->value_double));
            json_array_append_new(na, ro);
        }
        json_object_set_new(o, "numeric_restricts", na);
    }
    if (dp->crowding_tag && dp->crowding_tag->crowding_attribute &&
        dp->crowding_tag->crowding_attribute[0])
        json_object_set_new(o, "crowding_tag", json_string(dp->crowding_tag->crowding_attribute));
    return o;
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s)
        puts(s);
    free(s);
}

/* ------------------------------------------------------------------ query */

static void query_usage(FILE *f)
{
    fprintf(f,
            "usage: tessera query --target ADDR (--vector \"1,2,3\" | --queries Q.fvecs) [options]\n"
            "  Runs FindNeighbors on a coordinator and prints the neighbors of each query.\n"
            "  --target ADDR          coordinator address (host:port)\n"
            "  --vector V             one dense query, comma-separated floats\n"
            "  --queries F            dense queries from a .fvecs file (one request per 100)\n"
            "  --sparse S             sparse query \"dim:value,...\" (alone or with a dense one)\n"
            "  --alpha A              RRF weight of the dense ranking (1 dense only, 0 sparse only)\n"
            "  --k K                  neighbors per query (default 10)\n"
            "  --restrict ns=a,b      allow tokens a or b in namespace ns (repeatable; AND across ns)\n"
            "  --deny ns=c            deny token c in namespace ns (repeatable)\n"
            "  --numeric \"ns>=3\"      numeric restrict; ops < <= == != >= > (int, 1.5 double, 1.5f float)\n"
            "  --crowding N           at most N neighbors per crowding tag\n"
            "  --candidates N         approximate_neighbor_count: re-rank N PQ candidates exactly\n"
            "  --fraction F           fraction of coarse lists to probe (0,1]\n"
            "  --full                 return full datapoints\n"
            "  --allow-partial        answer from the reachable shards if one is down\n"
            "  --timeout-ms T         deadline (default 10000)\n"
            "  --json                 one JSON document on stdout\n" TLS_USAGE);
}

int tsr_cmd_query(int argc, char **argv)
{
    static const struct option lo[] = {
        {"target", 1, 0, 't'},   {"vector", 1, 0, 'v'},   {"queries", 1, 0, 'q'},
        {"sparse", 1, 0, 's'},   {"alpha", 1, 0, 'a'},    {"k", 1, 0, 'k'},
        {"restrict", 1, 0, 'r'}, {"deny", 1, 0, 'd'},     {"numeric", 1, 0, 'n'},
        {"crowding", 1, 0, 'c'}, {"candidates", 1, 0, 'C'}, {"fraction", 1, 0, 'f'},
        {"full", 0, 0, 'F'},     {"allow-partial", 0, 0, 'P'}, {"timeout-ms", 1, 0, 'T'},
        {"json", 0, 0, 'j'},     {"help", 0, 0, 'h'},     TLS_LONG_OPTS,
        {0, 0, 0, 0}};
    const char *target = NULL, *vector = NULL, *qfile = NULL, *sparse = NULL;
    tls_flags tls = {0};
    int k = 10, crowding = 0, candidates = 0, full = 0, as_json = 0, partial = 0, have_alpha = 0;
    double fraction = 0, alpha = 1;
    long timeout = 10000;
    restrict_list rl = {0};
    Tessera__V1__NumericRestriction **nums = NULL;
    size_t nnums = 0;
    int rc = 2, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 't': target = optarg; break;
        case 'v': vector = optarg; break;
        case 'q': qfile = optarg; break;
        case 's': sparse = optarg; break;
        case 'a': alpha = atof(optarg); have_alpha = 1; break;
        case 'k': k = atoi(optarg); break;
        case 'c': crowding = atoi(optarg); break;
        case 'C': candidates = atoi(optarg); break;
        case 'f': fraction = atof(optarg); break;
        case 'F': full = 1; break;
        case 'P': partial = 1; break;
        case 'T': timeout = atol(optarg); break;
        case 'j': as_json = 1; break;
        case 'r':
        case 'd':
            if (parse_restrict(&rl, optarg, c == 'd') != 0) {
                fprintf(stderr, "tessera query: --%s %s: expected ns=token[,token...]\n",
                        c == 'd' ? "deny" : "restrict", optarg);
                goto cleanup;
            }
            break;
        case 'n': {
            Tessera__V1__NumericRestriction *nr = parse_numeric(optarg);
            if (nr == NULL) {
                fprintf(stderr, "tessera query: --numeric %s: expected ns OP value, e.g. \"price>=3\"\n",
                        optarg);
                goto cleanup;
            }
            nums = tsr_xrealloc(nums, (nnums + 1) * sizeof *nums);
            nums[nnums++] = nr;
            break;
        }
        case 'h': query_usage(stdout); rc = 0; goto cleanup;
        default:
            if (tls_opt(&tls, c, optarg))
                break;
            query_usage(stderr);
            goto cleanup;
        }
    }
    if (target == NULL || (vector == NULL && qfile == NULL && sparse == NULL) ||
        (vector && qfile) || k <= 0) {
        query_usage(stderr);
        goto cleanup;
    }
    float *qv = NULL;
    size_t nq = 1, d = 0;
    if (vector && parse_floats(vector, &qv, &d) != 0) {
        fprintf(stderr, "tessera query: --vector: expected comma-separated finite floats\n");
        goto cleanup;
    }
    if (qfile) {
        tsr_error err = TSR_ERROR_INIT;
        if (tsr_fvecs_read(qfile, &qv, &nq, &d, &err) != 0) {
            fprintf(stderr, "tessera query: %s\n", err.msg);
            rc = 1;
            goto cleanup;
        }
    }
    Tessera__V1__SparseEmbedding se = TESSERA__V1__SPARSE_EMBEDDING__INIT;
    if (sparse && parse_sparse(sparse, &se) != 0) {
        fprintf(stderr, "tessera query: --sparse: expected dim:value[,dim:value...]\n");
        free(qv);
        free(se.values);
        free(se.dimensions);
        goto cleanup;
    }
    tsr_rpc_channel *ch = connect_target(target, &tls, &rc);
    if (ch == NULL) {
        free(qv);
        goto cleanup;
    }
    rc = 0;
    json_t *all = json_array();
    const size_t per_req = 100;
    for (size_t q0 = 0; q0 < nq && rc == 0; q0 += per_req) {
        size_t nb = nq - q0 < per_req ? nq - q0 : per_req;
        Tessera__V1__FindNeighborsRequest req = TESSERA__V1__FIND_NEIGHBORS_REQUEST__INIT;
        Tessera__V1__FindNeighborsRequest__Query *qs = tsr_xcalloc(nb, sizeof *qs);
        Tessera__V1__FindNeighborsRequest__Query **qp = tsr_xcalloc(nb, sizeof *qp);
        Tessera__V1__IndexDatapoint *dps = tsr_xcalloc(nb, sizeof *dps);
        Tessera__V1__FindNeighborsRequest__Query__RRF rrf =
            TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RRF__INIT;
        rrf.alpha = (float)alpha;
        char idbuf[32];
        for (size_t i = 0; i < nb; i++) {
            tessera__v1__find_neighbors_request__query__init(&qs[i]);
            tessera__v1__index_datapoint__init(&dps[i]);
            dps[i].datapoint_id = qfile ? (snprintf(idbuf, sizeof idbuf, "%zu", q0 + i), tsr_xstrdup(idbuf))
                                        : tsr_xstrdup("q");
            if (qv) {
                dps[i].feature_vector = qv + (q0 + i) * d;
                dps[i].n_feature_vector = d;
            }
            if (sparse)
                dps[i].sparse_embedding = &se;
            dps[i].restricts = rl.v;
            dps[i].n_restricts = rl.n;
            dps[i].numeric_restricts = nums;
            dps[i].n_numeric_restricts = nnums;
            qs[i].datapoint = &dps[i];
            qs[i].neighbor_count = k;
            qs[i].per_crowding_attribute_neighbor_count = crowding;
            qs[i].approximate_neighbor_count = candidates;
            qs[i].fraction_leaf_nodes_to_search_override = fraction;
            qs[i].allow_partial = partial;
            if (have_alpha || (sparse && !qv)) {
                if (!have_alpha)
                    rrf.alpha = 0; /* sparse-only query */
                qs[i].ranking_case = TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__RANKING_RRF;
                qs[i].rrf = &rrf;
            }
            qp[i] = &qs[i];
        }
        req.queries = qp;
        req.n_queries = nb;
        req.return_full_datapoint = full;
        tsr_rpc_result res;
        tsr_rpc_result_init(&res);
        ProtobufCMessage *out = NULL;
        tsr_rpc_call_pb(ch, SVC "FindNeighbors", &req.base,
                        &tessera__v1__find_neighbors_response__descriptor, timeout, &out, &res);
        if (res.code != TSR_RPC_OK) {
            print_rpc_failure("FindNeighbors", target, &res);
            rc = 1;
        } else {
            Tessera__V1__FindNeighborsResponse *resp = (Tessera__V1__FindNeighborsResponse *)out;
            for (size_t i = 0; i < resp->n_nearest_neighbors; i++) {
                const Tessera__V1__FindNeighborsResponse__NearestNeighbors *nn =
                    resp->nearest_neighbors[i];
                json_t *qo = json_object(), *na = json_array();
                json_object_set_new(qo, "query", json_string(nn->id));
                if (!as_json)
                    printf("query %s (version %lld)\n", nn->id, (long long)resp->version);
                for (size_t j = 0; j < nn->n_neighbors; j++) {
                    const Tessera__V1__FindNeighborsResponse__Neighbor *nb1 = nn->neighbors[j];
                    json_t *no = nb1->datapoint ? datapoint_json(nb1->datapoint) : json_object();
                    json_object_set_new(no, "distance", json_real(nb1->distance));
                    if (sparse)
                        json_object_set_new(no, "sparse_distance", json_real(nb1->sparse_distance));
                    if (!as_json) {
                        const char *tag = nb1->datapoint && nb1->datapoint->crowding_tag
                                              ? nb1->datapoint->crowding_tag->crowding_attribute
                                              : "";
                        printf("  %2zu  %-24s distance %-12.6g", j + 1,
                               nb1->datapoint ? nb1->datapoint->datapoint_id : "?", nb1->distance);
                        if (sparse)
                            printf(" sparse %-12.6g", nb1->sparse_distance);
                        printf("%s%s\n", tag && tag[0] ? " tag " : "", tag && tag[0] ? tag : "");
                    }
                    json_array_append_new(na, no);
                }
                json_object_set_new(qo, "neighbors", na);
                json_object_set_new(qo, "version", json_integer(resp->version));
                if (resp->n_missing_shards) {
                    json_t *ms = json_array();
                    for (size_t m = 0; m < resp->n_missing_shards; m++)
                        json_array_append_new(ms, json_string(resp->missing_shards[m]));
                    json_object_set_new(qo, "missing_shards", ms);
                    if (!as_json)
                        fprintf(stderr, "tessera query: partial answer, %zu shard(s) missing\n",
                                resp->n_missing_shards);
                }
                json_array_append_new(all, qo);
            }
            protobuf_c_message_free_unpacked(out, NULL);
        }
        tsr_rpc_result_close(&res);
        for (size_t i = 0; i < nb; i++)
            free(dps[i].datapoint_id);
        free(dps);
        free(qs);
        free(qp);
    }
    if (as_json && rc == 0)
        print_json(all);
    json_decref(all);
    tsr_rpc_channel_destroy(ch);
    free(qv);
    free(se.values);
    free(se.dimensions);
cleanup:
    for (size_t i = 0; i < rl.n; i++)
        tessera__v1__restriction__free_unpacked(rl.v[i], NULL);
    free(rl.v);
    for (size_t i = 0; i < nnums; i++)
        tessera__v1__numeric_restriction__free_unpacked(nums[i], NULL);
    free(nums);
    return rc;
}

/* ------------------------------------------------------------------ update */

static const char *state_name(Tessera__V1__Operation__State s)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&tessera__v1__operation__state__descriptor, (int)s);
    return v ? v->name : "UNKNOWN";
}

static void update_usage(FILE *f)
{
    fprintf(f,
            "usage: tessera update --target ADDR --batch-root DIR [--complete-overwrite]\n"
            "                      [--max-invalid-records N] [--json] [--timeout-s T]\n"
            "  Applies a Vertex-format batch (a folder on the coordinator's file system) as a new\n"
            "  index version, waits for it, and prints the batch report. Exit 1 when rejected.\n"
            "  A coordinator that restarts meanwhile is waited for (operations survive restarts;\n"
            "  one interrupted before its commit point ends FAILED \"interrupted\").\n"
            TLS_USAGE);
}

int tsr_cmd_update(int argc, char **argv)
{
    static const struct option lo[] = {{"target", 1, 0, 't'},
                                       {"batch-root", 1, 0, 'b'},
                                       {"complete-overwrite", 0, 0, 'o'},
                                       {"max-invalid-records", 1, 0, 'm'},
                                       {"json", 0, 0, 'j'},
                                       {"timeout-s", 1, 0, 'T'},
                                       {"help", 0, 0, 'h'},
                                       TLS_LONG_OPTS,
                                       {0, 0, 0, 0}};
    const char *target = NULL, *root = NULL;
    tls_flags tls = {0};
    int overwrite = 0, max_invalid = 0, as_json = 0, c;
    long timeout_s = 3600;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 't': target = optarg; break;
        case 'b': root = optarg; break;
        case 'o': overwrite = 1; break;
        case 'm': max_invalid = atoi(optarg); break;
        case 'j': as_json = 1; break;
        case 'T': timeout_s = atol(optarg); break;
        case 'h': update_usage(stdout); return 0;
        default:
            if (tls_opt(&tls, c, optarg))
                break;
            update_usage(stderr);
            return 2;
        }
    }
    if (target == NULL || root == NULL || max_invalid < 0) {
        update_usage(stderr);
        return 2;
    }
    char absroot[4096];
    if (realpath(root, absroot) == NULL) {
        fprintf(stderr, "tessera update: %s: %s\n", root, strerror(errno));
        return 1;
    }
    int rc = 1;
    tsr_rpc_channel *ch = connect_target(target, &tls, &rc);
    if (ch == NULL)
        return rc;
    rc = 1;
    Tessera__V1__UpdateIndexRequest req = TESSERA__V1__UPDATE_INDEX_REQUEST__INIT;
    req.batch_root = absroot;
    req.is_complete_overwrite = overwrite;
    req.max_invalid_records = max_invalid;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    if (tsr_rpc_call_pb(ch, SVC "UpdateIndex", &req.base,
                        &tessera__v1__update_index_response__descriptor, 30000, &out,
                        &res) != TSR_RPC_OK) {
        print_rpc_failure("UpdateIndex", target, &res);
        goto done;
    }
    char *opid = tsr_xstrdup(((Tessera__V1__UpdateIndexResponse *)out)->operation_id);
    protobuf_c_message_free_unpacked(out, NULL);
    int tty = isatty(2);
    /* monotonic: a step of the wall clock neither ends nor extends the wait */
    int64_t t_end = tsr_clock_mono_ms() + (int64_t)timeout_s * 1000;
    int warned_unavailable = 0;
    for (;;) {
        Tessera__V1__GetOperationRequest g = TESSERA__V1__GET_OPERATION_REQUEST__INIT;
        g.operation_id = opid;
        out = NULL;
        if (tsr_rpc_call_pb(ch, SVC "GetOperation", &g.base, &tessera__v1__operation__descriptor,
                            10000, &out, &res) != TSR_RPC_OK) {
            /* The coordinator restarting (or briefly unreachable) is not the end of the
             * update: operations survive a restart, so keep asking until --timeout-s. */
            int transient = res.code == TSR_RPC_UNAVAILABLE ||
                            res.code == TSR_RPC_DEADLINE_EXCEEDED;
            if (!transient || tsr_clock_mono_ms() > t_end) {
                print_rpc_failure("GetOperation", target, &res);
                break;
            }
            if (!warned_unavailable) {
                fprintf(stderr, "%stessera update: %s: coordinator unavailable (%s); still "
                        "waiting for %s\n", tty ? "\n" : "", target, res.message, opid);
                warned_unavailable = 1;
            }
            tsr_rpc_result_close(&res);
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        warned_unavailable = 0;
        Tessera__V1__Operation *op = (Tessera__V1__Operation *)out;
        int done = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED ||
                   op->state == TESSERA__V1__OPERATION__STATE__REJECTED ||
                   op->state == TESSERA__V1__OPERATION__STATE__FAILED;
        if (tty && op->progress) {
            const Tessera__V1__OperationProgress *p = op->progress;
            fprintf(stderr, "\r%-10s files %lld/%lld  records %lld  shards staged %d/%d prepared %d committed %d   ",
                    state_name(op->state), (long long)p->files_read, (long long)p->files_total,
                    (long long)p->records_read, p->shards_staged, p->shards_total,
                    p->shards_prepared, p->shards_committed);
            if (done)
                fputc('\n', stderr);
        }
        if (done) {
            if (as_json) {
                json_t *o = json_object();
                json_object_set_new(o, "operation_id", json_string(op->operation_id));
                json_object_set_new(o, "state", json_string(state_name(op->state)));
                json_object_set_new(o, "version", json_integer(op->version));
                json_object_set_new(o, "elapsed_ms", json_integer(op->end_time_ms - op->start_time_ms));
                if (op->error && op->error[0])
                    json_object_set_new(o, "error", json_string(op->error));
                if (op->n_warnings) {
                    json_t *wa = json_array();
                    for (size_t i = 0; i < op->n_warnings; i++)
                        json_array_append_new(wa, json_string(op->warnings[i]));
                    json_object_set_new(o, "warnings", wa);
                }
                json_t *rep = op->report_json && op->report_json[0]
                                  ? json_loads(op->report_json, 0, NULL)
                                  : NULL;
                if (rep)
                    json_object_set_new(o, "report", rep);
                print_json(o);
                json_decref(o);
            } else {
                if (op->report_json && op->report_json[0])
                    fprintf(stderr, "%s\n", op->report_json);
                for (size_t i = 0; i < op->n_warnings; i++)
                    fprintf(stderr, "warning: %s\n", op->warnings[i]);
                printf("%s: %s", opid, state_name(op->state));
                if (op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED)
                    printf(", version %lld, %lld ms", (long long)op->version,
                           (long long)(op->end_time_ms - op->start_time_ms));
                if (op->error && op->error[0])
                    printf(": %s", op->error);
                printf("\n");
            }
            rc = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED ? 0 : 1;
            protobuf_c_message_free_unpacked(out, NULL);
            break;
        }
        protobuf_c_message_free_unpacked(out, NULL);
        if (tsr_clock_mono_ms() > t_end) {
            fprintf(stderr, "tessera update: %s still running after %ld s\n", opid, timeout_s);
            break;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(opid);
done:
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    return rc;
}

/* ------------------------------------------------------------------ read, stats */

int tsr_cmd_read(int argc, char **argv)
{
    static const struct option lo[] = {
        {"target", 1, 0, 't'}, {"help", 0, 0, 'h'}, TLS_LONG_OPTS, {0, 0, 0, 0}};
    const char *target = NULL;
    tls_flags tls = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 't')
            target = optarg;
        else if (!tls_opt(&tls, c, optarg)) {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tessera read --target ADDR [--tls-ca FILE ...] ID...\n"
                    "  Prints the stored datapoints of the ids, one JSON line each; exit 1 if any is missing.\n"
                    TLS_USAGE);
            return c == 'h' ? 0 : 2;
        }
    }
    if (target == NULL || optind >= argc) {
        fprintf(stderr, "usage: tessera read --target ADDR ID...\n");
        return 2;
    }
    int rc = 1;
    tsr_rpc_channel *ch = connect_target(target, &tls, &rc);
    if (ch == NULL)
        return rc;
    Tessera__V1__ReadIndexDatapointsRequest req = TESSERA__V1__READ_INDEX_DATAPOINTS_REQUEST__INIT;
    req.ids = argv + optind;
    req.n_ids = (size_t)(argc - optind);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_rpc_call_pb(ch, SVC "ReadIndexDatapoints", &req.base,
                        &tessera__v1__read_index_datapoints_response__descriptor, 10000, &out,
                        &res) != TSR_RPC_OK) {
        print_rpc_failure("ReadIndexDatapoints", target, &res);
    } else {
        Tessera__V1__ReadIndexDatapointsResponse *r = (Tessera__V1__ReadIndexDatapointsResponse *)out;
        for (size_t i = 0; i < r->n_datapoints; i++) {
            json_t *j = datapoint_json(r->datapoints[i]);
            print_json(j);
            json_decref(j);
        }
        rc = r->n_datapoints == req.n_ids ? 0 : 1;
        if (rc)
            fprintf(stderr, "tessera read: %zu of %zu ids not found\n", req.n_ids - r->n_datapoints,
                    req.n_ids);
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    return rc;
}

int tsr_cmd_stats(int argc, char **argv)
{
    static const struct option lo[] = {
        {"target", 1, 0, 't'}, {"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, TLS_LONG_OPTS,
        {0, 0, 0, 0}};
    const char *target = NULL;
    tls_flags tls = {0};
    int as_json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 't')
            target = optarg;
        else if (c == 'j')
            as_json = 1;
        else if (!tls_opt(&tls, c, optarg)) {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tessera stats --target ADDR [--json] [--tls-ca FILE ...]\n"
                    "  Prints the index version, vector counts and per-shard state.\n" TLS_USAGE);
            return c == 'h' ? 0 : 2;
        }
    }
    if (target == NULL) {
        fprintf(stderr, "usage: tessera stats --target ADDR [--json]\n");
        return 2;
    }
    int rc = 1;
    tsr_rpc_channel *ch = connect_target(target, &tls, &rc);
    if (ch == NULL)
        return rc;
    Tessera__V1__GetIndexStatsRequest req = TESSERA__V1__GET_INDEX_STATS_REQUEST__INIT;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_rpc_call_pb(ch, SVC "GetIndexStats", &req.base,
                        &tessera__v1__get_index_stats_response__descriptor, 10000, &out,
                        &res) != TSR_RPC_OK) {
        print_rpc_failure("GetIndexStats", target, &res);
    } else {
        Tessera__V1__GetIndexStatsResponse *s = (Tessera__V1__GetIndexStatsResponse *)out;
        json_t *o = json_object(), *sh = json_array();
        json_object_set_new(o, "version", json_integer(s->version));
        json_object_set_new(o, "vectors", json_integer(s->vectors_count));
        json_object_set_new(o, "sparse_vectors", json_integer(s->sparse_vectors_count));
        json_object_set_new(o, "shards_count", json_integer(s->shards_count));
        if (!as_json)
            printf("version %lld  vectors %lld  sparse %lld  shards %d\n", (long long)s->version,
                   (long long)s->vectors_count, (long long)s->sparse_vectors_count, s->shards_count);
        for (size_t i = 0; i < s->n_shards; i++) {
            const Tessera__V1__ShardIndexStats *x = s->shards[i];
            json_t *so = json_object();
            json_object_set_new(so, "address", json_string(x->address));
            json_object_set_new(so, "vectors", json_integer(x->vectors_count));
            json_object_set_new(so, "sparse_vectors", json_integer(x->sparse_vectors_count));
            json_object_set_new(so, "version", json_integer(x->version));
            json_object_set_new(so, "available", json_boolean(x->available));
            json_array_append_new(sh, so);
            if (!as_json)
                printf("  shard %-22s %s  version %lld  vectors %lld  sparse %lld\n", x->address,
                       x->available ? "up  " : "DOWN", (long long)x->version,
                       (long long)x->vectors_count, (long long)x->sparse_vectors_count);
        }
        json_object_set_new(o, "shards", sh);
        if (as_json)
            print_json(o);
        json_decref(o);
        rc = 0;
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    return rc;
}

/* ------------------------------------------------------------------ health */

/* `tessera health`: grpc.health.v1.Health/Check against a coordinator or a shard — a
 * readiness / liveness probe that also speaks TLS (kubelet's grpc: probes do not). */
int tsr_cmd_health(int argc, char **argv)
{
    static const struct option lo[] = {{"target", 1, 0, 't'},     {"service", 1, 0, 's'},
                                       {"timeout-ms", 1, 0, 'T'}, {"help", 0, 0, 'h'},
                                       TLS_LONG_OPTS,              {0, 0, 0, 0}};
    const char *target = NULL, *service = "";
    long timeout_ms = 2000;
    tls_flags tls = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 't')
            target = optarg;
        else if (c == 's')
            service = optarg;
        else if (c == 'T')
            timeout_ms = atol(optarg);
        else if (!tls_opt(&tls, c, optarg)) {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tessera health --target ADDR [--service NAME] [--timeout-ms T]\n"
                    "                      [--tls-ca FILE ...]\n"
                    "  grpc.health.v1.Health/Check: prints the status, exit 0 when SERVING, 1\n"
                    "  otherwise (NOT_SERVING, unknown service, unreachable). A probe for\n"
                    "  Kubernetes exec probes, which unlike grpc: probes work with TLS.\n"
                    "  --service NAME         \"\" (default) = the server as a whole\n"
                    "  --timeout-ms T         deadline (default 2000)\n" TLS_USAGE);
            return c == 'h' ? 0 : 2;
        }
    }
    if (target == NULL || timeout_ms <= 0 || timeout_ms > 600000) {
        fprintf(stderr, "usage: tessera health --target ADDR [--service NAME] "
                        "[--timeout-ms 1..600000]\n");
        return 2;
    }
    int rc = 1;
    tsr_rpc_channel *ch = connect_target(target, &tls, &rc);
    if (ch == NULL)
        return rc;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_rpc_call_pb(ch, "/grpc.health.v1.Health/Check", &req.base,
                        &grpc__health__v1__health_check_response__descriptor,
                        (int64_t)timeout_ms, &out, &res) != TSR_RPC_OK) {
        print_rpc_failure("Health/Check", target, &res);
    } else {
        Grpc__Health__V1__HealthCheckResponse *h = (Grpc__Health__V1__HealthCheckResponse *)out;
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &grpc__health__v1__health_check_response__serving_status__descriptor,
            (int)h->status);
        printf("%s\n", v ? v->name : "UNKNOWN");
        rc = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : 1;
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    return rc;
}
