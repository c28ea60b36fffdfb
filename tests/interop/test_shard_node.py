"""A node @grpc/grpc-js client calls tessera-shard's Health/Check and Search (issue 4,
point 6).

The shard is loaded from python (Stage/Prepare/Commit with a faiss-trained template); the
node client (tests/interop/node, dependencies pinned by package-lock.json and installed
with `npm ci` when node_modules is missing) then calls Health, Search, Stats, a bad Search
and an unknown method; its answers must equal the python grpcio client's.
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import shard_harness as H  # noqa: E402

NODE_DIR = os.path.join(HERE, "node")


def main():
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(9)
    d, nlist = 16, 8
    xb = rng.normal(size=(3000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xb, nlist, 4, nbits=4)
    _, a = ix.quantizer.search(xb, 1)
    ups = [sp.StagedUpsert(label=i + 7, list=int(a[i, 0]), datapoint=H.datapoint(tp, "p%d" % i, xb[i]))
           for i in range(len(xb))]
    shard = H.Shard(H.tmpdir())
    try:
        H.load(shard, 1, 0, ups, template=tmpl, own=list(range(nlist)))
        xq = rng.normal(size=(5, d)).astype("float32")
        D, I = ix.quantizer.search(xq, 3)
        queries = [{"version": 1, "k": 5, "vector": xq[i].tolist(), "lists": I[i].tolist(),
                    "coarse_distances": D[i].tolist(), "return_ids": True} for i in range(5)]
        qfile = os.path.join(H.tmpdir(), "q.json")
        with open(qfile, "w") as f:
            json.dump(queries, f)
        out = subprocess.run(["node", os.path.join(NODE_DIR, "shard_client.js"), shard.target,
                              qfile], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        py = shard.stub.Search(sp.ShardSearchRequest(queries=[sp.ShardQuery(**q) for q in queries]),
                               timeout=10)
        assert got["health"] == "SERVING", got
        assert got["current_version"] == 1
        assert len(got["results"]) == 5
        for g, p in zip(got["results"], py.results):
            assert g["labels"] == list(p.labels), (g, p)
            assert np.allclose(g["distances"], p.distances)
            assert g["ids"] == list(p.ids)
        assert got["bad"]["code"] == 3 and "k = 0" in got["bad"]["details"], got["bad"]
        assert got["unknown"] == 12, got
        print("node client: health SERVING, 5 queries equal to python's, k=0 ->",
              got["bad"], "unknown method -> UNIMPLEMENTED")
    finally:
        shard.stop()
    print("ok")


if __name__ == "__main__":
    main()
