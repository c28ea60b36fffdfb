/*
 * clock — monotonic time for intervals, wall time for timestamps (see clock.h).
 */
#include "core/clock.h"

static int64_t ms_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t tsr_clock_mono_ms(void)
{
    return ms_of(CLOCK_MONOTONIC);
}

int64_t tsr_clock_wall_ms(void)
{
    return ms_of(CLOCK_REALTIME);
}

int tsr_clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc)
        return rc;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

struct timespec tsr_clock_mono_timespec(int64_t after_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (after_ms < 0)
        after_ms = 0;
    ts.tv_sec += (time_t)(after_ms / 1000);
    ts.tv_nsec += (long)(after_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
