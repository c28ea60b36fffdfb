/*
 * test_faiss_io — faiss_io round trips in memory (every variant: metric, by_residual,
 * direct map, full/sprs lists, IwQR) and one test per hostile-file check, each asserting
 * the specific error (code, offset and field named in the message); the file writers
 * (atomic write_file, write_to through a buffered writer: write_mem's bytes).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "index/faiss_io.h"

/* Shape of the test index: small so that offsets are easy to compute. */
#define D 4
#define NLIST 4
#define PQ_M 2
#define NBITS 4
#define KSUB (1 << NBITS)
#define CS 1 /* ceil(M * NBITS / 8) */

/* Fixed offsets of the layout (SPEC §1) for this shape. */
#define OFF_D 4
#define OFF_NTOTAL 8
#define OFF_DUMMY 16
#define OFF_IS_TRAINED 32
#define OFF_METRIC 33
#define OFF_NLIST 37
#define OFF_QFOURCC 53
#define OFF_QD 57
#define OFF_QNTOTAL 61
#define OFF_QMETRIC 86
#define OFF_QCENT_N 90
#define OFF_DM_TYPE (98 + NLIST * D * 4)
#define OFF_DM_ARR_N (OFF_DM_TYPE + 1)

static uint64_t seed = 1;
static float frand(void)
{
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
}

/* lists: per-list sizes; ids are 100 + running number. */
static tsr_ivfpq *make_index(enum tsr_metric metric, int by_residual, enum tsr_direct_map dm,
                             const size_t sizes[NLIST])
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tsr_ivfpq_create(D, NLIST, PQ_M, NBITS, metric, by_residual, &err);
    assert_non_null(ix);
    ix->is_trained = 1;
    ix->quantizer_is_trained = 1;
    ix->nprobe = 3;
    for (size_t i = 0; i < NLIST * D; i++)
        ix->centroids[i] = frand();
    for (size_t i = 0; i < D * KSUB; i++)
        ix->pq.centroids[i] = frand();
    int64_t next = 100;
    size_t total = 0;
    for (size_t l = 0; l < NLIST; l++) {
        for (size_t j = 0; j < sizes[l]; j++) {
            uint8_t code = (uint8_t)(l * 17 + j);
            int64_t id = next++;
            assert_int_equal(tsr_invlist_append(&ix->lists[l], CS, 1, &code, &id), 0);
        }
        total += sizes[l];
    }
    ix->ntotal = (int64_t)total;
    ix->dm_type = dm;
    if (dm == TSR_DM_ARRAY) {
        /* Faiss's lo_build(list, offset) for ids 0..ntotal-1 as if added in list order */
        ix->dm_array = calloc(total ? total : 1, sizeof(int64_t));
        size_t k = 0;
        for (size_t l = 0; l < NLIST; l++)
            for (size_t j = 0; j < sizes[l]; j++)
                ix->dm_array[k++] = (int64_t)(l << 32 | j);
        ix->dm_array_n = total;
    } else if (dm == TSR_DM_HASHTABLE) {
        ix->dm_hash = calloc(total ? 2 * total : 1, sizeof(int64_t));
        size_t k = 0;
        for (size_t l = 0; l < NLIST; l++)
            for (size_t j = 0; j < sizes[l]; j++, k++) {
                ix->dm_hash[2 * k] = ix->lists[l].ids[j];
                ix->dm_hash[2 * k + 1] = (int64_t)(l << 32 | j);
            }
        /* reverse so that "in the order read" is not sorted order */
        for (size_t a = 0, b = total ? total - 1 : 0; a < b; a++, b--)
            for (int w = 0; w < 2; w++) {
                int64_t t = ix->dm_hash[2 * a + w];
                ix->dm_hash[2 * a + w] = ix->dm_hash[2 * b + w];
                ix->dm_hash[2 * b + w] = t;
            }
        ix->dm_hash_n = total;
    }
    return ix;
}

static void write_ok(const tsr_ivfpq *ix, uint8_t **buf, size_t *len)
{
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_faiss_write_mem(ix, buf, len, &err);
    if (rc != 0)
        fail_msg("write: %s", err.msg);
}

static void assert_same_index(const tsr_ivfpq *a, const tsr_ivfpq *b)
{
    assert_int_equal(a->d, b->d);
    assert_int_equal(a->ntotal, b->ntotal);
    assert_int_equal(a->metric, b->metric);
    assert_int_equal(a->nlist, b->nlist);
    assert_int_equal(a->nprobe, b->nprobe);
    assert_int_equal(a->by_residual, b->by_residual);
    assert_int_equal(a->code_size, b->code_size);
    assert_int_equal(a->pq.M, b->pq.M);
    assert_int_equal(a->pq.nbits, b->pq.nbits);
    assert_int_equal(a->dm_type, b->dm_type);
    assert_int_equal(a->dm_array_n, b->dm_array_n);
    assert_int_equal(a->dm_hash_n, b->dm_hash_n);
    assert_string_equal(a->quantizer_fourcc, b->quantizer_fourcc);
    assert_memory_equal(a->centroids, b->centroids, a->nlist * (size_t)a->d * sizeof(float));
    assert_memory_equal(a->pq.centroids, b->pq.centroids, a->pq.d * a->pq.ksub * sizeof(float));
    if (a->dm_array_n)
        assert_memory_equal(a->dm_array, b->dm_array, a->dm_array_n * 8);
    if (a->dm_hash_n)
        assert_memory_equal(a->dm_hash, b->dm_hash, a->dm_hash_n * 16);
    for (size_t l = 0; l < a->nlist; l++) {
        assert_int_equal(a->lists[l].size, b->lists[l].size);
        if (a->lists[l].size) {
            assert_memory_equal(a->lists[l].codes, b->lists[l].codes, a->lists[l].size * a->code_size);
            assert_memory_equal(a->lists[l].ids, b->lists[l].ids, a->lists[l].size * 8);
        }
    }
    assert_int_equal(a->is_refine, b->is_refine);
}

/* write -> read -> compare -> write again: identical bytes. Returns the bytes. */
static uint8_t *round_trip(const tsr_ivfpq *ix, size_t *len, const char *want_list_type)
{
    uint8_t *b1, *b2;
    size_t n1, n2;
    write_ok(ix, &b1, &n1);
    tsr_ivfpq *back = NULL;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_faiss_read_mem(b1, n1, &back, &err) != 0)
        fail_msg("read: %s", err.msg);
    assert_same_index(ix, back);
    assert_string_equal(back->list_type, want_list_type);
    write_ok(back, &b2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b2);
    tsr_ivfpq_destroy(back);
    *len = n1;
    return b1;
}

static const size_t FULL[NLIST] = {3, 1, 0, 2};   /* 3 of 4 non-empty -> "full" */
static const size_t SPARSE[NLIST] = {0, 0, 5, 0}; /* 1 of 4 -> "sprs" */
static const size_t EMPTY[NLIST] = {0, 0, 0, 0};

static void test_round_trips(void **state)
{
    for (int metric = 0; metric <= 1; metric++)
        for (int res = 0; res <= 1; res++)
            for (int dm = 0; dm <= 2; dm++)
                for (int sp = 0; sp <= 2; sp++) {
                    const size_t *sz = sp == 0 ? FULL : sp == 1 ? SPARSE : EMPTY;
                    tsr_ivfpq *ix = make_index((enum tsr_metric)metric, res,
                                               (enum tsr_direct_map)dm, sz);
                    size_t len;
                    free(round_trip(ix, &len, sp == 0 ? "full" : "sprs"));
                    tsr_ivfpq_destroy(ix);
                }
}

static void test_round_trip_refine(void **state)
{
    tsr_ivfpq *ix = make_index(TSR_METRIC_L2, 1, TSR_DM_NONE, FULL);
    tsr_error err = TSR_ERROR_INIT;
    ix->is_refine = 1;
    assert_int_equal(tsr_pq_init(&ix->refine_pq, D, 4, 8, &err), 0);
    for (size_t i = 0; i < D * 256; i++)
        ix->refine_pq.centroids[i] = frand();
    ix->refine_codes_n = (size_t)ix->ntotal * 4;
    ix->refine_codes = malloc(ix->refine_codes_n);
    for (size_t i = 0; i < ix->refine_codes_n; i++)
        ix->refine_codes[i] = (uint8_t)(i * 31);
    ix->k_factor = 4.0f;
    size_t len;
    uint8_t *b = round_trip(ix, &len, "full");
    assert_memory_equal(b, "IwQR", 4);
    tsr_ivfpq *back = NULL;
    assert_int_equal(tsr_faiss_read_mem(b, len, &back, &err), 0);
    assert_int_equal(back->refine_codes_n, ix->refine_codes_n);
    assert_memory_equal(back->refine_codes, ix->refine_codes, ix->refine_codes_n);
    assert_true(back->k_factor == 4.0f);
    assert_int_equal(back->refine_pq.M, 4);
    /* refine codes count must be ntotal * refine code_size */
    size_t kf = len - 4, rc_n = kf - ix->refine_codes_n - 8;
    uint64_t bad = ix->refine_codes_n - 1;
    memcpy(b + rc_n, &bad, 8);
    tsr_ivfpq_destroy(back);
    back = NULL;
    assert_int_equal(tsr_faiss_read_mem(b, len, &back, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "refine_codes"));
    free(b);
    tsr_ivfpq_destroy(ix);
}

/* ---- hostile files ------------------------------------------------------------------- */

static uint8_t *valid_file(const size_t *sizes, enum tsr_direct_map dm, size_t *len)
{
    tsr_ivfpq *ix = make_index(TSR_METRIC_L2, 1, dm, sizes);
    uint8_t *b;
    write_ok(ix, &b, len);
    tsr_ivfpq_destroy(ix);
    return b;
}

/* offset of the "ilar" block for a NoMap file of this shape */
static size_t off_ilar(void) { return OFF_DM_ARR_N + 8 + 1 + 8 + 24 + 8 + D * KSUB * 4; }

static void put64(uint8_t *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }
static void put32(uint8_t *b, size_t off, uint32_t v) { memcpy(b + off, &v, 4); }

static void expect_error(const uint8_t *b, size_t len, int code, const char *s1, const char *s2)
{
    tsr_ivfpq *ix = NULL;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_faiss_read_mem(b, len, &ix, &err);
    if (rc != code || ix != NULL || strstr(err.msg, s1) == NULL ||
        (s2 != NULL && strstr(err.msg, s2) == NULL))
        fail_msg("rc %d (want %d), message '%s', want '%s' and '%s'", rc, code, err.msg, s1,
                 s2 ? s2 : "");
}

static void test_truncated(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_HASHTABLE, &len);
    for (size_t n = 0; n < len; n++) {
        tsr_ivfpq *ix = NULL;
        tsr_error err = TSR_ERROR_INIT;
        assert_int_equal(tsr_faiss_read_mem(b, n, &ix, &err), TSR_EFORMAT);
        assert_null(ix);
        assert_non_null(strstr(err.msg, "offset "));
        assert_non_null(strstr(err.msg, "remain"));
    }
    free(b);
}

static void test_bad_fourccs(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_NONE, &len);
    memcpy(b, "IxHN", 4);
    expect_error(b, len, TSR_EFORMAT, "offset 0: fourcc: \"IxHN\"", "expected \"IwPQ\"");
    memcpy(b, "IvPQ", 4);
    expect_error(b, len, TSR_EUNSUPPORTED, "offset 0: fourcc: \"IvPQ\"", "legacy");
    memcpy(b, "\x01\x02\x03\x04", 4);
    expect_error(b, len, TSR_EFORMAT, "offset 0: fourcc: 0x04030201", NULL);
    memcpy(b, "IwPQ", 4);
    memcpy(b + OFF_QFOURCC, "IHNf", 4);
    expect_error(b, len, TSR_EFORMAT, "offset 53: quantizer.fourcc: \"IHNf\"", NULL);
    memcpy(b + OFF_QFOURCC, "IxFl", 4);
    expect_error(b, len, TSR_EUNSUPPORTED, "offset 53: quantizer.fourcc: \"IxFl\"", NULL);
    memcpy(b + OFF_QFOURCC, "IxFI", 4); /* IP fourcc with an L2 header metric */
    expect_error(b, len, TSR_EFORMAT, "offset 86: quantizer.metric_type", "expected 0");
    memcpy(b + OFF_QFOURCC, "IxF2", 4);
    size_t il = off_ilar();
    assert_memory_equal(b + il, "ilar", 4);
    memcpy(b + il, "ilod", 4);
    char want[64];
    snprintf(want, sizeof want, "offset %zu: invlists.fourcc: \"ilod\"", il);
    expect_error(b, len, TSR_EUNSUPPORTED, want, NULL);
    memcpy(b + il, "ilar", 4);
    memcpy(b + il + 20, "spar", 4);
    snprintf(want, sizeof want, "offset %zu: invlists.list_type: \"spar\"", il + 20);
    expect_error(b, len, TSR_EFORMAT, want, NULL);
    free(b);
}

static void test_huge_counts(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_NONE, &len);
    put64(b, OFF_QCENT_N, (uint64_t)1 << 62);
    expect_error(b, len, TSR_EFORMAT, "offset 90: quantizer.centroids: vector of 4611686018427387904 floats",
                 "more than 2^64 bytes");
    put64(b, OFF_QCENT_N, NLIST * D);
    put64(b, OFF_DM_ARR_N, 1000000000);
    expect_error(b, len, TSR_EFORMAT, "direct_map.array: vector of 1000000000 i64", "remain");
    put64(b, OFF_DM_ARR_N, 0);
    /* a list size that needs far more bytes than remain, as in SPEC's example */
    size_t sizes = off_ilar() + 24 + 8;
    put64(b, sizes + 8 * 1, 99999999);
    char want[96];
    snprintf(want, sizeof want, "offset %zu: invlists.sizes[1]: list size 99999999 needs 899999991 bytes",
             sizes + 8);
    expect_error(b, len, TSR_EFORMAT, want, "remain");
    put64(b, sizes + 8 * 1, UINT64_MAX);
    expect_error(b, len, TSR_EFORMAT, "invlists.sizes[1]: list size 18446744073709551615", NULL);
    put64(b, sizes + 8, FULL[1]);
    put64(b, OFF_NLIST, (uint64_t)1 << 40); /* nlist must agree with the quantizer */
    expect_error(b, len, TSR_EFORMAT, "offset 61: quantizer.ntotal: 4, expected nlist = 1099511627776",
                 NULL);
    free(b);
}

static void test_sparse_checks(void **state)
{
    size_t len;
    uint8_t *b = valid_file(SPARSE, TSR_DM_NONE, &len);
    size_t il = off_ilar();
    assert_memory_equal(b + il + 20, "sprs", 4);
    size_t cnt = il + 24, pairs = cnt + 8;
    char want[96];
    put64(b, cnt, 3); /* odd */
    snprintf(want, sizeof want, "offset %zu: invlists.sparse_sizes: 3 entries, expected an even", cnt);
    expect_error(b, len, TSR_EFORMAT, want, NULL);
    put64(b, cnt, 2);
    put64(b, pairs, NLIST); /* list_no >= nlist */
    snprintf(want, sizeof want, "offset %zu: invlists.sparse_sizes[0]: list_no 4, expected < nlist", pairs);
    expect_error(b, len, TSR_EFORMAT, want, NULL);
    put64(b, pairs, 2);
    put64(b, pairs + 8, 0); /* an empty list in a sparse table */
    expect_error(b, len, TSR_EFORMAT, "invlists.sparse_sizes[1]: size 0 for list 2", NULL);
    put64(b, pairs + 8, 4); /* sum 4 != ntotal 5 */
    snprintf(want, sizeof want, "offset %zu: invlists.sizes: list sizes sum to 4, expected ntotal = 5",
             cnt);
    expect_error(b, len, TSR_EFORMAT, want, NULL);
    free(b);

    /* duplicate list_no: (1, 2), (1, 3) laid out by hand from a two-list file */
    static const size_t TWO[NLIST] = {0, 2, 0, 3}; /* 2 of 4 -> still "sprs" (not > nlist/2) */
    b = valid_file(TWO, TSR_DM_NONE, &len);
    assert_memory_equal(b + il + 20, "sprs", 4);
    put64(b, pairs + 16, 1);
    snprintf(want, sizeof want, "offset %zu: invlists.sparse_sizes[2]: list_no 1 after 1", pairs + 16);
    expect_error(b, len, TSR_EFORMAT, want, "strictly increasing");
    free(b);
}

static void test_sum_mismatch(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_NONE, &len);
    put64(b, OFF_NTOTAL, 7);
    expect_error(b, len, TSR_EFORMAT, "invlists.sizes: list sizes sum to 6, expected ntotal = 7", NULL);
    put64(b, OFF_NTOTAL, (uint64_t)-1);
    expect_error(b, len, TSR_EFORMAT, "offset 8: index.ntotal: -1, expected >= 0", NULL);
    free(b);
}

static void test_bad_bools_and_header(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_NONE, &len);
    b[OFF_IS_TRAINED] = 2;
    expect_error(b, len, TSR_EFORMAT, "offset 32: index.is_trained: bool byte is 2, expected 0 or 1", NULL);
    b[OFF_IS_TRAINED] = 1;
    size_t by_res = OFF_DM_ARR_N + 8;
    b[by_res] = 0xff;
    expect_error(b, len, TSR_EFORMAT, "by_residual: bool byte is 255", NULL);
    b[by_res] = 1;
    put64(b, OFF_DUMMY, 0);
    expect_error(b, len, TSR_EFORMAT, "offset 16: index.dummy1: 0, expected 1048576", NULL);
    put64(b, OFF_DUMMY, 1 << 20);
    put32(b, OFF_METRIC, 2); /* has a metric_arg: shifts nothing we could parse */
    expect_error(b, len, TSR_EUNSUPPORTED, "offset 33: index.metric_type: metric 2 is not supported", NULL);
    put32(b, OFF_METRIC, (uint32_t)-5);
    expect_error(b, len, TSR_EUNSUPPORTED, "metric -5 is not supported", NULL);
    put32(b, OFF_METRIC, 1);
    put32(b, OFF_D, 0);
    expect_error(b, len, TSR_EFORMAT, "offset 4: index.d: dimension 0, expected > 0", NULL);
    put32(b, OFF_D, 8);
    expect_error(b, len, TSR_EFORMAT, "offset 57: quantizer.d: 4, expected index d = 8", NULL);
    put32(b, OFF_D, D);
    put32(b, OFF_QD, 5);
    expect_error(b, len, TSR_EFORMAT, "offset 57: quantizer.d: 5", NULL);
    put32(b, OFF_QD, D);
    put64(b, OFF_QNTOTAL, 3);
    expect_error(b, len, TSR_EFORMAT, "offset 61: quantizer.ntotal: 3, expected nlist = 4", NULL);
    put64(b, OFF_QNTOTAL, NLIST);
    put64(b, OFF_NLIST, 0);
    expect_error(b, len, TSR_EFORMAT, "offset 37: ivf.nlist: 0, expected >= 1", NULL);
    put64(b, OFF_NLIST, NLIST);
    b[OFF_DM_TYPE] = 3;
    expect_error(b, len, TSR_EFORMAT, "direct_map.type: 3, expected 0 (NoMap)", NULL);
    b[OFF_DM_TYPE] = 1; /* Array with an empty array */
    expect_error(b, len, TSR_EFORMAT, "direct_map.array: 0 entries, expected ntotal = 6", NULL);
    b[OFF_DM_TYPE] = 0;
    /* PQ shape */
    size_t cs = by_res + 1, pqd = cs + 8, pqm = pqd + 8, pqn = pqm + 8;
    put64(b, cs, 2);
    expect_error(b, len, TSR_EFORMAT, "code_size: 2, expected ceil(M * nbits / 8) = 1", NULL);
    put64(b, cs, CS);
    put64(b, pqd, 8);
    expect_error(b, len, TSR_EFORMAT, "pq.d: 8, expected index d = 4", NULL);
    put64(b, pqd, D);
    put64(b, pqm, 3);
    expect_error(b, len, TSR_EFORMAT, "pq.M: 3, expected a divisor of d = 4", NULL);
    put64(b, pqm, 0);
    expect_error(b, len, TSR_EFORMAT, "pq.M: 0", NULL);
    put64(b, pqm, PQ_M);
    put64(b, pqn, 17);
    expect_error(b, len, TSR_EFORMAT, "pq.nbits: 17, expected 1..16", NULL);
    put64(b, pqn, 0);
    expect_error(b, len, TSR_EFORMAT, "pq.nbits: 0", NULL);
    put64(b, pqn, 5); /* code_size still 1, but centroid count no longer matches */
    expect_error(b, len, TSR_EFORMAT, "pq.centroids: 64 floats, expected d * 2^nbits = 128", NULL);
    put64(b, pqn, NBITS);
    size_t il = off_ilar();
    put64(b, il + 4, 5);
    expect_error(b, len, TSR_EFORMAT, "invlists.nlist: 5, expected nlist = 4", NULL);
    put64(b, il + 4, NLIST);
    put64(b, il + 12, 9);
    expect_error(b, len, TSR_EFORMAT, "invlists.code_size: 9, expected code_size = 1", NULL);
    put64(b, il + 12, CS);
    put64(b, il + 24, 3);
    expect_error(b, len, TSR_EFORMAT, "invlists.sizes: 3 entries, expected nlist = 4", NULL);
    put64(b, il + 24, NLIST);
    /* after all the repairs the file is valid again */
    tsr_ivfpq *ix = NULL;
    assert_int_equal(tsr_faiss_read_mem(b, len, &ix, NULL), 0);
    tsr_ivfpq_destroy(ix);
    free(b);
}

static void test_trailing_garbage(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_NONE, &len);
    uint8_t *b2 = malloc(len + 3);
    memcpy(b2, b, len);
    memset(b2 + len, 0, 3);
    char want[64];
    snprintf(want, sizeof want, "offset %zu: end of index: 3 trailing bytes", len);
    expect_error(b2, len + 3, TSR_EFORMAT, want, NULL);
    free(b2);
    free(b);
}

static void test_direct_map_entries(void **state)
{
    size_t len;
    uint8_t *b = valid_file(FULL, TSR_DM_ARRAY, &len);
    size_t arr = OFF_DM_ARR_N + 8;
    put64(b, arr + 8 * 2, (uint64_t)1 << 32 | 5); /* list 1 has 1 entry */
    expect_error(b, len, TSR_EFORMAT, "direct_map.array[2]", "(list 1, offset 5)");
    put64(b, arr + 8 * 2, (uint64_t)-1); /* missing entry (-1) is allowed, as Faiss leaves it */
    tsr_ivfpq *ix = NULL;
    assert_int_equal(tsr_faiss_read_mem(b, len, &ix, NULL), 0);
    tsr_ivfpq_destroy(ix);
    free(b);

    b = valid_file(FULL, TSR_DM_HASHTABLE, &len);
    size_t pairs = OFF_DM_ARR_N + 8 + 8;
    int64_t k0;
    memcpy(&k0, b + pairs, 8);
    memcpy(b + pairs + 16, &k0, 8); /* duplicate key */
    expect_error(b, len, TSR_EFORMAT, "direct_map.hashtable: key", "more than once");
    free(b);
}

static void test_file_io(void **state)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : P_tmpdir;
    char dir[200];
    snprintf(dir, sizeof dir, "%s/tsr_faiss_io_XXXXXX", base);
    assert_non_null(mkdtemp(dir));
    char path[256], tmp[300];
    snprintf(path, sizeof path, "%s/x.faiss", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tsr_ivfpq *ix = make_index(TSR_METRIC_IP, 0, TSR_DM_HASHTABLE, SPARSE);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_faiss_write_file(ix, path, &err), 0);
    tsr_ivfpq *back = NULL;
    assert_int_equal(tsr_faiss_read_file(path, &back, &err), 0);
    assert_same_index(ix, back);
    tsr_ivfpq_destroy(back);
    back = NULL;
    FILE *f = fopen(tmp, "r");
    assert_null(f);
    /* a directory that does not exist: TSR_EIO naming the temp file, nothing left */
    char bad[320];
    snprintf(bad, sizeof bad, "%s/no-such-dir/x.faiss", dir);
    assert_int_equal(tsr_faiss_write_file(ix, bad, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "no-such-dir/x.faiss.tmp"));
    /* read_file prefixes the path */
    f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    assert_int_equal(tsr_faiss_read_file(path, &back, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "trailing"));
    unlink(path);
    assert_int_equal(tsr_faiss_read_file(path, &back, &err), TSR_EIO);
    /* through a buffered writer (a 5-byte buffer): the bytes of write_mem */
    uint8_t *b;
    size_t len;
    assert_int_equal(tsr_faiss_write_mem(ix, &b, &len, &err), 0);
    tsr_file_writer w;
    assert_int_equal(tsr_file_writer_open(&w, path, 5, &err), 0);
    assert_int_equal(tsr_faiss_write_to(ix, &w, &err), 0);
    assert_int_equal(tsr_file_writer_close(&w, &err), 0);
    char *fb;
    size_t flen;
    assert_int_equal(tsr_file_read(path, 1 << 20, 0, &fb, &flen, &err), 0);
    assert_int_equal(flen, len);
    assert_memory_equal(fb, b, len);
    free(fb);
    free(b);
    unlink(path);
    /* the writer refuses an inconsistent struct rather than writing a bad file */
    ix->ntotal++;
    assert_int_equal(tsr_faiss_write_mem(ix, &b, &len, &err), TSR_EINVAL);
    assert_int_equal(tsr_file_writer_open(&w, path, 5, &err), 0);
    assert_int_equal(tsr_faiss_write_to(ix, &w, &err), TSR_EINVAL);
    tsr_file_writer_abort(&w);
    unlink(path);
    tsr_ivfpq_destroy(ix);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_round_trip_refine),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_fourccs),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_sparse_checks),
        cmocka_unit_test(test_sum_mismatch),
        cmocka_unit_test(test_bad_bools_and_header),
        cmocka_unit_test(test_trailing_garbage),
        cmocka_unit_test(test_direct_map_entries),
        cmocka_unit_test(test_file_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
