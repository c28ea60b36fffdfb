/*
 * server_flags — the flags both tessera servers take alike (contract in server_flags.h).
 */
#include "net/server_flags.h"

#include <stdint.h>
#include <string.h>

#define NFLAGS 11
#define MAX_OWN 64

void tsr_server_flags_init(tsr_server_flags *f, int workers)
{
    memset(f, 0, sizeof *f);
    f->workers = workers;
}

int tsr_server_flags_parse(tsr_server_flags *f, const char *prog, int argc, char **argv,
                           const tsr_cmdline_opt *own, size_t n, void (*usage)(FILE *),
                           int *exit_code)
{
    const tsr_cmdline_opt flags[NFLAGS] = {
        {"--listen", TSR_CMDLINE_STR, &f->listen, 0, 0, 1},
        {"--data", TSR_CMDLINE_STR, &f->data, 0, 0, 1},
        {"--metrics-listen", TSR_CMDLINE_STR, &f->metrics_listen, 0, 0, 0},
        {"--threads", TSR_CMDLINE_INT, &f->threads, 1, 64, 0},
        {"--workers", TSR_CMDLINE_INT, &f->workers, 1, 64, 0},
        {"--tls-cert", TSR_CMDLINE_STR, &f->tls_cert, 0, 0, 0},
        {"--tls-key", TSR_CMDLINE_STR, &f->tls_key, 0, 0, 0},
        {"--tls-client-ca", TSR_CMDLINE_STR, &f->tls_ca, 0, 0, 0},
        {"--max-message", TSR_CMDLINE_SIZE, &f->max_message, 4096, INT32_MAX, 0},
        {"--peer-token-file", TSR_CMDLINE_STR, &f->peer_token_file, 0, 0, 0},
        {"--insecure-no-auth", TSR_CMDLINE_FLAG, &f->insecure, 0, 0, 0},
    };
    tsr_cmdline_opt all[NFLAGS + MAX_OWN];
    if (n > MAX_OWN) {
        fprintf(stderr, "%s: too many options in the table\n", prog);
        *exit_code = 2;
        return 1;
    }
    memcpy(all, flags, sizeof flags);
    if (n > 0)
        memcpy(all + NFLAGS, own, n * sizeof *own);
    return tsr_cmdline_parse(prog, argc, argv, all, NFLAGS + n, usage, exit_code);
}

int tsr_server_flags_check_tls(const tsr_server_flags *f, tsr_error *err)
{
    tsr_cmdline_tls tls = {f->tls_cert, "--tls-cert", f->tls_key, "--tls-key", f->tls_ca,
                           "--tls-client-ca"};
    return tsr_cmdline_check_tls(&tls, 0, err);
}

void tsr_server_flags_server_opts(const tsr_server_flags *f, tsr_rpc_server_opts *o)
{
    tsr_rpc_server_opts_init(o);
    o->listen = f->listen;
    o->cqs = f->threads;
    o->workers = f->workers;
    o->max_message = f->max_message;
    o->tls_cert_file = f->tls_cert;
    o->tls_key_file = f->tls_key;
    o->tls_client_ca_file = f->tls_ca;
}
