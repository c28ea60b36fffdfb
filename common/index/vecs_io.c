/*
 * vecs_io — TEXMEX fvecs/ivecs readers and writers (format in vecs_io.h).
 */
#include "index/vecs_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/mem.h"

/* Both formats have 4-byte elements, so one reader serves both. The file is read whole
 * and its rows are compacted in place (each row drops its 4-byte dimension header), so the
 * peak memory is the file size. No size limit beyond the machine's memory: these are the
 * caller's own input vectors (the allocation is a try-allocation). */
static int read_vecs(const char *path, void **out, size_t *n_out, size_t *d_out, tsr_error *err)
{
    char *buf;
    size_t size;
    int rc = tsr_file_read(path, SIZE_MAX - 1, 0, &buf, &size, err);
    if (rc != 0)
        return rc;
    int32_t d32;
    if (size < 4) {
        rc = tsr_err(err, TSR_EFORMAT, "%s: offset 0: dimension: file too short", path);
        goto fail;
    }
    memcpy(&d32, buf, 4);
    if (d32 <= 0 || d32 > (1 << 20)) {
        rc = tsr_err(err, TSR_EFORMAT, "%s: offset 0: dimension %d, expected 1..1048576", path, d32);
        goto fail;
    }
    size_t d = (size_t)d32, row = 4 + 4 * d;
    if (size % row != 0) {
        rc = tsr_err(err, TSR_EFORMAT,
                     "%s: file size %zu is not a multiple of the row size %zu (dimension %zu)",
                     path, size, row, d);
        goto fail;
    }
    size_t n = size / row;
    for (size_t i = 0; i < n; i++) {
        memcpy(&d32, buf + i * row, 4);
        if ((size_t)d32 != d) {
            rc = tsr_err(err, TSR_EFORMAT, "%s: offset %zu: row %zu has dimension %d, expected %zu",
                         path, i * row, i, d32, d);
            goto fail;
        }
        memmove(buf + i * 4 * d, buf + i * row + 4, 4 * d); /* destination never ahead */
    }
    void *data = n > 0 ? realloc(buf, n * 4 * d) : NULL;
    if (data == NULL) /* shrinking failed (or nothing left): keep the larger block */
        data = buf;
    *out = data;
    *n_out = n;
    *d_out = d;
    return 0;
fail:
    free(buf);
    return rc;
}

static int write_vecs(const char *path, const void *x, size_t n, size_t d, tsr_error *err)
{
    if (d == 0 || d > (1u << 20))
        return tsr_err(err, TSR_EINVAL, "%s: dimension %zu out of range", path, d);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return tsr_err(err, TSR_EIO, "%s: cannot create: %s", path, strerror(errno));
    int32_t d32 = (int32_t)d;
    for (size_t i = 0; i < n; i++) {
        if (fwrite(&d32, 4, 1, f) != 1 || fwrite((const char *)x + i * 4 * d, 4, d, f) != d) {
            fclose(f);
            return tsr_err(err, TSR_EIO, "%s: write failed: %s", path, strerror(errno));
        }
    }
    if (fclose(f) != 0)
        return tsr_err(err, TSR_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int tsr_fvecs_read(const char *path, float **out, size_t *n, size_t *d, tsr_error *err)
{
    return read_vecs(path, (void **)out, n, d, err);
}

int tsr_ivecs_read(const char *path, int32_t **out, size_t *n, size_t *d, tsr_error *err)
{
    return read_vecs(path, (void **)out, n, d, err);
}

int tsr_fvecs_write(const char *path, const float *x, size_t n, size_t d, tsr_error *err)
{
    return write_vecs(path, x, n, d, err);
}

int tsr_ivecs_write(const char *path, const int32_t *x, size_t n, size_t d, tsr_error *err)
{
    return write_vecs(path, x, n, d, err);
}
