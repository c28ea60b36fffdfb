/*
 * batch_csv — the CSV batch reader.
 *
 * Fields are split at every comma (no quoting: Vertex's format has none, so an id or a
 * token cannot contain a comma). After the id, a field containing '=' is a name=value
 * pair, else a field containing ':' is a sparse dimension:value, else it is a dense value.
 * The groups must come in the order dense, sparse, name=value; anything out of order is
 * INVALID_CSV_SYNTAX. Decisions documented in docs/batch-format.md.
 */
#include "batch/batch_csv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_int.h"
#include "core/mem.h"

typedef struct csv_state {
    size_t dims;
    float *dense;       /* dims floats, reused per line */
    int64_t *sdims;     /* reused per line */
    float *svals;
    size_t scap;
    const tsr_record_sink *sink; /* borrowed */
    char msg[512];
} csv_state;

enum { LINE_OK = 0, LINE_BAD = 1 }; /* the prc values of tsr__lines_result */

#define BAD(t, ...)                                          \
    do {                                                     \
        *type = (t);                                         \
        snprintf(st->msg, sizeof st->msg, __VA_ARGS__);      \
        return LINE_BAD;                                     \
    } while (0)

static void trim_ws(const char **s, size_t *n)
{
    while (*n > 0 && ((*s)[0] == ' ' || (*s)[0] == '\t')) {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
        (*n)--;
}

static int sparse_push(csv_state *st, size_t n, int64_t d, float v)
{
    if (n == st->scap) {
        size_t nc = st->scap ? st->scap * 2 : 64;
        int64_t *nd = tsr_try_realloc(st->sdims, nc, sizeof *nd);
        if (nd == NULL)
            return TSR_ENOMEM;
        st->sdims = nd;
        float *nv = tsr_try_realloc(st->svals, nc, sizeof *nv);
        if (nv == NULL)
            return TSR_ENOMEM;
        st->svals = nv;
        st->scap = nc;
    }
    st->sdims[n] = d;
    st->svals[n] = v;
    return 0;
}

/* Handles one name=value field (f[0..n), eq = offset of the first '='). */
static int parse_kv(csv_state *st, tsr_datapoint *dp, size_t fieldno, const char *f, size_t n,
                    size_t eq, enum tsr_rec_error *type)
{
    const char *name = f, *val = f + eq + 1;
    size_t nlen = eq, vlen = n - eq - 1;
    char snip[80];
    if (nlen > 0 && name[0] == '#') {
        name++;
        nlen--;
        if (nlen == 0)
            BAD(TSR_REC_NAMESPACE_MISSING, "field %zu: numeric restrict '#=' without a namespace name",
                fieldno);
        tsr__snippet(snip, sizeof snip, val, vlen, 40);
        tsr_numeric_restrict nr;
        memset(&nr, 0, sizeof nr);
        char suffix = vlen > 0 ? val[vlen - 1] : '\0';
        if (vlen < 2 || (suffix != 'i' && suffix != 'f' && suffix != 'd'))
            BAD(TSR_REC_INVALID_NUMERIC_VALUE,
                "field %zu: numeric restrict value '%s' needs a number followed by a type suffix "
                "i (int), f (float) or d (double), e.g. #size=3i",
                fieldno, snip);
        int rc;
        if (suffix == 'i') {
            nr.type = TSR_NUM_INT;
            rc = tsr__parse_int64(val, vlen - 1, &nr.v.i);
        } else if (suffix == 'f') {
            nr.type = TSR_NUM_FLOAT;
            rc = tsr__parse_java_float(val, vlen - 1, &nr.v.f);
        } else {
            nr.type = TSR_NUM_DOUBLE;
            rc = tsr__parse_java_double(val, vlen - 1, &nr.v.d);
        }
        if (rc != TSR__NUM_OK)
            BAD(TSR_REC_INVALID_NUMERIC_VALUE, "field %zu: numeric restrict value '%s' is %s",
                fieldno, snip,
                rc == TSR__NUM_NONFINITE ? "not finite (NaN, Infinity or out of range)"
                : rc == TSR__NUM_RANGE   ? "outside the 64-bit integer range"
                : suffix == 'i'          ? "not an integer"
                                         : "not a Java floating-point literal");
        rc = tsr__dp_add_numeric(dp, name, nlen, &nr);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            tsr__snippet(snip, sizeof snip, name, nlen, 40);
            BAD(TSR_REC_DUPLICATE_NAMESPACE,
                "field %zu: numeric restrict namespace '%s' appears twice; a numeric namespace "
                "holds one value per record",
                fieldno, snip);
        }
        return LINE_OK;
    }
    if (nlen == 12 && memcmp(name, "crowding_tag", 12) == 0) {
        if (dp->crowding_tag != NULL)
            BAD(TSR_REC_MULTIPLE_VALUES, "field %zu: crowding_tag given more than once", fieldno);
        if (vlen == 0)
            BAD(TSR_REC_INVALID_TOKEN_VALUE, "field %zu: crowding_tag= has an empty value", fieldno);
        if ((dp->crowding_tag = tsr_try_strndup(val, vlen)) == NULL)
            return TSR_ENOMEM;
        return LINE_OK;
    }
    if (nlen == 0)
        BAD(TSR_REC_NAMESPACE_MISSING, "field %zu: token restrict '=value' without a namespace name",
            fieldno);
    int deny = vlen > 0 && val[0] == '!';
    if (deny) {
        val++;
        vlen--;
    }
    if (vlen == 0) {
        tsr__snippet(snip, sizeof snip, name, nlen, 40);
        BAD(TSR_REC_INVALID_TOKEN_VALUE, "field %zu: token restrict '%s=%s' has an empty value",
            fieldno, snip, deny ? "!" : "");
    }
    return tsr__dp_add_token(dp, name, nlen, val, vlen, deny);
}

/* Parses one non-empty, valid UTF-8 line into dp. Returns LINE_OK, LINE_BAD (type and
 * st->msg set, dp partly filled; caller closes it) or TSR_ENOMEM. */
static int parse_line(csv_state *st, const char *line, size_t len, tsr_datapoint *dp,
                      enum tsr_rec_error *type)
{
    const char *end = line + len;
    const char *comma = memchr(line, ',', len);
    size_t idlen = comma ? (size_t)(comma - line) : len;
    if (idlen == 0)
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "the id (first field) is empty");
    if ((dp->id = tsr_try_strndup(line, idlen)) == NULL)
        return TSR_ENOMEM;

    size_t ndense = 0, nsparse = 0, fieldno = 1;
    int phase = 0; /* 0 dense, 1 sparse, 2 name=value */
    char snip[80];
    const char *p = comma ? comma + 1 : end;
    int more = comma != NULL;
    while (more) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *fe = c ? c : end;
        const char *f = p;
        size_t n = (size_t)(fe - f);
        fieldno++;
        more = c != NULL;
        p = c ? c + 1 : end;

        const char *eq = memchr(f, '=', n);
        if (eq != NULL) {
            if (phase == 0 && ndense != 0 && ndense != st->dims)
                BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH,
                    "%zu dense values, the index dimension is %zu", ndense, st->dims);
            phase = 2;
            int rc = parse_kv(st, dp, fieldno, f, n, (size_t)(eq - f), type);
            if (rc != LINE_OK)
                return rc;
            continue;
        }
        const char *colon = memchr(f, ':', n);
        if (colon != NULL) {
            if (phase == 2) {
                tsr__snippet(snip, sizeof snip, f, n, 40);
                BAD(TSR_REC_INVALID_CSV_SYNTAX,
                    "field %zu: sparse value '%s' after name=value fields; the order is id, dense "
                    "values, sparse values, name=value lists",
                    fieldno, snip);
            }
            if (phase == 0 && ndense != 0 && ndense != st->dims)
                BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH,
                    "%zu dense values, the index dimension is %zu", ndense, st->dims);
            phase = 1;
            const char *ds = f;
            size_t dn = (size_t)(colon - f);
            trim_ws(&ds, &dn);
            int64_t dim;
            int rc = tsr__parse_int64(ds, dn, &dim);
            if (rc != TSR__NUM_OK) {
                tsr__snippet(snip, sizeof snip, f, n, 40);
                BAD(TSR_REC_INVALID_SPARSE_DIMENSIONS,
                    "field %zu: sparse dimension in '%s' is %s", fieldno, snip,
                    rc == TSR__NUM_RANGE ? "outside the 64-bit integer range" : "not an integer");
            }
            float v;
            rc = tsr__parse_java_float(colon + 1, (size_t)(fe - colon - 1), &v);
            if (rc != TSR__NUM_OK) {
                tsr__snippet(snip, sizeof snip, f, n, 40);
                if (rc == TSR__NUM_NONFINITE)
                    BAD(TSR_REC_INVALID_EMBEDDING,
                        "field %zu: sparse value in '%s' is not finite (NaN, Infinity or beyond "
                        "the float range)",
                        fieldno, snip);
                BAD(TSR_REC_INVALID_SPARSE_EMBEDDING,
                    "field %zu: sparse value in '%s' is not a Java floating-point literal",
                    fieldno, snip);
            }
            if (sparse_push(st, nsparse, dim, v))
                return TSR_ENOMEM;
            nsparse++;
            continue;
        }
        if (phase != 0) {
            tsr__snippet(snip, sizeof snip, f, n, 40);
            BAD(TSR_REC_INVALID_CSV_SYNTAX,
                "field %zu: dense value '%s' after %s; dense values must come right after the id",
                fieldno, snip, phase == 1 ? "sparse values" : "name=value fields");
        }
        float v;
        int rc = tsr__parse_java_float(f, n, &v);
        if (rc != TSR__NUM_OK) {
            tsr__snippet(snip, sizeof snip, f, n, 40);
            BAD(TSR_REC_INVALID_EMBEDDING,
                rc == TSR__NUM_NONFINITE
                    ? "field %zu: dense value '%s' is not finite (NaN, Infinity or beyond the "
                      "float range)"
                    : "field %zu: dense value '%s' is not a Java floating-point literal",
                fieldno, snip);
        }
        if (ndense < st->dims)
            st->dense[ndense] = v;
        ndense++;
    }
    if (phase == 0 && ndense != 0 && ndense != st->dims)
        BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH, "%zu dense values, the index dimension is %zu",
            ndense, st->dims);
    if (ndense == 0 && nsparse == 0)
        BAD(TSR_REC_INVALID_EMBEDDING,
            "no embedding: a record needs %zu dense values or at least one dimension:value",
            st->dims);
    if (ndense > 0) {
        dp->dense = tsr_try_malloc(ndense, sizeof *dp->dense);
        if (dp->dense == NULL)
            return TSR_ENOMEM;
        memcpy(dp->dense, st->dense, ndense * sizeof *dp->dense);
        dp->ndense = ndense;
    }
    if (nsparse > 0) {
        dp->sparse_dims = tsr_try_malloc(nsparse, sizeof *dp->sparse_dims);
        dp->sparse_vals = tsr_try_malloc(nsparse, sizeof *dp->sparse_vals);
        if (dp->sparse_dims == NULL || dp->sparse_vals == NULL)
            return TSR_ENOMEM;
        memcpy(dp->sparse_dims, st->sdims, nsparse * sizeof *dp->sparse_dims);
        memcpy(dp->sparse_vals, st->svals, nsparse * sizeof *dp->sparse_vals);
        dp->nsparse = nsparse;
        tsr_datapoint_normalize_sparse(dp);
    }
    return LINE_OK;
}

/* One line (tsr__line_fn): classifies it and hands a record or an error to the sink. */
static int csv_line(void *ctx, const tsr__lines *r, const char *line, size_t len, int too_long,
                    tsr_error *err)
{
    csv_state *st = ctx;
    const tsr_record_sink *sink = st->sink;
    uint64_t ln = r->lineno;
    if (too_long)
        return tsr__lines_too_long(r, sink, TSR_REC_INVALID_CSV_SYNTAX);
    if (tsr__blank(line, len))
        return sink->invalid(sink->ctx, ln, TSR_REC_EMPTY_LINE, "empty line") != 0;
    if (memchr(line, '\0', len) != NULL)
        return sink->invalid(sink->ctx, ln, TSR_REC_INVALID_ENCODING,
                             "line contains a NUL byte") != 0;
    if (!tsr__utf8_valid(line, len)) {
        const char *c = memchr(line, ',', len);
        size_t idlen = c ? (size_t)(c - line) : len;
        return sink->invalid(sink->ctx, ln, TSR_REC_INVALID_ENCODING,
                             tsr__utf8_valid(line, idlen)
                                 ? "line is not valid UTF-8"
                                 : "the id (first field) is not valid UTF-8") != 0;
    }
    tsr_datapoint dp;
    tsr_datapoint_init(&dp);
    enum tsr_rec_error type = TSR_REC_PARSING_ERROR;
    int prc = parse_line(st, line, len, &dp, &type);
    return tsr__lines_result(r, sink, prc, &dp, type, st->msg, err);
}

/* path != NULL: the file; else data[0..len). */
static int csv_run(const char *path, const void *data, size_t len, size_t dims,
                   const tsr_record_sink *sink, tsr_error *err)
{
    csv_state st;
    memset(&st, 0, sizeof st);
    st.dims = dims;
    st.sink = sink;
    st.dense = tsr_try_malloc(dims ? dims : 1, sizeof *st.dense);
    int rc;
    if (st.dense == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory for a %zu-dimension record", dims);
        if (path != NULL)
            tsr_err_prefix(err, "%s", path);
    } else {
        rc = tsr__lines_run(path, data, len, csv_line, &st, err);
    }
    free(st.dense);
    free(st.sdims);
    free(st.svals);
    return rc;
}

int tsr_batch_csv_read(const char *path, size_t dims, const tsr_record_sink *sink,
                       tsr_error *err)
{
    return csv_run(path, NULL, 0, dims, sink, err);
}

int tsr_batch_csv_read_mem(const void *data, size_t len, size_t dims,
                           const tsr_record_sink *sink, tsr_error *err)
{
    return csv_run(NULL, data, len, dims, sink, err);
}
