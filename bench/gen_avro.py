#!/usr/bin/env python3
"""Writes N FeatureVector records of dimension D (seed 003 schema) to an Avro object
container file for bench_ingest: gen_avro.py OUT N D.

python avro's DataFileWriter manages only a few thousand records/s, so the record bodies
(everything after the id) are encoded once for 1000 variants with avro's DatumWriter and
the container (header, blocks of 10,000 records, sync markers) is assembled here; each
record still gets its own id. Same shape as the CSV/JSON bench records: dense embedding,
one token restrict, a crowding tag, no sparse / numeric restricts."""
import io
import json
import os
import random
import sys

import avro.io
import avro.schema

# Seed 003's FeatureVector schema, shared with the tests (one copy in the tree).
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                           "feature_vector.avsc")
with open(SCHEMA_FILE) as _f:
    SCHEMA = json.load(_f)


def zigzag(n):
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def avro_bytes(b):
    return zigzag(len(b)) + b


def main():
    out, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    schema = avro.schema.parse(json.dumps(SCHEMA))
    writer = avro.io.DatumWriter(schema)
    rnd = random.Random(1)
    bodies = []
    for i in range(1000):
        buf = io.BytesIO()
        writer.write({"id": "", "embedding": [rnd.uniform(-0.25, 0.25) for _ in range(d)],
                      "sparse_embedding": None,
                      "restricts": [{"namespace": "color", "allow": ["c%d" % (i % 16)], "deny": None}],
                      "numeric_restricts": None, "crowding_tag": "t%d" % (i % 100)},
                     avro.io.BinaryEncoder(buf))
        bodies.append(buf.getvalue()[1:])  # drop the empty id (one 0x00 byte)
    sync = os.urandom(16)
    meta = {b"avro.schema": json.dumps(SCHEMA).encode(), b"avro.codec": b"null"}
    with open(out, "wb") as f:
        f.write(b"Obj\x01" + zigzag(len(meta)))
        for k, v in meta.items():
            f.write(avro_bytes(k) + avro_bytes(v))
        f.write(zigzag(0) + sync)
        for start in range(0, n, 10000):
            cnt = min(10000, n - start)
            block = b"".join(avro_bytes(b"id-%07d" % i) + bodies[i % 1000]
                             for i in range(start, start + cnt))
            f.write(zigzag(cnt) + zigzag(len(block)) + block + sync)


if __name__ == "__main__":
    main()
