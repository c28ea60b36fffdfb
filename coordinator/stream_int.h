/*
 * stream_int — what the files of the stream subsystem share (stream.c: the overlay and the
 * version log; stream_write.c: the queue and the writer; stream_recover.c: catch-up and
 * the log's replay). Not for other subsystems: they use stream.h.
 */
#ifndef TSR_COORD_STREAM_INT_H
#define TSR_COORD_STREAM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "tessera/v1/coord_log.pb-c.h"

/* ---- stream.c: the state of streamed writes (docs/streaming.md) --------------------- */
struct tsr__sreq;
struct tsr__stream {
    pthread_mutex_t mu;         /* the stream lock: held by a round (writer thread), by an
                                   update from its plan through its Commit fan-out, by a
                                   reshard move for its plan and Stage chunk 0, then from
                                   its catch-up through its Commit fan-out (not while it
                                   reads, stages and prepares), by a catch-up (reconcile) */
    /* under mu */
    int64_t next_label;         /* the label counter (the snapshot's plus the stream's) */
    int64_t next_seq;           /* the seq of the next round (> every seq ever logged) */
    int64_t *grp_seq;           /* owned; nshards: the last seq logged for each group */
    uint64_t log_version;       /* version of the open log file (0: none) */
    int log_fd;                 /* -1: none */
    int64_t log_bytes;          /* its size */
    /* the overlay: written under mu and ov_rw (write), read under ov_rw (read) */
    pthread_rwlock_t ov_rw;
    tsr__dir ov;                /* id -> entry or tombstone, on top of the snapshot's dir */
    uint64_t ov_version;        /* the version it applies on */
    int64_t ov_records;         /* streamed writes since that version (fold threshold) */
    int64_t d_dense, d_sparse;  /* change of the snapshot's counts */
    size_t *touched;            /* owned; the index in ov of the entry each write set, in
                                   order (a fold's catch-up re-applies the ones after its
                                   mark: tsr__stream_overlay_finish) */
    size_t ntouched, ctouched;
    /* the queue of requests: under q_mu */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv, done_cv;
    struct tsr__sreq *head, *tail;
    int stop, started;
    pthread_t thread;
};

/* The entry of id now: the overlay's (a tombstone = none), else the snapshot's. Caller
 * holds st.mu or st.ov_rw. */
const tsr__dir_entry *tsr__stream_lookup(const tsr__coord *c, const tsr__snap *sn, const char *id);

/* Sets id's overlay entry (the writer, under st.mu; takes ov_rw) and the counts. */
void tsr__stream_ov_apply(tsr__coord *c, const tsr__snap *sn, const char *id, int64_t label,
                          int32_t list, int32_t shard, int dense, int sparse, int dead);

/* The overlay after one logged round (the live round and the replay at start share it). */
void tsr__stream_apply_record(tsr__coord *c, const tsr__snap *sn,
                              const Tessera__V1__CoordLogRecord *rec);

/* A header for the log of version: the stream's counters now, the first n group seqs
 * replaced by seqs[] when given (a catch-up's: the new version's). */
int tsr__stream_write_header(tsr__coord *c, uint64_t version, int64_t next_label,
                             const int64_t *seqs, size_t n, tsr_error *err);

#endif
