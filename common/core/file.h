/*
 * file — whole-file reads and durable writes, with every guard in one place.
 *
 * Reading: tsr_file_read loads a whole regular file into memory. The caller states the
 * largest size it accepts (a manifest, a PEM file, an id map, a slice's metadata), and
 * the size is checked against it before any allocation, so a wrong path or a hostile file
 * costs an error, not the machine's memory. The file is opened non-blocking and must be a
 * regular file: a FIFO given by mistake is refused at once instead of blocking the caller
 * for ever waiting for a writer, and a directory or device is refused with a message that
 * says so. Reads are retried on EINTR and on short counts.
 *
 * Writing: tsr_file_write_all + tsr_file_fsync + tsr_file_fsync_dir are the steps of a
 * durable write (each retried on EINTR, errors name the path); tsr_file_write_sync creates
 * or truncates a file with given contents and fsyncs it; tsr_file_replace writes a temp
 * file, fsyncs it, renames it over the target and fsyncs the directory, so a reader sees
 * the old contents or the new, never a mix, and the new survives a crash once it returns.
 * A tsr_file_writer writes a durable file in sequence through a fixed buffer, and
 * tsr_file_replace_by replaces a file with what a writer wrote.
 *
 * Errors: TSR_ELIMIT above the caller's limit, TSR_ENOMEM, TSR_EIO for the rest (a missing
 * file included, unless the caller asks for TSR_ENOTFOUND: a store tells "no such record"
 * from "cannot read it"); every message starts with the path.
 */
#ifndef TSR_FILE_H
#define TSR_FILE_H

#include <stddef.h>

#include "core/error.h"

/* flags of tsr_file_read */
#define TSR_FILE_NOTFOUND 1u /* a missing file is TSR_ENOTFOUND (default: TSR_EIO) */

/* Reads the whole regular file at path, of at most max bytes, into a new buffer (caller
 * frees) with a NUL after the last byte (not counted in *len), so text can be parsed as a
 * string. A file that shrinks while being read yields what was there; one that grows,
 * its first st_size bytes (the size checked against max). On error *out is NULL. */
int tsr_file_read(const char *path, size_t max, unsigned flags, char **out, size_t *len,
                  tsr_error *err);

/* Writes all n bytes of buf to fd (EINTR and short writes retried); path names fd in
 * errors. */
int tsr_file_write_all(int fd, const void *buf, size_t n, const char *path, tsr_error *err);

/* fsync(fd), retried on EINTR. */
int tsr_file_fsync(int fd, const char *path, tsr_error *err);

/* Opens the directory dir and fsyncs it (makes a rename or a create in it durable). */
int tsr_file_fsync_dir(const char *dir, tsr_error *err);

/* Creates or truncates path (mode 0644), writes n bytes of buf, fsyncs and closes it. The
 * directory entry is not fsynced (callers that publish by a rename fsync the directory). */
int tsr_file_write_sync(const char *path, const void *buf, size_t n, tsr_error *err);

/* Durable replace: writes buf to tmp (created or truncated), fsyncs, closes, renames tmp
 * to path and fsyncs dir, the directory holding both. On failure before the rename, tmp
 * is removed and path is untouched. */
int tsr_file_replace(const char *path, const char *tmp, const char *dir, const void *buf,
                     size_t n, tsr_error *err);

/* A durable file written in sequence through a fixed buffer, for files too big to build
 * in memory first (a version's vectors.f32: ~70 MB per shard at 1M x 64): open creates or
 * truncates path; add appends (the buffer written out whenever it fills); close writes the
 * rest, fsyncs and closes, like tsr_file_write_sync; every open writer ends in close or
 * abort. After an error the writer only remembers it: later adds do nothing and close
 * returns it (and closes the fd). The file is left as it is on error: the caller's
 * transaction removes its directory. */
typedef struct tsr_file_writer {
    int fd;          /* -1 once closed */
    char *buf;
    size_t len, cap;
    int rc;          /* the first error, 0 = none */
    char path[4096];
} tsr_file_writer;

int tsr_file_writer_open(tsr_file_writer *w, const char *path, size_t bufsize, tsr_error *err);
int tsr_file_writer_add(tsr_file_writer *w, const void *p, size_t n, tsr_error *err);
int tsr_file_writer_close(tsr_file_writer *w, tsr_error *err);
/* Closes without writing the rest or syncing (a failed build); a closed writer is left. */
void tsr_file_writer_abort(tsr_file_writer *w);

/* Durable replace by a writer, for contents produced in sequence (an index file, an id
 * map): write(ctx, w, err) adds them to a writer (buffer bufsize) on path + ".tmp", which
 * is then fsynced, renamed over path and its directory fsynced, as tsr_file_replace does.
 * On any failure the temp file is removed and path is untouched; returns 0 or the first
 * error (write's own, TSR_ENOMEM or TSR_EIO). */
int tsr_file_replace_by(const char *path, size_t bufsize,
                        int (*write)(void *ctx, tsr_file_writer *w, tsr_error *err), void *ctx,
                        tsr_error *err);

#endif
