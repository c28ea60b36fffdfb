/*
 * fuzz_batch_delete — libFuzzer harness for the delete-file reader (from memory).
 */
#include <stddef.h>
#include <stdint.h>

#include "batch/batch_delete.h"
#include "fuzz_batch_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_batch_delete_read_mem(data, size, &fuzz_sink, &err) != 0)
        abort();
    return 0;
}
