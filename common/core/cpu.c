/*
 * cpu — the CPU's SIMD features under the TSR_SIMD_MAX cap (contract in cpu.h).
 */
#include "cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

enum { CAP_NONE = 2, CAP_AVX2 = 1, CAP_SCALAR = 0 };

static int cap_of_env(void)
{
    static atomic_int warned;
    const char *e = getenv("TSR_SIMD_MAX");
    if (e == NULL || *e == '\0' || strcmp(e, "avx512") == 0)
        return CAP_NONE;
    if (strcmp(e, "avx2") == 0)
        return CAP_AVX2;
    if (strcmp(e, "scalar") != 0 && atomic_exchange(&warned, 1) == 0)
        tsr_log(TSR_LOG_WARN, "TSR_SIMD_MAX=\"%s\": expected avx512, avx2 or scalar; "
                "running as scalar", e);
    return CAP_SCALAR;
}

int tsr_cpu_has(enum tsr_cpu_feature f)
{
#if defined(__x86_64__) || defined(__i386__)
    int cap = cap_of_env();
    switch (f) {
    case TSR_CPU_AVX2:
        return cap >= CAP_AVX2 && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma");
    case TSR_CPU_AVX512:
        return cap >= CAP_NONE && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    case TSR_CPU_AVX512_VBMI:
        return tsr_cpu_has(TSR_CPU_AVX512) && __builtin_cpu_supports("avx512vbmi");
    }
#else
    (void)f;
#endif
    return 0;
}
