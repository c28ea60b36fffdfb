/*
 * fuzz_shard_wal — the shard's write-ahead log of streamed writes (common/store/applog.c
 * framing and scan, stream.c's replay into the version's delta) read at start-up from random
 * bytes: the input is written as DATA/wal/v1.log of fuzz_shard_common.h's data folder
 * (version 1, 48 records) and replayed into version 1 by tsr__stream_replay_fresh: the code
 * of the start-up replay (tsr_applog_scan_file with stream.c's record callback: unpack,
 * validation, seq, tsr__delta_apply; a torn or corrupt tail, a record that does not parse
 * or validate, is logged and cut off with ftruncate + fsync) on a version without delta, as
 * one just loaded.
 *
 * Cost: the version is loaded once per process (tsr__shard_open of the committed version 1
 * in LLVMFuzzerInitialize: MANIFEST, template, lists, records) and kept; each input only
 * writes the file and replays it twice, and frees the delta it made (no LeakSanitizer rerun).
 * Measured side by side on the loaded 2-core machine (docs/reliability.md "Fuzzing"): 34
 * exec/s with the two whole shard opens per input this harness made before (version load,
 * WAL scan, replay, truncation, fsync), 1,917 with the version kept (56x), about 1.5x more
 * with the delta freed. What an input no longer runs: the load of the version (fuzz_manifest and
 * fuzz_faiss_io cover its files), remove_other_logs and opening the log for appending.
 *
 * Checks: no crash (ASan/UBSan); when the replay succeeds, a second replay on the log as
 * the first left it, into a fresh delta again, gives the same state (applied seq, delta
 * records and deletes, log size, and the file's size on disk is that size): what was kept
 * is exactly what was applied (never half a write) and a cut tail stays cut.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_shard_common.h"

static char *dir;
static tsr__shard S; /* open on dir (version 1) for the whole process */
static int S_open;

typedef struct {
    int64_t seq;
    size_t nrecs, ndeletes;
    uint64_t wal_size;
} wsum;

/* Replays the log at p into version 1 (a fresh delta) and sums the state up. */
static int replay_sum(const char *p, wsum *w)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr__version *v = S.current;
    uint64_t nrec = 0;
    memset(w, 0, sizeof *w);
    if (!v || v->version != 1) {
        fprintf(stderr, "the current version is not 1\n");
        abort();
    }
    if (tsr__stream_replay_fresh(v, p, &nrec, &w->wal_size, &err) != 0)
        return -1;
    w->seq = tsr__applied_seq(v, v->delta);
    w->nrecs = v->delta ? v->delta->nrecs : 0;
    w->ndeletes = v->delta ? v->delta->ndeletes : 0;
    struct stat st;
    if (stat(p, &st) != 0 || (uint64_t)st.st_size != w->wal_size) {
        fprintf(stderr, "the log is not cut where the replay stopped (%llu bytes)\n",
                (unsigned long long)w->wal_size);
        abort();
    }
    return 0;
}

static void wal_file(char *p, size_t cap)
{
    snprintf(p, cap, "%s/wal/v1.log", dir);
}

/* Valid logs: one record, three records, three records then a torn fourth. */
static void write_seeds(const char *sd)
{
    uint8_t log[8192];
    size_t off = 0;
    Tessera__V1__StagedUpsert ups[3], *upp[3];
    Tessera__V1__IndexDatapoint dps[3];
    char ids[3][16];
    for (int r = 0; r < 4; r++) {
        for (size_t i = 0; i < 3; i++) {
            fs_datapoint(200 + (size_t)r * 3 + i, &ups[i], &dps[i], ids[i], sizeof ids[i]);
            upp[i] = &ups[i];
        }
        Tessera__V1__StagedDelete del = TESSERA__V1__STAGED_DELETE__INIT, *delp = &del;
        del.label = r;
        del.list = r % TNLIST;
        Tessera__V1__ShardWriteRequest w = TESSERA__V1__SHARD_WRITE_REQUEST__INIT;
        w.version = 1;
        w.seq = r + 1;
        w.upserts = upp;
        w.n_upserts = 3;
        w.deletes = &delp;
        w.n_deletes = 1;
        size_t n;
        uint8_t *b = fs_pack(-1, &w.base, &n);
        uint32_t hdr[2] = {(uint32_t)n, tsr_store_crc32(0, b, n)};
        if (off + 8 + n > sizeof log)
            abort();
        memcpy(log + off, hdr, 8);
        memcpy(log + off + 8, b, n);
        free(b);
        if (r == 3) { /* torn: half of the fourth */
            fs_seed(sd, "three_and_torn", log, off + (8 + n) / 2);
            break;
        }
        off += 8 + n;
        if (r == 0)
            fs_seed(sd, "one_record", log, off);
        if (r == 2)
            fs_seed(sd, "three_records", log, off);
    }
}

static void down(void)
{
    if (S_open)
        tsr__shard_close(&S);
    S_open = 0;
    if (dir)
        tu_rmtree(dir);
    free(dir);
    dir = NULL;
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
    tsr__shard s;
    dir = fs_open(&s);
    tsr__shard_close(&s);
    /* the committed version 1 loaded as at start-up (an empty log), once */
    tsr_error err = TSR_ERROR_INIT;
    if (tsr__shard_open(&S, dir, &err) != 0) {
        fprintf(stderr, "fuzz shard wal: open: %s\n", err.msg);
        abort();
    }
    S_open = 1;
    tsr__stream_close(&S); /* the harness writes the log; the shard never appends */
    atexit(down);
    return 0;
}

/* Drops version 1's delta and tags (the next input's replay would): every input frees
 * what it made, so libFuzzer's malloc/free balance holds and it does not rerun each input
 * with a LeakSanitizer scan of the whole heap (-detect_leaks). */
static void release(void)
{
    tsr__delta_unref(S.current->delta);
    S.current->delta = NULL;
    tsr_filter_dict_destroy(S.current->dtags);
    S.current->dtags = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char p[4200];
    wal_file(p, sizeof p);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size))
        abort();
    fclose(f);
    wsum a, b;
    if (replay_sum(p, &a) != 0) {
        release();
        return 0;
    }
    if (replay_sum(p, &b) != 0) {
        fprintf(stderr, "the second replay failed\n");
        abort();
    }
    release();
    if (memcmp(&a, &b, sizeof a) != 0) {
        fprintf(stderr, "replay differs: seq %lld/%lld recs %zu/%zu dels %zu/%zu size %llu/%llu\n",
                (long long)a.seq, (long long)b.seq, a.nrecs, b.nrecs, a.ndeletes, b.ndeletes,
                (unsigned long long)a.wal_size, (unsigned long long)b.wal_size);
        abort();
    }
    return 0;
}
