/*
 * error — the one error type of libtessera.
 *
 * Every fallible function returns 0 (TSR_OK) or a negative TSR_E* code and, when the
 * caller passes a tsr_error, fills its text with a message a person can act on (which
 * file, which offset or line, what was expected). Codes come from one X-macro so the
 * enum and tsr_strerror never disagree. Mapping to gRPC status happens only at the RPC
 * boundary (rpc module).
 */
#ifndef TSR_ERROR_H
#define TSR_ERROR_H

#include <stddef.h>

#define TSR_ERRORS(X)                                               \
    X(TSR_OK, 0, "ok")                                              \
    X(TSR_EINVAL, -1, "invalid argument")                           \
    X(TSR_ENOMEM, -2, "out of memory")                              \
    X(TSR_EIO, -3, "I/O error")                                     \
    X(TSR_EFORMAT, -4, "bad file format")                           \
    X(TSR_ENOTFOUND, -5, "not found")                               \
    X(TSR_EUNSUPPORTED, -6, "unsupported")                          \
    X(TSR_ESTATE, -7, "failed precondition")                        \
    X(TSR_EUNAVAILABLE, -8, "unavailable")                          \
    X(TSR_ETIMEOUT, -9, "deadline exceeded")                        \
    X(TSR_ELIMIT, -10, "resource exhausted")                        \
    X(TSR_EINTERNAL, -11, "internal error")                         \
    X(TSR_EREJECTED, -12, "batch rejected")

enum tsr_errcode {
#define TSR_X_ENUM(name, value, text) name = value,
    TSR_ERRORS(TSR_X_ENUM)
#undef TSR_X_ENUM
};

#define TSR_ERROR_MSG_MAX 1024

/* Caller-embedded: init with TSR_ERROR_INIT or tsr_error_clear. */
typedef struct tsr_error {
    int code;
    char msg[TSR_ERROR_MSG_MAX];
} tsr_error;

#define TSR_ERROR_INIT {0, {0}}

/* Static text for a code; never NULL. */
const char *tsr_strerror(int code);

/* The code's name without the "TSR_" prefix ("EINVAL", "EUNAVAILABLE"; "OK" for 0,
 * "EUNKNOWN" for a code outside the list), e.g. for a metrics label; never NULL. */
const char *tsr_errcode_name(int code);

/* Sets code and formatted message on err (err may be NULL); returns code, so that
 * `return tsr_err(err, TSR_EFORMAT, "...")` reads naturally. */
int tsr_err(tsr_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an already set message (e.g. a file name). Returns err->code. */
int tsr_err_prefix(tsr_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void tsr_error_clear(tsr_error *err);

#endif
