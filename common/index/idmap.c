/*
 * idmap — id map file reader and writer (format in idmap.h).
 */
#include "index/idmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/mem.h"

int tsr_idmap_write(const char *path, char *const *ids, size_t n, tsr_error *err)
{
    size_t pl = strlen(path);
    char *tmp = tsr_try_malloc(pl + 5, 1);
    if (tmp == NULL)
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        for (const char *s = ids[i]; *s; s++) {
            if (*s == '\\')
                fputs("\\\\", f);
            else if (*s == '\n')
                fputs("\\n", f);
            else if (*s == '\r')
                fputs("\\r", f);
            else
                fputc(*s, f);
        }
        fputc('\n', f);
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: write failed: %s", tmp, strerror(errno));
        fclose(f);
        unlink(tmp);
        goto done;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
    }
done:
    free(tmp);
    return rc;
}

void tsr_idmap_free(char **ids, size_t n)
{
    if (ids == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids);
}

/* The map is read whole. Its size has no bound in the format; this only refuses absurd
 * input: 2^31 labels (index search reports int32 labels) at 32 bytes an id. */
#define IDMAP_MAX ((size_t)1 << 36) /* 64 GiB */

int tsr_idmap_read(const char *path, char ***ids_out, size_t *n_out, tsr_error *err)
{
    int rc = 0;
    char *buf = NULL, **ids = NULL;
    size_t n = 0;
    size_t len;
    if ((rc = tsr_file_read(path, IDMAP_MAX, 0, &buf, &len, err)) != 0)
        return rc;
    if (len > 0 && buf[len - 1] != '\n') {
        rc = tsr_err(err, TSR_EFORMAT, "%s: offset %zu: last line has no newline", path, len);
        goto cleanup;
    }
    size_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    ids = tsr_try_calloc(lines ? lines : 1, sizeof(char *));
    if (ids == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory for %zu ids", path, lines);
        goto cleanup;
    }
    for (size_t p = 0; p < len; n++) {
        size_t e = p;
        while (buf[e] != '\n')
            e++;
        char *s = tsr_try_malloc(e - p + 1, 1);
        if (s == NULL) {
            rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
            goto cleanup;
        }
        ids[n] = s;
        size_t o = 0;
        for (size_t i = p; i < e; i++) {
            if (buf[i] != '\\') {
                s[o++] = buf[i];
                continue;
            }
            char c = i + 1 < e ? buf[i + 1] : 0;
            if (c != '\\' && c != 'n' && c != 'r') {
                rc = tsr_err(err, TSR_EFORMAT,
                             "%s: line %zu: bad escape at offset %zu, expected \\\\, \\n or \\r",
                             path, n + 1, i);
                n++;
                goto cleanup;
            }
            s[o++] = c == 'n' ? '\n' : c == 'r' ? '\r' : '\\';
            i++;
        }
        s[o] = '\0';
        p = e + 1;
    }
    *ids_out = ids;
    *n_out = n;
    ids = NULL;
cleanup:
    if (ids != NULL)
        tsr_idmap_free(ids, n);
    free(buf);
    return rc;
}
