/*
 * fuzz_coord_rpc — every request a coordinator accepts, from bytes through protobuf-c
 * unpacking (after the server's nesting check, for the methods registered with a request
 * type), validation, the Vertex -> tessera.v1 translation, resource-name and
 * deployed_index_id checks, update_mask handling, the query plan and the write plan, on the
 * in-process coordinator of fuzz_coord_common.h, without gRPC or a socket
 * (tsr__rpc_run_detached / tsr__rpc_run_typed_detached run a handler as the server would).
 *
 * Input: byte 0 picks the method, the rest is the request message. Byte 0 below 252
 * (14 x 18): M[byte % 18], the first 18 rows of the table below (coordinator/main.c's order,
 * as before AddShardGroup and RemoveShardGroup were added: the committed corpus keeps its
 * meaning); 252-253: AddShardGroup, 254-255: RemoveShardGroup (rows 18 and 19).
 *
 * AddShardGroup / RemoveShardGroup: busy is cleared for them, so they pass the request's
 * checks (addresses, group number, last group, at most 256 groups) and start a move on the
 * update thread: an add appends the group to the config and opens its replicas (without
 * channels) then fails at the new group's Stats; a remove computes the new plan (the
 * balance rule of reshard.c) and fails reading the moved lists from their old owner. The
 * harness waits for the move and restores the state (fc_reshard_undo), so every input
 * starts from the same coordinator.
 *
 * Not covered (see fuzz_coord_common.h): the shards' replies (the fan-out fails at once
 * with UNAVAILABLE, so the merge of results, re-ranking, and the Vertex reply translation
 * are not reached), the round of a streamed write (the writer thread is not started), an
 * update's shard phases. Checks: no crash (ASan/UBSan), a status code in 0..16, an OK
 * reply that unpacks as the method's response type.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/rpc_int.h"

#include "fuzz_coord_common.h"
#include "frontend/frontend.h"
#include "google/cloud/aiplatform/container/v1/match_service.pb-c.h"
#include "google/cloud/aiplatform/v1/index_service.pb-c.h"
#include "google/cloud/aiplatform/v1/match_service.pb-c.h"
#include "google/longrunning/operations.pb-c.h"

#define SVC "/tessera.v1.VectorSearch/"
#define V1I TSR_VERTEX_V1_INDEX_SVC

static const char unimpl[] = V1I "CreateIndex";

static const struct {
    const char *path;
    tsr_rpc_handler_fn fn; /* a raw handler; NULL = the typed method of path (typed_of) */
    const ProtobufCMessageDescriptor *req_type; /* nesting checked first, as main.c sets */
} M[] = {
    {SVC "FindNeighbors", tsr__coord_rpc_find_neighbors,
     &tessera__v1__find_neighbors_request__descriptor},
    {SVC "ReadIndexDatapoints", NULL, NULL},
    {SVC "GetIndexStats", NULL, NULL},
    {SVC "UpdateIndex", NULL, NULL},
    {SVC "GetOperation", NULL, NULL},
    {SVC "UpsertDatapoints", NULL, NULL},
    {SVC "RemoveDatapoints", NULL, NULL},
    {TSR_VERTEX_SVC "Match", NULL, NULL},
    {TSR_VERTEX_SVC "BatchMatch", NULL, NULL},
    {TSR_VERTEX_SVC "BatchGetEmbeddings", NULL, NULL},
    {TSR_VERTEX_V1_SVC "FindNeighbors", NULL, NULL},
    {TSR_VERTEX_V1_SVC "ReadIndexDatapoints", NULL, NULL},
    {V1I "GetIndex", NULL, NULL},
    {V1I "UpdateIndex", NULL, NULL},
    {TSR_LRO_SVC "GetOperation", NULL, NULL},
    {V1I "UpsertDatapoints", NULL, NULL},
    {V1I "RemoveDatapoints", NULL, NULL},
    {V1I "CreateIndex", tsr__vertex_v1_rpc_unimplemented, NULL},
    /* added after the first 18: reached by byte 0 >= 252 only (see the top) */
    {SVC "AddShardGroup", NULL, NULL},
    {SVC "RemoveShardGroup", NULL, NULL},
};
#define NM (sizeof M / sizeof M[0])
#define NM_OLD 18                   /* the table's size before the reshard methods */
#define SEL_NEW (256 / NM_OLD * NM_OLD) /* 252: byte 0 from here picks the added rows */
_Static_assert(NM == NM_OLD + 2, "the selector below maps 252..255 onto two added rows");

/* byte 0 -> the row of M (see the top) */
static size_t method_of(uint8_t b)
{
    if (b < SEL_NEW)
        return b % NM_OLD;
    return NM_OLD + (size_t)(b - SEL_NEW) / 2;
}

static tsr__coord C;

/* The typed method registered at path (main.c registers these tables). */
static const tsr_rpc_method *typed_of(const char *path)
{
    const struct {
        const tsr_rpc_method *m;
        size_t n;
    } T[] = {{tsr__tessera_v1_methods, tsr__tessera_v1_nmethods},
             {tsr__vertex_methods, tsr__vertex_nmethods},
             {tsr__vertex_v1_methods, tsr__vertex_v1_nmethods},
             {tsr__vertex_v1_index_methods, tsr__vertex_v1_index_nmethods}};
    for (size_t t = 0; t < sizeof T / sizeof T[0]; t++)
        for (size_t i = 0; i < T[t].n; i++)
            if (strcmp(T[t].m[i].path, path) == 0)
                return &T[t].m[i];
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fc_init();
    fc_open(&C);
    atexit(fc_rmdir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t mi = method_of(data[0]);
    int reshard = strcmp(M[mi].path, SVC "AddShardGroup") == 0 ||
                  strcmp(M[mi].path, SVC "RemoveShardGroup") == 0;
    if (reshard) { /* a move may start (the top); no other call runs meanwhile */
        pthread_mutex_lock(&C.op_mu);
        C.busy = 0;
        pthread_mutex_unlock(&C.op_mu);
    }
    /* the unimplemented handler's ctx is the method's name without the leading '/' */
    void *ctx = M[mi].fn == tsr__vertex_v1_rpc_unimplemented ? (void *)(unimpl + 1) : &C;
    tsr__rpc_detached d;
    const tsr_rpc_method *tm = M[mi].fn ? NULL : typed_of(M[mi].path);
    if (!M[mi].fn && !tm)
        abort();
    int code = tm ? tsr__rpc_run_typed_detached(tm, &C, data + 1, size - 1, &d)
                  : tsr__rpc_run_detached(M[mi].path, M[mi].fn, ctx, M[mi].req_type, data + 1,
                                          size - 1, &d);
    if (reshard)
        fc_reshard_undo(&C, FC_NGROUPS);
    if (code < 0 || code > 16)
        abort();
    if (getenv("TSR_FUZZ_VERBOSE")) /* what an input does (TSR_FUZZ_VERBOSE=1 harness FILE) */
        fprintf(stderr, "%s: %d %s (%zu bytes)\n", M[mi].path, code, d.msg ? d.msg : "", d.len);
    tsr__rpc_detached_close(&d);
    return 0;
}
