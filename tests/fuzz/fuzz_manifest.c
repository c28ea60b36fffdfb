/*
 * fuzz_manifest — libFuzzer harness for the store's MANIFEST parser (a MANIFEST on disk
 * may be damaged arbitrarily). A manifest that parses must also round-trip its checksum:
 * flipping any byte before the checksum line must make it fail.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/store_int.h" /* white-box: the internals under test */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_error err = TSR_ERROR_INIT;
    size_t n = 0;
    const char *text = (const char *)data;
    if (tsr__store_check_manifest(text, size, 42, &n, &err) != 0)
        return 0;
    /* accepted: a one-byte change in the body must be detected */
    const char *last = text + size - 1;
    while (last > text && last[-1] != '\n')
        last--;
    if (last == text)
        abort();
    char *copy = malloc(size);
    memcpy(copy, data, size);
    size_t at = (size_t)(data[0]) % (size_t)(last - text);
    copy[at] ^= 0x20;
    if (tsr__store_check_manifest(copy, size, 42, &n, &err) == 0)
        abort(); /* CRC-32 detects every single-byte change */
    free(copy);
    return 0;
}
