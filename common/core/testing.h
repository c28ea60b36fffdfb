/*
 * testing — the test hooks and A/B knobs: one table, compiled into test builds only.
 *
 * A test hook makes a process misbehave on purpose (exit at a crash point, sleep before a
 * phase, plant a bug for the chaos checker); an A/B knob picks an older or a forced code
 * path so that tests and benchmarks can compare two implementations. Both are read from
 * environment variables, and both exist only in a build compiled with -DTSR_TESTING (`make
 * TESTING=1` -> build/testing/bin, and every sanitizer build). In a release build every
 * entry point below is a macro that expands to a constant and drops its arguments: the
 * binary reads none of these variables and holds none of their names or values (the
 * strings check of tests/tools/test_release_strings.py), so no operator's environment can
 * make a production process crash, sleep or acknowledge a write it never logged.
 *
 * Operator settings that are read from the environment are not here: TSR_LOG_LEVEL
 * (core/log.h), TSR_SIMD_MAX (core/cpu.h), TSR_BACKGROUND_NICE (core/parallel.h), and the
 * CLI's TSR_ETCD, TSR_TLS_CA, TSR_TLS_SERVER_NAME, TSR_TOKEN_FILE (docs/testing.md has
 * the table of every variable and why it is on its side).
 *
 * The table: X(ID, VARIABLE, KIND, VALUES, MEANING). KIND is CRASH (the value names a
 * crash point; a few also name a planted behaviour: VALUES lists them all), SLEEP (the
 * value is milliseconds, 1..600000) or AB (an A/B knob; VALUES lists what it takes).
 * tests/tools/test_release_strings.py reads this table from this file.
 *
 * Thread-safety: no state but the environment, read on each call.
 */
#ifndef TSR_TESTING_H
#define TSR_TESTING_H

/* clang-format off */
#define TSR_TEST_KNOBS(X)                                                                    \
    /* test hooks */                                                                        \
    X(COORD_CRASH_AT, "TSR_COORD_CRASH_AT", CRASH,                                          \
      "staged prepared saved flipped committed caught-up round-logged "                     \
      "plant-ack-unlogged mirror-answer-lost mirror-doubt no-read-index no-demand",         \
      "coordinator: _exit(137) at that step of an update, fold or reshard; or a planted "   \
      "behaviour (docs/testing.md)")                                                        \
    X(SHARD_CRASH_AT, "TSR_SHARD_CRASH_AT", CRASH,                                          \
      "prepare commit stage catchup catchup-logged",                                        \
      "shard: _exit(137) when that call arrives (catchup-logged: once logged)")             \
    X(COORD_SLOW_FLIP_MS, "TSR_COORD_SLOW_FLIP_MS", SLEEP, "",                              \
      "coordinator: the fold's flip after its catch-up sleeps first")                       \
    X(COORD_SLOW_START_MS, "TSR_COORD_SLOW_START_MS", SLEEP, "",                            \
      "coordinator: a new term's start-up sleeps first")                                    \
    X(COORD_SLOW_FOLD_DIR_MS, "TSR_COORD_SLOW_FOLD_DIR_MS", SLEEP, "",                      \
      "coordinator: the fold's directory copy sleeps first")                                \
    X(SHARD_SLOW_PREPARE_MS, "TSR_SHARD_SLOW_PREPARE_MS", SLEEP, "",                        \
      "shard: a Prepare sleeps first")                                                      \
    /* A/B knobs */                                                                         \
    X(SIMD, "TSR_SIMD", AB, "scalar avx2 avx512",                                           \
      "force the search / coarse-step kernels (tests compare them; operators: "             \
      "TSR_SIMD_MAX)")                                                                      \
    X(NO_SIMD, "TSR_NO_SIMD", AB, "1", "no AVX-512 in PQ encoding and k-means")             \
    X(SEARCH_FILTER, "TSR_SEARCH_FILTER", AB, "0 scalar",                                   \
      "the quantized prefilter off, or its scalar kernel")                                  \
    X(SEARCH_NIBBLE, "TSR_SEARCH_NIBBLE", AB, "0 scalar scalar6",                           \
      "the 4/6-bit prefilter off, or a scalar kernel")                                      \
    X(SHARD_CODES, "TSR_SHARD_CODES", AB, "faiss", "shard lists keep Faiss-order codes")    \
    X(SHARD_VECTORS, "TSR_SHARD_VECTORS", AB, "heap", "raw vectors copied to the heap")     \
    X(LEADER_WATCH, "TSR_LEADER_WATCH", AB, "0", "the election polled, not watched")        \
    X(RPC_CQS, "TSR_RPC_CQS", AB, "1..64", "server completion queues")                      \
    X(RPC_POLLERS, "TSR_RPC_POLLERS", AB, "1..", "pollers per server completion queue")     \
    X(RPC_INLINE_LONG, "TSR_RPC_INLINE_LONG", AB, "0", "long handlers not run inline")      \
    X(RPC_STREAM_POLL, "TSR_RPC_STREAM_POLL", AB, "1", "client streams wait blocking")      \
    X(RPC_CQ_POOL, "TSR_RPC_CQ_POOL", AB, "0", "a client completion queue per call")        \
    X(RPC_RETRIES, "TSR_RPC_RETRIES", AB, "1", "gRPC's retry machinery back on")
/* clang-format on */

enum tsr_test_knob_id {
#define TSR_TEST_KNOB_ENUM(id, var, kind, values, meaning) TSR_KNOB_##id,
    TSR_TEST_KNOBS(TSR_TEST_KNOB_ENUM)
#undef TSR_TEST_KNOB_ENUM
        TSR_KNOB__COUNT
};

#ifdef TSR_TESTING

/* The knob's value from the environment, or NULL when unset. */
const char *tsr_test_knob(enum tsr_test_knob_id id);

/* 1 when the knob holds `value` exactly. `value` must be one of the table's VALUES for
 * that knob (a test build aborts on an unlisted one: a typo would never fire). */
int tsr_test_is(enum tsr_test_knob_id id, const char *value);

/* A crash point: when the knob holds `step`, logs "VAR=step: exiting with 137 (test
 * hook)" and _exit(137)s, as a kill -9 at that point would (no atexit handlers, no flush
 * of anything but the log line). Otherwise returns. `step` is checked as by tsr_test_is. */
void tsr_test_crash(enum tsr_test_knob_id id, const char *step);

/* A slow phase: when the knob holds N in 1..600000, logs "VAR=N: WHAT sleeps first (test
 * hook)" and sleeps N ms (the process keeps serving on its other threads). */
void tsr_test_sleep(enum tsr_test_knob_id id, const char *what);

#else /* a release build: constants, the arguments dropped (no string reaches the binary) */

#define tsr_test_knob(id) ((const char *)0)
#define tsr_test_is(id, value) 0
#define tsr_test_crash(id, step) ((void)0)
#define tsr_test_sleep(id, what) ((void)0)

#endif

#endif
