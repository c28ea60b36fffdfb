/*
 * coord_config — the coordinator's configuration (config.c): the JSON config file, its
 * defaults and validation, and the shard groups as resharding changes them
 * (docs/config.md, docs/resharding.md).
 *
 * Owns: tsr__coord_config (the group arrays have room for TSR_COORD_MAX_SHARDS groups so
 * AddShardGroup never moves them). Locks: none of its own; nshards is atomic, the groups
 * change only on the update thread under update_mu and the stream lock (groups.h).
 * Also the test build's crash points and hooks (config.c).
 */
#ifndef TSR_COORD_CONFIG_H
#define TSR_COORD_CONFIG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/testing.h"

#define TSR_COORD_MAX_SHARDS 256
#define TSR_COORD_MAX_REPLICAS 16
#define TSR_COORD_MAX_CANDIDATES 10000   /* a shard's limit on k and candidates */
#define TSR_COORD_DEFAULT_APPROX 100     /* config approximate_neighbor_count (docs/config.md) */
#define TSR_COORD_DEFAULT_RRF_DEPTH 100  /* config rrf_depth (docs/query-semantics.md) */

enum tsr__distance { TSR_DIST_SQUARED_L2 = 0, TSR_DIST_DOT_PRODUCT, TSR_DIST_COSINE };
enum tsr__plan_kind { TSR_PLAN_BALANCED = 0, TSR_PLAN_LOCALITY };

typedef struct tsr__coord_config {
    int dimensions;
    enum tsr__distance distance;
    int nlist, pq_m, pq_nbits, nprobe;
    _Atomic size_t nshards; /* shard groups (atomic: AddShardGroup grows it while queries,
                               stats and metrics read it) */
    char **shards;          /* owned: "host:port" naming each group (its first replica) */
    size_t *nreplicas;      /* owned: replicas per group (>= 1) */
    char ***replicas;       /* owned: replicas[s][j] = "host:port" of replica j of group s */
    uint8_t *retired;       /* owned: retired[s] = 1: removed by RemoveShardGroup (owns no
                               list, not called); the arrays above have room for
                               TSR_COORD_MAX_SHARDS groups so AddShardGroup never moves them */
    char ***dropped;        /* owned: replica lists of groups drop_groups removed (kept
                               until close: a stats reader may still hold them) */
    size_t *dropped_n;      /* owned: the length of each */
    size_t ndropped;
    int resharded;          /* the groups differ from the config file (a reshard): every
                               version stores them (file "groups") and a restart uses those */
    int replica_attempt_ms; /* per-attempt deadline while another replica is left; 0 = half
                               the query's deadline */
    enum tsr__plan_kind plan;
    int search_deadline_ms, stage_deadline_ms;
    int max_k, max_queries;
    uint64_t seed;
    int stage_chunk;        /* upserts per Stage chunk */
    int update_min_replicas; /* replicas per group an update needs (0 = all); the others are
                                left out of the version and re-seeded by reconcile */
    int default_k;
    int approximate_neighbor_count; /* candidates per shard re-ranked exactly when a query
                                       does not set its own; 0 = PQ distances */
    int rrf_depth;          /* depth of the dense and of the sparse list of a hybrid (RRF)
                               query: max(k, rrf_depth), independent of k below it */
    int stream_fold_records; /* overlay size that starts a background fold (0 = never) */
    int stream_write_deadline_ms; /* one Shard.Write of a streamed round */
    int coalesce_inflight;  /* Search calls per replica of a group in flight before further
                               FindNeighbors queue and share one call (coalesce.c); 0 = off */
    int fold_prepare_parallel; /* replicas a fold's Prepare builds at once (0 = all) */
    int fold_build_cpu_percent; /* share of a core a fold's build may use (100 = unpaced) */
} tsr__coord_config;

/* Parses the config file. Returns 0 or TSR_EINVAL/TSR_EIO with err naming the key. */
int tsr__coord_config_load(const char *path, tsr__coord_config *cfg, tsr_error *err);
void tsr__coord_config_close(tsr__coord_config *cfg);
const char *tsr__distance_name(enum tsr__distance d);
/* Resharding (docs/resharding.md). add_group: appends a group of n replicas (addresses
 * copied; checked like the config's; TSR_EINVAL naming the problem). groups_text: the
 * groups as the text of a version's "groups" file, group also_retired (-1: none) written
 * as retired too (new, *len bytes; caller frees).
 * set_groups: replaces the groups by those of such a text (before any thread reads them;
 * TSR_EFORMAT naming the line); parse_groups: such a text into out's group arrays only
 * (close out with tsr__coord_config_close). */
int tsr__coord_config_add_group(tsr__coord_config *cfg, const char *const *addr, size_t n,
                                tsr_error *err);
char *tsr__coord_config_groups_text(const tsr__coord_config *cfg, int also_retired,
                                    size_t *len);
int tsr__coord_config_set_groups(tsr__coord_config *cfg, const char *text, size_t len,
                                 tsr_error *err);
int tsr__coord_config_parse_groups(const char *text, size_t len, tsr__coord_config *out,
                                   tsr_error *err);
/* Drops the groups keep .. nshards-1 (retired ones: failed adds never committed, see
 * tsr__coord_groups_follow): nshards becomes keep; their lists are freed at close. */
void tsr__coord_config_drop_groups(tsr__coord_config *cfg, size_t keep);

/* Test-only crash points (TSR_COORD_CRASH_AT=staged|prepared|saved|flipped|committed, and
 * caught-up: a reshard move's catch-up done, before its flip). Test builds only
 * (core/testing.h): nothing in a release build. */
#define tsr__coord_crash_point(step) tsr_test_crash(TSR_KNOB_COORD_CRASH_AT, step)
/* Test-only: 1 when TSR_COORD_CRASH_AT names this hook. Besides the crash points, one
 * planted bug for the chaos checker (tests/chaos, docs/reliability.md "Chaos"):
 * "plant-ack-unlogged" makes the stream writer acknowledge each round without appending it
 * to the coordinator log or mirroring it in etcd (it still sends it to the shards). Never
 * set outside that demonstration. Two more, each once per process, for the etcd mirror of a
 * streamed round (stream_ha.c): "mirror-answer-lost" puts a mirrored round again (a try
 * whose answer was lost: it must settle as logged), "mirror-doubt" takes a mirrored
 * round's answer as lost (outcome unknown: the leader must re-read etcd's rounds). Test
 * builds only (core/testing.h): 0 in a release build. */
#define tsr__coord_test_hook(name) tsr_test_is(TSR_KNOB_COORD_CRASH_AT, name)

#endif
