/*
 * cpu — which SIMD instruction sets this process may use: what the CPU has, capped by the
 * environment variable TSR_SIMD_MAX.
 *
 * Every kernel dispatch of the engine (the PQ scan and its calibration, the quantized
 * prefilter, the search table and its quantizer, the coarse step's k = 1 and k-heap scans,
 * PQ encoding, k-means) asks here rather than the CPU, so one variable makes a process
 * behave as on an older CPU: TSR_SIMD_MAX=avx2 is a CPU with AVX2 and FMA but no AVX-512
 * (Intel before Skylake-SP, AMD before Zen 4: most x86 servers in service),
 * TSR_SIMD_MAX=scalar one with neither; unset, empty or "avx512" = no cap. A capped process
 * still makes its own automatic choices, among what is left (that is the difference from
 * TSR_SIMD=avx2, which forces the AVX2 kernels so that tests can compare them). Benchmarks
 * use the cap to measure what such CPUs get (docs/performance.md); OpenBLAS dispatches on
 * its own (OPENBLAS_CORETYPE=Haswell caps it alike). Results never depend on it: every
 * kernel returns the same bits as the scalar one.
 *
 * Thread-safety: no state; the environment is read on each call (callers ask once per
 * search call or less), so a test can change the cap between calls.
 */
#ifndef TSR_CPU_H
#define TSR_CPU_H

enum tsr_cpu_feature {
    TSR_CPU_AVX2,        /* AVX2 and FMA */
    TSR_CPU_AVX512,      /* AVX-512 F, BW, VL and DQ */
    TSR_CPU_AVX512_VBMI, /* the above and VBMI (vpermb / vpermi2b: the 8-bit prefilter) */
};

/* 1 when the CPU has feature f and TSR_SIMD_MAX allows it, else 0. An unknown
 * TSR_SIMD_MAX value is a cap of "scalar" (the safe reading of a typo), logged once as a
 * warning. */
int tsr_cpu_has(enum tsr_cpu_feature f);

#endif
