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
 * DESIGN (threads): a published version is never modified; readers hold a reference
 * taken under tsr__shard.table_mu, which is held only to look up a version and bump its
 * refcount, or to swap the table entries (never during I/O or building). Updates are
 * serialized by update_mu, which no query ever takes. Lock order: update_mu, then
 * table_mu.
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
#include "store/store.h"

#include "tessera/v1/shard.pb-c.h"
#include "tessera/v1/tessera.pb-c.h"

#define TSR__MAX_K 10000            /* k, candidates and sparse_k above this are refused */
#define TSR__MAX_HELD_VERSIONS 8    /* serving versions kept before the oldest is dropped */
#define TSR__HELD_CAP (TSR__MAX_HELD_VERSIONS + 4) /* serving + prepared versions at most */

typedef struct tsr__tmpl {
    atomic_int refs;
    tsr_ivfpq *ix;   /* owned; lists all empty; scanned only through tsr_ivfpq_scanner */
} tsr__tmpl;

typedef struct tsr__list {
    atomic_int refs;
    size_t n;
    uint8_t *codes;  /* owned: n * code_size */
    int64_t *ids;    /* owned: n labels */
    float *term;     /* owned: n ADC terms (L2 by_residual), else NULL */
    tsr_ivfpq_flist *fl; /* owned: the codes and terms again, transposed for the quantized
                            prefilter (built with the list, immutable); NULL where no
                            prefilter kernel runs (tsr_ivfpq_flist_build) */
} tsr__list;

typedef struct tsr__rec {
    atomic_int refs;
    int64_t label;
    int32_t list;    /* -1 = sparse-only */
    tsr_datapoint dp; /* owned; dp.dense is the raw vector (d floats) or NULL */
} tsr__rec;

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
} tsr__edits;
void tsr__edits_close(tsr__edits *e);

/* Builds version `version` from base (borrowed) with template tmpl (borrowed, ref taken;
 * NULL = the base's) and edits (borrowed). Encodes new vectors with the PQ. */
int tsr__version_build(const tsr__version *base, tsr__tmpl *tmpl, const tsr__edits *e,
                       int64_t version, tsr__version **out, tsr_error *err);

/* Writes slice.faiss, meta, vectors.f32 of v into dir (existing, empty). */
int tsr__version_write(const tsr__version *v, const char *dir, tsr_error *err);
/* Loads a version from dir (files already checked against the MANIFEST). */
int tsr__version_load(const char *dir, int64_t version, tsr__version **out, tsr_error *err);

/* proto <-> datapoint */
int tsr__dp_from_proto(const Tessera__V1__IndexDatapoint *p, size_t d, tsr_datapoint *dp,
                       tsr_error *err);
/* tsr__dp_from_proto keeps embedding_metadata serialized (dp->metadata; more than
 * TSR_METADATA_MAX bytes is TSR_EINVAL). tsr__dp_to_proto returns a new message (free with
 * tsr__dp_proto_free) that borrows dp's strings and arrays and owns the unpacked
 * embedding_metadata; NULL when out of memory. */
Tessera__V1__IndexDatapoint *tsr__dp_to_proto(const tsr_datapoint *dp);
void tsr__dp_proto_free(Tessera__V1__IndexDatapoint *p);

/* ---- scan.c: one query on one version ---- */
typedef struct tsr__hit {
    int64_t label;
    float dist;
    uint32_t row;
} tsr__hit;

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
} tsr__query;

typedef struct tsr__qresult {
    tsr__hit *dense; size_t ndense;
    tsr__hit *sparse; size_t nsparse;
    int64_t codes_scanned, passed;
} tsr__qresult;

int tsr__search_one(const tsr__version *v, const tsr__query *q, tsr__qresult *res,
                    tsr_error *err);
void tsr__qresult_close(tsr__qresult *r);
/* PQ-encodes x (d floats) for list (residual when by_residual) into code (code_size). */
void tsr__encode(const tsr__tmpl *t, const float *x, int32_t list, uint8_t *code);

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
} tsr__shard;

int tsr__shard_open(tsr__shard *s, const char *dir, tsr_error *err);
void tsr__shard_close(tsr__shard *s);
/* A ref to the version (0 = current), or NULL when not held. Caller unrefs. */
tsr__version *tsr__shard_get(tsr__shard *s, int64_t version);

int tsr__shard_stage(tsr__shard *s, const Tessera__V1__StageRequest *rq,
                     Tessera__V1__StageResponse *resp, tsr_error *err);
int tsr__shard_prepare(tsr__shard *s, int64_t version, Tessera__V1__PrepareResponse *resp,
                       tsr_error *err);
int tsr__shard_commit(tsr__shard *s, int64_t version, tsr_error *err);
int tsr__shard_abort(tsr__shard *s, int64_t version, tsr_error *err);
/* Fills versions[] (up to cap) with the versions held after the release. */
int tsr__shard_release(tsr__shard *s, int64_t below, int64_t *versions, size_t cap,
                       size_t *n, tsr_error *err);
/* Snapshot of the held versions: refs into out (cap entries), states; caller unrefs. */
size_t tsr__shard_list(tsr__shard *s, tsr__held *out, size_t cap, int *staging_version_set,
                       int64_t *staging_version, int64_t *current_version);

#endif
