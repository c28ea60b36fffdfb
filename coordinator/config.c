/*
 * config — the coordinator's JSON config file (docs/config.md): index shape, distance,
 * default nprobe, shard addresses (an element may be {"replicas": [...]}: the first
 * replica is used, the others are recorded for later), plan kind, deadlines, limits,
 * seed. Unknown keys are an error naming the key, so a typo never silently falls back
 * to a default.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "mem.h"

static const char *known[] = {"dimensions", "distance", "nlist", "pq_m", "pq_nbits", "nprobe",
                              "shards", "plan", "search_deadline_ms", "stage_deadline_ms",
                              "max_k", "max_queries_per_request", "seed", "stage_chunk",
                              "default_k", NULL};

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

static int add_shard(tsr__coord_config *cfg, const char *addr, const char *replicas)
{
    cfg->shards = tsr_xrealloc(cfg->shards, (cfg->nshards + 1) * sizeof *cfg->shards);
    cfg->replicas = tsr_xrealloc(cfg->replicas, (cfg->nshards + 1) * sizeof *cfg->replicas);
    cfg->shards[cfg->nshards] = tsr_xstrdup(addr);
    cfg->replicas[cfg->nshards] = tsr_xstrdup(replicas ? replicas : addr);
    cfg->nshards++;
    return 0;
}

static int parse_shards(json_t *arr, const char *path, tsr__coord_config *cfg, tsr_error *err)
{
    if (!json_is_array(arr))
        return tsr_err(err, TSR_EINVAL, "%s: \"shards\" must be an array of \"host:port\"", path);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (json_is_string(v)) {
            if (json_string_length(v) == 0)
                return tsr_err(err, TSR_EINVAL, "%s: shards[%zu] is empty", path, i);
            add_shard(cfg, json_string_value(v), NULL);
        } else if (json_is_object(v)) {
            const char *k;
            json_t *x;
            json_object_foreach(v, k, x) {
                if (strcmp(k, "replicas") != 0)
                    return tsr_err(err, TSR_EINVAL, "%s: shards[%zu]: unknown key \"%s\" "
                                   "(expected \"replicas\")", path, i, k);
            }
            json_t *r = json_object_get(v, "replicas");
            if (!json_is_array(r) || json_array_size(r) == 0)
                return tsr_err(err, TSR_EINVAL, "%s: shards[%zu].replicas must be a non-empty "
                               "array of \"host:port\"", path, i);
            char joined[2048] = "";
            size_t j;
            json_t *a;
            json_array_foreach(r, j, a) {
                if (!json_is_string(a) || json_string_length(a) == 0)
                    return tsr_err(err, TSR_EINVAL, "%s: shards[%zu].replicas[%zu] must be a "
                                   "\"host:port\" string", path, i, j);
                size_t l = strlen(joined);
                snprintf(joined + l, sizeof joined - l, "%s%s", j ? "," : "",
                         json_string_value(a));
            }
            add_shard(cfg, json_string_value(json_array_get(r, 0)), joined);
        } else {
            return tsr_err(err, TSR_EINVAL, "%s: shards[%zu] must be \"host:port\" or "
                           "{\"replicas\": [...]}", path, i);
        }
        if (cfg->nshards > TSR_COORD_MAX_SHARDS)
            return tsr_err(err, TSR_EINVAL, "%s: more than %d shards", path,
                           TSR_COORD_MAX_SHARDS);
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
    cfg->default_k = 10;

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
            rc = tsr_err(err, TSR_EINVAL, "%s: unknown key \"%s\" (known: dimensions, distance, "
                         "nlist, pq_m, pq_nbits, nprobe, shards, plan, search_deadline_ms, "
                         "stage_deadline_ms, max_k, max_queries_per_request, seed)", path, key);
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
        (rc = get_int(root, path, "default_k", &cfg->default_k, 1, 10000, err)))
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
        free(cfg->shards[i]);
        free(cfg->replicas[i]);
    }
    free(cfg->shards);
    free(cfg->replicas);
    cfg->shards = cfg->replicas = NULL;
    cfg->nshards = 0;
}
