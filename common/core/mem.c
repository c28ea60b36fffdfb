/*
 * mem — checked and try-allocations (see mem.h for when to use which).
 */
#include "core/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *tsr_try_malloc(size_t n, size_t size)
{
    size_t bytes;
    if (tsr_mul_ok(n, size, &bytes) != 0)
        return NULL;
    return malloc(bytes ? bytes : 1);
}

void *tsr_try_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (tsr_mul_ok(n, size, &bytes) != 0)
        return NULL;
    return calloc(bytes ? n : 1, bytes ? size : 1);
}

void *tsr_try_realloc(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (tsr_mul_ok(n, size, &bytes) != 0)
        return NULL;
    return realloc(p, bytes ? bytes : 1);
}

static void oom(size_t size)
{
    fprintf(stderr, "tessera: out of memory allocating %zu bytes\n", size);
    abort();
}

void *tsr_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        oom(size);
    return p;
}

void *tsr_xcalloc(size_t n, size_t size)
{
    void *p = tsr_try_calloc(n, size);
    if (p == NULL)
        oom(n * size);
    return p;
}

void *tsr_xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (q == NULL)
        oom(size);
    return q;
}

char *tsr_xstrdup(const char *s)
{
    return tsr_xstrndup(s, strlen(s));
}

char *tsr_try_strndup(const char *s, size_t n)
{
    char *p = tsr_try_malloc(n + 1, 1); /* n + 1 overflows only at SIZE_MAX: NULL */
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

char *tsr_xstrndup(const char *s, size_t n)
{
    char *p = tsr_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void *tsr_try_aligned(size_t n, size_t size)
{
    size_t bytes;
    if (tsr_mul_ok(n, size, &bytes) != 0)
        return NULL;
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}
