/*
 * meta — the coordinator's metadata backend (local folder or etcd); see meta.h for the
 * layout in etcd and the commit point. Calls no other file of the folder but dirshard.c
 * (a directory file's summary); the directory's rebuild from the shards is the caller's
 * tsr__meta_dir_fn.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meta.h"
#include "dirshard.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/mem.h"

/* The files of a version in etcd: the first NREQUIRED always, "groups" (the shard groups,
 * written by a reshard and every version after it, docs/resharding.md) only when the
 * version has it: its line in PREFIX/version is then part of the commit transaction, so
 * the groups flip with the version and a deposed leader cannot commit them. */
static const char *const FILES[] = {"template.faiss", "plan", "directory", "groups"};
#define NFILES (sizeof FILES / sizeof FILES[0])
#define NREQUIRED 3

/* FILES[FILE_DIR]: the directory, in etcd as its summary (dsum) or as a blob (a reshard
 * move's version, or a record written before the summary existed) */
#define FILE_DIR 2
#define FILE_GROUPS 3 /* FILES[FILE_GROUPS]: where the directory lives (read before it) */

/* What PREFIX/version says: the version and each file's length and digest (has[i] 0: an
 * optional file the version does not have); for the directory with dsum, its summary
 * instead (len and sum unused). */
typedef struct vrec {
    uint64_t version;
    size_t len[NFILES];
    uint64_t sum[NFILES];
    uint8_t has[NFILES];
    uint8_t dsum;
    uint64_t dcount, ddigest;
    int64_t dnext;
    tsr__meta_carry carry; /* from 0: none */
} vrec;

static uint64_t digest(const void *p, size_t n)
{
    return tsr_fnv1a64(TSR_FNV1A64_BASIS, p, n);
}

void tsr__meta_key(const tsr__meta *m, const char *suffix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", m->prefix, suffix);
}

int tsr__meta_open(const char *endpoints, const char *prefix, const tsr_rpc_client_opts *copts,
                   int ttl_s, tsr__meta **out, tsr_error *err)
{
    *out = NULL;
    if (!prefix)
        prefix = "/tessera/default";
    size_t pl = strlen(prefix);
    while (pl > 1 && prefix[pl - 1] == '/')
        pl--;
    if (pl == 0 || prefix[0] != '/' || pl > 200)
        return tsr_err(err, TSR_EINVAL, "--etcd-prefix \"%s\": expected a key path starting "
                       "with '/', at most 200 characters", prefix);
    tsr_etcd *e = tsr_etcd_open(endpoints, copts, 5000, err);
    if (!e)
        return err->code ? err->code : TSR_EINVAL;
    int64_t fast_ms = (int64_t)ttl_s * 1000 / 6;
    fast_ms = fast_ms < 300 ? 300 : fast_ms > 1500 ? 1500 : fast_ms;
    tsr_etcd *f = tsr_etcd_open(endpoints, copts, fast_ms, err);
    if (!f) {
        tsr_etcd_close(e);
        return err->code ? err->code : TSR_EINVAL;
    }
    tsr__meta *m = tsr_xcalloc(1, sizeof *m);
    m->etcd = e;
    m->fast = f;
    memcpy(m->prefix, prefix, pl);
    m->prefix[pl] = 0;
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return 0;
}

void tsr__meta_close(tsr__meta *m)
{
    if (!m)
        return;
    tsr_etcd_close(m->etcd);
    tsr_etcd_close(m->fast);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static size_t vrec_format(const vrec *r, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "tessera-version 1\nversion %" PRIu64 "\n", r->version);
    for (size_t i = 0; i < NFILES && n < cap; i++)
        if (i == FILE_DIR && r->dsum)
            n += (size_t)snprintf(buf + n, cap - n, "dirsum %" PRIu64 " %" PRId64 " %016" PRIx64
                                  "\n", r->dcount, r->dnext, r->ddigest);
        else if (r->has[i])
            n += (size_t)snprintf(buf + n, cap - n, "file %s %zu %016" PRIx64 "\n", FILES[i],
                                  r->len[i], r->sum[i]);
    if (r->carry.from && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "carry %" PRIu64 " %" PRId64 " %" PRId64 "\n",
                              r->carry.from, r->carry.after, r->carry.upto);
    return n < cap ? n : cap - 1;
}

static int vrec_parse(const tsr__meta *m, const char *s, vrec *r, tsr_error *err)
{
    memset(r, 0, sizeof *r);
    int used = 0;
    if (sscanf(s, "tessera-version 1\nversion %" SCNu64 "\n%n", &r->version, &used) != 1 ||
        used <= 0 || r->version == 0)
        goto bad;
    s += used;
    for (size_t i = 0; i < NFILES; i++) {
        char name[32];
        if (i >= NREQUIRED && (!*s || strncmp(s, "carry ", 6) == 0))
            break; /* an optional file the version does not have */
        if (i == FILE_DIR && strncmp(s, "dirsum ", 7) == 0) {
            if (sscanf(s, "dirsum %" SCNu64 " %" SCNd64 " %" SCNx64 "\n%n", &r->dcount,
                       &r->dnext, &r->ddigest, &used) != 3 || used <= 0)
                goto bad;
            r->has[i] = r->dsum = 1;
            s += used;
            continue;
        }
        if (sscanf(s, "file %31s %zu %" SCNx64 "\n%n", name, &r->len[i], &r->sum[i], &used) != 3 ||
            strcmp(name, FILES[i]) != 0 || r->len[i] > TSR__META_MAX_FILE)
            goto bad;
        r->has[i] = 1;
        s += used;
    }
    if (strncmp(s, "carry ", 6) == 0) {
        if (!r->dsum ||
            sscanf(s, "carry %" SCNu64 " %" SCNd64 " %" SCNd64 "\n%n", &r->carry.from,
                   &r->carry.after, &r->carry.upto, &used) != 3 || used <= 0 ||
            r->carry.from == 0 || r->carry.from >= r->version ||
            r->carry.after >= r->carry.upto)
            goto bad;
        s += used;
    }
    return 0;
bad:
    return tsr_err(err, TSR_EFORMAT, "etcd key %s/version: expected \"tessera-version 1\", "
                   "\"version N\" and one \"file NAME LEN DIGEST\" line per file (%s, %s, %s, "
                   "then %s when the version has it; the %s as \"dirsum ENTRIES NEXT_LABEL "
                   "DIGEST\" instead, then optionally \"carry FROM_VERSION AFTER_SEQ UPTO_SEQ\" "
                   "with AFTER < UPTO)", m->prefix, FILES[0], FILES[1], FILES[2], FILES[3],
                   FILES[FILE_DIR]);
}

/* Reads PREFIX/version into *r (version 0 when absent) and its mod revision. */
static int read_vrec(tsr__meta *m, tsr_etcd *e, vrec *r, int64_t *rev, tsr_error *err)
{
    char key[300];
    tsr__meta_key(m, "/version", key, sizeof key);
    tsr_etcd_kv kv;
    memset(r, 0, sizeof *r);
    *rev = 0;
    int rc = tsr_etcd_get(e, key, &kv, NULL, err);
    if (rc == TSR_ENOTFOUND) {
        tsr_error_clear(err);
        return 0;
    }
    if (rc)
        return rc;
    rc = vrec_parse(m, (const char *)kv.value, r, err);
    *rev = kv.mod_rev;
    tsr_etcd_kvs_free(&kv, 1);
    return rc;
}

int tsr__meta_read_version(tsr__meta *m, uint64_t *version, int64_t *rev, tsr_error *err)
{
    vrec r;
    int rc = read_vrec(m, m->etcd, &r, rev, err);
    *version = rc ? 0 : r.version;
    return rc;
}

static void blob_prefix(const tsr__meta *m, uint64_t v, const char *file, char *buf, size_t cap)
{
    if (file)
        snprintf(buf, cap, "%s/blobs/%" PRIu64 "/%s/", m->prefix, v, file);
    else
        snprintf(buf, cap, "%s/blobs/%" PRIu64 "/", m->prefix, v);
}

/* Downloads file i of r from etcd into *buf (checked against its length and digest). */
static int fetch_file(tsr__meta *m, const vrec *r, size_t i, uint8_t **buf, tsr_error *err)
{
    char pre[320];
    blob_prefix(m, r->version, FILES[i], pre, sizeof pre);
    tsr_etcd_kv *kvs = NULL;
    size_t n = 0;
    int rc = tsr_etcd_get_prefix(m->etcd, pre, 0, &kvs, &n, NULL, err);
    if (rc)
        return rc;
    uint8_t *b = tsr_xmalloc(r->len[i] ? r->len[i] : 1);
    size_t got = 0;
    for (size_t k = 0; k < n && rc == 0; k++) { /* keys sort in chunk order (%08zu) */
        if (kvs[k].len > r->len[i] - got)
            rc = TSR_EFORMAT;
        else {
            memcpy(b + got, kvs[k].value, kvs[k].len);
            got += kvs[k].len;
        }
    }
    tsr_etcd_kvs_free(kvs, n);
    free(kvs);
    if (rc || got != r->len[i] || digest(b, got) != r->sum[i]) {
        free(b);
        return tsr_err(err, TSR_EFORMAT, "etcd %s*: %zu bytes in %zu chunk(s), expected %zu "
                       "bytes with digest %016" PRIx64, pre, got, n, r->len[i], r->sum[i]);
    }
    *buf = b;
    return 0;
}

/* 1 when st holds version r->version with files matching r. */
static int cached(tsr_store *st, const vrec *r)
{
    tsr_error e = TSR_ERROR_INIT;
    if (tsr_store_verify(st, r->version, &e))
        return 0;
    for (size_t i = 0; i < NFILES; i++) {
        void *b = NULL;
        size_t len = 0;
        int rc = tsr_store_read_file(st, r->version, FILES[i], TSR__META_MAX_FILE, &b, &len, &e);
        int ok;
        if (i == FILE_DIR && r->dsum) {
            uint64_t cnt = 0, sum = 0;
            int64_t next = 0;
            ok = rc == 0 && tsr__dir_file_summary(b, len, &cnt, &next, &sum, &e) == 0 &&
                 cnt == r->dcount && next == r->dnext && sum == r->ddigest;
        } else {
            ok = r->has[i] ? rc == 0 && len == r->len[i] && digest(b, len) == r->sum[i]
                           : rc == TSR_ENOTFOUND;
        }
        free(b);
        if (!ok)
            return 0;
    }
    return 1;
}

/* The directory of r from dirfn (its summary's version: listed from the shards), with
 * the version's groups file (already fetched into gb, or NULL) to say where it lives. */
/* The mirrored records of a version, copied (rebuild_dir's carry). */
typedef struct rounds {
    uint8_t **b;
    size_t *l, n, cap;
} rounds;

static int keep_round(void *ud, const uint8_t *buf, size_t len, tsr_error *err)
{
    rounds *rs = ud;
    (void)err;
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 64;
        rs->b = tsr_xrealloc(rs->b, rs->cap * sizeof *rs->b);
        rs->l = tsr_xrealloc(rs->l, rs->cap * sizeof *rs->l);
    }
    rs->b[rs->n] = tsr_xmalloc(len ? len : 1);
    memcpy(rs->b[rs->n], buf, len);
    rs->l[rs->n++] = len;
    return 0;
}

static int rebuild_dir(tsr__meta *m, const vrec *r, const uint8_t *gb, tsr__meta_dir_fn dirfn,
                       void *ud, uint8_t **buf, size_t *len, tsr_error *err)
{
    if (!dirfn)
        return tsr_err(err, TSR_EINTERNAL, "version %" PRIu64 ": its directory must be "
                       "rebuilt from the shards, and no way to do it was given", r->version);
    tsr__meta_dirsum di = {r->version, r->dcount, r->dnext, r->ddigest, (const char *)gb,
                           gb ? r->len[FILE_GROUPS] : 0, r->carry, NULL, NULL, 0};
    if (!r->carry.from)
        return dirfn(ud, &di, buf, len, err);
    rounds rs = {0};
    int rc = tsr__meta_log_fetch(m, r->carry.from, -1, keep_round, &rs, err);
    if (rc == 0) {
        di.rounds = (const uint8_t *const *)rs.b;
        di.round_lens = rs.l;
        di.nrounds = rs.n;
        rc = dirfn(ud, &di, buf, len, err);
    } else {
        tsr_err_prefix(err, "version %" PRIu64 ": the rounds it carried from version %" PRIu64,
                       r->version, r->carry.from);
    }
    for (size_t i = 0; i < rs.n; i++)
        free(rs.b[i]);
    free(rs.b);
    free(rs.l);
    return rc;
}

/* Writes version r from etcd (the directory: from dirfn when r keeps only its summary)
 * into st (a stale cached copy is replaced). The groups are fetched before the directory:
 * they say which shards hold it. */
static int download(tsr__meta *m, tsr_store *st, const vrec *r, tsr__meta_dir_fn dirfn,
                    void *ud, tsr_error *err)
{
    static const size_t order[NFILES] = {0, 1, FILE_GROUPS, FILE_DIR};
    uint8_t *b[NFILES] = {0};
    size_t bl[NFILES] = {0};
    int rc = 0;
    for (size_t k = 0; k < NFILES && rc == 0; k++) {
        size_t i = order[k];
        if (!r->has[i])
            continue;
        if (i == FILE_DIR && r->dsum)
            rc = rebuild_dir(m, r, b[FILE_GROUPS], dirfn, ud, &b[i], &bl[i], err);
        else if ((rc = fetch_file(m, r, i, &b[i], err)) == 0)
            bl[i] = r->len[i];
    }
    tsr_error e = TSR_ERROR_INIT;
    tsr_store_txn *t = NULL;
    if (rc == 0) {
        tsr_store_remove(st, r->version, &e); /* a cached copy that does not match */
        rc = tsr_store_begin(st, r->version, &t, err);
    }
    for (size_t i = 0; i < NFILES && rc == 0; i++)
        if (r->has[i])
            rc = tsr_store_txn_write_file(t, FILES[i], b[i], bl[i], err);
    for (size_t i = 0; i < NFILES; i++)
        free(b[i]);
    if (rc) {
        if (t)
            tsr_store_abort(t);
        return rc;
    }
    return tsr_store_commit(t, err);
}

int tsr__meta_sync(tsr__meta *m, tsr_store *st, tsr__meta_dir_fn dirfn, void *ud,
                   uint64_t *version, tsr_error *err)
{
    *version = 0;
    if (!m) {
        int rc = tsr_store_current(st, version, err);
        if (rc == TSR_ENOTFOUND) {
            tsr_error_clear(err);
            return 0;
        }
        return rc;
    }
    vrec r;
    int64_t rev = 0;
    int rc = read_vrec(m, m->etcd, &r, &rev, err);
    if (rc)
        return rc;
    if (r.version > 0 && !cached(st, &r)) {
        int64_t t0 = tsr_clock_mono_ms();
        if ((rc = download(m, st, &r, dirfn, ud, err)))
            return rc;
        tsr_info("etcd %s: version %" PRIu64 " loaded into the cache (%zu bytes from etcd%s, "
                 "%lld ms)", m->prefix, r.version, r.len[0] + r.len[1] + r.len[2] + r.len[3],
                 r.dsum ? "; the directory from the shards" : "",
                 (long long)(tsr_clock_mono_ms() - t0));
    }
    if (r.version > 0 && (rc = tsr_store_set_current(st, r.version, err)))
        return rc;
    pthread_mutex_lock(&m->mu);
    m->ver_rev = rev;
    m->version = r.version;
    pthread_mutex_unlock(&m->mu);
    *version = r.version;
    return 0;
}

/* Uploads the files of version v of st into etcd (the directory only with dir_blob, else
 * its summary); fills r. */
static int upload(tsr__meta *m, tsr_store *st, uint64_t v, int dir_blob, vrec *r,
                  tsr_error *err)
{
    memset(r, 0, sizeof *r);
    r->version = v;
    char pre[320], key[360];
    blob_prefix(m, v, NULL, pre, sizeof pre);
    int rc = tsr_etcd_delete(m->etcd, pre, 1, NULL, NULL, err); /* a failed earlier try */
    for (size_t i = 0; i < NFILES && rc == 0; i++) {
        void *b = NULL;
        size_t len = 0;
        rc = tsr_store_read_file(st, v, FILES[i], TSR__META_MAX_FILE, &b, &len, err);
        if (rc == TSR_ENOTFOUND && i >= NREQUIRED) { /* an optional file it does not have */
            tsr_error_clear(err);
            rc = 0;
            continue;
        }
        if (rc)
            break;
        r->has[i] = 1;
        if (i == FILE_DIR && !dir_blob) { /* its summary only: the shards hold it */
            r->dsum = 1;
            rc = tsr__dir_file_summary(b, len, &r->dcount, &r->dnext, &r->ddigest, err);
            free(b);
            if (rc)
                tsr_err_prefix(err, "version %" PRIu64 "", v);
            continue;
        }
        r->len[i] = len;
        r->sum[i] = digest(b, len);
        blob_prefix(m, v, FILES[i], pre, sizeof pre);
        for (size_t off = 0, k = 0; rc == 0 && (off < len || k == 0); off += TSR__META_CHUNK, k++) {
            size_t n = len - off < TSR__META_CHUNK ? len - off : TSR__META_CHUNK;
            snprintf(key, sizeof key, "%s%08zu", pre, k);
            rc = tsr_etcd_put(m->etcd, key, (const uint8_t *)b + off, n, 0, NULL, err);
        }
        free(b);
    }
    return rc;
}

int tsr__meta_commit(tsr__meta *m, tsr_store *st, uint64_t v, int dir_blob,
                     const tsr__meta_carry *carry, const tsr_etcd_cmp *extra, size_t ncmp,
                     tsr_error *err)
{
    if (!m)
        return 0;
    vrec r;
    int rc = upload(m, st, v, dir_blob, &r, err);
    if (rc)
        return rc;
    if (carry && carry->from && r.dsum)
        r.carry = *carry;
    char key[300], val[512];
    tsr__meta_key(m, "/version", key, sizeof key);
    size_t vl = vrec_format(&r, val, sizeof val);
    pthread_mutex_lock(&m->mu);
    int64_t seen = m->ver_rev;
    pthread_mutex_unlock(&m->mu);
    tsr_etcd_cmp cmp[8];
    if (ncmp > 7)
        return tsr_err(err, TSR_EINTERNAL, "meta commit: %zu extra compares (at most 7)", ncmp);
    cmp[0] = (tsr_etcd_cmp){key, TSR_ETCD_MOD_REV, seen, NULL, 0};
    for (size_t i = 0; i < ncmp; i++)
        cmp[i + 1] = extra[i];
    tsr_etcd_op op = {0, key, val, vl, 0};
    int ok = 0;
    int64_t rev = 0;
    rc = tsr_etcd_txn(m->etcd, cmp, ncmp + 1, &op, 1, &ok, &rev, err);
    if (rc == 0 && !ok) {
        /* a retried transaction whose first try applied also reads "not succeeded" */
        tsr_etcd_kv kv;
        if (tsr_etcd_get(m->etcd, key, &kv, NULL, err) == 0) {
            if (kv.len == vl && memcmp(kv.value, val, vl) == 0) {
                ok = 1;
                rev = kv.mod_rev;
            }
            tsr_etcd_kvs_free(&kv, 1);
        }
        if (!ok)
            return tsr_err(err, TSR_ESTATE, "etcd %s: the commit of version %" PRIu64 " was "
                           "refused: the version key changed since revision %lld or this "
                           "coordinator is no longer the leader", key, v, (long long)seen);
    }
    if (rc)
        return rc;
    pthread_mutex_lock(&m->mu);
    m->ver_rev = rev;
    m->version = v;
    pthread_mutex_unlock(&m->mu);
    if (v > 2) { /* keep the committed version and the one before */
        char pre[320];
        tsr_error e = TSR_ERROR_INIT;
        blob_prefix(m, v - 2, NULL, pre, sizeof pre);
        tsr_etcd_delete(m->etcd, pre, 1, NULL, NULL, &e);
    }
    return 0;
}

/* ---------------------------------------------------------------- records (operations) */

static void aux_key(const tsr__meta *m, const char *sub, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s/%s", m->prefix, sub, name ? name : "");
}

int tsr__meta_aux_write(tsr__meta *m, const char *sub, const char *name, const void *buf,
                        size_t len, tsr_error *err)
{
    char key[400];
    aux_key(m, sub, name, key, sizeof key);
    if (len > TSR__META_CHUNK)
        return tsr_err(err, TSR_ELIMIT, "etcd %s: a record of %zu bytes (at most %u)", key, len,
                       TSR__META_CHUNK);
    return tsr_etcd_put(m->etcd, key, buf, len, 0, NULL, err);
}

int tsr__meta_aux_list(tsr__meta *m, const char *sub, char ***names, size_t *n, tsr_error *err)
{
    char pre[400];
    aux_key(m, sub, NULL, pre, sizeof pre);
    tsr_etcd_kv *kvs = NULL;
    size_t k = 0;
    *names = NULL;
    *n = 0;
    int rc = tsr_etcd_get_prefix(m->etcd, pre, 0, &kvs, &k, NULL, err);
    if (rc)
        return rc;
    *names = tsr_xcalloc(k + 1, sizeof **names);
    size_t pl = strlen(pre);
    for (size_t i = 0; i < k; i++)
        (*names)[(*n)++] = tsr_xstrdup(kvs[i].key + pl);
    tsr_etcd_kvs_free(kvs, k);
    free(kvs);
    return 0;
}

int tsr__meta_aux_read(tsr__meta *m, const char *sub, const char *name, size_t max_len,
                       void **buf, size_t *len, tsr_error *err)
{
    char key[400];
    aux_key(m, sub, name, key, sizeof key);
    tsr_etcd_kv kv;
    *buf = NULL;
    *len = 0;
    int rc = tsr_etcd_get(m->etcd, key, &kv, NULL, err);
    if (rc == TSR_ENOTFOUND)
        return tsr_err(err, rc, "etcd %s: not found", key);
    if (rc)
        return rc;
    if (kv.len > max_len) {
        tsr_etcd_kvs_free(&kv, 1);
        return tsr_err(err, TSR_ELIMIT, "etcd %s: %zu bytes (at most %zu)", key, kv.len, max_len);
    }
    *buf = kv.value; /* NUL-terminated, as tsr_store_aux_read's */
    *len = kv.len;
    kv.value = NULL;
    tsr_etcd_kvs_free(&kv, 1);
    return 0;
}

int tsr__meta_aux_remove(tsr__meta *m, const char *sub, const char *name, tsr_error *err)
{
    char key[400];
    aux_key(m, sub, name, key, sizeof key);
    return tsr_etcd_delete(m->etcd, key, 0, NULL, NULL, err);
}

/* ---------------------------------------------------------------- the stream's log */

static void log_prefix(const tsr__meta *m, uint64_t v, int64_t seq, char *buf, size_t cap)
{
    if (seq < 0)
        snprintf(buf, cap, "%s/stream/%020" PRIu64 "/", m->prefix, v);
    else
        snprintf(buf, cap, "%s/stream/%020" PRIu64 "/%020" PRId64 "/", m->prefix, v, seq);
}

/* One try of a record's put under prefix pre: its chunks, then its mark "n", all fenced,
 * the mark only while it does not exist yet. A one-chunk record (the common round) is
 * ONE transaction: chunk and mark land together or not at all. *ok = whether etcd applied
 * every transaction; returns 0 when etcd answered them all, else the transport's error
 * (the last transaction sent may then have landed or not: in doubt). */
static int log_put_try(tsr__meta *m, const char *pre, const uint8_t *buf, size_t len,
                       const tsr_etcd_cmp *fence, size_t nfence, int *ok, tsr_error *err)
{
    size_t nch = len ? (len + TSR__META_CHUNK - 1) / TSR__META_CHUNK : 1;
    char key[440], mkey[440], mark[64];
    int ml = snprintf(mark, sizeof mark, "%zu %zu", nch, len);
    snprintf(mkey, sizeof mkey, "%sn", pre);
    /* every transaction also requires the mark to be absent: a chunk put whose answer was
     * lost and that etcd applies late cannot land on a completed record */
    tsr_etcd_cmp cmp[4];
    memcpy(cmp, fence, nfence * sizeof *cmp);
    size_t ncmp = nfence;
    cmp[ncmp++] = (tsr_etcd_cmp){mkey, TSR_ETCD_CREATE_REV, 0, NULL, 0};
    *ok = 0;
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * TSR__META_CHUNK;
        size_t n = len - off < TSR__META_CHUNK ? len - off : TSR__META_CHUNK;
        snprintf(key, sizeof key, "%sc%08zu", pre, k);
        tsr_etcd_op op[2] = {{0, key, buf + off, n, 0}, {0, mkey, mark, (size_t)ml, 0}};
        int last = k + 1 == nch;
        int rc = tsr_etcd_txn(m->etcd, cmp, ncmp, op, last && nch == 1 ? 2 : 1, ok, NULL, err);
        if (rc || !*ok)
            return rc;
        if (last && nch > 1) { /* the mark of a record of several chunks: its own txn */
            if ((rc = tsr_etcd_txn(m->etcd, cmp, ncmp, &op[1], 1, ok, NULL, err)) != 0)
                return rc;
        }
    }
    return 0;
}

typedef struct log_same_ud {
    const uint8_t *buf;
    size_t len;
    int found, same;
} log_same_ud;

static int log_same_one(void *ud, const uint8_t *buf, size_t len, tsr_error *err)
{
    log_same_ud *u = ud;
    (void)err;
    u->found = 1;
    u->same = len == u->len && (len == 0 || memcmp(buf, u->buf, len) == 0);
    return 0;
}

int tsr__meta_log_put(tsr__meta *m, uint64_t v, int64_t seq, const uint8_t *buf, size_t len,
                      const tsr_etcd_cmp *fence, size_t nfence, int64_t wait_ms,
                      tsr_error *err)
{
    if (nfence > 3)
        return tsr_err(err, TSR_EINVAL, "etcd: %zu fence compares, at most 3", nfence);
    char pre[400];
    log_prefix(m, v, seq, pre, sizeof pre);
    int64_t until = tsr_clock_mono_ms() + (wait_ms > 0 ? wait_ms : 0);
    for (int tries = 1;; tries++) {
        int ok = 0;
        int rc = log_put_try(m, pre, buf, len, fence, nfence, &ok, err);
        if (rc == 0 && ok)
            return 0;
        if (rc == 0) { /* refused: is an earlier try's record there (its answer was lost)? */
            log_same_ud u = {buf, len, 0, 0};
            tsr_error e2 = TSR_ERROR_INIT;
            rc = tsr__meta_log_fetch(m, v, seq, log_same_one, &u, &e2);
            if (rc == 0 && u.found && u.same) {
                tsr_info("etcd %sn: an earlier try of this round had landed (its answer was "
                         "lost): settled as logged after %d tries", pre, tries);
                return 0;
            }
            if (rc == 0)
                return tsr_err(err, TSR_ESTATE, "%sn: compare failed (%s)", pre,
                               u.found ? "the seq holds another round" : "this coordinator "
                               "is not the leader any more");
            if (err)
                *err = e2;
        }
        /* no answer: the try may have landed. Only the same bytes go under these keys
         * until etcd says which (never another round at this seq: meta.h). */
        if (tsr_clock_mono_ms() >= until) {
            char last[TSR_ERROR_MSG_MAX];
            snprintf(last, sizeof last, "%s", err ? err->msg : "");
            return tsr_err(err, TSR_EUNAVAILABLE, "%sn: outcome unknown after %d tries in "
                           "%lld ms (last: %s)", pre, tries, (long long)wait_ms, last);
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int tsr__meta_log_fetch(tsr__meta *m, uint64_t v, int64_t seq, tsr__meta_log_fn fn, void *ud,
                        tsr_error *err)
{
    char pre[400], q[400];
    log_prefix(m, v, -1, pre, sizeof pre);
    log_prefix(m, v, seq, q, sizeof q); /* seq >= 0: one record, the same walk */
    tsr_etcd_kv *kvs = NULL;
    size_t n = 0;
    int rc = tsr_etcd_get_prefix(m->etcd, q, 0, &kvs, &n, NULL, err);
    if (rc)
        return rc;
    size_t pl = strlen(pre);
    for (size_t i = 0; i < n && rc == 0;) {
        /* one record: its chunks c%08zu in order, then its mark "n" (absent: incomplete) */
        const char *seqkey = kvs[i].key + pl;
        size_t sl = strcspn(seqkey, "/"), j = i, total = 0;
        while (j < n && strncmp(kvs[j].key + pl, seqkey, sl + 1) == 0 &&
               kvs[j].key[pl + sl + 1] == 'c')
            total += kvs[j++].len;
        size_t nch = 0, want = 0;
        int complete = j < n && strncmp(kvs[j].key + pl, seqkey, sl + 1) == 0 &&
                       strcmp(kvs[j].key + pl + sl + 1, "n") == 0 &&
                       sscanf((const char *)kvs[j].value, "%zu %zu", &nch, &want) == 2 &&
                       nch == j - i && want == total;
        if (complete) {
            uint8_t *b = tsr_xmalloc(total ? total : 1);
            size_t off = 0;
            for (size_t k = i; k < j; k++) {
                memcpy(b + off, kvs[k].value, kvs[k].len);
                off += kvs[k].len;
            }
            rc = fn(ud, b, total, err);
            free(b);
            j++;
        } else {
            while (j < n && strncmp(kvs[j].key + pl, seqkey, sl + 1) == 0)
                j++; /* a round whose put failed: it was never acknowledged */
        }
        i = j;
    }
    tsr_etcd_kvs_free(kvs, n);
    free(kvs);
    return rc;
}

void tsr__meta_log_drop(tsr__meta *m, uint64_t v)
{
    char pre[400];
    log_prefix(m, v, -1, pre, sizeof pre);
    tsr_error e = TSR_ERROR_INIT;
    if (tsr_etcd_delete(m->etcd, pre, 1, NULL, NULL, &e))
        tsr_warn("etcd %s*: cannot remove the stream records of version %" PRIu64 ": %s", pre,
                 v, e.msg);
}

int tsr__meta_stream_head(tsr__meta *m, uint64_t *v, int64_t *seq, tsr_error *err)
{
    uint64_t prev = 0;
    for (int tries = 0; tries < 4; tries++) {
        int64_t rev = 0;
        vrec r;
        int rc = read_vrec(m, m->fast, &r, &rev, err); /* absent: version 0 */
        if (rc)
            return rc;
        *v = r.version;
        *seq = 0;
        if (*v == 0 || (tries > 0 && *v == prev))
            return 0; /* v has no round in etcd (no header either): none to wait for */
        prev = *v;
        char pre[400];
        log_prefix(m, *v, -1, pre, sizeof pre);
        tsr_etcd_kv *kvs = NULL;
        size_t n = 0;
        if ((rc = tsr_etcd_get_last_keys(m->fast, pre, 2, &kvs, &n, NULL, err)) != 0)
            return rc;
        int found = 0;
        if (n > 0) {
            size_t pl = strlen(pre);
            long long s = -1;
            char tail[16] = "";
            if (strlen(kvs[0].key) > pl && sscanf(kvs[0].key + pl, "%lld/%15s", &s, tail) == 2 &&
                s >= 0) {
                found = 1;
                *seq = tail[0] == 'n' ? (int64_t)s : (s > 0 ? (int64_t)s - 1 : 0);
            }
        }
        tsr_etcd_kvs_free(kvs, n);
        free(kvs);
        if (found)
            return 0;
        /* empty: dropped after a newer version's commit (read the version again), or a
         * version that never had a round (the same version read again: seq 0) */
    }
    return tsr_err(err, TSR_EUNAVAILABLE, "etcd: the streamed rounds of version %" PRIu64
                   " are gone (a newer version moved in 4 reads in a row)", *v);
}
