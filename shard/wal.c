/*
 * wal — the shard's write-ahead log of streamed writes, one file per version
 * (DATA/wal/v<version>.log; format in shard.h): append, fdatasync, and the start-up
 * replay that drops a torn or corrupt tail.
 *
 * A record is written with one write() of header and payload; a crash may leave a prefix
 * of it (a torn tail), which the replay detects (length past the end of the file) and
 * cuts off, as it does a record whose CRC-32 (common/store's, zlib polynomial) does not
 * match or whose payload the caller refuses: the log is valid exactly up to the last
 * good record, and nothing after a bad record is applied (never half a write).
 *
 * Threads: see shard.h (the caller's lock; fdatasync of the fd may run outside it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "shard.h"

static int io_err(tsr_error *err, const char *path, const char *what)
{
    return tsr_err(err, TSR_EIO, "%s: %s: %s", path, what, strerror(errno));
}

/* pread of exactly n bytes at off (EINTR and short reads retried); 0 or -1 (errno). */
static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO;
            return -1;
        }
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Cuts the log at good (logged with why the rest goes). */
static int cut_tail(int fd, const char *path, uint64_t good, uint64_t size, const char *why,
                    tsr_error *err)
{
    tsr_warn("%s: offset %llu: %s: dropping the tail (%llu bytes of %llu)", path,
             (unsigned long long)good, why, (unsigned long long)(size - good),
             (unsigned long long)size);
    if (ftruncate(fd, (off_t)good) != 0)
        return io_err(err, path, "ftruncate");
    return tsr_file_fsync(fd, path, err);
}

int tsr__wal_replay(const char *path, tsr__wal_fn fn, void *ctx, uint64_t *nrec,
                    uint64_t *size, tsr_error *err)
{
    int rc = 0;
    uint8_t *buf = NULL;
    *nrec = 0;
    *size = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : io_err(err, path, "open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = io_err(err, path, "fstat");
        goto out;
    }
    uint64_t fsize = (uint64_t)st.st_size, off = 0;
    char why[160];
    why[0] = '\0';
    while (off < fsize) {
        uint32_t hdr[2];
        if (fsize - off < 8) {
            snprintf(why, sizeof why, "a record header of %llu bytes (torn)",
                     (unsigned long long)(fsize - off));
            break;
        }
        if (pread_all(fd, hdr, 8, off) != 0) {
            rc = io_err(err, path, "read");
            goto out;
        }
        if (hdr[0] > TSR__WAL_MAX_RECORD) {
            snprintf(why, sizeof why, "record length %u above the limit %u (corrupt)", hdr[0],
                     TSR__WAL_MAX_RECORD);
            break;
        }
        if (hdr[0] > fsize - off - 8) {
            snprintf(why, sizeof why, "record length %u past the end of the file (torn)",
                     hdr[0]);
            break;
        }
        uint8_t *nb = realloc(buf, hdr[0] ? hdr[0] : 1);
        if (nb == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory for a record of %u bytes", path,
                         hdr[0]);
            goto out;
        }
        buf = nb;
        if (pread_all(fd, buf, hdr[0], off + 8) != 0) {
            rc = io_err(err, path, "read");
            goto out;
        }
        uint32_t crc = tsr_store_crc32(0, buf, hdr[0]);
        if (crc != hdr[1]) {
            snprintf(why, sizeof why, "CRC-32 %08x, the record says %08x (corrupt)", crc, hdr[1]);
            break;
        }
        tsr_error e = TSR_ERROR_INIT;
        int frc = fn(ctx, buf, hdr[0], off, &e);
        if (frc == TSR_ENOMEM || frc == TSR_EIO) {
            rc = tsr_err(err, frc, "%s: offset %llu: %s", path, (unsigned long long)off, e.msg);
            goto out;
        }
        if (frc != 0) {
            snprintf(why, sizeof why, "record refused (%.120s)", e.msg);
            break;
        }
        off += 8 + (uint64_t)hdr[0];
        (*nrec)++;
    }
    if (off < fsize && (rc = cut_tail(fd, path, off, fsize, why, err)) != 0)
        goto out;
    *size = off;
out:
    free(buf);
    close(fd);
    return rc;
}

int tsr__wal_open(tsr__wal *w, const char *path, tsr_error *err)
{
    w->fd = -1;
    w->size = 0;
    if (strlen(path) >= sizeof w->path)
        return tsr_err(err, TSR_EINVAL, "%s: path too long", path);
    strcpy(w->path, path);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return io_err(err, path, "open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = io_err(err, path, "fstat");
        close(fd);
        return rc;
    }
    w->fd = fd;
    w->size = (uint64_t)st.st_size;
    return 0;
}

int tsr__wal_append(tsr__wal *w, const uint8_t *p, size_t n, tsr_error *err)
{
    if (w->fd < 0)
        return tsr_err(err, TSR_ESTATE, "%s: the log is not open", w->path);
    if (n > TSR__WAL_MAX_RECORD)
        return tsr_err(err, TSR_ELIMIT, "%s: a record of %zu bytes is above the limit %u",
                       w->path, n, TSR__WAL_MAX_RECORD);
    uint8_t *b = malloc(n + 8);
    if (b == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory for a log record of %zu bytes", n);
    uint32_t hdr[2] = {(uint32_t)n, tsr_store_crc32(0, p, n)};
    memcpy(b, hdr, 8);
    memcpy(b + 8, p, n);
    int rc = tsr_file_write_all(w->fd, b, n + 8, w->path, err);
    free(b);
    if (rc == 0) {
        w->size += n + 8;
        return 0;
    }
    /* Cut a partial record off so that the next append starts on a record boundary. */
    if (ftruncate(w->fd, (off_t)w->size) != 0) {
        tsr_error_log("%s: cannot cut a failed append back to %llu bytes: %s", w->path,
                      (unsigned long long)w->size, strerror(errno));
        return tsr_err(err, TSR_ESTATE, "%s: a failed append left the log unusable", w->path);
    }
    return rc;
}

int tsr__wal_sync_fd(int fd, const char *path, tsr_error *err)
{
    while (fdatasync(fd) != 0) {
        if (errno == EINTR)
            continue;
        return io_err(err, path, "fdatasync");
    }
    return 0;
}

void tsr__wal_close(tsr__wal *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
}
