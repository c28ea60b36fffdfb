/*
 * etcd — the etcd v3 client (API and contract in etcd.h).
 *
 * Unary KV and Lease calls go through tsr_rpc_call_pb with member failover (call_any).
 * LeaseKeepAlive is a bidirectional stream in etcd's API; one renewal is one stream used
 * like a unary call (one request, half-close, one response: etcd's server answers each
 * request and ends the stream at the client's half-close), which needs no long-lived state.
 * Watch uses a real stream (tsr_rpc_stream) that stays open between waits; several keys
 * share one stream (one create request each, acknowledged in order), so one thread waits
 * on all of them at once.
 */
#include "net/etcd.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "etcd/v3/rpc.pb-c.h"
#include "net/etcd_int.h"

struct tsr_etcd {
    size_t n;
    char *addr[TSR_ETCD_MAX_ENDPOINTS];
    tsr_rpc_channel *ch[TSR_ETCD_MAX_ENDPOINTS];
    atomic_size_t good;     /* member that answered last */
    int64_t timeout_ms;
};

struct tsr_etcd_watch {
    tsr_rpc_stream *st;
    size_t n;                               /* watched keys on the stream */
    int64_t id[TSR_ETCD_MAX_WATCH_KEYS];    /* etcd's watch id of each */
    int64_t next[TSR_ETCD_MAX_WATCH_KEYS];  /* resume revision of each (0: unknown) */
    tsr_etcd_event *pend;   /* events received while the watches were being created */
    size_t npend;
    char *addr;             /* borrowed from the tsr_etcd, for messages */
};

tsr_etcd *tsr_etcd_open(const char *endpoints, const tsr_rpc_client_opts *copts,
                        int64_t timeout_ms, tsr_error *err)
{
    tsr_etcd *e = tsr_xcalloc(1, sizeof *e);
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    char *list = tsr_xstrdup(endpoints ? endpoints : ""), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (!*t)
            continue;
        if (e->n == TSR_ETCD_MAX_ENDPOINTS) {
            tsr_err(err, TSR_EINVAL, "etcd endpoints: more than %d", TSR_ETCD_MAX_ENDPOINTS);
            goto fail;
        }
        if (!strchr(t, ':')) {
            tsr_err(err, TSR_EINVAL, "etcd endpoint '%s': expected host:port", t);
            goto fail;
        }
        e->addr[e->n] = tsr_xstrdup(t);
        if (!(e->ch[e->n] = tsr_rpc_channel_create(t, copts, err)))
            goto fail;
        e->n++;
    }
    if (!e->n) {
        tsr_err(err, TSR_EINVAL, "etcd endpoints: none given (expected host:port[,host:port])");
        goto fail;
    }
    free(list);
    return e;
fail:
    free(list);
    tsr_etcd_close(e);
    return NULL;
}

void tsr_etcd_close(tsr_etcd *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < TSR_ETCD_MAX_ENDPOINTS; i++) {
        if (e->ch[i])
            tsr_rpc_channel_destroy(e->ch[i]);
        free(e->addr[i]);
    }
    free(e);
}

/* One unary call on the members in turn, from the last good one. */
static int call_any(tsr_etcd *e, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp,
                    tsr_error *err)
{
    char why[1024];
    size_t used = 0;
    why[0] = 0;
    size_t first = atomic_load(&e->good);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (size_t i = 0; i < e->n; i++) {
        size_t k = (first + i) % e->n;
        int code = tsr_rpc_call_pb(e->ch[k], method, req, rd, e->timeout_ms, resp, &res);
        if (code == TSR_RPC_OK) {
            atomic_store(&e->good, k);
            tsr_rpc_result_close(&res);
            return 0;
        }
        if (code != TSR_RPC_UNAVAILABLE && code != TSR_RPC_DEADLINE_EXCEEDED) {
            int rc = tsr_rpc_result_to_error(&res, e->addr[k], err);
            tsr_rpc_result_close(&res);
            return tsr_err_prefix(err, "etcd %s", method), rc;
        }
        if (used < sizeof why)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s%s: %s: %s",
                                     i ? "; " : "", e->addr[k], tsr_rpc_code_name(code),
                                     res.message);
    }
    tsr_rpc_result_close(&res);
    return tsr_err(err, TSR_EUNAVAILABLE, "etcd %s: no member answered (%s)", method, why);
}

/* range_end of "every key starting with p": p with its last byte below 0xff incremented,
 * the rest cut; "\0" (every key) when p is all 0xff. Returns its length; out has len+1. */
static size_t prefix_end(const char *p, size_t len, uint8_t *out)
{
    memcpy(out, p, len);
    for (size_t i = len; i > 0; i--) {
        if ((uint8_t)out[i - 1] < 0xff) {
            out[i - 1]++;
            return i;
        }
    }
    out[0] = 0;
    return 1;
}

static void kv_copy(const Mvccpb__KeyValue *src, tsr_etcd_kv *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->key = tsr_xmalloc(src->key.len + 1);
    if (src->key.len) /* a KeyValue without key has data NULL (memcpy's UB even for 0) */
        memcpy(dst->key, src->key.data, src->key.len);
    dst->key[src->key.len] = 0;
    dst->value = tsr_xmalloc(src->value.len + 1);
    if (src->value.len)
        memcpy(dst->value, src->value.data, src->value.len);
    dst->value[src->value.len] = 0;
    dst->len = src->value.len;
    dst->create_rev = src->create_revision;
    dst->mod_rev = src->mod_revision;
    dst->version = src->version;
    dst->lease = src->lease;
}

void tsr_etcd_kvs_free(tsr_etcd_kv *kvs, size_t n)
{
    if (!kvs)
        return;
    for (size_t i = 0; i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
        kvs[i].key = NULL;
        kvs[i].value = NULL;
    }
}

static int range(tsr_etcd *e, const char *key, int prefix, size_t limit, int last,
                 tsr_etcd_kv **kvs, size_t *n, int64_t *rev, tsr_error *err)
{
    size_t klen = strlen(key);
    uint8_t *end = tsr_xmalloc(klen + 1);
    Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
    rq.key.data = (uint8_t *)key;
    rq.key.len = klen;
    if (prefix) {
        rq.range_end.len = prefix_end(key, klen, end);
        rq.range_end.data = end;
    }
    rq.limit = (int64_t)limit;
    if (last) { /* etcd's SortOrder DESCEND (2) on SortTarget KEY (0), keys only */
        rq.sort_order = 2;
        rq.keys_only = 1;
    }
    Etcdserverpb__RangeResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.KV/Range", &rq.base,
                      &etcdserverpb__range_response__descriptor, (ProtobufCMessage **)&r, err);
    free(end);
    if (rc)
        return rc;
    tsr__etcd_range_take(r, kvs, n, rev);
    etcdserverpb__range_response__free_unpacked(r, NULL);
    return 0;
}

void tsr__etcd_range_take(const Etcdserverpb__RangeResponse *r, tsr_etcd_kv **kvs, size_t *n,
                          int64_t *rev)
{
    *n = r->n_kvs;
    *kvs = r->n_kvs ? tsr_xcalloc(r->n_kvs, sizeof **kvs) : NULL;
    for (size_t i = 0; i < r->n_kvs; i++)
        kv_copy(r->kvs[i], &(*kvs)[i]);
    if (rev)
        *rev = r->header ? r->header->revision : 0;
}

int tsr_etcd_get(tsr_etcd *e, const char *key, tsr_etcd_kv *kv, int64_t *rev, tsr_error *err)
{
    memset(kv, 0, sizeof *kv);
    tsr_etcd_kv *kvs = NULL;
    size_t n = 0;
    int rc = range(e, key, 0, 1, 0, &kvs, &n, rev, err);
    if (rc)
        return rc;
    return tsr__etcd_one(kvs, n, key, kv, err);
}

int tsr__etcd_one(tsr_etcd_kv *kvs, size_t n, const char *key, tsr_etcd_kv *kv, tsr_error *err)
{
    int rc = 0;
    if (!n)
        rc = tsr_err(err, TSR_ENOTFOUND, "etcd: no key %s", key);
    else if (n > 1 || strcmp(kvs[0].key, key) != 0)
        rc = tsr_err(err, TSR_EFORMAT, "etcd: a read of key %s answered %zu keys (the first "
                     "%.100s)", key, n, kvs[0].key);
    else
        *kv = kvs[0];
    if (rc)
        tsr_etcd_kvs_free(kvs, n);
    free(kvs);
    return rc;
}

int tsr_etcd_get_prefix(tsr_etcd *e, const char *prefix, size_t limit, tsr_etcd_kv **kvs,
                        size_t *n, int64_t *rev, tsr_error *err)
{
    return range(e, prefix, 1, limit, 0, kvs, n, rev, err);
}

int tsr_etcd_get_last_keys(tsr_etcd *e, const char *prefix, size_t limit, tsr_etcd_kv **kvs,
                           size_t *n, int64_t *rev, tsr_error *err)
{
    return range(e, prefix, 1, limit, 1, kvs, n, rev, err);
}

int tsr_etcd_put(tsr_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
                 int64_t *rev, tsr_error *err)
{
    Etcdserverpb__PutRequest rq = ETCDSERVERPB__PUT_REQUEST__INIT;
    rq.key.data = (uint8_t *)key;
    rq.key.len = strlen(key);
    rq.value.data = (uint8_t *)value;
    rq.value.len = len;
    rq.lease = lease;
    Etcdserverpb__PutResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.KV/Put", &rq.base,
                      &etcdserverpb__put_response__descriptor, (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    if (rev)
        *rev = r->header ? r->header->revision : 0;
    etcdserverpb__put_response__free_unpacked(r, NULL);
    return 0;
}

int tsr_etcd_delete(tsr_etcd *e, const char *key, int prefix, int64_t *deleted, int64_t *rev,
                    tsr_error *err)
{
    size_t klen = strlen(key);
    uint8_t *end = tsr_xmalloc(klen + 1);
    Etcdserverpb__DeleteRangeRequest rq = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    rq.key.data = (uint8_t *)key;
    rq.key.len = klen;
    if (prefix) {
        rq.range_end.len = prefix_end(key, klen, end);
        rq.range_end.data = end;
    }
    Etcdserverpb__DeleteRangeResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.KV/DeleteRange", &rq.base,
                      &etcdserverpb__delete_range_response__descriptor,
                      (ProtobufCMessage **)&r, err);
    free(end);
    if (rc)
        return rc;
    if (deleted)
        *deleted = r->deleted;
    if (rev)
        *rev = r->header ? r->header->revision : 0;
    etcdserverpb__delete_range_response__free_unpacked(r, NULL);
    return 0;
}

int tsr_etcd_txn(tsr_etcd *e, const tsr_etcd_cmp *cmp, size_t ncmp, const tsr_etcd_op *ops,
                 size_t nops, int *succeeded, int64_t *rev, tsr_error *err)
{
    if (ncmp > 64 || nops > 128) /* etcd's default --max-txn-ops is 128 */
        return tsr_err(err, TSR_EINVAL, "etcd txn: %zu compares, %zu ops (at most 64, 128)",
                       ncmp, nops);
    Etcdserverpb__Compare c[64], *cp[64];
    for (size_t i = 0; i < ncmp; i++) {
        etcdserverpb__compare__init(&c[i]);
        cp[i] = &c[i];
        c[i].result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
        c[i].key.data = (uint8_t *)cmp[i].key;
        c[i].key.len = strlen(cmp[i].key);
        switch (cmp[i].target) {
        case TSR_ETCD_CREATE_REV:
            c[i].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
            c[i].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
            c[i].create_revision = cmp[i].num;
            break;
        case TSR_ETCD_MOD_REV:
            c[i].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
            c[i].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
            c[i].mod_revision = cmp[i].num;
            break;
        case TSR_ETCD_VERSION:
            c[i].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION;
            c[i].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
            c[i].version = cmp[i].num;
            break;
        case TSR_ETCD_VALUE:
            c[i].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE;
            c[i].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
            c[i].value.data = (uint8_t *)cmp[i].value;
            c[i].value.len = cmp[i].len;
            break;
        case TSR_ETCD_LEASE:
            c[i].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE;
            c[i].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE;
            c[i].lease = cmp[i].num;
            break;
        default:
            return tsr_err(err, TSR_EINVAL, "etcd txn: compare %zu: unknown target", i);
        }
    }
    Etcdserverpb__RequestOp ro[128], *rop[128];
    Etcdserverpb__PutRequest put[128];
    Etcdserverpb__DeleteRangeRequest del[128];
    for (size_t i = 0; i < nops; i++) {
        etcdserverpb__request_op__init(&ro[i]);
        rop[i] = &ro[i];
        if (ops[i].del) {
            etcdserverpb__delete_range_request__init(&del[i]);
            del[i].key.data = (uint8_t *)ops[i].key;
            del[i].key.len = strlen(ops[i].key);
            ro[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
            ro[i].request_delete_range = &del[i];
        } else {
            etcdserverpb__put_request__init(&put[i]);
            put[i].key.data = (uint8_t *)ops[i].key;
            put[i].key.len = strlen(ops[i].key);
            put[i].value.data = (uint8_t *)ops[i].value;
            put[i].value.len = ops[i].len;
            put[i].lease = ops[i].lease;
            ro[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
            ro[i].request_put = &put[i];
        }
    }
    Etcdserverpb__TxnRequest rq = ETCDSERVERPB__TXN_REQUEST__INIT;
    rq.compare = cp;
    rq.n_compare = ncmp;
    rq.success = rop;
    rq.n_success = nops;
    Etcdserverpb__TxnResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.KV/Txn", &rq.base,
                      &etcdserverpb__txn_response__descriptor, (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    *succeeded = r->succeeded;
    if (rev)
        *rev = r->header ? r->header->revision : 0;
    etcdserverpb__txn_response__free_unpacked(r, NULL);
    return 0;
}

int tsr_etcd_lease_grant(tsr_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_ttl,
                         tsr_error *err)
{
    Etcdserverpb__LeaseGrantRequest rq = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    rq.ttl = ttl_s;
    Etcdserverpb__LeaseGrantResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.Lease/LeaseGrant", &rq.base,
                      &etcdserverpb__lease_grant_response__descriptor,
                      (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    if (r->error && r->error[0]) {
        rc = tsr_err(err, TSR_EINVAL, "etcd LeaseGrant: %s", r->error);
    } else {
        *id = r->id;
        if (granted_ttl)
            *granted_ttl = r->ttl;
    }
    etcdserverpb__lease_grant_response__free_unpacked(r, NULL);
    return rc;
}

int tsr_etcd_lease_keepalive(tsr_etcd *e, int64_t id, int64_t *ttl, tsr_error *err)
{
    Etcdserverpb__LeaseKeepAliveRequest rq = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    rq.id = id;
    Etcdserverpb__LeaseKeepAliveResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.Lease/LeaseKeepAlive", &rq.base,
                      &etcdserverpb__lease_keep_alive_response__descriptor,
                      (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    *ttl = r->ttl;
    etcdserverpb__lease_keep_alive_response__free_unpacked(r, NULL);
    if (*ttl <= 0)
        return tsr_err(err, TSR_ENOTFOUND, "etcd lease %llx has expired",
                       (unsigned long long)id);
    return 0;
}

int tsr_etcd_lease_revoke(tsr_etcd *e, int64_t id, tsr_error *err)
{
    Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
    rq.id = id;
    Etcdserverpb__LeaseRevokeResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.Lease/LeaseRevoke", &rq.base,
                      &etcdserverpb__lease_revoke_response__descriptor,
                      (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    etcdserverpb__lease_revoke_response__free_unpacked(r, NULL);
    return 0;
}

/* ---------------------------------------------------------------------------- watch -- */

void tsr_etcd_events_free(tsr_etcd_event *ev, size_t n)
{
    if (!ev)
        return;
    for (size_t i = 0; i < n; i++)
        tsr_etcd_kvs_free(&ev[i].kv, 1);
    free(ev);
}

/* Receives one WatchResponse. */
static int watch_recv(tsr_etcd_watch *w, int64_t timeout_ms, Etcdserverpb__WatchResponse **out,
                      tsr_error *err)
{
    uint8_t *msg;
    size_t len;
    int rc = tsr_rpc_stream_recv(w->st, timeout_ms, &msg, &len, err);
    if (rc)
        return rc == TSR_ETIMEOUT ? rc : tsr_err_prefix(err, "etcd watch on %s", w->addr), rc;
    *out = etcdserverpb__watch_response__unpack(NULL, len, msg);
    free(msg);
    if (!*out)
        return tsr_err(err, TSR_EFORMAT, "etcd watch on %s: unparsable WatchResponse",
                       w->addr);
    return 0;
}

/* Sends the create request of keys[i] on w's stream. */
static int watch_create(tsr_etcd_watch *w, const tsr_etcd_watch_key *k, int64_t timeout_ms,
                        tsr_error *err)
{
    size_t klen = strlen(k->key);
    uint8_t *end = tsr_xmalloc(klen + 1);
    Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    cr.key.data = (uint8_t *)k->key;
    cr.key.len = klen;
    if (k->prefix) {
        cr.range_end.len = prefix_end(k->key, klen, end);
        cr.range_end.data = end;
    }
    cr.start_revision = k->from_rev;
    Etcdserverpb__WatchRequest rq = ETCDSERVERPB__WATCH_REQUEST__INIT;
    rq.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    rq.create_request = &cr;
    size_t len;
    uint8_t *buf = tsr_rpc_pack(&rq.base, &len);
    free(end);
    int rc = buf ? tsr_rpc_stream_send(w->st, buf, len, timeout_ms, err)
                 : tsr_err(err, TSR_ENOMEM, "etcd watch: packing the request");
    free(buf);
    return rc ? tsr_err_prefix(err, "etcd watch on %s", w->addr), rc : 0;
}

/* Index of etcd's watch id among w's keys; w->n when it is none of them. */
static size_t watch_index(const tsr_etcd_watch *w, int64_t id)
{
    size_t i = 0;
    while (i < w->n && w->id[i] != id)
        i++;
    return i;
}

/* Events of response r into ev / n (appended), each tagged with its key's index; the
 * resume revisions move past them. */
static int watch_events(tsr_etcd_watch *w, const Etcdserverpb__WatchResponse *r,
                        tsr_etcd_event **ev, size_t *n, tsr_error *err)
{
    tsr_etcd_event *got = NULL;
    size_t k = 0;
    int rc = tsr__etcd_watch_take(r, w->addr, &got, &k, err);
    size_t i = watch_index(w, r->watch_id);
    if (rc || !k || i == w->n) { /* an error, a progress notice, or a watch not ours */
        tsr_etcd_events_free(got, k);
        return rc;
    }
    *ev = tsr_xrealloc(*ev, (*n + k) * sizeof **ev);
    for (size_t j = 0; j < k; j++) {
        got[j].watch = i;
        if (got[j].kv.mod_rev >= w->next[i])
            w->next[i] = got[j].kv.mod_rev + 1;
        (*ev)[(*n)++] = got[j];
    }
    free(got); /* the kvs moved */
    return 0;
}

/* Opens a stream on member k and creates every watch of keys on it. */
static int watch_open_on(tsr_etcd *e, size_t k, const tsr_etcd_watch_key *keys, size_t n,
                         tsr_etcd_watch **wp, tsr_error *err)
{
    tsr_etcd_watch *w = tsr_xcalloc(1, sizeof *w);
    w->addr = e->addr[k];
    if (!(w->st = tsr_rpc_stream_open(e->ch[k], "/etcdserverpb.Watch/Watch", 0, err))) {
        free(w);
        return TSR_EIO;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = watch_create(w, &keys[i], e->timeout_ms, err);
    /* etcd acknowledges the creates in order; events of the watches created first may come
     * in between (kept for watch_next) */
    while (rc == 0 && w->n < n) {
        Etcdserverpb__WatchResponse *r = NULL;
        if ((rc = watch_recv(w, e->timeout_ms, &r, err)))
            break;
        if (r->created) {
            int64_t id = 0;
            rc = tsr__etcd_watch_created(r, w->addr, keys[w->n].from_rev, &id, err);
            if (rc == 0) {
                w->id[w->n] = id;
                w->next[w->n] = keys[w->n].from_rev;
                w->n++;
            }
        } else {
            rc = watch_events(w, r, &w->pend, &w->npend, err);
        }
        etcdserverpb__watch_response__free_unpacked(r, NULL);
    }
    if (rc) {
        tsr_etcd_watch_close(w);
        return rc;
    }
    *wp = w;
    return 0;
}

int tsr_etcd_watch_open_keys(tsr_etcd *e, const tsr_etcd_watch_key *keys, size_t n,
                             tsr_etcd_watch **wp, tsr_error *err)
{
    *wp = NULL;
    if (n == 0 || n > TSR_ETCD_MAX_WATCH_KEYS)
        return tsr_err(err, TSR_EINVAL, "etcd watch: %zu keys (expected 1 to %d)", n,
                       TSR_ETCD_MAX_WATCH_KEYS);
    /* from the member that answered last; a member that does not answer (or refuses the
     * stream) is skipped, as call_any does for unary calls */
    size_t first = atomic_load(&e->good) % e->n;
    int rc = TSR_EUNAVAILABLE;
    for (size_t i = 0; i < e->n; i++) {
        size_t k = (first + i) % e->n;
        rc = watch_open_on(e, k, keys, n, wp, err);
        if (rc == 0) {
            atomic_store(&e->good, k);
            return 0;
        }
        if (rc == TSR_ESTATE || rc == TSR_EINVAL || rc == TSR_EFORMAT)
            return rc; /* etcd's answer: another member would say the same */
    }
    return rc;
}

int tsr_etcd_watch_open(tsr_etcd *e, const char *key, int prefix, int64_t from_rev,
                        tsr_etcd_watch **wp, tsr_error *err)
{
    tsr_etcd_watch_key k = {key, prefix, from_rev};
    return tsr_etcd_watch_open_keys(e, &k, 1, wp, err);
}

int64_t tsr_etcd_watch_resume_rev(const tsr_etcd_watch *w, size_t i)
{
    return i < w->n ? w->next[i] : 0;
}

const char *tsr_etcd_watch_member(const tsr_etcd_watch *w)
{
    return w->addr;
}

int tsr_etcd_watch_next(tsr_etcd_watch *w, int64_t timeout_ms, tsr_etcd_event **ev, size_t *n,
                        tsr_error *err)
{
    *ev = NULL;
    *n = 0;
    if (w->npend) { /* events that came while the watches were being created */
        *ev = w->pend;
        *n = w->npend;
        w->pend = NULL;
        w->npend = 0;
        return 0;
    }
    for (;;) {
        Etcdserverpb__WatchResponse *r = NULL;
        int rc = watch_recv(w, timeout_ms, &r, err);
        if (rc)
            return rc;
        rc = watch_events(w, r, ev, n, err);
        etcdserverpb__watch_response__free_unpacked(r, NULL);
        if (rc || *n)
            return rc;
        /* a progress notification or a fragment header: wait on */
    }
}

int tsr_etcd_compact(tsr_etcd *e, int64_t rev, int *already, tsr_error *err)
{
    if (already)
        *already = 0;
    if (rev <= 0)
        return tsr_err(err, TSR_EINVAL, "etcd Compact: revision %lld (expected > 0)",
                       (long long)rev);
    Etcdserverpb__CompactionRequest rq = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
    rq.revision = rev;
    Etcdserverpb__CompactionResponse *r = NULL;
    int rc = call_any(e, "/etcdserverpb.KV/Compact", &rq.base,
                      &etcdserverpb__compaction_response__descriptor,
                      (ProtobufCMessage **)&r, err);
    if (rc == 0) {
        etcdserverpb__compaction_response__free_unpacked(r, NULL);
        return 0;
    }
    /* OUT_OF_RANGE "mvcc: required revision has been compacted": done before (by us on
     * another member, a retried request, or another client) — what was asked holds */
    if (rc != TSR_EUNAVAILABLE && strstr(err->msg, "has been compacted")) {
        tsr_error_clear(err);
        if (already)
            *already = 1;
        return 0;
    }
    return rc;
}

int tsr__etcd_watch_created(const Etcdserverpb__WatchResponse *r, const char *addr,
                            int64_t from_rev, int64_t *id, tsr_error *err)
{
    if (r->compact_revision > 0)
        return tsr_err(err, TSR_ESTATE, "etcd watch on %s: revision %lld was compacted "
                       "(oldest kept: %lld)", addr, (long long)from_rev,
                       (long long)r->compact_revision);
    if (!r->created || r->canceled)
        return tsr_err(err, TSR_EINVAL, "etcd watch on %s: not created: %s", addr,
                       r->cancel_reason ? r->cancel_reason : "");
    *id = r->watch_id;
    return 0;
}

int tsr__etcd_watch_take(const Etcdserverpb__WatchResponse *r, const char *addr,
                         tsr_etcd_event **ev, size_t *n, tsr_error *err)
{
    *ev = NULL;
    *n = 0;
    if (r->canceled || r->compact_revision > 0)
        return tsr_err(err, r->compact_revision > 0 ? TSR_ESTATE : TSR_EUNAVAILABLE,
                       "etcd watch on %s: canceled (%s; compacted to %lld)", addr,
                       r->cancel_reason ? r->cancel_reason : "",
                       (long long)r->compact_revision);
    if (!r->n_events)
        return 0;
    *ev = tsr_xcalloc(r->n_events, sizeof **ev);
    for (size_t i = 0; i < r->n_events; i++) {
        const Mvccpb__Event *x = r->events[i];
        (*ev)[i].deleted = x->type == MVCCPB__EVENT__EVENT_TYPE__DELETE;
        if (x->kv)
            kv_copy(x->kv, &(*ev)[i].kv);
    }
    *n = r->n_events;
    return 0;
}

void tsr_etcd_watch_close(tsr_etcd_watch *w)
{
    if (!w)
        return;
    tsr_rpc_stream_close(w->st);
    tsr_etcd_events_free(w->pend, w->npend);
    free(w);
}
