/*
 * etcd_test_util — real etcd members for unit tests (header only): free loopback ports,
 * Debian's etcd binary, a cluster of n members under E.dir (started and waited for, killed
 * one by one or all, their data removed). Used by test_etcd and test_coord_meta; the test
 * sets E.dir before starting and exits 77 (SKIP) when etcd_bin() is NULL.
 */
#ifndef ETCD_TEST_UTIL_H
#define ETCD_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/etcd.h"

#define MAXM 3

static struct {
    pid_t pid[MAXM];
    int client[MAXM], peer[MAXM];
    char dir[64];
    char endpoints[256];
} E;

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (void *)&a, &l))
        abort();
    int p = ntohs(a.sin_port);
    close(s);
    return p;
}

static const char *etcd_bin(void)
{
    static const char *c[] = {"/usr/bin/etcd", "/usr/local/bin/etcd"};
    for (size_t i = 0; i < 2; i++)
        if (access(c[i], X_OK) == 0)
            return c[i];
    return NULL;
}

/* Starts n members named m0.. in E.dir; returns after every member answers a put. */
static void cluster_start(int n)
{
    char cluster[512] = "";
    for (int i = 0; i < n; i++) {
        E.client[i] = free_port();
        E.peer[i] = free_port();
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof cluster - l, "%sm%d=http://127.0.0.1:%d", i ? "," : "", i,
                 E.peer[i]);
    }
    E.endpoints[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(E.endpoints);
        snprintf(E.endpoints + l, sizeof E.endpoints - l, "%s127.0.0.1:%d", i ? "," : "",
                 E.client[i]);
        char name[16], data[128], curl[64], purl[64];
        snprintf(name, sizeof name, "m%d", i);
        snprintf(data, sizeof data, "%s/m%d", E.dir, i);
        snprintf(curl, sizeof curl, "http://127.0.0.1:%d", E.client[i]);
        snprintf(purl, sizeof purl, "http://127.0.0.1:%d", E.peer[i]);
        pid_t p = fork();
        if (p == 0) {
            freopen("/dev/null", "w", stderr);
            freopen("/dev/null", "w", stdout);
            execl(etcd_bin(), "etcd", "--name", name, "--data-dir", data,
                  "--listen-client-urls", curl, "--advertise-client-urls", curl,
                  "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                  "--initial-cluster", cluster, "--initial-cluster-state", "new",
                  "--heartbeat-interval", "50", "--election-timeout", "500", (char *)NULL);
            _exit(127);
        }
        E.pid[i] = p;
    }
    tsr_error err = TSR_ERROR_INIT;
    tsr_etcd *e = tsr_etcd_open(E.endpoints, NULL, 1000, &err);
    assert_non_null(e);
    for (int t = 0; t < 300; t++) {
        if (tsr_etcd_put(e, "/ready", "1", 1, 0, NULL, &err) == 0)
            break;
        usleep(100 * 1000);
    }
    assert_int_equal(tsr_etcd_put(e, "/ready", "1", 1, 0, NULL, &err), 0);
    tsr_etcd_close(e);
}

static void member_kill(int i)
{
    if (E.pid[i] > 0) {
        kill(E.pid[i], SIGKILL);
        waitpid(E.pid[i], NULL, 0);
        E.pid[i] = 0;
    }
}

static void cluster_stop(void)
{
    for (int i = 0; i < MAXM; i++)
        member_kill(i);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s/m*", E.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "etcd_test_util: could not clean %s\n", E.dir);
}

static int one_up(void **state)
{
    (void)state;
    cluster_start(1);
    return 0;
}

static int down(void **state)
{
    (void)state;
    cluster_stop();
    return 0;
}

#endif
