/*
 * metrics — a process-wide registry of counters, gauges and fixed-bucket histograms with
 * labels, rendered in the Prometheus text exposition format (version 0.0.4).
 *
 * HOOKS FOR THE OWNERS (one line each; all are thread-safe, never fail, never block on
 * slow work — a bad name or a full registry drops the sample and counts it in
 * tessera_metrics_dropped_total):
 *
 *   RPC server, after a call finished (method = the full path, code = gRPC status):
 *     tsr_metrics_rpc_observe("/tessera.v1.Shard/Search", code, seconds);
 *       → tessera_rpc_requests_total{method,code}  tessera_rpc_duration_seconds{method}
 *   Coordinator, per call to a shard (peer = "host:port" of the shard):
 *     tsr_metrics_shard_call_observe(peer, "/tessera.v1.Shard/Search", code, seconds);
 *       → tessera_shard_calls_total{shard,method,code} tessera_shard_call_duration_seconds{shard}
 *   Coordinator, whenever its health view of a shard changes:
 *     tsr_metrics_shard_up(peer, 1 or 0);                  → tessera_shard_up{shard}
 *   (The replicated coordinator does not use these two: coordinator/replica.c samples the
 *   same families with the labels shard=<group>,replica=<j>,address=<host:port>, the ones
 *   docs/operations.md documents and the HELP texts below describe.)
 *   Shard and coordinator, after a version became current:
 *     tsr_metrics_version_set(version);                     → tessera_version
 *   Shard, after a version is loaded / committed:
 *     tsr_metrics_index_size(vectors, lists_nonempty);      → tessera_vectors, tessera_lists
 *   Coordinator, during an update (phase = "validate","stage","prepare","commit"):
 *     tsr_metrics_update_phase(phase);                      → tessera_update_phase{phase}=1
 *     tsr_metrics_update_records(n);                        → tessera_update_records_total
 *     tsr_metrics_update_done(result, error_type);          → tessera_updates_total{result},
 *        result "committed"|"aborted"|"rejected"; error_type e.g. tsr_strerror name or
 *        NULL when none → tessera_update_errors_total{type}; phase gauge back to "idle".
 *
 *   Generic (labels = "key=value,key2=value2", values may hold anything except ','; NULL
 *   or "" = no labels; keep the same key order for the same series):
 *     tsr_metrics_counter_add("tessera_x_total", "type=foo", 1);
 *     tsr_metrics_gauge_set("tessera_vectors", NULL, 1234);
 *     tsr_metrics_gauge_add("tessera_inflight", NULL, -1);
 *     tsr_metrics_histogram_observe("tessera_stage_seconds", NULL, 0.42);
 *     tsr_metrics_describe("tessera_x_total", TSR_METRIC_COUNTER, "What it counts.");
 *
 * Serving it: common/net/metrics_http.h (GET /metrics on a libuv listener).
 *
 * DESIGN: series live in one fixed open-addressing table of atomically published
 * pointers. A sample looks its series up without a lock (hash, probe, compare, atomic
 * add); only creating a new series or family takes `reg_mu`. Series are never freed while
 * the process runs (tsr_metrics_reset is for tests only and must not race with samples).
 * Double values are stored as bit patterns in _Atomic uint64_t and added with a CAS loop.
 * Histogram bucket counts are per-bucket (non-cumulative) atomics, cumulated at render
 * time, so a scrape racing an observe may see count and buckets one sample apart — as in
 * every Prometheus client library.
 */
#ifndef TSR_METRICS_H
#define TSR_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum tsr_metric_type { TSR_METRIC_COUNTER = 1, TSR_METRIC_GAUGE = 2, TSR_METRIC_HISTOGRAM = 3 };

/* Latency buckets in seconds (upper bounds, +Inf implied): Prometheus' defaults extended
 * below 5 ms because a shard search takes well under a millisecond. */
#define TSR_METRICS_NBUCKETS 14
extern const double tsr_metrics_buckets[TSR_METRICS_NBUCKETS];

/* Maximum number of series (all families) and families; beyond, samples are dropped. */
#define TSR_METRICS_MAX_SERIES 4096
#define TSR_METRICS_MAX_FAMILIES 256

/* Sets HELP and TYPE for a family before (or after) its first sample. Returns 0, or
 * TSR_EINVAL on a bad name or a type that disagrees with an existing family. Borrows
 * nothing (copies). The well-known tessera_* families are pre-described. */
int tsr_metrics_describe(const char *name, enum tsr_metric_type type, const char *help);

/* Generic samples. name: [a-zA-Z_:][a-zA-Z0-9_:]*; labels: see above. A counter add of a
 * negative or NaN value is dropped. */
void tsr_metrics_counter_add(const char *name, const char *labels, double v);
void tsr_metrics_gauge_set(const char *name, const char *labels, double v);
void tsr_metrics_gauge_add(const char *name, const char *labels, double v);
void tsr_metrics_histogram_observe(const char *name, const char *labels, double v);

/* Reads a value back (tests, the coordinator's own decisions): counter or gauge value,
 * or a histogram's sample count. NaN when the series does not exist. */
double tsr_metrics_value(const char *name, const char *labels);

/* Domain hooks (see the list at the top). */
void tsr_metrics_rpc_observe(const char *method, int grpc_code, double seconds);
void tsr_metrics_shard_call_observe(const char *shard, const char *method, int grpc_code,
                                    double seconds);
void tsr_metrics_shard_up(const char *shard, int up);
void tsr_metrics_version_set(uint64_t version);
void tsr_metrics_index_size(uint64_t vectors, uint64_t lists);
void tsr_metrics_update_phase(const char *phase);
void tsr_metrics_update_records(uint64_t n);
void tsr_metrics_update_done(const char *result, const char *error_type);

/* Seconds on a monotonic clock, for timing a call: t0 = tsr_metrics_now(); ...;
 * tsr_metrics_rpc_observe(m, code, tsr_metrics_now() - t0). */
double tsr_metrics_now(void);

/* A collector runs at the start of every render (on the renderer's thread, e.g. the
 * metrics_http loop thread) to refresh gauges that are cheaper to read than to track.
 * It must be thread-safe and must not call tsr_metrics_render. At most 16. Returns 0 or
 * TSR_ELIMIT. */
int tsr_metrics_add_collector(void (*fn)(void *ud), void *ud);

/* Renders every family in the text format 0.0.4 (HELP and TYPE lines, families in
 * creation order, series sorted by labels). Returns a new NUL-terminated string (caller
 * frees) and its length in *len (may be NULL), or NULL when out of memory. */
char *tsr_metrics_render(size_t *len);

/* Forgets every family, series and collector. Tests only: nothing may sample meanwhile. */
void tsr_metrics_reset(void);

/* Name of a gRPC status code ("OK", "UNAVAILABLE", ...; "UNKNOWN" when out of range). */
const char *tsr_metrics_code_name(int grpc_code);

#endif
