/*
 * batch_csv — reader for Vertex AI Vector Search CSV batch files (SPEC §2):
 * `ID,N dense values,dimension:value sparse values,name=value lists`, one record per
 * line, numbers in Java floating-point literal syntax. Streams the file line by line in
 * bounded memory (lines longer than TSR_BATCH_MAX_LINE are reported and skipped).
 */
#ifndef TSR_BATCH_CSV_H
#define TSR_BATCH_CSV_H

#include <stddef.h>

#include "core/datapoint.h"
#include "core/error.h"

/* Reads path and calls sink once per line: record() for a valid record, invalid() with
 * the 1-based line for a bad one. dims is the index dimension (N). Returns 0, or a
 * negative TSR_E* for file-level failures only (cannot open/read, out of memory). */
int tsr_batch_csv_read(const char *path, size_t dims, const tsr_record_sink *sink,
                       tsr_error *err);

/* Same on an in-memory file (borrowed). */
int tsr_batch_csv_read_mem(const void *data, size_t len, size_t dims,
                           const tsr_record_sink *sink, tsr_error *err);

#endif
