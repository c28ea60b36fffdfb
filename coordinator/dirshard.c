/*
 * dirshard — the id directory of a version rebuilt from its shards (see dirshard.h for
 * the digest, the commit order and the threads). Calls config.c (the groups of a version)
 * and replica.c (an address's gRPC target); never meta.c.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "dirshard.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/mem.h"
#include "tessera/v1/coord_log.pb-c.h"

#define PAGE 50000          /* entries per Shard.List call (the shard's limit: 100000) */
#define CALL_MS 30000       /* one page's deadline */
#define ROUNDS 3            /* rebuilds tried, each from other replicas */
#define ENTRY_FIXED 22      /* bytes of an entry besides its id (state.c's format) */

static uint64_t mix(uint64_t x) /* splitmix64's finalizer: spreads FNV's bits for the sum */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t tsr__dir_entry_digest(const char *id, size_t idlen, int64_t label, int32_t list,
                               int32_t group, int dense, int sparse)
{
    uint8_t tail[18];
    memcpy(tail, &label, 8);
    memcpy(tail + 8, &list, 4);
    memcpy(tail + 12, &group, 4);
    tail[16] = dense != 0;
    tail[17] = sparse != 0;
    uint32_t l32 = (uint32_t)idlen;
    uint64_t h = tsr_fnv1a64(TSR_FNV1A64_BASIS, &l32, 4);
    h = tsr_fnv1a64(h, id, idlen);
    return mix(tsr_fnv1a64(h, tail, sizeof tail));
}

int tsr__dir_file_summary(const uint8_t *b, size_t n, uint64_t *count, int64_t *next_label,
                          uint64_t *digest, tsr_error *err)
{
    uint32_t fmt;
    uint64_t cnt, sum = 0;
    if (n < 24 || memcmp(b, "TSRD", 4) != 0)
        return tsr_err(err, TSR_EFORMAT, "directory file: %zu bytes, expected the \"TSRD\" "
                       "header of 24", n);
    memcpy(&fmt, b + 4, 4);
    memcpy(next_label, b + 8, 8);
    memcpy(&cnt, b + 16, 8);
    if (fmt != 1 || cnt > n / ENTRY_FIXED)
        return tsr_err(err, TSR_EFORMAT, "directory file: format %u (expected 1), count %" PRIu64,
                       fmt, cnt);
    size_t off = 24;
    for (uint64_t i = 0; i < cnt; i++) {
        uint32_t len;
        if (n - off < 4)
            goto trunc;
        memcpy(&len, b + off, 4);
        if (n - off - 4 < (size_t)len + 18)
            goto trunc;
        const uint8_t *p = b + off + 4 + len;
        int64_t label;
        int32_t list, group;
        memcpy(&label, p, 8);
        memcpy(&list, p + 8, 4);
        memcpy(&group, p + 12, 4);
        sum += tsr__dir_entry_digest((const char *)b + off + 4, len, label, list, group, p[16],
                                     p[17]);
        off += 4 + (size_t)len + 18;
    }
    *count = cnt;
    *digest = sum;
    return 0;
trunc:
    return tsr_err(err, TSR_EFORMAT, "directory file: truncated at offset %zu", off);
}

/* ---------------------------------------------------------------- the listing */

typedef struct glist {
    const tsr__coord *c;
    uint64_t version;
    size_t group;
    char **addrs;            /* borrowed: the group's replicas */
    size_t naddr;
    unsigned start;          /* the replica tried first */
    /* out */
    uint8_t *b;              /* entries in state.c's format (no header) */
    size_t n, cap;
    uint64_t count, digest;
    int rc;
    tsr_error err;
} glist;

static void put(glist *g, const void *p, size_t n)
{
    if (g->n + n > g->cap) {
        g->cap = g->cap ? g->cap * 2 : 1 << 16;
        while (g->cap < g->n + n)
            g->cap *= 2;
        g->b = tsr_xrealloc(g->b, g->cap);
    }
    memcpy(g->b + g->n, p, n);
    g->n += n;
}

/* Every page of the group's slice of version g->version from replica addr into g. */
static int list_replica(glist *g, const char *addr, tsr_error *err)
{
    char t[512];
    tsr__coord_target_of(addr, t, sizeof t);
    tsr_rpc_channel *ch = tsr_rpc_channel_create(t, &g->c->shard_opts, err);
    if (!ch)
        return err->code ? err->code : TSR_EUNAVAILABLE;
    g->n = 0;
    g->count = g->digest = 0;
    int rc = 0;
    int64_t start = 0, total = -1;
    for (int more = 1; more && rc == 0;) {
        Tessera__V1__ShardListRequest rq = TESSERA__V1__SHARD_LIST_REQUEST__INIT;
        rq.version = (int64_t)g->version;
        rq.start_label = start;
        rq.limit = PAGE;
        Tessera__V1__ShardListResponse *rp = NULL;
        tsr_rpc_result res;
        tsr_rpc_result_init(&res);
        int code = tsr_rpc_call_pb(ch, TSR_SHARD_SVC "List", &rq.base,
                                   &tessera__v1__shard_list_response__descriptor, CALL_MS,
                                   (ProtobufCMessage **)&rp, &res);
        if (code != TSR_RPC_OK) {
            rc = tsr_rpc_result_to_error(&res, addr, err);
            tsr_rpc_result_close(&res);
            break;
        }
        tsr_rpc_result_close(&res);
        if (total < 0)
            total = rp->total;
        /* columns of one length, ids adding up; labels ascending from start, the next
         * page after them */
        size_t ne = rp->n_labels, idsum = 0;
        for (size_t i = 0; i < rp->n_id_lengths && i < ne; i++)
            idsum += rp->id_lengths[i];
        if (rp->n_lists != ne || rp->flags.len != ne || rp->n_id_lengths != ne ||
            idsum != rp->ids.len || rp->total != total)
            rc = tsr_err(err, TSR_EFORMAT, "%s: List of version %" PRIu64 ": a page of %zu "
                         "labels, %zu lists, %zu flags, %zu id lengths (%zu bytes, ids %zu), "
                         "total %lld (first page: %lld)", addr, g->version, ne, rp->n_lists,
                         rp->flags.len, rp->n_id_lengths, idsum, rp->ids.len,
                         (long long)rp->total, (long long)total);
        int64_t prev = start - 1;
        const char *id = (const char *)rp->ids.data;
        for (size_t i = 0; i < ne && rc == 0; i++) {
            int64_t label = rp->labels[i];
            if (label <= prev) {
                rc = tsr_err(err, TSR_EFORMAT, "%s: List of version %" PRIu64 ": label %lld "
                             "after %lld (expected ascending)", addr, g->version,
                             (long long)label, (long long)prev);
                break;
            }
            prev = label;
            uint32_t len = rp->id_lengths[i];
            int32_t grp = (int32_t)g->group, list = rp->lists[i];
            uint8_t f[2] = {rp->flags.data[i] & 1, (rp->flags.data[i] >> 1) & 1};
            put(g, &len, 4);
            put(g, id, len);
            put(g, &label, 8);
            put(g, &list, 4);
            put(g, &grp, 4);
            put(g, f, 2);
            g->count++;
            g->digest += tsr__dir_entry_digest(id, len, label, list, grp, f[0], f[1]);
            id += len;
        }
        more = rp->more;
        if (rc == 0 && more && (rp->next_label <= prev || ne == 0))
            rc = tsr_err(err, TSR_EFORMAT, "%s: List of version %" PRIu64 ": a page of %zu "
                         "entries from label %lld says more from %lld: it does not go "
                         "forward", addr, g->version, ne, (long long)start,
                         (long long)rp->next_label);
        start = rp->next_label;
        protobuf_c_message_free_unpacked(&rp->base, NULL);
    }
    if (rc == 0 && (int64_t)g->count != total)
        rc = tsr_err(err, TSR_EFORMAT, "%s: List of version %" PRIu64 ": %" PRIu64 " entries, "
                     "the shard said %lld", addr, g->version, g->count, (long long)total);
    tsr_rpc_channel_destroy(ch);
    return rc;
}

static void *list_group(void *arg)
{
    glist *g = arg;
    g->rc = TSR_EUNAVAILABLE;
    tsr_err(&g->err, TSR_EUNAVAILABLE, "group %zu has no replica", g->group);
    for (size_t k = 0; k < g->naddr; k++) {
        const char *addr = g->addrs[(g->start + k) % g->naddr];
        tsr_error e = TSR_ERROR_INIT;
        if ((g->rc = list_replica(g, addr, &e)) == 0)
            return NULL;
        tsr_warn("directory of version %" PRIu64 ": group %zu replica %s cannot list it: %s",
                 g->version, g->group, addr, e.msg);
        g->err = e;
    }
    return NULL;
}

/* The 24-byte header of a directory file (state.c's format) at b; returns b + 24. */
static uint8_t *dir_header(uint8_t *b, int64_t next_label, uint64_t count)
{
    uint32_t fmt = 1;
    memcpy(b, "TSRD", 4);
    memcpy(b + 4, &fmt, 4);
    memcpy(b + 8, &next_label, 8);
    memcpy(b + 16, &count, 8);
    return b + 24;
}

/* The carried rounds of di (a fold's, meta.h tsr__meta_carry) applied onto the groups'
 * listing as the leader's catch-up put them onto its directory (stream_dir.c): in seq
 * order, a round's upserts (the id's entry replaced, in the group that logged it) then its
 * removed ids; the result checked against di and written in state.c's format. */
static int with_carry(const tsr__meta_dirsum *di, const glist *gs, size_t ng, uint8_t **buf,
                      size_t *len, tsr_error *err)
{
    tsr__dir d;
    tsr__dir_init(&d);
    char *id = NULL;
    size_t idcap = 0, applied = 0;
    int rc = 0;
    for (size_t g = 0; g < ng; g++) { /* list_replica wrote these: well formed */
        for (size_t off = 0; off < gs[g].n;) {
            uint32_t l;
            memcpy(&l, gs[g].b + off, 4);
            const uint8_t *p = gs[g].b + off + 4 + l;
            if (l + 1 > idcap) {
                idcap = 2 * (l + 1);
                id = tsr_xrealloc(id, idcap);
            }
            memcpy(id, gs[g].b + off + 4, l);
            id[l] = 0;
            int64_t label;
            int32_t list, grp;
            memcpy(&label, p, 8);
            memcpy(&list, p + 8, 4);
            memcpy(&grp, p + 12, 4);
            tsr__dir_set(&d, id, label, list, grp, p[16], p[17], 0);
            off += 4 + (size_t)l + 18;
        }
    }
    for (size_t i = 0; i < di->nrounds && rc == 0; i++) {
        Tessera__V1__CoordLogRecord *rec =
            tessera__v1__coord_log_record__unpack(NULL, di->round_lens[i], di->rounds[i]);
        if (!rec || (uint64_t)rec->version != di->carry.from) {
            rc = tsr_err(err, TSR_EFORMAT, "version %" PRIu64 ": record %zu of version %" PRIu64
                         "'s mirrored log is not one of its CoordLogRecords", di->version, i,
                         di->carry.from);
        } else if (rec->seq > di->carry.after && rec->seq <= di->carry.upto) {
            for (size_t k = 0; k < rec->n_writes; k++) {
                const Tessera__V1__CoordLogWrite *lw = rec->writes[k];
                for (size_t u = 0; lw->write && lw->group >= 0 && u < lw->write->n_upserts; u++) {
                    const Tessera__V1__StagedUpsert *up = lw->write->upserts[u];
                    const Tessera__V1__IndexDatapoint *dp = up->datapoint;
                    if (dp && dp->datapoint_id)
                        tsr__dir_set(&d, dp->datapoint_id, up->label, up->list, lw->group,
                                     dp->n_feature_vector > 0,
                                     dp->sparse_embedding && dp->sparse_embedding->n_values > 0,
                                     0);
                }
            }
            for (size_t k = 0; k < rec->n_removed_ids; k++)
                tsr__dir_remove(&d, rec->removed_ids[k]);
            applied++;
        }
        if (rec)
            tessera__v1__coord_log_record__free_unpacked(rec, NULL);
    }
    uint64_t count = d.n, sum = 0;
    size_t bytes = 24;
    for (size_t i = 0; i < d.n; i++)
        bytes += 4 + strlen(d.e[i].id) + 18;
    if (rc == 0) {
        for (size_t i = 0; i < d.n; i++) {
            const tsr__dir_entry *e = &d.e[i];
            sum += tsr__dir_entry_digest(e->id, strlen(e->id), e->label, e->list, e->shard,
                                         e->dense, e->sparse);
        }
        if (count != di->count || sum != di->digest)
            rc = tsr_err(err, TSR_EFORMAT, "the shards list, with the %zu rounds (%lld, %lld] "
                         "of version %" PRIu64 " carried, %" PRIu64 " entries with digest "
                         "%016" PRIx64 ", the version record says %" PRIu64 " with digest "
                         "%016" PRIx64 ": refused", applied, (long long)di->carry.after,
                         (long long)di->carry.upto, di->carry.from, count, sum, di->count,
                         di->digest);
    }
    if (rc == 0) {
        uint8_t *b = tsr_xmalloc(bytes), *p = dir_header(b, di->next_label, count);
        for (size_t i = 0; i < d.n; i++) {
            const tsr__dir_entry *e = &d.e[i];
            uint32_t l = (uint32_t)strlen(e->id);
            uint8_t f[2] = {e->dense != 0, e->sparse != 0};
            memcpy(p, &l, 4);
            memcpy(p + 4, e->id, l);
            p += 4 + l;
            memcpy(p, &e->label, 8);
            memcpy(p + 8, &e->list, 4);
            memcpy(p + 12, &e->shard, 4);
            memcpy(p + 16, f, 2);
            p += 18;
        }
        *buf = b;
        *len = bytes;
        tsr_info("directory of version %" PRIu64 ": %zu rounds (%lld, %lld] of version %" PRIu64
                 " carried onto the shards' listing", di->version, applied,
                 (long long)di->carry.after, (long long)di->carry.upto, di->carry.from);
    }
    free(id);
    tsr__dir_close(&d);
    return rc;
}

/* One round: every live group listed in parallel, then checked against di. */
static int rebuild_round(const tsr__coord *c, const tsr__coord_config *gc,
                         const tsr__meta_dirsum *di, unsigned round, uint8_t **buf,
                         size_t *len, tsr_error *err)
{
    size_t ng = gc->nshards;
    glist *gs = tsr_xcalloc(ng ? ng : 1, sizeof *gs);
    pthread_t *th = tsr_xcalloc(ng ? ng : 1, sizeof *th);
    uint8_t *started = tsr_xcalloc(ng ? ng : 1, 1);
    for (size_t g = 0; g < ng; g++) {
        gs[g] = (glist){.c = c, .version = di->version, .group = g, .addrs = gc->replicas[g],
                        .naddr = gc->nreplicas[g], .start = round, .err = TSR_ERROR_INIT};
        if (gc->retired[g])
            continue; /* a removed group owns nothing */
        if (pthread_create(&th[g], NULL, list_group, &gs[g]) == 0)
            started[g] = 1;
        else
            list_group(&gs[g]);
    }
    uint64_t count = 0, sum = 0;
    size_t bytes = 24;
    int rc = 0;
    for (size_t g = 0; g < ng; g++) {
        if (started[g])
            pthread_join(th[g], NULL);
        if (gc->retired[g])
            continue;
        if (gs[g].rc && rc == 0) {
            rc = gs[g].rc;
            *err = gs[g].err;
            tsr_err_prefix(err, "group %zu, every replica", g);
        }
        count += gs[g].count;
        sum += gs[g].digest;
        bytes += gs[g].n;
    }
    if (rc == 0 && di->carry.from) {
        rc = with_carry(di, gs, ng, buf, len, err);
        goto out;
    }
    if (rc == 0 && (count != di->count || sum != di->digest))
        rc = tsr_err(err, TSR_EFORMAT, "the shards list %" PRIu64 " entries with digest "
                     "%016" PRIx64 ", the version record says %" PRIu64 " with digest "
                     "%016" PRIx64 ": refused", count, sum, di->count, di->digest);
    if (rc == 0) {
        uint8_t *b = tsr_xmalloc(bytes), *p = dir_header(b, di->next_label, count);
        for (size_t g = 0; g < ng; g++) {
            if (gs[g].n)
                memcpy(p, gs[g].b, gs[g].n);
            p += gs[g].n;
        }
        *buf = b;
        *len = bytes;
    }
out:
    for (size_t g = 0; g < ng; g++)
        free(gs[g].b);
    free(gs);
    free(th);
    free(started);
    return rc;
}

int tsr__dir_rebuild(void *ud, const tsr__meta_dirsum *di, uint8_t **buf, size_t *len,
                     tsr_error *err)
{
    const tsr__coord *c = ud;
    *buf = NULL;
    *len = 0;
    tsr__coord_config parsed;
    const tsr__coord_config *gc = &c->cfg; /* the config's groups: arrays never move */
    int rc = 0;
    if (di->groups) {
        if ((rc = tsr__coord_config_parse_groups(di->groups, di->groups_len, &parsed, err)))
            return tsr_err_prefix(err, "version %" PRIu64 ": its groups", di->version);
        gc = &parsed;
    }
    int64_t t0 = tsr_clock_mono_ms();
    for (unsigned round = 0; round < ROUNDS; round++) {
        if (round) {
            tsr_warn("directory of version %" PRIu64 ": %s; listing again (round %u of %d)",
                     di->version, err->msg, round + 1, ROUNDS);
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
            tsr_error_clear(err);
        }
        if ((rc = rebuild_round(c, gc, di, round, buf, len, err)) == 0)
            break;
    }
    if (rc == 0)
        tsr_info("directory of version %" PRIu64 " rebuilt from %zu shard group(s): %" PRIu64
                 " ids, %zu bytes, %lld ms", di->version, (size_t)gc->nshards, di->count,
                 *len, (long long)(tsr_clock_mono_ms() - t0));
    else
        tsr_err_prefix(err, "directory of version %" PRIu64 " from the shards", di->version);
    if (gc == &parsed)
        tsr__coord_config_close(&parsed);
    return rc;
}
