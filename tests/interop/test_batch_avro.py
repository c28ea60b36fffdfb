#!/usr/bin/env python3
"""Interop: Avro batch files written by python `avro` (Debian python3-avro) with the
seed 003 FeatureVector schema read back by Tessera's Avro reader (common/batch/batch_avro.c)
to exactly the records written.

Covers dense, sparse-only, hybrid, restricts, numeric restricts (int/float/double),
crowding tags, codecs null / deflate / snappy (python-snappy is not installed, so a
literal-only snappy encoder stands in for it: valid snappy, decoded by our own
decoder), many blocks, compatible writer schemas (reordered fields, missing optional
fields, int -> long / float promotions, other record names, writer-only fields), and
error cases (wrong dims, NaN, bad sparse, multiple numeric values, truncated file, not
Avro, schemas that do not resolve).

Each file is read through `tessera batch inspect` (records on stdout sorted by id in
the seed's JSON form, errors with record index and Vertex type in the --report JSON).
"""
import io
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import types
import zlib


def _snappy_literal_compress(data: bytes) -> bytes:
    """Valid raw snappy using literals only (varint length, then literal chunks)."""
    out = bytearray()
    n = len(data)
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            break
    pos = 0
    while pos < len(data):
        chunk = data[pos:pos + 65536]
        ln = len(chunk) - 1
        if ln < 60:
            out.append(ln << 2)
        elif ln < 256:
            out += bytes([60 << 2, ln])
        else:
            out += bytes([61 << 2, ln & 0xFF, ln >> 8])
        out += chunk
        pos += len(chunk)
    return bytes(out)


# python-snappy stand-in, installed before avro.codecs is imported.
_fake = types.ModuleType("snappy")
_fake.compress = _snappy_literal_compress
_fake.decompress = lambda b: (_ for _ in ()).throw(RuntimeError("not needed"))
sys.modules.setdefault("snappy", _fake)

import avro.datafile  # noqa: E402
import avro.io  # noqa: E402
import avro.schema  # noqa: E402

# Seed 003's FeatureVector schema (tests/data/feature_vector.avsc, the one copy in the tree).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                       "feature_vector.avsc")) as _f:
    SEED_SCHEMA = json.load(_f)

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_add(a, b):
    return f32(f32(a) + f32(b))


def write_avro(path, schema, records, codec="null", sync_interval=None):
    sch = avro.schema.parse(json.dumps(schema))
    saved = avro.datafile.SYNC_INTERVAL
    avro.datafile.SYNC_INTERVAL = sync_interval or saved  # block size: many blocks per file
    try:
        with open(path, "wb") as f:
            w = avro.datafile.DataFileWriter(f, avro.io.DatumWriter(), sch, codec=codec)
            for r in records:
                w.append(r)
            w.close()
    finally:
        avro.datafile.SYNC_INTERVAL = saved


def read_back(path, dims, ids=()):
    """Reads one Avro file through `tessera batch inspect` (a batch root holding only that
    file). Returns ({record index: record}, [invalid], {"result", "error"}): records are
    mapped back to their index in the file through ids (the ids in written order);
    invalid entries come from the JSON report ({"index", "invalid", "msg"}); result is 0
    unless the file failed as a whole (error = the report's file_error)."""
    exe = os.path.join(os.environ["TSR_BIN"], "tessera")
    with tempfile.TemporaryDirectory() as root:
        os.symlink(os.path.abspath(path), os.path.join(root, "data.avro"))
        report = os.path.join(root + ".report.json")
        p = subprocess.run([exe, "batch", "inspect", "--batch-root", root, "--dimensions",
                            str(dims), "--max-invalid-records", "100000000", "--report", report,
                            "--records"],
                           capture_output=True, timeout=120)
        try:
            rep = json.load(open(report))
        finally:
            if os.path.exists(report):
                os.unlink(report)
    if p.returncode not in (0, 1):
        raise AssertionError("inspect exited %d: %s" % (p.returncode, p.stderr.decode()))
    lines = [json.loads(l) for l in p.stdout.decode("utf-8").splitlines() if l.strip()]
    ids = list(ids)
    check([l["id"] for l in lines] == sorted(l["id"] for l in lines),
          "inspect output is not sorted by id")
    recs = {}
    for l in lines:
        check(l["id"] in ids, "unexpected id %r in the output" % l["id"])
        if l["id"] in ids:
            recs[ids.index(l["id"])] = l
    f = rep["files"][0]
    invalid = [{"index": e["record"], "invalid": e["type"], "msg": e["message"]}
               for e in f["errors"]]
    result = {"result": 1 if f.get("file_error") else 0, "error": f.get("file_error", "")}
    return recs, invalid, result


def expected(rec):
    """The seed JSON form our reader should produce for an input record."""
    out = {"id": rec["id"]}
    if rec.get("embedding"):
        out["embedding"] = [f32(x) for x in rec["embedding"]]
    se = rec.get("sparse_embedding")
    if se and se["values"]:
        acc = {}
        for d, v in zip(se["dimensions"], se["values"]):
            acc[d] = f32_add(acc[d], v) if d in acc else f32(v)
        dims = sorted(acc)
        out["sparse_embedding"] = {"values": [acc[d] for d in dims], "dimensions": dims}
    if rec.get("restricts"):
        rs = {}
        for r in rec["restricts"]:
            o = rs.setdefault(r["namespace"], {"namespace": r["namespace"]})
            if r.get("allow"):
                o.setdefault("allow", []).extend(r["allow"])
            if r.get("deny"):
                o.setdefault("deny", []).extend(r["deny"])
        out["restricts"] = list(rs.values())
    if rec.get("numeric_restricts"):
        ns = []
        for r in rec["numeric_restricts"]:
            o = {"namespace": r["namespace"]}
            if r.get("value_int") is not None:
                o["value_int"] = r["value_int"]
            elif r.get("value_float") is not None:
                o["value_float"] = f32(r["value_float"])
            else:
                o["value_double"] = r["value_double"]
            ns.append(o)
        out["numeric_restricts"] = ns
    if rec.get("crowding_tag") is not None:
        out["crowding_tag"] = rec["crowding_tag"]
    return out


def same(got, want):
    """Exact comparison; floats compared as float32 bit patterns (value_double as double)."""
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and isinstance(want, (int, float)) and \
            (f32(got) == f32(want) if want == f32(want) else got == want)
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and \
            all(same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and \
            all(same(a, b) for a, b in zip(got, want))
    return got == want


def full(rec):
    """Fills the seed schema's nullable fields (python avro needs every field present)."""
    r = {"embedding": [], "sparse_embedding": None, "restricts": None,
         "numeric_restricts": None, "crowding_tag": None}
    r.update(rec)
    return r


def corpus(n, dims, seed=7):
    rnd = random.Random(seed)
    recs = [
        # the seed's examples (dimension 3)
        {"id": "1", "embedding": [1, 1, 1]},
        {"id": "2", "embedding": [2, 2, 2]},
        {"id": "3", "sparse_embedding": {"values": [0.1, 0.2], "dimensions": [1, 4]}},
        {"id": "4", "sparse_embedding": {"values": [-0.4, 0.2, -1.3], "dimensions": [10, 20, 20]}},
        {"id": "5", "embedding": [5, 5, -5], "sparse_embedding": {"values": [0.1], "dimensions": [500]}},
        {"id": "6", "embedding": [6, 7, -8.1], "sparse_embedding": {"values": [0.1, -0.2], "dimensions": [40, 901]}},
        {"id": "7", "embedding": [1, 2, 3],
         "restricts": [{"namespace": "color", "allow": ["red"], "deny": ["blue"]}],
         "numeric_restricts": [{"namespace": "size", "value_int": 3}], "crowding_tag": "shop-9"},
        {"id": "8", "embedding": [0.5, -0.25, 1e-30],
         "numeric_restricts": [{"namespace": "ratio", "value_float": 0.1},
                               {"namespace": "weight", "value_double": 0.3},
                               {"namespace": "big", "value_int": -2147483648}]},
        {"id": "9", "embedding": [3.4028234663852886e38, -1.1754943508222875e-38, 0.0],
         "restricts": [{"namespace": "a", "allow": ["x", "y"]}, {"namespace": "b", "deny": ["z"]},
                       {"namespace": "c"}]},
        # the same namespace twice: one restrict, lists joined (as the CSV/JSON readers do)
        {"id": "merge", "embedding": [1, 2, 3],
         "restricts": [{"namespace": "c", "allow": ["a"]}, {"namespace": "d", "deny": ["q"]},
                       {"namespace": "c", "allow": ["b"], "deny": ["x"]}]},
        {"id": "sparse-big-dims", "sparse_embedding": {"values": [1.5, 2.5],
                                                       "dimensions": [2**62, -3]}},
        {"id": "\u05de\u05d6\u05d4\u05d4-\U0001F600", "embedding": [1, 2, 3], "crowding_tag": "\u05ea\u05d2"},
    ]
    assert dims == 3
    for i in range(n):
        r = {"id": "r%05d" % i}
        kind = rnd.randrange(3)
        if kind != 1:
            r["embedding"] = [rnd.uniform(-10, 10) for _ in range(dims)]
        if kind != 0:
            k = rnd.randrange(1, 6)
            r["sparse_embedding"] = {"values": [rnd.uniform(-1, 1) for _ in range(k)],
                                     "dimensions": [rnd.randrange(0, 100000) for _ in range(k)]}
        if rnd.random() < 0.4:
            r["restricts"] = [{"namespace": "ns%d" % j,
                               "allow": ["t%d" % rnd.randrange(50) for _ in range(rnd.randrange(3))] or None,
                               "deny": ["d%d" % rnd.randrange(50) for _ in range(rnd.randrange(2))] or None}
                              for j in range(rnd.randrange(1, 3))]
        if rnd.random() < 0.4:
            t = rnd.randrange(3)
            key = ("value_int", "value_float", "value_double")[t]
            val = rnd.randrange(-10**9, 10**9) if t == 0 else rnd.uniform(-1e6, 1e6)
            r["numeric_restricts"] = [{"namespace": "num", key: val}]
        if rnd.random() < 0.3:
            r["crowding_tag"] = "tag%d" % rnd.randrange(10)
        recs.append(r)
    return recs


def norm_numeric(recs):
    """python avro needs the absent value_* keys too."""
    out = []
    for r in recs:
        r = dict(r)
        if r.get("numeric_restricts"):
            r["numeric_restricts"] = [dict({"value_int": None, "value_float": None,
                                            "value_double": None}, **n)
                                      for n in r["numeric_restricts"]]
        if r.get("restricts"):
            r["restricts"] = [dict({"allow": None, "deny": None}, **x) for x in r["restricts"]]
        out.append(full(r))
    return out


def test_roundtrip(tmp):
    recs = norm_numeric(corpus(1500, 3))
    for codec in ("null", "deflate", "snappy"):
        path = os.path.join(tmp, "rt_%s.avro" % codec)
        write_avro(path, SEED_SCHEMA, recs, codec=codec, sync_interval=4000)
        got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
        check(result["result"] == 0, "%s: result %r" % (codec, result))
        check(not invalid, "%s: unexpected invalid %r" % (codec, invalid[:3]))
        check(len(got) == len(recs), "%s: %d records read, %d written" % (codec, len(got), len(recs)))
        bad = [i for i, r in enumerate(recs) if not same(got.get(i), expected(r))]
        check(not bad, "%s: records differ at %r: got %r want %r" % (
            codec, bad[:3], got.get(bad[0]) if bad else None, expected(recs[bad[0]]) if bad else None))


def test_compatible_schemas(tmp):
    # fields reordered, optional numeric_restricts / crowding_tag / restricts missing,
    # dimensions int, other record names and a namespace, a writer-only field,
    # embedding as long, crowding tag not a union.
    schema = {
        "type": "record", "name": "Vec", "namespace": "com.example",
        "fields": [
            {"name": "extra", "type": {"type": "map", "values": ["null", "string"]}},
            {"name": "crowding_tag", "type": "string"},
            {"name": "sparse_embedding", "type": ["null", {
                "type": "record", "name": "Sparse", "fields": [
                    {"name": "dimensions", "type": {"type": "array", "items": "int"}},
                    {"name": "values", "type": {"type": "array", "items": "float"}}]}]},
            {"name": "embedding", "type": {"type": "array", "items": "long"}},
            {"name": "id", "type": "string"},
        ]}
    recs = [{"id": "a", "embedding": [1, 2, 3], "sparse_embedding": None, "crowding_tag": "t",
             "extra": {"k": "v", "n": None}},
            {"id": "b", "embedding": [], "sparse_embedding": {"values": [0.5], "dimensions": [7]},
             "crowding_tag": "u", "extra": {}}]
    path = os.path.join(tmp, "compat1.avro")
    write_avro(path, schema, recs, codec="deflate")
    got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
    check(result["result"] == 0 and not invalid, "compat1: %r %r" % (result, invalid))
    check(same(got.get(0), {"id": "a", "embedding": [1.0, 2.0, 3.0], "crowding_tag": "t"}),
          "compat1 rec0 %r" % got.get(0))
    check(same(got.get(1), {"id": "b", "sparse_embedding": {"values": [0.5], "dimensions": [7]},
                            "crowding_tag": "u"}), "compat1 rec1 %r" % got.get(1))

    # numeric restricts: value_int long, value_float missing, value_double from float;
    # restricts without deny; only id and numeric_restricts + embedding.
    schema2 = {
        "type": "record", "name": "FeatureVector", "fields": [
            {"name": "id", "type": "string"},
            {"name": "embedding", "type": {"type": "array", "items": "float"}},
            {"name": "restricts", "type": {"type": "array", "items": {
                "type": "record", "name": "R", "fields": [
                    {"name": "allow", "type": {"type": "array", "items": "string"}},
                    {"name": "namespace", "type": "string"}]}}},
            {"name": "numeric_restricts", "type": ["null", {"type": "array", "items": {
                "type": "record", "name": "N", "fields": [
                    {"name": "namespace", "type": "string"},
                    {"name": "value_int", "type": ["null", "long"]},
                    {"name": "value_double", "type": ["null", "float"]}]}}]},
        ]}
    recs = [{"id": "n1", "embedding": [1, 1, 1], "restricts": [{"allow": ["x"], "namespace": "c"}],
             "numeric_restricts": [{"namespace": "i", "value_int": 2**40, "value_double": None},
                                   {"namespace": "d", "value_int": None, "value_double": 0.75}]}]
    path = os.path.join(tmp, "compat2.avro")
    write_avro(path, schema2, recs)
    got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
    check(result["result"] == 0 and not invalid, "compat2: %r %r" % (result, invalid))
    check(same(got.get(0), {"id": "n1", "embedding": [1.0, 1.0, 1.0],
                            "restricts": [{"namespace": "c", "allow": ["x"]}],
                            "numeric_restricts": [{"namespace": "i", "value_int": 2**40},
                                                  {"namespace": "d", "value_double": 0.75}]}),
          "compat2 rec0 %r" % got.get(0))


def test_invalid_records(tmp):
    recs = norm_numeric([
        {"id": "ok0", "embedding": [1, 2, 3]},
        {"id": "dims", "embedding": [1, 2]},
        {"id": "nan", "embedding": [1, float("nan"), 3]},
        {"id": "inf", "sparse_embedding": {"values": [float("inf")], "dimensions": [1]}},
        {"id": "sparse", "sparse_embedding": {"values": [1, 2], "dimensions": [1]}},
        {"id": "multi", "embedding": [1, 2, 3],
         "numeric_restricts": [{"namespace": "n", "value_int": 1, "value_float": 2.0}]},
        {"id": "none", "embedding": [1, 2, 3], "numeric_restricts": [{"namespace": "n"}]},
        {"id": "", "embedding": [1, 2, 3]},
        {"id": "noemb"},
        {"id": "dupns", "embedding": [1, 2, 3],
         "numeric_restricts": [{"namespace": "c", "value_int": 1}, {"namespace": "c", "value_int": 2}]},
        {"id": "nans", "embedding": [1, 2, 3],
         "numeric_restricts": [{"namespace": "n", "value_double": float("nan")}]},
        {"id": "ok1", "embedding": [4, 5, 6]},
    ])
    want = {1: ("EMBEDDING_SIZE_MISMATCH", "embedding"), 2: ("INVALID_EMBEDDING", "embedding[1]"),
            3: ("INVALID_EMBEDDING", "sparse_embedding.values[0]"),
            4: ("INVALID_SPARSE_EMBEDDING", "sparse_embedding"),
            5: ("MULTIPLE_VALUES", "numeric_restricts[0]"),
            6: ("INVALID_NUMERIC_VALUE", "numeric_restricts[0]"),
            7: ("INVALID_EMBEDDING_ID", "id"), 8: ("INVALID_EMBEDDING", "embedding"),
            9: ("DUPLICATE_NAMESPACE", "numeric_restricts[1]"),
            10: ("INVALID_NUMERIC_VALUE", "value_double")}
    path = os.path.join(tmp, "invalid.avro")
    write_avro(path, SEED_SCHEMA, recs, codec="deflate")
    got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
    check(result["result"] == 0, "invalid: result %r" % result)
    check(sorted(got) == [0, 11], "invalid: valid records %r" % sorted(got))
    byidx = {i["index"]: i for i in invalid}
    for idx, (typ, needle) in want.items():
        e = byidx.get(idx)
        check(e is not None and e["invalid"] == typ and needle in e["msg"],
              "invalid record %d: want %s mentioning %r, got %r" % (idx, typ, needle, e))

    # invalid UTF-8 id: python avro refuses to write it, so patch the bytes of a valid file
    recs = norm_numeric([{"id": "ok", "embedding": [1, 2, 3]}, {"id": "XY", "embedding": [1, 2, 3]}])
    path = os.path.join(tmp, "utf8.avro")
    write_avro(path, SEED_SCHEMA, recs)
    data = open(path, "rb").read()
    k = data.rindex(b"XY")
    open(path, "wb").write(data[:k] + b"\xc3\x28" + data[k + 2:])
    got, invalid, result = read_back(path, 3, ["ok"])
    check(result["result"] == 0 and sorted(got) == [0] and len(invalid) == 1 and
          invalid[0]["index"] == 1 and invalid[0]["invalid"] == "INVALID_ENCODING" and
          "id" in invalid[0]["msg"], "utf8: %r %r" % (invalid, result))


def test_file_errors(tmp):
    recs = norm_numeric(corpus(300, 3))
    path = os.path.join(tmp, "trunc.avro")
    write_avro(path, SEED_SCHEMA, recs, codec="deflate", sync_interval=2000)
    data = open(path, "rb").read()
    # cut in the middle: records before the damaged block are read, then one
    # INVALID_AVRO_SYNTAX at the index of the first record not read
    for cut in (len(data) // 2, len(data) - 3, len(data) - 17):
        open(path, "wb").write(data[:cut])
        got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
        n = len(got)
        check(result["result"] == 0 and len(invalid) == 1 and
              invalid[0]["invalid"] == "INVALID_AVRO_SYNTAX" and invalid[0]["index"] == n and
              sorted(got) == list(range(n)) and 0 < n < len(recs),
              "truncated at %d: %d records, %r %r" % (cut, n, invalid, result))
    # a flipped byte inside a deflate block
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0x55
    open(path, "wb").write(bytes(bad))
    got, invalid, result = read_back(path, 3, [r["id"] for r in recs])
    check(result["result"] == 0 and len(invalid) == 1 and
          invalid[0]["invalid"] == "INVALID_AVRO_SYNTAX" and invalid[0]["index"] == len(got),
          "flipped byte: %r %r" % (invalid, result))
    # header cut: file-level error
    open(path, "wb").write(data[:40])
    got, invalid, result = read_back(path, 3)
    check(result["result"] != 0 and "INVALID_AVRO_SYNTAX" in result["error"] and not got,
          "header cut: %r" % result)
    # not Avro
    with open(path, "w") as f:
        f.write('{"id": "1", "embedding": [1,1,1]}\n')
    got, invalid, result = read_back(path, 3)
    check(result["result"] != 0 and "not an Avro object container" in result["error"],
          "not avro: %r" % result)
    # schemas that do not resolve: the message names the field
    cases = [
        ({"type": "record", "name": "FeatureVector", "fields": [
            {"name": "id", "type": "string"},
            {"name": "embedding", "type": {"type": "array", "items": "double"}}]},
         {"id": "x", "embedding": [1.0, 2.0, 3.0]}, "embedding"),
        ({"type": "record", "name": "FeatureVector", "fields": [
            {"name": "key", "type": "string"},
            {"name": "embedding", "type": {"type": "array", "items": "float"}}]},
         {"key": "x", "embedding": [1.0, 2.0, 3.0]}, "'id'"),
        ({"type": "record", "name": "FeatureVector", "fields": [
            {"name": "id", "type": "string"},
            {"name": "sparse_embedding", "type": {"type": "record", "name": "S", "fields": [
                {"name": "values", "type": {"type": "array", "items": "float"}},
                {"name": "dimensions", "type": {"type": "array", "items": "string"}}]}}]},
         {"id": "x", "sparse_embedding": {"values": [1.0], "dimensions": ["a"]}},
         "sparse_embedding.dimensions"),
        ({"type": "record", "name": "FeatureVector", "fields": [
            {"name": "id", "type": "long"}]}, {"id": 5}, "'id'"),
        ({"type": "record", "name": "FeatureVector", "fields": [
            {"name": "id", "type": "string"},
            {"name": "numeric_restricts", "type": {"type": "array", "items": {
                "type": "record", "name": "N", "fields": [
                    {"name": "namespace", "type": "string"},
                    {"name": "value_int", "type": ["null", "string"]}]}}}]},
         {"id": "x", "numeric_restricts": [{"namespace": "n", "value_int": "3"}]},
         "numeric_restricts[].value_int"),
    ]
    for i, (schema, rec, needle) in enumerate(cases):
        path = os.path.join(tmp, "schema%d.avro" % i)
        write_avro(path, schema, [rec])
        got, invalid, result = read_back(path, 3)
        check(result["result"] != 0 and needle in result["error"] and
              "does not resolve" in result["error"] and not got,
              "schema case %d: want error naming %s, got %r" % (i, needle, result))
    # codec we do not read
    path = os.path.join(tmp, "bzip2.avro")
    write_avro(path, SEED_SCHEMA, norm_numeric([{"id": "1", "embedding": [1, 2, 3]}]), codec="bzip2")
    got, invalid, result = read_back(path, 3)
    check(result["result"] != 0 and "bzip2" in result["error"], "bzip2: %r" % result)


def zz(v):
    """Avro zig-zag varint."""
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def test_oversized_record(tmp):
    """A well-formed record whose decoded values would exceed the per-record memory
    limit is reported and skipped; the next record of the same block is read."""
    path = os.path.join(tmp, "big.avro")
    write_avro(path, SEED_SCHEMA, norm_numeric([{"id": "a", "embedding": [1, 2, 3]}]))
    data = open(path, "rb").read()
    sync = data[-16:]
    header = data[:data.index(sync) + 16]
    n = 7_000_000  # sparse entries: 5 bytes each, ~40 bytes each decoded
    big = (zz(3) + b"big" + zz(0) + zz(1) + zz(n) + b"\0\0\0\0" * n + zz(0) +
           zz(n) + b"\x02" * n + zz(0) + zz(0) + zz(0) + zz(0))
    small = zz(5) + b"small" + zz(3) + struct.pack("<3f", 1, 2, 3) + zz(0) + zz(0) + zz(0) + \
        zz(0) + zz(0)
    body = big + small
    open(path, "wb").write(header + zz(2) + zz(len(body)) + body + sync)
    got, invalid, result = read_back(path, 3, ["big", "small"])
    check(result["result"] == 0 and len(invalid) == 1 and invalid[0]["index"] == 0 and
          invalid[0]["invalid"] == "INVALID_AVRO_SYNTAX" and "record skipped" in invalid[0]["msg"]
          and sorted(got) == [1] and got[1]["id"] == "small",
          "oversized record: %r %r %r" % (invalid, result, got))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_roundtrip(tmp)
        test_compatible_schemas(tmp)
        test_invalid_records(tmp)
        test_file_errors(tmp)
        test_oversized_record(tmp)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
