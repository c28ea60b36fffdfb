/*
 * log — see log.h.
 */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

void tsr_log(enum tsr_log_level level, const char *fmt, ...)
{
    int t = atomic_load_explicit(&threshold, memory_order_relaxed);
    if (t < 0) {
        t = level_from_env();
        atomic_store_explicit(&threshold, t, memory_order_relaxed);
    }
    if ((int)level < t)
        return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, program, names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
