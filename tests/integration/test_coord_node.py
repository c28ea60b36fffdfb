"""A node @grpc/grpc-js client against the cluster (issue 5, "what must be true" 5).

Coordinator + 4 shards; the node client (tests/interop/node/coord_client.js, packages from
package-lock.json, installed with `npm ci` when node_modules is missing) runs UpdateIndex
and polls GetOperation until the operation ends (the coordinator trains the index from
this first batch), then FindNeighbors (dense, with restricts, numeric restricts, crowding,
sparse, hybrid RRF; return_full_datapoint), ReadIndexDatapoints (an unknown id among
them), GetIndexStats, a FindNeighbors with a wrong dimension and GetOperation of an
unknown id. The python grpcio client then sends the same requests: the answers must be
the same — neighbour ids in order, distances within 1e-6 relative, every datapoint field
equal (floats compared as float32) — and the errors the same codes.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop", "node")
D = 16


def canon(dp):
    """The same canonical form as coord_client.js canon()."""
    num = []
    for n in dp.numeric_restricts:
        kind = n.WhichOneof("Value") or ""
        v = getattr(n, kind) if kind else ""
        num.append([n.namespace, kind, str(v) if kind != "value_float" else v])
    return [dp.datapoint_id, list(dp.feature_vector),
            [[r.namespace, list(r.allow_list), list(r.deny_list)] for r in dp.restricts], num,
            dp.crowding_tag.crowding_attribute if dp.HasField("crowding_tag") else "",
            [str(x) for x in dp.sparse_embedding.dimensions],
            list(dp.sparse_embedding.values)]


def same_dp(a, b, where):
    """a from node, b from python; floats as float32."""
    assert a is not None and b is not None, (where, a, b)
    f32 = lambda v: np.asarray(v, dtype=np.float64).astype(np.float32)  # noqa: E731
    assert a[0] == b[0], (where, a[0], b[0])
    assert np.array_equal(f32(a[1]), f32(b[1])), (where, "feature_vector")
    assert a[2] == b[2], (where, a[2], b[2])
    assert len(a[3]) == len(b[3]), (where, a[3], b[3])
    for x, y in zip(a[3], b[3]):
        assert x[:2] == y[:2], (where, x, y)
        if x[1] == "value_float":  # node prints a float32 decoded to double
            assert np.float32(float(x[2])) == np.float32(y[2]), (where, x, y)
        elif x[1] == "value_double":
            assert float(x[2]) == float(y[2]), (where, x, y)
        else:
            assert x[2] == y[2], (where, x, y)
    assert a[4] == b[4] and a[5] == b[5], (where, a[4:6], b[4:6])
    assert np.array_equal(f32(a[6]), f32(b[6])), (where, "sparse values")


def rel_close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-12)


def main():
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    tp = ch.stubs()[0]
    rng = np.random.default_rng(11)
    N = 3000
    centers = rng.normal(size=(20, D)).astype("float32") * 3
    x = (centers[rng.integers(0, 20, N)] + rng.normal(size=(N, D))).astype("float32")
    colors = ["red", "green", "blue"]
    recs = []
    for i in range(N):
        sp = None
        if i % 3 == 0:
            dims = sorted(rng.choice(500, 4, replace=False).tolist())
            sp = (dims, rng.normal(size=4).astype("float32").tolist())
        numeric = [("price", "int", int(i % 50)), ("score", "float", float(np.float32(i / 7.0))),
                   ("w", "double", i / 3.0)]
        recs.append(ch.dp_json("p%05d" % i, x[i], sparse=sp,
                               restricts=[("color", [colors[i % 3]], []),
                                          ("shape", ["sq" if i % 2 else "ci"], [])],
                               numeric=numeric, tag="t%d" % (i % 5)))
    root = sh.tmpdir("tsr-coord-node-")
    batch = ch.write_batch(os.path.join(root, "b1"), recs, per_file=1000)

    xq = (centers[rng.integers(0, 20, 8)] + rng.normal(size=(8, D))).astype("float32")
    qs = []
    for i in range(8):
        q = {"datapoint": {"datapoint_id": "q%d" % i,
                           "feature_vector": [float(v) for v in xq[i]]},
             "neighbor_count": 10}
        if i == 1:
            q["datapoint"]["restricts"] = [{"namespace": "color", "allow_list": ["red", "blue"]}]
        if i == 2:
            q["datapoint"]["numeric_restricts"] = [{"namespace": "price", "value_int": 20,
                                                    "op": "GREATER_EQUAL"}]
        if i == 3:
            q["per_crowding_attribute_neighbor_count"] = 2
        if i == 4:
            q["datapoint"]["sparse_embedding"] = {"dimensions": [3, 40, 77, 300],
                                                  "values": [0.5, -0.25, 1.0, 0.75]}
            q["rrf"] = {"alpha": 0.5}
        if i == 5:
            q["datapoint"] = {"datapoint_id": "q5", "sparse_embedding": {
                "dimensions": [3, 40, 77, 300], "values": [0.5, -0.25, 1.0, 0.75]}}
        if i == 6:
            q["approximate_neighbor_count"] = 50
            q["fraction_leaf_nodes_to_search_override"] = 0.5
        if i == 7:
            q["datapoint"]["restricts"] = [{"namespace": "shape", "deny_list": ["sq"]}]
            q["datapoint"]["numeric_restricts"] = [{"namespace": "score", "value_float": 100.0,
                                                    "op": "LESS"}]
        qs.append(q)
    read_ids = ["p00000", "p00003", "nope", "p02999", "p01234"]
    planf = os.path.join(root, "plan.json")
    with open(planf, "w") as f:
        json.dump({"batch_root": batch, "queries": qs, "return_full_datapoint": True,
                   "read_ids": read_ids, "bad_dims": D + 1}, f)

    cl = ch.Cluster(4, D, {"nlist": 16, "pq_m": 4, "nprobe": 4})
    try:
        out = subprocess.run(["node", os.path.join(NODE_DIR, "coord_client.js"), cl.target,
                              planf], capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr + out.stdout
        got = json.loads(out.stdout)
        o = got["operation"]
        assert o["state"] == "SUCCEEDED" and o["version"] == 1, o
        assert o["valid_records"] == N and o["shards_committed"] == 4, o
        # python: the same operation, then the same requests
        pop = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=got["operation_id"]),
                                   timeout=10)
        assert pop.state == tp.Operation.SUCCEEDED and pop.version == 1
        assert pop.report.valid_records == N
        from google.protobuf import json_format
        rq = json_format.ParseDict({"queries": qs, "return_full_datapoint": True},
                                   tp.FindNeighborsRequest())
        pr = cl.stub.FindNeighbors(rq, timeout=30)
        assert got["version"] == pr.version == 1
        assert len(got["neighbors"]) == len(pr.nearest_neighbors) == len(qs)
        nn_total = 0
        for i, (g, p) in enumerate(zip(got["neighbors"], pr.nearest_neighbors)):
            assert g["id"] == p.id == "q%d" % i
            gids = [n["id"] for n in g["neighbors"]]
            pids = [n.datapoint.datapoint_id for n in p.neighbors]
            assert gids == pids, (i, gids, pids)
            assert len(gids) > 0, i
            for gn, pn in zip(g["neighbors"], p.neighbors):
                assert rel_close(gn["distance"], pn.distance), (i, gn["distance"], pn.distance)
                assert rel_close(gn["sparse_distance"], pn.sparse_distance), (i, gn, pn)
                same_dp(gn["datapoint"], canon(pn.datapoint), "query %d %s" % (i, gn["id"]))
                nn_total += 1
        # the filters did what they say (so the comparison covers them)
        byid = {r["id"]: r for r in recs}
        assert all(byid[n]["restricts"][0]["allow"][0] in ("red", "blue")
                   for n in [x["id"] for x in got["neighbors"][1]["neighbors"]])
        assert all(int(n["id"][1:]) % 50 >= 20 for n in got["neighbors"][2]["neighbors"])
        tags = [n["datapoint"][4] for n in got["neighbors"][3]["neighbors"]]
        assert max(tags.count(t) for t in tags) <= 2, tags
        assert all(n["distance"] == 0 and n["sparse_distance"] != 0
                   for n in got["neighbors"][5]["neighbors"]), got["neighbors"][5]

        prd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=read_ids),
                                          timeout=10)
        assert len(got["read"]) == len(prd.datapoints) == 4, (got["read"], prd)
        for g, p in zip(got["read"], prd.datapoints):
            same_dp(g, canon(p), "read " + p.datapoint_id)
        # and what was read is what the batch held
        r3 = got["read"][1]
        assert r3[0] == "p00003" and np.array_equal(np.float32(r3[1]), x[3])
        assert r3[4] == "t3" and r3[2] == [["color", ["red"], []], ["shape", ["sq"], []]], r3

        pst = cl.stats()
        assert got["stats"] == {"vectors_count": pst.vectors_count, "version": 1,
                                "shards_count": 4}, (got["stats"], pst)
        assert got["bad"]["code"] == 3 and "dimensions" in got["bad"]["details"], got["bad"]
        try:
            bq = tp.FindNeighborsRequest(queries=[ch.query(tp, [0.5] * (D + 1), 10)])
            cl.stub.FindNeighbors(bq, timeout=10)
            raise AssertionError("wrong dimension accepted by python")
        except Exception as e:  # noqa
            assert "INVALID_ARGUMENT" in str(e), e
        assert got["unknown_op"] == 5, got["unknown_op"]
        print("node client: UpdateIndex -> %s (states seen %s); %d queries, %d neighbours and "
              "%d read datapoints equal to python's; errors INVALID_ARGUMENT / NOT_FOUND" %
              (o["state"], o["states_seen"], len(qs), nn_total, len(got["read"])))
    finally:
        cl.stop()
    print("test_coord_node: OK")


if __name__ == "__main__":
    main()
