/*
 * fuzz_etcd_response — what the etcd client (common/net/etcd.c) does with the bytes a member
 * answers, without an etcd: byte 0 picks the response (byte % 6), the rest is its message.
 *   0 RangeResponse        unpack, tsr__etcd_range_take (get_prefix), tsr__etcd_one (get)
 *   1 WatchResponse        unpack, tsr__etcd_watch_created (the first of a watch)
 *   2 WatchResponse        unpack, tsr__etcd_watch_take (a later one: events)
 *   3 TxnResponse          unpack (tsr_etcd_txn reads succeeded and header->revision)
 *   4 LeaseGrantResponse   unpack (tsr_etcd_lease_grant reads error, ID, TTL)
 *   5 LeaseKeepAliveResponse unpack (tsr_etcd_lease_keepalive reads TTL)
 * For 3..5 etcd.c's own handling is a few scalar reads inline in its calls, not factored
 * out: the harness covers protobuf-c's unpacking of them and reads the same fields.
 * Checks: no crash (ASan/UBSan), no leak (LeakSanitizer: every copy freed), a key read by
 * tsr__etcd_one is the key asked for.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/etcd_int.h"

static volatile uint64_t sink; /* unsigned: fuzzed values may overflow a sum */

static void range(const uint8_t *b, size_t n)
{
    Etcdserverpb__RangeResponse *r = etcdserverpb__range_response__unpack(NULL, n, b);
    if (!r)
        return;
    tsr_etcd_kv *kvs = NULL;
    size_t nk = 0;
    int64_t rev = 0;
    tsr__etcd_range_take(r, &kvs, &nk, &rev);
    tsr_etcd_kvs_free(kvs, nk);
    free(kvs);
    tsr__etcd_range_take(r, &kvs, &nk, NULL);
    tsr_etcd_kv kv;
    tsr_error err = TSR_ERROR_INIT;
    memset(&kv, 0, sizeof kv);
    if (tsr__etcd_one(kvs, nk, "/tessera/current", &kv, &err) == 0) {
        if (strcmp(kv.key, "/tessera/current") != 0)
            abort();
        tsr_etcd_kvs_free(&kv, 1);
    }
    etcdserverpb__range_response__free_unpacked(r, NULL);
}

static void watch(const uint8_t *b, size_t n, int first)
{
    Etcdserverpb__WatchResponse *r = etcdserverpb__watch_response__unpack(NULL, n, b);
    if (!r)
        return;
    tsr_error err = TSR_ERROR_INIT;
    if (first) {
        int64_t id = 0;
        tsr__etcd_watch_created(r, "127.0.0.1:2379", 5, &id, &err);
    } else {
        tsr_etcd_event *ev = NULL;
        size_t ne = 0;
        if (tsr__etcd_watch_take(r, "127.0.0.1:2379", &ev, &ne, &err) == 0)
            for (size_t i = 0; i < ne; i++)
                sink += (uint64_t)ev[i].kv.mod_rev + ev[i].kv.len + (uint64_t)ev[i].deleted;
        tsr_etcd_events_free(ev, ne);
    }
    etcdserverpb__watch_response__free_unpacked(r, NULL);
}

static void seed(const char *dir, const char *name, int sel, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(n + 1);
    b[0] = (uint8_t)sel;
    protobuf_c_message_pack(m, b + 1);
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n + 1, f) != n + 1)
        exit(1);
    fclose(f);
    free(b);
}

static void write_seeds(const char *dir)
{
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    h.revision = 42;
    h.cluster_id = 7;
    h.member_id = 9;
    h.raft_term = 3;
    Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT, kv2 = kv, *kvp[2] = {&kv, &kv2};
    kv.key.data = (uint8_t *)"/tessera/current";
    kv.key.len = strlen("/tessera/current");
    kv.value.data = (uint8_t *)"12";
    kv.value.len = 2;
    kv.create_revision = 5;
    kv.mod_revision = 40;
    kv.version = 3;
    kv2.key.data = (uint8_t *)"/tessera/leader";
    kv2.key.len = strlen("/tessera/leader");
    kv2.value.data = (uint8_t *)"coord-a";
    kv2.value.len = 7;
    kv2.lease = 0x1234;
    Etcdserverpb__RangeResponse rr = ETCDSERVERPB__RANGE_RESPONSE__INIT;
    rr.header = &h;
    rr.kvs = kvp;
    rr.n_kvs = 1;
    rr.count = 1;
    seed(dir, "range_one", 0, &rr.base);
    rr.n_kvs = 2;
    rr.count = 2;
    seed(dir, "range_two", 0, &rr.base);
    Etcdserverpb__WatchResponse wr = ETCDSERVERPB__WATCH_RESPONSE__INIT;
    wr.header = &h;
    wr.watch_id = 1;
    wr.created = 1;
    seed(dir, "watch_created", 1, &wr.base);
    wr.created = 0;
    wr.compact_revision = 30;
    seed(dir, "watch_compacted", 1, &wr.base);
    wr.compact_revision = 0;
    Mvccpb__Event e1 = MVCCPB__EVENT__INIT, e2 = e1, *ep[2] = {&e1, &e2};
    e1.kv = &kv;
    e2.type = MVCCPB__EVENT__EVENT_TYPE__DELETE;
    e2.kv = &kv2;
    wr.events = ep;
    wr.n_events = 2;
    seed(dir, "watch_events", 2, &wr.base);
    Etcdserverpb__TxnResponse tr = ETCDSERVERPB__TXN_RESPONSE__INIT;
    tr.header = &h;
    tr.succeeded = 1;
    seed(dir, "txn_ok", 3, &tr.base);
    Etcdserverpb__LeaseGrantResponse lg = ETCDSERVERPB__LEASE_GRANT_RESPONSE__INIT;
    lg.header = &h;
    lg.id = 0x1234;
    lg.ttl = 10;
    seed(dir, "lease_grant", 4, &lg.base);
    Etcdserverpb__LeaseKeepAliveResponse ka = ETCDSERVERPB__LEASE_KEEP_ALIVE_RESPONSE__INIT;
    ka.header = &h;
    ka.id = 0x1234;
    ka.ttl = 9;
    seed(dir, "lease_keepalive", 5, &ka.base);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *sd = getenv("TSR_FUZZ_SEEDS");
    if (sd) {
        write_seeds(sd);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    switch (data[0] % 6) {
    case 0:
        range(b, n);
        break;
    case 1:
    case 2:
        watch(b, n, data[0] % 6 == 1);
        break;
    case 3: {
        Etcdserverpb__TxnResponse *r = etcdserverpb__txn_response__unpack(NULL, n, b);
        if (r) {
            sink += (uint64_t)r->succeeded + (uint64_t)(r->header ? r->header->revision : 0);
            etcdserverpb__txn_response__free_unpacked(r, NULL);
        }
        break;
    }
    case 4: {
        Etcdserverpb__LeaseGrantResponse *r = etcdserverpb__lease_grant_response__unpack(NULL, n, b);
        if (r) {
            sink += (uint64_t)r->id + (uint64_t)r->ttl + (r->error ? strlen(r->error) : 0);
            etcdserverpb__lease_grant_response__free_unpacked(r, NULL);
        }
        break;
    }
    default: {
        Etcdserverpb__LeaseKeepAliveResponse *r =
            etcdserverpb__lease_keep_alive_response__unpack(NULL, n, b);
        if (r) {
            sink += (uint64_t)r->ttl;
            etcdserverpb__lease_keep_alive_response__free_unpacked(r, NULL);
        }
        break;
    }
    }
    return 0;
}
