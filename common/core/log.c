/*
 * log — see log.h.
 */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

static const char *program = "tessera";
static atomic_int threshold = -1; /* lazily from TSR_LOG_LEVEL; any thread may be first */

void tsr_log_set_program(const char *name)
{
    program = name;
}

static int level_from_env(void)
{
    const char *s = getenv("TSR_LOG_LEVEL");
    if (s == NULL)
        return TSR_LOG_INFO;
    if (strcmp(s, "debug") == 0)
        return TSR_LOG_DEBUG;
    if (strcmp(s, "warn") == 0)
        return TSR_LOG_WARN;
    if (strcmp(s, "error") == 0)
        return TSR_LOG_ERROR;
    return TSR_LOG_INFO;
}

static int below_threshold(enum tsr_log_level level)
{
    int t = atomic_load_explicit(&threshold, memory_order_relaxed);
    if (t < 0) {
        t = level_from_env();
        atomic_store_explicit(&threshold, t, memory_order_relaxed);
    }
    return (int)level < t;
}

/* Formats and prints one line: prefix, message, suffix (may be ""); clean: control
 * characters of the message become '?'. */
static void vlog(enum tsr_log_level level, int clean, const char *suffix, const char *fmt,
                 va_list ap)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, program, names[level]);
    if (n > 0 && (size_t)n < sizeof line) {
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        for (char *p = line + n; clean && *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
    }
    fprintf(stderr, "%s%s\n", line, suffix);
}

void tsr_log(enum tsr_log_level level, const char *fmt, ...)
{
    if (below_threshold(level))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, 0, "", fmt, ap);
    va_end(ap);
}

/* tsr_log_every's memory: one slot per recent key, under every_mu. */
static struct every_slot {
    char key[TSR_LOG_KEY_MAX];
    long long last_ms, every_ms; /* last line printed (tsr_clock_mono_ms), its window */
    unsigned long long quiet;    /* calls suppressed since that line */
    int used;
} every_slots[TSR_LOG_KEYS];
static unsigned long long every_dropped; /* lines of keys that found no slot */
static pthread_mutex_t every_mu = PTHREAD_MUTEX_INITIALIZER;

/* The slot of key, or a free or expired one (reset for key), or NULL when every slot is
 * inside its window. Caller holds every_mu. */
static struct every_slot *every_slot_of(const char *key, long long now)
{
    struct every_slot *freed = NULL;
    for (size_t i = 0; i < TSR_LOG_KEYS; i++) {
        struct every_slot *e = &every_slots[i];
        if (e->used && strncmp(e->key, key, sizeof e->key - 1) == 0)
            return e;
        if (!freed && (!e->used || now - e->last_ms >= e->every_ms))
            freed = e;
    }
    if (freed) {
        every_dropped += freed->quiet; /* a forgotten key's count goes to the others' */
        memset(freed, 0, sizeof *freed); /* every_ms 0: its first call prints */
        snprintf(freed->key, sizeof freed->key, "%s", key);
        freed->used = 1;
    }
    return freed;
}

int tsr_log_every(enum tsr_log_level level, const char *key, long long every_ms,
                  const char *fmt, ...)
{
    if (below_threshold(level))
        return 0;
    long long now = (long long)tsr_clock_mono_ms();
    char suffix[160] = "";
    pthread_mutex_lock(&every_mu);
    struct every_slot *e = every_slot_of(key ? key : "", now);
    if (e == NULL || (e->every_ms > 0 && now - e->last_ms < every_ms)) {
        if (e)
            e->quiet++;
        else
            every_dropped++;
        pthread_mutex_unlock(&every_mu);
        return 0;
    }
    int o = 0;
    if (e->quiet)
        o = snprintf(suffix, sizeof suffix, " (%llu more since the last line)", e->quiet);
    if (every_dropped)
        snprintf(suffix + o, sizeof suffix - (size_t)o, "; %llu lines of other keys suppressed",
                 every_dropped);
    e->quiet = 0;
    e->last_ms = now;
    e->every_ms = every_ms;
    every_dropped = 0;
    pthread_mutex_unlock(&every_mu);
    va_list ap;
    va_start(ap, fmt);
    vlog(level, 1, suffix, fmt, ap);
    va_end(ap);
    return 1;
}
