/*
 * rpc_auth — bearer tokens for the rpc server (API in rpc.h, "authorization"): the token
 * file parser, the bare token file reader, the constant-time check of a call's
 * `authorization: Bearer <token>` metadata, and the loopback test of a listen address.
 *
 * Roles are levels 1..nroles, named by the application (the coordinator: 1 "query",
 * 2 "admin"); a token of level L may call a method that requires a level <= L. Level 0
 * means open (no token needed). The server never sees role names again after the load.
 *
 * Secrets: tokens live only in the set (freed with explicit_bzero); no message of this
 * file quotes a token, a presented token or a line of the file, only file:line and what
 * is wrong. The compare (tsr__rpc_auth_check) looks at every token of the set and its
 * running time depends on the presented token's length only, not on where it differs
 * from a stored one.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "core/file.h"
#include "core/mem.h"
#include "net/rpc.h"
#include "net/rpc_int.h"

#define TOKEN_FILE_MAX (1u << 20)

struct token {
    char *tok;
    size_t len;
    int level;
};

struct tsr_rpc_tokens {
    struct token *t;
    size_t n;
    int nroles;
    char *roles[TSR_RPC_MAX_ROLES]; /* names, for messages */
};

/* A token is 16..TSR_RPC_MAX_TOKEN visible ASCII characters (no space: it travels in an
 * HTTP/2 header value after "Bearer "). Returns NULL or what is wrong. */
static const char *token_problem(const char *s, size_t n)
{
    if (n < TSR_RPC_MIN_TOKEN)
        return "token shorter than 16 characters (use e.g. `openssl rand -hex 32`)";
    if (n > TSR_RPC_MAX_TOKEN)
        return "token longer than 512 characters";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return "token has a character outside visible ASCII";
    return NULL;
}

void tsr_rpc_tokens_free(tsr_rpc_tokens *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        explicit_bzero(t->t[i].tok, t->t[i].len);
        free(t->t[i].tok);
    }
    free(t->t);
    for (int i = 0; i < t->nroles; i++)
        free(t->roles[i]);
    free(t);
}

static tsr_rpc_tokens *tokens_new(const char *const *roles, int nroles)
{
    tsr_rpc_tokens *t = tsr_xcalloc(1, sizeof *t);
    t->nroles = nroles;
    for (int i = 0; i < nroles; i++)
        t->roles[i] = tsr_xstrdup(roles[i]);
    return t;
}

static void tokens_add(tsr_rpc_tokens *t, const char *tok, size_t len, int level)
{
    t->t = tsr_xrealloc(t->t, (t->n + 1) * sizeof *t->t);
    t->t[t->n].tok = tsr_xstrndup(tok, len);
    t->t[t->n].len = len;
    t->t[t->n].level = level;
    t->n++;
}

/* One line "<role> <token>" (already without comment and surrounding blanks). */
static int parse_line(tsr_rpc_tokens *t, const char *path, int lno, char *s, tsr_error *err)
{
    char *sp = s + strcspn(s, " \t");
    if (!*sp)
        return tsr_err(err, TSR_EINVAL, "%s:%d: expected \"<role> <token>\" (role one of "
                       "%s%s%s)", path, lno, t->roles[0], t->nroles > 1 ? ", " : "",
                       t->nroles > 1 ? t->roles[1] : "");
    *sp++ = '\0';
    sp += strspn(sp, " \t");
    int level = 0;
    for (int i = 0; i < t->nroles; i++)
        if (strcmp(s, t->roles[i]) == 0)
            level = i + 1;
    if (!level)
        /* the word is not quoted: on a line written "<token> <role>" it is the token */
        return tsr_err(err, TSR_EINVAL, "%s:%d: the first word is not a role (roles: %s%s%s; "
                       "lines are \"<role> <token>\")", path, lno, t->roles[0],
                       t->nroles > 1 ? ", " : "", t->nroles > 1 ? t->roles[1] : "");
    size_t n = strcspn(sp, " \t");
    if (sp[n + strspn(sp + n, " \t")] != '\0')
        return tsr_err(err, TSR_EINVAL, "%s:%d: more than one token on the line", path, lno);
    const char *bad = token_problem(sp, n);
    if (bad)
        return tsr_err(err, TSR_EINVAL, "%s:%d: %s", path, lno, bad);
    for (size_t i = 0; i < t->n; i++)
        if (t->t[i].len == n && memcmp(t->t[i].tok, sp, n) == 0)
            return tsr_err(err, TSR_EINVAL, "%s:%d: the same token is already on an earlier "
                           "line", path, lno);
    tokens_add(t, sp, n, level);
    return 0;
}

int tsr_rpc_tokens_load(const char *path, const char *const *roles, int nroles,
                        tsr_rpc_tokens **out, tsr_error *err)
{
    *out = NULL;
    if (nroles < 1 || nroles > TSR_RPC_MAX_ROLES)
        return tsr_err(err, TSR_EINVAL, "token roles: 1..%d", TSR_RPC_MAX_ROLES);
    char *buf = NULL;
    size_t len = 0;
    int rc = tsr_file_read(path, TOKEN_FILE_MAX, 0, &buf, &len, err);
    if (rc)
        return rc;
    tsr_rpc_tokens *t = tokens_new(roles, nroles);
    int lno = 0;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        lno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        size_t n = strlen(line);
        while (n && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r'))
            line[--n] = '\0';
        line += strspn(line, " \t");
        if (*line && (rc = parse_line(t, path, lno, line, err)) != 0)
            break;
        line = nl ? nl + 1 : NULL;
    }
    explicit_bzero(buf, len);
    free(buf);
    if (rc == 0 && t->n == 0)
        rc = tsr_err(err, TSR_EINVAL, "%s: no token in the file (lines are \"<role> <token>\")",
                     path);
    if (rc) {
        tsr_rpc_tokens_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tsr_rpc_token_read(const char *path, char **out, tsr_error *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    int rc = tsr_file_read(path, TOKEN_FILE_MAX, 0, &buf, &len, err);
    if (rc)
        return rc;
    char *s = buf + strspn(buf, " \t\r\n");
    size_t n = strlen(s);
    while (n && strchr(" \t\r\n", s[n - 1]))
        n--;
    const char *bad = token_problem(s, n);
    if (bad)
        rc = tsr_err(err, TSR_EINVAL, "%s: %s (the file holds one bare token)", path, bad);
    else
        *out = tsr_xstrndup(s, n);
    explicit_bzero(buf, len);
    free(buf);
    return rc;
}

int tsr_rpc_tokens_single(const char *path, tsr_rpc_tokens **out, tsr_error *err)
{
    char *tok;
    *out = NULL;
    int rc = tsr_rpc_token_read(path, &tok, err);
    if (rc)
        return rc;
    static const char *const peer[] = {"peer"};
    tsr_rpc_tokens *t = tokens_new(peer, 1);
    tokens_add(t, tok, strlen(tok), 1);
    explicit_bzero(tok, strlen(tok));
    free(tok);
    *out = t;
    return 0;
}

size_t tsr_rpc_tokens_count(const tsr_rpc_tokens *t, int level)
{
    size_t n = 0;
    for (size_t i = 0; t && i < t->n; i++)
        n += t->t[i].level == level;
    return n;
}

int tsr_rpc_tokens_roles(const tsr_rpc_tokens *t)
{
    return t ? t->nroles : 0;
}

/* 1 when a (na bytes) equals b (nb bytes). Time depends on nb only. */
static int ct_equal(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < nb; i++)
        d |= (unsigned char)(b[i] ^ a[i % na]);
    return d == 0;
}

int tsr__rpc_auth_check(const tsr_rpc_tokens *t, const grpc_metadata_array *md, int required,
                        char *msg, size_t cap)
{
    if (required <= 0)
        return TSR_RPC_OK;
    if (required > t->nroles)
        required = t->nroles;
    const grpc_slice *val = NULL;
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice *k = &md->metadata[i].key;
        if (GRPC_SLICE_LENGTH(*k) == 13 &&
            strncasecmp((const char *)GRPC_SLICE_START_PTR(*k), "authorization", 13) == 0) {
            val = &md->metadata[i].value;
            break;
        }
    }
    if (!val) {
        snprintf(msg, cap, "missing \"authorization: Bearer <token>\" metadata");
        return TSR_RPC_UNAUTHENTICATED;
    }
    const char *v = (const char *)GRPC_SLICE_START_PTR(*val);
    size_t vn = GRPC_SLICE_LENGTH(*val);
    if (vn < 7 || strncasecmp(v, "Bearer ", 7) != 0) {
        snprintf(msg, cap, "the authorization metadata is not \"Bearer <token>\"");
        return TSR_RPC_UNAUTHENTICATED;
    }
    v += 7;
    vn -= 7;
    int level = 0;
    for (size_t i = 0; i < t->n; i++) { /* every token, no early exit */
        int eq = ct_equal(t->t[i].tok, t->t[i].len, v, vn);
        int take = eq & (t->t[i].level > level);
        level = take ? t->t[i].level : level;
    }
    if (!level) {
        snprintf(msg, cap, "unknown token");
        return TSR_RPC_UNAUTHENTICATED;
    }
    if (level < required) {
        snprintf(msg, cap, "this call needs role \"%s\"; the token has role \"%s\"",
                 t->roles[required - 1], t->roles[level - 1]);
        return TSR_RPC_PERMISSION_DENIED;
    }
    return TSR_RPC_OK;
}

int tsr_rpc_addr_is_loopback(const char *addr)
{
    if (!addr)
        return 0;
    if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0)
        return 1;
    if (strncmp(addr, "ipv4:", 5) == 0 || strncmp(addr, "ipv6:", 5) == 0)
        addr += 5;
    char host[128];
    const char *end;
    if (addr[0] == '[') {
        addr++;
        end = strchr(addr, ']');
    } else {
        end = strrchr(addr, ':');
    }
    if (!end || (size_t)(end - addr) >= sizeof host)
        return 0;
    memcpy(host, addr, (size_t)(end - addr));
    host[end - addr] = '\0';
    if (strcmp(host, "localhost") == 0)
        return 1;
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) == 1) {
        static const unsigned char one[16] = {[15] = 1};
        static const unsigned char v4map[12] = {[10] = 0xff, [11] = 0xff};
        return memcmp(a, one, 16) == 0 || (memcmp(a, v4map, 12) == 0 && a[12] == 127);
    }
    return 0;
}
