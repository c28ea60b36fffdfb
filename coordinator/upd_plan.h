/*
 * upd_plan — the half of an update that talks to no shard (update_plan.c): template,
 * the list of each record, the partition plan, the next directory, and per group the
 * upserts and deletes it stages. Pure functions on borrowed inputs: no lock, no thread;
 * the streamed writes reuse its pieces (normalisation, assignment, group of a list).
 */
#ifndef TSR_COORD_UPD_PLAN_H
#define TSR_COORD_UPD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "batch/batch.h"
#include "coord_config.h"
#include "core/error.h"
#include "index/ivfpq.h"
#include "snap.h"
#include "tessera/v1/shard.pb-c.h"

/* ---- update_plan.c: the half of an update that talks to no shard -------------------- */
typedef struct tsr__shard_work {
    size_t *ups;                /* owned; indices into the batch's records */
    size_t nups, cap;
    Tessera__V1__StagedDelete *dels; /* owned */
    size_t ndels, dcap;
} tsr__shard_work;

#define TSR__UPD_UNKNOWN_KEPT 5 /* unknown delete ids an update's warning names */

typedef struct tsr__upd_plan {
    tsr__snap *ns;              /* owned ref: the next snapshot (base version + 1), unsaved */
    tsr__shard_work *w;         /* owned; nshards entries: what each group stages */
    size_t nshards;
    int overwrite;              /* staged on an empty base (complete overwrite, or the first) */
    int64_t nmoved, ndeleted;   /* ids moved between groups; ids deleted */
    int64_t nunknown;           /* delete ids the base version does not hold (ignored) */
    size_t unknown[TSR__UPD_UNKNOWN_KEPT]; /* the first of them: indices into b->deletes */
} tsr__upd_plan;

/* Plans the update of base (borrowed) by batch b (borrowed; for the cosine distance its
 * dense vectors are normalised in place): template, list of each record, plan, directory,
 * and per group the upserts and deletes. overwrite: the request's is_complete_overwrite;
 * tmpl_path: --template (NULL = train from b when there is no index yet). Returns 0 with
 * *p filled (tsr__upd_plan_close it) or an error code with err set (*p closed). */
int tsr__upd_plan_build(const tsr__coord_config *cfg, const char *tmpl_path,
                        const tsr__snap *base, tsr_batch *b, int overwrite, tsr__upd_plan *p,
                        tsr_error *err);
void tsr__upd_plan_close(tsr__upd_plan *p); /* accepts a closed plan */

/* The pieces of the plan the streamed writes reuse (stream.c): the cosine normalisation
 * (in place), the list of each record (-1: no dense vector; threads for the assignment),
 * the group of a list (-1: hash of the id). */
void tsr__normalize(float *v, size_t d);
int tsr__assign_records(const tsr_ivfpq *tmpl, const tsr_datapoint *recs, size_t n, size_t d,
                        int threads, int64_t *assign, tsr_error *err);
int32_t tsr__group_of(const tsr__snap *s, int32_t list, const char *id, size_t nshards);

#endif
