/*
 * vecs_io — TEXMEX .fvecs / .ivecs files: each row is an int32 dimension followed by that
 * many float32 (fvecs) or int32 (ivecs) values, little-endian. All rows must share one
 * dimension. Readers check sizes against the file length before allocating.
 */
#ifndef TSR_VECS_IO_H
#define TSR_VECS_IO_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Reads a whole file; on success *out is a new n*d array (caller frees). */
int tsr_fvecs_read(const char *path, float **out, size_t *n, size_t *d, tsr_error *err);
int tsr_ivecs_read(const char *path, int32_t **out, size_t *n, size_t *d, tsr_error *err);

/* Writes n rows of dimension d (borrows x). */
int tsr_fvecs_write(const char *path, const float *x, size_t n, size_t d, tsr_error *err);
int tsr_ivecs_write(const char *path, const int32_t *x, size_t n, size_t d, tsr_error *err);

#endif
