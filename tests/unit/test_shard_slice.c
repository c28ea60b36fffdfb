/*
 * test_shard_slice — the shard's version snapshots (shard/slice.c) without RPC: build a
 * version from edits, copy-on-write of untouched lists, write + load round trip, and
 * load of hostile version directories (every truncation of meta, bad magic / format /
 * version, owned lists and records out of range, trailing bytes, short vectors.f32,
 * duplicate labels, records that do not parse): always an error with a message, never a
 * crash or a partly loaded version.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "shard_test_util.h"

typedef struct fixture {
    tsr__tmpl *tmpl;
    tsr__version *empty, *v1;
    float *x;
    size_t n;
    char *dir; /* v1 written here */
} fixture;

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tu_index();
    assert_non_null(ix);
    f->tmpl = tsr__tmpl_from_index(ix, &err);
    assert_non_null(f->tmpl);
    f->empty = tsr__version_empty(&err);
    assert_non_null(f->empty);
    f->n = 40;
    f->x = tu_data(f->n, 99);
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(f->n + 1, sizeof *e.ups);
    for (size_t i = 0; i < f->n; i++) /* labels 0, 2, 4, ...: sorted, unique */
        e.ups[e.nups++] = tu_rec((int64_t)(2 * i), (int32_t)(i % TNLIST), f->x + i * TD);
    /* one sparse-only record */
    tsr__rec *sp = tu_rec(1001, -1, NULL);
    sp->dp.sparse_dims = tsr_xmalloc(2 * sizeof(int64_t));
    sp->dp.sparse_vals = tsr_xmalloc(2 * sizeof(float));
    sp->dp.sparse_dims[0] = 3, sp->dp.sparse_dims[1] = 70;
    sp->dp.sparse_vals[0] = 0.5f, sp->dp.sparse_vals[1] = -1.0f;
    sp->dp.nsparse = 2;
    e.ups[e.nups++] = sp;
    assert_int_equal(tsr__version_build(f->empty, f->tmpl, &e, 1, &f->v1, &err), 0);
    tsr__edits_close(&e);
    f->dir = tu_tmpdir();
    assert_non_null(f->dir);
    assert_int_equal(tsr__version_write(f->v1, f->dir, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr__version_unref(f->v1);
    tsr__version_unref(f->empty);
    tsr__tmpl_unref(f->tmpl);
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->x);
    free(f);
    return 0;
}

static void test_build(void **state)
{
    fixture *f = *state;
    const tsr__version *v = f->v1;
    assert_int_equal(v->version, 1);
    assert_int_equal(v->nlist, TNLIST);
    assert_int_equal(v->nrecs, f->n + 1);
    assert_int_equal(v->nvectors, f->n);
    assert_int_equal(v->nsparse, 1);
    size_t inlists = 0;
    for (size_t l = 0; l < v->nlist; l++) {
        assert_true(v->owned[l]);
        assert_non_null(v->lists[l]);
        /* L2 by_residual: terms, in the scan blocks (the only copy) or beside the codes */
        assert_true(v->lists[l]->fl != NULL || v->lists[l]->term != NULL);
        inlists += v->lists[l]->n;
    }
    assert_int_equal(inlists, f->n);
    for (size_t i = 1; i < v->nrecs; i++)
        assert_true(v->recs[i - 1]->label < v->recs[i]->label);
    assert_non_null(tsr__version_find(v, 38));
    assert_null(tsr__version_find(v, 37));
    assert_int_equal(tsr__version_find(v, 1001)->list, -1);
}

static void test_copy_on_write(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    float y[TD] = {0};
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(2, sizeof *e.ups);
    e.ups[e.nups++] = tu_rec(7, 0, y);          /* a new label into list 0 */
    e.dels = tsr_xcalloc(1, sizeof *e.dels);
    e.dels[e.ndels++] = 2;                       /* label 2 lives in list 1 */
    tsr__version *v2 = NULL;
    assert_int_equal(tsr__version_build(f->v1, NULL, &e, 2, &v2, &err), 0);
    assert_int_equal(v2->nrecs, f->v1->nrecs);   /* +1 -1 */
    assert_null(tsr__version_find(v2, 2));
    assert_non_null(tsr__version_find(v2, 7));
    assert_non_null(tsr__version_find(f->v1, 2)); /* the base is not modified */
    assert_null(tsr__version_find(f->v1, 7));
    assert_ptr_not_equal(v2->lists[0], f->v1->lists[0]);
    assert_ptr_not_equal(v2->lists[1], f->v1->lists[1]);
    assert_ptr_equal(v2->lists[2], f->v1->lists[2]); /* untouched: shared */
    assert_ptr_equal(v2->lists[3], f->v1->lists[3]);
    assert_int_equal(v2->lists[0]->n, f->v1->lists[0]->n + 1);
    assert_int_equal(v2->lists[1]->n, f->v1->lists[1]->n - 1);
    tsr__version_unref(v2);

    /* drop list 3: not owned, its records gone */
    tsr__edits_close(&e);
    memset(&e, 0, sizeof e);
    e.drop = tsr_xcalloc(1, sizeof *e.drop);
    e.drop[e.ndrop++] = 3;
    assert_int_equal(tsr__version_build(f->v1, NULL, &e, 3, &v2, &err), 0);
    assert_false(v2->owned[3]);
    assert_null(v2->lists[3]);
    assert_int_equal(v2->nvectors, f->n - f->n / TNLIST);
    tsr__version_unref(v2);
    tsr__edits_close(&e);
}

static void test_build_refuses(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__edits e = {0};
    tsr__version *v = NULL;
    /* an empty base and no template */
    assert_int_equal(tsr__version_build(f->empty, NULL, &e, 1, &v, &err), TSR_ESTATE);
    assert_null(v);
    assert_true(strstr(err.msg, "no template") != NULL);
    /* a dense vector of the wrong dimension */
    tsr__rec *r = tu_rec(5, 1, NULL);
    r->dp.dense = tsr_xcalloc(TD - 1, sizeof(float));
    r->dp.ndense = TD - 1;
    e.ups = tsr_xcalloc(1, sizeof *e.ups);
    e.ups[e.nups++] = r;
    tsr_error_clear(&err);
    assert_int_equal(tsr__version_build(f->v1, NULL, &e, 2, &v, &err), TSR_EINVAL);
    assert_null(v);
    assert_true(strstr(err.msg, "dimension") != NULL);
    tsr__edits_close(&e);
}

/* The codes and terms of list l in Faiss order, from whichever copy it holds. */
static void list_codes(const tsr__list *l, size_t cs, uint8_t *codes, float *term)
{
    if (l->fl != NULL) {
        tsr_ivfpq_flist_codes(l->fl, 0, l->n, codes, term);
    } else {
        memcpy(codes, l->codes, l->n * cs);
        memcpy(term, l->term, l->n * 4);
    }
}

static void test_roundtrip(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr__version *v = NULL;
    assert_int_equal(tsr__version_load(f->dir, 1, &v, &err), 0);
    const tsr__version *a = f->v1;
    assert_int_equal(v->nrecs, a->nrecs);
    assert_int_equal(v->nlist, a->nlist);
    assert_int_equal(v->nvectors, a->nvectors);
    assert_int_equal(v->nsparse, a->nsparse);
    size_t cs = a->tmpl->ix->code_size;
    for (size_t l = 0; l < a->nlist; l++) {
        assert_int_equal(v->owned[l], a->owned[l]);
        assert_int_equal(v->lists[l]->n, a->lists[l]->n);
        assert_memory_equal(v->lists[l]->ids, a->lists[l]->ids, a->lists[l]->n * 8);
        size_t n = a->lists[l]->n;
        uint8_t *ca = tsr_xmalloc(n * cs), *cv = tsr_xmalloc(n * cs);
        float *ta = tsr_xmalloc(n * 4), *tv = tsr_xmalloc(n * 4);
        list_codes(a->lists[l], cs, ca, ta);
        list_codes(v->lists[l], cs, cv, tv);
        assert_memory_equal(cv, ca, n * cs);
        assert_memory_equal(tv, ta, n * 4);
        free(ca), free(cv), free(ta), free(tv);
    }
    for (size_t i = 0; i < a->nrecs; i++) {
        const tsr__rec *x = a->recs[i], *y = v->recs[i];
        assert_int_equal(x->label, y->label);
        assert_int_equal(x->list, y->list);
        assert_string_equal(x->dp.id, y->dp.id);
        assert_int_equal(x->dp.ndense, y->dp.ndense);
        if (x->dp.ndense)
            assert_memory_equal(x->dp.dense, y->dp.dense, x->dp.ndense * sizeof(float));
        assert_int_equal(x->dp.nsparse, y->dp.nsparse);
    }
    tsr__version_unref(v);
    /* the version number is checked against the meta */
    tsr_error_clear(&err);
    assert_int_equal(tsr__version_load(f->dir, 2, &v, &err), TSR_EFORMAT);
    assert_true(strstr(err.msg, "version") != NULL);
}

/* Loads dir/ with meta and vectors.f32 replaced; returns the code (err has the message). */
static int load_with(const fixture *f, const char *dir, const uint8_t *meta, size_t mn,
                     const uint8_t *vec, size_t vn, tsr_error *err)
{
    size_t sn = 0;
    uint8_t *slice = tu_read(f->dir, "slice.faiss", &sn);
    assert_non_null(slice);
    tu_write(dir, "slice.faiss", slice, sn);
    tu_write(dir, "meta", meta, mn);
    tu_write(dir, "vectors.f32", vec, vn);
    free(slice);
    tsr__version *v = NULL;
    tsr_error_clear(err);
    int rc = tsr__version_load(dir, 1, &v, err);
    if (rc == 0)
        tsr__version_unref(v);
    else
        assert_null(v);
    return rc;
}

static void expect_format(const fixture *f, const char *dir, const uint8_t *meta, size_t mn,
                          const uint8_t *vec, size_t vn, const char *what)
{
    tsr_error err = TSR_ERROR_INIT;
    int rc = load_with(f, dir, meta, mn, vec, vn, &err);
    if (rc != TSR_EFORMAT || strstr(err.msg, what) == NULL)
        fail_msg("expected TSR_EFORMAT with \"%s\", got %d: %s", what, rc, err.msg);
}

static void test_load_hostile(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    size_t mn = 0, vn = 0;
    uint8_t *meta = tu_read(f->dir, "meta", &mn), *vec = tu_read(f->dir, "vectors.f32", &vn);
    assert_non_null(meta);
    assert_non_null(vec);
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    uint8_t *m = tsr_xmalloc(mn + 64);

    assert_int_equal(load_with(f, dir, meta, mn, vec, vn, &err), 0); /* the copy loads */

    /* every truncation of meta is refused */
    for (size_t len = 0; len < mn; len++) {
        int rc = load_with(f, dir, meta, len, vec, vn, &err);
        if (rc == 0)
            fail_msg("meta truncated to %zu of %zu bytes loaded", len, mn);
        assert_true(err.msg[0] != '\0');
    }
    /* header fields */
    memcpy(m, meta, mn);
    m[0] = 'X';
    expect_format(f, dir, m, mn, vec, vn, "magic");
    memcpy(m, meta, mn);
    m[4] = 2; /* format */
    expect_format(f, dir, m, mn, vec, vn, "format 2");
    memcpy(m, meta, mn);
    m[16] = TD + 1; /* dimension */
    expect_format(f, dir, m, mn, vec, vn, "expected 1");
    /* nowned > nlist */
    memcpy(m, meta, mn);
    uint64_t big = TNLIST + 1;
    memcpy(m + 20, &big, 8);
    expect_format(f, dir, m, mn, vec, vn, "owned lists > nlist");
    /* an owned list out of range */
    memcpy(m, meta, mn);
    int32_t bad = TNLIST;
    memcpy(m + 28, &bad, 4);
    expect_format(f, dir, m, mn, vec, vn, "out of range");
    bad = -1;
    memcpy(m + 28, &bad, 4);
    expect_format(f, dir, m, mn, vec, vn, "out of range");
    /* a record count that cannot fit */
    size_t nrecs_off = 28 + 4 * TNLIST;
    memcpy(m, meta, mn);
    uint64_t huge = UINT64_MAX / 2;
    memcpy(m + nrecs_off, &huge, 8);
    expect_format(f, dir, m, mn, vec, vn, "do not fit");
    /* a record length past the end */
    memcpy(m, meta, mn);
    uint32_t l32 = 0xffffff00u;
    memcpy(m + nrecs_off + 8, &l32, 4);
    expect_format(f, dir, m, mn, vec, vn, "record truncated");
    /* a record that does not parse (a varint that never ends) */
    memcpy(m, meta, mn);
    uint32_t len0;
    memcpy(&len0, meta + nrecs_off + 8, 4);
    memset(m + nrecs_off + 12, 0xff, len0);
    expect_format(f, dir, m, mn, vec, vn, "does not parse");
    /* trailing bytes in meta; vectors.f32 longer than slice.faiss implies (refused by
     * its read limit before it is read) */
    memcpy(m, meta, mn);
    m[mn] = 0;
    expect_format(f, dir, m, mn + 1, vec, vn, "trailing bytes");
    uint8_t *v2 = tsr_xmalloc(vn + 4);
    memcpy(v2, vec, vn);
    memset(v2 + vn, 0, 4);
    expect_format(f, dir, meta, mn, v2, vn + 4, "more than the limit");
    /* vectors.f32 short */
    expect_format(f, dir, meta, mn, vec, vn - 4, "vectors.f32: truncated");
    expect_format(f, dir, meta, mn, vec, 0, "vectors.f32: truncated");
    free(v2);
    /* a label twice: the second record (label 2) relabelled 0 (field 1, varint 0) */
    memcpy(m, meta, mn);
    size_t r1 = nrecs_off + 12 + len0;
    assert_int_equal(m[r1 + 4], 0x08); /* field 1, varint */
    assert_int_equal(m[r1 + 5], 2);    /* label 2 */
    m[r1 + 5] = 0;
    expect_format(f, dir, m, mn, vec, vn, "label 0 twice");
    /* the missing files */
    char p[4096];
    snprintf(p, sizeof p, "%s/meta", dir);
    unlink(p);
    tsr__version *v = NULL;
    tsr_error_clear(&err);
    assert_int_not_equal(tsr__version_load(dir, 1, &v, &err), 0);
    assert_null(v);
    assert_true(strstr(err.msg, "meta") != NULL);
    snprintf(p, sizeof p, "%s/slice.faiss", dir);
    tu_write(dir, "slice.faiss", "junk", 4);
    tsr_error_clear(&err);
    assert_int_not_equal(tsr__version_load(dir, 1, &v, &err), 0);
    assert_null(v);

    free(m);
    free(meta);
    free(vec);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build),
        cmocka_unit_test(test_copy_on_write),
        cmocka_unit_test(test_build_refuses),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_load_hostile),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
