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
