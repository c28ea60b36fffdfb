/*
 * main — `tessera`: dispatches `tessera <group> [<command>] ...` to the cmd_* modules.
 * Every command parses its own options (core/cmdline.h) and prints its own --help; here
 * are only the top level (--help, --version, `help [GROUP [COMMAND]]`) and the usage of
 * a group given without its command (`tessera index`).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/log.h"
#include "core/version.h"

typedef struct {
    const char *group;
    const char *name; /* NULL: the group is the command (`tessera query`) */
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"index", "build", tsr_cmd_index_build, "train an IVFPQ index and write a Faiss IwPQ file"},
    {"index", "search", tsr_cmd_index_search, "search a Faiss IwPQ/IwQR file with fvecs queries"},
    {"index", "check", tsr_cmd_index_check, "validate a Faiss index file (exit 0 valid, 1 not)"},
    {"index", "info", tsr_cmd_index_info, "describe a Faiss index file as one JSON object"},
    {"index", "rewrite", tsr_cmd_index_rewrite, "read a Faiss index file and write it back"},
    {"batch", "inspect", tsr_cmd_batch_inspect, "validate a Vertex-format batch_root and summarize it (--records: print it)"},
    {"query", NULL, tsr_cmd_query, "find neighbors through a running coordinator"},
    {"update", NULL, tsr_cmd_update, "apply a batch_root as a new index version"},
    {"read", NULL, tsr_cmd_read, "read stored datapoints by id"},
    {"upsert", NULL, tsr_cmd_upsert, "upsert JSON-lines datapoints at once (streamed write)"},
    {"remove", NULL, tsr_cmd_remove, "remove datapoints by id at once (streamed write)"},
    {"stats", NULL, tsr_cmd_stats, "index and shard statistics"},
    {"shards", "add", tsr_cmd_shards_add,
     "add a shard group to a running index; lists move to it online"},
    {"shards", "remove", tsr_cmd_shards_remove,
     "remove a shard group; its lists move to the others online"},
    {"health", NULL, tsr_cmd_health, "grpc.health.v1 check of a coordinator or shard (a probe)"},
    {"cluster", "up", tsr_cmd_cluster_up,
     "run a local cluster, supervised (--coordinators N --etcd-local M: HA)"},
    {"cluster", "add-group", tsr_cmd_cluster_add_group,
     "add a shard group to a running `cluster up`, supervised and kept across restarts"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static int is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera <group> [<command>] [options]\n"
               "       tessera help [<group> [<command>]]   (= tessera <group> <command> --help)\n"
               "       tessera --version\n\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-7s %-10s %s\n", commands[i].group, commands[i].name ? commands[i].name : "",
                commands[i].summary);
    fprintf(f, "\nExit status: 0 success, 1 failure (see each command's --help), 2 usage error.\n");
}

/* The commands of a group with subcommands (`tessera index`). */
static void group_usage(FILE *f, const char *group)
{
    fprintf(f, "usage: tessera %s <command> [options]   (tessera %s <command> --help)\n\n", group,
            group);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].group, group) == 0)
            fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

/* The command named by words[0..n) (group, then command for grouped ones), or NULL.
 * *group_only is set when words[0] is a group that needs a command and words[1] is
 * missing. */
static const command *find(int n, char **words, int *group_only)
{
    *group_only = 0;
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const command *c = &commands[i];
        if (n < 1 || strcmp(words[0], c->group) != 0)
            continue;
        if (c->name == NULL)
            return c;
        if (n < 2 || is_help(words[1])) {
            *group_only = 1;
            return NULL;
        }
        if (strcmp(words[1], c->name) == 0)
            return c;
    }
    return NULL;
}

/* Edit distance of a and b (Levenshtein), for "did you mean"; capped at 9. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[32];
    if (la >= 31 || lb >= 31)
        return 9;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* The unknown word only (what follows it are its options: `tessera querry --target` is
 * about 'querry'), with the nearest command when one is close. */
static int unknown(int n, char **words)
{
    int grouped = 0; /* words[0] is a group with commands: the unknown word is words[1] */
    for (size_t i = 0; i < NCOMMANDS; i++)
        grouped |= commands[i].name != NULL && strcmp(words[0], commands[i].group) == 0;
    const char *word = grouped && n >= 2 ? words[1] : words[0], *near = NULL;
    int best = strlen(word) > 3 ? 3 : 2;
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const char *cand = grouped ? commands[i].name : commands[i].group;
        if (cand == NULL || (grouped && strcmp(commands[i].group, words[0]) != 0))
            continue;
        int d = edit_distance(word, cand);
        if (d < best) {
            best = d;
            near = cand;
        }
    }
    fprintf(stderr, "tessera: unknown command '%s%s%s'", grouped ? words[0] : "",
            grouped ? " " : "", word);
    if (near)
        fprintf(stderr, "; did you mean '%s%s%s'?", grouped ? words[0] : "", grouped ? " " : "",
                near);
    fprintf(stderr, " (see 'tessera %s%s--help')\n", grouped ? words[0] : "", grouped ? " " : "");
    return 2;
}

/* `tessera help [GROUP [COMMAND]]`: the usage of the tool, a group or a command. */
static int help(int n, char **words)
{
    if (n == 0) {
        usage(stdout);
        return 0;
    }
    int group_only;
    const command *c = find(n, words, &group_only);
    if (group_only) {
        group_usage(stdout, words[0]);
        return 0;
    }
    if (c == NULL)
        return unknown(n, words);
    char *argv[] = {words[c->name ? 1 : 0], "--help", NULL};
    return c->fn(2, argv);
}

int main(int argc, char **argv)
{
    tsr_log_set_program("tessera");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("tessera %s\n", TSR_VERSION);
        return 0;
    }
    if (strcmp(argv[1], TSR_CLUSTER_CHILD_CMD) == 0)
        return tsr_cluster_exec_child(argc - 1, argv + 1);
    if (strcmp(argv[1], "help") == 0)
        return help(argc - 2, argv + 2);
    int group_only;
    const command *c = find(argc - 1, argv + 1, &group_only);
    if (group_only) { /* `tessera index` is a usage error, `tessera index --help` is not */
        int asked = argc >= 3 && is_help(argv[2]);
        group_usage(asked ? stdout : stderr, argv[1]);
        return asked ? 0 : 2;
    }
    if (c == NULL)
        return unknown(argc - 1, argv + 1);
    return c->name ? c->fn(argc - 2, argv + 2) : c->fn(argc - 1, argv + 1);
}
