/*
 * cluster_config — the coordinator config of `tessera cluster up` (cmd_cluster.c): written
 * from the flags into DIR/coordinator.json on a fresh --data, and on every later start
 * (or with --config FILE) checked against the flags given, so that no flag is ignored
 * silently: `--dimensions 128` on a folder whose kept coordinator.json says 64 stops the
 * start with a message naming the flag, both values and what to do, instead of starting
 * a 64-dimension cluster. The settings checked are the ones the flags write: dimensions,
 * distance, nlist, pq_m, nprobe, and the shard ports --port and --shards imply. With
 * --auth-tokens it also keeps DIR/peer-token (mode 0600), the token the coordinator sends
 * to its shards and the only one they accept (docs/security.md), made on the first run.
 * And a folder first run with --etcd-local M (its index state in etcd) must be started
 * with --etcd-local M again, one run without it must not get it.
 *
 * DESIGN: the config is read with jansson only to compare; the coordinator stays the one
 * judge of a config's validity (a file that does not parse is left to it when no flag
 * needs comparing, so its own error is what the user sees).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define PROG "tessera cluster up"

void tsr_cluster_flags_defaults(tsr_cluster_flags *f)
{
    f->port_given = f->port != 0;
    f->shards_given = f->shards != 0;
    if (!f->port)
        f->port = 7000;
    if (!f->shards)
        f->shards = 4;
}

static int write_default_config(const char *path, const tsr_cluster_flags *f)
{
    FILE *fp = fopen(path, "w");
    if (fp == NULL) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(fp, "{\n  \"dimensions\": %d,\n  \"distance\": \"%s\",\n  \"nlist\": %d,\n"
                "  \"pq_m\": %d,\n  \"pq_nbits\": 8,\n  \"nprobe\": %d,\n  \"shards\": [",
            f->dims ? f->dims : 64, f->distance ? f->distance : "SQUARED_L2",
            f->nlist ? f->nlist : 64, f->pq_m ? f->pq_m : 16, f->nprobe ? f->nprobe : 8);
    for (int i = 0; i < f->shards; i++)
        fprintf(fp, "%s\"127.0.0.1:%d\"", i ? ", " : "", f->port + 1 + i);
    fprintf(fp, "]\n}\n");
    return fclose(fp) == 0 ? 0 : -1;
}

/* The port of "127.0.0.1:N" (a one-replica group on loopback), else -1. */
static int loopback_port(const json_t *g)
{
    const char *s = json_string_value(g);
    int port;
    char end;
    if (s == NULL || sscanf(s, "127.0.0.1:%d%c", &port, &end) != 1)
        return -1;
    return port;
}

/* The kept "shards" must be exactly 127.0.0.1:P+1..P+S: one written for another --port or
 * --shards would send the coordinator to other processes' ports (maybe another
 * cluster's). 0, or 1 after saying which flags contradict it and what they should be. */
static int check_shard_ports(const char *cfg, const json_t *root, const tsr_cluster_flags *f)
{
    const json_t *sh = json_object_get(root, "shards");
    size_t n = json_array_size(sh);
    int first = n ? loopback_port(json_array_get(sh, 0)) : -1, consecutive = first > 1;
    for (size_t i = 0; i < n && consecutive; i++)
        consecutive = loopback_port(json_array_get(sh, i)) == first + (int)i;
    if (consecutive && first == f->port + 1 && (int)n == f->shards)
        return 0;
    fprintf(stderr, PROG ": --port %d%s --shards %d%s contradict %s (kept from an earlier run "
                    "on this --data), whose shards are ",
            f->port, f->port_given ? "" : " (the default)", f->shards,
            f->shards_given ? "" : " (the default)", cfg);
    if (consecutive)
        fprintf(stderr, "127.0.0.1:%d..%d: start with --port %d --shards %d, or use another "
                        "--data for a new cluster\n",
                first, first + (int)n - 1, first - 1, (int)n);
    else
        fprintf(stderr, "not the loopback ports 127.0.0.1:%d..%d: start with the --port and "
                        "--shards it was written for, or pass --config, or use another "
                        "--data\n",
                f->port + 1, f->port + f->shards);
    return 1;
}

/* One flag against the config's value: prints the contradiction and returns 1, else 0. */
static int contradicts_int(const char *cfg, const json_t *root, const char *key,
                           const char *flag, int given)
{
    if (!given)
        return 0;
    const json_t *v = json_object_get(root, key);
    if (json_is_integer(v) && json_integer_value(v) == given)
        return 0;
    if (v == NULL)
        fprintf(stderr, PROG ": %s %d: %s does not set %s (the coordinator's default "
                        "applies)\n", flag, given, cfg, key);
    else if (json_is_integer(v))
        fprintf(stderr, PROG ": %s %d contradicts %s, which says %s %lld\n", flag, given, cfg,
                key, (long long)json_integer_value(v));
    else
        fprintf(stderr, PROG ": %s %d contradicts %s, whose %s is not an integer\n", flag,
                given, cfg, key);
    return 1;
}

static int contradicts_distance(const char *cfg, const json_t *root, const char *given)
{
    if (!given)
        return 0;
    const char *v = json_string_value(json_object_get(root, "distance"));
    if (v && strcasecmp(v, given) == 0)
        return 0;
    fprintf(stderr, PROG ": --distance %s contradicts %s, which says distance %s\n", given,
            cfg, v ? v : "(not set: the coordinator's default)");
    return 1;
}

/* Every index flag given must agree with the config in use: 0, or 1 after saying which
 * ones do not and what to do. */
static int check_index_flags(const char *cfg, int kept, const json_t *root,
                             const tsr_cluster_flags *f)
{
    int bad = contradicts_int(cfg, root, "dimensions", "--dimensions", f->dims);
    bad += contradicts_distance(cfg, root, f->distance);
    bad += contradicts_int(cfg, root, "nlist", "--nlist", f->nlist);
    bad += contradicts_int(cfg, root, "pq_m", "--pq-m", f->pq_m);
    bad += contradicts_int(cfg, root, "nprobe", "--nprobe", f->nprobe);
    if (!bad)
        return 0;
    if (kept)
        fprintf(stderr, PROG ": %s was kept from an earlier run on this --data and its index "
                        "keeps those settings; the cluster is not started: drop the flag%s to "
                        "start the kept index as it is, or use another --data for a new "
                        "index\n", cfg, bad > 1 ? "s" : "");
    else
        fprintf(stderr, PROG ": the config file (--config) sets the index; the cluster is not "
                        "started: drop the flag%s, or change %s\n", bad > 1 ? "s" : "", cfg);
    return 1;
}

/* Reads cfg for the checks; NULL when it does not parse (said when flags needed it). */
static json_t *load_for_checks(const char *cfg, const tsr_cluster_flags *f, int kept, int *bad)
{
    json_error_t jerr;
    json_t *root = json_load_file(cfg, 0, &jerr);
    *bad = 0;
    if (root && json_is_object(root))
        return root;
    json_decref(root);
    if (f->dims || f->distance || f->nlist || f->pq_m || f->nprobe || kept) {
        fprintf(stderr, PROG ": %s: %s (line %d); cannot check the flags against it: fix "
                        "it, or use another --data\n", cfg,
                root ? "not a JSON object" : jerr.text, jerr.line);
        *bad = 1;
    }
    return NULL;
}

int tsr_cluster_prepare_config(const char *data, const char *config, char *cfg, size_t cfglen,
                               const tsr_cluster_flags *f)
{
    if (mkdir(data, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", data, strerror(errno));
        return 1;
    }
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/logs", data);
    mkdir(path, 0755);
    int kept = config == NULL;
    if (config)
        snprintf(cfg, cfglen, "%s", config);
    else
        snprintf(cfg, cfglen, "%s/coordinator.json", data);
    if (kept && access(cfg, F_OK) != 0)
        return write_default_config(cfg, f) != 0;
    int bad;
    json_t *root = load_for_checks(cfg, f, kept, &bad);
    if (root == NULL)
        return bad;
    int rc = kept ? check_shard_ports(cfg, root, f) : 0;
    if (rc == 0)
        rc = check_index_flags(cfg, kept, root, f);
    json_decref(root);
    return rc;
}

/* ---- the peer token (docs/security.md "Shards accept only the coordinator") */

enum { PEER_TOKEN_BYTES = 32 };

/* A new token in path (hex of PEER_TOKEN_BYTES random bytes, mode 0600, fsynced). */
static int write_peer_token(const char *path)
{
    unsigned char raw[PEER_TOKEN_BYTES];
    char hex[2 * PEER_TOKEN_BYTES + 2];
    FILE *rnd = fopen("/dev/urandom", "rb");
    size_t got = rnd ? fread(raw, 1, sizeof raw, rnd) : 0;
    if (rnd)
        fclose(rnd);
    if (got != sizeof raw) {
        fprintf(stderr, PROG ": cannot read /dev/urandom for the peer token\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[2 * PEER_TOKEN_BYTES] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, hex, sizeof hex - 1) == (ssize_t)(sizeof hex - 1) &&
             fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    explicit_bzero(raw, sizeof raw);
    explicit_bzero(hex, sizeof hex);
    if (!ok) {
        fprintf(stderr, PROG ": cannot write the peer token %s: %s\n", path, strerror(errno));
        unlink(path);
        return 1;
    }
    return 0;
}

int tsr_cluster_peer_token(const char *data, char *path, size_t cap)
{
    char dir[4096];
    if (realpath(data, dir) == NULL) {
        fprintf(stderr, PROG ": %s: %s\n", data, strerror(errno));
        return 1;
    }
    snprintf(path, cap, "%s/peer-token", dir);
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? write_peer_token(path) : 1;
    if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 || st.st_uid != geteuid()) {
        fprintf(stderr, PROG ": %s (the shards' peer token, kept from an earlier run) must be a "
                        "regular file of yours with mode 0600 (it is %s mode %04o): chmod 600 "
                        "it, or delete it (a new one is made)\n",
                path, S_ISREG(st.st_mode) ? "a file of" : "not a regular file,",
                (unsigned)(st.st_mode & 07777));
        return 1;
    }
    return 0;
}

/* ---- the layout kept in DIR: with or without --etcd-local, and how many members */

/* 1 when DIR/name is a folder holding anything. */
static int dir_used(const char *data, const char *name)
{
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", data, name);
    DIR *d = opendir(path);
    if (d == NULL)
        return 0;
    int used = 0;
    for (struct dirent *e; !used && (e = readdir(d)) != NULL;)
        used = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return used;
}

int tsr_cluster_check_layout(const char *data, int netcd)
{
    char name[32];
    int kept = 0;
    for (;; kept++) {
        snprintf(name, sizeof name, "etcd-%d", kept);
        if (!dir_used(data, name))
            break;
    }
    if (kept > 0 && netcd != kept) {
        fprintf(stderr, PROG ": --etcd-local %d%s contradicts %s, which holds the data of a "
                        "%d-member etcd (%s/etcd-0..%d, where its index state is): start with "
                        "--etcd-local %d, or use another --data\n", netcd,
                netcd ? "" : " (not given)", data, kept, data, kept - 1, kept);
        return 1;
    }
    if (kept == 0 && netcd > 0 && dir_used(data, "coordinator")) {
        fprintf(stderr, PROG ": --etcd-local %d contradicts %s, whose index was served without "
                        "etcd (%s/coordinator): coordinators on etcd would not find it; start "
                        "without --etcd-local and --coordinators, or use another --data\n",
                netcd, data, data);
        return 1;
    }
    return 0;
}
