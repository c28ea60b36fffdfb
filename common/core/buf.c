/*
 * buf — the growable byte buffer (contract in buf.h).
 */
#include "core/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tsr_buf_reserve(tsr_buf *b, size_t extra)
{
    if (b->oom)
        return -1;
    if (b->p != NULL && b->cap - b->len > extra)
        return 0;
    if (extra > SIZE_MAX - 1 - b->len) {
        b->oom = 1;
        return -1;
    }
    size_t need = b->len + extra + 1, cap = b->cap ? b->cap : 1024;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *q = realloc(b->p, cap);
    if (q == NULL) {
        b->oom = 1;
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

void tsr_buf_add(tsr_buf *b, const void *p, size_t n)
{
    if (tsr_buf_reserve(b, n) != 0)
        return;
    if (n > 0)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void tsr_buf_puts(tsr_buf *b, const char *s)
{
    tsr_buf_add(b, s, strlen(s));
}

void tsr_buf_printf(tsr_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1; /* an encoding error: the text would be incomplete */
        return;
    }
    if ((size_t)n < sizeof tmp) {
        tsr_buf_add(b, tmp, (size_t)n);
        return;
    }
    if (tsr_buf_reserve(b, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void tsr_buf_free(tsr_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}
