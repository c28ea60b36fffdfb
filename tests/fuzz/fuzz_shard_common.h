/*
 * fuzz_shard_common — the shard of the fuzz harnesses fuzz_shard_rpc and fuzz_shard_wal
 * (header only, included once per harness): a tsr__shard opened on a temporary data folder
 * holding version 1 (d=8, nlist=4, PQ 4x8 trained on 600 vectors, FS_NREC records, labels
 * 0..FS_NREC-1 in list label % 4), staged, prepared and committed through the shard's own
 * update path (tsr__shard_stage / prepare / commit), as a coordinator makes it (in
 * fuzz_tmp.h's folder: /dev/shm unless TMPDIR is set). And the
 * seed writer: with TSR_FUZZ_SEEDS=<folder> in the environment a harness writes its seed
 * inputs there and exits (tests/fuzz/gen_seeds.sh), so the seeds are made by the real
 * protobuf-c code of the real messages.
 */
#ifndef FUZZ_SHARD_COMMON_H
#define FUZZ_SHARD_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "index/faiss_io.h"

#include "../unit/shard_test_util.h"
#include "fuzz_tmp.h"

#define FS_NREC 48

static uint8_t *fs_tmpl;
static size_t fs_ntmpl;
static float *fs_x;

/* The template and the vectors; once per process. */
static void fs_init(void)
{
    setenv("TSR_LOG_LEVEL", "error", 0); /* the harness prints only what fails */
    fuzz_tmp_default();
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = tu_index();
    if (!ix || tsr_faiss_write_mem(ix, &fs_tmpl, &fs_ntmpl, &err) != 0)
        abort();
    tsr_ivfpq_destroy(ix);
    fs_x = tu_data(FS_NREC, 5);
}

/* The datapoint of label i (a record of version 1), into caller storage. */
static void fs_datapoint(size_t i, Tessera__V1__StagedUpsert *u, Tessera__V1__IndexDatapoint *dp,
                         char *id, size_t idcap)
{
    tessera__v1__staged_upsert__init(u);
    tessera__v1__index_datapoint__init(dp);
    snprintf(id, idcap, "id%zu", i);
    dp->datapoint_id = id;
    dp->feature_vector = fs_x + (i % FS_NREC) * TD;
    dp->n_feature_vector = TD;
    u->label = (int64_t)i;
    u->list = (int32_t)(i % TNLIST);
    u->datapoint = dp;
}

/* Opens s on a new temporary folder (returned; caller frees) holding version 1. Aborts on
 * failure. */
static char *fs_open(tsr__shard *s)
{
    tsr_error err = TSR_ERROR_INIT;
    char *dir = fuzz_tmpdir("tsr-fuzz-shard");
    if (!dir || tsr__shard_open(s, dir, &err) != 0) {
        fprintf(stderr, "fuzz shard: open: %s\n", err.msg);
        abort();
    }
    Tessera__V1__StageRequest rq = TESSERA__V1__STAGE_REQUEST__INIT;
    Tessera__V1__StagedUpsert ups[FS_NREC], *upp[FS_NREC];
    Tessera__V1__IndexDatapoint dps[FS_NREC];
    char ids[FS_NREC][16];
    rq.version = 1;
    rq.template_faiss.data = fs_tmpl;
    rq.template_faiss.len = fs_ntmpl;
    for (size_t i = 0; i < FS_NREC; i++) {
        fs_datapoint(i, &ups[i], &dps[i], ids[i], sizeof ids[i]);
        upp[i] = &ups[i];
    }
    rq.upserts = upp;
    rq.n_upserts = FS_NREC;
    Tessera__V1__StageResponse sr = TESSERA__V1__STAGE_RESPONSE__INIT;
    Tessera__V1__PrepareResponse pr = TESSERA__V1__PREPARE_RESPONSE__INIT;
    if (tsr__shard_stage(s, &rq, &sr, &err) != 0 || tsr__shard_prepare(s, 0, 1, 0, &pr, &err) != 0 ||
        !pr.ready || tsr__shard_commit(s, 0, 1, &err) != 0) {
        fprintf(stderr, "fuzz shard: version 1: %s\n", err.msg);
        abort();
    }
    return dir;
}

/* Writes one seed file dir/name. */
static void fs_seed(const char *dir, const char *name, const void *b, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(b, 1, n, f) != n)) {
        perror(p);
        exit(1);
    }
    fclose(f);
}

/* Packs m after the prefix byte `first` (a method selector) when first >= 0. */
static uint8_t *fs_pack(int first, const ProtobufCMessage *m, size_t *n)
{
    size_t k = first >= 0 ? 1 : 0;
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *b = tsr_xmalloc(len + k + 1);
    if (k)
        b[0] = (uint8_t)first;
    protobuf_c_message_pack(m, b + k);
    *n = len + k;
    return b;
}

#endif
