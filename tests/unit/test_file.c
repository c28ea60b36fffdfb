/*
 * test_file — the one whole-file reader and the durable writers: contents and the NUL after
 * them, an empty file, a file over the caller's limit (refused before allocating), a FIFO
 * (refused at once, not waited on: alarm() turns a hang into a failure), a directory, a
 * missing file (TSR_EIO, or TSR_ENOTFOUND when asked), write_sync, replace and
 * replace_by (a writer's failure leaves the target and no temp file); the
 * buffered writer: pieces of every size through a 7-byte buffer give the same bytes, a
 * path that cannot be created is an error naming it that later adds and close return.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/file.h"

static char dir[512];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tsr-file-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void test_read_and_write_sync(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "a.txt");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_write_sync(p, "hello\n", 6, &err), 0);
    char *buf;
    size_t len;
    assert_int_equal(tsr_file_read(p, 6, 0, &buf, &len, &err), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(buf, "hello\n", 7); /* with the NUL */
    free(buf);
    /* write_sync truncates */
    assert_int_equal(tsr_file_write_sync(p, "hi", 2, &err), 0);
    assert_int_equal(tsr_file_read(p, 100, 0, &buf, &len, &err), 0);
    assert_int_equal(len, 2);
    assert_string_equal(buf, "hi");
    free(buf);
}

static void test_writer(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "w.bin");
    tsr_error err = TSR_ERROR_INIT;
    unsigned char want[1000];
    for (size_t i = 0; i < sizeof want; i++)
        want[i] = (unsigned char)(i * 31 + 7);
    tsr_file_writer w;
    assert_int_equal(tsr_file_writer_open(&w, p, 7, &err), 0);
    size_t at = 0;
    for (size_t k = 0; at < sizeof want; k++) { /* pieces of 0, 1, ..., 22 bytes */
        size_t n = k % 23 < sizeof want - at ? k % 23 : sizeof want - at;
        assert_int_equal(tsr_file_writer_add(&w, want + at, n, &err), 0);
        at += n;
    }
    assert_int_equal(tsr_file_writer_close(&w, &err), 0);
    char *buf;
    size_t len;
    assert_int_equal(tsr_file_read(p, 2000, 0, &buf, &len, &err), 0);
    assert_int_equal(len, sizeof want);
    assert_memory_equal(buf, want, sizeof want);
    free(buf);
    /* an error sticks: open fails (no such directory), add and close return it */
    path_in(p, sizeof p, "no-such-dir/w.bin");
    assert_int_equal(tsr_file_writer_open(&w, p, 64, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(tsr_file_writer_add(&w, want, 100, &err), TSR_EIO);
    assert_int_equal(tsr_file_writer_close(&w, &err), TSR_EIO);
    tsr_file_writer_abort(&w); /* after close: nothing left to do */
    /* abort leaves what was written so far and frees the buffer */
    path_in(p, sizeof p, "a.bin");
    assert_int_equal(tsr_file_writer_open(&w, p, 4, &err), 0);
    assert_int_equal(tsr_file_writer_add(&w, "abcdef", 6, &err), 0);
    tsr_file_writer_abort(&w);
    assert_int_equal(tsr_file_read(p, 100, 0, &buf, &len, &err), 0);
    assert_int_equal(len, 4);
    free(buf);
}

static void test_empty(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "empty");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_write_sync(p, "", 0, &err), 0);
    char *buf = (char *)1;
    size_t len = 99;
    assert_int_equal(tsr_file_read(p, 0, 0, &buf, &len, &err), 0); /* limit 0 allows empty */
    assert_non_null(buf);
    assert_int_equal(len, 0);
    assert_int_equal(buf[0], '\0');
    free(buf);
}

static void test_oversize(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "big");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_write_sync(p, "0123456789", 10, &err), 0);
    /* a sparse file far beyond memory: refused from its size, nothing allocated */
    assert_int_equal(truncate(p, (off_t)1 << 40), 0);
    char *buf = (char *)1;
    size_t len;
    assert_int_equal(tsr_file_read(p, 9, 0, &buf, &len, &err), TSR_ELIMIT);
    assert_null(buf);
    assert_non_null(strstr(err.msg, p));
    assert_non_null(strstr(err.msg, "more than the limit of 9"));
    assert_int_equal(truncate(p, 10), 0);
    assert_int_equal(tsr_file_read(p, 9, 0, &buf, &len, &err), TSR_ELIMIT);
    assert_int_equal(tsr_file_read(p, 10, 0, &buf, &len, &err), 0);
    assert_int_equal(len, 10);
    free(buf);
}

static void test_fifo_and_dir(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "fifo");
    assert_int_equal(mkfifo(p, 0600), 0);
    tsr_error err = TSR_ERROR_INIT;
    char *buf;
    size_t len;
    alarm(10);
    int rc = tsr_file_read(p, 1 << 20, 0, &buf, &len, &err);
    alarm(0);
    assert_int_equal(rc, TSR_EIO);
    assert_non_null(strstr(err.msg, p));
    assert_non_null(strstr(err.msg, "not a regular file (a FIFO"));
    unlink(p);
    assert_int_equal(tsr_file_read(dir, 1 << 20, 0, &buf, &len, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "not a regular file (a directory)"));
}

static void test_missing(void **state)
{
    (void)state;
    char p[600];
    path_in(p, sizeof p, "missing");
    tsr_error err = TSR_ERROR_INIT;
    char *buf;
    size_t len;
    assert_int_equal(tsr_file_read(p, 100, 0, &buf, &len, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "cannot open: No such file"));
    assert_int_equal(tsr_file_read(p, 100, TSR_FILE_NOTFOUND, &buf, &len, &err), TSR_ENOTFOUND);
    assert_int_equal(tsr_file_read(p, 100, 0, &buf, &len, NULL), TSR_EIO); /* err optional */
}

/* The file at p holds exactly the string want. */
static void expect_contents(const char *p, const char *want)
{
    char *buf;
    size_t len;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_read(p, 100, 0, &buf, &len, &err), 0);
    assert_int_equal(len, strlen(want));
    assert_string_equal(buf, want);
    free(buf);
}

static void test_replace(void **state)
{
    (void)state;
    char p[600], tmp[600];
    path_in(p, sizeof p, "r");
    path_in(tmp, sizeof tmp, "r.tmp");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_replace(p, tmp, dir, "one", 3, &err), 0);
    assert_int_equal(tsr_file_replace(p, tmp, dir, "two!", 4, &err), 0);
    expect_contents(p, "two!");
    assert_int_equal(access(tmp, F_OK), -1); /* renamed away */
    /* a temp path that cannot be created: the target stays as it was */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no-such-dir/r.tmp", dir);
    assert_int_equal(tsr_file_replace(p, bad, dir, "three", 5, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, bad));
    expect_contents(p, "two!");
}

/* What replace_by's writer callback adds: ctx = the text; "FAIL" = an error after
 * adding part of it. */
static int add_text(void *ctx, tsr_file_writer *w, tsr_error *err)
{
    const char *s = ctx;
    if (tsr_file_writer_add(w, s, strlen(s), err) != 0)
        return w->rc;
    if (strcmp(s, "FAIL") == 0)
        return tsr_err(err, TSR_EFORMAT, "made to fail");
    return 0;
}

static void test_replace_by(void **state)
{
    (void)state;
    char p[600], tmp[600];
    path_in(p, sizeof p, "rb");
    path_in(tmp, sizeof tmp, "rb.tmp");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_file_replace_by(p, 3, add_text, "first", &err), 0);
    assert_int_equal(tsr_file_replace_by(p, 3, add_text, "second", &err), 0);
    expect_contents(p, "second");
    assert_int_equal(access(tmp, F_OK), -1); /* renamed away */
    /* the writer fails: the target stays as it was and the temp file is gone */
    assert_int_equal(tsr_file_replace_by(p, 3, add_text, "FAIL", &err), TSR_EFORMAT);
    assert_string_equal(err.msg, "made to fail");
    assert_int_equal(access(tmp, F_OK), -1);
    expect_contents(p, "second");
    /* a path in no directory: an error naming the temp file */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no-such-dir/rb", dir);
    assert_int_equal(tsr_file_replace_by(bad, 3, add_text, "x", &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "no-such-dir/rb.tmp"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_and_write_sync),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test(test_fifo_and_dir),
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_replace),
        cmocka_unit_test(test_replace_by),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
