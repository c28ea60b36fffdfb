/*
 * cmdline — the command-line plumbing shared by tessera, tessera-shard and
 * tessera-coordinator: an option table parser ("--name VALUE" / "--name=VALUE"; typed
 * values checked against a range: int, int64, uint64, double, byte size; strings,
 * repeated strings, flags; required options; positional arguments; --help), the
 * stop-signal wait, and checks of TLS PEM files given on the command line (so a wrong file
 * is reported at start, naming the flag and the file, instead of as a handshake failure on
 * the first call).
 *
 *   static const char *listen;  static int threads;
 *   const tsr_cmdline_opt opts[] = {
 *       {"--listen", TSR_CMDLINE_STR, &listen, 0, 0, 1},
 *       {"--threads", TSR_CMDLINE_INT, &threads, 1, 64, 0},
 *   };
 *   int code;
 *   tsr_cmdline_stop_init();                                   // first thing in main
 *   if (tsr_cmdline_parse("tessera-shard", argc, argv, opts, 2, usage, &code))
 *       return code;                                           // 0 after --help / --version, else 2
 *   ... start serving ...
 *   int sig = tsr_cmdline_stop_wait();                         // SIGINT or SIGTERM
 *
 * A bad value is reported on one line that names the flag, what was expected and what was
 * given, e.g. "tessera query: --k: expected an integer from 1 to 10000, got 'abc'".
 *
 * Why a semaphore and not sigwait: OpenBLAS starts a thread from a library constructor,
 * before main runs, so a process-wide signal mask set in main cannot cover every thread; a
 * SIGTERM delivered to that thread would take the default action and kill the process
 * without a graceful stop. A handler installed with sigaction is process-wide, and
 * sem_post is async-signal-safe.
 */
#ifndef TSR_CMDLINE_H
#define TSR_CMDLINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

enum tsr_cmdline_kind {
    TSR_CMDLINE_STR = 0, /* dest: const char ** (borrows argv), not empty */
    TSR_CMDLINE_INT,     /* dest: int *, value in min..max */
    TSR_CMDLINE_SIZE,    /* dest: size_t *, bytes with an optional K/M/G suffix (x1024),
                            value in min..max */
    TSR_CMDLINE_FLAG,    /* dest: int *, set to 1; takes no value */
    TSR_CMDLINE_INT64,   /* dest: int64_t *, value in min..max */
    TSR_CMDLINE_UINT64,  /* dest: uint64_t *, value in (unsigned)min..(unsigned)max: max -1
                            is UINT64_MAX */
    TSR_CMDLINE_DOUBLE,  /* dest: double *, a finite number in min..max */
    TSR_CMDLINE_LIST,    /* dest: tsr_cmdline_list *, every value of a repeated option in
                            order (borrows argv), none empty; the caller frees it with
                            tsr_cmdline_list_free */
    TSR_CMDLINE_STR_ANY  /* dest: const char ** (borrows argv), may be empty ("") */
};

typedef struct tsr_cmdline_opt {
    const char *name;   /* "--listen" */
    int kind;           /* enum tsr_cmdline_kind */
    void *dest;         /* see the kinds; written only when the option is given */
    long long min, max; /* INT, INT64, UINT64, DOUBLE and SIZE: accepted range, inclusive */
    int required;       /* nonzero: missing → usage error naming it */
} tsr_cmdline_opt;

/* The values of a TSR_CMDLINE_LIST option. Zero-initialise it. */
typedef struct tsr_cmdline_list {
    const char **v; /* owned array of borrowed strings */
    size_t n;
} tsr_cmdline_list;

void tsr_cmdline_list_free(tsr_cmdline_list *l);

/* Parses argv[1..argc-1] against the n options. --help / -h prints usage(stdout);
 * --version prints "PROG VERSION" (PROG's first word, TSR_VERSION) and exits 0.
 * Returns 0 to go on, or 1 with *exit_code set: 0 after --help or --version, 2 after a usage error
 * (the message, e.g. "tessera-shard: --threads: expected an integer from 1 to 64, got
 * '99'", and for an unknown, value-less or missing option then usage(stderr) are
 * printed). A repeated option keeps the last value (LIST: every value). An argument that
 * is not an option is a usage error. */
int tsr_cmdline_parse(const char *prog, int argc, char **argv, const tsr_cmdline_opt *opts,
                      size_t n, void (*usage)(FILE *), int *exit_code);

/* What a command of the tessera tool parses: its options, its usage text, and whether it
 * takes positional arguments. */
typedef struct tsr_cmdline_spec {
    const char *prog;            /* message prefix and --help hint: "tessera query" */
    const tsr_cmdline_opt *opts;
    size_t nopts;
    void (*usage)(FILE *);       /* the --help text */
    int max_args;                /* positional arguments accepted (0: none, -1: any) */
    int brief;                   /* nonzero: a usage error prints its one line and
                                    "(see PROG --help)", not the whole usage */
} tsr_cmdline_spec;

/* tsr_cmdline_parse with a spec. Arguments that do not start with '-' (a lone "-"
 * included), and every argument after "--", are positional: they are moved, in order, to
 * argv[1..*nargs] (nargs may be NULL when max_args is 0). More than max_args of them is a
 * usage error. Returns as tsr_cmdline_parse. */
int tsr_cmdline_parse_spec(const tsr_cmdline_spec *spec, int argc, char **argv, int *nargs,
                           int *exit_code);

/* Parses "65536", "64K", "4M", "1G" (binary multiples). Returns 0 or -1 (not a size,
 * or above SIZE_MAX). */
int tsr_cmdline_parse_size(const char *s, size_t *out);

/* Installs SIGINT/SIGTERM handlers that post the stop semaphore and ignores SIGPIPE.
 * Call it first in main, before anything slow: a signal that arrives while the process
 * is still starting is then remembered and tsr_cmdline_stop_wait returns at once. */
void tsr_cmdline_stop_init(void);

/* Blocks until SIGINT or SIGTERM arrives (or arrived since stop_init); returns it. After
 * tsr_cmdline_hup_init it also returns SIGHUP (once per burst of SIGHUPs, and only while
 * no stop signal has arrived): the caller reloads and waits again. */
int tsr_cmdline_stop_wait(void);

/* Makes SIGHUP wake tsr_cmdline_stop_wait instead of killing the process (its default
 * action). For servers that reload a file on SIGHUP. */
void tsr_cmdline_hup_init(void);

/* "SIGINT", "SIGTERM", "SIGHUP", or "signal". */
const char *tsr_cmdline_signame(int sig);

/* TLS files as given by flags; NULL = not given. The *_flag strings name the flags in
 * messages (e.g. "--tls-cert"). */
typedef struct tsr_cmdline_tls {
    const char *cert, *cert_flag; /* PEM certificate chain (leaf first) */
    const char *key, *key_flag;   /* PEM private key, unencrypted, matching cert's leaf */
    const char *ca, *ca_flag;     /* PEM CA bundle (at least one certificate) */
} tsr_cmdline_tls;

/* Checks the files before they go to rpc: each given file is readable and holds what it
 * should (certificates / an unencrypted private key), the key matches the certificate,
 * and the flags go together: cert and key both or neither; a server (client = 0) takes
 * its client CA only with a cert; a client (client = 1) needs the CA to use a cert.
 * Certificates outside their validity period are logged as warnings. Returns 0,
 * TSR_EINVAL (flags that do not go together), TSR_EIO (unreadable) or TSR_EFORMAT (wrong
 * content, mismatch), with err naming the flag, the file and what was expected. */
int tsr_cmdline_check_tls(const tsr_cmdline_tls *t, int client, tsr_error *err);

#endif
