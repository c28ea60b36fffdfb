/*
 * dirshard — the id directory of a version rebuilt from the shards, not from etcd
 * (docs/coordinator.md "Where the quantizer and the directory come from").
 *
 * With --etcd, PREFIX/version keeps for the directory only its summary (entries, label
 * counter and an order-independent digest: the sum mod 2^64 of one FNV-1a 64 hash per
 * entry); a coordinator that lacks DATA/vN/directory lists one live replica per group of
 * version N (Shard.List, paged, one thread per group, failing over to the group's next
 * replica), checks the summary and hands meta.c the file (state.c's format) to cache.
 *
 * Commit order: the etcd commit point comes BEFORE the shards' Commit, so a follower may
 * list version N while a shard still holds it as PREPARED: Shard.List answers for a
 * prepared version as for a committed one (the etcd record already made it the truth;
 * a prepared N is only ever committed after that, never aborted). A replica left out of
 * N (update_min_replicas) does not hold it: FAILED_PRECONDITION, the next one is tried.
 *
 * DESIGN (threads): tsr__dir_rebuild runs on the caller's thread (start-up, or the
 * follower's follow_mu holder) and joins its listing threads before returning; it opens
 * its own channels (with the coordinator's shard options) to the replicas the version
 * names, so it works before tsr__coord_channels_open and for groups a reshard adds.
 */
#ifndef TSR_COORD_DIRSHARD_H
#define TSR_COORD_DIRSHARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "meta.h"

/* The summary of a directory file (state.c's format) into *count, *next_label, *digest.
 * Returns 0 or TSR_EFORMAT naming what is wrong. */
int tsr__dir_file_summary(const uint8_t *b, size_t n, uint64_t *count, int64_t *next_label,
                          uint64_t *digest, tsr_error *err);

/* One entry's share of the digest (dense and sparse taken as 0/1). */
uint64_t tsr__dir_entry_digest(const char *id, size_t idlen, int64_t label, int32_t list,
                               int32_t group, int dense, int sparse);

/* A tsr__meta_dir_fn (ud: the tsr__coord): the directory file of di->version listed from
 * its shards and checked against di, new in *buf (*len). Up to 3 rounds, each starting at
 * another replica of every group; errors name the group, replica and what differs
 * (TSR_EFORMAT: the listing does not match the summary; TSR_EUNAVAILABLE: a group had no
 * replica that could list the version). */
int tsr__dir_rebuild(void *ud, const tsr__meta_dirsum *di, uint8_t **buf, size_t *len,
                     tsr_error *err);

#endif
