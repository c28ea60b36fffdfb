"""Google's official node client @google-cloud/aiplatform (v1.MatchServiceClient and
v1.IndexServiceClient, pinned in tests/interop/node/package-lock.json, used unmodified)
against tessera-coordinator's google.cloud.aiplatform.v1 MatchService and IndexService
(issue 17).

A 4-shard cluster is loaded through UpdateIndex with restricts, numeric restricts, crowding
tags, sparse and sparse-only datapoints (vertex_harness.dataset), every fifth with
embedding_metadata. tests/interop/node/vertex_v1_client.js points the client at the
coordinator (apiEndpoint, port, insecure channel credentials) and sends findNeighbors with
resource names as callers write them: dense, token restricts (allow and deny), numeric
restricts (int and double, several ops), crowding, sparse-only, hybrid RRF,
return_full_datapoint over a batch of queries (the batch's embeddingMetadata returned), a
query carrying embedding_metadata (accepted and ignored); then readIndexDatapoints. Every
answer must equal tessera.v1 FindNeighbors / ReadIndexDatapoints for the same query (python
grpcio), embedding_metadata included. Bad requests get INVALID_ARGUMENT naming the field;
IndexService's unserved methods UNIMPLEMENTED naming what Tessera serves instead.

Streamed writes: upsertDatapoints (dense with restricts, numeric restricts, crowding tag and
embeddingMetadata; dense + sparse; sparse-only) is seen at once by findNeighbors
(returnFullDatapoint, the metadata as sent) and readIndexDatapoints, equal to tessera.v1;
bad upserts (wrong dimension, NaN, bad or missing index name, metadata over 64 KiB, an
unknown update_mask path) are INVALID_ARGUMENT naming the field and write nothing;
removeDatapoints removes at once. Then updateIndex from a batch folder (complete overwrite)
through its long-running operation. Then the coordinator is restarted with
--deployed-index-id and --auth-tokens: the client passes the token through its call
options (otherArgs.headers) and is served; a wrong deployed_index_id is NOT_FOUND naming
it; no token is UNAUTHENTICATED; upsert/removeDatapoints with a query token are
PERMISSION_DENIED and served with an admin token.
"""
import json
import os
import subprocess
import sys

import numpy as np
from google.protobuf import json_format

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import vertex_harness as vh  # noqa: E402

NODE_DIR = os.path.join(HERE, "node")
K = 8
ENDPOINT = "projects/my-project/locations/us-central1/indexEndpoints/1234567890"
OPS = {1: "LESS", 2: "LESS_EQUAL", 3: "EQUAL", 4: "GREATER_EQUAL", 5: "GREATER",
       6: "NOT_EQUAL"}
QUERY_TOKEN = "q-" + os.urandom(12).hex()
ADMIN_TOKEN = "a-" + os.urandom(12).hex()


def vertex_query(spec, qid):
    """The official client's request object (camelCase) for spec (ch.query's kwargs)."""
    dp = {"datapointId": qid}
    if spec.get("vec") is not None:
        dp["featureVector"] = [float(v) for v in spec["vec"]]
    if spec.get("sparse") is not None:
        dp["sparseEmbedding"] = {"dimensions": spec["sparse"][0], "values": spec["sparse"][1]}
    if spec.get("restricts"):
        dp["restricts"] = [{"namespace": ns, "allowList": a, "denyList": d}
                           for ns, a, d in spec["restricts"]]
    if spec.get("numeric"):
        dp["numericRestricts"] = []
        for ns, kind, val, op in spec["numeric"]:
            dp["numericRestricts"].append({"namespace": ns, "op": OPS[op],
                                           "value" + kind.capitalize(): val})
    if spec.get("metadata"):
        dp["embeddingMetadata"] = spec["metadata"]
    q = {"datapoint": dp, "neighborCount": spec.get("k", K),
         "perCrowdingAttributeNeighborCount": spec.get("crowding", 0),
         "fractionLeafNodesToSearchOverride": spec.get("fraction", 0.0)}
    if spec.get("cand"):
        q["approximateNeighborCount"] = spec["cand"]
    if spec.get("alpha") is not None:
        q["rrf"] = {"alpha": spec["alpha"]}
    return q


def tessera_kwargs(spec):
    return {k: v for k, v in spec.items() if k != "metadata"}


def js_value(v):
    """A google.protobuf.Value as the client decoded it, as plain JSON (numbers float)."""
    kind = v.get("kind") or next(k for k in ("nullValue", "numberValue", "stringValue",
                                             "boolValue", "structValue", "listValue") if k in v)
    if kind == "nullValue":
        return None
    if kind == "structValue":
        return js_struct(v["structValue"])
    if kind == "listValue":
        return [js_value(x) for x in v["listValue"].get("values") or []]
    return float(v[kind]) if kind == "numberValue" else v[kind]


def js_struct(st):
    """A google.protobuf.Struct as the client decoded it (or null), as plain JSON."""
    return None if st is None else {k: js_value(v) for k, v in (st.get("fields") or {}).items()}


def to_js_struct(o):
    """Plain JSON as the client's google.protobuf.Struct request object."""
    def val(v):
        if v is None:
            return {"nullValue": "NULL_VALUE"}
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, (int, float)):
            return {"numberValue": v}
        if isinstance(v, str):
            return {"stringValue": v}
        if isinstance(v, list):
            return {"listValue": {"values": [val(x) for x in v]}}
        return {"structValue": to_js_struct(v)}
    return {"fields": {k: val(v) for k, v in o.items()}}


def t_meta(d):
    """The embedding_metadata of a tessera.v1 IndexDatapoint as plain JSON (or None)."""
    return json_format.MessageToDict(d.embedding_metadata) \
        if d.HasField("embedding_metadata") else None


def v_dp(d):
    """(id, tag, vector, sparse, restricts, numeric, metadata) of an IndexDatapoint as the
    client decoded it (unset fields are null or absent)."""
    d = d or {}
    sp = d.get("sparseEmbedding")
    num = []
    for n in d.get("numericRestricts") or []:
        v = [n.get(k) for k in ("valueInt", "valueFloat", "valueDouble") if n.get(k) is not None]
        num.append((n.get("namespace") or "", float(v[0]) if v else None))
    return (d.get("datapointId") or "", (d.get("crowdingTag") or {}).get("crowdingAttribute") or "",
            [float(v) for v in d.get("featureVector") or []],
            ([int(x) for x in sp.get("dimensions") or []],
             [float(v) for v in sp.get("values") or []]) if sp else None,
            [(r.get("namespace") or "", r.get("allowList") or [], r.get("denyList") or [])
             for r in d.get("restricts") or []],
            sorted(num), js_struct(d.get("embeddingMetadata")))


def t_dp(d):
    """The same tuple of a tessera.v1 IndexDatapoint."""
    return (d.datapoint_id, d.crowding_tag.crowding_attribute,
            [float(v) for v in d.feature_vector],
            (list(d.sparse_embedding.dimensions), [float(v) for v in d.sparse_embedding.values])
            if d.HasField("sparse_embedding") else None,
            [(r.namespace, list(r.allow_list), list(r.deny_list)) for r in d.restricts],
            sorted((n.namespace, float(getattr(n, n.WhichOneof("Value"))))
                   for n in d.numeric_restricts), t_meta(d))


def run_node(port, calls, root, token=None):
    cfile = os.path.join(root, "calls.json")
    with open(cfile, "w") as f:
        json.dump(calls, f)
    argv = ["node", os.path.join(NODE_DIR, "vertex_v1_client.js"), str(port), cfile]
    out = subprocess.run(argv + ([token] if token else []), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["results"]
    assert len(got) == len(calls)
    return got


def specs(D, rng):
    out = []
    for j in range(8):
        qv = [float(v) for v in rng.normal(size=D.d).astype("float32")]
        s = dict(vec=qv, k=K, fraction=1.0, cand=600)
        if j % 2:
            s["restricts"] = [("color", [vh.COLORS[j % 4]], ["green"] if j % 3 == 0 else [])]
        if j % 3 == 1:
            s["numeric"] = [("price", "int", 40, 1 + j % 6)]
        if j == 4:
            s["numeric"] = [("w", "double", 5.5, 4), ("price", "int", 90, 6)]
        if j % 4 == 2:
            s["crowding"] = 1
        out.append(s)
    sq = ([3, 7, 11, 20], [0.5, 0.25, 1.0, 0.75])
    out.append(dict(sparse=sq, k=K))
    qv = [float(v) for v in rng.normal(size=D.d).astype("float32")]
    out.append(dict(vec=qv, sparse=sq, alpha=0.5, k=K, fraction=1.0))
    out.append(dict(vec=qv, sparse=sq, alpha=0.5, k=K, fraction=1.0, crowding=1,
                    restricts=[("color", ["red", "blue"], [])]))
    out.append(dict(vec=D.x[7].tolist(), k=K, fraction=1.0,
                    metadata={"fields": {"genre": {"stringValue": "jazz"},
                                         "year": {"numberValue": 1959}}}))
    return out


def check_answers(cl, tp, calls, got, full_batch):
    n = 0
    for j, (c, g) in enumerate(zip(calls, got)):
        if c["method"] != "findNeighbors" or "_want" in c:
            continue
        assert "response" in g, (j, g)
        full = c["request"].get("returnFullDatapoint", False)
        tq = [ch.query(tp, qid="q%d-%d" % (j, i), **tessera_kwargs(s))
              for i, s in enumerate(c["_specs"])]
        want = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=tq,
                                                             return_full_datapoint=full),
                                     timeout=30).nearest_neighbors
        have = g["response"].get("nearestNeighbors") or []
        assert len(have) == len(want), (j, have)
        for h, w in zip(have, want):
            assert (h.get("id") or "") == w.id, (j, h, w.id)
            hn = [(v_dp(x.get("datapoint")), x.get("distance") or 0.0,
                   x.get("sparseDistance") or 0.0) for x in h.get("neighbors") or []]
            wn = [(t_dp(x.datapoint), x.distance, x.sparse_distance) for x in w.neighbors]
            assert hn == wn, (j, hn, wn)
            assert hn, j
        n += 1
    assert full_batch
    return n


INDEX = "projects/my-project/locations/us-central1/indexes/987654321"


def update_call(uri, overwrite):
    return {"method": "updateIndex", "client": "IndexServiceClient", "lro": True,
            "request": {"index": {"name": INDEX, "metadata": {"structValue": {"fields": {
                "contentsDeltaUri": {"stringValue": uri},
                "isCompleteOverwrite": {"boolValue": overwrite}}}}}}}


def index_service(cl, tp, D, ss, root):
    """IndexService: updateIndex from a batch folder awaited through operation.promise(),
    findNeighbors on the new version equal to tessera.v1's, getIndex equal to
    GetIndexStats, a bad batch rejecting the promise, a gs:// URI refused."""
    D2 = vh.dataset(n=400, d=D.d, seed=21)
    b2 = ch.write_batch(os.path.join(root, "b2"), D2.recs, per_file=150)
    bad = os.path.join(root, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "part-0.json"), "w") as f:
        f.write(json.dumps({"id": "x1", "embedding": [1.0, 2.0]}) + "\n")
    before = cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=30).version
    calls = [update_call("file://" + b2, True)]
    for i, s in enumerate(ss):
        calls.append({"method": "findNeighbors", "_specs": [s],
                      "request": {"indexEndpoint": ENDPOINT,
                                  "queries": [vertex_query(s, "q%d-0" % (i + 1))]}})
    calls.append({"method": "getIndex", "client": "IndexServiceClient",
                  "request": {"name": INDEX}})
    calls.append(dict(update_call(bad, False), _want=(3, "EMBEDDING_SIZE_MISMATCH")))
    calls.append(dict(update_call("gs://bucket/batch", False), _want=(3, "only local paths")))
    calls.append({"method": "getIndex", "client": "IndexServiceClient",
                  "request": {"name": "my-index"}, "_want": (3, "name")})
    got = run_node(cl.coord.port, [{k: v for k, v in c.items() if not k.startswith("_")}
                                   for c in calls], root)
    up = got[0]
    assert "response" in up, up
    assert up["operation"].startswith(INDEX + "/operations/"), up
    assert up["response"]["name"] == INDEX, up
    st = cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=30)
    assert st.version == before + 1 and st.vectors_count == 400, (st, before)
    n_ok = check_answers(cl, tp, calls, got, True)
    gi = got[len(ss) + 1]["response"]
    cfg = gi["metadata"]["structValue"]["fields"]["config"]["structValue"]["fields"]
    dist = {"SQUARED_L2": "SQUARED_L2_DISTANCE", "DOT_PRODUCT": "DOT_PRODUCT_DISTANCE",
            "COSINE": "COSINE_DISTANCE"}[st.distance]
    assert cfg["dimensions"]["numberValue"] == st.dimensions == D.d, cfg
    assert cfg["distanceMeasureType"]["stringValue"] == dist, cfg
    ist = gi["indexStats"]
    assert int(ist["vectorsCount"]) == st.vectors_count, (ist, st)
    assert int(ist.get("sparseVectorsCount") or 0) == st.sparse_vectors_count, (ist, st)
    assert ist["shardsCount"] == st.shards_count == 4, (ist, st)
    assert gi["indexUpdateMethod"] == "STREAM_UPDATE", gi
    for c, g in zip(calls, got):
        if "_want" in c:
            code, msg = c["_want"]
            assert g.get("code") == code and msg in g.get("details", ""), (c, g)
    st2 = cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=30)
    assert st2.version == st.version, (st, st2)  # the rejected batch changed nothing
    print("IndexService: updateIndex awaited through operation.promise() (v%d live), %d "
          "findNeighbors on it equal to tessera.v1, getIndex = GetIndexStats, a bad batch "
          "rejects the promise, gs:// refused" % (st.version, n_ok))


def strip(calls):
    return [{k: v for k, v in c.items() if not k.startswith("_")} for c in calls]


def expect_codes(calls, got):
    n = 0
    for i, (c, g) in enumerate(zip(calls, got)):
        if "_want" in c:
            code, msg = c["_want"]
            assert g.get("code") == code and msg in g.get("details", ""), \
                (i, c["method"], c["_want"], str(g)[:600])
            n += 1
    return n


META = {"genre": "jazz", "year": 1959, "tags": ["a", True, None, 2.5],
        "nested": {"x": {"y": [1, {"z": "\u00e9"}]}}, "empty": {}}


def stream_dps(d):
    """Three datapoints for UpsertDatapoints (client request objects): s1 dense far from the
    batch's data with restricts, numeric restricts, a crowding tag and metadata; s2 dense +
    sparse with other metadata; s3 sparse-only without metadata."""
    far = [6.0 + 0.01 * i for i in range(d)]
    return [
        {"datapointId": "s1", "featureVector": far,
         "restricts": [{"namespace": "color", "allowList": ["red"], "denyList": ["blue"]}],
         "numericRestricts": [{"namespace": "price", "valueInt": 7},
                              {"namespace": "w", "valueDouble": 1.0}],
         "crowdingTag": {"crowdingAttribute": "shop-s"},
         "embeddingMetadata": to_js_struct(META)},
        {"datapointId": "s2", "featureVector": [v + 0.5 for v in far],
         "sparseEmbedding": {"dimensions": [3, 9], "values": [0.5, 0.25]},
         "restricts": [{"namespace": "color", "allowList": ["red"]}],
         "embeddingMetadata": to_js_struct({"n": 2})},
        {"datapointId": "s3", "sparseEmbedding": {"dimensions": [3, 7], "values": [2.0, 1.0]}},
    ], far


def stream_writes(cl, tp, D, root):
    """IndexService UpsertDatapoints / RemoveDatapoints with the official client: the
    upserted datapoints are seen at once by findNeighbors (returnFullDatapoint, with their
    embeddingMetadata) and readIndexDatapoints, equal to tessera.v1's answers; after
    removeDatapoints they are gone; bad requests are refused naming the field and change
    nothing."""
    dps, far = stream_dps(D.d)
    base = cl.stats().vectors_count
    q_far = dict(vec=far, k=4, fraction=1.0, restricts=[("color", ["red"], [])])
    q_sparse = dict(sparse=([3, 7, 9], [1.0, 1.0, 1.0]), k=4)
    finds = [{"method": "findNeighbors", "_specs": [q_far, q_sparse],
              "request": {"indexEndpoint": ENDPOINT, "returnFullDatapoint": True,
                          "queries": [vertex_query(q_far, "q1-0"),
                                      vertex_query(q_sparse, "q1-1")]}},
             {"method": "readIndexDatapoints",
              "request": {"indexEndpoint": ENDPOINT, "ids": ["s1", "s2", "s3", "p0001"]}}]
    calls = [{"method": "upsertDatapoints", "client": "IndexServiceClient",
              "request": {"index": INDEX, "datapoints": dps}}] + finds
    got = run_node(cl.coord.port, strip(calls), root)
    assert got[0].get("response") == {}, got[0]
    check_answers(cl, tp, calls, got, True)
    nn = got[1]["response"]["nearestNeighbors"]
    top = [v_dp(x["datapoint"]) for x in nn[0]["neighbors"]]
    assert [t[0] for t in top[:2]] == ["s1", "s2"], top
    assert top[0][6] == META, top[0]  # numbers come back as doubles: 1959.0 == 1959
    assert top[0][1] == "shop-s" and abs(nn[0]["neighbors"][0].get("distance", 0.0)) < 1e-6
    assert "s3" in [x["datapoint"]["datapointId"] for x in nn[1]["neighbors"]], nn[1]
    rd = got[2]["response"]["datapoints"]
    want = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(
        ids=["s1", "s2", "s3", "p0001"]), timeout=30)
    assert [v_dp(x) for x in rd] == [t_dp(x) for x in want.datapoints], rd
    assert [v_dp(x)[6] for x in rd][:3] == [t_meta(want.datapoints[0]), {"n": 2.0}, None]
    assert cl.stats().vectors_count == base + 2
    print("upsertDatapoints: 3 datapoints seen at once by findNeighbors (full datapoints with "
          "embeddingMetadata) and readIndexDatapoints, equal to tessera.v1")

    big = dict(dps[0], datapointId="big", embeddingMetadata=to_js_struct({"b": "y" * 70000}))
    bad = [
        ({"index": INDEX, "datapoints": [{"datapointId": "bad", "featureVector": [1.0, 2.0]}]},
         "upsertDatapoints", "datapoints[0]"),
        ({"index": INDEX, "datapoints": [dps[0], dict(dps[1], datapointId="bad", sparseEmbedding={
            "dimensions": [1, 2], "values": [0.5]})]}, "upsertDatapoints", "datapoints[1]"),
        ({"index": "my-index", "datapoints": [dps[0]]}, "upsertDatapoints", "index \"my-index\""),
        ({"datapoints": [dps[0]]}, "upsertDatapoints", "index is empty"),
        ({"index": INDEX, "datapoints": [big]}, "upsertDatapoints",
         "datapoints[0] (id \"big\"): embedding_metadata is"),
        ({"index": INDEX, "datapoints": [dps[0]], "updateMask": {"paths": ["color"]}},
         "upsertDatapoints", "update_mask"),
        ({"index": "projects/p/locations/l/indexEndpoints/1", "datapointIds": ["s1"]},
         "removeDatapoints", "index \"projects/p/locations/l/indexEndpoints/1\""),
    ]
    calls = [{"method": m, "client": "IndexServiceClient", "request": rq, "_want": (3, msg)}
             for rq, m, msg in bad]
    calls.append({"method": "readIndexDatapoints",
                  "request": {"indexEndpoint": ENDPOINT, "ids": ["bad", "big"]}})
    got = run_node(cl.coord.port, strip(calls), root)
    n_bad = expect_codes(calls, got)
    assert not got[-1]["response"].get("datapoints"), got[-1]

    calls = [{"method": "removeDatapoints", "client": "IndexServiceClient",
              "request": {"index": INDEX, "datapointIds": ["s1", "s3", "never-there"]}}] + finds
    got = run_node(cl.coord.port, strip(calls), root)
    assert got[0].get("response") == {}, got[0]
    check_answers(cl, tp, calls, got, True)
    ids0 = [x["datapoint"]["datapointId"] for x in got[1]["response"]["nearestNeighbors"][0][
        "neighbors"]]
    ids1 = [x["datapoint"]["datapointId"] for x in got[1]["response"]["nearestNeighbors"][1][
        "neighbors"]]
    assert ids0[0] == "s2" and "s1" not in ids0 and "s3" not in ids1, (ids0, ids1)
    assert [v_dp(x)[0] for x in got[2]["response"]["datapoints"]] == ["s2", "p0001"], got[2]
    assert cl.stats().vectors_count == base + 1
    print("removeDatapoints: s1, s3 gone at once (an unknown id is no error); %d bad requests "
          "INVALID_ARGUMENT naming the field, nothing written" % n_bad)


def main():
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@google-cloud", "aiplatform")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    tp = ch.stubs()[0]
    D = vh.dataset(n=600, d=12, seed=8)
    for i in range(0, len(D.recs), 5):  # metadata from the batch, returned with full datapoints
        D.recs[i]["embedding_metadata"] = {"i": i, "name": "rec %d" % i, "odd": bool(i % 2),
                                           "l": [i, None, {"k": "v"}]}
    root = sh.tmpdir("tsr-v1node-")
    batch = ch.write_batch(os.path.join(root, "b"), D.recs, per_file=200)
    cl = ch.Cluster(4, D.d, {"nlist": 8, "pq_m": 4, "nprobe": 3})
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        rng = np.random.default_rng(3)
        ss = specs(D, rng)
        calls = []
        for i, s in enumerate(ss):
            calls.append({"method": "findNeighbors", "_specs": [s],
                          "request": {"indexEndpoint": ENDPOINT, "deployedIndexId": "any_id",
                                      "queries": [vertex_query(s, "q%d-0" % len(calls))]}})
        # a batch of queries with the neighbors' full datapoints
        j = len(calls)
        calls.append({"method": "findNeighbors", "_specs": ss[:4] + ss[8:10],
                      "request": {"indexEndpoint": ENDPOINT, "returnFullDatapoint": True,
                                  "queries": [vertex_query(s, "q%d-%d" % (j, i))
                                              for i, s in enumerate(ss[:4] + ss[8:10])]}})
        ids = ["p0042", "missing-id", "q003", "p0007", "p0042"]
        calls.append({"method": "readIndexDatapoints",
                      "request": {"indexEndpoint": ENDPOINT, "ids": ids}})
        bad = [({"indexEndpoint": ENDPOINT, "queries": [{"datapoint": {"featureVector": [1, 2]}}]},
                3, "feature_vector has 2 values"),
               ({"indexEndpoint": "my-endpoint", "queries": [vertex_query(ss[0], "")]},
                3, "index_endpoint"),
               ({"queries": [{"datapoint": {"featureVector": ss[0]["vec"], "numericRestricts":
                                            [{"namespace": "price", "valueInt": 3}]}}]},
                3, "numeric_restricts[0] (price): op is unset"),
               ({"queries": [{"datapoint": {"featureVector": ss[0]["vec"]},
                              "neighborCount": -1}]}, 3, "neighbor_count"),
               ({"queries": [{"neighborCount": 3}]}, 3, "datapoint is missing")]
        for req, code, msg in bad:
            calls.append({"method": "findNeighbors", "request": req, "_want": (code, msg)})
        for m, rq in (("deleteIndex", {"name": INDEX}),
                      ("listIndexes", {"parent": "projects/p/locations/l"})):
            calls.append({"method": m, "client": "IndexServiceClient", "request": rq,
                          "_want": (12, "tessera.v1.VectorSearch/UpdateIndex")})
        got = run_node(cl.coord.port, [{k: v for k, v in c.items() if not k.startswith("_")}
                                       for c in calls], root)
        n_ok = check_answers(cl, tp, calls, got, True)
        with_meta = [x for nn in got[len(ss)]["response"]["nearestNeighbors"]
                     for x in nn["neighbors"] if x["datapoint"].get("embeddingMetadata")]
        assert with_meta, "no neighbor with the batch's embedding_metadata"
        # ReadIndexDatapoints: the same datapoints as tessera.v1's, in request order
        rd = got[len(ss) + 1]
        want = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=30)
        have = [v_dp(d) for d in rd["response"].get("datapoints") or []]
        assert have == [t_dp(d) for d in want.datapoints], (have, want)
        assert [h[0] for h in have] == ["p0042", "q003", "p0007", "p0042"], have
        # the metadata query equals the same query without it, and p0007 is its nearest
        assert got[len(ss) - 1]["response"]["nearestNeighbors"][0]["neighbors"][0][
            "datapoint"]["datapointId"] == "p0007"
        n_err = 0
        for c, g in zip(calls, got):
            if "_want" in c:
                code, msg = c["_want"]
                assert g.get("code") == code and msg in g.get("details", ""), (c, g)
                n_err += 1
        print("official client: %d findNeighbors calls equal to tessera.v1, readIndexDatapoints "
              "equal, %d refused as expected" % (n_ok, n_err))
        stream_writes(cl, tp, D, root)
        index_service(cl, tp, D, ss, root)

        # --deployed-index-id and --auth-tokens: the token through the client's call options
        tokens = os.path.join(root, "tokens")
        with open(tokens, "w") as f:
            f.write("query %s\nadmin %s\n" % (QUERY_TOKEN, ADMIN_TOKEN))
        cl.stop_coord()
        cl.start(extra_args=["--deployed-index-id", "idx_1", "--auth-tokens", tokens])
        s = ss[1]
        ok = {"method": "findNeighbors", "_specs": [s],
              "request": {"indexEndpoint": ENDPOINT, "deployedIndexId": "idx_1",
                          "queries": [vertex_query(s, "q0-0")]}}
        wrong = {"method": "findNeighbors",
                 "request": {"indexEndpoint": ENDPOINT, "deployedIndexId": "other",
                             "queries": [vertex_query(s, "")]}}
        rd_wrong = {"method": "readIndexDatapoints",
                    "request": {"indexEndpoint": ENDPOINT, "deployedIndexId": "other",
                                "ids": ["p0001"]}}
        calls = [ok, wrong, rd_wrong]
        got = run_node(cl.coord.port, [{k: v for k, v in c.items() if not k.startswith("_")}
                                       for c in calls], root, token=QUERY_TOKEN)
        import grpc
        md = [("authorization", "Bearer " + QUERY_TOKEN)]
        # tessera.v1 side of the comparison, with the token too
        stub = cl.stub
        cl.stub = type("S", (), {"FindNeighbors": lambda self, r, timeout: stub.FindNeighbors(
            r, timeout=timeout, metadata=md)})()
        check_answers(cl, tp, calls[:1], got[:1], True)
        cl.stub = stub
        for g in got[1:]:
            assert g.get("code") == 5 and 'deployed_index_id "other"' in g["details"], g
        got = run_node(cl.coord.port, [{k: v for k, v in ok.items() if not k.startswith("_")}],
                       root)
        assert got[0].get("code") == grpc.StatusCode.UNAUTHENTICATED.value[0], got
        # streamed writes need the admin role: a query token is PERMISSION_DENIED
        dps, _ = stream_dps(D.d)
        up = {"method": "upsertDatapoints", "client": "IndexServiceClient",
              "request": {"index": INDEX, "datapoints": dps[:1]}}
        rm = {"method": "removeDatapoints", "client": "IndexServiceClient",
              "request": {"index": INDEX, "datapointIds": ["s1"]}}
        rd = {"method": "readIndexDatapoints", "request": {"ids": ["s1"]}}
        got = run_node(cl.coord.port, [up, rm], root, token=QUERY_TOKEN)
        assert [g.get("code") for g in got] == [7, 7], got
        got = run_node(cl.coord.port, [up, rd, rm, rd], root, token=ADMIN_TOKEN)
        assert got[0].get("response") == {} and got[2].get("response") == {}, got
        assert [v_dp(x)[0] for x in got[1]["response"]["datapoints"]] == ["s1"], got[1]
        assert v_dp(got[1]["response"]["datapoints"][0])[6] == META, got[1]
        assert not got[3]["response"].get("datapoints"), got[3]
        print("with --auth-tokens: the client's bearer token served; a wrong "
              "deployed_index_id NOT_FOUND; no token UNAUTHENTICATED; upsert/removeDatapoints "
              "PERMISSION_DENIED with a query token, served with an admin token")
    finally:
        cl.stop()
    print("ok")


if __name__ == "__main__":
    main()
