/*
 * ivfpq_search — coarse assignment, per-query tables, the ADC scan with a top-k heap,
 * IwQR refinement and multithreaded batches (see ivfpq_search.h for the semantics), and
 * the run-time choice of a scan kernel: the scalar reference kernels are in
 * ivfpq_search_scalar.c, the SIMD ones in ivfpq_search_avx2.c / _avx512.c (all declared
 * in ivfpq_search_int.h).
 *
 * Every metric / residual variant is reduced to one scan: "smaller is better" distance
 *     dis = base(list) + term(vector) + sum_m T[m][code_m]
 * with base = ||x - c||^2 (L2 residual), -<x, c> (IP residual) or 0, term = ||y||^2 +
 * 2<c, y> (L2 residual only, from the cache) and T the per-query table (negated for IP;
 * negation is exact in float, so IP results are the negated scan values bit for bit).
 * The scan computes a block of distances with a kernel, then a scalar pass offers the
 * few that beat the heap top to the filter and the heap. From nprobe 2 on (8-bit codes,
 * AVX-512 VBMI or AVX2) a quantized prefilter bounds 64 codes at a time from a transposed
 * copy of the codes kept in the search cache, and only the codes whose bound is within a
 * rounding margin of the heap top get the exact sum: same results, ~3x less work at
 * nprobe 64 (see scan_list and tsr__quantize_table; docs/performance.md has figures).
 *
 * DESIGN (threads): a batch is split into query blocks that worker threads take from an
 * atomic counter; each worker owns its workspace (table, distance block, heap) and writes
 * only its queries' rows of D and I. The index and the cache are read-only during a
 * search. The cache is published once with an atomic pointer under `cache_lock`
 * (double-checked), the only lock of this file.
 */
#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "index/knn.h"
#include "core/heap.h"
#include "core/cpu.h"
#include "core/mem.h"
#include "core/testing.h"

/* ---- options and SIMD selection -------------------------------------------------- */

void tsr_ivfpq_search_opts_init(tsr_ivfpq_search_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
}

int tsr_ivfpq_search_simd_supported(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_AUTO:
    case TSR_SIMD_SCALAR:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case TSR_SIMD_AVX2:
        return tsr_cpu_has(TSR_CPU_AVX2);
    case TSR_SIMD_AVX512:
        return tsr_cpu_has(TSR_CPU_AVX512);
#endif
    default:
        return 0;
    }
}

const char *tsr_ivfpq_search_simd_name(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_SCALAR: return "scalar";
    case TSR_SIMD_AVX2: return "avx2";
    case TSR_SIMD_AVX512: return "avx512";
    default: return "auto";
    }
}

/* Gathers are not always faster than scalar loads (on the virtualized AMD EPYC of the
 * benchmarks, AVX2 gathers are ~20x and AVX-512 gathers ~3x slower than the scalar
 * kernel), so the automatic choice is measured once per process: each supported kernel
 * scans the same 512 random codes (M = 64) a few times and the fastest wins. All kernels
 * return bit-identical distances, so the choice changes speed only. */
static enum tsr_simd calibrated = TSR_SIMD_AUTO;
static pthread_once_t calibrate_once = PTHREAD_ONCE_INIT;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void calibrate(void)
{
    enum { CM = 64, CN = 512 };
    float *T = tsr_try_aligned(CM * 256, sizeof(float));
    uint8_t *codes = malloc((size_t)CM * CN);
    float *out = malloc(CN * sizeof(float));
    calibrated = TSR_SIMD_SCALAR;
    if (T == NULL || codes == NULL || out == NULL)
        goto done;
    uint32_t s = 12345;
    for (size_t i = 0; i < CM * 256; i++)
        T[i] = (float)(i % 97) * 0.01f;
    for (size_t i = 0; i < (size_t)CM * CN; i++) {
        s = s * 1103515245u + 12345u;
        codes[i] = (uint8_t)(s >> 23);
    }
    /* Rounds alternate the kernels (a burst of load on the shared machine then hits all
     * of them, not just the one being timed); best of 9 rounds each. */
    const enum tsr_simd cands[] = {TSR_SIMD_SCALAR, TSR_SIMD_AVX2, TSR_SIMD_AVX512};
    enum { NC = sizeof cands / sizeof cands[0] };
    double t[NC];
    for (size_t c = 0; c < NC; c++)
        t[c] = -1;
    for (int r = 0; r < 9; r++) {
        for (size_t c = 0; c < NC; c++) {
            if (!tsr_ivfpq_search_simd_supported(cands[c]))
                continue;
            double t0 = now_ns();
            tsr__scan8_for(cands[c])(T, CM, codes, CN, NULL, 0.0f, out);
            double dt = now_ns() - t0;
            if (t[c] < 0 || dt < t[c])
                t[c] = dt;
        }
    }
    double best = 0;
    int have = 0;
    for (size_t c = 0; c < NC; c++) {
        if (t[c] < 0)
            continue;
        if (!have || t[c] < best * 0.9) { /* a wider path must win clearly */
            have = 1;
            best = t[c];
            calibrated = cands[c];
        }
    }
done:
    free(T);
    free(codes);
    free(out);
}

enum tsr_simd tsr_ivfpq_search_simd_auto(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SIMD);
    if (e != NULL && *e) {
        enum tsr_simd want = strcmp(e, "scalar") == 0   ? TSR_SIMD_SCALAR
                             : strcmp(e, "avx2") == 0   ? TSR_SIMD_AVX2
                             : strcmp(e, "avx512") == 0 ? TSR_SIMD_AVX512
                                                        : TSR_SIMD_AUTO;
        /* Forcing a path the CPU lacks falls back to the automatic choice rather than
         * crashing on an illegal instruction. */
        if (want != TSR_SIMD_AUTO && tsr_ivfpq_search_simd_supported(want))
            return want;
    }
    pthread_once(&calibrate_once, calibrate);
    /* A cap (TSR_SIMD_MAX) set after the calibration: the scalar kernel, the reference */
    return tsr_ivfpq_search_simd_supported(calibrated) ? calibrated : TSR_SIMD_SCALAR;
}

tsr__scan8_fn tsr__scan8_for(enum tsr_simd s)
{
    switch (s) {
    case TSR_SIMD_AVX2: return tsr__scan8_avx2;
    case TSR_SIMD_AVX512: return tsr__scan8_avx512;
    default: return tsr__scan8_scalar;
    }
}

/* ---- search cache: per stored vector ||y||^2 + 2<c, y> (L2 by_residual) ---------------- */

typedef tsr__search_cache search_cache;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static void cache_free(search_cache *c)
{
    if (c == NULL)
        return;
    free(c->sizes);
    free(c->offsets);
    free(c->term);
    free(c->ct);
    free(c->tcodes);
    free(c->toffsets);
    tsr__ranks_unref(c->rk);
    free(c->ct_r);
    free(c->cnorms);
    free(c);
}

void tsr__ivfpq_search_cache_free(tsr_ivfpq *ix)
{
    if (ix == NULL)
        return;
    cache_free(ix->search_cache);
    ix->search_cache = NULL;
}

void tsr_ivfpq_search_invalidate(tsr_ivfpq *ix)
{
    tsr__ivfpq_search_cache_free(ix);
}

static float dot(const float *a, const float *b, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float l2sqr(const float *a, const float *b, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++) {
        float t = a[i] - b[i];
        s += t * t;
    }
    return s;
}

/* P[m][j] = ||c_mj||^2 + 2 <cent_m, c_mj> of list l: the same per-entry table as Faiss's
 * precomputed table type 1, so sum_m P[m][code_m] = ||y||^2 + 2 <cent, y>. */
static void list_table(const tsr_ivfpq *ix, size_t l, float *P)
{
    const tsr_pq *pq = &ix->pq;
    const float *cent = ix->centroids + l * (size_t)ix->d;
    for (size_t m = 0; m < pq->M; m++) {
        const float *cm = cent + m * pq->dsub;
        for (size_t j = 0; j < pq->ksub; j++) {
            const float *cj = pq->centroids + (m * pq->ksub + j) * pq->dsub;
            P[m * pq->ksub + j] = dot(cj, cj, pq->dsub) + 2.0f * dot(cm, cj, pq->dsub);
        }
    }
}

void tsr_ivfpq_terms_from_table(const tsr_ivfpq *ix, const float *P, const uint8_t *codes,
                                size_t n, float *term)
{
    const tsr_pq *pq = &ix->pq;
    if (pq->nbits == 8)
        tsr__scan8_scalar(P, pq->M, codes, n, NULL, 0.0f, term);
    else
        tsr__scan_generic(P, pq, codes, n, NULL, 0.0f, term);
}

/* Terms of n codes of list l (see tsr_ivfpq_list_terms); P is M * ksub scratch. */
static void list_terms(const tsr_ivfpq *ix, size_t l, const uint8_t *codes, size_t n,
                       float *P, float *term)
{
    list_table(ix, l, P);
    tsr_ivfpq_terms_from_table(ix, P, codes, n, term);
}

int tsr_ivfpq_list_table(const tsr_ivfpq *ix, size_t list, float *P, tsr_error *err)
{
    if (!tsr_ivfpq_has_terms(ix) || list >= ix->nlist || ix->pq.centroids == NULL ||
        ix->centroids == NULL)
        return tsr_err(err, TSR_EINVAL, "list_table: list %zu of %zu, or no terms for this "
                       "index (metric %d, by_residual %d)", list, ix->nlist, (int)ix->metric,
                       ix->by_residual);
    list_table(ix, list, P);
    return 0;
}

int tsr_ivfpq_has_terms(const tsr_ivfpq *ix)
{
    return ix->metric == TSR_METRIC_L2 && ix->by_residual;
}

int tsr_ivfpq_list_terms(const tsr_ivfpq *ix, size_t list, const uint8_t *codes, size_t n,
                         float *term, tsr_error *err)
{
    if (!tsr_ivfpq_has_terms(ix) || list >= ix->nlist || ix->pq.centroids == NULL ||
        ix->centroids == NULL)
        return tsr_err(err, TSR_EINVAL, "list_terms: list %zu of %zu, or no terms for this "
                       "index (metric %d, by_residual %d)", list, ix->nlist, (int)ix->metric,
                       ix->by_residual);
    if (n == 0)
        return 0;
    float *P = tsr_try_malloc(ix->pq.M * ix->pq.ksub, sizeof(float));
    if (P == NULL)
        return tsr_err(err, TSR_ENOMEM, "list_terms: out of memory for a %zu x %zu table",
                       ix->pq.M, ix->pq.ksub);
    list_terms(ix, list, codes, n, P, term);
    free(P);
    return 0;
}

/* TSR_SEARCH_FILTER: "0" = no prefilter (0), "scalar" = the scalar filter kernel (1,
 * tests), otherwise the AVX-512 VBMI kernel where the CPU has it (2), else the AVX2 kernel
 * (3), else none (0). */
static int filter_env(void)
{
    const char *e = tsr_test_knob(TSR_KNOB_SEARCH_FILTER);
    if (e && strcmp(e, "0") == 0)
        return 0;
    if (e && strcmp(e, "scalar") == 0)
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    if (tsr__filter8_avx512_supported())
        return 2;
    if (tsr__filter8_avx2_supported())
        return 3;
#endif
    return 0;
}

/* The transposed copy is built only where a filter kernel will use it. */
static int filter_wanted(const tsr_pq *pq)
{
    return pq->nbits == 8 && pq->M <= 256 && filter_env() != 0;
}

/* The prefilter reads ~16 KB from each of nprobe lists scattered over the copy: with
 * 4 KB pages nearly every list costs TLB misses (two-level page walks in a VM), so the
 * copy asks for transparent huge pages (2 MB aligned; madvise is a hint: without THP it
 * is an ordinary allocation). Freed with free(). */
static void *alloc_huge(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        size_t r = (bytes + huge - 1) / huge * huge;
        if (r >= bytes && posix_memalign(&p, huge, r) == 0) {
            (void)madvise(p, r, MADV_HUGEPAGE);
            return p;
        }
        return NULL;
    }
    return tsr_try_aligned(bytes ? bytes : 1, 1);
}

/* Bytes of one prefilter block: M rows of TSR__FBLOCK code bytes, then the block's
 * terms when the variant has them (a multiple of 64: blocks stay 64-aligned). */
size_t tsr__fblock_size(size_t M, int has_term)
{
    return M * TSR__FBLOCK + (has_term ? TSR__FBLOCK * sizeof(float) : 0);
}

static size_t fblock_bytes(const search_cache *c, size_t M)
{
    return tsr__fblock_size(M, c->term != NULL);
}

/* Transposes n codes (and their terms, when term is non-NULL; each code byte mapped
 * through rank when it is non-NULL) into dst, blocks of bsz bytes (tsr__fblock_size),
 * zeroed by the caller. */
void tsr__transpose_list(const uint8_t *codes, const float *term, size_t n, size_t M,
                         size_t bsz, const uint8_t *rank, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t *bp = dst + i / TSR__FBLOCK * bsz;
        const uint8_t *code = codes + i * M;
        for (size_t m = 0; m < M; m++)
            bp[m * TSR__FBLOCK + i % TSR__FBLOCK] = rank ? rank[m * 256 + code[m]] : code[m];
        if (term != NULL)
            memcpy(bp + M * TSR__FBLOCK + i % TSR__FBLOCK * sizeof(float), term + i,
                   sizeof(float));
    }
}

static search_cache *cache_build(const tsr_ivfpq *ix, tsr_error *err)
{
    const tsr_pq *pq = &ix->pq;
    search_cache *c = calloc(1, sizeof *c);
    float *P = NULL;
    if (c == NULL)
        goto oom;
    c->nlist = ix->nlist;
    c->sizes = tsr_try_malloc(ix->nlist, sizeof(size_t));
    c->offsets = tsr_try_malloc(ix->nlist, sizeof(size_t));
    if (c->sizes == NULL || c->offsets == NULL)
        goto oom;
    size_t total = 0;
    for (size_t l = 0; l < ix->nlist; l++) {
        c->sizes[l] = ix->lists[l].size;
        c->offsets[l] = total;
        total += ix->lists[l].size;
    }
    c->ct = tsr_try_aligned(pq->M * pq->ksub, pq->dsub * sizeof(float));
    if (c->ct == NULL)
        goto oom;
    if (ix->metric == TSR_METRIC_L2) {
        c->cnorms = tsr_try_malloc(ix->nlist ? ix->nlist : 1, sizeof(float));
        if (c->cnorms == NULL)
            goto oom;
        tsr_knn_norms(ix->centroids, ix->nlist, (size_t)ix->d, c->cnorms);
    }
    for (size_t m = 0; m < pq->M; m++)
        for (size_t t = 0; t < pq->dsub; t++)
            for (size_t j = 0; j < pq->ksub; j++)
                c->ct[(m * pq->dsub + t) * pq->ksub + j] =
                    pq->centroids[(m * pq->ksub + j) * pq->dsub + t];
    if (ix->metric == TSR_METRIC_L2 && ix->by_residual) {
        c->term = tsr_try_malloc(total ? total : 1, sizeof(float));
        P = tsr_try_malloc(pq->M * pq->ksub, sizeof(float));
        if (c->term == NULL || P == NULL)
            goto oom;
        for (size_t l = 0; l < ix->nlist; l++) {
            const tsr_invlist *L = &ix->lists[l];
            if (L->size == 0)
                continue;
            float *t = c->term + c->offsets[l];
            list_terms(ix, l, L->codes, L->size, P, t);
            for (size_t i = 0; i < L->size; i++) {
                float a = fabsf(t[i]);
                if (!(a <= c->tmax)) /* NaN: never filter (tmax = inf) */
                    c->tmax = a == a ? a : INFINITY;
            }
        }
    }
    if (tsr__ranks_new(pq, &c->rk) != 0)
        goto oom;
    if (c->rk != NULL) { /* dsub = 1: the blocks hold ranks, their tables are in rank order */
        const uint8_t *rank = tsr__ranks_rank(c->rk);
        if ((c->ct_r = tsr_try_aligned(pq->M * 256, sizeof(float))) == NULL)
            goto oom;
        for (size_t m = 0; m < pq->M; m++)
            for (size_t j = 0; j < 256; j++)
                c->ct_r[m * 256 + rank[m * 256 + j]] = c->ct[m * 256 + j];
    }
    if (filter_wanted(pq)) {
        /* One stream per list for the prefilter: each block holds its codes transposed
         * and then (L2 by_residual) its 64 terms, so a list is read front to back. */
        size_t bytes = 0, bsz = fblock_bytes(c, pq->M);
        c->toffsets = tsr_try_malloc(ix->nlist, sizeof(size_t));
        if (c->toffsets == NULL)
            goto oom;
        for (size_t l = 0; l < ix->nlist; l++) {
            size_t nb = (ix->lists[l].size + TSR__FBLOCK - 1) / TSR__FBLOCK, add;
            c->toffsets[l] = bytes;
            if (tsr_mul_ok(nb, bsz, &add) != 0 || bytes + add < bytes)
                goto oom;
            bytes += add;
        }
        c->tbytes = bytes;
        c->tcodes = alloc_huge(bytes);
        if (c->tcodes == NULL)
            goto oom;
        memset(c->tcodes, 0, bytes);
        for (size_t l = 0; l < ix->nlist; l++)
            tsr__transpose_list(ix->lists[l].codes, c->term ? c->term + c->offsets[l] : NULL,
                                ix->lists[l].size, pq->M, bsz,
                                c->rk ? tsr__ranks_rank(c->rk) : NULL,
                                c->tcodes + c->toffsets[l]);
    }
    free(P);
    return c;
oom:
    free(P);
    cache_free(c);
    tsr_err(err, TSR_ENOMEM, "search: out of memory for the search cache (%zu lists)",
            ix->nlist);
    return NULL;
}

const search_cache *tsr__search_cache_get(const tsr_ivfpq *cix, tsr_error *err)
{
    /* The cache is derived data; building it does not change the index as observed by
     * callers, hence the cast away from const. */
    tsr_ivfpq *ix = (tsr_ivfpq *)cix;
    search_cache *c = __atomic_load_n((search_cache **)&ix->search_cache, __ATOMIC_ACQUIRE);
    if (c != NULL)
        return c;
    pthread_mutex_lock(&cache_lock);
    c = ix->search_cache;
    if (c == NULL) {
        c = cache_build(ix, err);
        if (c != NULL)
            __atomic_store_n((search_cache **)&ix->search_cache, c, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cache_lock);
    return c;
}

int tsr_ivfpq_search_prepare(tsr_ivfpq *ix, tsr_error *err)
{
    /* The kernel calibration (once per process, a few ms) belongs to preparing too: it
     * would otherwise land in the first search (a tenth of a 2000-query batch at
     * nprobe 1). */
    (void)tsr_ivfpq_search_simd_auto();
    return tsr__search_cache_get(ix, err) != NULL ? 0 : (err ? err->code : TSR_ENOMEM);
}

/* ---- top-k heap, as Faiss 1.7.3's: values "smaller is better" ------------------------
 * core/heap.h. A candidate enters only when strictly better than the top (so among exact
 * ties the first scanned stays, as in Faiss); for IP the heap holds the negated product
 * with TSR_HEAP_TIE_SMALL_ID_WORSE, so output ties come in ascending id order for L2 and
 * descending for IP, exactly as Faiss returns them. */
typedef tsr_heap heap;

/* ---- per-thread workspace and the scan of one query ----------------------------------- */

#define FILTER_MIN_NPROBE 2 /* the prefilter from this nprobe on */
#ifndef FILTER_PF_LEAD
#define FILTER_PF_LEAD 16384 /* bytes the prefetch cursor runs ahead of the prefilter */
#endif

typedef struct job {
    const tsr_ivfpq *ix;
    const search_cache *cache;
    size_t n, k, nprobe;
    const float *x;
    const int64_t *lists;
    const float *coarse_dis;
    const tsr_ivfpq_search_opts *opts;
    tsr__scan8_fn scan8;
    int refine;      /* IwQR refinement active */
    tsr__filter8_fn filter; /* the prefilter kernel, NULL = none (see filter_env) */
    tsr__filter8_fn filter4; /* with cache->rk: the group kernel instead, or NULL */
    int sorted;      /* filter4 and tsr__rows_sorted: the group table from the rows' ends */
    int wide_table;  /* build the table with AVX-512 (see tsr__wide_table_ok) */
    size_t k1;       /* candidates from the scan: k, or k_factor * k with refine */
    float *D;
    int64_t *I;
    atomic_size_t next; /* next query to take */
} job;

typedef struct worker {
    job *jb;
    float *T;        /* M * ksub table */
    uint8_t *Tq;     /* NULL or M * 256: T quantized for the prefilter */
    uint8_t *Tg;     /* NULL or M * 64: its group minima (the group stage) */
    float *dis;      /* TSR__SCAN_BLOCK distances */
    heap h;
    heap hr;         /* refine heap (k entries) */
    float *r1, *r2;  /* refine: d floats each */
    int rc;
    tsr_error err;
    pthread_t thread;
} worker;

static void worker_close(worker *w)
{
    free(w->T);
    free(w->Tq);
    free(w->Tg);
    free(w->dis);
    free(w->h.d);
    free(w->h.id);
    free(w->h.aux);
    free(w->hr.d);
    free(w->hr.id);
    free(w->r1);
    free(w->r2);
}

static int worker_init(worker *w, job *jb)
{
    const tsr_pq *pq = &jb->ix->pq;
    memset(w, 0, sizeof *w);
    w->jb = jb;
    tsr_error_clear(&w->err);
    w->T = tsr_try_aligned(pq->M * pq->ksub, sizeof(float));
    w->dis = tsr_try_aligned(TSR__SCAN_BLOCK, sizeof(float));
    w->h.k = jb->k1;
    w->h.d = tsr_try_malloc(jb->k1 ? jb->k1 : 1, sizeof(float));
    w->h.id = tsr_try_malloc(jb->k1 ? jb->k1 : 1, sizeof(int64_t));
    int ok = w->T && w->dis && w->h.d && w->h.id;
    if (jb->filter != NULL) {
        w->Tq = tsr_try_aligned(pq->M * 256, 1);
        ok = ok && w->Tq;
    }
    if (jb->filter4 != NULL) {
        w->Tg = tsr_try_aligned(pq->M * 64, 1);
        ok = ok && w->Tg;
    }
    if (jb->refine) {
        w->h.aux = tsr_try_malloc(jb->k1 ? jb->k1 : 1, sizeof(int64_t));
        w->hr.k = jb->k;
        w->hr.d = tsr_try_malloc(jb->k ? jb->k : 1, sizeof(float));
        w->hr.id = tsr_try_malloc(jb->k ? jb->k : 1, sizeof(int64_t));
        w->r1 = tsr_try_malloc((size_t)jb->ix->d, sizeof(float));
        w->r2 = tsr_try_malloc((size_t)jb->ix->d, sizeof(float));
        ok = ok && w->h.aux && w->hr.d && w->hr.id && w->r1 && w->r2;
    }
    if (!ok) {
        worker_close(w);
        memset(w, 0, sizeof *w);
        return tsr_err(&w->err, TSR_ENOMEM, "search: out of memory for a %zu x %zu table",
                       pq->M, pq->ksub);
    }
    return 0;
}

/* The per-query table, "smaller is better" (see the file comment), from the transposed
 * centroids so that the inner loop runs over j with unit stride in 4-wide vectors. Each
 * entry is summed over t in order, as the straightforward per-entry dot product. The
 * metric's scale (-1 for IP, -2 for the L2 residual form) is a power of two, so it is
 * folded into x_t: (s x_t) c = s (x_t c) and the sums scale exactly, which saves a
 * second pass over the 64 KB table (it was half of the table time). */
typedef float v4sf __attribute__((vector_size(16)));

void tsr__build_table(const tsr_ivfpq *ix, const float *ct, const float *x, float *T, int wide)
{
    const tsr_pq *pq = &ix->pq;
    const size_t ksub = pq->ksub, dsub = pq->dsub;
    const int mode = ix->metric == TSR_METRIC_IP ? 0 : ix->by_residual ? 1 : 2;
    const float scale = mode == 0 ? -1.0f : -2.0f;
    /* wide: the AVX-512 form (same bits; ~3x faster, a twentieth of a query at nprobe 1) */
    if (wide && mode != 2 && ksub % 16 == 0) {
        tsr__table_avx512(ct, x, pq->M, dsub, ksub, scale, T);
        return;
    }
    const size_t k4 = ksub & ~(size_t)3; /* ksub < 4 only for nbits = 1 */
    for (size_t m = 0; m < pq->M; m++) {
        const float *xm = x + m * dsub;
        const float *cm = ct + m * dsub * ksub;
        float *tab = T + m * ksub;
        if (mode == 2) { /* sum_t (x_t - c_t)^2 */
            for (size_t t = 0; t < dsub; t++) {
                const float *c = cm + t * ksub;
                const float xt = xm[t];
                for (size_t j = 0; j < k4; j += 4) {
                    v4sf cv, tv;
                    memcpy(&cv, c + j, sizeof cv);
                    v4sf dl = xt - cv;
                    if (t == 0) {
                        tv = dl * dl;
                    } else {
                        memcpy(&tv, tab + j, sizeof tv);
                        tv += dl * dl;
                    }
                    memcpy(tab + j, &tv, sizeof tv);
                }
                for (size_t j = k4; j < ksub; j++)
                    tab[j] = (t == 0 ? 0.0f : tab[j]) + (xt - c[j]) * (xt - c[j]);
            }
            continue;
        }
        /* t = 0 initializes, later t accumulate (separate loops: no branch inside) */
        {
            const float xt = scale * xm[0];
            for (size_t j = 0; j < k4; j += 4) {
                v4sf cv;
                memcpy(&cv, cm + j, sizeof cv);
                v4sf tv = xt * cv;
                memcpy(tab + j, &tv, sizeof tv);
            }
            for (size_t j = k4; j < ksub; j++)
                tab[j] = xt * cm[j];
        }
        for (size_t t = 1; t < dsub; t++) {
            const float *c = cm + t * ksub;
            const float xt = scale * xm[t];
            for (size_t j = 0; j < k4; j += 4) {
                v4sf cv, tv;
                memcpy(&cv, c + j, sizeof cv);
                memcpy(&tv, tab + j, sizeof tv);
                tv += xt * cv;
                memcpy(tab + j, &tv, sizeof tv);
            }
            for (size_t j = k4; j < ksub; j++)
                tab[j] += xt * c[j];
        }
    }
}

/* A prefetch cursor that runs ahead of the prefilter through the transposed codes of
 * the probed lists, across list boundaries (a list is ~16 KB at M = 64: the hardware
 * prefetcher does not cross into the next one, and random 16 KB chunks read at about a
 * third of the sequential bandwidth). */
typedef struct tsr__pfcur {
    const search_cache *ca;
    const int64_t *lists;
    size_t np, p;          /* next probe to enter */
    const uint8_t *at;     /* next line to prefetch ... */
    size_t left;           /* ... and bytes left of the current list */
    size_t bsz;
} pfcur;

static void pf_run(pfcur *c, size_t bytes)
{
    while (bytes > 0) {
        if (c->left == 0) {
            if (c->p >= c->np)
                return;
            int64_t l = c->lists[c->p++];
            if (l < 0 || (size_t)l >= c->ca->nlist)
                continue;
            c->at = c->ca->tcodes + c->ca->toffsets[l];
            c->left = (c->ca->sizes[l] + TSR__FBLOCK - 1) / TSR__FBLOCK * c->bsz;
            continue;
        }
        size_t take = bytes < c->left ? bytes : c->left;
        for (size_t o = 0; o < take; o += 64)
            __builtin_prefetch(c->at + o);
        c->at += take;
        c->left -= take;
        bytes -= take;
    }
}

/* The scan of one list: block distances by the kernel, then only the codes that could
 * enter (score <= thr) go to the sink, which returns the new threshold. The one scan
 * loop of search and of the public scanner (ivfpq_scanner.c). */
float tsr__scan_list(const tsr_pq *pq, tsr__scan8_fn scan8, const float *T, float *dis,
                     const uint8_t *codes, size_t n, const float *term, float base,
                     const tsr__filt *f, float thr, tsr__sink_fn sink, void *ctx)
{
    if (f != NULL) {
        /* Block by block of TSR__FBLOCK codes: the bound for all, the exact distance only
         * for the codes whose bound is within the margin of the heap top (a fraction of
         * a percent on the bench data from the second list on). A code the filter drops
         * has a distance > thr, so it could not have entered, and thr only decreases:
         * the sink sees the same candidates in the same order as without the filter. */
        const size_t bsz = f->bsz;
        for (size_t b = 0; b < n; b += TSR__FBLOCK) {
            size_t nb = n - b < TSR__FBLOCK ? n - b : TSR__FBLOCK;
            const uint8_t *blk = f->blocks + b / TSR__FBLOCK * bsz;
            const float *tb = term ? (const float *)(const void *)(blk + pq->M * TSR__FBLOCK)
                                   : NULL;
            if (f->pf != NULL)
                pf_run(f->pf, bsz);
            uint64_t mask = thr < INFINITY
                                ? f->fn(f->Tq, pq->M, blk, nb, tb, base, f->qmin, f->delta,
                                        thr + f->margin, NULL)
                                : (nb == 64 ? ~(uint64_t)0 : ((uint64_t)1 << nb) - 1);
            while (mask) {
                size_t i = (size_t)__builtin_ctzll(mask);
                mask &= mask - 1;
                float d = (base + (tb ? tb[i] : 0.0f)) +
                          tsr__filter8_exact(T, pq->M, blk, i);
                if (d <= thr)
                    thr = sink(ctx, b + i, d);
            }
        }
        return thr;
    }
    for (size_t b = 0; b < n; b += TSR__SCAN_BLOCK) {
        size_t nb = n - b < TSR__SCAN_BLOCK ? n - b : TSR__SCAN_BLOCK;
        const uint8_t *cb = codes + b * pq->code_size;
        const float *tb = term ? term + b : NULL;
        if (pq->nbits == 8)
            scan8(T, pq->M, cb, nb, tb, base, dis);
        else
            tsr__scan_generic(T, pq, cb, nb, tb, base, dis);
        for (size_t i = 0; i < nb; i++)
            if (dis[i] <= thr)
                thr = sink(ctx, b + i, dis[i]);
    }
    return thr;
}

/* Decodes a PQ code into d floats. */
static void pq_decode(const tsr_pq *pq, const uint8_t *code, float *out)
{
    for (size_t m = 0; m < pq->M; m++) {
        uint32_t j = tsr_pq_code_get(code, m, pq->nbits);
        memcpy(out + m * pq->dsub, pq->centroids + (m * pq->ksub + j) * pq->dsub,
               pq->dsub * sizeof(float));
    }
}

static int refine_query(worker *w, const float *xq, float *Dq, int64_t *Iq)
{
    job *jb = w->jb;
    const tsr_ivfpq *ix = jb->ix;
    size_t d = (size_t)ix->d;
    heap *hr = &w->hr;
    tsr_heap_init(hr);
    for (size_t j = 0; j < jb->k1; j++) {
        int64_t pair = w->h.id[j];
        if (pair < 0)
            continue;
        size_t list = (size_t)(pair >> 32), ofs = (size_t)(pair & 0xffffffff);
        const tsr_invlist *L = &ix->lists[list];
        int64_t id = L->ids[ofs];
        size_t rcs = ix->refine_pq.code_size;
        if (id < 0 || (uint64_t)id >= ix->refine_codes_n / (rcs ? rcs : 1))
            return tsr_err(&w->err, TSR_EFORMAT,
                           "search: IwQR label %lld has no refine code (%zu refine codes)",
                           (long long)id, ix->refine_codes_n / (rcs ? rcs : 1));
        const float *cent = ix->centroids + list * d;
        pq_decode(&ix->pq, L->codes + ofs * ix->code_size, w->r2);
        for (size_t t = 0; t < d; t++)
            w->r2[t] = (xq[t] - cent[t]) - w->r2[t];
        pq_decode(&ix->refine_pq, ix->refine_codes + (size_t)id * rcs, w->r1);
        float dis = l2sqr(w->r1, w->r2, d);
        if (dis < hr->d[0])
            tsr_heap_replace_top(hr, dis, id, 0);
    }
    tsr_heap_sort(hr);
    memcpy(Dq, hr->d, jb->k * sizeof(float));
    memcpy(Iq, hr->id, jb->k * sizeof(int64_t));
    return 0;
}

/* Faiss's heap semantics: a candidate enters only when strictly better than the top. */
typedef struct search_sink {
    heap *h;
    const int64_t *ids;
    int64_t key;
    tsr_accept_fn accept;
    void *actx;
    int store_pairs;
} search_sink;

static float search_sink_fn(void *ctx, size_t i, float dd)
{
    search_sink *k = ctx;
    heap *h = k->h;
    if (!(dd < h->d[0]))
        return h->d[0];
    int64_t id = k->ids[i];
    if (k->accept && !k->accept(k->actx, id))
        return h->d[0];
    if (k->store_pairs) /* Faiss orders the first stage of IVFPQR by pair */
        tsr_heap_replace_top(h, dd, (int64_t)((uint64_t)k->key << 32 | i), id);
    else
        tsr_heap_replace_top(h, dd, id, 0);
    return h->d[0];
}

/* The per-list data a probe reads first (the list's size, its codes and ids pointers,
 * its offsets in the cache): random in memory, so one cache miss each per probed list
 * (a fifth of the search at nprobe 64 before this prefetch, a few probes ahead). */
#define META_AHEAD 8

static inline void meta_prefetch(const tsr_ivfpq *ix, const search_cache *ca, int64_t l)
{
    if (l < 0 || (size_t)l >= ix->nlist)
        return;
    __builtin_prefetch(&ix->lists[l]);
    __builtin_prefetch(&ca->sizes[l]);
    __builtin_prefetch(&ca->offsets[l]);
    if (ca->toffsets != NULL)
        __builtin_prefetch(&ca->toffsets[l]);
}

static int search_one(worker *w, size_t qi)
{
    job *jb = w->jb;
    const tsr_ivfpq *ix = jb->ix;
    const tsr_pq *pq = &ix->pq;
    const tsr_ivfpq_search_opts *o = jb->opts;
    const float *xq = jb->x + qi * (size_t)ix->d;
    float *Dq = jb->D + qi * jb->k;
    int64_t *Iq = jb->I + qi * jb->k;
    tsr_accept_fn accept = o ? o->accept : NULL;
    void *actx = o ? (o->accept_ctxs ? o->accept_ctxs[qi] : o->accept_ctx) : NULL;
    size_t max_codes = o ? o->max_codes : 0;
    heap *h = &w->h;
    const int ip = ix->metric == TSR_METRIC_IP;
    const int store_pairs = jb->refine;

    h->order = ip ? TSR_HEAP_TIE_SMALL_ID_WORSE : 0;
    tsr_heap_init(h);
    if (o && o->bounds && !isnan(o->bounds[qi])) {
        /* k sentinels one step beyond the bound (the heap holds -product for IP): a
         * result at the bound itself is strictly better, so it enters */
        float b = nextafterf(ip ? -o->bounds[qi] : o->bounds[qi], INFINITY);
        for (size_t i = 0; i < h->k; i++)
            h->d[i] = b;
    }
    if (h->k > 0) {
        /* The prefilter pays from a few lists on (quantizing the table costs ~2 us). Its
         * blocks hold centroid ranks when the cache has them: the tables in rank order. */
        int use_filter = jb->filter != NULL && jb->nprobe >= FILTER_MIN_NPROBE;
        int ranked = use_filter && jb->cache->rk != NULL;
        tsr__build_table(ix, ranked ? jb->cache->ct_r : jb->cache->ct, xq, w->T,
                         jb->wide_table);
        tsr__filt fl, *flp = NULL;
        pfcur pf;
        const int64_t *qlists = jb->lists + qi * jb->nprobe;
        for (size_t p = 0; p < jb->nprobe && p < META_AHEAD; p++)
            meta_prefetch(ix, jb->cache, qlists[p]);
        float tabs = 0;
        tsr__filter8_fn fn = jb->filter4 ? jb->filter4 : jb->filter;
        int quantized = use_filter && ranked && jb->sorted &&
                        tsr__group_table_sorted(fn, w->T, pq->M, w->Tg, &fl.qmin, &fl.delta,
                                                &tabs);
        if (use_filter && !quantized &&
            tsr__quantize_for(fn, jb->wide_table, w->T, pq->M, w->Tq, &fl.qmin, &fl.delta,
                              &tabs)) {
            quantized = 1;
            if (jb->filter4 != NULL)
                tsr__group_table(jb->filter4, w->Tq, pq->M, w->Tg);
        }
        if (quantized) {
            fl.fn = fn;
            fl.Tq = jb->filter4 != NULL ? w->Tg : w->Tq;
            fl.bsz = fblock_bytes(jb->cache, pq->M);
            pf.ca = jb->cache;
            pf.lists = jb->lists + qi * jb->nprobe;
            pf.np = jb->nprobe;
            pf.p = 0;
            pf.at = NULL;
            pf.left = 0;
            pf.bsz = fl.bsz;
            pf_run(&pf, FILTER_PF_LEAD);
            fl.pf = &pf;
            flp = &fl;
        } else if (ranked) { /* no filter after all: the plain scan reads Faiss-order codes */
            tsr__build_table(ix, jb->cache->ct, xq, w->T, jb->wide_table);
            ranked = 0;
        }
        size_t nscan = 0;
        for (size_t p = 0; p < jb->nprobe; p++) {
            int64_t key = jb->lists[qi * jb->nprobe + p];
            if (p + META_AHEAD < jb->nprobe)
                meta_prefetch(ix, jb->cache, qlists[p + META_AHEAD]);
            if (key < 0)
                continue;
            const tsr_invlist *L = &ix->lists[key];
            if (jb->cache->sizes[key] != L->size)
                return tsr_err(&w->err, TSR_ESTATE,
                               "search: list %lld changed size since the search cache was "
                               "built (%zu -> %zu); call tsr_ivfpq_search_invalidate",
                               (long long)key, jb->cache->sizes[key], L->size);
            float base = 0.0f;
            if (ix->by_residual) {
                if (ip) /* Faiss recomputes <x, c> here rather than using coarse_dis */
                    base = -dot(xq, ix->centroids + (size_t)key * (size_t)ix->d,
                                (size_t)ix->d);
                else
                    base = jb->coarse_dis[qi * jb->nprobe + p];
            }
            const float *term =
                jb->cache->term ? jb->cache->term + jb->cache->offsets[key] : NULL;
            const uint8_t *lcodes = L->codes;
            const search_cache *ca = jb->cache;
            if (flp == NULL && p + 1 < jb->nprobe) { /* the next list's first codes */
                int64_t nk = jb->lists[qi * jb->nprobe + p + 1];
                if (nk >= 0 && (size_t)nk < ix->nlist && ix->lists[nk].size > 0)
                    for (size_t c = 0; c < TSR__SCAN_PREFETCH; c++)
                        __builtin_prefetch(ix->lists[nk].codes + c * 64);
            }
            search_sink sk = {h, L->ids, key, accept, actx, store_pairs};
            const tsr__filt *f = NULL;
            if (flp != NULL) {
                /* Every rounding error between the bound and the exact sum (the table
                 * offsets summed, delta * Q, the kernel's 64 additions, base + term) is
                 * below ~200 float epsilons (2^-24) times A, the sum of the magnitudes
                 * involved; 2^-12 A leaves a factor ~20. */
                float A = fabsf(base) + ca->tmax + 2.0f * tabs;
                fl.margin = A * (1.0f / 4096.0f);
                fl.blocks = ca->tcodes + ca->toffsets[key];
                /* (a margin that is not finite drops nothing; ranked tables need the
                 * blocks) */
                if (fl.margin < INFINITY || ranked)
                    f = flp;
            }
            tsr__scan_list(pq, jb->scan8, w->T, w->dis, lcodes, L->size, term, base, f,
                           h->d[0], search_sink_fn, &sk);
            nscan += L->size;
            if (max_codes && nscan >= max_codes)
                break;
        }
    }
    tsr_heap_sort(h);
    if (jb->refine)
        return refine_query(w, xq, Dq, Iq);
    for (size_t r = 0; r < jb->k; r++) {
        Iq[r] = h->id[r];
        Dq[r] = h->id[r] < 0 ? (ip ? -INFINITY : INFINITY) /* empty, or a bound's sentinel */
                             : ip ? -h->d[r] : h->d[r];
    }
    return 0;
}

#define QBLOCK 4 /* queries taken per counter increment */

static void *worker_run(void *arg)
{
    worker *w = arg;
    job *jb = w->jb;
    for (;;) {
        size_t q0 = atomic_fetch_add(&jb->next, QBLOCK);
        if (q0 >= jb->n)
            break;
        size_t q1 = q0 + QBLOCK < jb->n ? q0 + QBLOCK : jb->n;
        for (size_t q = q0; q < q1; q++) {
            w->rc = search_one(w, q);
            if (w->rc != 0) {
                atomic_store(&jb->next, jb->n); /* stop the others early */
                return NULL;
            }
        }
    }
    return NULL;
}

int tsr__ivfpq_check_index(const tsr_ivfpq *ix, size_t k, tsr_error *err)
{
    const tsr_pq *pq = &ix->pq;
    if (ix->d <= 0 || pq->d != (size_t)ix->d || pq->M == 0 || pq->centroids == NULL ||
        ix->centroids == NULL || ix->lists == NULL || ix->code_size != pq->code_size)
        return tsr_err(err, TSR_EINVAL, "search: index is not a trained IVFPQ (d=%d, pq d=%zu,"
                       " code_size=%zu, pq code_size=%zu)", ix->d, pq->d, ix->code_size,
                       pq->code_size);
    if (ix->metric != TSR_METRIC_L2 && ix->metric != TSR_METRIC_IP)
        return tsr_err(err, TSR_EUNSUPPORTED, "search: metric %d", (int)ix->metric);
    if (ix->is_refine && (ix->refine_pq.d != (size_t)ix->d || ix->refine_pq.centroids == NULL))
        return tsr_err(err, TSR_EINVAL, "search: IwQR refine PQ has d=%zu, index d=%d",
                       ix->refine_pq.d, ix->d);
    if (k > ((size_t)1 << 30))
        return tsr_err(err, TSR_EINVAL, "search: k=%zu is too large", k);
    return 0;
}

/* The path the caller or TSR_SIMD forced: TSR_SIMD_AUTO when none (or an unknown name). */
static enum tsr_simd simd_forced(enum tsr_simd asked)
{
    if (asked == TSR_SIMD_AUTO) {
        const char *e = tsr_test_knob(TSR_KNOB_SIMD);
        if (e && strcmp(e, "scalar") == 0)
            return TSR_SIMD_SCALAR;
        if (e && strcmp(e, "avx2") == 0)
            return TSR_SIMD_AVX2;
        if (e && strcmp(e, "avx512") == 0)
            return TSR_SIMD_AVX512;
    }
    return asked;
}

/* 1 when the caller or TSR_SIMD asked for the scalar or the AVX2 path. */
static int plain_forced(enum tsr_simd asked)
{
    enum tsr_simd f = simd_forced(asked);
    return f == TSR_SIMD_SCALAR || f == TSR_SIMD_AVX2;
}

/* The AVX-512 table unless the caller or TSR_SIMD forced the scalar or AVX2 path (which
 * the tests compare with it: that is what keeps the generic table tested). */
int tsr__wide_table_ok(enum tsr_simd asked)
{
    return !plain_forced(asked) && tsr_ivfpq_search_simd_supported(TSR_SIMD_AVX512);
}

/* The prefilter kernel, NULL = none. TSR_SEARCH_FILTER=scalar forces the scalar one and
 * =0 none; otherwise a forced scalar path stays the plain scalar scan, a forced AVX2 path
 * (or a CPU without VBMI) takes the AVX2 kernel, and the automatic choice or forced
 * AVX-512 the VBMI kernel where the CPU has it. */
tsr__filter8_fn tsr__filter8_choose(enum tsr_simd asked)
{
    int fe = filter_env();
    enum tsr_simd f = simd_forced(asked);
    if (fe == 1)
        return tsr__filter8_scalar;
    if (fe == 0 || f == TSR_SIMD_SCALAR)
        return NULL;
    if (fe == 2 && f != TSR_SIMD_AVX2)
        return tsr__filter8_avx512;
    return tsr__filter8_avx2; /* fe is 2 or 3: the CPU has AVX2 */
}

tsr__filter8_fn tsr__filter4_choose(tsr__filter8_fn f8)
{
    const char *e = tsr_test_knob(TSR_KNOB_SEARCH_NIBBLE);
    if (f8 == NULL || (e && strcmp(e, "0") == 0))
        return NULL;
    if (e && strcmp(e, "scalar") == 0)
        return tsr__filter4_scalar;
    if (e && strcmp(e, "scalar6") == 0)
        return tsr__filter6_scalar;
    return f8 == tsr__filter8_avx2     ? tsr__filter4_avx2
           : f8 == tsr__filter8_avx512 ? tsr__filter6_avx512
                                       : NULL;
}

/* tsr__quantize_table, then the kernel's own layout of the table (the AVX2 kernel reads
 * slice differences, see ivfpq_search_avx2.c). Returns what tsr__quantize_table returns. */
int tsr__quantize_for(tsr__filter8_fn fn, int wide, const float *T, size_t M, uint8_t *Tq,
                      float *qmin, float *delta, float *tabs)
{
    if (!(wide ? tsr__quantize_table_avx512(T, M, Tq, qmin, delta, tabs)
               : tsr__quantize_table(T, M, Tq, qmin, delta, tabs)))
        return 0;
    if (fn == tsr__filter8_avx2)
        tsr__filter8_prep_avx2(Tq, M);
    return 1;
}

int tsr_ivfpq_search_preassigned(const tsr_ivfpq *ix, size_t n, const float *x, size_t k,
                                 size_t nprobe, const int64_t *lists,
                                 const float *coarse_dis, const tsr_ivfpq_search_opts *opts,
                                 float *D, int64_t *I, tsr_error *err)
{
    int rc = tsr__ivfpq_check_index(ix, k, err);
    if (rc != 0)
        return rc;
    if (n == 0 || k == 0)
        return 0;
    for (size_t i = 0; i < n * nprobe; i++)
        if (lists[i] >= (int64_t)ix->nlist)
            return tsr_err(err, TSR_EINVAL,
                           "search_preassigned: query %zu probe %zu: list %lld >= nlist %zu",
                           i / nprobe, i % nprobe, (long long)lists[i], ix->nlist);
    const search_cache *cache = tsr__search_cache_get(ix, err);
    if (cache == NULL)
        return err ? err->code : TSR_ENOMEM;

    job jb;
    memset(&jb, 0, sizeof jb);
    jb.ix = ix;
    jb.cache = cache;
    jb.n = n;
    jb.k = k;
    jb.nprobe = nprobe;
    jb.x = x;
    jb.lists = lists;
    jb.coarse_dis = coarse_dis;
    jb.opts = opts;
    enum tsr_simd simd = opts ? opts->simd : TSR_SIMD_AUTO;
    if (simd == TSR_SIMD_AUTO || !tsr_ivfpq_search_simd_supported(simd))
        simd = tsr_ivfpq_search_simd_auto();
    jb.scan8 = tsr__scan8_for(simd);
    jb.wide_table = tsr__wide_table_ok(opts ? opts->simd : TSR_SIMD_AUTO);
    if (cache->tcodes != NULL)
        jb.filter = tsr__filter8_choose(opts ? opts->simd : TSR_SIMD_AUTO);
    if (cache->rk != NULL)
        jb.filter4 = tsr__filter4_choose(jb.filter);
    jb.sorted = jb.filter4 != NULL && tsr__rows_sorted(ix);
    jb.refine = ix->is_refine && !(opts && opts->no_refine);
    if (jb.refine && opts && opts->bounds)
        return tsr_err(err, TSR_EINVAL, "search: bounds limit the PQ scan: not with an IwQR "
                                        "refine (set no_refine)");
    jb.k1 = k;
    if (jb.refine) {
        float kf = opts && opts->k_factor > 0 ? opts->k_factor : ix->k_factor;
        double k1 = (double)k * (double)kf; /* Faiss: long(k * k_factor) */
        if (!(k1 >= 1.0))
            k1 = 1.0;
        if (k1 > (double)((size_t)1 << 30))
            return tsr_err(err, TSR_EINVAL, "search: k * k_factor = %g is too large", k1);
        jb.k1 = (size_t)k1;
    }
    jb.D = D;
    jb.I = I;
    atomic_init(&jb.next, 0);

    size_t nt = opts && opts->threads > 1 ? (size_t)opts->threads : 1;
    size_t maxt = (n + QBLOCK - 1) / QBLOCK;
    if (nt > maxt)
        nt = maxt;
    if (nt > 256)
        nt = 256;
    worker *ws = calloc(nt, sizeof *ws);
    if (ws == NULL)
        return tsr_err(err, TSR_ENOMEM, "search: out of memory");
    size_t started = 0;
    rc = 0;
    for (size_t t = 0; t < nt; t++) {
        if (worker_init(&ws[t], &jb) != 0) {
            rc = tsr_err(err, TSR_ENOMEM, "%s", ws[t].err.msg);
            break;
        }
    }
    if (rc == 0) {
        for (started = 1; started < nt; started++)
            if (pthread_create(&ws[started].thread, NULL, worker_run, &ws[started]) != 0)
                break; /* fewer threads: the remaining work is still taken by those running */
        worker_run(&ws[0]);
        for (size_t t = 1; t < started; t++)
            pthread_join(ws[t].thread, NULL);
        for (size_t t = 0; t < started; t++) {
            if (ws[t].rc != 0) {
                rc = ws[t].rc;
                if (err) {
                    err->code = ws[t].err.code;
                    memcpy(err->msg, ws[t].err.msg, sizeof err->msg);
                }
                break;
            }
        }
    }
    for (size_t t = 0; t < nt; t++)
        worker_close(&ws[t]);
    free(ws);
    return rc;
}

/* Queries per coarse block: bounds the n * nprobe temporaries of a large batch. */
#define COARSE_BLOCK 4096

int tsr_ivfpq_search(const tsr_ivfpq *ix, size_t n, const float *x, size_t k,
                     const tsr_ivfpq_search_opts *opts, float *D, int64_t *I,
                     tsr_error *err)
{
    int rc = tsr__ivfpq_check_index(ix, k, err);
    if (rc != 0)
        return rc;
    if (n == 0 || k == 0)
        return 0;
    size_t nprobe = opts && opts->nprobe ? opts->nprobe : ix->nprobe;
    if (nprobe == 0)
        nprobe = 1;
    if (nprobe > ix->nlist)
        nprobe = ix->nlist;
    const search_cache *cache = tsr__search_cache_get(ix, err);
    if (cache == NULL)
        return err ? err->code : TSR_ENOMEM;
    size_t nb = n < COARSE_BLOCK ? n : COARSE_BLOCK;
    float *cd = tsr_try_malloc(nb * nprobe, sizeof(float));
    int64_t *cl = tsr_try_malloc(nb * nprobe, sizeof(int64_t));
    if (cd == NULL || cl == NULL) {
        rc = tsr_err(err, TSR_ENOMEM, "search: out of memory for %zu x %zu coarse results", nb,
                     nprobe);
        goto done;
    }
    for (size_t q0 = 0; q0 < n; q0 += nb) {
        size_t m = n - q0 < nb ? n - q0 : nb;
        const float *xb = x + q0 * (size_t)ix->d;
        rc = tsr_knn(xb, m, ix->centroids, ix->nlist, (size_t)ix->d, ix->metric, nprobe,
                     cache->cnorms, cd, cl, err);
        if (rc != 0)
            goto done;
        rc = tsr_ivfpq_search_preassigned(ix, m, xb, k, nprobe, cl, cd, opts, D + q0 * k,
                                          I + q0 * k, err);
        if (rc != 0)
            goto done;
    }
done:
    free(cd);
    free(cl);
    return rc;
}
