/*
 * pb_datapoint — record <-> tessera.v1.IndexDatapoint (see pb_datapoint.h).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/mem.h"
#include "net/pb_datapoint.h"

/* Fills p to describe d (borrowing d's arrays; the metadata is unpacked). */
void tsr_pb_datapoint_set(tsr_pb_datapoint *p, const tsr_datapoint *d)
{
    memset(p, 0, sizeof *p);
    tessera__v1__index_datapoint__init(&p->dp);
    p->dp.datapoint_id = d->id;
    if (d->dense) {
        p->dp.feature_vector = d->dense;
        p->dp.n_feature_vector = d->ndense;
    }
    if (d->nrestricts) {
        p->rs = tsr_xcalloc(d->nrestricts, sizeof *p->rs);
        p->rsp = tsr_xcalloc(d->nrestricts, sizeof *p->rsp);
        for (size_t i = 0; i < d->nrestricts; i++) {
            tessera__v1__restriction__init(&p->rs[i]);
            p->rs[i].namespace_ = d->restricts[i].ns;
            p->rs[i].allow_list = d->restricts[i].allow;
            p->rs[i].n_allow_list = d->restricts[i].nallow;
            p->rs[i].deny_list = d->restricts[i].deny;
            p->rs[i].n_deny_list = d->restricts[i].ndeny;
            p->rsp[i] = &p->rs[i];
        }
        p->dp.restricts = p->rsp;
        p->dp.n_restricts = d->nrestricts;
    }
    if (d->nnumeric) {
        p->ns = tsr_xcalloc(d->nnumeric, sizeof *p->ns);
        p->nsp = tsr_xcalloc(d->nnumeric, sizeof *p->nsp);
        for (size_t i = 0; i < d->nnumeric; i++) {
            Tessera__V1__NumericRestriction *n = &p->ns[i];
            tessera__v1__numeric_restriction__init(n);
            n->namespace_ = d->numeric[i].ns;
            if (d->numeric[i].type == TSR_NUM_INT) {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT;
                n->value_int = d->numeric[i].v.i;
            } else if (d->numeric[i].type == TSR_NUM_FLOAT) {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT;
                n->value_float = d->numeric[i].v.f;
            } else {
                n->value_case = TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE;
                n->value_double = d->numeric[i].v.d;
            }
            p->nsp[i] = n;
        }
        p->dp.numeric_restricts = p->nsp;
        p->dp.n_numeric_restricts = d->nnumeric;
    }
    if (d->crowding_tag) {
        tessera__v1__crowding_tag__init(&p->tag);
        p->tag.crowding_attribute = d->crowding_tag;
        p->dp.crowding_tag = &p->tag;
    }
    if (d->nsparse) {
        tessera__v1__sparse_embedding__init(&p->sp);
        p->sp.values = d->sparse_vals;
        p->sp.n_values = d->nsparse;
        p->sp.dimensions = d->sparse_dims;
        p->sp.n_dimensions = d->nsparse;
        p->dp.sparse_embedding = &p->sp;
    }
    if (d->nmetadata) {
        p->dp.embedding_metadata = google__protobuf__struct__unpack(NULL, d->nmetadata,
                                                                    d->metadata);
        if (p->dp.embedding_metadata == NULL) { /* our own bytes: out of memory or a bug */
            tsr_error_log("datapoint '%s': cannot unpack its embedding_metadata (%zu bytes)",
                          d->id, d->nmetadata);
            abort();
        }
    }
}

void tsr_pb_datapoint_free(tsr_pb_datapoint *p)
{
    if (p->dp.embedding_metadata)
        google__protobuf__struct__free_unpacked(p->dp.embedding_metadata, NULL);
    free(p->rs);
    free(p->rsp);
    free(p->ns);
    free(p->nsp);
}

Tessera__V1__IndexDatapoint *tsr_pb_datapoint_new(const tsr_datapoint *d)
{
    tsr_pb_datapoint *p = tsr_xmalloc(sizeof *p);
    tsr_pb_datapoint_set(p, d);
    _Static_assert(offsetof(tsr_pb_datapoint, dp) == 0, "dp first: delete gets p back");
    return &p->dp;
}

void tsr_pb_datapoint_delete(Tessera__V1__IndexDatapoint *m)
{
    if (m == NULL)
        return;
    tsr_pb_datapoint *p = (tsr_pb_datapoint *)(void *)m;
    tsr_pb_datapoint_free(p);
    free(p);
}


static char *dup_or_empty(const char *s) { return tsr_xstrdup(s ? s : ""); }

int tsr_pb_datapoint_record(const Tessera__V1__IndexDatapoint *p, tsr_datapoint *dp,
                   enum tsr_rec_error *type, char *msg, size_t cap)
{
    tsr_datapoint_init(dp);
    dp->id = dup_or_empty(p->datapoint_id);
    if (p->n_feature_vector) {
        dp->dense = tsr_xmalloc(p->n_feature_vector * sizeof(float));
        memcpy(dp->dense, p->feature_vector, p->n_feature_vector * sizeof(float));
        dp->ndense = p->n_feature_vector;
    }
    const Tessera__V1__SparseEmbedding *sp = p->sparse_embedding;
    if (sp && sp->n_values != sp->n_dimensions) {
        *type = TSR_REC_INVALID_SPARSE_EMBEDDING;
        snprintf(msg, cap, "sparse_embedding has %zu values but %zu dimensions; they must be "
                 "equal", sp->n_values, sp->n_dimensions);
        return 1;
    }
    if (sp && sp->n_values) {
        dp->nsparse = sp->n_values;
        dp->sparse_vals = tsr_xmalloc(dp->nsparse * sizeof(float));
        dp->sparse_dims = tsr_xmalloc(dp->nsparse * sizeof(int64_t));
        memcpy(dp->sparse_vals, sp->values, dp->nsparse * sizeof(float));
        memcpy(dp->sparse_dims, sp->dimensions, dp->nsparse * sizeof(int64_t));
        tsr_datapoint_normalize_sparse(dp);
    }
    if (p->n_restricts) {
        dp->restricts = tsr_xcalloc(p->n_restricts, sizeof *dp->restricts);
        dp->nrestricts = p->n_restricts;
        for (size_t i = 0; i < p->n_restricts; i++) {
            const Tessera__V1__Restriction *r = p->restricts[i];
            tsr_token_restrict *t = &dp->restricts[i];
            t->ns = dup_or_empty(r->namespace_);
            t->allow = tsr_xcalloc(r->n_allow_list + 1, sizeof *t->allow);
            t->deny = tsr_xcalloc(r->n_deny_list + 1, sizeof *t->deny);
            for (size_t j = 0; j < r->n_allow_list; j++)
                t->allow[t->nallow++] = dup_or_empty(r->allow_list[j]);
            for (size_t j = 0; j < r->n_deny_list; j++)
                t->deny[t->ndeny++] = dup_or_empty(r->deny_list[j]);
        }
    }
    if (p->n_numeric_restricts) {
        dp->numeric = tsr_xcalloc(p->n_numeric_restricts, sizeof *dp->numeric);
        for (size_t i = 0; i < p->n_numeric_restricts; i++) {
            const Tessera__V1__NumericRestriction *r = p->numeric_restricts[i];
            tsr_numeric_restrict *nr = &dp->numeric[dp->nnumeric++];
            nr->ns = dup_or_empty(r->namespace_);
            if (r->op != TESSERA__V1__NUMERIC_RESTRICTION__OPERATOR__OPERATOR_UNSPECIFIED) {
                *type = TSR_REC_OP_IN_DATAPOINT;
                snprintf(msg, cap, "numeric_restricts[%zu] has an op; operators belong to "
                         "queries, not to datapoints", i);
                return 1;
            }
            switch (r->value_case) {
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_INT:
                nr->type = TSR_NUM_INT;
                nr->v.i = r->value_int;
                break;
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_FLOAT:
                nr->type = TSR_NUM_FLOAT;
                nr->v.f = r->value_float;
                break;
            case TESSERA__V1__NUMERIC_RESTRICTION__VALUE_VALUE_DOUBLE:
                nr->type = TSR_NUM_DOUBLE;
                nr->v.d = r->value_double;
                break;
            default:
                *type = TSR_REC_INVALID_NUMERIC_VALUE;
                snprintf(msg, cap, "numeric_restricts[%zu] needs one of value_int, value_float, "
                         "value_double", i);
                return 1;
            }
        }
    }
    if (p->crowding_tag && p->crowding_tag->crowding_attribute &&
        p->crowding_tag->crowding_attribute[0])
        dp->crowding_tag = tsr_xstrdup(p->crowding_tag->crowding_attribute);
    if (p->embedding_metadata) { /* kept serialized, measured before anything is allocated */
        size_t n = protobuf_c_message_get_packed_size(&p->embedding_metadata->base);
        if (n > TSR_METADATA_MAX) {
            *type = TSR_REC_PARSING_ERROR;
            snprintf(msg, cap, "embedding_metadata is %zu bytes serialized, at most %zu", n,
                     TSR_METADATA_MAX);
            return 1;
        }
        if (n) {
            dp->metadata = tsr_xmalloc(n);
            dp->nmetadata = protobuf_c_message_pack(&p->embedding_metadata->base, dp->metadata);
        }
    }
    return 0;
}

