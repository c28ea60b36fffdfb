/*
 * query — the read path (query.c): FindNeighbors (coarse step, fan-out to one replica per
 * group, merge), ReadIndexDatapoints and the mapping of its errors to a gRPC status, for
 * every front end. Locks: none of its own; a query holds a snapshot reference and reads
 * the overlay under st.ov_rw (read).
 */
#ifndef TSR_COORD_QUERY_H
#define TSR_COORD_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "net/rpc.h"
#include "tessera/v1/tessera.pb-c.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* The one mapping of the query path's errors to a gRPC status (err->code; 0 counts as
 * INTERNAL), used by the RPC handlers only: status_of gives the code, reply_error sends
 * it with err->msg. */
int tsr__coord_status_of(const tsr_error *err);
int tsr__coord_reply_error(tsr_rpc_reply *r, const tsr_error *err);

/* The query path, reusable by other front ends (Vertex MatchService): answers rq (borrowed)
 * within remaining_ms. On success *out is a new response (caller frees with
 * tsr__coord_response_free). On failure returns a negative TSR code with err set (a
 * front end maps it with tsr__coord_status_of). */
int tsr__coord_find_neighbors(tsr__coord *c, const Tessera__V1__FindNeighborsRequest *rq,
                              int64_t remaining_ms, Tessera__V1__FindNeighborsResponse **out,
                              tsr_error *err);
void tsr__coord_response_free(Tessera__V1__FindNeighborsResponse *r);
/* The same without blocking, from inside an rpc handler (tessera.v1 FindNeighbors): rq
 * (taken: freed when answered) is planned here, its shard calls go out on the server's
 * queue (tsr__coord_group_fanout_async, or the coalescer) and the merge and the reply run
 * on the polling thread that sees the last one. Returns the handler's return value. */
int tsr__coord_find_neighbors_reply(tsr__coord *c, Tessera__V1__FindNeighborsRequest *rq,
                                    tsr_rpc_reply *r);

/* ReadIndexDatapoints, reusable likewise (Vertex BatchGetEmbeddings and embedding_id): the
 * stored datapoints of ids (borrowed) on one snapshot, within remaining_ms. On success *out
 * is a new response (found ids in request order, unknown ids omitted; caller frees with
 * tsr__coord_read_free). On failure a negative TSR code with err set. */
int tsr__coord_read(tsr__coord *c, char *const *ids, size_t n_ids, int64_t remaining_ms,
                    Tessera__V1__ReadIndexDatapointsResponse **out, tsr_error *err);
void tsr__coord_read_free(Tessera__V1__ReadIndexDatapointsResponse *r);

#endif
