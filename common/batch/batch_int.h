/*
 * batch_int — helpers shared by the batch readers (batch_csv, batch_json, batch_delete;
 * batch_avro uses the UTF-8 check):
 * a bounded-memory line reader over a file descriptor or a memory buffer, UTF-8
 * validation, Java floating-point literal parsing (Float.parseFloat grammar) and small
 * builders that append restricts to a tsr_datapoint. Internal to the batch readers
 * (tsr__ prefix); not a public API.
 */
#ifndef TSR_BATCH_INT_H
#define TSR_BATCH_INT_H

#include <stddef.h>
#include <stdint.h>

#include "core/datapoint.h"
#include "core/error.h"

/* Longest accepted line (bytes, without the newline). A longer line is reported as one
 * invalid record and skipped; memory stays bounded by this plus the read buffer. */
#define TSR_BATCH_MAX_LINE ((size_t)16 << 20)

typedef struct tsr__lines {
    int fd;              /* -1 when reading from memory */
    const char *mem;     /* borrowed, memory source */
    size_t memlen, mempos;
    char *buf;           /* owned read buffer (fd source) */
    size_t cap, start, end;
    size_t max_line;
    uint64_t lineno;     /* 1-based number of the line last returned */
    int eof;
} tsr__lines;

/* Opens path for reading (fd source). Returns 0 or TSR_EIO with a message naming path. */
int tsr__lines_open(tsr__lines *r, const char *path, tsr_error *err);
/* Memory source; borrows data, which must outlive the reader. */
void tsr__lines_init_mem(tsr__lines *r, const void *data, size_t len);
void tsr__lines_close(tsr__lines *r);

/* Next line without its "\n" or "\r\n". Returns 1 (line in *line, length in *len, valid until the
 * next call), 0 at end of input, or a negative TSR_E* on read failure. *too_long is set
 * when the line exceeded max_line: it was skipped and *len is 0. */
int tsr__lines_next(tsr__lines *r, const char **line, size_t *len, int *too_long,
                    tsr_error *err);

/* One line for tsr__lines_run: line[0..len) is valid until the call returns, too_long as
 * from tsr__lines_next, r->lineno its 1-based number. Returns 0 to go on, 1 to stop
 * reading (not an error: e.g. the sink asked), or a negative TSR_E* with err set. */
typedef int (*tsr__line_fn)(void *ctx, const tsr__lines *r, const char *line, size_t len,
                            int too_long, tsr_error *err);

/* The open / read / close frame of the line-based readers (CSV, JSON, delete): reads the
 * file at path, or when path is NULL the memory data[0..len) (borrowed), and calls fn
 * once per line. Returns 0 at the end of input or when fn asked to stop, else the
 * negative TSR_E* of the first failure. For a file the message names path once: open
 * failures say "path: cannot open: ...", read failures and fn's errors get "path: " in
 * front. */
int tsr__lines_run(const char *path, const void *data, size_t len, tsr__line_fn fn, void *ctx,
                   tsr_error *err);

/* Reports an over-long line (too_long from tsr__lines_next) to sink->invalid as `type`
 * with the line-limit message. Returns what tsr__line_fn returns (1 when the sink
 * asked to stop, else 0). */
int tsr__lines_too_long(const tsr__lines *r, const tsr_record_sink *sink,
                        enum tsr_rec_error type);

/* The end of a line callback that parsed a record into dp: prc 0 hands dp to
 * sink->record, prc 1 reports (type, msg) to sink->invalid, prc < 0 (out of memory) sets
 * err to "line N: out of memory". Closes dp either way. Returns what tsr__line_fn
 * returns. */
int tsr__lines_result(const tsr__lines *r, const tsr_record_sink *sink, int prc,
                      tsr_datapoint *dp, enum tsr_rec_error type, const char *msg,
                      tsr_error *err);

/* 1 when s[0..n) is empty or only spaces and tabs (a blank line). */
int tsr__blank(const char *s, size_t n);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points > U+10FFFF). */
int tsr__utf8_valid(const char *s, size_t n);

/* Results of the number parsers. */
enum { TSR__NUM_OK = 0, TSR__NUM_SYNTAX = 1, TSR__NUM_NONFINITE = 2, TSR__NUM_RANGE = 3 };

/* Java Float.parseFloat / Double.parseDouble grammar on s[0..n): leading and trailing
 * characters <= ' ' are trimmed (as Java's trim), optional sign, decimal or exponent
 * form, hexadecimal 0x...p... form, optional f/F/d/D suffix. Correctly rounded. NaN and
 * Infinity literals and values that overflow give TSR__NUM_NONFINITE. */
int tsr__parse_java_float(const char *s, size_t n, float *out);
int tsr__parse_java_double(const char *s, size_t n, double *out);
/* Java Long.parseLong: optional sign, decimal digits, no spaces; TSR__NUM_RANGE when
 * outside int64. */
int tsr__parse_int64(const char *s, size_t n, int64_t *out);

/* Copies at most max bytes of s[0..n) into out (cap >= max+4) as printable text:
 * control bytes become '?', a cut never splits a UTF-8 sequence, "..." marks a cut.
 * The result is valid UTF-8 when the input was. */
void tsr__snippet(char *out, size_t cap, const char *s, size_t n, size_t max);

/* Appends value to the allow (deny != 0) or deny list of namespace ns of dp, creating the
 * namespace on first use (order of first appearance kept). Returns 0 or TSR_ENOMEM. */
int tsr__dp_add_token(tsr_datapoint *dp, const char *ns, size_t nslen, const char *val,
                      size_t vallen, int deny);
/* Adds a numeric restrict. Returns 0, 1 when ns already has a numeric restrict (nothing
 * added), or TSR_ENOMEM. */
int tsr__dp_add_numeric(tsr_datapoint *dp, const char *ns, size_t nslen,
                        const tsr_numeric_restrict *value);

/* batch_confine.c: 1 when path (resolved) is dir or below it (dir resolved, "/" = all). */
int tsr__batch_inside(const char *path, const char *dir);
/* 1 when the entry name of the folder dir (resolved) is a symlink that does not resolve
 * inside confine (a dangling one included); 0 for other entries. */
int tsr__batch_entry_outside(const char *dir, const char *name, const char *confine);

#endif
