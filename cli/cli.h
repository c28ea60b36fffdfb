/*
 * cli — shared declarations of the `tessera` command-line tool. Each command lives in
 * its own cmd_*.c and is reached from the table in main.c. A command returns the
 * process exit code: 0 success, 1 failure (bad input, rejected batch), 2 usage error.
 *
 * Conventions of every command: options are parsed with tsr_cmdline_parse_spec (brief
 * usage errors: one line naming the flag, then a pointer to --help); every message
 * starts with "tessera <command>: " (e.g. "tessera index search: ", "tessera query: ");
 * --help ends with the exit codes.
 */
#ifndef TSR_CLI_H
#define TSR_CLI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

int tsr_cmd_index_build(int argc, char **argv);
int tsr_cmd_index_search(int argc, char **argv);
int tsr_cmd_index_check(int argc, char **argv);
int tsr_cmd_index_info(int argc, char **argv);
int tsr_cmd_index_rewrite(int argc, char **argv);
int tsr_cmd_batch_inspect(int argc, char **argv);
int tsr_cmd_query(int argc, char **argv);
int tsr_cmd_update(int argc, char **argv);
int tsr_cmd_read(int argc, char **argv);
int tsr_cmd_stats(int argc, char **argv);
int tsr_cmd_health(int argc, char **argv);
int tsr_cmd_shards_add(int argc, char **argv);    /* cmd_shards.c (docs/resharding.md) */
int tsr_cmd_shards_remove(int argc, char **argv);
int tsr_cmd_cluster_up(int argc, char **argv);
/* `tessera __cluster-child PPID EXE ARGS...`: how cluster up runs its etcd members (own
 * process group, killed with the supervisor; cmd_cluster.c). Not a user command. */
#define TSR_CLUSTER_CHILD_CMD "__cluster-child"
int tsr_cluster_exec_child(int argc, char **argv);

/* Writes a JSON batch report and a newline to path (created or truncated, fsynced), as
 * `batch inspect --report` and `update --report` do; on failure prints
 * "PROG: cannot write the report: PATH: why" and returns -1. (cmd_batch.c) */
int tsr_cli_write_report(const char *prog, const char *path, const char *json);

/* batch_summary.c: the default output of `tessera batch inspect` (records by kind, dense
 * and sparse dimensions, token and numeric namespaces seen, crowding tags, metadata) of the
 * batch read from root; accepted = 0 says the counts are of a rejected batch's valid
 * records. */
struct tsr_batch;
void tsr_cli_batch_summary(FILE *f, const struct tsr_batch *b, const char *root, size_t dims,
                           int accepted);

/* cli_metadata.c: a google.protobuf.Struct (a datapoint's embedding_metadata; NULL = {})
 * as a JSON object, new reference; tsr_cli_metadata_json takes it serialized in
 * data[0..len) and returns NULL when it does not parse. */
struct Google__Protobuf__Struct;
json_t *tsr_cli_struct_json(const struct Google__Protobuf__Struct *s);
json_t *tsr_cli_metadata_json(const uint8_t *data, size_t len);

/* cluster_check.c: the checks of `tessera cluster up` (see the file comment there). */
#include <stddef.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
struct tsr_rpc_client_opts;
/* 0 when a server could bind host:port now; -1 with the reason in why otherwise. */
int tsr_cluster_port_free(const char *host, int port, char *why, size_t whylen);
/* 1 when another process holds dir/LOCK (a running coordinator or shard), else 0. */
int tsr_cluster_dir_locked(const char *dir);
/* 1 when target answers grpc.health.v1.Health/Check(service) SERVING within timeout_ms. */
int tsr_cluster_health(const char *target, const char *service,
                       const struct tsr_rpc_client_opts *opts, int timeout_ms);
/* Size of a file (0 when missing): where this run's lines of a log begin. */
long tsr_cluster_log_size(const char *path);
/* Prints the last nlines lines written to path after offset off, each after prefix. */
void tsr_cluster_print_log_tail(FILE *f, const char *prefix, const char *path, long off,
                                int nlines);

/* cluster_config.c: the coordinator config of `tessera cluster up`. The flags that write
 * it; 0 / NULL = not given (the ones given must agree with a kept or --config file). */
typedef struct tsr_cluster_flags {
    int port, shards, port_given, shards_given;
    int dims, nlist, pq_m, nprobe;
    const char *distance;
} tsr_cluster_flags;
/* Sets port_given / shards_given and the defaults of port (7000) and shards (4). */
void tsr_cluster_flags_defaults(tsr_cluster_flags *f);
/* Creates DIR and DIR/logs and names the config in cfg: --config, or DIR/coordinator.json
 * (written from the flags when absent). A kept DIR/coordinator.json must name the shards
 * 127.0.0.1:P+1..P+S; every index flag given must agree with the config. 0, or 1 after
 * saying which flag contradicts what and what to do. */
int tsr_cluster_prepare_config(const char *data, const char *config, char *cfg, size_t cfglen,
                               const tsr_cluster_flags *f);
/* The absolute path of DIR/peer-token in path: made (random, mode 0600) when absent; one
 * kept from an earlier run must be the caller's regular file with mode 0600. 0, or 1
 * after saying why not. */
int tsr_cluster_peer_token(const char *data, char *path, size_t cap);
/* A DIR holding etcd members' data (DIR/etcd-0..M-1) must run with --etcd-local M, and
 * one whose coordinator served without etcd (DIR/coordinator) without it. 0, or 1 after
 * saying which. */
int tsr_cluster_check_layout(const char *data, int netcd);

/* cluster_groups.c: shard groups added to a running `cluster up` (see the file comment). */
enum { TSR_CLUSTER_MAX_GROUPS = 32 };
typedef struct tsr_cluster_group {
    char name[32]; /* "shard-N": its data is DIR/shard-N */
    int port;      /* 127.0.0.1:port */
} tsr_cluster_group;
/* Reads DIR/groups.json into g[0..cap): the count (0 when the file is absent), or -1 after
 * saying what is wrong with it. */
int tsr_cluster_groups_read(const char *data, tsr_cluster_group *g, int cap);
/* Writes DIR/cluster-up.json: this process (the supervisor), the coordinator's port, the
 * config's shard count and the first port past the cluster's layout. 0 or -1 (said). */
int tsr_cluster_state_write(const char *data, int port, int shards, int next_port);
int tsr_cmd_cluster_add_group(int argc, char **argv);

/* ---- cmd_online.c and targets.c: what every online command (query, update, read, stats, health,
 * upsert, remove) shares ---- */
#include "core/cmdline.h"
#include "net/rpc.h"

/* --tls-* and --token-file flags of every online command */
typedef struct tsr_cli_tls {
    const char *ca, *cert, *key, *name;
    const char *token_file;
} tsr_cli_tls;
#define TSR_CLI_TLS_OPTS(t)                                                                        \
    {"--tls-ca", TSR_CMDLINE_STR, &(t).ca, 0, 0, 0},                                      \
        {"--tls-cert", TSR_CMDLINE_STR, &(t).cert, 0, 0, 0},                              \
        {"--tls-key", TSR_CMDLINE_STR, &(t).key, 0, 0, 0},                                \
        {"--tls-server-name", TSR_CMDLINE_STR, &(t).name, 0, 0, 0},                       \
        {"--token-file", TSR_CMDLINE_STR, &(t).token_file, 0, 0, 0}
/* The port of a --target that names none ("localhost"), as `cluster up`'s --port. */
#define TSR_CLI_DEFAULT_PORT 7000
#define TSR_CLI_TLS_USAGE                                                                          \
    "  --target HOST          without :PORT means HOST:7000 (cluster up's default port)\n"  \
    "  --target A,B,...       several coordinators of one index: a call that fails with\n"  \
    "                         UNAVAILABLE or DEADLINE_EXCEEDED is tried on the next; a write\n" \
    "                         goes to the leader a follower names (docs/ha.md)\n"              \
    "  --tls-ca FILE          use TLS, trusting this CA (PEM) for the coordinator's certificate\n" \
    "  --tls-cert FILE --tls-key FILE  client certificate (coordinator with mutual TLS)\n"       \
    "  --tls-server-name N    name to check in the certificate instead of ADDR's host\n" \
    "  --token-file FILE      send the bare token in FILE as \"authorization: Bearer\" (a\n"  \
    "                         coordinator with --auth-tokens; env TSR_TOKEN_FILE)\n"

/* Parses an online command's flags; max_args positional arguments go to argv[1..*nargs]
 * (-1: any number). Returns -1 to go on, else the exit code (0 after --help, 2 usage
 * error). */
int tsr_cli_parse_flags(const char *prog, const tsr_cmdline_opt *opts, size_t n,
                        void (*usage)(FILE *), int max_args, int argc, char **argv, int *nargs);
/* (targets.c) Opens the channel to target with the TLS / token flags. Returns NULL on failure with
 * *code = 2 (TLS flags or files are wrong: a usage error) or 1. TSR_TLS_CA /
 * TSR_TLS_SERVER_NAME / TSR_TOKEN_FILE stand in for the flags when those are not given. */
tsr_rpc_channel *tsr_cli_connect(const char *prog, const char *target, const tsr_cli_tls *t,
                                 int *code);
/* "PROG: WHAT on TARGET failed: CODE: message" on stderr. */
void tsr_cli_rpc_failure(const char *prog, const char *what, const char *target,
                         const tsr_rpc_result *res);

/* ---- targets.c: `--target A,B,...`, the coordinators of an online command and the calls
 * that fail over between them (see the file comment there and docs/ha.md) ---- */
typedef struct tsr_cli_targets tsr_cli_targets;
/* Opens a channel to every address of list (comma-separated host:port). NULL on failure
 * with *code = 2 (an empty entry, TLS flags) or 1, said on stderr. */
tsr_cli_targets *tsr_cli_targets_open(const char *prog, const char *list, const tsr_cli_tls *t,
                                      int *code);
void tsr_cli_targets_close(tsr_cli_targets *t); /* accepts NULL */
/* (cmd_online.c) For `--target ADDR [TLS and token flags] [--] ID...` (read, remove):
 * parses the flags, the ids go to argv[1..*nids] (at least one), and opens the targets.
 * NULL with the exit code in *code after --help (0), a usage error (2, also for no ID) or
 * a failure to open (tsr_cli_targets_open's 1 or 2). */
tsr_cli_targets *tsr_cli_open_ids(const char *prog, void (*usage)(FILE *), int argc,
                                  char **argv, int *nids, int *code);
/* The target the next call starts on: the last one that answered (borrowed). */
const char *tsr_cli_targets_current(const tsr_cli_targets *t);
size_t tsr_cli_targets_count(const tsr_cli_targets *t);
/* The next call starts on addr when it is in the list (else nothing changes). */
void tsr_cli_targets_select(tsr_cli_targets *t, const char *addr);
#define TSR_CLI_WRITE 1 /* a write: follow "not the leader: the leader is ADDR", wait for
                           an election ("no leader elected yet") up to timeout_ms */
/* tsr_rpc_call_pb on the current target, failing over to the next ones on UNAVAILABLE or
 * DEADLINE_EXCEEDED (each target at most once, timeout_ms per try). Returns res->code; on
 * OK *out is the reply (caller frees). On failure res is the last target's answer and
 * tsr_cli_targets_current names that target. */
int tsr_cli_call(tsr_cli_targets *t, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, int flags,
                 ProtobufCMessage **out, tsr_rpc_result *res);
/* "PROG: WHAT on TARGET failed: CODE: message" (TARGET: the last one tried, followed by
 * "(tried all N)" when the list has several). */
void tsr_cli_targets_failure(const tsr_cli_targets *t, const char *what,
                             const tsr_rpc_result *res);

/* cmd_stream.c: `tessera upsert`, `tessera remove` (streamed writes). */
int tsr_cmd_upsert(int argc, char **argv);
int tsr_cmd_remove(int argc, char **argv);

#endif
