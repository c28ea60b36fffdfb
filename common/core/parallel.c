/*
 * parallel — the fork-join loop (contract in parallel.h).
 */
#include "core/parallel.h"

#include <pthread.h>

typedef struct {
    void (*fn)(void *, size_t, size_t, int);
    void *ctx;
    size_t begin, end;
    int tid;
} chunk;

static void *chunk_main(void *arg)
{
    chunk *c = arg;
    c->fn(c->ctx, c->begin, c->end, c->tid);
    return NULL;
}

void tsr_parallel_for(int threads, size_t n, void (*fn)(void *, size_t, size_t, int), void *ctx)
{
    if (threads > TSR_PARALLEL_MAX_THREADS)
        threads = TSR_PARALLEL_MAX_THREADS;
    if (threads <= 1 || n < 2) {
        fn(ctx, 0, n, 0);
        return;
    }
    if ((size_t)threads > n)
        threads = (int)n;
    chunk c[TSR_PARALLEL_MAX_THREADS];
    pthread_t th[TSR_PARALLEL_MAX_THREADS];
    int started[TSR_PARALLEL_MAX_THREADS] = {0};
    for (int t = 0; t < threads; t++) {
        c[t] = (chunk){fn, ctx, n * (size_t)t / (size_t)threads,
                       n * (size_t)(t + 1) / (size_t)threads, t};
        if (t > 0)
            started[t] = pthread_create(&th[t], NULL, chunk_main, &c[t]) == 0;
    }
    chunk_main(&c[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            chunk_main(&c[t]); /* could not start a thread: do its share here */
    }
}
