/*
 * query_ns — warnings about restrict namespaces that no datapoint of the index uses
 * (FindNeighborsResponse.warnings; docs/query-semantics.md "Unknown namespaces"). By
 * Vertex's rules `--restrict colour=red` on an index whose datapoints say `color` matches
 * nothing and the answer is empty; the warning says why.
 *
 * Where the truth lives: each shard reports, per query, the namespaces of its restricts
 * that no datapoint of the searched version uses, its streamed delta included
 * (ShardQueryResult.unknown_namespaces, shard/nsuse.c). A namespace is unknown to the
 * index when every live group reports it. Streamed writes: an upsert is acknowledged once
 * every live replica of its group applied it, and a query demands that seq of each group
 * it asks (read-your-writes), so a namespace first used by an acknowledged upsert is known
 * to the next query's answers.
 *
 * Cost: a dense query asks only the groups owning its probed lists. Namespaces that some
 * answer showed in use are remembered here (a namespace ever used stays "used": the set
 * only grows, so it never causes a false warning); only a query naming a namespace not in
 * the set also asks the other live groups, with a namespace-only query (no vector, no
 * lists: no scan). So the steady state costs nothing; a typo costs one small call per
 * group not probed.
 *
 * The set is per process (a coordinator serves one index), at most KNOWN_CAP names
 * (beyond, names are not remembered: more asking, never a wrong warning); known_mu guards
 * it (a leaf lock). Calls no other file of the folder.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/mem.h"
#include "query_ns.h"

#define KNOWN_CAP 4096 /* slots; at most half are filled */

static pthread_mutex_t known_mu = PTHREAD_MUTEX_INITIALIZER;
static char *known[KNOWN_CAP];
static size_t nknown;

/* Slot of ns (its string, or the empty slot where it would go). Caller holds known_mu. */
static size_t slot_of(const char *ns)
{
    size_t i = (size_t)(tsr_fnv1a64_str(TSR_FNV1A64_BASIS, ns) % KNOWN_CAP);
    while (known[i] && strcmp(known[i], ns) != 0)
        i = (i + 1) % KNOWN_CAP;
    return i;
}

static int is_known(const char *ns)
{
    pthread_mutex_lock(&known_mu);
    int k = known[slot_of(ns)] != NULL;
    pthread_mutex_unlock(&known_mu);
    return k;
}

static void learn(const char *ns)
{
    pthread_mutex_lock(&known_mu);
    size_t i = slot_of(ns);
    if (!known[i] && nknown < KNOWN_CAP / 2) {
        known[i] = tsr_xstrdup(ns);
        nknown++;
    }
    pthread_mutex_unlock(&known_mu);
}

/* Namespace j of dp's token then numeric restricts. */
static const char *ns_at(const Tessera__V1__IndexDatapoint *dp, size_t j)
{
    return j < dp->n_restricts ? dp->restricts[j]->namespace_
                               : dp->numeric_restricts[j - dp->n_restricts]->namespace_;
}

int tsr__query_ns_probe(const Tessera__V1__IndexDatapoint *dp)
{
    for (size_t j = 0; j < dp->n_restricts + dp->n_numeric_restricts; j++)
        if (!is_known(ns_at(dp, j)))
            return 1;
    return 0;
}

static int reported(const Tessera__V1__ShardQueryResult *r, const char *ns)
{
    for (size_t k = 0; k < r->n_unknown_namespaces; k++)
        if (strcmp(r->unknown_namespaces[k], ns) == 0)
            return 1;
    return 0;
}

size_t tsr__query_ns_settle(const Tessera__V1__IndexDatapoint *dp, size_t qi,
                            const Tessera__V1__ShardQueryResult *const *res, size_t nres,
                            int complete, char **warn, size_t cap)
{
    size_t nw = 0;
    for (size_t j = 0; j < dp->n_restricts + dp->n_numeric_restricts; j++) {
        const char *ns = ns_at(dp, j);
        size_t unknown = 0;
        for (size_t s = 0; s < nres; s++)
            unknown += reported(res[s], ns);
        if (unknown < nres) {
            learn(ns);
            continue;
        }
        int dup = 0; /* a namespace named twice (token and numeric, or repeated) */
        for (size_t k = 0; k < j && !dup; k++)
            dup = strcmp(ns_at(dp, k), ns) == 0;
        if (!complete || nres == 0 || dup || nw == cap)
            continue;
        char buf[512];
        snprintf(buf, sizeof buf,
                 "queries[%zu]: no datapoint of the index uses the %s namespace '%.200s': "
                 "this restrict matches nothing (a typo?)",
                 qi, j < dp->n_restricts ? "restrict" : "numeric restrict", ns);
        warn[nw++] = tsr_xstrdup(buf);
    }
    return nw;
}
