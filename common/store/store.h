/*
 * store — versioned data directories with an atomic commit (DESIGN "Storage").
 *
 * A data dir holds `CURRENT` (one line: the served version's name, e.g. "v000042"), one
 * directory per complete version (`v000042/`, files plus a `MANIFEST` of names, sizes and
 * CRC-32 checksums), and `LOCK` (flock'ed while a process has the store open). A version is
 * written as `.tmp-v000042/`, every file fsynced, the MANIFEST written and fsynced, the
 * directory fsynced, then renamed to `v000042/` and the data dir fsynced; `CURRENT` is
 * replaced by writing `CURRENT.tmp`, fsync, rename, fsync of the data dir. So a crash at
 * any point leaves CURRENT naming a complete, verifiable version (the old one until the
 * rename of CURRENT, the new one after). Leftover `.tmp-*` entries are removed on open.
 * The argument step by step is in docs/storage.md.
 *
 * Write errors (ENOSPC, EIO, EDQUOT, EFBIG) come back as TSR_EIO with the file name and
 * strerror; nothing that exists already is modified before the final renames, so the old
 * version stays intact and servable.
 *
 * Threads: one tsr_store is used by one thread at a time for writes (begin / commit /
 * set_current / remove); the read-only calls (current, list, verify, path, read_file) may
 * run concurrently with each other and with a write transaction.
 */
#ifndef TSR_STORE_H
#define TSR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct tsr_store tsr_store;
typedef struct tsr_store_txn tsr_store_txn;
typedef struct tsr_store_file tsr_store_file;

#define TSR_STORE_NAME_MAX 128 /* longest file name inside a version */

/* Opens the data dir (creating it and missing parents), takes its LOCK (TSR_ESTATE when
 * another process holds it) and removes leftover `.tmp-*` entries and `CURRENT.tmp`.
 * *out is a new store, caller destroys. */
int tsr_store_create(const char *dir, tsr_store **out, tsr_error *err);
void tsr_store_destroy(tsr_store *s); /* accepts NULL; releases the lock */
const char *tsr_store_dir(const tsr_store *s);

/* "v000042" for 42 into buf (at least 24 bytes). */
void tsr_store_version_name(uint64_t version, char *buf, size_t cap);

/* The version CURRENT names into *version. TSR_ENOTFOUND when there is no CURRENT (a new
 * store), TSR_EFORMAT when its content is not a version name, TSR_EIO. */
int tsr_store_current(const tsr_store *s, uint64_t *version, tsr_error *err);
/* Atomically points CURRENT at version, which must be a committed directory
 * (TSR_ENOTFOUND otherwise). Durable when it returns 0. */
int tsr_store_set_current(tsr_store *s, uint64_t version, tsr_error *err);

/* Committed versions (vNNNNNN directories), ascending, into *versions (caller frees;
 * NULL when *n == 0). */
int tsr_store_list(const tsr_store *s, uint64_t **versions, size_t *n, tsr_error *err);

/* Checks a committed version against its MANIFEST: the manifest's own checksum, every
 * listed file present with the listed size and checksum, no unlisted file. TSR_EFORMAT
 * with a message naming the file and what mismatched (size or checksum), TSR_ENOTFOUND. */
int tsr_store_verify(const tsr_store *s, uint64_t version, tsr_error *err);

/* Removes a committed version (crash-safe: renamed to a `.tmp-` name first). TSR_ESTATE
 * for the version CURRENT names, TSR_ENOTFOUND. */
int tsr_store_remove(tsr_store *s, uint64_t version, tsr_error *err);

/* "<dir>/v000042/<name>" (name NULL: the version directory) into buf; TSR_ELIMIT when it
 * does not fit. */
int tsr_store_path(const tsr_store *s, uint64_t version, const char *name, char *buf,
                   size_t cap, tsr_error *err);

/* Reads a whole file of a committed version into *buf (caller frees; NUL-terminated for
 * convenience, *len excludes the NUL). TSR_ELIMIT when larger than max_len. */
int tsr_store_read_file(const tsr_store *s, uint64_t version, const char *name,
                        size_t max_len, void **buf, size_t *len, tsr_error *err);

/* ---- records beside the versions -------------------------------------------------------
 * Small files in one sub-directory of the data dir (e.g. "operations"), outside every
 * version: written whole and atomically (`.tmp-NAME`, fsync, rename, fsync of the
 * sub-directory), so a reader sees the old record or the new one, never a part. sub and name
 * are plain names (letters, digits, '.', '_', '-'; no leading '.'). Used by one thread at a
 * time per sub-directory. */

/* Writes sub/name (creating sub when missing). */
int tsr_store_aux_write(tsr_store *s, const char *sub, const char *name, const void *buf,
                        size_t len, tsr_error *err);

/* The names in sub (a missing sub is empty), sorted; leftover `.tmp-*` files are removed.
 * *names is a new array of new strings (caller frees each and the array). */
int tsr_store_aux_list(tsr_store *s, const char *sub, char ***names, size_t *n,
                       tsr_error *err);

/* Reads sub/name whole (as tsr_store_read_file: NUL-terminated, TSR_ELIMIT over max_len,
 * TSR_ENOTFOUND when missing). */
int tsr_store_aux_read(const tsr_store *s, const char *sub, const char *name, size_t max_len,
                       void **buf, size_t *len, tsr_error *err);

/* Removes sub/name; a missing file is not an error. */
int tsr_store_aux_remove(tsr_store *s, const char *sub, const char *name, tsr_error *err);

/* ---- writing a version ------------------------------------------------------------------- */

/* Starts version `version` in `.tmp-vNNNNNN/` (replacing a stale one). TSR_ESTATE when the
 * version is already committed or another transaction is open on s. *out is a new
 * transaction, consumed by tsr_store_commit or tsr_store_abort. */
int tsr_store_begin(tsr_store *s, uint64_t version, tsr_store_txn **out, tsr_error *err);

/* The temporary directory, for writers that take a path (e.g. a Faiss writer). Files
 * placed there by other code are fsynced and checksummed by tsr_store_commit. */
const char *tsr_store_txn_dir(const tsr_store_txn *t);

/* Writes buf[0..len) as file `name` ([A-Za-z0-9._-], not starting with '.', not
 * "MANIFEST") and fsyncs it. TSR_EIO (with file and strerror), TSR_EINVAL (bad name,
 * exists already). */
int tsr_store_txn_write_file(tsr_store_txn *t, const char *name, const void *buf, size_t len,
                             tsr_error *err);

/* Streaming variant: open, write any number of times, close (fsync + record). A file must
 * be closed (or aborted) before commit. */
int tsr_store_file_open(tsr_store_txn *t, const char *name, tsr_store_file **out,
                        tsr_error *err);
int tsr_store_file_write(tsr_store_file *f, const void *buf, size_t len, tsr_error *err);
/* fsyncs and records the file; frees f in every case (on error the file is removed). */
int tsr_store_file_close(tsr_store_file *f, tsr_error *err);
void tsr_store_file_abort(tsr_store_file *f); /* removes the file, frees f; accepts NULL */

/* Writes the MANIFEST, fsyncs everything, renames to `vNNNNNN/`, fsyncs the data dir.
 * Frees t in every case but one; on error the temporary directory is removed. The
 * exception: TSR_ESTATE when a tsr_store_file is still open leaves t alive (the files
 * refer to it): close or abort them, then commit or abort t. Does not touch CURRENT (see
 * tsr_store_set_current). */
int tsr_store_commit(tsr_store_txn *t, tsr_error *err);
/* Removes the temporary directory and frees t; accepts NULL. */
void tsr_store_abort(tsr_store_txn *t);

/* CRC-32 (zlib polynomial) of buf, continuing from crc (start with 0). */
uint32_t tsr_store_crc32(uint32_t crc, const void *buf, size_t len);

#endif
