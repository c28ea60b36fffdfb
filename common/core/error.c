/*
 * error — codes, their static text, and the caller-carried message buffer.
 */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *tsr_strerror(int code)
{
    switch (code) {
#define TSR_X_CASE(name, value, text) \
    case value:                       \
        return text;
        TSR_ERRORS(TSR_X_CASE)
#undef TSR_X_CASE
    default:
        return "unknown error";
    }
}

const char *tsr_errcode_name(int code)
{
    switch (code) {
#define TSR_X_NAME(name, value, text) \
    case name:                        \
        return &#name[4];
        TSR_ERRORS(TSR_X_NAME)
#undef TSR_X_NAME
    default:
        return "EUNKNOWN";
    }
}

int tsr_err(tsr_error *err, int code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int tsr_err_prefix(tsr_error *err, const char *fmt, ...)
{
    if (err == NULL)
        return TSR_EINTERNAL;
    char prefix[TSR_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* build in a buffer big enough for both, then truncate into msg */
    char both[2 * TSR_ERROR_MSG_MAX + 2];
    size_t lp = strlen(prefix);
    memcpy(both, prefix, lp);
    both[lp] = ':';
    both[lp + 1] = ' ';
    memcpy(both + lp + 2, err->msg, strnlen(err->msg, sizeof err->msg - 1) + 1);
    both[sizeof both - 1] = '\0';
    size_t n = strnlen(both, sizeof err->msg - 1);
    memcpy(err->msg, both, n);
    err->msg[n] = '\0';
    return err->code;
}

void tsr_error_clear(tsr_error *err)
{
    if (err == NULL)
        return;
    err->code = TSR_OK;
    err->msg[0] = '\0';
}
