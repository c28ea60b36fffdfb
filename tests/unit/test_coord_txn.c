/*
 * test_coord_txn — the version-transaction engine (coordinator/txn.c tsr__txn_run) and
 * the contract it gives its planners (txn.h), on a coordinator in this process whose
 * replicas have no channel (every shard call fails at once as UNAVAILABLE):
 *   - a planner that plans with the stream frozen is called frozen; a fold's
 *     (plan_frozen 0) is called with writes flowing;
 *   - a plan that fails ends the transaction there: no fill, no prepared, no caught_up,
 *     finish once with the plan's code, the stream thawed, the served version and its
 *     reference count unchanged;
 *   - a Stage refused by the shards (the move's chunk 0) is a failure before the commit
 *     point: fill is not called, finish sees the error, newv's coordinator log is removed
 *     (tsr__stream_version_abort), version 1 stays served.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <grpc/grpc.h>

#include "coord.h"
#include "coord_test_util.h"
#include "core/mem.h"
#include "stream_int.h"
#include "txn.h"

static char dir[512];

/* What the planner's hooks saw. */
typedef struct seen {
    int plan, fill, prepared, caught_up, finish;
    int plan_frozen;            /* the stream was frozen when plan ran */
    int finish_rc;
    int plan_rc;                /* what plan returns (0: it plans an empty fold) */
    tsr_batch b;                /* the empty batch of a fold's plan */
} seen;

static int frozen(tsr__coord *c)
{
    if (pthread_mutex_trylock(&c->st->mu) != 0)
        return 1;
    pthread_mutex_unlock(&c->st->mu);
    return 0;
}

static int h_plan(tsr__txn *u, void *ud, tsr_error *err)
{
    seen *s = ud;
    s->plan++;
    s->plan_frozen = frozen(u->c);
    if (s->plan_rc)
        return tsr_err(err, s->plan_rc, "planted: the plan fails");
    u->b = &s->b;
    return tsr__txn_plan(u, 0, err);
}

static int h_fill(tsr__txn *u, void *ud, tsr_error *err)
{
    (void)u;
    (void)err;
    ((seen *)ud)->fill++;
    return 0;
}

static void h_prepared(tsr__txn *u, void *ud)
{
    (void)u;
    ((seen *)ud)->prepared++;
}

static void h_caught_up(tsr__txn *u, void *ud)
{
    (void)u;
    ((seen *)ud)->caught_up++;
}

static void h_finish(tsr__txn *u, void *ud, int rc)
{
    seen *s = ud;
    s->finish++;
    s->finish_rc = rc;
    assert_true(frozen(u->c)); /* finish runs before the thaw */
}

static void coord_open(tsr__coord *c)
{
    tsr_error err = TSR_ERROR_INIT;
    memset(c, 0, sizeof *c);
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/coordinator.json", dir);
    FILE *f = fopen(cfgp, "w");
    assert_non_null(f);
    fputs("{\"dimensions\": 8, \"nlist\": 4, \"pq_m\": 2, \"pq_nbits\": 8, \"nprobe\": 2,\n"
          " \"shards\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}\n", f);
    fclose(f);
    assert_int_equal(tsr__coord_config_load(cfgp, &c->cfg, &err), 0);
    pthread_mutex_init(&c->snap_mu, NULL);
    pthread_mutex_init(&c->update_mu, NULL);
    pthread_mutex_init(&c->op_mu, NULL);
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/data", dir);
    assert_int_equal(tsr_store_create(sdir, &c->store, &err), 0);
    c->no_channels = 1;
    tsr_rpc_client_opts copts;
    memset(&copts, 0, sizeof copts);
    assert_int_equal(tsr__coord_channels_open(c, &copts, &err), 0);
    tsr__snap *s = coord_test_snapshot(1, (size_t)c->cfg.nlist, c->cfg.nshards, &err);
    assert_non_null(s);
    tsr__dir_add(&s->dir, "a", 0, 0, s->plan[0], 1, 0);
    s->next_label = 1;
    s->ndense = 1;
    c->snap = s;
    assert_int_equal(tsr__stream_init(c, &err), 0);
}

static void coord_close(tsr__coord *c)
{
    tsr__stream_close(c);
    tsr__coord_channels_close(c);
    tsr__snap_unref(c->snap);
    tsr_store_destroy(c->store);
    tsr__coord_config_close(&c->cfg);
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/data", dir);
    coord_test_rmtree(sdir); /* the next test starts from an empty folder */
}

/* Runs one transaction of planner pl (hooks recording into *s) as an operation would. */
static int run(tsr__coord *c, tsr__txn_planner *pl, seen *s, int catchup, tsr_error *err)
{
    tsr__op op;
    memset(&op, 0, sizeof op);
    snprintf(op.id, sizeof op.id, "op-1-1");
    tsr__txn u = {.c = c, .op = &op, .fresh = -1, .catchup = catchup,
                  .term = tsr__coord_term(c)};
    pl->plan = h_plan;
    pl->fill = h_fill;
    pl->prepared = h_prepared;
    pl->caught_up = h_caught_up;
    pl->finish = h_finish;
    pl->ud = s;
    int64_t v = 0;
    pthread_mutex_lock(&c->update_mu);
    int rc = tsr__txn_run(&u, pl, &v, err);
    pthread_mutex_unlock(&c->update_mu);
    assert_int_equal(v, 0); /* nothing here ever commits */
    free(op.error);
    return rc;
}

static void served_is_v1(tsr__coord *c)
{
    tsr__snap *s = tsr__coord_snap_get(c);
    assert_int_equal(s->version, 1);
    assert_int_equal(atomic_load(&s->refs), 2); /* the served one and ours: none leaked */
    tsr__snap_unref(s);
    assert_false(frozen(c));
}

static void test_plan_fails(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    for (int pf = 0; pf <= 1; pf++) {
        seen s = {.plan_rc = TSR_EINVAL};
        tsr__txn_planner pl = {.plan_frozen = pf, .split_stage = 1};
        tsr_error err = TSR_ERROR_INIT;
        int rc = run(&c, &pl, &s, !pf, &err);
        assert_int_equal(rc, TSR_EINVAL);
        assert_non_null(strstr(err.msg, "planted"));
        assert_int_equal(s.plan, 1);
        assert_int_equal(s.plan_frozen, pf); /* frozen exactly when the planner says */
        assert_int_equal(s.fill + s.prepared + s.caught_up, 0);
        assert_int_equal(s.finish, 1);
        assert_int_equal(s.finish_rc, TSR_EINVAL);
        served_is_v1(&c);
    }
    coord_close(&c);
}

static void test_stage_refused(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    seen s = {0};
    tsr__txn_planner pl = {.plan_frozen = 0, .split_stage = 1};
    tsr_error err = TSR_ERROR_INIT;
    int rc = run(&c, &pl, &s, 1, &err);
    assert_int_not_equal(rc, 0); /* no shard answers: Stage fails */
    assert_int_equal(s.plan, 1);
    assert_int_equal(s.plan_frozen, 0); /* a fold plans with writes flowing */
    assert_int_equal(s.fill + s.prepared + s.caught_up, 0);
    assert_int_equal(s.finish, 1);
    assert_int_equal(s.finish_rc, rc);
    served_is_v1(&c);
    char path[4400];
    tsr__slog_path(c.store, 2, path, sizeof path);
    assert_int_not_equal(access(path, F_OK), 0); /* v2's log removed by the abort */
    tsr__slog_path(c.store, 1, path, sizeof path);
    assert_int_equal(access(path, F_OK), 0); /* v1's stays */
    coord_close(&c);
}

int main(void)
{
    grpc_init(); /* the fan-outs' completion queues */
    coord_test_tmpdir(dir, sizeof dir, "tsr_coord_txn");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_fails),
        cmocka_unit_test(test_stage_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    coord_test_rmtree(dir);
    grpc_shutdown();
    return rc;
}
