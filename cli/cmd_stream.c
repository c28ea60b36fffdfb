/*
 * cmd_stream — `tessera upsert` and `tessera remove`: streamed writes through a running
 * coordinator (tessera.v1 UpsertDatapoints / RemoveDatapoints, docs/streaming.md).
 *
 * upsert reads JSON lines in the batch record format (docs/batch-format.md) from a file or
 * stdin with the batch module's JSON reader, so a line is accepted or refused exactly as in
 * a batch file (the index dimension comes from GetIndexStats); every line is checked before
 * anything is sent, and an invalid one is named by its line number, error type and field.
 * The records then go in requests of --per-call records (each acknowledged before the
 * next). remove sends the ids given (at most 10000 per request).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch/batch_json.h"
#include "cli.h"
#include "core/datapoint.h"
#include "core/file.h"
#include "core/mem.h"
#include "net/pb_datapoint.h"
#include "tessera/v1/tessera.pb-c.h"

#define SVC "/tessera.v1.VectorSearch/"
#define MAX_PER_CALL 10000
#define STREAM_MAX_INPUT ((size_t)4 << 30)

/* ------------------------------------------------------------------ input */

typedef struct recs {
    tsr_datapoint *dp;
    uint64_t *line;
    size_t n, cap;
    uint64_t bad;              /* invalid lines (each printed) */
    const char *prog, *name;
} recs;

static int on_record(void *ctx, uint64_t where, tsr_datapoint *dp)
{
    recs *r = ctx;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->dp = tsr_xrealloc(r->dp, r->cap * sizeof *r->dp);
        r->line = tsr_xrealloc(r->line, r->cap * sizeof *r->line);
    }
    r->dp[r->n] = *dp;
    r->line[r->n++] = where;
    tsr_datapoint_init(dp);
    return 0;
}

static int on_invalid(void *ctx, uint64_t where, enum tsr_rec_error type, const char *msg)
{
    recs *r = ctx;
    if (r->bad++ < 20)
        fprintf(stderr, "%s: %s line %llu: %s: %s\n", r->prog, r->name,
                (unsigned long long)where, tsr_rec_error_name(type), msg);
    return 0;
}

/* The whole of stdin (new buffer). */
static int read_stdin(char **out, size_t *len, tsr_error *err)
{
    size_t cap = 1 << 16, n = 0;
    char *b = tsr_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap >= STREAM_MAX_INPUT) {
                free(b);
                return tsr_err(err, TSR_ELIMIT, "stdin: more than %zu bytes", STREAM_MAX_INPUT);
            }
            cap *= 2;
            b = tsr_xrealloc(b, cap + 1);
        }
        ssize_t k = read(0, b + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            free(b);
            return tsr_err(err, TSR_EIO, "stdin: %s", strerror(errno));
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* The index dimension, from GetIndexStats. Returns 0 or 1 (printed). */
static int index_dims(const char *prog, tsr_cli_targets *ch, size_t *dims)
{
    Tessera__V1__GetIndexStatsRequest req = TESSERA__V1__GET_INDEX_STATS_REQUEST__INIT;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    int rc = 1;
    if (tsr_cli_call(ch, SVC "GetIndexStats", &req.base,
                     &tessera__v1__get_index_stats_response__descriptor, 10000, 0, &out,
                     &res) != TSR_RPC_OK) {
        tsr_cli_targets_failure(ch, "GetIndexStats", &res);
    } else {
        Tessera__V1__GetIndexStatsResponse *st = (Tessera__V1__GetIndexStatsResponse *)out;
        if (st->dimensions <= 0) {
            fprintf(stderr, "%s: %s reports no index dimension\n", prog,
                    tsr_cli_targets_current(ch));
        } else {
            *dims = (size_t)st->dimensions;
            rc = 0;
        }
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    return rc;
}

/* ------------------------------------------------------------------ upsert */

#undef PROG
#define PROG "tessera upsert"

static void upsert_usage(FILE *f)
{
    fprintf(f, "usage: tessera upsert --target ADDR (--json FILE | --json -) [--per-call N]\n"
               "                      [--tls-ca FILE ...] [--token-file FILE]\n"
               "  Upserts datapoints into the served index at once (UpsertDatapoints): visible to\n"
               "  every later query once acknowledged, durable on the coordinator and the shards.\n"
               "  --json FILE            JSON lines in the batch record format (\"-\" = stdin):\n"
               "                         {\"id\": \"a\", \"embedding\": [...], \"restricts\": [...],\n"
               "                         \"numeric_restricts\": [...], \"crowding_tag\": \"t\",\n"
               "                         \"sparse_embedding\": {...}, \"embedding_metadata\": {...}};\n"
               "                         every line is checked as a batch record before\n"
               "                         anything is sent\n"
               "  --per-call N           records per request (1..10000, default 500); each request\n"
               "                         is all or nothing and acknowledged before the next\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 all upserted, 1 an invalid line (nothing sent) or a refused\n"
               "request (the requests before it are written), 2 usage error.\n");
}

/* Sends records [from, to) in one request. Returns 0 or 1 (printed). */
static int send_upsert(tsr_cli_targets *ch, const recs *r, size_t from, size_t to,
                       int64_t *version, int64_t *seq)
{
    size_t n = to - from;
    tsr_pb_datapoint *pb = tsr_xcalloc(n, sizeof *pb);
    Tessera__V1__IndexDatapoint **dps = tsr_xcalloc(n, sizeof *dps);
    for (size_t i = 0; i < n; i++) {
        tsr_pb_datapoint_set(&pb[i], &r->dp[from + i]);
        dps[i] = &pb[i].dp;
    }
    Tessera__V1__UpsertDatapointsRequest req = TESSERA__V1__UPSERT_DATAPOINTS_REQUEST__INIT;
    req.datapoints = dps;
    req.n_datapoints = n;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    int rc = 0;
    if (tsr_cli_call(ch, SVC "UpsertDatapoints", &req.base,
                     &tessera__v1__upsert_datapoints_response__descriptor, 60000, TSR_CLI_WRITE,
                     &out, &res) != TSR_RPC_OK) {
        char what[96];
        snprintf(what, sizeof what, "UpsertDatapoints of lines %llu..%llu",
                 (unsigned long long)r->line[from], (unsigned long long)r->line[to - 1]);
        tsr_cli_targets_failure(ch, what, &res);
        rc = 1;
    } else {
        Tessera__V1__UpsertDatapointsResponse *u = (Tessera__V1__UpsertDatapointsResponse *)out;
        *version = u->version;
        *seq = u->stream_seq;
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    for (size_t i = 0; i < n; i++)
        tsr_pb_datapoint_free(&pb[i]);
    free(pb);
    free(dps);
    return rc;
}

/* Reads and checks every line of the input into r. Returns 0 or 1 (printed). */
static int load_input(const char *json, size_t dims, recs *r)
{
    tsr_error err = TSR_ERROR_INIT;
    char *data = NULL;
    size_t len = 0;
    int rc = strcmp(json, "-") == 0 ? read_stdin(&data, &len, &err)
                                    : tsr_file_read(json, STREAM_MAX_INPUT, 0, &data, &len, &err);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return 1;
    }
    tsr_record_sink sink = {r, on_record, on_invalid, NULL};
    rc = tsr_batch_json_read_mem(data, len, dims, &sink, &err);
    free(data);
    if (rc) {
        fprintf(stderr, PROG ": %s: %s\n", r->name, err.msg);
        return 1;
    }
    if (r->bad) {
        fprintf(stderr, PROG ": %s: %llu invalid line(s)%s; nothing was sent\n", r->name,
                (unsigned long long)r->bad, r->bad > 20 ? " (the first 20 shown)" : "");
        return 1;
    }
    return 0;
}

int tsr_cmd_upsert(int argc, char **argv)
{
    const char *target = NULL, *json = NULL;
    int per_call = 500;
    tsr_cli_tls tls = {0};
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--json", TSR_CMDLINE_STR, &json, 0, 0, 1},
        {"--per-call", TSR_CMDLINE_INT, &per_call, 1, MAX_PER_CALL, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], upsert_usage, 0,
                                   argc, argv, NULL);
    if (code >= 0)
        return code;
    int rc = 1;
    tsr_cli_targets *ch = tsr_cli_targets_open(PROG, target, &tls, &rc);
    if (ch == NULL)
        return rc;
    recs r = {.prog = PROG, .name = strcmp(json, "-") == 0 ? "stdin" : json};
    size_t dims = 0;
    int64_t version = 0, seq = 0;
    size_t sent = 0;
    rc = index_dims(PROG, ch, &dims);
    if (rc == 0)
        rc = load_input(json, dims, &r);
    for (size_t i = 0; rc == 0 && i < r.n; i += (size_t)per_call) {
        size_t to = i + (size_t)per_call < r.n ? i + (size_t)per_call : r.n;
        rc = send_upsert(ch, &r, i, to, &version, &seq);
        if (rc == 0)
            sent = to;
    }
    if (rc == 0)
        printf("upserted %zu datapoint%s (version %lld, stream seq %lld)\n", sent,
               sent == 1 ? "" : "s", (long long)version, (long long)seq);
    else if (sent)
        fprintf(stderr, PROG ": %zu datapoint(s) of lines before the refused request were "
                "upserted\n", sent);
    for (size_t i = 0; i < r.n; i++)
        tsr_datapoint_close(&r.dp[i]);
    free(r.dp);
    free(r.line);
    tsr_cli_targets_close(ch);
    return rc;
}

/* ------------------------------------------------------------------ remove */

#undef PROG
#define PROG "tessera remove"

static void remove_usage(FILE *f)
{
    fprintf(f, "usage: tessera remove --target ADDR [--tls-ca FILE ...] [--token-file FILE] ID...\n"
               "  Removes datapoints from the served index at once (RemoveDatapoints): no later\n"
               "  query returns them. An id the index does not hold is counted, not an error.\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 done (also for unknown ids), 1 refused or unreachable, 2 usage\n"
               "error.\n");
}

int tsr_cmd_remove(int argc, char **argv)
{
    int nids, rc;
    tsr_cli_targets *ch = tsr_cli_open_ids(PROG, remove_usage, argc, argv, &nids, &rc);
    if (ch == NULL)
        return rc;
    int64_t removed = 0, unknown = 0, version = 0, seq = 0;
    rc = 0;
    for (size_t i = 0; rc == 0 && i < (size_t)nids; i += MAX_PER_CALL) {
        Tessera__V1__RemoveDatapointsRequest req = TESSERA__V1__REMOVE_DATAPOINTS_REQUEST__INIT;
        req.datapoint_ids = argv + 1 + i;
        req.n_datapoint_ids = (size_t)nids - i < MAX_PER_CALL ? (size_t)nids - i : MAX_PER_CALL;
        tsr_rpc_result res;
        tsr_rpc_result_init(&res);
        ProtobufCMessage *out = NULL;
        if (tsr_cli_call(ch, SVC "RemoveDatapoints", &req.base,
                         &tessera__v1__remove_datapoints_response__descriptor, 60000,
                         TSR_CLI_WRITE, &out, &res) != TSR_RPC_OK) {
            tsr_cli_targets_failure(ch, "RemoveDatapoints", &res);
            rc = 1;
        } else {
            Tessera__V1__RemoveDatapointsResponse *m = (Tessera__V1__RemoveDatapointsResponse *)out;
            removed += m->removed;
            unknown += m->unknown;
            version = m->version;
            seq = m->stream_seq;
            protobuf_c_message_free_unpacked(out, NULL);
        }
        tsr_rpc_result_close(&res);
    }
    if (rc == 0)
        printf("removed %lld, unknown %lld (version %lld, stream seq %lld)\n",
               (long long)removed, (long long)unknown, (long long)version, (long long)seq);
    tsr_cli_targets_close(ch);
    return rc;
}
