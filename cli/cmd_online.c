/*
 * cmd_online — the client commands of `tessera` that talk to a running coordinator over
 * gRPC (tessera.v1.VectorSearch): query, update, read, stats, and the health probe.
 *
 * Output is a human-readable table by default and one JSON document with --json, so that
 * scripts and tests can parse it. Exit codes: 0 success, 1 the server said no (or the
 * batch was rejected), 2 usage error.
 */
#include <errno.h>
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

/* The accepted forms, for the usage errors of --restrict / --deny / --numeric. */
#define RESTRICT_FORMS                                                                     \
    "expected NS=TOKEN[,TOKEN...] (--restrict allows the tokens, --deny excludes them; NS "   \
    "without spaces or any of < > = ! ~), e.g. --restrict color=red,blue --deny color=green"
#define NUMERIC_FORMS                                                                      \
    "expected NS OP VALUE with OP one of < <= = == != >= > and VALUE an integer (3), a "     \
    "double (2.5) or a float (2.5f), NS without spaces or any of < > = ! ~, e.g. "          \
    "--numeric 'price>=3'"

/* 1 when ns[0..len) can name a namespace on the command line: not empty, and no space or
 * operator character (so that a mistyped operator, "price~=3" or "color!=red", is an
 * error instead of a namespace "price~" or "color!"). */
static int good_ns(const char *ns, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (strchr("<>=!~ \t\n\r", ns[i]) != NULL)
            return 0;
    return 1;
}

/* "ns=a,b" into the allow (or deny) list of namespace ns */
static int parse_restrict(restrict_list *l, const char *arg, int deny)
{
    const char *eq = strchr(arg, '=');
    if (eq == NULL || !good_ns(arg, (size_t)(eq - arg)) || eq[1] == '\0')
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

/* "ns>=3", "ns<2.5", "ns==7" (or "ns=7"), "ns!=1.5f": int when it parses as one, float
 * with an f suffix, double otherwise. NULL when arg is none of these. */
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
    if (pos == NULL || !good_ns(arg, (size_t)(pos - arg)))
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
        if (end != val && (*end == 'f' || *end == 'F') && end[1] == '\0' && isfinite(dv)) {
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

/* Parses an online command's flags; max_args positional arguments go to argv[1..*nargs].
 * Returns -1 to go on, else the exit code (0 after --help, 2 usage error). */
int tsr_cli_parse_flags(const char *prog, const tsr_cmdline_opt *opts, size_t n,
                       void (*usage)(FILE *), int max_args, int argc, char **argv, int *nargs)
{
    const tsr_cmdline_spec spec = {prog, opts, n, usage, max_args, 1};
    int code;
    return tsr_cmdline_parse_spec(&spec, argc, argv, nargs, &code) ? code : -1;
}

tsr_cli_targets *tsr_cli_open_ids(const char *prog, void (*usage)(FILE *), int argc,
                                  char **argv, int *nids, int *code)
{
    const char *target = NULL;
    tsr_cli_tls tls = {0};
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        TSR_CLI_TLS_OPTS(tls),
    };
    *nids = 0;
    *code = tsr_cli_parse_flags(prog, opts, sizeof opts / sizeof opts[0], usage, -1, argc, argv,
                                nids);
    if (*code >= 0)
        return NULL;
    if (*nids == 0) {
        fprintf(stderr, "%s: expected at least one ID (see '%s --help')\n", prog, prog);
        *code = 2;
        return NULL;
    }
    *code = 1;
    return tsr_cli_targets_open(prog, target, &tls, code);
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
    if (dp->embedding_metadata)
        json_object_set_new(o, "embedding_metadata",
                            tsr_cli_struct_json(dp->embedding_metadata));
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

#define PROG "tessera query"

static void query_usage(FILE *f)
{
    fprintf(f,
            "usage: tessera query --target ADDR (--vector \"1,2,3\" | --queries Q.fvecs) [options]\n"
            "  Runs FindNeighbors on a coordinator and prints the neighbors of each query.\n"
            "  --target ADDR          coordinator address (host:port), or several: A,B,...\n"
            "  --vector V             one dense query, comma-separated floats\n"
            "  --queries F            dense queries from a .fvecs file (one request per 100)\n"
            "  --sparse S             sparse query \"dim:value,...\" (alone or with a dense one)\n"
            "  --alpha A              RRF weight of the dense ranking, 0..1 (1 dense only, 0\n"
            "                         sparse only)\n"
            "  --k K                  neighbors per query, 1..10000 (default 10)\n"
            "  --restrict ns=a,b      allow tokens a or b in namespace ns (repeatable; AND across ns)\n"
            "  --deny ns=c            deny token c in namespace ns (repeatable)\n"
            "  --numeric \"ns>=3\"      numeric restrict, repeatable; OP: < <= = == != >= >\n"
            "                         (= is ==); value 3 int, 1.5 double, 1.5f float\n"
            "  --crowding N           at most N neighbors per crowding tag (0 = no limit)\n"
            "  --candidates N         approximate_neighbor_count, 0..10000: N PQ candidates\n"
            "                         per shard re-ranked with the stored vectors (default:\n"
            "                         the index setting, 100); 0 = no re-rank (PQ distances)\n"
            "  --fraction F           fraction of coarse lists to probe, 0..1 (0: index default)\n"
            "  --full                 return full datapoints\n"
            "  --allow-partial        answer from the reachable shards if one is down\n"
            "  --timeout-ms T         deadline, 1..86400000 (default 10000)\n"
            "  --json                 one JSON document on stdout\n" TSR_CLI_TLS_USAGE
            "Output: `distance` is the dense distance (squared L2, or the dot product for\n"
            "DOT_PRODUCT and COSINE), exact (from the stored vectors) by default, the PQ\n"
            "approximation with --candidates 0; `-` for a hit found only by the sparse search\n"
            "(every hit of a sparse-only query, and a hybrid query's sparse-only hits: --json\n"
            "says \"sparse_only\": true and keeps distance 0).\n"
            "`sparse_distance` is the exact sparse dot product. Hybrid (--sparse with a\n"
            "vector and --alpha): reciprocal rank fusion of both lists (docs/query-semantics.md).\n"
            "Exit status: 0 success, 1 the query failed (coordinator refused or unreachable,\n"
            "unreadable --queries file), 2 usage error (flags, TLS files).\n");
}

/* Adds the --restrict, --deny and --numeric values to the query. Returns 0, or 2 after
 * a message naming the bad value and listing the accepted forms. */
static int query_restricts(const tsr_cmdline_list *allow, const tsr_cmdline_list *deny,
                           const tsr_cmdline_list *numeric, restrict_list *rl,
                           Tessera__V1__NumericRestriction ***nums, size_t *nnums)
{
    for (int d = 0; d < 2; d++) {
        const tsr_cmdline_list *l = d ? deny : allow;
        for (size_t i = 0; i < l->n; i++)
            if (parse_restrict(rl, l->v[i], d) != 0) {
                const char *v = l->v[i], *ne = strstr(v, "!=");
                fprintf(stderr, PROG ": %s '%s': " RESTRICT_FORMS "\n",
                        d ? "--deny" : "--restrict", v);
                if (ne != NULL && ne > v && ne[2] != '\0')
                    fprintf(stderr, PROG ": to exclude a token: --deny '%.*s=%s'\n",
                            (int)(ne - v), v, ne + 2);
                return 2;
            }
    }
    for (size_t i = 0; i < numeric->n; i++) {
        Tessera__V1__NumericRestriction *nr = parse_numeric(numeric->v[i]);
        if (nr == NULL) {
            fprintf(stderr, PROG ": --numeric '%s': " NUMERIC_FORMS "\n", numeric->v[i]);
            return 2;
        }
        *nums = tsr_xrealloc(*nums, (*nnums + 1) * sizeof **nums);
        (*nums)[(*nnums)++] = nr;
    }
    return 0;
}

/* Prints the neighbors of each query of resp (a table unless as_json) and appends one
 * JSON object per query to all. sparse: the query had a sparse part (print its distance);
 * dense: it had a dense one. The table prints `distance -` where there is no dense
 * distance: every hit of a sparse-only query, and a hybrid query's hits found only by the
 * sparse search (Neighbor.sparse_only; --json keeps the number and says sparse_only). */
static void print_neighbors(const Tessera__V1__FindNeighborsResponse *resp, int sparse,
                            int dense, int as_json, json_t *all)
{
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
            if (nb1->sparse_only)
                json_object_set_new(no, "sparse_only", json_true());
            if (!as_json) {
                const char *tag = nb1->datapoint && nb1->datapoint->crowding_tag
                                      ? nb1->datapoint->crowding_tag->crowding_attribute
                                      : "";
                const char *id = nb1->datapoint ? nb1->datapoint->datapoint_id : "?";
                if (!dense || nb1->sparse_only)
                    printf("  %2zu  %-24s distance %-12s", j + 1, id, "-");
                else
                    printf("  %2zu  %-24s distance %-12.6g", j + 1, id, nb1->distance);
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
                fprintf(stderr, PROG ": partial answer, %zu shard(s) missing\n",
                        resp->n_missing_shards);
        }
        json_array_append_new(all, qo);
    }
    for (size_t w = 0; w < resp->n_warnings; w++) /* e.g. a restrict namespace never used */
        fprintf(stderr, PROG ": warning: %s\n", resp->warnings[w]);
}

int tsr_cmd_query(int argc, char **argv)
{
    const char *target = NULL, *vector = NULL, *qfile = NULL, *sparse = NULL;
    tsr_cli_tls tls = {0};
    int k = 10, crowding = 0, candidates = -1 /* not given */, full = 0, as_json = 0;
    int partial = 0;
    double fraction = 0, alpha = -1; /* -1: not given */
    int64_t timeout = 10000;
    tsr_cmdline_list allow = {0}, deny = {0}, numeric = {0};
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--vector", TSR_CMDLINE_STR, &vector, 0, 0, 0},
        {"--queries", TSR_CMDLINE_STR, &qfile, 0, 0, 0},
        {"--sparse", TSR_CMDLINE_STR, &sparse, 0, 0, 0},
        {"--alpha", TSR_CMDLINE_DOUBLE, &alpha, 0, 1, 0},
        {"--k", TSR_CMDLINE_INT, &k, 1, 10000, 0},
        {"--restrict", TSR_CMDLINE_LIST, &allow, 0, 0, 0},
        {"--deny", TSR_CMDLINE_LIST, &deny, 0, 0, 0},
        {"--numeric", TSR_CMDLINE_LIST, &numeric, 0, 0, 0},
        {"--crowding", TSR_CMDLINE_INT, &crowding, 0, INT32_MAX, 0},
        {"--candidates", TSR_CMDLINE_INT, &candidates, 0, 10000, 0},
        {"--fraction", TSR_CMDLINE_DOUBLE, &fraction, 0, 1, 0},
        {"--full", TSR_CMDLINE_FLAG, &full, 0, 0, 0},
        {"--allow-partial", TSR_CMDLINE_FLAG, &partial, 0, 0, 0},
        {"--timeout-ms", TSR_CMDLINE_INT64, &timeout, 1, 86400000, 0},
        {"--json", TSR_CMDLINE_FLAG, &as_json, 0, 0, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    restrict_list rl = {0};
    Tessera__V1__NumericRestriction **nums = NULL;
    size_t nnums = 0;
    int rc = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], query_usage, 0, argc, argv,
                         NULL);
    if (rc >= 0)
        goto cleanup;
    rc = 2;
    int have_alpha = alpha >= 0;
    if (!have_alpha)
        alpha = 1;
    if (vector == NULL && qfile == NULL && sparse == NULL) {
        fprintf(stderr, PROG ": give --vector, --queries or --sparse (see '" PROG " --help')\n");
        goto cleanup;
    }
    if (vector && qfile) {
        fprintf(stderr, PROG ": --vector and --queries exclude each other\n");
        goto cleanup;
    }
    if (query_restricts(&allow, &deny, &numeric, &rl, &nums, &nnums) != 0)
        goto cleanup;
    float *qv = NULL;
    size_t nq = 1, d = 0;
    if (vector && parse_floats(vector, &qv, &d) != 0) {
        fprintf(stderr, PROG ": --vector: expected comma-separated finite floats, got '%s'\n",
                vector);
        goto cleanup;
    }
    if (qfile) {
        tsr_error err = TSR_ERROR_INIT;
        if (tsr_fvecs_read(qfile, &qv, &nq, &d, &err) != 0) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            rc = 1;
            goto cleanup;
        }
    }
    Tessera__V1__SparseEmbedding se = TESSERA__V1__SPARSE_EMBEDDING__INIT;
    if (sparse && parse_sparse(sparse, &se) != 0) {
        fprintf(stderr, PROG ": --sparse: expected DIM:VALUE[,DIM:VALUE...], got '%s'\n",
                sparse);
        free(qv);
        free(se.values);
        free(se.dimensions);
        goto cleanup;
    }
    tsr_cli_targets *ch = tsr_cli_targets_open(PROG, target, &tls, &rc);
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
            if (candidates >= 0) { /* else the index setting (exact re-rank by default) */
                qs[i].approximate_case =
                    TESSERA__V1__FIND_NEIGHBORS_REQUEST__QUERY__APPROXIMATE_APPROXIMATE_NEIGHBOR_COUNT;
                qs[i].approximate_neighbor_count = candidates;
            }
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
        tsr_cli_call(ch, SVC "FindNeighbors", &req.base,
                     &tessera__v1__find_neighbors_response__descriptor, timeout, 0, &out, &res);
        if (res.code != TSR_RPC_OK) {
            tsr_cli_targets_failure(ch, "FindNeighbors", &res);
            rc = 1;
        } else {
            print_neighbors((Tessera__V1__FindNeighborsResponse *)out, sparse != NULL,
                            qv != NULL, as_json, all);
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
    tsr_cli_targets_close(ch);
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
    tsr_cmdline_list_free(&allow);
    tsr_cmdline_list_free(&deny);
    tsr_cmdline_list_free(&numeric);
    return rc;
}
#undef PROG

/* ------------------------------------------------------------------ update */

static const char *state_name(Tessera__V1__Operation__State s)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&tessera__v1__operation__state__descriptor, (int)s);
    return v ? v->name : "UNKNOWN";
}

#define PROG "tessera update"

static void update_usage(FILE *f)
{
    fprintf(f,
            "usage: tessera update --target ADDR --batch-root DIR [--complete-overwrite]\n"
            "                      [--max-invalid-records N] [--json] [--report FILE]\n"
            "                      [--timeout-s T]\n"
            "       tessera update --target ADDR --fold [--json] [--timeout-s T]\n"
            "  Applies a Vertex-format batch (a folder on the coordinator's file system) as a new\n"
            "  index version and waits for it. Prints the outcome, the batch's counts (records =\n"
            "  valid + invalid) and its first errors as FILE:LINE: TYPE: message (stdout), and\n"
            "  the batch's and the operation's warnings (stderr), e.g. deleted ids that are not\n"
            "  in the index. An absolute DIR is sent as given (the coordinator resolves it); a\n"
            "  relative one is made absolute here (for a coordinator on this file system).\n"
            "  A coordinator that restarts meanwhile is waited for (operations survive restarts;\n"
            "  one interrupted before its commit point ends FAILED \"interrupted\").\n"
            "  --fold                   no batch: fold the streamed writes (UpsertDatapoints,\n"
            "                           RemoveDatapoints) into a new version now, as the\n"
            "                           background fold does past stream_fold_records; writes\n"
            "                           go on meanwhile (docs/streaming.md)\n"
            "  --max-invalid-records N  invalid records to skip, 0..2147483647 (default 0)\n"
            "  --timeout-s T            how long to wait for the operation, 0..31536000 (default\n"
            "                           3600)\n"
            "  --json                   print the operation and its full batch report as one JSON\n"
            "                           document instead\n"
            "  --report FILE            also write the full batch report (JSON, the form of\n"
            "                           `tessera batch inspect --report`) to FILE\n"
            TSR_CLI_TLS_USAGE
            "Exit status: 0 the update succeeded, 1 it was rejected or failed (or still runs\n"
            "after --timeout-s), 2 usage error (flags, TLS files).\n");
}

/* Errors printed on the human lines; the rest are counted ("... N more"). */
#define UPDATE_SHOWN_ERRORS 10
#define UPDATE_SHOWN_WARNINGS 5

static json_int_t jint(const json_t *o, const char *key)
{
    return json_integer_value(json_object_get(o, key));
}

/* The human form of a finished operation: the outcome line, the batch's counts and first
 * errors (FILE:LINE: TYPE: message, as `tessera batch inspect` prints them) on stdout;
 * the batch's and the operation's warnings on stderr. */
static void print_update_human(const Tessera__V1__Operation *op, const char *opid)
{
    printf("%s: %s", opid, state_name(op->state));
    if (op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED)
        printf(", version %lld, %lld ms", (long long)op->version,
               (long long)(op->end_time_ms - op->start_time_ms));
    if (op->error && op->error[0])
        printf(": %s", op->error);
    printf("\n");
    json_t *r = op->report_json && op->report_json[0] ? json_loads(op->report_json, 0, NULL)
                                                      : NULL;
    if (r) {
        printf("  batch: %lld records (%lld valid, %lld invalid); %lld upserts, %lld deletes, "
               "%lld duplicates\n", (long long)jint(r, "records"),
               (long long)jint(r, "valid_records"), (long long)jint(r, "invalid_records"),
               (long long)jint(r, "upserts"), (long long)jint(r, "deletes"),
               (long long)jint(r, "duplicates"));
        long long total = (long long)(jint(r, "errors_total") + jint(r, "invalid_records"));
        long long shown = 0;
        size_t i;
        json_t *e, *f;
        json_array_foreach(json_object_get(r, "errors"), i, e) { /* batch-level ones */
            const char *m = json_string_value(e);
            if (shown == UPDATE_SHOWN_ERRORS)
                break;
            if (!m || !op->error || strcmp(m, op->error) != 0) /* not again */
                printf("  %s\n", m ? m : "?");
            shown++;
        }
        json_array_foreach(json_object_get(r, "files"), i, f) {
            const char *name = json_string_value(json_object_get(f, "file"));
            size_t k;
            json_array_foreach(json_object_get(f, "errors"), k, e) {
                if (shown >= UPDATE_SHOWN_ERRORS)
                    break;
                json_t *line = json_object_get(e, "line");
                printf("  %s:%s%lld: %s: %s\n", name ? name : "?", line ? "" : "record ",
                       (long long)json_integer_value(line ? line : json_object_get(e, "record")),
                       json_string_value(json_object_get(e, "type")),
                       json_string_value(json_object_get(e, "message")));
                shown++;
            }
        }
        if (total > shown)
            printf("  ... %lld more error%s (the full report: --report FILE or --json)\n",
                   total - shown, total - shown == 1 ? "" : "s");
        shown = 0;
        json_array_foreach(json_object_get(r, "warnings"), i, e) {
            if (shown == UPDATE_SHOWN_WARNINGS)
                break;
            fprintf(stderr, "warning: %s\n", json_string_value(e));
            shown++;
        }
        if (jint(r, "warnings_total") > shown)
            fprintf(stderr, "warning: ... %lld more batch warnings (--report FILE)\n",
                    (long long)(jint(r, "warnings_total") - shown));
        json_decref(r);
    }
    for (size_t i = 0; i < op->n_warnings; i++)
        fprintf(stderr, "warning: %s\n", op->warnings[i]);
}

/* --json: the operation with its warnings and full report, one document. */
static void print_update_json(const Tessera__V1__Operation *op)
{
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
    json_t *rep = op->report_json && op->report_json[0] ? json_loads(op->report_json, 0, NULL)
                                                        : NULL;
    if (rep)
        json_object_set_new(o, "report", rep);
    print_json(o);
    json_decref(o);
}

/* --report FILE: the batch report as the coordinator made it. Returns 0 or -1 (said). */
static int write_update_report(const Tessera__V1__Operation *op, const char *path)
{
    if (!op->report_json || !op->report_json[0]) {
        fprintf(stderr, PROG ": no batch report to write to %s (the batch was not read: "
                "see the error)\n", path);
        return -1;
    }
    return tsr_cli_write_report(PROG, path, op->report_json);
}

int tsr_cmd_update(int argc, char **argv)
{
    const char *target = NULL, *root = NULL, *report = NULL;
    tsr_cli_tls tls = {0};
    int overwrite = 0, max_invalid = 0, as_json = 0, report_failed = 0, fold = 0;
    int64_t timeout_s = 3600;
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--batch-root", TSR_CMDLINE_STR, &root, 0, 0, 0},
        {"--fold", TSR_CMDLINE_FLAG, &fold, 0, 0, 0},
        {"--complete-overwrite", TSR_CMDLINE_FLAG, &overwrite, 0, 0, 0},
        {"--max-invalid-records", TSR_CMDLINE_INT, &max_invalid, 0, INT32_MAX, 0},
        {"--json", TSR_CMDLINE_FLAG, &as_json, 0, 0, 0},
        {"--report", TSR_CMDLINE_STR, &report, 0, 0, 0},
        {"--timeout-s", TSR_CMDLINE_INT64, &timeout_s, 0, 31536000, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], update_usage, 0, argc, argv,
                           NULL);
    if (code >= 0)
        return code;
    if (!root == !fold || (fold && (overwrite || max_invalid || report))) {
        fprintf(stderr, PROG ": %s\n", fold ? (root ? "--fold takes no --batch-root"
                                                   : "--fold takes no --complete-overwrite, "
                                                     "--max-invalid-records or --report")
                                            : "--batch-root DIR or --fold is required");
        update_usage(stderr);
        return 2;
    }
    /* The batch root is a path of the coordinator's file system (a container, another host):
     * an absolute one is sent as given and resolved there. A relative one only makes sense
     * when both share this file system: it is made absolute here. */
    char absroot[4096] = "";
    if (fold) {
        /* no batch */
    } else if (root[0] == '/') {
        snprintf(absroot, sizeof absroot, "%s", root);
    } else if (realpath(root, absroot) == NULL) {
        fprintf(stderr, PROG ": %s: %s\n", root, strerror(errno));
        return 1;
    }
    int rc = 1;
    tsr_cli_targets *ch = tsr_cli_targets_open(PROG, target, &tls, &rc);
    if (ch == NULL)
        return rc;
    rc = 1;
    Tessera__V1__UpdateIndexRequest req = TESSERA__V1__UPDATE_INDEX_REQUEST__INIT;
    req.batch_root = absroot;
    req.fold_stream = fold;
    req.is_complete_overwrite = overwrite;
    req.max_invalid_records = max_invalid;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    if (tsr_cli_call(ch, SVC "UpdateIndex", &req.base,
                     &tessera__v1__update_index_response__descriptor, 30000, TSR_CLI_WRITE, &out,
                     &res) != TSR_RPC_OK) {
        tsr_cli_targets_failure(ch, "UpdateIndex", &res);
        goto done;
    }
    char *opid = tsr_xstrdup(((Tessera__V1__UpdateIndexResponse *)out)->operation_id);
    char *origin = tsr_xstrdup(tsr_cli_targets_current(ch)); /* the leader that took it */
    protobuf_c_message_free_unpacked(out, NULL);
    int tty = isatty(2);
    /* monotonic: a step of the wall clock neither ends nor extends the wait */
    int64_t t_end = tsr_clock_mono_ms() + (int64_t)timeout_s * 1000;
    int warned_unavailable = 0;
    for (;;) {
        Tessera__V1__GetOperationRequest g = TESSERA__V1__GET_OPERATION_REQUEST__INIT;
        g.operation_id = opid;
        out = NULL;
        if (tsr_cli_call(ch, SVC "GetOperation", &g.base, &tessera__v1__operation__descriptor,
                         10000, 0, &out, &res) != TSR_RPC_OK) {
            /* The coordinator restarting (or briefly unreachable) is not the end of the
             * update: operations survive a restart, so keep asking until --timeout-s. */
            int transient = res.code == TSR_RPC_UNAVAILABLE ||
                            res.code == TSR_RPC_DEADLINE_EXCEEDED;
            /* Another coordinator than the one that took the operation does not know it
             * (its record not shared yet): ask the origin again, which may come back. */
            int elsewhere = res.code == TSR_RPC_NOT_FOUND &&
                            strcmp(tsr_cli_targets_current(ch), origin) != 0;
            if (elsewhere) {
                if (!warned_unavailable)
                    fprintf(stderr, "%s" PROG ": %s does not know %s (%s); waiting for %s\n",
                            tty ? "\n" : "", tsr_cli_targets_current(ch), opid, res.message,
                            origin);
                transient = warned_unavailable = 1;
            }
            if (!transient || tsr_clock_mono_ms() > t_end) {
                tsr_cli_targets_failure(ch, "GetOperation", &res);
                break;
            }
            if (elsewhere)
                tsr_cli_targets_select(ch, origin);
            if (!warned_unavailable) {
                fprintf(stderr, "%s" PROG ": %s: coordinator unavailable (%s); still "
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
            if (as_json)
                print_update_json(op);
            else
                print_update_human(op, opid);
            if (report && write_update_report(op, report) != 0)
                report_failed = 1;
            rc = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED && !report_failed ? 0 : 1;
            protobuf_c_message_free_unpacked(out, NULL);
            break;
        }
        protobuf_c_message_free_unpacked(out, NULL);
        if (tsr_clock_mono_ms() > t_end) {
            fprintf(stderr, PROG ": %s still running after %lld s\n", opid,
                    (long long)timeout_s);
            break;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(opid);
    free(origin);
done:
    tsr_rpc_result_close(&res);
    tsr_cli_targets_close(ch);
    return rc;
}

#undef PROG

/* ------------------------------------------------------------------ read, stats */

#define PROG "tessera read"

/* "tessera read: 1 of 2 ids not found: c-000" (the first 20 missing ids, by name). */
static void print_missing_ids(const Tessera__V1__ReadIndexDatapointsRequest *req,
                              const Tessera__V1__ReadIndexDatapointsResponse *r)
{
    size_t missing = req->n_ids - r->n_datapoints, shown = 0;
    fprintf(stderr, PROG ": %zu of %zu ids not found:", missing, req->n_ids);
    for (size_t i = 0; i < req->n_ids && shown < 20; i++) {
        size_t j = 0;
        while (j < r->n_datapoints &&
               (r->datapoints[j]->datapoint_id == NULL ||
                strcmp(r->datapoints[j]->datapoint_id, req->ids[i]) != 0))
            j++;
        if (j == r->n_datapoints) {
            fprintf(stderr, " %s", req->ids[i]);
            shown++;
        }
    }
    fprintf(stderr, "%s\n", missing > shown ? " ..." : "");
}

static void read_usage(FILE *f)
{
    fprintf(f, "usage: tessera read --target ADDR [--tls-ca FILE ...] [--] ID...\n"
               "  Prints the stored datapoints of the ids, one JSON line each (ids that start\n"
               "  with '-' go after --).\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 success, 1 an id is missing or the read failed, 2 usage error\n"
               "(flags, TLS files).\n");
}

int tsr_cmd_read(int argc, char **argv)
{
    int nids, rc;
    tsr_cli_targets *ch = tsr_cli_open_ids(PROG, read_usage, argc, argv, &nids, &rc);
    if (ch == NULL)
        return rc;
    Tessera__V1__ReadIndexDatapointsRequest req = TESSERA__V1__READ_INDEX_DATAPOINTS_REQUEST__INIT;
    req.ids = argv + 1;
    req.n_ids = (size_t)nids;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_cli_call(ch, SVC "ReadIndexDatapoints", &req.base,
                     &tessera__v1__read_index_datapoints_response__descriptor, 10000, 0, &out,
                     &res) != TSR_RPC_OK) {
        tsr_cli_targets_failure(ch, "ReadIndexDatapoints", &res);
    } else {
        Tessera__V1__ReadIndexDatapointsResponse *r = (Tessera__V1__ReadIndexDatapointsResponse *)out;
        for (size_t i = 0; i < r->n_datapoints; i++) {
            json_t *j = datapoint_json(r->datapoints[i]);
            print_json(j);
            json_decref(j);
        }
        rc = r->n_datapoints == req.n_ids ? 0 : 1;
        if (rc)
            print_missing_ids(&req, r);
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_cli_targets_close(ch);
    return rc;
}

#undef PROG
#define PROG "tessera stats"

static void stats_usage(FILE *f)
{
    fprintf(f, "usage: tessera stats --target ADDR [--json] [--tls-ca FILE ...]\n"
               "  Prints the index version, vector counts and per-shard state.\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 success, 1 the coordinator refused or is unreachable, 2 usage\n"
               "error (flags, TLS files).\n");
}

/* GetIndexStatsResponse fields 13 (repeated string coordinators) and 14 (string leader)
 * as JSON (an array and a string): read through the message descriptor when the
 * generated code knows them, else from the unknown fields, so that this file builds and
 * works with the protos from before and after they were added. */
static void add_len_field(json_t *arr, const ProtobufCMessageUnknownField *u)
{
    /* data: the length varint, then the bytes */
    uint64_t n = 0;
    size_t i = 0;
    for (int shift = 0; i < u->len && shift < 64; shift += 7) {
        n |= (uint64_t)(u->data[i] & 0x7f) << shift;
        if ((u->data[i++] & 0x80) == 0)
            break;
    }
    if (n <= u->len - i)
        json_array_append_new(arr, json_stringn((const char *)u->data + i, (size_t)n));
}

static void ha_fields(const Tessera__V1__GetIndexStatsResponse *s, json_t **coords,
                      json_t **leader)
{
    *coords = json_array();
    *leader = NULL;
    const ProtobufCMessageDescriptor *d = s->base.descriptor;
    const ProtobufCFieldDescriptor *fc = protobuf_c_message_descriptor_get_field(d, 13);
    const ProtobufCFieldDescriptor *fl = protobuf_c_message_descriptor_get_field(d, 14);
    const char *base = (const char *)s;
    if (fc && fc->type == PROTOBUF_C_TYPE_STRING && fc->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n = *(const size_t *)(base + fc->quantifier_offset);
        char *const *v = *(char *const *const *)(base + fc->offset);
        for (size_t i = 0; i < n; i++)
            json_array_append_new(*coords, json_string(v[i] ? v[i] : ""));
    }
    if (fl && fl->type == PROTOBUF_C_TYPE_STRING && fl->label != PROTOBUF_C_LABEL_REPEATED) {
        const char *v = *(const char *const *)(base + fl->offset);
        if (v && v[0])
            *leader = json_string(v);
    }
    json_t *lv = json_array();
    for (size_t i = 0; i < s->base.n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &s->base.unknown_fields[i];
        if (u->wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED && u->tag == 13 && !fc)
            add_len_field(*coords, u);
        else if (u->wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED && u->tag == 14 && !fl)
            add_len_field(lv, u);
    }
    if (*leader == NULL && json_array_size(lv))
        *leader = json_incref(json_array_get(lv, json_array_size(lv) - 1));
    json_decref(lv);
}

int tsr_cmd_stats(int argc, char **argv)
{
    const char *target = NULL;
    tsr_cli_tls tls = {0};
    int as_json = 0;
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--json", TSR_CMDLINE_FLAG, &as_json, 0, 0, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], stats_usage, 0, argc, argv,
                           NULL);
    if (code >= 0)
        return code;
    int rc = 1;
    tsr_cli_targets *ch = tsr_cli_targets_open(PROG, target, &tls, &rc);
    if (ch == NULL)
        return rc;
    Tessera__V1__GetIndexStatsRequest req = TESSERA__V1__GET_INDEX_STATS_REQUEST__INIT;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_cli_call(ch, SVC "GetIndexStats", &req.base,
                     &tessera__v1__get_index_stats_response__descriptor, 10000, 0, &out,
                     &res) != TSR_RPC_OK) {
        tsr_cli_targets_failure(ch, "GetIndexStats", &res);
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
        const Tessera__V1__OperationProgress *lp = s->last_operation_progress;
        if (lp && lp->lists_total) { /* the running or last reshard (docs/resharding.md) */
            json_t *rs = json_object();
            json_object_set_new(rs, "operation_id", json_string(s->last_operation_id));
            json_object_set_new(rs, "lists_total", json_integer(lp->lists_total));
            json_object_set_new(rs, "lists_moved", json_integer(lp->lists_moved));
            json_object_set_new(rs, "datapoints_moved", json_integer(lp->datapoints_moved));
            json_object_set_new(rs, "bytes_moved", json_integer(lp->bytes_moved));
            json_object_set_new(o, "reshard", rs);
            if (!as_json)
                printf("reshard %s: lists %lld/%lld  datapoints %lld  bytes %lld\n",
                       s->last_operation_id, (long long)lp->lists_moved,
                       (long long)lp->lists_total, (long long)lp->datapoints_moved,
                       (long long)lp->bytes_moved);
        }
        json_t *coords, *leader;
        ha_fields(s, &coords, &leader);
        if (json_array_size(coords) || leader) {
            json_object_set(o, "coordinators", coords);
            json_object_set_new(o, "leader", leader ? json_incref(leader) : json_string(""));
            if (!as_json) {
                size_t ci;
                json_t *c;
                printf("coordinators");
                json_array_foreach(coords, ci, c) {
                    const char *a = json_string_value(c);
                    printf(" %s%s", a, leader && strcmp(a, json_string_value(leader)) == 0
                                           ? " (leader)" : "");
                }
                printf("%s%s\n", leader ? "  leader " : "  no leader",
                       leader ? json_string_value(leader) : "");
            }
        }
        json_decref(coords);
        json_decref(leader);
        /* a removed group (RemoveShardGroup) is no shard: not a row, only its number
         * (numbers are never reused, so the rows' numbers skip it) */
        json_t *gone = json_array();
        for (size_t i = 0; i < s->n_shards; i++)
            if (s->shards[i]->removed)
                json_array_append_new(gone, json_integer((json_int_t)i));
        json_object_set_new(o, "removed_groups", gone);
        if (!as_json && json_array_size(gone)) {
            size_t gi;
            json_t *g;
            printf("removed groups");
            json_array_foreach(gone, gi, g)
                printf(" %lld", (long long)json_integer_value(g));
            printf("\n");
        }
        for (size_t i = 0; i < s->n_shards; i++) {
            const Tessera__V1__ShardIndexStats *x = s->shards[i];
            if (x->removed)
                continue;
            json_t *so = json_object();
            json_object_set_new(so, "group", json_integer((json_int_t)i));
            json_object_set_new(so, "address", json_string(x->address));
            json_object_set_new(so, "vectors", json_integer(x->vectors_count));
            json_object_set_new(so, "sparse_vectors", json_integer(x->sparse_vectors_count));
            json_object_set_new(so, "version", json_integer(x->version));
            json_object_set_new(so, "available", json_boolean(x->available));
            json_array_append_new(sh, so);
            if (!as_json)
                printf("  shard %-3zu %-22s %s  version %lld  vectors %lld  sparse %lld\n", i,
                       x->address, x->available ? "up  " : "DOWN", (long long)x->version,
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
    tsr_cli_targets_close(ch);
    return rc;
}

#undef PROG

/* ------------------------------------------------------------------ health */

/* `tessera health`: grpc.health.v1.Health/Check against a coordinator or a shard — a
 * readiness / liveness probe that also speaks TLS (kubelet's grpc: probes do not). */
#define PROG "tessera health"

static void health_usage(FILE *f)
{
    fprintf(f, "usage: tessera health --target ADDR [--service NAME] [--timeout-ms T]\n"
               "                      [--wait SECONDS] [--tls-ca FILE ...]\n"
               "  grpc.health.v1.Health/Check: prints the status. A probe for Kubernetes exec\n"
               "  probes, which unlike grpc: probes work with TLS.\n"
               "  --service NAME         \"\" (default) = the server as a whole\n"
               "  --timeout-ms T         deadline of one check, 1..600000 (default 2000)\n"
               "  --wait SECONDS         ask again every 200 ms until SERVING, for at most\n"
               "                         SECONDS (1..86400): for a server still starting, e.g.\n"
               "                         right after `tessera cluster up ... &`\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 SERVING, 1 otherwise (NOT_SERVING, unknown service, unreachable;\n"
               "with --wait: not SERVING within SECONDS), 2 usage error (flags, TLS files).\n");
}

/* One Health/Check on a new channel (a channel that failed to connect would wait out
 * its reconnect backoff). Returns 0 SERVING, 1 otherwise (said when loud), or 2. */
static int health_once(const char *target, const tsr_cli_tls *tls, const char *service,
                       int64_t timeout_ms, int loud)
{
    int rc = 1;
    tsr_cli_targets *ch = tsr_cli_targets_open(PROG, target, tls, &rc);
    if (ch == NULL)
        return rc;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    rc = 1;
    if (tsr_cli_call(ch, "/grpc.health.v1.Health/Check", &req.base,
                     &grpc__health__v1__health_check_response__descriptor, timeout_ms, 0, &out,
                     &res) != TSR_RPC_OK) {
        if (loud)
            tsr_cli_targets_failure(ch, "Health/Check", &res);
    } else {
        Grpc__Health__V1__HealthCheckResponse *h = (Grpc__Health__V1__HealthCheckResponse *)out;
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &grpc__health__v1__health_check_response__serving_status__descriptor,
            (int)h->status);
        rc = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : 1;
        if (rc == 0 || loud)
            printf("%s\n", v ? v->name : "UNKNOWN");
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_cli_targets_close(ch);
    return rc;
}

int tsr_cmd_health(int argc, char **argv)
{
    const char *target = NULL, *service = "";
    int64_t timeout_ms = 2000;
    int wait_s = 0;
    tsr_cli_tls tls = {0};
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--service", TSR_CMDLINE_STR_ANY, &service, 0, 0, 0},
        {"--timeout-ms", TSR_CMDLINE_INT64, &timeout_ms, 1, 600000, 0},
        {"--wait", TSR_CMDLINE_INT, &wait_s, 1, 86400, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], health_usage, 0, argc, argv,
                           NULL);
    if (code >= 0)
        return code;
    int64_t end = tsr_clock_mono_ms() + (int64_t)wait_s * 1000;
    for (;;) {
        int64_t left = end - tsr_clock_mono_ms();
        int last = wait_s == 0 || left <= 0;
        int64_t t = !last && left < timeout_ms ? left : timeout_ms;
        int rc = health_once(target, &tls, service, t, last);
        if (rc != 1 || last)
            return rc;
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
#undef PROG
