/*
 * main — `tessera`: dispatches `tessera <group> <command> ...` to the cmd_* modules.
 * Every command prints its own --help.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/log.h"

typedef struct {
    const char *group;
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"index", "build", tsr_cmd_index_build, "train an IVFPQ index and write a Faiss IwPQ file"},
    {"index", "search", tsr_cmd_index_search, "search a Faiss IwPQ/IwQR file with fvecs queries"},
    {"index", "check", tsr_cmd_index_check, "validate a Faiss index file (exit 0 valid, 1 not)"},
    {"index", "info", tsr_cmd_index_info, "describe a Faiss index file as one JSON object"},
    {"index", "rewrite", tsr_cmd_index_rewrite, "read a Faiss index file and write it back"},
    {"batch", "inspect", tsr_cmd_batch_inspect, "validate a Vertex-format batch_root and print it"},
    {"query", NULL, tsr_cmd_query, "find neighbors through a running coordinator"},
    {"update", NULL, tsr_cmd_update, "apply a batch_root as a new index version"},
    {"read", NULL, tsr_cmd_read, "read stored datapoints by id"},
    {"stats", NULL, tsr_cmd_stats, "index and shard statistics"},
    {"health", NULL, tsr_cmd_health, "grpc.health.v1 check of a coordinator or shard (a probe)"},
    {"cluster", "up", tsr_cmd_cluster_up, "run a local coordinator + shards (supervised)"},
};

int tsr_cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera <group> <command> [options]   (tessera <group> <command> --help)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-7s %-10s %s\n", commands[i].group, commands[i].name ? commands[i].name : "",
                commands[i].summary);
}

int main(int argc, char **argv)
{
    tsr_log_set_program("tessera");
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const command *c = &commands[i];
        if (strcmp(argv[1], c->group) != 0)
            continue;
        if (c->name == NULL)
            return c->fn(argc - 1, argv + 1);
        if (argc >= 3 && strcmp(argv[2], c->name) == 0)
            return c->fn(argc - 2, argv + 2);
    }
    fprintf(stderr, "tessera: unknown command '%s%s%s'\n", argv[1], argc >= 3 ? " " : "",
            argc >= 3 ? argv[2] : "");
    usage(stderr);
    return 2;
}
