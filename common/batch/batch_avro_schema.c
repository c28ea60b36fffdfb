/*
 * batch_avro_schema — writer-schema checks, reader-schema generation and record
 * pre-validation for batch_avro (see batch_avro_int.h for why each exists).
 */
#include "batch/batch_avro_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_avro.h"
#include "core/buf.h"
#include "core/mem.h"

#define MSG_MAX 512

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


/* Printable excerpt of s for messages: at most 40 bytes, control and non-ASCII bytes as
 * '?' (the text may be the invalid UTF-8 we are reporting). */
void tsr__avro_snippet(char *out, size_t cap, const char *s, size_t n)
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
static int gen_reader(tsr_buf *b, const desc *d, avro_schema_t w, const char *path,
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
        tsr_buf_printf(b, "\"%s\"", d->prim);
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
        tsr_buf_printf(b, "[\"null\",");
        if (gen_reader(b, d->sub, one, path, msg, msgcap) != 0)
            return -1;
        tsr_buf_printf(b, "]");
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
        tsr_buf_printf(b, "{\"type\":\"array\",\"items\":");
        if (gen_reader(b, d->sub, wi, sub, msg, msgcap) != 0)
            return -1;
        tsr_buf_printf(b, "}");
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
        if (w != NULL && !*path && field_by_name(w, "embedding_metadata") != NULL) {
            /* a writer-only field would be skipped by the resolver: refuse, never drop */
            snprintf(msg, msgcap, "the writer schema has a field 'embedding_metadata': the Avro "
                     "format (FeatureVector) cannot carry embedding metadata in Tessera; write "
                     "these records as JSON (.json) or send them with UpsertDatapoints");
            return -1;
        }
        tsr_buf_printf(b, "{\"type\":\"record\",\"name\":\"%s\"", name);
        if (ns != NULL && *ns != '\0')
            tsr_buf_printf(b, ",\"namespace\":\"%s\"", ns);
        tsr_buf_printf(b, ",\"fields\":[");
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
            tsr_buf_printf(b, "%s{\"name\":\"%s\",\"type\":", first ? "" : ",", f->name);
            if (gen_reader(b, f->type, wf, sub, msg, msgcap) != 0)
                return -1;
            tsr_buf_printf(b, "}");
            first = 0;
        }
        tsr_buf_printf(b, "]}");
        return 0;
    }
    }
    return -1;
}

/* ---- pre-validation of record bytes against the writer schema ------------------------ */

/* Estimated bytes avro-c and we allocate per decoded item; only used to refuse records
 * whose decoded form would be far larger than TSR_AVRO_MAX_RECORD_COST. */
#define COST_ITEM 40u
#define COST_NODE 100u


static int vfail(tsr__avro_vstate *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vfail(tsr__avro_vstate *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    return -1;
}

static int vlong(tsr__avro_vstate *v, int64_t *out, const char *what)
{
    size_t n = mem_long(v->p, v->end, out);
    if (n == 0)
        return vfail(v, "%s: varint truncated or longer than 10 bytes", what);
    v->p += n;
    return 0;
}

static int vbytes(tsr__avro_vstate *v, const char *what)
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

static int validate_value(tsr__avro_vstate *v, avro_schema_t s, int depth);

/* Array or map blocks: count (negative: -count then block byte size), items. */
static int validate_blocks(tsr__avro_vstate *v, avro_schema_t items, int is_map, int depth)
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

static int validate_value(tsr__avro_vstate *v, avro_schema_t s, int depth)
{
    if (depth > TSR_AVRO_MAX_DEPTH)
        return vfail(v, "values nested deeper than %d levels", TSR_AVRO_MAX_DEPTH);
    /* Zero-byte values (null, empty records) cost work but no input; a writer schema full
     * of them must not turn a small block into hours of walking. */
    if (++*v->steps > v->max_steps)
        return vfail(v, "more than %llu values in a block of %llu bytes (writer schema with "
                        "too many zero-size fields)",
                     (unsigned long long)v->max_steps,
                     (unsigned long long)((v->max_steps - 65536) / 4));
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


static int cmp_cstr(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

#define MAX_NAMED 4096

typedef struct wcheck {
    avro_schema_t seen[MAX_NAMED]; /* records already checked (named types are shared) */
    size_t nseen;
    char msg[MSG_MAX];
} wcheck;

/* Checks what avro-c 1.11 takes on trust in a writer schema: field names unique within
 * each record (avro-c parses duplicates; its resolver then looks fields up by name and
 * by index inconsistently and crashes). Each named record is checked once. */
static int check_writer(wcheck *c, avro_schema_t s, int depth)
{
    if (depth > TSR_AVRO_MAX_SCHEMA_DEPTH) {
        snprintf(c->msg, sizeof c->msg, "the writer schema nests deeper than %d levels",
                 TSR_AVRO_MAX_SCHEMA_DEPTH);
        return -1;
    }
    s = deref(s);
    if (s == NULL || avro_typeof(s) == AVRO_LINK) {
        snprintf(c->msg, sizeof c->msg, "the writer schema has an unresolved named type");
        return -1;
    }
    switch (avro_typeof(s)) {
    case AVRO_ARRAY:
        return check_writer(c, avro_schema_array_items(s), depth + 1);
    case AVRO_MAP:
        return check_writer(c, avro_schema_map_values(s), depth + 1);
    case AVRO_UNION:
        for (size_t i = 0; i < avro_schema_union_size(s); i++)
            if (check_writer(c, avro_schema_union_branch(s, (int)i), depth + 1) != 0)
                return -1;
        return 0;
    case AVRO_RECORD: {
        for (size_t i = 0; i < c->nseen; i++)
            if (c->seen[i] == s)
                return 0;
        if (c->nseen == MAX_NAMED) {
            snprintf(c->msg, sizeof c->msg, "the writer schema has more than %d record types",
                     MAX_NAMED);
            return -1;
        }
        c->seen[c->nseen++] = s;
        size_t n = avro_schema_record_size(s);
        const char **names = tsr_try_malloc(n ? n : 1, sizeof *names);
        if (names == NULL) {
            snprintf(c->msg, sizeof c->msg, "out of memory");
            return -1;
        }
        int rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
            names[i] = avro_schema_record_field_name(s, (int)i);
            if (names[i] == NULL || avro_schema_record_field_get_by_index(s, (int)i) == NULL) {
                snprintf(c->msg, sizeof c->msg, "record %s: field %zu is malformed",
                         avro_schema_name(s), i);
                rc = -1;
            }
        }
        if (rc == 0 && n > 1) {
            qsort(names, n, sizeof *names, cmp_cstr);
            for (size_t i = 1; i < n; i++)
                if (strcmp(names[i - 1], names[i]) == 0) {
                    char sn[64];
                    tsr__avro_snippet(sn, sizeof sn, names[i], strlen(names[i]));
                    snprintf(c->msg, sizeof c->msg, "record %s has two fields named '%s'",
                             avro_schema_name(s), sn);
                    rc = -1;
                    break;
                }
        }
        free(names);
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = check_writer(c, avro_schema_record_field_get_by_index(s, (int)i), depth + 1);
        return rc;
    }
    default:
        return 0;
    }
}

/* Deepest nesting of JSON arrays/objects in s[0..n) (strings skipped). avro-c parses
 * schemas recursively, one C frame per level, and jansson lets 2048 levels through; a
 * FeatureVector needs 10. */
int tsr__avro_json_depth(const char *s, size_t n)
{
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max)
                max = depth;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

/* ---- entry points -------------------------------------------------------------------- */

int tsr__avro_check_writer(avro_schema_t w, char *msg, size_t msgcap)
{
    wcheck *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(msg, msgcap, "out of memory");
        return -2;
    }
    int rc = check_writer(c, w, 0);
    if (rc != 0)
        snprintf(msg, msgcap, "%s", c->msg);
    free(c);
    return rc;
}

int tsr__avro_reader_schema(avro_schema_t w, char **json, size_t *len, char *msg,
                            size_t msgcap)
{
    tsr_buf b = TSR_BUF_INIT;
    msg[0] = '\0';
    int rc = gen_reader(&b, &d_top, w, "", msg, msgcap);
    if (rc != 0 || b.oom) {
        free(b.p);
        if (rc == 0)
            snprintf(msg, msgcap, "out of memory");
        return rc != 0 ? -1 : -2;
    }
    *json = b.p;
    *len = b.len;
    return 0;
}

int tsr__avro_validate(tsr__avro_vstate *v, avro_schema_t s)
{
    return validate_value(v, s, 0);
}
