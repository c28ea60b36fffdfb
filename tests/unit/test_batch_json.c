/*
 * test_batch_json — the JSON reader against SPEC §2: the seed examples, unknown-field
 * errors with suggestions, every record-level error type, and embedding_metadata (its
 * google.protobuf.Struct bytes decoded and re-packed by protobuf-c, its limits).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "batch/batch_json.h"
#include "batch_test_sink.h"
#include "google/protobuf/struct.pb-c.h"

static coll *parse(const char *text, size_t dims)
{
    coll *c = coll_new();
    tsr_record_sink s = SINK(c);
    tsr_error err = TSR_ERROR_INIT;
    assert_int_equal(tsr_batch_json_read_mem(text, strlen(text), dims, &s, &err), 0);
    return c;
}

/* One line that must be invalid with type; the message must contain `needle`. */
static void expect_bad(const char *line, size_t dims, enum tsr_rec_error type, const char *needle)
{
    coll *c = parse(line, dims);
    if (c->nbad != 1 || c->types[0] != type)
        fail_msg("'%s': expected %s, got %zu errors (first %s: %s), %zu records", line,
                 tsr_rec_error_name(type), c->nbad, c->nbad ? tsr_rec_error_name(c->types[0]) : "-",
                 c->nbad ? c->msgs[0] : "", c->nrecs);
    if (needle && strstr(c->msgs[0], needle) == NULL)
        fail_msg("'%s': message '%s' lacks '%s'", line, c->msgs[0], needle);
    assert_int_equal(c->nrecs, 0);
    coll_free(c);
}

static void test_seed_examples(void **state)
{
    (void)state;
    coll *c = parse(
        "{\"id\": \"1\", \"embedding\": [1,1,1]}\n"
        "{\"id\": \"2\", \"embedding\": [2,2,2]}\n"
        "{\"id\": \"3\", \"sparse_embedding\": {\"values\": [0.1, 0.2], \"dimensions\": [1, 4]}}\n"
        "{\"id\": \"4\", \"sparse_embedding\": {\"values\": [-0.4, 0.2, -1.3], \"dimensions\": [10, 20, 20]}}\n"
        "{\"id\": \"5\", \"embedding\": [5, 5, -5], \"sparse_embedding\": {\"values\": [0.1], \"dimensions\": [500]}}\n"
        "{\"id\": \"6\", \"embedding\": [6, 7, -8.1], \"sparse_embedding\": {\"values\": [0.1, -0.2], \"dimensions\": [40, 901]}}\n",
        3);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 6);
    assert_string_equal(c->recs[0].id, "1");
    assert_int_equal(c->recs[0].ndense, 3);
    assert_int_equal(c->recs[0].nsparse, 0);
    assert_int_equal(c->recs[2].ndense, 0);
    assert_int_equal(c->recs[2].nsparse, 2);
    assert_int_equal(c->recs[2].sparse_dims[1], 4);
    assert_true(c->recs[2].sparse_vals[1] == 0.2f);
    /* [10, 20, 20]: duplicate dimensions summed */
    assert_int_equal(c->recs[3].nsparse, 2);
    assert_int_equal(c->recs[3].sparse_dims[1], 20);
    assert_true(c->recs[3].sparse_vals[1] == 0.2f + -1.3f);
    assert_true(c->recs[5].dense[2] == -8.1f);
    assert_int_equal(c->recs[5].sparse_dims[1], 901);
    assert_int_equal(c->rec_where[5], 6);
    coll_free(c);
}

static void test_full_record(void **state)
{
    (void)state;
    coll *c = parse("{\"id\": \"7\", \"embedding\": [1,2,3], \"restricts\": [{\"namespace\": "
                    "\"color\", \"allow\": [\"red\"], \"deny\": [\"blue\"]}], \"numeric_restricts\": "
                    "[{\"namespace\": \"size\", \"value_int\": 3}, {\"namespace\": \"r\", "
                    "\"value_float\": 0.1}, {\"namespace\": \"w\", \"value_double\": 0.3}], "
                    "\"crowding_tag\": \"shop-9\"}",
                    3);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 1);
    tsr_datapoint *d = &c->recs[0];
    assert_int_equal(d->nrestricts, 1);
    assert_string_equal(d->restricts[0].ns, "color");
    assert_string_equal(d->restricts[0].allow[0], "red");
    assert_string_equal(d->restricts[0].deny[0], "blue");
    assert_int_equal(d->nnumeric, 3);
    assert_int_equal(d->numeric[0].type, TSR_NUM_INT);
    assert_int_equal(d->numeric[0].v.i, 3);
    assert_int_equal(d->numeric[1].type, TSR_NUM_FLOAT);
    assert_true(d->numeric[1].v.f == 0.1f);
    assert_int_equal(d->numeric[2].type, TSR_NUM_DOUBLE);
    assert_true(d->numeric[2].v.d == 0.3);
    assert_string_equal(d->crowding_tag, "shop-9");
    coll_free(c);
    /* allow only, deny only */
    c = parse("{\"id\": \"a\", \"embedding\": [1,2,3], \"restricts\": [{\"namespace\": \"c\", "
              "\"allow\": [\"x\"]}, {\"namespace\": \"d\", \"deny\": [\"y\"]}, {\"namespace\": \"c\", "
              "\"allow\": [\"z\"]}]}",
              3);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 1);
    assert_int_equal(c->recs[0].nrestricts, 2); /* same namespace twice: merged */
    assert_int_equal(c->recs[0].restricts[0].nallow, 2);
    assert_string_equal(c->recs[0].restricts[0].allow[1], "z");
    assert_int_equal(c->recs[0].restricts[1].ndeny, 1);
    coll_free(c);
    /* nulls are absent; empty embedding with a sparse one is sparse-only (as in Avro) */
    c = parse("{\"id\": \"n\", \"embedding\": [], \"sparse_embedding\": {\"values\": [1], "
              "\"dimensions\": [2]}, \"restricts\": null, \"numeric_restricts\": null, "
              "\"crowding_tag\": null}",
              3);
    assert_int_equal(c->nrecs, 1);
    assert_int_equal(c->recs[0].ndense, 0);
    assert_null(c->recs[0].crowding_tag);
    coll_free(c);
}

static void test_unknown_fields(void **state)
{
    (void)state;
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"restricts\":[{\"namespace\":\"c\",\"allow_list\":[\"x\"]}]}",
               1, TSR_REC_PARSING_ERROR, "'allow_list' in restricts[0]; did you mean 'allow'");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"restricts\":[{\"namespace\":\"c\",\"deny_list\":[\"x\"]}]}",
               1, TSR_REC_PARSING_ERROR, "did you mean 'deny'");
    expect_bad("{\"id\":\"a\",\"sparse_embeddings\":{\"values\":[1],\"dimensions\":[1]}}", 1,
               TSR_REC_PARSING_ERROR, "did you mean 'sparse_embedding'");
    expect_bad("{\"id\":\"a\",\"feature_vector\":[1]}", 1, TSR_REC_PARSING_ERROR,
               "did you mean 'embedding'");
    expect_bad("{\"datapoint_id\":\"a\",\"embedding\":[1]}", 1, TSR_REC_PARSING_ERROR,
               "did you mean 'id'");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"crowdingTag\":\"x\"}", 1, TSR_REC_PARSING_ERROR,
               "did you mean 'crowding_tag'");
    expect_bad("{\"id\":\"a\",\"embeding\":[1]}", 1, TSR_REC_PARSING_ERROR, "did you mean 'embedding'");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"zzzzzz\":1}", 1, TSR_REC_PARSING_ERROR,
               "known fields: id, embedding");
    expect_bad("{\"id\":\"a\",\"sparse_embedding\":{\"values\":[1],\"dims\":[1]}}", 1,
               TSR_REC_PARSING_ERROR, "did you mean 'dimensions'");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"c\",\"valueInt\":1}]}",
               1, TSR_REC_PARSING_ERROR, "did you mean 'value_int'");
}

static void test_errors(void **state)
{
    (void)state;
    expect_bad("{\"id\":\"a\",\"embedding\":[1,2,3]}", 2, TSR_REC_EMBEDDING_SIZE_MISMATCH, "3 values");
    expect_bad("{\"id\":\"a\",\"embedding\":[1]}", 2, TSR_REC_EMBEDDING_SIZE_MISMATCH, NULL);
    expect_bad("{\"id\":\"a\",\"sparse_embedding\":{\"values\":[1,2],\"dimensions\":[1]}}", 2,
               TSR_REC_INVALID_SPARSE_EMBEDDING, "2 values but 1 dimensions");
    expect_bad("{\"id\":\"a\",\"sparse_embedding\":{\"values\":[1],\"dimensions\":[1.5]}}", 2,
               TSR_REC_INVALID_SPARSE_DIMENSIONS, NULL);
    expect_bad("{\"id\":\"a\",\"sparse_embedding\":{\"values\":[\"x\"],\"dimensions\":[1]}}", 2,
               TSR_REC_INVALID_SPARSE_EMBEDDING, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\",\"value_int\":3,\"op\":\"LESS\"}]}",
               1, TSR_REC_OP_IN_DATAPOINT, "op");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\",\"value_int\":3,\"value_float\":1}]}",
               1, TSR_REC_MULTIPLE_VALUES, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\"}]}", 1,
               TSR_REC_INVALID_NUMERIC_VALUE, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\",\"value_int\":1.5}]}",
               1, TSR_REC_INVALID_NUMERIC_VALUE, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\",\"value_float\":1e39}]}",
               1, TSR_REC_INVALID_NUMERIC_VALUE, "float range");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"namespace\":\"s\",\"value_int\":1},{\"namespace\":\"s\",\"value_int\":2}]}",
               1, TSR_REC_DUPLICATE_NAMESPACE, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"numeric_restricts\":[{\"value_int\":1}]}", 1,
               TSR_REC_NAMESPACE_MISSING, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"restricts\":[{\"allow\":[\"x\"]}]}", 1,
               TSR_REC_NAMESPACE_MISSING, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"restricts\":[{\"namespace\":\"c\",\"allow\":[1]}]}", 1,
               TSR_REC_INVALID_TOKEN_VALUE, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1e39]}", 1, TSR_REC_INVALID_EMBEDDING, "float range");
    expect_bad("{\"id\":\"a\",\"embedding\":[\"1\"]}", 1, TSR_REC_INVALID_EMBEDDING, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[NaN]}", 1, TSR_REC_INVALID_JSON_SYNTAX, NULL);
    expect_bad("{\"id\":\"a\"}", 1, TSR_REC_INVALID_EMBEDDING, "no embedding");
    expect_bad("{\"id\":1,\"embedding\":[1]}", 1, TSR_REC_INVALID_EMBEDDING_ID, NULL);
    expect_bad("{\"embedding\":[1]}", 1, TSR_REC_INVALID_EMBEDDING_ID, NULL);
    expect_bad("{\"id\":\"\",\"embedding\":[1]}", 1, TSR_REC_INVALID_EMBEDDING_ID, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"crowding_tag\":5}", 1, TSR_REC_PARSING_ERROR, NULL);
    expect_bad("{\"id\":\"a\",\"embedding\":[1]", 1, TSR_REC_INVALID_JSON_SYNTAX, "column");
    expect_bad("{\"id\":\"a\",\"id\":\"b\",\"embedding\":[1]}", 1, TSR_REC_INVALID_JSON_SYNTAX, NULL);
    expect_bad("[1,2]", 1, TSR_REC_INVALID_JSON_SYNTAX, NULL);
    expect_bad("{\"id\":\"\xff\",\"embedding\":[1]}", 1, TSR_REC_INVALID_ENCODING, NULL);
    expect_bad("  \t", 1, TSR_REC_EMPTY_LINE, NULL);
}

static void test_lines(void **state)
{
    (void)state;
    coll *c = parse("{\"id\":\"a\",\"embedding\":[1]}\r\n\n{\"id\":\"b\",\"embedding\":[2]}", 1);
    assert_int_equal(c->nrecs, 2);
    assert_int_equal(c->nbad, 1);
    assert_int_equal(c->types[0], TSR_REC_EMPTY_LINE);
    assert_int_equal(c->bad_where[0], 2);
    assert_int_equal(c->rec_where[1], 3);
    coll_free(c);
}

/* A record cut short in the middle of a file: the error is on its line and column, and
 * does not say "end of file" (jansson parses each line as a whole input). */
static void test_syntax_mid_file(void **state)
{
    (void)state;
    coll *c = parse("{\"id\":\"a\",\"embedding\":[1]}\n"
                    "{\"id\":\"b\",\"embedding\":[1\n"
                    "{\"id\":\"c\",\"embedding\":[1]} x\n"
                    "{\"id\":\"d\",\"embedding\":[1]}\n",
                    1);
    assert_int_equal(c->nrecs, 2);
    assert_int_equal(c->nbad, 2);
    assert_int_equal(c->bad_where[0], 2);
    assert_int_equal(c->bad_where[1], 3);
    for (size_t i = 0; i < 2; i++)
        if (strstr(c->msgs[i], "end of file") || !strstr(c->msgs[i], "end of the line"))
            fail_msg("line %d: '%s'", (int)c->bad_where[i], c->msgs[i]);
    assert_non_null(strstr(c->msgs[0], "column 24: ']' expected at the end of the line"));
    assert_non_null(strstr(c->msgs[1], "column 28: end of the line expected near 'x'"));
    coll_free(c);
}

static void test_suggest(void **state)
{
    (void)state;
    static const char *const k[] = {"namespace", "allow", "deny", NULL};
    assert_string_equal(tsr_batch_json_suggest("allowList", k), "allow");
    assert_string_equal(tsr_batch_json_suggest("namespce", k), "namespace");
    assert_null(tsr_batch_json_suggest("qqqqqqqq", k));
}


/* The member key of s, or fail. */
static const Google__Protobuf__Value *member(const Google__Protobuf__Struct *s, const char *key)
{
    for (size_t i = 0; i < s->n_fields; i++)
        if (strcmp(s->fields[i]->key, key) == 0)
            return s->fields[i]->value;
    fail_msg("no member '%s'", key);
    return NULL;
}

/* One record with embedding_metadata md (JSON text); returns its unpacked Struct after
 * checking that protobuf-c packs it back to the very same bytes. */
static Google__Protobuf__Struct *meta_of(const char *md, coll **cp)
{
    char line[4096];
    snprintf(line, sizeof line, "{\"id\":\"m\",\"embedding\":[1],\"embedding_metadata\":%s}", md);
    coll *c = parse(line, 1);
    if (c->nbad)
        fail_msg("%s: %s", md, c->msgs[0]);
    assert_int_equal(c->nrecs, 1);
    const tsr_datapoint *dp = &c->recs[0];
    assert_non_null(dp->metadata);
    Google__Protobuf__Struct *s = google__protobuf__struct__unpack(NULL, dp->nmetadata, dp->metadata);
    assert_non_null(s);
    size_t n = protobuf_c_message_get_packed_size(&s->base);
    assert_int_equal(n, dp->nmetadata);
    uint8_t *b = malloc(n);
    protobuf_c_message_pack(&s->base, b);
    assert_memory_equal(b, dp->metadata, n);
    free(b);
    *cp = c;
    return s;
}

static void test_metadata(void **state)
{
    (void)state;
    coll *c;
    Google__Protobuf__Struct *s = meta_of(
        "{\"title\":\"caf\u00e9 \\u00e9\",\"year\":1999,\"price\":-2.5,\"new\":true,"
        "\"old\":false,\"none\":null,\"tags\":[\"a\",1,[],{}],\"nested\":{\"deep\":{\"x\":[1e300]}},"
        "\"\":\"empty key\"}", &c);
    assert_int_equal(s->n_fields, 9);
    assert_string_equal(s->fields[0]->key, "title");
    assert_string_equal(member(s, "title")->string_value, "caf\u00e9 \u00e9");
    assert_true(member(s, "year")->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE);
    assert_true(member(s, "year")->number_value == 1999.0);
    assert_true(member(s, "price")->number_value == -2.5);
    assert_true(member(s, "new")->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
                member(s, "new")->bool_value);
    assert_true(member(s, "old")->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE &&
                !member(s, "old")->bool_value);
    assert_true(member(s, "none")->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE);
    const Google__Protobuf__ListValue *l = member(s, "tags")->list_value;
    assert_int_equal(l->n_values, 4);
    assert_string_equal(l->values[0]->string_value, "a");
    assert_true(l->values[1]->number_value == 1.0);
    assert_true(l->values[2]->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE);
    assert_int_equal(l->values[2]->list_value->n_values, 0);
    assert_true(l->values[3]->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE);
    const Google__Protobuf__Value *x = member(member(member(s, "nested")->struct_value,
                                                     "deep")->struct_value, "x");
    assert_true(x->list_value->values[0]->number_value == 1e300);
    assert_string_equal(member(s, "")->string_value, "empty key");
    google__protobuf__struct__free_unpacked(s, NULL);
    coll_free(c);

    /* {} and null: nothing stored */
    c = parse("{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":{}}\n"
              "{\"id\":\"b\",\"embedding\":[1],\"embedding_metadata\":null}\n", 1);
    assert_int_equal(c->nbad, 0);
    assert_int_equal(c->nrecs, 2);
    assert_null(c->recs[0].metadata);
    assert_int_equal(c->recs[0].nmetadata, 0);
    assert_null(c->recs[1].metadata);
    coll_free(c);
}

static void test_metadata_errors(void **state)
{
    (void)state;
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":\"x\"}", 1,
               TSR_REC_PARSING_ERROR, "\"embedding_metadata\" must be a JSON object");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":[1]}", 1,
               TSR_REC_PARSING_ERROR, "must be a JSON object");
    /* a NUL cannot reach a protobuf string: the JSON parser refuses \u0000 (and the encoder
     * would too) */
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":{\"k\":[\"a\\u0000b\"]}}", 1,
               TSR_REC_INVALID_JSON_SYNTAX, "\\u0000 is not allowed");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":{\"k\\u0000\":1}}", 1,
               TSR_REC_INVALID_JSON_SYNTAX, "NUL byte in object key");
    expect_bad("{\"id\":\"a\",\"embedding\":[1],\"metadata\":{}}", 1, TSR_REC_PARSING_ERROR,
               "did you mean 'embedding_metadata'?");
    /* depth: 64 nested levels are fine, 65 are not */
    for (int depth = 64; depth <= 65; depth++) {
        char line[1024] = "{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":";
        for (int i = 0; i < depth; i++)
            strcat(line, "{\"a\":");
        strcat(line, "1");
        for (int i = 0; i < depth; i++)
            strcat(line, "}");
        strcat(line, "}");
        if (depth == 64) {
            coll *c = parse(line, 1);
            assert_int_equal(c->nbad, 0);
            assert_int_equal(c->nrecs, 1);
            coll_free(c);
        } else {
            expect_bad(line, 1, TSR_REC_PARSING_ERROR, "nests deeper than 64 levels");
        }
    }
    /* size: the limit is on the serialized Struct. {"k": "<L x>"} with 2^14 <= L < 2^21 is
     * Struct{entry(3-byte varint length){key 3, Value(3){string(3) L}}} = L + 15 bytes:
     * L = 65536 - 15 fits exactly, one more does not. */
    for (size_t L = 65536 - 16; L <= 65536 - 14; L++) {
        size_t n = 64 + L;
        char *line = malloc(n);
        int o = snprintf(line, n, "{\"id\":\"a\",\"embedding\":[1],\"embedding_metadata\":{\"k\":\"");
        memset(line + o, 'x', L);
        strcpy(line + o + L, "\"}}");
        coll *c = parse(line, 1);
        if (L <= 65536 - 15) {
            assert_int_equal(c->nbad, 0);
            assert_int_equal(c->recs[0].nmetadata, L + 15);
        } else {
            assert_int_equal(c->nbad, 1);
            assert_int_equal(c->types[0], TSR_REC_PARSING_ERROR);
            assert_non_null(strstr(c->msgs[0], "more than 65536 bytes serialized"));
        }
        coll_free(c);
        free(line);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_examples), cmocka_unit_test(test_full_record),
        cmocka_unit_test(test_unknown_fields), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_lines),          cmocka_unit_test(test_syntax_mid_file),          cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_metadata),       cmocka_unit_test(test_metadata_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
