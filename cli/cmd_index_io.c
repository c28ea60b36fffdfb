/*
 * cmd_index_io — `tessera index check | info | rewrite`: validate, describe and rewrite
 * Faiss IwPQ / IwQR files through faiss_io. `check` takes many files so that tests can
 * validate thousands of mutated files in one process.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/cmdline.h"
#include "index/faiss_io.h"

#define PROG_CHECK "tessera index check"
#define PROG_INFO "tessera index info"
#define PROG_REWRITE "tessera index rewrite"

static void check_usage(FILE *f)
{
    fprintf(f, "usage: tessera index check FILE [FILE...]\n\n"
               "Validates Faiss IndexIVFPQ (IwPQ) / IndexIVFPQR (IwQR) files as a hostile\n"
               "input: prints 'FILE: ok' on stdout for each valid file and a one-line error\n"
               "(byte offset, field, what was expected) on stderr for each invalid one.\n"
               "Exit 0 when all files are valid, 1 when any is not, 2 on usage errors.\n");
}

static void info_usage(FILE *f)
{
    fprintf(f, "usage: tessera index info FILE\n\n"
               "Prints one JSON object describing a Faiss IwPQ / IwQR file: fourcc, d, ntotal,\n"
               "nlist, nprobe, metric (l2|ip), by_residual, code_size, pq_m, pq_nbits,\n"
               "direct_map (none|array|hashtable), list_type (full|sprs, as stored in the\n"
               "file), nonempty_lists, is_trained, quantizer (IxF2|IxFI); IwQR files add\n"
               "refine_pq_m, refine_pq_nbits, refine_code_size and k_factor.\n"
               "Exit 0 on success, 1 on an invalid file, 2 on usage errors.\n");
}

static void rewrite_usage(FILE *f)
{
    fprintf(f, "usage: tessera index rewrite IN OUT\n\n"
               "Reads the Faiss IwPQ / IwQR file IN and writes it back to OUT (atomically,\n"
               "via OUT.tmp). A file written by Faiss comes back byte for byte.\n"
               "Exit 0 on success, 1 on an invalid input or a write error, 2 on usage errors.\n");
}

/* Parses a command that takes only files: min..max of them (max -1: any), moved to
 * argv[1..*n]. Returns -1 to go on, else the exit code (0 after --help, 2 usage error). */
static int files_args(const char *prog, void (*usage)(FILE *), int argc, char **argv, int min,
                      int max, const char *what, int *n)
{
    tsr_cmdline_spec spec = {prog, NULL, 0, usage, max, 1};
    int code;
    if (tsr_cmdline_parse_spec(&spec, argc, argv, n, &code))
        return code;
    if (*n < min) {
        fprintf(stderr, "%s: expected %s (see '%s --help')\n", prog, what, prog);
        return 2;
    }
    return -1;
}

/* The index in the Faiss file at path, or NULL after printing why ("PROG: message"). */
static tsr_ivfpq *read_index(const char *prog, const char *path)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = NULL;
    if (tsr_faiss_read_file(path, &ix, &err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        tsr_ivfpq_destroy(ix);
        return NULL;
    }
    return ix;
}

int tsr_cmd_index_check(int argc, char **argv)
{
    int n, code = files_args(PROG_CHECK, check_usage, argc, argv, 1, -1, "at least one FILE", &n);
    if (code >= 0)
        return code;
    char **files = argv + 1;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        tsr_ivfpq *ix = read_index(PROG_CHECK, files[i]);
        if (ix == NULL) {
            bad = 1;
        } else {
            printf("%s: ok\n", files[i]);
            tsr_ivfpq_destroy(ix);
        }
    }
    fflush(stdout);
    return bad;
}

int tsr_cmd_index_info(int argc, char **argv)
{
    int n, code = files_args(PROG_INFO, info_usage, argc, argv, 1, 1, "FILE", &n);
    if (code >= 0)
        return code;
    tsr_ivfpq *ix = read_index(PROG_INFO, argv[1]);
    if (ix == NULL)
        return 1;
    static const char *dm[] = {"none", "array", "hashtable"};
    printf("{\"fourcc\": \"%s\", \"d\": %d, \"ntotal\": %" PRId64 ", \"nlist\": %zu, "
           "\"nprobe\": %zu, \"metric\": \"%s\", \"by_residual\": %s, \"code_size\": %zu, "
           "\"pq_m\": %zu, \"pq_nbits\": %zu, \"direct_map\": \"%s\", \"list_type\": \"%s\", "
           "\"nonempty_lists\": %zu, \"is_trained\": %s, \"quantizer\": \"%s\"",
           ix->is_refine ? "IwQR" : "IwPQ", ix->d, ix->ntotal, ix->nlist, ix->nprobe,
           ix->metric == TSR_METRIC_L2 ? "l2" : "ip", ix->by_residual ? "true" : "false",
           ix->code_size, ix->pq.M, ix->pq.nbits, dm[ix->dm_type], ix->list_type,
           tsr_faiss_nonempty_lists(ix), ix->is_trained ? "true" : "false", ix->quantizer_fourcc);
    if (ix->is_refine)
        printf(", \"refine_pq_m\": %zu, \"refine_pq_nbits\": %zu, \"refine_code_size\": %zu, "
               "\"k_factor\": %.9g",
               ix->refine_pq.M, ix->refine_pq.nbits, ix->refine_pq.code_size, (double)ix->k_factor);
    printf("}\n");
    tsr_ivfpq_destroy(ix);
    return 0;
}

int tsr_cmd_index_rewrite(int argc, char **argv)
{
    int n, code = files_args(PROG_REWRITE, rewrite_usage, argc, argv, 2, 2, "IN and OUT", &n);
    if (code >= 0)
        return code;
    tsr_ivfpq *ix = read_index(PROG_REWRITE, argv[1]);
    if (ix == NULL)
        return 1;
    tsr_error err = TSR_ERROR_INIT;
    int rc = 0;
    if (tsr_faiss_write_file(ix, argv[2], &err) != 0) {
        fprintf(stderr, PROG_REWRITE ": %s\n", err.msg);
        rc = 1;
    }
    tsr_ivfpq_destroy(ix);
    return rc;
}
