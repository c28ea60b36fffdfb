/*
 * batch_delete — reader for the files under batch_root/delete/ (SPEC §2): UTF-8 text,
 * one id per line; blank lines and a final newline are fine.
 */
#ifndef TSR_BATCH_DELETE_H
#define TSR_BATCH_DELETE_H

#include <stddef.h>

#include "core/datapoint.h"
#include "core/error.h"

/* Calls sink->delete_id once per id (1-based line), sink->invalid for a line that is
 * not valid UTF-8 or too long. dims is ignored (same shape as the other readers).
 * Returns 0, or a negative TSR_E* for file-level failures only. */
int tsr_batch_delete_read(const char *path, size_t dims, const tsr_record_sink *sink,
                          tsr_error *err);

/* Same on an in-memory file (borrowed). */
int tsr_batch_delete_read_mem(const void *data, size_t len, const tsr_record_sink *sink,
                              tsr_error *err);

#endif
