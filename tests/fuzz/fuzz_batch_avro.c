/*
 * fuzz_batch_avro — libFuzzer harness for the Avro batch reader: any bytes as an Avro
 * container file (header, writer schema, blocks, codecs, records), read from memory
 * with index dimension 3. The reader must never crash, hang or allocate more than the
 * input justifies; every datapoint handed to the sink is checked and freed.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_avro.h"
#include "core/datapoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int on_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    (void)ctx;
    (void)where;
    /* touch everything the reader produced */
    volatile size_t sum = strlen(dp->id);
    for (size_t i = 0; i < dp->ndense; i++)
        sum += dp->dense[i] != 0;
    for (size_t i = 0; i < dp->nsparse; i++)
        sum += (size_t)dp->sparse_dims[i] + (dp->sparse_vals[i] != 0);
    for (size_t i = 0; i < dp->nrestricts; i++) {
        sum += strlen(dp->restricts[i].ns);
        for (size_t k = 0; k < dp->restricts[i].nallow; k++)
            sum += strlen(dp->restricts[i].allow[k]);
        for (size_t k = 0; k < dp->restricts[i].ndeny; k++)
            sum += strlen(dp->restricts[i].deny[k]);
    }
    for (size_t i = 0; i < dp->nnumeric; i++)
        sum += strlen(dp->numeric[i].ns);
    if (dp->crowding_tag)
        sum += strlen(dp->crowding_tag);
    (void)sum;
    if (dp->ndense != 0 && dp->ndense != 3)
        abort(); /* the reader must have rejected it */
    tsr_datapoint_close(dp);
    return 0;
}

static int on_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    (void)ctx;
    (void)where;
    if ((unsigned)type >= TSR_REC__COUNT || msg == NULL || strlen(msg) == 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_record_sink sink = {NULL, on_record, on_invalid, NULL};
    tsr_error err = TSR_ERROR_INIT;
    tsr_batch_avro_read_mem(data, size, "fuzz.avro", 3, &sink, &err);
    return 0;
}
