/*
 * test_buf — the growable byte buffer: appends of bytes, strings and formatted text (short
 * and longer than the internal 512-byte scratch), the NUL after the contents, growth over
 * many appends, and the sticky oom flag (a failed reservation stops later appends).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/buf.h"

static void test_append(void **state)
{
    (void)state;
    tsr_buf b = TSR_BUF_INIT;
    tsr_buf_add(&b, "", 0);
    assert_non_null(b.p); /* an empty append still gives a C string */
    assert_int_equal(b.len, 0);
    assert_string_equal(b.p, "");
    tsr_buf_puts(&b, "ab");
    tsr_buf_add(&b, "c\0d", 3); /* binary bytes, NUL included */
    tsr_buf_printf(&b, "-%d-%s", 42, "x");
    assert_int_equal(b.len, 2 + 3 + 5);
    assert_memory_equal(b.p, "abc\0d-42-x", 11);
    assert_int_equal(b.p[b.len], '\0');
    assert_false(b.oom);
    tsr_buf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
}

static void test_long_printf_and_growth(void **state)
{
    (void)state;
    tsr_buf b = TSR_BUF_INIT;
    char big[3000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    tsr_buf_printf(&b, "<%s>", big); /* longer than the formatting scratch */
    assert_int_equal(b.len, sizeof big + 1);
    assert_int_equal(b.p[0], '<');
    assert_int_equal(b.p[b.len - 1], '>');
    assert_int_equal(strlen(b.p), b.len);
    for (int i = 0; i < 100000; i++)
        tsr_buf_add(&b, &i, sizeof i);
    assert_int_equal(b.len, sizeof big + 1 + 100000 * sizeof(int));
    int last;
    memcpy(&last, b.p + b.len - sizeof last, sizeof last);
    assert_int_equal(last, 99999);
    assert_true(b.cap > b.len);
    tsr_buf_free(&b);
}

static void test_oom_sticky(void **state)
{
    (void)state;
    tsr_buf b = TSR_BUF_INIT;
    tsr_buf_puts(&b, "kept");
    assert_int_equal(tsr_buf_reserve(&b, SIZE_MAX - 2), -1); /* cannot exist */
    assert_true(b.oom);
    tsr_buf_puts(&b, "dropped");
    tsr_buf_printf(&b, "%d", 1);
    assert_int_equal(b.len, 4);
    assert_string_equal(b.p, "kept");
    assert_int_equal(tsr_buf_reserve(&b, 1), -1);
    tsr_buf_free(&b);
    assert_false(b.oom);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_long_printf_and_growth),
        cmocka_unit_test(test_oom_sticky),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
