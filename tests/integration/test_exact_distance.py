"""Distances are exact by default (issue 13, item 5): a query with a stored vector returns
it first at distance 0 (+-1e-4), through tessera.v1 over python grpcio, through the
`tessera query` CLI and through the Vertex MatchService (Match with embedding_id, which
docs/vertex-compat.md promises gives ~0). approximate_neighbor_count = 0 set explicitly by
the query (`--candidates 0`), or the config's approximate_neighbor_count = 0, gives the PQ
distance back; a query's own count wins over the config's.

Index: 2000 vectors, d 32, nlist 16, pq_m 8 (PQ distances of a vector to itself are
clearly non-zero), 4 shards, default nprobe.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import vertex_harness as vh  # noqa: E402

N, D, K = 2000, 32, 5
IDX = "tessera-idx"
PROBE = [3, 17, 250, 999, 1234, 1999]


def first(resp):
    nb = resp.nearest_neighbors[0].neighbors[0]
    return nb.datapoint.datapoint_id, nb.distance


def grpc_checks(cl, tp, x, expect_exact_default):
    pq = []
    for i in PROBE:
        want = "v%04d" % i
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, x[i], K)]), timeout=30)
        did, dist = first(r)
        if expect_exact_default:
            assert did == want and abs(dist) < 1e-4, \
                "default query with the stored vector of %s: first %s at distance %g, " \
                "expected itself at 0 (exact re-rank)" % (want, did, dist)
        # explicitly 0: PQ distances (the self hit is not at 0)
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, x[i], K, cand=0)]), timeout=30)
        got = {n.datapoint.datapoint_id: n.distance for n in r.nearest_neighbors[0].neighbors}
        if want in got:
            pq.append(got[want])
        if not expect_exact_default:
            # the same as the default
            r2 = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, x[i], K)]), timeout=30)
            assert [(n.datapoint.datapoint_id, n.distance)
                    for n in r2.nearest_neighbors[0].neighbors] == \
                [(n.datapoint.datapoint_id, n.distance)
                 for n in r.nearest_neighbors[0].neighbors]
            # a query's own count wins over the config's 0
            r3 = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, x[i], K, cand=100)]), timeout=30)
            did, dist = first(r3)
            assert did == want and abs(dist) < 1e-4, (want, did, dist)
    assert len(pq) >= len(PROBE) // 2 and sum(d > 1e-3 for d in pq) >= len(pq) - 1, \
        "approximate_neighbor_count = 0 must give PQ distances, got %s" % pq
    return pq


def cli_query(cl, vec, extra=()):
    exe = os.path.join(ch.BIN, "tessera")
    r = subprocess.run([exe, "query", "--target", cl.target, "--vector",
                        ",".join("%.9g" % v for v in vec), "--k", str(K), "--json"] +
                       list(extra), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    out = json.loads(r.stdout)
    q = out[0] if isinstance(out, list) else out
    nb = q["neighbors"][0]
    return nb.get("id") or nb.get("datapoint_id"), nb["distance"]


def main():
    tp = ch.stubs()[0]
    mp, mpg = vh.vstubs()
    rng = np.random.default_rng(13)
    x = rng.normal(size=(N, D)).astype("float32")
    recs = [ch.dp_json("v%04d" % i, x[i]) for i in range(N)]
    root = sh.tmpdir("tsr-exact-")
    batch = ch.write_batch(os.path.join(root, "b"), recs, per_file=1000)
    cl = ch.Cluster(4, D, {"nlist": 16, "pq_m": 8})
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        pq = grpc_checks(cl, tp, x, True)
        print("grpcio: stored vector first at 0 by default; PQ distances with 0:",
              ["%.2f" % d for d in pq])

        # the CLI: exact by default, PQ with --candidates 0
        exe = os.path.join(ch.BIN, "tessera")
        h = subprocess.run([exe, "query", "--help"], capture_output=True, text=True)
        assert "distance" in h.stdout and "--candidates 0" in h.stdout, h.stdout
        for i in PROBE[:3]:
            did, dist = cli_query(cl, x[i])
            assert did == "v%04d" % i and abs(dist) < 1e-4, (i, did, dist)
            did0, dist0 = cli_query(cl, x[i], ["--candidates", "0"])
            assert dist0 > 1e-3, ("--candidates 0 gives PQ distances", i, did0, dist0)
        print("CLI: exact by default, PQ with --candidates 0")

        # the Vertex Match with embedding_id (0 = the index setting, as Vertex)
        cl.stop_coord()
        cl.start(extra_args=["--deployed-index-id", IDX])
        vs = mpg.MatchServiceStub(cl.channel)
        for i in PROBE:
            m = mp.MatchRequest(deployed_index_id=IDX, num_neighbors=K,
                                embedding_id="v%04d" % i)
            mr = vs.Match(m, timeout=30)
            assert mr.neighbor[0].id == "v%04d" % i and abs(mr.neighbor[0].distance) < 1e-4, \
                ("Match with embedding_id", i, mr.neighbor[0])
        print("Vertex Match with embedding_id: itself at ~0")

        # the config's approximate_neighbor_count = 0: PQ by default, a query's own wins
        cl.stop_coord()
        with open(cl.config) as f:
            cfg = json.load(f)
        cfg["approximate_neighbor_count"] = 0
        with open(cl.config, "w") as f:
            json.dump(cfg, f)
        cl.start()
        grpc_checks(cl, tp, x, False)
        print("config approximate_neighbor_count 0: PQ distances unless the query asks")
    finally:
        cl.stop()
    print("test_exact_distance: OK")


if __name__ == "__main__":
    main()
