/*
 * fuzz_store_applog — the CRC-framed append log of common/store (store/applog.c: the
 * format the shard's write-ahead log and the coordinator's stream log share) scanned from
 * random bytes. Input: one byte of settings (bits 0-2: the record limit, 16 << k bytes;
 * bit 3: records whose payload starts with 0xff are refused by the callback), then the
 * file's bytes.
 *
 * Checks: no crash (ASan/UBSan; a hostile length is refused before any allocation of that
 * size, so no input makes it allocate more than the limit); every record given to the
 * callback sits right after the previous one, within the file and the limit, and its
 * header's CRC is zlib's crc32 of its payload (checked here independently); a scan without
 * TSR_APPLOG_CUT leaves the file as it was; one with it gives the same records and cuts
 * the file exactly at the good prefix, after which a scan finds nothing wrong and the same
 * records; an append after that is read back as one more record.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz_tmp.h"
#include "store/applog.h"

static char *dir;
static char path[600];

typedef struct walk {
    const uint8_t *file; /* the input's file bytes (NULL: not checked against) */
    size_t size;
    uint32_t limit;
    int refuse_ff;
    uint64_t next, nrec;
} walk;

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int on_record(void *ud, const uint8_t *rec, size_t len, uint64_t off, tsr_error *err)
{
    walk *w = ud;
    if (off != w->next || len > w->limit || off + 8 + len > w->size) {
        fprintf(stderr, "record at %llu of %zu bytes: expected at %llu, within %zu bytes\n",
                (unsigned long long)off, len, (unsigned long long)w->next, w->size);
        abort();
    }
    if (w->file && (get32(w->file + off) != len ||
                    get32(w->file + off + 4) != (uint32_t)crc32(0, rec, (uInt)len))) {
        fprintf(stderr, "record at %llu: header does not describe its payload\n",
                (unsigned long long)off);
        abort();
    }
    if (w->refuse_ff && len && rec[0] == 0xff)
        return tsr_err(err, TSR_EFORMAT, "refused");
    w->next = off + 8 + len;
    w->nrec++;
    return 0;
}

static uint64_t file_size(void)
{
    struct stat st;
    if (stat(path, &st) != 0)
        abort();
    return (uint64_t)st.st_size;
}

static void scan(walk *w, unsigned flags, tsr_applog_scan *r)
{
    tsr_error err = TSR_ERROR_INIT;
    w->next = 0, w->nrec = 0;
    if (tsr_applog_scan_file(path, 0, w->limit, flags, on_record, w, r, &err) != 0) {
        fprintf(stderr, "scan failed: %s\n", err.msg);
        abort();
    }
    if (r->nrec != w->nrec || r->good != w->next || r->good > r->size ||
        (r->good < r->size) != (r->why[0] != 0)) {
        fprintf(stderr, "scan result: %llu records, good %llu of %llu, why '%s'\n",
                (unsigned long long)r->nrec, (unsigned long long)r->good,
                (unsigned long long)r->size, r->why);
        abort();
    }
}

static void down(void)
{
    unlink(path);
    if (dir)
        rmdir(dir);
    free(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmp_default();
    dir = fuzz_tmpdir("fuzz-applog");
    snprintf(path, sizeof path, "%s/v1.log", dir);
    atexit(down);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    walk w = {.file = data + 1, .size = size - 1, .limit = 16u << (data[0] & 7),
              .refuse_ff = (data[0] >> 3) & 1};
    FILE *f = fopen(path, "wb");
    if (!f || (w.size && fwrite(w.file, 1, w.size, f) != w.size))
        abort();
    fclose(f);
    tsr_applog_scan a, b, c;
    scan(&w, 0, &a);
    if (file_size() != w.size)
        abort(); /* a scan without CUT changed the file */
    scan(&w, TSR_APPLOG_CUT, &b);
    if (b.nrec != a.nrec || b.good != a.good || strcmp(a.why, b.why) != 0 ||
        file_size() != b.good)
        abort();
    scan(&w, TSR_APPLOG_CUT, &c);
    if (c.nrec != a.nrec || c.good != a.good || c.why[0] || c.size != a.good)
        abort();
    tsr_applog l;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_applog_open(&l, path, w.limit, 0, &err) != 0 ||
        tsr_applog_append(&l, "ok", 2, 0, &err) != 0) {
        fprintf(stderr, "append: %s\n", err.msg);
        abort();
    }
    tsr_applog_close(&l);
    w.file = NULL, w.size = (size_t)a.good + 10;
    scan(&w, 0, &c);
    if (c.nrec != a.nrec + 1 || c.why[0])
        abort();
    return 0;
}
