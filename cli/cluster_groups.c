/*
 * cluster_groups — shard groups added to a `tessera cluster up` cluster while it runs, kept
 * so that the supervisor starts them again on every later start (issue 41, item 4: a group
 * added with `tessera shards add` to processes the user ran by hand was not supervised;
 * after a restart the coordinator routed to it and, with that process down, every query
 * failed).
 *
 * Two files in the cluster's --data folder:
 *  - DIR/cluster-up.json, written by the running supervisor at start: its pid, the
 *    coordinator's port, the number of shards of the config and the first port past the
 *    cluster's layout; `tessera cluster add-group` reads it to find the running cluster;
 *  - DIR/groups.json, {"groups": [{"name": "shard-4", "port": 7005}, ...]}: the added
 *    groups (one replica each), appended by `tessera cluster add-group` (write to a
 *    temporary file, rename). The supervisor reads it at start (the groups start with the
 *    shards, before the coordinator) and polls it while it runs (cmd_cluster.c): a new
 *    entry is a new supervised tessera-shard on that port with data in DIR/<name>.
 *
 * `tessera cluster add-group --data DIR` puts one entry there, waits until the supervisor
 * started the process and it answers health (`tessera health --wait`), then calls
 * AddShardGroup through `tessera shards add`, which moves lists to it online. It composes
 * the two commands rather than repeating their calls.
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cli.h"

#define PROG "tessera cluster add-group"

int tsr_cluster_groups_read(const char *data, tsr_cluster_group *g, int cap)
{
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/groups.json", data);
    if (access(path, F_OK) != 0)
        return 0;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *arr = json_object_get(root, "groups");
    if (!json_is_array(arr)) {
        fprintf(stderr, "tessera cluster: %s: %s (line %d): expected {\"groups\": [{\"name\": "
                        "..., \"port\": ...}]}\n", path, root ? "no \"groups\" array" : jerr.text,
                jerr.line);
        json_decref(root);
        return -1;
    }
    int n = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        json_int_t port = json_integer_value(json_object_get(e, "port"));
        if (name == NULL || strncmp(name, "shard-", 6) != 0 || strlen(name) >= sizeof g->name ||
            strchr(name, '/') || port < 1 || port > 65535 || n == cap) {
            fprintf(stderr, "tessera cluster: %s: group %zu: expected {\"name\": \"shard-N\", "
                            "\"port\": 1..65535}%s\n", path, i,
                    n == cap ? " (too many groups)" : "");
            json_decref(root);
            return -1;
        }
        snprintf(g[n].name, sizeof g[n].name, "%s", name);
        g[n++].port = (int)port;
    }
    json_decref(root);
    return n;
}

int tsr_cluster_state_write(const char *data, int port, int shards, int next_port)
{
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/cluster-up.json", data);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "tessera cluster up: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"pid\": %ld, \"port\": %d, \"shards\": %d, \"next_port\": %d}\n",
            (long)getpid(), port, shards, next_port);
    return fclose(f) == 0 ? 0 : -1;
}

/* The running supervisor of data: 0 with its coordinator port, shards and next free
 * port, or 1 after saying why not. */
static int running_cluster(const char *data, int *port, int *shards, int *next_port)
{
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/cluster-up.json", data);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_int_t pid = json_integer_value(json_object_get(root, "pid"));
    *port = (int)json_integer_value(json_object_get(root, "port"));
    *shards = (int)json_integer_value(json_object_get(root, "shards"));
    *next_port = (int)json_integer_value(json_object_get(root, "next_port"));
    json_decref(root);
    if (root == NULL || pid <= 0 || kill((pid_t)pid, 0) != 0 || *port <= 0 || *next_port <= 0) {
        fprintf(stderr, PROG ": no `tessera cluster up` runs on --data %s (%s: %s): start it "
                        "first; it starts and keeps the new group's process\n", data, path,
                root == NULL ? jerr.text : pid > 0 && kill((pid_t)pid, 0) != 0
                                               ? "its process has ended" : "incomplete");
        return 1;
    }
    return 0;
}

/* Appends {name, port} to DIR/groups.json (temporary file, then rename). */
static int groups_append(const char *data, const tsr_cluster_group *g, int n,
                         const tsr_cluster_group *add)
{
    char path[4096 + 32], tmp[4096 + 48];
    snprintf(path, sizeof path, "%s/groups.json", data);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"groups\": [");
    for (int i = 0; i <= n; i++) {
        const tsr_cluster_group *e = i < n ? &g[i] : add;
        fprintf(f, "%s\n  {\"name\": \"%s\", \"port\": %d}", i ? "," : "", e->name, e->port);
    }
    fprintf(f, "\n]}\n");
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return 1;
    }
    return 0;
}

/* The new group's port: --port, else the first free one past the layout and the groups. */
static int pick_port(int want, int next_port, const tsr_cluster_group *g, int n)
{
    char why[128];
    if (want) {
        for (int i = 0; i < n; i++)
            if (g[i].port == want) {
                fprintf(stderr, PROG ": --port %d is %s's already\n", want, g[i].name);
                return -1;
            }
        if (tsr_cluster_port_free("127.0.0.1", want, why, sizeof why) != 0) {
            fprintf(stderr, PROG ": --port %d is in use: %s\n", want, why);
            return -1;
        }
        return want;
    }
    int p = next_port;
    for (int i = 0; i < n; i++)
        if (g[i].port >= p)
            p = g[i].port + 1;
    for (; p <= 65535 && p < next_port + 1000; p++)
        if (tsr_cluster_port_free("127.0.0.1", p, why, sizeof why) == 0)
            return p;
    fprintf(stderr, PROG ": no free port from %d on: pass --port\n", next_port);
    return -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera cluster add-group --data DIR [--port Q] [--timeout-s S]\n"
            "                                 [--tls-ca FILE ...] [--token-file FILE]\n"
            "  Adds one shard group (one tessera-shard) to the `tessera cluster up` running on\n"
            "  DIR, supervised by it: the group is written to DIR/groups.json, the supervisor\n"
            "  starts its process (data in DIR/shard-N, port Q, default the first free port past\n"
            "  the cluster's), and once it answers, AddShardGroup moves lists to it online\n"
            "  (`tessera shards add`, docs/resharding.md). Every later `cluster up` on DIR\n"
            "  starts it again with the other shards. A group removed with `tessera shards\n"
            "  remove` keeps its process until its entry is deleted from DIR/groups.json.\n"
            "  --timeout-s S  give up waiting for the move after S seconds (default 3600)\n"
            "  --tls-* / --token-file: as for `tessera shards add` (an admin token when the\n"
            "  cluster runs with --auth-tokens).\n"
            "Exit status: 0 added, 1 failed (the process stays supervised; retry with `tessera\n"
            "shards add --group 127.0.0.1:Q`), 2 usage error.\n");
}

/* argv of a command run in-process: words, then the TLS / token flags given. */
static int with_tls(char **v, int n, const tsr_cli_tls *t, int token)
{
    const char *pairs[][2] = {{"--tls-ca", t->ca},
                              {"--tls-cert", t->cert},
                              {"--tls-key", t->key},
                              {"--tls-server-name", t->name},
                              {"--token-file", token ? t->token_file : NULL}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (pairs[i][1]) {
            v[n++] = (char *)pairs[i][0];
            v[n++] = (char *)pairs[i][1];
        }
    v[n] = NULL;
    return n;
}

int tsr_cmd_cluster_add_group(int argc, char **argv)
{
    const char *data = NULL;
    int want_port = 0;
    int64_t timeout_s = 3600;
    tsr_cli_tls tls = {0};
    const tsr_cmdline_opt opts[] = {
        {"--data", TSR_CMDLINE_STR, &data, 0, 0, 1},
        {"--port", TSR_CMDLINE_INT, &want_port, 1, 65535, 0},
        {"--timeout-s", TSR_CMDLINE_INT64, &timeout_s, 0, 31536000, 0},
        TSR_CLI_TLS_OPTS(tls),
    };
    int code = tsr_cli_parse_flags(PROG, opts, sizeof opts / sizeof opts[0], usage, 0, argc,
                                   argv, NULL);
    if (code >= 0)
        return code;
    int port, shards, next_port;
    tsr_cluster_group g[TSR_CLUSTER_MAX_GROUPS];
    if (running_cluster(data, &port, &shards, &next_port) != 0)
        return 1;
    int n = tsr_cluster_groups_read(data, g, TSR_CLUSTER_MAX_GROUPS);
    if (n < 0)
        return 1;
    if (n == TSR_CLUSTER_MAX_GROUPS) {
        fprintf(stderr, PROG ": %s already has %d added groups, the most cluster up keeps\n",
                data, n);
        return 1;
    }
    tsr_cluster_group add;
    snprintf(add.name, sizeof add.name, "shard-%d", shards + n);
    if ((add.port = pick_port(want_port, next_port, g, n)) < 0)
        return 1;
    if (groups_append(data, g, n, &add) != 0)
        return 1;
    char addr[32], coord[32], ts[32], wait[16];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", add.port);
    snprintf(coord, sizeof coord, "127.0.0.1:%d", port);
    snprintf(ts, sizeof ts, "%lld", (long long)timeout_s);
    snprintf(wait, sizeof wait, "%d", 60);
    printf(PROG ": %s on %s written to %s/groups.json; cluster up starts it\n", add.name, addr,
           data);
    fflush(stdout);
    char *v[24] = {"health", "--target", addr, "--wait", wait, "--service", "tessera.v1.Shard"};
    int rc = tsr_cmd_health(with_tls(v, 7, &tls, 0), v);
    if (rc == 0) {
        char *s[24] = {"add", "--target", coord, "--group", addr, "--timeout-s", ts};
        rc = tsr_cmd_shards_add(with_tls(s, 7, &tls, 1), s);
    }
    if (rc != 0)
        fprintf(stderr, PROG ": %s was not added to the index; its process stays supervised "
                        "(%s/groups.json): retry with `tessera shards add --target %s --group "
                        "%s`\n", add.name, data, coord, addr);
    return rc;
}
