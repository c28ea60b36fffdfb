/*
 * mem — allocation helpers for sizes that come from input.
 *
 * Sizes read from files, messages or lines are multiplied with overflow checks and
 * allocated with a "try" allocation that returns NULL instead of aborting, so a hostile
 * header turns into TSR_ENOMEM / TSR_EFORMAT, never a crash. tsr_xmalloc is for small,
 * program-determined sizes where failure is fatal anyway.
 */
#ifndef TSR_MEM_H
#define TSR_MEM_H

#include <stddef.h>
#include <stdint.h>

/* a*b into *out; returns 0 on success, -1 on overflow. */
static inline int tsr_mul_ok(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Returns NULL on failure or when n*size overflows; caller frees. */
void *tsr_try_malloc(size_t n, size_t size);
void *tsr_try_calloc(size_t n, size_t size);
void *tsr_try_realloc(void *p, size_t n, size_t size);
/* A NUL-terminated copy of s[0..n) (s need not be terminated), or NULL. */
char *tsr_try_strndup(const char *s, size_t n);

/* Aborts with a message on failure; for program-determined sizes only. */
void *tsr_xmalloc(size_t size);
void *tsr_xcalloc(size_t n, size_t size);
void *tsr_xrealloc(void *p, size_t size);
char *tsr_xstrdup(const char *s);
char *tsr_xstrndup(const char *s, size_t n);

/* 64-byte aligned, for SIMD tables; NULL on failure; free with free(). */
void *tsr_try_aligned(size_t n, size_t size);

#endif
