/*
 * batch_avro — `.avro` batch files: container framing, codecs, pre-validation of record
 * bytes, avro-c schema resolution and decoding, and the checks that turn a decoded
 * FeatureVector into a tsr_datapoint (see batch_avro.h and docs/avro.md).
 *
 * Why the container is read here and not with avro_file_reader: avro-c 1.11 allocates
 * whatever block length the file states and decodes block data without bounds beyond
 * the buffer; a hostile file turns that into a huge allocation. Here every length is
 * checked against the bytes left in the file and TSR_AVRO_MAX_BLOCK, and each record is
 * first walked against the writer schema (tsr__avro_validate, batch_avro_schema.c) so
 * that avro-c only decodes byte ranges already known to be well-formed, one record at a
 * time. Codecs are in batch_avro_codec.c.
 *
 * DESIGN (threads): the batch walker calls the reader from several threads at once, one
 * file per thread; all state is per call (struct rd) except avro-c's process-global error
 * buffer, see avro_lock.
 */
#include "batch/batch_avro.h"

#include <avro.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "batch/batch_avro_int.h"
#include "batch/batch_int.h"
#include "core/mem.h"

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

enum codec { CODEC_NULL, CODEC_DEFLATE, CODEC_SNAPPY };

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
        tsr__avro_snippet(sn, sizeof sn, codec, strlen(codec));
        return tsr_err(err, TSR_EUNSUPPORTED,
                       "%s: Avro codec '%s' is not supported (supported: null, deflate, snappy)",
                       r->name, sn);
    }
    return 0;
}

/* ---- avro-c allocator: leak tracking on schema parse failures --------------------------- */

/* avro-c 1.11 leaks parts of a schema when parsing fails (e.g. a fixed type that
 * redefines a name, found by the fuzzer). avro-c's allocator is replaceable: ours is
 * realloc/free like the default one, and while a thread parses a schema (under avro_lock)
 * it records that thread's live avro-c allocations; when the parse fails, whatever is
 * still live is unreachable and freed. It also refuses single allocations over
 * AVRO_ALLOC_MAX, as a second line behind the pre-validation. */
#define AVRO_ALLOC_MAX ((size_t)512 << 20)

typedef struct track {
    void **slot; /* open addressing; NULL empty, TOMB deleted */
    size_t cap, used;
    int oom;
} track;

static char track_tomb;
#define TOMB ((void *)&track_tomb)

static _Thread_local track *tls_track;

static size_t track_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void track_put(track *t, void *p);

static void track_grow(track *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 1024;
    void **ns = calloc(ncap, sizeof *ns);
    if (ns == NULL) {
        t->oom = 1; /* stop tracking: at worst avro-c's own leak stays */
        return;
    }
    void **old = t->slot;
    size_t ocap = t->cap;
    t->slot = ns;
    t->cap = ncap;
    t->used = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i] != NULL && old[i] != TOMB)
            track_put(t, old[i]);
    free(old);
}

static void track_put(track *t, void *p)
{
    if (t->oom)
        return;
    if ((t->used + 1) * 2 > t->cap) {
        track_grow(t);
        if (t->oom)
            return;
    }
    size_t i = track_hash(p, t->cap);
    while (t->slot[i] != NULL && t->slot[i] != TOMB)
        i = (i + 1) & (t->cap - 1);
    t->slot[i] = p;
    t->used++;
}

static void track_del(track *t, void *p)
{
    if (t->cap == 0)
        return;
    size_t i = track_hash(p, t->cap);
    while (t->slot[i] != NULL) {
        if (t->slot[i] == p) {
            t->slot[i] = TOMB;
            return;
        }
        i = (i + 1) & (t->cap - 1);
    }
}

static void *track_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    (void)osize;
    track *t = tls_track;
    if (nsize == 0) {
        if (t != NULL && ptr != NULL)
            track_del(t, ptr);
        free(ptr);
        return NULL;
    }
    if (nsize > AVRO_ALLOC_MAX)
        return NULL;
    if (t != NULL && ptr != NULL)
        track_del(t, ptr);
    void *np = realloc(ptr, nsize);
    if (t != NULL) {
        if (np != NULL)
            track_put(t, np);
        else if (ptr != NULL)
            track_put(t, ptr); /* failed realloc: ptr is still live */
    }
    return np;
}

static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;

static void install_allocator(void)
{
    avro_set_allocator(track_alloc, NULL);
}

/* avro_schema_from_json_length, freeing what avro-c leaves behind when it fails. */
static int parse_schema_tracked(const char *json, size_t len, avro_schema_t *out)
{
    track t = {NULL, 0, 0, 0};
    tls_track = &t;
    int rc = avro_schema_from_json_length(json, len, out);
    tls_track = NULL;
    if (rc != 0 && !t.oom) {
        for (size_t i = 0; i < t.cap; i++)
            if (t.slot[i] != NULL && t.slot[i] != TOMB)
                free(t.slot[i]);
    }
    free(t.slot);
    return rc;
}

/* Writer schema from JSON, reader schema generated for it, avro-c resolver. */
static int setup_schemas_locked(rd *r, const char *json, size_t len, tsr_error *err)
{
    if (parse_schema_tracked(json, len, &r->wschema) != 0) {
        r->wschema = NULL;
        return tsr_err(err, TSR_EFORMAT, "%s: INVALID_AVRO_SYNTAX: the writer schema in the "
                                         "header does not parse: %s",
                       r->name, avro_strerror());
    }
    if (avro_typeof(r->wschema) != AVRO_RECORD)
        return tsr_err(err, TSR_EFORMAT,
                       "%s: the writer schema is a %s, expected the FeatureVector record",
                       r->name, avro_schema_type_name(r->wschema));
    char msg[MSG_MAX] = "";
    int rc = tsr__avro_check_writer(r->wschema, msg, sizeof msg);
    if (rc != 0)
        return tsr_err(err, rc == -2 ? TSR_ENOMEM : TSR_EFORMAT, "%s: INVALID_AVRO_SYNTAX: %s",
                       r->name, msg);
    char *rjson = NULL;
    size_t rlen = 0;
    rc = tsr__avro_reader_schema(r->wschema, &rjson, &rlen, msg, sizeof msg);
    if (rc != 0)
        return tsr_err(err, rc == -2 ? TSR_ENOMEM : TSR_EFORMAT,
                       "%s: the writer schema does not resolve to FeatureVector: %s", r->name,
                       msg);
    if (parse_schema_tracked(rjson, rlen, &r->rschema) != 0) {
        r->rschema = NULL;
        rc = tsr_err(err, TSR_EFORMAT,
                     "%s: the writer schema does not resolve to FeatureVector (its record "
                     "names clash): %s",
                     r->name, avro_strerror());
        free(rjson);
        return rc;
    }
    free(rjson);
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

/* avro-c keeps its error text in one process-global buffer (not thread-local in 1.11),
 * and the batch walker reads files in parallel: the calls whose errors we report
 * (schema parsing, resolver creation) run under this lock, once per file. Record
 * decoding runs unlocked; it only sees pre-validated bytes. */
static pthread_mutex_t avro_lock = PTHREAD_MUTEX_INITIALIZER;

static int setup_schemas(rd *r, const char *json, size_t len, tsr_error *err)
{
    int d = tsr__avro_json_depth(json, len);
    if (d > TSR_AVRO_MAX_SCHEMA_DEPTH)
        return tsr_err(err, TSR_EFORMAT,
                       "%s: INVALID_AVRO_SYNTAX: the writer schema is nested %d levels deep "
                       "(at most %d accepted)",
                       r->name, d, TSR_AVRO_MAX_SCHEMA_DEPTH);
    pthread_mutex_lock(&avro_lock);
    int rc = setup_schemas_locked(r, json, len, err);
    pthread_mutex_unlock(&avro_lock);
    return rc;
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
    if (!tsr__utf8_valid(s, n)) {
        tsr__avro_snippet(sn, sizeof sn, s, n);
        BAD(TSR_REC_INVALID_ENCODING, "%s '%s' is not valid UTF-8", field, sn);
    }
    if (memchr(s, '\0', n) != NULL) {
        tsr__avro_snippet(sn, sizeof sn, s, n);
        BAD(nul_type, "%s '%s' contains a NUL character", field, sn);
    }
    if ((*out = tsr_try_strndup(s, n)) == NULL)
        return -1;
    if (outlen)
        *outlen = n;
    return 0;
}

/* Entry i of the array arr (restricts or numeric_restricts, named by what) into *e and its
 * namespace, a non-empty string, into *ns (new string). *count counts the entry as soon as
 * it exists, before the namespace is taken, so that whatever was taken is freed with the
 * datapoint when the record turns out invalid. */
static int take_entry_ns(avro_value_t *arr, size_t i, const char *what, avro_value_t *e,
                         size_t *count, char **ns, size_t *nslen, enum tsr_rec_error *type,
                         char *msg, size_t msgcap)
{
    char field[64];
    snprintf(field, sizeof field, "%s[%zu].namespace", what, i);
    avro_value_t v;
    if (avro_value_get_by_index(arr, i, e, NULL) != 0 ||
        avro_value_get_by_name(e, "namespace", &v, NULL) != 0)
        BAD(TSR_REC_NAMESPACE_MISSING, "%s: missing", field);
    (*count)++;
    int rc = take_string(&v, field, ns, nslen, TSR_REC_NAMESPACE_MISSING, type, msg, msgcap);
    if (rc != 0)
        return rc;
    if (*nslen == 0)
        BAD(TSR_REC_NAMESPACE_MISSING, "%s is empty", field);
    return 0;
}

/* The start of reading the array v (`field` in messages): its length (*cnt) and a zeroed
 * element of elem bytes per value (*out; left NULL when the array is empty). */
static int take_array(avro_value_t *v, const char *field, size_t elem, size_t *cnt,
                      void **out, enum tsr_rec_error *type, char *msg, size_t msgcap)
{
    if (avro_value_get_size(v, cnt) != 0)
        BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s: not an array", field);
    if (*cnt > 0 && (*out = tsr_try_calloc(*cnt, elem)) == NULL)
        return -1;
    return 0;
}

static int take_floats(avro_value_t *arr, float **out, size_t *n, const char *field,
                       enum tsr_rec_error *type, char *msg, size_t msgcap)
{
    size_t cnt;
    void *vals = NULL;
    int rc = take_array(arr, field, sizeof **out, &cnt, &vals, type, msg, msgcap);
    if (rc != 0)
        return rc;
    *out = vals;
    *n = cnt;
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
    char where[64];
    snprintf(where, sizeof where, "restricts[%zu].%s", ri, name);
    size_t cnt;
    void *toks = NULL;
    int rc = take_array(&arr, where, sizeof **out, &cnt, &toks, type, msg, msgcap);
    if (rc != 0)
        return rc;
    *out = toks;
    for (size_t i = 0; i < cnt; i++) {
        avro_value_t e;
        char field[96];
        snprintf(field, sizeof field, "restricts[%zu] (namespace '%s') %s[%zu]", ri, ns, name, i);
        if (avro_value_get_by_index(&arr, i, &e, NULL) != 0)
            BAD(TSR_REC_INVALID_AVRO_SYNTAX, "%s: missing", field);
        size_t len;
        rc = take_string(&e, field, &(*out)[i], &len, TSR_REC_INVALID_TOKEN_VALUE, type, msg,
                         msgcap);
        if (rc != 0)
            return rc;
        (*nout)++;
        if (len == 0)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "%s is an empty token", field);
    }
    return 0;
}

typedef struct ns_ref {
    const char *ns;
    size_t idx;
} ns_ref;

static int cmp_ns_ref(const void *x, const void *y)
{
    const ns_ref *a = x, *b = y;
    int c = strcmp(a->ns, b->ns);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

/* The namespaces of n structs (array base, element size, offset of the char *ns member)
 * with their indexes, sorted by namespace then index (caller frees); NULL on ENOMEM. Sorting
 * keeps the checks O(n log n): a record may hold very many restricts. */
static ns_ref *sorted_ns(const void *base, size_t n, size_t elem, size_t off)
{
    ns_ref *r = tsr_try_malloc(n, sizeof *r);
    if (r == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        memcpy(&r[i].ns, (const char *)base + i * elem + off, sizeof r[i].ns);
        r[i].idx = i;
    }
    qsort(r, n, sizeof *r, cmp_ns_ref);
    return r;
}

/* Looks for two equal namespaces among n structs (as sorted_ns takes them). Returns 1
 * with *first < *second the indexes of a duplicate pair, 0 when all differ, -1 on ENOMEM. */
static int find_dup_ns(const void *base, size_t n, size_t elem, size_t off, size_t *first,
                       size_t *second)
{
    if (n < 2)
        return 0;
    ns_ref *r = sorted_ns(base, n, elem, off);
    if (r == NULL)
        return -1;
    int found = 0;
    for (size_t i = 1; i < n; i++)
        if (strcmp(r[i - 1].ns, r[i].ns) == 0 && (!found || r[i].idx < *second)) {
            *first = r[i - 1].idx;
            *second = r[i].idx;
            found = 1;
        }
    free(r);
    return found;
}

/* Restricts entries with the same namespace become one (allow and deny lists joined in
 * the order of appearance, first appearance keeps its place), as the CSV and JSON
 * readers do. Sort-based so that a record with very many restricts stays O(n log n).
 * Returns 0 or -1 (out of memory; dp stays consistent and is closed by the caller). */
static int merge_restricts(tsr_datapoint *dp)
{
    size_t n = dp->nrestricts;
    if (n < 2)
        return 0;
    ns_ref *r = sorted_ns(dp->restricts, n, sizeof *dp->restricts,
                          offsetof(tsr_token_restrict, ns));
    if (r == NULL)
        return -1;
    int merged = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && strcmp(r[j].ns, r[i].ns) == 0)
            j++;
        tsr_token_restrict *first = &dp->restricts[r[i].idx]; /* lowest index: sorted by idx */
        if (j > i + 1) {
            size_t ta = first->nallow, td = first->ndeny;
            for (size_t k = i + 1; k < j; k++) {
                ta += dp->restricts[r[k].idx].nallow;
                td += dp->restricts[r[k].idx].ndeny;
            }
            char **na = ta ? tsr_try_realloc(first->allow, ta, sizeof *na) : first->allow;
            if (na == NULL) {
                free(r);
                return -1;
            }
            first->allow = na;
            char **nd = td ? tsr_try_realloc(first->deny, td, sizeof *nd) : first->deny;
            if (nd == NULL) {
                free(r);
                return -1;
            }
            first->deny = nd;
            /* r[i+1..j) are in index order (ties sorted by idx): appearance order kept */
            for (size_t k = i + 1; k < j; k++) {
                tsr_token_restrict *t = &dp->restricts[r[k].idx];
                if (t->nallow)
                    memcpy(first->allow + first->nallow, t->allow, t->nallow * sizeof *na);
                first->nallow += t->nallow;
                if (t->ndeny)
                    memcpy(first->deny + first->ndeny, t->deny, t->ndeny * sizeof *nd);
                first->ndeny += t->ndeny;
                free(t->allow);
                free(t->deny);
                free(t->ns);
                memset(t, 0, sizeof *t); /* ns NULL: dropped below */
            }
            merged = 1;
        }
        i = j;
    }
    free(r);
    if (merged) {
        size_t out = 0;
        for (size_t i = 0; i < n; i++)
            if (dp->restricts[i].ns != NULL)
                dp->restricts[out++] = dp->restricts[i];
        dp->nrestricts = out;
    }
    return 0;
}

/* The parts of to_datapoint below take the record's field v (present, not null) and return
 * as to_datapoint does: 0 ok, 1 invalid (type/msg set), -1 out of memory. */

/* sparse_embedding: values and dimensions of equal length. */
static int take_sparse(avro_value_t *v, tsr_datapoint *dp, enum tsr_rec_error *type,
                       char *msg, size_t msgcap)
{
    int rc;
    avro_value_t vals, dims;
    size_t nv = 0, nd = 0;
    if (avro_value_get_by_name(v, "values", &vals, NULL) != 0 ||
        avro_value_get_by_name(v, "dimensions", &dims, NULL) != 0 ||
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
    return 0;
}

/* restricts: an array of {namespace, allow, deny}; entries of one namespace merged. */
static int take_restricts(avro_value_t *v, tsr_datapoint *dp, enum tsr_rec_error *type,
                          char *msg, size_t msgcap)
{
    size_t cnt;
    void *entries = NULL;
    int rc = take_array(v, "restricts", sizeof *dp->restricts, &cnt, &entries, type, msg,
                          msgcap);
    if (rc != 0)
        return rc;
    dp->restricts = entries;
    for (size_t i = 0; i < cnt; i++) {
        avro_value_t e;
        tsr_token_restrict *t = &dp->restricts[i];
        size_t nslen;
        if ((rc = take_entry_ns(v, i, "restricts", &e, &dp->nrestricts, &t->ns, &nslen, type,
                                msg, msgcap)) != 0)
            return rc;
        if ((rc = take_tokens(&e, "allow", t->ns, i, &t->allow, &t->nallow, type, msg,
                              msgcap)) != 0)
            return rc;
        if ((rc = take_tokens(&e, "deny", t->ns, i, &t->deny, &t->ndeny, type, msg,
                              msgcap)) != 0)
            return rc;
    }
    if (merge_restricts(dp) != 0)
        return -1;
    return 0;
}

/* numeric_restricts: an array of {namespace, exactly one value}; a namespace once. */
static int take_numeric(avro_value_t *v, tsr_datapoint *dp, enum tsr_rec_error *type,
                        char *msg, size_t msgcap)
{
    char sn[64];
    size_t cnt;
    void *entries = NULL;
    int rc = take_array(v, "numeric_restricts", sizeof *dp->numeric, &cnt, &entries, type,
                          msg, msgcap);
    if (rc != 0)
        return rc;
    dp->numeric = entries;
    for (size_t i = 0; i < cnt; i++) {
        avro_value_t e, x;
        tsr_numeric_restrict *nr = &dp->numeric[i];
        size_t nslen;
        if ((rc = take_entry_ns(v, i, "numeric_restricts", &e, &dp->nnumeric, &nr->ns, &nslen,
                                type, msg, msgcap)) != 0)
            return rc;
        tsr__avro_snippet(sn, sizeof sn, nr->ns, nslen);
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
    size_t a = 0, b2 = 0;
    rc = find_dup_ns(dp->numeric, dp->nnumeric, sizeof *dp->numeric,
                     offsetof(tsr_numeric_restrict, ns), &a, &b2);
    if (rc < 0)
        return -1;
    if (rc > 0) {
        tsr__avro_snippet(sn, sizeof sn, dp->numeric[a].ns, strlen(dp->numeric[a].ns));
        BAD(TSR_REC_DUPLICATE_NAMESPACE,
            "numeric_restricts[%zu]: namespace '%s' already appears in "
            "numeric_restricts[%zu]; a numeric namespace holds one value per record",
            b2, sn, a);
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

    if (get_opt(rec, "sparse_embedding", &v) &&
        (rc = take_sparse(&v, dp, type, msg, msgcap)) != 0)
        return rc;
    if (dp->ndense == 0 && dp->nsparse == 0)
        BAD(TSR_REC_INVALID_EMBEDDING,
            "no embedding: a record needs %zu embedding values or a non-empty sparse_embedding",
            r->dims);

    if (get_opt(rec, "restricts", &v) && (rc = take_restricts(&v, dp, type, msg, msgcap)) != 0)
        return rc;
    if (get_opt(rec, "numeric_restricts", &v) &&
        (rc = take_numeric(&v, dp, type, msg, msgcap)) != 0)
        return rc;

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
    uint64_t steps = 0;
    for (uint64_t k = 0; k < count && !r->stop; k++) {
        tsr__avro_vstate v;
        memset(&v, 0, sizeof v);
        v.p = p;
        v.end = end;
        v.max_items = (uint64_t)(end - p) + 16;
        v.steps = &steps;
        v.max_steps = 4 * (uint64_t)len + 65536;
        if (tsr__avro_validate(&v, r->wschema) != 0) {
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu, record %llu of %llu: %s; the rest of the file is not read",
                   (unsigned long long)blockno, (unsigned long long)k,
                   (unsigned long long)count, v.why);
            return 1;
        }
        if (v.cost > TSR_AVRO_MAX_RECORD_COST) {
            /* Well-formed but too big to decode in bounded memory: skip this record only. */
            report(r, r->index, TSR_REC_INVALID_AVRO_SYNTAX,
                   "block %llu, record %llu: %zu bytes whose values would take about %llu MiB "
                   "decoded (limit %u MiB); record skipped",
                   (unsigned long long)blockno, (unsigned long long)k, (size_t)(v.p - p),
                   (unsigned long long)(v.cost >> 20), TSR_AVRO_MAX_RECORD_COST >> 20);
            p = v.p;
            r->index++;
            continue;
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
                         ? tsr__avro_inflate(raw, (size_t)size, &plain, &plaincap, &outlen, why,
                                         sizeof why)
                         : tsr__avro_unsnappy(raw, (size_t)size, &plain, &plaincap, &outlen, why,
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
    pthread_once(&alloc_once, install_allocator);
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
