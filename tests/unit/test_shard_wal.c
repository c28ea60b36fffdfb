/*
 * test_shard_wal — the shard's write-ahead log (shard/wal.c): records round-trip in order
 * with their offsets; a log cut at every byte offset inside its last record replays the
 * complete records and is truncated back to them; a flipped byte (CRC mismatch), a length
 * above the limit and a record the caller refuses each drop the tail from that record,
 * with a log line naming the file, the offset and why; a replay of a clean log changes
 * nothing (replaying twice gives the same records), and appends continue after a replay.
 * stderr is redirected to a temporary file that the tests read back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/log.h"
#include "shard_test_util.h"

#define NREC 5

static char logpath[] = "/tmp/tsr-test-wal-log-XXXXXX";

typedef struct fixture {
    char *dir;
    char path[4200];
    uint64_t ends[NREC]; /* file size after record i */
} fixture;

typedef struct seen {
    size_t n;
    size_t len[16];
    uint64_t off[16];
    uint8_t first[16];
    int refuse_at; /* record index the callback refuses (-1 = none) */
} seen;

static int collect(void *ctx, const uint8_t *p, size_t n, uint64_t off, tsr_error *err)
{
    seen *s = ctx;
    if ((int)s->n == s->refuse_at)
        return tsr_err(err, TSR_EFORMAT, "not a ShardWriteRequest");
    if (s->n < 16) {
        s->len[s->n] = n;
        s->off[s->n] = off;
        s->first[s->n] = n ? p[0] : 0;
    }
    s->n++;
    return 0;
}

/* Record i: 10 + 37 * i bytes of value i + 1 (record 0 is short, record 4 longer). */
static void payload(size_t i, uint8_t *b, size_t *n)
{
    *n = 10 + 37 * i;
    memset(b, (int)(i + 1), *n);
}

static char *drain(void)
{
    fflush(stderr);
    size_t n = 0;
    FILE *f = fopen(logpath, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = tsr_xcalloc(n + 1, 1);
    assert_int_equal(fread(s, 1, n, f), n);
    fclose(f);
    assert_non_null(freopen(logpath, "w", stderr));
    return s;
}

static uint64_t fsize(const char *p)
{
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    return (uint64_t)st.st_size;
}

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    f->dir = tu_tmpdir();
    assert_non_null(f->dir);
    snprintf(f->path, sizeof f->path, "%s/v3.log", f->dir);
    tsr__wal w;
    assert_int_equal(tsr__wal_open(&w, f->path, &err), 0);
    for (size_t i = 0; i < NREC; i++) {
        uint8_t b[256];
        size_t n;
        payload(i, b, &n);
        assert_int_equal(tsr__wal_append(&w, b, n, &err), 0);
        f->ends[i] = w.size;
    }
    assert_int_equal(tsr__wal_sync_fd(w.fd, w.path, &err), 0);
    tsr__wal_close(&w);
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    free(drain());
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static void test_roundtrip(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    seen s = {.refuse_at = -1};
    uint64_t nrec, size;
    assert_int_equal(tsr__wal_replay(f->path, collect, &s, &nrec, &size, &err), 0);
    assert_int_equal(nrec, NREC);
    assert_int_equal(s.n, NREC);
    assert_int_equal(size, f->ends[NREC - 1]);
    for (size_t i = 0; i < NREC; i++) {
        size_t n;
        uint8_t b[256];
        payload(i, b, &n);
        assert_int_equal(s.len[i], n);
        assert_int_equal(s.first[i], i + 1);
        assert_int_equal(s.off[i], i ? f->ends[i - 1] : 0);
    }
    /* Idempotent: a clean log is not modified by a replay, a second one sees the same. */
    seen s2 = {.refuse_at = -1};
    assert_int_equal(tsr__wal_replay(f->path, collect, &s2, &nrec, &size, &err), 0);
    assert_int_equal(s2.n, NREC);
    assert_memory_equal(s2.off, s.off, sizeof s.off);
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    char *log = drain();
    assert_null(strstr(log, "dropping"));
    free(log);
    /* A missing log is an empty one. */
    char miss[4300];
    snprintf(miss, sizeof miss, "%s/v9.log", f->dir);
    assert_int_equal(tsr__wal_replay(miss, collect, &s2, &nrec, &size, &err), 0);
    assert_int_equal(nrec, 0);
    /* Appends continue after a replay. */
    tsr__wal w;
    assert_int_equal(tsr__wal_open(&w, f->path, &err), 0);
    assert_int_equal(w.size, f->ends[NREC - 1]);
    assert_int_equal(tsr__wal_append(&w, (const uint8_t *)"xyz", 3, &err), 0);
    tsr__wal_close(&w);
    seen s3 = {.refuse_at = -1};
    assert_int_equal(tsr__wal_replay(f->path, collect, &s3, &nrec, &size, &err), 0);
    assert_int_equal(nrec, NREC + 1);
    assert_int_equal(s3.len[NREC], 3);
}

/* The log cut at every byte offset inside its last record (header included). */
static void test_torn_tail_every_offset(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    size_t n = 0;
    uint8_t *whole = tu_read(f->dir, "v3.log", &n);
    assert_int_equal(n, f->ends[NREC - 1]);
    uint64_t good = f->ends[NREC - 2];
    for (uint64_t cut = good + 1; cut < n; cut++) {
        tu_write(f->dir, "v3.log", whole, (size_t)cut);
        seen s = {.refuse_at = -1};
        uint64_t nrec, size;
        assert_int_equal(tsr__wal_replay(f->path, collect, &s, &nrec, &size, &err), 0);
        assert_int_equal(nrec, NREC - 1);
        assert_int_equal(size, good);
        assert_int_equal(fsize(f->path), good);
        char *log = drain();
        char want[4400];
        snprintf(want, sizeof want, "v3.log: offset %llu: ", (unsigned long long)good);
        assert_non_null(strstr(log, want));
        assert_non_null(strstr(log, "torn"));
        assert_non_null(strstr(log, "dropping the tail"));
        free(log);
    }
    /* cut exactly at a record boundary: nothing to drop, nothing logged */
    tu_write(f->dir, "v3.log", whole, (size_t)good);
    seen s = {.refuse_at = -1};
    uint64_t nrec, size;
    assert_int_equal(tsr__wal_replay(f->path, collect, &s, &nrec, &size, &err), 0);
    assert_int_equal(nrec, NREC - 1);
    char *log = drain();
    assert_null(strstr(log, "dropping"));
    free(log);
    free(whole);
}

/* Replays a log whose bytes were changed at off (value x); expects `keep` records. */
static void corrupt_case(fixture *f, const uint8_t *whole, size_t n, size_t off, uint8_t x,
                         int refuse_at, size_t keep, const char *why)
{
    tsr_error err = TSR_ERROR_INIT;
    uint8_t *b = tsr_xmalloc(n);
    memcpy(b, whole, n);
    b[off] = x;
    tu_write(f->dir, "v3.log", b, n);
    free(b);
    seen s = {.refuse_at = refuse_at};
    uint64_t nrec, size;
    assert_int_equal(tsr__wal_replay(f->path, collect, &s, &nrec, &size, &err), 0);
    assert_int_equal(nrec, keep);
    uint64_t good = keep ? f->ends[keep - 1] : 0;
    assert_int_equal(size, good);
    assert_int_equal(fsize(f->path), good);
    char *log = drain();
    char want[4400];
    snprintf(want, sizeof want, "v3.log: offset %llu: ", (unsigned long long)good);
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, why));
    free(log);
}

static void test_corrupt(void **state)
{
    fixture *f = *state;
    size_t n = 0;
    uint8_t *whole = tu_read(f->dir, "v3.log", &n);
    /* a flipped payload byte of record 2: CRC mismatch, records 2.. dropped */
    size_t off2 = (size_t)f->ends[1];
    corrupt_case(f, whole, n, off2 + 8 + 5, whole[off2 + 8 + 5] ^ 0x40, -1, 2, "CRC-32");
    /* a flipped CRC byte of record 0 */
    corrupt_case(f, whole, n, 4, whole[4] ^ 1, -1, 0, "CRC-32");
    /* a length above the limit (the top byte of record 3's length): refused before any
     * allocation of that size */
    size_t off3 = (size_t)f->ends[2];
    corrupt_case(f, whole, n, off3 + 3, 0x7f, -1, 3, "above the limit");
    /* a record the caller refuses (unparsable): it and the rest are dropped */
    corrupt_case(f, whole, n, 0, whole[0], 1, 1, "record refused (not a ShardWriteRequest)");
    free(whole);
}

int main(void)
{
    int fd = mkstemp(logpath);
    if (fd < 0)
        return 1;
    close(fd);
    if (freopen(logpath, "w", stderr) == NULL)
        return 1;
    tsr_log_set_program("test_shard_wal");
    unsetenv("TSR_LOG_LEVEL");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_tail_every_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(logpath);
    return rc;
}
