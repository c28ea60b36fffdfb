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
#include "index/faiss_io.h"
#include "index/ivfpq_search.h"
#include "index/knn.h"
#include "core/mem.h"
#include "index/vecs_io.h"

static void help(void)
{
    printf("usage: tessera index search --index F --queries Q.fvecs --k K --nprobe P\n"
           "                            [--threads T] --out I.ivecs [--distances D.fvecs]\n\n"
           "Searches a Faiss IndexIVFPQ (IwPQ) or IndexIVFPQR (IwQR) file with the queries of\n"
           "Q.fvecs as Faiss's IndexIVFPQ::search does (IwQR: re-ranked with the refine codes),\n"
           "and writes one row of K labels per query to I.ivecs (int32; -1 = missing) and, with\n"
           "--distances, one row of K distances (squared L2, or inner product for IP indexes;\n"
           "+inf / -inf for missing).\n\n"
           "  --index F         index file\n"
           "  --queries Q       queries, .fvecs, dimension = the index's d\n"
           "  --k K             results per query (> 0)\n"
           "  --nprobe P        lists to probe (> 0; clamped to nlist)\n"
           "  --threads T       search threads (default 1; also the BLAS threads of the\n"
           "                    coarse step)\n"
           "  --out I           labels output (.ivecs)\n"
           "  --distances D     distances output (.fvecs)\n"
           "  --k-factor F      IwQR: candidates per result (default: the file's k_factor)\n"
           "  --no-refine       IwQR: return the PQ scan results without refinement\n"
           "  --lists L.ivecs   search_preassigned: probe these lists (one row per query, -1 =\n"
           "                    none; the row width replaces --nprobe, which may be omitted)\n"
           "  --coarse-dis C    with --lists: the coarse distances (.fvecs, same shape)\n"
           "  --simd S          scan kernel: auto|scalar|avx2|avx512 (default auto; env TSR_SIMD)\n"
           "  --stats           print one JSON line of timings to stderr\n"
           "  --warmup N        before the timed search, search the first N queries once at\n"
           "                    nprobe 1, untimed, results dropped (what a benchmark does to a\n"
           "                    library it calls in-process, e.g. bench/bench_search.py to Faiss)\n\n"
           "Exit 0 on success, 1 on bad input (unreadable or invalid file, dimension\n"
           "mismatch, label beyond int32), 2 on usage errors.\n");
}

static int parse_size(const char *opt, const char *v, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x == 0 || x > (1ull << 31)) {
        fprintf(stderr, "tessera: index search: %s expects a positive integer, got '%s'\n", opt,
                v);
        return -1;
    }
    *out = (size_t)x;
    return 0;
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
    if (tsr_cli_wants_help(argc, argv)) {
        help();
        return 0;
    }
    const char *index = NULL, *queries = NULL, *out = NULL, *dist = NULL, *simd = NULL;
    const char *lists_path = NULL, *coarse_path = NULL;
    size_t k = 0, nprobe = 0, threads = 1, warmup = 0;
    float k_factor = 0;
    int no_refine = 0, stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--no-refine") == 0) {
            no_refine = 1;
            continue;
        }
        if (strcmp(a, "--stats") == 0) {
            stats = 1;
            continue;
        }
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        char name[32];
        if (strncmp(a, "--", 2) == 0 && eq != NULL && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            a = name;
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[i + 1];
        }
        int known = 1;
        if (strcmp(a, "--index") == 0 || strcmp(a, "--queries") == 0 ||
            strcmp(a, "--out") == 0 || strcmp(a, "--distances") == 0 ||
            strcmp(a, "--k") == 0 || strcmp(a, "--nprobe") == 0 ||
            strcmp(a, "--threads") == 0 || strcmp(a, "--simd") == 0 ||
            strcmp(a, "--k-factor") == 0 || strcmp(a, "--lists") == 0 ||
            strcmp(a, "--coarse-dis") == 0 || strcmp(a, "--warmup") == 0) {
            if (v == NULL) {
                fprintf(stderr, "tessera: index search: %s needs a value (see --help)\n", a);
                return 2;
            }
            if (eq == NULL)
                i++;
        } else {
            known = 0;
        }
        if (!known) {
            fprintf(stderr, "tessera: index search: unknown argument '%s' (see --help)\n",
                    argv[i]);
            return 2;
        }
        if (strcmp(a, "--index") == 0) index = v;
        else if (strcmp(a, "--queries") == 0) queries = v;
        else if (strcmp(a, "--out") == 0) out = v;
        else if (strcmp(a, "--distances") == 0) dist = v;
        else if (strcmp(a, "--simd") == 0) simd = v;
        else if (strcmp(a, "--lists") == 0) lists_path = v;
        else if (strcmp(a, "--coarse-dis") == 0) coarse_path = v;
        else if (strcmp(a, "--k") == 0) { if (parse_size(a, v, &k)) return 2; }
        else if (strcmp(a, "--nprobe") == 0) { if (parse_size(a, v, &nprobe)) return 2; }
        else if (strcmp(a, "--warmup") == 0) { if (parse_size(a, v, &warmup)) return 2; }
        else if (strcmp(a, "--threads") == 0) {
            if (parse_size(a, v, &threads) || threads > 256) {
                fprintf(stderr, "tessera: index search: --threads expects 1..256\n");
                return 2;
            }
        } else if (strcmp(a, "--k-factor") == 0) {
            char *end;
            k_factor = strtof(v, &end);
            if (end == v || *end || !(k_factor >= 1.0f && k_factor <= 1e6f)) {
                fprintf(stderr, "tessera: index search: --k-factor expects a number >= 1\n");
                return 2;
            }
        }
    }
    const char *missing = !index ? "--index" : !queries ? "--queries" : !k ? "--k"
                        : !nprobe && !lists_path ? "--nprobe" : !out ? "--out"
                        : coarse_path && !lists_path ? "--lists (with --coarse-dis)" : NULL;
    if (missing) {
        fprintf(stderr, "tessera: index search: %s is required (see --help)\n", missing);
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
            fprintf(stderr, "tessera: index search: --simd expects auto|scalar|avx2|avx512\n");
            return 2;
        }
        if (!tsr_ivfpq_search_simd_supported(o.simd)) {
            fprintf(stderr, "tessera: index search: this CPU cannot run --simd %s\n", simd);
            return 1;
        }
    }
    o.nprobe = nprobe;
    o.threads = (int)threads;
    o.k_factor = k_factor;
    o.no_refine = no_refine;
    tsr_blas_set_threads((int)threads);

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
    fprintf(stderr, "tessera: index search: %s\n", err.msg);
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
