/*
 * batch_avro — reader for `.avro` batch files (SPEC §2, seed 003): an Avro object
 * container file whose writer schema resolves to Vertex AI's `FeatureVector` record.
 *
 * The container framing (magic, header map, sync markers, block count and size) and the
 * codecs (null, deflate, snappy) are read here, with every size checked against the
 * bytes that are really there, because avro-c's own file reader trusts block sizes.
 * Every record's bytes are walked against the writer schema before avro-c decodes them
 * (lengths, union branches, enum indexes, nesting depth, element counts), so avro-c only
 * ever sees well-formed data. Decoding and schema resolution are avro-c's
 * (avro_resolved_writer, reader schema = our FeatureVector). See docs/avro.md.
 *
 * Valid records go to sink->record, bad ones to sink->invalid with the 0-based record
 * index, the Vertex error type and a message naming the field. A corrupt block ends the
 * file with one INVALID_AVRO_SYNTAX at the index of the first record it could not read.
 * File-level failures (cannot open, not an Avro container, bad header, unknown codec,
 * a schema that does not resolve) return a negative TSR_E* code with a message in err
 * that names the file and, for resolution, the field.
 */
#ifndef TSR_BATCH_AVRO_H
#define TSR_BATCH_AVRO_H

#include <stddef.h>
#include <stdint.h>

#include "core/datapoint.h"
#include "core/error.h"

/* Limits (documented in docs/avro.md). */
#define TSR_AVRO_MAX_BLOCK (64u << 20)      /* decompressed bytes of one block */
#define TSR_AVRO_MAX_RECORD_COST (256u << 20) /* estimated decoded bytes of one record */
#define TSR_AVRO_MAX_SCHEMA (1u << 20)      /* bytes of the avro.schema header value */
#define TSR_AVRO_MAX_DEPTH 64               /* nesting of values in one record */
#define TSR_AVRO_MAX_SCHEMA_DEPTH 64        /* JSON nesting of the writer schema */

/* Reads the file at `path` (borrowed). `dims` is the index dimension: a non-empty
 * `embedding` must have exactly `dims` values. Returns 0 when the file was read to its
 * end (or the sink asked to stop), even if records were invalid. */
int tsr_batch_avro_read(const char *path, size_t dims, const tsr_record_sink *sink,
                        tsr_error *err);

/* Same, from memory (borrowed; used by the fuzzer and tests). `name` is used in
 * messages only. */
int tsr_batch_avro_read_mem(const void *data, size_t len, const char *name, size_t dims,
                            const tsr_record_sink *sink, tsr_error *err);

#endif
