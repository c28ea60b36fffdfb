/*
 * ivfpq_dispatch — the run-time choice of the search's kernels: the plain 8-bit scan kernel
 * (scalar, AVX2, AVX-512; the automatic choice measured once per process), the quantized
 * prefilter's kernel and its group stage, the AVX-512 table, and the A/B knobs of test
 * builds that force them (TSR_SIMD, TSR_SEARCH_FILTER, TSR_SEARCH_NIBBLE; core/testing.h). All choices
 * give the same bits: they change speed only. Used by the scanner (ivfpq_scanner.c) and
 * the search cache (ivfpq_cache.c: the prefilter's blocks are built where a kernel will
 * read them).
 *
 * Thread-safety: the calibration runs once (pthread_once); everything else is pure.
 */
#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "core/mem.h"
#include "core/testing.h"

int tsr_ivfpq_search_simd_supported(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_AUTO:
    case TSR_SIMD_SCALAR:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case TSR_SIMD_AVX2:
        return tsr_cpu_has(TSR_CPU_AVX2);
    case TSR_SIMD_AVX512:
        return tsr_cpu_has(TSR_CPU_AVX512);
#endif
    default:
        return 0;
    }
}

const char *tsr_ivfpq_search_simd_name(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_SCALAR: return "scalar";
    case TSR_SIMD_AVX2: return "avx2";
    case TSR_SIMD_AVX512: return "avx512";
    default: return "auto";
    }
}

/* Gathers are not always faster than scalar loads (on the virtualized AMD EPYC of the
 * benchmarks, AVX2 gathers are ~20x and AVX-512 gathers ~3x slower than the scalar
 * kernel), so the automatic choice is measured once per process: each supported kernel
 * scans the same 512 random codes (M = 64) a few times and the fastest wins. All kernels
 * return bit-identical distances, so the choice changes speed only. */
static enum tsr_simd calibrated = TSR_SIMD_AUTO;
static pthread_once_t calibrate_once = PTHREAD_ONCE_INIT;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void calibrate(void)
{
    enum { CM = 64, CN = 512 };
    float *T = tsr_try_aligned(CM * 256, sizeof(float));
    uint8_t *codes = malloc((size_t)CM * CN);
    float *out = malloc(CN * sizeof(float));
    calibrated = TSR_SIMD_SCALAR;
    if (T == NULL || codes == NULL || out == NULL)
        goto done;
    uint32_t s = 12345;
    for (size_t i = 0; i < CM * 256; i++)
        T[i] = (float)(i % 97) * 0.01f;
    for (size_t i = 0; i < (size_t)CM * CN; i++) {
        s = s * 1103515245u + 12345u;
        codes[i] = (uint8_t)(s >> 23);
    }
    /* Rounds alternate the kernels (a burst of load on the shared machine then hits all
     * of them, not just the one being timed); best of 9 rounds each. */
    const enum tsr_simd cands[] = {TSR_SIMD_SCALAR, TSR_SIMD_AVX2, TSR_SIMD_AVX512};
    enum { NC = sizeof cands / sizeof cands[0] };
    double t[NC];
    for (size_t c = 0; c < NC; c++)
        t[c] = -1;
    for (int r = 0; r < 9; r++) {
        for (size_t c = 0; c < NC; c++) {
            if (!tsr_ivfpq_search_simd_supported(cands[c]))
                continue;
            double t0 = now_ns();
            tsr__scan8_for(cands[c])(T, CM, codes, CN, NULL, 0.0f, out);
            double dt = now_ns() - t0;
            if (t[c] < 0 || dt < t[c])
                t[c] = dt;
        }
    }
    double best = 0;
    int have = 0;
    for (size_t c = 0; c < NC; c++) {
        if (t[c] < 0)
            continue;
        if (!have || t[c] < best * 0.9) { /* a wider path must win clearly */
            have = 1;
            best = t[c];
            calibrated = cands[c];
        }
    }
done:
    free(T);
    free(codes);
    free(out);
}

enum tsr_simd tsr_ivfpq_search_simd_auto(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SIMD);
    if (e != NULL && *e) {
        enum tsr_simd want = strcmp(e, "scalar") == 0   ? TSR_SIMD_SCALAR
                             : strcmp(e, "avx2") == 0   ? TSR_SIMD_AVX2
                             : strcmp(e, "avx512") == 0 ? TSR_SIMD_AVX512
                                                        : TSR_SIMD_AUTO;
        /* Forcing a path the CPU lacks falls back to the automatic choice rather than
         * crashing on an illegal instruction. */
        if (want != TSR_SIMD_AUTO && tsr_ivfpq_search_simd_supported(want))
            return want;
    }
    pthread_once(&calibrate_once, calibrate);
    /* A cap (TSR_SIMD_MAX) set after the calibration: the scalar kernel, the reference */
    return tsr_ivfpq_search_simd_supported(calibrated) ? calibrated : TSR_SIMD_SCALAR;
}

tsr__scan8_fn tsr__scan8_for(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_AVX2: return tsr__scan8_avx2;
    case TSR_SIMD_AVX512: return tsr__scan8_avx512;
    default: return tsr__scan8_scalar;
    }
}

/* TSR_SEARCH_FILTER: "0" = no prefilter (0), "scalar" = the scalar filter kernel (1,
 * tests), otherwise the AVX-512 VBMI kernel where the CPU has it (2), else the AVX2 kernel
 * (3), else none (0). */
int tsr__filter_env(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SEARCH_FILTER);
    if (e && strcmp(e, "0") == 0)
        return 0;
    if (e && strcmp(e, "scalar") == 0)
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    if (tsr__filter8_avx512_supported())
        return 2;
    if (tsr__filter8_avx2_supported())
        return 3;
#endif
    return 0;
}


/* The path the caller or TSR_SIMD forced: TSR_SIMD_AUTO when none (or an unknown name). */
static enum tsr_simd simd_forced(enum tsr_simd asked)
{
    if (asked == TSR_SIMD_AUTO) {
        const char *e = tsr_test_knob(TSR_KNOB_SIMD);
        if (e && strcmp(e, "scalar") == 0)
            return TSR_SIMD_SCALAR;
        if (e && strcmp(e, "avx2") == 0)
            return TSR_SIMD_AVX2;
        if (e && strcmp(e, "avx512") == 0)
            return TSR_SIMD_AVX512;
    }
    return asked;
}

/* 1 when the caller or TSR_SIMD asked for the scalar or the AVX2 path. */
static int plain_forced(enum tsr_simd asked)
{
    enum tsr_simd f = simd_forced(asked);
    return f == TSR_SIMD_SCALAR || f == TSR_SIMD_AVX2;
}

/* The AVX-512 table unless the caller or TSR_SIMD forced the scalar or AVX2 path (which
 * the tests compare with it: that is what keeps the generic table tested). */
int tsr__wide_table_ok(enum tsr_simd asked)
{
    return !plain_forced(asked) && tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX512);
}

/* The prefilter kernel, NULL = none. TSR_SEARCH_FILTER=scalar forces the scalar one and
 * =0 none; otherwise a forced scalar path stays the plain scalar scan, a forced AVX2 path
 * (or a CPU without VBMI) takes the AVX2 kernel, and the automatic choice or forced
 * AVX-512 the VBMI kernel where the CPU has it. */
tsr__filter8_fn tsr__filter8_choose(enum tsr_simd asked)
{
    int fe = tsr__filter_env();
    enum tsr_simd f = simd_forced(asked);
    if (fe == 1)
        return tsr__filter8_scalar;
    if (fe == 0 || f == TSR_SIMD_SCALAR)
        return NULL;
    if (fe == 2 && f != TSR_SIMD_AVX2)
        return tsr__filter8_avx512;
    return tsr__filter8_avx2; /* fe is 2 or 3: the CPU has AVX2 */
}

tsr__filter8_fn tsr__filter4_choose(tsr__filter8_fn f8)
{
    const char *e = tsr_test_knob(TSR_KNOB_SEARCH_NIBBLE);
    if (f8 == NULL || (e && strcmp(e, "0") == 0))
        return NULL;
    if (e && strcmp(e, "scalar") == 0)
        return tsr__filter4_scalar;
    if (e && strcmp(e, "scalar6") == 0)
        return tsr__filter6_scalar;
    return f8 == tsr__filter8_avx2     ? tsr__filter4_avx2
           : f8 == tsr__filter8_avx512 ? tsr__filter6_avx512
                                       : NULL;
}

/* tsr__quantize_table, then the kernel's own layout of the table (the AVX2 kernel reads
 * slice differences, see ivfpq_search_avx2.c). Returns what tsr__quantize_table returns. */
int tsr__quantize_for(tsr__filter8_fn fn, int wide, const float *T, size_t M, uint8_t *Tq,
                      float *qmin, float *delta, float *tabs)
{
    if (!(wide ? tsr__quantize_table_avx512(T, M, Tq, qmin, delta, tabs)
               : tsr__quantize_table(T, M, Tq, qmin, delta, tabs)))
        return 0;
    if (fn == tsr__filter8_avx2)
        tsr__filter8_prep_avx2(Tq, M);
    return 1;
}
