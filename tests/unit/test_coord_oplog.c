/*
 * test_coord_oplog — the coordinator's operation records (coordinator/oplog.c) without a
 * server: a record written and replayed into a fresh operations table keeps every field;
 * interrupted operations resolve by CURRENT (target reached: SUCCEEDED, else FAILED with
 * the reason), and the resolution is written back; a torn record (a file cut short, as a
 * crash in the middle of a non-atomic write would leave it), a foreign file, a record
 * under the wrong name are skipped with the rest loaded; only the newest TSR__OP_MAX_KEPT
 * come back and new operation ids continue after the highest one seen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "coord.h"
#include "coord_test_util.h"
#include "core/mem.h"

static char dir[512];

static void coord_open(tsr__coord *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->op_mu, NULL);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_store_create(dir, &c->store, &err), 0);
}

static void coord_close(tsr__coord *c)
{
    tsr__coord_ops_close(c);
    tsr_store_destroy(c->store);
    pthread_mutex_destroy(&c->op_mu);
}

static tsr__op *new_op(unsigned seq, int state, int64_t start_ms)
{
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-%u-%u", seq, 1000 + seq);
    op->state = state;
    op->start_ms = start_ms;
    op->files_total = 3;
    op->files_read = 2;
    op->records_read = 77;
    op->shards_total = 4;
    op->shards_staged = 4;
    op->batch_root = tsr_xstrdup("/batch");
    return op;
}

static tsr__op *find(tsr__coord *c, const char *id)
{
    for (size_t i = 0; i < c->nops; i++)
        if (strcmp(c->ops[i]->id, id) == 0)
            return c->ops[i];
    return NULL;
}

static void save(tsr__coord *c, tsr__op *op)
{
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr__oplog_save(c, op, 0, 0, &err), 0);
}

static int setup(void **state)
{
    (void)state;
    coord_test_tmpdir(dir, sizeof dir, "tsr-coord-oplog");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    coord_test_rmtree(dir);
    return 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    tsr__op *op = new_op(5, TESSERA__V1__OPERATION__STATE__SUCCEEDED, 111);
    op->version = 9;
    op->end_ms = 222;
    op->error = tsr_xstrdup("");
    op->report_json = tsr_xstrdup("{\"valid_records\":77}");
    op->warnings = tsr_xcalloc(2, sizeof *op->warnings);
    op->warnings[op->nwarnings++] = tsr_xstrdup("shard 1 replica 0 left out");
    op->warnings[op->nwarnings++] = tsr_xstrdup("second");
    save(&c, op);
    tsr__op_free(op);
    coord_close(&c);

    coord_open(&c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr__oplog_load(&c, 9, &err), 0);
    assert_int_equal(c.nops, 1);
    tsr__op *r = find(&c, "op-5-1005");
    assert_non_null(r);
    assert_int_equal(r->state, TESSERA__V1__OPERATION__STATE__SUCCEEDED);
    assert_int_equal(r->version, 9);
    assert_int_equal(r->start_ms, 111);
    assert_int_equal(r->end_ms, 222);
    assert_int_equal(r->files_total, 3);
    assert_int_equal(r->records_read, 77);
    assert_int_equal(r->shards_total, 4);
    assert_string_equal(r->report_json, "{\"valid_records\":77}");
    assert_int_equal(r->nwarnings, 2);
    assert_string_equal(r->warnings[0], "shard 1 replica 0 left out");
    assert_int_equal(c.op_seq, 5); /* the next id is op-6-... */
    coord_close(&c);
}

static void test_interrupted(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    tsr__op *past = new_op(1, TESSERA__V1__OPERATION__STATE__COMMITTING, 10);
    past->target = 2;
    tsr__op *before = new_op(2, TESSERA__V1__OPERATION__STATE__PREPARING, 20);
    before->target = 3;
    tsr__op *pending = new_op(3, TESSERA__V1__OPERATION__STATE__PENDING, 30);
    save(&c, past);
    save(&c, before);
    save(&c, pending);
    tsr__op_free(past);
    tsr__op_free(before);
    tsr__op_free(pending);
    coord_close(&c);

    for (int round = 0; round < 2; round++) { /* the resolution is written back */
        coord_open(&c);
        tsr_error err = TSR_ERROR_INIT;
        assert_int_equal(tsr__oplog_load(&c, round == 0 ? 2 : 7, &err), 0);
        assert_int_equal(c.nops, 3);
        assert_string_equal(c.ops[0]->id, "op-1-1001"); /* by start time */
        assert_int_equal(c.ops[0]->state, TESSERA__V1__OPERATION__STATE__SUCCEEDED);
        assert_int_equal(c.ops[0]->version, 2);
        assert_int_equal(c.ops[1]->state, TESSERA__V1__OPERATION__STATE__FAILED);
        assert_int_equal(c.ops[1]->version, 0);
        assert_non_null(strstr(c.ops[1]->error, "before its commit point"));
        assert_int_equal(c.ops[2]->state, TESSERA__V1__OPERATION__STATE__FAILED);
        assert_true(c.ops[2]->end_ms > 0);
        coord_close(&c);
    }
}

static void write_file(const char *name, const void *buf, size_t len)
{
    char p[700];
    snprintf(p, sizeof p, "%s/operations/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

static void test_torn_and_foreign(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    tsr__op *a = new_op(1, TESSERA__V1__OPERATION__STATE__SUCCEEDED, 10);
    tsr__op *b = new_op(2, TESSERA__V1__OPERATION__STATE__FAILED, 20);
    b->error = tsr_xstrdup("a long enough error message to make the record worth cutting");
    save(&c, a);
    save(&c, b);
    coord_close(&c);
    /* torn tail: b's record cut in the middle of its last field */
    char p[700];
    snprintf(p, sizeof p, "%s/operations/op-2-1002.pb", dir);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 10), 0);
    write_file("junk.pb", "\xff\xff\xff\xff\xff", 5);
    write_file("notes.txt", "hello", 5);
    /* a's record under another operation's name */
    snprintf(p, sizeof p, "%s/operations/op-1-1001.pb", dir);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_file("op-9-1009.pb", buf, n);

    coord_open(&c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr__oplog_load(&c, 0, &err), 0);
    assert_int_equal(c.nops, 1);
    assert_non_null(find(&c, "op-1-1001"));
    assert_null(find(&c, "op-2-1002"));
    /* unreadable records are left on disk (not ours to delete) */
    snprintf(p, sizeof p, "%s/operations/op-2-1002.pb", dir);
    assert_int_equal(access(p, F_OK), 0);
    coord_close(&c);
    tsr__op_free(a);
    tsr__op_free(b);
}

static void test_keeps_newest(void **state)
{
    (void)state;
    tsr__coord c;
    coord_open(&c);
    unsigned total = TSR__OP_MAX_KEPT + 5;
    for (unsigned i = 1; i <= total; i++) {
        tsr__op *op = new_op(i, TESSERA__V1__OPERATION__STATE__SUCCEEDED, (int64_t)i * 10);
        save(&c, op);
        tsr__op_free(op);
    }
    coord_close(&c);
    coord_open(&c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr__oplog_load(&c, 1, &err), 0);
    assert_int_equal(c.nops, TSR__OP_MAX_KEPT);
    assert_null(find(&c, "op-5-1005")); /* the oldest are forgotten, on disk too */
    assert_non_null(find(&c, "op-6-1006"));
    assert_int_equal(c.op_seq, total);
    char p[700];
    snprintf(p, sizeof p, "%s/operations/op-1-1001.pb", dir);
    assert_int_not_equal(access(p, F_OK), 0);
    coord_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_and_foreign, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keeps_newest, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
