/*
 * cli_metadata — a datapoint's embedding_metadata (a google.protobuf.Struct) as the JSON
 * object it was given as, for the commands that print datapoints (batch inspect, read,
 * query). Numbers are doubles in a Struct, so 3 prints as 3.0.
 */
#include <stdlib.h>

#include "cli.h"
#include "google/protobuf/struct.pb-c.h"

static json_t *value_json(const Google__Protobuf__Value *v)
{
    switch (v ? v->kind_case : GOOGLE__PROTOBUF__VALUE__KIND__NOT_SET) {
    case GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE:
        return json_real(v->number_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE:
        return json_string(v->string_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE:
        return json_boolean(v->bool_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE:
        return tsr_cli_struct_json(v->struct_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE: {
        json_t *a = json_array();
        for (size_t i = 0; v->list_value && i < v->list_value->n_values; i++)
            json_array_append_new(a, value_json(v->list_value->values[i]));
        return a;
    }
    default:
        return json_null();
    }
}

json_t *tsr_cli_struct_json(const Google__Protobuf__Struct *s)
{
    json_t *o = json_object();
    for (size_t i = 0; s && i < s->n_fields; i++)
        json_object_set_new(o, s->fields[i]->key ? s->fields[i]->key : "",
                            value_json(s->fields[i]->value));
    return o;
}

json_t *tsr_cli_metadata_json(const uint8_t *data, size_t len)
{
    Google__Protobuf__Struct *s = google__protobuf__struct__unpack(NULL, len, data);
    if (!s)
        return NULL;
    json_t *o = tsr_cli_struct_json(s);
    google__protobuf__struct__free_unpacked(s, NULL);
    return o;
}

