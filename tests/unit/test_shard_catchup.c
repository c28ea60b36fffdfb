/*
 * test_shard_catchup — the shard's catch-up version (StageRequest.capture_delta,
 * docs/resharding.md "Writes during a move"), without RPC: a staging that opts in keeps
 * the base's delta snapshot of its chunk 0 and its Prepare folds that snapshot while
 * Writes with later seqs keep landing in the served version (before and after the
 * Prepare); Writes naming the prepared version carry those later rounds into it (its own
 * log, its own seq check: a resend is acknowledged, not applied twice); a restart keeps
 * both versions' writes (the prepared version's log replayed); Commit serves the new
 * version with its caught-up delta and continues its log; Abort removes the log. Without
 * capture_delta nothing changes: Prepare refuses "writes arrived after Stage", Writes
 * wait while a prepared version waits, and a Write naming a prepared version is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "index/faiss_io.h"
#include "shard_test_util.h"

enum { MAXR = 16 };

/* The records of one Stage or Write request (the protobuf structs, filled by hand). */
typedef struct recs {
    Tessera__V1__StagedUpsert ups[MAXR], *upp[MAXR];
    Tessera__V1__IndexDatapoint dps[MAXR];
    Tessera__V1__StagedDelete dels[MAXR], *delp[MAXR];
    char ids[MAXR][16];
    float vec[MAXR][TD];
    size_t nups, ndels;
} recs;

typedef struct fixture {
    char *dir;
    tsr__shard s;
    uint8_t *tmpl;
    size_t ntmpl;
    float *x;
} fixture;

static void add_up(recs *r, const fixture *f, int64_t label)
{
    size_t i = r->nups++;
    tessera__v1__staged_upsert__init(&r->ups[i]);
    tessera__v1__index_datapoint__init(&r->dps[i]);
    snprintf(r->ids[i], sizeof r->ids[i], "id%lld", (long long)label);
    memcpy(r->vec[i], f->x + (size_t)label % 100 * TD, sizeof r->vec[i]);
    r->dps[i].datapoint_id = r->ids[i];
    r->dps[i].feature_vector = r->vec[i];
    r->dps[i].n_feature_vector = TD;
    r->ups[i].label = label;
    r->ups[i].list = (int32_t)(label % TNLIST);
    r->ups[i].datapoint = &r->dps[i];
    r->upp[i] = &r->ups[i];
}

static void add_del(recs *r, int64_t label)
{
    size_t i = r->ndels++;
    tessera__v1__staged_delete__init(&r->dels[i]);
    r->dels[i].label = label;
    r->delp[i] = &r->dels[i];
}

static int do_stage(fixture *f, int64_t version, int64_t base, int64_t base_seq, int capture,
                    recs *r, tsr_error *err)
{
    Tessera__V1__StageRequest rq = TESSERA__V1__STAGE_REQUEST__INIT;
    Tessera__V1__StageResponse resp = TESSERA__V1__STAGE_RESPONSE__INIT;
    rq.version = version;
    rq.base_version = base;
    rq.base_stream_seq = base_seq;
    rq.capture_delta = capture;
    if (base == 0) {
        rq.template_faiss.data = f->tmpl;
        rq.template_faiss.len = f->ntmpl;
    }
    rq.upserts = r->upp;
    rq.n_upserts = r->nups;
    rq.deletes = r->delp;
    rq.n_deletes = r->ndels;
    tsr_error_clear(err);
    return tsr__shard_stage(&f->s, &rq, &resp, err);
}

static int do_prepare(fixture *f, int64_t version, tsr_error *err)
{
    Tessera__V1__PrepareResponse pr = TESSERA__V1__PREPARE_RESPONSE__INIT;
    tsr_error_clear(err);
    return tsr__shard_prepare(&f->s, 0, version, 0, &pr, err);
}

/* A Write of r on version at seq, sent as the packed bytes the service logs. */
static int do_write(fixture *f, int64_t version, int64_t seq, recs *r, int64_t *applied,
                    tsr_error *err)
{
    Tessera__V1__ShardWriteRequest rq = TESSERA__V1__SHARD_WRITE_REQUEST__INIT;
    Tessera__V1__ShardWriteResponse resp = TESSERA__V1__SHARD_WRITE_RESPONSE__INIT;
    rq.version = version;
    rq.seq = seq;
    rq.upserts = r->upp;
    rq.n_upserts = r->nups;
    rq.deletes = r->delp;
    rq.n_deletes = r->ndels;
    size_t n = tessera__v1__shard_write_request__get_packed_size(&rq);
    uint8_t *raw = tsr_xmalloc(n + 1);
    tessera__v1__shard_write_request__pack(&rq, raw);
    tsr_error_clear(err);
    int rc = tsr__shard_write(&f->s, raw, n, &rq, &resp, err);
    free(raw);
    if (applied)
        *applied = resp.applied_seq;
    return rc;
}

static void expect(int rc, const tsr_error *err, int code, const char *what)
{
    if (rc != code || strstr(err->msg, what) == NULL)
        fail_msg("expected %d with \"%s\", got %d: %s", code, what, rc, err->msg);
}

/* 1 when label is visible in version `version` (its records with its delta now). */
static int visible(fixture *f, int64_t version, int64_t label)
{
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(&f->s, version, &d);
    assert_non_null(v);
    int vis;
    if (d && tsr__delta_find(d, label, NULL)) {
        vis = 1;
    } else {
        int masked = 0;
        for (size_t i = 0; d && i < d->nmask; i++)
            masked |= d->mask[i] == label;
        vis = !masked && tsr__version_find(v, label) != NULL;
    }
    tsr__delta_unref(d);
    tsr__version_unref(v);
    return vis;
}

static int64_t applied_of(fixture *f, int64_t version)
{
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(&f->s, version, &d);
    assert_non_null(v);
    int64_t a = tsr__applied_seq(v, d);
    tsr__delta_unref(d);
    tsr__version_unref(v);
    return a;
}

static int64_t current_version(fixture *f)
{
    tsr__version *v = tsr__shard_get(&f->s, 0);
    int64_t n = v ? v->version : -1;
    tsr__version_unref(v);
    return n;
}

static int log_exists(fixture *f, int64_t version)
{
    char p[4300];
    struct stat sb;
    snprintf(p, sizeof p, "%s/wal/v%lld.log", f->dir, (long long)version);
    return stat(p, &sb) == 0;
}

static void reopen(fixture *f)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr__shard_close(&f->s);
    if (tsr__shard_open(&f->s, f->dir, &err) != 0)
        fail_msg("reopen: %s", err.msg);
}

/* Version 1 (labels 0..19) committed, then Write seq 1 on it (label 30). */
static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tu_index();
    assert_non_null(ix);
    assert_int_equal(tsr_faiss_write_mem(ix, &f->tmpl, &f->ntmpl, &err), 0);
    tsr_ivfpq_destroy(ix);
    f->x = tu_data(100, 5);
    f->dir = tu_tmpdir();
    assert_non_null(f->dir);
    assert_int_equal(tsr__shard_open(&f->s, f->dir, &err), 0);
    recs *r = tsr_xcalloc(1, sizeof *r);
    for (int64_t l = 0; l < 20 && r->nups < MAXR; l++)
        add_up(r, f, l);
    assert_int_equal(do_stage(f, 1, 0, 0, 0, r, &err), 0);
    assert_int_equal(do_prepare(f, 1, &err), 0);
    assert_int_equal(tsr__shard_commit(&f->s, 0, 1, &err), 0);
    memset(r, 0, sizeof *r);
    add_up(r, f, 30);
    assert_int_equal(do_write(f, 1, 1, r, NULL, &err), 0);
    free(r);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tsr__shard_close(&f->s);
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->tmpl);
    free(f->x);
    free(f);
    return 0;
}

/* Without capture_delta: exactly the behaviour before it. */
static void test_without_capture(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    recs *r = tsr_xcalloc(1, sizeof *r), *w = tsr_xcalloc(1, sizeof *w);
    add_up(r, f, 40);
    assert_int_equal(do_stage(f, 2, 1, 1, 0, r, &err), 0);
    add_up(w, f, 31);
    assert_int_equal(do_write(f, 1, 2, w, NULL, &err), 0);
    expect(do_prepare(f, 2, &err), &err, TSR_ESTATE, "writes arrived after Stage");
    assert_false(log_exists(f, 2));

    /* staged again at the new seq: prepared; Writes wait for its Commit or Abort, and one
     * naming it is refused */
    assert_int_equal(do_stage(f, 2, 1, 2, 0, r, &err), 0);
    assert_int_equal(do_prepare(f, 2, &err), 0);
    assert_false(log_exists(f, 2));
    memset(w, 0, sizeof *w);
    add_up(w, f, 32);
    expect(do_write(f, 1, 3, w, NULL, &err), &err, TSR_ESTATE, "is prepared");
    expect(do_write(f, 2, 3, w, NULL, &err), &err, TSR_ESTATE, "current version is 1");
    assert_int_equal(tsr__shard_commit(&f->s, 0, 2, &err), 0);
    assert_true(visible(f, 2, 31) && visible(f, 2, 40) && !visible(f, 2, 32));
    assert_int_equal(applied_of(f, 2), 2);
    free(r);
    free(w);
}

/* capture_delta: the move's whole sequence on one shard, with restarts. */
static void test_capture_flow(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    int64_t applied = 0;
    recs *r = tsr_xcalloc(1, sizeof *r), *w = tsr_xcalloc(1, sizeof *w);

    /* the seq must still be the applied one at chunk 0 */
    add_up(r, f, 40);
    add_del(r, 2);
    expect(do_stage(f, 2, 1, 0, 1, r, &err), &err, TSR_ESTATE, "applied stream seq is 1");
    assert_int_equal(do_stage(f, 2, 1, 1, 1, r, &err), 0); /* S = 1 */

    /* seq 2 after chunk 0: on version 1, not in the prepared 2 */
    add_up(w, f, 31);
    add_del(w, 3);
    assert_int_equal(do_write(f, 1, 2, w, NULL, &err), 0);
    assert_int_equal(do_prepare(f, 2, &err), 0);
    assert_true(log_exists(f, 2));
    assert_true(visible(f, 2, 30));  /* seq 1, captured */
    assert_true(visible(f, 2, 40));  /* staged */
    assert_false(visible(f, 2, 2));  /* staged delete */
    assert_false(visible(f, 2, 31)); /* seq 2: not yet */
    assert_true(visible(f, 2, 3));
    assert_int_equal(applied_of(f, 2), 1);
    assert_true(visible(f, 1, 31) && !visible(f, 1, 3)); /* the served version has it */

    /* seq 3 on version 1 while 2 is prepared: taken (a catch-up version stops nothing) */
    memset(w, 0, sizeof *w);
    add_up(w, f, 32);
    assert_int_equal(do_write(f, 1, 3, w, &applied, &err), 0);
    assert_int_equal(applied, 3);

    /* the catch-up: seqs 2 and 3 naming version 2; a resend is acknowledged only */
    memset(w, 0, sizeof *w);
    add_up(w, f, 31);
    add_del(w, 3);
    assert_int_equal(do_write(f, 2, 2, w, &applied, &err), 0);
    assert_int_equal(applied, 2);
    assert_int_equal(do_write(f, 2, 2, w, &applied, &err), 0);
    assert_int_equal(applied, 2);
    memset(w, 0, sizeof *w);
    add_up(w, f, 32);
    assert_int_equal(do_write(f, 2, 3, w, &applied, &err), 0);
    assert_int_equal(applied, 3);
    assert_true(visible(f, 2, 31) && visible(f, 2, 32) && !visible(f, 2, 3));
    /* a bad record naming it is refused whole, naming the field */
    memset(w, 0, sizeof *w);
    add_up(w, f, 33);
    w->ups[0].list = TNLIST;
    expect(do_write(f, 2, 4, w, NULL, &err), &err, TSR_EINVAL, "list 4");
    assert_int_equal(applied_of(f, 2), 3);
    /* a version neither current nor a prepared catch-up one */
    expect(do_write(f, 5, 4, w, NULL, &err), &err, TSR_ESTATE, "current version is 1");

    /* a restart keeps both: version 1's log and version 2's catch-up log replayed */
    reopen(f);
    assert_int_equal(current_version(f), 1);
    assert_int_equal(applied_of(f, 1), 3);
    assert_int_equal(applied_of(f, 2), 3);
    assert_true(visible(f, 2, 31) && visible(f, 2, 32) && visible(f, 2, 40));
    assert_false(visible(f, 2, 3) || visible(f, 2, 2));
    memset(w, 0, sizeof *w);
    add_up(w, f, 34);
    assert_int_equal(do_write(f, 1, 4, w, NULL, &err), 0); /* still a catch-up version */
    assert_int_equal(do_write(f, 2, 4, w, NULL, &err), 0);

    /* Commit: version 2 serves its caught-up delta and continues its log */
    assert_int_equal(tsr__shard_commit(&f->s, 0, 2, &err), 0);
    assert_int_equal(current_version(f), 2);
    assert_int_equal(applied_of(f, 2), 4);
    assert_false(log_exists(f, 1));
    expect(do_write(f, 1, 5, w, NULL, &err), &err, TSR_ESTATE, "current version is 2");
    memset(w, 0, sizeof *w);
    add_up(w, f, 35);
    assert_int_equal(do_write(f, 2, 5, w, &applied, &err), 0);
    assert_int_equal(applied, 5);
    reopen(f);
    assert_int_equal(current_version(f), 2);
    assert_int_equal(applied_of(f, 2), 5);
    assert_true(visible(f, 2, 30) && visible(f, 2, 31) && visible(f, 2, 32) &&
                visible(f, 2, 34) && visible(f, 2, 35) && visible(f, 2, 40));
    assert_false(visible(f, 2, 2) || visible(f, 2, 3));
    free(r);
    free(w);
}

/* Abort of a catch-up version: its log goes, Writes naming it are refused. */
static void test_capture_abort(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    recs *r = tsr_xcalloc(1, sizeof *r), *w = tsr_xcalloc(1, sizeof *w);
    add_up(r, f, 40);
    assert_int_equal(do_stage(f, 2, 1, 1, 1, r, &err), 0);
    assert_int_equal(do_prepare(f, 2, &err), 0);
    add_up(w, f, 31);
    assert_int_equal(do_write(f, 2, 2, w, NULL, &err), 0);
    assert_true(log_exists(f, 2));
    assert_int_equal(tsr__shard_abort(&f->s, 0, 2, &err), 0);
    assert_false(log_exists(f, 2));
    expect(do_write(f, 2, 3, w, NULL, &err), &err, TSR_ESTATE, "current version is 1");
    assert_int_equal(do_write(f, 1, 2, w, NULL, &err), 0);
    reopen(f);
    assert_int_equal(current_version(f), 1);
    assert_int_equal(applied_of(f, 1), 2);
    assert_null(tsr__shard_get(&f->s, 2));

    /* a fresh group's catch-up version: an empty base, nothing captured */
    tsr__shard_close(&f->s);
    tu_rmtree(f->dir);
    assert_int_equal(mkdir(f->dir, 0755), 0);
    assert_int_equal(tsr__shard_open(&f->s, f->dir, &err), 0);
    assert_int_equal(do_stage(f, 2, 0, 1, 1, r, &err), 0);
    assert_int_equal(do_prepare(f, 2, &err), 0);
    /* its own lists only (40's list 0, not 31's list 3) */
    expect(do_write(f, 2, 2, w, NULL, &err), &err, TSR_EINVAL, "not a list this shard owns");
    memset(w, 0, sizeof *w);
    add_up(w, f, 44);
    assert_int_equal(do_write(f, 2, 2, w, NULL, &err), 0);
    assert_int_equal(tsr__shard_commit(&f->s, 0, 2, &err), 0);
    assert_true(visible(f, 2, 44) && visible(f, 2, 40));
    assert_int_equal(applied_of(f, 2), 2);
    free(r);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_without_capture, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_flow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_abort, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
