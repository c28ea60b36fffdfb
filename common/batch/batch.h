/*
 * batch — loads a Vertex AI Vector Search batch_root (SPEC §2): enforces the folder
 * rules, reads the data files (.csv, .json, .avro) and delete/ files in parallel, merges
 * everything into one batch sorted by id, and builds the report (per-file counts, the
 * first errors of each file with line / record index, Vertex error type and message,
 * counts per type, batch-level errors and warnings).
 *
 * Decisions (docs/batch-format.md): of several records with the same id the last one
 * in (file name, line) order wins and a warning names all copies; an id in a data file
 * and a delete file is a batch-level error; folder-rule violations and file-level
 * failures reject the batch whatever max_invalid_records says.
 */
#ifndef TSR_BATCH_H
#define TSR_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/datapoint.h"
#include "core/error.h"

#define TSR_BATCH_MAX_OBJECTS 5000
#define TSR_BATCH_MAX_FILE_ERRORS 50  /* errors kept per file in the report */
#define TSR_BATCH_MAX_MESSAGES 100    /* batch-level errors / warnings kept */

enum tsr_batch_kind { TSR_BATCH_CSV, TSR_BATCH_JSON, TSR_BATCH_AVRO, TSR_BATCH_DELETE };

typedef struct tsr_batch_rec_error {
    uint64_t where;            /* 1-based line, or 0-based Avro record index */
    enum tsr_rec_error type;
    char *msg;                 /* owned */
} tsr_batch_rec_error;

typedef struct tsr_batch_file_report {
    char *name;                /* owned; relative to batch_root ("a.csv", "delete/x") */
    enum tsr_batch_kind kind;
    uint64_t valid;            /* valid records, or ids for a delete file */
    uint64_t invalid;
    uint64_t type_counts[TSR_REC__COUNT];
    tsr_batch_rec_error *errors; /* owned; the first TSR_BATCH_MAX_FILE_ERRORS */
    size_t nerrors;
    char *file_error;          /* owned; file-level failure, NULL if none */
} tsr_batch_file_report;

typedef struct tsr_batch_report {
    char *root;                    /* owned */
    tsr_batch_file_report *files;  /* owned, sorted by name */
    size_t nfiles;
    uint64_t type_counts[TSR_REC__COUNT];
    uint64_t valid, invalid;       /* over all files (before duplicate merging) */
    uint64_t records;              /* records read (lines of data and delete files, Avro
                                      records): valid + invalid */
    uint64_t upserts, deletes;     /* unique ids in the merged batch; when accepted,
                                      valid = upserts + deletes + duplicates */
    uint64_t duplicates;           /* extra copies dropped (data and delete files) */
    char **errors;                 /* owned; batch-level errors (first TSR_BATCH_MAX_MESSAGES) */
    size_t nerrors;
    uint64_t errors_total;
    char **warnings;               /* owned; first TSR_BATCH_MAX_MESSAGES */
    size_t nwarnings;
    uint64_t warnings_total;
    uint64_t max_invalid;
    int rejected;
    char reason[512];              /* why rejected; empty when accepted */
} tsr_batch_report;

typedef struct tsr_batch {
    tsr_datapoint *records;        /* owned, sorted by id (bytewise), ids unique */
    size_t nrecords;
    char **deletes;                /* owned, sorted, unique */
    size_t ndeletes;
    tsr_batch_report report;
} tsr_batch;

typedef struct tsr_batch_options {
    size_t dims;                   /* index dimension (dense length), > 0 */
    uint64_t max_invalid;          /* invalid records tolerated (skipped); default 0 */
    unsigned threads;              /* reader threads; 0 = number of online cores */
    /* A resolved folder (tsr_batch_confine's *within) that every entry must stay inside: a
     * symlink of the root or of delete/ that resolves elsewhere is a batch error and is
     * not read. NULL = no check (local tools). */
    const char *confine;
} tsr_batch_options;

/* Reads the batch under root. On success (0) or rejection (TSR_EREJECTED) *out is a new
 * batch with its report (caller destroys); when rejected the records are whatever could
 * be read, for inspection only. Other negative codes (root unreadable, out of memory)
 * leave *out NULL and set err. */
int tsr_batch_load(const char *root, const tsr_batch_options *opt, tsr_batch **out,
                   tsr_error *err);
void tsr_batch_destroy(tsr_batch *b);

/* For a server that reads batch roots named by its clients (batch_confine.c): resolves
 * root (realpath) and checks that it lies inside one of allowed[0..n) (absolute resolved
 * folders, e.g. realpath of the server's flags) and that no symlink entry of the root or
 * of its delete/ folder resolves outside that folder. Returns 0 with *resolved (new
 * string: load that path) and *within (the allowed folder, borrowed: pass it as
 * tsr_batch_options.confine); TSR_EREJECTED when refused, with err naming the allowed
 * folders and at most the root's entry that points out (never a name from outside them).
 * A missing root inside an allowed folder is accepted (the loader reports it). */
int tsr_batch_confine(const char *root, const char *const *allowed, size_t n, char **resolved,
                      const char **within, tsr_error *err);

/* batch_check.c: the semantic rules of one record (dp borrowed; sparse normalised), the
 * same for every format and for streamed upserts: non-empty UTF-8 id, dense embedding of
 * exactly dims values or a non-empty sparse one, finite values, non-empty UTF-8 namespaces
 * and tokens, each namespace once, a non-empty UTF-8 crowding tag, embedding_metadata of
 * at most TSR_METADATA_MAX bytes. Returns 0, or 1 with the Vertex error type in *type and a
 * message naming the field in msg (cap bytes). */
int tsr_batch_record_check(const tsr_datapoint *dp, size_t dims, enum tsr_rec_error *type,
                           char *msg, size_t cap);
/* Its parts: the id alone (a removed id), the token and numeric restricts alone (an
 * upsert with update mask all_restricts). Same returns. */
int tsr_batch_id_check(const char *id, enum tsr_rec_error *type, char *msg, size_t cap);
int tsr_batch_restricts_check(const tsr_datapoint *dp, enum tsr_rec_error *type, char *msg,
                              size_t cap);

/* The report as a JSON document (new string, caller frees), NULL on out of memory. */
char *tsr_batch_report_json(const tsr_batch_report *r);
/* The report as text for a person. */
void tsr_batch_report_text(const tsr_batch_report *r, FILE *f);

/* "csv", "json", "avro", "delete". */
const char *tsr_batch_kind_name(enum tsr_batch_kind k);

/* The text of a number as `tessera batch inspect` prints it: the shortest "%.Ng" that
 * reads back (strtof / strtod, hence also the batch readers) to the same bits. cap >= 32
 * bytes. Returns the length. Only for finite values. */
int tsr_batch_fmt_float(char *buf, size_t cap, float f);
int tsr_batch_fmt_double(char *buf, size_t cap, double d);

#endif
