/*
 * parallel — a tiny fork-join loop: split [0, n) into one contiguous chunk per thread.
 *
 * Used by the index engine's training and encoding (k-means assignment and update, PQ
 * sub-space training, PQ encoding). Each call starts its threads and joins them before
 * returning; there is no pool, no queue and no lock: the work items of these callers are
 * coarse (thousands of rows per chunk), so a thread start costs nothing measurable, and a
 * caller writes each output from exactly one chunk, so chunks need no synchronisation.
 * Chunk t is [n*t/T, n*(t+1)/T): the split depends only on n and T, never on timing.
 *
 * Also the priority of background work (tsr_thread_background): the threads that build a
 * version (a shard's Prepare, a coordinator's update) run below the threads that serve
 * queries, so a batch update or a fold takes the CPU the queries leave.
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

/* The nice value of background work when TSR_BACKGROUND_NICE is not set. */
#define TSR_BACKGROUND_NICE 10

/* Lowers the CALLING THREAD's priority (Linux: each thread has its own) to the background
 * level: nice TSR_BACKGROUND_NICE, or the value of the environment variable
 * TSR_BACKGROUND_NICE — 0..19 (0 = not lowered), or "idle" for SCHED_IDLE (runs only on a
 * CPU nothing else wants). A thread already at that nice or lower keeps its own (it is never
 * raised, even as root). A value it cannot read or apply is logged at debug level and the
 * thread keeps its priority. Returns the thread's nice after the call (20 = idle; -1 =
 * unchanged on an error). Irreversible for an unprivileged thread: call it on a thread of
 * its own. */
int tsr_thread_background(void);

/* Paces the CALLING THREAD's work to a duty cycle: after tsr_thread_pace(f) with 0 < f < 1,
 * each tsr_thread_pause() — called by background work at its safe points (between lists
 * of a build, between chunks of a file) — sleeps once the thread has used 2 ms of CPU
 * since its last sleep, long enough that it uses at most f of one core, so its work comes
 * in short slices instead of one long burst (docs/performance.md, the fold's p99). f <= 0
 * or f >= 1: no pacing (the default of every thread). A pause on a thread never paced
 * costs one thread-local test. */
void tsr_thread_pace(double f);
int tsr_thread_pause(void); /* 1 when it slept */

#endif
