/*
 * clock — the two clocks of Tessera, and which one to use.
 *
 * tsr_clock_mono_ms (CLOCK_MONOTONIC) measures time: every interval, deadline, back-off,
 * timeout and retry schedule is computed from it, so a step of the wall clock (NTP, an
 * operator's `date -s`, a VM resume) neither stretches a deadline nor expires it at once.
 * Its origin is arbitrary: a value means something only next to another value of the
 * same clock in the same process; never store it or show it.
 *
 * tsr_clock_wall_ms (CLOCK_REALTIME) says when something happened, for people and
 * records: log lines, an operation's start and end time, the process start time. Never
 * subtract two of them to decide anything.
 *
 * Condition variables that wait with a deadline are created by tsr_clock_cond_init (they
 * wait on CLOCK_MONOTONIC), their deadline made by tsr_clock_mono_timespec.
 */
#ifndef TSR_CLOCK_H
#define TSR_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC (arbitrary origin): for intervals and deadlines. */
int64_t tsr_clock_mono_ms(void);

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): for timestamps shown or stored. */
int64_t tsr_clock_wall_ms(void);

/* Initialises cv to wait on CLOCK_MONOTONIC (pthread_cond_timedwait with a deadline from
 * tsr_clock_mono_timespec). Returns 0 or the pthread error. */
int tsr_clock_cond_init(pthread_cond_t *cv);

/* The CLOCK_MONOTONIC instant `after_ms` milliseconds from now, as a timespec for
 * pthread_cond_timedwait on a condition variable made by tsr_clock_cond_init. */
struct timespec tsr_clock_mono_timespec(int64_t after_ms);

#endif
