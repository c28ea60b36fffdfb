#!/usr/bin/env python3
"""The same records written as CSV, JSON and Avro (python avro, null and deflate codecs)
give identical `tessera batch inspect` output (SPEC §2): dense, sparse-only, hybrid,
token restricts (allow/deny), numeric restricts (int/float/double), crowding tags,
non-ASCII ids, deletes. Also checks the output against the records themselves."""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

import avro.datafile
import avro.io
import avro.schema

BIN = os.environ.get("TSR_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "bin"))
TESSERA = os.path.join(BIN, "tessera")
DIMS = 4

# Seed 003's FeatureVector schema (tests/data/feature_vector.avsc, the one copy in the tree).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                       "feature_vector.avsc")) as _f:
    SCHEMA = json.load(_f)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def short(x):
    """Shortest decimal that reads back to the same float32."""
    for p in range(6, 10):
        s = "%.*g" % (p, x)
        if f32(float(s)) == x:
            return s
    return repr(x)


def make_records():
    rnd = random.Random(3)
    recs = []
    for i in range(60):
        kind = i % 3  # 0 dense, 1 sparse-only, 2 hybrid
        r = {"id": ("id-%02d" % i) if i % 7 else ("\u05d0\u05d1-%d" % i)}
        if kind != 1:
            r["embedding"] = [f32(rnd.uniform(-10, 10)) for _ in range(DIMS)]
        if kind != 0:
            dims = sorted(rnd.sample(range(0, 1 << 40), rnd.randint(1, 5)))
            r["sparse"] = (dims, [f32(rnd.uniform(-1, 1)) for _ in dims])
        if i % 2:
            r["restricts"] = [("color", ["red", "blue"][: 1 + i % 2], ["purple"] if i % 4 == 1 else []),
                              ("shape", ["sq"], [])]
        if i % 5 == 0:
            r["numeric"] = [("size", "int", i), ("ratio", "float", f32(i / 8.0)),
                            ("w", "double", i / 3.0)]
        if i % 3 == 0:
            r["crowding_tag"] = "t%d" % (i % 4)
        recs.append(r)
    return recs


def write_csv(path, recs):
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            fields = [r["id"]]
            fields += [short(v) for v in r.get("embedding", [])]
            if "sparse" in r:
                fields += ["%d:%s" % (d, short(v)) for d, v in zip(*r["sparse"])]
            if "crowding_tag" in r:
                fields.append("crowding_tag=" + r["crowding_tag"])
            for ns, allow, deny in r.get("restricts", []):
                fields += ["%s=%s" % (ns, t) for t in allow] + ["%s=!%s" % (ns, t) for t in deny]
            for ns, t, v in r.get("numeric", []):
                fields.append("#%s=%s%s" % (ns, v if t == "int" else short(v) if t == "float" else repr(v),
                                            t[0]))
            f.write(",".join(fields) + "\n")


def write_json(path, recs):
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            o = {"id": r["id"]}
            if "embedding" in r:
                o["embedding"] = [float(short(v)) for v in r["embedding"]]
            if "sparse" in r:
                o["sparse_embedding"] = {"values": [float(short(v)) for v in r["sparse"][1]],
                                         "dimensions": r["sparse"][0]}
            if "restricts" in r:
                o["restricts"] = [dict({"namespace": ns}, **({"allow": a} if a else {}),
                                       **({"deny": d} if d else {})) for ns, a, d in r["restricts"]]
            if "numeric" in r:
                o["numeric_restricts"] = [{"namespace": ns, "value_" + t: v} for ns, t, v in r["numeric"]]
            if "crowding_tag" in r:
                o["crowding_tag"] = r["crowding_tag"]
            f.write(json.dumps(o, ensure_ascii=False) + "\n")


def write_avro(path, recs, codec):
    schema = avro.schema.parse(json.dumps(SCHEMA))
    with open(path, "wb") as f:
        w = avro.datafile.DataFileWriter(f, avro.io.DatumWriter(), schema, codec=codec)
        for r in recs:
            nums = None
            if "numeric" in r:
                nums = [{"namespace": ns, "value_int": v if t == "int" else None,
                         "value_float": v if t == "float" else None,
                         "value_double": v if t == "double" else None} for ns, t, v in r["numeric"]]
            w.append({
                "id": r["id"],
                "embedding": r.get("embedding", []),
                "sparse_embedding": {"values": r["sparse"][1], "dimensions": r["sparse"][0]}
                if "sparse" in r else None,
                "restricts": [{"namespace": ns, "allow": a or None, "deny": d or None}
                              for ns, a, d in r["restricts"]] if "restricts" in r else None,
                "numeric_restricts": nums,
                "crowding_tag": r.get("crowding_tag"),
            })
        w.close()


def inspect(root):
    r = subprocess.run([TESSERA, "batch", "inspect", "--records", "--batch-root", root, "--dimensions", str(DIMS)],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        print(r.stderr.decode())
        raise SystemExit("inspect failed on %s: exit %d" % (root, r.returncode))
    return r.stdout.decode()


def expected_lines(recs):
    """What inspect must print, built from the records (sorted by id bytes)."""
    out = []
    for r in sorted(recs, key=lambda r: r["id"].encode()):
        o = {"id": r["id"]}
        if "embedding" in r:
            o["embedding"] = r["embedding"]
        if "sparse" in r:
            o["sparse_embedding"] = {"values": r["sparse"][1], "dimensions": r["sparse"][0]}
        if "restricts" in r:
            o["restricts"] = [dict({"namespace": ns}, **({"allow": a} if a else {}),
                                   **({"deny": d} if d else {})) for ns, a, d in r["restricts"]]
        if "numeric" in r:
            o["numeric_restricts"] = [{"namespace": ns, "value_" + t: v} for ns, t, v in r["numeric"]]
        if "crowding_tag" in r:
            o["crowding_tag"] = r["crowding_tag"]
        out.append(o)
    return out


def normalize(line):
    """Floats compared as float32 (value_double as double)."""
    o = json.loads(line)
    if "embedding" in o:
        o["embedding"] = [f32(v) for v in o["embedding"]]
    if "sparse_embedding" in o:
        o["sparse_embedding"]["values"] = [f32(v) for v in o["sparse_embedding"]["values"]]
    for n in o.get("numeric_restricts", []):
        if "value_float" in n:
            n["value_float"] = f32(n["value_float"])
    return o


def main():
    recs = make_records()
    tmp = tempfile.mkdtemp(prefix="tsr_crossformat_")
    try:
        outputs = {}
        for fmt in ("csv", "json", "avro-null", "avro-deflate"):
            root = os.path.join(tmp, fmt)
            os.makedirs(os.path.join(root, "delete"))
            # split over two files to exercise the merge
            half = len(recs) // 2
            for k, part in enumerate((recs[:half], recs[half:])):
                name = os.path.join(root, "part%d.%s" % (k, fmt.split("-")[0]))
                if fmt == "csv":
                    write_csv(name, part)
                elif fmt == "json":
                    write_json(name, part)
                else:
                    write_avro(name, part, fmt.split("-")[1])
            with open(os.path.join(root, "delete", "ids.txt"), "w") as f:
                f.write("gone-1\ngone-2\n")
            outputs[fmt] = inspect(root)
        ref = outputs["csv"]
        ok = True
        for fmt, out in outputs.items():
            if out != ref:
                ok = False
                a, b = ref.splitlines(), out.splitlines()
                for x, y in zip(a, b):
                    if x != y:
                        print("csv  :", x)
                        print("%-5s:" % fmt[:5], y)
                        break
                print("FAIL: %s output differs from csv (%d vs %d lines)" % (fmt, len(b), len(a)))
        got = [normalize(l) for l in ref.splitlines()]
        want = expected_lines(recs) + [{"id": "gone-1", "delete": True}, {"id": "gone-2", "delete": True}]
        if got != want:
            ok = False
            for x, y in zip(got, want):
                if x != y:
                    print("got :", x)
                    print("want:", y)
                    break
            print("FAIL: output differs from the records written")
        if not ok:
            sys.exit(1)
        print("csv, json, avro (null, deflate): identical inspect output, %d records" % len(recs))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
