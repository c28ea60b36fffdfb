/*
 * faiss_io — read and write Faiss IndexIVFPQ ("IwPQ") and IndexIVFPQR ("IwQR") files
 * into / from the in-memory tsr_ivfpq, in the exact byte layout of SPEC §1 (Faiss
 * 1.6.2 … 1.15), so that reading a Faiss file and writing it back is byte-identical.
 *
 * Supported: quantizers IxF2 / IxFI, direct maps NoMap / Array / Hashtable (hashtable
 * pairs kept in file order), by_residual 0/1, "ilar" inverted lists stored "full" or
 * "sprs" (the writer picks like Faiss: "full" when more than nlist/2 lists are non-empty),
 * METRIC_L2 and METRIC_INNER_PRODUCT. Anything else is an error naming the fourcc/field.
 *
 * Files are hostile: the reader loads the whole file, parses it with a bounds-checked
 * cursor, checks every count against the bytes that remain before allocating, and
 * every error message says "offset N: field: what was expected".
 */
#ifndef TSR_FAISS_IO_H
#define TSR_FAISS_IO_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/file.h"
#include "index/ivfpq.h"

/* Parses buf[0..len) (borrowed). On success *out is a new index, caller destroys.
 * Returns 0 or TSR_EFORMAT / TSR_EUNSUPPORTED / TSR_ENOMEM with err set. */
int tsr_faiss_read_mem(const uint8_t *buf, size_t len, tsr_ivfpq **out, tsr_error *err);

/* Reads the file at path whole and parses it; as tsr_faiss_read_mem (+ TSR_EIO). */
int tsr_faiss_read_file(const char *path, tsr_ivfpq **out, tsr_error *err);

/* Serializes ix (borrowed) into a new buffer *buf of *len bytes; caller frees *buf. */
int tsr_faiss_write_mem(const tsr_ivfpq *ix, uint8_t **buf, size_t *len, tsr_error *err);

/* Serializes ix (borrowed) through the open writer w (core/file.h) as it goes, without the
 * whole image in memory; the caller closes (or aborts) w. TSR_EINVAL for an invalid ix,
 * else the writer's error (TSR_EIO naming its path). */
int tsr_faiss_write_to(const tsr_ivfpq *ix, tsr_file_writer *w, tsr_error *err);

/* Writes ix to path atomically: path.tmp, fsync, rename, fsync of the directory. */
int tsr_faiss_write_file(const tsr_ivfpq *ix, const char *path, tsr_error *err);

/* Number of non-empty inverted lists of ix. */
size_t tsr_faiss_nonempty_lists(const tsr_ivfpq *ix);

#endif
