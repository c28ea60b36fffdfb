/*
 * test_hash — FNV-1a 64 against the published test vectors (standard basis), the routing
 * basis pinned to values computed before the copies were unified (a change there moves
 * records between shards: core/hash.h), and the incremental form equal to the one-shot.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/hash.h"

static void test_standard_vectors(void **state)
{
    (void)state;
    assert_true(TSR_FNV1A64_BASIS == 14695981039346656037ull);
    assert_true(tsr_fnv1a64(TSR_FNV1A64_BASIS, "", 0) == 0xcbf29ce484222325ull);
    assert_true(tsr_fnv1a64(TSR_FNV1A64_BASIS, "a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(tsr_fnv1a64(TSR_FNV1A64_BASIS, "foobar", 6) == 0x85944171f73967e8ull);
    assert_true(tsr_fnv1a64_str(TSR_FNV1A64_BASIS, "foobar") == 0x85944171f73967e8ull);
}

static void test_route_basis_pinned(void **state)
{
    (void)state;
    assert_true(TSR_FNV1A64_BASIS_ROUTE == 1469598103934665603ull);
    assert_true(tsr_fnv1a64_str(TSR_FNV1A64_BASIS_ROUTE, "") == 0x14650fb0739d0383ull);
    assert_true(tsr_fnv1a64_str(TSR_FNV1A64_BASIS_ROUTE, "a") == 0x44bd8ad473cd9906ull);
    assert_true(tsr_fnv1a64_str(TSR_FNV1A64_BASIS_ROUTE, "shard-key-42") ==
                0x72274c7659d4f8dcull);
}

static void test_incremental(void **state)
{
    (void)state;
    uint64_t h = tsr_fnv1a64_str(TSR_FNV1A64_BASIS, "foo");
    h = tsr_fnv1a64(h, "bar", 3);
    assert_true(h == 0x85944171f73967e8ull);
    /* bytes >= 0x80 are hashed unsigned */
    const char hi[] = "\xff\x80";
    assert_true(tsr_fnv1a64_str(TSR_FNV1A64_BASIS, hi) == tsr_fnv1a64(TSR_FNV1A64_BASIS, hi, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standard_vectors),
        cmocka_unit_test(test_route_basis_pinned),
        cmocka_unit_test(test_incremental),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
