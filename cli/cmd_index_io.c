/*
 * cmd_index_io — `tessera index check | info | rewrite`: validate, describe and rewrite
 * Faiss IwPQ / IwQR files through faiss_io. `check` takes many files so that tests can
 * validate thousands of mutated files in one process.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "index/faiss_io.h"

/* Collects the non-option arguments; returns -1 (after a message) on an unknown option. */
static int positional(int argc, char **argv, const char *cmd, char **out, int max)
{
    int n = 0, opts = 1;
    for (int i = 1; i < argc; i++) {
        if (opts && strcmp(argv[i], "--") == 0) {
            opts = 0;
            continue;
        }
        if (opts && argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "tessera: index %s: unknown option '%s' (see --help)\n", cmd, argv[i]);
            return -1;
        }
        if (n == max) {
            fprintf(stderr, "tessera: index %s: too many arguments (see --help)\n", cmd);
            return -1;
        }
        out[n++] = argv[i];
    }
    return n;
}

int tsr_cmd_index_check(int argc, char **argv)
{
    if (tsr_cli_wants_help(argc, argv)) {
        printf("usage: tessera index check FILE [FILE...]\n\n"
               "Validates Faiss IndexIVFPQ (IwPQ) / IndexIVFPQR (IwQR) files as a hostile\n"
               "input: prints 'FILE: ok' on stdout for each valid file and a one-line error\n"
               "(byte offset, field, what was expected) on stderr for each invalid one.\n"
               "Exit 0 when all files are valid, 1 when any is not, 2 on usage errors.\n");
        return 0;
    }
    char **files = argv; /* positional() never yields more than argc-1 entries */
    int n = positional(argc, argv, "check", files, argc);
    if (n < 0)
        return 2;
    if (n == 0) {
        fprintf(stderr, "tessera: index check: expected at least one FILE (see --help)\n");
        return 2;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        tsr_error err = TSR_ERROR_INIT;
        tsr_ivfpq *ix = NULL;
        if (tsr_faiss_read_file(files[i], &ix, &err) != 0) {
            fprintf(stderr, "tessera: index check: %s\n", err.msg);
            bad = 1;
        } else {
            printf("%s: ok\n", files[i]);
        }
        tsr_ivfpq_destroy(ix);
    }
    fflush(stdout);
    return bad;
}

int tsr_cmd_index_info(int argc, char **argv)
{
    if (tsr_cli_wants_help(argc, argv)) {
        printf("usage: tessera index info FILE\n\n"
               "Prints one JSON object describing a Faiss IwPQ / IwQR file: fourcc, d, ntotal,\n"
               "nlist, nprobe, metric (l2|ip), by_residual, code_size, pq_m, pq_nbits,\n"
               "direct_map (none|array|hashtable), list_type (full|sprs, as stored in the\n"
               "file), nonempty_lists, is_trained, quantizer (IxF2|IxFI); IwQR files add\n"
               "refine_pq_m, refine_pq_nbits, refine_code_size and k_factor.\n"
               "Exit 1 on an invalid file, 2 on usage errors.\n");
        return 0;
    }
    char *files[1];
    int n = positional(argc, argv, "info", files, 1);
    if (n != 1) {
        if (n == 0)
            fprintf(stderr, "tessera: index info: expected FILE (see --help)\n");
        return 2;
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = NULL;
    if (tsr_faiss_read_file(files[0], &ix, &err) != 0) {
        fprintf(stderr, "tessera: index info: %s\n", err.msg);
        return 1;
    }
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
    if (tsr_cli_wants_help(argc, argv)) {
        printf("usage: tessera index rewrite IN OUT\n\n"
               "Reads the Faiss IwPQ / IwQR file IN and writes it back to OUT (atomically,\n"
               "via OUT.tmp). A file written by Faiss comes back byte for byte.\n"
               "Exit 1 on an invalid input or a write error, 2 on usage errors.\n");
        return 0;
    }
    char *files[2];
    int n = positional(argc, argv, "rewrite", files, 2);
    if (n != 2) {
        if (n >= 0)
            fprintf(stderr, "tessera: index rewrite: expected IN and OUT (see --help)\n");
        return 2;
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_ivfpq *ix = NULL;
    int rc = 1;
    if (tsr_faiss_read_file(files[0], &ix, &err) != 0) {
        fprintf(stderr, "tessera: index rewrite: %s\n", err.msg);
        goto out;
    }
    if (tsr_faiss_write_file(ix, files[1], &err) != 0) {
        fprintf(stderr, "tessera: index rewrite: %s\n", err.msg);
        goto out;
    }
    rc = 0;
out:
    tsr_ivfpq_destroy(ix);
    return rc;
}
