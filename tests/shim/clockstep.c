/*
 * clockstep — an LD_PRELOAD shim that steps the wall clock a process sees (tests only).
 *
 * TSR_CLOCKSTEP_FILE names a file holding a signed offset in milliseconds (decimal, e.g.
 * "-3600000"); CLOCK_REALTIME (and its _COARSE form), gettimeofday() and time() return the
 * real wall clock plus that offset. The test writes the file while the process runs: that
 * is a step of the wall clock, as NTP or `date -s` makes one, without root and without
 * touching the machine's clock. CLOCK_MONOTONIC and every other clock are left alone. The
 * file is re-read at most every 5 ms of monotonic time (a missing or unreadable file keeps
 * the last offset; 0 at first).
 *
 * The kernel's own view is not shifted: a pthread_cond_timedwait on a CLOCK_REALTIME
 * condition variable, given an absolute deadline computed from the shifted clock, waits
 * until that instant of the real clock — exactly what a real step does to it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real_cg;
static atomic_llong offset_ms;
static atomic_llong next_read_ns = 0;

static clock_gettime_fn real_clock_gettime(void)
{
    clock_gettime_fn f = atomic_load(&real_cg);
    if (!f) {
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store(&real_cg, f);
    }
    return f;
}

static long long current_offset(void)
{
    struct timespec m;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &m) != 0)
        return atomic_load(&offset_ms);
    long long now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
    long long due = atomic_load(&next_read_ns);
    if (now >= due && atomic_compare_exchange_strong(&next_read_ns, &due, now + 5000000LL)) {
        const char *path = getenv("TSR_CLOCKSTEP_FILE");
        FILE *f = path ? fopen(path, "r") : NULL;
        long long v;
        if (f) {
            if (fscanf(f, "%lld", &v) == 1)
                atomic_store(&offset_ms, v);
            fclose(f);
        }
    }
    return atomic_load(&offset_ms);
}

static void shift(struct timespec *ts)
{
    long long off = current_offset();
    long long ns = (long long)ts->tv_nsec + (off % 1000) * 1000000LL;
    ts->tv_sec += (time_t)(off / 1000);
    while (ns < 0) {
        ns += 1000000000LL;
        ts->tv_sec--;
    }
    while (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        ts->tv_sec++;
    }
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

/* glibc declares tv nonnull; a caller may still pass NULL (POSIX allows it) */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
