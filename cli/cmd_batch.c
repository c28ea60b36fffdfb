/*
 * cmd_batch — `tessera batch inspect`: validates a Vertex-format batch_root. By default
 * it prints a summary of what the batch holds on stdout (batch_summary.c); with --records
 * it prints the resulting batch as JSON lines instead (sorted by id, floats in shortest
 * round-trip form, then the deleted ids; only when accepted). The report (files, counts,
 * errors with file:line) goes to stderr as text and, with --report FILE, as JSON.
 * Exit 0 accepted, 1 rejected, 2 usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch.h"
#include "cli.h"
#include "core/cmdline.h"
#include "core/file.h"
#include "core/mem.h"

#define PROG "tessera batch inspect"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera batch inspect --batch-root DIR --dimensions D [--records]\n"
            "                             [--max-invalid-records N] [--report FILE] [--threads T]\n"
            "\n"
            "Reads a Vertex AI Vector Search batch_root (data files *.csv, *.json, *.avro and\n"
            "an optional delete/ folder of id files) and checks every rule of the format. The\n"
            "report (per-file counts, errors as FILE:LINE with the Vertex error type, warnings)\n"
            "goes to stderr, and as JSON to FILE with --report. stdout gets a summary: records\n"
            "by kind, deletes, dense and sparse dimensions, the token and numeric namespaces\n"
            "seen (records, distinct tokens, value ranges), crowding tags.\n"
            "\n"
            "  --batch-root DIR            the batch folder\n"
            "  --dimensions D              the index dimension (length of dense embeddings)\n"
            "  --records                   print the batch instead of the summary: one JSON\n"
            "                              record per line sorted by id, then {\"id\": ...,\n"
            "                              \"delete\": true} per deleted id (accepted batch only)\n"
            "  --max-invalid-records N     skip up to N invalid records (default 0: any invalid\n"
            "                              record rejects the batch)\n"
            "  --report FILE               also write the report as JSON to FILE\n"
            "  --threads T                 reader threads, 0..256 (default 0: number of cores)\n"
            "\n"
            "Exit status: 0 batch accepted, 1 batch rejected, 2 usage error.\n");
}

static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
        } else if (c < 0x20) {
            switch (c) {
            case '\n':
                fputs("\\n", f);
                break;
            case '\t':
                fputs("\\t", f);
                break;
            case '\r':
                fputs("\\r", f);
                break;
            default:
                fprintf(f, "\\u%04x", c);
            }
        } else {
            fputc((int)c, f);
        }
    }
    fputc('"', f);
}

static void put_float(FILE *f, float v)
{
    char b[48];
    tsr_batch_fmt_float(b, sizeof b, v);
    fputs(b, f);
}

static void put_floats(FILE *f, const float *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        put_float(f, v[i]);
    }
    fputc(']', f);
}

static void put_strv(FILE *f, char **v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        put_str(f, v[i]);
    }
    fputc(']', f);
}

static void put_record(FILE *f, const tsr_datapoint *dp)
{
    fputs("{\"id\": ", f);
    put_str(f, dp->id);
    if (dp->ndense > 0) {
        fputs(", \"embedding\": ", f);
        put_floats(f, dp->dense, dp->ndense);
    }
    if (dp->nsparse > 0) {
        fputs(", \"sparse_embedding\": {\"values\": ", f);
        put_floats(f, dp->sparse_vals, dp->nsparse);
        fputs(", \"dimensions\": [", f);
        for (size_t i = 0; i < dp->nsparse; i++)
            fprintf(f, "%s%lld", i ? ", " : "", (long long)dp->sparse_dims[i]);
        fputs("]}", f);
    }
    if (dp->nrestricts > 0) {
        fputs(", \"restricts\": [", f);
        for (size_t i = 0; i < dp->nrestricts; i++) {
            const tsr_token_restrict *r = &dp->restricts[i];
            fputs(i ? ", {\"namespace\": " : "{\"namespace\": ", f);
            put_str(f, r->ns);
            if (r->nallow > 0) {
                fputs(", \"allow\": ", f);
                put_strv(f, r->allow, r->nallow);
            }
            if (r->ndeny > 0) {
                fputs(", \"deny\": ", f);
                put_strv(f, r->deny, r->ndeny);
            }
            fputc('}', f);
        }
        fputc(']', f);
    }
    if (dp->nnumeric > 0) {
        fputs(", \"numeric_restricts\": [", f);
        for (size_t i = 0; i < dp->nnumeric; i++) {
            const tsr_numeric_restrict *r = &dp->numeric[i];
            char b[48];
            fputs(i ? ", {\"namespace\": " : "{\"namespace\": ", f);
            put_str(f, r->ns);
            switch (r->type) {
            case TSR_NUM_INT:
                fprintf(f, ", \"value_int\": %lld}", (long long)r->v.i);
                break;
            case TSR_NUM_FLOAT:
                tsr_batch_fmt_float(b, sizeof b, r->v.f);
                fprintf(f, ", \"value_float\": %s}", b);
                break;
            case TSR_NUM_DOUBLE:
                tsr_batch_fmt_double(b, sizeof b, r->v.d);
                fprintf(f, ", \"value_double\": %s}", b);
                break;
            }
        }
        fputc(']', f);
    }
    if (dp->crowding_tag != NULL) {
        fputs(", \"crowding_tag\": ", f);
        put_str(f, dp->crowding_tag);
    }
    if (dp->nmetadata) { /* the serialized Struct, as JSON (numbers shortest round trip) */
        json_t *m = tsr_cli_metadata_json(dp->metadata, dp->nmetadata);
        char *t = m ? json_dumps(m, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        fprintf(f, ", \"embedding_metadata\": %s", t ? t : "null");
        free(t);
        json_decref(m);
    }
    fputs("}\n", f);
}

int tsr_cli_write_report(const char *prog, const char *path, const char *json)
{
    if (json == NULL) {
        fprintf(stderr, "%s: cannot write the report to %s: out of memory\n", prog, path);
        return -1;
    }
    size_t n = strlen(json);
    char *text = tsr_xmalloc(n + 2);
    memcpy(text, json, n);
    memcpy(text + n, "\n", 2);
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_file_write_sync(path, text, n + 1, &err);
    free(text);
    if (rc != 0)
        fprintf(stderr, "%s: cannot write the report: %s\n", prog, err.msg); /* names path */
    return rc ? -1 : 0;
}

int tsr_cmd_batch_inspect(int argc, char **argv)
{
    const char *root = NULL, *report = NULL;
    uint64_t dims = 0, maxinv = 0, threads = 0;
    int records = 0;
    const tsr_cmdline_opt opts[] = {
        {"--batch-root", TSR_CMDLINE_STR, &root, 0, 0, 1},
        {"--dimensions", TSR_CMDLINE_UINT64, &dims, 1, 1 << 20, 1},
        {"--records", TSR_CMDLINE_FLAG, &records, 0, 0, 0},
        {"--max-invalid-records", TSR_CMDLINE_UINT64, &maxinv, 0, -1, 0},
        {"--report", TSR_CMDLINE_STR, &report, 0, 0, 0},
        {"--threads", TSR_CMDLINE_UINT64, &threads, 0, 256, 0},
    };
    const tsr_cmdline_spec spec = {PROG, opts, sizeof opts / sizeof opts[0], usage, 0, 1};
    int code;
    if (tsr_cmdline_parse_spec(&spec, argc, argv, NULL, &code))
        return code;
    tsr_batch_options o = {(size_t)dims, maxinv, (unsigned)threads, NULL};
    tsr_batch *b = NULL;
    tsr_error err = TSR_ERROR_INIT;
    int rc = tsr_batch_load(root, &o, &b, &err);
    if (b == NULL) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return 1;
    }
    tsr_batch_report_text(&b->report, stderr);
    if (!records) {
        fflush(stderr);
        tsr_cli_batch_summary(stdout, b, root, (size_t)dims, rc == 0);
        fflush(stdout);
    } else if (rc == 0) {
        static char obuf[1 << 16];
        setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
        for (size_t i = 0; i < b->nrecords; i++)
            put_record(stdout, &b->records[i]);
        for (size_t i = 0; i < b->ndeletes; i++) {
            fputs("{\"id\": ", stdout);
            put_str(stdout, b->deletes[i]);
            fputs(", \"delete\": true}\n", stdout);
        }
        fflush(stdout);
    }
    int exit_code = rc == 0 ? 0 : 1;
    if (report != NULL) {
        char *js = tsr_batch_report_json(&b->report);
        if (tsr_cli_write_report(PROG, report, js) != 0)
            exit_code = 1;
        free(js);
    }
    tsr_batch_destroy(b);
    return exit_code;
}
