/*
 * batch_check — the semantic rules every record obeys, whatever it was read from (a batch
 * file's CSV, JSON or Avro line, or a streamed UpsertDatapoints datapoint): a non-empty
 * UTF-8 id, a dense embedding of the index dimension or a non-empty sparse one, finite
 * values, non-empty UTF-8 namespaces and tokens, one entry per namespace, a non-empty
 * UTF-8 crowding tag. The readers check their syntax and most of this while parsing (with
 * their own field names); the batch merger runs this check on every record they hand over,
 * so a record that reaches an index has passed exactly these rules, and the coordinator's
 * streamed writes use the same function.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch.h"
#include "batch_int.h"

static int bad(enum tsr_rec_error *type, char *msg, size_t cap, enum tsr_rec_error t,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int bad(enum tsr_rec_error *type, char *msg, size_t cap, enum tsr_rec_error t,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (cap)
        vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    *type = t;
    return 1;
}

static int utf8(const char *s) { return tsr__utf8_valid(s, strlen(s)); }

static int cmp_ns(const void *a, const void *b)
{
    return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

/* The index in ns[0..n) (each a pointer to a namespace string, stride bytes apart) of a
 * namespace that appears twice, with *first its earlier copy; SIZE_MAX when none. */
static size_t dup_ns(const void *base, size_t n, size_t stride, size_t *first)
{
    if (n < 2)
        return SIZE_MAX;
    const char *const **p = malloc(n * sizeof *p);
    size_t found = SIZE_MAX;
    if (!p) { /* quadratic fallback, no allocation */
        for (size_t i = 1; i < n && found == SIZE_MAX; i++)
            for (size_t j = 0; j < i; j++)
                if (strcmp(*(const char *const *)((const char *)base + i * stride),
                           *(const char *const *)((const char *)base + j * stride)) == 0) {
                    *first = j;
                    found = i;
                    break;
                }
        return found;
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (const char *const *)((const char *)base + i * stride);
    qsort(p, n, sizeof *p, cmp_ns);
    for (size_t i = 1; i < n; i++)
        if (strcmp(*p[i], *p[i - 1]) == 0) {
            size_t a = (size_t)((const char *)p[i] - (const char *)base) / stride;
            size_t b = (size_t)((const char *)p[i - 1] - (const char *)base) / stride;
            *first = a < b ? a : b;
            found = a < b ? b : a;
            break;
        }
    free(p);
    return found;
}

#define BAD(t, ...) return bad(type, msg, cap, t, __VA_ARGS__)

int tsr_batch_restricts_check(const tsr_datapoint *dp, enum tsr_rec_error *type, char *msg,
                              size_t cap)
{
    for (size_t i = 0; i < dp->nrestricts; i++) {
        const tsr_token_restrict *r = &dp->restricts[i];
        if (!r->ns || !r->ns[0])
            BAD(TSR_REC_NAMESPACE_MISSING, "restricts[%zu].namespace is empty", i);
        if (!utf8(r->ns))
            BAD(TSR_REC_INVALID_ENCODING, "restricts[%zu].namespace is not valid UTF-8", i);
        for (int deny = 0; deny < 2; deny++) {
            char *const *v = deny ? r->deny : r->allow;
            size_t n = deny ? r->ndeny : r->nallow;
            for (size_t j = 0; j < n; j++) {
                if (!v[j] || !v[j][0])
                    BAD(TSR_REC_INVALID_TOKEN_VALUE, "restricts[%zu].%s[%zu] is an empty "
                        "string", i, deny ? "deny" : "allow", j);
                if (!utf8(v[j]))
                    BAD(TSR_REC_INVALID_ENCODING, "restricts[%zu].%s[%zu] is not valid UTF-8",
                        i, deny ? "deny" : "allow", j);
            }
        }
    }
    size_t a = 0, b = dup_ns(dp->restricts, dp->nrestricts, sizeof *dp->restricts, &a);
    if (b != SIZE_MAX)
        BAD(TSR_REC_DUPLICATE_NAMESPACE, "restricts[%zu]: namespace already appears in "
            "restricts[%zu]; give each namespace once with all its tokens", b, a);
    for (size_t i = 0; i < dp->nnumeric; i++) {
        const tsr_numeric_restrict *r = &dp->numeric[i];
        if (!r->ns || !r->ns[0])
            BAD(TSR_REC_NAMESPACE_MISSING, "numeric_restricts[%zu].namespace is empty", i);
        if (!utf8(r->ns))
            BAD(TSR_REC_INVALID_ENCODING, "numeric_restricts[%zu].namespace is not valid UTF-8",
                i);
        if ((r->type == TSR_NUM_FLOAT && !isfinite(r->v.f)) ||
            (r->type == TSR_NUM_DOUBLE && !isfinite(r->v.d)))
            BAD(TSR_REC_INVALID_NUMERIC_VALUE, "numeric_restricts[%zu]: the value is not finite",
                i);
    }
    b = dup_ns(dp->numeric, dp->nnumeric, sizeof *dp->numeric, &a);
    if (b != SIZE_MAX)
        BAD(TSR_REC_DUPLICATE_NAMESPACE, "numeric_restricts[%zu]: namespace already appears in "
            "numeric_restricts[%zu]; a numeric namespace holds one value per record", b, a);
    return 0;
}

int tsr_batch_id_check(const char *id, enum tsr_rec_error *type, char *msg, size_t cap)
{
    if (!id || !id[0])
        BAD(TSR_REC_INVALID_EMBEDDING_ID, "id is empty");
    if (!utf8(id))
        BAD(TSR_REC_INVALID_ENCODING, "id is not valid UTF-8");
    return 0;
}

int tsr_batch_record_check(const tsr_datapoint *dp, size_t dims, enum tsr_rec_error *type,
                           char *msg, size_t cap)
{
    if (tsr_batch_id_check(dp->id, type, msg, cap))
        return 1;
    if (dp->ndense != 0 && dp->ndense != dims)
        BAD(TSR_REC_EMBEDDING_SIZE_MISMATCH, "embedding has %zu values, the index dimension is "
            "%zu", dp->ndense, dims);
    for (size_t i = 0; dp->dense && i < dp->ndense; i++)
        if (!isfinite(dp->dense[i]))
            BAD(TSR_REC_INVALID_EMBEDDING, "embedding[%zu] is %s; values must be finite", i,
                isnan(dp->dense[i]) ? "NaN" : "infinite");
    for (size_t i = 0; i < dp->nsparse; i++)
        if (!isfinite(dp->sparse_vals[i]))
            BAD(TSR_REC_INVALID_EMBEDDING, "sparse_embedding.values[%zu] is %s; values must be "
                "finite", i, isnan(dp->sparse_vals[i]) ? "NaN" : "infinite");
    if (dp->ndense == 0 && dp->nsparse == 0)
        BAD(TSR_REC_INVALID_EMBEDDING, "no embedding: a record needs %zu embedding values or a "
            "non-empty sparse_embedding", dims);
    if (tsr_batch_restricts_check(dp, type, msg, cap))
        return 1;
    if (dp->crowding_tag && !dp->crowding_tag[0])
        BAD(TSR_REC_INVALID_TOKEN_VALUE, "crowding_tag is empty");
    if (dp->crowding_tag && !utf8(dp->crowding_tag))
        BAD(TSR_REC_INVALID_ENCODING, "crowding_tag is not valid UTF-8");
    if (dp->nmetadata > TSR_METADATA_MAX)
        BAD(TSR_REC_PARSING_ERROR, "embedding_metadata is %zu bytes serialized, at most %zu",
            dp->nmetadata, TSR_METADATA_MAX);
    return 0;
}
#undef BAD
