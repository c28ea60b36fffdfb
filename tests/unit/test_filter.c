/*
 * test_filter — SPEC §3 token and numeric restricts: the worked example A–H, every numeric
 * operator over int/float/double and mixed types, missing namespaces, AND across
 * namespaces, unknown tokens, and a randomized comparison with a string-level reference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "query/filter.h"
#include "core/mem.h"

/* Adds namespace ns with tokens "a,b,!c" ("!" = deny) to a restrict array. */
static void add_restrict(tsr_token_restrict **rs, size_t *n, const char *ns, const char *spec)
{
    *rs = tsr_xrealloc(*rs, (*n + 1) * sizeof **rs);
    tsr_token_restrict *r = &(*rs)[(*n)++];
    memset(r, 0, sizeof *r);
    r->ns = tsr_xstrdup(ns);
    char *copy = tsr_xstrdup(spec), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (t[0] == '!') {
            r->deny = tsr_xrealloc(r->deny, (r->ndeny + 1) * sizeof *r->deny);
            r->deny[r->ndeny++] = tsr_xstrdup(t + 1);
        } else {
            r->allow = tsr_xrealloc(r->allow, (r->nallow + 1) * sizeof *r->allow);
            r->allow[r->nallow++] = tsr_xstrdup(t);
        }
    }
    free(copy);
}

static void free_restricts(tsr_token_restrict *rs, size_t n)
{
    tsr_datapoint dp;
    tsr_datapoint_init(&dp);
    dp.restricts = rs;
    dp.nrestricts = n;
    tsr_datapoint_close(&dp);
}

static void add_numeric(tsr_datapoint *dp, const char *ns, enum tsr_num_type t, double v,
                        int64_t iv)
{
    dp->numeric = tsr_xrealloc(dp->numeric, (dp->nnumeric + 1) * sizeof *dp->numeric);
    tsr_numeric_restrict *n = &dp->numeric[dp->nnumeric++];
    n->ns = tsr_xstrdup(ns);
    n->type = t;
    if (t == TSR_NUM_INT)
        n->v.i = iv;
    else if (t == TSR_NUM_FLOAT)
        n->v.f = (float)v;
    else
        n->v.d = v;
}

/* Rows labelled 100+i; returns the letters of matching rows, e.g. "BEFG". */
static void matches(const tsr_filter *f, const tsr_filter_meta *m, char *out)
{
    size_t k = 0;
    for (uint32_t r = 0; r < tsr_filter_meta_rows(m); r++)
        if (tsr_filter_match(f, m, r))
            out[k++] = (char)('A' + r);
    out[k] = '\0';
}

static const char *example_dp[] = {"", "red", "blue", "orange", "red,blue", "red,!blue",
                                   "red,blue,!blue", "!blue"};

static tsr_filter_meta *build_example(tsr_filter_dict *d)
{
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    assert_non_null(m);
    for (int i = 0; i < 8; i++) {
        tsr_datapoint dp;
        tsr_datapoint_init(&dp);
        if (example_dp[i][0])
            add_restrict(&dp.restricts, &dp.nrestricts, "color", example_dp[i]);
        uint32_t row;
        tsr_error err = TSR_ERROR_INIT;
        assert_int_equal(tsr_filter_meta_add(m, 100 + i, &dp, &row, &err), 0);
        assert_int_equal(row, (uint32_t)i);
        tsr_datapoint_close(&dp);
    }
    return m;
}

static void expect_query(const tsr_filter_meta *m, const char *ns, const char *spec,
                         const char *want)
{
    tsr_token_restrict *q = NULL;
    size_t nq = 0;
    if (spec != NULL)
        add_restrict(&q, &nq, ns, spec);
    tsr_filter *f = NULL;
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_filter_compile(tsr_filter_meta_dict(m), q, nq, NULL, 0, &f, &err), 0);
    char got[64];
    matches(f, m, got);
    if (strcmp(got, want) != 0)
        fail_msg("query %s {%s}: got %s, want %s", ns, spec ? spec : "(none)", got, want);
    tsr_filter_destroy(f);
    free_restricts(q, nq);
}

static void test_worked_example(void **state)
{
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = build_example(d);
    expect_query(m, "color", "red", "BEFG");
    expect_query(m, "color", "blue", "CE");
    expect_query(m, "color", "red,blue", "BCE");
    expect_query(m, "color", "!blue", "ABDFH");
    expect_query(m, "color", NULL, "ABCDEFGH"); /* {} as no restrict at all */
    expect_query(m, "color", "", "ABCDEFGH");   /* {} as an empty namespace entry */
    /* a namespace the query names that no datapoint uses */
    expect_query(m, "shape", "", "ABCDEFGH");
    /* more combinations derived from the rules */
    expect_query(m, "color", "orange", "D");
    expect_query(m, "color", "red,!blue", "BF");
    expect_query(m, "color", "!red,!blue", "ADH");
    /* unknown tokens */
    expect_query(m, "color", "purple", "");
    expect_query(m, "color", "red,purple", "BEFG");
    expect_query(m, "color", "!purple", "ABCDEFGH");
    expect_query(m, "shape", "square", "");
    expect_query(m, "shape", "!square", "ABCDEFGH");
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

static void test_and_across_namespaces(void **state)
{
    /* rows: A red/square, B blue/square, C red/circle, D red (no shape), E square (no color) */
    static const char *color[] = {"red", "blue", "red", "red", NULL};
    static const char *shape[] = {"square", "square", "circle", NULL, "square"};
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    for (int i = 0; i < 5; i++) {
        tsr_datapoint dp;
        tsr_datapoint_init(&dp);
        if (color[i])
            add_restrict(&dp.restricts, &dp.nrestricts, "color", color[i]);
        if (shape[i])
            add_restrict(&dp.restricts, &dp.nrestricts, "shape", shape[i]);
        assert_int_equal(tsr_filter_meta_add(m, i, &dp, NULL, NULL), 0);
        tsr_datapoint_close(&dp);
    }
    struct {
        const char *c, *s, *want;
    } cases[] = {
        {"red,blue", "square", "AB"}, {"red", "square", "A"}, {"red", NULL, "ACD"},
        {NULL, "square", "ABE"},      {"red", "!circle", "AD"}, {"!red", "square", "BE"},
        {"red,blue", "circle,square", "ABC"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_token_restrict *q = NULL;
        size_t nq = 0;
        if (cases[i].c)
            add_restrict(&q, &nq, "color", cases[i].c);
        if (cases[i].s)
            add_restrict(&q, &nq, "shape", cases[i].s);
        tsr_filter *f;
        assert_int_equal(tsr_filter_compile(d, q, nq, NULL, 0, &f, NULL), 0);
        char got[16];
        matches(f, m, got);
        if (strcmp(got, cases[i].want) != 0)
            fail_msg("case %zu: got %s want %s", i, got, cases[i].want);
        tsr_filter_destroy(f);
        free_restricts(q, nq);
    }
    /* the same namespace named twice is one namespace: tokens merge (OR) */
    tsr_token_restrict *q = NULL;
    size_t nq = 0;
    add_restrict(&q, &nq, "color", "blue");
    add_restrict(&q, &nq, "color", "red");
    tsr_filter *f;
    assert_int_equal(tsr_filter_compile(d, q, nq, NULL, 0, &f, NULL), 0);
    char got[16];
    matches(f, m, got);
    assert_string_equal(got, "ABCD");
    tsr_filter_destroy(f);
    free_restricts(q, nq);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

/* Reference comparison: int with int exactly, otherwise as double. */
static int ref_num(int dint, int64_t di, double dd, int qint, int64_t qi, double qd,
                   enum tsr_num_op op)
{
    int lt, eq;
    if (dint && qint) {
        lt = di < qi;
        eq = di == qi;
    } else {
        double a = dint ? (double)di : dd, b = qint ? (double)qi : qd;
        lt = a < b;
        eq = a == b;
    }
    switch (op) {
    case TSR_OP_LESS: return lt;
    case TSR_OP_LESS_EQUAL: return lt || eq;
    case TSR_OP_EQUAL: return eq;
    case TSR_OP_GREATER_EQUAL: return !lt;
    case TSR_OP_GREATER: return !lt && !eq;
    case TSR_OP_NOT_EQUAL: return !eq;
    default: return -1;
    }
}

static void test_numeric_ops(void **state)
{
    /* datapoint values: each in its own row; the last row has no "x" at all */
    static const double vals[] = {-1, 0, 1, 2.5, 3, 0.1};
    const int nv = (int)(sizeof vals / sizeof vals[0]);
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    int nrow = 0;
    int rtype[64];
    double rval[64];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < nv; i++) {
            if (t == TSR_NUM_INT && vals[i] != (double)(int64_t)vals[i])
                continue;
            tsr_datapoint dp;
            tsr_datapoint_init(&dp);
            add_numeric(&dp, "y", TSR_NUM_INT, 0, 7); /* an unrelated namespace first */
            add_numeric(&dp, "x", (enum tsr_num_type)t, vals[i], (int64_t)vals[i]);
            assert_int_equal(tsr_filter_meta_add(m, nrow, &dp, NULL, NULL), 0);
            rtype[nrow] = t;
            rval[nrow] = vals[i];
            nrow++;
            tsr_datapoint_close(&dp);
        }
    tsr_datapoint none;
    tsr_datapoint_init(&none);
    add_numeric(&none, "y", TSR_NUM_INT, 0, 1);
    assert_int_equal(tsr_filter_meta_add(m, 1000, &none, NULL, NULL), 0);
    tsr_datapoint_close(&none);

    static const double qvals[] = {0, 1, 2.5, 0.1, -1};
    int checked = 0;
    for (int op = TSR_OP_LESS; op <= TSR_OP_NOT_EQUAL; op++)
        for (int qt = 0; qt < 3; qt++)
            for (size_t qv = 0; qv < sizeof qvals / sizeof qvals[0]; qv++) {
                if (qt == TSR_NUM_INT && qvals[qv] != (double)(int64_t)qvals[qv])
                    continue;
                tsr_numeric_query q = {.ns = "x", .type = (enum tsr_num_type)qt,
                                       .op = (enum tsr_num_op)op};
                if (qt == TSR_NUM_INT)
                    q.v.i = (int64_t)qvals[qv];
                else if (qt == TSR_NUM_FLOAT)
                    q.v.f = (float)qvals[qv];
                else
                    q.v.d = qvals[qv];
                tsr_filter *f;
                assert_int_equal(tsr_filter_compile(d, NULL, 0, &q, 1, &f, NULL), 0);
                for (int r = 0; r < nrow; r++) {
                    /* the reference sees the values as the types store them */
                    double dd = rtype[r] == TSR_NUM_FLOAT ? (double)(float)rval[r] : rval[r];
                    double qd = qt == TSR_NUM_FLOAT ? (double)(float)qvals[qv] : qvals[qv];
                    int want = ref_num(rtype[r] == TSR_NUM_INT, (int64_t)rval[r], dd,
                                       qt == TSR_NUM_INT, (int64_t)qvals[qv], qd,
                                       (enum tsr_num_op)op);
                    int got = tsr_filter_match(f, m, (uint32_t)r);
                    if (got != want)
                        fail_msg("op %d qtype %d q %g row type %d value %g: got %d want %d", op,
                                 qt, qvals[qv], rtype[r], rval[r], got, want);
                    checked++;
                }
                /* a datapoint without the namespace never matches, not even NOT_EQUAL */
                assert_int_equal(tsr_filter_match(f, m, (uint32_t)nrow), 0);
                tsr_filter_destroy(f);
            }
    assert_true(checked > 500);

    /* spot checks that do not rely on the reference */
    struct {
        int row;
        tsr_numeric_query q;
        int want;
    } spot[] = {
        /* row 3 is int 3, row 2 is int 1 (ints: -1 0 1 3 at rows 0..3) */
        {3, {"x", TSR_NUM_INT, {.i = 3}, TSR_OP_EQUAL}, 1},
        {3, {"x", TSR_NUM_DOUBLE, {.d = 3.0}, TSR_OP_EQUAL}, 1},
        {3, {"x", TSR_NUM_FLOAT, {.f = 2.5f}, TSR_OP_GREATER}, 1},
        {2, {"x", TSR_NUM_FLOAT, {.f = 2.5f}, TSR_OP_LESS}, 1},
        {2, {"x", TSR_NUM_INT, {.i = 1}, TSR_OP_NOT_EQUAL}, 0},
        /* rows 4.. are floats: -1 0 1 2.5 3 0.1f; 0.1f != 0.1 as double */
        {9, {"x", TSR_NUM_DOUBLE, {.d = 0.1}, TSR_OP_EQUAL}, 0},
        {9, {"x", TSR_NUM_FLOAT, {.f = 0.1f}, TSR_OP_EQUAL}, 1},
        {9, {"x", TSR_NUM_DOUBLE, {.d = 0.1}, TSR_OP_GREATER}, 1}, /* 0.1f > 0.1 */
        {7, {"x", TSR_NUM_INT, {.i = 2}, TSR_OP_GREATER}, 1},      /* 2.5f > 2 */
    };
    for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++) {
        tsr_filter *f;
        assert_int_equal(tsr_filter_compile(d, NULL, 0, &spot[i].q, 1, &f, NULL), 0);
        if (tsr_filter_match(f, m, (uint32_t)spot[i].row) != spot[i].want)
            fail_msg("spot %zu", i);
        tsr_filter_destroy(f);
    }
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

static void test_numeric_int_exact(void **state)
{
    /* 2^53 + 1 is not a double: int vs int must compare exactly, int vs double as double */
    const int64_t big = (1ll << 53) + 1;
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    tsr_datapoint dp;
    tsr_datapoint_init(&dp);
    add_numeric(&dp, "n", TSR_NUM_INT, 0, big);
    assert_int_equal(tsr_filter_meta_add(m, 1, &dp, NULL, NULL), 0);
    tsr_datapoint_close(&dp);
    tsr_numeric_query qi = {"n", TSR_NUM_INT, {.i = big - 1}, TSR_OP_EQUAL};
    tsr_numeric_query qd = {"n", TSR_NUM_DOUBLE, {.d = (double)(big - 1)}, TSR_OP_EQUAL};
    tsr_numeric_query qg = {"n", TSR_NUM_INT, {.i = big - 1}, TSR_OP_GREATER};
    tsr_filter *f;
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &qi, 1, &f, NULL), 0);
    assert_int_equal(tsr_filter_match(f, m, 0), 0);
    tsr_filter_destroy(f);
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &qd, 1, &f, NULL), 0);
    assert_int_equal(tsr_filter_match(f, m, 0), 1);
    tsr_filter_destroy(f);
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &qg, 1, &f, NULL), 0);
    assert_int_equal(tsr_filter_match(f, m, 0), 1);
    tsr_filter_destroy(f);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

static void test_numeric_and_tokens(void **state)
{
    /* rows: price 5 red, price 15 red, price 15 blue, red without price */
    tsr_filter_dict *d = tsr_filter_dict_create();
    tsr_filter_meta *m = tsr_filter_meta_create(d);
    int64_t price[] = {5, 15, 15, -1};
    const char *col[] = {"red", "red", "blue", "red"};
    for (int i = 0; i < 4; i++) {
        tsr_datapoint dp;
        tsr_datapoint_init(&dp);
        add_restrict(&dp.restricts, &dp.nrestricts, "color", col[i]);
        if (price[i] >= 0)
            add_numeric(&dp, "price", TSR_NUM_INT, 0, price[i]);
        add_numeric(&dp, "weight", TSR_NUM_DOUBLE, 1.5 * i, 0);
        assert_int_equal(tsr_filter_meta_add(m, i, &dp, NULL, NULL), 0);
        tsr_datapoint_close(&dp);
    }
    tsr_token_restrict *q = NULL;
    size_t nq = 0;
    add_restrict(&q, &nq, "color", "red");
    tsr_numeric_query nqs[] = {
        {"price", TSR_NUM_INT, {.i = 10}, TSR_OP_GREATER},
        {"price", TSR_NUM_DOUBLE, {.d = 20}, TSR_OP_LESS},
        {"weight", TSR_NUM_FLOAT, {.f = 1.0f}, TSR_OP_GREATER_EQUAL},
    };
    char got[8];
    tsr_filter *f;
    assert_int_equal(tsr_filter_compile(d, q, nq, nqs, 3, &f, NULL), 0);
    matches(f, m, got);
    assert_string_equal(got, "B");
    tsr_filter_destroy(f);
    assert_int_equal(tsr_filter_compile(d, NULL, 0, nqs, 2, &f, NULL), 0);
    matches(f, m, got);
    assert_string_equal(got, "BC");
    tsr_filter_destroy(f);
    assert_int_equal(tsr_filter_compile(d, q, nq, nqs + 1, 1, &f, NULL), 0);
    matches(f, m, got);
    assert_string_equal(got, "AB");
    tsr_filter_destroy(f);
    /* unknown numeric namespace matches nothing */
    tsr_numeric_query unk = {"volume", TSR_NUM_INT, {.i = 0}, TSR_OP_NOT_EQUAL};
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &unk, 1, &f, NULL), 0);
    assert_true(tsr_filter_matches_none(f));
    matches(f, m, got);
    assert_string_equal(got, "");
    tsr_filter_destroy(f);
    /* bad operator is rejected with a message */
    tsr_numeric_query bad = {"price", TSR_NUM_INT, {.i = 0}, TSR_OP_UNSPECIFIED};
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &bad, 1, &f, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "operator"));
    bad.op = (enum tsr_num_op)7;
    assert_int_equal(tsr_filter_compile(d, NULL, 0, &bad, 1, &f, &err), TSR_EINVAL);
    free_restricts(q, nq);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(d);
}

static void test_dict_meta_callback(void **state)
{
    tsr_filter_dict *d = tsr_filter_dict_create();
    uint32_t ids[5000];
    char buf[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(buf, sizeof buf, "tok%d", i);
        assert_int_equal(tsr_filter_dict_intern(d, buf, strlen(buf), &ids[i]), 0);
        assert_int_equal(ids[i], (uint32_t)i);
    }
    uint32_t again;
    assert_int_equal(tsr_filter_dict_intern(d, "tok17", 5, &again), 0);
    assert_int_equal(again, 17);
    tsr_filter_dict *c = tsr_filter_dict_clone(d);
    assert_non_null(c);
    for (int i = 0; i < 5000; i += 97) {
        snprintf(buf, sizeof buf, "tok%d", i);
        assert_int_equal(tsr_filter_dict_lookup(c, buf, strlen(buf)), (uint32_t)i);
    }
    assert_int_equal(tsr_filter_dict_intern(c, "new", 3, &again), 0);
    assert_int_equal(again, 5000);
    assert_int_equal(tsr_filter_dict_lookup(d, "new", 3), TSR_FILTER_NOID);
    size_t len;
    assert_string_equal(tsr_filter_dict_str(c, 5000, &len), "new");
    assert_int_equal(len, 3);
    assert_null(tsr_filter_dict_str(d, 5000, NULL));
    tsr_filter_dict_destroy(d);

    tsr_filter_meta *m = build_example(c);
    tsr_error err = TSR_ERROR_INIT;
    tsr_datapoint dp;
    tsr_datapoint_init(&dp);
    assert_int_equal(tsr_filter_meta_add(m, 101, &dp, NULL, &err), TSR_EINVAL);
    assert_non_null(strstr(err.msg, "101"));
    uint32_t row;
    assert_int_equal(tsr_filter_meta_find(m, 104, &row), 0);
    assert_int_equal(row, 4);
    assert_int_equal(tsr_filter_meta_find(m, 99, &row), -1);
    assert_int_equal(tsr_filter_meta_label(m, 6), 106);
    assert_int_equal(tsr_filter_meta_crowding(m, 0), TSR_FILTER_NOID); /* untagged */

    tsr_token_restrict *q = NULL;
    size_t nq = 0;
    add_restrict(&q, &nq, "color", "blue");
    tsr_filter *f;
    assert_int_equal(tsr_filter_compile(c, q, nq, NULL, 0, &f, NULL), 0);
    tsr_filter_scan scan = {f, m};
    int (*accept)(void *, int64_t) = tsr_filter_accept_label;
    assert_int_equal(accept(&scan, 102), 1);
    assert_int_equal(accept(&scan, 104), 1);
    assert_int_equal(accept(&scan, 106), 0);
    assert_int_equal(accept(&scan, 100), 0);
    assert_int_equal(accept(&scan, 12345), 0);
    tsr_filter_scan all = {NULL, m};
    assert_int_equal(accept(&all, 100), 1);
    assert_int_equal(accept(&all, 12345), 0);
    tsr_filter_destroy(f);
    free_restricts(q, nq);
    tsr_filter_meta_destroy(m);
    tsr_filter_dict_destroy(c);
}

/* ---- randomized comparison with a direct string-level reading of SPEC §3 ---------------- */

typedef struct rdp {
    int has[3][4]; /* [ns][tok]: 0 none, 1 allow, 2 deny, 3 both */
} rdp;

static const char *NS[] = {"a", "b", "c"};
static const char *TOK[] = {"t0", "t1", "t2", "t3"};

static int ref_match(const rdp *p, const int q[3][5], const int named[3])
{
    for (int ns = 0; ns < 3; ns++) {
        if (!named[ns])
            continue;
        int any_allow = 0, ok = 0;
        for (int t = 0; t < 5; t++) {
            int qa = q[ns][t] & 1, qd = q[ns][t] & 2;
            int da = t < 4 && (p->has[ns][t] & 1), dd = t < 4 && (p->has[ns][t] & 2);
            if (qa)
                any_allow = 1;
            if (qd && da)
                return 0;
            if (qa && dd)
                return 0;
            if (qa && da)
                ok = 1;
        }
        if (any_allow && !ok)
            return 0;
    }
    return 1;
}

static void test_random_reference(void **state)
{
    srand(12345);
    for (int iter = 0; iter < 200; iter++) {
        tsr_filter_dict *d = tsr_filter_dict_create();
        tsr_filter_meta *m = tsr_filter_meta_create(d);
        rdp pts[40];
        for (int i = 0; i < 40; i++) {
            tsr_datapoint dp;
            tsr_datapoint_init(&dp);
            for (int ns = 0; ns < 3; ns++) {
                char spec[64] = "";
                for (int t = 0; t < 4; t++) {
                    int v = rand() % 6;
                    pts[i].has[ns][t] = v < 3 ? 0 : v - 2; /* 0..3 */
                    if (pts[i].has[ns][t] & 1)
                        strcat(spec, TOK[t]), strcat(spec, ",");
                    if (pts[i].has[ns][t] & 2)
                        strcat(spec, "!"), strcat(spec, TOK[t]), strcat(spec, ",");
                }
                if (spec[0] || rand() % 4 == 0)
                    add_restrict(&dp.restricts, &dp.nrestricts, NS[ns], spec);
            }
            assert_int_equal(tsr_filter_meta_add(m, i, &dp, NULL, NULL), 0);
            tsr_datapoint_close(&dp);
        }
        for (int qi = 0; qi < 20; qi++) {
            int q[3][5] = {{0}}, named[3] = {0};
            tsr_token_restrict *qr = NULL;
            size_t nq = 0;
            for (int ns = 0; ns < 3; ns++) {
                if (rand() % 2)
                    continue;
                named[ns] = 1;
                char spec[80] = "";
                for (int t = 0; t < 5; t++) { /* t == 4 is a token no datapoint has */
                    int v = rand() % 8;
                    q[ns][t] = v < 5 ? 0 : v - 4;
                    const char *name = t < 4 ? TOK[t] : "zz";
                    if (q[ns][t] & 1)
                        strcat(spec, name), strcat(spec, ",");
                    if (q[ns][t] & 2)
                        strcat(spec, "!"), strcat(spec, name), strcat(spec, ",");
                }
                add_restrict(&qr, &nq, NS[ns], spec);
            }
            tsr_filter *f;
            assert_int_equal(tsr_filter_compile(d, qr, nq, NULL, 0, &f, NULL), 0);
            for (int i = 0; i < 40; i++) {
                int want = ref_match(&pts[i], (const int(*)[5])q, named);
                if (tsr_filter_match(f, m, (uint32_t)i) != want)
                    fail_msg("iter %d query %d row %d: want %d", iter, qi, i, want);
            }
            tsr_filter_destroy(f);
            free_restricts(qr, nq);
        }
        tsr_filter_meta_destroy(m);
        tsr_filter_dict_destroy(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),     cmocka_unit_test(test_and_across_namespaces),
        cmocka_unit_test(test_numeric_ops),        cmocka_unit_test(test_numeric_int_exact),
        cmocka_unit_test(test_numeric_and_tokens), cmocka_unit_test(test_dict_meta_callback),
        cmocka_unit_test(test_random_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
