/*
 * frontend — the RPC handlers of the coordinator's services, adapters over the subsystems:
 * tessera.v1.Coordinator (tessera_v1.c), the Vertex private MatchService
 * (google.cloud.aiplatform.container.v1, vertex.c), google.cloud.aiplatform.v1
 * MatchService and IndexService and google.longrunning.Operations (vertex_v1.c,
 * vertex_v1_index.c). main.c registers them; nothing else calls them. They include the
 * coordinator's headers as their own (-Icoordinator, mk/coordinator.mk).
 */
#ifndef TSR_COORD_FRONTEND_H
#define TSR_COORD_FRONTEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "net/rpc.h"
#include "net/rpc_typed.h"
#include "tessera/v1/tessera.pb-c.h"

typedef struct tsr__coord tsr__coord; /* coord.h */
typedef struct arena tsr__arena;      /* arena.h */

/* tessera_v1.c: the tessera.v1.VectorSearch methods as typed methods (net/rpc_typed.h;
 * app = the tsr__coord): ReadIndexDatapoints, GetIndexStats, UpdateIndex, GetOperation,
 * UpsertDatapoints / RemoveDatapoints (TSR_RPC_LONG, role admin), AddShardGroup /
 * RemoveShardGroup (docs/resharding.md: a move on the update thread, leader only). Roles
 * are main.c's. FindNeighbors is a raw handler: its reply is sent by the query path's
 * asynchronous fan-out. */
extern const tsr_rpc_method tsr__tessera_v1_methods[];
extern const size_t tsr__tessera_v1_nmethods;
int tsr__coord_rpc_find_neighbors(void *ctx, const uint8_t *req, size_t len, tsr_rpc_reply *r);

/* vertex.c: google.cloud.aiplatform.container.v1.MatchService (docs/vertex-compat.md);
 * register with TSR_RPC_LONG. */
#define TSR_VERTEX_SVC "/google.cloud.aiplatform.container.v1.MatchService/"
/* Match, BatchMatch, BatchGetEmbeddings as typed methods (app = the tsr__coord). */
extern const tsr_rpc_method tsr__vertex_methods[];
extern const size_t tsr__vertex_nmethods;
/* The int64 crowding_attribute Vertex reports for a Tessera crowding tag (borrowed; NULL or
 * "" = no tag = 0): the number itself when the tag is a canonical decimal int64, else
 * FNV-1a 64 of the tag's bytes with the top bit cleared (docs/vertex-compat.md). */
int64_t tsr__vertex_crowding_attribute(const char *tag);
/* What a Vertex reply borrows (both Vertex APIs): its allocations (tsr__vertex_call_arena)
 * and the core responses it was translated from (kept with tsr__vertex_keep_fn / _rd;
 * NULL allowed), all freed after the reply is packed. tsr__vertex_call_new: the
 * call's, NULL when out of memory. */
typedef struct tsr__vertex_call tsr__vertex_call;
tsr__vertex_call *tsr__vertex_call_new(tsr_rpc_ctx *ctx);
tsr__arena *tsr__vertex_call_arena(tsr__vertex_call *k);
void tsr__vertex_keep_fn(tsr__vertex_call *k, Tessera__V1__FindNeighborsResponse *r);
void tsr__vertex_keep_rd(tsr__vertex_call *k, Tessera__V1__ReadIndexDatapointsResponse *r);
/* 1 when s is the resource name "projects/P/locations/L/<kind>X" with non-empty segments
 * and nothing after X; kind is e.g. "indexEndpoints/" or "indexes/". */
int tsr__vertex_resource_ok(const char *s, const char *kind);
/* 0 when the deployed_index_id id (borrowed; NULL or "" = any) is served here: always
 * without --deployed-index-id, else only that id. Otherwise TSR_ENOTFOUND with err naming
 * the field, prefixed by where ("" or e.g. "requests[2]: "). */
int tsr__vertex_check_index(const tsr__coord *c, const char *id, const char *where,
                            tsr_error *err);

/* vertex_v1.c: google.cloud.aiplatform.v1.MatchService (docs/vertex-compat.md); register
 * with TSR_RPC_LONG. The unimplemented handler takes the method's full name (static
 * storage) as ctx and answers UNIMPLEMENTED saying what Tessera serves instead. */
#define TSR_VERTEX_V1_SVC "/google.cloud.aiplatform.v1.MatchService/"
#define TSR_VERTEX_V1_INDEX_SVC "/google.cloud.aiplatform.v1.IndexService/"
/* FindNeighbors and ReadIndexDatapoints as typed methods (app = the tsr__coord). */
extern const tsr_rpc_method tsr__vertex_v1_methods[];
extern const size_t tsr__vertex_v1_nmethods;
int tsr__vertex_v1_rpc_unimplemented(void *ctx, const uint8_t *req, size_t len,
                                     tsr_rpc_reply *r);
/* The tessera.v1 IndexDatapoint for the v1 one g (same fields and numbers): it borrows every
 * string, array and the embedding_metadata of g (which must outlive it); its structs are
 * in a. Used for queries and for UpsertDatapoints' datapoints. */
struct Google__Cloud__Aiplatform__V1__IndexDatapoint;
Tessera__V1__IndexDatapoint *tsr__vertex_v1_dp_to_tessera(
    tsr__arena *a, const struct Google__Cloud__Aiplatform__V1__IndexDatapoint *g);

/* vertex_v1_index.c: IndexService GetIndex (role query), UpdateIndex (admin) and
 * google.longrunning.Operations/GetOperation (query), UpsertDatapoints and
 * RemoveDatapoints (admin; TSR_RPC_LONG: they block on the streamed write), as typed
 * methods (app = the tsr__coord); roles are main.c's. */
#define TSR_LRO_SVC "/google.longrunning.Operations/"
extern const tsr_rpc_method tsr__vertex_v1_index_methods[];
extern const size_t tsr__vertex_v1_index_nmethods;

#endif
