/*
 * batch_avro_codec — the block codecs of Avro object container files, for batch_avro:
 * deflate (raw RFC 1951, via zlib) and snappy (own decoder: raw snappy format plus the
 * big-endian CRC32 Avro appends). Output is bounded by TSR_AVRO_MAX_BLOCK and by what the
 * compressed bytes can produce, whatever sizes the input claims. Internal (tsr__ prefix).
 */
#ifndef TSR_BATCH_AVRO_CODEC_H
#define TSR_BATCH_AVRO_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* Decompress in[0..inlen) into *out (grown as needed with realloc, capacity *outcap; the
 * caller owns and frees *out, which may be reused across calls). Return 0 with *outlen
 * set, or -1 with a message in why (corrupt data, output over TSR_AVRO_MAX_BLOCK, ENOMEM). */
int tsr__avro_inflate(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                      size_t *outlen, char *why, size_t whycap);
int tsr__avro_unsnappy(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                       size_t *outlen, char *why, size_t whycap);

#endif
