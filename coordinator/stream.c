/*
 * stream — streamed writes (docs/streaming.md): UpsertDatapoints / RemoveDatapoints.
 * First version of the entry points; the writer thread follows.
 */
#include "coord.h"

int tsr__coord_stream_upsert(tsr__coord *c, const Tessera__V1__UpsertDatapointsRequest *rq,
                             Tessera__V1__UpsertDatapointsResponse *resp, tsr_rpc_reply *r)
{
    (void)c; (void)rq; (void)resp;
    return tsr_rpc_reply_error(r, TSR_RPC_UNIMPLEMENTED, "UpsertDatapoints: not yet");
}

int tsr__coord_stream_remove(tsr__coord *c, const Tessera__V1__RemoveDatapointsRequest *rq,
                             Tessera__V1__RemoveDatapointsResponse *resp, tsr_rpc_reply *r)
{
    (void)c; (void)rq; (void)resp;
    return tsr_rpc_reply_error(r, TSR_RPC_UNIMPLEMENTED, "RemoveDatapoints: not yet");
}
