/*
 * test_batch_avro — unit tests of the Avro batch reader (common/batch/batch_avro.c).
 *
 * Files are written with avro-c's own file writer (seed 003's FeatureVector schema),
 * read back through tsr_batch_avro_read / _read_mem, then damaged byte by byte to check
 * that hostile framing (block counts and sizes, string lengths, array counts, deflate
 * bombs, truncation) gives INVALID_AVRO_SYNTAX with the record index, never a crash or
 * a huge allocation.
 *
 * Dump mode (used by tests/interop/test_batch_avro.py until `tessera batch inspect`
 * can read Avro): with TSR_AVRO_DUMP=<file> [TSR_AVRO_DIMS=<d>] the binary reads that
 * file and prints one JSON line per event: {"index":i,"record":{...}} (seed JSON form),
 * {"index":i,"invalid":"TYPE","msg":"..."}, and last {"result":rc,"error":"..."}.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <avro.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <zlib.h>

#include "batch/batch_avro.h"
#include "core/datapoint.h"

/* ---- JSON output (dump mode) -------------------------------------------------------------- */

static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void put_strv(FILE *f, char **v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        put_str(f, v[i]);
    }
    fputc(']', f);
}

static void put_dp(FILE *f, const tsr_datapoint *dp)
{
    fprintf(f, "{\"id\":");
    put_str(f, dp->id);
    if (dp->ndense) {
        fprintf(f, ",\"embedding\":[");
        for (size_t i = 0; i < dp->ndense; i++)
            fprintf(f, "%s%.9g", i ? "," : "", dp->dense[i]);
        fputc(']', f);
    }
    if (dp->nsparse) {
        fprintf(f, ",\"sparse_embedding\":{\"values\":[");
        for (size_t i = 0; i < dp->nsparse; i++)
            fprintf(f, "%s%.9g", i ? "," : "", dp->sparse_vals[i]);
        fprintf(f, "],\"dimensions\":[");
        for (size_t i = 0; i < dp->nsparse; i++)
            fprintf(f, "%s%lld", i ? "," : "", (long long)dp->sparse_dims[i]);
        fprintf(f, "]}");
    }
    if (dp->nrestricts) {
        fprintf(f, ",\"restricts\":[");
        for (size_t i = 0; i < dp->nrestricts; i++) {
            const tsr_token_restrict *t = &dp->restricts[i];
            fprintf(f, "%s{\"namespace\":", i ? "," : "");
            put_str(f, t->ns);
            if (t->nallow) {
                fprintf(f, ",\"allow\":");
                put_strv(f, t->allow, t->nallow);
            }
            if (t->ndeny) {
                fprintf(f, ",\"deny\":");
                put_strv(f, t->deny, t->ndeny);
            }
            fputc('}', f);
        }
        fputc(']', f);
    }
    if (dp->nnumeric) {
        fprintf(f, ",\"numeric_restricts\":[");
        for (size_t i = 0; i < dp->nnumeric; i++) {
            const tsr_numeric_restrict *n = &dp->numeric[i];
            fprintf(f, "%s{\"namespace\":", i ? "," : "");
            put_str(f, n->ns);
            if (n->type == TSR_NUM_INT)
                fprintf(f, ",\"value_int\":%lld}", (long long)n->v.i);
            else if (n->type == TSR_NUM_FLOAT)
                fprintf(f, ",\"value_float\":%.9g}", n->v.f);
            else
                fprintf(f, ",\"value_double\":%.17g}", n->v.d);
        }
        fputc(']', f);
    }
    if (dp->crowding_tag) {
        fprintf(f, ",\"crowding_tag\":");
        put_str(f, dp->crowding_tag);
    }
    fputc('}', f);
}

static int dump_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    fprintf(stdout, "{\"index\":%llu,\"record\":", (unsigned long long)where);
    put_dp(stdout, dp);
    fprintf(stdout, "}\n");
    tsr_datapoint_close(dp);
    return 0;
}

static int dump_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    fprintf(stdout, "{\"index\":%llu,\"invalid\":\"%s\",\"msg\":", (unsigned long long)where,
            tsr_rec_error_name(type));
    put_str(stdout, msg);
    fprintf(stdout, "}\n");
    return 0;
}

static int dump_main(const char *path)
{
    const char *d = getenv("TSR_AVRO_DIMS");
    size_t dims = d ? strtoul(d, NULL, 10) : 3;
    tsr_record_sink sink = {NULL, dump_record, dump_invalid, NULL};
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_batch_avro_read(path, dims, &sink, &err);
    fprintf(stdout, "{\"result\":%d,\"error\":", rc);
    put_str(stdout, rc ? err.msg : "");
    fprintf(stdout, "}\n");
    return 0;
}

/* ---- collecting sink --------------------------------------------------------------------- */

typedef struct ev {
    uint64_t where;
    int invalid;
    enum tsr_rec_error type;
    char msg[512];
    tsr_datapoint dp;
} ev;

typedef struct col {
    ev *v;
    size_t n, cap;
} col;

static ev *col_push(col *c)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->v = realloc(c->v, c->cap * sizeof *c->v);
        assert_non_null(c->v);
    }
    ev *e = &c->v[c->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static int col_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    ev *e = col_push(ctx);
    e->where = where;
    e->dp = *dp;
    memset(dp, 0, sizeof *dp);
    return 0;
}

static int col_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    ev *e = col_push(ctx);
    e->where = where;
    e->invalid = 1;
    e->type = type;
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    return 0;
}

static void col_free(col *c)
{
    for (size_t i = 0; i < c->n; i++)
        tsr_datapoint_close(&c->v[i].dp);
    free(c->v);
    memset(c, 0, sizeof *c);
}

static int read_mem(const void *data, size_t len, size_t dims, col *c, tsr_error *err)
{
    tsr_record_sink sink = {c, col_record, col_invalid, NULL};
    tsr_error_clear(err);
    return tsr_batch_avro_read_mem(data, len, "t.avro", dims, &sink, err);
}

/* A new temporary file name in $TMPDIR (the file is created, then removed). */
static void tmp_name(char *out, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    snprintf(out, cap, "%s/tsr_avro_XXXXXX", dir && *dir ? dir : P_tmpdir);
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    unlink(out);
}

/* ---- writing test files with avro-c ---------------------------------------------------- */

static const char *SEED_SCHEMA =
    "{\"type\":\"record\",\"name\":\"FeatureVector\",\"fields\":["
    "{\"name\":\"id\",\"type\":\"string\"},"
    "{\"name\":\"embedding\",\"type\":{\"type\":\"array\",\"items\":\"float\"}},"
    "{\"name\":\"sparse_embedding\",\"type\":[\"null\",{\"type\":\"record\",\"name\":"
    "\"sparse_embedding\",\"fields\":[{\"name\":\"values\",\"type\":{\"type\":\"array\","
    "\"items\":\"float\"}},{\"name\":\"dimensions\",\"type\":{\"type\":\"array\",\"items\":"
    "\"long\"}}]}]},"
    "{\"name\":\"restricts\",\"type\":[\"null\",{\"type\":\"array\",\"items\":{\"type\":"
    "\"record\",\"name\":\"Restrict\",\"fields\":[{\"name\":\"namespace\",\"type\":\"string\"},"
    "{\"name\":\"allow\",\"type\":[\"null\",{\"type\":\"array\",\"items\":\"string\"}]},"
    "{\"name\":\"deny\",\"type\":[\"null\",{\"type\":\"array\",\"items\":\"string\"}]}]}}]},"
    "{\"name\":\"numeric_restricts\",\"type\":[\"null\",{\"type\":\"array\",\"items\":{"
    "\"name\":\"NumericRestrict\",\"type\":\"record\",\"fields\":[{\"name\":\"namespace\","
    "\"type\":\"string\"},{\"name\":\"value_int\",\"type\":[\"null\",\"int\"],\"default\":null},"
    "{\"name\":\"value_float\",\"type\":[\"null\",\"float\"],\"default\":null},"
    "{\"name\":\"value_double\",\"type\":[\"null\",\"double\"],\"default\":null}]}}],"
    "\"default\":null},"
    "{\"name\":\"crowding_tag\",\"type\":[\"null\",\"string\"]}]}";

typedef struct spec {
    const char *id;
    size_t ndense;
    float dense[4];
    size_t nsparse, ndims;
    float svals[4];
    int64_t sdims[4];
    const char *allow_ns; /* one restrict with allow "red" and deny "blue" when set */
    int num;              /* 0 none, 1 int, 2 float, 3 double, 4 int+float, 5 none set */
    const char *tag;
} spec;

static void set_branch_null(avro_value_t *u)
{
    avro_value_t b;
    assert_int_equal(avro_value_set_branch(u, 0, &b), 0);
    avro_value_set_null(&b);
}

static void fill(avro_value_t *rec, const spec *s)
{
    avro_value_t f, b, e, x, y;
    avro_value_get_by_name(rec, "id", &f, NULL);
    avro_value_set_string_len(&f, s->id, strlen(s->id) + 1);
    avro_value_get_by_name(rec, "embedding", &f, NULL);
    for (size_t i = 0; i < s->ndense; i++) {
        avro_value_append(&f, &e, NULL);
        avro_value_set_float(&e, s->dense[i]);
    }
    avro_value_get_by_name(rec, "sparse_embedding", &f, NULL);
    if (s->nsparse || s->ndims) {
        avro_value_set_branch(&f, 1, &b);
        avro_value_get_by_name(&b, "values", &x, NULL);
        for (size_t i = 0; i < s->nsparse; i++) {
            avro_value_append(&x, &e, NULL);
            avro_value_set_float(&e, s->svals[i]);
        }
        avro_value_get_by_name(&b, "dimensions", &x, NULL);
        for (size_t i = 0; i < s->ndims; i++) {
            avro_value_append(&x, &e, NULL);
            avro_value_set_long(&e, s->sdims[i]);
        }
    } else {
        set_branch_null(&f);
    }
    avro_value_get_by_name(rec, "restricts", &f, NULL);
    if (s->allow_ns) {
        avro_value_set_branch(&f, 1, &b);
        avro_value_append(&b, &e, NULL);
        avro_value_get_by_name(&e, "namespace", &x, NULL);
        avro_value_set_string(&x, s->allow_ns);
        avro_value_get_by_name(&e, "allow", &x, NULL);
        avro_value_set_branch(&x, 1, &y);
        avro_value_append(&y, &x, NULL);
        avro_value_set_string(&x, "red");
        avro_value_get_by_name(&e, "deny", &x, NULL);
        avro_value_set_branch(&x, 1, &y);
        avro_value_append(&y, &x, NULL);
        avro_value_set_string(&x, "blue");
    } else {
        set_branch_null(&f);
    }
    avro_value_get_by_name(rec, "numeric_restricts", &f, NULL);
    if (s->num) {
        avro_value_set_branch(&f, 1, &b);
        avro_value_append(&b, &e, NULL);
        avro_value_get_by_name(&e, "namespace", &x, NULL);
        avro_value_set_string(&x, "size");
        avro_value_get_by_name(&e, "value_int", &x, NULL);
        if (s->num == 1 || s->num == 4) {
            avro_value_set_branch(&x, 1, &y);
            avro_value_set_int(&y, -7);
        } else {
            set_branch_null(&x);
        }
        avro_value_get_by_name(&e, "value_float", &x, NULL);
        if (s->num == 2 || s->num == 4) {
            avro_value_set_branch(&x, 1, &y);
            avro_value_set_float(&y, 0.25f);
        } else {
            set_branch_null(&x);
        }
        avro_value_get_by_name(&e, "value_double", &x, NULL);
        if (s->num == 3) {
            avro_value_set_branch(&x, 1, &y);
            avro_value_set_double(&y, 0.3);
        } else {
            set_branch_null(&x);
        }
    } else {
        set_branch_null(&f);
    }
    avro_value_get_by_name(rec, "crowding_tag", &f, NULL);
    if (s->tag) {
        avro_value_set_branch(&f, 1, &b);
        avro_value_set_string(&b, s->tag);
    } else {
        set_branch_null(&f);
    }
}

/* Writes specs to a new file (avro-c writer, given codec and block size) and returns its
 * bytes (caller frees). */
static uint8_t *write_file(const spec *specs, size_t n, const char *codec, size_t block,
                           size_t *len)
{
    char path[512];
    tmp_name(path, sizeof path);
    avro_schema_t schema;
    assert_int_equal(avro_schema_from_json_length(SEED_SCHEMA, strlen(SEED_SCHEMA), &schema), 0);
    avro_file_writer_t w;
    assert_int_equal(avro_file_writer_create_with_codec(path, schema, &w, codec, block), 0);
    avro_value_iface_t *iface = avro_generic_class_from_schema(schema);
    avro_value_t rec;
    avro_generic_value_new(iface, &rec);
    for (size_t i = 0; i < n; i++) {
        avro_value_reset(&rec);
        fill(&rec, &specs[i]);
        assert_int_equal(avro_file_writer_append_value(w, &rec), 0);
    }
    avro_file_writer_close(w);
    avro_value_decref(&rec);
    avro_value_iface_decref(iface);
    avro_schema_decref(schema);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    unlink(path);
    *len = (size_t)sz;
    return buf;
}

static const spec GOOD[] = {
    {"1", 3, {1, 1, 1}, 0, 0, {0}, {0}, NULL, 0, NULL},
    {"3", 0, {0}, 2, 2, {0.1f, 0.2f}, {1, 4}, NULL, 0, NULL},
    {"4", 0, {0}, 3, 3, {-0.4f, 0.2f, -1.3f}, {10, 20, 20}, NULL, 0, NULL},
    {"5", 3, {5, 5, -5}, 1, 1, {0.1f}, {500}, NULL, 0, NULL},
    {"7", 3, {1, 2, 3}, 0, 0, {0}, {0}, "color", 1, "shop-9"},
    {"8", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 2, NULL},
    {"9", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 3, NULL},
};
#define NGOOD (sizeof GOOD / sizeof GOOD[0])

static void check_good(col *c)
{
    assert_int_equal(c->n, NGOOD);
    for (size_t i = 0; i < NGOOD; i++) {
        ev *e = &c->v[i];
        assert_false(e->invalid);
        assert_int_equal(e->where, i);
        assert_string_equal(e->dp.id, GOOD[i].id);
        assert_int_equal(e->dp.ndense, GOOD[i].ndense);
        for (size_t k = 0; k < GOOD[i].ndense; k++)
            assert_true(e->dp.dense[k] == GOOD[i].dense[k]);
    }
    /* id 4: dims [10,20,20] -> [10,20], values summed */
    assert_int_equal(c->v[2].dp.nsparse, 2);
    assert_int_equal(c->v[2].dp.sparse_dims[1], 20);
    assert_true(c->v[2].dp.sparse_vals[1] == 0.2f + -1.3f);
    tsr_datapoint *d7 = &c->v[4].dp;
    assert_int_equal(d7->nrestricts, 1);
    assert_string_equal(d7->restricts[0].ns, "color");
    assert_string_equal(d7->restricts[0].allow[0], "red");
    assert_string_equal(d7->restricts[0].deny[0], "blue");
    assert_int_equal(d7->nnumeric, 1);
    assert_int_equal(d7->numeric[0].type, TSR_NUM_INT);
    assert_int_equal(d7->numeric[0].v.i, -7);
    assert_string_equal(d7->crowding_tag, "shop-9");
    assert_int_equal(c->v[5].dp.numeric[0].type, TSR_NUM_FLOAT);
    assert_true(c->v[5].dp.numeric[0].v.f == 0.25f);
    assert_int_equal(c->v[6].dp.numeric[0].type, TSR_NUM_DOUBLE);
    assert_true(c->v[6].dp.numeric[0].v.d == 0.3);
}

static void test_roundtrip_codecs(void **state)
{
    const char *codecs[] = {"null", "deflate", "snappy"};
    for (size_t k = 0; k < 3; k++) {
        size_t len;
        uint8_t *buf = write_file(GOOD, NGOOD, codecs[k], 128, &len);
        col c = {0};
        tsr_error err;
        assert_int_equal(read_mem(buf, len, 3, &c, &err), 0);
        check_good(&c);
        col_free(&c);
        free(buf);
    }
}

static void test_read_path(void **state)
{
    size_t len;
    uint8_t *buf = write_file(GOOD, NGOOD, "deflate", 0, &len);
    char path[512];
    tmp_name(path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, len), (ssize_t)len);
    close(fd);
    col c = {0};
    tsr_record_sink sink = {&c, col_record, col_invalid, NULL};
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_batch_avro_read(path, 3, &sink, &err), 0);
    check_good(&c);
    col_free(&c);
    /* truncated file on disk */
    assert_int_equal(truncate(path, (off_t)len - 5), 0);
    assert_int_equal(tsr_batch_avro_read(path, 3, &sink, &err), 0);
    assert_true(c.n >= 1);
    assert_true(c.v[c.n - 1].invalid);
    assert_int_equal(c.v[c.n - 1].type, TSR_REC_INVALID_AVRO_SYNTAX);
    col_free(&c);
    unlink(path);
    assert_int_not_equal(tsr_batch_avro_read(path, 3, &sink, &err), 0);
    assert_non_null(strstr(err.msg, "cannot open"));
    free(buf);
}

static void test_invalid_records(void **state)
{
    static const spec bad[] = {
        {"a", 2, {1, 2}, 0, 0, {0}, {0}, NULL, 0, NULL},                 /* size mismatch */
        {"b", 3, {1, NAN, 2}, 0, 0, {0}, {0}, NULL, 0, NULL},            /* NaN */
        {"c", 0, {0}, 2, 1, {1, 2}, {3}, NULL, 0, NULL},                 /* sparse mismatch */
        {"d", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 4, NULL},              /* two values */
        {"e", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 5, NULL},              /* no value */
        {"\xff\xfe", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 0, NULL},       /* bad UTF-8 */
        {"", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 0, NULL},               /* empty id */
        {"f", 0, {0}, 0, 0, {0}, {0}, NULL, 0, NULL},                    /* no embedding */
        {"g", 3, {1, INFINITY, 2}, 0, 0, {0}, {0}, NULL, 0, NULL},       /* Inf */
        {"ok", 3, {1, 2, 3}, 0, 0, {0}, {0}, NULL, 0, NULL},
    };
    static const enum tsr_rec_error want[] = {
        TSR_REC_EMBEDDING_SIZE_MISMATCH, TSR_REC_INVALID_EMBEDDING, TSR_REC_INVALID_SPARSE_EMBEDDING,
        TSR_REC_MULTIPLE_VALUES, TSR_REC_INVALID_NUMERIC_VALUE, TSR_REC_INVALID_ENCODING,
        TSR_REC_INVALID_EMBEDDING_ID, TSR_REC_INVALID_EMBEDDING, TSR_REC_INVALID_EMBEDDING,
    };
    size_t n = sizeof bad / sizeof bad[0], len;
    uint8_t *buf = write_file(bad, n, "null", 0, &len);
    col c = {0};
    tsr_error err;
    assert_int_equal(read_mem(buf, len, 3, &c, &err), 0);
    assert_int_equal(c.n, n);
    for (size_t i = 0; i + 1 < n; i++) {
        assert_true(c.v[i].invalid);
        assert_int_equal(c.v[i].where, i);
        assert_int_equal(c.v[i].type, want[i]);
    }
    assert_non_null(strstr(c.v[0].msg, "embedding has 2 values"));
    assert_non_null(strstr(c.v[1].msg, "embedding[1] is NaN"));
    assert_non_null(strstr(c.v[3].msg, "numeric_restricts[0]"));
    assert_false(c.v[n - 1].invalid);
    assert_string_equal(c.v[n - 1].dp.id, "ok");
    col_free(&c);
    free(buf);
}

static void test_not_avro(void **state)
{
    col c = {0};
    tsr_error err;
    const char *text = "{\"id\": \"1\", \"embedding\": [1,1,1]}\n";
    assert_int_equal(read_mem(text, strlen(text), 3, &c, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "not an Avro object container"));
    assert_int_equal(read_mem("", 0, 3, &c, &err), TSR_EFORMAT);
    assert_int_equal(c.n, 0);
}

/* Offset just after the header: where the first block starts. */
static size_t header_end(const uint8_t *buf, size_t len)
{
    /* the file's sync marker is its last 16 bytes; the header ends with the same 16 */
    for (size_t i = 4; i + 32 <= len; i++)
        if (memcmp(buf + i, buf + len - 16, 16) == 0)
            return i + 16;
    fail();
    return 0;
}

static uint8_t *put_varint(uint8_t *p, int64_t v)
{
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z & ~0x7fULL) {
        *p++ = (uint8_t)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

/* A file with one hand-encoded block; returns its length. */
static size_t craft(uint8_t *out, const uint8_t *hdr, size_t hlen, const uint8_t *sync,
                    int64_t count, int64_t size, const uint8_t *data, size_t dlen)
{
    memcpy(out, hdr, hlen);
    uint8_t *p = out + hlen;
    p = put_varint(p, count);
    p = put_varint(p, size);
    memcpy(p, data, dlen);
    p += dlen;
    memcpy(p, sync, 16);
    return (size_t)(p + 16 - out);
}

static void expect_syntax(const uint8_t *buf, size_t len, uint64_t where, const char *needle)
{
    col c = {0};
    tsr_error err;
    assert_int_equal(read_mem(buf, len, 3, &c, &err), 0);
    assert_true(c.n >= 1);
    ev *e = &c.v[c.n - 1];
    if (!e->invalid || e->type != TSR_REC_INVALID_AVRO_SYNTAX || e->where != where ||
        (needle && !strstr(e->msg, needle)))
        fail_msg("got invalid=%d type=%s where=%llu msg=%s", e->invalid,
                 tsr_rec_error_name(e->type), (unsigned long long)e->where, e->msg);
    col_free(&c);
}

static void test_hostile_blocks(void **state)
{
    size_t len;
    static const spec one[] = {{"1", 3, {1, 1, 1}, 0, 0, {0}, {0}, NULL, 0, NULL}};
    uint8_t *good = write_file(one, 1, "null", 0, &len);
    size_t h = header_end(good, len);
    const uint8_t *sync = good + len - 16;
    uint8_t out[4096];
    /* the record bytes of "1": id, embedding, 4 null unions */
    uint8_t rec[64], *p = rec;
    p = put_varint(p, 1);
    *p++ = '1';
    p = put_varint(p, 3);
    for (int i = 0; i < 3; i++) {
        float f = 1;
        memcpy(p, &f, 4);
        p += 4;
    }
    p = put_varint(p, 0);
    for (int i = 0; i < 4; i++)
        p = put_varint(p, 0);
    size_t rl = (size_t)(p - rec);

    size_t n = craft(out, good, h, sync, 1, (int64_t)rl, rec, rl);
    col c = {0};
    tsr_error err;
    assert_int_equal(read_mem(out, n, 3, &c, &err), 0);
    assert_int_equal(c.n, 1);
    assert_false(c.v[0].invalid);
    col_free(&c);

    /* huge record count, huge and negative block size */
    n = craft(out, good, h, sync, INT64_MAX, (int64_t)rl, rec, rl);
    expect_syntax(out, n, 0, "out of range");
    n = craft(out, good, h, sync, 1, INT64_MAX / 2, rec, rl);
    expect_syntax(out, n, 0, "out of range");
    n = craft(out, good, h, sync, 1, -5, rec, rl);
    expect_syntax(out, n, 0, "out of range");
    n = craft(out, good, h, sync, 3, (int64_t)rl, rec, rl);
    expect_syntax(out, n, 1, NULL);
    /* bad sync */
    n = craft(out, good, h, sync, 1, (int64_t)rl, rec, rl);
    out[n - 1] ^= 1;
    expect_syntax(out, n, 0, "sync marker");
    /* huge string length for the id */
    uint8_t bad[64];
    memcpy(bad, rec, rl);
    uint8_t *q = put_varint(bad, (int64_t)1 << 40);
    size_t bl = (size_t)(q - bad);
    memcpy(q, rec + 2, rl - 2);
    bl += rl - 2;
    n = craft(out, good, h, sync, 1, (int64_t)bl, bad, bl);
    expect_syntax(out, n, 0, "string: length");
    /* huge array count for the embedding */
    q = bad;
    q = put_varint(q, 1);
    *q++ = '1';
    q = put_varint(q, INT64_MAX);
    bl = (size_t)(q - bad);
    n = craft(out, good, h, sync, 1, (int64_t)bl, bad, bl);
    expect_syntax(out, n, 0, "array");
    /* negative block count with a lying byte size */
    q = bad;
    q = put_varint(q, 1);
    *q++ = '1';
    q = put_varint(q, -3);
    q = put_varint(q, 5);
    for (int i = 0; i < 3; i++) {
        float f = 1;
        memcpy(q, &f, 4);
        q += 4;
    }
    q = put_varint(q, 0);
    for (int i = 0; i < 4; i++)
        q = put_varint(q, 0);
    bl = (size_t)(q - bad);
    n = craft(out, good, h, sync, 1, (int64_t)bl, bad, bl);
    expect_syntax(out, n, 0, "block size says");
    /* union branch out of range */
    memcpy(bad, rec, rl);
    bad[rl - 1] = 4;
    n = craft(out, good, h, sync, 1, (int64_t)rl, bad, rl);
    expect_syntax(out, n, 0, "union");
    /* trailing bytes after the records of a block */
    memcpy(bad, rec, rl);
    bad[rl] = 0;
    n = craft(out, good, h, sync, 1, (int64_t)rl + 1, bad, rl + 1);
    expect_syntax(out, n, 1, "bytes left");
    /* every truncation of a valid two-block file: never a crash, an error at the end */
    free(good);
    good = write_file(GOOD, NGOOD, "deflate", 128, &len);
    for (size_t cut = 0; cut < len; cut++) {
        col cc = {0};
        int rc = read_mem(good, cut, 3, &cc, &err);
        /* a cut at a block boundary reads as a shorter valid file; elsewhere the last
         * event is an INVALID_AVRO_SYNTAX or the call fails (header) */
        if (rc == 0 && cut == len - 5) {
            assert_true(cc.n >= 1);
            assert_true(cc.v[cc.n - 1].invalid);
        }
        col_free(&cc);
    }
    free(good);
}

static void test_deflate_bomb(void **state)
{
    size_t len;
    static const spec one[] = {{"1", 3, {1, 1, 1}, 0, 0, {0}, {0}, NULL, 0, NULL}};
    uint8_t *good = write_file(one, 1, "deflate", 0, &len);
    size_t h = header_end(good, len);
    /* 128 MiB of zeros compressed */
    size_t zlen = 128u << 20;
    uint8_t *zeros = calloc(1, zlen);
    uLongf clen = compressBound(zlen);
    uint8_t *comp = malloc(clen);
    assert_int_equal(compress2(comp, &clen, zeros, zlen, 9), Z_OK);
    free(zeros);
    /* strip zlib header (2) and adler (4): raw deflate */
    size_t raw = clen - 6;
    uint8_t *out = malloc(h + raw + 64);
    size_t n = craft(out, good, h, good + len - 16, 1, (int64_t)raw, comp + 2, raw);
    expect_syntax(out, n, 0, "more than");
    free(out);
    free(comp);
    free(good);
}

static void test_schema_resolution(void **state)
{
    col c = {0};
    tsr_error err;
    struct {
        const char *schema;
        int ok;
        const char *needle;
    } cases[] = {
        /* reordered, optional fields missing, int dims, renamed record */
        {"{\"type\":\"record\",\"name\":\"X\",\"namespace\":\"a.b\",\"fields\":["
         "{\"name\":\"embedding\",\"type\":{\"type\":\"array\",\"items\":\"int\"}},"
         "{\"name\":\"extra\",\"type\":{\"type\":\"map\",\"values\":\"long\"}},"
         "{\"name\":\"id\",\"type\":\"string\"}]}",
         1, NULL},
        {"{\"type\":\"record\",\"name\":\"FeatureVector\",\"fields\":["
         "{\"name\":\"embedding\",\"type\":{\"type\":\"array\",\"items\":\"float\"}}]}",
         0, "no field 'id'"},
        {"{\"type\":\"record\",\"name\":\"FeatureVector\",\"fields\":["
         "{\"name\":\"id\",\"type\":\"string\"},"
         "{\"name\":\"embedding\",\"type\":{\"type\":\"array\",\"items\":\"double\"}}]}",
         0, "embedding"},
        {"\"string\"", 0, "expected the FeatureVector record"},
        {"{\"type\":", 0, "does not parse"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char path[512];
        tmp_name(path, sizeof path);
        avro_schema_t s;
        if (avro_schema_from_json_length(cases[k].schema, strlen(cases[k].schema), &s) != 0) {
            /* unparsable: hand-build a header with that schema text */
            uint8_t buf[512], *p = buf;
            memcpy(p, "Obj\x01", 4);
            p += 4;
            p = put_varint(p, 1);
            p = put_varint(p, 11);
            memcpy(p, "avro.schema", 11);
            p += 11;
            p = put_varint(p, (int64_t)strlen(cases[k].schema));
            memcpy(p, cases[k].schema, strlen(cases[k].schema));
            p += strlen(cases[k].schema);
            p = put_varint(p, 0);
            memset(p, 7, 16);
            p += 16;
            int rc = read_mem(buf, (size_t)(p - buf), 3, &c, &err);
            assert_int_not_equal(rc, 0);
            assert_non_null(strstr(err.msg, cases[k].needle));
            continue;
        }
        avro_file_writer_t w;
        assert_int_equal(avro_file_writer_create_with_codec(path, s, &w, "null", 0), 0);
        if (avro_typeof(s) == AVRO_RECORD) {
            avro_value_iface_t *iface = avro_generic_class_from_schema(s);
            avro_value_t rec, f, e;
            avro_generic_value_new(iface, &rec);
            if (avro_value_get_by_name(&rec, "id", &f, NULL) == 0)
                avro_value_set_string(&f, "r1");
            avro_value_get_by_name(&rec, "embedding", &f, NULL);
            for (int i = 0; i < 3; i++) {
                avro_value_append(&f, &e, NULL);
                if (avro_value_set_int(&e, i + 1) != 0)
                    avro_value_set_float(&e, (float)i + 1), avro_value_set_double(&e, i + 1);
            }
            if (avro_value_get_by_name(&rec, "extra", &f, NULL) == 0) {
                avro_value_add(&f, "k", &e, NULL, NULL);
                avro_value_set_long(&e, 5);
            }
            assert_int_equal(avro_file_writer_append_value(w, &rec), 0);
            avro_value_decref(&rec);
            avro_value_iface_decref(iface);
        }
        avro_file_writer_close(w);
        avro_schema_decref(s);
        tsr_record_sink sink = {&c, col_record, col_invalid, NULL};
        tsr_error_clear(&err);
        int rc = tsr_batch_avro_read(path, 3, &sink, &err);
        unlink(path);
        if (cases[k].ok) {
            assert_int_equal(rc, 0);
            assert_int_equal(c.n, 1);
            assert_false(c.v[0].invalid);
            assert_string_equal(c.v[0].dp.id, "r1");
            assert_true(c.v[0].dp.dense[2] == 3.0f);
            assert_null(c.v[0].dp.crowding_tag);
        } else {
            assert_int_not_equal(rc, 0);
            if (!strstr(err.msg, cases[k].needle))
                fail_msg("case %zu: %s", k, err.msg);
        }
        col_free(&c);
    }
}

/* A null-codec container with the given schema text and one block (caller frees). */
static uint8_t *hand_file(const char *schema, int64_t count, const uint8_t *data, size_t dlen,
                          size_t *len)
{
    size_t sl = strlen(schema);
    uint8_t *buf = malloc(sl + dlen + 128), *p = buf;
    assert_non_null(buf);
    memcpy(p, "Obj\x01", 4);
    p += 4;
    p = put_varint(p, 1);
    p = put_varint(p, 11);
    memcpy(p, "avro.schema", 11);
    p += 11;
    p = put_varint(p, (int64_t)sl);
    memcpy(p, schema, sl);
    p += sl;
    p = put_varint(p, 0);
    memset(p, 0x5a, 16);
    p += 16;
    p = put_varint(p, count);
    p = put_varint(p, (int64_t)dlen);
    memcpy(p, data, dlen);
    p += dlen;
    memset(p, 0x5a, 16);
    p += 16;
    *len = (size_t)(p - buf);
    return buf;
}

static void test_hostile_schemas(void **state)
{
    col c = {0};
    tsr_error err;
    size_t len;
    /* 100 nested arrays in a writer-only field */
    char deep[4096] = "{\"type\":\"record\",\"name\":\"F\",\"fields\":[{\"name\":\"id\","
                      "\"type\":\"string\"},{\"name\":\"x\",\"type\":";
    for (int i = 0; i < 100; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "\"int\"");
    for (int i = 0; i < 100; i++)
        strcat(deep, "}");
    strcat(deep, "}]}");
    uint8_t rec[4] = {2, 'a', 0, 0};
    uint8_t *f = hand_file(deep, 1, rec, 3, &len);
    assert_int_equal(read_mem(f, len, 3, &c, &err), TSR_EFORMAT);
    assert_non_null(strstr(err.msg, "nested"));
    free(f);

    /* 2000 null fields per record and 100000 one-byte records: the walk is bounded */
    size_t cap = 2000 * 40 + 256;
    char *wide = malloc(cap);
    strcpy(wide, "{\"type\":\"record\",\"name\":\"F\",\"fields\":[{\"name\":\"id\","
                 "\"type\":\"string\"}");
    for (int i = 0; i < 2000; i++)
        sprintf(wide + strlen(wide), ",{\"name\":\"n%d\",\"type\":\"null\"}", i);
    strcat(wide, "]}");
    size_t n = 100000;
    uint8_t *recs = calloc(1, n); /* id "" each: one byte */
    f = hand_file(wide, (int64_t)n, recs, n, &len);
    assert_int_equal(read_mem(f, len, 3, &c, &err), 0);
    assert_true(c.n >= 1);
    ev *e = &c.v[c.n - 1];
    assert_int_equal(e->type, TSR_REC_INVALID_AVRO_SYNTAX);
    assert_non_null(strstr(e->msg, "zero-size"));
    assert_true(c.n < 300);
    col_free(&c);
    free(f);
    free(recs);
    free(wide);

    /* array of nulls with a huge count in a writer-only field */
    const char *nulls = "{\"type\":\"record\",\"name\":\"F\",\"fields\":[{\"name\":\"id\","
                        "\"type\":\"string\"},{\"name\":\"x\",\"type\":{\"type\":\"array\","
                        "\"items\":\"null\"}}]}";
    uint8_t r2[32], *q = r2;
    q = put_varint(q, 1);
    *q++ = 'a';
    q = put_varint(q, INT64_MAX / 4);
    q = put_varint(q, 0);
    f = hand_file(nulls, 1, r2, (size_t)(q - r2), &len);
    assert_int_equal(read_mem(f, len, 3, &c, &err), 0);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.v[0].type, TSR_REC_INVALID_AVRO_SYNTAX);
    col_free(&c);
    free(f);
}

int main(void)
{
    const char *dump = getenv("TSR_AVRO_DUMP");
    if (dump != NULL)
        return dump_main(dump);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_codecs),  cmocka_unit_test(test_read_path),
        cmocka_unit_test(test_invalid_records),   cmocka_unit_test(test_not_avro),
        cmocka_unit_test(test_hostile_blocks),    cmocka_unit_test(test_deflate_bomb),
        cmocka_unit_test(test_schema_resolution), cmocka_unit_test(test_hostile_schemas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
