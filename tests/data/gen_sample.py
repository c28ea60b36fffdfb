#!/usr/bin/env python3
"""Generates a sample Vertex-format batch_root for `make run` / `make demo`.

Writes N datapoints of dimension D in three formats (JSON lines, CSV, and Avro written
with the python `avro` package), with sparse embeddings on every third, token restricts
(color, shape), numeric restricts (price int, rating float) and crowding tags (shop),
plus what the demo queries with, beside OUT_DIR: query.txt (the dense query,
comma-separated floats), sparse.txt (the sparse query, "dim:value,...") and demo.json
(each datapoint's color, shape, price, shop and sparse dims, for explaining answers).

The data are made so that every query feature visibly changes the demo's answer: the
query sits on cluster 3, whose first members (dp-00003, dp-00035, dp-00067, ...: every
32nd id) are placed ever farther from it, so they are its nearest neighbors in that
order; their colors cycle red, green, blue, orange, their prices differ (some below 50),
and two in a row share a shop (crowding). The sparse query is the sparse embedding of a
datapoint far from the dense query (hybrid search brings it in).

Without the `avro` package (e.g. a python3 other than /usr/bin/python3, which has
python3-avro) it stops with an error, unless --no-avro asks for the third part as JSON.
Deterministic for a given seed.
Usage: gen_sample.py OUT_DIR [--n N] [--dims D] [--seed S] [--no-avro]
"""
import argparse
import json
import os
import random
import sys

# Seed 003's FeatureVector schema, shared with the tests and bench/gen_avro.py.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "feature_vector.avsc")) as _f:
    AVRO_SCHEMA = json.load(_f)

COLORS = ["red", "green", "blue", "orange"]
SHAPES = ["square", "circle", "triangle"]
NCENTERS = 32
QUERY_CENTER = 3
NEAR = 12  # members of the query's cluster placed at graded distances from the query


def attrs(i):
    """The restricts and crowding tag of datapoint i (m = its rank within its cluster)."""
    m = i // NCENTERS
    return {"color": COLORS[m % 4], "shape": SHAPES[m % 3], "price": (i * 37) % 100,
            "rating": (i % 50) / 2.0, "shop": "shop-%d" % ((m // 2) % 20)}


def make_records(n, dims, seed):
    rnd = random.Random(seed)
    centers = [[rnd.gauss(0, 1) for _ in range(dims)] for _ in range(NCENTERS)]
    query = [round(x + 0.05, 5) for x in centers[QUERY_CENTER]]
    recs = []
    for i in range(n):
        c, m = i % NCENTERS, i // NCENTERS
        if c == QUERY_CENTER and m < NEAR:  # the showcase: m-th nearest to the query
            emb = [round(x + rnd.gauss(0, 0.015 * (m + 1)), 5) for x in query]
        else:
            emb = [round(x + rnd.gauss(0, 0.3), 5) for x in centers[c]]
        a = attrs(i)
        r = {"id": "dp-%05d" % i,
             "embedding": emb,
             "restricts": [{"namespace": "color", "allow": [a["color"]]},
                           {"namespace": "shape", "allow": [a["shape"]]}],
             "numeric_restricts": [{"namespace": "price", "value_int": a["price"]},
                                   {"namespace": "rating", "value_float": a["rating"]}],
             "crowding_tag": a["shop"]}
        if i % 3 == 0:
            sd = sorted(rnd.sample(range(1000), 4))
            r["sparse_embedding"] = {"values": [round(rnd.uniform(0.1, 1), 3) for _ in sd],
                                     "dimensions": sd}
        recs.append(r)
    return recs, query


def sparse_query(recs):
    """The sparse embedding of the first sparse datapoint of another cluster than the
    query's, as "dim:value,..." (the hybrid query finds it through its sparse part)."""
    for i, r in enumerate(recs):
        if "sparse_embedding" in r and i % NCENTERS not in (QUERY_CENTER,) and i >= NCENTERS:
            se = r["sparse_embedding"]
            return ",".join("%d:%r" % (d, v) for d, v in zip(se["dimensions"], se["values"]))
    return ""


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
    ap.add_argument("--no-avro", action="store_true",
                    help="write the third part as JSON lines instead of Avro")
    a = ap.parse_args()
    if not a.no_avro:
        try:
            import avro.schema  # noqa: F401
        except ImportError:
            sys.exit("gen_sample.py: the python 'avro' package is missing from %s; run it with "
                     "/usr/bin/python3 (Debian/Ubuntu: python3-avro) or pass --no-avro to write "
                     "the third part as JSON" % sys.executable)
    os.makedirs(a.out, exist_ok=True)
    recs, query = make_records(a.n, a.dims, a.seed)
    third = a.n // 3
    with open(os.path.join(a.out, "part-0.json"), "w") as f:
        for r in recs[:third]:
            f.write(json.dumps(r) + "\n")
    write_csv(os.path.join(a.out, "part-1.csv"), recs[third:2 * third])
    if a.no_avro:
        with open(os.path.join(a.out, "part-2.json"), "w") as f:
            for r in recs[2 * third:]:
                f.write(json.dumps(r) + "\n")
    else:
        write_avro(os.path.join(a.out, "part-2.avro"), recs[2 * third:])
    side = os.path.dirname(os.path.abspath(a.out))
    with open(os.path.join(side, "query.txt"), "w") as f:
        f.write(",".join(repr(x) for x in query) + "\n")
    with open(os.path.join(side, "sparse.txt"), "w") as f:
        f.write(sparse_query(recs) + "\n")
    demo = {}
    for i, r in enumerate(recs):
        d = attrs(i)
        d["sparse"] = r.get("sparse_embedding", {}).get("dimensions", [])
        demo[r["id"]] = d
    with open(os.path.join(side, "demo.json"), "w") as f:
        json.dump(demo, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
