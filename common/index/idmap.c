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

typedef struct idlist {
    char *const *ids;
    size_t n;
} idlist;

/* One id a line, with '\\', '\n' and '\r' escaped. */
static int write_ids(void *ctx, tsr_file_writer *w, tsr_error *err)
{
    const idlist *l = ctx;
    for (size_t i = 0; i < l->n; i++) {
        const char *s = l->ids[i];
        for (;;) {
            size_t run = strcspn(s, "\\\n\r");
            tsr_file_writer_add(w, s, run, err);
            s += run;
            if (*s == '\0')
                break;
            const char esc[2] = {'\\', *s == '\\' ? '\\' : *s == '\n' ? 'n' : 'r'};
            tsr_file_writer_add(w, esc, 2, err);
            s++;
        }
        tsr_file_writer_add(w, "\n", 1, err);
    }
    return w->rc; /* the writer keeps the first error */
}

int tsr_idmap_write(const char *path, char *const *ids, size_t n, tsr_error *err)
{
    idlist l = {ids, n};
    return tsr_file_replace_by(path, (size_t)1 << 20, write_ids, &l, err);
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
