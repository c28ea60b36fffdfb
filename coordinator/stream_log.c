/*
 * stream_log — the coordinator's log of streamed writes (proto/tessera/v1/coord_log.proto,
 * docs/streaming.md "The coordinator log"): one file per committed version,
 * DATA/stream/v<version>.log, records `u32 len | u32 crc32 | CoordLogRecord` (little
 * endian), a header first, then one record per round. This file only frames, appends
 * (fsync) and scans records; what they mean is stream.c's. A scan stops at the first
 * record that does not check (length past the end, CRC mismatch, unparsable payload) and
 * says where the good prefix ends, so the caller drops a torn or corrupt tail instead of
 * half-applying it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord.h"
#include "core/file.h"
#include "core/mem.h"
#include "store/store.h"
#include "tessera/v1/coord_log.pb-c.h"

#define SLOG_MAX_RECORD ((uint32_t)1 << 30) /* a round of 10k records is far below */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tsr__slog_dir(const tsr_store *st, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/stream", tsr_store_dir(st));
}

void tsr__slog_path(const tsr_store *st, uint64_t version, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/stream/v%06llu.log", tsr_store_dir(st), (unsigned long long)version);
}

uint8_t *tsr__slog_frame(const Tessera__V1__CoordLogRecord *rec, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(&rec->base);
    uint8_t *buf = tsr_xmalloc(n + 8);
    protobuf_c_message_pack(&rec->base, buf + 8);
    put32(buf, (uint32_t)n);
    put32(buf + 4, tsr_store_crc32(0, buf + 8, n));
    *len = n + 8;
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
    uint8_t *buf = tsr__slog_frame(hdr, &len);
    int rc = tsr_file_replace(path, tmp, dir, buf, len, err);
    free(buf);
    return rc;
}

int tsr__slog_open(const tsr_store *st, uint64_t version, int *fd, int64_t *size, tsr_error *err)
{
    char path[4200];
    tsr__slog_path(st, version, path, sizeof path);
    *fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (*fd < 0)
        return tsr_err(err, errno == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: cannot open: %s",
                       path, strerror(errno));
    struct stat sb;
    if (fstat(*fd, &sb) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return tsr_err(err, TSR_EIO, "%s: %s", path, strerror(e));
    }
    *size = (int64_t)sb.st_size;
    return 0;
}

int tsr__slog_append(int fd, const char *what, const Tessera__V1__CoordLogRecord *rec,
                     int64_t *size, tsr_error *err)
{
    size_t len = 0;
    uint8_t *buf = tsr__slog_frame(rec, &len);
    int rc = tsr_file_write_all(fd, buf, len, what, err);
    if (rc == 0)
        rc = tsr_file_fsync(fd, what, err);
    free(buf);
    if (rc) { /* never leave a half record for the next append to follow */
        if (ftruncate(fd, (off_t)*size) != 0)
            tsr_err_prefix(err, "%s: cannot cut the partial record either (%s)", what,
                           strerror(errno));
        return rc;
    }
    *size += (int64_t)len;
    return 0;
}

int tsr__slog_scan(const char *path, int64_t start, tsr__slog_fn fn, void *ud, int64_t *good,
                   char *why, size_t whycap, tsr_error *err)
{
    char *data = NULL;
    size_t len = 0;
    *good = 0;
    if (why && whycap)
        why[0] = 0;
    int rc = tsr_file_read(path, (size_t)1 << 40, TSR_FILE_NOTFOUND, &data, &len, err);
    if (rc)
        return rc;
    const uint8_t *p = (const uint8_t *)data;
    size_t off = start > 0 && (uint64_t)start <= len ? (size_t)start : 0;
    *good = (int64_t)off;
    while (off < len) {
        if (len - off < 8) {
            snprintf(why, whycap, "a record header of %zu bytes at offset %zu (8 expected)",
                     len - off, off);
            break;
        }
        uint32_t n = get32(p + off), crc = get32(p + off + 4);
        if (n > SLOG_MAX_RECORD || n > len - off - 8) {
            snprintf(why, whycap, "record at offset %zu: length %u runs past the end (%zu bytes)",
                     off, n, len);
            break;
        }
        if (tsr_store_crc32(0, p + off + 8, n) != crc) {
            snprintf(why, whycap, "record at offset %zu: CRC mismatch", off);
            break;
        }
        Tessera__V1__CoordLogRecord *rec =
            tessera__v1__coord_log_record__unpack(NULL, n, p + off + 8);
        if (!rec) {
            snprintf(why, whycap, "record at offset %zu: not a CoordLogRecord", off);
            break;
        }
        int stop = fn(ud, rec, (int64_t)off);
        tessera__v1__coord_log_record__free_unpacked(rec, NULL);
        off += 8 + (size_t)n;
        *good = (int64_t)off;
        if (stop)
            break;
    }
    free(data);
    return 0;
}
