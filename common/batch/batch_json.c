/*
 * batch_json — the JSON batch reader.
 *
 * Each line is validated as UTF-8 (so encoding problems get INVALID_ENCODING, not a
 * syntax error), parsed with json_loadb (duplicate keys rejected), and mapped onto a
 * tsr_datapoint field by field. null counts as absent for the optional fields (the Avro
 * schema's null unions say the same). Numbers go through double (as protobuf's JSON
 * parser does for float fields) and must fit a float32.
 *
 * embedding_metadata (a JSON object) is stored serialized as the google.protobuf.Struct
 * the APIs carry (tsr_datapoint.metadata): objects -> Struct, arrays -> ListValue, numbers
 * -> number_value (a double, as protobuf's JSON mapping), strings, booleans, null. The
 * encoder below writes the protobuf wire form directly (common/ does not link the
 * generated code); its size is computed first and checked against TSR_METADATA_MAX before
 * anything is allocated.
 */
#include "batch/batch_json.h"

#include <ctype.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_int.h"
#include "core/mem.h"

static const char *const top_fields[] = {"id",         "embedding",         "sparse_embedding",
                                         "restricts",  "numeric_restricts", "crowding_tag",
                                         "embedding_metadata", NULL};
static const char *const sparse_fields[] = {"values", "dimensions", NULL};
static const char *const restrict_fields[] = {"namespace", "allow", "deny", NULL};
static const char *const numeric_fields[] = {"namespace", "value_int", "value_float",
                                             "value_double", NULL};

/* Names users write (other APIs, protobuf field names, plurals) -> the field meant. */
static const char *const aliases[][2] = {
    {"allow_list", "allow"},
    {"allowlist", "allow"},
    {"allow_tokens", "allow"},
    {"string_tokens", "allow"},
    {"tokens", "allow"},
    {"deny_list", "deny"},
    {"denylist", "deny"},
    {"deny_tokens", "deny"},
    {"string_blacklist_tokens", "deny"},
    {"blacklist", "deny"},
    {"sparse_embeddings", "sparse_embedding"},
    {"sparse", "sparse_embedding"},
    {"sparse_vector", "sparse_embedding"},
    {"feature_vector", "embedding"},
    {"embeddings", "embedding"},
    {"vector", "embedding"},
    {"dense_embedding", "embedding"},
    {"datapoint_id", "id"},
    {"datapointid", "id"},
    {"_id", "id"},
    {"restrictions", "restricts"},
    {"token_restricts", "restricts"},
    {"numeric_restrictions", "numeric_restricts"},
    {"crowding_attribute", "crowding_tag"},
    {"metadata", "embedding_metadata"},
    {"embeddingmetadata", "embedding_metadata"},
    {"crowding", "crowding_tag"},
    {"name", "namespace"},
    {"ns", "namespace"},
    {"dims", "dimensions"},
    {"indices", "dimensions"},
    {"value", "value_double"},
    {"int", "value_int"},
    {"float", "value_float"},
    {"double", "value_double"},
};

static int in_list(const char *name, const char *const *known)
{
    for (size_t i = 0; known[i] != NULL; i++)
        if (strcmp(name, known[i]) == 0)
            return 1;
    return 0;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 99;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j];
            size_t sub = prev + (tolower((unsigned char)a[i - 1]) != b[j - 1]);
            size_t del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

const char *tsr_batch_json_suggest(const char *name, const char *const *known)
{
    /* Normalize: camelCase / dashes / case -> snake_case. */
    char norm[80];
    size_t o = 0;
    for (size_t i = 0; name[i] != '\0' && o + 2 < sizeof norm; i++) {
        unsigned char c = (unsigned char)name[i];
        if (isupper(c)) {
            if (i > 0 && o > 0 && norm[o - 1] != '_')
                norm[o++] = '_';
            norm[o++] = (char)tolower(c);
        } else if (c == '-' || c == ' ') {
            norm[o++] = '_';
        } else {
            norm[o++] = (char)c;
        }
    }
    norm[o] = '\0';
    for (size_t k = 0; known[k] != NULL; k++)
        if (strcmp(norm, known[k]) == 0)
            return known[k];
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(norm, aliases[i][0]) == 0 && in_list(aliases[i][1], known))
            for (size_t k = 0; known[k] != NULL; k++)
                if (strcmp(known[k], aliases[i][1]) == 0)
                    return known[k];
    const char *best = NULL;
    size_t bestd = 3;
    for (size_t k = 0; known[k] != NULL; k++) {
        size_t d = edit_distance(norm, known[k]);
        if (d < bestd && d < strlen(known[k])) {
            bestd = d;
            best = known[k];
        }
    }
    return best;
}

typedef struct json_state {
    size_t dims;
    const tsr_record_sink *sink; /* borrowed */
    char msg[512];
} json_state;

enum { REC_OK = 0, REC_BAD = 1 }; /* the prc values of tsr__lines_result */

#define BAD(t, ...)                                          \
    do {                                                     \
        *type = (t);                                         \
        snprintf(st->msg, sizeof st->msg, __VA_ARGS__);      \
        return REC_BAD;                                      \
    } while (0)

/* Checks obj for fields not in known. where = "the record", "restricts[2]", ... */
static int check_fields(json_state *st, json_t *obj, const char *const *known, const char *where,
                        enum tsr_rec_error *type)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        if (in_list(key, known))
            continue;
        char snip[80];
        tsr__snippet(snip, sizeof snip, key, strlen(key), 40);
        const char *s = tsr_batch_json_suggest(key, known);
        if (s != NULL)
            BAD(TSR_REC_PARSING_ERROR, "unknown field '%s' in %s; did you mean '%s'?", snip,
                where, s);
        char list[160];
        size_t o = 0;
        for (size_t k = 0; known[k] != NULL; k++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", k ? ", " : "", known[k]);
        BAD(TSR_REC_PARSING_ERROR, "unknown field '%s' in %s (known fields: %s)", snip, where,
            list);
    }
    return REC_OK;
}

/* A JSON number as a finite float32; 0 ok, 1 not a number, 2 out of range. */
static int to_float(json_t *v, float *out)
{
    double d;
    if (json_is_integer(v))
        d = (double)json_integer_value(v);
    else if (json_is_real(v))
        d = json_real_value(v);
    else
        return 1;
    float f = (float)d;
    if (!isfinite(d) || isinf(f))
        return 2;
    *out = f;
    return 0;
}

static int parse_sparse(json_state *st, json_t *sp, tsr_datapoint *dp, enum tsr_rec_error *type)
{
    if (!json_is_object(sp))
        BAD(TSR_REC_INVALID_SPARSE_EMBEDDING,
            "sparse_embedding must be an object {\"values\": [...], \"dimensions\": [...]}");
    int rc = check_fields(st, sp, sparse_fields, "sparse_embedding", type);
    if (rc != REC_OK)
        return rc;
    json_t *vals = json_object_get(sp, "values"), *dims = json_object_get(sp, "dimensions");
    if (!json_is_array(vals) || !json_is_array(dims))
        BAD(TSR_REC_INVALID_SPARSE_EMBEDDING,
            "sparse_embedding needs arrays \"values\" and \"dimensions\"");
    size_t n = json_array_size(vals);
    if (json_array_size(dims) != n)
        BAD(TSR_REC_INVALID_SPARSE_EMBEDDING,
            "sparse_embedding has %zu values but %zu dimensions; they must be equal", n,
            json_array_size(dims));
    if (n == 0)
        return REC_OK;
    dp->sparse_dims = tsr_try_malloc(n, sizeof *dp->sparse_dims);
    dp->sparse_vals = tsr_try_malloc(n, sizeof *dp->sparse_vals);
    if (dp->sparse_dims == NULL || dp->sparse_vals == NULL)
        return TSR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(dims, i);
        if (!json_is_integer(d))
            BAD(TSR_REC_INVALID_SPARSE_DIMENSIONS,
                "sparse_embedding.dimensions[%zu] is not an integer (int64)", i);
        dp->sparse_dims[i] = (int64_t)json_integer_value(d);
        int r = to_float(json_array_get(vals, i), &dp->sparse_vals[i]);
        if (r == 1)
            BAD(TSR_REC_INVALID_SPARSE_EMBEDDING, "sparse_embedding.values[%zu] is not a number", i);
        if (r == 2)
            BAD(TSR_REC_INVALID_EMBEDDING,
                "sparse_embedding.values[%zu] is beyond the float range", i);
        dp->nsparse = i + 1;
    }
    tsr_datapoint_normalize_sparse(dp);
    return REC_OK;
}

static int parse_tokens(json_state *st, json_t *arr, tsr_datapoint *dp, const char *ns,
                        size_t idx, int deny, enum tsr_rec_error *type)
{
    const char *fname = deny ? "deny" : "allow";
    if (arr == NULL || json_is_null(arr)) /* absent or null: optional in the seed's form */
        return REC_OK;
    if (!json_is_array(arr))
        BAD(TSR_REC_INVALID_TOKEN_VALUE, "restricts[%zu].%s must be an array of strings", idx, fname);
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_string(t))
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "restricts[%zu].%s[%zu] is not a string", idx, fname, i);
        if (json_string_length(t) == 0)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "restricts[%zu].%s[%zu] is an empty string", idx, fname, i);
        if (tsr__dp_add_token(dp, ns, strlen(ns), json_string_value(t), json_string_length(t), deny))
            return TSR_ENOMEM;
    }
    return REC_OK;
}

/* Element r of a restricts or numeric_restricts array, `where` in messages: an object
 * with only the fields in known and a namespace (a non-empty string without NUL: *ns). */
static int restrict_entry(json_state *st, json_t *r, const char *where, const char *const *known,
                          const char **ns, enum tsr_rec_error *type)
{
    if (!json_is_object(r))
        BAD(TSR_REC_PARSING_ERROR, "%s is not an object", where);
    int rc = check_fields(st, r, known, where, type);
    if (rc != REC_OK)
        return rc;
    json_t *v = json_object_get(r, "namespace");
    if (!json_is_string(v) || json_string_length(v) == 0)
        BAD(TSR_REC_NAMESPACE_MISSING, "%s has no namespace (a non-empty string)", where);
    if (strlen(json_string_value(v)) != json_string_length(v))
        BAD(TSR_REC_NAMESPACE_MISSING, "%s.namespace contains a NUL character", where);
    *ns = json_string_value(v);
    return REC_OK;
}

static int parse_restricts(json_state *st, json_t *arr, tsr_datapoint *dp, enum tsr_rec_error *type)
{
    if (!json_is_array(arr))
        BAD(TSR_REC_PARSING_ERROR, "restricts must be an array of {namespace, allow, deny} objects");
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "restricts[%zu]", i);
        const char *nss;
        int rc = restrict_entry(st, r, where, restrict_fields, &nss, type);
        if (rc != REC_OK)
            return rc;
        if (tsr__dp_add_token(dp, nss, strlen(nss), NULL, 0, 0))
            return TSR_ENOMEM;
        rc = parse_tokens(st, json_object_get(r, "allow"), dp, nss, i, 0, type);
        if (rc != REC_OK)
            return rc;
        rc = parse_tokens(st, json_object_get(r, "deny"), dp, nss, i, 1, type);
        if (rc != REC_OK)
            return rc;
    }
    return REC_OK;
}

static int parse_numeric(json_state *st, json_t *arr, tsr_datapoint *dp, enum tsr_rec_error *type)
{
    if (!json_is_array(arr))
        BAD(TSR_REC_PARSING_ERROR,
            "numeric_restricts must be an array of {namespace, value_int|value_float|value_double}");
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "numeric_restricts[%zu]", i);
        /* before the field check, which would call "op" unknown (NULL for a non-object) */
        if (json_object_get(r, "op") != NULL)
            BAD(TSR_REC_OP_IN_DATAPOINT,
                "%s has an \"op\" field; operators belong to queries, not to datapoints", where);
        const char *nss;
        int rc = restrict_entry(st, r, where, numeric_fields, &nss, type);
        if (rc != REC_OK)
            return rc;
        json_t *vi = json_object_get(r, "value_int"), *vf = json_object_get(r, "value_float"),
               *vd = json_object_get(r, "value_double");
        int nv = (vi && !json_is_null(vi)) + (vf && !json_is_null(vf)) + (vd && !json_is_null(vd));
        if (nv == 0)
            BAD(TSR_REC_INVALID_NUMERIC_VALUE, "%s needs one of value_int, value_float, value_double",
                where);
        if (nv > 1)
            BAD(TSR_REC_MULTIPLE_VALUES,
                "%s has %d of value_int, value_float, value_double; exactly one is allowed", where,
                nv);
        tsr_numeric_restrict nr;
        memset(&nr, 0, sizeof nr);
        if (vi && !json_is_null(vi)) {
            if (!json_is_integer(vi))
                BAD(TSR_REC_INVALID_NUMERIC_VALUE, "%s.value_int is not an integer", where);
            nr.type = TSR_NUM_INT;
            nr.v.i = (int64_t)json_integer_value(vi);
        } else if (vf && !json_is_null(vf)) {
            nr.type = TSR_NUM_FLOAT;
            int fr = to_float(vf, &nr.v.f);
            if (fr)
                BAD(TSR_REC_INVALID_NUMERIC_VALUE, "%s.value_float is %s", where,
                    fr == 1 ? "not a number" : "beyond the float range");
        } else {
            nr.type = TSR_NUM_DOUBLE;
            if (!json_is_number(vd))
                BAD(TSR_REC_INVALID_NUMERIC_VALUE, "%s.value_double is not a number", where);
            nr.v.d = json_number_value(vd);
            if (!isfinite(nr.v.d))
                BAD(TSR_REC_INVALID_NUMERIC_VALUE, "%s.value_double is not finite", where);
        }
        rc = tsr__dp_add_numeric(dp, nss, strlen(nss), &nr);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            char snip[80];
            tsr__snippet(snip, sizeof snip, nss, strlen(nss), 40);
            BAD(TSR_REC_DUPLICATE_NAMESPACE,
                "%s: numeric namespace '%s' appears twice; a numeric namespace holds one value",
                where, snip);
        }
    }
    return REC_OK;
}

/* ---- embedding_metadata -> google.protobuf.Struct wire bytes ------------------------- */

#define META_DEPTH_MAX 64 /* nesting of objects/arrays inside embedding_metadata */

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A length-delimited field of n payload bytes (tags here are one byte). */
static size_t ld_len(size_t n)
{
    return 1 + varint_len(n) + n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_ld(uint8_t *p, uint8_t tag, const void *data, size_t n)
{
    *p++ = tag;
    p = put_varint(p, n);
    if (n)
        memcpy(p, data, n);
    return p + n;
}

/* Payload size of v as a google.protobuf.Value (what = 0), or of the object v as a Struct
 * (what = 1) or the array v as a ListValue (what = 2); checks depth and NULs on the way.
 * path names the member for messages ("embedding_metadata.a.b[2]"). -1 with st->msg. */
static int meta_size(json_state *st, json_t *v, int what, int depth, char *path, size_t *out)
{
    size_t n = 0, plen = strlen(path);
    if (what == 0) {
        switch (json_typeof(v)) {
        case JSON_NULL:
        case JSON_TRUE:
        case JSON_FALSE:
            *out = 2; /* tag + varint */
            return 0;
        case JSON_INTEGER:
        case JSON_REAL:
            *out = 9; /* tag + fixed64 */
            return 0;
        case JSON_STRING:
            if (strlen(json_string_value(v)) != json_string_length(v)) {
                snprintf(st->msg, sizeof st->msg, "%s: a string contains a NUL character", path);
                return -1;
            }
            *out = ld_len(json_string_length(v));
            return 0;
        case JSON_OBJECT:
        case JSON_ARRAY:
            if (meta_size(st, v, json_is_object(v) ? 1 : 2, depth + 1, path, &n) != 0)
                return -1;
            *out = ld_len(n);
            return 0;
        }
        return -1;
    }
    if (depth >= META_DEPTH_MAX) { /* the metadata object itself is level 1 */
        snprintf(st->msg, sizeof st->msg, "%s: nests deeper than %d levels", path, META_DEPTH_MAX);
        return -1;
    }
    if (what == 1) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            size_t kl = strlen(k), vs;
            if (plen < 200)
                snprintf(path + plen, 256 - plen, ".%.40s", k);
            if (json_object_iter_key_len(json_object_key_to_iter(k)) != kl) {
                snprintf(st->msg, sizeof st->msg, "%s: a key contains a NUL character", path);
                return -1;
            }
            if (meta_size(st, x, 0, depth, path, &vs) != 0)
                return -1;
            /* map entry {key = 1, value = 2}; an empty key is left out (proto3 default) */
            n += ld_len((kl ? ld_len(kl) : 0) + ld_len(vs));
            path[plen] = 0;
            if (n > TSR_METADATA_MAX)
                break;
        }
    } else {
        for (size_t i = 0; i < json_array_size(v); i++) {
            size_t vs;
            if (plen < 200)
                snprintf(path + plen, 256 - plen, "[%zu]", i);
            if (meta_size(st, json_array_get(v, i), 0, depth, path, &vs) != 0)
                return -1;
            n += ld_len(vs);
            path[plen] = 0;
            if (n > TSR_METADATA_MAX)
                break;
        }
    }
    *out = n;
    return 0;
}

/* Writes what meta_size measured (already checked) at p; returns the end. */
static uint8_t *meta_put(json_state *st, json_t *v, int what, uint8_t *p)
{
    char path[256] = "";
    size_t n = 0;
    if (what == 0) {
        switch (json_typeof(v)) {
        case JSON_NULL: /* null_value = 1 (NULL_VALUE) */
            *p++ = 0x08;
            *p++ = 0;
            return p;
        case JSON_TRUE:
        case JSON_FALSE: /* bool_value = 4 */
            *p++ = 0x20;
            *p++ = json_is_true(v) ? 1 : 0;
            return p;
        case JSON_INTEGER:
        case JSON_REAL: { /* number_value = 2, fixed64 little-endian */
            double d = json_number_value(v);
            uint64_t bits;
            memcpy(&bits, &d, sizeof bits);
            *p++ = 0x11;
            for (int i = 0; i < 8; i++)
                *p++ = (uint8_t)(bits >> (8 * i));
            return p;
        }
        case JSON_STRING: /* string_value = 3 */
            return put_ld(p, 0x1a, json_string_value(v), json_string_length(v));
        default: /* struct_value = 5, list_value = 6 */
            meta_size(st, v, json_is_object(v) ? 1 : 2, 0, path, &n);
            *p++ = json_is_object(v) ? 0x2a : 0x32;
            p = put_varint(p, n);
            return meta_put(st, v, json_is_object(v) ? 1 : 2, p);
        }
    }
    if (what == 1) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        { /* fields = 1: map entry {string key = 1; Value value = 2} */
            size_t kl = strlen(k), vs;
            meta_size(st, x, 0, 0, path, &vs);
            *p++ = 0x0a;
            p = put_varint(p, (kl ? ld_len(kl) : 0) + ld_len(vs));
            if (kl)
                p = put_ld(p, 0x0a, k, kl);
            *p++ = 0x12;
            p = put_varint(p, vs);
            p = meta_put(st, x, 0, p);
        }
        return p;
    }
    for (size_t i = 0; i < json_array_size(v); i++) { /* values = 1 */
        json_t *x = json_array_get(v, i);
        size_t vs;
        meta_size(st, x, 0, 0, path, &vs);
        *p++ = 0x0a;
        p = put_varint(p, vs);
        p = meta_put(st, x, 0, p);
    }
    return p;
}

/* dp->metadata from the JSON object md: REC_OK, REC_BAD (*type, st->msg) or TSR_ENOMEM. */
static int parse_metadata(json_state *st, json_t *md, tsr_datapoint *dp, enum tsr_rec_error *type)
{
    char path[256] = "embedding_metadata";
    size_t n = 0;
    if (!json_is_object(md))
        BAD(TSR_REC_PARSING_ERROR, "\"embedding_metadata\" must be a JSON object");
    if (meta_size(st, md, 1, 0, path, &n) != 0) {
        *type = TSR_REC_PARSING_ERROR;
        return REC_BAD;
    }
    if (n > TSR_METADATA_MAX)
        BAD(TSR_REC_PARSING_ERROR, "\"embedding_metadata\" is more than %zu bytes serialized "
            "(as a google.protobuf.Struct), the limit", TSR_METADATA_MAX);
    if (n == 0) /* {}: nothing to store */
        return REC_OK;
    if ((dp->metadata = tsr_try_malloc(n, 1)) == NULL)
        return TSR_ENOMEM;
    dp->nmetadata = (size_t)(meta_put(st, md, 1, dp->metadata) - dp->metadata);
    return REC_OK;
}

static int parse_record(json_state *st, json_t *o, tsr_datapoint *dp, enum tsr_rec_error *type)
{
    if (!json_is_object(o))
        BAD(TSR_REC_INVALID_JSON_SYNTAX, "the line is not a JSON object");
    int rc = check_fields(st, o, top_fields, "the record", type);
    if (rc != REC_OK)
        return rc;
    json_t *id = json_object_get(o, "id");
    if (id == NULL)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "the record has no \"id\"");
    if (!json_is_string(id))
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "\"id\" must be a string");
    size_t idlen = json_string_length(id);
    if (idlen == 0)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "\"id\" is empty");
    if (strlen(json_string_value(id)) != idlen)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "\"id\" contains a NUL character");
    if ((dp->id = tsr_try_strndup(json_string_value(id), idlen)) == NULL)
        return TSR_ENOMEM;

    json_t *emb = json_object_get(o, "embedding");
    if (emb != NULL && !json_is_null(emb)) {
        if (!json_is_array(emb))
            BAD(TSR_REC_INVALID_EMBEDDING, "\"embedding\" must be an array of numbers");
        size_t n = json_array_size(emb);
        if (n != 0 && n != st->dims)
            BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH,
                "\"embedding\" has %zu values, the index dimension is %zu", n, st->dims);
        if (n != 0) {
            dp->dense = tsr_try_malloc(n, sizeof *dp->dense);
            if (dp->dense == NULL)
                return TSR_ENOMEM;
            for (size_t i = 0; i < n; i++) {
                int r = to_float(json_array_get(emb, i), &dp->dense[i]);
                if (r)
                    BAD(TSR_REC_INVALID_EMBEDDING, "embedding[%zu] is %s", i,
                        r == 1 ? "not a number" : "beyond the float range");
            }
            dp->ndense = n;
        }
    }
    json_t *sp = json_object_get(o, "sparse_embedding");
    if (sp != NULL && !json_is_null(sp)) {
        rc = parse_sparse(st, sp, dp, type);
        if (rc != REC_OK)
            return rc;
    }
    if (dp->ndense == 0 && dp->nsparse == 0)
        BAD(TSR_REC_INVALID_EMBEDDING,
            "no embedding: the record needs \"embedding\" (%zu numbers) or a non-empty "
            "\"sparse_embedding\"",
            st->dims);
    json_t *r = json_object_get(o, "restricts");
    if (r != NULL && !json_is_null(r)) {
        rc = parse_restricts(st, r, dp, type);
        if (rc != REC_OK)
            return rc;
    }
    json_t *nr = json_object_get(o, "numeric_restricts");
    if (nr != NULL && !json_is_null(nr)) {
        rc = parse_numeric(st, nr, dp, type);
        if (rc != REC_OK)
            return rc;
    }
    json_t *ct = json_object_get(o, "crowding_tag");
    if (ct != NULL && !json_is_null(ct)) {
        if (!json_is_string(ct))
            BAD(TSR_REC_PARSING_ERROR, "\"crowding_tag\" must be a string");
        size_t l = json_string_length(ct);
        if (l == 0 || strlen(json_string_value(ct)) != l)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "\"crowding_tag\" is empty or contains NUL");
        if ((dp->crowding_tag = tsr_try_strndup(json_string_value(ct), l)) == NULL)
            return TSR_ENOMEM;
    }
    json_t *md = json_object_get(o, "embedding_metadata");
    if (md != NULL && !json_is_null(md))
        return parse_metadata(st, md, dp, type);
    return REC_OK;
}

/* The message of a syntax error of one line: "column C: <jansson's text>", where "end of
 * file" (jansson parses one line as its whole input) reads "end of the line", so that an
 * error in the middle of a file does not say "near end of file"; the sink adds the file
 * and the line. */
static void syntax_message(json_error_t *jerr, char *out, size_t cap)
{
    /* jansson quotes the bad token ("... near '...'") byte-wise, and may cut a UTF-8
     * sequence (e.g. a backslash before a 2-byte character): drop the quote then */
    char *near = strstr(jerr->text, " near '");
    if (near && !tsr__utf8_valid(jerr->text, strlen(jerr->text)))
        *near = '\0';
    const char *text = tsr__utf8_valid(jerr->text, strlen(jerr->text)) ? jerr->text
                                                                       : "syntax error";
    static const char eof_near[] = " near end of file", eof[] = "end of file";
    const char *at = strstr(text, eof_near);
    if (at && at[sizeof eof_near - 1] == '\0') /* "']' expected near end of file" */
        snprintf(out, cap, "column %d: %.*s at the end of the line (a record must be on one "
                 "line)", jerr->column, (int)(at - text), text);
    else if ((at = strstr(text, eof)) != NULL) /* "end of file expected near 'x'" */
        snprintf(out, cap, "column %d: %.*send of the line%s", jerr->column, (int)(at - text),
                 text, at + sizeof eof - 1);
    else
        snprintf(out, cap, "column %d: %s", jerr->column, text);
}

/* One line (tsr__line_fn): classifies it and hands a record or an error to the sink. */
static int json_line(void *ctx, const tsr__lines *r, const char *line, size_t len, int too_long,
                     tsr_error *err)
{
    json_state *st = ctx;
    const tsr_record_sink *sink = st->sink;
    uint64_t ln = r->lineno;
    if (too_long)
        return tsr__lines_too_long(r, sink, TSR_REC_INVALID_JSON_SYNTAX);
    if (tsr__blank(line, len))
        return sink->invalid(sink->ctx, ln, TSR_REC_EMPTY_LINE, "empty line") != 0;
    if (!tsr__utf8_valid(line, len))
        return sink->invalid(sink->ctx, ln, TSR_REC_INVALID_ENCODING,
                             "line is not valid UTF-8") != 0;
    json_error_t jerr;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (o == NULL) {
        syntax_message(&jerr, st->msg, sizeof st->msg);
        return sink->invalid(sink->ctx, ln, TSR_REC_INVALID_JSON_SYNTAX, st->msg) != 0;
    }
    tsr_datapoint dp;
    tsr_datapoint_init(&dp);
    enum tsr_rec_error type = TSR_REC_PARSING_ERROR;
    int prc = parse_record(st, o, &dp, &type);
    json_decref(o);
    return tsr__lines_result(r, sink, prc, &dp, type, st->msg, err);
}

int tsr_batch_json_read(const char *path, size_t dims, const tsr_record_sink *sink,
                        tsr_error *err)
{
    json_state st = {.dims = dims, .sink = sink};
    return tsr__lines_run(path, NULL, 0, json_line, &st, err);
}

int tsr_batch_json_read_mem(const void *data, size_t len, size_t dims,
                            const tsr_record_sink *sink, tsr_error *err)
{
    json_state st = {.dims = dims, .sink = sink};
    return tsr__lines_run(NULL, data, len, json_line, &st, err);
}
