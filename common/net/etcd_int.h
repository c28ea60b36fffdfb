/*
 * etcd_int — the parts of etcd.c that turn an etcd response (an unpacked protobuf-c message
 * received from a member) into what the tsr_etcd_* calls return, split out so that the fuzz
 * harness tests/fuzz/fuzz_etcd_response.c can feed them hostile responses without an etcd.
 * Only etcd.c and the tests use them.
 */
#ifndef TSR_ETCD_INTERNAL_H
#define TSR_ETCD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "etcd/v3/rpc.pb-c.h"
#include "net/etcd.h"

/* A Range response r (borrowed) into *kvs (new array of *n copies; caller frees with
 * tsr_etcd_kvs_free and free) and *rev (may be NULL) = its header's revision (0 without). */
void tsr__etcd_range_take(const Etcdserverpb__RangeResponse *r, tsr_etcd_kv **kvs, size_t *n,
                          int64_t *rev);

/* tsr_etcd_get's verdict on the kvs (taken: freed or moved) a read of key returned: 0 with
 * *kv the key's; TSR_ENOTFOUND for none; TSR_EFORMAT when the member answered more than one
 * key or another key (a broken or hostile member: nothing is taken from it). */
int tsr__etcd_one(tsr_etcd_kv *kvs, size_t n, const char *key, tsr_etcd_kv *kv, tsr_error *err);

/* The first response of a watch opened from from_rev on member addr: 0 with *id set when it
 * was created; TSR_ESTATE when from_rev was compacted away; TSR_EINVAL when etcd did not
 * create it (err names addr and etcd's reason). */
int tsr__etcd_watch_created(const Etcdserverpb__WatchResponse *r, const char *addr,
                            int64_t from_rev, int64_t *id, tsr_error *err);

/* A later response of a watch: 0 with *ev (new array, tsr_etcd_events_free) and *n >= 1 for
 * events, 0 with *n = 0 for a progress notification (wait on); TSR_ESTATE (compacted) or
 * TSR_EUNAVAILABLE (canceled) with err set. */
int tsr__etcd_watch_take(const Etcdserverpb__WatchResponse *r, const char *addr,
                         tsr_etcd_event **ev, size_t *n, tsr_error *err);

#endif
