/*
 * fuzz_metrics_http — the /metrics listener's request parser and router on arbitrary
 * bytes. Feeds the input whole and also byte-prefix by prefix (as the listener sees it
 * arriving in pieces), checks the parser's invariants (a final verdict on a prefix is
 * the verdict on the whole input, head_len within the input, NUL-terminated fields) and builds the response for every verdict.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/metrics.h"
#include "net/metrics_http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    tsr_http_request req;
    int whole = tsr_http_parse_request(buf, size, &req);
    if (whole == TSR_HTTP_DONE) {
        if (req.head_len == 0 || req.head_len > size) abort();
        if (strlen(req.method) >= sizeof req.method || strlen(req.path) >= sizeof req.path) abort();
        if (req.path[0] != '/') abort();
    }
    if (whole == TSR_HTTP_INCOMPLETE && size >= TSR_METRICS_HTTP_MAX_REQUEST) abort();
    /* Prefixes: once a prefix gives a final verdict, longer input must not change it
     * (the listener answers at the first final verdict). */
    int first_final = TSR_HTTP_INCOMPLETE;
    size_t step = size > 512 ? size / 64 : 1;
    for (size_t n = 0; n <= size; n += step) {
        tsr_http_request r;
        int v = tsr_http_parse_request(buf, n, &r);
        if (v != TSR_HTTP_INCOMPLETE) {
            first_final = v;
            if (v == TSR_HTTP_DONE && r.head_len != req.head_len) abort();
            break;
        }
    }
    if (first_final != TSR_HTTP_INCOMPLETE && first_final != whole) abort();
    size_t len = 0;
    char *resp = tsr_http_respond(whole, whole == TSR_HTTP_DONE ? &req : NULL, size & 1, &len);
    if (whole != TSR_HTTP_INCOMPLETE && !resp) abort();
    if (resp && (len < 17 || memcmp(resp, "HTTP/1.1 ", 9) != 0)) abort();
    free(resp);
    return 0;
}
