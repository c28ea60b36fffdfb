/*
 * cmd_shards — `tessera shards add` and `tessera shards remove`: grow or shrink a running
 * cluster by one shard group (tessera.v1 AddShardGroup / RemoveShardGroup,
 * docs/resharding.md). Both start an operation on the coordinator and follow it with
 * GetOperation until it ends: on a terminal one progress line (lists and bytes moved,
 * percent, shard steps) is rewritten in place; the end prints the outcome and the version.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/clock.h"
#include "core/mem.h"
#include "tessera/v1/tessera.pb-c.h"

#define SVC "/tessera.v1.VectorSearch/"

static void add_usage(FILE *f)
{
    fprintf(f, "usage: tessera shards add --target ADDR --group ADDR[,ADDR...] [--timeout-s S]\n"
               "                          [--tls-ca FILE ...] [--token-file FILE]\n"
               "  Adds a shard group while the index serves (AddShardGroup): the new group's\n"
               "  replicas (running tessera-shard processes with an empty --data) get the lists\n"
               "  that rebalance the index (vectors per group within 10 %% of the mean when the\n"
               "  lists allow), moved as one two-phase version; queries never fail meanwhile.\n"
               "  --group ADDR[,ADDR...]  the new group's replicas (host:port, 1..16)\n"
               "  --timeout-s S           give up waiting after S seconds (default 3600; the\n"
               "                          move goes on)\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 moved, 1 failed (nothing changed), 2 usage error.\n");
}

static void remove_usage(FILE *f)
{
    fprintf(f, "usage: tessera shards remove --target ADDR --group N [--timeout-s S]\n"
               "                             [--tls-ca FILE ...] [--token-file FILE]\n"
               "  Removes shard group N (a number of `tessera stats`) while the index serves\n"
               "  (RemoveShardGroup): its lists move to the other groups, least loaded first;\n"
               "  once it ends the group's processes may be stopped.\n"
               "  --group N               the group to remove\n"
               "  --timeout-s S           give up waiting after S seconds (default 3600)\n"
               TSR_CLI_TLS_USAGE
               "Exit status: 0 removed, 1 failed (nothing changed), 2 usage error.\n");
}

static const char *state_name(Tessera__V1__Operation__State s)
{
    static const char *n[] = {"UNSPECIFIED", "PENDING", "READING", "STAGING", "PREPARING",
                              "COMMITTING", "SUCCEEDED", "REJECTED", "FAILED"};
    return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "?";
}

/* Follows operation opid until it ends or timeout_s passes. Returns the exit status. */
static int follow(const char *prog, tsr_cli_targets *ch, const char *opid, int64_t timeout_s)
{
    int tty = isatty(2), rc = 1;
    int64_t t_end = tsr_clock_mono_ms() + timeout_s * 1000;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    for (;;) {
        Tessera__V1__GetOperationRequest g = TESSERA__V1__GET_OPERATION_REQUEST__INIT;
        g.operation_id = (char *)opid;
        ProtobufCMessage *out = NULL;
        if (tsr_cli_call(ch, SVC "GetOperation", &g.base, &tessera__v1__operation__descriptor,
                         10000, 0, &out, &res) != TSR_RPC_OK) {
            int transient = res.code == TSR_RPC_UNAVAILABLE ||
                            res.code == TSR_RPC_DEADLINE_EXCEEDED;
            if (!transient || tsr_clock_mono_ms() > t_end) {
                tsr_cli_targets_failure(ch, "GetOperation", &res);
                break;
            }
            tsr_rpc_result_close(&res);
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        const Tessera__V1__Operation *op = (Tessera__V1__Operation *)out;
        int done = op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED ||
                   op->state == TESSERA__V1__OPERATION__STATE__REJECTED ||
                   op->state == TESSERA__V1__OPERATION__STATE__FAILED;
        const Tessera__V1__OperationProgress *p = op->progress;
        if (tty && p) {
            double pct = p->lists_total ? 100.0 * (double)p->lists_moved /
                                              (double)p->lists_total : done ? 100.0 : 0.0;
            fprintf(stderr, "\r%-10s lists %lld/%lld (%.0f%%)  datapoints %lld  %.1f MB  "
                    "shards staged %d/%d prepared %d committed %d   ", state_name(op->state),
                    (long long)p->lists_moved, (long long)p->lists_total, pct,
                    (long long)p->datapoints_moved, (double)p->bytes_moved / 1e6,
                    p->shards_staged, p->shards_total, p->shards_prepared,
                    p->shards_committed);
            if (done)
                fputc('\n', stderr);
        }
        if (done) {
            if (op->state == TESSERA__V1__OPERATION__STATE__SUCCEEDED) {
                printf("%s: %s succeeded: version %lld, %lld lists (%lld datapoints, %lld "
                       "bytes) moved\n", prog, opid, (long long)op->version,
                       p ? (long long)p->lists_total : 0,
                       p ? (long long)p->datapoints_moved : 0,
                       p ? (long long)p->bytes_moved : 0);
                rc = 0;
            } else {
                fprintf(stderr, "%s: %s %s: %s\n", prog, opid, state_name(op->state),
                        op->error ? op->error : "");
            }
            for (size_t i = 0; i < op->n_warnings; i++)
                fprintf(stderr, "%s: warning: %s\n", prog, op->warnings[i]);
            protobuf_c_message_free_unpacked(out, NULL);
            break;
        }
        protobuf_c_message_free_unpacked(out, NULL);
        if (tsr_clock_mono_ms() > t_end) {
            fprintf(stderr, "%s: %s still running after %lld s\n", prog, opid,
                    (long long)timeout_s);
            break;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    tsr_rpc_result_close(&res);
    return rc;
}

/* Sends the request (AddShardGroup or RemoveShardGroup) and follows its operation. */
static int run(const char *prog, const char *target, const tsr_cli_tls *tls, const char *method,
               const ProtobufCMessage *req, int64_t timeout_s)
{
    int rc = 1;
    tsr_cli_targets *ch = tsr_cli_targets_open(prog, target, tls, &rc);
    if (ch == NULL)
        return rc;
    rc = 1;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    char m[128];
    snprintf(m, sizeof m, SVC "%s", method);
    if (tsr_cli_call(ch, m, req, &tessera__v1__reshard_response__descriptor, 30000,
                     TSR_CLI_WRITE, &out, &res) != TSR_RPC_OK) {
        tsr_cli_targets_failure(ch, method, &res);
    } else {
        const Tessera__V1__ReshardResponse *r = (Tessera__V1__ReshardResponse *)out;
        fprintf(stderr, "%s: operation %s (group %u)\n", prog, r->operation_id, r->group);
        char *opid = tsr_xstrdup(r->operation_id);
        protobuf_c_message_free_unpacked(out, NULL);
        rc = follow(prog, ch, opid, timeout_s);
        free(opid);
    }
    tsr_rpc_result_close(&res);
    tsr_cli_targets_close(ch);
    return rc;
}

int tsr_cmd_shards_add(int argc, char **argv)
{
    const char *prog = "tessera shards add", *target = NULL, *group = NULL;
    tsr_cli_tls tls = {0};
    int64_t timeout_s = 3600;
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--group", TSR_CMDLINE_STR, &group, 0, 0, 1},
        {"--timeout-s", TSR_CMDLINE_INT64, &timeout_s, 0, 31536000, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(prog, opts, sizeof opts / sizeof opts[0], add_usage, 0, argc,
                                   argv, NULL);
    if (code >= 0)
        return code;
    char *list = tsr_xstrdup(group), *save = NULL;
    char *addrs[16];
    size_t n = 0;
    int bad = 0;
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (n == 16 || !strchr(a, ':')) {
            bad = 1;
            break;
        }
        addrs[n++] = a;
    }
    if (bad || n == 0) {
        fprintf(stderr, "%s: --group %s: expected 1..16 comma-separated host:port addresses\n",
                prog, group);
        free(list);
        return 2;
    }
    Tessera__V1__AddShardGroupRequest rq = TESSERA__V1__ADD_SHARD_GROUP_REQUEST__INIT;
    rq.replicas = addrs;
    rq.n_replicas = n;
    int rc = run(prog, target, &tls, "AddShardGroup", &rq.base, timeout_s);
    free(list);
    return rc;
}

int tsr_cmd_shards_remove(int argc, char **argv)
{
    const char *prog = "tessera shards remove", *target = NULL;
    tsr_cli_tls tls = {0};
    int group = -1;
    int64_t timeout_s = 3600;
    const tsr_cmdline_opt opts[] = {
        {"--target", TSR_CMDLINE_STR, &target, 0, 0, 1},
        {"--group", TSR_CMDLINE_INT, &group, 0, 255, 1},
        {"--timeout-s", TSR_CMDLINE_INT64, &timeout_s, 0, 31536000, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(prog, opts, sizeof opts / sizeof opts[0], remove_usage, 0,
                                   argc, argv, NULL);
    if (code >= 0)
        return code;
    Tessera__V1__RemoveShardGroupRequest rq = TESSERA__V1__REMOVE_SHARD_GROUP_REQUEST__INIT;
    rq.group = (uint32_t)group;
    return run(prog, target, &tls, "RemoveShardGroup", &rq.base, timeout_s);
}
