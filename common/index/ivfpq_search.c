/*
 * ivfpq_search — Faiss's IndexIVFPQ::search / search_preassigned over an in-memory index
 * (see ivfpq_search.h for the semantics): the coarse assignment (tsr_knn), then per query
 * a loop over the probed lists with the one scanner (ivfpq_scanner.c, the shard's too)
 * into a top-k heap with Faiss's tie order and the caller's accept filter, the IwQR
 * refinement, and multithreaded batches.
 *
 * Every metric / residual variant is reduced to one scan: "smaller is better" distance
 *     dis = base(list) + term(vector) + sum_m T[m][code_m]
 * with base = ||x - c||^2 (L2 residual), -<x, c> (IP residual) or 0, term = ||y||^2 +
 * 2<c, y> (L2 residual only, from the search cache, ivfpq_cache.c) and T the per-query
 * table (negated for IP; negation is exact in float, so IP results are the negated scan
 * values bit for bit). From nprobe 2 on (8-bit codes, AVX-512 VBMI or AVX2) the scanner
 * runs the quantized prefilter on the cache's transposed blocks of each list (with a
 * prefetch cursor across the probed lists): same results, ~3x less work at nprobe 64
 * (tsr__scan_list and tsr__quantize_table; docs/performance.md has figures).
 *
 * DESIGN (threads): a batch is split into query blocks that worker threads take from an
 * atomic counter; each worker owns its scanner and heaps and writes only its queries'
 * rows of D and I. The index and the cache are read-only during a search.
 */
#include "index/ivfpq_search.h"
#include "index/ivfpq_search_int.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "index/knn.h"
#include "index/pq_code.h"
#include "core/heap.h"
#include "core/mem.h"

void tsr_ivfpq_search_opts_init(tsr_ivfpq_search_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
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

typedef tsr__search_cache search_cache;

/* ---- top-k heap, as Faiss 1.7.3's: values "smaller is better" ------------------------
 * core/heap.h. A candidate enters only when strictly better than the top (so among exact
 * ties the first scanned stays, as in Faiss); for IP the heap holds the negated product
 * with TSR_HEAP_TIE_SMALL_ID_WORSE, so output ties come in ascending id order for L2 and
 * descending for IP, exactly as Faiss returns them. */
typedef tsr_heap heap;

/* ---- per-thread workspace and the scan of one query ----------------------------------- */

#define FILTER_MIN_NPROBE 2 /* the prefilter from this nprobe on */

typedef struct job {
    const tsr_ivfpq *ix;
    const search_cache *cache;
    size_t n, k, nprobe;
    const float *x;
    const int64_t *lists;
    const float *coarse_dis;
    const tsr_ivfpq_search_opts *opts;
    enum tsr_simd simd; /* the kernels asked for (opts->simd) */
    int refine;      /* IwQR refinement active */
    size_t k1;       /* candidates from the scan: k, or k_factor * k with refine */
    float *D;
    int64_t *I;
    atomic_size_t next; /* next query to take */
} job;

typedef struct worker {
    job *jb;
    tsr_ivfpq_scanner *sc;
    heap h;
    heap hr;         /* refine heap (k entries) */
    float *r1, *r2;  /* refine: d floats each */
    int rc;
    tsr_error err;
    pthread_t thread;
} worker;

static void worker_close(worker *w)
{
    tsr_ivfpq_scanner_destroy(w->sc);
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
    if ((w->sc = tsr_ivfpq_scanner_create(jb->ix, jb->simd, &w->err)) == NULL)
        return w->err.code;
    w->h.k = jb->k1;
    w->h.d = tsr_try_malloc(jb->k1 ? jb->k1 : 1, sizeof(float));
    w->h.id = tsr_try_malloc(jb->k1 ? jb->k1 : 1, sizeof(int64_t));
    int ok = w->h.d && w->h.id;
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
        tsr_pq_decode(&ix->pq, L->codes + ofs * ix->code_size, 1, w->r2);
        for (size_t t = 0; t < d; t++)
            w->r2[t] = (xq[t] - cent[t]) - w->r2[t];
        tsr_pq_decode(&ix->refine_pq, ix->refine_codes + (size_t)id * rcs, 1, w->r1);
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
        /* The prefilter pays from a few lists on (quantizing the table costs ~2 us). */
        tsr_ivfpq_scanner *sc = w->sc;
        const search_cache *ca = jb->cache;
        const int64_t *qlists = jb->lists + qi * jb->nprobe;
        const int use_filter = jb->nprobe >= FILTER_MIN_NPROBE;
        tsr__pfcur pf;
        tsr_ivfpq_scanner_set_query(sc, xq);
        if (use_filter)
            tsr__scanner_prefetch(sc, &pf, qlists, jb->nprobe);
        for (size_t p = 0; p < jb->nprobe && p < META_AHEAD; p++)
            meta_prefetch(ix, ca, qlists[p]);
        size_t nscan = 0;
        for (size_t p = 0; p < jb->nprobe; p++) {
            int64_t key = qlists[p];
            if (p + META_AHEAD < jb->nprobe)
                meta_prefetch(ix, ca, qlists[p + META_AHEAD]);
            if (key < 0)
                continue;
            const tsr_invlist *L = &ix->lists[key];
            if (ca->sizes[key] != L->size)
                return tsr_err(&w->err, TSR_ESTATE,
                               "search: list %lld changed size since the search cache was "
                               "built (%zu -> %zu); call tsr_ivfpq_search_invalidate",
                               (long long)key, ca->sizes[key], L->size);
            float base = 0.0f;
            if (ix->by_residual) {
                if (ip) /* Faiss recomputes <x, c> here rather than using coarse_dis */
                    base = -tsr__dot(xq, ix->centroids + (size_t)key * (size_t)ix->d,
                                     (size_t)ix->d);
                else
                    base = jb->coarse_dis[qi * jb->nprobe + p];
            }
            const float *term = ca->term ? ca->term + ca->offsets[key] : NULL;
            const tsr_ivfpq_flist *fl = use_filter ? tsr__scanner_view(sc, (size_t)key) : NULL;
            if (fl == NULL && p + 1 < jb->nprobe) { /* the next list's first codes */
                int64_t nk = qlists[p + 1];
                if (nk >= 0 && (size_t)nk < ix->nlist && ix->lists[nk].size > 0)
                    for (size_t c = 0; c < TSR__SCAN_PREFETCH; c++)
                        __builtin_prefetch(ix->lists[nk].codes + c * 64);
            }
            search_sink sk = {h, L->ids, key, accept, actx, store_pairs};
            tsr_ivfpq_scanner_scan_filtered(sc, L->codes, L->size, term, fl, base, h->d[0],
                                            search_sink_fn, &sk);
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
    jb.simd = opts ? opts->simd : TSR_SIMD_AUTO;
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
