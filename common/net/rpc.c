/*
 * rpc — the parts of the rpc module shared by server and client: status code names, the
 * one mapping between TSR error codes and gRPC status codes, protobuf-c packing helpers,
 * and small gRPC core utilities (reading byte buffers, deadlines, PEM files).
 * The server is in rpc_server.c, the client in rpc_client.c; the API is in rpc.h.
 */
#include "net/rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "core/file.h"
#include "core/mem.h"
#include "net/rpc_int.h"

const char *tsr_rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0]))
        return "UNKNOWN_CODE";
    return names[code];
}

int tsr_rpc_status_from_error(int tsr_code)
{
    switch (tsr_code) {
    case TSR_OK: return TSR_RPC_OK;
    case TSR_EINVAL: return TSR_RPC_INVALID_ARGUMENT;
    case TSR_ENOTFOUND: return TSR_RPC_NOT_FOUND;
    case TSR_ESTATE: return TSR_RPC_FAILED_PRECONDITION;
    case TSR_EUNAVAILABLE: return TSR_RPC_UNAVAILABLE;
    case TSR_ETIMEOUT: return TSR_RPC_DEADLINE_EXCEEDED;
    case TSR_ELIMIT: return TSR_RPC_RESOURCE_EXHAUSTED;
    default: return TSR_RPC_INTERNAL;
    }
}

int tsr_rpc_error_from_status(int grpc_code)
{
    switch (grpc_code) {
    case TSR_RPC_OK: return TSR_OK;
    case TSR_RPC_INVALID_ARGUMENT:
    case TSR_RPC_OUT_OF_RANGE: return TSR_EINVAL;
    case TSR_RPC_NOT_FOUND: return TSR_ENOTFOUND;
    case TSR_RPC_FAILED_PRECONDITION:
    case TSR_RPC_ABORTED: return TSR_ESTATE;
    case TSR_RPC_UNAVAILABLE:
    case TSR_RPC_CANCELLED: return TSR_EUNAVAILABLE;
    case TSR_RPC_DEADLINE_EXCEEDED: return TSR_ETIMEOUT;
    case TSR_RPC_RESOURCE_EXHAUSTED: return TSR_ELIMIT;
    case TSR_RPC_UNIMPLEMENTED: return TSR_EUNSUPPORTED;
    default: return TSR_EINTERNAL;
    }
}

uint8_t *tsr_rpc_pack(const ProtobufCMessage *msg, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = tsr_try_malloc(n ? n : 1, 1);
    if (!buf)
        return NULL;
    *len = protobuf_c_message_pack(msg, buf);
    return buf;
}

/* ---- internal helpers ---- */

atomic_int tsr__rpc_pollers_running;

char *tsr__rpc_read_file(const char *path, const char *what, tsr_error *err)
{
    tsr_error e = TSR_ERROR_INIT;
    char *buf;
    size_t len;
    int rc = tsr_file_read(path, 1 << 20, 0, &buf, &len, &e); /* a PEM file is a few KiB */
    if (rc == 0)
        return buf;
    tsr_err(err, rc, "%s %s", what, e.msg);
    return NULL;
}

char *tsr__rpc_slice_strdup(grpc_slice s)
{
    size_t n = GRPC_SLICE_LENGTH(s);
    char *p = tsr_xmalloc(n + 1);
    if (n)
        memcpy(p, GRPC_SLICE_START_PTR(s), n);
    p[n] = 0;
    return p;
}

grpc_slice tsr__rpc_buffer_to_slice(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return s;
}

int64_t tsr__rpc_remaining_ms(gpr_timespec d)
{
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0)
        return INT64_MAX;
    gpr_timespec m = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(m, gpr_now(GPR_CLOCK_MONOTONIC));
    return gpr_time_to_millis(left);
}

gpr_timespec tsr__rpc_deadline(int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        timeout_ms = 30000;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

#if defined(__SANITIZE_THREAD__)
/* gRPC core, gpr and abseil are not built with ThreadSanitizer, so their internal
 * synchronization is invisible to it and their own accesses show up as races (e.g. abseil's
 * deadlock-detection graph, epoll fds). Suppress reports that happen inside those
 * libraries; races in Tessera's code still report (rpc marks its hand-overs to core with
 * TSR_TSAN_RELEASE/ACQUIRE). Picked up by the TSan runtime in every binary that links
 * the rpc module. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libgrpc.so\n"
           "called_from_lib:libgpr.so\n"
           "called_from_lib:libupb.so\n"
           "called_from_lib:libcrypto.so.3\n"
           "called_from_lib:libssl.so.3\n"
           "race:libcrypto.so\n"
           "race:libssl.so\n"
           "race:absl::\n"
           "race:grpc_core::\n"
           "race:grpc_event_engine::\n"
           "race:libgrpc.so\n"
           "race:libgpr.so\n"
           "race:libabsl_*\n"
           "deadlock:libgrpc.so\n"
           "deadlock:libabsl_*\n"
           "mutex:libgrpc.so\n";
}
#endif

/* ---------------------------------------------------------------- nesting depth */

static int rd_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int sh = 0; sh < 64 && *p < end; sh += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

int tsr_rpc_too_deep(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                     int max_depth)
{
    const uint8_t *p = data, *end = data ? data + len : data;
    while (p < end) {
        uint64_t key, n;
        if (rd_varint(&p, end, &key))
            return 0;
        switch (key & 7) {
        case 0: /* varint */
            if (rd_varint(&p, end, &n))
                return 0;
            break;
        case 1: /* fixed64 */
            if (end - p < 8)
                return 0;
            p += 8;
            break;
        case 5: /* fixed32 */
            if (end - p < 4)
                return 0;
            p += 4;
            break;
        case 2: { /* length-delimited: a sub-message when desc says so */
            if (rd_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return 0;
            const ProtobufCFieldDescriptor *f =
                key >> 3 <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(key >> 3))
                    : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                (max_depth <= 0 || tsr_rpc_too_deep(f->descriptor, p, (size_t)n, max_depth - 1)))
                return 1;
            p += n;
            break;
        }
        default: /* groups (3, 4) and invalid types: protobuf-c refuses the message */
            return 0;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- repeated fields */

long tsr_rpc_split_repeated(const uint8_t *data, size_t len, unsigned field, size_t *at,
                            size_t cap)
{
    const uint8_t *p = data, *end = data ? data + len : data;
    size_t k = 0;
    while (p < end) {
        uint64_t key, n;
        const uint8_t *start = p;
        if (rd_varint(&p, end, &key) || key != (((uint64_t)field << 3) | 2u) || k == cap ||
            rd_varint(&p, end, &n) || n > (uint64_t)(end - p))
            return -1;
        at[k++] = (size_t)(start - data);
        p += n;
    }
    return (long)k;
}
