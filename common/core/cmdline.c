/*
 * cmdline — option table parsing, the stop-signal semaphore and TLS file checks for the
 * server binaries (cmdline.h). The TLS checks use OpenSSL directly (gRPC core links it
 * already): gRPC itself only reads the PEM text at start and fails later, at the first
 * handshake or when the port is added, without saying which file is wrong.
 *
 * DESIGN (signals): the only state shared with a signal handler is stop_sem (posted) and
 * stop_sig (written before the post, read after the wait).
 */
#include "core/cmdline.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "core/file.h"
#include "core/log.h"
#include "core/mem.h"
#include "core/version.h"

/* ------------------------------------------------------------------ option parsing */

int tsr_cmdline_parse_size(const char *s, size_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: return -1;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
        end += 2; /* "64KiB" */
    else if (mul > 1 && (*end == 'B' || *end == 'b'))
        end++;    /* "64KB", still binary: a size flag is never decimal here */
    if (*end != 0 || v > SIZE_MAX / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

void tsr_cmdline_list_free(tsr_cmdline_list *l)
{
    if (l == NULL)
        return;
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* strtoll / strtoull of the whole of v; -1 when v is not a decimal integer (no spaces, no
 * '+') or out of range. */
static int whole_ll(const char *v, long long *out)
{
    char *end;
    errno = 0;
    *out = strtoll(v, &end, 10);
    /* strtoll skips leading spaces: " 5" is not a value as typed */
    return ((*v != '-' && (*v < '0' || *v > '9')) || *end != 0 || errno == ERANGE) ? -1 : 0;
}

static int whole_ull(const char *v, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(v, &end, 10);
    /* strtoull takes "-1" as ULLONG_MAX: a sign is not an unsigned integer */
    return (*v < '0' || *v > '9' || *end != 0 || errno == ERANGE) ? -1 : 0;
}

/* Stores v into o->dest; on a bad value prints "prog: --name: expected ..., got 'v'". */
static int set_value(const char *prog, const tsr_cmdline_opt *o, const char *v)
{
    long long n;
    unsigned long long u;
    switch (o->kind) {
    case TSR_CMDLINE_STR:
        if (*v == 0) {
            fprintf(stderr, "%s: %s: expected a value, got ''\n", prog, o->name);
            return -1;
        }
        *(const char **)o->dest = v;
        return 0;
    case TSR_CMDLINE_STR_ANY:
        *(const char **)o->dest = v;
        return 0;
    case TSR_CMDLINE_LIST: {
        if (*v == 0) {
            fprintf(stderr, "%s: %s: expected a value, got ''\n", prog, o->name);
            return -1;
        }
        tsr_cmdline_list *l = o->dest;
        l->v = tsr_xrealloc(l->v, (l->n + 1) * sizeof *l->v);
        l->v[l->n++] = v;
        return 0;
    }
    case TSR_CMDLINE_INT:
    case TSR_CMDLINE_INT64:
        if (whole_ll(v, &n) != 0 || n < o->min || n > o->max) {
            fprintf(stderr, "%s: %s: expected an integer from %lld to %lld, got '%s'\n", prog,
                    o->name, o->min, o->max, v);
            return -1;
        }
        if (o->kind == TSR_CMDLINE_INT)
            *(int *)o->dest = (int)n;
        else
            *(int64_t *)o->dest = (int64_t)n;
        return 0;
    case TSR_CMDLINE_UINT64:
        if (whole_ull(v, &u) != 0 || u < (unsigned long long)o->min ||
            u > (unsigned long long)o->max) {
            fprintf(stderr, "%s: %s: expected an integer from %llu to %llu, got '%s'\n", prog,
                    o->name, (unsigned long long)o->min, (unsigned long long)o->max, v);
            return -1;
        }
        *(uint64_t *)o->dest = (uint64_t)u;
        return 0;
    case TSR_CMDLINE_DOUBLE: {
        char *end;
        errno = 0;
        double d = strtod(v, &end);
        /* the range test also refuses nan and the infinities */
        if (*v == 0 || *v == ' ' || *v == '\t' || *end != 0 || errno == ERANGE ||
            !(d >= (double)o->min && d <= (double)o->max)) {
            fprintf(stderr, "%s: %s: expected a number from %lld to %lld, got '%s'\n", prog,
                    o->name, o->min, o->max, v);
            return -1;
        }
        *(double *)o->dest = d;
        return 0;
    }
    case TSR_CMDLINE_SIZE: {
        size_t sz;
        if (tsr_cmdline_parse_size(v, &sz) != 0 || (long long)sz < o->min ||
            (unsigned long long)sz > (unsigned long long)o->max) {
            fprintf(stderr, "%s: %s: expected a size in bytes from %lld to %lld (suffix K, M "
                            "or G allowed), got '%s'\n", prog, o->name, o->min, o->max, v);
            return -1;
        }
        *(size_t *)o->dest = sz;
        return 0;
    }
    default:
        fprintf(stderr, "%s: %s: bad option table\n", prog, o->name);
        return -1;
    }
}

static const tsr_cmdline_opt *find_opt(const tsr_cmdline_opt *opts, size_t n, const char *a,
                                       size_t nlen, size_t *k)
{
    for (*k = 0; *k < n; (*k)++)
        if (strlen(opts[*k].name) == nlen && strncmp(opts[*k].name, a, nlen) == 0)
            return &opts[*k];
    return NULL;
}

/* A usage error: prints "prog: <message>", then the usage (or, brief, a pointer to
 * --help); sets *exit_code to 2 and returns 1. */
static int usage_error(const tsr_cmdline_spec *s, int *exit_code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", s->prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (s->brief) {
        fprintf(stderr, " (see '%s --help')\n", s->prog);
    } else {
        fputs("\n\n", stderr);
        s->usage(stderr);
    }
    *exit_code = 2;
    return 1;
}

int tsr_cmdline_parse_spec(const tsr_cmdline_spec *s, int argc, char **argv, int *nargs,
                           int *exit_code)
{
    unsigned char seen[128] = {0};
    int npos = 0, only_args = 0;
    if (s->nopts > sizeof seen) {
        fprintf(stderr, "%s: too many options in the table\n", s->prog);
        *exit_code = 2;
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_args || a[0] != '-' || a[1] == 0) {
            if (s->max_args >= 0 && npos >= s->max_args)
                return usage_error(s, exit_code, "unexpected argument '%s'", a);
            argv[1 + npos++] = a; /* 1 + npos <= i: only consumed slots are reused */
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_args = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            s->usage(stdout);
            *exit_code = 0;
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            /* the program's name without the command ("tessera query" -> "tessera") */
            printf("%.*s %s\n", (int)strcspn(s->prog, " "), s->prog, TSR_VERSION);
            *exit_code = 0;
            return 1;
        }
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a), k;
        const tsr_cmdline_opt *o = find_opt(s->opts, s->nopts, a, nlen, &k);
        if (o == NULL)
            return usage_error(s, exit_code, "unknown option %.*s", (int)nlen, a);
        if (o->kind == TSR_CMDLINE_FLAG) {
            if (eq)
                return usage_error(s, exit_code, "%s takes no value", o->name);
            *(int *)o->dest = 1;
        } else {
            const char *v;
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return usage_error(s, exit_code, "%s needs a value", o->name);
            if (set_value(s->prog, o, v) != 0) {
                *exit_code = 2;
                return 1;
            }
        }
        seen[k] = 1;
    }
    for (size_t k = 0; k < s->nopts; k++)
        if (s->opts[k].required && !seen[k])
            return usage_error(s, exit_code, "%s is required", s->opts[k].name);
    if (nargs != NULL)
        *nargs = npos;
    return 0;
}

int tsr_cmdline_parse(const char *prog, int argc, char **argv, const tsr_cmdline_opt *opts,
                      size_t n, void (*usage)(FILE *), int *exit_code)
{
    tsr_cmdline_spec s = {prog, opts, n, usage, 0, 0};
    return tsr_cmdline_parse_spec(&s, argc, argv, NULL, exit_code);
}

/* ------------------------------------------------------------------ stop signal */

static sem_t stop_sem;
static volatile sig_atomic_t stop_sig;
static volatile sig_atomic_t hup_pending;
static int stop_ready;

static void on_stop_signal(int sig)
{
    if (stop_sig == 0)
        stop_sig = sig;
    sem_post(&stop_sem); /* async-signal-safe */
}

/* Installs handler for sig process-wide. SA_RESTART: a signal landing on a thread in
 * read() during a load must not turn into a spurious I/O error (sem_wait is never
 * restarted; stop_wait loops on EINTR). */
static void install_handler(int sig, void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

void tsr_cmdline_stop_init(void)
{
    if (stop_ready)
        return;
    stop_ready = 1;
    sem_init(&stop_sem, 0, 0);
    install_handler(SIGINT, on_stop_signal);
    install_handler(SIGTERM, on_stop_signal);
    signal(SIGPIPE, SIG_IGN);
}

static void on_hup_signal(int sig)
{
    (void)sig;
    hup_pending = 1;
    sem_post(&stop_sem);
}

void tsr_cmdline_hup_init(void)
{
    tsr_cmdline_stop_init();
    install_handler(SIGHUP, on_hup_signal);
}

int tsr_cmdline_stop_wait(void)
{
    tsr_cmdline_stop_init();
    while (sem_wait(&stop_sem) != 0 && errno == EINTR)
        ;
    if (stop_sig == 0 && hup_pending) {
        hup_pending = 0;
        return SIGHUP;
    }
    return stop_sig;
}

const char *tsr_cmdline_signame(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP"
                                                                                 : "signal";
}

/* ------------------------------------------------------------------ TLS file checks */

enum { PEM_MAX = 1 << 20 };

/* Reads a whole PEM file (at most 1 MiB, as rpc does; a FIFO is refused at once, not
 * waited on for ever). Returns a new NUL-terminated buffer (caller frees) or NULL with err
 * set. */
static char *read_pem(const char *flag, const char *path, size_t *len, tsr_error *err)
{
    tsr_error e = TSR_ERROR_INIT;
    char *buf;
    int rc = tsr_file_read(path, PEM_MAX, 0, &buf, len, &e);
    if (rc == 0)
        return buf;
    if (rc == TSR_ELIMIT)
        tsr_err(err, TSR_EFORMAT, "%s %s: larger than 1 MiB, expected a PEM file", flag, path);
    else
        tsr_err(err, rc, "%s %s, expected a PEM file", flag, e.msg);
    return NULL;
}

static void warn_validity(const char *flag, const char *path, X509 *x, int idx)
{
    char name[256] = "?";
    X509_NAME_oneline(X509_get_subject_name(x), name, sizeof name);
    if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0)
        tsr_warn("%s %s: certificate %d (%s) has expired: peers will refuse it", flag, path,
                 idx, name);
    else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0)
        tsr_warn("%s %s: certificate %d (%s) is not valid yet (clock skew?)", flag, path, idx,
                 name);
}

/* Parses every certificate of a PEM text; returns the first (caller frees) or NULL with
 * err set. *count = number of certificates. */
static X509 *load_certs(const char *flag, const char *path, const char *text, size_t len,
                        int *count, tsr_error *err)
{
    BIO *b = BIO_new_mem_buf(text, (int)len);
    X509 *first = NULL;
    *count = 0;
    if (b == NULL) {
        tsr_err(err, TSR_ENOMEM, "%s %s: out of memory", flag, path);
        return NULL;
    }
    for (;;) {
        X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
        if (x == NULL)
            break;
        warn_validity(flag, path, x, *count);
        if (first == NULL)
            first = x;
        else
            X509_free(x);
        (*count)++;
    }
    BIO_free(b);
    ERR_clear_error(); /* the loop ends with a "no start line" error */
    if (first == NULL) {
        if (strstr(text, "PRIVATE KEY-----"))
            tsr_err(err, TSR_EFORMAT, "%s %s: holds a private key, expected a PEM certificate "
                    "(-----BEGIN CERTIFICATE-----); were the cert and key files swapped?", flag,
                    path);
        else if (strstr(text, "-----BEGIN CERTIFICATE-----"))
            tsr_err(err, TSR_EFORMAT, "%s %s: the PEM certificate does not parse", flag, path);
        else
            tsr_err(err, TSR_EFORMAT, "%s %s: no PEM certificate in it (expected -----BEGIN "
                    "CERTIFICATE-----)", flag, path);
    }
    return first;
}

static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1; /* never prompt on a terminal: an encrypted key is an error */
}

static EVP_PKEY *load_key(const char *flag, const char *path, const char *text, size_t len,
                          tsr_error *err)
{
    BIO *b = BIO_new_mem_buf(text, (int)len);
    if (b == NULL) {
        tsr_err(err, TSR_ENOMEM, "%s %s: out of memory", flag, path);
        return NULL;
    }
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, no_password, NULL);
    BIO_free(b);
    ERR_clear_error();
    if (k == NULL) {
        if (strstr(text, "ENCRYPTED"))
            tsr_err(err, TSR_EFORMAT, "%s %s: the private key is encrypted; gRPC needs an "
                    "unencrypted PEM key (openssl pkey -in KEY -out PLAIN)", flag, path);
        else if (strstr(text, "-----BEGIN CERTIFICATE-----"))
            tsr_err(err, TSR_EFORMAT, "%s %s: holds a certificate, expected a PEM private key "
                    "(-----BEGIN PRIVATE KEY-----); were the cert and key files swapped?",
                    flag, path);
        else
            tsr_err(err, TSR_EFORMAT, "%s %s: no PEM private key in it (expected -----BEGIN "
                    "PRIVATE KEY----- or -----BEGIN RSA/EC PRIVATE KEY-----)", flag, path);
    }
    return k;
}

int tsr_cmdline_check_tls(const tsr_cmdline_tls *t, int client, tsr_error *errp)
{
    tsr_error local = TSR_ERROR_INIT, *err = errp ? errp : &local;
    const char *cf = t->cert_flag ? t->cert_flag : "certificate";
    const char *kf = t->key_flag ? t->key_flag : "key";
    const char *af = t->ca_flag ? t->ca_flag : "CA";
    if (!t->cert != !t->key)
        return tsr_err(err, TSR_EINVAL, "%s and %s go together: give both or neither", cf, kf);
    if (!client && t->ca && !t->cert)
        return tsr_err(err, TSR_EINVAL, "%s needs %s and %s (mutual TLS is on top of TLS)", af,
                       cf, kf);
    if (client && t->cert && !t->ca)
        return tsr_err(err, TSR_EINVAL, "%s needs %s (the CA that signed the server's "
                       "certificate)", cf, af);
    int rc = 0, count = 0;
    size_t len = 0;
    char *text = NULL;
    X509 *cert = NULL, *ca = NULL;
    EVP_PKEY *key = NULL;
    if (t->ca) {
        if ((text = read_pem(af, t->ca, &len, err)) == NULL ||
            (ca = load_certs(af, t->ca, text, len, &count, err)) == NULL) {
            rc = err->code ? err->code : TSR_EFORMAT;
            goto out;
        }
        free(text);
        text = NULL;
    }
    if (t->cert) {
        if ((text = read_pem(cf, t->cert, &len, err)) == NULL ||
            (cert = load_certs(cf, t->cert, text, len, &count, err)) == NULL) {
            rc = err->code ? err->code : TSR_EFORMAT;
            goto out;
        }
        free(text);
        if ((text = read_pem(kf, t->key, &len, err)) == NULL ||
            (key = load_key(kf, t->key, text, len, err)) == NULL) {
            rc = err->code ? err->code : TSR_EFORMAT;
            goto out;
        }
        if (X509_check_private_key(cert, key) != 1) {
            ERR_clear_error();
            rc = tsr_err(err, TSR_EFORMAT, "%s %s does not match the certificate of %s %s (the "
                         "key's public half differs from the certificate's public key)", kf,
                         t->key, cf, t->cert);
            goto out;
        }
    }
out:
    free(text);
    X509_free(cert);
    X509_free(ca);
    EVP_PKEY_free(key);
    return rc;
}
