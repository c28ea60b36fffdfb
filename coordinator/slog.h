/*
 * slog — the coordinator log's files (stream_log.c: framing, append + fsync, scan) and
 * their mirror in etcd (stream_ha.c, --etcd, the leader only). The stream (stream.h) is
 * their only writer; it holds the stream lock around every call that appends.
 * Locks: none of their own (stream_ha.c reads lead.mu, a leaf).
 */
#ifndef TSR_COORD_SLOG_H
#define TSR_COORD_SLOG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "store/store.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* ---- stream_log.c: the coordinator log's files (naming, records; framing in store/applog) ---- */
struct Tessera__V1__CoordLogRecord;
/* DATA/stream and DATA/stream/v<version>.log into buf. */
void tsr__slog_dir(const tsr_store *st, char *buf, size_t cap);
void tsr__slog_path(const tsr_store *st, uint64_t version, char *buf, size_t cap);
/* Creates (replaces) the log of version with its header hdr only, durably (fsync, rename,
 * fsync of DATA/stream). */
int tsr__slog_create(const tsr_store *st, uint64_t version,
                     const struct Tessera__V1__CoordLogRecord *hdr, tsr_error *err);
/* Opens the log of version for appending: *fd and its *size. TSR_ENOTFOUND when missing. */
int tsr__slog_open(const tsr_store *st, uint64_t version, int *fd, int64_t *size,
                   tsr_error *err);
/* Appends rec and fsyncs; *size grows by the record. On failure the file is cut back to
 * *size (what names the file in messages). */
int tsr__slog_append(int fd, const char *what, const struct Tessera__V1__CoordLogRecord *rec,
                     int64_t *size, tsr_error *err);
/* Calls fn(ud, record, offset) for each good record of path in order from byte start (0,
 * or the end of a record: tsr__stream_log_offset; past the end = from 0) (fn returns
 * nonzero to stop). *good: bytes of the good prefix; why: empty, or what is wrong after it
 * (a torn or corrupt tail). Returns 0, TSR_ENOTFOUND (no file) or TSR_EIO. */
typedef int (*tsr__slog_fn)(void *ud, const struct Tessera__V1__CoordLogRecord *rec,
                            int64_t offset);
int tsr__slog_scan(const char *path, int64_t start, tsr__slog_fn fn, void *ud, int64_t *good,
                   char *why, size_t whycap, tsr_error *err);
/* The same, then the bad tail (why not empty) cut off durably (logged): the log's replay
 * at start. */
int tsr__slog_scan_cut(const char *path, tsr__slog_fn fn, void *ud, int64_t *good, char *why,
                       size_t whycap, tsr_error *err);
/* Takes back the records after size (a round etcd refused): the file on fd cut back to
 * size, durably. */
int tsr__slog_cut(int fd, const char *path, int64_t size, tsr_error *err);

/* ---- stream_ha.c: the coordinator log mirrored in etcd (--etcd; the leader only) ---- */
/* mirror: rec into etcd (0 without --etcd or when not leading); drop: version's records;
 * restore: the local log of version rewritten from etcd's records (*found 0: etcd holds
 * none, the local log is untouched). */
int tsr__shlog_mirror(tsr__coord *c, const struct Tessera__V1__CoordLogRecord *rec,
                      tsr_error *err);
/* A round of the stream writer: with --etcd always mirrored (fenced), whether or not this
 * coordinator still believes it leads — a leader that stepped down by its own clock while
 * rounds were queued used to skip the mirror (a follower's rule) and acknowledge them
 * (tests/chaos, seed 1: seqs reused by the successor). The fence refuses it when another
 * coordinator holds the leader key. */
int tsr__shlog_mirror_round(tsr__coord *c, const struct Tessera__V1__CoordLogRecord *rec,
                            tsr_error *err);
void tsr__shlog_drop(tsr__coord *c, uint64_t version);
int tsr__shlog_restore(tsr__coord *c, uint64_t version, int *found, tsr_error *err);

#endif
