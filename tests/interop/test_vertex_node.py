"""A node @grpc/grpc-js client calls Vertex's MatchService/Match on tessera-coordinator
(issue 6, "what must be true" 3).

A 4-shard cluster is loaded through UpdateIndex; tests/interop/node/vertex_client.js
(dependencies pinned by package-lock.json, `npm ci` when node_modules is missing) loads
the test's hand-written client copy of match_service.proto with @grpc/proto-loader and
sends dense queries with restricts / numeric restricts / crowding, embedding_id,
embedding_enabled, sparse-only and hybrid RRF requests and two bad ones. Its neighbors
(ids, distances, sparse distances, crowding_attribute) must equal tessera.v1
FindNeighbors' for the same queries, and the bad requests must fail with
INVALID_ARGUMENT / NOT_FOUND and a message.
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import vertex_harness as vh  # noqa: E402

NODE_DIR = os.path.join(HERE, "node")
K = 8


def main():
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    tp = ch.stubs()[0]
    D = vh.dataset(n=600, d=12, seed=8)
    root = sh.tmpdir("tsr-vnode-")
    batch = ch.write_batch(os.path.join(root, "b"), D.recs, per_file=200)
    cl = ch.Cluster(4, D.d, {"nlist": 8, "pq_m": 4, "nprobe": 3})
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        rng = np.random.default_rng(3)
        reqs, refs = [], []  # refs: FindNeighbors query kwargs, or expected error
        for j in range(10):
            qv = [float(v) for v in rng.normal(size=D.d).astype("float32")]
            m = {"deployed_index_id": "any-name", "float_val": qv, "num_neighbors": K,
                 "fraction_leaf_nodes_to_search_override": 1.0, "approx_num_neighbors": 600}
            kw = dict(vec=qv, k=K, fraction=1.0, cand=600)
            if j % 2:
                m["restricts"] = [{"name": "color", "allow_tokens": [vh.COLORS[j % 4]],
                                   "deny_tokens": ["green"] if j % 3 == 0 else []}]
                kw["restricts"] = [("color", [vh.COLORS[j % 4]], ["green"] if j % 3 == 0 else [])]
            if j % 3 == 1:
                m["numeric_restricts"] = [{"name": "price", "value_int": 40, "op": "LESS"}]
                kw["numeric"] = [("price", "int", 40, 1)]
            if j % 4 == 2:
                m["per_crowding_attribute_num_neighbors"] = 1
                kw["crowding"] = 1
            if j == 3:
                m["embedding_enabled"] = True
            reqs.append(m)
            refs.append(kw)
        reqs.append({"embedding_id": "p0042", "num_neighbors": K,
                     "fraction_leaf_nodes_to_search_override": 1.0})
        refs.append(dict(vec=D.x[42], k=K, fraction=1.0))
        sq = ([3, 7, 11, 20], [0.5, 0.25, 1.0, 0.75])
        reqs.append({"sparse_embedding": {"dimension": sq[0], "float_val": sq[1]},
                     "num_neighbors": K})
        refs.append(dict(sparse=sq, k=K))
        qv = [float(v) for v in rng.normal(size=D.d).astype("float32")]
        reqs.append({"float_val": qv, "sparse_embedding": {"dimension": sq[0], "float_val": sq[1]},
                     "rrf": {"alpha": 0.5}, "num_neighbors": K})
        refs.append(dict(vec=qv, sparse=sq, alpha=0.5, k=K))
        reqs.append({"float_val": [1.0, 2.0], "num_neighbors": K})
        refs.append((3, "float_val has 2 values"))
        reqs.append({"embedding_id": "missing-id"})
        refs.append((5, "missing-id"))
        reqs.append({"num_neighbors": K})
        refs.append((3, "all empty"))
        rfile = os.path.join(root, "requests.json")
        with open(rfile, "w") as f:
            json.dump(reqs, f)
        out = subprocess.run(["node", os.path.join(NODE_DIR, "vertex_client.js"), cl.target,
                              rfile], capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)["results"]
        assert len(got) == len(reqs)
        n_ok = n_err = 0
        for j, (g, ref) in enumerate(zip(got, refs)):
            if isinstance(ref, tuple):
                assert g.get("code") == ref[0] and ref[1] in g.get("details", ""), (j, g, ref)
                n_err += 1
                continue
            assert "neighbors" in g, (j, g)
            nn = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, **ref)], return_full_datapoint=True),
                timeout=30).nearest_neighbors[0]
            want = [(n.datapoint.datapoint_id, n.distance, n.sparse_distance,
                     str(vh.crowding_attribute(D.tags[n.datapoint.datapoint_id])))
                    for n in nn.neighbors]
            have = [(n["id"], n["distance"], n["sparse_distance"], n["crowding_attribute"])
                    for n in g["neighbors"]]
            assert have == want, (j, have, want)
            assert have, j
            if reqs[j].get("embedding_enabled"):
                assert [e["id"] for e in g["embeddings"]] == [h[0] for h in have]
                for e, n in zip(g["embeddings"], nn.neighbors):
                    assert np.allclose(e["float_val"], list(n.datapoint.feature_vector))
            else:
                assert g["embeddings"] == [], j
            n_ok += 1
        assert got[10]["neighbors"][0]["id"] == "p0042"
        print("node Match: %d answers equal to FindNeighbors, %d bad requests rejected" %
              (n_ok, n_err))
    finally:
        cl.stop()
    print("ok")


if __name__ == "__main__":
    main()
