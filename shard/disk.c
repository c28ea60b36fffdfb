/*
 * disk — the shard data directory (DESIGN "Storage"):
 *   DIR/CURRENT             "v000042\n", replaced by write-temp + fsync + rename
 *   DIR/v000042/            slice.faiss, meta, vectors.f32, MANIFEST
 *   DIR/v000043.tmp/        a version being written (removed at start-up)
 * A version directory is written as vNNNNNN.tmp, every file fsynced, MANIFEST last,
 * then renamed to vNNNNNN and the parent fsynced, so a crash leaves either no directory,
 * a .tmp one (garbage) or a complete one. MANIFEST lists each file's size and CRC-32 and
 * ends with an "end" line; a version whose MANIFEST is missing, truncated or does not
 * match its files is not loaded.
 *
 * MANIFEST:
 *   tessera-shard-manifest 1
 *   version 42
 *   file slice.faiss <size> <crc32 hex>
 *   file meta <size> <crc32 hex>
 *   file vectors.f32 <size> <crc32 hex>
 *   end
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "shard.h"

static const char *const FILES[] = {"slice.faiss", "meta", "vectors.f32"};
#define NFILES (sizeof FILES / sizeof FILES[0])

void tsr__vdir(const char *dir, int64_t version, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/v%06lld", dir, (long long)version);
}

static int file_crc(const char *path, uint64_t *size, uint32_t *crc, tsr_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char b[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    for (;;) {
        ssize_t r = read(fd, b, sizeof b);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return tsr_err(err, TSR_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        c = crc32(c, b, (uInt)r);
        n += (uint64_t)r;
    }
    close(fd);
    *size = n;
    *crc = (uint32_t)c;
    return 0;
}

int tsr__fsync_dir(const char *path, tsr_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot open directory: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0)
        return tsr_err(err, TSR_EIO, "%s: fsync failed: %s", path, strerror(e));
    return 0;
}

static int write_file_sync(const char *path, const char *text, tsr_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int ok = w == (ssize_t)n && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok)
        return tsr_err(err, TSR_EIO, "%s: write failed: %s", path, strerror(e));
    return 0;
}

int tsr__manifest_write(const char *vdir, int64_t version, uint64_t *total, tsr_error *err)
{
    char text[2048], path[4096];
    int off = snprintf(text, sizeof text, "tessera-shard-manifest 1\nversion %lld\n",
                       (long long)version);
    *total = 0;
    for (size_t i = 0; i < NFILES; i++) {
        uint64_t size;
        uint32_t crc;
        snprintf(path, sizeof path, "%s/%s", vdir, FILES[i]);
        int rc = file_crc(path, &size, &crc, err);
        if (rc != 0)
            return rc;
        *total += size;
        off += snprintf(text + off, sizeof text - (size_t)off, "file %s %" PRIu64 " %08x\n",
                        FILES[i], size, crc);
    }
    snprintf(text + off, sizeof text - (size_t)off, "end\n");
    snprintf(path, sizeof path, "%s/MANIFEST", vdir);
    int rc = write_file_sync(path, text, err);
    if (rc == 0)
        rc = tsr__fsync_dir(vdir, err);
    return rc;
}

int tsr__manifest_check(const char *vdir, int64_t version, uint64_t *total, tsr_error *err)
{
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/MANIFEST", vdir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return tsr_err(err, TSR_EFORMAT, "%s: missing: %s", path, strerror(errno));
    int rc = 0, seen[NFILES] = {0}, lineno = 0, ended = 0;
    *total = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char name[256];
        uint64_t size;
        unsigned crc;
        long long v;
        if (lineno == 1) {
            if (strcmp(line, "tessera-shard-manifest 1\n") != 0) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line 1: not a tessera-shard-manifest 1", path);
                break;
            }
        } else if (lineno == 2) {
            if (sscanf(line, "version %lld", &v) != 1 || v != version) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line 2: expected version %lld", path,
                             (long long)version);
                break;
            }
        } else if (strcmp(line, "end\n") == 0) {
            ended = 1;
            break;
        } else if (sscanf(line, "file %255s %" SCNu64 " %x", name, &size, &crc) == 3) {
            size_t i = 0;
            while (i < NFILES && strcmp(FILES[i], name) != 0)
                i++;
            if (i == NFILES) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line %d: unknown file '%s'", path, lineno, name);
                break;
            }
            char fp[4096];
            uint64_t got;
            uint32_t gcrc;
            snprintf(fp, sizeof fp, "%s/%s", vdir, name);
            if ((rc = file_crc(fp, &got, &gcrc, err)) != 0) {
                rc = TSR_EFORMAT;
                break;
            }
            if (got != size || gcrc != crc) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: size %" PRIu64 " crc %08x, the MANIFEST says "
                             "size %" PRIu64 " crc %08x", fp, got, gcrc, size, crc);
                break;
            }
            seen[i] = 1;
            *total += size;
        } else {
            rc = tsr_err(err, TSR_EFORMAT, "%s: line %d: cannot parse", path, lineno);
            break;
        }
    }
    fclose(f);
    if (rc == 0 && !ended)
        rc = tsr_err(err, TSR_EFORMAT, "%s: truncated (no end line)", path);
    for (size_t i = 0; rc == 0 && i < NFILES; i++)
        if (!seen[i])
            rc = tsr_err(err, TSR_EFORMAT, "%s: does not list %s", path, FILES[i]);
    return rc;
}

int tsr__current_read(const char *dir, int64_t *version, tsr_error *err)
{
    char path[4096], line[64] = {0};
    snprintf(path, sizeof path, "%s/CURRENT", dir);
    *version = 0;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        if (errno == ENOENT)
            return 0;
        return tsr_err(err, TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    long long v;
    char nl;
    if (got == NULL || sscanf(line, "v%lld%c", &v, &nl) != 2 || nl != '\n' || v < 0)
        return tsr_err(err, TSR_EFORMAT, "%s: expected \"vNNNNNN\\n\"", path);
    *version = v;
    return 0;
}

int tsr__current_write(const char *dir, int64_t version, tsr_error *err)
{
    char path[4096], tmp[4096], text[64];
    snprintf(path, sizeof path, "%s/CURRENT", dir);
    snprintf(tmp, sizeof tmp, "%s/CURRENT.tmp", dir);
    snprintf(text, sizeof text, "v%06lld\n", (long long)version);
    int rc = write_file_sync(tmp, text, err);
    if (rc != 0)
        return rc;
    if (rename(tmp, path) != 0)
        return tsr_err(err, TSR_EIO, "%s: rename failed: %s", path, strerror(errno));
    return tsr__fsync_dir(dir, err);
}

int tsr__rmtree(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            tsr__rmtree(p);
        else
            unlink(p);
    }
    closedir(d);
    return rmdir(path);
}

static int i64_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int tsr__list_vdirs(const char *dir, int64_t **out, size_t *n, tsr_error *err)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return tsr_err(err, TSR_EIO, "%s: cannot open data directory: %s", dir, strerror(errno));
    int64_t *a = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)) != NULL) {
        long long v;
        int len = 0;
        if (e->d_name[0] != 'v' || sscanf(e->d_name, "v%lld%n", &v, &len) != 1 || v <= 0)
            continue;
        if (strcmp(e->d_name + len, ".tmp") == 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            tsr__rmtree(p); /* a version that never finished writing */
            continue;
        }
        if (e->d_name[len] != 0)
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *q = realloc(a, cap * sizeof *a);
            if (q == NULL) {
                free(a);
                closedir(d);
                return tsr_err(err, TSR_ENOMEM, "out of memory");
            }
            a = q;
        }
        a[cnt++] = v;
    }
    closedir(d);
    qsort(a, cnt, sizeof *a, i64_cmp);
    *out = a;
    *n = cnt;
    return 0;
}
