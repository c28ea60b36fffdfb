/*
 * filter — token restricts and numeric restricts of a query (SPEC §3), compiled once per
 * query into a test that is cheap to run for every candidate of a scan.
 *
 * Three pieces:
 *  - tsr_filter_dict interns strings (namespaces, tokens, crowding tags) into dense
 *    uint32 ids. A shard keeps one per version; ids are stable across
 *    tsr_filter_dict_clone, so version N+1 clones N's dict and interns new strings into
 *    the clone while queries on N keep using N's dict (no locks, no races).
 *  - tsr_filter_meta holds, per local row, the datapoint's label, its token restricts as a
 *    sorted run of packed (ns_id, token_id, is_deny) keys in one arena, its numeric values
 *    as a sorted run of (ns_id, type, value) in a second arena, and its crowding tag id.
 *    Rows are appended once and never change (an immutable build per version).
 *  - tsr_filter is a compiled query: clauses sorted by namespace id with sorted token id
 *    sets, numeric clauses sorted by namespace id, and two shortcuts ("matches everything",
 *    "matches nothing") so the common unfiltered case costs one branch.
 *
 * Semantics (derivation with the SPEC worked example in docs/query-semantics.md): for every
 * namespace the query names, with query allow set QA and deny set QD, and the datapoint's
 * allow tokens DA and deny tokens DD in that namespace:
 *     excluded when DA ∩ QD ≠ ∅ (a query deny removes datapoints that have the token),
 *     excluded when DD ∩ QA ≠ ∅ (a datapoint deny removes it from queries allowing it),
 *     otherwise it passes when QA = ∅ or DA ∩ QA ≠ ∅.
 * The datapoint matches when it passes every named namespace and every numeric clause.
 * A query naming one namespace twice has the two entries merged (union of tokens).
 *
 * Thread-safety: dict and meta are read-only after building and may be shared by any
 * number of query threads; a tsr_filter is immutable after compile.
 */
#ifndef TSR_FILTER_H
#define TSR_FILTER_H

#include <stddef.h>
#include <stdint.h>

#include "core/datapoint.h"
#include "core/error.h"

#define TSR_FILTER_NOID UINT32_MAX
/* Ids are limited to 31 bits so that (ns, token, deny) packs into one uint64. */
#define TSR_FILTER_MAX_IDS 0x7fffffffu

/* ---- string dictionary --------------------------------------------------------------- */
typedef struct tsr_filter_dict tsr_filter_dict;

/* Returns a new empty dict (caller destroys) or NULL on out of memory. */
tsr_filter_dict *tsr_filter_dict_create(void);
/* Returns a new dict with the same strings and ids as d (caller destroys), or NULL. */
tsr_filter_dict *tsr_filter_dict_clone(const tsr_filter_dict *d);
void tsr_filter_dict_destroy(tsr_filter_dict *d); /* accepts NULL */

/* Id of s[0..len) (added when new) into *id. TSR_ENOMEM / TSR_ELIMIT on failure. */
int tsr_filter_dict_intern(tsr_filter_dict *d, const char *s, size_t len, uint32_t *id);
/* Id of s[0..len) or TSR_FILTER_NOID when absent; never modifies d. */
uint32_t tsr_filter_dict_lookup(const tsr_filter_dict *d, const char *s, size_t len);
/* Borrowed NUL-terminated string of id (length in *len when non-NULL); NULL if no such id. */
const char *tsr_filter_dict_str(const tsr_filter_dict *d, uint32_t id, size_t *len);
size_t tsr_filter_dict_size(const tsr_filter_dict *d);

/* ---- per-row metadata ---------------------------------------------------------------- */
typedef struct tsr_filter_meta tsr_filter_meta;

/* Returns a new empty meta that borrows dict (the dict must outlive it and is only
 * modified by tsr_filter_meta_add); NULL on out of memory. */
tsr_filter_meta *tsr_filter_meta_create(tsr_filter_dict *dict);
void tsr_filter_meta_destroy(tsr_filter_meta *m); /* accepts NULL */
/* Heap bytes of m's row arrays, token/numeric arenas and label hash (capacities; not the
 * dictionary). 0 for NULL. */
size_t tsr_filter_meta_bytes(const tsr_filter_meta *m);

/* Appends a row for the datapoint dp (borrowed; only its restricts, numeric values and
 * crowding tag are read) with the given label; its row number goes to *row (may be NULL).
 * A datapoint without a crowding tag (or with "", which proto3 cannot tell from absent)
 * gets TSR_FILTER_NOID, which topk treats as "never limited" (TSR_TOPK_NOTAG). TSR_EINVAL when the label is already present, TSR_ENOMEM / TSR_ELIMIT. */
int tsr_filter_meta_add(tsr_filter_meta *m, int64_t label, const tsr_datapoint *dp,
                        uint32_t *row, tsr_error *err);

size_t tsr_filter_meta_rows(const tsr_filter_meta *m);
int64_t tsr_filter_meta_label(const tsr_filter_meta *m, uint32_t row);
/* Row of label into *row; returns 0 when found, -1 when the label is not in m. */
int tsr_filter_meta_find(const tsr_filter_meta *m, int64_t label, uint32_t *row);
/* Crowding tag id of row (a dict id), TSR_FILTER_NOID when the row has none. */
uint32_t tsr_filter_meta_crowding(const tsr_filter_meta *m, uint32_t row);
const tsr_filter_dict *tsr_filter_meta_dict(const tsr_filter_meta *m);

/* ---- compiled query ------------------------------------------------------------------ */
/* Same numbering as the proto's NumericRestriction.Operator. */
enum tsr_num_op {
    TSR_OP_UNSPECIFIED = 0,
    TSR_OP_LESS = 1,
    TSR_OP_LESS_EQUAL = 2,
    TSR_OP_EQUAL = 3,
    TSR_OP_GREATER_EQUAL = 4,
    TSR_OP_GREATER = 5,
    TSR_OP_NOT_EQUAL = 6
};

/* One numeric restrict of a query: "datapoint value in ns <op> v". */
typedef struct tsr_numeric_query {
    const char *ns; /* borrowed, NUL-terminated */
    enum tsr_num_type type;
    tsr_num v;
    enum tsr_num_op op;
} tsr_numeric_query;

typedef struct tsr_filter tsr_filter;

/* Compiles the query's token restricts r[0..nr) and numeric restricts nq[0..nn) against
 * dict (borrowed, only read) into *out (a new filter, caller destroys). Tokens and
 * namespaces unknown to the dict can match no datapoint: an unknown allow token is
 * dropped from its set (a set left empty by that matches nothing), an unknown deny token
 * has no effect. A numeric restrict on an unknown namespace matches nothing.
 * TSR_EINVAL (op unspecified or out of range, bad type, NULL namespace) / TSR_ENOMEM. */
int tsr_filter_compile(const tsr_filter_dict *dict, const tsr_token_restrict *r, size_t nr,
                       const tsr_numeric_query *nq, size_t nn, tsr_filter **out,
                       tsr_error *err);
void tsr_filter_destroy(tsr_filter *f); /* accepts NULL */

/* 1 when the row passes the filter, 0 otherwise. f may be NULL (matches everything).
 * m must use the dict (or a clone with a superset of the ids) f was compiled with. */
int tsr_filter_match(const tsr_filter *f, const tsr_filter_meta *m, uint32_t row);

/* 1 when f matches every row (no effective clause); lets a scan skip the test. */
int tsr_filter_matches_all(const tsr_filter *f);
/* 1 when f can match no row at all (e.g. allow of an unknown token); a scan can stop. */
int tsr_filter_matches_none(const tsr_filter *f);

/* Callback form for a scan that sees labels: ctx is a tsr_filter_scan. A label that is
 * not in the meta is rejected. Returns 1 to accept, 0 to reject. */
typedef struct tsr_filter_scan {
    const tsr_filter *filter;   /* borrowed; NULL = accept all known labels */
    const tsr_filter_meta *meta; /* borrowed */
} tsr_filter_scan;
int tsr_filter_accept_label(void *ctx, int64_t label);

#endif
