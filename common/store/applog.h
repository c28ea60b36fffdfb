/*
 * applog — an append-only log of CRC-framed records in one file: the framing, the append
 * (one record at a time, cut back on failure), the sync and the start-up scan that finds
 * where the good prefix ends. The shard's write-ahead log (shard/stream.c, DATA/wal/) and
 * the coordinator's stream log (coordinator/stream_log.c, DATA/stream/) are both such
 * logs; what their records hold, how their files are named and when one is replaced is
 * theirs.
 *
 * Format: records back to back, each `u32 len | u32 crc | payload[len]` (little endian;
 * crc = tsr_store_crc32 of the payload, the zlib polynomial), nothing before the first or
 * after the last. An empty file is an empty log.
 *
 * Crash model: a record goes to the file with one write() (writev of header and payload);
 * a crash may leave a prefix of it (a torn tail), and a disk may hand back changed bytes.
 * A scan stops at the first record that does not check — a header cut short, a length
 * above the log's limit or past the end of the file (both checked before anything of that
 * size is allocated), a CRC mismatch, or a payload the caller refuses — and reports the
 * offset where the good prefix ends and why, so the caller drops the tail (nothing after a
 * bad record is applied: never half a write). With TSR_APPLOG_CUT the scan truncates the
 * tail itself (ftruncate + fsync, one warning line naming file, offset and why).
 *
 * Ownership and threads: a tsr_applog is a plain value (fd, path, size) owned by one
 * caller, who serializes open / append / close with its own lock; the log keeps no lock.
 * The one call that may run outside the owner's lock is tsr_applog_sync_fd on an fd copied
 * under it (group commit: appends go on while one thread syncs), as long as the owner does
 * not close that fd meanwhile. A scan opens the file by path on its own fd; scanning a log
 * that is being appended to sees the records complete when it reads them.
 */
#ifndef TSR_APPLOG_H
#define TSR_APPLOG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define TSR_APPLOG_HDR 8u             /* u32 len | u32 crc */
#define TSR_APPLOG_PATH_MAX 4096

/* flags */
#define TSR_APPLOG_CREATE 1u /* open: create the file when missing (default: TSR_ENOTFOUND) */
#define TSR_APPLOG_SYNC 2u   /* append: fdatasync before returning (cut back if it fails) */
#define TSR_APPLOG_CUT 4u    /* scan: truncate a bad tail (ftruncate + fsync, logged) */

typedef struct tsr_applog {
    int fd;                          /* -1 = closed */
    uint32_t max_record;             /* longest payload append accepts */
    uint64_t size;                   /* bytes of whole records: the file's size */
    char path[TSR_APPLOG_PATH_MAX];  /* names the file in every message */
} tsr_applog;

/* Opens the log at path for appending (O_APPEND; flags: TSR_APPLOG_CREATE), l->size = the
 * file's size. The file is not scanned: the caller scans first (or created it). Payloads
 * above max_record bytes are refused by append. TSR_ENOTFOUND (missing, no CREATE),
 * TSR_EINVAL (path too long), TSR_EIO; l->fd is -1 after a failure. */
int tsr_applog_open(tsr_applog *l, const char *path, uint32_t max_record, unsigned flags,
                    tsr_error *err);
/* Closes the fd (accepts a closed log); l->path and l->size stay. */
void tsr_applog_close(tsr_applog *l);

/* Appends one record of payload p[0..n) (flags: TSR_APPLOG_SYNC) and grows l->size. On any
 * failure the file is cut back to l->size, so the next append starts on a record boundary:
 * TSR_EIO, TSR_ELIMIT (n above max_record: nothing written), TSR_ESTATE (not open, or the
 * cut failed too: the log must not be appended to again; logged). */
int tsr_applog_append(tsr_applog *l, const void *p, size_t n, unsigned flags, tsr_error *err);
/* The same on a caller's fd: path names it in messages, *size is its size (grows). */
int tsr_applog_append_fd(int fd, const char *path, uint64_t *size, uint32_t max_record,
                         const void *p, size_t n, unsigned flags, tsr_error *err);
/* Cuts the log on fd back to size bytes (a record boundary the caller knows: a round it
 * must take back), durably (ftruncate + fsync). TSR_EIO naming path. */
int tsr_applog_cut_fd(int fd, const char *path, uint64_t size, tsr_error *err);
/* fdatasync (enough for an append: the size is metadata needed to read the data). */
int tsr_applog_sync(tsr_applog *l, tsr_error *err);
int tsr_applog_sync_fd(int fd, const char *path, tsr_error *err);

/* Creates (replaces) the log at path holding the one record p[0..n), durably: written to
 * tmp, fsynced, renamed over path, dir (the directory of both) fsynced. */
int tsr_applog_create(const char *path, const char *tmp, const char *dir, const void *p,
                      size_t n, tsr_error *err);

/* The record callback of a scan: rec[0..len) is a payload whose CRC checked, off the
 * offset of its header. Returns 0 (go on), TSR_APPLOG_STOP (stop after this record: it
 * counts as good), TSR_ENOMEM or TSR_EIO (the scan fails with that error, prefixed with
 * file and offset), or any other error code: the record is refused (err's message says
 * why) and the good prefix ends before it. */
#define TSR_APPLOG_STOP 1
typedef int (*tsr_applog_fn)(void *ud, const uint8_t *rec, size_t len, uint64_t off,
                             tsr_error *err);

typedef struct tsr_applog_scan {
    uint64_t nrec;  /* records given to fn (the stopping one included) */
    uint64_t good;  /* end of the good prefix (start when nothing checked) */
    uint64_t size;  /* the file's size when the scan began */
    char why[256];  /* "" (clean, or stopped by fn), or "offset N: what is wrong there" */
} tsr_applog_scan;

/* Calls fn for each good record of the log at path, in order, from byte start (0 or the
 * end of a record; a start past the end of the file scans from 0: the file was replaced
 * since the offset was taken). Payloads above max_record are corrupt. flags:
 * TSR_APPLOG_CUT. *res is filled in every case. Returns 0 (also for a bad tail: see
 * res->why), TSR_ENOTFOUND (no file), TSR_EIO, TSR_ENOMEM, or fn's hard error. */
int tsr_applog_scan_file(const char *path, uint64_t start, uint32_t max_record,
                         unsigned flags, tsr_applog_fn fn, void *ud, tsr_applog_scan *res,
                         tsr_error *err);

#endif
