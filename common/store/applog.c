/*
 * applog — CRC-framed append-only logs (contract and format in applog.h).
 */
#include "store/applog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "store/store.h"

static int io_err(tsr_error *err, const char *path, const char *what)
{
    return tsr_err(err, TSR_EIO, "%s: %s: %s", path, what, strerror(errno));
}

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

static void frame_header(uint8_t hdr[TSR_APPLOG_HDR], const void *p, size_t n)
{
    put32(hdr, (uint32_t)n);
    put32(hdr + 4, tsr_store_crc32(0, p, n));
}

int tsr_applog_open(tsr_applog *l, const char *path, uint32_t max_record, unsigned flags,
                    tsr_error *err)
{
    l->fd = -1;
    l->size = 0;
    l->max_record = max_record;
    l->path[0] = '\0';
    if (strlen(path) >= sizeof l->path)
        return tsr_err(err, TSR_EINVAL, "%s: path too long", path);
    strcpy(l->path, path);
    int oflags = O_WRONLY | O_APPEND | O_CLOEXEC | (flags & TSR_APPLOG_CREATE ? O_CREAT : 0);
    int fd = open(path, oflags, 0644);
    if (fd < 0)
        return errno == ENOENT ? tsr_err(err, TSR_ENOTFOUND, "%s: cannot open: %s", path,
                                         strerror(errno))
                               : io_err(err, path, "cannot open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = io_err(err, path, "fstat");
        close(fd);
        return rc;
    }
    l->fd = fd;
    l->size = (uint64_t)st.st_size;
    return 0;
}

void tsr_applog_close(tsr_applog *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

/* writev of the header and the payload until all is written (EINTR, short writes). */
static int write_record(int fd, const char *path, const uint8_t *hdr, const void *p, size_t n,
                        tsr_error *err)
{
    struct iovec iov[2] = {{(void *)hdr, TSR_APPLOG_HDR}, {(void *)p, n}};
    struct iovec *v = iov;
    int cnt = n ? 2 : 1;
    while (cnt > 0) {
        ssize_t w = writev(fd, v, cnt);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return io_err(err, path, "write");
        }
        size_t left = (size_t)w;
        while (cnt > 0 && left >= v->iov_len) {
            left -= v->iov_len;
            v++, cnt--;
        }
        if (cnt > 0) {
            v->iov_base = (uint8_t *)v->iov_base + left;
            v->iov_len -= left;
        }
    }
    return 0;
}

int tsr_applog_append_fd(int fd, const char *path, uint64_t *size, uint32_t max_record,
                         const void *p, size_t n, unsigned flags, tsr_error *err)
{
    if (fd < 0)
        return tsr_err(err, TSR_ESTATE, "%s: the log is not open", path);
    if (n > max_record)
        return tsr_err(err, TSR_ELIMIT, "%s: a record of %zu bytes is above the limit %u",
                       path, n, max_record);
    uint8_t hdr[TSR_APPLOG_HDR];
    frame_header(hdr, p, n);
    int rc = write_record(fd, path, hdr, p, n, err);
    if (rc == 0 && (flags & TSR_APPLOG_SYNC))
        rc = tsr_applog_sync_fd(fd, path, err);
    if (rc == 0) {
        *size += TSR_APPLOG_HDR + n;
        return 0;
    }
    /* Cut a partial record off so that the next append starts on a record boundary. */
    if (ftruncate(fd, (off_t)*size) != 0) {
        tsr_error_log("%s: cannot cut a failed append back to %llu bytes: %s", path,
                      (unsigned long long)*size, strerror(errno));
        tsr_err_prefix(err, "%s: a failed append left the log unusable", path);
        if (err)
            err->code = TSR_ESTATE;
        return TSR_ESTATE;
    }
    return rc;
}

int tsr_applog_append(tsr_applog *l, const void *p, size_t n, unsigned flags, tsr_error *err)
{
    return tsr_applog_append_fd(l->fd, l->path, &l->size, l->max_record, p, n, flags, err);
}

int tsr_applog_cut_fd(int fd, const char *path, uint64_t size, tsr_error *err)
{
    if (ftruncate(fd, (off_t)size) != 0)
        return io_err(err, path, "ftruncate");
    return tsr_file_fsync(fd, path, err);
}

int tsr_applog_sync_fd(int fd, const char *path, tsr_error *err)
{
    while (fdatasync(fd) != 0) {
        if (errno == EINTR)
            continue;
        return io_err(err, path, "fdatasync");
    }
    return 0;
}

int tsr_applog_sync(tsr_applog *l, tsr_error *err)
{
    return tsr_applog_sync_fd(l->fd, l->path, err);
}

int tsr_applog_create(const char *path, const char *tmp, const char *dir, const void *p,
                      size_t n, tsr_error *err)
{
    uint8_t *buf = malloc(TSR_APPLOG_HDR + n);
    if (buf == NULL)
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory for a record of %zu bytes", path, n);
    frame_header(buf, p, n);
    if (n)
        memcpy(buf + TSR_APPLOG_HDR, p, n);
    int rc = tsr_file_replace(path, tmp, dir, buf, TSR_APPLOG_HDR + n, err);
    free(buf);
    return rc;
}

/* ---- scan ---------------------------------------------------------------------------- */

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

/* A scan in progress: the file, the reused payload buffer, the result. */
typedef struct scan {
    const char *path;
    int fd;
    uint32_t max_record;
    uint8_t *buf;
    size_t cap;
    tsr_applog_scan *res;
} scan;

/* Reads and checks the record at off: 0 with *rec / *len, 1 when it does not check
 * (res->why says why), or an error. The length is checked against the limit and the
 * bytes left before anything is allocated for it. */
static int read_record(scan *s, uint64_t off, const uint8_t **rec, uint32_t *len,
                       tsr_error *err)
{
    tsr_applog_scan *r = s->res;
    uint64_t left = r->size - off;
    uint8_t hdr[TSR_APPLOG_HDR];
    if (left < TSR_APPLOG_HDR) {
        snprintf(r->why, sizeof r->why, "offset %llu: a record header of %llu bytes (torn)",
                 (unsigned long long)off, (unsigned long long)left);
        return 1;
    }
    if (pread_all(s->fd, hdr, TSR_APPLOG_HDR, off) != 0)
        return io_err(err, s->path, "read");
    uint32_t n = get32(hdr), crc = get32(hdr + 4);
    if (n > s->max_record) {
        snprintf(r->why, sizeof r->why, "offset %llu: record length %u above the limit %u "
                 "(corrupt)", (unsigned long long)off, n, s->max_record);
        return 1;
    }
    if (n > left - TSR_APPLOG_HDR) {
        snprintf(r->why, sizeof r->why, "offset %llu: record length %u past the end of the "
                 "file (torn)", (unsigned long long)off, n);
        return 1;
    }
    if (n > s->cap) {
        uint8_t *nb = realloc(s->buf, n);
        if (nb == NULL)
            return tsr_err(err, TSR_ENOMEM, "%s: out of memory for a record of %u bytes",
                           s->path, n);
        s->buf = nb, s->cap = n;
    }
    if (n && pread_all(s->fd, s->buf, n, off + TSR_APPLOG_HDR) != 0)
        return io_err(err, s->path, "read");
    uint32_t got = tsr_store_crc32(0, s->buf, n);
    if (got != crc) {
        snprintf(r->why, sizeof r->why, "offset %llu: CRC-32 %08x, the record says %08x "
                 "(corrupt)", (unsigned long long)off, got, crc);
        return 1;
    }
    *rec = s->buf;
    *len = n;
    return 0;
}

/* Cuts the file at res->good (logged with why the rest goes), durably. */
static int cut_tail(scan *s, tsr_error *err)
{
    tsr_applog_scan *r = s->res;
    tsr_warn("%s: %s: dropping the tail (%llu bytes of %llu)", s->path, r->why,
             (unsigned long long)(r->size - r->good), (unsigned long long)r->size);
    return tsr_applog_cut_fd(s->fd, s->path, r->good, err);
}

/* The record loop: fn for each good record from res->good on. */
static int scan_records(scan *s, tsr_applog_fn fn, void *ud, tsr_error *err)
{
    tsr_applog_scan *r = s->res;
    while (r->good < r->size) {
        const uint8_t *rec = NULL;
        uint32_t n = 0;
        uint64_t off = r->good;
        int rc = read_record(s, off, &rec, &n, err);
        if (rc != 0)
            return rc == 1 ? 0 : rc;
        tsr_error e = TSR_ERROR_INIT;
        int frc = fn(ud, rec, n, off, &e);
        if (frc == TSR_ENOMEM || frc == TSR_EIO)
            return tsr_err(err, frc, "%s: offset %llu: %s", s->path, (unsigned long long)off,
                           e.msg);
        if (frc != 0 && frc != TSR_APPLOG_STOP) {
            snprintf(r->why, sizeof r->why, "offset %llu: record refused (%.200s)",
                     (unsigned long long)off, e.msg);
            return 0;
        }
        r->good = off + TSR_APPLOG_HDR + n;
        r->nrec++;
        if (frc == TSR_APPLOG_STOP)
            return 0;
    }
    return 0;
}

int tsr_applog_scan_file(const char *path, uint64_t start, uint32_t max_record,
                         unsigned flags, tsr_applog_fn fn, void *ud, tsr_applog_scan *res,
                         tsr_error *err)
{
    memset(res, 0, sizeof *res);
    scan s = {.path = path, .fd = -1, .max_record = max_record, .res = res};
    s.fd = open(path, (flags & TSR_APPLOG_CUT ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (s.fd < 0)
        return errno == ENOENT ? tsr_err(err, TSR_ENOTFOUND, "%s: no such log", path)
                               : io_err(err, path, "open");
    int rc = 0;
    struct stat st;
    if (fstat(s.fd, &st) != 0) {
        rc = io_err(err, path, "fstat");
        goto out;
    }
    res->size = (uint64_t)st.st_size;
    res->good = start <= res->size ? start : 0;
    if ((rc = scan_records(&s, fn, ud, err)) != 0)
        goto out;
    if (res->why[0] && (flags & TSR_APPLOG_CUT))
        rc = cut_tail(&s, err);
out:
    free(s.buf);
    close(s.fd);
    return rc;
}
