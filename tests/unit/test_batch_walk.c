/*
 * test_batch_walk — tsr_batch_load against the batch_root rules of SPEC §2: suffixes,
 * the 5,000-object limit, delete/ as the only subfolder, gzip by magic, duplicate ids,
 * data/delete conflicts, max_invalid_records, the merged order and the report, and that
 * file-level errors name the file exactly once (readers alone and through the report).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "batch/batch.h"
#include "batch/batch_avro.h"
#include "batch/batch_csv.h"
#include "batch/batch_delete.h"
#include "batch/batch_json.h"

static char root[512];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/tsr_batch_XXXXXX", tmp ? tmp : P_tmpdir);
    assert_non_null(mkdtemp(root));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void put(const char *name, const char *content, size_t len)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, name);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')) != NULL; s++) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fwrite(content, 1, len, f);
    fclose(f);
}
#define PUT(name, s) put((name), (s), strlen(s))

static tsr_batch *load(size_t dims, uint64_t maxinv, int *rc)
{
    tsr_batch_options o = {dims, maxinv, 2, NULL};
    tsr_batch *b = NULL;
    tsr_error err = TSR_ERROR_INIT;
    *rc = tsr_batch_load(root, &o, &b, &err);
    assert_non_null(b);
    return b;
}

static int has_error(const tsr_batch *b, const char *needle)
{
    for (size_t i = 0; i < b->report.nerrors; i++)
        if (strstr(b->report.errors[i], needle))
            return 1;
    return 0;
}

static void test_merge_sorted_and_deletes(void **state)
{
    (void)state;
    PUT("b.csv", "z,1,2\nm,3,4\n");
    PUT("a.json", "{\"id\": \"k\", \"embedding\": [5, 6]}\n");
    PUT("delete/del.txt", "gone\n\nalso-gone\n");
    int rc;
    tsr_batch *b = load(2, 0, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(b->nrecords, 3);
    assert_string_equal(b->records[0].id, "k");
    assert_string_equal(b->records[1].id, "m");
    assert_string_equal(b->records[2].id, "z");
    assert_int_equal(b->ndeletes, 2);
    assert_string_equal(b->deletes[0], "also-gone");
    assert_string_equal(b->deletes[1], "gone");
    assert_int_equal(b->report.nfiles, 3);
    assert_string_equal(b->report.files[0].name, "a.json");
    assert_string_equal(b->report.files[2].name, "delete/del.txt");
    assert_int_equal(b->report.files[2].kind, TSR_BATCH_DELETE);
    assert_false(b->report.rejected);
    tsr_batch_destroy(b);
}

static void test_duplicate_last_wins_with_warning(void **state)
{
    (void)state;
    PUT("a.csv", "x,1\ny,2\nx,3\n");
    PUT("b.csv", "x,4\n");
    PUT("delete/d", "q\nq\n");
    int rc;
    tsr_batch *b = load(1, 0, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(b->nrecords, 2);
    assert_string_equal(b->records[0].id, "x");
    assert_true(b->records[0].dense[0] == 4.0f); /* last by (file name, line) */
    assert_int_equal(b->ndeletes, 1);
    assert_int_equal(b->report.upserts, 2);
    assert_int_equal(b->report.records, 6); /* every line read: valid + invalid */
    assert_int_equal(b->report.records, b->report.valid + b->report.invalid);
    assert_int_equal(b->report.valid,
                     b->report.upserts + b->report.deletes + b->report.duplicates);
    assert_int_equal(b->report.duplicates, 3);
    assert_int_equal(b->report.warnings_total, 2);
    assert_non_null(strstr(b->report.warnings[0], "'x' appears 3 times"));
    assert_non_null(strstr(b->report.warnings[0], "a.csv:1, a.csv:3, b.csv:1"));
    tsr_batch_destroy(b);
}

static void test_data_and_delete_conflict(void **state)
{
    (void)state;
    PUT("a.csv", "x,1\ny,2\n");
    PUT("delete/d.txt", "y\n");
    int rc;
    tsr_batch *b = load(1, 100, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(b->report.rejected);
    assert_true(has_error(b, "id 'y' is in data file a.csv (line 2) and in delete file delete/d.txt (line 1)"));
    tsr_batch_destroy(b);
}

static void test_bad_suffix_and_subfolder(void **state)
{
    (void)state;
    PUT("a.csv", "x,1\n");
    PUT("notes.txt", "hello\n");
    PUT("sub/a.csv", "y,1\n");
    PUT("delete/inner/z", "q\n");
    int rc;
    tsr_batch *b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "file 'notes.txt' has an unsupported suffix"));
    assert_true(has_error(b, "subfolder 'sub/' is not allowed"));
    assert_true(has_error(b, "delete/inner/ is a folder"));
    assert_int_equal(b->report.errors_total, 3);
    tsr_batch_destroy(b);
}

static void test_gzip_rejected_whatever_the_name(void **state)
{
    (void)state;
    put("data.json", "\x1f\x8b\x08\x00rest", 8);
    PUT("ok.csv", "x,1\n");
    int rc;
    tsr_batch *b = load(1, 1000, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "data.json: the file is gzip-compressed"));
    assert_true(has_error(b, "gzip input is not supported"));
    tsr_batch_destroy(b);
    /* the same in a delete file */
    teardown(NULL);
    setup(NULL);
    put("delete/d", "\x1f\x8b", 2);
    b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "gzip"));
    tsr_batch_destroy(b);
}

static void test_object_limit(void **state)
{
    (void)state;
    char name[32];
    for (int i = 0; i < TSR_BATCH_MAX_OBJECTS; i++) {
        snprintf(name, sizeof name, "f%04d.csv", i);
        PUT(name, i == 0 ? "x,1\n" : ""); /* one record: not an empty batch */
    }
    int rc;
    tsr_batch *b = load(1, 0, &rc);
    assert_int_equal(rc, 0); /* exactly 5000 is fine */
    tsr_batch_destroy(b);
    PUT("f5000.csv", "");
    b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "5001 objects"));
    tsr_batch_destroy(b);
}

static void test_max_invalid_records(void **state)
{
    (void)state;
    PUT("a.csv", "x,1\n\ny,1,2\nz,3\n");
    int rc;
    tsr_batch *b = load(1, 0, &rc); /* default: any invalid rejects */
    assert_int_equal(rc, TSR_EREJECTED);
    assert_non_null(strstr(b->report.reason, "2 invalid records; max_invalid_records is 0"));
    tsr_batch_destroy(b);
    b = load(1, 1, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    tsr_batch_destroy(b);
    b = load(1, 2, &rc); /* skipped, still reported */
    assert_int_equal(rc, 0);
    assert_int_equal(b->nrecords, 2);
    const tsr_batch_file_report *f = &b->report.files[0];
    assert_int_equal(f->valid, 2);
    assert_int_equal(f->invalid, 2);
    assert_int_equal(f->nerrors, 2);
    assert_int_equal(f->errors[0].where, 2);
    assert_int_equal(f->errors[0].type, TSR_REC_EMPTY_LINE);
    assert_int_equal(f->errors[1].where, 3);
    assert_int_equal(f->errors[1].type, TSR_REC_EMBEDDING_SIZE_MISMATCH);
    assert_int_equal(b->report.type_counts[TSR_REC_EMPTY_LINE], 1);
    assert_int_equal(b->report.type_counts[TSR_REC_EMBEDDING_SIZE_MISMATCH], 1);
    tsr_batch_destroy(b);
}

static void test_report_caps_and_json(void **state)
{
    (void)state;
    char *big = malloc(200 * 4 + 1);
    for (int i = 0; i < 200; i++)
        memcpy(big + 4 * i, "a,x\n", 4);
    big[800] = '\0';
    PUT("bad.csv", big);
    free(big);
    int rc;
    tsr_batch *b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_int_equal(b->report.files[0].invalid, 200);
    assert_int_equal(b->report.files[0].nerrors, TSR_BATCH_MAX_FILE_ERRORS);
    char *js = tsr_batch_report_json(&b->report);
    assert_non_null(js);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    assert_non_null(o);
    assert_false(json_is_true(json_object_get(o, "accepted")));
    json_t *f0 = json_array_get(json_object_get(o, "files"), 0);
    assert_string_equal(json_string_value(json_object_get(f0, "file")), "bad.csv");
    assert_int_equal(json_integer_value(json_object_get(f0, "invalid")), 200);
    json_t *e0 = json_array_get(json_object_get(f0, "errors"), 0);
    assert_int_equal(json_integer_value(json_object_get(e0, "line")), 1);
    assert_string_equal(json_string_value(json_object_get(e0, "type")), "INVALID_EMBEDDING");
    assert_int_equal(json_array_size(json_object_get(f0, "errors")), 50);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "error_counts"),
                                                        "INVALID_EMBEDDING")),
                     200);
    json_decref(o);
    free(js);
    FILE *mf = fopen("/dev/null", "w");
    tsr_batch_report_text(&b->report, mf);
    fclose(mf);
    tsr_batch_destroy(b);
}

static void test_missing_root(void **state)
{
    (void)state;
    tsr_batch_options o = {1, 0, 1, NULL};
    tsr_batch *b = NULL;
    tsr_error err = TSR_ERROR_INIT;
    char p[600];
    snprintf(p, sizeof p, "%s/does-not-exist", root);
    assert_int_equal(tsr_batch_load(p, &o, &b, &err), TSR_EIO);
    assert_null(b);
    assert_non_null(strstr(err.msg, "does-not-exist"));
}

/* ---- each error names its file once ----------------------------------------------- */

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0, l = strlen(needle);
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += l)
        n++;
    return n;
}

/* A file every open() accepts and every read() fails on (EIO at offset 0), also as root,
 * where chmod 000 does not make a file unreadable. */
static void put_unreadable(const char *name)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, name);
    PUT(name, "");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(symlink("/proc/self/mem", p), 0);
}

static const char *const NAMES[] = {"a.csv", "b.json", "c.avro", "delete/d"};

/* The batch error of `name` starts with "name: " and names it only there; its
 * file_error does not name it at all; the text report names it once per line; the
 * full path of the batch root appears only where the report names the root. */
static void check_named_once(const tsr_batch *b, const char *name, int file_level)
{
    char head[64];
    snprintf(head, sizeof head, "%s: ", name);
    int found = 0;
    for (size_t i = 0; i < b->report.nerrors; i++) {
        const char *e = b->report.errors[i];
        if (strncmp(e, head, strlen(head)) != 0)
            continue;
        found = 1;
        if (count(e, name) != 1 || strstr(e, root) != NULL)
            fail_msg("batch error names %s more than once: %s", name, e);
    }
    assert_int_equal(found, file_level);
    for (size_t i = 0; i < b->report.nfiles; i++) {
        const tsr_batch_file_report *f = &b->report.files[i];
        if (strcmp(f->name, name) != 0)
            continue;
        assert_int_equal(f->file_error != NULL, file_level);
        if (f->file_error != NULL && (strstr(f->file_error, name) || strstr(f->file_error, root)))
            fail_msg("file_error of %s repeats the file: %s", name, f->file_error);
        for (size_t k = 0; k < f->nerrors; k++)
            if (strstr(f->errors[k].msg, name) || strstr(f->errors[k].msg, root))
                fail_msg("record error of %s repeats the file: %s", name, f->errors[k].msg);
    }
    char *text = NULL;
    size_t tlen = 0;
    FILE *mf = open_memstream(&text, &tlen);
    assert_non_null(mf);
    tsr_batch_report_text(&b->report, mf);
    fclose(mf);
    int lineno = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"), lineno++) {
        if (count(line, name) > 1)
            fail_msg("report line names %s more than once: %s", name, line);
        if (lineno > 0 && strstr(line, root) != NULL)
            fail_msg("report line has the full path: %s", line);
    }
    free(text);
    char *js = tsr_batch_report_json(&b->report);
    assert_non_null(js);
    assert_int_equal(count(js, root), 1); /* "batch_root" */
    free(js);
}

static void test_unreadable_files_named_once(void **state)
{
    (void)state;
    for (size_t i = 0; i < 4; i++)
        put_unreadable(NAMES[i]);
    int rc;
    tsr_batch *b = load(2, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_int_equal(b->report.errors_total, 4);
    for (size_t i = 0; i < 4; i++)
        check_named_once(b, NAMES[i], 1);
    assert_true(has_error(b, "a.csv: read failed: "));
    assert_true(has_error(b, "c.avro: read error at offset 0: "));
    tsr_batch_destroy(b);
    if (geteuid() != 0) { /* chmod 000 only keeps non-root out: open() fails */
        char p[1024];
        for (size_t i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "%s/%s", root, NAMES[i]);
            unlink(p);
            PUT(NAMES[i], "x\n");
            assert_int_equal(chmod(p, 0), 0);
        }
        b = load(2, 0, &rc);
        assert_int_equal(rc, TSR_EREJECTED);
        for (size_t i = 0; i < 4; i++)
            check_named_once(b, NAMES[i], 1);
        assert_true(has_error(b, "b.json: cannot open: "));
        tsr_batch_destroy(b);
    }
}

static void test_malformed_first_line_named_once(void **state)
{
    (void)state;
    PUT("a.csv", "x,notanumber,1\n");
    PUT("b.json", "{\"id\": \n");
    PUT("c.avro", "Obj\x01\x02garbage");
    PUT("delete/d", "\xff\xfe\n");
    int rc;
    tsr_batch *b = load(2, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    check_named_once(b, "a.csv", 0);
    check_named_once(b, "b.json", 0);
    check_named_once(b, "c.avro", 1); /* a bad header is a file-level error */
    check_named_once(b, "delete/d", 0);
    assert_int_equal(b->report.invalid, 3);
    for (size_t i = 0; i < b->report.nfiles; i++)
        if (b->report.files[i].kind != TSR_BATCH_AVRO) {
            assert_int_equal(b->report.files[i].nerrors, 1);
            assert_int_equal(b->report.files[i].errors[0].where, 1); /* line 1 */
        }
    tsr_batch_destroy(b);
}

static int ignore_rec(void *c, uint64_t w, tsr_datapoint *dp)
{
    (void)c, (void)w, (void)dp;
    return 0;
}
static int ignore_bad(void *c, uint64_t w, enum tsr_rec_error t, const char *m)
{
    (void)c, (void)w, (void)t, (void)m;
    return 0;
}
static int ignore_del(void *c, uint64_t w, const char *id, size_t l)
{
    (void)c, (void)w, (void)id, (void)l;
    return 0;
}

/* The readers on their own name the path they were given, once. */
static void test_readers_name_path_once(void **state)
{
    (void)state;
    tsr_record_sink sink = {NULL, ignore_rec, ignore_bad, ignore_del};
    int (*const readers[4])(const char *, size_t, const tsr_record_sink *, tsr_error *) = {
        tsr_batch_csv_read, tsr_batch_json_read, tsr_batch_avro_read, tsr_batch_delete_read};
    char missing[700];
    snprintf(missing, sizeof missing, "%s/missing", root);
    const char *paths[2] = {missing, "/proc/self/mem"};
    for (size_t k = 0; k < 2; k++)
        for (size_t i = 0; i < 4; i++) {
            tsr_error err = TSR_ERROR_INIT;
            assert_int_not_equal(readers[i](paths[k], 2, &sink, &err), 0);
            if (count(err.msg, paths[k]) != 1)
                fail_msg("reader %zu on %s: %s", i, paths[k], err.msg);
        }
}

/* The walker's own confinement (tsr_batch_options.confine): a symlink swapped in after the
 * server's check is still not read, in the root or in delete/; a link inside stays fine. */
static void test_confine_walker(void **state)
{
    (void)state;
    char in[600], outdir[600], p[1200], q[1200];
    snprintf(in, sizeof in, "%s/in", root);
    snprintf(outdir, sizeof outdir, "%s/out", root);
    PUT("in/a.csv", "a,1\n");
    PUT("in/delete/d", "x\n");
    PUT("out/secret.csv", "s,2\n");
    PUT("out/ids", "a\n");
    snprintf(p, sizeof p, "%s/secret.csv", outdir);
    snprintf(q, sizeof q, "%s/evil.csv", in);
    assert_int_equal(symlink(p, q), 0);
    snprintf(p, sizeof p, "%s/ids", outdir);
    snprintf(q, sizeof q, "%s/delete/evil", in);
    assert_int_equal(symlink(p, q), 0);
    snprintf(p, sizeof p, "%s/a.csv", in);
    snprintf(q, sizeof q, "%s/same.csv", in);
    assert_int_equal(symlink(p, q), 0);
    char *rin = realpath(in, NULL);
    assert_non_null(rin);
    tsr_batch_options o = {1, 0, 1, rin};
    tsr_batch *b = NULL;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_batch_load(rin, &o, &b, &err);
    assert_non_null(b);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "'evil.csv' resolves outside the allowed folder"));
    assert_true(has_error(b, "delete/evil resolves outside the allowed folder"));
    assert_false(has_error(b, "same.csv"));
    for (size_t i = 0; i < b->report.nerrors; i++)
        assert_null(strstr(b->report.errors[i], "secret"));
    tsr_batch_destroy(b);
    /* the server-side check refuses the same root, naming the entry only */
    char *res = NULL;
    const char *within = NULL;
    const char *allowed[] = {rin};
    rc = tsr_batch_confine(rin, allowed, 1, &res, &within, &err);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_null(strstr(err.msg, "secret"));
    assert_null(res);
    free(rin);
}

/* Nothing to apply: an empty root (no file at all: no job array either), then only an
 * empty file, are rejected; one delete id is enough. Counts: records = valid + invalid. */
static void test_nothing_to_apply(void **state)
{
    (void)state;
    int rc;
    tsr_batch *b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "nothing to apply: batch_root holds no data file"));
    assert_string_equal(b->report.reason, b->report.errors[0]); /* one error: it is the reason */
    tsr_batch_destroy(b);
    PUT("a.csv", "");
    b = load(1, 0, &rc);
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "no valid record and no id to delete in 1 file"));
    tsr_batch_destroy(b);
    PUT("a.csv", "x,1,2\n");
    b = load(1, 1, &rc); /* the invalid record is tolerated, and then nothing is left */
    assert_int_equal(rc, TSR_EREJECTED);
    assert_true(has_error(b, "nothing to apply"));
    assert_int_equal(b->report.records, 1);
    assert_int_equal(b->report.invalid, 1);
    tsr_batch_destroy(b);
    PUT("delete/d", "gone\n");
    b = load(1, 1, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(b->report.records, 2);
    assert_int_equal(b->report.records, b->report.valid + b->report.invalid);
    assert_int_equal(b->report.deletes, 1);
    tsr_batch_destroy(b);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_merge_sorted_and_deletes),     T(test_duplicate_last_wins_with_warning),
        T(test_data_and_delete_conflict),     T(test_bad_suffix_and_subfolder),
        T(test_gzip_rejected_whatever_the_name), T(test_object_limit),
        T(test_max_invalid_records),          T(test_report_caps_and_json),
        T(test_missing_root),                 T(test_unreadable_files_named_once),
        T(test_malformed_first_line_named_once), T(test_readers_name_path_once),
        T(test_confine_walker),
        T(test_nothing_to_apply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
