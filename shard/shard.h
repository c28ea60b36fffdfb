/*
 * shard — internals of tessera-shard shared across the shard/ sources (prefix tsr__).
 *
 * A shard serves immutable, refcounted version snapshots (tsr__version). A version is
 * made of shared pieces so that version N+1 costs only what changed:
 *  - tsr__tmpl: the trained quantizer (coarse centroids + PQ, no vectors); shared by
 *    every version built on it;
 *  - tsr__list: one inverted list's codes, labels and per-code ADC terms (common/
 *    ivfpq_search's tsr_ivfpq_list_terms); a list an update does not touch is shared by N
 *    and N+1 (copy-on-write per list);
 *  - tsr__rec: one datapoint (id, raw dense vector, restricts, numeric, crowding tag,
 *    sparse); shared by every version that holds it.
 * The per-version parts are pointer arrays, the filter dictionary + row metadata, and
 * the row tables (row r of the filter meta = entry r of the version: lists first, in list
 * order, then sparse-only datapoints).
 *
 * Streamed writes (stream.c, delta.c; their log a common/store applog) add to each version a tsr__delta: an
 * immutable snapshot of the writes applied on it, replaced whole by each Write; the
 * version owns a ref to its latest one (tsr__version.delta).
 *
 * DESIGN (threads): a published version is never modified except its delta pointer (and
 * the writer-only dtags); readers take a reference to the version and to its delta
 * together under tsr__shard.table_mu, which is held only to look up a version and bump its
 * refcounts, or to swap the table entries or a delta pointer (never during I/O or
 * building). Updates are serialized by update_mu, which no query ever takes; Writes by
 * write_mu (stream.c), which no query takes either. Lock order: update_mu, then write_mu,
 * then table_mu; term_mu (term.c) innermost, under update_mu or alone.
 */
#ifndef TSR_SHARD_INTERNAL_H
#define TSR_SHARD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/datapoint.h"
#include "core/error.h"
#include "query/filter.h"
#include "index/ivfpq.h"
#include "index/ivfpq_search.h"
#include "index/pq_code.h"
#include "store/applog.h"
#include "store/store.h"

#include "tessera/v1/shard.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"

#define TSR__MAX_K 10000            /* k, candidates and sparse_k above this are refused */
#define TSR__MAX_HELD_VERSIONS 8    /* serving versions kept before the oldest is dropped */
#define TSR__HELD_CAP (TSR__MAX_HELD_VERSIONS + 4) /* serving + prepared versions at most */

typedef struct tsr__tmpl {
    atomic_int refs;
    tsr_ivfpq *ix;   /* owned; lists all empty; scanned only through tsr_ivfpq_scanner */
    float **ptab;    /* owned, writer-only (write_mu): per list, the ADC term table of
                        tsr_ivfpq_list_table, made on a delta's first write to the list
                        (NULL = not yet); at most TSR__PTAB_CAP bytes in all */
    size_t ptab_bytes;
    tsr_pq_encoder *enc; /* owned, immutable: ix's exact one-vector PQ encoder (tsr__encode) */
} tsr__tmpl;
#define TSR__PTAB_CAP ((size_t)64 << 20)

/* One copy of the codes (docs/shard.md "Memory"): a base list keeps its codes and terms
 * only as fl, the scan blocks (transposed by 64 for the quantized prefilter; codes back in
 * Faiss order with tsr_ivfpq_flist_codes for slice.faiss and list rebuilds); codes and
 * term are then NULL. A list keeps codes + term instead (fl NULL) where no blocks can be
 * built (codes of other than 8 bits, M > 256), in a delta (appended a few at a time), and
 * with TSR_SHARD_CODES=faiss (the former layout, for comparisons). */
typedef struct tsr__list {
    atomic_int refs;
    size_t n;
    uint8_t *codes;  /* owned: n * code_size, or NULL when fl */
    int64_t *ids;    /* owned: n labels */
    float *term;     /* owned: n ADC terms (L2 by_residual), else NULL; NULL when fl */
    tsr_ivfpq_flist *fl; /* owned: codes and terms as scan blocks (immutable), or NULL */
} tsr__list;

/* A read-only, shared mapping of a version's vectors.f32 (mmap PROT_READ, MAP_SHARED:
 * pages come from the page cache, which the kernel may evict and read again). Every record
 * whose raw vector points into it holds a ref, so the mapping lives as long as any version
 * holds one of those records, also after its directory is removed (an unlinked file stays
 * valid while mapped). */
typedef struct tsr__vmap {
    atomic_int refs;
    void *base;
    size_t len;
} tsr__vmap;
tsr__vmap *tsr__vmap_ref(tsr__vmap *m);
void tsr__vmap_unref(tsr__vmap *m);   /* accepts NULL; munmaps at the last ref */
uint64_t tsr__vmap_bytes(void);       /* bytes mapped by live tsr__vmap of the process */

typedef struct tsr__rec {
    atomic_int refs;
    int64_t label;
    int32_t list;    /* -1 = sparse-only */
    uint32_t tag;    /* crowding tag id while the record is in a delta (tsr__delta), in
                        the id space of its version's filter dict (see tsr__delta);
                        set once before the delta is published; unused in a base */
    tsr_datapoint dp; /* owned; dp.dense is the raw vector (d floats) or NULL: on the heap
                         (owned), or in vmap's pages (read-only, not owned) */
    tsr__vmap *vmap; /* ref, or NULL when dp.dense is on the heap: records loaded from a
                        version directory point into its mapped vectors.f32 (unless
                        TSR_SHARD_VECTORS=heap); records made by Stage or Write keep their
                        heap copy */
} tsr__rec;

/* The streamed writes held by one version (docs/streaming.md "On the shard"): an
 * immutable, refcounted snapshot, replaced whole by every applied Write (copy-on-write:
 * the list pointer array and the mask are copied, the records appended to a shared buffer
 * or copied (tsr__recbuf), only the lists the write touches are rebuilt). Readers take a reference together with the version's (under
 * table_mu) and never wait for a writer.
 *  - lists[i]: the delta records of list i as a tsr__list (codes, labels, ADC terms
 *    computed exactly as for a base list; fl always NULL), or NULL;
 *  - recs: the upserts held, sorted by label (a label appears at most once; a later
 *    upsert of it replaces it, a delete removes it); a delta record's search row is
 *    version->nrows + its index in recs (tsr__row_rec);
 *  - mask: the base labels that are masked (deleted, or replaced by an upsert in recs),
 *    sorted. Crowding tag ids of delta records: the base dict's id of the tag when it has
 *    one, else TSR__DTAG_BIT | an id from the version's writer-only dtags dict. */
#define TSR__DTAG_BIT 0x80000000u
/* The record array of deltas, shared by successive snapshots (delta.c): recs[0..n) are
 * refs owned by the buffer (dropped when its last delta goes). A write whose new records
 * all sort after the tip's last label appends them in place past n (readers of older
 * snapshots only read their own prefix), so such a write costs O(its records), not
 * O(delta). Only the writer (write_mu, or the replay thread) changes n and the slots past
 * it; a snapshot is published with a pointer swap under table_mu, which orders them. */
typedef struct tsr__recbuf {
    atomic_int refs;
    tsr__rec **recs;         /* cap slots; [0..n) refs */
    size_t n, cap;
} tsr__recbuf;

typedef struct tsr__delta {
    atomic_int refs;
    int64_t seq;             /* applied seq: the last write applied to the version */
    size_t nlist;
    tsr__list **lists;       /* nlist refs, NULL = no delta record in that list */
    tsr__rec **recs;         /* = rbuf->recs (borrowed), sorted by label; [0..nrecs) */
    size_t nrecs;
    tsr__recbuf *rbuf;       /* ref, or NULL when nrecs is 0 */
    uint64_t rec_anon, rec_mapped; /* bytes of recs[0..nrecs) (tsr__version_memory_split) */
    int64_t *mask;           /* sorted base labels masked */
    size_t nmask;
    size_t ndeletes;         /* masked labels without an upsert in recs */
    int64_t mvec, msparse;   /* masked base records with a dense / sparse embedding */
    int64_t rvec, rsparse;   /* delta records with a dense / sparse embedding */
} tsr__delta;

enum tsr__vstate { TSR__PREPARED = 2, TSR__SERVING = 3 };

typedef struct tsr__version {
    atomic_int refs;
    int64_t version;
    tsr__tmpl *tmpl;          /* ref; NULL for the empty version 0 */
    size_t nlist;
    tsr__list **lists;        /* nlist refs, NULL = empty */
    uint8_t *owned;           /* nlist flags: lists this shard owns */
    tsr__rec **recs;          /* refs, sorted by label */
    size_t nrecs;
    size_t nvectors;          /* recs with a dense vector */
    size_t nsparse;           /* recs with a sparse embedding */
    tsr_filter_dict *dict;    /* owned */
    tsr_filter_meta *meta;    /* owned; rows as in the file comment */
    struct tsr_sparse_index *sparse_ix; /* owned; over the rows; NULL when no sparse */
    size_t *row0;             /* nlist+1: first row of list i; row0[nlist] = first sparse-only */
    tsr__rec **row_rec;       /* rows -> rec (borrowed from recs) */
    size_t nrows;
    uint64_t disk_bytes;
    uint64_t rec_anon, rec_mapped; /* bytes of recs[0..nrecs) (set once, by finish) */
    int64_t stream_seq;       /* the stream seq folded into this version (file "stream"
                                 of its directory; 0 without one) */
    int catchup;              /* a prepared catch-up version (StageRequest.capture_delta):
                                 takes Writes naming it into its own log (wal/v<N>.log,
                                 created at its Prepare: the file marks it after a restart)
                                 and does not stop Writes to the current version. Set
                                 before the version is published, then read-only. */
    /* Streaming (the only mutable parts of a published version): */
    tsr__delta *delta;        /* ref or NULL (= empty); read and swapped under table_mu */
    tsr_filter_dict *dtags;   /* owned; crowding tags of delta records unknown to dict;
                                 used by the writer only (write_mu), never by a query */
} tsr__version;

/* ---- slice.c: pieces, build, load, write ---- */
tsr__tmpl *tsr__tmpl_from_index(tsr_ivfpq *ix, tsr_error *err); /* takes ownership of ix */
tsr__tmpl *tsr__tmpl_ref(tsr__tmpl *t);
void tsr__tmpl_unref(tsr__tmpl *t);
void tsr__list_unref(tsr__list *l);
tsr__rec *tsr__rec_ref(tsr__rec *r);
void tsr__rec_unref(tsr__rec *r);

tsr__version *tsr__version_ref(tsr__version *v);
void tsr__version_unref(tsr__version *v); /* accepts NULL */
/* The empty version 0 (no template, no lists). */
tsr__version *tsr__version_empty(tsr_error *err);
/* Binary search; NULL when absent. */
tsr__rec *tsr__version_find(const tsr__version *v, int64_t label);
/* Bytes of index data held (codes, labels, vectors, metadata estimate). */
uint64_t tsr__version_memory(const tsr__version *v);
/* The same split: *anon = on the heap (codes, labels, terms, records, heap vectors, row
 * tables, metadata estimate), *mapped = raw vectors in mapped vectors.f32 pages; d (v's
 * delta or NULL) adds its lists and records. */
/* Adds the heap (*anon) and mapped (*mapped) bytes of record r (metadata estimated). */
void tsr__rec_bytes(const tsr__rec *r, uint64_t *anon, uint64_t *mapped);
void tsr__version_memory_split(const tsr__version *v, const tsr__delta *d, uint64_t *anon,
                               uint64_t *mapped);

/* ---- delta snapshots (slice.c: refcount; delta.c: building) ---- */
tsr__delta *tsr__delta_ref(tsr__delta *d);   /* accepts NULL */
void tsr__delta_unref(tsr__delta *d);        /* accepts NULL */

static inline int tsr__delta_empty(const tsr__delta *d)
{
    return d == NULL || (d->nrecs == 0 && d->nmask == 0);
}

/* The delta record of label (its index in recs into *idx when idx), or NULL. */
static inline tsr__rec *tsr__delta_find(const tsr__delta *d, int64_t label, size_t *idx)
{
    size_t lo = 0, hi = d ? d->nrecs : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t l = d->recs[mid]->label;
        if (l == label) {
            if (idx)
                *idx = mid;
            return d->recs[mid];
        }
        if (l < label)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* 1 when the sorted array a[0..n) holds x. */
/* The index of x in a (sorted ascending), or n when absent. */
static inline size_t tsr__i64_index(const int64_t *a, size_t n, int64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] == x)
            return mid;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return n;
}

static inline int tsr__i64_in(const int64_t *a, size_t n, int64_t x)
{
    return tsr__i64_index(a, n, x) < n;
}

/* The record of a search row of version v with delta d (rows past v->nrows are delta
 * records). */
static inline tsr__rec *tsr__row_rec(const tsr__version *v, const tsr__delta *d, uint32_t row)
{
    return row < v->nrows ? v->row_rec[row] : d->recs[row - v->nrows];
}

/* The applied stream seq of v with its delta d (d must be v's, or NULL). */
static inline int64_t tsr__applied_seq(const tsr__version *v, const tsr__delta *d)
{
    return d ? d->seq : v->stream_seq;
}

/* An edit set for building version N+1 from a base. */
typedef struct tsr__edits {
    tsr__rec **ups;     /* refs, sorted by label, unique */
    size_t nups, capups;
    int64_t *dels;      /* sorted unique labels after finish */
    size_t ndels, capdels;
    int32_t *drop;      /* lists no longer owned */
    size_t ndrop;
    int32_t *own;       /* full owned set when have_own */
    size_t nown;
    int have_own;
    tsr__delta *src;    /* ref or NULL: the base's delta folded into ups (fold_delta); the
                           build copies the codes of its records instead of encoding them */
} tsr__edits;
void tsr__edits_close(tsr__edits *e);

/* Builds version `version` from base (borrowed) with template tmpl (borrowed, ref taken;
 * NULL = the base's) and edits (borrowed). Encodes new vectors with the PQ. */
int tsr__version_build(const tsr__version *base, tsr__tmpl *tmpl, const tsr__edits *e,
                       int64_t version, tsr__version **out, tsr_error *err);

/* Writes slice.faiss, meta, vectors.f32 of v into dir (existing, empty). */
int tsr__version_write(const tsr__version *v, const char *dir, tsr_error *err);
/* After v's files are durable in dir and before v is published (no reader yet): the
 * records of v whose raw vector is on the heap (made by Stage or Write) are replaced in v
 * by copies pointing into a mapping of dir/vectors.f32 (after checking the bytes match),
 * so a built or folded version reads its vectors through the page cache like a loaded
 * one; the heap copies go with the last older version or delta that holds them. A failure
 * leaves the rest on the heap (logged). Nothing with TSR_SHARD_VECTORS=heap. */
void tsr__version_map_vectors(tsr__version *v, const char *dir);
/* Loads a version from dir (files already checked against the MANIFEST). */
int tsr__version_load(const char *dir, int64_t version, tsr__version **out, tsr_error *err);

/* ---- convert.c: edits and datapoints from and to protobuf ---- */

/* Validates upserts and deletes (a Stage chunk's or a Write's) whole against template t
 * (owned: the lists a Write may name, NULL = any list of t, as for Stage): label >= 0,
 * list in -1..nlist-1, a dense vector of dimension d exactly when list >= 0, finite
 * values, sparse lengths, numeric values; delete labels >= 0. Converts the upserts to
 * records into recs (n_upserts + 1 slots; *nrecs filled, refs owned by the caller even on
 * error). TSR_EINVAL naming upserts[i] / deletes[i] and the field, TSR_ENOMEM. */
int tsr__convert_edits(const tsr__tmpl *t, const uint8_t *owned,
                       Tessera__V1__StagedUpsert *const *ups, size_t nups,
                       Tessera__V1__StagedDelete *const *dels, size_t ndels, tsr__rec **recs,
                       size_t *nrecs, tsr_error *err);

/* proto -> datapoint: tsr_pb_datapoint_record (common/net/pb_datapoint, the one
 * conversion; datapoint -> proto is its tsr_pb_datapoint_new / _set) with its refusals as
 * TSR_EINVAL "datapoint 'ID': why" (p NULL: "datapoint missing"; d nonzero: a dense vector
 * of another dimension is refused before anything is copied). embedding_metadata is kept
 * serialized (dp->metadata; more than TSR_METADATA_MAX bytes is refused). dp is empty after
 * an error. */
int tsr__dp_from_proto(const Tessera__V1__IndexDatapoint *p, size_t d, tsr_datapoint *dp,
                       tsr_error *err);

/* ---- scan.c: one query on one version ---- */
typedef struct tsr__hit {
    int64_t label;
    float dist;
    uint32_t row;
} tsr__hit;

/* A scanner kept across the queries of one Search call: tsr__search_one makes it on first
 * use and again when a query's index differs (one per call, not one per query: a scanner
 * holds three tables of up to M x 256 floats, and their malloc/free per query was ~10 % of
 * a shard's CPU under batches, docs/performance.md Dec 7). The caller zero-initializes it
 * and closes it before it drops the references to the versions queried. */
typedef struct tsr__scan_cache {
    const tsr_ivfpq *ix;
    tsr_ivfpq_scanner *sc;
} tsr__scan_cache;
void tsr__scan_cache_close(tsr__scan_cache *c);

typedef struct tsr__query {
    const float *x;            /* NULL = no dense part */
    const int32_t *lists;
    const float *coarse;
    size_t nprobe;
    size_t k, candidates, sparse_k;
    uint32_t crowd;            /* 0 = no limit */
    const tsr_filter *filter;  /* NULL = everything */
    const int64_t *sp_dims;    /* sparse query, ascending unique */
    const float *sp_vals;
    size_t nsp;
    const tsr__delta *delta;   /* the version's delta (NULL or empty = none) */
    const tsr_token_restrict *tr; /* the raw restricts behind filter, for delta records */
    size_t ntr;
    const tsr_numeric_query *nq;
    size_t nnq;
    tsr__scan_cache *scan;     /* NULL = a scanner of its own for this query */
} tsr__query;

typedef struct tsr__qresult {
    tsr__hit *dense; size_t ndense;
    tsr__hit *sparse; size_t nsparse;
    int64_t codes_scanned, passed;
} tsr__qresult;

/* ---- nsuse.c ---- */
/* 1 when no datapoint of v nor of its delta dl (NULL = none) uses namespace ns in a token
 * or numeric restrict (a string v's dictionary holds as a token or tag counts as used). */
int tsr__ns_unknown(const tsr__version *v, const tsr__delta *dl, const char *ns);

int tsr__search_one(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                    tsr_error *err);
void tsr__qresult_close(tsr__qresult *r);
/* PQ-encodes x (d floats) for list (residual when by_residual) into code (code_size). */
void tsr__encode(const tsr__tmpl *t, const float *x, int32_t list, uint8_t *code);

/* ---- delta.c: building deltas ---- */
/* A new delta snapshot of v: old (v's current delta, NULL = none) plus one write's
 * upserts (validated records, borrowed: refs are taken; their crowding tag ids are set
 * here) and deletes, at seq. Caller serializes the builds of one version (write_mu).
 * TSR_ESTATE for the empty version 0, TSR_ENOMEM. */
int tsr__delta_apply(tsr__version *v, const tsr__delta *old, tsr__rec *const *ups, size_t nups,
                     const int64_t *dels, size_t ndels, int64_t seq, tsr__delta **out,
                     tsr_error *err);
/* Folds delta d (borrowed) into the edit set e of the next version (e as make_edits left
 * it: upserts sorted unique, deletes sorted unique): the delta's upserts whose label e
 * neither upserts nor deletes are added, the masked labels join the deletes (the staged
 * edits win over the delta on one label). */
int tsr__delta_fold(const tsr__delta *d, tsr__edits *e, tsr_error *err);

/* ---- the write-ahead log of one version (DATA/wal/v<version>.log) ----
 * A common/store append log (store/applog.h: framing, append, fdatasync, the scan that
 * cuts a torn or corrupt tail) whose payloads are packed ShardWriteRequests of at most
 * TSR__WAL_MAX_RECORD bytes, as received. stream.c owns the files: which version's log,
 * created empty at a Prepare, replayed at start-up (tsr__stream_open), removed when folded.
 * The shard's log (s->wal) is used under write_mu, except that its fd may be fdatasync'ed
 * by one thread outside it (group commit, stream.c sync_to). */
#define TSR__WAL_MAX_RECORD ((uint32_t)64 << 20)

/* ---- update.c: the shard state ---- */
typedef struct tsr__staging tsr__staging;

typedef struct tsr__held {
    tsr__version *v;
    int state; /* enum tsr__vstate */
} tsr__held;

typedef struct tsr__shard {
    char *dir;                  /* owned: data dir */
    tsr_store *store;           /* owned: versioned dirs, CURRENT, MANIFEST (common/store/store);
                                   written only under update_mu */
    pthread_mutex_t table_mu;   /* guards current + held (short sections only) */
    tsr__version *current;      /* ref */
    tsr__held held[TSR__HELD_CAP];
    size_t nheld;
    pthread_mutex_t update_mu;  /* serializes Stage/Prepare/Commit/Abort/Release */
    tsr__staging *staging;      /* guarded by update_mu */
    _Atomic int64_t staging_version; /* 0 = none; readable without update_mu */
    _Atomic int64_t searches;
    /* Streamed writes (stream.c). write_mu serializes the Writes' checks, appends and
     * applies, and the log switch at Commit; it is released while one Write (the
     * leader) fdatasyncs the log for every append before its target (group commit).
     * Lock order: update_mu, then write_mu, then table_mu. */
    pthread_mutex_t write_mu;
    pthread_cond_t write_cv;    /* with write_mu: sync done, turn to apply, idle */
    tsr_applog wal;             /* the current version's log (write_mu) */
    int64_t wal_version;        /* its version (0 = none open) */
    int64_t appended_seq;       /* the last seq appended to the log (write_mu) */
    uint64_t synced;            /* bytes of the log known durable (write_mu) */
    int syncing, pausing, inflight, broken; /* write_mu */
    uint64_t tickets, applied_tickets;      /* appends made / applied, in order */
    char broken_msg[256];       /* why the log refuses writes (broken) */
    _Atomic int64_t wal_bytes, writes, write_records, folds;
    /* term.c: the highest HA leader term seen (DATA/leader-term); term_mu, innermost */
    pthread_mutex_t term_mu;
    int64_t term;
    int term_loaded;
} tsr__shard;

/* term.c: 0 when term is 0 (no term) or at least the highest seen (a higher one is made
 * durable first); else TSR_ESTATE "leader term T is older than U" (or an I/O error). */
int tsr__shard_term_check(tsr__shard *s, int64_t term, tsr_error *err);

int tsr__shard_open(tsr__shard *s, const char *dir, tsr_error *err);
void tsr__shard_close(tsr__shard *s);
/* A ref to the version (0 = current), or NULL when not held. Caller unrefs. */
tsr__version *tsr__shard_get(tsr__shard *s, int64_t version);
/* The same, with a ref to the version's delta snapshot of that moment into *d (NULL =
 * none; d may be NULL). Caller unrefs both. */
tsr__version *tsr__shard_get_view(tsr__shard *s, int64_t version, tsr__delta **d);

/* Stage, Prepare, Commit, Abort and Release check the sender's leader term (term, or the
 * StageRequest's leader_term; 0 = none) with tsr__shard_term_check while they hold
 * update_mu, and operate under the same hold: a call of a newer term cannot come between
 * the check and the operation (a deposed leader's Abort checked, then a new leader's Stage
 * of the same version number, then the Abort dropping it). */
int tsr__shard_stage(tsr__shard *s, const Tessera__V1__StageRequest *rq,
                     Tessera__V1__StageResponse *resp, tsr_error *err);
/* cpu_pct: PrepareRequest.build_cpu_percent (1..99 paces the build thread to that share
 * of a core, core/parallel.h tsr_thread_pace; 0 or >= 100: unpaced). */
int tsr__shard_prepare(tsr__shard *s, int64_t term, int64_t version, unsigned cpu_pct,
                       Tessera__V1__PrepareResponse *resp, tsr_error *err);
int tsr__shard_commit(tsr__shard *s, int64_t term, int64_t version, tsr_error *err);
int tsr__shard_abort(tsr__shard *s, int64_t term, int64_t version, tsr_error *err);
/* Fills versions[] (up to cap) with the versions held after the release. */
int tsr__shard_release(tsr__shard *s, int64_t term, int64_t below, int64_t *versions,
                       size_t cap, size_t *n, tsr_error *err);
/* Snapshot of the held versions: refs into out (cap entries), states; caller unrefs. */
size_t tsr__shard_list(tsr__shard *s, tsr__held *out, size_t cap, int *staging_version_set,
                       int64_t *staging_version, int64_t *current_version);

/* ---- stream.c: streamed writes ---- */
/* After the versions are loaded (tsr__shard_open): removes the logs of other versions
 * (older = folded, newer = impossible unless a held prepared version's: logged), replays
 * the current version's log into its delta (a torn or corrupt tail logged and cut) and
 * opens it for appending; a prepared version with a log is a catch-up version: its log is
 * replayed into its delta the same way (not opened). */
int tsr__stream_open(tsr__shard *s, tsr_error *err);
/* Creates the empty log of a catch-up version about to be published as prepared (file
 * and directory fsynced), or removes the log of a prepared version dropped (Abort, or a
 * Commit of a newer one). Caller holds update_mu; the remove takes write_mu. */
int tsr__stream_catchup_create(tsr__shard *s, int64_t version, tsr_error *err);
void tsr__stream_catchup_remove(tsr__shard *s, int64_t version);
void tsr__stream_close(tsr__shard *s);
/* The fuzz harness fuzz_shard_wal only (the start-up replay without the rest of a shard
 * open): v (a loaded version with a template, borrowed; no Write, no reader, no other
 * thread touches it: the shard is not serving) loses its delta and its delta's crowding
 * tags, as a version just loaded has none, then the log at path is replayed into it by the
 * code tsr__stream_open runs (tsr_applog_scan_file with the same record callback: a torn or
 * corrupt tail or a refused record logged and cut off; a missing file is an empty log).
 * *nrec: records replayed, *size: the log's size after; TSR_EIO / TSR_ENOMEM. */
int tsr__stream_replay_fresh(tsr__version *v, const char *path, uint64_t *nrec,
                             uint64_t *size, tsr_error *err);
/* Write (service.c, on the worker pool): raw[0..len) is the request as received (logged
 * as is), rq its unpacked form. FAILED_PRECONDITION (TSR_ESTATE) for a version other than
 * the current one or while a prepared version waits, TSR_EINVAL naming the field.
 * A prepared catch-up version (tsr__version.catchup) is the exception both ways: a Write
 * naming it is appended to its own log (fdatasync'ed, under write_mu, no group commit:
 * only the coordinator's catch-up sends them, one at a time) and applied to its delta;
 * it does not stop Writes to the current version. */
int tsr__shard_write(tsr__shard *s, const uint8_t *raw, size_t len,
                     const Tessera__V1__ShardWriteRequest *rq,
                     Tessera__V1__ShardWriteResponse *resp, tsr_error *err);
/* Commit (update.c, holding update_mu): pause takes write_mu once no Write is in flight;
 * resume switches the log to the (new) current version when switched, removing the old
 * version's log (CURRENT is durable by then), and releases write_mu. */
void tsr__stream_pause(tsr__shard *s);
void tsr__stream_resume(tsr__shard *s, int switched);

#endif
