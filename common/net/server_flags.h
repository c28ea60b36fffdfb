/*
 * server_flags — the flags both tessera servers take alike (tessera-shard,
 * tessera-coordinator): --listen, --data, --metrics-listen, --threads, --workers, the
 * server's TLS files (--tls-cert, --tls-key, --tls-client-ca), --max-message,
 * --peer-token-file and --insecure-no-auth. One table, so the two binaries accept them
 * with the same names, ranges and checks; each main parses them together with its own
 * options and keeps its own usage text (what a flag means for that server).
 *
 *   tsr_server_flags sf;
 *   tsr_server_flags_init(&sf, 2);                     // the server's default --workers
 *   const tsr_cmdline_opt own[] = {{"--config", TSR_CMDLINE_STR, &config, 0, 0, 1}};
 *   if (tsr_server_flags_parse(&sf, "tessera-x", argc, argv, own, 1, usage, &code))
 *       return code;
 *   if (tsr_server_flags_check_tls(&sf, &err) != 0) ...
 *   tsr_rpc_server_opts o;
 *   tsr_server_flags_server_opts(&sf, &o);             // then the server's own settings
 */
#ifndef TSR_SERVER_FLAGS_H
#define TSR_SERVER_FLAGS_H

#include <stddef.h>
#include <stdio.h>

#include "core/cmdline.h"
#include "core/error.h"
#include "net/rpc.h"

typedef struct tsr_server_flags {
    const char *listen;          /* --listen ADDR (required) */
    const char *data;            /* --data DIR (required) */
    const char *metrics_listen;  /* --metrics-listen ADDR, NULL = none */
    int threads;                 /* --threads 1..64, 0 = not given */
    int workers;                 /* --workers 1..64, the server's default when not given */
    const char *tls_cert, *tls_key, *tls_ca; /* --tls-cert, --tls-key, --tls-client-ca */
    size_t max_message;          /* --max-message 4K..2G-1, 0 = not given */
    const char *peer_token_file; /* --peer-token-file FILE, NULL = none */
    int insecure;                /* --insecure-no-auth */
} tsr_server_flags;

/* Zeroes f and sets the default of --workers. */
void tsr_server_flags_init(tsr_server_flags *f, int workers);

/* tsr_cmdline_parse over the server flags and the program's own options (n of them; at
 * most 64): returns 0 to go on, or 1 with *exit_code set, as tsr_cmdline_parse. */
int tsr_server_flags_parse(tsr_server_flags *f, const char *prog, int argc, char **argv,
                           const tsr_cmdline_opt *own, size_t n, void (*usage)(FILE *),
                           int *exit_code);

/* tsr_cmdline_check_tls of the server's TLS files (flags named in err). */
int tsr_server_flags_check_tls(const tsr_server_flags *f, tsr_error *err);

/* o initialised (tsr_rpc_server_opts_init) with the flags: listen, cqs = threads, workers,
 * max_message, the TLS files. The caller adds what is its own (pollers, a hint). */
void tsr_server_flags_server_opts(const tsr_server_flags *f, tsr_rpc_server_opts *o);

#endif
