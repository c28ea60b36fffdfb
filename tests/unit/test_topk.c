/*
 * test_topk — heap against a full sort, the crowding pass against a literal reference,
 * the per-shard crowded collector plus the coordinator merge against the single-node
 * crowded answer on random splits (property test over many seeds), and RRF.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "query/topk.h"

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* n hits with distinct labels, distances from a small set when ties is set */
static void random_hits(tsr_hit *h, size_t n, int ties, uint32_t ntags)
{
    for (size_t i = 0; i < n; i++) {
        h[i].label = (int64_t)(i * 7 + 3) ^ 0x55;
        h[i].dist = ties ? (float)(rnd() % 16) : (float)(rnd() % 1000000) / 1000.0f - 300.0f;
        /* some hits have no crowding tag (never limited) */
        h[i].tag = ntags > 1 && rnd() % 8 == 0 ? TSR_TOPK_NOTAG : rnd() % ntags;
    }
}

static void shuffle(tsr_hit *h, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = rnd() % i;
        tsr_hit t = h[i - 1];
        h[i - 1] = h[j];
        h[j] = t;
    }
}

static void assert_same(const tsr_hit *a, size_t na, const tsr_hit *b, size_t nb,
                        const char *what, int seed)
{
    if (na != nb)
        fail_msg("%s seed %d: %zu hits, want %zu", what, seed, na, nb);
    for (size_t i = 0; i < na; i++)
        if (a[i].label != b[i].label || a[i].dist != b[i].dist)
            fail_msg("%s seed %d: hit %zu is (%g, %lld), want (%g, %lld)", what, seed, i,
                     a[i].dist, (long long)a[i].label, b[i].dist, (long long)b[i].label);
}

static void test_heap_vs_sort(void **state)
{
    enum { N = 3000 };
    static tsr_hit all[N], sorted[N], got[N];
    for (int seed = 0; seed < 200; seed++) {
        rng_state = (uint64_t)seed;
        size_t n = rnd() % N;
        size_t k = seed % 10 == 0 ? 0 : (seed % 7 == 0 ? n + 5 : 1 + rnd() % 100);
        int lb = seed & 1;
        random_hits(all, n, seed & 2, 1);
        memcpy(sorted, all, n * sizeof *all);
        tsr_hits_sort(sorted, n, lb);
        tsr_topk t;
        assert_int_equal(tsr_topk_init(&t, k, lb), 0);
        size_t entered = 0;
        for (size_t i = 0; i < n; i++) {
            int would = tsr_topk_would_enter(&t, all[i].dist, all[i].label);
            int kept = tsr_topk_push(&t, all[i].dist, 0, all[i].label);
            assert_int_equal(would, kept);
            entered += (size_t)kept;
        }
        size_t m = tsr_topk_extract(&t, got);
        assert_same(got, m, sorted, n < k ? n : k, "heap", seed);
        for (size_t i = 1; i < n; i++) /* sort gives a strict total order */
            assert_true(tsr_hit_better(&sorted[i - 1], &sorted[i], lb));
        tsr_topk_close(&t);
    }
}

/* Literal SPEC §3 crowding with an array of counts (tags are small in the tests). */
static size_t ref_crowd(const tsr_hit *sorted, size_t n, size_t k, size_t c, tsr_hit *out)
{
    static unsigned cnt[4096];
    memset(cnt, 0, sizeof cnt);
    size_t m = 0;
    for (size_t i = 0; i < n && m < k; i++) {
        if (sorted[i].tag != TSR_TOPK_NOTAG) {
            if (c != 0 && c < k && cnt[sorted[i].tag] >= c)
                continue;
            cnt[sorted[i].tag]++;
        }
        out[m++] = sorted[i];
    }
    return m;
}

static void test_crowd_select(void **state)
{
    enum { N = 2000 };
    static tsr_hit all[N], want[N], got[N];
    int crowded_cases = 0;
    for (int seed = 0; seed < 300; seed++) {
        rng_state = 1000 + (uint64_t)seed;
        size_t n = rnd() % N, k = 1 + rnd() % 60, c = rnd() % 8;
        uint32_t ntags = 1 + rnd() % 40;
        random_hits(all, n, seed & 1, ntags);
        tsr_hits_sort(all, n, seed & 2);
        size_t nw = ref_crowd(all, n, k, c, want), ng;
        assert_int_equal(tsr_crowd_select(all, n, k, c, got, &ng), 0);
        assert_same(got, ng, want, nw, "crowd_select", seed);
        size_t plain = n < k ? n : k;
        int differs = nw != plain;
        for (size_t i = 0; i < nw && !differs; i++)
            differs = want[i].label != all[i].label;
        crowded_cases += differs;
    }
    if (crowded_cases <= 50) /* the limit really bit in many cases */
        fail_msg("only %d cases where crowding changed the answer", crowded_cases);
    /* hand example: c = 1, k = 3 over tags A A B A C */
    tsr_hit h[] = {{1, 0, 10}, {2, 0, 11}, {3, 1, 12}, {4, 0, 13}, {5, 2, 14}};
    size_t ng;
    assert_int_equal(tsr_crowd_select(h, 5, 3, 1, got, &ng), 0);
    assert_int_equal(ng, 3);
    assert_int_equal(got[0].label, 10);
    assert_int_equal(got[1].label, 12);
    assert_int_equal(got[2].label, 14);
    /* untagged hits are never limited */
    tsr_hit u[] = {{1, TSR_TOPK_NOTAG, 10}, {2, TSR_TOPK_NOTAG, 11}, {3, 0, 12}, {4, 0, 13},
                   {5, TSR_TOPK_NOTAG, 14}};
    assert_int_equal(tsr_crowd_select(u, 5, 4, 1, got, &ng), 0);
    assert_int_equal(ng, 4);
    assert_int_equal(got[2].label, 12);
    assert_int_equal(got[3].label, 14);
    /* c >= k: no limit */
    assert_int_equal(tsr_crowd_select(h, 5, 3, 3, got, &ng), 0);
    assert_int_equal(got[1].label, 11);
}

/* Per-shard crowded top-k then the coordinator's crowded merge equals the single-node
 * greedy pass, on random splits; also the collector alone equals the greedy pass. */
static void test_crowded_distributed(void **state)
{
    enum { N = 1500, SMAX = 8 };
    static tsr_hit all[N], sorted[N], want[N], got[N];
    static tsr_hit shard_in[SMAX][N], shard_out[SMAX][N];
    size_t shard_n[SMAX], shard_m[SMAX];
    for (int seed = 0; seed < 400; seed++) {
        rng_state = 77777 + (uint64_t)seed;
        size_t n = rnd() % N, k = 1 + rnd() % 50, c = rnd() % 6;
        size_t S = 1 + rnd() % SMAX;
        uint32_t ntags = 1 + rnd() % (seed % 3 == 0 ? 3 : 60);
        int lb = seed & 1;
        random_hits(all, n, seed & 2, ntags);
        memcpy(sorted, all, n * sizeof *all);
        tsr_hits_sort(sorted, n, lb);
        size_t nw = ref_crowd(sorted, n, k, c, want);

        /* the collector over all candidates in random order */
        shuffle(all, n);
        tsr_crowd_topk ct;
        assert_int_equal(tsr_crowd_topk_init(&ct, k, c, lb), 0);
        for (size_t i = 0; i < n; i++)
            assert_true(tsr_crowd_topk_push(&ct, all[i].dist, all[i].tag, all[i].label) >= 0);
        size_t ng = tsr_crowd_topk_extract(&ct, got);
        assert_same(got, ng, want, nw, "collector", seed);

        /* reuse after extract */
        for (size_t i = 0; i < n; i++)
            tsr_crowd_topk_push(&ct, all[i].dist, all[i].tag, all[i].label);
        ng = tsr_crowd_topk_extract(&ct, got);
        assert_same(got, ng, want, nw, "collector reuse", seed);
        tsr_crowd_topk_close(&ct);

        /* random split, sometimes skewed so that one shard holds most of a tag */
        memset(shard_n, 0, sizeof shard_n);
        for (size_t i = 0; i < n; i++) {
            size_t s = (seed % 4 == 0) ? all[i].tag % S : rnd() % S;
            shard_in[s][shard_n[s]++] = all[i];
        }
        const tsr_hit *lists[SMAX];
        for (size_t s = 0; s < S; s++) {
            assert_int_equal(tsr_crowd_topk_init(&ct, k, c, lb), 0);
            for (size_t i = 0; i < shard_n[s]; i++)
                tsr_crowd_topk_push(&ct, shard_in[s][i].dist, shard_in[s][i].tag,
                                    shard_in[s][i].label);
            shard_m[s] = tsr_crowd_topk_extract(&ct, shard_out[s]);
            tsr_crowd_topk_close(&ct);
            lists[s] = shard_out[s];
        }
        assert_int_equal(tsr_topk_merge(lists, shard_m, S, lb, k, c, got, &ng), 0);
        assert_same(got, ng, want, nw, "distributed", seed);

        /* plain merge (no crowding) of sorted lists equals the sort */
        for (size_t s = 0; s < S; s++) {
            tsr_hits_sort(shard_in[s], shard_n[s], lb);
            lists[s] = shard_in[s];
        }
        assert_int_equal(tsr_topk_merge(lists, shard_n, S, lb, k, 0, got, &ng), 0);
        assert_same(got, ng, sorted, n < k ? n : k, "merge", seed);
    }
}

/* ---- RRF ---------------------------------------------------------------------------- */

static const tsr_rrf_hit *find_rrf(const tsr_rrf_hit *h, size_t n, int64_t label)
{
    for (size_t i = 0; i < n; i++)
        if (h[i].label == label)
            return &h[i];
    return NULL;
}

static void test_rrf(void **state)
{
    /* dense ranks: 1:a 2:b 3:c ; sparse ranks: 1:c 2:d */
    tsr_hit dense[] = {{0.1f, 0, 'a'}, {0.2f, 0, 'b'}, {0.3f, 0, 'c'}};
    tsr_hit sparse[] = {{9.0f, 0, 'c'}, {8.0f, 0, 'd'}};
    tsr_rrf_hit out[8];
    size_t n;
    const double k0 = TSR_RRF_K0;

    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 0.5, k0, 10, 0, out, &n), 0);
    assert_int_equal(n, 4);
    const tsr_rrf_hit *c = find_rrf(out, n, 'c');
    assert_non_null(c);
    assert_true(c->in_dense && c->in_sparse);
    assert_int_equal(c->rank_dense, 3);
    assert_int_equal(c->rank_sparse, 1);
    assert_true(c->dist == 0.3f && c->sparse_dist == 9.0f);
    double sc = 0.5 / (k0 + 3) + 0.5 / (k0 + 1);
    assert_true(c->score == sc);
    assert_int_equal(out[0].label, 'c'); /* in both lists: first */
    assert_int_equal(out[1].label, 'a'); /* a (dense 1) and d ... */
    assert_true(out[1].score == 0.5 / (k0 + 1));
    assert_int_equal(out[2].label, 'b'); /* b: 0.5/62 and d: 0.5/62 tie, label order */
    assert_int_equal(out[3].label, 'd');
    assert_true(out[2].score == out[3].score);
    assert_false(find_rrf(out, n, 'd')->in_dense);

    /* alpha 1: dense only, in dense order */
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 1.0, k0, 10, 0, out, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(out[0].label, 'a');
    assert_int_equal(out[1].label, 'b');
    assert_int_equal(out[2].label, 'c');
    assert_true(out[2].score == 1.0 / (k0 + 3));

    /* alpha 0 is really 0: sparse only, in sparse order */
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 0.0, k0, 10, 0, out, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(out[0].label, 'c');
    assert_int_equal(out[1].label, 'd');
    assert_true(out[0].score == 1.0 / (k0 + 1));

    /* k cuts, crowding applies after fusion */
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 0.5, k0, 2, 0, out, &n), 0);
    assert_int_equal(n, 2);
    tsr_hit dt[] = {{0.1f, 1, 'a'}, {0.2f, 1, 'b'}, {0.3f, 2, 'c'}};
    assert_int_equal(tsr_rrf_fuse(dt, 3, sparse, 2, 0.5, k0, 3, 1, out, &n), 0);
    assert_int_equal(n, 3); /* c(tag 2), a(tag 1), b skipped (tag 1), d(tag 0) */
    assert_int_equal(out[0].label, 'c');
    assert_int_equal(out[1].label, 'a');
    assert_int_equal(out[2].label, 'd');

    /* bad arguments */
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, -0.1, k0, 10, 0, out, &n), TSR_EINVAL);
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 1.5, k0, 10, 0, out, &n), TSR_EINVAL);
    assert_int_equal(tsr_rrf_fuse(dense, 3, sparse, 2, 0.5, 0.0, 10, 0, out, &n), TSR_EINVAL);
    assert_int_equal(tsr_rrf_fuse(NULL, 0, NULL, 0, 0.5, k0, 10, 0, out, &n), 0);
    assert_int_equal(n, 0);
}

/* Equal values share a rank (competition ranking), a label found by both lists gets both
 * terms, ties of the fused score go to the better dense rank, and the answer for k is the
 * prefix of the answer for k + 1 (issue 13: the hybrid ranking must not change with k). */
static void test_rrf_ties(void **state)
{
    (void)state;
    /* the case: labels 1..9 share the sparse score 0.9; label 10 is dense rank 1
     * and also has 0.9 (sparse position 10 by label order) */
    enum { NS = 12 };
    tsr_hit dense[] = {{0.0f, 0, 10}, {2.0f, 0, 50}, {3.0f, 0, 51}, {3.0f, 0, 52}, {4.0f, 0, 4}};
    tsr_hit sparse[NS];
    for (int i = 0; i < NS; i++)
        sparse[i] = (tsr_hit){i < 10 ? 0.9f : 0.5f, 0, i < 10 ? i + 1 : 60 + i};
    tsr_rrf_hit out[32], prev[32];
    size_t n, np = 0;
    const double k0 = TSR_RRF_K0;
    for (size_t k = 1; k <= 14; k++) {
        assert_int_equal(tsr_rrf_fuse(dense, 5, sparse, NS, 0.5, k0, k, 0, out, &n), 0);
        assert_int_equal(out[0].label, 10); /* both lists, both rank 1 */
        assert_int_equal(out[0].rank_sparse, 1);
        assert_true(out[0].score == 0.5 / (k0 + 1) + 0.5 / (k0 + 1));
        for (size_t i = 0; i < np; i++)
            assert_int_equal(out[i].label, prev[i].label);
        memcpy(prev, out, n * sizeof *out);
        np = n;
    }
    /* 4: dense rank 5, sparse rank 1; then 1..9 (sparse rank 1 only) by label */
    assert_int_equal(out[1].label, 4);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(out[2 + i].label, i < 3 ? i + 1 : i + 2);
        assert_int_equal(out[2 + i].rank_sparse, 1);
    }
    /* 51 and 52 tie in the dense list: both rank 3 */
    const tsr_rrf_hit *a = find_rrf(out, n, 51), *b = find_rrf(out, n, 52);
    assert_true(a && b && a->rank_dense == 3 && b->rank_dense == 3 && a->score == b->score);
    /* an equal fused score goes to the better dense rank: 7 (dense 1, sparse 2) and
     * 3 (dense 2, sparse 1) score the same; 7 first despite its larger label */
    tsr_hit d2[] = {{1.0f, 0, 7}, {2.0f, 0, 3}};
    tsr_hit s2[] = {{9.0f, 0, 3}, {8.0f, 0, 7}};
    assert_int_equal(tsr_rrf_fuse(d2, 2, s2, 2, 0.5, k0, 2, 0, out, &n), 0);
    assert_true(out[0].score == out[1].score);
    assert_int_equal(out[0].label, 7);
    assert_int_equal(out[1].label, 3);
}

static void test_rrf_random(void **state)
{
    enum { N = 300 };
    static tsr_hit dense[N], sparse[N];
    static tsr_rrf_hit out[2 * N];
    for (int seed = 0; seed < 100; seed++) {
        rng_state = 4242 + (uint64_t)seed;
        size_t nd = rnd() % N, ns = rnd() % N;
        /* labels drawn from 0..399 without repetition inside a list */
        static int used[400];
        memset(used, 0, sizeof used);
        for (size_t i = 0; i < nd; i++) {
            int64_t l;
            do
                l = rnd() % 400;
            while (used[l] & 1);
            used[l] |= 1;
            dense[i] = (tsr_hit){(float)i, 0, l};
        }
        for (size_t i = 0; i < ns; i++) {
            int64_t l;
            do
                l = rnd() % 400;
            while (used[l] & 2);
            used[l] |= 2;
            sparse[i] = (tsr_hit){-(float)i, 0, l}; /* distinct: ranks are i + 1 */
        }
        double alphas[] = {0.0, 0.5, 1.0, 0.25};
        for (int a = 0; a < 4; a++) {
            double alpha = alphas[a];
            size_t n;
            assert_int_equal(tsr_rrf_fuse(dense, nd, sparse, ns, alpha, 60.0, 2 * N, 0, out, &n), 0);
            /* reference score per label */
            double ref[400];
            int present[400];
            size_t npresent = 0;
            for (int l = 0; l < 400; l++) {
                ref[l] = 0;
                present[l] = 0;
            }
            for (size_t i = 0; i < nd; i++)
                if (alpha > 0)
                    ref[dense[i].label] += alpha / (60.0 + (double)(i + 1)), present[dense[i].label] = 1;
            for (size_t i = 0; i < ns; i++)
                if (alpha < 1)
                    ref[sparse[i].label] += (1 - alpha) / (60.0 + (double)(i + 1)), present[sparse[i].label] = 1;
            for (int l = 0; l < 400; l++)
                npresent += (size_t)present[l];
            assert_int_equal(n, npresent);
            for (size_t i = 0; i < n; i++) {
                assert_true(present[out[i].label]);
                double d = out[i].score - ref[out[i].label];
                assert_true(d < 1e-12 && d > -1e-12);
                if (i > 0) { /* score, then dense rank (absent last), then label */
                    uint32_t ra = out[i - 1].in_dense ? out[i - 1].rank_dense : UINT32_MAX;
                    uint32_t rb = out[i].in_dense ? out[i].rank_dense : UINT32_MAX;
                    assert_true(out[i - 1].score > out[i].score ||
                                (out[i - 1].score == out[i].score &&
                                 (ra < rb || (ra == rb && out[i - 1].label < out[i].label))));
                }
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heap_vs_sort),        cmocka_unit_test(test_crowd_select),
        cmocka_unit_test(test_crowded_distributed), cmocka_unit_test(test_rrf),
        cmocka_unit_test(test_rrf_ties),
        cmocka_unit_test(test_rrf_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
