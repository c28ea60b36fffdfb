/*
 * cmd_index_search — `tessera index search`: load a Faiss IwPQ / IwQR file, search a
 * batch of fvecs queries with ivfpq_search, write one row of k labels per query (ivecs)
 * and optionally the distances (fvecs). Labels must fit int32 (the ivecs element type);
 * a larger label is an error rather than a silently truncated result.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/cmdline.h"
#include "index/faiss_io.h"
#include "index/ivfpq_search.h"
#include "index/knn.h"
#include "core/mem.h"
#include "index/vecs_io.h"

#define PROG "tessera index search"

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera index search --index F --queries Q.fvecs --k K --nprobe P\n"
           "                            [--threads T] --out I.ivecs [--distances D.fvecs]\n\n"
           "Searches a Faiss IndexIVFPQ (IwPQ) or IndexIVFPQR (IwQR) file with the queries of\n"
           "Q.fvecs as Faiss's IndexIVFPQ::search does (IwQR: re-ranked with the refine codes),\n"
           "and writes one row of K labels per query to I.ivecs (int32; -1 = missing) and, with\n"
           "--distances, one row of K distances (squared L2, or inner product for IP indexes;\n"
           "+inf / -inf for missing).\n\n"
           "  --index F         index file\n"
           "  --queries Q       queries, .fvecs, dimension = the index's d\n"
           "  --k K             results per query (1..2^31)\n"
           "  --nprobe P        lists to probe (1..2^31; clamped to nlist)\n"
           "  --threads T       search threads, 1..256 (default 1; also the BLAS threads of\n"
           "                    the coarse step)\n"
           "  --out I           labels output (.ivecs)\n"
           "  --distances D     distances output (.fvecs)\n"
           "  --k-factor F      IwQR: candidates per result, 1..1e6 (default: the file's\n"
           "                    k_factor)\n"
           "  --no-refine       IwQR: return the PQ scan results without refinement\n"
           "  --lists L.ivecs   search_preassigned: probe these lists (one row per query, -1 =\n"
           "                    none; the row width replaces --nprobe, which may be omitted)\n"
           "  --coarse-dis C    with --lists: the coarse distances (.fvecs, same shape)\n"
           "  --simd S          scan kernel: auto|scalar|avx2|avx512 (default auto)\n"
           "  --stats           print one JSON line of timings to stderr\n"
           "  --warmup N        before the timed search, search the first N (>= 1) queries once\n"
           "                    at nprobe 1, untimed, results dropped (what a benchmark does to a\n"
           "                    library it calls in-process, e.g. bench/bench_search.py to Faiss)\n\n"
           "Exit 0 on success, 1 on bad input (unreadable or invalid file, dimension\n"
           "mismatch, label beyond int32), 2 on usage errors.\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --warmup: the first n queries once at nprobe 1, results dropped (pages in what the
 * timed search touches first, as a benchmark's warm-up call of an in-process library). */
static int warmup_pass(tsr_ivfpq *ix, const float *x, size_t n, size_t k,
                       const tsr_ivfpq_search_opts *o, tsr_error *err)
{
    tsr_ivfpq_search_opts w = *o;
    w.nprobe = 1;
    float *D = tsr_try_malloc(n * k, sizeof(float));
    int64_t *I = tsr_try_malloc(n * k, sizeof(int64_t));
    int rc = D && I ? tsr_ivfpq_search(ix, n, x, k, &w, D, I, err)
                    : tsr_err(err, TSR_ENOMEM, "out of memory for the warm-up");
    free(D);
    free(I);
    return rc;
}

int tsr_cmd_index_search(int argc, char **argv)
{
    const char *index = NULL, *queries = NULL, *out = NULL, *dist = NULL, *simd = NULL;
    const char *lists_path = NULL, *coarse_path = NULL;
    uint64_t k = 0, nprobe = 0, warmup = 0;
    int threads = 1, no_refine = 0, stats = 0;
    double k_factor = 0;
    const long long most = 1ll << 31;
    const tsr_cmdline_opt opts[] = {
        {"--index", TSR_CMDLINE_STR, &index, 0, 0, 1},
        {"--queries", TSR_CMDLINE_STR, &queries, 0, 0, 1},
        {"--k", TSR_CMDLINE_UINT64, &k, 1, most, 1},
        {"--nprobe", TSR_CMDLINE_UINT64, &nprobe, 1, most, 0},
        {"--threads", TSR_CMDLINE_INT, &threads, 1, 256, 0},
        {"--out", TSR_CMDLINE_STR, &out, 0, 0, 1},
        {"--distances", TSR_CMDLINE_STR, &dist, 0, 0, 0},
        {"--k-factor", TSR_CMDLINE_DOUBLE, &k_factor, 1, 1000000, 0},
        {"--no-refine", TSR_CMDLINE_FLAG, &no_refine, 0, 0, 0},
        {"--lists", TSR_CMDLINE_STR, &lists_path, 0, 0, 0},
        {"--coarse-dis", TSR_CMDLINE_STR, &coarse_path, 0, 0, 0},
        {"--simd", TSR_CMDLINE_STR, &simd, 0, 0, 0},
        {"--stats", TSR_CMDLINE_FLAG, &stats, 0, 0, 0},
        {"--warmup", TSR_CMDLINE_UINT64, &warmup, 1, most, 0},
    };
    const tsr_cmdline_spec spec = {PROG, opts, sizeof opts / sizeof opts[0], usage, 0, 1};
    int code;
    if (tsr_cmdline_parse_spec(&spec, argc, argv, NULL, &code))
        return code;
    const char *missing = !nprobe && !lists_path ? "--nprobe (or --lists)"
                        : coarse_path && !lists_path ? "--lists (with --coarse-dis)" : NULL;
    if (missing) {
        fprintf(stderr, PROG ": %s is required (see '" PROG " --help')\n", missing);
        return 2;
    }
    tsr_ivfpq_search_opts o;
    tsr_ivfpq_search_opts_init(&o);
    if (simd != NULL) {
        if (strcmp(simd, "auto") == 0) o.simd = TSR_SIMD_AUTO;
        else if (strcmp(simd, "scalar") == 0) o.simd = TSR_SIMD_SCALAR;
        else if (strcmp(simd, "avx2") == 0) o.simd = TSR_SIMD_AVX2;
        else if (strcmp(simd, "avx512") == 0) o.simd = TSR_SIMD_AVX512;
        else {
            fprintf(stderr, PROG ": --simd: expected auto, scalar, avx2 or avx512, got '%s'\n",
                    simd);
            return 2;
        }
        if (!tsr_ivfpq_search_simd_supported(o.simd)) {
            fprintf(stderr, PROG ": this CPU cannot run --simd %s\n", simd);
            return 1;
        }
    }
    o.nprobe = nprobe;
    o.threads = threads;
    o.k_factor = (float)k_factor;
    o.no_refine = no_refine;
    tsr_blas_set_threads(threads);

    int rc = 1;
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = NULL;
    float *x = NULL, *D = NULL;
    int64_t *I = NULL;
    int32_t *I32 = NULL, *L32 = NULL;
    int64_t *L = NULL;
    float *C = NULL;
    size_t nq = 0, dq = 0, nl = 0, wl = 0, nc = 0, wc = 0;
    double t0 = now_s();
    if (tsr_faiss_read_file(index, &ix, &err) != 0)
        goto fail;
    if (tsr_fvecs_read(queries, &x, &nq, &dq, &err) != 0)
        goto fail;
    if (nq > 0 && dq != (size_t)ix->d) {
        tsr_err(&err, TSR_EINVAL, "%s: queries have dimension %zu, the index %s has d=%d",
                queries, dq, index, ix->d);
        goto fail;
    }
    if (tsr_ivfpq_search_prepare(ix, &err) != 0)
        goto fail;
    if (warmup > 0 && nq > 0 && warmup_pass(ix, x, warmup < nq ? warmup : nq, k, &o, &err))
        goto fail;
    double t1 = now_s();
    D = tsr_try_malloc(nq ? nq * k : 1, sizeof(float));
    I = tsr_try_malloc(nq ? nq * k : 1, sizeof(int64_t));
    I32 = tsr_try_malloc(nq ? nq * k : 1, sizeof(int32_t));
    if (D == NULL || I == NULL || I32 == NULL) {
        tsr_err(&err, TSR_ENOMEM, "out of memory for %zu x %zu results", nq, k);
        goto fail;
    }
    if (lists_path != NULL) {
        if (tsr_ivecs_read(lists_path, &L32, &nl, &wl, &err) != 0)
            goto fail;
        if (nl != nq) {
            tsr_err(&err, TSR_EINVAL, "%s: %zu rows, expected one per query (%zu)", lists_path,
                    nl, nq);
            goto fail;
        }
        if (coarse_path != NULL) {
            if (tsr_fvecs_read(coarse_path, &C, &nc, &wc, &err) != 0)
                goto fail;
            if (nc != nl || (nc > 0 && wc != wl)) {
                tsr_err(&err, TSR_EINVAL, "%s: %zu x %zu, expected the shape of %s (%zu x %zu)",
                        coarse_path, nc, wc, lists_path, nl, wl);
                goto fail;
            }
        } else {
            C = tsr_try_calloc((nl && wl) ? nl * wl : 1, sizeof(float));
        }
        L = tsr_try_malloc((nl && wl) ? nl * wl : 1, sizeof(int64_t));
        if (L == NULL || C == NULL) {
            tsr_err(&err, TSR_ENOMEM, "out of memory for %zu x %zu lists", nl, wl);
            goto fail;
        }
        for (size_t i = 0; i < nl * wl; i++)
            L[i] = L32[i];
        t1 = now_s();
        if (tsr_ivfpq_search_preassigned(ix, nq, x, k, wl, L, C, &o, D, I, &err) != 0)
            goto fail;
    } else if (tsr_ivfpq_search(ix, nq, x, k, &o, D, I, &err) != 0) {
        goto fail;
    }
    double t2 = now_s();
    for (size_t i = 0; i < nq * k; i++) {
        if (I[i] < -1 || I[i] > INT32_MAX) {
            tsr_err(&err, TSR_EINVAL,
                    "query %zu: label %lld does not fit the int32 of an ivecs file", i / k,
                    (long long)I[i]);
            goto fail;
        }
        I32[i] = (int32_t)I[i];
    }
    if (tsr_ivecs_write(out, I32, nq, k, &err) != 0)
        goto fail;
    if (dist != NULL && tsr_fvecs_write(dist, D, nq, k, &err) != 0)
        goto fail;
    if (stats) {
        double s = t2 - t1;
        fprintf(stderr,
                "{\"queries\": %zu, \"load_s\": %.6f, \"search_s\": %.6f, \"qps\": %.1f, "
                "\"simd\": \"%s\"}\n",
                nq, t1 - t0, s, s > 0 ? (double)nq / s : 0.0,
                tsr_ivfpq_search_simd_name(o.simd != TSR_SIMD_AUTO ? o.simd
                                                                  : tsr_ivfpq_search_simd_auto()));
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, PROG ": %s\n", err.msg);
done:
    tsr_ivfpq_destroy(ix);
    free(x);
    free(D);
    free(I);
    free(I32);
    free(L32);
    free(L);
    free(C);
    return rc;
}
