/*
 * batch_json — reader for Vertex AI Vector Search JSON batch files (SPEC §2): UTF-8, one
 * JSON object per line, parsed with jansson line by line (bounded memory). Unknown
 * fields are errors naming the field and, when close, the intended one.
 */
#ifndef TSR_BATCH_JSON_H
#define TSR_BATCH_JSON_H

#include <stddef.h>

#include "core/datapoint.h"
#include "core/error.h"

/* Reads path, one sink call per line (record() or invalid() with the 1-based line).
 * Returns 0, or a negative TSR_E* for file-level failures only. */
int tsr_batch_json_read(const char *path, size_t dims, const tsr_record_sink *sink,
                        tsr_error *err);

/* Same on an in-memory file (borrowed). */
int tsr_batch_json_read_mem(const void *data, size_t len, size_t dims,
                            const tsr_record_sink *sink, tsr_error *err);

/* The known field of `known` (NULL-terminated) a user most likely meant by `name`
 * (alias table, camelCase, edit distance <= 2), or NULL. Exposed for tests. */
const char *tsr_batch_json_suggest(const char *name, const char *const *known);

#endif
