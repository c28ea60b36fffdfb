"""A restrict on a namespace no datapoint uses is answered (empty, by Vertex's rules) with a
warning (issue 41 item 5): FindNeighborsResponse.warnings names it, and `tessera query`
prints it on stderr and exits 0. 4 shard groups, nprobe 1 of 32 lists, so a dense query
probes one group and the others are asked with a namespace-only query. Checks:
- `colour` (token) and `prize` (numeric) warn; `color` and `price` do not, also mixed in
  one query (only the unknown one warns), and on a sparse-only query;
- a namespace first used by a streamed upsert warns before the upsert and not once the
  upsert is acknowledged (every later query), whichever group it landed in;
- the CLI prints "warning: ... 'colour' ..." on stderr for --restrict colour=red and
  --numeric 'prize>=50', exit 0, and nothing for the right names."""
import os
import subprocess
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 2000
GE = 4  # NumericRestriction.GREATER_EQUAL


def warnings_of(cl, tp, q):
    r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
    return list(r.warnings), r


def main():
    tp, _, _, _ = ch.stubs()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D)).astype("float32")
    recs = [ch.dp_json("d%05d" % i, x[i], sparse=([i % 50, 100 + i % 7], [1.0, 0.5]),
                       restricts=[("color", ["red" if i % 2 else "blue"], [])],
                       numeric=[("price", "int", i % 100)]) for i in range(N)]
    root = sh.tmpdir("tsr-unknown-ns-")
    b0 = ch.write_batch(os.path.join(root, "b0"), recs)
    cl = ch.Cluster(4, D, {"nlist": 32, "pq_m": 4, "nprobe": 1}, root=root)
    try:
        op = cl.update(b0)
        assert op.state == tp.Operation.SUCCEEDED, op
        v = x[3]
        w, r = warnings_of(cl, tp, ch.query(tp, v, restricts=[("color", ["red"], [])]))
        assert w == [] and len(r.nearest_neighbors[0].neighbors) > 0, (w, r)
        w, r = warnings_of(cl, tp, ch.query(tp, v, restricts=[("colour", ["red"], [])]))
        assert len(w) == 1 and "'colour'" in w[0] and "restrict namespace" in w[0], w
        assert len(r.nearest_neighbors[0].neighbors) == 0
        w, _ = warnings_of(cl, tp, ch.query(tp, v, numeric=[("prize", "int", 50, GE)]))
        assert len(w) == 1 and "numeric restrict namespace 'prize'" in w[0], w
        w, _ = warnings_of(cl, tp, ch.query(tp, v, numeric=[("price", "int", 50, GE)]))
        assert w == [], w
        w, _ = warnings_of(cl, tp, ch.query(tp, v, restricts=[("color", ["red"], []),
                                                              ("colour", ["red"], [])],
                                            numeric=[("price", "int", 50, GE)]))
        assert len(w) == 1 and "'colour'" in w[0], w
        w, _ = warnings_of(cl, tp, ch.query(tp, sparse=([3], [1.0]),
                                            restricts=[("colour", ["red"], [])]))
        assert len(w) == 1 and "'colour'" in w[0], w
        print("typos warn, known namespaces do not")

        # the shard reports unknown namespaces only when asked (ShardQuery.check_namespaces):
        # a query on known namespaces costs it nothing for them
        sp = sh.stubs()[0]
        for want in (False, True):
            rq = sp.ShardSearchRequest()
            sq = rq.queries.add(version=0, k=5, check_namespaces=want)
            sq.sparse.values.extend([1.0])  # a sparse query: no list to own
            sq.sparse.dimensions.extend([3])
            sq.restricts.add(namespace="colour", allow_list=["red"])
            res = cl.shards[0].stub.Search(rq, timeout=30).results[0]
            assert list(res.unknown_namespaces) == (["colour"] if want else []), (want, res)
        rq = sp.ShardSearchRequest()
        rq.queries.add(version=0, k=5).restricts.add(namespace="colour", allow_list=["red"])
        try:
            cl.shards[0].stub.Search(rq, timeout=30)
            raise AssertionError("a namespace-only query without check_namespaces answered")
        except grpc.RpcError as e:
            assert "empty query" in e.details(), e.details()
        print("the shard reports them only when asked")

        # a namespace first used by streamed upserts: one datapoint per probe, in any group
        for j in range(3):
            qv = rng.normal(size=D).astype("float32")
            ns = "size%d" % j
            w, _ = warnings_of(cl, tp, ch.query(tp, qv, restricts=[(ns, ["xl"], [])]))
            assert len(w) == 1 and ns in w[0], w
            dp = tp.IndexDatapoint(datapoint_id="s%d" % j)
            dp.feature_vector.extend([float(t) for t in rng.normal(size=D)])
            dp.restricts.add(namespace=ns, allow_list=["xl"])
            cl.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=[dp]), timeout=30)
            for _ in range(5):  # a query vector far from the datapoint: other groups probed
                w, _ = warnings_of(cl, tp, ch.query(tp, rng.normal(size=D),
                                                    restricts=[(ns, ["xl"], [])]))
                assert w == [], (ns, w)
        print("a namespace of an acknowledged upsert does not warn")

        exe = os.path.join(ch.BIN, "tessera")
        vec = ",".join("%g" % t for t in v)
        p = subprocess.run([exe, "query", "--target", cl.target, "--vector", vec,
                            "--restrict", "colour=red", "--numeric", "prize>=50"],
                           capture_output=True, text=True, timeout=60)
        print(p.stderr)
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert "warning:" in p.stderr and "'colour'" in p.stderr and "'prize'" in p.stderr, \
            p.stderr
        p = subprocess.run([exe, "query", "--target", cl.target, "--vector", vec,
                            "--restrict", "color=red", "--numeric", "price>=50"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "warning" not in p.stderr, p.stderr
    finally:
        cl.stop()
    print("test_unknown_namespace: OK")


if __name__ == "__main__":
    main()
