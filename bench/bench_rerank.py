#!/usr/bin/python3
"""bench_rerank — what the default exact re-rank (approximate_neighbor_count) costs.

A coordinator + 4 shards on loopback (tests/integration/coord_harness), BENCH_RERANK_N
(default 50000) x 64 float32 vectors (clustered: 500 centres N(0, 2^2) + unit noise,
numpy default_rng(7)), nlist 256, PQ 16 x 8 bits, L2, nprobe 16, trained by the
coordinator. BENCH_RERANK_NQ (1000) queries drawn the same way, k = 10, one query per
FindNeighbors call from python grpcio, sequential; per approximate_neighbor_count (0 = PQ
distances, unset = the config default 100, 400): p50 / p99 latency, queries/s, recall@10
against brute force and the mean |distance - exact distance| of the returned neighbours.
Rounds are interleaved (BENCH_RERANK_ROUNDS, default 3) and the median is shown.

Run: make all && TSR_BIN=$PWD/bin /usr/bin/python3 bench/bench_rerank.py
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

N = int(os.environ.get("BENCH_RERANK_N", "50000"))
NQ = int(os.environ.get("BENCH_RERANK_NQ", "1000"))
ROUNDS = int(os.environ.get("BENCH_RERANK_ROUNDS", "3"))
D, K = 64, 10
SETTINGS = [("0 (PQ)", 0), ("default (100)", None), ("400", 400)]


def data(rng, n, centres):
    c = centres[rng.integers(0, len(centres), n)]
    return (c + rng.normal(size=(n, D))).astype("float32")


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=2.0, size=(500, D))
    x = data(rng, N, centres)
    xq = data(rng, NQ, centres)
    root = sh.tmpdir("tsr-bench-rerank-")
    batch = ch.write_batch(os.path.join(root, "b"),
                           [ch.dp_json("v%06d" % i, x[i]) for i in range(N)], per_file=25000)
    xn = (x ** 2).sum(1)
    dist = xn[None, :] - 2 * xq @ x.T + (xq ** 2).sum(1)[:, None]
    truth = np.argsort(dist, axis=1)[:, :K]
    cl = ch.Cluster(4, D, {"nlist": 256, "pq_m": 16, "nprobe": 16})
    try:
        t0 = time.time()
        op = cl.update(batch, timeout=1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        print("index of %d x %d built in %.1fs" % (N, D, time.time() - t0))
        res = {name: {"lat": [], "qps": [], "recall": 0.0, "err": 0.0} for name, _ in SETTINGS}
        for rnd in range(ROUNDS):
            for name, cand in SETTINGS:
                lat, hit, err = [], 0, []
                t1 = time.time()
                for i in range(NQ):
                    rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xq[i], K, cand=cand)])
                    a = time.perf_counter()
                    r = cl.stub.FindNeighbors(rq, timeout=30)
                    lat.append((time.perf_counter() - a) * 1e6)
                    nb = r.nearest_neighbors[0].neighbors
                    labs = [int(n.datapoint.datapoint_id[1:]) for n in nb]
                    hit += len(set(labs) & set(truth[i].tolist()))
                    err += [abs(n.distance - dist[i, lab]) for n, lab in zip(nb, labs)]
                r_ = res[name]
                r_["lat"].append((np.percentile(lat, 50), np.percentile(lat, 99)))
                r_["qps"].append(NQ / (time.time() - t1))
                r_["recall"] = hit / (NQ * K)
                r_["err"] = float(np.mean(err))
        print("| approximate_neighbor_count | p50 µs | p99 µs | queries/s | recall@10 | "
              "mean abs distance error |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, _ in SETTINGS:
            r_ = res[name]
            p50 = statistics.median(l[0] for l in r_["lat"])
            p99 = statistics.median(l[1] for l in r_["lat"])
            print("| %s | %.0f | %.0f | %.0f | %.3f | %.3g |" % (
                name, p50, p99, statistics.median(r_["qps"]), r_["recall"], r_["err"]))
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
