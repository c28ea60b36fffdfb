/*
 * test_coord_reconcile — the decisions of a reconcile pass (coordinator/reconcile.c) with
 * plain inputs: what each version a replica's Stats lists asks for when the coordinator
 * serves V (Commit V prepared but not current; Abort a staged or prepared version above
 * or below V and V itself still staging; V held or served: it can answer V; nothing for
 * other committed versions), which sibling a lagging replica is re-seeded from and how
 * often (at most one attempt per replica every 5 s, none without a sibling that holds V,
 * none for a replica that does not need it), and the pause between passes (0.3 s while
 * something is off, 1 s when all is settled).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord.h"

#define STAGING TESSERA__V1__SHARD_VERSION__STATE__STAGING
#define PREPARED TESSERA__V1__SHARD_VERSION__STATE__PREPARED
#define SERVING TESSERA__V1__SHARD_VERSION__STATE__SERVING

static void test_action(void **state)
{
    (void)state;
    const int64_t V = 7;
    /* V prepared and not current: the coordinator flipped, the Commit did not arrive */
    assert_int_equal(tsr__reconcile_action(V, 7, PREPARED, 0), TSR_REC_COMMIT);
    /* V served: held */
    assert_int_equal(tsr__reconcile_action(V, 7, SERVING, 1), TSR_REC_HOLDS);
    /* V serving beside the current one (during a flip): held */
    assert_int_equal(tsr__reconcile_action(V, 7, SERVING, 0), TSR_REC_HOLDS);
    /* V still staging: left out of V (update_min_replicas): aborted, not held */
    assert_int_equal(tsr__reconcile_action(V, 7, STAGING, 0), TSR_REC_ABORT);
    /* above V, staging or prepared: an update that never reached the commit point */
    assert_int_equal(tsr__reconcile_action(V, 8, STAGING, 0), TSR_REC_ABORT);
    assert_int_equal(tsr__reconcile_action(V, 9, PREPARED, 0), TSR_REC_ABORT);
    /* prepared below V: aborted */
    assert_int_equal(tsr__reconcile_action(V, 6, PREPARED, 0), TSR_REC_ABORT);
    /* older serving versions: nothing (the delayed Release drops them) */
    assert_int_equal(tsr__reconcile_action(V, 6, SERVING, 0), TSR_REC_KEEP);
    assert_int_equal(tsr__reconcile_action(V, 6, SERVING, 1), TSR_REC_KEEP);
    /* a version it serves is never aborted, even pending in its own view */
    assert_int_equal(tsr__reconcile_action(V, 8, PREPARED, 1), TSR_REC_KEEP);
    assert_int_equal(tsr__reconcile_action(V, 7, PREPARED, 1), TSR_REC_HOLDS);
}

static void test_resync_pacing(void **state)
{
    (void)state;
    /* group of three at flat replicas 3, 4, 5: 3 lags, 5 holds V, 4 does not */
    char holds[8] = {1, 1, 1, 0, 0, 1, 1, 1};
    int64_t at = 0, now = 100000;
    assert_int_equal(tsr__reconcile_resync_from(1, &at, now, holds, 3, 3), 5);
    assert_int_equal(at, now + 5000);
    /* the next passes (every 0.3 s while off) do not try again before 5 s */
    for (int64_t t = now; t < now + 5000; t += 300)
        assert_int_equal(tsr__reconcile_resync_from(1, &at, t, holds, 3, 3), SIZE_MAX);
    assert_int_equal(at, now + 5000);
    assert_int_equal(tsr__reconcile_resync_from(1, &at, now + 5000, holds, 3, 3), 5);
    assert_int_equal(at, now + 10000);
    /* the first sibling that holds V */
    holds[4] = 1;
    at = 0;
    assert_int_equal(tsr__reconcile_resync_from(1, &at, now, holds, 3, 3), 4);
    /* no sibling holds V: nothing, and the next pass may still try (no wait set) */
    holds[4] = holds[5] = 0;
    at = 0;
    assert_int_equal(tsr__reconcile_resync_from(1, &at, now, holds, 3, 3), SIZE_MAX);
    assert_int_equal(at, 0);
    /* replicas of other groups (holding V) are never a source */
    assert_int_equal(tsr__reconcile_resync_from(1, &at, now, holds, 3, 2), SIZE_MAX);
    /* a replica that does not need it: nothing, whatever its siblings hold */
    holds[5] = 1;
    assert_int_equal(tsr__reconcile_resync_from(0, &at, now, holds, 3, 3), SIZE_MAX);
    assert_int_equal(at, 0);
}

static void test_pause(void **state)
{
    (void)state;
    assert_int_equal(tsr__reconcile_pause_ms(0), 1000);
    assert_int_equal(tsr__reconcile_pause_ms(1), 300);
    assert_int_equal(tsr__reconcile_pause_ms(5), 300);
    assert_int_equal(tsr__reconcile_pause_ms(-1), 300); /* a pass that re-seeded more */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_action),
        cmocka_unit_test(test_resync_pacing),
        cmocka_unit_test(test_pause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
