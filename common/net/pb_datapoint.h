/*
 * pb_datapoint — a record (core/datapoint) as a tessera.v1.IndexDatapoint and back: the
 * one conversion the coordinator (Stage and streamed Write requests, UpsertDatapoints
 * input), the shard (Stage and Write edits, its version files, datapoints in Search and
 * ReadIndexDatapoints answers) and the CLI (`tessera upsert`) share.
 */
#ifndef TSR_PB_DATAPOINT_H
#define TSR_PB_DATAPOINT_H

#include <stddef.h>

#include "core/datapoint.h"
#include "tessera/v1/tessera.pb-c.h"

/* An IndexDatapoint describing a record, with the storage of its sub-messages. */
typedef struct tsr_pb_datapoint {
    Tessera__V1__IndexDatapoint dp;
    Tessera__V1__Restriction *rs, **rsp;
    Tessera__V1__NumericRestriction *ns, **nsp;
    Tessera__V1__CrowdingTag tag;
    Tessera__V1__SparseEmbedding sp;
} tsr_pb_datapoint;

/* Fills p->dp to describe d (borrowing d's arrays and strings: d must outlive p; the
 * serialized embedding_metadata is unpacked into a Struct p owns — failing to unpack those
 * bytes, which a reader or tsr_pb_datapoint_record wrote, aborts like tsr_xmalloc). */
void tsr_pb_datapoint_set(tsr_pb_datapoint *p, const tsr_datapoint *d);
/* Frees what set allocated (not d's data). */
void tsr_pb_datapoint_free(tsr_pb_datapoint *p);
/* The same as one heap message, for a message kept by pointer (a repeated field of a
 * response): a new IndexDatapoint describing d (borrowing d's data, as set), never NULL;
 * delete frees it (accepts NULL). Only messages of tsr_pb_datapoint_new may be deleted. */
Tessera__V1__IndexDatapoint *tsr_pb_datapoint_new(const tsr_datapoint *d);
void tsr_pb_datapoint_delete(Tessera__V1__IndexDatapoint *m);

/* IndexDatapoint -> record (copies everything; dp is initialised first; sparse normalised;
 * an empty crowding_attribute = no tag). Returns 0, or 1 with *type and msg (cap bytes) for
 * what the record model cannot hold: unequal sparse lengths, a numeric restrict without a
 * value or with an op, embedding_metadata over TSR_METADATA_MAX bytes serialized (checked
 * before it is copied; kept serialized in dp->metadata). dp is then partly filled:
 * tsr_datapoint_close it. The semantic
 * checks are the batch's (tsr_batch_record_check). */
int tsr_pb_datapoint_record(const Tessera__V1__IndexDatapoint *p, tsr_datapoint *dp,
                            enum tsr_rec_error *type, char *msg, size_t cap);

#endif
