/*
 * cluster_check — what `tessera cluster up` (cmd_cluster.c) checks before and while it
 * starts a local cluster: that a port is free to listen on, that a data directory is not
 * held by a running process (its LOCK, the flock that common/store/store takes while a process
 * has the store open), whether a started process answers grpc.health.v1.Health/Check
 * with SERVING, and the tail of a process's log (what it wrote since a given offset).
 *
 * DESIGN: plain blocking helpers with short, bounded waits (a health check has a deadline
 * of a few hundred milliseconds); they hold nothing between calls. The port and lock
 * checks are advisory — another process may take the port or the folder a moment later —
 * so the supervisor still treats a child that exits during start-up as a start failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "grpc/health/v1/health.pb-c.h"
#include "net/rpc.h"

int tsr_cluster_port_free(const char *host, int port, char *why, size_t whylen)
{
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, serv, &hints, &ai);
    if (g != 0) {
        snprintf(why, whylen, "cannot resolve %s: %s", host, gai_strerror(g));
        return -1;
    }
    int rc = 0;
    for (struct addrinfo *a = ai; a != NULL && rc == 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        /* as the servers do: a connection in TIME_WAIT does not make the port busy */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
            snprintf(why, whylen, "%s", strerror(errno));
            rc = -1;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

int tsr_cluster_dir_locked(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/LOCK", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 0; /* no LOCK yet: nobody ever opened this store */
    int held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* releases our flock if we got it */
    return held;
}

int tsr_cluster_health(const char *target, const char *service,
                       const struct tsr_rpc_client_opts *opts, int timeout_ms)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, opts, &err);
    if (ch == NULL)
        return 0;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    ProtobufCMessage *out = NULL;
    int serving = 0;
    if (tsr_rpc_call_pb(ch, "/grpc.health.v1.Health/Check", &req.base,
                        &grpc__health__v1__health_check_response__descriptor, timeout_ms, &out,
                        &res) == TSR_RPC_OK) {
        Grpc__Health__V1__HealthCheckResponse *h = (Grpc__Health__V1__HealthCheckResponse *)out;
        serving = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        protobuf_c_message_free_unpacked(out, NULL);
    }
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    return serving;
}

long tsr_cluster_log_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

enum { TAIL_BYTES = 16384 };

void tsr_cluster_print_log_tail(FILE *f, const char *prefix, const char *path, long off,
                                int nlines)
{
    FILE *in = fopen(path, "r");
    if (in == NULL) {
        fprintf(f, "%s(cannot read %s: %s)\n", prefix, path, strerror(errno));
        return;
    }
    long end = 0;
    if (fseek(in, 0, SEEK_END) == 0)
        end = ftell(in);
    long from = end - off > TAIL_BYTES ? end - TAIL_BYTES : off;
    if (from < 0 || from > end)
        from = 0;
    char *buf = malloc(TAIL_BYTES + 1);
    size_t n = 0;
    if (buf != NULL && fseek(in, from, SEEK_SET) == 0)
        n = fread(buf, 1, TAIL_BYTES, in);
    fclose(in);
    if (buf == NULL)
        return;
    buf[n] = '\0';
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (n == 0) {
        fprintf(f, "%s(%s: nothing written)\n", prefix, path);
        free(buf);
        return;
    }
    /* start of the last nlines lines */
    char *start = buf + n;
    for (int seen = 0; start > buf; start--)
        if (start[-1] == '\n' && ++seen == nlines)
            break;
    for (char *line = start; line != NULL;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        fprintf(f, "%s%s\n", prefix, line);
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
}
