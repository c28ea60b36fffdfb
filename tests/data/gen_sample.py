#!/usr/bin/env python3
"""Generates a sample Vertex-format batch_root for `make run` / `make demo`.

Writes N datapoints of dimension D in three formats (JSON lines, CSV, and Avro when the
python `avro` package is present), with sparse embeddings on some, token restricts
(color, shape), numeric restricts (price int, rating float) and crowding tags (shop),
plus the query vector the demo sends (OUT/../query.txt: comma-separated floats).
Deterministic for a given seed. Usage: gen_sample.py OUT_DIR [--n N] [--dims D] [--seed S]
"""
import argparse
import json
import os
import random

# Seed 003's FeatureVector schema, shared with the tests and bench/gen_avro.py.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "feature_vector.avsc")) as _f:
    AVRO_SCHEMA = json.load(_f)


def make_records(n, dims, seed):
    rnd = random.Random(seed)
    colors = ["red", "green", "blue", "orange"]
    shapes = ["square", "circle", "triangle"]
    centers = [[rnd.gauss(0, 1) for _ in range(dims)] for _ in range(32)]
    recs = []
    for i in range(n):
        c = centers[i % len(centers)]
        r = {"id": "dp-%05d" % i,
             "embedding": [round(x + rnd.gauss(0, 0.3), 5) for x in c],
             "restricts": [{"namespace": "color", "allow": [colors[i % 4]]},
                           {"namespace": "shape", "allow": [shapes[i % 3]]}],
             "numeric_restricts": [{"namespace": "price", "value_int": i % 100},
                                   {"namespace": "rating", "value_float": (i % 50) / 2.0}],
             "crowding_tag": "shop-%d" % (i % 20)}
        if i % 3 == 0:
            sd = sorted(rnd.sample(range(1000), 4))
            r["sparse_embedding"] = {"values": [round(rnd.uniform(0.1, 1), 3) for _ in sd],
                                     "dimensions": sd}
        recs.append(r)
    query = [round(x + 0.05, 5) for x in centers[3]]
    return recs, query


def write_csv(path, recs):
    with open(path, "w") as f:
        for r in recs:
            cols = [r["id"]] + [repr(x) for x in r["embedding"]]
            if "sparse_embedding" in r:
                se = r["sparse_embedding"]
                cols += ["%d:%r" % (d, v) for d, v in zip(se["dimensions"], se["values"])]
            cols.append("crowding_tag=" + r["crowding_tag"])
            for rs in r["restricts"]:
                cols += ["%s=%s" % (rs["namespace"], t) for t in rs["allow"]]
            cols.append("#price=%di" % r["numeric_restricts"][0]["value_int"])
            cols.append("#rating=%rf" % r["numeric_restricts"][1]["value_float"])
            f.write(",".join(cols) + "\n")


def write_avro(path, recs):
    import avro.schema
    from avro.datafile import DataFileWriter
    from avro.io import DatumWriter
    schema = avro.schema.parse(json.dumps(AVRO_SCHEMA))
    with open(path, "wb") as f:
        w = DataFileWriter(f, DatumWriter(), schema, codec="deflate")
        for r in recs:
            nr = r["numeric_restricts"]
            w.append({
                "id": r["id"], "embedding": r["embedding"],
                "sparse_embedding": r.get("sparse_embedding"),
                "restricts": [{"namespace": x["namespace"], "allow": x["allow"], "deny": None}
                              for x in r["restricts"]],
                "numeric_restricts": [
                    {"namespace": "price", "value_int": nr[0]["value_int"],
                     "value_float": None, "value_double": None},
                    {"namespace": "rating", "value_int": None,
                     "value_float": nr[1]["value_float"], "value_double": None}],
                "crowding_tag": r["crowding_tag"]})
        w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--dims", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    recs, query = make_records(a.n, a.dims, a.seed)
    third = a.n // 3
    with open(os.path.join(a.out, "part-0.json"), "w") as f:
        for r in recs[:third]:
            f.write(json.dumps(r) + "\n")
    write_csv(os.path.join(a.out, "part-1.csv"), recs[third:2 * third])
    try:
        write_avro(os.path.join(a.out, "part-2.avro"), recs[2 * third:])
    except ImportError:
        with open(os.path.join(a.out, "part-2.json"), "w") as f:
            for r in recs[2 * third:]:
                f.write(json.dumps(r) + "\n")
    with open(os.path.join(os.path.dirname(os.path.abspath(a.out)), "query.txt"), "w") as f:
        f.write(",".join(repr(x) for x in query) + "\n")


if __name__ == "__main__":
    main()
