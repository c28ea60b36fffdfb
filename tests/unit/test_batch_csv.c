/*
 * test_batch_csv — the CSV reader against SPEC §2: the seed example, Java float
 * literals, sparse, restricts, numeric restricts and every record-level error type.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "batch/batch_csv.h"
#include "batch/batch_int.h"
#include "batch_test_sink.h"

static coll *parse(const char *text, size_t dims)
{
    coll *c = coll_new();
    tsr_record_sink s = SINK(c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_batch_csv_read_mem(text, strlen(text), dims, &s, &err), 0);
    return c;
}

/* One line that must be invalid with the given type. */
static void expect_bad(const char *line, size_t dims, enum tsr_rec_error type)
{
    coll *c = parse(line, dims);
    if (c->nbad != 1 || c->types[0] != type)
        fail_msg("'%s': expected 1 error %s, got %zu errors (first %s: %s), %zu records", line,
                 tsr_rec_error_name(type), c->nbad, c->nbad ? tsr_rec_error_name(c->types[0]) : "-",
                 c->nbad ? c->msgs[0] : "", c->nrecs);
    assert_int_equal(c->nrecs, 0);
    coll_free(c);
}

static void test_seed_example(void **state)
{
    (void)state;
    coll *c = parse("6,7,-8.1,40:0.1,901:-0.2,1111:0.5,crowding_tag=test,color=red,color=blue,"
                    "color=!purple,ratio=0.1f\n",
                    2);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 1);
    tsr_datapoint *d = &c->recs[0];
    assert_string_equal(d->id, "6");
    assert_int_equal(d->ndense, 2);
    assert_true(d->dense[0] == 7.0f && d->dense[1] == -8.1f);
    assert_int_equal(d->nsparse, 3);
    assert_int_equal(d->sparse_dims[0], 40);
    assert_int_equal(d->sparse_dims[1], 901);
    assert_int_equal(d->sparse_dims[2], 1111);
    assert_true(d->sparse_vals[0] == 0.1f && d->sparse_vals[1] == -0.2f && d->sparse_vals[2] == 0.5f);
    assert_string_equal(d->crowding_tag, "test");
    assert_int_equal(d->nrestricts, 2);
    assert_string_equal(d->restricts[0].ns, "color");
    assert_int_equal(d->restricts[0].nallow, 2);
    assert_string_equal(d->restricts[0].allow[0], "red");
    assert_string_equal(d->restricts[0].allow[1], "blue");
    assert_int_equal(d->restricts[0].ndeny, 1);
    assert_string_equal(d->restricts[0].deny[0], "purple");
    /* ratio=0.1f without '#' is a token restrict (SPEC §2). */
    assert_string_equal(d->restricts[1].ns, "ratio");
    assert_int_equal(d->restricts[1].nallow, 1);
    assert_string_equal(d->restricts[1].allow[0], "0.1f");
    assert_int_equal(d->nnumeric, 0);
    coll_free(c);
}

static void test_numeric_restricts(void **state)
{
    (void)state;
    coll *c = parse("6,7,-8.1,#ratio=0.1f,#size=3i,#weight=0.3d,#neg=-9223372036854775808i\n", 2);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 1);
    tsr_datapoint *d = &c->recs[0];
    assert_int_equal(d->nrestricts, 0);
    assert_int_equal(d->nnumeric, 4);
    assert_string_equal(d->numeric[0].ns, "ratio");
    assert_int_equal(d->numeric[0].type, TSR_NUM_FLOAT);
    assert_true(d->numeric[0].v.f == 0.1f);
    assert_string_equal(d->numeric[1].ns, "size");
    assert_int_equal(d->numeric[1].type, TSR_NUM_INT);
    assert_int_equal(d->numeric[1].v.i, 3);
    assert_int_equal(d->numeric[2].type, TSR_NUM_DOUBLE);
    assert_true(d->numeric[2].v.d == 0.3);
    assert_true(d->numeric[3].v.i == INT64_MIN);
    coll_free(c);
    expect_bad("1,1,#size=3\n", 1, TSR_REC_INVALID_NUMERIC_VALUE);
    expect_bad("1,1,#size=3x\n", 1, TSR_REC_INVALID_NUMERIC_VALUE);
    expect_bad("1,1,#size=1.5i\n", 1, TSR_REC_INVALID_NUMERIC_VALUE);
    expect_bad("1,1,#size=9223372036854775808i\n", 1, TSR_REC_INVALID_NUMERIC_VALUE);
    expect_bad("1,1,#size=NaNf\n", 1, TSR_REC_INVALID_NUMERIC_VALUE);
    expect_bad("1,1,#=3i\n", 1, TSR_REC_NAMESPACE_MISSING);
}

static void test_repeated_numeric_is_duplicate_namespace(void **state)
{
    (void)state;
    expect_bad("1,1,#size=3i,#size=4i\n", 1, TSR_REC_DUPLICATE_NAMESPACE);
    expect_bad("1,1,#size=3i,#size=4f\n", 1, TSR_REC_DUPLICATE_NAMESPACE);
    /* a token namespace of the same name is a different thing */
    coll *c = parse("1,1,#size=3i,size=big\n", 1);
    assert_int_equal(c->nrecs, 1);
    coll_free(c);
}

static void test_crowding_tag_once(void **state)
{
    (void)state;
    expect_bad("1,1,crowding_tag=a,crowding_tag=b\n", 1, TSR_REC_MULTIPLE_VALUES);
    expect_bad("1,1,crowding_tag=\n", 1, TSR_REC_INVALID_TOKEN_VALUE);
}

static void test_tokens(void **state)
{
    (void)state;
    expect_bad("1,1,=red\n", 1, TSR_REC_NAMESPACE_MISSING);
    expect_bad("1,1,color=\n", 1, TSR_REC_INVALID_TOKEN_VALUE);
    expect_bad("1,1,color=!\n", 1, TSR_REC_INVALID_TOKEN_VALUE);
    coll *c = parse("1,1,url=a=b:c\n", 1); /* first '=' splits; ':' in a value is fine */
    assert_int_equal(c->nrecs, 1);
    assert_string_equal(c->recs[0].restricts[0].allow[0], "a=b:c");
    coll_free(c);
}

static void test_java_floats(void **state)
{
    (void)state;
    coll *c = parse("a,1.5e3,0x1.8p1,-.5f,2.D,+1E-2,0X1P-2d, 3 ,1e-50\n", 8);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 1);
    float *v = c->recs[0].dense;
    assert_true(v[0] == 1500.0f && v[1] == 3.0f && v[2] == -0.5f && v[3] == 2.0f);
    assert_true(v[4] == 0.01f && v[5] == 0.25f && v[6] == 3.0f && v[7] == 0.0f);
    coll_free(c);
    const char *bad[] = {"a,1e\n", "a,e5\n", "a,.\n", "a,0x1.8\n", "a,1.5ff\n", "a,--1\n",
                         "a,1_000\n", "a,\n", "a,0x\n", "a,inf\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad(bad[i], 1, TSR_REC_INVALID_EMBEDDING);
}

static void test_nan_infinity_rejected(void **state)
{
    (void)state;
    expect_bad("a,NaN\n", 1, TSR_REC_INVALID_EMBEDDING);
    expect_bad("a,-Infinity\n", 1, TSR_REC_INVALID_EMBEDDING);
    expect_bad("a,Infinity\n", 1, TSR_REC_INVALID_EMBEDDING);
    expect_bad("a,1e39\n", 1, TSR_REC_INVALID_EMBEDDING); /* beyond float: Infinity */
    expect_bad("a,5:NaN\n", 1, TSR_REC_INVALID_EMBEDDING);
}

static void test_float_rounding_matches_strtof(void **state)
{
    (void)state;
    /* Compare against strtof on many random decimal strings (correct rounding). */
    srand(7);
    char line[128];
    for (int i = 0; i < 20000; i++) {
        float ref;
        char num[64];
        int digits = 1 + rand() % 12;
        int o = 0, dot = rand() % (digits + 1);
        if (rand() & 1)
            num[o++] = '-';
        if (i % 3 == 0) { /* printed random floats: 9 significant digits */
            float r = (float)rand() / (float)RAND_MAX * powf(10.0f, (float)(rand() % 20 - 10));
            snprintf(num, sizeof num, "%.9g", (double)r);
        } else if (i % 3 == 1) { /* exact float midpoints: hardest for double rounding */
            float a = (float)rand() / 1024.0f;
            double mid = ((double)a + (double)nextafterf(a, INFINITY)) / 2;
            snprintf(num, sizeof num, "%.17g", mid);
        } else {
            for (int k = 0; k < digits; k++) {
                if (k == dot)
                    num[o++] = '.';
                num[o++] = (char)('0' + rand() % 10);
            }
            o += snprintf(num + o, sizeof num - (size_t)o, "e%d", rand() % 60 - 30);
            num[o] = '\0';
        }
        ref = strtof(num, NULL);
        if (isinf(ref) || isnan(ref))
            continue;
        snprintf(line, sizeof line, "x,%s\n", num);
        coll *c = parse(line, 1);
        if (c->nrecs != 1)
            fail_msg("%s: %s", num, c->nbad ? c->msgs[0] : "?");
        if (c->recs[0].dense[0] != ref)
            fail_msg("%s: got %a want %a", num, (double)c->recs[0].dense[0], (double)ref);
        coll_free(c);
    }
}

static void test_sizes_and_order(void **state)
{
    (void)state;
    expect_bad("a,1,2,3\n", 2, TSR_REC_EMBEDDING_SIZE_MISMATCH);
    expect_bad("a,1\n", 2, TSR_REC_EMBEDDING_SIZE_MISMATCH);
    expect_bad("a,1,color=red\n", 2, TSR_REC_EMBEDDING_SIZE_MISMATCH);
    expect_bad("a,1,2,5:1,3\n", 2, TSR_REC_INVALID_CSV_SYNTAX);  /* dense after sparse */
    expect_bad("a,5:1,1,2\n", 2, TSR_REC_INVALID_CSV_SYNTAX);    /* dense after sparse */
    expect_bad("a,1,2,c=x,5:1\n", 2, TSR_REC_INVALID_CSV_SYNTAX); /* sparse after tokens */
    expect_bad("a\n", 2, TSR_REC_INVALID_EMBEDDING);             /* no embedding */
    expect_bad("a,color=red\n", 2, TSR_REC_INVALID_EMBEDDING);
    expect_bad(",1,2\n", 2, TSR_REC_INVALID_EMBEDDING_ID);
    /* sparse only, hybrid */
    coll *c = parse("s,5:1.5,3:2,5:0.5\nh,1,2,9:1\n", 2);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 2);
    assert_int_equal(c->recs[0].ndense, 0);
    assert_int_equal(c->recs[0].nsparse, 2); /* duplicates summed, sorted */
    assert_int_equal(c->recs[0].sparse_dims[0], 3);
    assert_int_equal(c->recs[0].sparse_dims[1], 5);
    assert_true(c->recs[0].sparse_vals[1] == 2.0f);
    assert_int_equal(c->recs[1].ndense, 2);
    coll_free(c);
}

static void test_sparse_errors(void **state)
{
    (void)state;
    expect_bad("a,x:1\n", 1, TSR_REC_INVALID_SPARSE_DIMENSIONS);
    expect_bad("a,1.5:1\n", 1, TSR_REC_INVALID_SPARSE_DIMENSIONS);
    expect_bad("a,9223372036854775808:1\n", 1, TSR_REC_INVALID_SPARSE_DIMENSIONS);
    expect_bad("a,1:x\n", 1, TSR_REC_INVALID_SPARSE_EMBEDDING);
    expect_bad("a,1:\n", 1, TSR_REC_INVALID_SPARSE_EMBEDDING);
    coll *c = parse("a,-9223372036854775808:1,9223372036854775807:2\n", 1);
    assert_int_equal(c->nrecs, 1);
    assert_true(c->recs[0].sparse_dims[0] == INT64_MIN && c->recs[0].sparse_dims[1] == INT64_MAX);
    coll_free(c);
}

static void test_lines_encoding(void **state)
{
    (void)state;
    coll *c = parse("a,1\r\n\r\n\nb,2\n   \nc,3", 1);
    assert_int_equal(c->nrecs, 3);
    assert_string_equal(c->recs[0].id, "a"); /* CR stripped */
    assert_string_equal(c->recs[2].id, "c"); /* no final newline */
    assert_int_equal(c->rec_where[1], 4);
    assert_int_equal(c->nbad, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(c->types[i], TSR_REC_EMPTY_LINE);
    assert_int_equal(c->bad_where[0], 2);
    assert_int_equal(c->bad_where[1], 3);
    assert_int_equal(c->bad_where[2], 5);
    coll_free(c);
    expect_bad("\xff\xfe,1\n", 1, TSR_REC_INVALID_ENCODING);
    expect_bad("\xc0\xaf,1\n", 1, TSR_REC_INVALID_ENCODING);      /* overlong */
    expect_bad("\xed\xa0\x80,1\n", 1, TSR_REC_INVALID_ENCODING);  /* surrogate */
    expect_bad("a,1,c=\xe2\x82\n", 1, TSR_REC_INVALID_ENCODING);  /* truncated */
    c = parse("\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d,1\n", 1); /* Hebrew id is fine */
    assert_int_equal(c->nrecs, 1);
    coll_free(c);
}

static void test_long_line_file(void **state)
{
    (void)state;
    /* A line over the limit is one invalid record; the next line still reads. */
    char path[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/tsr_csv_XXXXXX", tmp ? tmp : P_tmpdir);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("a,1\nb,", f);
    for (size_t i = 0; i < TSR_BATCH_MAX_LINE / 2 + 10; i++)
        fputs("1,", f);
    fputs("1\nc,2\n", f);
    fclose(f);
    coll *c = coll_new();
    tsr_record_sink s = SINK(c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_batch_csv_read(path, 1, &s, &err), 0);
    assert_int_equal(c->nrecs, 2);
    assert_string_equal(c->recs[1].id, "c");
    assert_int_equal(c->rec_where[1], 3);
    assert_int_equal(c->nbad, 1);
    assert_int_equal(c->bad_where[0], 2);
    assert_int_equal(c->types[0], TSR_REC_INVALID_CSV_SYNTAX);
    coll_free(c);
    unlink(path);
    assert_int_not_equal(tsr_batch_csv_read("/nonexistent/x.csv", 1, &s, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_example),
        cmocka_unit_test(test_numeric_restricts),
        cmocka_unit_test(test_repeated_numeric_is_duplicate_namespace),
        cmocka_unit_test(test_crowding_tag_once),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_java_floats),
        cmocka_unit_test(test_nan_infinity_rejected),
        cmocka_unit_test(test_float_rounding_matches_strtof),
        cmocka_unit_test(test_sizes_and_order),
        cmocka_unit_test(test_sparse_errors),
        cmocka_unit_test(test_lines_encoding),
        cmocka_unit_test(test_long_line_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
