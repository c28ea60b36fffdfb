/*
 * targets — the coordinator list of an online command (`--target A,B,...`) and the calls
 * that fail over between its members.
 *
 * Several coordinators serve one index (docs/ha.md): every one answers reads, one leader
 * takes the writes and the followers refuse them with UNAVAILABLE "not the leader: the
 * leader is ADDR" (or "no leader elected yet"). A call here is tried on the current
 * target (the last one that answered; the first of the list at the start) and, when it
 * fails with UNAVAILABLE or DEADLINE_EXCEEDED, on the next ones in list order; a write
 * refused by a follower goes straight to the leader it names (added to the list when it
 * is not in it). A write that finds no leader (an election in progress) is retried for
 * as long as the call's timeout allows. When a call was answered by another target than
 * the one it was first tried on, one line on stderr says which ("PROG: answered by B
 * (A: UNAVAILABLE: ...)").
 *
 * tsr_cli_connect (one channel with the TLS / token flags) and tsr_cli_rpc_failure live here
 * too: every online command reaches the coordinators through this file.
 *
 * Ownership: the list owns its channels (one per target, made when the list is opened
 * or a leader is learnt); not thread-safe (one command, one thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/clock.h"
#include "core/mem.h"

/* Opens the channel. Returns NULL on failure with *code = 2 (TLS flags or files are
 * wrong: a usage error) or 1. TSR_TLS_CA / TSR_TLS_SERVER_NAME / TSR_TOKEN_FILE stand in
 * for --tls-ca / --tls-server-name / --token-file when those are not given. */
tsr_rpc_channel *tsr_cli_connect(const char *prog, const char *target, const tsr_cli_tls *t,
                                 int *code)
{
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_client_opts o;
    tsr_rpc_client_opts_init(&o);
    o.no_watch = 1; /* one-shot client: no connectivity thread needed */
    o.tls_ca_file = t->ca ? t->ca : getenv("TSR_TLS_CA");
    o.tls_cert_file = t->cert;
    o.tls_key_file = t->key;
    o.tls_server_name = t->name ? t->name : getenv("TSR_TLS_SERVER_NAME");
    if (o.tls_server_name && !o.tls_ca_file) {
        fprintf(stderr, "%s: --tls-server-name needs --tls-ca\n", prog);
        *code = 2;
        return NULL;
    }
    tsr_cmdline_tls chk = {o.tls_cert_file, "--tls-cert", o.tls_key_file, "--tls-key",
                           o.tls_ca_file, t->ca ? "--tls-ca" : "TSR_TLS_CA"};
    if (tsr_cmdline_check_tls(&chk, 1, &err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        *code = 2;
        return NULL;
    }
    const char *tf = t->token_file ? t->token_file : getenv("TSR_TOKEN_FILE");
    char *token = NULL;
    if (tf && *tf && tsr_rpc_token_read(tf, &token, &err) != 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, t->token_file ? "--token-file" : "TSR_TOKEN_FILE",
                err.msg);
        *code = 2;
        return NULL;
    }
    o.bearer_token = token; /* copied by the channel */
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, &o, &err);
    if (token) {
        explicit_bzero(token, strlen(token));
        free(token);
    }
    if (ch == NULL) {
        fprintf(stderr, "%s: %s: %s\n", prog, target, err.msg);
        *code = 1;
    }
    return ch;
}

void tsr_cli_rpc_failure(const char *prog, const char *what, const char *target,
                         const tsr_rpc_result *res)
{
    fprintf(stderr, "%s: %s on %s failed: %s: %s\n", prog, what, target,
            tsr_rpc_code_name(res->code), res->message ? res->message : "");
}

#define MAX_TARGETS 64

struct tsr_cli_targets {
    const char *prog;
    tsr_cli_tls tls;
    size_t n, cur;
    char *addr[MAX_TARGETS];
    tsr_rpc_channel *ch[MAX_TARGETS];
};

/* addr[0..len) as a new string, with TSR_CLI_DEFAULT_PORT when it names no port: gRPC
 * would take 443 for a bare "localhost", where nothing of ours listens. URIs
 * ("dns:///h:p", "unix:/path", "ipv4:...") are left as they are; a bare IPv6 address
 * gets brackets ("::1" -> "[::1]:7000"). */
static char *with_port(const char *addr, size_t len)
{
    char *a = tsr_xstrndup(addr, len);
    const char *colon = strchr(a, ':'), *close = strchr(a, ']');
    int uri = strchr(a, '/') != NULL || strncmp(a, "unix:", 5) == 0 ||
              strncmp(a, "ipv4:", 5) == 0 || strncmp(a, "ipv6:", 5) == 0;
    int has_port = a[0] == '[' ? close != NULL && close[1] == ':'
                               : colon != NULL && strchr(colon + 1, ':') == NULL;
    if (uri || has_port || len == 0)
        return a;
    char *out = tsr_xmalloc(len + 16);
    if (colon != NULL && a[0] != '[') /* a bare IPv6 address */
        snprintf(out, len + 16, "[%s]:%d", a, TSR_CLI_DEFAULT_PORT);
    else
        snprintf(out, len + 16, "%s:%d", a, TSR_CLI_DEFAULT_PORT);
    free(a);
    return out;
}

/* Adds addr (a copy) with its channel. Returns its index, or -1 (said, *code set). */
static int add_target(tsr_cli_targets *t, const char *addr, size_t len, int *code)
{
    for (size_t i = 0; i < t->n; i++)
        if (strlen(t->addr[i]) == len && memcmp(t->addr[i], addr, len) == 0)
            return (int)i;
    if (t->n == MAX_TARGETS) {
        fprintf(stderr, "%s: --target: more than %d addresses\n", t->prog, MAX_TARGETS);
        *code = 2;
        return -1;
    }
    char *a = with_port(addr, len);
    tsr_rpc_channel *ch = tsr_cli_connect(t->prog, a, &t->tls, code);
    if (ch == NULL) {
        free(a);
        return -1;
    }
    t->addr[t->n] = a;
    t->ch[t->n] = ch;
    return (int)t->n++;
}

tsr_cli_targets *tsr_cli_targets_open(const char *prog, const char *list, const tsr_cli_tls *tls,
                                      int *code)
{
    tsr_cli_targets *t = tsr_xcalloc(1, sizeof *t);
    t->prog = prog;
    t->tls = *tls;
    const char *p = list;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0) {
            fprintf(stderr, "%s: --target '%s': expected ADDR[,ADDR...] (host:port, no empty "
                    "entry)\n", prog, list);
            *code = 2;
            goto fail;
        }
        if (add_target(t, p, len, code) < 0)
            goto fail;
        if (c == NULL)
            break;
        p = c + 1;
    }
    return t;
fail:
    tsr_cli_targets_close(t);
    return NULL;
}

void tsr_cli_targets_close(tsr_cli_targets *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; i++) {
        tsr_rpc_channel_destroy(t->ch[i]);
        free(t->addr[i]);
    }
    free(t);
}

const char *tsr_cli_targets_current(const tsr_cli_targets *t)
{
    return t->addr[t->cur];
}

size_t tsr_cli_targets_count(const tsr_cli_targets *t)
{
    return t->n;
}

void tsr_cli_targets_select(tsr_cli_targets *t, const char *addr)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->addr[i], addr) == 0)
            t->cur = i;
}

/* The ADDR of "not the leader: the leader is ADDR" in msg: its start, length in *len;
 * NULL when msg does not name a leader. */
static const char *leader_named(const char *msg, size_t *len)
{
    static const char mark[] = "the leader is ";
    const char *s = msg ? strstr(msg, "not the leader") : NULL;
    s = s ? strstr(s, mark) : NULL;
    if (s == NULL)
        return NULL;
    s += sizeof mark - 1;
    size_t n = strcspn(s, " ,;()\t\n");
    while (n > 0 && s[n - 1] == '.')
        n--;
    *len = n;
    return n ? s : NULL;
}

static int failover_code(int code)
{
    return code == TSR_RPC_UNAVAILABLE || code == TSR_RPC_DEADLINE_EXCEEDED;
}

int tsr_cli_call(tsr_cli_targets *t, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, int flags,
                 ProtobufCMessage **out, tsr_rpc_result *res)
{
    size_t first = t->cur;
    char *first_fail = NULL; /* "ADDR: CODE: message" of the first failure */
    int64_t t_end = tsr_clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 30000);
    size_t tried = 0, redirects = 0;
    for (;;) {
        *out = NULL;
        int code = tsr_rpc_call_pb(t->ch[t->cur], method, req, resp_desc, timeout_ms, out, res);
        if (code == TSR_RPC_OK) {
            if (t->cur != first)
                fprintf(stderr, "%s: answered by %s (%s)\n", t->prog, t->addr[t->cur],
                        first_fail ? first_fail : "failed over");
            break;
        }
        if (!failover_code(code))
            break;
        if (first_fail == NULL) {
            size_t need = strlen(t->addr[t->cur]) + strlen(res->message) + 40;
            first_fail = tsr_xmalloc(need);
            snprintf(first_fail, need, "%s: %s: %s", t->addr[t->cur], tsr_rpc_code_name(code),
                     res->message);
        }
        size_t llen = 0;
        const char *leader = (flags & TSR_CLI_WRITE) ? leader_named(res->message, &llen) : NULL;
        if (leader && redirects < 4) {
            int c2 = 1, i = add_target(t, leader, llen, &c2);
            if (i >= 0 && (size_t)i != t->cur) {
                redirects++;
                t->cur = (size_t)i;
                continue;
            }
        }
        if (++tried < t->n) {
            t->cur = (t->cur + 1) % t->n;
            continue;
        }
        /* every target said no. A write with no leader yet (an election): wait for one
         * while the timeout allows; anything else is the answer. */
        int no_leader = (flags & TSR_CLI_WRITE) && code == TSR_RPC_UNAVAILABLE &&
                        (strstr(res->message, "no leader") || leader != NULL);
        if (!no_leader || tsr_clock_mono_ms() + 250 > t_end)
            break;
        struct timespec ts = {0, 250 * 1000 * 1000};
        nanosleep(&ts, NULL);
        tried = 0;
        redirects = 0;
        t->cur = (t->cur + 1) % t->n;
    }
    free(first_fail);
    return res->code;
}

void tsr_cli_targets_failure(const tsr_cli_targets *t, const char *what,
                             const tsr_rpc_result *res)
{
    char tail[48] = "";
    if (t->n > 1)
        snprintf(tail, sizeof tail, " (tried all %zu)", t->n);
    fprintf(stderr, "%s: %s on %s%s failed: %s: %s\n", t->prog, what, t->addr[t->cur], tail,
            tsr_rpc_code_name(res->code), res->message ? res->message : "");
}
