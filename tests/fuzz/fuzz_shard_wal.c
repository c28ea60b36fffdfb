/*
 * fuzz_shard_wal — the shard's write-ahead log of streamed writes (shard/wal.c framing,
 * stream.c's replay into the version's delta) read at start-up from random bytes: the input
 * is written as DATA/wal/v1.log of fuzz_shard_common.h's data folder (version 1, 48
 * records) and tsr__shard_open replays it (a torn or corrupt tail, a record that does not
 * parse or validate, is logged and cut off).
 *
 * Checks: no crash (ASan/UBSan); when the open succeeds, a second open on the log as the
 * first left it gives the same state (applied seq, delta records and deletes, log size):
 * what was kept is exactly what was applied (never half a write) and a cut tail stays cut;
 * the current version is still 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_shard_common.h"

static char *dir;

typedef struct {
    int64_t seq;
    size_t nrecs, ndeletes;
    uint64_t wal_size;
} wsum;

static int open_sum(wsum *w)
{
    tsr__shard s;
    tsr_error err = TSR_ERROR_INIT;
    memset(w, 0, sizeof *w);
    if (tsr__shard_open(&s, dir, &err) != 0) {
        tsr__shard_close(&s);
        return -1;
    }
    tsr__delta *d = NULL;
    tsr__version *v = tsr__shard_get_view(&s, 0, &d);
    if (!v || v->version != 1) {
        fprintf(stderr, "the current version is not 1 after the replay\n");
        abort();
    }
    w->seq = tsr__applied_seq(v, d);
    w->nrecs = d ? d->nrecs : 0;
    w->ndeletes = d ? d->ndeletes : 0;
    w->wal_size = s.wal.size;
    tsr__delta_unref(d);
    tsr__version_unref(v);
    tsr__shard_close(&s);
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
    atexit(down);
    return 0;
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
    if (open_sum(&a) != 0)
        return 0;
    if (open_sum(&b) != 0) {
        fprintf(stderr, "the second open failed\n");
        abort();
    }
    if (memcmp(&a, &b, sizeof a) != 0) {
        fprintf(stderr, "replay differs: seq %lld/%lld recs %zu/%zu dels %zu/%zu size %llu/%llu\n",
                (long long)a.seq, (long long)b.seq, a.nrecs, b.nrecs, a.ndeletes, b.ndeletes,
                (unsigned long long)a.wal_size, (unsigned long long)b.wal_size);
        abort();
    }
    return 0;
}
