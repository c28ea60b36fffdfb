/*
 * fuzz_coord_stream_log — the coordinator's log of streamed writes (coordinator/stream_log.c
 * on common/store/applog.c: framing and scan, stream.c's replay into the overlay) read at start-up from random bytes:
 * the input is written as DATA/stream/v000001.log of the coordinator of fuzz_coord_common.h
 * and tsr__stream_init replays it (cutting a torn or corrupt tail).
 *
 * Checks: no crash (ASan/UBSan); start-up either succeeds or fails with an error (never
 * half-applies): when it succeeds, a second start-up on the file as the first one left it
 * gives the same state (next seq, label counter, per-group seqs, overlay size, log size), so
 * what was kept is exactly what was applied and a cut tail stays cut.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_coord_common.h"
#include "stream_int.h"

static tsr__coord C;

typedef struct {
    int64_t next_seq, next_label, log_bytes, ov_records;
    size_t ov_n;
    int64_t grp[8];
} st_sum;

static void sum(const tsr__coord *c, st_sum *s)
{
    memset(s, 0, sizeof *s);
    s->next_seq = c->st->next_seq;
    s->next_label = c->st->next_label;
    s->log_bytes = c->st->log_bytes;
    s->ov_records = c->st->ov_records;
    s->ov_n = c->st->ov.n;
    for (size_t g = 0; g < c->cfg.nshards && g < 8; g++)
        s->grp[g] = c->st->grp_seq[g];
}

/* A start-up of the stream from the log: tsr__stream_init creates the state anew (close
 * freed the last one), as for a new coordinator (main.c). */
static int start(tsr_error *err)
{
    return tsr__stream_init(&C, err);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fc_init();
    fc_open(&C);
    tsr__stream_close(&C);
    atexit(fc_rmdir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[700];
    tsr__slog_path(C.store, 1, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    tsr_error err = TSR_ERROR_INIT;
    if (start(&err) != 0) {
        tsr__stream_close(&C);
        return 0;
    }
    st_sum a, b;
    sum(&C, &a);
    tsr__stream_close(&C);
    if (start(&err) != 0) {
        fprintf(stderr, "second start-up failed: %s\n", err.msg);
        abort();
    }
    sum(&C, &b);
    tsr__stream_close(&C);
    if (memcmp(&a, &b, sizeof a) != 0) {
        fprintf(stderr, "replay differs: seq %lld/%lld label %lld/%lld bytes %lld/%lld "
                "overlay %zu/%zu records %lld/%lld group seqs %lld,%lld/%lld,%lld\n",
                (long long)a.next_seq, (long long)b.next_seq, (long long)a.next_label,
                (long long)b.next_label, (long long)a.log_bytes, (long long)b.log_bytes, a.ov_n,
                b.ov_n, (long long)a.ov_records, (long long)b.ov_records, (long long)a.grp[0],
                (long long)a.grp[1], (long long)b.grp[0], (long long)b.grp[1]);
        abort();
    }
    return 0;
}
