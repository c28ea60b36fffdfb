/*
 * parallel — the fork-join loop (contract in parallel.h).
 */
#include "core/parallel.h"

#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

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

int tsr_thread_background(void)
{
    const char *e = getenv("TSR_BACKGROUND_NICE");
    pid_t tid = (pid_t)syscall(SYS_gettid);
    if (e && strcmp(e, "idle") == 0) {
        struct sched_param sp = {0};
        if (sched_setscheduler(tid, SCHED_IDLE, &sp) != 0) {
            tsr_debug("TSR_BACKGROUND_NICE=idle: %s", strerror(errno));
            return -1;
        }
        return 20;
    }
    long nice = TSR_BACKGROUND_NICE;
    if (e && e[0]) {
        char *end;
        nice = strtol(e, &end, 10);
        if (*end || nice < 0 || nice > 19) {
            tsr_debug("TSR_BACKGROUND_NICE=%s: expected 0..19 or idle", e);
            return -1;
        }
    }
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, (id_t)tid);
    if (errno == 0 && cur >= nice)
        return cur; /* already at least as low (a process started under nice): never raised */
    if (nice > 0 && setpriority(PRIO_PROCESS, (id_t)tid, (int)nice) != 0) {
        tsr_debug("cannot lower a background thread's priority: %s", strerror(errno));
        return -1;
    }
    return (int)nice;
}

static _Thread_local double pace_f;       /* 0 = not paced */
static _Thread_local int64_t pace_cpu_ns; /* the thread's CPU time at its last sleep */

static int64_t thread_cpu_ns(void)
{
    struct timespec ts = {0, 0};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void tsr_thread_pace(double f)
{
    pace_f = f > 0 && f < 1 ? f : 0;
    pace_cpu_ns = pace_f ? thread_cpu_ns() : 0;
}

int tsr_thread_pause(void)
{
    if (pace_f == 0)
        return 0;
    int64_t now = thread_cpu_ns(), used = now - pace_cpu_ns;
    if (used < 2000000)
        return 0;
    int64_t rest = (int64_t)((double)used * (1 - pace_f) / pace_f);
    if (rest > 1000000000)
        rest = 1000000000;
    struct timespec ts = {rest / 1000000000, rest % 1000000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    pace_cpu_ns = now;
    return 1;
}
