/*
 * test_coord_reshard — the reshard plan's balance rule (coordinator/reshard.c,
 * tsr__reshard_balance_plan): on AddShardGroup the new group takes lists only from the
 * others until every load is within 10 % of the mean, and no list moves between the old
 * groups; on RemoveShardGroup the removed group's lists go, largest first, each to the
 * least loaded group (an exact small case), and nothing else moves when that is balanced; a plan already within
 * the band is left as it is, and out of it the list that evens the pair best moves;
 * skewed list sizes end balanced or with no single move that would bring the most and
 * least loaded groups closer; retired groups get nothing; the
 * input plan is not changed and the result is deterministic.
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

#define NL 48

static void loads(const int32_t *plan, const int64_t *size, size_t nlist, size_t S,
                  int64_t *load)
{
    memset(load, 0, S * sizeof *load);
    for (size_t l = 0; l < nlist; l++) {
        assert_true(plan[l] >= 0 && (size_t)plan[l] < S);
        load[plan[l]] += size[l];
    }
}

/* The rule's end: loads of live groups within ±10 % of their mean, or no list of the most
 * loaded group whose move to the least loaded one brings the two closer. */
static void assert_balanced(const int32_t *plan, const int64_t *size, size_t nlist,
                            const uint8_t *live, size_t S)
{
    int64_t load[16], total = 0;
    loads(plan, size, nlist, S, load);
    size_t nl = 0, gmax = S, gmin = S;
    for (size_t g = 0; g < S; g++) {
        if (!live[g]) {
            assert_int_equal(load[g], 0);
            continue;
        }
        total += load[g];
        nl++;
        if (gmax == S || load[g] > load[gmax])
            gmax = g;
        if (gmin == S || load[g] < load[gmin])
            gmin = g;
    }
    double mean = (double)total / (double)nl;
    if ((double)load[gmax] <= mean * 1.1 && (double)load[gmin] >= mean * 0.9)
        return;
    int64_t diff = load[gmax] - load[gmin];
    for (size_t l = 0; l < nlist; l++)
        if (plan[l] == (int32_t)gmax && size[l] > 0 && size[l] < diff)
            assert_true(llabs(diff - 2 * size[l]) >= diff);
}

static void test_add(void **state)
{
    (void)state;
    int32_t old[NL];
    int64_t size[NL];
    for (size_t l = 0; l < NL; l++) {
        old[l] = (int32_t)(l % 3);
        size[l] = 100;
    }
    int32_t keep[NL];
    memcpy(keep, old, sizeof keep);
    uint8_t live[4] = {1, 1, 1, 1}; /* group 3 just added, empty */
    int32_t *p = tsr__reshard_balance_plan(old, size, NL, live, 4, -1);
    assert_memory_equal(old, keep, sizeof keep); /* input untouched */
    size_t moved = 0;
    for (size_t l = 0; l < NL; l++)
        if (p[l] != old[l]) {
            assert_int_equal(p[l], 3); /* only to the new group */
            moved++;
        }
    int64_t load[4];
    loads(p, size, NL, 4, load);
    /* 4800 over 4 groups: 1200 each, within ±120 */
    for (size_t g = 0; g < 4; g++)
        assert_true(load[g] >= 1080 && load[g] <= 1320);
    /* as few as the band allows: group 3 needs at least 11 lists, and 12 is exact */
    assert_true(moved >= 11 && moved <= 12);
    assert_balanced(p, size, NL, live, 4);
    int32_t *again = tsr__reshard_balance_plan(old, size, NL, live, 4, -1);
    assert_memory_equal(p, again, NL * sizeof *p);
    free(again);
    free(p);
}

static void test_remove(void **state)
{
    (void)state;
    int32_t old[NL];
    int64_t size[NL];
    for (size_t l = 0; l < NL; l++) {
        old[l] = (int32_t)(l % 4);
        size[l] = 10 + (int64_t)(l % 4 == 1 ? l : 0); /* group 1's lists of growing size */
    }
    uint8_t live[4] = {1, 0, 1, 1};
    int32_t *p = tsr__reshard_balance_plan(old, size, NL, live, 4, 1);
    int64_t load[4];
    loads(p, size, NL, 4, load);
    assert_int_equal(load[1], 0);
    for (size_t l = 0; l < NL; l++) {
        assert_int_not_equal(p[l], 1);
        if (old[l] != 1)
            assert_int_equal(p[l], old[l]); /* balanced at once: nothing else moves */
    }
    /* largest first, each to the least loaded: group 1's 12 lists (sizes 11, 15, ..., 55;
     * 396 in all) spread over three groups of 120 each: within 55 of each other */
    int64_t mx = 0, mn = INT64_MAX;
    for (size_t g = 0; g < 4; g++)
        if (live[g]) {
            mx = load[g] > mx ? load[g] : mx;
            mn = load[g] < mn ? load[g] : mn;
        }
    assert_int_equal(load[0] + load[2] + load[3], 120 * 3 + 396);
    assert_true(mx - mn <= 55);
    assert_balanced(p, size, NL, live, 4);
    free(p);
}

static void test_remove_order(void **state)
{
    (void)state;
    /* group 2 removed: its lists of 20, 50, 30 go largest first to the least loaded group:
     * 50 -> group 1 (90 -> 140), 30 -> group 0 (100 -> 130), 20 -> group 0 (-> 150) */
    int32_t old[5] = {0, 1, 2, 2, 2};
    int64_t size[5] = {100, 90, 20, 50, 30};
    uint8_t live[3] = {1, 1, 0};
    int32_t *p = tsr__reshard_balance_plan(old, size, 5, live, 3, 2);
    int32_t want[5] = {0, 1, 0, 1, 0};
    assert_memory_equal(p, want, sizeof want);
    free(p);
    /* two groups of 100, group 2's lists of 60 and 40: 60 to group 0 (the first of the
     * least loaded), 40 to group 1 (160 / 140, in the band: no further move). Smallest
     * first, or to the most loaded and balanced afterwards, ends 140 / 160 the other way. */
    int32_t o2[4] = {0, 1, 2, 2};
    int64_t s2[4] = {100, 100, 60, 40};
    p = tsr__reshard_balance_plan(o2, s2, 4, live, 3, 2);
    int32_t w2[4] = {0, 1, 0, 1};
    assert_memory_equal(p, w2, sizeof w2);
    free(p);
}

static void test_band_kept(void **state)
{
    (void)state;
    /* loads 1050, 950, 1000: within ±10 % of the mean: nothing moves */
    int32_t old[6] = {0, 0, 1, 1, 2, 2};
    int64_t size[6] = {550, 500, 475, 475, 500, 500};
    uint8_t live[3] = {1, 1, 1};
    int32_t *p = tsr__reshard_balance_plan(old, size, 6, live, 3, -1);
    assert_memory_equal(p, old, sizeof old);
    free(p);
    /* 1150 / 850 / 1000: out of the band; of the lists below the difference (300) the one
     * of 200 evens the pair best (250 would leave them 200 apart, 200 leaves 100) */
    int32_t o2[6] = {0, 0, 0, 1, 2, 2};
    int64_t s2[6] = {700, 250, 200, 850, 500, 500};
    int32_t *q = tsr__reshard_balance_plan(o2, s2, 6, live, 3, -1);
    int32_t want[6] = {0, 0, 1, 1, 2, 2};
    assert_memory_equal(q, want, sizeof want);
    free(q);
}

static void test_skewed(void **state)
{
    (void)state;
    int32_t old[NL];
    int64_t size[NL];
    uint64_t s = 12345;
    for (size_t l = 0; l < NL; l++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size[l] = (int64_t)((s >> 33) % 1000);
        old[l] = (int32_t)(l % 2);
    }
    size[0] = 20000; /* one list larger than all the others together */
    uint8_t live[5] = {1, 1, 0, 1, 1}; /* group 2 retired earlier: gets nothing */
    for (int add = 3; add <= 4; add++) {
        int32_t *p = tsr__reshard_balance_plan(old, size, NL, live, (size_t)add + 1, -1);
        assert_balanced(p, size, NL, live, (size_t)add + 1);
        free(p);
    }
    /* remove group 0 (holding the big list) */
    uint8_t live2[5] = {0, 1, 0, 1, 1};
    int32_t *p = tsr__reshard_balance_plan(old, size, NL, live2, 5, 0);
    assert_balanced(p, size, NL, live2, 5);
    for (size_t l = 0; l < NL; l++)
        assert_true(p[l] == 1 || p[l] == 3 || p[l] == 4);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_remove_order),
        cmocka_unit_test(test_band_kept),
        cmocka_unit_test(test_skewed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
