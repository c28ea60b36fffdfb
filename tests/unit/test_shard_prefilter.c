/*
 * test_shard_prefilter — the shard's scan (shard/scan.c) gives byte-identical answers
 * (labels, distances, rows) with the quantized prefilter on (the automatic kernel: AVX-512
 * VBMI where the CPU has it, else the AVX2 kernel), off (TSR_SEARCH_FILTER=0), with its
 * scalar kernel (TSR_SEARCH_FILTER=scalar), with TSR_SIMD=avx2 (the AVX2 filter kernel;
 * the plain AVX2 scan with TSR_SEARCH_FILTER=0; AVX2 with the scalar filter) and with
 * TSR_SIMD=scalar (the plain scalar scan), and as on CPUs without AVX-512 or SIMD
 * (TSR_SIMD_MAX=avx2 | scalar), for queries with token restricts, numeric restricts, crowding and
 * the exact re-rank, at nprobe 1, 2, 5 and 8 of 8 lists (the filter runs from one list
 * on); for an index of 4 dimensions per sub-quantizer and one of 1 (the blocks then hold
 * centroid ranks, the AVX2 path runs the nibble stage, and TSR_SEARCH_NIBBLE=0 turns it
 * off).
 *
 * A list keeps its codes only as the scan blocks (tsr_ivfpq_flist), whichever kernel runs;
 * the reference is TSR_SHARD_CODES=faiss with TSR_SEARCH_FILTER=0 (Faiss-order codes, the
 * plain scan, the layout before the blocks became the only copy). Each setting builds its
 * own version from the same records.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "index/knn.h"
#include "shard_test_util.h"

enum { PD = 32, PNLIST = 8, PN = 6000, PQN = 40, PK = 10 };

/* Sub-quantizers of the group's index: 8 (dsub 4), then 32 (dsub 1: the scan blocks hold
 * centroid ranks and the AVX2 path runs the nibble stage). */
static size_t PM = 8;

static uint32_t seed = 12345;

static float *pdata(size_t n, const float *cent)
{
    float *x = tsr_xmalloc(n * PD * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        size_t c = (size_t)((tu_rand(&seed) + 0.5f) * 16) % 16;
        for (size_t j = 0; j < PD; j++)
            x[i * PD + j] = cent[c * PD + j] + tu_rand(&seed);
    }
    return x;
}

typedef struct fixture {
    tsr__tmpl *tmpl;
    tsr__edits e;
    float *xq;
    float *cd;      /* PQN * PNLIST coarse distances, nearest first */
    int32_t *lists; /* PQN * PNLIST */
} fixture;

static char *xstr(const char *s)
{
    return tsr_xstrdup(s);
}

/* Record i: token "color" in {red, green, blue}, numeric "price" = i % 100, crowding tag
 * "t<i % 7>" (none for every 11th). */
static void add_restricts(tsr_datapoint *dp, size_t i)
{
    static const char *colors[] = {"red", "green", "blue"};
    dp->restricts = tsr_xcalloc(1, sizeof *dp->restricts);
    dp->nrestricts = 1;
    dp->restricts[0].ns = xstr("color");
    dp->restricts[0].allow = tsr_xcalloc(1, sizeof(char *));
    dp->restricts[0].allow[0] = xstr(colors[i % 3]);
    dp->restricts[0].nallow = 1;
    dp->numeric = tsr_xcalloc(1, sizeof *dp->numeric);
    dp->nnumeric = 1;
    dp->numeric[0].ns = xstr("price");
    dp->numeric[0].type = TSR_NUM_INT;
    dp->numeric[0].v.i = (int64_t)(i % 100);
    if (i % 11 != 0) {
        char t[16];
        snprintf(t, sizeof t, "t%zu", i % 7);
        dp->crowding_tag = xstr(t);
    }
}

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    float *cent = tsr_xmalloc(16 * PD * sizeof(float));
    for (size_t i = 0; i < 16 * PD; i++)
        cent[i] = 8.0f * tu_rand(&seed);
    float *x = pdata(PN, cent);
    f->xq = pdata(PQN, cent);
    free(cent);
    tsr_ivfpq *ix = tsr_ivfpq_create(PD, PNLIST, PM, 8, TSR_METRIC_L2, 1, &err);
    assert_non_null(ix);
    tsr_build_params p;
    tsr_build_params_default(&p);
    p.quiet = 1;
    assert_int_equal(tsr_ivfpq_train(ix, x, PN, &p, &err), 0);
    float *ad = tsr_xmalloc(PN * sizeof(float));
    int64_t *al = tsr_xmalloc(PN * sizeof(int64_t));
    assert_int_equal(tsr_knn(x, PN, ix->centroids, PNLIST, PD, TSR_METRIC_L2, 1, NULL, ad, al,
                             &err), 0);
    f->cd = tsr_xmalloc(PQN * PNLIST * sizeof(float));
    int64_t *ql = tsr_xmalloc(PQN * PNLIST * sizeof(int64_t));
    assert_int_equal(tsr_knn(f->xq, PQN, ix->centroids, PNLIST, PD, TSR_METRIC_L2, PNLIST,
                             NULL, f->cd, ql, &err), 0);
    f->lists = tsr_xmalloc(PQN * PNLIST * sizeof(int32_t));
    for (size_t i = 0; i < PQN * PNLIST; i++)
        f->lists[i] = (int32_t)ql[i];
    free(ql);
    f->tmpl = tsr__tmpl_from_index(ix, &err);
    assert_non_null(f->tmpl);
    f->e.ups = tsr_xcalloc(PN, sizeof *f->e.ups);
    for (size_t i = 0; i < PN; i++) {
        tsr__rec *r = tsr_xcalloc(1, sizeof *r);
        atomic_init(&r->refs, 1);
        r->label = (int64_t)i;
        r->list = (int32_t)al[i];
        char id[32];
        snprintf(id, sizeof id, "id%zu", i);
        r->dp.id = tsr_xstrdup(id);
        r->dp.dense = tsr_xmalloc(PD * sizeof(float));
        memcpy(r->dp.dense, x + i * PD, PD * sizeof(float));
        r->dp.ndense = PD;
        add_restricts(&r->dp, i);
        f->e.ups[f->e.nups++] = r;
    }
    free(x);
    free(ad);
    free(al);
    *state = f;
    return 0;
}

static int setup_dsub1(void **state)
{
    PM = PD;
    return setup(state);
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr__edits_close(&f->e);
    tsr__tmpl_unref(f->tmpl);
    free(f->xq);
    free(f->cd);
    free(f->lists);
    free(f);
    return 0;
}

/* The query kinds: plain, token restrict, numeric restrict, crowding, crowding + token
 * restrict + re-rank, numeric restrict + re-rank. */
enum { KINDS = 6 };

static tsr_filter *kind_filter(const tsr__version *v, int kind)
{
    tsr_error err = TSR_ERROR_INIT;
    char *allow[] = {"red", "blue"};
    tsr_token_restrict tr = {"color", allow, 2, NULL, 0};
    tsr_numeric_query nq = {"price", TSR_NUM_INT, {.i = 30}, TSR_OP_LESS};
    tsr_filter *flt = NULL;
    int tok = kind == 1 || kind == 4, num = kind == 2 || kind == 5;
    if (!tok && !num)
        return NULL;
    assert_int_equal(tsr_filter_compile(v->dict, tok ? &tr : NULL, tok, num ? &nq : NULL, num,
                                        &flt, &err), 0);
    return flt;
}

/* Runs every query of every kind at several nprobe on v; appends (label, distance, row)
 * of each answer, and its length, to *out (*n bytes). */
static void run_all(const fixture *f, const tsr__version *v, uint8_t **out, size_t *n)
{
    static const size_t nprobes[] = {1, 2, 5, PNLIST};
    size_t cap = 1 << 20;
    *out = tsr_xmalloc(cap);
    *n = 0;
    tsr_error err = TSR_ERROR_INIT;
    for (int kind = 0; kind < KINDS; kind++) {
        tsr_filter *flt = kind_filter(v, kind);
        for (size_t pi = 0; pi < sizeof nprobes / sizeof *nprobes; pi++)
            for (size_t qi = 0; qi < PQN; qi++) {
                tsr__query q = {0};
                q.x = f->xq + qi * PD;
                q.lists = f->lists + qi * PNLIST;
                q.coarse = f->cd + qi * PNLIST;
                q.nprobe = nprobes[pi];
                q.k = PK;
                q.filter = flt;
                q.crowd = kind >= 3 && kind <= 4 ? 2 : 0;
                q.candidates = kind >= 4 ? 3 * PK : 0;
                tsr__qresult r;
                assert_int_equal(tsr__search_one(v, &q, &r, &err), 0);
                size_t need = sizeof(size_t) + r.ndense * sizeof(tsr__hit);
                if (*n + need > cap)
                    *out = tsr_xrealloc(*out, cap = 2 * cap + need);
                memcpy(*out + *n, &r.ndense, sizeof(size_t));
                *n += sizeof(size_t);
                for (size_t i = 0; i < r.ndense; i++) { /* field by field: no padding */
                    memcpy(*out + *n, &r.dense[i].label, 8);
                    memcpy(*out + *n + 8, &r.dense[i].dist, 4);
                    memcpy(*out + *n + 12, &r.dense[i].row, 4);
                    *n += 16;
                }
                if (kind == 0 && pi > 0)
                    assert_int_equal(r.ndense, PK);
                tsr__qresult_close(&r);
            }
        tsr_filter_destroy(flt);
    }
}

/* Builds a version under the given knobs (NULL = unset) and returns its answers. */
static void answers(const fixture *f, const char *filter_env, const char *simd_env,
                    const char *cap_env, int expect_fl, uint8_t **out, size_t *n)
{
    tsr_error err = TSR_ERROR_INIT;
    if (expect_fl == 0) /* the Faiss-order layout: codes + terms, no scan blocks */
        setenv("TSR_SHARD_CODES", "faiss", 1);
    else
        unsetenv("TSR_SHARD_CODES");
    if (filter_env)
        setenv("TSR_SEARCH_FILTER", filter_env, 1);
    else
        unsetenv("TSR_SEARCH_FILTER");
    if (simd_env)
        setenv("TSR_SIMD", simd_env, 1);
    else
        unsetenv("TSR_SIMD");
    if (cap_env)
        setenv("TSR_SIMD_MAX", cap_env, 1);
    else
        unsetenv("TSR_SIMD_MAX");
    tsr__version *empty = tsr__version_empty(&err), *v = NULL;
    assert_non_null(empty);
    assert_int_equal(tsr__version_build(empty, f->tmpl, &f->e, 1, &v, &err), 0);
    for (size_t l = 0; l < v->nlist; l++) {
        assert_non_null(v->lists[l]);
        /* one copy: the scan blocks, or the Faiss-order codes */
        assert_int_equal(v->lists[l]->fl != NULL, expect_fl);
        assert_int_equal(v->lists[l]->codes == NULL, expect_fl);
        assert_int_equal(v->lists[l]->term == NULL, expect_fl);
    }
    run_all(f, v, out, n);
    tsr__version_unref(v);
    tsr__version_unref(empty);
    unsetenv("TSR_SHARD_CODES");
    unsetenv("TSR_SIMD_MAX");
}

static void test_identical(void **state)
{
    fixture *f = *state;
    uint8_t *ref, *got;
    size_t nref, ngot;
    /* The reference: Faiss-order codes, the plain scan (no prefilter). Every other case
     * keeps the codes only as scan blocks: with each prefilter kernel, and with none (the
     * plain kernels on blocks put back in Faiss order). */
    answers(f, "0", NULL, NULL, 0, &ref, &nref);
    struct {
        const char *filter, *simd;
        int fl;          /* 1 = scan blocks, 0 = Faiss-order codes */
        const char *cap; /* TSR_SIMD_MAX: a CPU without AVX-512 (avx2) or SIMD (scalar) */
        const char *nib; /* TSR_SEARCH_NIBBLE (dsub = 1): 0 = off, scalar / scalar6 = the
                            scalar group kernels */
    } cases[] = {
        {"scalar", NULL, 1, NULL, NULL},   {NULL, NULL, 1, NULL, NULL},
        {NULL, "avx2", 1, NULL, NULL},     {"scalar", "avx2", 1, NULL, NULL},
        {"0", "avx2", 1, NULL, NULL},      {NULL, "scalar", 1, NULL, NULL},
        {"scalar", "scalar", 1, NULL, NULL}, {"0", NULL, 1, NULL, NULL},
        {"0", "scalar", 1, NULL, NULL},    {NULL, NULL, 0, NULL, NULL},
        {"0", "avx2", 0, NULL, NULL},      {NULL, NULL, 1, "avx2", NULL},
        {"0", NULL, 1, "avx2", NULL},      {NULL, NULL, 1, "scalar", NULL},
        {NULL, "avx2", 1, NULL, "0"},      {NULL, NULL, 1, NULL, "scalar"},
        {NULL, NULL, 1, "avx2", "scalar"}, {NULL, NULL, 1, NULL, "scalar6"},
        {NULL, NULL, 1, NULL, "0"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (cases[c].nib)
            setenv("TSR_SEARCH_NIBBLE", cases[c].nib, 1);
        answers(f, cases[c].filter, cases[c].simd, cases[c].cap, cases[c].fl, &got, &ngot);
        unsetenv("TSR_SEARCH_NIBBLE");
        if (ngot != nref || memcmp(got, ref, nref) != 0)
            fail_msg("M=%zu TSR_SEARCH_FILTER=%s TSR_SIMD=%s TSR_SIMD_MAX=%s TSR_SEARCH_NIBBLE=%s "
                     "layout %s: answers differ from TSR_SEARCH_FILTER=0 on Faiss-order codes "
                     "(%zu vs %zu bytes)", PM,
                     cases[c].filter ? cases[c].filter : "(unset)",
                     cases[c].simd ? cases[c].simd : "(unset)",
                     cases[c].cap ? cases[c].cap : "(unset)",
                     cases[c].nib ? cases[c].nib : "(unset)",
                     cases[c].fl ? "blocks" : "faiss", ngot, nref);
        free(got);
    }
    free(ref);
    unsetenv("TSR_SEARCH_FILTER");
    unsetenv("TSR_SIMD");
}

/* One copy of the codes: a list's scan blocks are M * 64 + 256 bytes per started block of
 * 64 codes, the version's memory counts them instead of the Faiss-order codes and terms
 * (TSR_SHARD_CODES=faiss), and nothing else changes. */
static void test_flist_memory(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__version *empty = tsr__version_empty(&err), *v = NULL;
    assert_int_equal(tsr__version_build(empty, f->tmpl, &f->e, 1, &v, &err), 0);
    uint64_t blocks_mem = tsr__version_memory(v);
    uint64_t fl = 0, faiss = 0;
    for (size_t l = 0; l < v->nlist; l++) {
        size_t blocks = (v->lists[l]->n + 63) / 64;
        assert_true(tsr_ivfpq_flist_bytes(v->lists[l]->fl) >= blocks * (PM * 64 + 256));
        fl += tsr_ivfpq_flist_bytes(v->lists[l]->fl);
        faiss += v->lists[l]->n * (PM + sizeof(float));
    }
    tsr__version_unref(v);
    setenv("TSR_SHARD_CODES", "faiss", 1);
    assert_int_equal(tsr__version_build(empty, f->tmpl, &f->e, 1, &v, &err), 0);
    assert_int_equal(blocks_mem - fl, tsr__version_memory(v) - faiss);
    tsr__version_unref(v);
    tsr__version_unref(empty);
    unsetenv("TSR_SHARD_CODES");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical),
        cmocka_unit_test(test_flist_memory),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed + cmocka_run_group_tests(tests, setup_dsub1, teardown);
}
