/*
 * config — the coordinator's JSON config file (docs/config.md): index shape, distance,
 * default nprobe, shard groups (an element is "host:port", or a replica list
 * ["a:1", "b:2"] / {"replicas": [...]}; the first replica's address names the group),
 * plan kind, deadlines, limits, seed, the query defaults (exact re-rank count, RRF depth). Unknown keys are an error naming the key, so a typo never silently falls back
 * to a default.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "core/log.h"
#include "core/mem.h"

static const char *known[] = {"dimensions", "distance", "nlist", "pq_m", "pq_nbits", "nprobe",
                              "shards", "plan", "search_deadline_ms", "stage_deadline_ms",
                              "max_k", "max_queries_per_request", "seed", "stage_chunk",
                              "default_k", "replica_attempt_ms", "update_min_replicas",
                              "approximate_neighbor_count", "rrf_depth", "stream_fold_records",
                              "stream_write_deadline_ms", "coalesce_inflight",
                              "fold_prepare_parallel", "fold_build_cpu_percent", NULL};

const char *tsr__distance_name(enum tsr__distance d)
{
    return d == TSR_DIST_DOT_PRODUCT ? "DOT_PRODUCT" : d == TSR_DIST_COSINE ? "COSINE"
                                                                             : "SQUARED_L2";
}

static int get_int(json_t *root, const char *path, const char *key, int *out, long lo, long hi,
                   tsr_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return tsr_err(err, TSR_EINVAL, "%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return tsr_err(err, TSR_EINVAL, "%s: \"%s\" = %lld is outside %ld..%ld", path, key,
                       (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

/* An address is a gRPC target ("host:port", "dns:///host:port", "[::1]:7001", ...). It also
 * becomes a metrics label value and a log field, so it must be short (dialled through a
 * fixed 512-byte target buffer; labels are built in fixed buffers) and free of the
 * characters that would split or break a label ("," separates labels, quotes, control
 * characters and spaces, which no target contains). */
#define ADDR_MAX 255

static int check_addr(const char *path, size_t i, const char *a, tsr_error *err)
{
    size_t len = strlen(a);
    if (len > ADDR_MAX)
        return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: address of %zu bytes, longer than %d "
                       "(expected \"host:port\")", path, i, len, ADDR_MAX);
    for (size_t k = 0; k < len; k++) {
        unsigned char ch = (unsigned char)a[k];
        if (ch <= ' ' || ch >= 0x7f || ch == ',' || ch == '"' || ch == '\\')
            return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: address \"%.64s\" has a bad "
                           "character at byte %zu (expected \"host:port\")", path, i, a, k);
    }
    return 0;
}

/* Adds a group of n replicas (addresses copied); rejects an address used twice anywhere,
 * and addresses check_addr refuses. */
static int add_group(tsr__coord_config *cfg, const char *path, size_t i, const char **addr,
                     size_t n, tsr_error *err)
{
    for (size_t j = 0; j < n; j++) {
        int rc = check_addr(path, i, addr[j], err);
        if (rc)
            return rc;
        for (size_t s = 0; s < cfg->nshards; s++)
            for (size_t r = 0; r < cfg->nreplicas[s] && !cfg->retired[s]; r++)
                if (strcmp(cfg->replicas[s][r], addr[j]) == 0)
                    return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: \"%s\" is also a replica "
                                   "of shards[%zu]", path, i, addr[j], s);
        for (size_t k = 0; k < j; k++)
            if (strcmp(addr[k], addr[j]) == 0)
                return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: replica \"%s\" is listed "
                               "twice", path, i, addr[j]);
    }
    size_t g = cfg->nshards;
    if (g >= TSR_COORD_MAX_SHARDS)
        return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: at most %d shard groups", path, i,
                       TSR_COORD_MAX_SHARDS);
    if (!cfg->shards) { /* full capacity at once: a reshard appends while others read */
        cfg->shards = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *cfg->shards);
        cfg->replicas = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *cfg->replicas);
        cfg->nreplicas = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *cfg->nreplicas);
        cfg->retired = tsr_xcalloc(TSR_COORD_MAX_SHARDS, sizeof *cfg->retired);
    }
    cfg->replicas[g] = tsr_xcalloc(n, sizeof **cfg->replicas);
    for (size_t j = 0; j < n; j++)
        cfg->replicas[g][j] = tsr_xstrdup(addr[j]);
    cfg->nreplicas[g] = n;
    cfg->shards[g] = cfg->replicas[g][0];
    cfg->nshards++;
    return 0;
}

/* A replica list: ["a:1", "b:2"] (an element of "shards" or the value of "replicas"). */
static int parse_replicas(json_t *r, const char *path, size_t i, tsr__coord_config *cfg,
                          tsr_error *err)
{
    if (!json_is_array(r) || json_array_size(r) == 0)
        return tsr_err(err, TSR_EINVAL, "%s: shards[%zu].replicas must be a non-empty array of "
                       "\"host:port\"", path, i);
    if (json_array_size(r) > TSR_COORD_MAX_REPLICAS)
        return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: %zu replicas, at most %d", path, i,
                       json_array_size(r), TSR_COORD_MAX_REPLICAS);
    const char *addr[TSR_COORD_MAX_REPLICAS];
    size_t j;
    json_t *a;
    json_array_foreach(r, j, a) {
        if (!json_is_string(a) || json_string_length(a) == 0)
            return tsr_err(err, TSR_EINVAL, "%s: shards[%zu].replicas[%zu] must be a "
                           "\"host:port\" string", path, i, j);
        addr[j] = json_string_value(a);
    }
    return add_group(cfg, path, i, addr, json_array_size(r), err);
}

static int parse_shards(json_t *arr, const char *path, tsr__coord_config *cfg, tsr_error *err)
{
    if (!json_is_array(arr))
        return tsr_err(err, TSR_EINVAL, "%s: \"shards\" must be an array of \"host:port\"", path);
    if (json_array_size(arr) > TSR_COORD_MAX_SHARDS)
        return tsr_err(err, TSR_EINVAL, "%s: %zu shards, at most %d", path,
                       json_array_size(arr), TSR_COORD_MAX_SHARDS);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        int rc;
        if (json_is_string(v)) {
            if (json_string_length(v) == 0)
                return tsr_err(err, TSR_EINVAL, "%s: shards[%zu] is empty", path, i);
            const char *one = json_string_value(v);
            rc = add_group(cfg, path, i, &one, 1, err);
        } else if (json_is_array(v)) {
            rc = parse_replicas(v, path, i, cfg, err);
        } else if (json_is_object(v)) {
            const char *k;
            json_t *x;
            json_object_foreach(v, k, x) {
                if (strcmp(k, "replicas") != 0)
                    return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: unknown key \"%s\" "
                                   "(expected \"replicas\")", path, i, k);
            }
            rc = parse_replicas(json_object_get(v, "replicas"), path, i, cfg, err);
        } else {
            return tsr_err(err, TSR_EINVAL, "%s: shards[%zu] must be \"host:port\", "
                           "[\"host:port\", ...] or {\"replicas\": [...]}", path, i);
        }
        if (rc)
            return rc;
    }
    if (cfg->nshards == 0)
        return tsr_err(err, TSR_EINVAL, "%s: \"shards\" is empty", path);
    return 0;
}

int tsr__coord_config_load(const char *path, tsr__coord_config *cfg, tsr_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->distance = TSR_DIST_SQUARED_L2;
    cfg->nlist = 64;
    cfg->pq_m = 16;
    cfg->pq_nbits = 8;
    cfg->nprobe = 8;
    cfg->plan = TSR_PLAN_BALANCED;
    cfg->search_deadline_ms = 2000;
    cfg->stage_deadline_ms = 120000;
    cfg->max_k = 1000;
    cfg->max_queries = 1000;
    cfg->seed = 1234;
    cfg->stage_chunk = 2000;
    cfg->stream_fold_records = 100000;
    cfg->stream_write_deadline_ms = 5000;
    cfg->coalesce_inflight = 2;
    cfg->fold_prepare_parallel = 1;
    cfg->fold_build_cpu_percent = 25;
    cfg->default_k = 10;
    cfg->approximate_neighbor_count = TSR_COORD_DEFAULT_APPROX;
    cfg->rrf_depth = TSR_COORD_DEFAULT_RRF_DEPTH;

    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    if (!root)
        return tsr_err(err, TSR_EINVAL, "%s: line %d column %d: %s", path, je.line, je.column,
                       je.text);
    if (!json_is_object(root)) {
        rc = tsr_err(err, TSR_EINVAL, "%s: must be a JSON object", path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            ok |= strcmp(known[i], key) == 0;
        if (!ok) {
            char list[512];
            size_t len = 0;
            for (int i = 0; known[i] && len < sizeof list; i++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                        known[i]);
            rc = tsr_err(err, TSR_EINVAL, "%s: unknown key \"%s\" (known: %s)", path, key, list);
            goto out;
        }
    }
    if (!json_object_get(root, "dimensions")) {
        rc = tsr_err(err, TSR_EINVAL, "%s: \"dimensions\" is required", path);
        goto out;
    }
    int seed = 1234;
    if ((rc = get_int(root, path, "dimensions", &cfg->dimensions, 1, 65536, err)) ||
        (rc = get_int(root, path, "nlist", &cfg->nlist, 1, 1 << 20, err)) ||
        (rc = get_int(root, path, "pq_m", &cfg->pq_m, 1, 65536, err)) ||
        (rc = get_int(root, path, "pq_nbits", &cfg->pq_nbits, 1, 16, err)) ||
        (rc = get_int(root, path, "nprobe", &cfg->nprobe, 1, 1 << 20, err)) ||
        (rc = get_int(root, path, "search_deadline_ms", &cfg->search_deadline_ms, 1, 3600000,
                      err)) ||
        (rc = get_int(root, path, "stage_deadline_ms", &cfg->stage_deadline_ms, 1, 86400000,
                      err)) ||
        (rc = get_int(root, path, "max_k", &cfg->max_k, 1, 10000, err)) ||
        (rc = get_int(root, path, "max_queries_per_request", &cfg->max_queries, 1, 100000,
                      err)) ||
        (rc = get_int(root, path, "seed", &seed, 0, 2147483647, err)) ||
        (rc = get_int(root, path, "stage_chunk", &cfg->stage_chunk, 1, 1000000, err)) ||
        (rc = get_int(root, path, "stream_fold_records", &cfg->stream_fold_records, 0,
                      100000000, err)) ||
        (rc = get_int(root, path, "stream_write_deadline_ms", &cfg->stream_write_deadline_ms,
                      10, 600000, err)) ||
        (rc = get_int(root, path, "default_k", &cfg->default_k, 1, 10000, err)) ||
        (rc = get_int(root, path, "coalesce_inflight", &cfg->coalesce_inflight, 0, 1024, err)) ||
        (rc = get_int(root, path, "fold_prepare_parallel", &cfg->fold_prepare_parallel, 0, 1024,
                      err)) ||
        (rc = get_int(root, path, "fold_build_cpu_percent", &cfg->fold_build_cpu_percent, 1,
                      100, err)) ||
        (rc = get_int(root, path, "replica_attempt_ms", &cfg->replica_attempt_ms, 0, 3600000,
                      err)) ||
        (rc = get_int(root, path, "update_min_replicas", &cfg->update_min_replicas, 0, 64,
                      err)) ||
        (rc = get_int(root, path, "approximate_neighbor_count", &cfg->approximate_neighbor_count,
                      0, TSR_COORD_MAX_CANDIDATES, err)) ||
        (rc = get_int(root, path, "rrf_depth", &cfg->rrf_depth, 1, TSR_COORD_MAX_CANDIDATES,
                      err)))
        goto out;
    cfg->seed = (uint64_t)seed;
    if (cfg->dimensions % cfg->pq_m != 0) {
        rc = tsr_err(err, TSR_EINVAL, "%s: \"dimensions\" (%d) must be a multiple of \"pq_m\" "
                     "(%d)", path, cfg->dimensions, cfg->pq_m);
        goto out;
    }
    if (cfg->pq_nbits != 8) {
        rc = tsr_err(err, TSR_EINVAL, "%s: \"pq_nbits\" = %d: only 8 is supported", path,
                     cfg->pq_nbits);
        goto out;
    }
    if (cfg->default_k > cfg->max_k)
        cfg->default_k = cfg->max_k;
    json_t *d = json_object_get(root, "distance");
    if (d) {
        const char *s = json_is_string(d) ? json_string_value(d) : "";
        if (strcmp(s, "SQUARED_L2") == 0)
            cfg->distance = TSR_DIST_SQUARED_L2;
        else if (strcmp(s, "DOT_PRODUCT") == 0)
            cfg->distance = TSR_DIST_DOT_PRODUCT;
        else if (strcmp(s, "COSINE") == 0)
            cfg->distance = TSR_DIST_COSINE;
        else {
            rc = tsr_err(err, TSR_EINVAL, "%s: \"distance\" must be \"SQUARED_L2\", "
                         "\"DOT_PRODUCT\" or \"COSINE\"", path);
            goto out;
        }
    }
    json_t *p = json_object_get(root, "plan");
    if (p) {
        const char *s = json_is_string(p) ? json_string_value(p) : "";
        if (strcmp(s, "balanced") == 0)
            cfg->plan = TSR_PLAN_BALANCED;
        else if (strcmp(s, "locality") == 0)
            cfg->plan = TSR_PLAN_LOCALITY;
        else {
            rc = tsr_err(err, TSR_EINVAL, "%s: \"plan\" must be \"balanced\" or \"locality\"",
                         path);
            goto out;
        }
    }
    json_t *sh = json_object_get(root, "shards");
    if (!sh) {
        rc = tsr_err(err, TSR_EINVAL, "%s: \"shards\" is required", path);
        goto out;
    }
    rc = parse_shards(sh, path, cfg, err);
out:
    json_decref(root);
    if (rc)
        tsr__coord_config_close(cfg);
    return rc;
}

void tsr__coord_config_close(tsr__coord_config *cfg)
{
    for (size_t i = 0; i < cfg->nshards; i++) {
        for (size_t j = 0; j < cfg->nreplicas[i]; j++)
            free(cfg->replicas[i][j]);
        free(cfg->replicas[i]);
    }
    for (size_t i = 0; i < cfg->ndropped; i++) {
        for (size_t j = 0; j < cfg->dropped_n[i]; j++)
            free(cfg->dropped[i][j]);
        free(cfg->dropped[i]);
    }
    free(cfg->dropped);
    free(cfg->dropped_n);
    cfg->dropped = NULL;
    cfg->dropped_n = NULL;
    cfg->ndropped = 0;
    free(cfg->shards); /* its strings are replicas[i][0] */
    free(cfg->replicas);
    free(cfg->nreplicas);
    free(cfg->retired);
    cfg->retired = NULL;
    cfg->shards = NULL;
    cfg->replicas = NULL;
    cfg->nreplicas = NULL;
    cfg->nshards = 0;
}

/* ---------------------------------------------------------------- resharding */

int tsr__coord_config_add_group(tsr__coord_config *cfg, const char *const *addr, size_t n,
                                tsr_error *err)
{
    if (n == 0 || n > TSR_COORD_MAX_REPLICAS)
        return tsr_err(err, TSR_EINVAL, "replicas: %zu given, expected 1 .. %d \"host:port\"",
                       n, TSR_COORD_MAX_REPLICAS);
    return add_group(cfg, "new group", cfg->nshards, (const char **)addr, n, err);
}

void tsr__coord_config_drop_groups(tsr__coord_config *cfg, size_t keep)
{
    size_t n = cfg->nshards;
    if (keep >= n)
        return;
    size_t m = cfg->ndropped + n - keep;
    cfg->dropped = tsr_xrealloc(cfg->dropped, m * sizeof *cfg->dropped);
    cfg->dropped_n = tsr_xrealloc(cfg->dropped_n, m * sizeof *cfg->dropped_n);
    for (size_t s = keep; s < n; s++) { /* moved, not freed: the slot is rewritten by the
                                           next add_group while a reader may hold it */
        cfg->dropped[cfg->ndropped] = cfg->replicas[s];
        cfg->dropped_n[cfg->ndropped++] = cfg->nreplicas[s];
    }
    cfg->nshards = keep;
}

char *tsr__coord_config_groups_text(const tsr__coord_config *cfg, int also_retired,
                                    size_t *len)
{
    size_t cap = 64, n = 0;
    for (size_t s = 0; s < cfg->nshards; s++)
        for (size_t j = 0; j < cfg->nreplicas[s]; j++)
            cap += strlen(cfg->replicas[s][j]) + 16;
    char *t = tsr_xmalloc(cap);
    n += (size_t)snprintf(t, cap, "tessera-groups 1\n%zu\n", cfg->nshards);
    for (size_t s = 0; s < cfg->nshards; s++) {
        int gone = cfg->retired[s] || (int)s == also_retired;
        n += (size_t)snprintf(t + n, cap - n, "%s", gone ? "retired" : "live");
        for (size_t j = 0; j < cfg->nreplicas[s]; j++)
            n += (size_t)snprintf(t + n, cap - n, " %s", cfg->replicas[s][j]);
        n += (size_t)snprintf(t + n, cap - n, "\n");
    }
    *len = n;
    return t;
}

int tsr__coord_config_parse_groups(const char *text, size_t len, tsr__coord_config *out,
                                   tsr_error *err)
{
    char *t = tsr_xmalloc(len + 1), *save = NULL;
    memcpy(t, text, len);
    t[len] = 0;
    tsr__coord_config nc;
    memset(&nc, 0, sizeof nc);
    int rc = 0;
    size_t ng = 0;
    char *line = strtok_r(t, "\n", &save);
    if (!line || strcmp(line, "tessera-groups 1") != 0) {
        rc = tsr_err(err, TSR_EFORMAT, "groups: expected the header \"tessera-groups 1\"");
        goto out;
    }
    line = strtok_r(NULL, "\n", &save);
    if (!line || sscanf(line, "%zu", &ng) != 1 || ng == 0 || ng > TSR_COORD_MAX_SHARDS) {
        rc = tsr_err(err, TSR_EFORMAT, "groups: line 2: expected a group count 1 .. %d",
                     TSR_COORD_MAX_SHARDS);
        goto out;
    }
    for (size_t g = 0; g < ng; g++) {
        line = strtok_r(NULL, "\n", &save);
        const char *addr[TSR_COORD_MAX_REPLICAS];
        size_t na = 0;
        char *s2 = NULL, *w = line ? strtok_r(line, " ", &s2) : NULL;
        int retired = w && strcmp(w, "retired") == 0;
        if (!w || (!retired && strcmp(w, "live") != 0)) {
            rc = tsr_err(err, TSR_EFORMAT, "groups: group %zu: expected \"live\" or "
                         "\"retired\" and its replicas", g);
            goto out;
        }
        while ((w = strtok_r(NULL, " ", &s2)) && na < TSR_COORD_MAX_REPLICAS)
            addr[na++] = w;
        if (na == 0 || w) {
            rc = tsr_err(err, TSR_EFORMAT, "groups: group %zu: expected 1 .. %d replicas", g,
                         TSR_COORD_MAX_REPLICAS);
            goto out;
        }
        if ((rc = add_group(&nc, "groups", g, addr, na, err)))
            goto out;
        nc.retired[g] = (uint8_t)retired;
    }
    *out = nc;
    memset(&nc, 0, sizeof nc);
out:
    tsr__coord_config_close(&nc);
    free(t);
    return rc;
}

int tsr__coord_config_set_groups(tsr__coord_config *cfg, const char *text, size_t len,
                                 tsr_error *err)
{
    tsr__coord_config nc;
    int rc = tsr__coord_config_parse_groups(text, len, &nc, err);
    if (rc)
        return rc;
    /* keep every other setting; swap the groups (called before any thread reads them) */
    tsr__coord_config old = *cfg;
    cfg->shards = nc.shards;
    cfg->replicas = nc.replicas;
    cfg->nreplicas = nc.nreplicas;
    cfg->retired = nc.retired;
    cfg->nshards = nc.nshards;
    cfg->resharded = 1;
    nc = old;
    nc.dropped = NULL; /* still cfg's */
    nc.dropped_n = NULL;
    nc.ndropped = 0;
    tsr__coord_config_close(&nc);
    return 0;
}
