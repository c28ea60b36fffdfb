/*
 * test_idmap — id map files: round trip of ids with backslashes, newlines and carriage
 * returns; rejection of bad escapes and of a missing final newline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index/idmap.h"

static char dir[200];

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

static void test_round_trip(void **state)
{
    (void)state;
    char *ids[] = {"a", "", "b\\c", "line\nbreak", "cr\r", "\\n literal", "ünï"};
    size_t n = sizeof ids / sizeof ids[0];
    char p[300];
    path_in(p, sizeof p, "x.ids");
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_idmap_write(p, ids, n, &err), 0);
    char **got;
    size_t m;
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), 0);
    assert_int_equal(m, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(got[i], ids[i]);
    tsr_idmap_free(got, m);
    assert_int_equal(tsr_idmap_write(p, ids, 0, &err), 0);
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), 0);
    assert_int_equal(m, 0);
    tsr_idmap_free(got, m);
    unlink(p);
}

static void write_raw(const char *p, const char *s)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_bad_files(void **state)
{
    (void)state;
    char p[300];
    path_in(p, sizeof p, "bad.ids");
    char **got;
    size_t m;
    tsr_error err = TSR_ERROR_INIT;
    write_raw(p, "ok\nbad\\x\n");
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "line 2"));
    write_raw(p, "ok\ntrailing\\\n");
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), TSR_EFORMAT);
    write_raw(p, "no newline");
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), TSR_EFORMAT);
    unlink(p);
    path_in(p, sizeof p, "missing.ids");
    assert_int_equal(tsr_idmap_read(p, &got, &m, &err), TSR_EIO);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tsr_idmap_XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    if (mkdtemp(dir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_round_trip),
                                       cmocka_unit_test(test_bad_files)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
