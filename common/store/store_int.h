/*
 * store_int — internals of the store for white-box tests (tests/unit, tests/fuzz); not a
 * public API. Neither the shard nor the coordinator uses them: their own crash tests kill
 * the process at points of their own (e.g. TSR_COORD_CRASH_AT), not inside the store.
 */
#ifndef TSR_STORE_INT_H
#define TSR_STORE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* For the fuzz harness: parses and checks MANIFEST text (copied, not modified) as
 * tsr_store_verify does before looking at files; *nfiles gets the number of entries. */
int tsr__store_check_manifest(const char *text, size_t len, uint64_t version, size_t *nfiles,
                              tsr_error *err);

/* For crash tests only: when set, called with a step name right after each durable step
 * of commit and set_current (a test kills the process there). NULL (the default) in every
 * program. Not synchronised: set it before the store is used. */
extern void (*tsr__store_hook)(const char *step);

#endif
