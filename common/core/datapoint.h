/*
 * datapoint — the record model of a batch (SPEC §2) and the interface between the
 * per-format readers (batch_csv, batch_json, batch_avro, batch_delete) and the batch
 * merger.
 *
 * A reader turns one file into calls on a tsr_record_sink: one `record` per valid
 * record (ownership of the datapoint passes to the sink), one `invalid` per bad record
 * (with the Vertex error type and a message naming the field), one `delete_id` per id of
 * a delete file. A reader returns an error only for file-level failures (cannot open,
 * not a valid container); record-level problems never stop it.
 */
#ifndef TSR_DATAPOINT_H
#define TSR_DATAPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Vertex AI Vector Search error types (SPEC §2), plus internal WARNING kinds. */
#define TSR_REC_ERRORS(X)          \
    X(EMPTY_LINE)                  \
    X(INVALID_JSON_SYNTAX)         \
    X(INVALID_CSV_SYNTAX)          \
    X(INVALID_AVRO_SYNTAX)         \
    X(INVALID_EMBEDDING_ID)        \
    X(EMBEDDING_SIZE_MISMATCH)     \
    X(NAMESPACE_MISSING)           \
    X(PARSING_ERROR)               \
    X(DUPLICATE_NAMESPACE)         \
    X(OP_IN_DATAPOINT)             \
    X(MULTIPLE_VALUES)             \
    X(INVALID_NUMERIC_VALUE)       \
    X(INVALID_ENCODING)            \
    X(INVALID_SPARSE_DIMENSIONS)   \
    X(INVALID_TOKEN_VALUE)         \
    X(INVALID_SPARSE_EMBEDDING)    \
    X(INVALID_EMBEDDING)

enum tsr_rec_error {
#define TSR_X_REC(name) TSR_REC_##name,
    TSR_REC_ERRORS(TSR_X_REC)
#undef TSR_X_REC
    TSR_REC__COUNT
};

/* "EMPTY_LINE" etc.; never NULL. */
const char *tsr_rec_error_name(enum tsr_rec_error e);

typedef struct tsr_token_restrict {
    char *ns;       /* owned, NUL-terminated UTF-8 */
    char **allow;   /* owned array of owned strings */
    size_t nallow;
    char **deny;    /* owned array of owned strings */
    size_t ndeny;
} tsr_token_restrict;

enum tsr_num_type { TSR_NUM_INT = 0, TSR_NUM_FLOAT = 1, TSR_NUM_DOUBLE = 2 };

/* A numeric restrict's value (of a datapoint or of a query): the member named by the
 * tsr_num_type beside it. */
typedef union tsr_num {
    int64_t i;
    float f;
    double d;
} tsr_num;

typedef struct tsr_numeric_restrict {
    char *ns; /* owned */
    enum tsr_num_type type;
    tsr_num v;
} tsr_numeric_restrict;

typedef struct tsr_datapoint {
    char *id;                 /* owned, valid UTF-8 */
    float *dense;             /* owned; NULL when the record has no dense embedding */
    size_t ndense;
    int64_t *sparse_dims;     /* owned; sorted ascending, unique (after normalize) */
    float *sparse_vals;       /* owned */
    size_t nsparse;
    tsr_token_restrict *restricts; /* owned array */
    size_t nrestricts;
    tsr_numeric_restrict *numeric; /* owned array */
    size_t nnumeric;
    char *crowding_tag;       /* owned; NULL when absent */
    uint8_t *metadata;        /* owned; embedding_metadata as a serialized
                                 google.protobuf.Struct (protobuf wire bytes); NULL when
                                 absent or empty ({}); at most TSR_METADATA_MAX bytes */
    size_t nmetadata;
} tsr_datapoint;

/* Largest embedding_metadata a datapoint may carry, serialized (a google.protobuf.Struct
 * in protobuf wire form): larger is an error wherever metadata enters (a batch record,
 * UpsertDatapoints), checked before anything of that size is allocated. */
#define TSR_METADATA_MAX ((size_t)64 << 10)

void tsr_datapoint_init(tsr_datapoint *dp);  /* zeroes */
void tsr_datapoint_close(tsr_datapoint *dp); /* frees all fields, leaves it zeroed */

/* Sorts sparse dims ascending and sums the values of duplicate dims (SPEC §2). */
void tsr_datapoint_normalize_sparse(tsr_datapoint *dp);

/* Sink for readers. `where` is the 1-based line (CSV/JSON/delete) or 0-based Avro record
 * index. Callbacks return 0 to go on, nonzero to stop reading (e.g. too many errors). */
typedef struct tsr_record_sink {
    void *ctx;
    int (*record)(void *ctx, uint64_t where, tsr_datapoint *dp); /* takes ownership of *dp
                                                                   contents; dp is zeroed after */
    int (*invalid)(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg);
    int (*delete_id)(void *ctx, uint64_t where, const char *id, size_t len);
} tsr_record_sink;

#endif
