/*
 * stream_log — the coordinator's log of streamed writes (proto/tessera/v1/coord_log.proto,
 * docs/streaming.md "The coordinator log"): one file per committed version,
 * DATA/stream/v<version>.log, a common/store append log (store/applog.h: `u32 len | u32
 * crc32 | payload` records, append, scan) whose payloads are packed CoordLogRecords, a
 * header first, then one record per round. This file names the files and packs and
 * unpacks the records; what they mean is stream.c's. A scan stops at the first record
 * that does not check (length past the end, CRC mismatch, unparsable payload) and says
 * where the good prefix ends, so the caller drops a torn or corrupt tail instead of
 * half-applying it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coord.h"
#include "core/mem.h"
#include "store/applog.h"
#include "store/store.h"
#include "tessera/v1/coord_log.pb-c.h"

#define SLOG_MAX_RECORD ((uint32_t)1 << 30) /* a round of 10k records is far below */

void tsr__slog_dir(const tsr_store *st, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/stream", tsr_store_dir(st));
}

void tsr__slog_path(const tsr_store *st, uint64_t version, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/stream/v%06llu.log", tsr_store_dir(st), (unsigned long long)version);
}

/* rec packed into a new buffer of *len bytes. */
static uint8_t *pack(const Tessera__V1__CoordLogRecord *rec, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(&rec->base);
    uint8_t *buf = tsr_xmalloc(n ? n : 1);
    *len = protobuf_c_message_pack(&rec->base, buf);
    return buf;
}

int tsr__slog_create(const tsr_store *st, uint64_t version,
                     const Tessera__V1__CoordLogRecord *hdr, tsr_error *err)
{
    char dir[4096], path[4200], tmp[4200];
    tsr__slog_dir(st, dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return tsr_err(err, TSR_EIO, "%s: cannot create: %s", dir, strerror(errno));
    tsr__slog_path(st, version, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s/.tmp-v%06llu.log", dir, (unsigned long long)version);
    size_t len = 0;
    uint8_t *buf = pack(hdr, &len);
    int rc = tsr_applog_create(path, tmp, dir, buf, len, err);
    free(buf);
    return rc;
}

int tsr__slog_open(const tsr_store *st, uint64_t version, int *fd, int64_t *size, tsr_error *err)
{
    char path[4200];
    tsr_applog l;
    tsr__slog_path(st, version, path, sizeof path);
    int rc = tsr_applog_open(&l, path, SLOG_MAX_RECORD, 0, err);
    *fd = l.fd; /* the caller keeps the fd and the size (tsr__slog_append) */
    *size = (int64_t)l.size;
    return rc;
}

int tsr__slog_append(int fd, const char *what, const Tessera__V1__CoordLogRecord *rec,
                     int64_t *size, tsr_error *err)
{
    size_t len = 0;
    uint64_t sz = (uint64_t)*size;
    uint8_t *buf = pack(rec, &len);
    int rc = tsr_applog_append_fd(fd, what, &sz, SLOG_MAX_RECORD, buf, len, TSR_APPLOG_SYNC,
                                  err);
    free(buf);
    *size = (int64_t)sz;
    return rc;
}

typedef struct scan_ctx {
    tsr__slog_fn fn;
    void *ud;
} scan_ctx;

static int scan_one(void *ud, const uint8_t *p, size_t n, uint64_t off, tsr_error *err)
{
    scan_ctx *s = ud;
    Tessera__V1__CoordLogRecord *rec = tessera__v1__coord_log_record__unpack(NULL, n, p);
    if (!rec)
        return tsr_err(err, TSR_EFORMAT, "not a CoordLogRecord");
    int stop = s->fn(s->ud, rec, (int64_t)off);
    tessera__v1__coord_log_record__free_unpacked(rec, NULL);
    return stop ? TSR_APPLOG_STOP : 0;
}

static int slog_scan(const char *path, int64_t start, unsigned flags, tsr__slog_fn fn,
                     void *ud, int64_t *good, char *why, size_t whycap, tsr_error *err)
{
    scan_ctx s = {fn, ud};
    tsr_applog_scan r;
    int rc = tsr_applog_scan_file(path, start > 0 ? (uint64_t)start : 0, SLOG_MAX_RECORD,
                                  flags, scan_one, &s, &r, err);
    *good = (int64_t)r.good;
    if (why && whycap)
        snprintf(why, whycap, "%s", r.why);
    return rc;
}

int tsr__slog_scan(const char *path, int64_t start, tsr__slog_fn fn, void *ud, int64_t *good,
                   char *why, size_t whycap, tsr_error *err)
{
    return slog_scan(path, start, 0, fn, ud, good, why, whycap, err);
}

int tsr__slog_scan_cut(const char *path, tsr__slog_fn fn, void *ud, int64_t *good, char *why,
                       size_t whycap, tsr_error *err)
{
    return slog_scan(path, 0, TSR_APPLOG_CUT, fn, ud, good, why, whycap, err);
}

int tsr__slog_cut(int fd, const char *path, int64_t size, tsr_error *err)
{
    return tsr_applog_cut_fd(fd, path, size > 0 ? (uint64_t)size : 0, err);
}
