/*
 * convert — a datapoint from and to its protobuf form (tsr__dp_from_proto,
 * tsr__dp_proto_free) and the validation and conversion of a Stage chunk's or a Write's
 * edits into records (tsr__convert_edits): the checks every upsert passes before any
 * version or delta sees it (label, list, dimension, finite values, sparse lengths,
 * numeric values), each error naming the upsert or delete and the field. Contracts in
 * shard.h. Split from slice.c, which keeps the versions and their files.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "shard.h"
#include "query/sparse.h"

static char *dupn(const char *s)
{
    return strdup(s ? s : "");
}

int tsr__dp_from_proto(const Tessera__V1__IndexDatapoint *p, size_t d, tsr_datapoint *dp,
                       tsr_error *err)
{
    tsr_datapoint_init(dp);
    if (p == NULL)
        return tsr_err(err, TSR_EINVAL, "datapoint missing");
    dp->id = dupn(p->datapoint_id);
    if (dp->id == NULL)
        goto nomem;
    if (p->n_feature_vector > 0) {
        if (d && p->n_feature_vector != d) {
            tsr_err(err, TSR_EINVAL, "datapoint '%s': feature_vector has %zu values, the index "
                    "dimension is %zu", dp->id, p->n_feature_vector, d);
            goto fail;
        }
        dp->dense = tsr_try_malloc(p->n_feature_vector, sizeof(float));
        if (dp->dense == NULL)
            goto nomem;
        memcpy(dp->dense, p->feature_vector, p->n_feature_vector * sizeof(float));
        dp->ndense = p->n_feature_vector;
    }
    if (p->sparse_embedding && (p->sparse_embedding->n_values || p->sparse_embedding->n_dimensions)) {
        const Tessera__V1__SparseEmbedding *s = p->sparse_embedding;
        if (s->n_values != s->n_dimensions) {
            tsr_err(err, TSR_EINVAL, "datapoint '%s': sparse_embedding has %zu values and %zu "
                    "dimensions", dp->id, s->n_values, s->n_dimensions);
            goto fail;
        }
        dp->sparse_dims = tsr_try_malloc(s->n_values, sizeof(int64_t));
        dp->sparse_vals = tsr_try_malloc(s->n_values, sizeof(float));
        if (!dp->sparse_dims || !dp->sparse_vals)
            goto nomem;
        memcpy(dp->sparse_dims, s->dimensions, s->n_values * sizeof(int64_t));
        memcpy(dp->sparse_vals, s->values, s->n_values * sizeof(float));
        dp->nsparse = s->n_values;
        tsr_datapoint_normalize_sparse(dp);
    }
    if (p->n_restricts) {
        dp->restricts = tsr_try_calloc(p->n_restricts, sizeof(tsr_token_restrict));
        if (dp->restricts == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_restricts; i++) {
            const Tessera__V1__Restriction *r = p->restricts[i];
            tsr_token_restrict *t = &dp->restricts[i];
            dp->nrestricts = i + 1;
            t->ns = dupn(r->namespace_);
            t->allow = tsr_try_calloc(r->n_allow_list + 1, sizeof(char *));
            t->deny = tsr_try_calloc(r->n_deny_list + 1, sizeof(char *));
            if (!t->ns || !t->allow || !t->deny)
                goto nomem;
            for (size_t j = 0; j < r->n_allow_list; j++, t->nallow++)
                if ((t->allow[j] = dupn(r->allow_list[j])) == NULL)
                    goto nomem;
            for (size_t j = 0; j < r->n_deny_list; j++, t->ndeny++)
                if ((t->deny[j] = dupn(r->deny_list[j])) == NULL)
                    goto nomem;
        }
    }
    if (p->n_numeric_restricts) {
        dp->numeric = tsr_try_calloc(p->n_numeric_restricts, sizeof(tsr_numeric_restrict));
        if (dp->numeric == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_numeric_restricts; i++) {
            const Tessera__V1__NumericRestriction *n = p->numeric_restricts[i];
            tsr_numeric_restrict *o = &dp->numeric[i];
            dp->nnumeric = i + 1;
            if ((o->ns = dupn(n->namespace_)) == NULL)
                goto nomem;
            switch (n->value_case) {
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT:
                o->type = TSR_NUM_INT, o->v.i = n->value_int;
                break;
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT:
                o->type = TSR_NUM_FLOAT, o->v.f = n->value_float;
                break;
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE:
                o->type = TSR_NUM_DOUBLE, o->v.d = n->value_double;
                break;
            default:
                tsr_err(err, TSR_EINVAL, "datapoint '%s': numeric_restricts[%zu] ('%s') has no "
                        "value", dp->id, i, o->ns);
                goto fail;
            }
        }
    }
    if (p->crowding_tag && p->crowding_tag->crowding_attribute &&
        p->crowding_tag->crowding_attribute[0]) {
        if ((dp->crowding_tag = dupn(p->crowding_tag->crowding_attribute)) == NULL)
            goto nomem;
    }
    if (p->embedding_metadata) { /* kept serialized; the limit is checked before packing */
        size_t n = protobuf_c_message_get_packed_size(&p->embedding_metadata->base);
        if (n > TSR_METADATA_MAX) {
            tsr_err(err, TSR_EINVAL, "datapoint '%s': embedding_metadata is %zu bytes "
                    "serialized, at most %zu", dp->id, n, TSR_METADATA_MAX);
            goto fail;
        }
        if (n && (dp->metadata = tsr_try_malloc(n, 1)) == NULL)
            goto nomem;
        dp->nmetadata = n ? protobuf_c_message_pack(&p->embedding_metadata->base,
                                                    dp->metadata) : 0;
    }
    return 0;
nomem:
    tsr_err(err, TSR_ENOMEM, "out of memory");
fail:
    tsr_datapoint_close(dp);
    return err ? err->code : TSR_EINVAL;
}

/* 1 when every value of the datapoint message is a finite number. *what names the first
 * field that is not. */
static int dp_finite(const Tessera__V1__IndexDatapoint *p, const char **what, size_t *at)
{
    for (size_t j = 0; j < p->n_feature_vector; j++)
        if (!isfinite(p->feature_vector[j]))
            return *what = "feature_vector", *at = j, 0;
    if (p->sparse_embedding)
        for (size_t j = 0; j < p->sparse_embedding->n_values; j++)
            if (!isfinite(p->sparse_embedding->values[j]))
                return *what = "sparse_embedding.values", *at = j, 0;
    return 1;
}

int tsr__convert_edits(const tsr__tmpl *t, const uint8_t *owned,
                       Tessera__V1__StagedUpsert *const *ups, size_t nups,
                       Tessera__V1__StagedDelete *const *dels, size_t ndels, tsr__rec **recs,
                       size_t *nrecs, tsr_error *err)
{
    size_t d = (size_t)t->ix->d, nlist = t->ix->nlist;
    for (size_t i = 0; i < nups; i++) {
        const Tessera__V1__StagedUpsert *u = ups[i];
        const char *what;
        size_t at;
        if (u->label < 0)
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].label %lld: must be >= 0", i,
                           (long long)u->label);
        if (u->list < -1 || (u->list >= 0 && (size_t)u->list >= nlist))
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].list %d: not in -1..%zu", i, u->list,
                           nlist - 1);
        if (owned && u->list >= 0 && !owned[u->list])
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].list %d: not a list this shard owns",
                           i, u->list);
        if (u->datapoint == NULL)
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].datapoint: missing", i);
        if (u->list >= 0 && u->datapoint->n_feature_vector != d)
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].datapoint.feature_vector: %zu values, "
                           "the index dimension is %zu", i, u->datapoint->n_feature_vector, d);
        if (u->list == -1 && u->datapoint->n_feature_vector != 0)
            return tsr_err(err, TSR_EINVAL, "upserts[%zu]: list -1 (sparse-only) with a dense "
                           "feature_vector", i);
        if (!dp_finite(u->datapoint, &what, &at))
            return tsr_err(err, TSR_EINVAL, "upserts[%zu].datapoint.%s[%zu]: not a finite "
                           "number", i, what, at);
        tsr__rec *r = calloc(1, sizeof *r);
        if (r == NULL)
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        atomic_init(&r->refs, 1);
        r->label = u->label;
        r->list = u->list;
        r->tag = TSR_FILTER_NOID;
        recs[(*nrecs)++] = r;
        int rc = tsr__dp_from_proto(u->datapoint, d, &r->dp, err);
        if (rc != 0) {
            tsr_err_prefix(err, "upserts[%zu]", i);
            return rc;
        }
    }
    for (size_t i = 0; i < ndels; i++)
        if (dels[i]->label < 0)
            return tsr_err(err, TSR_EINVAL, "deletes[%zu].label %lld: must be >= 0", i,
                           (long long)dels[i]->label);
    return 0;
}

/* The message borrows every string and array of dp; only the message structs and the
 * unpacked embedding_metadata are ours. */
Tessera__V1__IndexDatapoint *tsr__dp_to_proto(const tsr_datapoint *dp)
{
    Tessera__V1__IndexDatapoint *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    tessera__v1__index_datapoint__init(p);
    p->datapoint_id = dp->id;
    p->feature_vector = dp->dense;
    p->n_feature_vector = dp->ndense;
    if (dp->nsparse) {
        p->sparse_embedding = calloc(1, sizeof *p->sparse_embedding);
        if (p->sparse_embedding == NULL)
            goto fail;
        tessera__v1__sparse_embedding__init(p->sparse_embedding);
        p->sparse_embedding->values = dp->sparse_vals;
        p->sparse_embedding->n_values = dp->nsparse;
        p->sparse_embedding->dimensions = dp->sparse_dims;
        p->sparse_embedding->n_dimensions = dp->nsparse;
    }
    if (dp->crowding_tag) {
        p->crowding_tag = calloc(1, sizeof *p->crowding_tag);
        if (p->crowding_tag == NULL)
            goto fail;
        tessera__v1__crowding_tag__init(p->crowding_tag);
        p->crowding_tag->crowding_attribute = dp->crowding_tag;
    }
    if (dp->nmetadata && (p->embedding_metadata = google__protobuf__struct__unpack(
                              NULL, dp->nmetadata, dp->metadata)) == NULL)
        goto fail; /* out of memory: the bytes were packed by tsr__dp_from_proto */
    if (dp->nrestricts) {
        p->restricts = calloc(dp->nrestricts, sizeof *p->restricts);
        if (p->restricts == NULL)
            goto fail;
        for (size_t i = 0; i < dp->nrestricts; i++) {
            Tessera__V1__Restriction *r = calloc(1, sizeof *r);
            if (r == NULL)
                goto fail;
            tessera__v1__restriction__init(r);
            p->restricts[p->n_restricts++] = r;
            r->namespace_ = dp->restricts[i].ns;
            r->allow_list = dp->restricts[i].allow;
            r->n_allow_list = dp->restricts[i].nallow;
            r->deny_list = dp->restricts[i].deny;
            r->n_deny_list = dp->restricts[i].ndeny;
        }
    }
    if (dp->nnumeric) {
        p->numeric_restricts = calloc(dp->nnumeric, sizeof *p->numeric_restricts);
        if (p->numeric_restricts == NULL)
            goto fail;
        for (size_t i = 0; i < dp->nnumeric; i++) {
            Tessera__V1__NumericRestriction *n = calloc(1, sizeof *n);
            if (n == NULL)
                goto fail;
            tessera__v1__numeric_restriction__init(n);
            p->numeric_restricts[p->n_numeric_restricts++] = n;
            n->namespace_ = dp->numeric[i].ns;
            switch (dp->numeric[i].type) {
            case TSR_NUM_INT:
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT;
                n->value_int = dp->numeric[i].v.i;
                break;
            case TSR_NUM_FLOAT:
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT;
                n->value_float = dp->numeric[i].v.f;
                break;
            default:
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE;
                n->value_double = dp->numeric[i].v.d;
                break;
            }
        }
    }
    return p;
fail:
    tsr__dp_proto_free(p);
    return NULL;
}

void tsr__dp_proto_free(Tessera__V1__IndexDatapoint *p)
{
    if (p == NULL)
        return;
    free(p->sparse_embedding);
    free(p->crowding_tag);
    if (p->embedding_metadata)
        google__protobuf__struct__free_unpacked(p->embedding_metadata, NULL);
    for (size_t i = 0; i < p->n_restricts; i++)
        free(p->restricts[i]);
    free(p->restricts);
    for (size_t i = 0; i < p->n_numeric_restricts; i++)
        free(p->numeric_restricts[i]);
    free(p->numeric_restricts);
    free(p);
}

