/*
 * batch_avro — `.avro` batch files: container framing, codecs, pre-validation of record
 * bytes, avro-c schema resolution and decoding, and the checks that turn a decoded
 * FeatureVector into a tsr_datapoint (see batch_avro.h and docs/avro.md).
 *
 * Why the container is read here and not with avro_file_reader: avro-c 1.11 allocates
 * whatever block length the file states and decodes block data without bounds beyond
 * the buffer; a hostile file turns that into a huge allocation. Here every length is
 * checked against the bytes left in the file and TSR_AVRO_MAX_BLOCK, and each record is
 * first walked against the writer schema (validate_value) so that avro-c only decodes
 * byte ranges already known to be well-formed, one record at a time.
 */
#include "batch_avro.h"

#include <avro.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "mem.h"

#define AVRO_MAGIC "Obj\x01"
#define SYNC_LEN 16
#define MAX_HEADER_ENTRIES 1024
#define MAX_CODEC_NAME 64
#define MSG_MAX 512

/* ---- byte source: a FILE or a memory buffer -------------------------------------------- */

typedef struct src {
    FILE *fp;           /* NULL for memory */
    const uint8_t *mem; /* borrowed */
    size_t memlen;
    uint64_t off;       /* bytes consumed so far */
    int64_t size;       /* total bytes, -1 when unknown (pipe) */
    int ioerr;
} src;

/* 0 when n bytes were read, -1 on short input (EOF or I/O error, see ioerr). */
static int src_read(src *s, void *buf, size_t n)
{
    if (s->fp == NULL) {
        if (s->memlen - s->off < n)
            return -1;
        memcpy(buf, s->mem + s->off, n);
        s->off += n;
        return 0;
    }
    size_t got = fread(buf, 1, n, s->fp);
    s->off += got;
    if (got != n) {
        if (ferror(s->fp))
            s->ioerr = errno ? errno : EIO;
        return -1;
    }
    return 0;
}

static int64_t src_remaining(const src *s)
{
    if (s->size < 0)
        return INT64_MAX;
    return s->size - (int64_t)s->off;
}

/* 1 at end of input. */
static int src_at_eof(src *s)
{
    if (s->fp == NULL)
        return s->off == s->memlen;
    int c = getc(s->fp);
    if (c == EOF)
        return 1;
    ungetc(c, s->fp);
    return 0;
}

/* Zig-zag varint long. 0 ok, -1 short input, -2 longer than 10 bytes. */
static int src_long(src *s, int64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        uint8_t b;
        if (src_read(s, &b, 1) != 0)
            return -1;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));
            return 0;
        }
    }
    return -2;
}

/* ---- varints in memory ------------------------------------------------------------------ */

/* Zig-zag varint from p[0..end). Returns bytes used, 0 on short input or overlong. */
static size_t mem_long(const uint8_t *p, const uint8_t *end, int64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < 10 && p + i < end; i++) {
        uint8_t b = p[i];
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));
            return i + 1;
        }
    }
    return 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates, or code points > U+10FFFF). */
static int utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp, min;
        if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

/* Printable excerpt of s for messages: at most 40 bytes, control and non-ASCII bytes as
 * '?' (the text may be the invalid UTF-8 we are reporting). */
static void snippet(char *out, size_t cap, const char *s, size_t n)
{
    size_t o = 0, max = 40;
    for (size_t i = 0; i < n && i < max && o + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') ? '?' : (char)c;
    }
    if (n > max && o + 4 < cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* ---- the reader schema ------------------------------------------------------------------ */

/* Our FeatureVector, described as a tree so that the reader schema handed to avro-c can
 * be generated per file: avro-c 1.11's resolver does not use reader defaults (a reader
 * field missing from the writer is an error), so optional fields the writer lacks are
 * left out of the reader schema and read as null/empty. Record names are taken from the
 * writer (avro-c compares them; Vertex's own reader ignores them). value_int is long in
 * the reader so that int (seed) and long writers both resolve (int promotes to long). */
enum dkind { D_PRIM, D_ARRAY, D_RECORD, D_NULLABLE };

struct dfield;
typedef struct desc {
    enum dkind kind;
    const char *prim;         /* D_PRIM: Avro primitive name */
    const struct desc *sub;   /* D_ARRAY items, D_NULLABLE non-null branch */
    const char *name;         /* D_RECORD default name */
    const struct dfield *fields;
    size_t nfields;
} desc;

typedef struct dfield {
    const char *name;
    const desc *type;
    int optional; /* may be absent from the writer schema */
} dfield;

static const desc d_string = {D_PRIM, "string", NULL, NULL, NULL, 0};
static const desc d_float = {D_PRIM, "float", NULL, NULL, NULL, 0};
static const desc d_long = {D_PRIM, "long", NULL, NULL, NULL, 0};
static const desc d_double = {D_PRIM, "double", NULL, NULL, NULL, 0};
static const desc d_float_arr = {D_ARRAY, NULL, &d_float, NULL, NULL, 0};
static const desc d_long_arr = {D_ARRAY, NULL, &d_long, NULL, NULL, 0};
static const desc d_string_arr = {D_ARRAY, NULL, &d_string, NULL, NULL, 0};
static const desc d_opt_string_arr = {D_NULLABLE, NULL, &d_string_arr, NULL, NULL, 0};
static const desc d_opt_string = {D_NULLABLE, NULL, &d_string, NULL, NULL, 0};
static const desc d_opt_long = {D_NULLABLE, NULL, &d_long, NULL, NULL, 0};
static const desc d_opt_float = {D_NULLABLE, NULL, &d_float, NULL, NULL, 0};
static const desc d_opt_double = {D_NULLABLE, NULL, &d_double, NULL, NULL, 0};

static const dfield f_sparse[] = {
    {"values", &d_float_arr, 0},
    {"dimensions", &d_long_arr, 0},
};
static const desc d_sparse = {D_RECORD, NULL, NULL, "sparse_embedding", f_sparse, 2};
static const desc d_opt_sparse = {D_NULLABLE, NULL, &d_sparse, NULL, NULL, 0};

static const dfield f_restrict[] = {
    {"namespace", &d_string, 0},
    {"allow", &d_opt_string_arr, 1},
    {"deny", &d_opt_string_arr, 1},
};
static const desc d_restrict = {D_RECORD, NULL, NULL, "Restrict", f_restrict, 3};
static const desc d_restrict_arr = {D_ARRAY, NULL, &d_restrict, NULL, NULL, 0};
static const desc d_opt_restrict_arr = {D_NULLABLE, NULL, &d_restrict_arr, NULL, NULL, 0};

static const dfield f_numeric[] = {
    {"namespace", &d_string, 0},
    {"value_int", &d_opt_long, 1},
    {"value_float", &d_opt_float, 1},
    {"value_double", &d_opt_double, 1},
};
static const desc d_numeric = {D_RECORD, NULL, NULL, "NumericRestrict", f_numeric, 4};
static const desc d_numeric_arr = {D_ARRAY, NULL, &d_numeric, NULL, NULL, 0};
static const desc d_opt_numeric_arr = {D_NULLABLE, NULL, &d_numeric_arr, NULL, NULL, 0};

static const dfield f_top[] = {
    {"id", &d_string, 0},
    {"embedding", &d_float_arr, 1},
    {"sparse_embedding", &d_opt_sparse, 1},
    {"restricts", &d_opt_restrict_arr, 1},
    {"numeric_restricts", &d_opt_numeric_arr, 1},
    {"crowding_tag", &d_opt_string, 1},
};
static const desc d_top = {D_RECORD, NULL, NULL, "FeatureVector", f_top, 6};

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p != NULL && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap ? b->cap * 2 : 1024;
        while (ncap < b->len + (size_t)n + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (np == NULL) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

static avro_schema_t deref(avro_schema_t s)
{
    int guard = 0;
    while (s != NULL && avro_typeof(s) == AVRO_LINK && guard++ < 64)
        s = avro_schema_link_target(s);
    return s;
}

/* avro_schema_record_field_get (1.11) dereferences a failed lookup, so a field the
 * writer lacks crashes it; look fields up by index instead. */
static avro_schema_t field_by_name(avro_schema_t rec, const char *name)
{
    size_t n = avro_schema_record_size(rec);
    for (size_t i = 0; i < n; i++) {
        const char *fn = avro_schema_record_field_name(rec, (int)i);
        if (fn != NULL && strcmp(fn, name) == 0)
            return avro_schema_record_field_get_by_index(rec, (int)i);
    }
    return NULL;
}

/* Names are copied into JSON; accept only Avro name characters (avro-c checks them too,
 * this keeps the generated JSON well-formed whatever happens). */
static int name_ok(const char *s)
{
    if (s == NULL || *s == '\0')
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* Avro promotions avro-c's resolver implements: int -> long, float, double;
 * long -> float, double; float -> double. */
static int prim_ok(const char *prim, avro_type_t t)
{
    if (strcmp(prim, "string") == 0)
        return t == AVRO_STRING;
    if (strcmp(prim, "long") == 0)
        return t == AVRO_INT32 || t == AVRO_INT64;
    if (strcmp(prim, "float") == 0)
        return t == AVRO_INT32 || t == AVRO_INT64 || t == AVRO_FLOAT;
    if (strcmp(prim, "double") == 0)
        return t == AVRO_INT32 || t == AVRO_INT64 || t == AVRO_FLOAT || t == AVRO_DOUBLE;
    return 0;
}

static const char *desc_name(const desc *d)
{
    switch (d->kind) {
    case D_PRIM:
        return d->prim;
    case D_ARRAY:
        return d->sub->kind == D_PRIM
                   ? (strcmp(d->sub->prim, "float") == 0  ? "array<float>"
                      : strcmp(d->sub->prim, "long") == 0 ? "array<long>"
                                                          : "array<string>")
                   : "array<record>";
    case D_RECORD:
        return "record";
    case D_NULLABLE:
        return "union [null, ...]";
    }
    return "?";
}

static int gen_fail(char *msg, size_t msgcap, const char *path, avro_schema_t w, const desc *d)
{
    snprintf(msg, msgcap, "field '%s' has writer type %s, which cannot be read as %s",
             *path ? path : "(top level)", w ? avro_schema_type_name(w) : "?", desc_name(d));
    return -1;
}

/* Appends the reader schema for d, shaped by writer schema w, and checks on the way
 * that avro-c will resolve the pair: avro_resolved_writer_new of 1.11 crashes on some
 * pairs it cannot resolve (e.g. array<double> into array<float>), so it is only called
 * once this check passed. w NULL (writer union that is only null): the full reader type
 * with default names. path names the field for messages. */
static int gen_reader(sbuf *b, const desc *d, avro_schema_t w, const char *path,
                      char *msg, size_t msgcap)
{
    if (w != NULL) {
        w = deref(w);
        if (w == NULL) {
            snprintf(msg, msgcap, "field '%s': unresolved named type", path);
            return -1;
        }
    }
    avro_type_t t = w != NULL ? avro_typeof(w) : AVRO_NULL;
    switch (d->kind) {
    case D_PRIM:
        if (w != NULL && !prim_ok(d->prim, t))
            return gen_fail(msg, msgcap, path, w, d);
        sb_add(b, "\"%s\"", d->prim);
        return 0;
    case D_NULLABLE: {
        avro_schema_t one = NULL;
        if (w != NULL && t == AVRO_UNION) {
            size_t n = avro_schema_union_size(w), nonnull = 0;
            for (size_t i = 0; i < n; i++) {
                avro_schema_t br = deref(avro_schema_union_branch(w, (int)i));
                if (br == NULL)
                    return gen_fail(msg, msgcap, path, w, d);
                if (avro_typeof(br) == AVRO_NULL)
                    continue;
                nonnull++;
                if (d->sub->kind == D_PRIM) {
                    if (!prim_ok(d->sub->prim, avro_typeof(br)))
                        return gen_fail(msg, msgcap, path, br, d->sub);
                } else if (nonnull > 1) {
                    snprintf(msg, msgcap,
                             "field '%s': writer union has more than one non-null branch", path);
                    return -1;
                }
                one = br;
            }
        } else if (w != NULL && t != AVRO_NULL) {
            one = w;
        }
        sb_add(b, "[\"null\",");
        if (gen_reader(b, d->sub, one, path, msg, msgcap) != 0)
            return -1;
        sb_add(b, "]");
        return 0;
    }
    case D_ARRAY: {
        avro_schema_t wi = NULL;
        if (w != NULL) {
            if (t != AVRO_ARRAY)
                return gen_fail(msg, msgcap, path, w, d);
            wi = avro_schema_array_items(w);
            if (wi == NULL)
                return gen_fail(msg, msgcap, path, w, d);
        }
        char sub[200];
        snprintf(sub, sizeof sub, "%s[]", path);
        sb_add(b, "{\"type\":\"array\",\"items\":");
        if (gen_reader(b, d->sub, wi, sub, msg, msgcap) != 0)
            return -1;
        sb_add(b, "}");
        return 0;
    }
    case D_RECORD: {
        const char *name = d->name, *ns = NULL;
        if (w != NULL) {
            if (t != AVRO_RECORD)
                return gen_fail(msg, msgcap, path, w, d);
            name = avro_schema_name(w);
            ns = avro_schema_namespace(w);
            if (!name_ok(name) || (ns != NULL && *ns != '\0' && !name_ok(ns))) {
                snprintf(msg, msgcap, "record type of '%s' has an invalid name", path);
                return -1;
            }
        }
        sb_add(b, "{\"type\":\"record\",\"name\":\"%s\"", name);
        if (ns != NULL && *ns != '\0')
            sb_add(b, ",\"namespace\":\"%s\"", ns);
        sb_add(b, ",\"fields\":[");
        int first = 1;
        for (size_t i = 0; i < d->nfields; i++) {
            const dfield *f = &d->fields[i];
            avro_schema_t wf = NULL;
            char sub[200];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", f->name);
            if (w != NULL) {
                wf = field_by_name(w, f->name);
                if (wf == NULL) {
                    if (f->optional)
                        continue;
                    snprintf(msg, msgcap,
                             "writer schema has no field '%s' (required by FeatureVector)", sub);
                    return -1;
                }
            }
            sb_add(b, "%s{\"name\":\"%s\",\"type\":", first ? "" : ",", f->name);
            if (gen_reader(b, f->type, wf, sub, msg, msgcap) != 0)
                return -1;
            sb_add(b, "}");
            first = 0;
        }
        sb_add(b, "]}");
        return 0;
    }
    }
    return -1;
}

/* ---- pre-validation of record bytes against the writer schema ------------------------ */

/* Estimated bytes avro-c and we allocate per decoded item; only used to refuse records
 * whose decoded form would be far larger than TSR_AVRO_MAX_RECORD_COST. */
#define COST_ITEM 16u
#define COST_NODE 64u

typedef struct vstate {
    const uint8_t *p, *end;
    uint64_t items;     /* array/map items seen in this record */
    uint64_t max_items; /* bound: bytes left in the block, +16 */
    uint64_t cost;
    char why[160];
} vstate;

static int vfail(vstate *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vfail(vstate *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    return -1;
}

static int vlong(vstate *v, int64_t *out, const char *what)
{
    size_t n = mem_long(v->p, v->end, out);
    if (n == 0)
        return vfail(v, "%s: varint truncated or longer than 10 bytes", what);
    v->p += n;
    return 0;
}

static int vbytes(vstate *v, const char *what)
{
    int64_t len;
    if (vlong(v, &len, what) != 0)
        return -1;
    if (len < 0 || len > v->end - v->p)
        return vfail(v, "%s: length %lld but %lld bytes left in the block", what,
                     (long long)len, (long long)(v->end - v->p));
    v->p += len;
    v->cost += COST_NODE + (uint64_t)len;
    return 0;
}

static int validate_value(vstate *v, avro_schema_t s, int depth);

/* Array or map blocks: count (negative: -count then block byte size), items. */
static int validate_blocks(vstate *v, avro_schema_t items, int is_map, int depth)
{
    const char *what = is_map ? "map" : "array";
    for (;;) {
        int64_t count, size = -1;
        if (vlong(v, &count, what) != 0)
            return -1;
        if (count == 0)
            return 0;
        if (count < 0) {
            if (count == INT64_MIN)
                return vfail(v, "%s: block count out of range", what);
            count = -count;
            if (vlong(v, &size, what) != 0)
                return -1;
            if (size < 0 || size > v->end - v->p)
                return vfail(v, "%s: block size %lld but %lld bytes left", what, (long long)size,
                             (long long)(v->end - v->p));
        }
        if ((uint64_t)count > v->max_items - v->items)
            return vfail(v, "%s: block of %lld items is more than the data can hold", what,
                         (long long)count);
        const uint8_t *start = v->p;
        for (int64_t i = 0; i < count; i++) {
            v->items++;
            v->cost += COST_ITEM;
            if (is_map && vbytes(v, "map key") != 0)
                return -1;
            if (validate_value(v, items, depth + 1) != 0)
                return -1;
        }
        /* avro-c skips sized blocks of writer-only fields by item, we check both agree. */
        if (size >= 0 && v->p - start != size)
            return vfail(v, "%s: block size says %lld bytes, its items take %lld", what,
                         (long long)size, (long long)(v->p - start));
    }
}

static int validate_value(vstate *v, avro_schema_t s, int depth)
{
    if (depth > TSR_AVRO_MAX_DEPTH)
        return vfail(v, "values nested deeper than %d levels", TSR_AVRO_MAX_DEPTH);
    if (v->cost > TSR_AVRO_MAX_RECORD_COST)
        return vfail(v, "record too large to decode (more than %u MiB of values)",
                     TSR_AVRO_MAX_RECORD_COST >> 20);
    s = deref(s);
    if (s == NULL)
        return vfail(v, "unresolved named type in the writer schema");
    int64_t x;
    switch (avro_typeof(s)) {
    case AVRO_NULL:
        return 0;
    case AVRO_BOOLEAN:
        if (v->p >= v->end)
            return vfail(v, "boolean: truncated");
        if (*v->p > 1)
            return vfail(v, "boolean: byte %u is neither 0 nor 1", *v->p);
        v->p++;
        return 0;
    case AVRO_INT32:
        if (vlong(v, &x, "int") != 0)
            return -1;
        if (x < INT32_MIN || x > INT32_MAX)
            return vfail(v, "int: value %lld out of the 32-bit range", (long long)x);
        return 0;
    case AVRO_INT64:
        return vlong(v, &x, "long");
    case AVRO_FLOAT:
        if (v->end - v->p < 4)
            return vfail(v, "float: truncated");
        v->p += 4;
        return 0;
    case AVRO_DOUBLE:
        if (v->end - v->p < 8)
            return vfail(v, "double: truncated");
        v->p += 8;
        return 0;
    case AVRO_STRING:
        return vbytes(v, "string");
    case AVRO_BYTES:
        return vbytes(v, "bytes");
    case AVRO_FIXED: {
        int64_t n = avro_schema_fixed_size(s);
        if (n < 0 || n > v->end - v->p)
            return vfail(v, "fixed: %lld bytes but %lld left", (long long)n,
                         (long long)(v->end - v->p));
        v->p += n;
        v->cost += COST_NODE + (uint64_t)n;
        return 0;
    }
    case AVRO_ENUM:
        if (vlong(v, &x, "enum") != 0)
            return -1;
        if (x < 0 || x >= avro_schema_enum_number_of_symbols(s))
            return vfail(v, "enum: index %lld out of range", (long long)x);
        return 0;
    case AVRO_ARRAY:
        v->cost += COST_NODE;
        return validate_blocks(v, avro_schema_array_items(s), 0, depth);
    case AVRO_MAP:
        v->cost += COST_NODE;
        return validate_blocks(v, avro_schema_map_values(s), 1, depth);
    case AVRO_UNION: {
        if (vlong(v, &x, "union") != 0)
            return -1;
        size_t n = avro_schema_union_size(s);
        if (x < 0 || (uint64_t)x >= n)
            return vfail(v, "union: branch %lld but the union has %zu", (long long)x, n);
        v->cost += COST_NODE;
        return validate_value(v, avro_schema_union_branch(s, (int)x), depth + 1);
    }
    case AVRO_RECORD: {
        size_t n = avro_schema_record_size(s);
        v->cost += COST_NODE;
        for (size_t i = 0; i < n; i++) {
            avro_schema_t f = avro_schema_record_field_get_by_index(s, (int)i);
            if (f == NULL)
                return vfail(v, "record field %zu missing in the writer schema", i);
            if (validate_value(v, f, depth + 1) != 0)
                return -1;
        }
        return 0;
    }
    default:
        return vfail(v, "unsupported type %d in the writer schema", (int)avro_typeof(s));
    }
}

/* ---- codecs ------------------------------------------------------------------------------ */

enum codec { CODEC_NULL, CODEC_DEFLATE, CODEC_SNAPPY };

/* Raw deflate (RFC 1951, no zlib header), as Avro writes it. Output bounded by
 * TSR_AVRO_MAX_BLOCK. Returns 0, or -1 with why set. *out grows as needed (caller frees). */
static int inflate_block(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
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
static int unsnappy_block(const uint8_t *in, size_t inlen, uint8_t **out, size_t *outcap,
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

/* ---- the reader ------------------------------------------------------------------------- */

typedef struct rd {
    src s;
    const char *name;
    size_t dims;
    const tsr_record_sink *sink;
    uint8_t sync[SYNC_LEN];
    enum codec codec;
    avro_schema_t wschema, rschema;
    avro_value_iface_t *rclass, *resolver;
    avro_value_t dest, resolved;
    int have_dest, have_resolved;
    avro_reader_t mreader;
    uint64_t index; /* records seen so far (0-based index of the next one) */
    int stop;       /* the sink asked to stop */
} rd;

static int hdr_err(rd *r, tsr_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int hdr_err(rd *r, tsr_error *err, const char *fmt, ...)
{
    char m[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (r->s.ioerr)
        return tsr_err(err, TSR_EIO, "%s: read error at offset %llu: %s", r->name,
                       (unsigned long long)r->s.off, strerror(r->s.ioerr));
    return tsr_err(err, TSR_EFORMAT, "%s: INVALID_AVRO_SYNTAX: %s", r->name, m);
}

/* Reads a length-prefixed byte string of at most max bytes from the header into a new
 * NUL-terminated buffer (caller frees). */
static int hdr_bytes(rd *r, size_t max, char **out, size_t *outlen, const char *what,
                     tsr_error *err)
{
    int64_t len;
    uint64_t at = r->s.off;
    int rc = src_long(&r->s, &len);
    if (rc != 0)
        return hdr_err(r, err, "header %s at offset %llu: %s", what, (unsigned long long)at,
                       rc == -1 ? "file ends" : "bad varint");
    if (len < 0 || (uint64_t)len > max || len > src_remaining(&r->s))
        return hdr_err(r, err, "header %s at offset %llu: length %lld out of range", what,
                       (unsigned long long)at, (long long)len);
    char *b = malloc((size_t)len + 1);
    if (b == NULL)
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory reading the header", r->name);
    if (src_read(&r->s, b, (size_t)len) != 0) {
        free(b);
        return hdr_err(r, err, "header %s at offset %llu: file ends", what,
                       (unsigned long long)at);
    }
    b[len] = '\0';
    *out = b;
    *outlen = (size_t)len;
    return 0;
}

/* Magic, metadata map (avro.schema, avro.codec), sync marker. */
static int read_header(rd *r, char **schema, size_t *schema_len, tsr_error *err)
{
    char magic[4];
    if (src_read(&r->s, magic, 4) != 0 || memcmp(magic, AVRO_MAGIC, 4) != 0) {
        if (r->s.ioerr)
            return hdr_err(r, err, "read error");
        return hdr_err(r, err, "not an Avro object container file (the first 4 bytes are "
                               "not 'Obj' 0x01)");
    }
    char codec[MAX_CODEC_NAME + 1] = "null";
    int have_codec = 0;
    size_t entries = 0;
    for (;;) {
        int64_t count;
        uint64_t at = r->s.off;
        int rc = src_long(&r->s, &count);
        if (rc != 0)
            return hdr_err(r, err, "header map at offset %llu: %s", (unsigned long long)at,
                           rc == -1 ? "file ends" : "bad varint");
        if (count == 0)
            break;
        if (count < 0) {
            int64_t size;
            if (count == INT64_MIN || src_long(&r->s, &size) != 0)
                return hdr_err(r, err, "header map at offset %llu: bad block",
                               (unsigned long long)at);
            count = -count;
        }
        if ((uint64_t)count > MAX_HEADER_ENTRIES - entries)
            return hdr_err(r, err, "header map at offset %llu: more than %d entries",
                           (unsigned long long)at, MAX_HEADER_ENTRIES);
        for (int64_t i = 0; i < count; i++, entries++) {
            char *key = NULL, *val = NULL;
            size_t klen, vlen;
            if ((rc = hdr_bytes(r, 4096, &key, &klen, "key", err)) != 0)
                return rc;
            if ((rc = hdr_bytes(r, TSR_AVRO_MAX_SCHEMA, &val, &vlen, "value", err)) != 0) {
                free(key);
                return rc;
            }
            if (strcmp(key, "avro.schema") == 0 && klen == 11) {
                if (*schema != NULL) {
                    free(key);
                    free(val);
                    return hdr_err(r, err, "header has two avro.schema entries");
                }
                *schema = val;
                *schema_len = vlen;
                val = NULL;
            } else if (strcmp(key, "avro.codec") == 0 && klen == 10) {
                if (have_codec || vlen > MAX_CODEC_NAME || strlen(val) != vlen) {
                    free(key);
                    free(val);
                    return hdr_err(r, err, "header avro.codec entry is repeated or too long");
                }
                memcpy(codec, val, vlen + 1);
                have_codec = 1;
            }
            free(key);
            free(val);
        }
    }
    if (src_read(&r->s, r->sync, SYNC_LEN) != 0)
        return hdr_err(r, err, "header: file ends before the sync marker");
    if (*schema == NULL)
        return hdr_err(r, err, "header has no avro.schema entry");
    if (strcmp(codec, "null") == 0)
        r->codec = CODEC_NULL;
    else if (strcmp(codec, "deflate") == 0)
        r->codec = CODEC_DEFLATE;
    else if (strcmp(codec, "snappy") == 0)
        r->codec = CODEC_SNAPPY;
    else {
        char sn[64];
        snippet(sn, sizeof sn, codec, strlen(codec));
        return tsr_err(err, TSR_EUNSUPPORTED,
                       "%s: Avro codec '%s' is not supported (supported: null, deflate, snappy)",
                       r->name, sn);
    }
    return 0;
}

/* Writer schema from JSON, reader schema generated for it, avro-c resolver. */
static int setup_schemas(rd *r, const char *json, size_t len, tsr_error *err)
{
    if (avro_schema_from_json_length(json, len, &r->wschema) != 0) {
        r->wschema = NULL;
        return tsr_err(err, TSR_EFORMAT, "%s: INVALID_AVRO_SYNTAX: the writer schema in the "
                                         "header does not parse: %s",
                       r->name, avro_strerror());
    }
    if (avro_typeof(r->wschema) != AVRO_RECORD)
        return tsr_err(err, TSR_EFORMAT,
                       "%s: the writer schema is a %s, expected the FeatureVector record",
                       r->name, avro_schema_type_name(r->wschema));
    sbuf b = {NULL, 0, 0, 0};
    char msg[MSG_MAX] = "";
    int rc = gen_reader(&b, &d_top, r->wschema, "", msg, sizeof msg);
    if (rc != 0 || b.oom) {
        free(b.p);
        if (b.oom)
            return tsr_err(err, TSR_ENOMEM, "%s: out of memory", r->name);
        return tsr_err(err, TSR_EFORMAT,
                       "%s: the writer schema does not resolve to FeatureVector: %s", r->name,
                       msg);
    }
    if (avro_schema_from_json_length(b.p, b.len, &r->rschema) != 0) {
        r->rschema = NULL;
        rc = tsr_err(err, TSR_EFORMAT,
                     "%s: the writer schema does not resolve to FeatureVector (its record "
                     "names clash): %s",
                     r->name, avro_strerror());
        free(b.p);
        return rc;
    }
    free(b.p);
    r->resolver = avro_resolved_writer_new(r->wschema, r->rschema);
    if (r->resolver == NULL)
        return tsr_err(err, TSR_EFORMAT,
                       "%s: the writer schema does not resolve to FeatureVector: %s", r->name,
                       avro_strerror());
    r->rclass = avro_generic_class_from_schema(r->rschema);
    if (r->rclass == NULL)
        return tsr_err(err, TSR_EINTERNAL, "%s: avro-c: %s", r->name, avro_strerror());
    if (avro_generic_value_new(r->rclass, &r->dest) != 0)
        return tsr_err(err, TSR_ENOMEM, "%s: avro-c: %s", r->name, avro_strerror());
    r->have_dest = 1;
    if (avro_resolved_writer_new_value(r->resolver, &r->resolved) != 0)
        return tsr_err(err, TSR_ENOMEM, "%s: avro-c: %s", r->name, avro_strerror());
    r->have_resolved = 1;
    avro_resolved_writer_set_dest(&r->resolved, &r->dest);
    r->mreader = avro_reader_memory("", 0);
    if (r->mreader == NULL)
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory", r->name);
    return 0;
}

/* ---- decoded value -> tsr_datapoint ------------------------------------------------------ */

#define BAD(t, ...)                                   \
    do {                                              \
        *type = (t);                                  \
        snprintf(msg, msgcap, __VA_ARGS__);           \
        return 1;                                     \
    } while (0)

/* Non-null branch of a reader union [null, X] (or NULL for null / absent field). */
static int get_opt(avro_value_t *rec, const char *name, avro_value_t *out)
{
    avro_value_t u;
    if (avro_value_get_by_name(rec, name, &u, NULL) != 0)
        return 0;
    int disc;
    if (avro_value_get_discriminant(&u, &disc) != 0 || disc != 1)
        return 0;
    return avro_value_get_current_branch(&u, out) == 0;
}

/* A string field as a new C string; 1 with type/msg on a bad string, -1 on ENOMEM. */
static int take_string(avro_value_t *v, const char *field, char **out, size_t *outlen,
                       enum tsr_rec_error nul_type, enum tsr_rec_error *type, char *msg,
                       size_t msgcap)
{
    const char *s;
    size_t size;
    if (avro_value_get_string(v, &s, &size) != 0 || s == NULL)
        BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s: not a string", field);
    size_t n = size > 0 ? size - 1 : 0; /* avro-c sizes include the NUL */
    char sn[64];
    if (!utf8_ok((const unsigned char *)s, n)) {
        snippet(sn, sizeof sn, s, n);
        BAD(TSR_REC_INVALID_ENCODING, "%s '%s' is not valid UTF-8", field, sn);
    }
    if (memchr(s, '\0', n) != NULL) {
        snippet(sn, sizeof sn, s, n);
        BAD(nul_type, "%s '%s' contains a NUL character", field, sn);
    }
    *out = tsr_try_malloc(n + 1, 1);
    if (*out == NULL)
        return -1;
    memcpy(*out, s, n + 1);
    (*out)[n] = '\0';
    if (outlen)
        *outlen = n;
    return 0;
}

static int take_floats(avro_value_t *arr, float **out, size_t *n, const char *field,
                       enum tsr_rec_error *type, char *msg, size_t msgcap)
{
    size_t cnt;
    if (avro_value_get_size(arr, &cnt) != 0)
        BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s: not an array", field);
    *n = cnt;
    if (cnt == 0)
        return 0;
    *out = tsr_try_malloc(cnt, sizeof **out);
    if (*out == NULL)
        return -1;
    for (size_t i = 0; i < cnt; i++) {
        avro_value_t e;
        float f;
        if (avro_value_get_by_index(arr, i, &e, NULL) != 0 || avro_value_get_float(&e, &f) != 0)
            BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s[%zu]: not a float", field, i);
        if (!isfinite(f))
            BAD(TSR_REC_INVALID_EMBEDDING, "%s[%zu] is %s; values must be finite", field, i,
                isnan(f) ? "NaN" : "infinite");
        (*out)[i] = f;
    }
    return 0;
}

/* Fills an allow/deny list from the optional string array `name` of restrict r. */
static int take_tokens(avro_value_t *r, const char *name, const char *ns, size_t ri,
                       char ***out, size_t *nout, enum tsr_rec_error *type, char *msg,
                       size_t msgcap)
{
    avro_value_t arr;
    if (!get_opt(r, name, &arr))
        return 0;
    size_t cnt;
    if (avro_value_get_size(&arr, &cnt) != 0)
        BAD(TSR_REC_INVALID_AVRO_SYNTAX, "restricts[%zu].%s: not an array", ri, name);
    if (cnt == 0)
        return 0;
    *out = tsr_try_calloc(cnt, sizeof **out);
    if (*out == NULL)
        return -1;
    for (size_t i = 0; i < cnt; i++) {
        avro_value_t e;
        char field[96];
        snprintf(field, sizeof field, "restricts[%zu] (namespace '%s') %s[%zu]", ri, ns, name, i);
        if (avro_value_get_by_index(&arr, i, &e, NULL) != 0)
            BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s: missing", field);
        size_t len;
        int rc = take_string(&e, field, &(*out)[i], &len, TSR_REC_INVALID_TOKEN_VALUE, type,
                             msg, msgcap);
        if (rc != 0)
            return rc;
        (*nout)++;
        if (len == 0)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "%s is an empty token", field);
    }
    return 0;
}

/* Converts the decoded record. 0 ok, 1 invalid (type/msg set), -1 out of memory. dp is
 * partly filled on failure; the caller closes it. */
static int to_datapoint(rd *r, avro_value_t *rec, tsr_datapoint *dp, enum tsr_rec_error *type,
                        char *msg, size_t msgcap)
{
    avro_value_t v;
    int rc;
    char sn[64];

    if (avro_value_get_by_name(rec, "id", &v, NULL) != 0)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "id: missing");
    size_t idlen;
    if ((rc = take_string(&v, "id", &dp->id, &idlen, TSR_REC_INVALID_EMBEDDING_ID, type, msg,
                          msgcap)) != 0)
        return rc;
    if (idlen == 0)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "id is empty");

    if (avro_value_get_by_name(rec, "embedding", &v, NULL) == 0) {
        if ((rc = take_floats(&v, &dp->dense, &dp->ndense, "embedding", type, msg, msgcap)) != 0)
            return rc;
        if (dp->ndense != 0 && dp->ndense != r->dims)
            BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH,
                "embedding has %zu values, the index dimension is %zu", dp->ndense, r->dims);
    }

    if (get_opt(rec, "sparse_embedding", &v)) {
        avro_value_t vals, dims;
        size_t nv = 0, nd = 0;
        if (avro_value_get_by_name(&v, "values", &vals, NULL) != 0 ||
            avro_value_get_by_name(&v, "dimensions", &dims, NULL) != 0 ||
            avro_value_get_size(&vals, &nv) != 0 || avro_value_get_size(&dims, &nd) != 0)
            BAD(TSR_REC_INVALID_SPARSE_EMBEDDING, "sparse_embedding: values or dimensions missing");
        if (nv != nd)
            BAD(TSR_REC_INVALID_SPARSE_EMBEDDING,
                "sparse_embedding has %zu values but %zu dimensions; they must be equal", nv, nd);
        size_t n;
        if ((rc = take_floats(&vals, &dp->sparse_vals, &n, "sparse_embedding.values", type, msg,
                              msgcap)) != 0)
            return rc;
        dp->nsparse = nv;
        if (nd > 0) {
            dp->sparse_dims = tsr_try_malloc(nd, sizeof *dp->sparse_dims);
            if (dp->sparse_dims == NULL)
                return -1;
        }
        for (size_t i = 0; i < nd; i++) {
            avro_value_t e;
            int64_t d;
            if (avro_value_get_by_index(&dims, i, &e, NULL) != 0 ||
                avro_value_get_long(&e, &d) != 0)
                BAD(TSR_REC_INVALID_SPARSE_DIMENSIONS, "sparse_embedding.dimensions[%zu]: not a long",
                    i);
            dp->sparse_dims[i] = d;
        }
    }
    if (dp->ndense == 0 && dp->nsparse == 0)
        BAD(TSR_REC_INVALID_EMBEDDING,
            "no embedding: a record needs %zu embedding values or a non-empty sparse_embedding",
            r->dims);

    if (get_opt(rec, "restricts", &v)) {
        size_t cnt;
        if (avro_value_get_size(&v, &cnt) != 0)
            BAD(TSR_REC_INVALID_AVRO_SYNTAX, "restricts: not an array");
        if (cnt > 0) {
            dp->restricts = tsr_try_calloc(cnt, sizeof *dp->restricts);
            if (dp->restricts == NULL)
                return -1;
        }
        for (size_t i = 0; i < cnt; i++) {
            avro_value_t e, ns;
            char field[48];
            snprintf(field, sizeof field, "restricts[%zu].namespace", i);
            if (avro_value_get_by_index(&v, i, &e, NULL) != 0 ||
                avro_value_get_by_name(&e, "namespace", &ns, NULL) != 0)
                BAD(TSR_REC_NAMESPACE_MISSING, "%s: missing", field);
            tsr_token_restrict *t = &dp->restricts[i];
            dp->nrestricts++;
            size_t nslen;
            if ((rc = take_string(&ns, field, &t->ns, &nslen, TSR_REC_NAMESPACE_MISSING, type, msg,
                                  msgcap)) != 0)
                return rc;
            if (nslen == 0)
                BAD(TSR_REC_NAMESPACE_MISSING, "%s is empty", field);
            for (size_t k = 0; k < i; k++)
                if (strcmp(dp->restricts[k].ns, t->ns) == 0) {
                    snippet(sn, sizeof sn, t->ns, nslen);
                    BAD(TSR_REC_DUPLICATE_NAMESPACE,
                        "restricts[%zu]: namespace '%s' already appears in restricts[%zu]", i, sn,
                        k);
                }
            if ((rc = take_tokens(&e, "allow", t->ns, i, &t->allow, &t->nallow, type, msg,
                                  msgcap)) != 0)
                return rc;
            if ((rc = take_tokens(&e, "deny", t->ns, i, &t->deny, &t->ndeny, type, msg,
                                  msgcap)) != 0)
                return rc;
        }
    }

    if (get_opt(rec, "numeric_restricts", &v)) {
        size_t cnt;
        if (avro_value_get_size(&v, &cnt) != 0)
            BAD(TSR_REC_INVALID_AVRO_SYNTAX, "numeric_restricts: not an array");
        if (cnt > 0) {
            dp->numeric = tsr_try_calloc(cnt, sizeof *dp->numeric);
            if (dp->numeric == NULL)
                return -1;
        }
        for (size_t i = 0; i < cnt; i++) {
            avro_value_t e, ns, x;
            char field[56];
            snprintf(field, sizeof field, "numeric_restricts[%zu].namespace", i);
            if (avro_value_get_by_index(&v, i, &e, NULL) != 0 ||
                avro_value_get_by_name(&e, "namespace", &ns, NULL) != 0)
                BAD(TSR_REC_NAMESPACE_MISSING, "%s: missing", field);
            tsr_numeric_restrict *nr = &dp->numeric[i];
            dp->nnumeric++;
            size_t nslen;
            if ((rc = take_string(&ns, field, &nr->ns, &nslen, TSR_REC_NAMESPACE_MISSING, type, msg,
                                  msgcap)) != 0)
                return rc;
            if (nslen == 0)
                BAD(TSR_REC_NAMESPACE_MISSING, "%s is empty", field);
            snippet(sn, sizeof sn, nr->ns, nslen);
            for (size_t k = 0; k < i; k++)
                if (strcmp(dp->numeric[k].ns, nr->ns) == 0)
                    BAD(TSR_REC_DUPLICATE_NAMESPACE,
                        "numeric_restricts[%zu]: namespace '%s' already appears in "
                        "numeric_restricts[%zu]; a numeric namespace holds one value per record",
                        i, sn, k);
            int nset = 0;
            if (get_opt(&e, "value_int", &x)) {
                nset++;
                nr->type = TSR_NUM_INT;
                if (avro_value_get_long(&x, &nr->v.i) != 0)
                    BAD(TSR_REC_INVALID_NUMERIC_VALUE, "numeric_restricts[%zu].value_int: not an int",
                        i);
            }
            if (get_opt(&e, "value_float", &x)) {
                nset++;
                nr->type = TSR_NUM_FLOAT;
                if (avro_value_get_float(&x, &nr->v.f) != 0 || !isfinite(nr->v.f))
                    BAD(TSR_REC_INVALID_NUMERIC_VALUE,
                        "numeric_restricts[%zu] (namespace '%s').value_float is not finite", i, sn);
            }
            if (get_opt(&e, "value_double", &x)) {
                nset++;
                nr->type = TSR_NUM_DOUBLE;
                if (avro_value_get_double(&x, &nr->v.d) != 0 || !isfinite(nr->v.d))
                    BAD(TSR_REC_INVALID_NUMERIC_VALUE,
                        "numeric_restricts[%zu] (namespace '%s').value_double is not finite", i,
                        sn);
            }
            if (nset == 0)
                BAD(TSR_REC_INVALID_NUMERIC_VALUE,
                    "numeric_restricts[%zu] (namespace '%s') has none of value_int, value_float, "
                    "value_double; exactly one is needed",
                    i, sn);
            if (nset > 1)
                BAD(TSR_REC_MULTIPLE_VALUES,
                    "numeric_restricts[%zu] (namespace '%s') sets %d of value_int, value_float, "
                    "value_double; exactly one is allowed",
                    i, sn, nset);
        }
    }

    if (get_opt(rec, "crowding_tag", &v)) {
        size_t len;
        if ((rc = take_string(&v, "crowding_tag", &dp->crowding_tag, &len,
                              TSR_REC_INVALID_TOKEN_VALUE, type, msg, msgcap)) != 0)
            return rc;
        if (len == 0)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "crowding_tag is empty");
    }
    tsr_datapoint_normalize_sparse(dp);
    return 0;
}
#undef BAD

/* ---- blocks ------------------------------------------------------------------------------- */

static int report(rd *r, uint64_t where, enum tsr_rec_error type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int report(rd *r, uint64_t where, enum tsr_rec_error type, const char *fmt, ...)
{
    char m[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (r->sink->invalid != NULL && r->sink->invalid(r->sink->ctx, where, type, m) != 0)
        r->stop = 1;
    return 0;
}

/* Decodes the count records of one (decompressed) block. Returns 0, or 1 when the block
 * is corrupt (reported; the caller stops), -1 on out of memory (err set). */
static int decode_block(rd *r, const uint8_t *data, size_t len, uint64_t count, uint64_t blockno,
                        tsr_error *err)
{
    const uint8_t *p = data, *end = data + len;
    for (uint64_t k = 0; k < count && !r->stop; k++) {
        vstate v;
        memset(&v, 0, sizeof v);
        v.p = p;
        v.end = end;
        v.max_items = (uint64_t)(end - p) + 16;
        if (validate_value(&v, r->wschema, 0) != 0) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu, record %llu of %llu: %s; the rest of the file is not read",
                   (unsigned long long)blockno, (unsigned long long)k,
                   (unsigned long long)count, v.why);
            return 1;
        }
        /* One record per source: avro-c cannot read past what was validated. */
        avro_reader_memory_set_source(r->mreader, (const char *)p, (int64_t)(v.p - p));
        if (avro_value_read(r->mreader, &r->resolved) != 0) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu, record %llu: avro-c cannot decode it: %s; the rest of the "
                   "file is not read",
                   (unsigned long long)blockno, (unsigned long long)k, avro_strerror());
            return 1;
        }
        p = v.p;
        tsr_datapoint dp;
        tsr_datapoint_init(&dp);
        enum tsr_rec_error type = TSR_REC_PARSING_ERROR;
        char msg[MSG_MAX];
        int rc = to_datapoint(r, &r->dest, &dp, &type, msg, sizeof msg);
        if (rc < 0) {
            tsr_datapoint_close(&dp);
            return tsr_err(err, TSR_ENOMEM, "%s: out of memory at record %llu", r->name,
                           (unsigned long long)r->index);
        }
        if (rc > 0) {
            tsr_datapoint_close(&dp);
            report(r, r->index, type, "%s", msg);
        } else if (r->sink->record != NULL) {
            if (r->sink->record(r->sink->ctx, r->index, &dp) != 0)
                r->stop = 1;
            tsr_datapoint_close(&dp); /* no-op when the sink took the contents */
        } else {
            tsr_datapoint_close(&dp);
        }
        r->index++;
    }
    if (!r->stop && p != end) {
        report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
               "block %llu: %lld bytes left after its %llu records; the rest of the file is "
               "not read",
               (unsigned long long)blockno, (long long)(end - p), (unsigned long long)count);
        return 1;
    }
    return 0;
}

static int read_blocks(rd *r, tsr_error *err)
{
    uint8_t *raw = NULL, *plain = NULL;
    size_t rawcap = 0, plaincap = 0;
    int ret = 0;
    for (uint64_t blockno = 0; !r->stop; blockno++) {
        if (src_at_eof(&r->s))
            break;
        uint64_t at = r->s.off;
        int64_t count, size;
        int rc1 = src_long(&r->s, &count);
        int rc2 = rc1 == 0 ? src_long(&r->s, &size) : rc1;
        if (r->s.ioerr) {
            ret = tsr_err(err, TSR_EIO, "%s: read error at offset %llu: %s", r->name,
                          (unsigned long long)r->s.off, strerror(r->s.ioerr));
            break;
        }
        if (rc1 != 0 || rc2 != 0) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu at offset %llu: %s in the block header; the rest of the file is "
                   "not read",
                   (unsigned long long)blockno, (unsigned long long)at,
                   (rc1 == -1 || rc2 == -1) ? "file ends" : "bad varint");
            break;
        }
        int64_t left = src_remaining(&r->s);
        if (count < 0 || size < 0 || size > left - SYNC_LEN || size > (int64_t)TSR_AVRO_MAX_BLOCK ||
            (count > 0 && size == 0) || count > (int64_t)TSR_AVRO_MAX_BLOCK) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu at offset %llu: record count %lld / byte size %lld out of range "
                   "(%lld bytes left in the file, at most %u MiB per block); the rest of the "
                   "file is not read",
                   (unsigned long long)blockno, (unsigned long long)at, (long long)count,
                   (long long)size, (long long)(left == INT64_MAX ? -1 : left),
                   TSR_AVRO_MAX_BLOCK >> 20);
            break;
        }
        if ((size_t)size > rawcap || raw == NULL) {
            uint8_t *np = realloc(raw, size ? (size_t)size : 1);
            if (np == NULL) {
                ret = tsr_err(err, TSR_ENOMEM, "%s: out of memory for a %lld-byte block",
                              r->name, (long long)size);
                break;
            }
            raw = np;
            rawcap = size ? (size_t)size : 1;
        }
        uint8_t sync[SYNC_LEN];
        if (src_read(&r->s, raw, (size_t)size) != 0 || src_read(&r->s, sync, SYNC_LEN) != 0) {
            if (r->s.ioerr) {
                ret = tsr_err(err, TSR_EIO, "%s: read error at offset %llu: %s", r->name,
                              (unsigned long long)r->s.off, strerror(r->s.ioerr));
                break;
            }
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu at offset %llu: file ends inside the block (truncated file); "
                   "the rest of the file is not read",
                   (unsigned long long)blockno, (unsigned long long)at);
            break;
        }
        if (memcmp(sync, r->sync, SYNC_LEN) != 0) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu at offset %llu: sync marker after the block does not match the "
                   "header's (corrupt or truncated block); the rest of the file is not read",
                   (unsigned long long)blockno, (unsigned long long)at);
            break;
        }
        const uint8_t *data = raw;
        size_t len = (size_t)size;
        if (r->codec != CODEC_NULL && size > 0) {
            char why[160];
            size_t outlen = 0;
            int rc = r->codec == CODEC_DEFLATE
                         ? inflate_block(raw, (size_t)size, &plain, &plaincap, &outlen, why,
                                         sizeof why)
                         : unsnappy_block(raw, (size_t)size, &plain, &plaincap, &outlen, why,
                                          sizeof why);
            if (rc != 0) {
                report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                       "block %llu at offset %llu: %s; the rest of the file is not read",
                       (unsigned long long)blockno, (unsigned long long)at, why);
                break;
            }
            data = plain;
            len = outlen;
        }
        /* Every FeatureVector has an id, so every record takes at least one byte. */
        if ((uint64_t)count > len) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu at offset %llu: %lld records cannot fit in %zu bytes; the rest "
                   "of the file is not read",
                   (unsigned long long)blockno, (unsigned long long)at, (long long)count, len);
            break;
        }
        int rc = decode_block(r, data, len, (uint64_t)count, blockno, err);
        if (rc < 0)
            ret = rc;
        if (rc != 0)
            break;
    }
    free(raw);
    free(plain);
    return ret;
}

static int read_all(rd *r, tsr_error *err)
{
    char *schema = NULL;
    size_t schema_len = 0;
    int rc = read_header(r, &schema, &schema_len, err);
    if (rc == 0)
        rc = setup_schemas(r, schema, schema_len, err);
    free(schema);
    if (rc == 0)
        rc = read_blocks(r, err);
    if (r->mreader != NULL)
        avro_reader_free(r->mreader);
    if (r->have_resolved)
        avro_value_decref(&r->resolved);
    if (r->have_dest)
        avro_value_decref(&r->dest);
    if (r->resolver != NULL)
        avro_value_iface_decref(r->resolver);
    if (r->rclass != NULL)
        avro_value_iface_decref(r->rclass);
    if (r->rschema != NULL)
        avro_schema_decref(r->rschema);
    if (r->wschema != NULL)
        avro_schema_decref(r->wschema);
    return rc;
}

int tsr_batch_avro_read_mem(const void *data, size_t len, const char *name, size_t dims,
                            const tsr_record_sink *sink, tsr_error *err)
{
    rd r;
    memset(&r, 0, sizeof r);
    r.s.mem = data;
    r.s.memlen = len;
    r.s.size = (int64_t)len;
    r.name = name ? name : "<memory>";
    r.dims = dims;
    r.sink = sink;
    return read_all(&r, err);
}

int tsr_batch_avro_read(const char *path, size_t dims, const tsr_record_sink *sink,
                        tsr_error *err)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return tsr_err(err, TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    rd r;
    memset(&r, 0, sizeof r);
    r.s.fp = fp;
    r.s.size = -1;
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode))
        r.s.size = (int64_t)st.st_size;
    r.name = path;
    r.dims = dims;
    r.sink = sink;
    int rc = read_all(&r, err);
    fclose(fp);
    return rc;
}
