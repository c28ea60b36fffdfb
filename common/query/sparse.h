/*
 * sparse — an inverted index over sparse embeddings (int64 dimension → postings of
 * (row, value)) with exact dot-product top-k (SPEC §3: sparse embeddings always use the
 * dot product, larger is nearer).
 *
 * Rows are a shard's local rows, the same numbering as its tsr_filter_meta, so a search
 * can apply a compiled filter and report labels and crowding tags from the meta.
 *
 * Immutable after build: a shard builds a new index for every version (a builder takes
 * (row, dims, values) in any order; finish sorts the M nonzeros once, O(M log M)) and
 * any number of threads may search it concurrently. Duplicate dimensions inside one row
 * are summed (as tsr_datapoint_normalize_sparse does); duplicate dimensions in a query
 * contribute once per occurrence, which is the same as summing them.
 *
 * Candidates are the rows that share at least one dimension with the query; a row with no
 * common dimension (dot product 0 by definition) is not returned.
 */
#ifndef TSR_SPARSE_H
#define TSR_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "core/datapoint.h"
#include "core/error.h"
#include "query/filter.h"
#include "query/topk.h"

typedef struct tsr_sparse_builder tsr_sparse_builder;
typedef struct tsr_sparse_index tsr_sparse_index;

/* Returns a new empty builder (caller destroys) or NULL on out of memory. */
tsr_sparse_builder *tsr_sparse_builder_create(void);
void tsr_sparse_builder_destroy(tsr_sparse_builder *b); /* accepts NULL */

/* Adds row's nonzeros (borrowed arrays of n dims and values, any order); duplicate dims
 * in one call are summed in input order. A row may be added in several calls; the values
 * of a dim repeated across calls add up too (in unspecified order).
 * TSR_EINVAL (row == UINT32_MAX, NaN or infinite value), TSR_ENOMEM. */
int tsr_sparse_builder_add(tsr_sparse_builder *b, uint32_t row, const int64_t *dims,
                           const float *vals, size_t n, tsr_error *err);

/* Builds the index over rows [0, nrows) into *out (a new index, caller destroys) and
 * empties the builder (which can be reused, and must still be destroyed). TSR_EINVAL when
 * a row added is >= nrows, TSR_ENOMEM. */
int tsr_sparse_builder_finish(tsr_sparse_builder *b, size_t nrows, tsr_sparse_index **out,
                              tsr_error *err);

/* Convenience: row i = dps[i] (borrowed; its sparse_dims / sparse_vals). */
int tsr_sparse_index_build(const tsr_datapoint *dps, size_t n, tsr_sparse_index **out,
                           tsr_error *err);

void tsr_sparse_index_destroy(tsr_sparse_index *ix); /* accepts NULL */
size_t tsr_sparse_index_rows(const tsr_sparse_index *ix);
size_t tsr_sparse_index_nnz(const tsr_sparse_index *ix);  /* stored (row, dim) pairs */
size_t tsr_sparse_index_ndims(const tsr_sparse_index *ix); /* distinct dimensions */

/* Exact top-k by dot product of the query (nq dims and values, borrowed, any order,
 * duplicates allowed) into out (capacity k), count in *nout, best first (larger dot
 * product, then smaller label). With meta (borrowed, same rows): a hit's label and tag are
 * the row's label and crowding tag and filter (may be NULL) is applied; without meta:
 * label = row, tag = 0, and filter must be NULL. c is the crowding limit (0 = none).
 * Returns 0, TSR_EINVAL, TSR_ENOMEM. */
int tsr_sparse_search(const tsr_sparse_index *ix, const int64_t *qdims, const float *qvals,
                      size_t nq, size_t k, size_t c, const tsr_filter *filter,
                      const tsr_filter_meta *meta, tsr_hit *out, size_t *nout,
                      tsr_error *err);

#endif
