/*
 * test_cmdline — the option table parser (values, --name=value, ranges, sizes, required,
 * unknown, missing value, --help), the typed kinds of the tessera commands (int64, uint64,
 * double, repeated, possibly-empty strings), positional arguments, the one-line messages
 * that name the flag (captured from stderr), size suffixes, the stop semaphore (a signal raised
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

/* ---- typed kinds, positional arguments and messages (the tessera commands' parser) */

static int64_t t_i64;
static uint64_t t_u64, t_big;
static double t_dbl;
static const char *t_any;
static tsr_cmdline_list t_list;
static int t_k;

static const tsr_cmdline_opt typed_opts[] = {
    {"--k", TSR_CMDLINE_INT, &t_k, 1, 10000, 0},
    {"--timeout", TSR_CMDLINE_INT64, &t_i64, -5, 5000000000ll, 0},
    {"--count", TSR_CMDLINE_UINT64, &t_u64, 2, 1 << 20, 0},
    {"--seed", TSR_CMDLINE_UINT64, &t_big, 0, -1, 0}, /* max -1: UINT64_MAX */
    {"--fraction", TSR_CMDLINE_DOUBLE, &t_dbl, 0, 1, 0},
    {"--service", TSR_CMDLINE_STR_ANY, &t_any, 0, 0, 0},
    {"--restrict", TSR_CMDLINE_LIST, &t_list, 0, 0, 0},
};

static char captured[4096];

/* Parses with the typed table (brief, max_args positional arguments) and keeps what the
 * parser wrote on stderr in `captured`. */
static int parse_typed(int argc, char **argv, int max_args, int *nargs, int *code)
{
    tsr_cmdline_spec spec = {"tessera x", typed_opts, sizeof typed_opts / sizeof typed_opts[0],
                             usage, max_args, 1};
    t_i64 = 0, t_u64 = 0, t_big = 0, t_dbl = -1, t_any = NULL, t_k = 0;
    tsr_cmdline_list_free(&t_list);
    usage_calls = 0;
    *code = -1;
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(tmp), STDERR_FILENO);
    int rc = tsr_cmdline_parse_spec(&spec, argc, argv, nargs, code);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(captured, 1, sizeof captured - 1, tmp);
    captured[n] = 0;
    fclose(tmp);
    return rc;
}

#define TYPED(code, ...) parse_typed(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), 0, NULL, code)

static void test_typed_ok(void **state)
{
    (void)state;
    int code;
    assert_int_equal(TYPED(&code, "--timeout", "4000000000", "--count=2", "--seed",
                           "18446744073709551615", "--fraction", "0.25", "--service", "",
                           "--restrict", "a=1", "--restrict=b=2", "--k", "10000"),
                     0);
    assert_true(t_i64 == 4000000000ll);
    assert_true(t_u64 == 2);
    assert_true(t_big == UINT64_MAX);
    assert_true(t_dbl == 0.25);
    assert_string_equal(t_any, "");
    assert_int_equal(t_k, 10000);
    assert_int_equal(t_list.n, 2); /* every value of a repeated option, in order */
    assert_string_equal(t_list.v[0], "a=1");
    assert_string_equal(t_list.v[1], "b=2");
    assert_string_equal(captured, "");
    assert_int_equal(TYPED(&code, "--timeout", "-5", "--fraction", "1", "--fraction", "0"), 0);
    assert_true(t_i64 == -5);
    assert_true(t_dbl == 0.0); /* the last of a repeated single-valued option */
    tsr_cmdline_list_free(&t_list);
    assert_null(t_list.v);
}

static void test_typed_errors(void **state)
{
    (void)state;
    int code;
    /* the message names the flag, what was expected and what was given; no usage */
    assert_int_equal(TYPED(&code, "--k", "abc"), 1);
    assert_int_equal(code, 2);
    assert_string_equal(captured,
                        "tessera x: --k: expected an integer from 1 to 10000, got 'abc'\n");
    assert_int_equal(usage_calls, 0);
    assert_int_equal(TYPED(&code, "--k", "0"), 1);
    assert_string_equal(captured, "tessera x: --k: expected an integer from 1 to 10000, got '0'\n");
    assert_int_equal(TYPED(&code, "--fraction", "1.5"), 1);
    assert_string_equal(captured,
                        "tessera x: --fraction: expected a number from 0 to 1, got '1.5'\n");
    assert_int_equal(TYPED(&code, "--seed", "-1"), 1);
    assert_string_equal(captured, "tessera x: --seed: expected an integer from 0 to "
                                  "18446744073709551615, got '-1'\n");
    const char *bad[][2] = {
        {"--timeout", "-6"},          {"--timeout", "5000000001"}, {"--timeout", "1e3"},
        {"--count", "1"},             {"--count", "+3"},           {"--count", "1048577"},
        {"--seed", "18446744073709551616"},                        {"--seed", ""},
        {"--fraction", "nan"},        {"--fraction", "inf"},       {"--fraction", "-0.1"},
        {"--fraction", "0.5x"},       {"--fraction", ""},          {"--restrict", ""},
        {"--k", "10001"},             {"--k", " 5"},             {"--k", "+5"},
        {"--fraction", " 0.5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"prog", (char *)bad[i][0], (char *)bad[i][1], NULL};
        assert_int_equal(parse_typed(3, argv, 0, NULL, &code), 1);
        assert_int_equal(code, 2);
        assert_non_null(strstr(captured, bad[i][0]));
        assert_int_equal(usage_calls, 0);
    }
    /* brief: unknown, value-less and missing options point at --help, no usage */
    assert_int_equal(TYPED(&code, "--kk", "3"), 1);
    assert_int_equal(code, 2);
    assert_string_equal(captured, "tessera x: unknown option --kk (see 'tessera x --help')\n");
    assert_int_equal(TYPED(&code, "--k"), 1);
    assert_string_equal(captured, "tessera x: --k needs a value (see 'tessera x --help')\n");
    assert_int_equal(usage_calls, 0);
    /* --help still prints the usage */
    assert_int_equal(TYPED(&code, "--k", "3", "-h"), 1);
    assert_int_equal(code, 0);
    assert_int_equal(usage_calls, 1);
    tsr_cmdline_list_free(&t_list);
}

static void test_positional(void **state)
{
    (void)state;
    int code, n = -1;
    char *argv[] = {"prog", "a", "--k", "3", "-", "b", "--", "--k", "-x", NULL};
    assert_int_equal(parse_typed(9, argv, -1, &n, &code), 0);
    assert_int_equal(t_k, 3);
    assert_int_equal(n, 5); /* moved to argv[1..5] in order; after "--" nothing is an option */
    assert_string_equal(argv[1], "a");
    assert_string_equal(argv[2], "-");
    assert_string_equal(argv[3], "b");
    assert_string_equal(argv[4], "--k");
    assert_string_equal(argv[5], "-x");
    char *two[] = {"prog", "in", "out", "more", NULL};
    assert_int_equal(parse_typed(4, two, 2, &n, &code), 1);
    assert_int_equal(code, 2);
    assert_string_equal(captured,
                        "tessera x: unexpected argument 'more' (see 'tessera x --help')\n");
    assert_int_equal(TYPED(&code, "--k", "3", "stray"), 1); /* max_args 0 */
    assert_int_equal(code, 2);
    /* tsr_cmdline_parse takes no positional argument */
    assert_int_equal(PARSE(&code, "--listen", "a", "stray"), 1);
    assert_int_equal(code, 2);
    tsr_cmdline_list_free(&t_list);
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
        cmocka_unit_test(test_typed_ok),     cmocka_unit_test(test_typed_errors),
        cmocka_unit_test(test_positional),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
