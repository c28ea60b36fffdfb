/*
 * batch_avro_codec — deflate and snappy block decoding for batch_avro (see the header).
 */
#include "batch/batch_avro_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "batch/batch_avro.h"

/* Raw deflate (RFC 1951, no zlib header), as Avro writes it. Output bounded by
 * TSR_AVRO_MAX_BLOCK. Returns 0, or -1 with why set. *out grows as needed (caller frees). */
int tsr__avro_inflate(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                         size_t *outlen, char *why, size_t whycap)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -15) != Z_OK) {
        snprintf(why, whycap, "deflate: cannot initialize zlib");
        return -1;
    }
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)inlen;
    size_t have = 0;
    int rc = -1;
    for (;;) {
        if (have == *outcap) {
            if (*outcap >= TSR_AVRO_MAX_BLOCK) {
                snprintf(why, whycap, "deflate: block inflates to more than %u MiB",
                         TSR_AVRO_MAX_BLOCK >> 20);
                goto done;
            }
            size_t ncap = *outcap ? *outcap * 2 : (inlen < 4096 ? 16384 : inlen * 4);
            if (ncap > TSR_AVRO_MAX_BLOCK)
                ncap = TSR_AVRO_MAX_BLOCK;
            uint8_t *np = realloc(*out, ncap);
            if (np == NULL) {
                snprintf(why, whycap, "deflate: out of memory");
                goto done;
            }
            *out = np;
            *outcap = ncap;
        }
        zs.next_out = *out + have;
        zs.avail_out = (uInt)(*outcap - have);
        int zr = inflate(&zs, Z_NO_FLUSH);
        have = *outcap - zs.avail_out;
        if (zr == Z_STREAM_END) {
            /* Bytes after the end of the deflate stream are ignored, as Java's Inflater
             * does: python avro writes zlib.compress(data)[2:-1], which leaves three
             * bytes of the Adler-32 trailer behind every block. */
            rc = 0;
            break;
        }
        if (zr == Z_BUF_ERROR && zs.avail_in == 0) {
            snprintf(why, whycap, "deflate: stream truncated");
            goto done;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            snprintf(why, whycap, "deflate: %s", zs.msg ? zs.msg : "corrupt data");
            goto done;
        }
    }
    *outlen = have;
done:
    inflateEnd(&zs);
    return rc;
}

/* Snappy raw format followed by the big-endian CRC32 of the uncompressed data (Avro). */
int tsr__avro_unsnappy(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
                          size_t *outlen, char *why, size_t whycap)
{
    if (inlen < 5) {
        snprintf(why, whycap, "snappy: block of %zu bytes is too short", inlen);
        return -1;
    }
    const uint8_t *p = in, *end = in + inlen - 4;
    uint64_t ulen = 0;
    int shift = 0;
    for (;;) {
        if (p >= end || shift > 28) {
            snprintf(why, whycap, "snappy: bad length preamble");
            return -1;
        }
        uint8_t b = *p++;
        ulen |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80))
            break;
    }
    /* Snappy cannot expand data more than about 64x per tag byte; this bound keeps a
     * hostile preamble from allocating what the block cannot produce. */
    if (ulen > TSR_AVRO_MAX_BLOCK || ulen > (uint64_t)inlen * 64 + 64) {
        snprintf(why, whycap, "snappy: uncompressed length %llu is out of range",
                 (unsigned long long)ulen);
        return -1;
    }
    if (*outcap < ulen || *out == NULL) {
        uint8_t *np = realloc(*out, ulen ? ulen : 1);
        if (np == NULL) {
            snprintf(why, whycap, "snappy: out of memory");
            return -1;
        }
        *out = np;
        *outcap = ulen ? ulen : 1;
    }
    uint8_t *o = *out;
    size_t op = 0;
    while (p < end) {
        uint8_t tag = *p++;
        size_t len, off = 0;
        switch (tag & 3) {
        case 0:
            len = (size_t)(tag >> 2) + 1;
            if (len > 60) {
                size_t nb = len - 60;
                if ((size_t)(end - p) < nb)
                    goto corrupt;
                len = 0;
                for (size_t k = 0; k < nb; k++)
                    len |= (size_t)p[k] << (8 * k);
                len += 1;
                p += nb;
            }
            if ((size_t)(end - p) < len || ulen - op < len)
                goto corrupt;
            memcpy(o + op, p, len);
            p += len;
            op += len;
            continue;
        case 1:
            if (end - p < 1)
                goto corrupt;
            len = ((tag >> 2) & 7) + 4;
            off = ((size_t)(tag >> 5) << 8) | p[0];
            p += 1;
            break;
        case 2:
            if (end - p < 2)
                goto corrupt;
            len = (size_t)(tag >> 2) + 1;
            off = (size_t)p[0] | ((size_t)p[1] << 8);
            p += 2;
            break;
        default:
            if (end - p < 4)
                goto corrupt;
            len = (size_t)(tag >> 2) + 1;
            off = (size_t)p[0] | ((size_t)p[1] << 8) | ((size_t)p[2] << 16) |
                  ((size_t)p[3] << 24);
            p += 4;
            break;
        }
        if (off == 0 || off > op || ulen - op < len)
            goto corrupt;
        for (size_t k = 0; k < len; k++, op++)
            o[op] = o[op - off];
    }
    if (op != ulen)
        goto corrupt;
    uint32_t want = ((uint32_t)end[0] << 24) | ((uint32_t)end[1] << 16) |
                    ((uint32_t)end[2] << 8) | end[3];
    uint32_t got = (uint32_t)crc32(0L, o, (uInt)ulen);
    if (want != got) {
        snprintf(why, whycap, "snappy: CRC32 mismatch (stored %08x, data %08x)", want, got);
        return -1;
    }
    *outlen = ulen;
    return 0;
corrupt:
    snprintf(why, whycap, "snappy: corrupt compressed data");
    return -1;
}
