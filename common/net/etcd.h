/*
 * etcd — a client of etcd v3's gRPC API for Tessera's control plane (the HA issue: the
 * committed version, the plan, the groups, the label counter, the operation records and the
 * leader's lease live in etcd; docs/coordinator.md).
 *
 * What it offers is what the control plane needs and no more: single-key reads and prefix
 * reads, puts and deletes, history compaction, transactions whose compares are all "equal" (create/mod
 * revision, version, value, lease of a key) — the building block of compare-and-swap,
 * election and fenced commits —, leases (grant, keep-alive, revoke) and watches. Messages
 * are etcd's own (proto/etcd/v3, trimmed copies of etcd 3.4's files), carried by the
 * project's rpc layer (common/net/rpc: channels, TLS, deadlines, streaming calls).
 *
 * Endpoints: a comma-separated list of host:port of the cluster's members. Each request goes
 * to the member that answered last; on UNAVAILABLE or DEADLINE_EXCEEDED it is retried once
 * on each other member (etcd members forward to the raft leader, so any member will do).
 * A request is retried only when it cannot have been applied twice harmfully: reads always;
 * puts, deletes and transactions too — a transaction guarded by a compare cannot apply twice
 * (the second attempt's compare fails, which the caller sees as "not succeeded" and must
 * re-read), and an unguarded put of the same value is idempotent.
 *
 * Errors: TSR_EUNAVAILABLE when no member answered (err names each member and its error),
 * TSR_EINVAL for what etcd refused as invalid, TSR_EFORMAT for an unparsable answer.
 *
 * DESIGN (threads): a tsr_etcd may be used by any number of threads at once (the channels
 * are thread-safe; the index of the last good member is an atomic). A tsr_etcd_watch has one
 * user thread.
 */
#ifndef TSR_ETCD_H
#define TSR_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "net/rpc.h"

#define TSR_ETCD_MAX_ENDPOINTS 16

typedef struct tsr_etcd tsr_etcd;

/* Connects to endpoints ("h:p[,h:p...]", at most TSR_ETCD_MAX_ENDPOINTS) with copts
 * (TLS, token; NULL = plaintext) and a per-request deadline of timeout_ms (<= 0: 5000).
 * Nothing is sent yet. NULL with err set for a malformed list. */
tsr_etcd *tsr_etcd_open(const char *endpoints, const tsr_rpc_client_opts *copts,
                        int64_t timeout_ms, tsr_error *err);
void tsr_etcd_close(tsr_etcd *e); /* accepts NULL */

/* One key-value as read (owned by its array: tsr_etcd_kvs_free). */
typedef struct tsr_etcd_kv {
    char *key;              /* NUL-terminated copy */
    uint8_t *value;         /* value bytes (NUL-terminated for convenience), len bytes */
    size_t len;
    int64_t create_rev, mod_rev, version, lease;
} tsr_etcd_kv;

void tsr_etcd_kvs_free(tsr_etcd_kv *kvs, size_t n);

/* Reads key: *kv filled (tsr_etcd_kvs_free(kv, 1)) and 0; TSR_ENOTFOUND when absent (kv
 * zeroed). *rev (may be NULL) = the store's revision of the read. */
int tsr_etcd_get(tsr_etcd *e, const char *key, tsr_etcd_kv *kv, int64_t *rev, tsr_error *err);

/* Reads every key starting with prefix, in key order, at most limit (0 = all): *kvs
 * (caller frees with tsr_etcd_kvs_free), *n. */
int tsr_etcd_get_prefix(tsr_etcd *e, const char *prefix, size_t limit, tsr_etcd_kv **kvs,
                        size_t *n, int64_t *rev, tsr_error *err);

/* The LAST keys starting with prefix, in descending key order, at most limit, keys only
 * (values empty): a linearizable read of the newest key under a prefix (coordinator/meta.c
 * tsr__meta_stream_head). Same ownership as tsr_etcd_get_prefix. */
int tsr_etcd_get_last_keys(tsr_etcd *e, const char *prefix, size_t limit, tsr_etcd_kv **kvs,
                           size_t *n, int64_t *rev, tsr_error *err);

/* Puts key = value (len bytes), attached to lease (0 = none). *rev = the new revision. */
int tsr_etcd_put(tsr_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
                 int64_t *rev, tsr_error *err);

/* Deletes key, or with prefix != 0 every key starting with it. *deleted = how many. */
int tsr_etcd_delete(tsr_etcd *e, const char *key, int prefix, int64_t *deleted, int64_t *rev,
                    tsr_error *err);

/* ---- transactions: if every compare holds, apply ops --------------------------------- */
enum tsr_etcd_target {
    TSR_ETCD_CREATE_REV,    /* create revision of key == num (0 = the key does not exist) */
    TSR_ETCD_MOD_REV,       /* mod revision == num */
    TSR_ETCD_VERSION,       /* version == num */
    TSR_ETCD_VALUE,         /* value == (value, len) */
    TSR_ETCD_LEASE          /* lease == num */
};

typedef struct tsr_etcd_cmp {
    const char *key;
    enum tsr_etcd_target target;
    int64_t num;
    const void *value;
    size_t len;
} tsr_etcd_cmp;

typedef struct tsr_etcd_op {
    int del;                /* 0 = put, 1 = delete key */
    const char *key;
    const void *value;      /* put only */
    size_t len;
    int64_t lease;          /* put only; 0 = none */
} tsr_etcd_op;

/* Applies ops (all of them, atomically) when every compare is equal, else nothing.
 * *succeeded = whether they were applied. Returns 0 either way (a failed compare is not an
 * error); an error code only when etcd could not be asked or refused the request. */
int tsr_etcd_txn(tsr_etcd *e, const tsr_etcd_cmp *cmp, size_t ncmp, const tsr_etcd_op *ops,
                 size_t nops, int *succeeded, int64_t *rev, tsr_error *err);

/* ---- leases ------------------------------------------------------------------------- */
/* Grants a lease of ttl_s seconds: *id, *granted_ttl (etcd may raise a small ttl). */
int tsr_etcd_lease_grant(tsr_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_ttl,
                         tsr_error *err);
/* Renews lease id once: *ttl = the seconds left; TSR_ENOTFOUND when the lease has expired
 * or was revoked (its keys are gone). */
int tsr_etcd_lease_keepalive(tsr_etcd *e, int64_t id, int64_t *ttl, tsr_error *err);
/* Revokes lease id (its keys are deleted). An unknown lease is TSR_ENOTFOUND. */
int tsr_etcd_lease_revoke(tsr_etcd *e, int64_t id, tsr_error *err);

/* ---- history ----------------------------------------------------------------------- */
/* Compacts etcd's key-value history below revision rev: every key keeps its current value,
 * older values (and a watch or read at an older revision) are gone — what bounds etcd's
 * database (docs/operations.md "etcd"). 0 when done; also 0 with *already = 1 (may be NULL)
 * when the history was already compacted at or above rev (OUT_OF_RANGE "has been
 * compacted": by us before, on a retry, or by another client). TSR_EINVAL for rev <= 0 or
 * a future revision; TSR_EUNAVAILABLE as every call. */
int tsr_etcd_compact(tsr_etcd *e, int64_t rev, int *already, tsr_error *err);

/* ---- watches ------------------------------------------------------------------------ */
typedef struct tsr_etcd_watch tsr_etcd_watch;

typedef struct tsr_etcd_event {
    int deleted;            /* 0 = put */
    size_t watch;           /* which watched key it matched: its index in keys[] of
                               tsr_etcd_watch_open_keys (0 for tsr_etcd_watch_open) */
    tsr_etcd_kv kv;         /* the key's new state (for a delete: key and mod_rev only) */
} tsr_etcd_event;

void tsr_etcd_events_free(tsr_etcd_event *ev, size_t n);

/* Watches key (prefix != 0: every key starting with it) from revision from_rev (0 = changes
 * after now; a read's rev + 1 = every change after that read, so nothing is missed between
 * a read and its watch). The watch is established when this returns 0. */
int tsr_etcd_watch_open(tsr_etcd *e, const char *key, int prefix, int64_t from_rev,
                        tsr_etcd_watch **w, tsr_error *err);

/* Several keys (or prefixes) watched on ONE stream, so that one wait covers them all: each
 * keys[i] as tsr_etcd_watch_open's key / prefix / from_rev; events say which (ev.watch).
 * The stream goes to the member that answered last, else the next one that answers.
 * Errors as tsr_etcd_watch_open (TSR_ESTATE when a from_rev was compacted away). */
#define TSR_ETCD_MAX_WATCH_KEYS 8
typedef struct tsr_etcd_watch_key {
    const char *key;
    int prefix;
    int64_t from_rev;
} tsr_etcd_watch_key;
int tsr_etcd_watch_open_keys(tsr_etcd *e, const tsr_etcd_watch_key *keys, size_t n,
                             tsr_etcd_watch **w, tsr_error *err);

/* The from_rev to re-open watched key i with after the stream broke, so that nothing is
 * missed or repeated: its last event's revision + 1, else the from_rev it was opened with
 * (0 = it was opened "from now": that cannot resume without a gap; re-read instead). */
int64_t tsr_etcd_watch_resume_rev(const tsr_etcd_watch *w, size_t i);

/* The member ("host:port") the watch's stream is on (borrowed from the tsr_etcd). */
const char *tsr_etcd_watch_member(const tsr_etcd_watch *w);

/* Waits up to timeout_ms for changes: 0 with *ev (caller frees with tsr_etcd_events_free)
 * and *n >= 1; TSR_ETIMEOUT when nothing changed; TSR_ESTATE when from_rev was compacted
 * away (re-read and re-watch); another code when the member went away (re-open the watch
 * from the last revision seen + 1: it resumes without a gap). */
int tsr_etcd_watch_next(tsr_etcd_watch *w, int64_t timeout_ms, tsr_etcd_event **ev, size_t *n,
                        tsr_error *err);
void tsr_etcd_watch_close(tsr_etcd_watch *w); /* accepts NULL */

#endif
