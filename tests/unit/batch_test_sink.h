/*
 * batch_test_sink — a collecting tsr_record_sink for the batch reader unit tests.
 */
#ifndef BATCH_TEST_SINK_H
#define BATCH_TEST_SINK_H

#include <stdlib.h>
#include <string.h>

#include "core/datapoint.h"

typedef struct coll {
    tsr_datapoint recs[64];
    uint64_t rec_where[64];
    size_t nrecs;
    enum tsr_rec_error types[64];
    uint64_t bad_where[64];
    char msgs[64][512];
    size_t nbad;
    char dels[64][64];
    size_t ndels;
} coll;

static int c_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    coll *c = ctx;
    if (c->nrecs < 64) {
        c->rec_where[c->nrecs] = where;
        c->recs[c->nrecs++] = *dp;
        tsr_datapoint_init(dp);
    }
    return 0;
}

static int c_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    coll *c = ctx;
    if (c->nbad < 64) {
        c->types[c->nbad] = type;
        c->bad_where[c->nbad] = where;
        strncpy(c->msgs[c->nbad], msg, 511);
        c->nbad++;
    }
    return 0;
}

static int c_delete(void *ctx, uint64_t where, const char *id, size_t len)
{
    coll *c = ctx;
    (void)where;
    if (c->ndels < 64 && len < 64) {
        memcpy(c->dels[c->ndels], id, len);
        c->dels[c->ndels][len] = '\0';
        c->ndels++;
    }
    return 0;
}

static coll *coll_new(void)
{
    return calloc(1, sizeof(coll));
}

static void coll_free(coll *c)
{
    for (size_t i = 0; i < c->nrecs; i++)
        tsr_datapoint_close(&c->recs[i]);
    free(c);
}

#define SINK(c) ((tsr_record_sink){(c), c_record, c_invalid, c_delete})

#endif
