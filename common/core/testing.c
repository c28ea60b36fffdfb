/*
 * testing — see testing.h. Compiled to nothing in a release build.
 */
#include "core/testing.h"

#ifdef TSR_TESTING

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

static const struct {
    const char *var, *values;
} knobs[] = {
#define TSR_TEST_KNOB_ROW(id, var, kind, values, meaning) {var, values},
    TSR_TEST_KNOBS(TSR_TEST_KNOB_ROW)
#undef TSR_TEST_KNOB_ROW
};

const char *tsr_test_knob(enum tsr_test_knob_id id)
{
    return getenv(knobs[id].var);
}

/* 1 when `value` is a whole word of the knob's VALUES. */
static int listed(enum tsr_test_knob_id id, const char *value)
{
    size_t n = strlen(value);
    for (const char *p = knobs[id].values; (p = strstr(p, value)) != NULL; p += n) {
        int starts = p == knobs[id].values || p[-1] == ' ';
        if (starts && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    }
    return 0;
}

int tsr_test_is(enum tsr_test_knob_id id, const char *value)
{
    if (!listed(id, value)) {
        tsr_log(TSR_LOG_ERROR, "%s: \"%s\" is not in the table of core/testing.h", knobs[id].var,
                value);
        abort();
    }
    const char *at = getenv(knobs[id].var);
    return at != NULL && strcmp(at, value) == 0;
}

void tsr_test_crash(enum tsr_test_knob_id id, const char *step)
{
    if (tsr_test_is(id, step)) {
        tsr_log(TSR_LOG_WARN, "%s=%s: exiting with 137 (test hook)", knobs[id].var, step);
        _exit(137);
    }
}

void tsr_test_sleep(enum tsr_test_knob_id id, const char *what)
{
    const char *e = getenv(knobs[id].var);
    long ms = e ? strtol(e, NULL, 10) : 0;
    if (ms <= 0 || ms > 600000)
        return;
    tsr_log(TSR_LOG_WARN, "%s=%ld: %s sleeps first (test hook)", knobs[id].var, ms, what);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

#else

/* ISO C wants a translation unit to declare something. */
typedef int tsr__testing_release_build;

#endif
