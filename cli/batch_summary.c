/*
 * batch_summary — the default output of `tessera batch inspect`: what a batch holds, in a
 * few lines a person reads (the records themselves are behind --records, cmd_batch.c).
 *
 * Records by kind (dense, sparse-only, hybrid) and deletes; the dense dimension; the
 * sparse dimensions' range; every token namespace with the records that use it and its
 * distinct tokens; every numeric namespace with its records, value types and range;
 * crowding tags and metadata. Namespaces are counted by sorting (namespace, record) pairs,
 * so a batch with many namespaces costs O(n log n), not a scan per namespace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch.h"
#include "cli.h"
#include "core/mem.h"

/* At most this many namespaces are listed per kind; the rest are counted. */
#define SUMMARY_MAX_NS 32

struct ns_use {
    const char *ns;
    const char *token; /* token restricts: the token (allow or deny); numeric: NULL */
    size_t rec;
    double v;
    int type; /* numeric: 1 << tsr_num_type */
};

static int cmp_use(const void *a, const void *b)
{
    const struct ns_use *x = a, *y = b;
    int c = strcmp(x->ns, y->ns);
    if (c)
        return c;
    if (x->rec != y->rec)
        return x->rec < y->rec ? -1 : 1;
    if (x->token && y->token)
        return strcmp(x->token, y->token);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Distinct strings of v[0..n) (sorted in place). */
static size_t distinct(const char **v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_str);
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += i == 0 || strcmp(v[i], v[i - 1]) != 0;
    return d;
}

static double num_value(const tsr_numeric_restrict *r)
{
    return r->type == TSR_NUM_INT ? (double)r->v.i
           : r->type == TSR_NUM_FLOAT ? (double)r->v.f
                                      : r->v.d;
}

/* One line per namespace of u[0..n) (sorted by namespace, record): records using it, and
 * distinct tokens (token) or types and range (numeric). */
static void print_namespaces(FILE *f, const char *what, struct ns_use *u, size_t n, int numeric)
{
    qsort(u, n, sizeof *u, cmp_use);
    size_t nns = 0;
    for (size_t i = 0; i < n; i++)
        nns += i == 0 || strcmp(u[i].ns, u[i - 1].ns) != 0;
    fprintf(f, "  %s namespaces: %zu%s\n", what, nns, nns ? "" : " (none)");
    const char **toks = numeric ? NULL : tsr_xmalloc((n ? n : 1) * sizeof *toks);
    size_t shown = 0;
    for (size_t i = 0, j; i < n; i = j) {
        size_t recs = 0, ntok = 0;
        double lo = u[i].v, hi = u[i].v;
        int types = 0;
        for (j = i; j < n && strcmp(u[j].ns, u[i].ns) == 0; j++) {
            recs += j == i || u[j].rec != u[j - 1].rec;
            if (toks)
                toks[ntok++] = u[j].token;
            lo = u[j].v < lo ? u[j].v : lo;
            hi = u[j].v > hi ? u[j].v : hi;
            types |= u[j].type;
        }
        if (++shown > SUMMARY_MAX_NS)
            continue;
        fprintf(f, "    %-20s %zu record%s", u[i].ns, recs, recs == 1 ? "" : "s");
        if (!numeric)
            fprintf(f, ", %zu distinct token%s\n", distinct(toks, ntok),
                    distinct(toks, ntok) == 1 ? "" : "s");
        else
            fprintf(f, ", %s%s%s%s%s, %.9g .. %.9g\n", types & 1 << TSR_NUM_INT ? "int" : "",
                    (types & 1 << TSR_NUM_INT) && (types & 6) ? "+" : "",
                    types & 1 << TSR_NUM_FLOAT ? "float" : "",
                    (types & 1 << TSR_NUM_FLOAT) && (types & 1 << TSR_NUM_DOUBLE) ? "+" : "",
                    types & 1 << TSR_NUM_DOUBLE ? "double" : "", lo, hi);
    }
    if (shown > SUMMARY_MAX_NS)
        fprintf(f, "    ... and %zu more\n", shown - SUMMARY_MAX_NS);
    free(toks);
}

/* The (namespace, record) uses of the batch's token (numeric == 0) or numeric restricts. */
static struct ns_use *collect(const tsr_batch *b, int numeric, size_t *n)
{
    size_t cap = 0, k = 0;
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *dp = &b->records[i];
        if (numeric)
            cap += dp->nnumeric;
        else
            for (size_t r = 0; r < dp->nrestricts; r++)
                cap += dp->restricts[r].nallow + dp->restricts[r].ndeny + 1;
    }
    struct ns_use *u = tsr_xmalloc((cap ? cap : 1) * sizeof *u);
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *dp = &b->records[i];
        for (size_t r = 0; numeric && r < dp->nnumeric; r++)
            u[k++] = (struct ns_use){dp->numeric[r].ns, NULL, i, num_value(&dp->numeric[r]),
                                     1 << dp->numeric[r].type};
        for (size_t r = 0; !numeric && r < dp->nrestricts; r++) {
            const tsr_token_restrict *t = &dp->restricts[r];
            for (size_t a = 0; a < t->nallow; a++)
                u[k++] = (struct ns_use){t->ns, t->allow[a], i, 0, 0};
            for (size_t a = 0; a < t->ndeny; a++)
                u[k++] = (struct ns_use){t->ns, t->deny[a], i, 0, 0};
        }
    }
    *n = k;
    return u;
}

void tsr_cli_batch_summary(FILE *f, const tsr_batch *b, const char *root, size_t dims,
                           int accepted)
{
    size_t dense = 0, sparse_only = 0, hybrid = 0, nnz = 0, tagged = 0, meta = 0;
    int64_t slo = 0, shi = 0;
    const char **tags = tsr_xmalloc((b->nrecords ? b->nrecords : 1) * sizeof *tags);
    for (size_t i = 0; i < b->nrecords; i++) {
        const tsr_datapoint *dp = &b->records[i];
        dense += dp->ndense > 0 && dp->nsparse == 0;
        hybrid += dp->ndense > 0 && dp->nsparse > 0;
        sparse_only += dp->ndense == 0 && dp->nsparse > 0;
        if (dp->nsparse > 0) { /* sparse_dims are sorted */
            slo = nnz == 0 || dp->sparse_dims[0] < slo ? dp->sparse_dims[0] : slo;
            shi = nnz == 0 || dp->sparse_dims[dp->nsparse - 1] > shi
                      ? dp->sparse_dims[dp->nsparse - 1]
                      : shi;
            nnz += dp->nsparse;
        }
        if (dp->crowding_tag)
            tags[tagged++] = dp->crowding_tag;
        meta += dp->nmetadata > 0;
    }
    fprintf(f, "summary of %s%s:\n", root, accepted ? "" : " (rejected: the valid records read)");
    const tsr_batch_report *r = &b->report;
    uint64_t files_err = 0;
    for (size_t i = 0; i < r->nfiles; i++)
        files_err += r->files[i].invalid > 0 || r->files[i].file_error != NULL;
    fprintf(f, "  %zu files (%llu with errors); %llu records read, %llu invalid "
            "(FILE:LINE of each in the report on stderr)\n",
            r->nfiles, (unsigned long long)files_err, (unsigned long long)r->records,
            (unsigned long long)r->invalid);
    fprintf(f, "  %zu records: %zu dense, %zu hybrid, %zu sparse-only; %zu deletes\n",
            b->nrecords, dense, hybrid, sparse_only, b->ndeletes);
    fprintf(f, "  dense dimensions: %zu (every embedding checked against --dimensions)\n", dims);
    if (nnz)
        fprintf(f, "  sparse dimensions: %lld .. %lld, %zu non-zeros in %zu records\n",
                (long long)slo, (long long)shi, nnz, hybrid + sparse_only);
    else
        fprintf(f, "  sparse dimensions: none\n");
    size_t n;
    struct ns_use *u = collect(b, 0, &n);
    print_namespaces(f, "token", u, n, 0);
    free(u);
    u = collect(b, 1, &n);
    print_namespaces(f, "numeric", u, n, 1);
    free(u);
    fprintf(f, "  crowding tags: %zu distinct on %zu records; embedding_metadata on %zu records\n",
            distinct(tags, tagged), tagged, meta);
    free(tags);
    fprintf(f, "(the records as JSON lines: --records)\n");
}
