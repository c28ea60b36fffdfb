/*
 * batch_avro_int — internals of the Avro batch reader, shared by batch_avro.c,
 * batch_avro_schema.c and batch_avro_codec.c only (tsr__ prefix; not a public API).
 *
 * batch_avro_schema — the schema side of batch_avro:
 *  - checks of a writer schema that avro-c 1.11 takes on trust (duplicate field names,
 *    nesting depth) — tsr__avro_check_writer, tsr__avro_json_depth;
 *  - the reader schema: our FeatureVector shaped per file by the writer schema, checked
 *    to resolve before avro-c's resolver sees it (which crashes on some pairs it cannot
 *    resolve) — tsr__avro_reader_schema;
 *  - pre-validation of one record's bytes against the writer schema, so that avro-c
 *    only decodes well-formed byte ranges — tsr__avro_validate.
 *
 * batch_avro_codec — the block codecs of Avro object container files: deflate (raw
 * RFC 1951, via zlib) and snappy (own decoder: raw snappy format plus the big-endian
 * CRC32 Avro appends). Output is bounded by TSR_AVRO_MAX_BLOCK and by what the
 * compressed bytes can produce, whatever sizes the input claims.
 */
#ifndef TSR_BATCH_AVRO_INT_H
#define TSR_BATCH_AVRO_INT_H

#include <avro.h>
#include <stddef.h>
#include <stdint.h>

/* ---- schema (batch_avro_schema.c) ---- */

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

/* ---- block codecs (batch_avro_codec.c) ---- */

/* Decompress in[0..inlen) into *out (grown as needed with realloc, capacity *outcap; the
 * caller owns and frees *out, which may be reused across calls). Return 0 with *outlen
 * set, or -1 with a message in why (corrupt data, output over TSR_AVRO_MAX_BLOCK, ENOMEM). */
int tsr__avro_inflate(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                      size_t *outlen, char *why, size_t whycap);
int tsr__avro_unsnappy(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                       size_t *outlen, char *why, size_t whycap);

#endif
