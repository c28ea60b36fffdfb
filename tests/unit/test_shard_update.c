/*
 * test_shard_update — the shard's two-phase update (shard/update.c) without RPC: Stage
 * requests are built as the unpacked protobuf structs the handler passes on. Refusals
 * (version and chunk numbers, a missing or bad template, a base the shard lacks, every
 * invalid field of a chunk) leave the staging as it was; the retry of the last chunk is
 * acknowledged, not applied twice; Stage -> Prepare -> Commit serves the new version,
 * Abort drops a prepared one, and a reopened shard serves what CURRENT says; each of
 * them refuses an older leader term than the highest seen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "index/faiss_io.h"
#include "shard_test_util.h"

/* One Stage request with its owned parts (the protobuf structs, filled by hand). */
typedef struct stage {
    Tessera__V1__StageRequest rq;
    Tessera__V1__StagedUpsert ups[64], *upp[64];
    Tessera__V1__IndexDatapoint dps[64];
    Tessera__V1__StagedDelete dels[16], *delp[16];
    char ids[64][16];
    float vec[64][TD];
} stage;

typedef struct fixture {
    char *dir;
    tsr__shard s;
    uint8_t *tmpl; /* template.faiss bytes */
    size_t ntmpl;
    float *x;
} fixture;

static void stage_init(stage *st, int64_t version, int64_t base, int32_t chunk)
{
    memset(st, 0, sizeof *st);
    tessera__v1__stage_request__init(&st->rq);
    st->rq.version = version;
    st->rq.base_version = base;
    st->rq.chunk = chunk;
    st->rq.upserts = st->upp;
    st->rq.deletes = st->delp;
}

static void stage_upsert(stage *st, const fixture *f, int64_t label, int32_t list)
{
    size_t i = st->rq.n_upserts++;
    Tessera__V1__StagedUpsert *u = &st->ups[i];
    Tessera__V1__IndexDatapoint *dp = &st->dps[i];
    tessera__v1__staged_upsert__init(u);
    tessera__v1__index_datapoint__init(dp);
    snprintf(st->ids[i], sizeof st->ids[i], "id%lld", (long long)label);
    memcpy(st->vec[i], f->x + (size_t)label % 100 * TD, sizeof st->vec[i]);
    dp->datapoint_id = st->ids[i];
    dp->feature_vector = st->vec[i];
    dp->n_feature_vector = TD;
    u->label = label;
    u->list = list;
    u->datapoint = dp;
    st->upp[i] = u;
}

static void stage_delete(stage *st, int64_t label)
{
    size_t i = st->rq.n_deletes++;
    tessera__v1__staged_delete__init(&st->dels[i]);
    st->dels[i].label = label;
    st->delp[i] = &st->dels[i];
}

static int do_stage(fixture *f, stage *st, Tessera__V1__StageResponse *resp, tsr_error *err)
{
    tessera__v1__stage_response__init(resp);
    tsr_error_clear(err);
    return tsr__shard_stage(&f->s, &st->rq, resp, err);
}

static int64_t current_version(fixture *f)
{
    tsr__version *v = tsr__shard_get(&f->s, 0);
    int64_t n = v ? v->version : -1;
    tsr__version_unref(v);
    return n;
}

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

/* Version 1 on the empty base: chunk 0 with the template and `n` upserts. */
static void stage_v1(fixture *f, stage *st, size_t n)
{
    stage_init(st, 1, 0, 0);
    st->rq.template_faiss.data = f->tmpl;
    st->rq.template_faiss.len = f->ntmpl;
    for (size_t i = 0; i < n; i++)
        stage_upsert(st, f, (int64_t)i, (int32_t)(i % TNLIST));
}

static void expect(int rc, const tsr_error *err, int code, const char *what)
{
    if (rc != code || strstr(err->msg, what) == NULL)
        fail_msg("expected %d with \"%s\", got %d: %s", code, what, rc, err->msg);
}

static void test_stage_refuses(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__StageResponse resp;
    stage *st = tsr_xcalloc(1, sizeof *st);
    assert_int_equal(current_version(f), 0); /* a new data dir serves the empty version */

    stage_init(st, 0, 0, 0);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "version 0: must be > 0");
    stage_init(st, 1, 0, -1);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "chunk -1");
    stage_init(st, 1, 0, 1);
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "without chunk 0");
    stage_init(st, 1, 0, 0); /* empty base, no template */
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "no template_faiss");
    stage_init(st, 1, 0, 0);
    uint8_t junk[16] = "not a faiss file";
    st->rq.template_faiss.data = junk;
    st->rq.template_faiss.len = sizeof junk;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "template_faiss");
    stage_init(st, 2, 1, 0); /* a base the shard does not have */
    st->rq.template_faiss.data = f->tmpl;
    st->rq.template_faiss.len = f->ntmpl;
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "base_version 1");
    assert_int_equal(atomic_load(&f->s.staging_version), 0);
    assert_null(f->s.staging);
    free(st);
}

static void test_stage_chunks(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__StageResponse resp;
    stage *st = tsr_xcalloc(1, sizeof *st);
    stage_v1(f, st, 8);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    assert_int_equal(resp.version, 1);
    assert_int_equal(resp.chunks_received, 1);
    assert_int_equal(resp.upserts, 8);
    assert_int_equal(atomic_load(&f->s.staging_version), 1);

    /* invalid chunks 1: refused whole, nothing applied */
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, 0);
    st->ups[0].label = -1;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "upserts[0].label -1");
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, 0);
    stage_upsert(st, f, 101, TNLIST);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "upserts[1].list 4");
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, 0);
    st->ups[0].datapoint = NULL;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "datapoint: missing");
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, 0);
    st->dps[0].n_feature_vector = TD - 1;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "index dimension is 8");
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, -1);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "sparse-only");
    stage_init(st, 1, 0, 1);
    stage_delete(st, -5);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "deletes[0].label -5");
    stage_init(st, 1, 0, 1);
    int32_t badl = 99;
    st->rq.drop_lists = &badl;
    st->rq.n_drop_lists = 1;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "drop_lists[0] 99");
    stage_init(st, 1, 0, 1);
    st->rq.own_lists = &badl;
    st->rq.n_own_lists = 1;
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "own_lists[0] 99");
    stage_init(st, 1, 0, 2);
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "expected chunk 1");
    stage_init(st, 1, 7, 1);
    expect(do_stage(f, st, &resp, &err), &err, TSR_EINVAL, "differs from chunk 0");

    /* a valid chunk 1, then its retry: acknowledged, not applied twice */
    stage_init(st, 1, 0, 1);
    stage_upsert(st, f, 100, 1);
    stage_delete(st, 3);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    assert_int_equal(resp.chunks_received, 2);
    assert_int_equal(resp.upserts, 9);
    assert_int_equal(resp.deletes, 1);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    assert_int_equal(resp.chunks_received, 2);
    assert_int_equal(resp.upserts, 9);

    /* a new chunk 0 replaces the unfinished staging */
    stage_v1(f, st, 2);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    assert_int_equal(resp.chunks_received, 1);
    assert_int_equal(resp.upserts, 2);
    assert_int_equal(tsr__shard_abort(&f->s, 0, 1, &err), 0);
    assert_int_equal(atomic_load(&f->s.staging_version), 0);
    free(st);
}

static void test_update_flow(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__StageResponse resp;
    Tessera__V1__PrepareResponse pr;
    stage *st = tsr_xcalloc(1, sizeof *st);

    stage_v1(f, st, 20);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    tessera__v1__prepare_response__init(&pr);
    assert_int_equal(tsr__shard_prepare(&f->s, 0, 1, 0, &pr, &err), 0);
    assert_true(pr.ready);
    assert_int_equal(pr.vectors_count, 20);
    assert_int_equal(current_version(f), 0); /* prepared, not yet serving */
    assert_int_equal(tsr__shard_commit(&f->s, 0, 1, &err), 0);
    assert_int_equal(current_version(f), 1);
    assert_int_equal(tsr__shard_commit(&f->s, 0, 1, &err), 0); /* idempotent */

    /* a version at or below the current one cannot be staged */
    stage_v1(f, st, 1);
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "already has");

    /* version 2 on 1: one delete, one new label; prepared then aborted */
    stage_init(st, 2, 1, 0);
    stage_delete(st, 4);
    stage_upsert(st, f, 50, 2);
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    tessera__v1__prepare_response__init(&pr);
    assert_int_equal(tsr__shard_prepare(&f->s, 0, 2, 0, &pr, &err), 0);
    assert_int_equal(pr.vectors_count, 20);
    tsr__version *v2 = tsr__shard_get(&f->s, 2); /* a prepared version can be queried */
    assert_non_null(v2);
    assert_null(tsr__version_find(v2, 4));
    assert_non_null(tsr__version_find(v2, 50));
    tsr__version_unref(v2);
    assert_int_equal(tsr__shard_abort(&f->s, 0, 2, &err), 0);
    assert_null(tsr__shard_get(&f->s, 2));
    tsr_error_clear(&err);
    assert_int_equal(tsr__shard_commit(&f->s, 0, 2, &err), TSR_ESTATE);
    expect(tsr__shard_abort(&f->s, 0, 1, &err), &err, TSR_ESTATE, "current version");

    /* again, committed this time; then release the old one */
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    tessera__v1__prepare_response__init(&pr);
    assert_int_equal(tsr__shard_prepare(&f->s, 0, 2, 0, &pr, &err), 0);
    assert_int_equal(tsr__shard_commit(&f->s, 0, 2, &err), 0);
    assert_int_equal(current_version(f), 2);
    tsr__version *v1 = tsr__shard_get(&f->s, 1); /* still held until released */
    assert_non_null(v1);
    assert_non_null(tsr__version_find(v1, 4));
    int64_t held[TSR__HELD_CAP];
    size_t nh = 0;
    assert_int_equal(tsr__shard_release(&f->s, 0, 2, held, TSR__HELD_CAP, &nh, &err), 0);
    assert_null(tsr__shard_get(&f->s, 1));
    assert_non_null(tsr__version_find(v1, 4)); /* a reference taken before stays valid */
    tsr__version_unref(v1);

    /* a reopened shard serves CURRENT from disk */
    tsr__shard_close(&f->s);
    assert_int_equal(tsr__shard_open(&f->s, f->dir, &err), 0);
    assert_int_equal(current_version(f), 2);
    tsr__version *v = tsr__shard_get(&f->s, 0);
    assert_int_equal(v->nrecs, 20);
    assert_null(tsr__version_find(v, 4));
    assert_non_null(tsr__version_find(v, 50));
    tsr__version_unref(v);
    free(st);
}

/* Each of Stage, Prepare, Commit, Abort and Release checks the sender's term itself (under
 * update_mu, shard.h): an older term than the highest seen is refused and changes nothing;
 * term 0 is never checked. */
static void test_terms(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    Tessera__V1__StageResponse resp;
    Tessera__V1__PrepareResponse pr;
    int64_t held[TSR__HELD_CAP];
    size_t nh = 0;
    stage *st = tsr_xcalloc(1, sizeof *st);

    stage_v1(f, st, 10);
    st->rq.leader_term = 7;
    assert_int_equal(do_stage(f, st, &resp, &err), 0); /* term 7 seen */
    tessera__v1__prepare_response__init(&pr);
    expect(tsr__shard_prepare(&f->s, 6, 1, 0, &pr, &err), &err, TSR_ESTATE,
           "leader term 6 is older than 7");
    assert_false(pr.ready);
    expect(tsr__shard_abort(&f->s, 6, 1, &err), &err, TSR_ESTATE, "older than 7");
    assert_int_equal(atomic_load(&f->s.staging_version), 1); /* not aborted */
    tessera__v1__prepare_response__init(&pr);
    assert_int_equal(tsr__shard_prepare(&f->s, 7, 1, 0, &pr, &err), 0);
    assert_true(pr.ready);
    expect(tsr__shard_commit(&f->s, 5, 1, &err), &err, TSR_ESTATE, "older than 7");
    assert_int_equal(current_version(f), 0); /* not committed */
    assert_int_equal(tsr__shard_commit(&f->s, 9, 1, &err), 0); /* a newer term: 9 seen */
    assert_int_equal(current_version(f), 1);
    expect(tsr__shard_release(&f->s, 8, 1, held, TSR__HELD_CAP, &nh, &err), &err, TSR_ESTATE,
           "leader term 8 is older than 9");
    stage_init(st, 2, 1, 0);
    stage_upsert(st, f, 50, 2);
    st->rq.leader_term = 8;
    expect(do_stage(f, st, &resp, &err), &err, TSR_ESTATE, "older than 9");
    assert_int_equal(atomic_load(&f->s.staging_version), 0); /* nothing staged */
    st->rq.leader_term = 0; /* no term (the local backend): never checked */
    assert_int_equal(do_stage(f, st, &resp, &err), 0);
    assert_int_equal(tsr__shard_abort(&f->s, 0, 2, &err), 0);
    assert_int_equal(tsr__shard_release(&f->s, 9, 1, held, TSR__HELD_CAP, &nh, &err), 0);
    free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stage_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_update_flow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_terms, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
