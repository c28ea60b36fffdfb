"""Hybrid (RRF) ranking does not depend on k (issue 13, item 4), through a real coordinator
and 4 shards over python grpcio.

The issue's case: 100 records share one sparse score (7001:0.9), the query is the stored
vector of one of them plus the sparse query 7001:1, alpha 0.5. Before, each list was cut
at k, so k = 1 put j-001 (sparse rank 1 by label order) first, k = 2, 3 j-001 then j-010,
k = 4, 5 j-010 first. Now both lists have a depth independent of k (rrf_depth, 100), a
record found by both searches gets both terms, and records with equal sparse scores share
their sparse rank (docs/query-semantics.md). Checked for several query records, with and
without crowding, SQUARED_L2 and COSINE:
- for k = 1..10, top-k is the prefix of top-(k+1) (ids and order);
- the queried record (dense rank 1 and sparse score 0.9) ranks first, with both its
  distances (dense ~0 / its norm, sparse 0.9);
- the fused order is the one computed here from the returned lists' ranks.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

N, D, NTIED = 600, 16, 100


def ids(resp):
    return [n.datapoint.datapoint_id for n in resp.nearest_neighbors[0].neighbors]


def run(distance):
    tp = ch.stubs()[0]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, D)).astype("float32")
    recs = []
    for i in range(N):
        did = "j-%03d" % (i + 1)
        # the first NTIED share the sparse score 0.9 on dimension 7001; others have
        # other dimensions (found by no query here) or none
        sp = ([7001], [0.9]) if i < NTIED else (([int(rng.integers(1, 50))], [1.0])
                                                 if i % 3 == 0 else None)
        recs.append(ch.dp_json(did, x[i], sparse=sp, tag="t%d" % (i % 7)))
    root = sh.tmpdir("tsr-hybrid-")
    batch = ch.write_batch(os.path.join(root, "b"), recs, per_file=200)
    cl = ch.Cluster(4, D, {"nlist": 8, "pq_m": 4, "nprobe": 8, "distance": distance})
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        for qi in (9, 0, 41, 77, 99):   # j-010 (the issue's), j-001, ...
            want = "j-%03d" % (qi + 1)
            for crowd in (0, 2):
                prev = None
                for k in range(1, 12):
                    q = ch.query(tp, x[qi], k, sparse=([7001], [1.0]), alpha=0.5,
                                 crowding=crowd)
                    r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
                    got = ids(r)
                    assert len(got) == k, (distance, want, crowd, k, got)
                    assert got[0] == want, \
                        "%s: query %s crowding %d k=%d: first is %s, expected the record " \
                        "found by both searches (%s)" % (distance, want, crowd, k, got, want)
                    nb = r.nearest_neighbors[0].neighbors[0]
                    assert abs(nb.sparse_distance - 0.9) < 1e-6, nb
                    # exact distances by default (item 5): 0, or cosine 1
                    assert abs(nb.distance - (0.0 if distance == "SQUARED_L2" else 1.0)) \
                        < 1e-4, nb
                    if prev is not None:
                        assert got[:k - 1] == prev, \
                            "%s: query %s crowding %d: top-%d %s is not the prefix of " \
                            "top-%d %s" % (distance, want, crowd, k - 1, prev, k, got)
                    prev = got
                # the fused order: every tied record (sparse rank 1) before those found
                # by one list only; among the tied ones, those the dense search found
                # (distance != 0) first, by distance, then the others by label
                nbs = r.nearest_neighbors[0].neighbors
                tied = [n for n in nbs if abs(n.sparse_distance - 0.9) < 1e-6]
                assert [n.datapoint.datapoint_id for n in nbs[:len(tied)]] == \
                    [n.datapoint.datapoint_id for n in tied], \
                    [(n.datapoint.datapoint_id, n.distance, n.sparse_distance) for n in nbs]
                ds = [n.distance for n in tied[1:]]  # after the query's own record
                found = [d for d in ds if d != 0]
                assert ds[:len(found)] == found, ds
                assert found == sorted(found, reverse=distance != "SQUARED_L2"), ds
                rest = [n.datapoint.datapoint_id for n in tied[1 + len(found):]]
                assert rest == sorted(rest), rest
        print(distance, "prefix-stable for k = 1..11, doubly-found record first")
    finally:
        cl.stop()


def main():
    run("SQUARED_L2")
    run("COSINE")
    print("test_hybrid_rank: OK")


if __name__ == "__main__":
    main()
