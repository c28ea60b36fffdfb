/*
 * metrics — process-wide counters, gauges and histograms with labels, and the Prometheus
 * text-format (0.0.4) renderer. See metrics.h for the hooks and the DESIGN note.
 *
 * DESIGN (threads): any thread samples. `table` slots are written once (NULL → series)
 * under `reg_mu` with a release store and read with acquire loads, so a sampler never
 * locks for an existing series. `reg_mu` guards families, series creation, collectors and
 * rendering; collectors run with no lock held (they sample, which may create series).
 * Lock order: reg_mu only (a single lock).
 */
#include "net/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/buf.h"
#include "core/error.h"
#include "core/hash.h"
#include "net/metrics_process.h"

const double tsr_metrics_buckets[TSR_METRICS_NBUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

#define NAME_MAX_LEN 127
#define HELP_MAX_LEN 255
#define LABELS_MAX_LEN 1024
#define TABLE_SLOTS (2 * TSR_METRICS_MAX_SERIES) /* load factor <= 0.5: short probes */
#define MAX_COLLECTORS 16

struct family {
    char name[NAME_MAX_LEN + 1];
    char help[HELP_MAX_LEN + 1];
    enum tsr_metric_type type;
};

struct series {
    uint64_t hash;
    struct family *fam;
    char *labels;   /* as given by the caller, the lookup key with fam->name */
    char *rendered; /* k="v",... escaped for the text format ("" when none) */
    _Atomic uint64_t val; /* double bits: counter or gauge value */
    _Atomic uint64_t count;
    _Atomic uint64_t sum; /* double bits */
    _Atomic uint64_t buckets[TSR_METRICS_NBUCKETS + 1]; /* last = +Inf, non-cumulative */
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct series *) table[TABLE_SLOTS];
static struct family *families[TSR_METRICS_MAX_FAMILIES];
static int nfamilies;
static int nseries;
static _Atomic uint64_t dropped;
static struct {
    void (*fn)(void *);
    void *ud;
} collectors[MAX_COLLECTORS];
static int ncollectors;
static _Atomic int described_builtin;

static const struct {
    const char *name;
    enum tsr_metric_type type;
    const char *help;
} builtin[] = {
    {"tessera_rpc_requests_total", TSR_METRIC_COUNTER,
     "RPCs this process served, by full method path and gRPC status code."},
    {"tessera_rpc_duration_seconds", TSR_METRIC_HISTOGRAM,
     "Time from receiving an RPC to sending its status, by method."},
    {"tessera_shard_calls_total", TSR_METRIC_COUNTER,
     "Calls the coordinator made to a shard replica, by shard group, replica, address, "
     "method and status code."},
    {"tessera_shard_call_duration_seconds", TSR_METRIC_HISTOGRAM,
     "Duration of coordinator-to-replica calls (of the parallel fan-out round they were in), "
     "by shard group, replica and address."},
    {"tessera_shard_up", TSR_METRIC_GAUGE,
     "1 when the coordinator would send queries to this replica (no failure within its "
     "back-off, channel not failing, holds the served version), else 0."},
    {"tessera_version", TSR_METRIC_GAUGE, "Index version this process currently serves."},
    {"tessera_vectors", TSR_METRIC_GAUGE, "Datapoints in the served version of this shard."},
    {"tessera_lists", TSR_METRIC_GAUGE,
     "Non-empty coarse (IVF) lists in the served version of this shard."},
    {"tessera_update_phase", TSR_METRIC_GAUGE,
     "1 for the phase the current update is in (idle when none runs), 0 for the others."},
    {"tessera_update_records_total", TSR_METRIC_COUNTER,
     "Batch records (upserts and deletes) read by updates."},
    {"tessera_updates_total", TSR_METRIC_COUNTER,
     "Finished updates by result: committed, aborted (failed after staging began), "
     "rejected (invalid batch, nothing staged)."},
    {"tessera_update_errors_total", TSR_METRIC_COUNTER, "Update failures by error type."},
    {"tessera_last_update_success_timestamp_seconds", TSR_METRIC_GAUGE,
     "Unix time of the last committed update."},
    {"tessera_process_start_time_seconds", TSR_METRIC_GAUGE,
     "Unix time the process started (first use of the metrics registry)."},
};

static const char *const code_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *tsr_metrics_code_name(int code)
{
    if (code < 0 || code >= (int)(sizeof code_names / sizeof code_names[0])) return "UNKNOWN";
    return code_names[code];
}

static inline uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}
static inline double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d2u(u2d(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

static uint64_t hash_key(const char *name, const char *labels)
{
    static const unsigned char sep = 1; /* name and labels do not run together */
    uint64_t h = tsr_fnv1a64_str(TSR_FNV1A64_BASIS_ROUTE, name);
    h = tsr_fnv1a64(h, &sep, 1);
    return tsr_fnv1a64_str(h, labels);
}

static int valid_name(const char *s, int allow_colon)
{
    size_t n = 0;
    for (const char *p = s; *p; p++, n++) {
        char c = *p;
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':');
        if (!alpha && !(n > 0 && c >= '0' && c <= '9')) return 0;
    }
    return n > 0 && n <= NAME_MAX_LEN;
}


/* Shortest text that reads back as the same double; the format's NaN / +Inf / -Inf. */
static void fmt_double(char out[40], double v)
{
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, 40, "%.0f", v);
        return;
    }
    snprintf(out, 40, "%.15g", v);
    if (strtod(out, NULL) != v) snprintf(out, 40, "%.17g", v);
}

/* "k=v,k2=v2" → `k="v",k2="v2"` (escaped). Returns a new string or NULL when invalid. */
static char *render_labels(const char *labels, enum tsr_metric_type type)
{
    tsr_buf b = TSR_BUF_INIT;
    tsr_buf_puts(&b, "");
    const char *p = labels;
    while (*p) {
        const char *eq = strchr(p, '=');
        const char *comma = strchr(p, ',');
        if (!eq || (comma && comma < eq)) goto bad;
        size_t kl = (size_t)(eq - p);
        char key[NAME_MAX_LEN + 1];
        if (kl == 0 || kl > NAME_MAX_LEN) goto bad;
        memcpy(key, p, kl);
        key[kl] = 0;
        if (!valid_name(key, 0) || strncmp(key, "__", 2) == 0) goto bad;
        if (type == TSR_METRIC_HISTOGRAM && strcmp(key, "le") == 0) goto bad;
        const char *v = eq + 1;
        const char *ve = comma ? comma : v + strlen(v);
        if (b.len) tsr_buf_puts(&b, ",");
        tsr_buf_add(&b, key, kl);
        tsr_buf_puts(&b, "=\"");
        for (const char *q = v; q < ve; q++) {
            if (*q == '\\') tsr_buf_puts(&b, "\\\\");
            else if (*q == '"') tsr_buf_puts(&b, "\\\"");
            else if (*q == '\n') tsr_buf_puts(&b, "\\n");
            else tsr_buf_add(&b, q, 1);
        }
        tsr_buf_puts(&b, "\"");
        p = comma ? comma + 1 : ve;
        if (comma && !*p) goto bad; /* trailing comma */
    }
    if (b.oom) goto bad;
    return b.p;
bad:
    free(b.p);
    return NULL;
}

/* ---- registry ------------------------------------------------------------------------- */

static struct family *family_find_locked(const char *name)
{
    for (int i = 0; i < nfamilies; i++)
        if (strcmp(families[i]->name, name) == 0) return families[i];
    return NULL;
}

static struct family *family_get_locked(const char *name, enum tsr_metric_type type)
{
    struct family *f = family_find_locked(name);
    if (f) return f->type == type ? f : NULL;
    if (nfamilies >= TSR_METRICS_MAX_FAMILIES || !valid_name(name, 1)) return NULL;
    f = calloc(1, sizeof *f);
    if (!f) return NULL;
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->help, sizeof f->help, "Tessera metric %s.", name);
    f->type = type;
    families[nfamilies++] = f;
    return f;
}

static void describe_builtin(void);

static void ensure_init(void)
{
    if (atomic_load_explicit(&described_builtin, memory_order_acquire)) return;
    describe_builtin();
}

static inline struct series *probe(uint64_t h, const char *name, const char *labels, size_t *slot)
{
    size_t i = (size_t)h & (TABLE_SLOTS - 1);
    for (size_t n = 0; n < TABLE_SLOTS; n++, i = (i + 1) & (TABLE_SLOTS - 1)) {
        struct series *s = atomic_load_explicit(&table[i], memory_order_acquire);
        if (!s) {
            *slot = i;
            return NULL;
        }
        if (s->hash == h && strcmp(s->labels, labels) == 0 && strcmp(s->fam->name, name) == 0)
            return s;
    }
    *slot = TABLE_SLOTS;
    return NULL;
}

/* The series for (name, labels) of `type`, created on first use; NULL = drop the sample. */
static struct series *lookup(const char *name, const char *labels, enum tsr_metric_type type)
{
    if (!name) goto drop;
    if (!labels) labels = "";
    ensure_init();
    uint64_t h = hash_key(name, labels);
    size_t slot;
    struct series *s = probe(h, name, labels, &slot);
    if (s) {
        if (s->fam->type != type) goto drop;
        return s;
    }
    if (strlen(labels) > LABELS_MAX_LEN) goto drop;
    pthread_mutex_lock(&reg_mu);
    s = probe(h, name, labels, &slot); /* another thread may have created it */
    if (!s && slot < TABLE_SLOTS && nseries < TSR_METRICS_MAX_SERIES) {
        struct family *f = family_get_locked(name, type);
        char *rendered = f ? render_labels(labels, type) : NULL;
        struct series *ns = rendered ? calloc(1, sizeof *ns) : NULL;
        char *lcopy = ns ? strdup(labels) : NULL;
        if (lcopy) {
            ns->hash = h;
            ns->fam = f;
            ns->labels = lcopy;
            ns->rendered = rendered;
            atomic_store_explicit(&table[slot], ns, memory_order_release);
            nseries++;
            s = ns;
        } else {
            free(rendered);
            free(ns);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    if (!s || s->fam->type != type) goto drop;
    return s;
drop:
    atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
    return NULL;
}

int tsr_metrics_describe(const char *name, enum tsr_metric_type type, const char *help)
{
    if (!name || type < TSR_METRIC_COUNTER || type > TSR_METRIC_HISTOGRAM) return TSR_EINVAL;
    pthread_mutex_lock(&reg_mu);
    struct family *f = family_get_locked(name, type);
    if (f && help) {
        /* HELP text: escape backslash and newline as the format requires. */
        size_t o = 0;
        for (const char *p = help; *p && o + 2 < sizeof f->help; p++) {
            if (*p == '\\' || *p == '\n') {
                f->help[o++] = '\\';
                f->help[o++] = *p == '\n' ? 'n' : '\\';
            } else {
                f->help[o++] = *p;
            }
        }
        f->help[o] = 0;
    }
    pthread_mutex_unlock(&reg_mu);
    return f ? 0 : TSR_EINVAL;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void describe_builtin(void)
{
    static pthread_mutex_t once_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&once_mu);
    if (!atomic_load(&described_builtin)) {
        for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
            tsr_metrics_describe(builtin[i].name, builtin[i].type, builtin[i].help);
        atomic_store_explicit(&described_builtin, 1, memory_order_release);
        tsr_metrics_gauge_set("tessera_process_start_time_seconds", NULL, wall_now());
    }
    pthread_mutex_unlock(&once_mu);
}

void tsr_metrics_counter_add(const char *name, const char *labels, double v)
{
    if (!(v >= 0)) { /* negative or NaN */
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    struct series *s = lookup(name, labels, TSR_METRIC_COUNTER);
    if (s) atomic_add_double(&s->val, v);
}

void tsr_metrics_gauge_set(const char *name, const char *labels, double v)
{
    struct series *s = lookup(name, labels, TSR_METRIC_GAUGE);
    if (s) atomic_store_explicit(&s->val, d2u(v), memory_order_relaxed);
}

void tsr_metrics_gauge_add(const char *name, const char *labels, double v)
{
    struct series *s = lookup(name, labels, TSR_METRIC_GAUGE);
    if (s) atomic_add_double(&s->val, v);
}

void tsr_metrics_histogram_observe(const char *name, const char *labels, double v)
{
    if (isnan(v)) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    struct series *s = lookup(name, labels, TSR_METRIC_HISTOGRAM);
    if (!s) return;
    int i = 0;
    while (i < TSR_METRICS_NBUCKETS && v > tsr_metrics_buckets[i]) i++;
    atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&s->sum, v);
    atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
}

double tsr_metrics_value(const char *name, const char *labels)
{
    if (!name) return NAN;
    if (!labels) labels = "";
    size_t slot;
    struct series *s = probe(hash_key(name, labels), name, labels, &slot);
    if (!s) return NAN;
    if (s->fam->type == TSR_METRIC_HISTOGRAM)
        return (double)atomic_load_explicit(&s->count, memory_order_relaxed);
    return u2d(atomic_load_explicit(&s->val, memory_order_relaxed));
}

/* ---- domain hooks --------------------------------------------------------------------- */

/* Appends "key=value" to buf, with ',' in the value (which would split it) as '_'. */
static void put_label(char *buf, size_t cap, const char *key, const char *value)
{
    size_t o = strlen(buf);
    if (o && o + 1 < cap) buf[o++] = ',';
    for (const char *k = key; *k && o + 1 < cap; k++) buf[o++] = *k;
    if (o + 1 < cap) buf[o++] = '=';
    for (const char *v = value ? value : ""; *v && o + 1 < cap; v++) buf[o++] = *v == ',' ? '_' : *v;
    buf[o] = 0;
}

void tsr_metrics_rpc_observe(const char *method, int grpc_code, double seconds)
{
    char l[320] = "";
    put_label(l, sizeof l, "method", method);
    tsr_metrics_histogram_observe("tessera_rpc_duration_seconds", l, seconds);
    put_label(l, sizeof l, "code", tsr_metrics_code_name(grpc_code));
    tsr_metrics_counter_add("tessera_rpc_requests_total", l, 1);
}

void tsr_metrics_shard_call_observe(const char *shard, const char *method, int grpc_code,
                                    double seconds)
{
    char l[400] = "";
    put_label(l, sizeof l, "shard", shard);
    tsr_metrics_histogram_observe("tessera_shard_call_duration_seconds", l, seconds);
    put_label(l, sizeof l, "method", method);
    put_label(l, sizeof l, "code", tsr_metrics_code_name(grpc_code));
    tsr_metrics_counter_add("tessera_shard_calls_total", l, 1);
}

void tsr_metrics_shard_up(const char *shard, int up)
{
    char l[200] = "";
    put_label(l, sizeof l, "shard", shard);
    tsr_metrics_gauge_set("tessera_shard_up", l, up ? 1 : 0);
}

void tsr_metrics_version_set(uint64_t version)
{
    tsr_metrics_gauge_set("tessera_version", NULL, (double)version);
}

void tsr_metrics_index_size(uint64_t vectors, uint64_t lists)
{
    tsr_metrics_gauge_set("tessera_vectors", NULL, (double)vectors);
    tsr_metrics_gauge_set("tessera_lists", NULL, (double)lists);
}

static const char *const phases[] = {"idle", "validate", "stage", "prepare", "commit", "other"};

void tsr_metrics_update_phase(const char *phase)
{
    size_t np = sizeof phases / sizeof phases[0], cur = np - 1;
    for (size_t i = 0; i < np; i++)
        if (phase && strcmp(phase, phases[i]) == 0) cur = i;
    for (size_t i = 0; i < np; i++) {
        char l[64] = "";
        put_label(l, sizeof l, "phase", phases[i]);
        tsr_metrics_gauge_set("tessera_update_phase", l, i == cur ? 1 : 0);
    }
}

void tsr_metrics_update_records(uint64_t n)
{
    tsr_metrics_counter_add("tessera_update_records_total", NULL, (double)n);
}

void tsr_metrics_update_done(const char *result, const char *error_type)
{
    char l[160] = "";
    put_label(l, sizeof l, "result", result ? result : "unknown");
    tsr_metrics_counter_add("tessera_updates_total", l, 1);
    if (error_type) {
        l[0] = 0;
        put_label(l, sizeof l, "type", error_type);
        tsr_metrics_counter_add("tessera_update_errors_total", l, 1);
    }
    if (result && strcmp(result, "committed") == 0)
        tsr_metrics_gauge_set("tessera_last_update_success_timestamp_seconds", NULL, wall_now());
    tsr_metrics_update_phase("idle");
}

double tsr_metrics_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tsr_metrics_add_collector(void (*fn)(void *ud), void *ud)
{
    int rc = TSR_ELIMIT;
    pthread_mutex_lock(&reg_mu);
    if (fn && ncollectors < MAX_COLLECTORS) {
        collectors[ncollectors].fn = fn;
        collectors[ncollectors].ud = ud;
        ncollectors++;
        rc = 0;
    }
    pthread_mutex_unlock(&reg_mu);
    return rc;
}

/* ---- rendering ------------------------------------------------------------------------ */

static int cmp_series(const void *a, const void *b)
{
    const struct series *x = *(const struct series *const *)a, *y = *(const struct series *const *)b;
    return strcmp(x->rendered, y->rendered);
}

static void render_series(tsr_buf *b, const struct series *s)
{
    const char *n = s->fam->name;
    char num[40];
    if (s->fam->type != TSR_METRIC_HISTOGRAM) {
        fmt_double(num, u2d(atomic_load_explicit(&s->val, memory_order_relaxed)));
        if (s->rendered[0]) tsr_buf_printf(b, "%s{%s} %s\n", n, s->rendered, num);
        else tsr_buf_printf(b, "%s %s\n", n, num);
        return;
    }
    const char *sep = s->rendered[0] ? "," : "";
    uint64_t cum = 0;
    for (int i = 0; i <= TSR_METRICS_NBUCKETS; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        if (i < TSR_METRICS_NBUCKETS) fmt_double(num, tsr_metrics_buckets[i]);
        else strcpy(num, "+Inf");
        tsr_buf_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", n, s->rendered, sep, num,
                  (unsigned long long)cum);
    }
    fmt_double(num, u2d(atomic_load_explicit(&s->sum, memory_order_relaxed)));
    /* _count equals the +Inf bucket, as the format requires, even mid-observe. */
    if (s->rendered[0]) {
        tsr_buf_printf(b, "%s_sum{%s} %s\n", n, s->rendered, num);
        tsr_buf_printf(b, "%s_count{%s} %llu\n", n, s->rendered, (unsigned long long)cum);
    } else {
        tsr_buf_printf(b, "%s_sum %s\n%s_count %llu\n", n, num, n, (unsigned long long)cum);
    }
}

static const char *type_name(enum tsr_metric_type t)
{
    return t == TSR_METRIC_COUNTER ? "counter" : t == TSR_METRIC_GAUGE ? "gauge" : "histogram";
}

char *tsr_metrics_render(size_t *len)
{
    ensure_init();
    /* Collectors first, with no lock held: they sample and may create series. */
    void (*fns[MAX_COLLECTORS])(void *);
    void *uds[MAX_COLLECTORS];
    pthread_mutex_lock(&reg_mu);
    int nc = ncollectors;
    for (int i = 0; i < nc; i++) {
        fns[i] = collectors[i].fn;
        uds[i] = collectors[i].ud;
    }
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < nc; i++) fns[i](uds[i]);

    tsr_buf b = TSR_BUF_INIT;
    struct series **list = malloc(sizeof *list * TSR_METRICS_MAX_SERIES);
    if (!list) return NULL;
    pthread_mutex_lock(&reg_mu);
    for (int f = 0; f < nfamilies; f++) {
        int n = 0;
        for (size_t i = 0; i < TABLE_SLOTS; i++) {
            struct series *s = atomic_load_explicit(&table[i], memory_order_acquire);
            if (s && s->fam == families[f] && n < TSR_METRICS_MAX_SERIES) list[n++] = s;
        }
        if (n == 0) continue; /* described but never sampled: nothing to say yet */
        qsort(list, (size_t)n, sizeof *list, cmp_series);
        tsr_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", families[f]->name, families[f]->help,
                  families[f]->name, type_name(families[f]->type));
        for (int i = 0; i < n; i++) render_series(&b, list[i]);
    }
    pthread_mutex_unlock(&reg_mu);
    free(list);
    tsr_buf_printf(&b,
              "# HELP tessera_metrics_dropped_total Samples dropped by the metrics registry "
              "(bad name or labels, type mismatch, registry full).\n"
              "# TYPE tessera_metrics_dropped_total counter\n"
              "tessera_metrics_dropped_total %llu\n",
              (unsigned long long)atomic_load_explicit(&dropped, memory_order_relaxed));
    tsr_metrics_process_render(&b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len) *len = b.len;
    return b.p;
}

void tsr_metrics_reset(void)
{
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < TABLE_SLOTS; i++) {
        struct series *s = atomic_exchange(&table[i], NULL);
        if (s) {
            free(s->labels);
            free(s->rendered);
            free(s);
        }
    }
    for (int i = 0; i < nfamilies; i++) free(families[i]);
    nfamilies = 0;
    nseries = 0;
    ncollectors = 0;
    atomic_store(&dropped, 0);
    atomic_store(&described_builtin, 0);
    pthread_mutex_unlock(&reg_mu);
}
