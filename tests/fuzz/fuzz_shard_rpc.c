/*
 * fuzz_shard_rpc — every tessera.v1.Shard request, from bytes through protobuf-c unpacking,
 * validation and handling, on a small shard in this process, without gRPC or a socket
 * (tsr__rpc_run_typed_detached runs a typed method as the server would: size and nesting
 * checks, unpacking, the handler, packing).
 *
 * Input: byte 0 picks the method (byte % 10: Search, Read, Stage, Prepare, Commit, Abort,
 * Release, Stats, Write, List); the rest is the request message. The shard is fuzz_shard_common.h's
 * (version 1, 48 records). Inputs may change its state (stage, prepare, commit, abort,
 * release versions; streamed writes, logged and fsynced): after RESET_EVERY inputs of a
 * mutating method the shard is closed, its folder removed and a new one made, so the state
 * stays small. Checks: no crash (ASan/UBSan), a status code in 0..16, an OK reply that
 * unpacks as the method's response type, and after each mutating call Stats still answers
 * OK (the shard stays usable).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/rpc_int.h"
#include "shard_service.h"

#include "fuzz_shard_common.h"

#define RESET_EVERY 200

static const struct {
    const char *m;
    const ProtobufCMessageDescriptor *resp;
} M[] = {
    {"Search", &tessera__v1__shard_search_response__descriptor},
    {"Read", &tessera__v1__shard_read_response__descriptor},
    {"Stage", &tessera__v1__stage_response__descriptor},
    {"Prepare", &tessera__v1__prepare_response__descriptor},
    {"Commit", &tessera__v1__commit_response__descriptor},
    {"Abort", &tessera__v1__abort_response__descriptor},
    {"Release", &tessera__v1__release_response__descriptor},
    {"Stats", &tessera__v1__shard_stats_response__descriptor},
    {"Write", &tessera__v1__shard_write_response__descriptor},
    {"List", &tessera__v1__shard_list_response__descriptor},
};
#define NM (sizeof M / sizeof M[0])
enum { SEARCH, READ, STAGE, PREPARE, COMMIT, ABORT, RELEASE, STATS, WRITE, LIST };

static tsr__shard S;
static char *dir;
static unsigned dirty;

static int call(size_t mi, const uint8_t *req, size_t len)
{
    const tsr_rpc_method *m = tsr_shard_service_method(M[mi].m);
    if (!m)
        abort();
    tsr__rpc_detached d;
    int code = tsr__rpc_run_typed_detached(m, &S, req, len, &d);
    if (code < 0 || code > 16)
        abort();
    if (getenv("TSR_FUZZ_VERBOSE")) /* what an input does (TSR_FUZZ_VERBOSE=1 harness FILE) */
        fprintf(stderr, "%s: %d %s (%zu bytes)\n", M[mi].m, code, d.msg ? d.msg : "", d.len);
    if (code == TSR_RPC_OK) {
        ProtobufCMessage *m = protobuf_c_message_unpack(M[mi].resp, NULL, d.len, d.resp);
        if (!m) {
            fprintf(stderr, "%s: an OK reply that does not unpack\n", M[mi].m);
            abort();
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    tsr__rpc_detached_close(&d);
    return code;
}

static void down(void)
{
    tsr__shard_close(&S);
    tu_rmtree(dir);
    free(dir);
    dir = NULL;
}

static void seed(const char *sd, int mi, const char *name, const ProtobufCMessage *m)
{
    size_t n;
    uint8_t *b = fs_pack(mi, m, &n);
    fs_seed(sd, name, b, n);
    free(b);
}

/* A few valid requests per method, against version 1. */
static void write_seeds(const char *sd)
{
    float q[TD];
    memcpy(q, fs_x + 3 * TD, sizeof q);
    int32_t lists[2] = {0, 3};
    Tessera__V1__ShardQuery sq = TESSERA__V1__SHARD_QUERY__INIT, *sqp = &sq;
    sq.version = 1;
    sq.vector = q;
    sq.n_vector = TD;
    float coarse[2] = {1.0f, 9.0f};
    sq.lists = lists;
    sq.n_lists = 2;
    sq.coarse_distances = coarse;
    sq.n_coarse_distances = 2;
    sq.k = 5;
    Tessera__V1__ShardSearchRequest sr = TESSERA__V1__SHARD_SEARCH_REQUEST__INIT;
    sr.queries = &sqp;
    sr.n_queries = 1;
    seed(sd, SEARCH, "search_k5", &sr.base);
    sq.candidates = 20;
    sq.k = 3;
    seed(sd, SEARCH, "search_candidates", &sr.base);
    int64_t labels[3] = {0, 7, 999};
    Tessera__V1__ShardReadRequest rr = TESSERA__V1__SHARD_READ_REQUEST__INIT;
    rr.version = 1;
    rr.labels = labels;
    rr.n_labels = 3;
    seed(sd, READ, "read", &rr.base);

    Tessera__V1__StagedUpsert ups[4], *upp[4];
    Tessera__V1__IndexDatapoint dps[4];
    char ids[4][16];
    for (size_t i = 0; i < 4; i++) {
        fs_datapoint(100 + i, &ups[i], &dps[i], ids[i], sizeof ids[i]);
        upp[i] = &ups[i];
    }
    Tessera__V1__StagedDelete del = TESSERA__V1__STAGED_DELETE__INIT, *delp = &del;
    del.label = 5;
    del.list = 1;
    Tessera__V1__StageRequest st = TESSERA__V1__STAGE_REQUEST__INIT;
    st.version = 2;
    st.base_version = 1;
    st.upserts = upp;
    st.n_upserts = 4;
    st.deletes = &delp;
    st.n_deletes = 1;
    seed(sd, STAGE, "stage_v2_on_v1", &st.base);
    st.template_faiss.data = fs_tmpl;
    st.template_faiss.len = fs_ntmpl;
    st.base_version = 0;
    seed(sd, STAGE, "stage_v2_overwrite", &st.base);
    Tessera__V1__PrepareRequest pr = TESSERA__V1__PREPARE_REQUEST__INIT;
    pr.version = 2;
    seed(sd, PREPARE, "prepare_v2", &pr.base);
    Tessera__V1__CommitRequest cr = TESSERA__V1__COMMIT_REQUEST__INIT;
    cr.version = 2;
    seed(sd, COMMIT, "commit_v2", &cr.base);
    Tessera__V1__AbortRequest ar = TESSERA__V1__ABORT_REQUEST__INIT;
    ar.version = 2;
    seed(sd, ABORT, "abort_v2", &ar.base);
    Tessera__V1__ReleaseRequest rl = TESSERA__V1__RELEASE_REQUEST__INIT;
    rl.below_version = 2;
    seed(sd, RELEASE, "release_below2", &rl.base);
    Tessera__V1__ShardStatsRequest ss = TESSERA__V1__SHARD_STATS_REQUEST__INIT;
    seed(sd, STATS, "stats", &ss.base);
    Tessera__V1__ShardWriteRequest w = TESSERA__V1__SHARD_WRITE_REQUEST__INIT;
    w.version = 1;
    w.seq = 1;
    w.upserts = upp;
    w.n_upserts = 2;
    w.deletes = &delp;
    w.n_deletes = 1;
    seed(sd, WRITE, "write_seq1", &w.base);
    w.seq = 2;
    w.n_upserts = 0;
    del.label = 100;
    del.list = 0;
    seed(sd, WRITE, "write_seq2_delete", &w.base);
    Tessera__V1__ShardListRequest ls = TESSERA__V1__SHARD_LIST_REQUEST__INIT;
    ls.version = 1;
    seed(sd, LIST, "list_v1", &ls.base);
    ls.start_label = 20;
    ls.limit = 7;
    seed(sd, LIST, "list_v1_page", &ls.base);
    ls.limit = 2000000000; /* a hostile limit: refused before anything is allocated */
    seed(sd, LIST, "list_v1_hostile_limit", &ls.base);
    ls.version = 2;
    ls.limit = 0;
    seed(sd, LIST, "list_v2_not_held", &ls.base);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fs_init();
    const char *sd = getenv("TSR_FUZZ_SEEDS");
    if (sd) {
        write_seeds(sd);
        exit(0);
    }
    dir = fs_open(&S);
    atexit(down);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t mi = data[0] % NM;
    call(mi, data + 1, size - 1);
    if (mi >= STAGE && mi != STATS && mi != LIST) { /* a mutating method: still answers */
        if (call(STATS, NULL, 0) != TSR_RPC_OK)
            abort();
        if (++dirty >= RESET_EVERY) {
            down();
            dir = fs_open(&S);
            dirty = 0;
        }
    }
    return 0;
}
