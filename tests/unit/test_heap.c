/*
 * test_heap — the (distance, id) k-heap: the k best of a stream with both tie orders
 * (ascending ids on equal distances, and descending with TSR_HEAP_TIE_SMALL_ID_WORSE),
 * larger-is-better, the aux payload moving with its entry, sentinels left when fewer than
 * k entries arrive, NaN never entering, and the result against a brute-force sort.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/heap.h"

/* Offers (d, id) as the callers do: only when better than the root. */
static void offer(tsr_heap *h, float d, int64_t id, int64_t aux)
{
    if (tsr_heap_worse(h->order, h->d[0], h->id[0], d, id))
        tsr_heap_replace_top(h, d, id, aux);
}

static void test_tie_orders(void **state)
{
    (void)state;
    float d[4];
    int64_t id[4];
    /* distances 1,1,1,1,1,0.5 for ids 5,3,9,1,7,4 */
    const float dv[] = {1, 1, 1, 1, 1, 0.5f};
    const int64_t iv[] = {5, 3, 9, 1, 7, 4};
    tsr_heap h = {4, 0, d, id, NULL};
    tsr_heap_init(&h);
    for (int i = 0; i < 6; i++)
        offer(&h, dv[i], iv[i], 0);
    tsr_heap_sort(&h);
    const int64_t asc[] = {4, 1, 3, 5}; /* ties: the smaller ids kept, ascending */
    for (int i = 0; i < 4; i++)
        assert_int_equal(id[i], asc[i]);
    assert_true(d[0] == 0.5f && d[3] == 1.0f);

    h.order = TSR_HEAP_TIE_SMALL_ID_WORSE;
    tsr_heap_init(&h);
    for (int i = 0; i < 6; i++)
        offer(&h, dv[i], iv[i], 0);
    tsr_heap_sort(&h);
    const int64_t desc[] = {4, 9, 7, 5}; /* ties: the larger ids kept, descending */
    for (int i = 0; i < 4; i++)
        assert_int_equal(id[i], desc[i]);
}

static void test_larger_better_aux_and_sentinels(void **state)
{
    (void)state;
    float d[5];
    int64_t id[5], aux[5];
    tsr_heap h = {5, TSR_HEAP_LARGER_BETTER, d, id, aux};
    tsr_heap_init(&h);
    assert_true(d[0] == -INFINITY && id[0] == -1 && aux[0] == -1);
    offer(&h, 2.0f, 10, 100);
    offer(&h, NAN, 11, 110); /* never enters */
    offer(&h, 3.0f, 12, 120);
    offer(&h, 2.0f, 8, 80); /* tie with 10: the smaller id is better */
    tsr_heap_sort(&h);
    assert_true(d[0] == 3.0f && id[0] == 12 && aux[0] == 120);
    assert_true(d[1] == 2.0f && id[1] == 8 && aux[1] == 80);
    assert_true(d[2] == 2.0f && id[2] == 10 && aux[2] == 100);
    for (int i = 3; i < 5; i++) /* fewer than k: the sentinels stay, last */
        assert_true(d[i] == -INFINITY && id[i] == -1 && aux[i] == -1);
}

static unsigned g_order;
static const float *g_d;

static int cmp_idx(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (tsr_heap_worse(g_order, g_d[y], y, g_d[x], x))
        return -1; /* x better */
    if (tsr_heap_worse(g_order, g_d[x], x, g_d[y], y))
        return 1;
    return 0;
}

static void test_against_sort(void **state)
{
    (void)state;
    enum { N = 2000, K = 37 };
    static float v[N];
    static int64_t all[N];
    unsigned seed = 12345;
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (float)((seed >> 16) % 50); /* many ties */
        all[i] = i;
    }
    for (unsigned order = 0; order < 4; order++) {
        float d[K];
        int64_t id[K];
        tsr_heap h = {K, order, d, id, NULL};
        tsr_heap_init(&h);
        for (int i = 0; i < N; i++)
            offer(&h, v[i], i, 0);
        tsr_heap_sort(&h);
        g_order = order;
        g_d = v;
        qsort(all, N, sizeof all[0], cmp_idx);
        for (int i = 0; i < K; i++) {
            assert_int_equal(id[i], all[i]);
            assert_true(d[i] == v[all[i]]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tie_orders),
        cmocka_unit_test(test_larger_better_aux_and_sentinels),
        cmocka_unit_test(test_against_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
