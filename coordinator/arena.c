/*
 * arena — bump blocks freed together (arena.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "index/knn.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "net/metrics.h"
#include "query/topk.h"
#include "arena.h"

#define AR_BLOCK 16384
#define AR_BIG (AR_BLOCK / 4)
#define AR_ALIGN 16

void tsr__ar_own(tsr__arena *a, void *x)
{
    if (a->n == a->cap)
        a->p = tsr_xrealloc(a->p, (a->cap = a->cap ? a->cap * 2 : 16) * sizeof *a->p);
    a->p[a->n++] = x;
}

void *tsr__ar(tsr__arena *a, size_t n, size_t size)
{
    if (!n)
        n = 1;
    if (!size)
        size = 1;
    if (n > (SIZE_MAX - AR_ALIGN) / size)
        return tsr_xcalloc(n, size); /* aborts: the product overflows */
    size_t bytes = (n * size + AR_ALIGN - 1) & ~(size_t)(AR_ALIGN - 1);
    if (bytes > AR_BIG) {
        void *x = tsr_xcalloc(1, bytes);
        tsr__ar_own(a, x);
        return x;
    }
    if (bytes > a->left) {
        a->cur = tsr_xcalloc(1, AR_BLOCK);
        a->left = AR_BLOCK;
        tsr__ar_own(a, a->cur);
    }
    void *x = a->cur;
    a->cur += bytes;
    a->left -= bytes;
    return x;
}

void tsr__ar_free(tsr__arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}
