/*
 * fuzz_faiss_io — libFuzzer harness for the Faiss IwPQ/IwQR reader.
 *
 * Invariants checked on every input:
 *  - a rejected input yields no index and a message naming the offset ("offset N: ...");
 *  - an accepted input can be written back; when its list table uses the type Faiss's
 *    rule would pick, the rewrite is the input byte for byte (the reader accepts only
 *    canonical encodings otherwise);
 *  - the rewrite reads back and rewrites to the same bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index/faiss_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_faiss_io: %s: %s\n", what, msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_ivfpq *ix = NULL, *back = NULL;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_faiss_read_mem(data, size, &ix, &err);
    if (rc != 0) {
        if (ix != NULL)
            die("rejected input", "returned an index");
        if (rc != TSR_ENOMEM && strncmp(err.msg, "offset ", 7) != 0)
            die("error message does not name the offset", err.msg);
        return 0;
    }
    uint8_t *w1 = NULL, *w2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (tsr_faiss_write_mem(ix, &w1, &n1, &err) != 0)
        die("write of an accepted index failed", err.msg);
    const char *canonical = tsr_faiss_nonempty_lists(ix) > ix->nlist / 2 ? "full" : "sprs";
    if (strcmp(ix->list_type, canonical) == 0 && (n1 != size || memcmp(w1, data, size) != 0))
        die("rewrite", "not byte-identical to the accepted input");
    if (tsr_faiss_read_mem(w1, n1, &back, &err) != 0)
        die("re-read of the rewrite failed", err.msg);
    if (tsr_faiss_write_mem(back, &w2, &n2, &err) != 0)
        die("second write failed", err.msg);
    if (n1 != n2 || memcmp(w1, w2, n1) != 0)
        die("second rewrite", "differs from the first");
    free(w1);
    free(w2);
    tsr_ivfpq_destroy(back);
    tsr_ivfpq_destroy(ix);
    return 0;
}
