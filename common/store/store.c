/*
 * store — versioned data directories: temp-write + fsync + rename, CURRENT, MANIFEST
 * (interface and guarantees in store.h, the crash-safety argument in docs/storage.md).
 *
 * MANIFEST (text, one record per line, '\n' terminated):
 *     tessera-manifest 1
 *     version v000042
 *     file <name> <size in bytes> crc32 <8 lowercase hex digits>     (sorted by name)
 *     checksum crc32 <8 hex digits>      (CRC-32 of every byte before this line)
 * The trailing checksum makes a damaged manifest itself detectable. CRC-32 is zlib's
 * (already linked, hardware-accelerated where zlib is): it detects every error burst up
 * to 32 bits and random corruption with probability 1 - 2^-32, enough for torn or
 * bit-rotted files; it is not a defence against deliberate tampering.
 */
#include "store/store.h"
#include "store/store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/file.h"
#include "core/parallel.h"
#include "core/mem.h"

void (*tsr__store_hook)(const char *step) = NULL;
#define HOOK(step)                   \
    do {                             \
        if (tsr__store_hook != NULL) \
            tsr__store_hook(step);   \
    } while (0)

#define MANIFEST_MAX (4u << 20) /* bytes; a manifest lists a handful of files */
#define IO_CHUNK (1u << 20)

struct tsr_store {
    char *dir;
    int lock_fd;
    int txn_open;
};

typedef struct entry {
    char name[TSR_STORE_NAME_MAX + 1];
    uint64_t size;
    uint32_t crc;
} entry;

struct tsr_store_txn {
    tsr_store *s;
    uint64_t version;
    char *tmp, *final;
    entry *e;
    size_t n, cap;
    int open_files;
};

struct tsr_store_file {
    tsr_store_txn *t;
    int fd;
    char *path;
    entry e;
};

/* ---- helpers ------------------------------------------------------------------------------- */

uint32_t tsr_store_crc32(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uLong c = crc;
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, n);
        p += n;
        len -= n;
    }
    return (uint32_t)c;
}

void tsr_store_version_name(uint64_t version, char *buf, size_t cap)
{
    snprintf(buf, cap, "v%06" PRIu64, version);
}

/* Parses a canonical version name ("v000042", exactly as tsr_store_version_name prints). */
static int parse_version(const char *s, size_t len, uint64_t *v)
{
    if (len < 2 || len > 21 || s[0] != 'v')
        return -1;
    uint64_t x = 0;
    for (size_t i = 1; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    char canon[32];
    tsr_store_version_name(x, canon, sizeof canon);
    if (strlen(canon) != len || memcmp(canon, s, len) != 0)
        return -1;
    *v = x;
    return 0;
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (p == NULL)
        return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
    return p;
}

static char *version_dir(const tsr_store *s, const char *prefix, uint64_t v)
{
    char name[48];
    char vn[32];
    tsr_store_version_name(v, vn, sizeof vn);
    snprintf(name, sizeof name, "%s%s", prefix, vn);
    return join(s->dir, name);
}

static int valid_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > TSR_STORE_NAME_MAX || n[0] == '.' || strcmp(n, "MANIFEST") == 0)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Removes a file or a directory tree; 0 or -1 with errno. */
static int rm_tree_at(int dfd, const char *name, int depth)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if ((errno != EISDIR && errno != EPERM) || depth > 16)
        return -1;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (rm_tree_at(fd, de->d_name, depth + 1) != 0)
            rc = -1;
    }
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

static int rm_tree(const char *path)
{
    return rm_tree_at(AT_FDCWD, path, 0);
}

static int mkdir_p(const char *dir, tsr_error *err)
{
    char *p = tsr_xstrdup(dir);
    size_t len = strlen(p);
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int rc = tsr_err(err, TSR_EIO, "mkdir %s: %s", p, strerror(errno));
            free(p);
            return rc;
        }
        p[i] = c;
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return tsr_err(err, TSR_EIO, "%s: not a directory", dir);
    return 0;
}

/* Size and CRC of a file by reading it; also fsyncs it when do_sync. */
static int checksum_file(const char *path, int do_sync, uint64_t *size, uint32_t *crc,
                         tsr_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT)
            return tsr_err(err, TSR_ENOTFOUND, "%s: missing", path);
        return tsr_err(err, TSR_EIO, "open %s: %s", path, strerror(errno));
    }
    char *buf = malloc(IO_CHUNK);
    if (buf == NULL) {
        close(fd);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    uint64_t n = 0;
    uint32_t c = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, IO_CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = tsr_err(err, TSR_EIO, "read %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        c = tsr_store_crc32(c, buf, (size_t)r);
        n += (uint64_t)r;
        tsr_thread_pause(); /* a paced background thread (a shard's build) rests here */
    }
    free(buf);
    if (rc == 0 && do_sync)
        rc = tsr_file_fsync(fd, path, err);
    close(fd);
    *size = n;
    *crc = c;
    return rc;
}

/* ---- open / close -------------------------------------------------------------------------- */

int tsr_store_create(const char *dir, tsr_store **out, tsr_error *err)
{
    int rc;
    *out = NULL;
    if (dir == NULL || dir[0] == '\0')
        return tsr_err(err, TSR_EINVAL, "store: empty data directory");
    if ((rc = mkdir_p(dir, err)) != 0)
        return rc;
    tsr_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return tsr_err(err, TSR_ENOMEM, "store: out of memory");
    s->dir = tsr_xstrdup(dir);
    s->lock_fd = -1;
    char *lock = join(dir, "LOCK");
    s->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->lock_fd < 0) {
        rc = tsr_err(err, TSR_EIO, "open %s: %s", lock, strerror(errno));
        free(lock);
        goto fail;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        rc = errno == EWOULDBLOCK
                 ? tsr_err(err, TSR_ESTATE, "%s: data directory is in use by another process", dir)
                 : tsr_err(err, TSR_EIO, "flock %s: %s", lock, strerror(errno));
        free(lock);
        goto fail;
    }
    free(lock);

    /* Leftovers of an interrupted write, remove or commit: never part of a version. */
    DIR *d = opendir(dir);
    if (d == NULL) {
        rc = tsr_err(err, TSR_EIO, "opendir %s: %s", dir, strerror(errno));
        goto fail;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, ".tmp-", 5) != 0 && strcmp(de->d_name, "CURRENT.tmp") != 0)
            continue;
        char *p = join(dir, de->d_name);
        if (rm_tree(p) != 0) {
            rc = tsr_err(err, TSR_EIO, "remove leftover %s: %s", p, strerror(errno));
            free(p);
            closedir(d);
            goto fail;
        }
        free(p);
    }
    closedir(d);
    *out = s;
    return 0;
fail:
    tsr_store_destroy(s);
    return rc;
}

void tsr_store_destroy(tsr_store *s)
{
    if (s == NULL)
        return;
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* releases the flock */
    free(s->dir);
    free(s);
}

const char *tsr_store_dir(const tsr_store *s)
{
    return s->dir;
}

/* ---- CURRENT ------------------------------------------------------------------------------- */

int tsr_store_current(const tsr_store *s, uint64_t *version, tsr_error *err)
{
    char *path = join(s->dir, "CURRENT"), *buf = NULL;
    size_t len;
    int rc = tsr_file_read(path, 64, TSR_FILE_NOTFOUND, &buf, &len, err);
    if (rc == TSR_ENOTFOUND)
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no CURRENT version yet", path);
    if (rc == 0) {
        size_t n = len;
        if (n > 0 && buf[n - 1] == '\n')
            n--;
        if (parse_version(buf, n, version) != 0)
            rc = tsr_err(err, TSR_EFORMAT, "%s: expected a version name like v000042, got \"%.32s\"",
                         path, buf);
    } else if (rc == TSR_ELIMIT) {
        rc = tsr_err(err, TSR_EFORMAT, "%s: too long for a version name", path);
    }
    free(buf);
    free(path);
    return rc;
}

int tsr_store_set_current(tsr_store *s, uint64_t version, tsr_error *err)
{
    int rc = 0, fd = -1;
    char *vdir = version_dir(s, "", version);
    char *tmp = join(s->dir, "CURRENT.tmp"), *cur = join(s->dir, "CURRENT");
    struct stat st;
    if (stat(vdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no such committed version", vdir);
        goto done;
    }
    char line[40];
    tsr_store_version_name(version, line, sizeof line - 1);
    strcat(line, "\n");
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tsr_err(err, TSR_EIO, "open %s: %s", tmp, strerror(errno));
        goto done;
    }
    if ((rc = tsr_file_write_all(fd, line, strlen(line), tmp, err)) != 0 ||
        (rc = tsr_file_fsync(fd, tmp, err)) != 0)
        goto done;
    if (close(fd) != 0) {
        fd = -1;
        rc = tsr_err(err, TSR_EIO, "close %s: %s", tmp, strerror(errno));
        goto done;
    }
    fd = -1;
    HOOK("current-tmp-synced");
    if (rename(tmp, cur) != 0) {
        rc = tsr_err(err, TSR_EIO, "rename %s to %s: %s", tmp, cur, strerror(errno));
        goto done;
    }
    HOOK("current-renamed");
    rc = tsr_file_fsync_dir(s->dir, err);
    HOOK("current-synced");
done:
    if (fd >= 0)
        close(fd);
    if (rc != 0)
        unlink(tmp);
    free(vdir);
    free(tmp);
    free(cur);
    return rc;
}

/* ---- listing, paths, reading ------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int tsr_store_list(const tsr_store *s, uint64_t **versions, size_t *n, tsr_error *err)
{
    *versions = NULL;
    *n = 0;
    DIR *d = opendir(s->dir);
    if (d == NULL)
        return tsr_err(err, TSR_EIO, "opendir %s: %s", s->dir, strerror(errno));
    uint64_t *v = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        uint64_t x;
        if (parse_version(de->d_name, strlen(de->d_name), &x) != 0)
            continue;
        struct stat st;
        char *p = join(s->dir, de->d_name);
        int isdir = stat(p, &st) == 0 && S_ISDIR(st.st_mode);
        free(p);
        if (!isdir)
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            v = tsr_xrealloc(v, cap * sizeof *v);
        }
        v[cnt++] = x;
    }
    closedir(d);
    if (cnt > 1)
        qsort(v, cnt, sizeof *v, cmp_u64);
    *versions = v;
    *n = cnt;
    return 0;
}

int tsr_store_path(const tsr_store *s, uint64_t version, const char *name, char *buf,
                   size_t cap, tsr_error *err)
{
    char vn[32];
    tsr_store_version_name(version, vn, sizeof vn);
    int n = name ? snprintf(buf, cap, "%s/%s/%s", s->dir, vn, name)
                 : snprintf(buf, cap, "%s/%s", s->dir, vn);
    if (n < 0 || (size_t)n >= cap)
        return tsr_err(err, TSR_ELIMIT, "store: path of %s/%s too long", vn, name ? name : "");
    return 0;
}

int tsr_store_read_file(const tsr_store *s, uint64_t version, const char *name,
                        size_t max_len, void **buf, size_t *len, tsr_error *err)
{
    char path[4096];
    int rc;
    if (!valid_name(name) && strcmp(name, "MANIFEST") != 0)
        return tsr_err(err, TSR_EINVAL, "store: bad file name \"%.64s\"", name);
    if ((rc = tsr_store_path(s, version, name, path, sizeof path, err)) != 0)
        return rc;
    char *b;
    rc = tsr_file_read(path, max_len, TSR_FILE_NOTFOUND, &b, len, err);
    if (rc == 0)
        *buf = b;
    return rc;
}

/* ---- MANIFEST ----------------------------------------------------------------------------- */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* Parses and checks a manifest's text; entries into *out (caller frees). */
static int parse_manifest(const char *path, char *text, size_t len, uint64_t version,
                          entry **out, size_t *nout, tsr_error *err)
{
    entry *e = NULL;
    size_t n = 0, cap = 0;
    int rc = 0, lineno = 0, seen_version = 0;
    *out = NULL;
    *nout = 0;
    if (len == 0 || text[len - 1] != '\n' || memchr(text, '\0', len) != NULL)
        return tsr_err(err, TSR_EFORMAT, "%s: truncated or not text", path);
    /* the last line is the checksum of everything before it: check it before parsing */
    char *last = text + len - 1;
    while (last > text && last[-1] != '\n')
        last--;
    {
        unsigned want;
        int used = 0;
        if (strncmp(last, "checksum crc32 ", 15) != 0 ||
            sscanf(last + 15, "%8x%n", &want, &used) != 1 || last[15 + used] != '\n')
            return tsr_err(err, TSR_EFORMAT, "%s: no checksum line at the end (truncated manifest)",
                           path);
        uint32_t got = tsr_store_crc32(0, text, (size_t)(last - text));
        if (got != want)
            return tsr_err(err, TSR_EFORMAT,
                           "%s: manifest checksum crc32 %08x, its last line says %08x (manifest damaged)",
                           path, got, want);
    }
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        *nl = '\0';
        lineno++;
        if (lineno == 1) {
            if (strcmp(p, "tessera-manifest 1") != 0) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line 1: expected \"tessera-manifest 1\"", path);
                goto fail;
            }
        } else if (strncmp(p, "version ", 8) == 0) {
            uint64_t v;
            if (parse_version(p + 8, strlen(p + 8), &v) != 0 || v != version) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line %d: version \"%.32s\" does not match the directory",
                             path, lineno, p + 8);
                goto fail;
            }
            seen_version = 1;
        } else if (strncmp(p, "file ", 5) == 0) {
            char name[TSR_STORE_NAME_MAX + 2];
            unsigned long long size;
            unsigned crc;
            int used = 0;
            if (sscanf(p + 5, "%129s %llu crc32 %8x%n", name, &size, &crc, &used) != 3 ||
                p[5 + used] != '\0' || !valid_name(name)) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: line %d: expected \"file <name> <size> crc32 <hex>\"",
                             path, lineno);
                goto fail;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                e = tsr_xrealloc(e, cap * sizeof *e);
            }
            strcpy(e[n].name, name);
            e[n].size = size;
            e[n].crc = crc;
            n++;
        } else if (p == last) {
            if (!seen_version) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: no version line", path);
                goto fail;
            }
            *out = e;
            *nout = n;
            return 0;
        } else {
            rc = tsr_err(err, TSR_EFORMAT, "%s: line %d: unknown record \"%.32s\"", path, lineno, p);
            goto fail;
        }
        p = nl + 1;
    }
    rc = tsr_err(err, TSR_EFORMAT, "%s: no checksum line (truncated manifest)", path);
fail:
    free(e);
    return rc;
}

int tsr__store_check_manifest(const char *text, size_t len, uint64_t version, size_t *nfiles,
                              tsr_error *err)
{
    if (len > MANIFEST_MAX)
        return tsr_err(err, TSR_ELIMIT, "manifest larger than %u bytes", MANIFEST_MAX);
    char *copy = tsr_try_malloc(len + 1, 1);
    if (copy == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    if (len)
        memcpy(copy, text, len);
    copy[len] = '\0';
    entry *e = NULL;
    int rc = parse_manifest("MANIFEST", copy, len, version, &e, nfiles, err);
    free(e);
    free(copy);
    return rc;
}

int tsr_store_verify(const tsr_store *s, uint64_t version, tsr_error *err)
{
    int rc;
    char *vdir = version_dir(s, "", version);
    char *mpath = join(vdir, "MANIFEST");
    char *text = NULL;
    entry *e = NULL;
    size_t len, n = 0;
    DIR *d = NULL;
    struct stat st;
    if (stat(vdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no such version", vdir);
        goto done;
    }
    rc = tsr_file_read(mpath, MANIFEST_MAX, TSR_FILE_NOTFOUND, &text, &len, err);
    if (rc == TSR_ENOTFOUND)
        rc = tsr_err(err, TSR_EFORMAT, "%s: missing", mpath);
    if (rc != 0)
        goto done;
    if ((rc = parse_manifest(mpath, text, len, version, &e, &n, err)) != 0)
        goto done;
    for (size_t i = 0; i < n; i++) {
        char *fp = join(vdir, e[i].name);
        uint64_t size;
        uint32_t crc;
        if (lstat(fp, &st) != 0 || !S_ISREG(st.st_mode)) {
            rc = tsr_err(err, TSR_EFORMAT, "%s: missing (listed in MANIFEST)", fp);
        } else if ((uint64_t)st.st_size != e[i].size) {
            rc = tsr_err(err, TSR_EFORMAT, "%s: size is %lld bytes, MANIFEST says %llu", fp,
                         (long long)st.st_size, (unsigned long long)e[i].size);
        } else if ((rc = checksum_file(fp, 0, &size, &crc, err)) == 0) {
            if (size != e[i].size)
                rc = tsr_err(err, TSR_EFORMAT, "%s: read %llu bytes, MANIFEST says %llu", fp,
                             (unsigned long long)size, (unsigned long long)e[i].size);
            else if (crc != e[i].crc)
                rc = tsr_err(err, TSR_EFORMAT, "%s: checksum crc32 %08x, MANIFEST says %08x", fp,
                             crc, e[i].crc);
        }
        free(fp);
        if (rc != 0)
            goto done;
    }
    d = opendir(vdir);
    if (d == NULL) {
        rc = tsr_err(err, TSR_EIO, "opendir %s: %s", vdir, strerror(errno));
        goto done;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, "MANIFEST") == 0)
            continue;
        int listed = 0;
        for (size_t i = 0; i < n && !listed; i++)
            listed = strcmp(e[i].name, de->d_name) == 0;
        if (!listed) {
            rc = tsr_err(err, TSR_EFORMAT, "%s/%s: not listed in MANIFEST", vdir, de->d_name);
            goto done;
        }
    }
done:
    if (d)
        closedir(d);
    free(e);
    free(text);
    free(mpath);
    free(vdir);
    return rc;
}

int tsr_store_remove(tsr_store *s, uint64_t version, tsr_error *err)
{
    uint64_t cur;
    tsr_error tmp_err = TSR_ERROR_INIT;
    int rc = tsr_store_current(s, &cur, &tmp_err);
    if (rc == 0 && cur == version) {
        char vn[32];
        tsr_store_version_name(version, vn, sizeof vn);
        return tsr_err(err, TSR_ESTATE, "store: %s is the CURRENT version, not removed", vn);
    }
    char *vdir = version_dir(s, "", version), *gone = version_dir(s, ".tmp-rm-", version);
    struct stat st;
    rc = 0;
    if (stat(vdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no such version", vdir);
        goto done;
    }
    /* rename first: a crash during the deletion leaves a .tmp- entry, never a partial vN */
    rm_tree(gone);
    if (rename(vdir, gone) != 0) {
        rc = tsr_err(err, TSR_EIO, "rename %s to %s: %s", vdir, gone, strerror(errno));
        goto done;
    }
    if ((rc = tsr_file_fsync_dir(s->dir, err)) != 0)
        goto done;
    if (rm_tree(gone) != 0)
        rc = tsr_err(err, TSR_EIO, "remove %s: %s", gone, strerror(errno));
done:
    free(vdir);
    free(gone);
    return rc;
}

/* ---- writing a version --------------------------------------------------------------------- */

int tsr_store_begin(tsr_store *s, uint64_t version, tsr_store_txn **out, tsr_error *err)
{
    *out = NULL;
    if (s->txn_open)
        return tsr_err(err, TSR_ESTATE, "store %s: another version is being written", s->dir);
    tsr_store_txn *t = calloc(1, sizeof *t);
    if (t == NULL)
        return tsr_err(err, TSR_ENOMEM, "store: out of memory");
    t->s = s;
    t->version = version;
    t->tmp = version_dir(s, ".tmp-", version);
    t->final = version_dir(s, "", version);
    struct stat st;
    int rc;
    if (stat(t->final, &st) == 0) {
        rc = tsr_err(err, TSR_ESTATE, "%s: version already committed", t->final);
        goto fail;
    }
    if (rm_tree(t->tmp) != 0) {
        rc = tsr_err(err, TSR_EIO, "remove stale %s: %s", t->tmp, strerror(errno));
        goto fail;
    }
    if (mkdir(t->tmp, 0755) != 0) {
        rc = tsr_err(err, TSR_EIO, "mkdir %s: %s", t->tmp, strerror(errno));
        goto fail;
    }
    s->txn_open = 1;
    *out = t;
    return 0;
fail:
    free(t->tmp);
    free(t->final);
    free(t);
    return rc;
}

const char *tsr_store_txn_dir(const tsr_store_txn *t)
{
    return t->tmp;
}

static void txn_free(tsr_store_txn *t)
{
    t->s->txn_open = 0;
    free(t->tmp);
    free(t->final);
    free(t->e);
    free(t);
}

void tsr_store_abort(tsr_store_txn *t)
{
    if (t == NULL)
        return;
    rm_tree(t->tmp);
    txn_free(t);
}

static int txn_has(const tsr_store_txn *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->e[i].name, name) == 0)
            return 1;
    return 0;
}

int tsr_store_file_open(tsr_store_txn *t, const char *name, tsr_store_file **out,
                        tsr_error *err)
{
    *out = NULL;
    if (!valid_name(name))
        return tsr_err(err, TSR_EINVAL,
                       "store: bad file name \"%.64s\" (want [A-Za-z0-9._-], no leading '.', not MANIFEST)",
                       name);
    if (txn_has(t, name))
        return tsr_err(err, TSR_EINVAL, "store: %s written twice", name);
    tsr_store_file *f = calloc(1, sizeof *f);
    if (f == NULL)
        return tsr_err(err, TSR_ENOMEM, "store: out of memory");
    f->t = t;
    f->path = join(t->tmp, name);
    strcpy(f->e.name, name);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f->fd < 0) {
        int rc = tsr_err(err, errno == EEXIST ? TSR_EINVAL : TSR_EIO, "create %s: %s", f->path,
                         strerror(errno));
        free(f->path);
        free(f);
        return rc;
    }
    t->open_files++;
    *out = f;
    return 0;
}

int tsr_store_file_write(tsr_store_file *f, const void *buf, size_t len, tsr_error *err)
{
    int rc = tsr_file_write_all(f->fd, buf, len, f->path, err);
    if (rc == 0) {
        f->e.crc = tsr_store_crc32(f->e.crc, buf, len);
        f->e.size += len;
    }
    return rc;
}

static void file_free(tsr_store_file *f, int remove)
{
    if (f->fd >= 0)
        close(f->fd);
    if (remove)
        unlink(f->path);
    f->t->open_files--;
    free(f->path);
    free(f);
}

void tsr_store_file_abort(tsr_store_file *f)
{
    if (f != NULL)
        file_free(f, 1);
}

int tsr_store_file_close(tsr_store_file *f, tsr_error *err)
{
    tsr_store_txn *t = f->t;
    int rc = tsr_file_fsync(f->fd, f->path, err);
    if (rc == 0) {
        int fd = f->fd;
        f->fd = -1;
        if (close(fd) != 0) /* NFS and friends report deferred write errors here */
            rc = tsr_err(err, TSR_EIO, "close %s: %s", f->path, strerror(errno));
    }
    if (rc == 0) {
        if (t->n == t->cap) {
            size_t nc = t->cap ? t->cap * 2 : 8;
            entry *e = tsr_try_realloc(t->e, nc, sizeof *e);
            if (e == NULL)
                rc = tsr_err(err, TSR_ENOMEM, "store: out of memory");
            else
                t->e = e, t->cap = nc;
        }
        if (rc == 0)
            t->e[t->n++] = f->e;
    }
    file_free(f, rc != 0);
    if (rc == 0)
        HOOK("file-synced");
    return rc;
}

int tsr_store_txn_write_file(tsr_store_txn *t, const char *name, const void *buf, size_t len,
                             tsr_error *err)
{
    tsr_store_file *f;
    int rc = tsr_store_file_open(t, name, &f, err);
    if (rc != 0)
        return rc;
    if ((rc = tsr_store_file_write(f, buf, len, err)) != 0) {
        tsr_store_file_abort(f);
        return rc;
    }
    return tsr_store_file_close(f, err);
}

/* Adds files other code placed in the temporary directory (fsynced and checksummed here). */
static int adopt_foreign_files(tsr_store_txn *t, tsr_error *err)
{
    DIR *d = opendir(t->tmp);
    if (d == NULL)
        return tsr_err(err, TSR_EIO, "opendir %s: %s", t->tmp, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 || txn_has(t, de->d_name))
            continue;
        char *p = join(t->tmp, de->d_name);
        struct stat st;
        if (!valid_name(de->d_name)) {
            rc = tsr_err(err, TSR_EINVAL, "%s: name not allowed in a version", p);
        } else if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            rc = tsr_err(err, TSR_EINVAL, "%s: only regular files may be in a version", p);
        } else {
            entry e;
            memset(&e, 0, sizeof e);
            strcpy(e.name, de->d_name);
            if ((rc = checksum_file(p, 1, &e.size, &e.crc, err)) == 0) {
                t->e = tsr_xrealloc(t->e, (t->n + 1) * sizeof *t->e);
                t->cap = t->n + 1;
                t->e[t->n++] = e;
            }
        }
        free(p);
    }
    closedir(d);
    return rc;
}

int tsr_store_commit(tsr_store_txn *t, tsr_error *err)
{
    int rc, fd = -1;
    char *mpath = join(t->tmp, "MANIFEST"), *text = NULL;
    if (t->open_files != 0) {
        /* a programming error; the open files point at t, so t must stay alive */
        free(mpath);
        return tsr_err(err, TSR_ESTATE, "store: %d file(s) of %s still open at commit",
                       t->open_files, t->tmp);
    }
    if ((rc = adopt_foreign_files(t, err)) != 0)
        goto fail;
    if (t->n > 1)
        qsort(t->e, t->n, sizeof *t->e, cmp_entry);

    size_t cap = 128 + t->n * (TSR_STORE_NAME_MAX + 64), len = 0;
    text = tsr_xmalloc(cap);
    char vn[32];
    tsr_store_version_name(t->version, vn, sizeof vn);
    len += (size_t)snprintf(text + len, cap - len, "tessera-manifest 1\nversion %s\n", vn);
    for (size_t i = 0; i < t->n; i++)
        len += (size_t)snprintf(text + len, cap - len, "file %s %llu crc32 %08x\n", t->e[i].name,
                                (unsigned long long)t->e[i].size, t->e[i].crc);
    uint32_t self = tsr_store_crc32(0, text, len);
    len += (size_t)snprintf(text + len, cap - len, "checksum crc32 %08x\n", self);

    fd = open(mpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tsr_err(err, TSR_EIO, "create %s: %s", mpath, strerror(errno));
        goto fail;
    }
    if ((rc = tsr_file_write_all(fd, text, len, mpath, err)) != 0 || (rc = tsr_file_fsync(fd, mpath, err)) != 0)
        goto fail;
    if (close(fd) != 0) {
        fd = -1;
        rc = tsr_err(err, TSR_EIO, "close %s: %s", mpath, strerror(errno));
        goto fail;
    }
    fd = -1;
    HOOK("manifest-synced");
    if ((rc = tsr_file_fsync_dir(t->tmp, err)) != 0)
        goto fail;
    HOOK("tmp-dir-synced");
    if (rename(t->tmp, t->final) != 0) {
        rc = tsr_err(err, TSR_EIO, "rename %s to %s: %s", t->tmp, t->final, strerror(errno));
        goto fail;
    }
    HOOK("renamed");
    if ((rc = tsr_file_fsync_dir(t->s->dir, err)) != 0) {
        /* the rename happened but may not be durable; keep the directory (it is complete) */
        goto out;
    }
    HOOK("committed");
out:
    free(text);
    free(mpath);
    txn_free(t);
    return rc;
fail:
    if (fd >= 0)
        close(fd);
    free(text);
    free(mpath);
    tsr_store_abort(t);
    return rc;
}

/* ---- records beside the versions ---------------------------------------------------------- */

static int aux_path(const tsr_store *s, const char *sub, const char *name, char *buf,
                    size_t cap, tsr_error *err)
{
    if (!valid_name(sub) || (name && !valid_name(name)))
        return tsr_err(err, TSR_EINVAL, "store: bad record name \"%.64s/%.64s\"", sub,
                       name ? name : "");
    int n = name ? snprintf(buf, cap, "%s/%s/%s", s->dir, sub, name)
                 : snprintf(buf, cap, "%s/%s", s->dir, sub);
    if (n < 0 || (size_t)n >= cap)
        return tsr_err(err, TSR_ELIMIT, "store: path of %s/%s longer than %zu bytes", sub,
                       name ? name : "", cap - 1);
    return 0;
}

int tsr_store_aux_write(tsr_store *s, const char *sub, const char *name, const void *buf,
                        size_t len, tsr_error *err)
{
    char dir[4096], path[4096], tmp[4096 + 8];
    int rc;
    if ((rc = aux_path(s, sub, NULL, dir, sizeof dir, err)) != 0 ||
        (rc = aux_path(s, sub, name, path, sizeof path, err)) != 0)
        return rc;
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return tsr_err(err, TSR_EIO, "mkdir %s: %s", dir, strerror(errno));
    return tsr_file_replace(path, tmp, dir, buf, len, err);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int tsr_store_aux_list(tsr_store *s, const char *sub, char ***names, size_t *n,
                       tsr_error *err)
{
    char dir[4096];
    int rc;
    *names = NULL;
    *n = 0;
    if ((rc = aux_path(s, sub, NULL, dir, sizeof dir, err)) != 0)
        return rc;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT)
            return 0;
        return tsr_err(err, TSR_EIO, "opendir %s: %s", dir, strerror(errno));
    }
    char **v = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, ".tmp-", 5) == 0) { /* an interrupted write */
            unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!valid_name(de->d_name))
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            v = tsr_xrealloc(v, cap * sizeof *v);
        }
        v[cnt++] = tsr_xstrdup(de->d_name);
    }
    closedir(d);
    if (cnt)
        qsort(v, cnt, sizeof *v, cmp_name);
    *names = v;
    *n = cnt;
    return 0;
}

int tsr_store_aux_read(const tsr_store *s, const char *sub, const char *name, size_t max_len,
                       void **buf, size_t *len, tsr_error *err)
{
    char path[4096];
    int rc;
    if ((rc = aux_path(s, sub, name, path, sizeof path, err)) != 0)
        return rc;
    char *b;
    rc = tsr_file_read(path, max_len, TSR_FILE_NOTFOUND, &b, len, err);
    if (rc == 0)
        *buf = b;
    return rc;
}

int tsr_store_aux_remove(tsr_store *s, const char *sub, const char *name, tsr_error *err)
{
    char path[4096];
    int rc;
    if ((rc = aux_path(s, sub, name, path, sizeof path, err)) != 0)
        return rc;
    if (unlink(path) != 0 && errno != ENOENT)
        return tsr_err(err, TSR_EIO, "remove %s: %s", path, strerror(errno));
    return 0;
}
