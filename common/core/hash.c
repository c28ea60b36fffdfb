/*
 * hash — FNV-1a 64 (the bases and why each stays as it is: hash.h).
 */
#include "core/hash.h"

uint64_t tsr_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= TSR_FNV1A64_PRIME;
    }
    return h;
}

uint64_t tsr_fnv1a64_str(uint64_t h, const char *s)
{
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        h ^= *q;
        h *= TSR_FNV1A64_PRIME;
    }
    return h;
}
