/*
 * convert — the validation and conversion of a Stage chunk's or a Write's edits into
 * records (tsr__convert_edits): the checks every upsert passes before any version or delta
 * sees it (label, list, dimension, finite values, sparse lengths, numeric values), each
 * error naming the upsert or delete and the field; a datapoint from its protobuf form with
 * those errors as a tsr_error (tsr__dp_from_proto, over common/net/pb_datapoint, the one
 * conversion). Contracts in shard.h. Split from slice.c, which keeps the versions and their
 * files.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "net/pb_datapoint.h"
#include "shard.h"
#include "query/sparse.h"

int tsr__dp_from_proto(const Tessera__V1__IndexDatapoint *p, size_t d, tsr_datapoint *dp,
                       tsr_error *err)
{
    tsr_datapoint_init(dp);
    if (p == NULL)
        return tsr_err(err, TSR_EINVAL, "datapoint missing");
    if (d && p->n_feature_vector > 0 && p->n_feature_vector != d)
        return tsr_err(err, TSR_EINVAL, "datapoint '%s': feature_vector has %zu values, the "
                       "index dimension is %zu", p->datapoint_id ? p->datapoint_id : "",
                       p->n_feature_vector, d);
    enum tsr_rec_error type;
    char msg[512];
    if (tsr_pb_datapoint_record(p, dp, &type, msg, sizeof msg) == 0)
        return 0;
    int rc = tsr_err(err, TSR_EINVAL, "datapoint '%s': %s", dp->id ? dp->id : "", msg);
    tsr_datapoint_close(dp);
    return rc;
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
