/*
 * shard_service — registers the tessera.v1.Shard handlers (service.c) on an rpc server, and
 * the shard's /metrics collector.
 */
#ifndef TSR_SHARD_SERVICE_H
#define TSR_SHARD_SERVICE_H

#include "net/rpc.h"
#include "net/rpc_typed.h"
#include "shard.h"

/* Registers every Shard method with ctx s (borrowed; must outlive the server). */
int tsr_shard_service_register(tsr_rpc_server *srv, tsr__shard *s);

/* The typed method of Shard method `method` ("Search", "Stage", ...; its app is a
 * tsr__shard) as tsr_shard_service_register installs it; NULL for an unknown method. For
 * the fuzz harnesses (tests/fuzz/fuzz_shard_rpc.c), which run it without a server. */
const tsr_rpc_method *tsr_shard_service_method(const char *method);

/* Registers the /metrics collector of s (borrowed; the metrics listener must be destroyed
 * before s is closed): tessera_version, tessera_vectors, tessera_lists. Returns 0 or
 * TSR_ELIMIT (the registry's collectors are full). */
int tsr_shard_metrics_register(tsr__shard *s);

#endif
