/*
 * test_log — tsr_log_every (core/log.h): one line per key per window, the count of the
 * suppressed calls on the next line, control characters shown as '?', and a flood of new
 * keys bounded by the key table (the lines that found no slot counted on a later line).
 * stderr is redirected to a temporary file that each test reads back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/log.h"

static char path[] = "/tmp/tsr-test-log-XXXXXX";

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* What was written to stderr since the last call (a new string; caller frees). */
static char *drain(void)
{
    fflush(stderr);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    assert_non_null(freopen(path, "w", stderr));
    return s;
}

static size_t lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static int setup(void **state)
{
    (void)state;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_non_null(freopen(path, "w", stderr));
    tsr_log_set_program("test_log");
    unsetenv("TSR_LOG_LEVEL"); /* the default threshold (info), read at the first line */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static void test_one_line_per_window(void **state)
{
    (void)state;
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k1", 300, "event %d", 1), 1);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k1", 300, "event %d", 2), 0);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k1", 300, "event %d", 3), 0);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k2", 300, "other"), 1); /* its own key */
    char *s = drain();
    assert_int_equal(lines(s), 2);
    assert_non_null(strstr(s, "test_log warn: event 1\n"));
    assert_non_null(strstr(s, "test_log warn: other\n"));
    free(s);
    sleep_ms(350);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k1", 300, "event %d", 4), 1);
    s = drain();
    assert_non_null(strstr(s, "event 4 (2 more since the last line)\n"));
    free(s);
    /* below the threshold (info by default): nothing, not even counted */
    assert_int_equal(tsr_log_every(TSR_LOG_DEBUG, "k3", 300, "hidden"), 0);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "k3", 300, "shown"), 1);
    s = drain();
    assert_int_equal(lines(s), 1);
    assert_null(strstr(s, "more since"));
    free(s);
}

static void test_control_characters(void **state)
{
    (void)state;
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "cc", 1000, "method %s", "/a\nb\033[2J"), 1);
    char *s = drain();
    assert_int_equal(lines(s), 1);
    assert_non_null(strstr(s, "method /a?b?[2J\n"));
    free(s);
}

static void test_key_flood_bounded(void **state)
{
    (void)state;
    sleep_ms(1100); /* every earlier key's window has passed: all slots reusable */
    char key[32];
    int printed = 0;
    for (int i = 0; i < TSR_LOG_KEYS + 10; i++) {
        snprintf(key, sizeof key, "flood-%d", i);
        printed += tsr_log_every(TSR_LOG_WARN, key, 300, "%s", key);
    }
    assert_int_equal(printed, TSR_LOG_KEYS);
    char *s = drain();
    assert_int_equal(lines(s), TSR_LOG_KEYS);
    free(s);
    sleep_ms(350);
    assert_int_equal(tsr_log_every(TSR_LOG_WARN, "late", 300, "late"), 1);
    s = drain();
    assert_non_null(strstr(s, "late; 10 lines of other keys suppressed\n"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_line_per_window),
        cmocka_unit_test(test_control_characters),
        cmocka_unit_test(test_key_flood_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
