/*
 * parallel — a tiny fork-join loop: split [0, n) into one contiguous chunk per thread.
 *
 * Used by the index engine's training and encoding (k-means assignment and update, PQ
 * sub-space training, PQ encoding). Each call starts its threads and joins them before
 * returning; there is no pool, no queue and no lock: the work items of these callers are
 * coarse (thousands of rows per chunk), so a thread start costs nothing measurable, and a
 * caller writes each output from exactly one chunk, so chunks need no synchronisation.
 * Chunk t is [n*t/T, n*(t+1)/T): the split depends only on n and T, never on timing.
 */
#ifndef TSR_PARALLEL_H
#define TSR_PARALLEL_H

#include <stddef.h>

/* Upper bound of `threads` (larger values are clamped); callers size per-thread arrays by it. */
#define TSR_PARALLEL_MAX_THREADS 256

/* Runs fn(ctx, begin, end, tid) on min(threads, n) contiguous chunks of [0, n), tid 0 on
 * the calling thread, and returns when all are done. threads <= 1 or n < 2: one call on
 * the calling thread. A thread that cannot be started has its chunk run by the caller
 * (same result, less parallel). fn must not fail halfway: it reports errors through ctx. */
void tsr_parallel_for(int threads, size_t n,
                      void (*fn)(void *ctx, size_t begin, size_t end, int tid), void *ctx);

#endif
