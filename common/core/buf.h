/*
 * buf — a growable byte buffer for building output: metrics exposition text, generated
 * Avro schemas, a version's metadata, a serialized index.
 *
 * Appends never fail loudly: the first allocation failure sets the sticky `oom` flag and
 * every later append does nothing, so a builder appends freely and checks `oom` once at the
 * end (the pattern of sds / Redis's client buffers, minus the reallocation on every call).
 * After any append that succeeded, p[len] is a NUL, so text built here is a C string; the
 * NUL is not counted in len. Capacity doubles, so n appends cost O(total) copies.
 *
 * Caller-embedded: initialise with TSR_BUF_INIT; the builder owns p until it takes it
 * (b.p, then forget the buffer) or releases it with tsr_buf_free.
 */
#ifndef TSR_BUF_H
#define TSR_BUF_H

#include <stddef.h>

typedef struct tsr_buf {
    char *p;    /* NULL until the first append */
    size_t len; /* bytes used, not counting the NUL */
    size_t cap; /* bytes allocated */
    int oom;    /* an allocation failed: contents incomplete, appends ignored */
} tsr_buf;

#define TSR_BUF_INIT {NULL, 0, 0, 0}

/* Makes room for extra more bytes and the NUL. Returns 0, or -1 with oom set (also when
 * oom was already set). */
int tsr_buf_reserve(tsr_buf *b, size_t extra);

/* Appends n bytes of p (n may be 0: then only ensures p != NULL and the NUL). */
void tsr_buf_add(tsr_buf *b, const void *p, size_t n);

/* Appends the bytes of the C string s, without its NUL. */
void tsr_buf_puts(tsr_buf *b, const char *s);

/* Appends printf-formatted text. */
void tsr_buf_printf(tsr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees the contents and resets b to TSR_BUF_INIT. */
void tsr_buf_free(tsr_buf *b);

#endif
