/*
 * query_ns — FindNeighbors' warnings about restrict namespaces that no datapoint of the
 * index uses (query_ns.c; docs/query-semantics.md "Unknown namespaces"). Owns the set of
 * namespaces seen in use; its one lock (known_mu) is a leaf: taken with no other held
 * beyond the caller's, never calls out while held.
 */
#ifndef TSR_COORD_QUERY_NS_H
#define TSR_COORD_QUERY_NS_H

#include <stddef.h>

#include "tessera/v1/shard.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"

/* 1 when dp (a query) names a restrict namespace no earlier answer showed in use: the
 * query must then also ask the live groups it does not probe (a namespace-only query). */
int tsr__query_ns_probe(const Tessera__V1__IndexDatapoint *dp);
/* After the answers res[0..nres) of query qi (dp) came back: remembers the namespaces
 * some group uses, and when complete (every live group answered) writes a warning (new
 * string, caller frees) for each namespace every answer reported unknown into warn, at
 * most cap. Returns the number written. */
size_t tsr__query_ns_settle(const Tessera__V1__IndexDatapoint *dp, size_t qi,
                            const Tessera__V1__ShardQueryResult *const *res, size_t nres,
                            int complete, char **warn, size_t cap);

#endif
