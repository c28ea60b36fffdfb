/*
 * coord_test_util — helpers shared by the test_coord_* unit tests (header only): a
 * temporary directory, its removal, a trained template and a snapshot around it.
 */
#ifndef COORD_TEST_UTIL_H
#define COORD_TEST_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "coord.h"
#include "core/mem.h"
#include "index/ivfpq_build.h"

static inline void coord_test_tmpdir(char *buf, size_t cap, const char *prefix)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/%s-XXXXXX", t && t[0] ? t : P_tmpdir, prefix);
    if (mkdtemp(buf) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

static inline int coord_test_rm_one(const char *path, const struct stat *sb, int flag,
                                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void coord_test_rmtree(const char *dir)
{
    nftw(dir, coord_test_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* n pseudo-random vectors of dimension d (caller frees). */
static inline float *coord_test_vectors(size_t n, size_t d, unsigned seed)
{
    float *x = tsr_xmalloc(n * d * sizeof *x);
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n * d; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((s >> 33) % 2000) / 100.0f - 10.0f;
    }
    return x;
}

/* A trained L2 template: d = 8, pq_m 2, 8 bits, nlist lists (NULL on failure). */
static inline tsr_ivfpq *coord_test_template(size_t nlist, tsr_error *err)
{
    size_t n = 512, d = 8;
    tsr_ivfpq *ix = tsr_ivfpq_create((int)d, nlist, 2, 8, TSR_METRIC_L2, 1, err);
    if (!ix)
        return NULL;
    float *x = coord_test_vectors(n, d, 1);
    tsr_build_params bp;
    tsr_build_params_default(&bp);
    bp.seed = 7;
    bp.quiet = 1;
    bp.threads = 1;
    int rc = tsr_ivfpq_train(ix, x, n, &bp, err);
    free(x);
    if (rc) {
        tsr_ivfpq_destroy(ix);
        return NULL;
    }
    return ix;
}

/* A snapshot of `version` with a trained template of nlist lists and a balanced plan over
 * nshards groups, empty directory (NULL on failure). */
static inline tsr__snap *coord_test_snapshot(uint64_t version, size_t nlist, size_t nshards,
                                             tsr_error *err)
{
    tsr_ivfpq *t = coord_test_template(nlist, err);
    if (!t)
        return NULL;
    tsr__snap *s = tsr__snap_create();
    s->version = version;
    if (tsr__snap_set_template(s, t, err)) {
        tsr_ivfpq_destroy(t);
        tsr__snap_unref(s);
        return NULL;
    }
    int64_t *sizes = tsr_xcalloc(nlist, sizeof *sizes);
    s->plan = tsr_xmalloc(nlist * sizeof *s->plan);
    tsr__plan_build(TSR_PLAN_BALANCED, s->tmpl, sizes, nshards, 1, s->plan);
    s->plan_kind = TSR_PLAN_BALANCED;
    free(sizes);
    return s;
}

#endif
