/*
 * reshard_carry — the catch-up of a reshard move (docs/resharding.md "Writes during a
 * move"): the streamed-write rounds logged on the served version N after the move's S
 * (every group's Stage chunk 0 was sent at S, with capture_delta: each group's N+1 folds
 * its delta of S only) up to the last one, T, re-routed by the plan of N+1 and sent, in
 * seq order and with their own seqs, as Writes naming the prepared catch-up version N+1
 * (shard/stream.c takes them into that version's own log and delta). N+1 then holds
 * every acknowledged write on every group before the commit point.
 *
 * Routing: an upsert goes to the owner of its list in N+1 (of its id's hash when
 * sparse-only), with a delete of its label on every other group of N+1; a delete goes to
 * every group of N+1. Labels are unique over the groups (the coordinator's one counter),
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
#include "core/log.h"
#include "core/mem.h"
#include "tessera/v1/coord_log.pb-c.h"

typedef struct carry {
    tsr__coord *c;
    const tsr__snap *ns;
    uint64_t newv;
    size_t S;                   /* ns's groups */
    int64_t from, upto;
    const char *skip;
    int64_t *sent;              /* per group of ns: the last seq carried to it */
    size_t rounds, writes;
    int rc;
    tsr_error *err;
} carry;

/* Adds a borrowed pointer to a growing array (cap doubles). */
static void push_ptr(void ***a, size_t *n, size_t *cap, void *p)
{
    if (*n == *cap)
        *a = tsr_xrealloc(*a, (*cap = *cap ? *cap * 2 : 16) * sizeof **a);
    (*a)[(*n)++] = p;
}

/* One logged round in (from, upto]: its records re-routed by ns's plan, sent as one Write
 * per group naming newv with the round's seq, to every replica not skipped. An upsert goes
 * to the owner of its list in ns (of its id's hash when sparse-only) and a delete of its
 * label to every other group of ns; a delete goes to every group of ns. Labels are unique
 * over the groups, so a group without the label ignores its delete, and the label ends
 * where its last upsert put it even when the staged copy of it (read at any moment after
 * S) sits in the group of its list at S. Stops the scan on the first failure. */
static int carry_one(void *ud, const Tessera__V1__CoordLogRecord *rec, int64_t off)
{
    carry *cr = ud;
    (void)off;
    if (rec->seq <= cr->from || rec->seq > cr->upto)
        return 0;
    size_t S = cr->S;
    tsr__coord *c = cr->c;
    Tessera__V1__ShardWriteRequest *w = tsr_xcalloc(S, sizeof *w);
    size_t *ucap = tsr_xcalloc(S, sizeof *ucap), *dcap = tsr_xcalloc(S, sizeof *dcap);
    uint8_t **bufs = tsr_xcalloc(c->cfg.nshards + 1, sizeof *bufs);
    size_t *lens = tsr_xcalloc(c->cfg.nshards + 1, sizeof *lens);
    ProtobufCMessage **resps = tsr_xcalloc(c->nrep + 1, sizeof *resps);
    for (size_t g = 0; g < S; g++) {
        tessera__v1__shard_write_request__init(&w[g]);
        w[g].version = (int64_t)cr->newv;
        w[g].seq = rec->seq;
        w[g].leader_term = tsr__coord_term(c);
    }
    size_t nup = 0, nx = 0;
    for (size_t k = 0; k < rec->n_writes; k++)
        nup += rec->writes[k]->write ? rec->writes[k]->write->n_upserts : 0;
    Tessera__V1__StagedDelete *xd = tsr_xcalloc(nup + 1, sizeof *xd); /* upserts' deletes */
    for (size_t k = 0; k < rec->n_writes; k++) {
        const Tessera__V1__ShardWriteRequest *lw = rec->writes[k]->write;
        if (!lw)
            continue;
        for (size_t u = 0; u < lw->n_upserts; u++) {
            Tessera__V1__StagedUpsert *up = lw->upserts[u];
            const char *id = up->datapoint ? up->datapoint->datapoint_id : NULL;
            if (!id)
                continue;
            size_t g = (size_t)tsr__group_of(cr->ns, up->list, id, S);
            push_ptr((void ***)&w[g].upserts, &w[g].n_upserts, &ucap[g], up);
            Tessera__V1__StagedDelete *x = &xd[nx++];
            tessera__v1__staged_delete__init(x);
            x->label = up->label;
            x->list = up->list;
            for (size_t h = 0; h < S; h++)
                if (h != g && !cr->ns->retired[h])
                    push_ptr((void ***)&w[h].deletes, &w[h].n_deletes, &dcap[h], x);
        }
        for (size_t d = 0; d < lw->n_deletes; d++)
            for (size_t g = 0; g < S; g++)
                if (!cr->ns->retired[g])
                    push_ptr((void ***)&w[g].deletes, &w[g].n_deletes, &dcap[g],
                             lw->deletes[d]);
    }
    for (size_t g = 0; g < S; g++)
        if (w[g].n_upserts || w[g].n_deletes)
            bufs[g] = tsr_rpc_pack(&w[g].base, &lens[g]);
    size_t bad = tsr__coord_all_fanout(c, TSR_SHARD_SVC "Write", bufs, lens, cr->skip,
                                       c->cfg.stream_write_deadline_ms,
                                       &tessera__v1__shard_write_response__descriptor, resps,
                                       cr->err);
    if (bad) {
        cr->rc = cr->err && cr->err->code ? cr->err->code : TSR_EUNAVAILABLE;
        tsr_err_prefix(cr->err, "the catch-up of version %llu, seq %lld",
                       (unsigned long long)cr->newv, (long long)rec->seq);
    } else {
        for (size_t g = 0; g < S; g++)
            if (bufs[g]) {
                cr->sent[g] = rec->seq;
                cr->writes++;
            }
        cr->rounds++;
    }
    for (size_t k = 0; k < c->nrep; k++)
        protobuf_c_message_free_unpacked(resps[k], NULL); /* accepts NULL */
    for (size_t g = 0; g < S; g++) {
        free(w[g].upserts);
        free(w[g].deletes);
        free(bufs[g]);
    }
    free(w);
    free(xd);
    free(ucap);
    free(dcap);
    free(bufs);
    free(lens);
    free(resps);
    return bad ? 1 : 0;
}

int tsr__reshard_carry(tsr__coord *c, uint64_t newv, const tsr__snap *ns, int64_t from,
                       const char *skip, int64_t *sent, tsr_error *err)
{
    tsr__stream *s = &c->st;
    carry cr = {.c = c, .ns = ns, .newv = newv, .S = tsr__snap_groups(ns, &c->cfg),
                .from = from, .upto = s->next_seq - 1, .skip = skip, .sent = sent, .err = err};
    if (cr.upto <= from)
        return 0;
    if (s->log_fd < 0 || s->log_version == 0)
        return tsr_err(err, TSR_ESTATE, "the catch-up of version %llu: the coordinator log is "
                       "not open", (unsigned long long)newv);
    char path[4200], why[300];
    int64_t good = 0;
    tsr__slog_path(c->store, s->log_version, path, sizeof path);
    int rc = tsr__slog_scan(path, carry_one, &cr, &good, why, sizeof why, err);
    if (rc == 0)
        rc = cr.rc;
    if (rc == 0)
        tsr_info("stream: version %llu caught up on seqs %lld..%lld (%zu rounds, %zu shard "
                 "writes)", (unsigned long long)newv, (long long)from + 1, (long long)cr.upto,
                 cr.rounds, cr.writes);
    return rc;
}

