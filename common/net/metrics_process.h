/*
 * metrics_process — the standard process_* metrics every Prometheus client library
 * exports (process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds), read from /proc/self at render time, so every binary that
 * serves /metrics (tessera-coordinator, tessera-shard) has them with no hook of its own.
 *
 * tsr_metrics_render (metrics.c) calls it after the registry's families; it only reads
 * /proc and appends text, and never calls back into the registry. On a system without
 * /proc (or a field it cannot read) the metric is left out rather than reported as 0, as
 * the Go and Python clients do.
 */
#ifndef TSR_METRICS_PROCESS_H
#define TSR_METRICS_PROCESS_H

#include "core/buf.h"

/* Appends the process_* families (HELP, TYPE, one sample each) to b. Never fails (a
 * value that cannot be read is omitted; b->oom reports out of memory). Thread-safe. */
void tsr_metrics_process_render(tsr_buf *b);

#endif
