/*
 * bench_query — CPU time of the query-time parts that run per row or per list: the token /
 * numeric filter's per-row test (query/filter) and the sparse inverted index's build and
 * search (query/sparse). Figures for docs/performance.md, not pass/fail bounds (they were
 * timing "tests" in tests/unit/test_filter.c and test_sparse.c; a timing belongs here).
 *
 *   make bench-query        one run, both tables (single thread, CPU time)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "query/filter.h"
#include "query/sparse.h"
#include "query/topk.h"

static uint64_t rng_state = 1;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what, const tsr_error *err)
{
    fprintf(stderr, "bench_query: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

/* Adds namespace ns with tokens "a,b,!c" ("!" = deny) to a restrict array. */
static void add_restrict(tsr_token_restrict **rs, size_t *n, const char *ns, const char *spec)
{
    *rs = tsr_xrealloc(*rs, (*n + 1) * sizeof **rs);
    tsr_token_restrict *r = &(*rs)[(*n)++];
    memset(r, 0, sizeof *r);
    r->ns = tsr_xstrdup(ns);
    char *copy = tsr_xstrdup(spec), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char ***list = t[0] == '!' ? &r->deny : &r->allow;
        size_t *len = t[0] == '!' ? &r->ndeny : &r->nallow;
        *list = tsr_xrealloc(*list, (*len + 1) * sizeof **list);
        (*list)[(*len)++] = tsr_xstrdup(t[0] == '!' ? t + 1 : t);
    }
    free(copy);
}

/* 200k rows with three token namespaces and an int; a 2-namespace + numeric query. */
static void bench_filter(void)
{
    enum { R = 200000 };
    static const char *colors[] = {"red", "green", "blue", "black", "white"};
    static const char *shapes[] = {"square", "circle", "star"};
    tsr_error err = {0};
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    for (int i = 0; i < R; i++) {
        tsr_datapoint dp;
        tsr_datapoint_init(&dp);
        char spec[64];
        snprintf(spec, sizeof spec, "%s,%s", colors[rnd() % 5], colors[rnd() % 5]);
        add_restrict(&dp.restricts, &dp.nrestricts, "color", spec);
        add_restrict(&dp.restricts, &dp.nrestricts, "shape", shapes[rnd() % 3]);
        snprintf(spec, sizeof spec, "t%u", rnd() % 1000);
        add_restrict(&dp.restricts, &dp.nrestricts, "tag", spec);
        dp.numeric = tsr_xcalloc(1, sizeof *dp.numeric);
        dp.nnumeric = 1;
        dp.numeric[0].ns = tsr_xstrdup("price");
        dp.numeric[0].type = TSR_NUM_INT;
        dp.numeric[0].v.i = rnd() % 100;
        if (tsr_filter_meta_add(m, (uint32_t)i, &dp, NULL, &err) != 0)
            die("tsr_filter_meta_add", &err);
        tsr_datapoint_close(&dp);
    }
    tsr_datapoint q;
    tsr_datapoint_init(&q);
    add_restrict(&q.restricts, &q.nrestricts, "color", "red,blue,!black");
    add_restrict(&q.restricts, &q.nrestricts, "shape", "square,star");
    tsr_numeric_query nn = {"price", TSR_NUM_INT, {.i = 50}, TSR_OP_LESS};
    tsr_filter *f;
    if (tsr_filter_compile(d, q.restricts, q.nrestricts, &nn, 1, &f, &err) != 0)
        die("tsr_filter_compile", &err);
    size_t hits = 0, hits2 = 0;
    double t0 = cpu_seconds();
    for (int rep = 0; rep < 5; rep++)
        for (uint32_t r = 0; r < R; r++)
            hits += (size_t)tsr_filter_match(f, m, r);
    double t1 = cpu_seconds();
    tsr_filter_scan scan = {f, m};
    for (int64_t l = 0; l < R; l++)
        hits2 += (size_t)tsr_filter_accept_label(&scan, l);
    double t2 = cpu_seconds();
    if (hits != 5 * hits2)
        die("tsr_filter_match and tsr_filter_accept_label disagree", NULL);
    printf("%-44s %10.1f ns/row\n", "filter: tsr_filter_match", (t1 - t0) * 1e9 / (5.0 * R));
    printf("%-44s %10.1f ns/label\n", "filter: tsr_filter_accept_label", (t2 - t1) * 1e9 / R);
    printf("%-44s %10zu of %d\n", "filter: rows matching", hits2, R);
    tsr_filter_destroy(f);
    tsr_datapoint_close(&q);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

/* 100k rows x 20 nonzeros = 2M nonzeros over 30k dims; 200 queries of 10 dims, k = 10. */
static void bench_sparse(void)
{
    enum { R = 100000, Z = 20, Q = 200 };
    tsr_error err = {0};
    tsr_sparse_builder *b = tsr_sparse_builder_create();
    int64_t d[Z];
    float v[Z];
    for (uint32_t r = 0; r < R; r++) {
        for (int j = 0; j < Z; j++) {
            d[j] = (int64_t)(rnd() % 30000);
            v[j] = (float)(rnd() % 100) / 100.0f;
        }
        if (tsr_sparse_builder_add(b, r, d, v, Z, &err) != 0)
            die("tsr_sparse_builder_add", &err);
    }
    double t0 = cpu_seconds();
    tsr_sparse_index *ix;
    if (tsr_sparse_builder_finish(b, R, &ix, &err) != 0)
        die("tsr_sparse_builder_finish", &err);
    double t1 = cpu_seconds();
    tsr_hit out[10];
    size_t n;
    for (int q = 0; q < Q; q++) {
        for (int j = 0; j < 10; j++) {
            d[j] = (int64_t)(rnd() % 30000);
            v[j] = 1.0f;
        }
        if (tsr_sparse_search(ix, d, v, 10, 10, 0, NULL, NULL, out, &n, &err) != 0)
            die("tsr_sparse_search", &err);
    }
    double t2 = cpu_seconds();
    printf("%-44s %10.3f s\n", "sparse: build, 2M nonzeros", t1 - t0);
    printf("%-44s %10.1f us/query\n", "sparse: 10-dim query over 100k rows, k=10", (t2 - t1) / Q * 1e6);
    tsr_sparse_index_destroy(ix);
    tsr_sparse_builder_destroy(b);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "usage: bench_query   (no options; CPU time of one thread)\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    printf("%-44s %10s\n", "what (CPU time, one thread)", "figure");
    bench_filter();
    bench_sparse();
    return 0;
}
