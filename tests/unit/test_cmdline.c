/*
 * test_cmdline — the option table parser (values, --name=value, ranges, sizes, required,
 * unknown, missing value, --help), size suffixes, the stop semaphore (a signal raised
 * before the wait is not lost) and the TLS flag pairing rules (the file contents are
 * tested by tests/integration/test_tls.py with real openssl-made certificates).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/cmdline.h"

static int usage_calls;
static void usage(FILE *f)
{
    (void)f;
    usage_calls++;
}

static const char *s_listen, *s_data;
static int s_threads, s_flag;
static size_t s_max;

static int parse(int argc, char **argv, int *code)
{
    const tsr_cmdline_opt opts[] = {
        {"--listen", TSR_CMDLINE_STR, &s_listen, 0, 0, 1},
        {"--data", TSR_CMDLINE_STR, &s_data, 0, 0, 0},
        {"--threads", TSR_CMDLINE_INT, &s_threads, 1, 64, 0},
        {"--max-message", TSR_CMDLINE_SIZE, &s_max, 4096, INT32_MAX, 0},
        {"--verbose", TSR_CMDLINE_FLAG, &s_flag, 0, 0, 0},
    };
    s_listen = s_data = NULL;
    s_threads = s_flag = 0;
    s_max = 0;
    usage_calls = 0;
    *code = -1;
    return tsr_cmdline_parse("prog", argc, argv, opts, sizeof opts / sizeof opts[0], usage,
                             code);
}

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"prog", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(code, ...) parse(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), code)

static void test_parse_ok(void **state)
{
    (void)state;
    int code;
    assert_int_equal(PARSE(&code, "--listen", "a:1", "--threads=7", "--max-message", "64K",
                           "--verbose", "--data", "d"),
                     0);
    assert_string_equal(s_listen, "a:1");
    assert_string_equal(s_data, "d");
    assert_int_equal(s_threads, 7);
    assert_int_equal(s_max, 65536);
    assert_int_equal(s_flag, 1);
    assert_int_equal(usage_calls, 0);
    /* the last of a repeated option wins */
    assert_int_equal(PARSE(&code, "--listen", "a", "--listen", "b"), 0);
    assert_string_equal(s_listen, "b");
}

static void test_parse_errors(void **state)
{
    (void)state;
    int code;
    /* --help: exit 0, usage once */
    assert_int_equal(PARSE(&code, "--listen", "a", "--help"), 1);
    assert_int_equal(code, 0);
    assert_int_equal(usage_calls, 1);
    assert_int_equal(PARSE(&code, "-h"), 1);
    assert_int_equal(code, 0);
    /* usage errors: exit 2 */
    assert_int_equal(PARSE(&code, "--listen"), 1); /* needs a value */
    assert_int_equal(code, 2);
    assert_int_equal(usage_calls, 1);
    assert_int_equal(PARSE(&code, "--data", "d"), 1); /* --listen is required */
    assert_int_equal(code, 2);
    assert_int_equal(PARSE(&code, "--listen", "a", "--bogus", "1"), 1);
    assert_int_equal(code, 2);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threads", "0"), 1);
    assert_int_equal(code, 2);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threads", "65"), 1);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threads", "7x"), 1);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threads", ""), 1);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threads", "99999999999999999999"), 1);
    assert_int_equal(PARSE(&code, "--listen", "a", "--max-message", "1K"), 1); /* < 4096 */
    assert_int_equal(PARSE(&code, "--listen", "a", "--max-message", "4G"), 1); /* > INT32_MAX */
    assert_int_equal(PARSE(&code, "--listen", ""), 1);                         /* empty */
    assert_int_equal(PARSE(&code, "--listen", "a", "--verbose=1"), 1);
    assert_int_equal(code, 2);
    /* a prefix of an option name is not that option */
    assert_int_equal(PARSE(&code, "--listen", "a", "--thread", "3"), 1);
    assert_int_equal(PARSE(&code, "--listen", "a", "--threadsx=3"), 1);
}

static void test_sizes(void **state)
{
    (void)state;
    size_t v;
    assert_int_equal(tsr_cmdline_parse_size("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(tsr_cmdline_parse_size("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(tsr_cmdline_parse_size("4k", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(tsr_cmdline_parse_size("3M", &v), 0);
    assert_int_equal(v, 3u << 20);
    assert_int_equal(tsr_cmdline_parse_size("2MiB", &v), 0);
    assert_int_equal(v, 2u << 20);
    assert_int_equal(tsr_cmdline_parse_size("1GB", &v), 0);
    assert_int_equal(v, 1u << 30);
    const char *bad[] = {"", "-1", "+5", "1T", "1.5M", "M", "12 ", " 12", "1Mi", "1KiBx",
                         "99999999999999999999", "18446744073709551615G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tsr_cmdline_parse_size(bad[i], &v), -1);
}

static void test_stop_signal(void **state)
{
    (void)state;
    tsr_cmdline_stop_init();
    tsr_cmdline_stop_init(); /* idempotent */
    raise(SIGTERM);          /* before the wait: remembered, the process lives on */
    assert_int_equal(tsr_cmdline_stop_wait(), SIGTERM);
    assert_string_equal(tsr_cmdline_signame(SIGTERM), "SIGTERM");
    assert_string_equal(tsr_cmdline_signame(SIGINT), "SIGINT");
}

static void test_tls_pairing(void **state)
{
    (void)state;
    tsr_error err = TSR_ERROR_INIT;
    tsr_cmdline_tls none = {0};
    assert_int_equal(tsr_cmdline_check_tls(&none, 0, &err), 0);
    assert_int_equal(tsr_cmdline_check_tls(&none, 1, &err), 0);
    tsr_cmdline_tls cert_only = {"c.pem", "--tls-cert", NULL, "--tls-key", NULL, "--tls-ca"};
    assert_int_equal(tsr_cmdline_check_tls(&cert_only, 0, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "--tls-cert and --tls-key"));
    tsr_cmdline_tls ca_only = {NULL, "--tls-cert", NULL, "--tls-key", "ca.pem",
                               "--tls-client-ca"};
    assert_int_equal(tsr_cmdline_check_tls(&ca_only, 0, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "--tls-client-ca needs"));
    tsr_cmdline_tls pair_no_ca = {"c.pem", "--c", "k.pem", "--k", NULL, "--ca"};
    assert_int_equal(tsr_cmdline_check_tls(&pair_no_ca, 1, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "--c needs --ca"));
    tsr_cmdline_tls missing = {NULL, NULL, NULL, NULL, "/nonexistent/ca.pem", "--tls-ca"};
    assert_int_equal(tsr_cmdline_check_tls(&missing, 1, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "--tls-ca /nonexistent/ca.pem"));
    /* a directory is not a PEM file; err may be NULL */
    tsr_cmdline_tls dir = {NULL, NULL, NULL, NULL, ".", "--tls-ca"};
    assert_int_not_equal(tsr_cmdline_check_tls(&dir, 1, NULL), 0);
}

/* A FIFO given as a PEM file is refused at once (it used to block in fopen for ever,
 * waiting for a writer); alarm() turns a regression into a failure, not a hung run. */
static void test_tls_fifo(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/tsr-cmdline-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ca.pem", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    tsr_error err = TSR_ERROR_INIT;
    tsr_cmdline_tls fifo = {NULL, NULL, NULL, NULL, path, "--tls-ca"};
    alarm(10);
    int rc = tsr_cmdline_check_tls(&fifo, 1, &err);
    alarm(0);
    unlink(path);
    rmdir(dir);
    assert_int_equal(rc, TSR_EIO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    tsr_cmdline_tls dir_ca = {NULL, NULL, NULL, NULL, ".", "--tls-ca"};
    assert_int_equal(tsr_cmdline_check_tls(&dir_ca, 1, &err), TSR_EIO);
    assert_non_null(strstr(err.msg, "a directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),     cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_sizes),        cmocka_unit_test(test_stop_signal),
        cmocka_unit_test(test_tls_pairing),  cmocka_unit_test(test_tls_fifo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
