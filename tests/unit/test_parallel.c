/*
 * test_parallel — core/parallel: the fork-join loop covers [0, n) exactly once in the
 * documented chunks, and tsr_thread_background lowers only the calling thread (nice 10 by
 * default, the value of TSR_BACKGROUND_NICE, SCHED_IDLE for "idle"), leaving the thread
 * unchanged on a value it cannot read. Each priority case runs on a thread of its own: a
 * lowered priority cannot be raised back without privilege. tsr_thread_pace(0.25) makes
 * the thread's pauses sleep (every ~2 ms of CPU): 40 ms of CPU take at least 2.5 x that in
 * wall time (4 x expected; sleeping only adds time, so the bound holds on a loaded
 * machine), while an unpaced thread's pauses and those of a pace of 0 or 1 never sleep.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/parallel.h"

#define N 1000

static void mark(void *ctx, size_t b, size_t e, int tid)
{
    int *seen = ctx;
    for (size_t i = b; i < e; i++)
        seen[i]++; /* each index exactly once */
    /* chunk tid is [n*tid/T, n*(tid+1)/T) for T = 3 */
    assert_int_equal(b, (size_t)N * (size_t)tid / 3);
    assert_int_equal(e, (size_t)N * (size_t)(tid + 1) / 3);
}

static void test_for_chunks(void **state)
{
    (void)state;
    int *seen = calloc(N, sizeof *seen);
    tsr_parallel_for(3, N, mark, seen);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    free(seen);
}

typedef struct {
    const char *env; /* NULL = unset */
    int ret, nice, policy;
} prio_case;

static void *prio_main(void *p)
{
    prio_case *c = p;
    if (c->env)
        setenv("TSR_BACKGROUND_NICE", c->env, 1);
    else
        unsetenv("TSR_BACKGROUND_NICE");
    c->ret = tsr_thread_background();
    pid_t tid = (pid_t)syscall(SYS_gettid);
    c->nice = getpriority(PRIO_PROCESS, (id_t)tid);
    c->policy = sched_getscheduler(tid);
    return NULL;
}

static prio_case run_case(const char *env)
{
    prio_case c = {env, 0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, prio_main, &c), 0);
    pthread_join(th, NULL);
    unsetenv("TSR_BACKGROUND_NICE");
    return c;
}

static void test_background(void **state)
{
    (void)state;
    int base = getpriority(PRIO_PROCESS, 0); /* this (main) thread, never lowered */
#define AT_LEAST(n) ((n) > base ? (n) : base) /* never raised above the process's own */
    prio_case c = run_case(NULL);
    assert_int_equal(c.ret, AT_LEAST(TSR_BACKGROUND_NICE));
    assert_int_equal(c.nice, AT_LEAST(TSR_BACKGROUND_NICE));
    assert_int_equal(c.policy, SCHED_OTHER);
    c = run_case("17");
    assert_int_equal(c.ret, AT_LEAST(17));
    assert_int_equal(c.nice, AT_LEAST(17));
    c = run_case("0");
    assert_int_equal(c.ret, base);
    assert_int_equal(c.nice, base);
    c = run_case("idle");
    assert_int_equal(c.ret, 20);
    assert_int_equal(c.policy, SCHED_IDLE);
    c = run_case("lots");
    assert_int_equal(c.ret, -1);
    assert_int_equal(c.nice, base);
    assert_int_equal(c.policy, SCHED_OTHER);
    c = run_case("25");
    assert_int_equal(c.ret, -1);
    assert_int_equal(c.nice, base);
    /* the main thread kept its priority through all of it */
    assert_int_equal(getpriority(PRIO_PROCESS, 0), base);
}

static int64_t now_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Burns cpu_ns of this thread's CPU, pausing every ~0.1 ms; returns the wall time taken
 * and the number of pauses that slept. */
static int64_t burn(int64_t cpu_ns, int *slept)
{
    volatile uint64_t x = 1;
    int64_t w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    *slept = 0;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0 < cpu_ns) {
        for (int i = 0; i < 20000; i++)
            x = x * 6364136223846793005ull + 1;
        *slept += tsr_thread_pause();
    }
    return now_ns(CLOCK_MONOTONIC) - w0;
}

static void *pace_main(void *p)
{
    int64_t *out = p;
    int slept = 0;
    tsr_thread_pace(0.25);
    out[0] = burn(40000000, &slept);
    out[1] = slept;
    tsr_thread_pace(1); /* off again */
    burn(5000000, &slept);
    out[2] = slept;
    tsr_thread_pace(0);
    burn(5000000, &slept);
    out[3] = slept;
    return NULL;
}

static void test_pace(void **state)
{
    (void)state;
    int slept = 0;
    burn(5000000, &slept); /* this thread was never paced */
    assert_int_equal(slept, 0);
    int64_t r[4] = {0, 0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pace_main, r), 0);
    pthread_join(th, NULL);
    assert_true(r[0] >= 100000000); /* 40 ms of CPU at 25 %: >= 160 ms expected */
    assert_true(r[1] >= 5);         /* every ~2 ms of CPU */
    assert_int_equal(r[2], 0);
    assert_int_equal(r[3], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_for_chunks),
        cmocka_unit_test(test_background),
        cmocka_unit_test(test_pace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
