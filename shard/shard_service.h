/*
 * shard_service — registers the tessera.v1.Shard handlers (service.c) on an rpc server.
 */
#ifndef TSR_SHARD_SERVICE_H
#define TSR_SHARD_SERVICE_H

#include "net/rpc.h"
#include "shard.h"

/* Registers every Shard method with ctx s (borrowed; must outlive the server). */
int tsr_shard_service_register(tsr_rpc_server *srv, tsr__shard *s);

#endif
