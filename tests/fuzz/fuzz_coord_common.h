/*
 * fuzz_coord_common — the coordinator of the fuzz harnesses fuzz_coord_rpc and
 * fuzz_coord_stream_log (header only, included once per harness): a tsr__coord in this
 * process (its folder in fuzz_tmp.h's: /dev/shm unless TMPDIR is set), configured from a
 * JSON config file as tessera-coordinator is (d=8, nlist=4,
 * PQ 2x8, 2 shard groups of one replica each), with a store in a temporary folder, a
 * committed snapshot of version 1 (a trained template, a balanced plan, FC_NIDS ids in its
 * directory) and the streamed-write state initialised from its log (tsr__stream_init).
 *
 * The replicas have NO channel (coord.h: no_channels): every call to a shard fails at once
 * as UNAVAILABLE (no socket, no gRPC traffic, no DNS lookup, also for a group AddShardGroup
 * appends), so the harnesses reach everything a request goes through up to
 * the fan-out to shards, and the fan-out's failure path, but never the merge of shard
 * replies. The streamed-write writer thread is not started: Upsert/RemoveDatapoints are
 * validated, translated and planned, then answered UNAVAILABLE ("starting"). An update is
 * marked busy: UpdateIndex requests are validated and confined (--batch-root-allow /tmp),
 * then answered FAILED_PRECONDITION; GetOperation finds one kept
 * operation, "op-1-1". AddShardGroup / RemoveShardGroup run with busy cleared: validated,
 * then the move starts on the update thread and fails at its first shard call (after the
 * new plan, for a remove); fc_reshard_undo waits for it and restores the state.
 */
#ifndef FUZZ_COORD_COMMON_H
#define FUZZ_COORD_COMMON_H

#include <grpc/grpc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "core/log.h"
#include "core/mem.h"

#include "../unit/coord_test_util.h"
#include "fuzz_tmp.h"

#define FC_NIDS 32
#define FC_NGROUPS 2 /* the config file's shard groups (one replica each) */

static char fc_dir[512];
static char *fc_allow[1];

/* Fills c; aborts on any failure (a harness that cannot start must not pass). */
static void fc_open(tsr__coord *c)
{
    tsr_error err = TSR_ERROR_INIT;
    memset(c, 0, sizeof *c);
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/coordinator.json", fc_dir);
    FILE *f = fopen(cfgp, "w");
    if (!f)
        abort();
    fputs("{\"dimensions\": 8, \"nlist\": 4, \"pq_m\": 2, \"pq_nbits\": 8, \"nprobe\": 2,\n"
          " \"max_k\": 100, \"max_queries_per_request\": 16,\n"
          " \"shards\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}\n", f);
    fclose(f);
    if (tsr__coord_config_load(cfgp, &c->cfg, &err) != 0) {
        fprintf(stderr, "fuzz coord: config: %s\n", err.msg);
        abort();
    }
    pthread_mutex_init(&c->snap_mu, NULL);
    pthread_mutex_init(&c->update_mu, NULL);
    pthread_mutex_init(&c->op_mu, NULL);
    pthread_mutex_init(&c->rec_mu, NULL);
    pthread_cond_init(&c->rec_cv, NULL);
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/data", fc_dir);
    if (tsr_store_create(sdir, &c->store, &err) != 0) {
        fprintf(stderr, "fuzz coord: store: %s\n", err.msg);
        abort();
    }
    /* replicas without channels (coord.h: no_channels; the arrays at full capacity as the
     * server has them, so AddShardGroup can append) */
    c->no_channels = 1;
    tsr_rpc_client_opts copts;
    memset(&copts, 0, sizeof copts);
    if (tsr__coord_channels_open(c, &copts, &err) != 0) {
        fprintf(stderr, "fuzz coord: replicas: %s\n", err.msg);
        abort();
    }
    tsr__snap *s = coord_test_snapshot(1, (size_t)c->cfg.nlist, c->cfg.nshards, &err);
    if (!s) {
        fprintf(stderr, "fuzz coord: snapshot: %s\n", err.msg);
        abort();
    }
    for (int i = 0; i < FC_NIDS; i++) {
        char id[16];
        snprintf(id, sizeof id, "id%d", i);
        int32_t list = i % c->cfg.nlist;
        tsr__dir_add(&s->dir, id, i, list, s->plan[list], 1, 0);
    }
    s->next_label = FC_NIDS;
    s->ndense = FC_NIDS;
    c->snap = s;
    if (tsr__stream_init(c, &err) != 0) {
        fprintf(stderr, "fuzz coord: stream: %s\n", err.msg);
        abort();
    }
    /* an update in progress, one kept operation */
    fc_allow[0] = (char *)"/tmp"; /* the seeds' batch_root; "/etc" is outside */
    c->batch_allow = (const char *const *)fc_allow;
    c->nbatch_allow = 1;
    c->busy = 1;
    tsr__op *op = tsr_xcalloc(1, sizeof *op);
    snprintf(op->id, sizeof op->id, "op-1-1");
    op->state = TESSERA__V1__OPERATION__STATE__STAGING;
    op->batch_root = tsr_xstrdup(fc_dir);
    op->shards_total = 2;
    c->ops = tsr_xcalloc(1, sizeof *c->ops);
    c->ops[0] = op;
    c->nops = 1;
}

/* After an AddShardGroup / RemoveShardGroup call (the only requests that start work on the
 * update thread here: busy is cleared for them): waits for the move (it fails at its first
 * shard call: the new group's Stats, or the Shard.Read of the moved lists), then puts back
 * what a move changes so that no input depends on the ones before it and the groups never
 * fill up (256 at most): the config's groups (the appended ones freed, none retired,
 * resharded 0), the replica slots, the operations (only "op-1-1" kept; the others' records
 * forgotten) and busy. Aborts when a move committed a version (it cannot without shards). */
__attribute__((unused)) static void fc_reshard_undo(tsr__coord *c, size_t ngroups)
{
    if (c->upd_thread_live) {
        pthread_join(c->upd_thread, NULL);
        c->upd_thread_live = 0;
    }
    for (size_t s = ngroups; s < c->cfg.nshards; s++) {
        for (size_t j = 0; j < c->cfg.nreplicas[s]; j++)
            free(c->cfg.replicas[s][j]);
        free(c->cfg.replicas[s]);
        c->cfg.replicas[s] = NULL;
        c->cfg.shards[s] = NULL;
        c->cfg.nreplicas[s] = 0;
    }
    c->cfg.nshards = ngroups;
    memset(c->cfg.retired, 0, TSR_COORD_MAX_SHARDS);
    c->cfg.resharded = 0;
    memset(&c->rep[ngroups], 0, (c->nrep - ngroups) * sizeof *c->rep);
    c->nrep = ngroups; /* one replica per group */
    for (size_t s = 0; s < ngroups; s++)
        c->grp[s].n = 1;
    memset(&c->grp[ngroups], 0, (TSR_COORD_MAX_SHARDS - ngroups) * sizeof *c->grp);
    pthread_mutex_lock(&c->op_mu);
    while (c->nops > 1) {
        tsr__op *op = c->ops[--c->nops];
        tsr__oplog_forget(c, op);
        tsr__op_free(op);
    }
    if (c->nops != 1 || strcmp(c->ops[0]->id, "op-1-1") != 0 || c->busy)
        abort(); /* the move ended (busy 0) and the kept operation is still there */
    c->busy = 1;
    pthread_mutex_unlock(&c->op_mu);
    tsr__snap *s = tsr__coord_snap_get(c);
    uint64_t v = s->version;
    tsr__snap_unref(s);
    if (v != 1)
        abort();
}

static void fc_init(void)
{
    setenv("TSR_LOG_LEVEL", "error", 0); /* the harness prints only what fails */
    grpc_init(); /* the fan-out's completion queues */
    fuzz_tmp_default();
    coord_test_tmpdir(fc_dir, sizeof fc_dir, "tsr-fuzz-coord");
}

static void fc_rmdir(void)
{
    coord_test_rmtree(fc_dir);
}

#endif
