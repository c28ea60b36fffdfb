#!/usr/bin/env python3
"""Writes N FeatureVector records of dimension D (seed 003 schema) to an Avro file for
bench_ingest: gen_avro.py OUT N D. Same shape as the CSV/JSON bench records."""
import io
import json
import random
import sys

import avro.datafile
import avro.io
import avro.schema

SCHEMA = {
    "type": "record", "name": "FeatureVector", "fields": [
        {"name": "id", "type": "string"},
        {"name": "embedding", "type": {"type": "array", "items": "float"}},
        {"name": "sparse_embedding", "type": ["null", {"type": "record", "name": "sparse_embedding", "fields": [
            {"name": "values", "type": {"type": "array", "items": "float"}},
            {"name": "dimensions", "type": {"type": "array", "items": "long"}}]}]},
        {"name": "restricts", "type": ["null", {"type": "array", "items": {"type": "record", "name": "Restrict", "fields": [
            {"name": "namespace", "type": "string"},
            {"name": "allow", "type": ["null", {"type": "array", "items": "string"}]},
            {"name": "deny", "type": ["null", {"type": "array", "items": "string"}]}]}}]},
        {"name": "numeric_restricts", "type": ["null", {"type": "array", "items": {"name": "NumericRestrict", "type": "record", "fields": [
            {"name": "namespace", "type": "string"},
            {"name": "value_int", "type": ["null", "int"], "default": None},
            {"name": "value_float", "type": ["null", "float"], "default": None},
            {"name": "value_double", "type": ["null", "double"], "default": None}]}}], "default": None},
        {"name": "crowding_tag", "type": ["null", "string"]},
    ]}


def main():
    out, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    schema = avro.schema.parse(json.dumps(SCHEMA))
    rnd = random.Random(1)
    with open(out, "wb") as f:
        w = avro.datafile.DataFileWriter(f, avro.io.DatumWriter(), schema)
        for i in range(n):
            w.append({"id": "id-%07d" % i,
                      "embedding": [rnd.uniform(-0.25, 0.25) for _ in range(d)],
                      "sparse_embedding": None,
                      "restricts": [{"namespace": "color", "allow": ["c%d" % (i % 16)], "deny": None}],
                      "numeric_restricts": None,
                      "crowding_tag": "t%d" % (i % 100)})
        w.close()


if __name__ == "__main__":
    main()
