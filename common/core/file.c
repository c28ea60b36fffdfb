/*
 * file — whole-file reads and durable writes (contract and guards in file.h).
 */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mem.h"
#include "core/parallel.h"

/* One read or write call moves at most this much (Linux moves at most ~2 GiB anyway). */
#define IO_CHUNK (1u << 20)

int tsr_file_read(const char *path, size_t max, unsigned flags, char **out, size_t *len,
                  tsr_error *err)
{
    int rc = 0;
    char *buf = NULL;
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int code = errno == ENOENT && (flags & TSR_FILE_NOTFOUND) ? TSR_ENOTFOUND : TSR_EIO;
        return tsr_err(err, code, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tsr_err(err, TSR_EIO, "%s: not a regular file (%s)", path,
                     S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, socket or device");
        goto cleanup;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > max) {
        rc = tsr_err(err, TSR_ELIMIT, "%s: %lld bytes, more than the limit of %zu", path,
                     (long long)st.st_size, max);
        goto cleanup;
    }
    size_t cap = (size_t)st.st_size;
    buf = tsr_try_malloc(cap + 1, 1);
    if (buf == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory for %zu bytes", path, cap);
        goto cleanup;
    }
    size_t n = 0;
    while (n < cap) {
        size_t want = cap - n > IO_CHUNK ? IO_CHUNK : cap - n;
        ssize_t r = read(fd, buf + n, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = tsr_err(err, TSR_EIO, "%s: cannot read: %s", path, strerror(errno));
            goto cleanup;
        }
        if (r == 0)
            break; /* shrank meanwhile: return what is there */
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
cleanup:
    free(buf);
    close(fd);
    return rc;
}

int tsr_file_write_all(int fd, const void *buf, size_t n, const char *path, tsr_error *err)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > IO_CHUNK ? IO_CHUNK : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return tsr_err(err, TSR_EIO, "%s: write failed: %s", path, strerror(errno));
        if (w == 0)
            return tsr_err(err, TSR_EIO, "%s: write failed: no progress", path);
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tsr_file_fsync(int fd, const char *path, tsr_error *err)
{
    while (fsync(fd) != 0) {
        if (errno == EINTR)
            continue;
        return tsr_err(err, TSR_EIO, "%s: fsync failed: %s", path, strerror(errno));
    }
    return 0;
}

int tsr_file_fsync_dir(const char *dir, tsr_error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = tsr_file_fsync(fd, dir, err);
    close(fd);
    return rc;
}

int tsr_file_write_sync(const char *path, const void *buf, size_t n, tsr_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot create: %s", path, strerror(errno));
    int rc = tsr_file_write_all(fd, buf, n, path, err);
    if (rc == 0)
        rc = tsr_file_fsync(fd, path, err);
    /* NFS and friends report deferred write errors at close */
    if (close(fd) != 0 && rc == 0)
        rc = tsr_err(err, TSR_EIO, "%s: close failed: %s", path, strerror(errno));
    return rc;
}

int tsr_file_replace(const char *path, const char *tmp, const char *dir, const void *buf,
                     size_t n, tsr_error *err)
{
    int rc = tsr_file_write_sync(tmp, buf, n, err);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    return tsr_file_fsync_dir(dir, err);
}

int tsr_file_writer_open(tsr_file_writer *w, const char *path, size_t bufsize, tsr_error *err)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    w->cap = bufsize ? bufsize : 1;
    if ((w->buf = malloc(w->cap)) == NULL)
        return w->rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory for a %zu-byte write "
                               "buffer", path, w->cap);
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return w->rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

int tsr_file_writer_add(tsr_file_writer *w, const void *p, size_t n, tsr_error *err)
{
    const char *s = p;
    while (w->rc == 0 && n > 0) {
        size_t k = w->cap - w->len < n ? w->cap - w->len : n;
        memcpy(w->buf + w->len, s, k);
        w->len += k, s += k, n -= k;
        if (w->len == w->cap) {
            w->rc = tsr_file_write_all(w->fd, w->buf, w->len, w->path, err);
            w->len = 0;
            tsr_thread_pause(); /* a paced background thread rests between chunks */
        }
    }
    return w->rc;
}

int tsr_file_writer_close(tsr_file_writer *w, tsr_error *err)
{
    int rc = w->rc;
    if (rc == 0 && w->len > 0)
        rc = tsr_file_write_all(w->fd, w->buf, w->len, w->path, err);
    if (rc == 0)
        rc = tsr_file_fsync(w->fd, w->path, err);
    if (w->fd >= 0 && close(w->fd) != 0 && rc == 0) /* deferred write errors (NFS) */
        rc = tsr_err(err, TSR_EIO, "%s: close failed: %s", w->path, strerror(errno));
    free(w->buf);
    w->fd = -1, w->buf = NULL, w->len = 0;
    return rc;
}

void tsr_file_writer_abort(tsr_file_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->buf);
    w->fd = -1, w->buf = NULL, w->len = 0;
}

int tsr_file_replace_by(const char *path, size_t bufsize,
                        int (*write)(void *ctx, tsr_file_writer *w, tsr_error *err), void *ctx,
                        tsr_error *err)
{
    size_t plen = strlen(path);
    char *tmp = tsr_try_malloc(plen + 5, 1), *dir = tsr_try_malloc(plen + 2, 1);
    int rc = 0;
    if (tmp == NULL || dir == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
        goto out_free;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    tsr_file_writer w;
    if ((rc = tsr_file_writer_open(&w, tmp, bufsize, err)) != 0 ||
        (rc = write(ctx, &w, err)) != 0) {
        tsr_file_writer_abort(&w);
        goto out_unlink;
    }
    if ((rc = tsr_file_writer_close(&w, err)) != 0) /* written and fsynced */
        goto out_unlink;
    if (rename(tmp, path) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto out_unlink;
    }
    /* the directory holding path: its part up to the last '/', "/" or "." */
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        memcpy(dir, ".", 2);
    else {
        size_t dlen = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
    }
    rc = tsr_file_fsync_dir(dir, err);
    goto out_free;
out_unlink:
    unlink(tmp);
out_free:
    free(tmp);
    free(dir);
    return rc;
}
