/*
 * batch_avro_schema — the schema side of batch_avro (internal, tsr__ prefix):
 *  - checks of a writer schema that avro-c 1.11 takes on trust (duplicate field names,
 *    nesting depth) — tsr__avro_check_writer, tsr__avro_json_depth;
 *  - the reader schema: our FeatureVector shaped per file by the writer schema, checked
 *    to resolve before avro-c's resolver sees it (which crashes on some pairs it cannot
 *    resolve) — tsr__avro_reader_schema;
 *  - pre-validation of one record's bytes against the writer schema, so that avro-c
 *    only decodes well-formed byte ranges — tsr__avro_validate.
 */
#ifndef TSR_BATCH_AVRO_SCHEMA_H
#define TSR_BATCH_AVRO_SCHEMA_H

#include <avro.h>
#include <stddef.h>
#include <stdint.h>

/* Printable excerpt of s[0..n) for messages (at most 40 bytes; control and non-ASCII
 * bytes as '?'). */
void tsr__avro_snippet(char *out, size_t cap, const char *s, size_t n);

/* Deepest nesting of JSON arrays/objects in s[0..n). */
int tsr__avro_json_depth(const char *s, size_t n);

/* 0 when w is acceptable; -1 (msg says why) or -2 (out of memory). */
int tsr__avro_check_writer(avro_schema_t w, char *msg, size_t msgcap);

/* Reader schema JSON for writer schema w: 0 with *json (new, caller frees) and *len;
 * -1 when w does not resolve to FeatureVector (msg names the field); -2 out of memory. */
int tsr__avro_reader_schema(avro_schema_t w, char **json, size_t *len, char *msg,
                            size_t msgcap);

/* State of one record's walk. The caller sets p/end (the bytes left in the block),
 * max_items, steps/max_steps and zeroes the rest; after the walk p is the record's end,
 * cost the estimated decoded bytes, why the reason of a failure. */
typedef struct tsr__avro_vstate {
    const uint8_t *p, *end;
    uint64_t items;     /* array/map items seen in this record */
    uint64_t max_items; /* bound: bytes left in the block, +16 */
    uint64_t cost;      /* estimated bytes of the decoded record */
    uint64_t *steps;    /* values walked in this block (shared by its records) */
    uint64_t max_steps; /* bound: 4 per byte of the block, +64Ki */
    char why[160];
} tsr__avro_vstate;

/* Walks one value of schema s (the writer's record) from v->p. 0 ok, -1 malformed. */
int tsr__avro_validate(tsr__avro_vstate *v, avro_schema_t s);

#endif
