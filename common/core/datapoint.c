/*
 * datapoint — record model lifecycle and sparse normalization.
 */
#include "core/datapoint.h"

#include <stdlib.h>
#include <string.h>

const char *tsr_rec_error_name(enum tsr_rec_error e)
{
    static const char *names[] = {
#define TSR_X_NAME(name) #name,
        TSR_REC_ERRORS(TSR_X_NAME)
#undef TSR_X_NAME
    };
    if ((unsigned)e >= TSR_REC__COUNT)
        return "UNKNOWN";
    return names[e];
}

void tsr_datapoint_init(tsr_datapoint *dp)
{
    memset(dp, 0, sizeof *dp);
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void tsr_datapoint_close(tsr_datapoint *dp)
{
    free(dp->id);
    free(dp->dense);
    free(dp->sparse_dims);
    free(dp->sparse_vals);
    for (size_t i = 0; i < dp->nrestricts; i++) {
        free(dp->restricts[i].ns);
        free_strv(dp->restricts[i].allow, dp->restricts[i].nallow);
        free_strv(dp->restricts[i].deny, dp->restricts[i].ndeny);
    }
    free(dp->restricts);
    for (size_t i = 0; i < dp->nnumeric; i++)
        free(dp->numeric[i].ns);
    free(dp->numeric);
    free(dp->crowding_tag);
    free(dp->metadata);
    memset(dp, 0, sizeof *dp);
}

/* Insertion sort for short runs, merge via index sort otherwise. Sparse vectors are
 * usually short; a simple stable sort on (dim) pairs is enough. */
typedef struct {
    int64_t dim;
    float val;
} sparse_pair;

static int cmp_pair(const void *a, const void *b)
{
    int64_t x = ((const sparse_pair *)a)->dim, y = ((const sparse_pair *)b)->dim;
    return (x > y) - (x < y);
}

void tsr_datapoint_normalize_sparse(tsr_datapoint *dp)
{
    size_t n = dp->nsparse;
    if (n == 0)
        return;
    int sorted = 1;
    for (size_t i = 1; i < n; i++)
        if (dp->sparse_dims[i] <= dp->sparse_dims[i - 1]) {
            sorted = 0;
            break;
        }
    if (sorted)
        return;
    sparse_pair *p = malloc(n * sizeof *p);
    if (p == NULL)
        return; /* stays unsorted but correct for dot products */
    for (size_t i = 0; i < n; i++) {
        p[i].dim = dp->sparse_dims[i];
        p[i].val = dp->sparse_vals[i];
    }
    qsort(p, n, sizeof *p, cmp_pair);
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (out > 0 && p[i].dim == dp->sparse_dims[out - 1]) {
            dp->sparse_vals[out - 1] += p[i].val;
        } else {
            dp->sparse_dims[out] = p[i].dim;
            dp->sparse_vals[out] = p[i].val;
            out++;
        }
    }
    dp->nsparse = out;
    free(p);
}
