/*
 * shard_test_util — fixtures of the shard unit tests (test_shard_*.c, linked with
 * libtsr_shard.a): a small trained index, records, temporary directories and file bytes.
 * Header-only (static inline), included once per test program.
 */
#ifndef TSR_SHARD_TEST_UTIL_H
#define TSR_SHARD_TEST_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mem.h"
#include "index/ivfpq_build.h"
#include "shard.h"

enum { TD = 8, TNLIST = 4, TM = 4 }; /* dimension, lists, sub-quantizers (8 bits) */

static inline float tu_rand(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* n vectors of dimension TD around TNLIST centres (deterministic). */
static inline float *tu_data(size_t n, uint32_t seed)
{
    float *x = tsr_xmalloc(n * TD * sizeof(float));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < TD; j++)
            x[i * TD + j] = (float)(i % TNLIST) * 4.0f + tu_rand(&seed);
    return x;
}

/* A trained IVFPQ (L2, by_residual) with empty lists. */
static inline tsr_ivfpq *tu_index(void)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tsr_ivfpq_create(TD, TNLIST, TM, 8, TSR_METRIC_L2, 1, &err);
    if (ix == NULL)
        return NULL;
    size_t n = 600;
    float *x = tu_data(n, 7);
    tsr_build_params p;
    tsr_build_params_default(&p);
    p.quiet = 1;
    int rc = tsr_ivfpq_train(ix, x, n, &p, &err);
    free(x);
    if (rc != 0) {
        fprintf(stderr, "train: %s\n", err.msg);
        tsr_ivfpq_destroy(ix);
        return NULL;
    }
    return ix;
}

/* A dense record (one ref) of label in list, vector x (TD floats, copied). */
static inline tsr__rec *tu_rec(int64_t label, int32_t list, const float *x)
{
    tsr__rec *r = tsr_xcalloc(1, sizeof *r);
    atomic_init(&r->refs, 1);
    r->label = label;
    r->list = list;
    char id[32];
    snprintf(id, sizeof id, "id%lld", (long long)label);
    r->dp.id = tsr_xstrdup(id);
    if (x != NULL) {
        r->dp.dense = tsr_xmalloc(TD * sizeof(float));
        memcpy(r->dp.dense, x, TD * sizeof(float));
        r->dp.ndense = TD;
    }
    return r;
}

static inline char *tu_tmpdir(void)
{
    char t[] = "/tmp/tsr-shard-unit-XXXXXX";
    char *d = mkdtemp(t);
    return d ? tsr_xstrdup(d) : NULL;
}

/* rm -r of a directory two levels deep at most (version dirs). */
static inline void tu_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue;
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            tu_rmtree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline uint8_t *tu_read(const char *dir, const char *name, size_t *n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = tsr_xmalloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static inline void tu_write(const char *dir, const char *name, const void *b, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f == NULL)
        return;
    if (n)
        fwrite(b, 1, n, f);
    fclose(f);
}

#endif
