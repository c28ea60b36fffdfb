/*
 * reshard_carry — the catch-up of a reshard move (docs/resharding.md "Writes during a
 * move"): the streamed-write rounds logged on the served version N after the move's S
 * (every group's Stage chunk 0 was sent at S, with capture_delta: each group's N+1 folds
 * its delta of S only) up to the last one, T, re-routed by the plan of N+1 and sent, in
 * seq order, as Writes naming the prepared catch-up version N+1 (shard/stream.c takes
 * them into that version's own log and delta). N+1 then holds
 * every acknowledged write on every group before the commit point.
 *
 * Batches: consecutive rounds are merged per group (the last operation on a label wins:
 * an upsert replaces whatever the label held, a delete removes it) into one Write of at
 * most CARRY_MAX operations carrying the seq of the last round merged, so the catch-up
 * costs one fan-out (one fdatasync per replica) per CARRY_MAX operations, not per round.
 *
 * Routing: an upsert goes to the owner of its list in N+1 (of its id's hash when
 * sparse-only), with a delete of its label on every other group of N+1; a delete goes to
 * every group of N+1. When N+1 has N's plan and groups (a fold) each logged Write goes to
 * its own group as it was (verbatim): the round already routed it, the delete of a moved
 * id's old label included, and the deletes for every other group would only multiply the
 * operations carried under the stream lock by the number of groups. Labels are unique over the groups (the coordinator's one counter),
 * so a group without the label ignores its delete, and a label ends where its last upsert
 * put it even when the moved copy staged for it (read at any moment after S, placed by
 * the directory of S) sits elsewhere. The removed group of a remove gets nothing.
 *
 * DESIGN (threads): the update thread, under update_mu and the stream lock (the log and
 * the counters of c->st are the writer's otherwise); no other lock.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mem.h"
#include "tessera/v1/coord_log.pb-c.h"

#define CARRY_MAX 10000 /* operations per batch (a round may hold ROUND_MAX records) */

typedef struct cop {
    int64_t label;
    int32_t list;
    size_t ord;                         /* order of arrival (the later wins) */
    Tessera__V1__StagedUpsert *up;      /* owned copy; NULL = delete */
} cop;

typedef struct gbuf {
    cop *ops;
    size_t n, cap;
} gbuf;

typedef struct carry {
    tsr__coord *c;
    const tsr__snap *ns;
    uint64_t newv;
    size_t S;                   /* ns's groups */
    int verbatim;               /* ns has the served plan and groups: as logged */
    int64_t from, upto;
    const char *skip;
    int64_t *sent;              /* per group of ns: the last seq carried to it */
    gbuf *gb;                   /* per group: the batch's operations */
    size_t pending, ord;
    int64_t last;               /* the last round's seq in the batch */
    size_t rounds, writes, batches;
    int rc;
    tsr_error *err;
} carry;

static void add_op(carry *cr, size_t g, int64_t label, int32_t list,
                   Tessera__V1__StagedUpsert *up)
{
    gbuf *b = &cr->gb[g];
    if (b->n == b->cap)
        b->ops = tsr_xrealloc(b->ops, (b->cap = b->cap ? b->cap * 2 : 64) * sizeof *b->ops);
    b->ops[b->n++] = (cop){label, list, cr->ord++, up};
    cr->pending++;
}

/* A copy the batch owns (the scanned record is freed after its callback). */
static Tessera__V1__StagedUpsert *up_copy(const Tessera__V1__StagedUpsert *u)
{
    size_t n = tessera__v1__staged_upsert__get_packed_size(u);
    uint8_t *buf = tsr_xmalloc(n + 1);
    tessera__v1__staged_upsert__pack(u, buf);
    Tessera__V1__StagedUpsert *c = tessera__v1__staged_upsert__unpack(NULL, n, buf);
    free(buf);
    return c;
}

static int cop_cmp(const void *a, const void *b)
{
    const cop *x = a, *y = b;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

/* Sends the batch: per group one Write naming newv with the batch's last seq, the last
 * operation of each label (a label is never both upserted and deleted in one Write), to
 * every replica not skipped. Empties the batch; cr->rc on a failure. */
static void flush(carry *cr)
{
    tsr__coord *c = cr->c;
    size_t S = cr->S;
    Tessera__V1__ShardWriteRequest *w = tsr_xcalloc(S, sizeof *w);
    Tessera__V1__StagedDelete **dels = tsr_xcalloc(S, sizeof *dels);
    uint8_t **bufs = tsr_xcalloc(c->cfg.nshards + 1, sizeof *bufs);
    size_t *lens = tsr_xcalloc(c->cfg.nshards + 1, sizeof *lens);
    ProtobufCMessage **resps = tsr_xcalloc(c->nrep + 1, sizeof *resps);
    for (size_t g = 0; g < S; g++) {
        gbuf *b = &cr->gb[g];
        tessera__v1__shard_write_request__init(&w[g]);
        w[g].version = (int64_t)cr->newv;
        w[g].seq = cr->last;
        w[g].leader_term = tsr__coord_term(c);
        if (!b->n)
            continue;
        qsort(b->ops, b->n, sizeof *b->ops, cop_cmp);
        w[g].upserts = tsr_xcalloc(b->n, sizeof *w[g].upserts);
        w[g].deletes = tsr_xcalloc(b->n, sizeof *w[g].deletes);
        dels[g] = tsr_xcalloc(b->n, sizeof **dels);
        for (size_t i = 0; i < b->n; i++) {
            if (i + 1 < b->n && b->ops[i + 1].label == b->ops[i].label)
                continue; /* a later operation on the label wins */
            if (b->ops[i].up) {
                w[g].upserts[w[g].n_upserts++] = b->ops[i].up;
            } else {
                Tessera__V1__StagedDelete *d = &dels[g][w[g].n_deletes];
                tessera__v1__staged_delete__init(d);
                d->label = b->ops[i].label;
                d->list = b->ops[i].list;
                w[g].deletes[w[g].n_deletes++] = d;
            }
        }
        bufs[g] = tsr_rpc_pack(&w[g].base, &lens[g]);
    }
    size_t bad = tsr__coord_all_fanout(c, TSR_SHARD_SVC "Write", bufs, lens, cr->skip,
                                       c->cfg.stream_write_deadline_ms,
                                       &tessera__v1__shard_write_response__descriptor, resps,
                                       cr->err);
    if (bad) {
        cr->rc = cr->err && cr->err->code ? cr->err->code : TSR_EUNAVAILABLE;
        tsr_err_prefix(cr->err, "the catch-up of version %llu, seqs up to %lld",
                       (unsigned long long)cr->newv, (long long)cr->last);
    } else {
        for (size_t g = 0; g < S; g++)
            if (bufs[g]) {
                cr->sent[g] = cr->last;
                cr->writes++;
            }
        cr->batches++;
    }
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(resps[k], NULL); /* accepts NULL */
    for (size_t g = 0; g < S; g++) {
        gbuf *b = &cr->gb[g];
        for (size_t i = 0; i < b->n; i++)
            if (b->ops[i].up)
                tessera__v1__staged_upsert__free_unpacked(b->ops[i].up, NULL);
        b->n = 0;
        free(w[g].upserts);
        free(w[g].deletes);
        free(dels[g]);
        free(bufs[g]);
    }
    cr->pending = 0;
    free(w);
    free(dels);
    free(bufs);
    free(lens);
    free(resps);
}

/* One logged round in (from, upto]: its records re-routed by ns's plan into the batch (an
 * upsert to the owner of its list in ns, of its id's hash when sparse-only, and a delete
 * of its label to every other group of ns; a delete to every group of ns), which is sent
 * once it holds CARRY_MAX operations. Stops the scan on the first failure. */
static int carry_one(void *ud, const Tessera__V1__CoordLogRecord *rec, int64_t off)
{
    carry *cr = ud;
    (void)off;
    if (rec->seq <= cr->from || rec->seq > cr->upto)
        return 0;
    size_t S = cr->S;
    for (size_t k = 0; k < rec->n_writes; k++) {
        const Tessera__V1__ShardWriteRequest *lw = rec->writes[k]->write;
        int32_t lg = rec->writes[k]->group;
        if (!lw || (cr->verbatim && (lg < 0 || (size_t)lg >= S)))
            continue;
        for (size_t u = 0; u < lw->n_upserts; u++) {
            const Tessera__V1__StagedUpsert *up = lw->upserts[u];
            const char *id = up->datapoint ? up->datapoint->datapoint_id : NULL;
            if (!id)
                continue;
            size_t g = cr->verbatim ? (size_t)lg : (size_t)tsr__group_of(cr->ns, up->list, id, S);
            Tessera__V1__StagedUpsert *cp = up_copy(up);
            if (!cp) {
                cr->rc = tsr_err(cr->err, TSR_ENOMEM, "the catch-up of version %llu: out of "
                                 "memory", (unsigned long long)cr->newv);
                return 1;
            }
            add_op(cr, g, up->label, up->list, cp);
            for (size_t h = 0; h < S && !cr->verbatim; h++)
                if (h != g && !cr->ns->retired[h])
                    add_op(cr, h, up->label, up->list, NULL);
        }
        for (size_t d = 0; d < lw->n_deletes; d++)
            for (size_t g = 0; g < S; g++)
                if (cr->verbatim ? g == (size_t)lg : !cr->ns->retired[g])
                    add_op(cr, g, lw->deletes[d]->label, lw->deletes[d]->list, NULL);
    }
    cr->last = rec->seq;
    cr->rounds++;
    if (cr->pending >= CARRY_MAX)
        flush(cr);
    return cr->rc ? 1 : 0;
}

int tsr__reshard_carry(tsr__coord *c, uint64_t newv, const tsr__snap *ns, int64_t from,
                       int64_t from_off,
                       const char *skip, int64_t *sent, tsr_error *err)
{
    uint64_t logv = tsr__stream_log_version(c);
    carry cr = {.c = c, .ns = ns, .newv = newv, .S = tsr__snap_groups(ns, &c->cfg),
                .from = from, .upto = tsr__stream_last_seq(c), .skip = skip, .sent = sent, .err = err};
    if (cr.upto <= from)
        return 0;
    tsr__snap *cur = tsr__coord_snap_get(c); /* N: a fold keeps its plan and groups */
    cr.verbatim = cur->plan && ns->plan && cur->tmpl && ns->tmpl &&
                  cur->tmpl->nlist == ns->tmpl->nlist && tsr__snap_groups(cur, &c->cfg) == cr.S &&
                  memcmp(cur->plan, ns->plan, ns->tmpl->nlist * sizeof *ns->plan) == 0 &&
                  memcmp(cur->retired, ns->retired, sizeof ns->retired) == 0;
    tsr__snap_unref(cur);
    if (logv == 0)
        return tsr_err(err, TSR_ESTATE, "the catch-up of version %llu: the coordinator log is "
                       "not open", (unsigned long long)newv);
    char path[4200], why[300];
    int64_t good = 0;
    cr.gb = tsr_xcalloc(cr.S + 1, sizeof *cr.gb);
    tsr__slog_path(c->store, logv, path, sizeof path);
    int64_t t0 = tsr_clock_mono_ms();
    int rc = tsr__slog_scan(path, from_off, carry_one, &cr, &good, why, sizeof why, err);
    if (rc == 0 && cr.rc == 0 && cr.pending)
        flush(&cr);
    if (rc == 0)
        rc = cr.rc;
    if (rc == 0)
        tsr_info("stream: version %llu caught up on seqs %lld..%lld (%zu rounds in %zu "
                 "batches, %zu shard writes%s) in %lld ms", (unsigned long long)newv,
                 (long long)from + 1, (long long)cr.upto, cr.rounds, cr.batches, cr.writes,
                 cr.verbatim ? ", as logged" : "", (long long)(tsr_clock_mono_ms() - t0));
    for (size_t g = 0; g < cr.S; g++) { /* a batch left by a failure */
        for (size_t i = 0; i < cr.gb[g].n; i++)
            if (cr.gb[g].ops[i].up)
                tessera__v1__staged_upsert__free_unpacked(cr.gb[g].ops[i].up, NULL);
        free(cr.gb[g].ops);
    }
    free(cr.gb);
    return rc;
}
