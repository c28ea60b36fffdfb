/*
 * test_rpc_typed — the typed RPC layer (net/rpc_typed.h): malformed requests, the size limit
 * checked before the request is unpacked, the nesting check of recursive request types
 * (found from the descriptors), the mapping of a handler's tsr_error to a status with its
 * message, a status chosen by the handler, resp_free and deferred cleanups on success and
 * failure, raw replies; then the same over a real server and client, with a held reply
 * released from another thread; and the client side's tsr_rpc_result_unpack.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/protobuf/struct.pb-c.h"
#include "net/rpc_int.h"
#include "net/rpc_typed.h"
#include "tessera/v1/shard.pb-c.h"

typedef Tessera__V1__ShardListRequest Req;
typedef Tessera__V1__ShardListResponse Resp;

static int calls, frees, deferred; /* handler runs, resp_free runs, deferred cleanups */

static void count_deferred(void *arg)
{
    (*(int *)arg)++;
}

/* version: 1 → OK with labels {1, 2, 3} (malloc'ed, freed by list_free) and version echoed;
 * 2 → TSR_EINVAL with a message; 3 → TSR_ESTATE; 4 → TSR_ELIMIT; 5 → a bare TSR_ENOTFOUND
 * (no err); 6 → a status chosen with tsr_rpc_ctx_error; 7 → a raw reply; 8 → held and
 * released from another thread (over a server; detached: hold refused → UNAVAILABLE);
 * 9 → a message of its own (tsr_rpc_ctx_set_resp) freed after packing. */
static void *release_later(void *arg);

static void own_free(void *p)
{
    deferred += 10;
    protobuf_c_message_free_unpacked(p, NULL);
}

TSR_RPC_HANDLER(h_list, Req, Resp)
{
    calls++;
    tsr_rpc_ctx_defer(ctx, count_deferred, &deferred);
    resp->labels = malloc(3 * sizeof *resp->labels); /* attached before any failure */
    for (int i = 0; i < 3; i++)
        resp->labels[i] = i + 1;
    resp->n_labels = 3;
    switch (rq->version) {
    case 1:
        resp->version = rq->version;
        return 0;
    case 2:
        return tsr_err(err, TSR_EINVAL, "ShardListRequest.limit %d: expected 0..10", rq->limit);
    case 3:
        return tsr_err(err, TSR_ESTATE, "version 3: not held");
    case 4:
        return tsr_err(err, TSR_ELIMIT, "too many");
    case 5:
        return TSR_ENOTFOUND;
    case 6:
        return tsr_rpc_ctx_error(ctx, TSR_RPC_ABORTED, "aborted: %s", "conflict");
    case 7: {
        uint8_t *b = malloc(2);
        b[0] = 0x08; /* version = 42 */
        b[1] = 42;
        tsr_rpc_ctx_reply_raw(ctx, b, 2);
        return 0;
    }
    case 8: {
        int rc = tsr_rpc_ctx_hold(ctx);
        if (rc != 0)
            return tsr_err(err, rc, "cannot hold");
        pthread_t t;
        pthread_create(&t, NULL, release_later, ctx);
        pthread_detach(t);
        return 0;
    }
    case 9: {
        Resp *own = malloc(sizeof *own);
        tessera__v1__shard_list_response__init(own);
        own->version = 99;
        if (tsr_rpc_ctx_set_resp(ctx, (ProtobufCMessage *)(void *)&rq->base, NULL) != TSR_EINVAL)
            return TSR_EINTERNAL;
        return tsr_rpc_ctx_set_resp(ctx, &own->base, own_free);
    }
    default:
        return 0;
    }
}

static void *release_later(void *arg)
{
    tsr_rpc_ctx *ctx = arg;
    usleep(20000);
    Resp *resp = (Resp *)(void *)tsr_rpc_ctx_resp(ctx);
    resp->version = 88;
    tsr_rpc_ctx_release(ctx, 0, NULL);
    return NULL;
}

static void list_free(void *p)
{
    Resp *resp = p;
    frees++;
    free(resp->labels);
}

/* Struct in, empty ListResponse out: for the nesting check. */
TSR_RPC_HANDLER(h_struct, Google__Protobuf__Struct, Resp)
{
    calls++;
    resp->total = (int64_t)rq->n_fields;
    return 0;
}

static const tsr_rpc_method M[] = {
    {"/tessera.test.Typed/List", &tessera__v1__shard_list_request__descriptor,
     &tessera__v1__shard_list_response__descriptor, h_list, list_free, 0, 64},
    {"/tessera.test.Typed/Struct", &google__protobuf__struct__descriptor,
     &tessera__v1__shard_list_response__descriptor, h_struct, NULL, TSR_RPC_LONG, 0},
};

static uint8_t *pack_req(int64_t version, int32_t limit, size_t *len)
{
    Req r = TESSERA__V1__SHARD_LIST_REQUEST__INIT;
    r.version = version;
    r.limit = limit;
    return tsr_rpc_pack(&r.base, len);
}

static int run(const tsr_rpc_method *m, const uint8_t *b, size_t n, tsr__rpc_detached *d)
{
    calls = frees = deferred = 0;
    return tsr__rpc_run_typed_detached(m, NULL, b, n, d);
}

static void test_malformed(void **state)
{
    (void)state;
    tsr__rpc_detached d;
    const uint8_t bad[] = {0x08, 0xff, 0xff}; /* a varint cut short */
    assert_int_equal(run(&M[0], bad, sizeof bad, &d), TSR_RPC_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "ShardListRequest: malformed protobuf");
    assert_int_equal(calls, 0);
    tsr__rpc_detached_close(&d);
    const uint8_t wrong_type[] = {0x0a, 0x01, 0x00}; /* field 1 length-delimited, an int64 */
    assert_int_equal(run(&M[0], wrong_type, sizeof wrong_type, &d), TSR_RPC_INVALID_ARGUMENT);
    assert_int_equal(calls, 0);
    tsr__rpc_detached_close(&d);
}

static void test_oversize(void **state)
{
    (void)state;
    /* 70 bytes, well-formed (an unknown bytes field 15): over the method's 64, refused
     * before it is unpacked, so the handler never runs */
    uint8_t b[70];
    memset(b, 'x', sizeof b);
    b[0] = (15 << 3) | 2;
    b[1] = sizeof b - 2;
    tsr__rpc_detached d;
    assert_int_equal(run(&M[0], b, sizeof b, &d), TSR_RPC_RESOURCE_EXHAUSTED);
    assert_string_equal(d.msg, "ShardListRequest: request of 70 bytes exceeds the limit of 64 "
                               "bytes");
    assert_int_equal(calls, 0);
    tsr__rpc_detached_close(&d);
    /* 64 bytes: accepted */
    b[1] = 62;
    assert_int_equal(run(&M[0], b, 64, &d), TSR_RPC_OK);
    assert_int_equal(calls, 1);
    tsr__rpc_detached_close(&d);
}

static void test_status_mapping(void **state)
{
    (void)state;
    static const struct {
        int64_t version;
        int code;
        const char *msg;
    } T[] = {
        {2, TSR_RPC_INVALID_ARGUMENT, "ShardListRequest.limit 9: expected 0..10"},
        {3, TSR_RPC_FAILED_PRECONDITION, "version 3: not held"},
        {4, TSR_RPC_RESOURCE_EXHAUSTED, "too many"},
        {5, TSR_RPC_NOT_FOUND, "ShardListRequest: not found"},
        {6, TSR_RPC_ABORTED, "aborted: conflict"},
        {8, TSR_RPC_UNAVAILABLE, "cannot hold"}, /* detached: no hold */
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        size_t n;
        uint8_t *b = pack_req(T[i].version, 9, &n);
        tsr__rpc_detached d;
        assert_int_equal(run(&M[0], b, n, &d), T[i].code);
        assert_string_equal(d.msg, T[i].msg);
        assert_null(d.resp); /* an error sends no response */
        /* what the handler attached is freed on failure too */
        assert_int_equal(calls, 1);
        assert_int_equal(frees, 1);
        assert_int_equal(deferred, 1);
        tsr__rpc_detached_close(&d);
        free(b);
    }
}

static void test_ok_and_raw(void **state)
{
    (void)state;
    size_t n;
    uint8_t *b = pack_req(1, 0, &n);
    tsr__rpc_detached d;
    assert_int_equal(run(&M[0], b, n, &d), TSR_RPC_OK);
    assert_null(d.msg);
    Resp *r = tessera__v1__shard_list_response__unpack(NULL, d.len, d.resp);
    assert_non_null(r);
    assert_int_equal(r->version, 1);
    assert_int_equal(r->n_labels, 3);
    assert_int_equal(r->labels[2], 3);
    tessera__v1__shard_list_response__free_unpacked(r, NULL);
    assert_int_equal(frees, 1);
    assert_int_equal(deferred, 1);
    tsr__rpc_detached_close(&d);
    free(b);
    b = pack_req(7, 0, &n);
    assert_int_equal(run(&M[0], b, n, &d), TSR_RPC_OK);
    assert_int_equal(d.len, 2);
    assert_int_equal(d.resp[1], 42);
    assert_int_equal(frees, 1);
    tsr__rpc_detached_close(&d);
    free(b);
    b = pack_req(9, 0, &n);
    assert_int_equal(run(&M[0], b, n, &d), TSR_RPC_OK);
    r = tessera__v1__shard_list_response__unpack(NULL, d.len, d.resp);
    assert_non_null(r);
    assert_int_equal(r->version, 99);
    assert_int_equal(r->n_labels, 0);
    tessera__v1__shard_list_response__free_unpacked(r, NULL);
    assert_int_equal(deferred, 11);
    tsr__rpc_detached_close(&d);
    free(b);
    /* an empty request is the message with every field default */
    assert_int_equal(run(&M[0], NULL, 0, &d), TSR_RPC_OK);
    assert_int_equal(calls, 1);
    tsr__rpc_detached_close(&d);
}

/* A Struct nested `levels` JSON levels deep (3 message levels each), packed. */
static uint8_t *deep_struct(int levels, size_t *len)
{
    Google__Protobuf__Struct *st = calloc((size_t)levels + 1, sizeof *st);
    Google__Protobuf__Struct__FieldsEntry *en = calloc((size_t)levels, sizeof *en);
    Google__Protobuf__Struct__FieldsEntry **enp = calloc((size_t)levels, sizeof *enp);
    Google__Protobuf__Value *va = calloc((size_t)levels, sizeof *va);
    for (int i = 0; i <= levels; i++)
        google__protobuf__struct__init(&st[i]);
    for (int i = 0; i < levels; i++) {
        google__protobuf__struct__fields_entry__init(&en[i]);
        google__protobuf__value__init(&va[i]);
        va[i].kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
        va[i].struct_value = &st[i + 1];
        en[i].key = (char *)"a";
        en[i].value = &va[i];
        enp[i] = &en[i];
        st[i].fields = &enp[i];
        st[i].n_fields = 1;
    }
    uint8_t *b = tsr_rpc_pack(&st[0].base, len);
    free(st);
    free(en);
    free(enp);
    free(va);
    return b;
}

static void test_nesting(void **state)
{
    (void)state;
    assert_int_equal(tsr_rpc_type_recursive(&google__protobuf__struct__descriptor), 1);
    assert_int_equal(tsr_rpc_type_recursive(&google__protobuf__value__descriptor), 1);
    assert_int_equal(tsr_rpc_type_recursive(&tessera__v1__shard_list_request__descriptor), 0);
    assert_int_equal(tsr_rpc_type_recursive(&tessera__v1__shard_search_request__descriptor), 0);
    assert_int_equal(tsr_rpc_type_recursive(&tessera__v1__stage_request__descriptor), 1);
    size_t n;
    uint8_t *b = deep_struct(TSR_RPC_MAX_DEPTH / 3, &n);
    tsr__rpc_detached d;
    assert_int_equal(run(&M[1], b, n, &d), TSR_RPC_OK);
    assert_int_equal(calls, 1);
    tsr__rpc_detached_close(&d);
    free(b);
    b = deep_struct(TSR_RPC_MAX_DEPTH / 3 + 1, &n);
    assert_int_equal(run(&M[1], b, n, &d), TSR_RPC_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "Struct: sub-messages nest deeper than 256 levels");
    assert_int_equal(calls, 0);
    tsr__rpc_detached_close(&d);
    free(b);
}

/* Over a real server and client: registration, LONG, a status, a held reply. */
static void test_server(void **state)
{
    (void)state;
    tsr_rpc_server_opts o;
    tsr_rpc_server_opts_init(&o);
    o.pollers = 2;
    tsr_error err = TSR_ERROR_INIT;
    tsr_rpc_server *s = tsr_rpc_server_create(&o, &err);
    assert_non_null(s);
    assert_int_equal(tsr_rpc_server_add_typed(s, M, 2, NULL), 0);
    assert_int_equal(tsr_rpc_server_add_typed(s, M, 1, NULL), TSR_EINVAL); /* duplicate */
    tsr_rpc_method broken = M[0];
    broken.path = "/tessera.test.Typed/Broken";
    broken.resp = NULL;
    assert_int_equal(tsr_rpc_server_add_typed(s, &broken, 1, NULL), TSR_EINVAL);
    assert_int_equal(tsr_rpc_server_start(s, &err), 0);
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", tsr_rpc_server_port(s));
    tsr_rpc_channel *ch = tsr_rpc_channel_create(target, NULL, &err);
    assert_non_null(ch);
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    static const int64_t versions[] = {1, 3, 8};
    static const int64_t want_version[] = {1, 0, 88};
    static const int codes[] = {TSR_RPC_OK, TSR_RPC_FAILED_PRECONDITION, TSR_RPC_OK};
    for (size_t i = 0; i < 3; i++) {
        Req rq = TESSERA__V1__SHARD_LIST_REQUEST__INIT;
        rq.version = versions[i];
        ProtobufCMessage *out = NULL;
        assert_int_equal(tsr_rpc_call_pb(ch, M[0].path, &rq.base,
                                         &tessera__v1__shard_list_response__descriptor, 5000,
                                         &out, &res),
                         codes[i]);
        if (codes[i] == TSR_RPC_OK) {
            Resp *r = (Resp *)(void *)out;
            assert_int_equal(r->version, want_version[i]);
            assert_int_equal(r->n_labels, 3);
            protobuf_c_message_free_unpacked(out, NULL);
        } else {
            assert_string_equal(res.message, "version 3: not held");
        }
    }
    const uint8_t bad[] = {0x08, 0xff};
    assert_int_equal(tsr_rpc_call(ch, M[0].path, bad, sizeof bad, 5000, &res),
                     TSR_RPC_INVALID_ARGUMENT);
    assert_string_equal(res.message, "ShardListRequest: malformed protobuf");
    size_t n;
    uint8_t *b = deep_struct(TSR_RPC_MAX_DEPTH, &n);
    assert_int_equal(tsr_rpc_call(ch, M[1].path, b, n, 5000, &res), TSR_RPC_INVALID_ARGUMENT);
    free(b);
    tsr_rpc_result_close(&res);
    tsr_rpc_channel_destroy(ch);
    tsr_rpc_server_destroy(s);
}

/* The client side: a fan-out result's reply unpacked, or the result turned INTERNAL. */
static void test_result_unpack(void **state)
{
    (void)state;
    tsr_rpc_result res;
    tsr_rpc_result_init(&res);
    const ProtobufCMessageDescriptor *d = &tessera__v1__shard_list_response__descriptor;
    res.data = malloc(2);
    res.data[0] = 0x08; /* version = 5 */
    res.data[1] = 5;
    res.len = 2;
    Resp *r = (Resp *)(void *)tsr_rpc_result_unpack(&res, d, NULL);
    assert_non_null(r);
    assert_int_equal(r->version, 5);
    assert_int_equal(res.code, TSR_RPC_OK);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    res.data[1] = 0xff; /* cut short */
    assert_null(tsr_rpc_result_unpack(&res, d, NULL));
    assert_int_equal(res.code, TSR_RPC_INTERNAL);
    assert_string_equal(res.message, "malformed ShardListResponse");
    assert_null(tsr_rpc_result_unpack(&res, d, NULL)); /* not OK: nothing */
    tsr_rpc_result_close(&res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test(test_status_mapping),
        cmocka_unit_test(test_ok_and_raw),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_server),
        cmocka_unit_test(test_result_unpack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
