/*
 * test_store_applog — the CRC-framed append log of common/store (store/applog.h), the one
 * the shard's write-ahead log and the coordinator's stream log are made of:
 *   - the format, byte for byte (`u32 len | u32 crc32 | payload`, little endian, the zlib
 *     CRC: "123456789" is cbf43926), so that existing data folders keep loading;
 *   - records round-trip in order with their offsets, across a close and a reopen, and a
 *     scan of a clean log changes nothing; appends continue after a reopen;
 *   - a log cut at every byte offset inside its last record gives the complete records, and
 *     with TSR_APPLOG_CUT is truncated back to them with a line naming the file and offset;
 *   - a flipped payload or CRC byte (CRC mismatch), a length above the limit (refused before
 *     anything that size is allocated), a length past the end, and a record the caller
 *     refuses end the good prefix, naming the offset and why; without TSR_APPLOG_CUT the
 *     file is not touched;
 *   - a callback's stop (TSR_APPLOG_STOP), a hard error (file and offset in the message),
 *     a start offset (past the end: from 0), a missing file (TSR_ENOTFOUND);
 *   - append: above the limit nothing is written (TSR_ELIMIT); a write that fails half way
 *     (RLIMIT_FSIZE) is cut back so the log stays a sequence of whole records;
 *   - tsr_applog_create writes one record atomically.
 * stderr is redirected to a temporary file that the tests read back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/mem.h"
#include "store/applog.h"
#include "store/store.h"

#define NREC 5
#define LIMIT 4096u

static char logpath[] = "/tmp/tsr-test-applog-log-XXXXXX";

typedef struct fixture {
    char dir[64];
    char path[128];
    uint64_t ends[NREC]; /* file size after record i */
} fixture;

typedef struct seen {
    size_t n;
    size_t len[16];
    uint64_t off[16];
    uint8_t first[16];
    int refuse_at; /* record index the callback refuses (-1 = none) */
    int stop_at;   /* record index after which it stops (-1 = none) */
    int fail_at;   /* record index it fails hard on, TSR_EIO (-1 = none) */
} seen;

#define SEEN_INIT {.refuse_at = -1, .stop_at = -1, .fail_at = -1}

static int collect(void *ud, const uint8_t *p, size_t n, uint64_t off, tsr_error *err)
{
    seen *s = ud;
    if ((int)s->n == s->refuse_at)
        return tsr_err(err, TSR_EFORMAT, "not a ShardWriteRequest");
    if ((int)s->n == s->fail_at)
        return tsr_err(err, TSR_EIO, "the disk is gone");
    if (s->n < 16) {
        s->len[s->n] = n;
        s->off[s->n] = off;
        s->first[s->n] = n ? p[0] : 0;
    }
    s->n++;
    return (int)s->n - 1 == s->stop_at ? TSR_APPLOG_STOP : 0;
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
    FILE *f = fopen(logpath, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
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

static uint8_t *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = tsr_xmalloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spill(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static int setup(void **state)
{
    fixture *f = tsr_xcalloc(1, sizeof *f);
    tsr_error err = TSR_ERROR_INIT;
    snprintf(f->dir, sizeof f->dir, "/tmp/tsr-applog-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/v3.log", f->dir);
    tsr_applog l;
    assert_int_equal(tsr_applog_open(&l, f->path, LIMIT, 0, &err), TSR_ENOTFOUND);
    assert_non_null(strstr(err.msg, "v3.log"));
    assert_int_equal(l.fd, -1);
    assert_int_equal(tsr_applog_open(&l, f->path, LIMIT, TSR_APPLOG_CREATE, &err), 0);
    assert_int_equal(l.size, 0);
    for (size_t i = 0; i < NREC; i++) {
        uint8_t b[256];
        size_t n;
        payload(i, b, &n);
        assert_int_equal(tsr_applog_append(&l, b, n, i == 2 ? TSR_APPLOG_SYNC : 0, &err), 0);
        f->ends[i] = l.size;
    }
    assert_int_equal(tsr_applog_sync(&l, &err), 0);
    tsr_applog_close(&l);
    tsr_applog_close(&l); /* twice is fine */
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    free(drain());
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    DIR *d = opendir(f->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char p[400];
        snprintf(p, sizeof p, "%s/%s", f->dir, e->d_name);
        if (e->d_name[0] != '.')
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(f->dir);
    free(f);
    return 0;
}

static int scan(const char *path, uint64_t start, unsigned flags, seen *s, tsr_applog_scan *r,
                tsr_error *err)
{
    return tsr_applog_scan_file(path, start, LIMIT, flags, collect, s, r, err);
}

/* The bytes on disk: the format every existing data folder holds. */
static void test_format(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    char p[200];
    snprintf(p, sizeof p, "%s/fmt.log", f->dir);
    tsr_applog l;
    assert_int_equal(tsr_applog_open(&l, p, LIMIT, TSR_APPLOG_CREATE, &err), 0);
    assert_int_equal(tsr_applog_append(&l, "123456789", 9, 0, &err), 0);
    assert_int_equal(tsr_applog_append(&l, "", 0, 0, &err), 0);
    tsr_applog_close(&l);
    static const uint8_t want[] = {9, 0, 0, 0, 0x26, 0x39, 0xf4, 0xcb, '1', '2', '3', '4', '5',
                                   '6', '7', '8', '9', 0, 0, 0, 0, 0, 0, 0, 0};
    size_t n;
    uint8_t *got = slurp(p, &n);
    assert_int_equal(n, sizeof want);
    assert_memory_equal(got, want, sizeof want);
    free(got);
    /* and read back: the empty payload is a record too */
    seen s = SEEN_INIT;
    tsr_applog_scan r;
    assert_int_equal(scan(p, 0, 0, &s, &r, &err), 0);
    assert_int_equal(r.nrec, 2);
    assert_int_equal(s.len[0], 9);
    assert_int_equal(s.len[1], 0);
    assert_int_equal(r.good, sizeof want);
    assert_string_equal(r.why, "");
    /* create: one record, atomically (no temporary left) */
    char tmp[220];
    snprintf(tmp, sizeof tmp, "%s/.tmp-fmt.log", f->dir);
    assert_int_equal(tsr_applog_create(p, tmp, f->dir, "123456789", 9, &err), 0);
    got = slurp(p, &n);
    assert_int_equal(n, 17);
    assert_memory_equal(got, want, 17);
    free(got);
    assert_int_equal(access(tmp, F_OK), -1);
}

static void test_roundtrip(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    seen s = SEEN_INIT;
    tsr_applog_scan r;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s, &r, &err), 0);
    assert_int_equal(r.nrec, NREC);
    assert_int_equal(s.n, NREC);
    assert_int_equal(r.good, f->ends[NREC - 1]);
    assert_int_equal(r.size, f->ends[NREC - 1]);
    assert_string_equal(r.why, "");
    for (size_t i = 0; i < NREC; i++) {
        size_t n;
        uint8_t b[256];
        payload(i, b, &n);
        assert_int_equal(s.len[i], n);
        assert_int_equal(s.first[i], i + 1);
        assert_int_equal(s.off[i], i ? f->ends[i - 1] : 0);
    }
    /* Idempotent: a clean log is not modified by a scan, a second one sees the same. */
    seen s2 = SEEN_INIT;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s2, &r, &err), 0);
    assert_int_equal(s2.n, NREC);
    assert_memory_equal(s2.off, s.off, sizeof s.off);
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    char *log = drain();
    assert_null(strstr(log, "dropping"));
    free(log);
    /* A missing log: TSR_ENOTFOUND naming it, an empty result. */
    char miss[300];
    snprintf(miss, sizeof miss, "%s/v9.log", f->dir);
    seen s3 = SEEN_INIT;
    assert_int_equal(scan(miss, 0, 0, &s3, &r, &err), TSR_ENOTFOUND);
    assert_non_null(strstr(err.msg, "v9.log"));
    assert_int_equal(r.nrec, 0);
    assert_int_equal(r.good, 0);
    /* Reopened, appends continue after the last record. */
    tsr_applog l;
    assert_int_equal(tsr_applog_open(&l, f->path, LIMIT, 0, &err), 0);
    assert_int_equal(l.size, f->ends[NREC - 1]);
    assert_int_equal(tsr_applog_append(&l, "xyz", 3, TSR_APPLOG_SYNC, &err), 0);
    assert_int_equal(l.size, f->ends[NREC - 1] + 8 + 3);
    tsr_applog_close(&l);
    seen s4 = SEEN_INIT;
    assert_int_equal(scan(f->path, 0, 0, &s4, &r, &err), 0);
    assert_int_equal(r.nrec, NREC + 1);
    assert_int_equal(s4.len[NREC], 3);
    assert_int_equal(s4.off[NREC], f->ends[NREC - 1]);
}

/* start, TSR_APPLOG_STOP and a callback's hard error. */
static void test_scan_control(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr_applog_scan r;
    /* from the end of record 1 */
    seen s = SEEN_INIT;
    assert_int_equal(scan(f->path, f->ends[1], 0, &s, &r, &err), 0);
    assert_int_equal(r.nrec, NREC - 2);
    assert_int_equal(s.off[0], f->ends[1]);
    assert_int_equal(s.first[0], 3);
    /* a start past the end of the file: from 0 */
    seen s2 = SEEN_INIT;
    assert_int_equal(scan(f->path, f->ends[NREC - 1] + 100, 0, &s2, &r, &err), 0);
    assert_int_equal(r.nrec, NREC);
    /* stop after record 1: it counts as good, nothing is wrong */
    seen s3 = SEEN_INIT;
    s3.stop_at = 1;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s3, &r, &err), 0);
    assert_int_equal(r.nrec, 2);
    assert_int_equal(r.good, f->ends[1]);
    assert_string_equal(r.why, "");
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    /* a hard error on record 2: the scan fails naming file and offset, nothing is cut */
    seen s4 = SEEN_INIT;
    s4.fail_at = 2;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s4, &r, &err), TSR_EIO);
    char want[300];
    snprintf(want, sizeof want, "%s: offset %llu: the disk is gone", f->path,
             (unsigned long long)f->ends[1]);
    assert_string_equal(err.msg, want);
    assert_int_equal(fsize(f->path), f->ends[NREC - 1]);
    free(drain());
}

/* The log cut at every byte offset inside its last record (header included). */
static void test_torn_tail_every_offset(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    size_t n = 0;
    uint8_t *whole = slurp(f->path, &n);
    assert_int_equal(n, f->ends[NREC - 1]);
    uint64_t good = f->ends[NREC - 2];
    for (uint64_t cut = good + 1; cut < n; cut++) {
        tsr_applog_scan r;
        /* without CUT: reported, the file untouched */
        spill(f->path, whole, (size_t)cut);
        seen s0 = SEEN_INIT;
        assert_int_equal(scan(f->path, 0, 0, &s0, &r, &err), 0);
        assert_int_equal(r.nrec, NREC - 1);
        assert_int_equal(r.good, good);
        assert_int_equal(fsize(f->path), cut);
        assert_non_null(strstr(r.why, "(torn)"));
        /* with CUT: truncated back to the complete records, logged */
        seen s = SEEN_INIT;
        assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s, &r, &err), 0);
        assert_int_equal(r.nrec, NREC - 1);
        assert_int_equal(r.good, good);
        assert_int_equal(fsize(f->path), good);
        char *log = drain();
        char want[400];
        snprintf(want, sizeof want, "%s: offset %llu: ", f->path, (unsigned long long)good);
        assert_non_null(strstr(log, want));
        assert_non_null(strstr(log, "torn"));
        assert_non_null(strstr(log, "dropping the tail"));
        free(log);
    }
    /* cut exactly at a record boundary: nothing to drop, nothing logged */
    spill(f->path, whole, (size_t)good);
    seen s = SEEN_INIT;
    tsr_applog_scan r;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s, &r, &err), 0);
    assert_int_equal(r.nrec, NREC - 1);
    char *log = drain();
    assert_null(strstr(log, "dropping"));
    free(log);
    free(whole);
}

/* Scans a log whose byte at off was set to x; expects `keep` records and `why`. */
static void corrupt_case(fixture *f, const uint8_t *whole, size_t n, size_t off, uint8_t x,
                         int refuse_at, size_t keep, const char *why)
{
    tsr_error err = TSR_ERROR_INIT;
    uint8_t *b = tsr_xmalloc(n);
    memcpy(b, whole, n);
    b[off] = x;
    spill(f->path, b, n);
    free(b);
    uint64_t good = keep ? f->ends[keep - 1] : 0;
    char want[400];
    snprintf(want, sizeof want, "offset %llu: ", (unsigned long long)good);
    /* without CUT: the good prefix and why, the file untouched */
    seen s0 = SEEN_INIT;
    s0.refuse_at = refuse_at;
    tsr_applog_scan r;
    assert_int_equal(scan(f->path, 0, 0, &s0, &r, &err), 0);
    assert_int_equal(r.nrec, keep);
    assert_int_equal(r.good, good);
    assert_int_equal(strncmp(r.why, want, strlen(want)), 0);
    assert_non_null(strstr(r.why, why));
    assert_int_equal(fsize(f->path), n);
    /* with CUT: truncated, one line naming the file, the offset and why */
    seen s = SEEN_INIT;
    s.refuse_at = refuse_at;
    assert_int_equal(scan(f->path, 0, TSR_APPLOG_CUT, &s, &r, &err), 0);
    assert_int_equal(r.nrec, keep);
    assert_int_equal(fsize(f->path), good);
    char *log = drain();
    snprintf(want, sizeof want, "%s: offset %llu: ", f->path, (unsigned long long)good);
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, why));
    assert_non_null(strstr(log, "dropping the tail"));
    free(log);
}

static void test_corrupt(void **state)
{
    fixture *f = *state;
    size_t n = 0;
    uint8_t *whole = slurp(f->path, &n);
    /* a flipped payload byte of record 2: CRC mismatch, records 2.. dropped */
    size_t off2 = (size_t)f->ends[1];
    corrupt_case(f, whole, n, off2 + 8 + 5, whole[off2 + 8 + 5] ^ 0x40, -1, 2, "CRC-32");
    /* a flipped CRC byte of record 0 */
    corrupt_case(f, whole, n, 4, whole[4] ^ 1, -1, 0, "CRC-32");
    /* a hostile length (top byte of record 3's length: ~2 GiB): above the limit, refused
     * from the header alone, before anything of that size is allocated */
    size_t off3 = (size_t)f->ends[2];
    corrupt_case(f, whole, n, off3 + 3, 0x7f, -1, 3, "above the limit 4096");
    /* a length under the limit but past the end of the file */
    corrupt_case(f, whole, n, off3 + 1, 0x0f, -1, 3, "past the end of the file");
    /* a record the caller refuses (unparsable): it and the rest are dropped */
    corrupt_case(f, whole, n, 0, whole[0], 1, 1, "record refused (not a ShardWriteRequest)");
    free(whole);
}

/* Append: the limit; a write failing half way is cut back to whole records. */
static void test_append_failure(void **state)
{
    fixture *f = *state;
    tsr_error err = TSR_ERROR_INIT;
    tsr_applog l;
    assert_int_equal(tsr_applog_open(&l, f->path, LIMIT, 0, &err), 0);
    uint64_t before = l.size;
    uint8_t *big = tsr_xcalloc(LIMIT + 1, 1);
    assert_int_equal(tsr_applog_append(&l, big, LIMIT + 1, 0, &err), TSR_ELIMIT);
    assert_non_null(strstr(err.msg, "v3.log"));
    assert_int_equal(l.size, before);
    assert_int_equal(fsize(f->path), before);
    /* RLIMIT_FSIZE 100 bytes above the end: writev writes part of the record, then EFBIG */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)before + 100;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = tsr_applog_append(&l, big, 1000, TSR_APPLOG_SYNC, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    assert_int_equal(rc, TSR_EIO);
    assert_non_null(strstr(err.msg, "v3.log"));
    assert_int_equal(l.size, before);
    assert_int_equal(fsize(f->path), before);
    /* the log goes on: the next append and a scan see whole records only */
    assert_int_equal(tsr_applog_append(&l, big, 1000, 0, &err), 0);
    tsr_applog_close(&l);
    /* appending to a closed log */
    assert_int_equal(tsr_applog_append(&l, big, 1, 0, &err), TSR_ESTATE);
    free(big);
    seen s = SEEN_INIT;
    tsr_applog_scan r;
    assert_int_equal(scan(f->path, 0, 0, &s, &r, &err), 0);
    assert_int_equal(r.nrec, NREC + 1);
    assert_string_equal(r.why, "");
    assert_int_equal(s.len[NREC], 1000);
}

int main(void)
{
    int fd = mkstemp(logpath);
    if (fd < 0)
        return 1;
    close(fd);
    if (freopen(logpath, "w", stderr) == NULL)
        return 1;
    tsr_log_set_program("test_store_applog");
    unsetenv("TSR_LOG_LEVEL");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_control, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_tail_every_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_failure, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(logpath);
    return rc;
}
