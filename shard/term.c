/*
 * term — fencing of HA coordinators (docs/coordinator.md "Fencing"): the highest leader
 * term a shard has seen, kept in DATA/leader-term (text, written by a durable replace:
 * tmp, fsync, rename, fsync of the data dir). Stage, Prepare, Commit, Abort, Release and
 * Write carry the sender's term; a lower one than the highest seen is refused, so a
 * deposed leader can neither commit, nor abort or overwrite what its successor staged.
 * Term 0 (a coordinator on the local backend) is never checked: unchanged behaviour.
 *
 * Threads: term_mu guards term and term_loaded; it is held across the file write (rare:
 * once per new leader) and is the innermost lock: Stage, Prepare, Commit, Abort and
 * Release check under update_mu (update.c: the check and the operation are one section),
 * Write's check takes it alone. Nothing is locked while it is held. Calls no other file
 * of the folder.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/file.h"
#include "core/log.h"
#include "shard.h"

#define TERM_FILE "leader-term"

/* Reads DATA/leader-term once (missing = 0). Caller holds term_mu. */
static int term_load(tsr__shard *s, tsr_error *err)
{
    if (s->term_loaded)
        return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/" TERM_FILE, s->dir);
    char *buf = NULL;
    size_t len = 0;
    int rc = tsr_file_read(path, 64, TSR_FILE_NOTFOUND, &buf, &len, err);
    if (rc == TSR_ENOTFOUND) {
        tsr_error_clear(err);
        s->term = 0;
    } else if (rc) {
        return rc;
    } else {
        char *end = NULL;
        long long t = strtoll(buf, &end, 10);
        int ok = end != buf && t >= 0;
        free(buf);
        if (!ok)
            return tsr_err(err, TSR_EFORMAT, "%s: expected one leader term (a number >= 0)",
                           path);
        s->term = t;
    }
    s->term_loaded = 1;
    return 0;
}

int tsr__shard_term_check(tsr__shard *s, int64_t term, tsr_error *err)
{
    if (term <= 0)
        return 0;
    pthread_mutex_lock(&s->term_mu);
    int rc = term_load(s, err);
    if (rc == 0 && term < s->term)
        rc = tsr_err(err, TSR_ESTATE, "leader term %" PRId64 " is older than %" PRId64,
                     term, s->term);
    if (rc == 0 && term > s->term) {
        char path[4200], tmp[4300], val[32];
        snprintf(path, sizeof path, "%s/" TERM_FILE, s->dir);
        snprintf(tmp, sizeof tmp, "%s/." TERM_FILE ".tmp", s->dir);
        int n = snprintf(val, sizeof val, "%" PRId64 "\n", term);
        if ((rc = tsr_file_replace(path, tmp, s->dir, val, (size_t)n, err)) == 0) {
            tsr_info("leader term %" PRId64 " (was %" PRId64 ")", term, s->term);
            s->term = term;
        }
    }
    pthread_mutex_unlock(&s->term_mu);
    return rc;
}
