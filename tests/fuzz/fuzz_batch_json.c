/*
 * fuzz_batch_json — libFuzzer harness for the JSON batch reader (from-memory entry point).
 * The first byte picks the index dimension (1..8), the rest is the file.
 */
#include <stddef.h>
#include <stdint.h>

#include "batch/batch_json.h"
#include "fuzz_batch_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fuzz_dims = 1 + data[0] % 8;
    tsr_error err = TSR_ERROR_INIT;
    if (tsr_batch_json_read_mem(data + 1, size - 1, fuzz_dims, &fuzz_sink, &err) != 0)
        abort(); /* memory input: only out of memory could fail */
    return 0;
}
