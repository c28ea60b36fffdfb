/*
 * batch_util — the internal helpers of the batch readers (declared in batch_int.h): line
 * reader, UTF-8 check, Java float literals and restrict builders.
 *
 * The float parser validates the Java grammar itself and computes the common case
 * (<= 19 significant digits, |exponent| <= 22) with one correctly rounded double
 * operation; the result is then narrowed to float unless the double is exactly a float
 * rounding midpoint (the only case where double rounding can differ from direct
 * rounding), in which case, like every other hard case, strtof/strtod decides.
 */
#include "batch/batch_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"

#define READ_CHUNK ((size_t)1 << 18)

int tsr__lines_open(tsr__lines *r, const char *path, tsr_error *err)
{
    memset(r, 0, sizeof *r);
    r->max_line = TSR_BATCH_MAX_LINE;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    r->cap = READ_CHUNK;
    r->buf = tsr_try_malloc(r->cap, 1);
    if (r->buf == NULL) {
        close(r->fd);
        r->fd = -1;
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory for the read buffer", path);
    }
    return 0;
}

void tsr__lines_init_mem(tsr__lines *r, const void *data, size_t len)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->mem = data;
    r->memlen = len;
    r->max_line = TSR_BATCH_MAX_LINE;
}

void tsr__lines_close(tsr__lines *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r->buf);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

static void strip_cr(const char **line, size_t *len)
{
    if (*len > 0 && (*line)[*len - 1] == '\r')
        (*len)--;
}

/* Reads more bytes into buf[end..cap). Returns bytes read, 0 at EOF, <0 on error. */
static ssize_t fill(tsr__lines *r)
{
    for (;;) {
        ssize_t n = read(r->fd, r->buf + r->end, r->cap - r->end);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0)
            r->end += (size_t)n;
        return n;
    }
}

int tsr__lines_next(tsr__lines *r, const char **line, size_t *len, int *too_long,
                    tsr_error *err)
{
    *too_long = 0;
    if (r->fd < 0) {
        if (r->mempos >= r->memlen)
            return 0;
        const char *p = r->mem + r->mempos;
        size_t rem = r->memlen - r->mempos;
        const char *nl = memchr(p, '\n', rem);
        size_t l = nl ? (size_t)(nl - p) : rem;
        r->mempos += l + (nl != NULL);
        r->lineno++;
        *line = p;
        *len = l;
        strip_cr(line, len);
        if (*len > r->max_line) {
            *too_long = 1;
            *len = 0;
        }
        return 1;
    }
    int skipping = 0; /* inside an over-long line: drop bytes until the newline */
    size_t scanned = 0; /* bytes of [start,end) already searched for '\n' */
    for (;;) {
        char *p = r->buf + r->start;
        size_t avail = r->end - r->start;
        char *nl = memchr(p + scanned, '\n', avail - scanned);
        if (nl != NULL) {
            size_t l = (size_t)(nl - p);
            r->start += l + 1;
            r->lineno++;
            if (skipping || l > r->max_line + 1) {
                *too_long = 1;
                *line = p;
                *len = 0;
                return 1;
            }
            *line = p;
            *len = l;
            strip_cr(line, len);
            if (*len > r->max_line) {
                *too_long = 1;
                *len = 0;
            }
            return 1;
        }
        scanned = avail;
        if (r->eof) {
            if (avail == 0 && !skipping)
                return 0;
            r->start = r->end;
            r->lineno++;
            *line = p;
            *len = skipping ? 0 : avail;
            *too_long = skipping;
            strip_cr(line, len);
            if (*len > r->max_line) {
                *too_long = 1;
                *len = 0;
            }
            return 1;
        }
        /* Make room: compact, then grow up to the line limit, else start skipping. */
        if (r->start > 0) {
            memmove(r->buf, r->buf + r->start, avail);
            r->end = avail;
            r->start = 0;
        }
        if (r->end == r->cap) {
            if (skipping || r->cap > r->max_line + 1) {
                skipping = 1;
                r->end = 0; /* drop what we have of the long line */
                scanned = 0;
            } else {
                size_t ncap = r->cap * 2;
                if (ncap > r->max_line + 2)
                    ncap = r->max_line + 2;
                char *nb = tsr_try_realloc(r->buf, ncap, 1);
                if (nb == NULL)
                    return tsr_err(err, TSR_ENOMEM, "out of memory growing the line buffer");
                r->buf = nb;
                r->cap = ncap;
            }
        }
        ssize_t n = fill(r);
        if (n < 0)
            return tsr_err(err, TSR_EIO, "read failed: %s", strerror(errno));
        if (n == 0)
            r->eof = 1;
    }
}

int tsr__lines_run(const char *path, const void *data, size_t len, tsr__line_fn fn, void *ctx,
                   tsr_error *err)
{
    tsr__lines r;
    if (path != NULL) {
        int rc = tsr__lines_open(&r, path, err);
        if (rc != 0)
            return rc; /* the message names path already */
    } else {
        tsr__lines_init_mem(&r, data, len);
    }
    int rc;
    const char *line;
    size_t n;
    int too_long;
    while ((rc = tsr__lines_next(&r, &line, &n, &too_long, err)) == 1) {
        rc = fn(ctx, &r, line, n, too_long, err);
        if (rc != 0)
            break;
    }
    tsr__lines_close(&r);
    if (rc > 0)
        rc = 0; /* fn asked to stop */
    if (rc != 0 && path != NULL)
        tsr_err_prefix(err, "%s", path);
    return rc;
}

int tsr__lines_too_long(const tsr__lines *r, const tsr_record_sink *sink,
                        enum tsr_rec_error type)
{
    char msg[128];
    snprintf(msg, sizeof msg, "line longer than the %zu-byte limit; skipped", r->max_line);
    return sink->invalid(sink->ctx, r->lineno, type, msg) != 0;
}

int tsr__lines_result(const tsr__lines *r, const tsr_record_sink *sink, int prc,
                      tsr_datapoint *dp, enum tsr_rec_error type, const char *msg,
                      tsr_error *err)
{
    int ret;
    if (prc < 0)
        ret = tsr_err(err, prc, "line %llu: out of memory", (unsigned long long)r->lineno);
    else if (prc == 0)
        ret = sink->record(sink->ctx, r->lineno, dp) != 0;
    else
        ret = sink->invalid(sink->ctx, r->lineno, type, msg) != 0;
    tsr_datapoint_close(dp);
    return ret;
}

int tsr__blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t')
            return 0;
    return 1;
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */

int tsr__utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + need >= n)
            return 0;
        for (size_t k = 1; k <= need; k++) {
            unsigned cc = s[i + k];
            if ((cc & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* ---- numbers -------------------------------------------------------------------------- */

static const double pow10_tab[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static void java_trim(const char **s, size_t *n)
{
    while (*n > 0 && (unsigned char)(*s)[0] <= ' ') {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && (unsigned char)(*s)[*n - 1] <= ' ')
        (*n)--;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Validates the Java grammar on the trimmed text. On success sets *body_len (text
 * without the f/F/d/D suffix), and for decimal literals the fast-path data: *w (first
 * up to 19 significant digits), *e10 (decimal exponent to apply), *exact (1 when all
 * digits fit in w and the exponent was parsed exactly). *neg is the sign. *hex for hex.
 * Returns TSR__NUM_OK, TSR__NUM_SYNTAX or TSR__NUM_NONFINITE (NaN/Infinity). */
static int java_scan(const char *s, size_t n, size_t *body_len, int *neg, int *hex,
                     uint64_t *w, int64_t *e10, int *exact)
{
    size_t i = 0;
    *neg = 0;
    *hex = 0;
    *w = 0;
    *e10 = 0;
    *exact = 1;
    if (i < n && (s[i] == '+' || s[i] == '-')) {
        *neg = s[i] == '-';
        i++;
    }
    if (n - i == 3 && memcmp(s + i, "NaN", 3) == 0)
        return TSR__NUM_NONFINITE;
    if (n - i == 8 && memcmp(s + i, "Infinity", 8) == 0)
        return TSR__NUM_NONFINITE;
    if (n - i >= 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        *hex = 1;
        i += 2;
        size_t digits = 0;
        while (i < n && is_hex(s[i])) {
            i++;
            digits++;
        }
        if (i < n && s[i] == '.') {
            i++;
            while (i < n && is_hex(s[i])) {
                i++;
                digits++;
            }
        }
        if (digits == 0 || i >= n || (s[i] != 'p' && s[i] != 'P'))
            return TSR__NUM_SYNTAX;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t ed = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            i++;
            ed++;
        }
        if (ed == 0)
            return TSR__NUM_SYNTAX;
        *body_len = i;
        if (i < n && (s[i] == 'f' || s[i] == 'F' || s[i] == 'd' || s[i] == 'D'))
            i++;
        return i == n ? TSR__NUM_OK : TSR__NUM_SYNTAX;
    }
    size_t digits = 0, sig = 0;
    int64_t drop = 0; /* exponent adjustment for digits not kept / after the point */
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        unsigned d = (unsigned)(s[i] - '0');
        if (sig > 0 || d != 0) {
            if (sig < 19) {
                *w = *w * 10 + d;
                sig++;
            } else {
                drop++;
                if (d != 0)
                    *exact = 0;
            }
        }
        i++;
        digits++;
    }
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            unsigned d = (unsigned)(s[i] - '0');
            if (sig > 0 || d != 0) {
                if (sig < 19) {
                    *w = *w * 10 + d;
                    sig++;
                    drop--;
                } else if (d != 0) {
                    *exact = 0;
                }
            } else {
                drop--;
            }
            i++;
            digits++;
        }
    }
    if (digits == 0)
        return TSR__NUM_SYNTAX;
    int64_t ex = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int eneg = 0;
        if (i < n && (s[i] == '+' || s[i] == '-')) {
            eneg = s[i] == '-';
            i++;
        }
        size_t ed = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (ex < 100000)
                ex = ex * 10 + (s[i] - '0');
            else
                *exact = 0;
            i++;
            ed++;
        }
        if (ed == 0)
            return TSR__NUM_SYNTAX;
        if (eneg)
            ex = -ex;
    }
    *body_len = i;
    if (i < n && (s[i] == 'f' || s[i] == 'F' || s[i] == 'd' || s[i] == 'D'))
        i++;
    if (i != n)
        return TSR__NUM_SYNTAX;
    *e10 = ex + drop;
    return TSR__NUM_OK;
}

/* strtof (is_float: into *f) or strtod (into *d) on a NUL-terminated copy of s[0..n);
 * the output is written only when the value is finite. */
static int slow_parse(const char *s, size_t n, int is_float, double *d, float *f)
{
    char local[128];
    char *buf = local;
    if (n + 1 > sizeof local) {
        buf = tsr_try_malloc(n + 1, 1);
        if (buf == NULL)
            return TSR__NUM_RANGE;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    int rc = TSR__NUM_OK;
    if (is_float) {
        float v = strtof(buf, NULL);
        if (isinf(v))
            rc = TSR__NUM_NONFINITE;
        else
            *f = v;
    } else {
        double v = strtod(buf, NULL);
        if (isinf(v))
            rc = TSR__NUM_NONFINITE;
        else
            *d = v;
    }
    if (buf != local)
        free(buf);
    return rc;
}

/* The correctly rounded double for the decimal fast path, or 0 when not applicable. */
static int fast_double(uint64_t w, int64_t e10, int exact, double *out)
{
    if (!exact)
        return 0;
    if (w == 0) {
        *out = 0.0;
        return 1;
    }
    if (w > (1ULL << 53) || e10 < -22 || e10 > 22)
        return 0;
    double d = (double)w;
    *out = e10 >= 0 ? d * pow10_tab[e10] : d / pow10_tab[-e10];
    return 1;
}

/* A Java literal s[0..n) (blanks around it ignored) as a float (is_float: into *f) or a
 * double (into *d), written only on TSR__NUM_OK; returns as slow_parse. The decimal fast
 * path gives a correctly rounded double; for a float it is used only when rounding that
 * double to float cannot differ from rounding the decimal (a normal float, and not
 * halfway between two floats), else strtof decides. */
static int java_parse(const char *s, size_t n, int is_float, double *d, float *f)
{
    java_trim(&s, &n);
    size_t body;
    int neg, hex, exact;
    uint64_t w;
    int64_t e10;
    int rc = java_scan(s, n, &body, &neg, &hex, &w, &e10, &exact);
    if (rc != TSR__NUM_OK)
        return rc;
    double fd;
    if (!hex && fast_double(w, e10, exact, &fd)) {
        if (!is_float) {
            *d = neg ? -fd : fd;
            return TSR__NUM_OK;
        }
        uint64_t bits;
        memcpy(&bits, &fd, sizeof bits);
        int be = (int)((bits >> 52) & 0x7FF) - 1023;
        if (fd == 0.0 ||
            (be >= -125 && be <= 126 && (bits & 0x1FFFFFFFULL) != 0x10000000ULL)) {
            float ff = (float)fd;
            *f = neg ? -ff : ff;
            return TSR__NUM_OK;
        }
    }
    return slow_parse(s, body, is_float, d, f);
}

int tsr__parse_java_float(const char *s, size_t n, float *out)
{
    return java_parse(s, n, 1, NULL, out);
}

int tsr__parse_java_double(const char *s, size_t n, double *out)
{
    return java_parse(s, n, 0, out, NULL);
}

int tsr__parse_int64(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) {
        neg = s[i] == '-';
        i++;
    }
    if (i == n)
        return TSR__NUM_SYNTAX;
    uint64_t v = 0;
    const uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    int range = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return TSR__NUM_SYNTAX;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10)
            range = 1;
        else
            v = v * 10 + d;
    }
    if (range)
        return TSR__NUM_RANGE;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return TSR__NUM_OK;
}

void tsr__snippet(char *out, size_t cap, const char *s, size_t n, size_t max)
{
    size_t o = 0, i = 0;
    if (cap < max + 4)
        max = cap > 4 ? cap - 4 : 0;
    while (i < n && o < max) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (o + l > max || i + l > n)
            break;
        if (l == 1) {
            out[o++] = (c < 0x20 || c == 0x7F) ? '?' : (char)c;
        } else {
            memcpy(out + o, s + i, l);
            o += l;
        }
        i += l;
    }
    if (i < n && o + 3 < cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* ---- restrict builders ---------------------------------------------------------------- */

/* Grows an array whose capacity is implicit in its count: 4, 8, 16, ... */
static int grow(void **arr, size_t n, size_t elem)
{
    if (n != 0 && (n < 4 || (n & (n - 1)) != 0))
        return 0;
    size_t ncap = n < 4 ? 4 : n * 2;
    void *p = tsr_try_realloc(*arr, ncap, elem);
    if (p == NULL)
        return TSR_ENOMEM;
    *arr = p;
    return 0;
}

int tsr__dp_add_token(tsr_datapoint *dp, const char *ns, size_t nslen, const char *val,
                      size_t vallen, int deny)
{
    tsr_token_restrict *r = NULL;
    for (size_t i = 0; i < dp->nrestricts; i++)
        if (strlen(dp->restricts[i].ns) == nslen && memcmp(dp->restricts[i].ns, ns, nslen) == 0) {
            r = &dp->restricts[i];
            break;
        }
    if (r == NULL) {
        if (grow((void **)&dp->restricts, dp->nrestricts, sizeof *dp->restricts))
            return TSR_ENOMEM;
        r = &dp->restricts[dp->nrestricts];
        memset(r, 0, sizeof *r);
        r->ns = tsr_try_strndup(ns, nslen);
        if (r->ns == NULL)
            return TSR_ENOMEM;
        dp->nrestricts++;
    }
    if (val == NULL)
        return 0; /* namespace only */
    char ***list = deny ? &r->deny : &r->allow;
    size_t *cnt = deny ? &r->ndeny : &r->nallow;
    if (grow((void **)list, *cnt, sizeof **list))
        return TSR_ENOMEM;
    char *v = tsr_try_strndup(val, vallen);
    if (v == NULL)
        return TSR_ENOMEM;
    (*list)[(*cnt)++] = v;
    return 0;
}

int tsr__dp_add_numeric(tsr_datapoint *dp, const char *ns, size_t nslen,
                        const tsr_numeric_restrict *value)
{
    for (size_t i = 0; i < dp->nnumeric; i++)
        if (strlen(dp->numeric[i].ns) == nslen && memcmp(dp->numeric[i].ns, ns, nslen) == 0)
            return 1;
    if (grow((void **)&dp->numeric, dp->nnumeric, sizeof *dp->numeric))
        return TSR_ENOMEM;
    tsr_numeric_restrict *r = &dp->numeric[dp->nnumeric];
    *r = *value;
    r->ns = tsr_try_strndup(ns, nslen);
    if (r->ns == NULL)
        return TSR_ENOMEM;
    dp->nnumeric++;
    return 0;
}
