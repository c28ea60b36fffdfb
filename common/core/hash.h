/*
 * hash — FNV-1a 64, the one string hash of the project.
 *
 * FNV-1a (Fowler/Noll/Vo): h = basis; for each byte: h ^= byte, h *= 2^40 + 2^8 + 0xb3.
 * It is short, has no tables, and is good enough for the open-addressing tables that use
 * it (callers that need well-mixed low bits add a finalizer of their own: query/filter).
 *
 * Two offset bases are in use, and neither may change (why, per caller):
 *   TSR_FNV1A64_BASIS         the standard basis 14695981039346656037. The Vertex
 *                             crowding_attribute of a non-numeric crowding tag is sent to
 *                             clients (coordinator/frontend/vertex.c,
 *                             docs/vertex-compat.md): it must be the published FNV-1a 64
 *                             of the tag's bytes.
 *   TSR_FNV1A64_BASIS_ROUTE   1469598103934665603: the standard basis with its last digit
 *                             dropped (a historic slip). It is NOT in-memory only: the
 *                             coordinator routes a record that has no coarse list (no dense
 *                             vector) to shard hash(id) % S (coordinator/update_plan.c),
 *                             and that shard is recorded in the id directory and holds the
 *                             record. A different basis would send a re-upsert of an
 *                             existing id to another shard (a needless move) and break the
 *                             placement of data written before the change. The
 *                             coordinator's id directory and the metrics series table hash
 *                             with it too (in memory; kept so their table layouts and
 *                             exposition order stay as they were).
 */
#ifndef TSR_HASH_H
#define TSR_HASH_H

#include <stddef.h>
#include <stdint.h>

#define TSR_FNV1A64_BASIS 0xcbf29ce484222325ull       /* 14695981039346656037 */
#define TSR_FNV1A64_BASIS_ROUTE 1469598103934665603ull /* see above: never change */
#define TSR_FNV1A64_PRIME 0x100000001b3ull            /* 1099511628211 */

/* Continues a hash h (a basis, or the result of an earlier call) over n bytes of p. */
uint64_t tsr_fnv1a64(uint64_t h, const void *p, size_t n);

/* Continues a hash h over the bytes of the NUL-terminated s (not the NUL). */
uint64_t tsr_fnv1a64_str(uint64_t h, const char *s);

#endif
