/*
 * idmap — the id map file written beside an index built from a batch (`F.faiss.ids`):
 * the string id of every label, one per line in label order (line 1 = label 0), UTF-8,
 * '\n' line ends. Ids are arbitrary UTF-8, so three bytes are escaped: backslash as "\\",
 * newline as "\n", carriage return as "\r"; nothing else is. See docs/training.md.
 */
#ifndef TSR_IDMAP_H
#define TSR_IDMAP_H

#include <stddef.h>

#include "core/error.h"

/* Writes n ids (borrowed) to path atomically (path.tmp, fsync, rename). */
int tsr_idmap_write(const char *path, char *const *ids, size_t n, tsr_error *err);

/* Reads an id map: on success *ids is a new array of *n new strings (caller frees each and
 * the array; tsr_idmap_free does both). A bad escape is TSR_EFORMAT naming the line. */
int tsr_idmap_read(const char *path, char ***ids, size_t *n, tsr_error *err);
void tsr_idmap_free(char **ids, size_t n);

#endif
