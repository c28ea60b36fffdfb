/*
 * snap — the served snapshot and the id directory (state.c).
 *
 * A tsr__snap is one committed version, immutable once published: its template, the
 * partition plan (list -> shard group), the id directory (string id -> label, list,
 * group), its groups. It is refcounted: a query takes a reference with
 * tsr__coord_snap_get and plans on it; the update thread publishes the next one
 * (tsr__stream_publish -> tsr__coord_snap_swap) and retires the old one
 * (tsr__snap_retire). Its on-disk form is common/store.
 *
 * Owns: the directory type (tsr__dir) and the snapshot type; the coordinator's served
 * snapshot pointer (tsr__coord.snap). Locks: snap_mu, a leaf held only to copy the pointer
 * and bump the count (lock order: docs/architecture.md).
 */
#ifndef TSR_COORD_SNAP_H
#define TSR_COORD_SNAP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coord_config.h"
#include "core/error.h"
#include "index/ivfpq.h"
#include "store/store.h"

typedef struct tsr__coord tsr__coord; /* coord.h */

/* ---- directory: string id -> (label, list, shard) ------------------------------------ */
typedef struct tsr__dir_entry {
    char *id;        /* owned by the directory */
    int64_t label;
    int32_t list;    /* -1 = sparse-only */
    int32_t shard;
    uint8_t dense, sparse;
    uint8_t dead;    /* stream overlay only: a tombstone (the id was removed) */
} tsr__dir_entry;

typedef struct tsr__dir {
    tsr__dir_entry *e;   /* owned; entries (unordered), deleted ones removed by rebuild */
    size_t n, cap;
    uint32_t *slot;      /* open addressing: index+1 into e, 0 = empty */
    size_t mask;
} tsr__dir;

void tsr__dir_init(tsr__dir *d);
void tsr__dir_close(tsr__dir *d);
/* Entry of id or NULL (borrowed). */
const tsr__dir_entry *tsr__dir_find(const tsr__dir *d, const char *id);
/* Adds an entry (id copied); the id must not be present. */
void tsr__dir_add(tsr__dir *d, const char *id, int64_t label, int32_t list, int32_t shard,
                  int dense, int sparse);
/* Adds the entry or, when id is present, overwrites its fields (the overlay's upsert);
 * returns it (valid until the next add). */
tsr__dir_entry *tsr__dir_set(tsr__dir *d, const char *id, int64_t label, int32_t list, int32_t shard,
                  int dense, int sparse, int dead);
/* Removes id's entry (the last entry takes its place: entries are unordered); 1 when it
 * was there, else 0. O(1) expected: no tombstone, the probe run is shifted back. */
int tsr__dir_remove(tsr__dir *d, const char *id);
uint64_t tsr__hash_str(const char *s);

/* ---- snapshot ---------------------------------------------------------------------- */
typedef struct tsr__snap {
    atomic_int refs;
    uint64_t version;        /* 0 = no index yet */
    tsr_ivfpq *tmpl;         /* owned; trained, no vectors; NULL at version 0 */
    uint8_t *tmpl_bytes;     /* owned; template.faiss bytes */
    size_t tmpl_len;
    float *cent_norms;       /* owned; ||c||^2 per list (L2 coarse step) */
    int32_t *plan;           /* owned; nlist entries: list -> shard */
    enum tsr__plan_kind plan_kind;
    tsr__dir dir;
    int64_t next_label;
    int64_t ndense, nsparse;
    char *groups;            /* owned; the shard groups (config groups_text) stored with the
                                version after a reshard (file "groups"); NULL = the config's */
    size_t groups_len;
    size_t ngroups;          /* shard groups at this version (its plan and directory name no
                                other); 0 = the config's count (tsr__snap_groups) */
    uint8_t retired[TSR_COORD_MAX_SHARDS]; /* 1: a group RemoveShardGroup removed (owns no
                                list and no sparse-only id) */
} tsr__snap;

tsr__snap *tsr__snap_create(void);
/* The shard groups of s's version: the bound of every per-group array a reader of s sizes
 * (AddShardGroup grows the config's count while queries on older snapshots still run). */
size_t tsr__snap_groups(const tsr__snap *s, const tsr__coord_config *cfg);
/* Of those, the groups s's version did not remove (RemoveShardGroup): what GetIndexStats
 * and the Vertex indexStats count as shards. */
size_t tsr__snap_live_groups(const tsr__snap *s, const tsr__coord_config *cfg);
void tsr__snap_unref(tsr__snap *s); /* accepts NULL */
/* Sets tmpl (takes ownership), its bytes, norms. */
int tsr__snap_set_template(tsr__snap *s, tsr_ivfpq *tmpl, tsr_error *err);
/* Writes version s->version into the store (template.faiss, plan, directory, MANIFEST)
 * and does not touch CURRENT. */
int tsr__snap_save(const tsr__snap *s, tsr_store *st, tsr_error *err);
/* Loads a committed version (verified against its MANIFEST). */
int tsr__snap_load(tsr_store *st, uint64_t version, tsr__snap **out, tsr_error *err);
/* Plans list -> shard from list sizes (sizes: nlist counts). */
void tsr__plan_build(enum tsr__plan_kind kind, const tsr_ivfpq *tmpl, const int64_t *sizes,
                     size_t nshards, uint64_t seed, int32_t *plan);

tsr__snap *tsr__coord_snap_get(tsr__coord *c);          /* new ref; caller unrefs */

void tsr__coord_snap_set(tsr__coord *c, tsr__snap *s);  /* takes s's reference */
/* The same, returning the snapshot it replaced with the served reference (the caller
 * drops it, e.g. with tsr__snap_retire). */
tsr__snap *tsr__coord_snap_swap(tsr__coord *c, tsr__snap *s);
/* Drops the caller's reference to a snapshot no longer served, freeing it on the CALLING
 * thread once the queries planned on it let go (polled every ms for up to wait_ms; past
 * that, the last of them frees it; 0 = a plain unref). A snapshot of 1M ids is ~1M
 * strings: freed by the query that held it last, that query waited tens of ms at every
 * commit point. An update retires its base after releasing the stream lock (update.c): a
 * success replaced it; a failure's base is still served (wait 0). */
#define TSR__SNAP_RETIRE_MS 200
void tsr__snap_retire(tsr__snap *s, int64_t wait_ms);

#endif
