/*
 * test_server_flags — the flags both servers take: parsed together with a program's own
 * options (either table may name any argument), the default of --workers kept unless
 * given, the common ranges and required flags, the rpc server options built from them,
 * and an own-options table too large for the combined table refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "net/server_flags.h"

static void usage(FILE *f)
{
    (void)f;
}

static void test_with_own_options(void **state)
{
    (void)state;
    tsr_server_flags sf;
    tsr_server_flags_init(&sf, 8);
    const char *config = NULL;
    int ttl = 5;
    const tsr_cmdline_opt own[] = {
        {"--config", TSR_CMDLINE_STR, &config, 0, 0, 1},
        {"--ttl", TSR_CMDLINE_INT, &ttl, 2, 600, 0},
    };
    char *argv[] = {"p", "--config", "c.json", "--listen", "127.0.0.1:0", "--data=d",
                    "--ttl", "9", "--threads", "3", "--max-message", "8K", "--tls-cert", "x",
                    "--insecure-no-auth", NULL};
    int code = -1;
    assert_int_equal(tsr_server_flags_parse(&sf, "p", 15, argv, own, 2, usage, &code), 0);
    assert_string_equal(config, "c.json");
    assert_int_equal(ttl, 9);
    assert_string_equal(sf.listen, "127.0.0.1:0");
    assert_string_equal(sf.data, "d");
    assert_int_equal(sf.threads, 3);
    assert_int_equal(sf.workers, 8); /* the server's default */
    assert_int_equal(sf.max_message, 8192);
    assert_int_equal(sf.insecure, 1);
    assert_null(sf.metrics_listen);
    tsr_rpc_server_opts o;
    tsr_server_flags_server_opts(&sf, &o);
    assert_string_equal(o.listen, "127.0.0.1:0");
    assert_int_equal(o.cqs, 3);
    assert_int_equal(o.workers, 8);
    assert_int_equal(o.max_message, 8192);
    assert_string_equal(o.tls_cert_file, "x");
    assert_null(o.tls_key_file);
}

static void test_errors(void **state)
{
    (void)state;
    tsr_server_flags sf;
    int code = -1;
    tsr_server_flags_init(&sf, 2);
    char *missing[] = {"p", "--listen", "a:1", NULL}; /* --data is required */
    assert_int_equal(tsr_server_flags_parse(&sf, "p", 3, missing, NULL, 0, usage, &code), 1);
    assert_int_equal(code, 2);
    tsr_server_flags_init(&sf, 2);
    char *range[] = {"p", "--listen", "a:1", "--data", "d", "--workers", "65", NULL};
    assert_int_equal(tsr_server_flags_parse(&sf, "p", 7, range, NULL, 0, usage, &code), 1);
    assert_int_equal(code, 2);
    /* an own option of the other server is unknown here */
    char *other[] = {"p", "--listen", "a:1", "--data", "d", "--config", "c", NULL};
    assert_int_equal(tsr_server_flags_parse(&sf, "p", 7, other, NULL, 0, usage, &code), 1);
    assert_int_equal(code, 2);
    /* the TLS pairing rules of a server: a key without a certificate */
    tsr_server_flags_init(&sf, 2);
    sf.tls_key = "k.pem";
    tsr_error err = TSR_ERROR_INIT;
    assert_int_not_equal(tsr_server_flags_check_tls(&sf, &err), 0);
    assert_non_null(strstr(err.msg, "--tls-key"));
    /* a table of own options larger than the combined table */
    static tsr_cmdline_opt many[65];
    char *ok[] = {"p", "--listen", "a:1", "--data", "d", NULL};
    assert_int_equal(tsr_server_flags_parse(&sf, "p", 5, ok, many, 65, usage, &code), 1);
    assert_int_equal(code, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_with_own_options),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
