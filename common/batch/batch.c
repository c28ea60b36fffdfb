/*
 * batch — batch_root walker, parallel per-file reading, merge and report.
 *
 * DESIGN (threads): tsr_batch_load builds the list of file jobs on the calling thread,
 * then starts up to min(threads, jobs) pthreads that take jobs by an atomic counter.
 * Each job is owned by exactly one worker while it runs (its record array, delete ids
 * and file report); nothing is shared but the counter, so there are no locks. After
 * join, the calling thread merges the jobs in file-name order, which makes the result
 * independent of scheduling.
 */
#include "batch/batch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batch/batch_csv.h"
#include "batch/batch_delete.h"
#include "batch/batch_json.h"
#include "batch/batch_int.h"
#include "core/mem.h"

#if defined(__has_include)
#if __has_include("batch_avro.h")
#include "batch/batch_avro.h"
#define TSR_HAVE_BATCH_AVRO 1
#endif
#endif

typedef struct rec_entry {
    tsr_datapoint dp;
    uint64_t where;
} rec_entry;

typedef struct del_entry {
    char *id;
    uint64_t where;
} del_entry;

typedef struct file_job {
    char *path;                 /* owned, full path */
    tsr_batch_file_report rep;  /* moved into the batch report after the merge */
    size_t dims;
    rec_entry *recs;
    size_t nrecs, caprecs;
    del_entry *dels;
    size_t ndels, capdels;
    int oom;
    int gzip;
} file_job;

const char *tsr_batch_kind_name(enum tsr_batch_kind k)
{
    switch (k) {
    case TSR_BATCH_CSV:
        return "csv";
    case TSR_BATCH_JSON:
        return "json";
    case TSR_BATCH_AVRO:
        return "avro";
    case TSR_BATCH_DELETE:
        return "delete";
    }
    return "?";
}

/* ---- sink ----------------------------------------------------------------------------- */

static int sink_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg);

static int sink_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    file_job *j = ctx;
    enum tsr_rec_error type;
    char msg[512];
    if (tsr_batch_record_check(dp, j->dims, &type, msg, sizeof msg)) {
        /* the readers check all this while parsing; the gate keeps every format (and the
         * streamed upserts, which call it too) to one set of rules */
        tsr_datapoint_close(dp);
        return sink_invalid(ctx, where, type, msg);
    }
    if (j->nrecs == j->caprecs) {
        size_t nc = j->caprecs ? j->caprecs * 2 : 256;
        rec_entry *n = tsr_try_realloc(j->recs, nc, sizeof *n);
        if (n == NULL) {
            j->oom = 1;
            tsr_datapoint_close(dp);
            return 1;
        }
        j->recs = n;
        j->caprecs = nc;
    }
    j->recs[j->nrecs].dp = *dp;
    j->recs[j->nrecs].where = where;
    j->nrecs++;
    tsr_datapoint_init(dp);
    j->rep.valid++;
    return 0;
}

static int sink_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    file_job *j = ctx;
    j->rep.invalid++;
    if ((unsigned)type < TSR_REC__COUNT)
        j->rep.type_counts[type]++;
    if (j->rep.nerrors < TSR_BATCH_MAX_FILE_ERRORS) {
        if (j->rep.errors == NULL) {
            j->rep.errors = tsr_try_calloc(TSR_BATCH_MAX_FILE_ERRORS, sizeof *j->rep.errors);
            if (j->rep.errors == NULL) {
                j->oom = 1;
                return 1;
            }
        }
        tsr_batch_rec_error *e = &j->rep.errors[j->rep.nerrors];
        e->where = where;
        e->type = type;
        e->msg = strdup(msg ? msg : "");
        if (e->msg == NULL) {
            j->oom = 1;
            return 1;
        }
        j->rep.nerrors++;
    }
    return 0;
}

static int sink_delete(void *ctx, uint64_t where, const char *id, size_t len)
{
    file_job *j = ctx;
    if (j->ndels == j->capdels) {
        size_t nc = j->capdels ? j->capdels * 2 : 256;
        del_entry *n = tsr_try_realloc(j->dels, nc, sizeof *n);
        if (n == NULL) {
            j->oom = 1;
            return 1;
        }
        j->dels = n;
        j->capdels = nc;
    }
    char *s = tsr_try_malloc(len + 1, 1);
    if (s == NULL) {
        j->oom = 1;
        return 1;
    }
    memcpy(s, id, len);
    s[len] = '\0';
    j->dels[j->ndels].id = s;
    j->dels[j->ndels].where = where;
    j->ndels++;
    j->rep.valid++;
    return 0;
}

/* ---- workers -------------------------------------------------------------------------- */

/* The readers' file-level messages begin with the path they were given ("<path>: ..."),
 * so that they stand alone for other callers. The report puts the name relative to
 * batch_root in front of file_error, so that prefix is dropped here: each message names
 * the file once, and no full path of the reading machine ends up in the report. */
static const char *without_path(const char *msg, const char *path)
{
    size_t n = strlen(path);
    if (strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        return msg + n + 2;
    return msg;
}

static void run_job(file_job *j)
{
    tsr_record_sink sink = {j, sink_record, sink_invalid, sink_delete};
    tsr_error err = TSR_ERROR_INIT;
    int fd = open(j->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "cannot open: %s", strerror(errno));
        j->rep.file_error = tsr_xstrdup(msg);
        return;
    }
    unsigned char magic[2];
    ssize_t n = read(fd, magic, 2);
    close(fd);
    if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        j->gzip = 1;
        j->rep.file_error = tsr_xstrdup(
            "the file is gzip-compressed (starts with 1f 8b); gzip input is not supported, "
            "decompress it first");
        return;
    }
    int rc = 0;
    switch (j->rep.kind) {
    case TSR_BATCH_CSV:
        rc = tsr_batch_csv_read(j->path, j->dims, &sink, &err);
        break;
    case TSR_BATCH_JSON:
        rc = tsr_batch_json_read(j->path, j->dims, &sink, &err);
        break;
    case TSR_BATCH_DELETE:
        rc = tsr_batch_delete_read(j->path, j->dims, &sink, &err);
        break;
    case TSR_BATCH_AVRO:
#ifdef TSR_HAVE_BATCH_AVRO
        rc = tsr_batch_avro_read(j->path, j->dims, &sink, &err);
#else
        rc = tsr_err(&err, TSR_EUNSUPPORTED, "Avro support is not built into this binary");
#endif
        break;
    }
    if (rc != 0)
        j->rep.file_error =
            tsr_xstrdup(err.msg[0] ? without_path(err.msg, j->path) : tsr_strerror(rc));
    else if (j->oom)
        j->rep.file_error = tsr_xstrdup("out of memory while reading the file");
}

typedef struct pool {
    file_job *jobs;
    size_t njobs;
    atomic_size_t next;
} pool;

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->njobs)
            return NULL;
        run_job(&p->jobs[i]);
    }
}

/* Frees what the job owns besides its file report (records, delete ids, path). */
static void job_free_data(file_job *j)
{
    for (size_t k = 0; k < j->nrecs; k++)
        tsr_datapoint_close(&j->recs[k].dp);
    for (size_t k = 0; k < j->ndels; k++)
        free(j->dels[k].id);
    free(j->recs);
    free(j->dels);
    free(j->path);
}

static void file_report_close(tsr_batch_file_report *f)
{
    free(f->name);
    free(f->file_error);
    for (size_t k = 0; k < f->nerrors; k++)
        free(f->errors[k].msg);
    free(f->errors);
}

/* ---- messages ------------------------------------------------------------------------- */

/* Copy of s with invalid UTF-8 bytes and control characters replaced by '?'. */
static char *sanitize(const char *s)
{
    size_t n = strlen(s);
    char *o = tsr_xmalloc(n + 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                               : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (l > 1 && i + l <= n && tsr__utf8_valid(s + i, l)) {
            memcpy(o + i, s + i, l);
            i += l;
        } else {
            o[i] = (c < 0x20 || c >= 0x7F) ? '?' : (char)c;
            i++;
        }
    }
    o[n] = '\0';
    return o;
}

__attribute__((format(printf, 4, 5))) static void add_msg(char ***arr, size_t *n,
                                                          uint64_t *total, const char *fmt, ...)
{
    (*total)++;
    if (*n >= TSR_BATCH_MAX_MESSAGES)
        return;
    if (*arr == NULL)
        *arr = tsr_xcalloc(TSR_BATCH_MAX_MESSAGES, sizeof **arr);
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    (*arr)[(*n)++] = sanitize(buf);
}

#define BATCH_ERROR(rep, ...) add_msg(&(rep)->errors, &(rep)->nerrors, &(rep)->errors_total, __VA_ARGS__)
#define BATCH_WARN(rep, ...) \
    add_msg(&(rep)->warnings, &(rep)->nwarnings, &(rep)->warnings_total, __VA_ARGS__)

/* ---- walker --------------------------------------------------------------------------- */

typedef struct job_list {
    file_job *v;
    size_t n, cap;
    uint64_t objects; /* every file seen, also the ones not kept */
} job_list;

static void add_job(job_list *l, const char *root, const char *name, enum tsr_batch_kind kind,
                    size_t dims)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = tsr_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    file_job *j = &l->v[l->n++];
    memset(j, 0, sizeof *j);
    size_t len = strlen(root) + strlen(name) + 2;
    j->path = tsr_xmalloc(len);
    snprintf(j->path, len, "%s/%s", root, name);
    j->rep.name = tsr_xstrdup(name);
    j->rep.kind = kind;
    j->dims = dims;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int walk_delete(const char *root, job_list *l, tsr_batch_report *rep, size_t dims,
                       const char *confine)
{
    size_t len = strlen(root) + 8;
    char *dpath = tsr_xmalloc(len);
    snprintf(dpath, len, "%s/delete", root);
    DIR *d = opendir(dpath);
    if (d == NULL) {
        BATCH_ERROR(rep, "cannot open the delete/ folder: %s", strerror(errno));
        free(dpath);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        l->objects++;
        if (l->objects > TSR_BATCH_MAX_OBJECTS)
            continue; /* counted, not kept: the batch is rejected anyway */
        struct stat st;
        char name[300];
        snprintf(name, sizeof name, "delete/%s", e->d_name);
        if (confine && tsr__batch_entry_outside(dpath, e->d_name, confine)) {
            BATCH_ERROR(rep, "%s resolves outside the allowed folder; not read", name);
        } else if (fstatat(dirfd(d), e->d_name, &st, 0) != 0) {
            BATCH_ERROR(rep, "%s: cannot stat: %s", name, strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            BATCH_ERROR(rep, "%s/ is a folder; delete/ may only hold files of ids", name);
        } else if (!S_ISREG(st.st_mode)) {
            BATCH_ERROR(rep, "%s is not a regular file", name);
        } else {
            add_job(l, root, name, TSR_BATCH_DELETE, dims);
        }
    }
    closedir(d);
    free(dpath);
    return 0;
}

static int walk_root(const char *root, job_list *l, tsr_batch_report *rep, size_t dims,
                     const char *confine, tsr_error *err)
{
    DIR *d = opendir(root);
    if (d == NULL)
        return tsr_err(err, TSR_EIO, "%s: cannot open batch_root: %s", root, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        struct stat st;
        if (confine && tsr__batch_entry_outside(root, name, confine)) {
            l->objects++;
            BATCH_ERROR(rep, "'%s' resolves outside the allowed folder; not read", name);
            continue;
        }
        if (fstatat(dirfd(d), name, &st, 0) != 0) {
            l->objects++;
            BATCH_ERROR(rep, "%s: cannot stat: %s", name, strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (strcmp(name, "delete") == 0)
                walk_delete(root, l, rep, dims, confine);
            else
                BATCH_ERROR(rep,
                            "subfolder '%s/' is not allowed in batch_root; the only allowed "
                            "subfolder is delete/",
                            name);
            continue;
        }
        l->objects++;
        if (l->objects > TSR_BATCH_MAX_OBJECTS)
            continue;
        if (!S_ISREG(st.st_mode)) {
            BATCH_ERROR(rep, "%s is not a regular file", name);
        } else if (has_suffix(name, ".csv")) {
            add_job(l, root, name, TSR_BATCH_CSV, dims);
        } else if (has_suffix(name, ".json")) {
            add_job(l, root, name, TSR_BATCH_JSON, dims);
        } else if (has_suffix(name, ".avro")) {
            add_job(l, root, name, TSR_BATCH_AVRO, dims);
        } else {
            BATCH_ERROR(rep,
                        "file '%s' has an unsupported suffix; data files in batch_root end in "
                        ".csv, .json or .avro",
                        name);
        }
    }
    closedir(d);
    if (l->objects > TSR_BATCH_MAX_OBJECTS)
        BATCH_ERROR(rep, "batch_root holds %llu objects (files, delete/ included); the limit is %d",
                    (unsigned long long)l->objects, TSR_BATCH_MAX_OBJECTS);
    return 0;
}

/* ---- merge ---------------------------------------------------------------------------- */

typedef struct ref {
    const char *id;
    uint32_t job;
    uint64_t where;
    void *item; /* rec_entry* or del_entry* */
} ref;

static int cmp_ref(const void *a, const void *b)
{
    const ref *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c != 0)
        return c;
    if (x->job != y->job)
        return x->job < y->job ? -1 : 1;
    return (x->where > y->where) - (x->where < y->where);
}

static int cmp_job(const void *a, const void *b)
{
    return strcmp(((const file_job *)a)->rep.name, ((const file_job *)b)->rep.name);
}

static const char *where_word(const file_job *j)
{
    return j->rep.kind == TSR_BATCH_AVRO ? "record " : "";
}

/* Sorts refs and reports duplicate groups; the last copy is kept (keep[i] = 1). */
static size_t dedupe(ref *r, size_t n, const file_job *jobs, tsr_batch_report *rep,
                     unsigned char *keep, const char *what)
{
    qsort(r, n, sizeof *r, cmp_ref);
    size_t kept = 0;
    for (size_t i = 0; i < n;) {
        size_t k = i + 1;
        while (k < n && strcmp(r[k].id, r[i].id) == 0)
            k++;
        keep[k - 1] = 1;
        kept++;
        if (k - i > 1) {
            rep->duplicates += k - i - 1;
            char list[600];
            size_t o = 0;
            for (size_t m = i; m < k && o + 80 < sizeof list; m++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s:%s%llu", m > i ? ", " : "",
                                      jobs[r[m].job].rep.name, where_word(&jobs[r[m].job]),
                                      (unsigned long long)r[m].where);
            if (o + 80 >= sizeof list)
                snprintf(list + o, sizeof list - o, ", ...");
            char snip[140];
            tsr__snippet(snip, sizeof snip, r[i].id, strlen(r[i].id), 120);
            BATCH_WARN(rep,
                       "%s id '%s' appears %zu times (%s); counted once, the last copy (%s:%s%llu) "
                       "is used",
                       what, snip, k - i, list, jobs[r[k - 1].job].rep.name,
                       where_word(&jobs[r[k - 1].job]), (unsigned long long)r[k - 1].where);
        }
        i = k;
    }
    return kept;
}

/* Reads every file of the list on up to `threads` threads (0 = one per CPU), the calling
 * thread included; each job keeps its records and report. */
static void read_files(job_list *l, unsigned threads)
{
    unsigned nt = threads;
    if (nt == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 0 ? (unsigned)c : 1;
    }
    if (nt > l->n)
        nt = (unsigned)l->n;
    pool p = {l->v, l->n, 0};
    pthread_t *th = tsr_xcalloc(nt, sizeof *th);
    unsigned started = 0;
    for (unsigned i = 1; i < nt; i++)
        if (pthread_create(&th[started], NULL, worker, &p) == 0)
            started++;
    worker(&p); /* the calling thread works too */
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
}

/* Reports an id kept both as data and as a delete (rr and dr sorted by id; only the
 * kept copies count): an id may not be in both. */
static void report_conflicts(const ref *rr, size_t nrec, const unsigned char *keep_r,
                             const ref *dr, size_t ndel, const unsigned char *keep_d,
                             const file_job *jobs, tsr_batch_report *rep)
{
    for (size_t i = 0, k = 0; i < nrec && k < ndel;) {
        if (!keep_r[i]) {
            i++;
            continue;
        }
        if (!keep_d[k]) {
            k++;
            continue;
        }
        int c = strcmp(rr[i].id, dr[k].id);
        if (c < 0) {
            i++;
        } else if (c > 0) {
            k++;
        } else {
            char snip[140];
            tsr__snippet(snip, sizeof snip, dr[k].id, strlen(dr[k].id), 120);
            BATCH_ERROR(rep,
                        "id '%s' is in data file %s (%s%llu) and in delete file %s (line %llu); "
                        "an id may not be in both",
                        snip, jobs[rr[i].job].rep.name,
                        jobs[rr[i].job].rep.kind == TSR_BATCH_AVRO ? "record " : "line ",
                        (unsigned long long)rr[i].where, jobs[dr[k].job].rep.name,
                        (unsigned long long)dr[k].where);
            i++;
            k++;
        }
    }
}

/* Merges the records and deletes of all jobs (nrec and ndel of them) into b: one copy of
 * each id (dedupe), conflicts reported, the kept datapoints and ids moved out of the
 * jobs. */
static int merge_jobs(const job_list *l, size_t nrec, size_t ndel, tsr_batch *b,
                      tsr_error *err)
{
    int rc = 0;
    tsr_batch_report *rep = &b->report;
    ref *rr = tsr_try_malloc(nrec ? nrec : 1, sizeof *rr);
    ref *dr = tsr_try_malloc(ndel ? ndel : 1, sizeof *dr);
    unsigned char *keep_r = tsr_try_calloc(nrec ? nrec : 1, 1);
    unsigned char *keep_d = tsr_try_calloc(ndel ? ndel : 1, 1);
    if (rr == NULL || dr == NULL || keep_r == NULL || keep_d == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory merging %zu records", nrec);
        goto out;
    }
    size_t o = 0, od = 0;
    for (size_t i = 0; i < l->n; i++) {
        for (size_t k = 0; k < l->v[i].nrecs; k++)
            rr[o++] = (ref){l->v[i].recs[k].dp.id, (uint32_t)i, l->v[i].recs[k].where,
                            &l->v[i].recs[k]};
        for (size_t k = 0; k < l->v[i].ndels; k++)
            dr[od++] = (ref){l->v[i].dels[k].id, (uint32_t)i, l->v[i].dels[k].where,
                             &l->v[i].dels[k]};
    }
    size_t ur = dedupe(rr, nrec, l->v, rep, keep_r, "data");
    size_t ud = dedupe(dr, ndel, l->v, rep, keep_d, "delete");
    report_conflicts(rr, nrec, keep_r, dr, ndel, keep_d, l->v, rep);
    b->records = tsr_try_malloc(ur ? ur : 1, sizeof *b->records);
    b->deletes = tsr_try_malloc(ud ? ud : 1, sizeof *b->deletes);
    if (b->records == NULL || b->deletes == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory merging %zu records", nrec);
        goto out;
    }
    for (size_t i = 0; i < nrec; i++) {
        rec_entry *e = rr[i].item;
        if (keep_r[i]) {
            b->records[b->nrecords++] = e->dp;
            tsr_datapoint_init(&e->dp);
        }
    }
    for (size_t i = 0; i < ndel; i++) {
        del_entry *e = dr[i].item;
        if (keep_d[i]) {
            b->deletes[b->ndeletes++] = e->id;
            e->id = NULL;
        }
    }
    rep->upserts = b->nrecords;
    rep->deletes = b->ndeletes;
out:
    free(rr);
    free(dr);
    free(keep_r);
    free(keep_d);
    return rc;
}

/* The verdict on the whole batch: rejected on any batch-level error or on more invalid
 * records than allowed. */
static void judge(tsr_batch_report *rep)
{
    if (rep->errors_total == 1) {
        rep->rejected = 1;
        snprintf(rep->reason, sizeof rep->reason, "%s", rep->errors[0]);
    } else if (rep->errors_total > 0) {
        rep->rejected = 1;
        snprintf(rep->reason, sizeof rep->reason, "%llu batch-level errors (first: %s)",
                 (unsigned long long)rep->errors_total, rep->errors[0]);
    } else if (rep->invalid > rep->max_invalid) {
        rep->rejected = 1;
        snprintf(rep->reason, sizeof rep->reason,
                 "%llu invalid record%s; max_invalid_records is %llu",
                 (unsigned long long)rep->invalid, rep->invalid == 1 ? "" : "s",
                 (unsigned long long)rep->max_invalid);
    }
}

static void jobs_free(job_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        job_free_data(&l->v[i]);
        file_report_close(&l->v[i].rep);
    }
    free(l->v);
}

int tsr_batch_load(const char *root, const tsr_batch_options *opt, tsr_batch **out,
                   tsr_error *err)
{
    *out = NULL;
    if (opt->dims == 0)
        return tsr_err(err, TSR_EINVAL, "the index dimension must be > 0");
    tsr_batch *b = tsr_xcalloc(1, sizeof *b);
    tsr_batch_report *rep = &b->report;
    rep->root = sanitize(root);
    rep->max_invalid = opt->max_invalid;
    job_list l = {0};
    int rc = walk_root(root, &l, rep, opt->dims, opt->confine, err);
    if (rc != 0) {
        tsr_batch_destroy(b);
        jobs_free(&l);
        return rc;
    }
    if (l.n > 1) /* l.v is NULL for an empty batch_root: qsort(NULL, 0) is undefined */
        qsort(l.v, l.n, sizeof *l.v, cmp_job);

    /* Read: skip the work when the folder is already invalid for its size. */
    if (l.objects <= TSR_BATCH_MAX_OBJECTS && l.n > 0)
        read_files(&l, opt->threads);

    /* Per-file results into the report. */
    size_t nrec = 0, ndel = 0;
    for (size_t i = 0; i < l.n; i++) {
        file_job *j = &l.v[i];
        rep->valid += j->rep.valid;
        rep->invalid += j->rep.invalid;
        for (int t = 0; t < TSR_REC__COUNT; t++)
            rep->type_counts[t] += j->rep.type_counts[t];
        if (j->rep.file_error != NULL)
            BATCH_ERROR(rep, "%s: %s", j->rep.name, j->rep.file_error);
        nrec += j->nrecs;
        ndel += j->ndels;
    }

    if ((rc = merge_jobs(&l, nrec, ndel, b, err)) != 0) {
        jobs_free(&l);
        tsr_batch_destroy(b);
        return rc;
    }

    /* Move file reports; free the jobs. */
    rep->files = tsr_xcalloc(l.n ? l.n : 1, sizeof *rep->files);
    for (size_t i = 0; i < l.n; i++) {
        rep->files[rep->nfiles++] = l.v[i].rep;
        job_free_data(&l.v[i]);
    }
    free(l.v);
    rep->records = rep->valid + rep->invalid;
    /* Nothing to apply (no file, or no valid record and no delete id although the invalid
     * ones are tolerated): refused rather than a new version equal to the last one
     * (docs/decisions.md). */
    if (rep->errors_total == 0 && rep->invalid <= rep->max_invalid && b->nrecords == 0 &&
        b->ndeletes == 0) {
        if (rep->nfiles == 0)
            BATCH_ERROR(rep, "nothing to apply: batch_root holds no data file and no delete "
                        "file (an update needs at least one record or one id to delete)");
        else
            BATCH_ERROR(rep, "nothing to apply: no valid record and no id to delete in %zu "
                        "file%s (an update needs at least one)", rep->nfiles,
                        rep->nfiles == 1 ? "" : "s");
    }
    judge(rep);
    *out = b;
    return rep->rejected ? TSR_EREJECTED : 0;
}

void tsr_batch_destroy(tsr_batch *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->nrecords; i++)
        tsr_datapoint_close(&b->records[i]);
    free(b->records);
    for (size_t i = 0; i < b->ndeletes; i++)
        free(b->deletes[i]);
    free(b->deletes);
    tsr_batch_report *r = &b->report;
    for (size_t i = 0; i < r->nfiles; i++)
        file_report_close(&r->files[i]);
    free(r->files);
    for (size_t i = 0; i < r->nerrors; i++)
        free(r->errors[i]);
    free(r->errors);
    for (size_t i = 0; i < r->nwarnings; i++)
        free(r->warnings[i]);
    free(r->warnings);
    free(r->root);
    free(b);
}

/* ---- report rendering ----------------------------------------------------------------- */

static json_t *jstr(const char *s)
{
    json_t *v = json_string(s);
    if (v == NULL) { /* not UTF-8: sanitize */
        char *c = sanitize(s);
        v = json_string(c);
        free(c);
    }
    return v;
}

static json_t *strv(char **v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, jstr(v[i]));
    return a;
}

static json_t *counts(const uint64_t *c)
{
    json_t *o = json_object();
    for (int t = 0; t < TSR_REC__COUNT; t++)
        if (c[t] > 0)
            json_object_set_new(o, tsr_rec_error_name((enum tsr_rec_error)t),
                                json_integer((json_int_t)c[t]));
    return o;
}

char *tsr_batch_report_json(const tsr_batch_report *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "batch_root", jstr(r->root));
    json_object_set_new(o, "accepted", json_boolean(!r->rejected));
    if (r->rejected)
        json_object_set_new(o, "rejected_reason", jstr(r->reason));
    json_object_set_new(o, "records", json_integer((json_int_t)r->records));
    json_object_set_new(o, "valid_records", json_integer((json_int_t)r->valid));
    json_object_set_new(o, "invalid_records", json_integer((json_int_t)r->invalid));
    json_object_set_new(o, "upserts", json_integer((json_int_t)r->upserts));
    json_object_set_new(o, "deletes", json_integer((json_int_t)r->deletes));
    json_object_set_new(o, "max_invalid_records", json_integer((json_int_t)r->max_invalid));
    json_object_set_new(o, "duplicates", json_integer((json_int_t)r->duplicates));
    json_object_set_new(o, "error_counts", counts(r->type_counts));
    json_object_set_new(o, "errors", strv(r->errors, r->nerrors));
    json_object_set_new(o, "errors_total", json_integer((json_int_t)r->errors_total));
    json_object_set_new(o, "warnings", strv(r->warnings, r->nwarnings));
    json_object_set_new(o, "warnings_total", json_integer((json_int_t)r->warnings_total));
    json_t *files = json_array();
    for (size_t i = 0; i < r->nfiles; i++) {
        const tsr_batch_file_report *f = &r->files[i];
        json_t *fo = json_object();
        json_object_set_new(fo, "file", jstr(f->name));
        json_object_set_new(fo, "format", json_string(tsr_batch_kind_name(f->kind)));
        json_object_set_new(fo, "valid", json_integer((json_int_t)f->valid));
        json_object_set_new(fo, "invalid", json_integer((json_int_t)f->invalid));
        if (f->file_error)
            json_object_set_new(fo, "file_error", jstr(f->file_error));
        json_object_set_new(fo, "error_counts", counts(f->type_counts));
        json_t *errs = json_array();
        for (size_t k = 0; k < f->nerrors; k++) {
            json_t *e = json_object();
            json_object_set_new(e, f->kind == TSR_BATCH_AVRO ? "record" : "line",
                                json_integer((json_int_t)f->errors[k].where));
            json_object_set_new(e, "type", json_string(tsr_rec_error_name(f->errors[k].type)));
            json_object_set_new(e, "message", jstr(f->errors[k].msg));
            json_array_append_new(errs, e);
        }
        json_object_set_new(fo, "errors", errs);
        json_array_append_new(files, fo);
    }
    json_object_set_new(o, "files", files);
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

void tsr_batch_report_text(const tsr_batch_report *r, FILE *f)
{
    if (r->rejected)
        fprintf(f, "batch %s: REJECTED: %s\n", r->root, r->reason);
    else
        fprintf(f, "batch %s: accepted\n", r->root);
    fprintf(f, "  %llu records: %llu valid, %llu invalid (max_invalid_records %llu); "
               "%llu upserts, %llu deletes, %llu duplicates\n",
            (unsigned long long)r->records, (unsigned long long)r->valid,
            (unsigned long long)r->invalid, (unsigned long long)r->max_invalid,
            (unsigned long long)r->upserts, (unsigned long long)r->deletes,
            (unsigned long long)r->duplicates);
    int any = 0;
    for (int t = 0; t < TSR_REC__COUNT; t++)
        if (r->type_counts[t] > 0) {
            fprintf(f, "%s%s %llu", any ? ", " : "  error counts: ",
                    tsr_rec_error_name((enum tsr_rec_error)t), (unsigned long long)r->type_counts[t]);
            any = 1;
        }
    if (any)
        fputc('\n', f);
    for (size_t i = 0; i < r->nerrors; i++)
        fprintf(f, "  error: %s\n", r->errors[i]);
    if (r->errors_total > r->nerrors)
        fprintf(f, "  ... %llu more errors\n", (unsigned long long)(r->errors_total - r->nerrors));
    for (size_t i = 0; i < r->nwarnings; i++)
        fprintf(f, "  warning: %s\n", r->warnings[i]);
    if (r->warnings_total > r->nwarnings)
        fprintf(f, "  ... %llu more warnings\n",
                (unsigned long long)(r->warnings_total - r->nwarnings));
    for (size_t i = 0; i < r->nfiles; i++) {
        const tsr_batch_file_report *fr = &r->files[i];
        fprintf(f, "  %s (%s): %llu valid, %llu invalid%s%s\n", fr->name,
                tsr_batch_kind_name(fr->kind), (unsigned long long)fr->valid,
                (unsigned long long)fr->invalid, fr->file_error ? "; " : "",
                fr->file_error ? fr->file_error : "");
        for (size_t k = 0; k < fr->nerrors; k++)
            fprintf(f, "    %s:%s%llu: %s: %s\n", fr->name,
                    fr->kind == TSR_BATCH_AVRO ? "record " : "",
                    (unsigned long long)fr->errors[k].where,
                    tsr_rec_error_name(fr->errors[k].type), fr->errors[k].msg);
        if (fr->invalid > fr->nerrors)
            fprintf(f, "    ... %llu more invalid records in %s\n",
                    (unsigned long long)(fr->invalid - fr->nerrors), fr->name);
    }
}

/* ------------------------------------------------------------------ number text */

int tsr_batch_fmt_float(char *buf, size_t cap, float f)
{
    int len = 0;
    for (int p = 6; p <= 9; p++) {
        len = snprintf(buf, cap, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f)
            break;
    }
    return len;
}

int tsr_batch_fmt_double(char *buf, size_t cap, double d)
{
    int len = 0;
    for (int p = 15; p <= 17; p++) {
        len = snprintf(buf, cap, "%.*g", p, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    return len;
}
