/*
 * fuzz_batch_common — shared checking sink for the batch reader fuzz harnesses: every
 * record a reader accepts must satisfy the datapoint invariants (id non-empty UTF-8,
 * dense length = dims or 0, sparse sorted and unique, finite floats, restricts named).
 */
#ifndef FUZZ_BATCH_COMMON_H
#define FUZZ_BATCH_COMMON_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_int.h"
#include "core/datapoint.h"

static size_t fuzz_dims;

static int fz_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    (void)ctx;
    (void)where;
    if (dp->id == NULL || dp->id[0] == '\0' || !tsr__utf8_valid(dp->id, strlen(dp->id)))
        abort();
    if (dp->ndense != 0 && dp->ndense != fuzz_dims)
        abort();
    if (dp->ndense == 0 && dp->nsparse == 0)
        abort();
    for (size_t i = 0; i < dp->ndense; i++)
        if (!isfinite(dp->dense[i]))
            abort();
    for (size_t i = 0; i < dp->nsparse; i++) {
        if (i > 0 && dp->sparse_dims[i] <= dp->sparse_dims[i - 1])
            abort();
        if (isnan(dp->sparse_vals[i]))
            abort();
    }
    for (size_t i = 0; i < dp->nrestricts; i++)
        if (dp->restricts[i].ns == NULL || dp->restricts[i].ns[0] == '\0')
            abort();
    for (size_t i = 0; i < dp->nnumeric; i++) {
        if (dp->numeric[i].ns == NULL || dp->numeric[i].ns[0] == '\0')
            abort();
        for (size_t k = 0; k < i; k++)
            if (strcmp(dp->numeric[i].ns, dp->numeric[k].ns) == 0)
                abort();
    }
    return 0;
}

static int fz_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    (void)ctx;
    if (where == 0 || (unsigned)type >= TSR_REC__COUNT || msg == NULL ||
        !tsr__utf8_valid(msg, strlen(msg)))
        abort();
    return 0;
}

static int fz_delete(void *ctx, uint64_t where, const char *id, size_t len)
{
    (void)ctx;
    (void)where;
    if (len == 0 || !tsr__utf8_valid(id, len) || memchr(id, '\0', len) != NULL)
        abort();
    return 0;
}

static const tsr_record_sink fuzz_sink = {NULL, fz_record, fz_invalid, fz_delete};

#endif
