"""Coordinator errors and edges through python grpcio (issue 5, "what must be true" 5 in
part; tests 1-4 use grpcio for everything else):
config errors name the key; --help; the cluster-up default config is accepted; an empty
index → FAILED_PRECONDITION; too few vectors to train → FAILED with the reason; a rejected
batch → REJECTED with its report and nothing changed, max_invalid_records lets it pass;
bad queries → INVALID_ARGUMENT with a message; unknown operation → NOT_FOUND;
sparse-only datapoints (routed by hash(id) % S) found by sparse queries and read back;
a dead shard → UNAVAILABLE naming it, fast, or with allow_partial an answer that lists
missing_shards; GetIndexStats marks it unavailable; the `tessera` CLI talks to it.
"""
import json
import os
import subprocess
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16


def expect_code(fn, code, text=None):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        if text:
            assert text in e.details(), (text, e.details())
        return e.details()
    raise AssertionError("expected %s" % code)


def config_errors(root):
    exe = os.path.join(ch.BIN, "tessera-coordinator")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--config" in r.stdout
    for cfg, want in [({"dimensions": 16, "shards": ["127.0.0.1:1"], "nprobes": 3}, '"nprobes"'),
                      ({"shards": ["127.0.0.1:1"]}, '"dimensions" is required'),
                      ({"dimensions": 16, "shards": []}, '"shards" is empty'),
                      ({"dimensions": 16, "shards": ["127.0.0.1:1"], "distance": "L1"},
                       '"distance"'),
                      ({"dimensions": 16, "shards": [{"replica": ["a:1"]}]}, '"replica"')]:
        p = os.path.join(root, "bad.json")
        with open(p, "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([exe, "--listen", "127.0.0.1:0", "--data", os.path.join(root, "cd"),
                            "--config", p], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and want in r.stderr, (cfg, r.returncode, r.stderr)


def main():
    tp = ch.stubs()[0]
    root = sh.tmpdir("tsr-coord-err-")
    config_errors(root)
    rng = np.random.default_rng(1)
    # the cluster-up default config shape (64 dims), with replicas syntax for one shard
    cl = ch.Cluster(4, 64, {"distance": "SQUARED_L2", "nlist": 64, "pq_m": 16, "pq_nbits": 8,
                            "nprobe": 8})
    try:
        q = ch.query(tp, rng.normal(size=64), 5)
        expect_code(lambda: cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]),
                                                  timeout=10),
                    grpc.StatusCode.FAILED_PRECONDITION, "empty")
        few = ch.write_batch(os.path.join(root, "few"),
                             [ch.dp_json("f%d" % i, rng.normal(size=64)) for i in range(30)])
        op = cl.update(few)
        assert op.state == tp.Operation.FAILED and "nlist" in op.error, op
        expect_code(lambda: cl.stub.GetOperation(tp.GetOperationRequest(operation_id="zz"),
                                                 timeout=10), grpc.StatusCode.NOT_FOUND)
        # a batch with one bad record: rejected, then accepted with max_invalid_records
        x = rng.normal(size=(1000, 64)).astype("float32")
        recs = [ch.dp_json("d%04d" % i, x[i], tag="t%d" % (i % 3)) for i in range(1000)]
        recs.append({"id": "bad", "embedding": [1.0, 2.0]})
        sp_ids = []
        for i in range(40):  # sparse-only datapoints
            recs.append(ch.dp_json("s%02d" % i, sparse=([i, 100 + i], [1.0, 0.5])))
            sp_ids.append("s%02d" % i)
        b = ch.write_batch(os.path.join(root, "b1"), recs, per_file=400)
        op = cl.update(b)
        assert op.state == tp.Operation.REJECTED and op.report.rejected, op
        assert op.report.invalid_records == 1
        assert any(e.error_type == "EMBEDDING_SIZE_MISMATCH" for e in op.report.errors), op.report
        assert "EMBEDDING_SIZE_MISMATCH" in op.report_json
        assert cl.stats().version == 0
        op = cl.update(b, max_invalid=1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        st = cl.stats()
        assert st.vectors_count == 1000 and st.sparse_vectors_count == 40, st
        assert sum(s.sparse_vectors_count for s in st.shards) == 40
        assert sum(1 for s in st.shards if s.sparse_vectors_count) >= 2, st  # spread by hash
        # sparse-only: found by a sparse query, read back
        resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[
            ch.query(tp, sparse=([7, 107], [1.0, 1.0]), k=3)]), timeout=10)
        nb = resp.nearest_neighbors[0].neighbors
        assert nb[0].datapoint.datapoint_id == "s07" and abs(nb[0].sparse_distance - 1.5) < 1e-6
        rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=sp_ids[:5]), timeout=10)
        assert [d.datapoint_id for d in rd.datapoints] == sp_ids[:5]
        assert len(rd.datapoints[0].feature_vector) == 0

        # bad queries
        IA = grpc.StatusCode.INVALID_ARGUMENT
        good = x[0].tolist()
        bad = [(ch.query(tp, good[:10]), "dimensions 64"),
               (ch.query(tp, good, k=5000), "neighbor_count"),
               (ch.query(tp, good, k=-1), "neighbor_count"),
               (ch.query(tp), "empty query"),
               (ch.query(tp, good, fraction=1.5), "fraction_leaf_nodes"),
               (ch.query(tp, good, crowding=-2), "per_crowding"),
               (ch.query(tp, good, numeric=[("price", "int", 3, 0)]), "op is unset"),
               (ch.query(tp, good, sparse=([1, 2], [1.0])), "sparse_embedding")]
        for qq, text in bad:
            expect_code(lambda: cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, good), qq]), timeout=10), IA, text)
        expect_code(lambda: cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[]),
                                                  timeout=10), IA, "empty")
        expect_code(lambda: cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, good)] * 1001), timeout=10), IA, "max_queries_per_request")
        expect_code(lambda: cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=""),
                                                timeout=10), IA, "batch_root")
        op = cl.update(os.path.join(root, "missing"))
        assert op.state in (tp.Operation.FAILED, tp.Operation.REJECTED), op

        # the lead's CLI against this coordinator
        cli = os.path.join(ch.BIN, "tessera")
        r = subprocess.run([cli, "stats", "--target", cl.target], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([cli, "query", "--target", cl.target, "--vector",
                            ",".join("%g" % v for v in good), "--k", "3", "--json"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "d0000" in r.stdout, (r.stdout, r.stderr)

        # a dead shard
        victim = cl.shards[2]
        victim.kill()
        qs = [ch.query(tp, x[i], 10, fraction=1.0) for i in range(5)]
        t0 = time.time()
        det = expect_code(lambda: cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=qs),
                                                        timeout=10),
                          grpc.StatusCode.UNAVAILABLE, victim.target)
        dt = time.time() - t0
        assert dt < 3.0, dt
        qs = [ch.query(tp, x[i], 10, fraction=1.0, allow_partial=True) for i in range(5)]
        resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=qs), timeout=10)
        assert list(resp.missing_shards) == [victim.target], resp.missing_shards
        assert all(len(nn.neighbors) == 10 for nn in resp.nearest_neighbors)
        st = cl.stats()
        assert [s.available for s in st.shards] == [True, True, False, True], st
        print("dead shard: UNAVAILABLE in %.3fs: %s" % (dt, det))
        cl.shards[2] = sh.Shard(victim.data)  # for a clean stop (new port, unused)
    finally:
        cl.stop()
    print("test_coord_errors: OK")


if __name__ == "__main__":
    main()
