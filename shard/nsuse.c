/*
 * nsuse — which namespaces of a query no datapoint uses (ShardQueryResult
 * .unknown_namespaces; docs/query-semantics.md "Unknown namespaces"). By Vertex's rules a
 * restrict on such a namespace matches nothing; the coordinator turns a namespace that
 * every shard group reports into a warning of the response ('colour' for 'color').
 *
 * A namespace is known when the version's filter dictionary holds the string (every
 * namespace of its datapoints is interned there; so are tokens and crowding tags, so a
 * namespace spelled like some token is taken as known: no warning rather than a false
 * one), or when a record of the version's streamed delta names it. The delta is scanned
 * only for a string the dictionary lacks — the rare case of a typo or of a namespace first
 * used by a streamed write — so a query on known namespaces costs one lookup each.
 *
 * Threads: reads an immutable version and delta snapshot (the caller holds references).
 * Calls no other file of the folder.
 */
#include <string.h>

#include "query/filter.h"
#include "shard.h"

/* 1 when a delta record names ns in a token or numeric restrict. */
static int delta_uses(const tsr__delta *dl, const char *ns)
{
    for (size_t i = 0; dl && i < dl->nrecs; i++) {
        const tsr_datapoint *dp = &dl->recs[i]->dp;
        for (size_t r = 0; r < dp->nrestricts; r++)
            if (strcmp(dp->restricts[r].ns, ns) == 0)
                return 1;
        for (size_t r = 0; r < dp->nnumeric; r++)
            if (strcmp(dp->numeric[r].ns, ns) == 0)
                return 1;
    }
    return 0;
}

int tsr__ns_unknown(const tsr__version *v, const tsr__delta *dl, const char *ns)
{
    if (v->dict && tsr_filter_dict_lookup(v->dict, ns, strlen(ns)) != TSR_FILTER_NOID)
        return 0;
    return !delta_uses(dl, ns);
}
