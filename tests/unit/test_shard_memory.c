/*
 * test_shard_memory — the shard's memory layout (docs/shard.md "Memory"):
 *  - the scan blocks (tsr_ivfpq_flist) give back exactly the Faiss-order codes and terms
 *    they were built from, for every M of 8-bit codes (1..256) and ragged list sizes;
 *  - slice.faiss, meta and vectors.f32 of a version are byte-identical whether its lists
 *    hold the blocks or Faiss-order codes (TSR_SHARD_CODES=faiss), and after a load (mapped
 *    vectors, lists rebuilt as blocks) and a write again;
 *  - a loaded version's mapped vectors.f32 stays valid while a newer version shares its
 *    records, after the older version is released and its directory removed, and is
 *    unmapped with the last record (run under ASan by make test-san);
 *  - a template change re-encodes from the mapped vectors;
 *  - a written version's heap vectors are re-pointed into its own vectors.f32.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "shard_test_util.h"

static uint32_t seed = 4242;

static uint32_t rnd(void)
{
    seed = seed * 1664525u + 1013904223u;
    return seed >> 8;
}

static void test_flist_roundtrip(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 5, 63, 64, 65, 127, 128, 129, 300};
    tsr_error err = TSR_ERROR_INIT;
    for (size_t M = 1; M <= 256; M++) {
        tsr_ivfpq ix;
        memset(&ix, 0, sizeof ix);
        ix.pq.M = M, ix.pq.nbits = 8, ix.pq.code_size = M;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            size_t n = sizes[si];
            uint8_t *codes = tsr_xmalloc(n * M), *back = tsr_xmalloc(n * M);
            float *term = tsr_xmalloc(n * sizeof(float)), *tb = tsr_xmalloc(n * sizeof(float));
            for (size_t i = 0; i < n * M; i++)
                codes[i] = (uint8_t)rnd();
            for (size_t i = 0; i < n; i++) {
                uint32_t b = rnd() << 8 | (rnd() & 0xff); /* any bits, NaN included */
                memcpy(&term[i], &b, sizeof b);
            }
            for (int with_term = 0; with_term < 2; with_term++) {
                tsr_ivfpq_flist *fl = NULL;
                assert_int_equal(
                    tsr_ivfpq_flist_build(&ix, codes, n, with_term ? term : NULL, &fl, &err), 0);
                assert_non_null(fl);
                assert_int_equal(tsr_ivfpq_flist_size(fl), n);
                memset(back, 0xa5, n * M);
                memset(tb, 0xa5, n * sizeof(float));
                tsr_ivfpq_flist_codes(fl, 0, n, back, with_term ? tb : NULL);
                if (memcmp(back, codes, n * M) != 0)
                    fail_msg("M %zu n %zu: codes differ after the round trip", M, n);
                if (with_term && memcmp(tb, term, n * sizeof(float)) != 0)
                    fail_msg("M %zu n %zu: terms differ after the round trip", M, n);
                /* a ragged range inside: one code at a time and a run across blocks */
                size_t i0 = rnd() % n, len = 1 + rnd() % (n - i0);
                tsr_ivfpq_flist_codes(fl, i0, len, back, NULL);
                assert_memory_equal(back, codes + i0 * M, len * M);
                tsr_ivfpq_flist_free(fl);
            }
            free(codes), free(back), free(term), free(tb);
        }
    }
    /* One dimension per sub-quantizer: the blocks hold centroid ranks (the nibble stage),
     * and the codes still come back as given. */
    for (size_t M = 1; M <= 64; M *= 4) {
        tsr_ivfpq ix;
        memset(&ix, 0, sizeof ix);
        ix.d = (int)M;
        ix.pq.d = M, ix.pq.M = M, ix.pq.nbits = 8, ix.pq.code_size = M, ix.pq.dsub = 1;
        ix.pq.ksub = 256;
        ix.pq.centroids = tsr_xmalloc(M * 256 * sizeof(float));
        for (size_t i = 0; i < M * 256; i++)
            ix.pq.centroids[i] = (float)(rnd() % 1000) - 500.0f; /* ties too */
        size_t n = 130;
        uint8_t *codes = tsr_xmalloc(n * M), *back = tsr_xmalloc(n * M);
        for (size_t i = 0; i < n * M; i++)
            codes[i] = (uint8_t)rnd();
        tsr_ivfpq_flist *fl = NULL;
        assert_int_equal(tsr_ivfpq_flist_build(&ix, codes, n, NULL, &fl, &err), 0);
        assert_non_null(fl);
        memset(back, 0xa5, n * M);
        tsr_ivfpq_flist_codes(fl, 0, n, back, NULL);
        if (memcmp(back, codes, n * M) != 0)
            fail_msg("dsub 1, M %zu: codes differ after the round trip", M);
        tsr_ivfpq_search_invalidate(&ix); /* the flist keeps its ranks */
        tsr_ivfpq_flist_codes(fl, 7, 70, back, NULL);
        assert_memory_equal(back, codes + 7 * M, 70 * M);
        tsr_ivfpq_flist_free(fl);
        free(codes), free(back), free(ix.pq.centroids);
    }
    /* nothing to build: other than 8 bits, M > 256, n == 0 */
    tsr_ivfpq ix;
    memset(&ix, 0, sizeof ix);
    ix.pq.M = 257, ix.pq.nbits = 8;
    uint8_t c[257 * 2] = {0};
    tsr_ivfpq_flist *fl = (tsr_ivfpq_flist *)1;
    assert_int_equal(tsr_ivfpq_flist_build(&ix, c, 2, NULL, &fl, &err), 0);
    assert_null(fl);
    ix.pq.M = 4, ix.pq.nbits = 4;
    assert_int_equal(tsr_ivfpq_flist_build(&ix, c, 2, NULL, &fl, &err), 0);
    assert_null(fl);
    ix.pq.nbits = 8;
    assert_int_equal(tsr_ivfpq_flist_build(&ix, c, 0, NULL, &fl, &err), 0);
    assert_null(fl);
}

typedef struct fixture {
    tsr__tmpl *tmpl;
    tsr__version *empty;
    float *x;
    size_t n;
} fixture;

/* A version of f->n records (labels 0, 2, ...; lists uneven so some hold > 64 codes, one
 * sparse-only) under the current env. */
static tsr__version *build_v1(const fixture *f)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(f->n + 1, sizeof *e.ups);
    for (size_t i = 0; i < f->n; i++)
        e.ups[e.nups++] = tu_rec((int64_t)(2 * i), (int32_t)(i % 7 % TNLIST), f->x + i * TD);
    e.ups[e.nups++] = tu_rec(100001, -1, NULL);
    tsr__version *v = NULL;
    assert_int_equal(tsr__version_build(f->empty, f->tmpl, &e, 1, &v, &err), 0);
    tsr__edits_close(&e);
    return v;
}

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tu_index();
    assert_non_null(ix);
    f->tmpl = tsr__tmpl_from_index(ix, &err);
    assert_non_null(f->tmpl);
    f->empty = tsr__version_empty(&err);
    f->n = 700;
    f->x = tu_data(f->n, 31);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr__version_unref(f->empty);
    tsr__tmpl_unref(f->tmpl);
    free(f->x);
    free(f);
    unsetenv("TSR_SHARD_CODES");
    unsetenv("TSR_SHARD_VECTORS");
    return 0;
}

static void same_files(const char *a, const char *b)
{
    static const char *const names[] = {"slice.faiss", "meta", "vectors.f32"};
    for (size_t i = 0; i < 3; i++) {
        size_t na = 0, nb = 0;
        uint8_t *pa = tu_read(a, names[i], &na), *pb = tu_read(b, names[i], &nb);
        assert_non_null(pa);
        assert_non_null(pb);
        if (na != nb || memcmp(pa, pb, na) != 0)
            fail_msg("%s differs (%zu vs %zu bytes)", names[i], na, nb);
        free(pa), free(pb);
    }
}

static void test_files_identical(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    char *da = tu_tmpdir(), *db = tu_tmpdir(), *dc = tu_tmpdir(), *dd = tu_tmpdir();
    setenv("TSR_SHARD_CODES", "faiss", 1);
    tsr__version *va = build_v1(f);
    assert_null(va->lists[0]->fl);
    assert_non_null(va->lists[0]->codes);
    assert_int_equal(tsr__version_write(va, da, &err), 0);
    unsetenv("TSR_SHARD_CODES");
    tsr__version *vb = build_v1(f);
    for (size_t l = 0; l < TNLIST; l++) {
        assert_non_null(vb->lists[l]->fl);
        assert_null(vb->lists[l]->codes);
        assert_null(vb->lists[l]->term);
    }
    assert_true(vb->lists[0]->n > 64);
    assert_int_equal(tsr__version_write(vb, db, &err), 0);
    same_files(da, db);
    /* load (mapped vectors, blocks), write again */
    tsr__version *vc = NULL;
    assert_int_equal(tsr__version_load(db, 1, &vc, &err), 0);
    assert_non_null(vc->recs[0]->vmap);
    assert_int_equal(tsr__version_write(vc, dc, &err), 0);
    same_files(da, dc);
    /* and the former way: heap vectors, Faiss-order codes */
    setenv("TSR_SHARD_CODES", "faiss", 1);
    setenv("TSR_SHARD_VECTORS", "heap", 1);
    tsr__version *vd = NULL;
    assert_int_equal(tsr__version_load(da, 1, &vd, &err), 0);
    assert_null(vd->recs[0]->vmap);
    assert_null(vd->lists[0]->fl);
    assert_int_equal(tsr__version_write(vd, dd, &err), 0);
    same_files(da, dd);
    unsetenv("TSR_SHARD_CODES");
    unsetenv("TSR_SHARD_VECTORS");
    tsr__version_unref(va), tsr__version_unref(vb), tsr__version_unref(vc);
    tsr__version_unref(vd);
    const char *dirs[] = {da, db, dc, dd};
    for (size_t i = 0; i < 4; i++) {
        tu_rmtree(dirs[i]);
        free((char *)dirs[i]);
    }
}

static void test_mapping_outlives_version(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    char *d1 = tu_tmpdir(), *d2 = tu_tmpdir();
    uint64_t mapped0 = tsr__vmap_bytes();
    tsr__version *v = build_v1(f);
    assert_int_equal(tsr__version_write(v, d1, &err), 0);
    tsr__version_unref(v);
    tsr__version *l1 = NULL;
    assert_int_equal(tsr__version_load(d1, 1, &l1, &err), 0);
    assert_int_equal(tsr__vmap_bytes() - mapped0, f->n * TD * sizeof(float));
    uint64_t anon, mapped;
    tsr__version_memory_split(l1, NULL, &anon, &mapped);
    assert_int_equal(mapped, f->n * TD * sizeof(float));
    /* version 2 from the loaded one: one new record, one delete; the rest shared */
    tsr__edits e = {0};
    e.ups = tsr_xcalloc(1, sizeof *e.ups);
    e.ups[e.nups++] = tu_rec(1, 0, f->x);
    e.dels = tsr_xcalloc(1, sizeof *e.dels);
    e.dels[e.ndels++] = 4;
    tsr__version *v2 = NULL;
    assert_int_equal(tsr__version_build(l1, l1->tmpl, &e, 2, &v2, &err), 0);
    tsr__edits_close(&e);
    /* release version 1 and remove its directory: the mapping stays while v2 needs it */
    tsr__version_unref(l1);
    tu_rmtree(d1);
    assert_int_equal(tsr__vmap_bytes() - mapped0, f->n * TD * sizeof(float));
    size_t seen = 0;
    for (size_t i = 0; i < v2->nrecs; i++) {
        const tsr__rec *r = v2->recs[i];
        if (r->list < 0)
            continue;
        size_t src = r->label == 1 ? 0 : (size_t)r->label / 2;
        assert_memory_equal(r->dp.dense, f->x + src * TD, TD * sizeof(float));
        assert_true(r->label == 1 ? r->vmap == NULL : r->vmap != NULL);
        seen++;
    }
    assert_int_equal(seen, f->n);
    /* a template change re-encodes from the mapped vectors */
    tsr_ivfpq *ix2 = tu_index();
    tsr__tmpl *t2 = tsr__tmpl_from_index(ix2, &err);
    assert_non_null(t2);
    tsr__edits none = {0};
    tsr__version *v3 = NULL;
    assert_int_equal(tsr__version_build(v2, t2, &none, 3, &v3, &err), 0);
    assert_int_equal(v3->nvectors, v2->nvectors);
    tsr__tmpl_unref(t2);
    assert_int_equal(tsr__version_write(v2, d2, &err), 0);
    /* v2 written: its heap record (label 1) is re-pointed into d2's vectors.f32, the
     * others keep version 1's mapping; rows follow */
    tsr__rec *old1 = tsr__rec_ref(tsr__version_find(v2, 1));
    tsr__version_map_vectors(v2, d2);
    tsr__rec *new1 = tsr__version_find(v2, 1);
    assert_true(new1 != old1 && new1->vmap != NULL && old1->vmap == NULL);
    assert_memory_equal(new1->dp.dense, f->x, TD * sizeof(float));
    assert_string_equal(new1->dp.id, old1->dp.id);
    tsr__rec_unref(old1);
    assert_int_equal(tsr__vmap_bytes() - mapped0, (f->n + f->n) * TD * sizeof(float));
    for (size_t li = 0; li < v2->nlist; li++)
        for (size_t j = 0; v2->lists[li] && j < v2->lists[li]->n; j++) {
            const tsr__rec *r = v2->row_rec[v2->row0[li] + j];
            assert_int_equal(r->label, v2->lists[li]->ids[j]);
            assert_ptr_equal(r, tsr__version_find(v2, r->label));
            assert_non_null(r->vmap);
        }
    tsr__version_unref(v2);
    tsr__version_unref(v3);
    /* the last record gone: unmapped */
    assert_int_equal(tsr__vmap_bytes(), mapped0);
    tu_rmtree(d2);
    free(d1), free(d2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flist_roundtrip),
        cmocka_unit_test_setup_teardown(test_files_identical, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mapping_outlives_version, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
