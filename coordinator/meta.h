/*
 * meta — the coordinator's metadata backend: where the committed version lives
 * (docs/coordinator.md "Metadata backends").
 *
 * Two backends behind one handle:
 *   - local (no --etcd; the default of `make run`): DATA/CURRENT names the committed
 *     version, DATA/v<N>/ holds its files; a tsr__meta is then NULL and every call below
 *     is a no-op that succeeds (the store alone decides, as before this module).
 *   - etcd (--etcd ENDPOINTS --etcd-prefix PREFIX): the key PREFIX/version is the
 *     authoritative committed version, its value names the version and the length and
 *     FNV-1a 64 digest of each of its small files (template.faiss, plan, and groups
 *     when the version has one: the shard groups after a reshard, docs/resharding.md), and
 *     for the id directory only its summary: a line "dirsum ENTRIES NEXT_LABEL DIGEST"
 *     (dirshard.h; the directory is ~34 bytes per id, too large for etcd at 10^8 ids).
 *     The small files are kept in etcd in chunks of at most TSR__META_CHUNK bytes under
 *     PREFIX/blobs/<N>/<file>/<chunk#> (the committed version and the one before it); the
 *     directory is rebuilt from the shards (Shard.List, dirshard.c) and checked against
 *     its summary. So a coordinator with an empty --data folder loads the version from
 *     etcd and the shards alone. DATA/ is then a cache: CURRENT and v<N>/ are written
 *     after the etcd commit, and a cached version is used only when its files match the
 *     digests (the directory: its summary). A record written before this change, with a
 *     "file directory LEN DIGEST" line, is still read: its directory blob is downloaded
 *     as before.
 *
 * The commit point of an update is one etcd transaction: PREFIX/version is replaced only
 * when its mod revision is still the one this coordinator read or wrote last (and, once
 * an election runs, when the caller's leader key is still its own: the compares given in
 * extra). A transaction whose answer was lost is settled by re-reading the key.
 *
 * DESIGN (threads): the update thread commits; start-up syncs before any other thread
 * runs; tsr__meta_poll is called by one watcher thread. ver_rev is guarded by mu.
 */
#ifndef TSR_COORD_META_H
#define TSR_COORD_META_H

#include <pthread.h>
#include <stdint.h>

#include "core/error.h"
#include "net/etcd.h"
#include "net/rpc.h"
#include "store/store.h"

#define TSR__META_CHUNK (1u << 20)   /* etcd's default request limit is 1.5 MiB */
#define TSR__META_MAX_FILE ((size_t)1 << 34)

typedef struct tsr__meta {
    tsr_etcd *etcd;             /* owned: versions, records (deadline 5 s) */
    tsr_etcd *fast;             /* owned: lease, election, members (deadline ttl/6 within
                                   0.3..1.5 s: a leader cut off from etcd learns it in time) */
    char prefix[256];           /* no trailing '/' */
    pthread_mutex_t mu;
    int64_t ver_rev;            /* under mu: mod revision of PREFIX/version last seen
                                   (0: absent) */
    uint64_t version;           /* under mu: the version it names (0: none) */
} tsr__meta;

/* Opens the etcd backend: endpoints "h:p[,h:p]", prefix (NULL = "/tessera/default"; a
 * trailing '/' is dropped), copts (TLS; borrowed during the call), ttl_s (the lease TTL:
 * sets the fast handle's deadline). Returns 0 with *out set, or an error naming the flag. */
int tsr__meta_open(const char *endpoints, const char *prefix, const tsr_rpc_client_opts *copts,
                   int ttl_s, tsr__meta **out, tsr_error *err);
void tsr__meta_close(tsr__meta *m); /* accepts NULL */

/* Key of PREFIX + suffix into buf (suffix starts with '/'). */
void tsr__meta_key(const tsr__meta *m, const char *suffix, char *buf, size_t cap);

/* The directory of a version whose record keeps only its summary (see above), handed to
 * a tsr__meta_dir_fn with the version's groups file (NULL: the version has none, the
 * config's groups hold it). */
/* A fold's carried rounds (docs/ha.md "Folds with --etcd"): the version's slices hold the
 * streamed writes up to seq `after`; the rounds (after, upto] of version `from`'s mirrored
 * log (PREFIX/stream/<from>/, kept while this version is the current one) were carried to
 * it by its catch-up and are in its directory but only in its shards' delta. from 0 = none. */
typedef struct tsr__meta_carry {
    uint64_t from;
    int64_t after, upto;
} tsr__meta_carry;

typedef struct tsr__meta_dirsum {
    uint64_t version;
    uint64_t count;             /* entries */
    int64_t next_label;         /* the label counter */
    uint64_t digest;            /* sum of the entries' tsr__dir_entry_digest */
    const char *groups;         /* borrowed during the call; NULL = the config's */
    size_t groups_len;
    tsr__meta_carry carry;      /* rounds to apply onto the shards' listing (from 0: none) */
    const uint8_t *const *rounds; /* with carry: every complete record of carry.from's */
    const size_t *round_lens;     /* mirrored log, packed CoordLogRecords in seq order */
    size_t nrounds;               /* (borrowed during the call; the header included) */
} tsr__meta_dirsum;
/* Makes the directory file (state.c's format) of di->version, new in *buf (*len), checked
 * against di; returns 0 or an error (nothing is cached; the caller retries later). */
typedef int (*tsr__meta_dir_fn)(void *ud, const tsr__meta_dirsum *di, uint8_t **buf,
                                size_t *len, tsr_error *err);

/* At start, and when a follower moves: the version etcd holds into *version (0 = none
 * yet) and, when it is not in st's cache with matching digests, downloaded into st (the
 * directory: from dirfn(ud, ...), or its blob for a record that still names one); st's
 * CURRENT then names it. m NULL: *version = st's CURRENT (0 when none). Returns 0 or an
 * error (TSR_EUNAVAILABLE naming etcd; dirfn's). */
int tsr__meta_sync(tsr__meta *m, tsr_store *st, tsr__meta_dir_fn dirfn, void *ud,
                   uint64_t *version, tsr_error *err);

/* The commit point of version v, already saved in st (tsr__snap_save): its small files are
 * uploaded and its directory summarized (uploaded too only with dir_blob: a version whose
 * directory its shards' slices do not hold exactly, a reshard move's whose catch-up
 * carried writes into their delta, re-routed; a fold's catch-up instead names its carried
 * rounds, carry non-NULL with from > 0: a line "carry FROM AFTER UPTO" in the record),
 * then PREFIX/version is set by one transaction conditional on its mod revision
 * (and the ncmp compares in extra, e.g. the leader key). Returns 0 = committed; TSR_ESTATE
 * when a compare failed (another coordinator committed, or leadership was lost: nothing
 * changed); TSR_EUNAVAILABLE when etcd did not answer (nothing changed, or the re-read
 * after a lost answer showed it did not). m NULL: 0 (the local backend's commit point is
 * st's CURRENT, which the caller flips). */
int tsr__meta_commit(tsr__meta *m, tsr_store *st, uint64_t v, int dir_blob,
                     const tsr__meta_carry *carry, const tsr_etcd_cmp *extra, size_t ncmp, tsr_error *err);

/* Reads PREFIX/version: *version and *rev (its mod revision; 0 / 0 when absent). */
int tsr__meta_read_version(tsr__meta *m, uint64_t *version, int64_t *rev, tsr_error *err);

/* Records beside the versions (the operation records, oplog.c) under PREFIX/<sub>/<name>,
 * with the contracts of tsr_store_aux_write / _list / _read / _remove (common/store/store.h);
 * a record is at most TSR__META_CHUNK bytes (TSR_ELIMIT). */
int tsr__meta_aux_write(tsr__meta *m, const char *sub, const char *name, const void *buf,
                        size_t len, tsr_error *err);
int tsr__meta_aux_list(tsr__meta *m, const char *sub, char ***names, size_t *n, tsr_error *err);
int tsr__meta_aux_read(tsr__meta *m, const char *sub, const char *name, size_t max_len,
                       void **buf, size_t *len, tsr_error *err);
int tsr__meta_aux_remove(tsr__meta *m, const char *sub, const char *name, tsr_error *err);

/* The coordinator log of streamed writes mirrored in etcd (stream_ha.c): record seq (0 =
 * the header) of version v, packed, under PREFIX/stream/<v>/<seq>/ in chunks c<k> and
 * then a mark "n" = "<chunks> <bytes>" (a record without its mark was never acknowledged
 * and is skipped). fetch calls fn(ud, record, len, err) for each complete one in seq order
 * (a nonzero return stops it and is returned); drop removes version v's records.
 * put is fenced: every key is written in a transaction with the fence compares (at most 3;
 * the leader's, tsr__leader_fence), the mark only while it does not exist yet (a one-chunk
 * record is one transaction: chunk and mark together): a deposed leader cannot add a round
 * after its successor read the log, nor two leaders complete one seq twice. A try whose
 * answer is lost may have landed, so put settles it before returning: it repeats the SAME
 * bytes under the same keys (harmless if a try landed) until etcd answers, for at most
 * wait_ms, and reads a refused mark back. Returns 0 = etcd holds exactly buf at seq (maybe
 * from an earlier try); TSR_ESTATE = it does not and no try of this call can land any more
 * (the fence failed: not the leader; or the seq holds another round); any other code =
 * in doubt after wait_ms (etcd did not answer): the caller must not put another record at
 * this seq before a re-read of the log settles it (stream_ha.c resigns). A leader that
 * reused the seq of an in-doubt round wrote its chunks over the round etcd had kept and
 * retried a refused mark forever (found by a 60-minute chaos run, docs/reliability.md). */
int tsr__meta_log_put(tsr__meta *m, uint64_t v, int64_t seq, const uint8_t *buf, size_t len,
                      const tsr_etcd_cmp *fence, size_t nfence, int64_t wait_ms,
                      tsr_error *err);
typedef int (*tsr__meta_log_fn)(void *ud, const uint8_t *buf, size_t len, tsr_error *err);
int tsr__meta_log_fetch(tsr__meta *m, uint64_t v, int64_t seq, tsr__meta_log_fn fn, void *ud,
                        tsr_error *err); /* seq -1: every record of v, else that one */
void tsr__meta_log_drop(tsr__meta *m, uint64_t v);
/* The read index of a follower (query.c): two linearizable reads, PREFIX/version (*v), then
 * the newest key under PREFIX/stream/<v>/ (keys only, descending, limit 2): *seq = the
 * newest round etcd holds complete for v (its mark "n" is there; a top round with chunks
 * but no mark was never acknowledged and its predecessor is complete, the writer mirrors
 * in order), 0 = the header only. A version whose rounds are gone (dropped after the
 * next version's commit) is read again, up to 4 times. Through the fast client (its short
 * deadline: a query does not wait 5 s for an etcd without quorum). 0 or the error (etcd
 * unreachable: TSR_EUNAVAILABLE as every etcd call). */
int tsr__meta_stream_head(tsr__meta *m, uint64_t *v, int64_t *seq, tsr_error *err);

#endif
