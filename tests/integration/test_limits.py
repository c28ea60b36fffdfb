"""Request limits (issue 7, Operations: "request limits (k, dimensions, queries per request,
message size) enforced with INVALID_ARGUMENT or RESOURCE_EXHAUSTED").

A cluster of 2 shards (--max-message 1M) and a coordinator with --max-message 4K and a
config of max_k 50, max_queries_per_request 20, dimensions 16. Through python grpcio:
- coordinator: k = 51 → INVALID_ARGUMENT naming neighbor_count and max_k; 21 queries →
  INVALID_ARGUMENT naming max_queries_per_request; a 15- or 17-value vector →
  INVALID_ARGUMENT naming the dimensions; a request over 4 KiB → RESOURCE_EXHAUSTED; a
  reply over 4 KiB (20 queries x 50 neighbours) → RESOURCE_EXHAUSTED naming the maximum
  message size; after each, a normal query still answers (the server keeps serving);
- a shard, called directly: k above its 10000 cap, more than 10000 queries, a wrong
  dimension → INVALID_ARGUMENT with the limit in the message, a request over 1 MiB →
  RESOURCE_EXHAUSTED, and it keeps serving;
- bad values of the flag: --max-message 100 (below 4096) and 3X → exit 2;
- an early SIGTERM (common/core/cmdline): as soon as /proc says the process catches SIGTERM
  (before it serves), SIGTERM makes the shard and the coordinator start, stop gracefully
  and exit 0, 8 times each (no death by the default action on a thread that did not block
  it).
"""
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
IA = grpc.StatusCode.INVALID_ARGUMENT
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


def expect_code(fn, code, *texts):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        for t in texts:
            assert t in e.details(), (t, e.details())
        return e.details()
    raise AssertionError("expected %s" % code)


def wait_op(stub, tp, op_id, timeout=120):
    t0 = time.time()
    while True:
        op = stub.GetOperation(tp.GetOperationRequest(operation_id=op_id), timeout=10)
        if op.state in (tp.Operation.SUCCEEDED, tp.Operation.REJECTED, tp.Operation.FAILED):
            return op
        assert time.time() - t0 < timeout, op
        time.sleep(0.05)


def run(bin_dir):
    tp, tpg, sp, _ = ch.stubs()
    _, spg, _, _, _ = sh.stubs()
    root = sh.tmpdir("tsr-limits-")
    for bad in ("100", "3X"):
        r = subprocess.run([os.path.join(bin_dir, "tessera-coordinator"), "--listen",
                            "127.0.0.1:0", "--data", os.path.join(root, "x"), "--config",
                            os.path.join(root, "none.json"), "--max-message", bad],
                           capture_output=True, text=True, timeout=30)
        # the usage error names the flag and the value it refused
        assert r.returncode == 2 and "--max-message" in r.stderr and "'%s'" % bad in r.stderr, \
            (bad, r.stderr)

    shards = [sh.Shard(os.path.join(root, "shard-%d" % i), extra=["--max-message", "1M"],
                       bin_dir=bin_dir) for i in range(2)]
    cfg = os.path.join(root, "coordinator.json")
    with open(cfg, "w") as f:
        json.dump({"dimensions": D, "nlist": 8, "pq_m": 4, "nprobe": 8, "max_k": 50,
                   "max_queries_per_request": 20, "shards": [s.target for s in shards]}, f)
    coord = ch.Proc([os.path.join(bin_dir, "tessera-coordinator"), "--listen", "127.0.0.1:0",
                     "--data", os.path.join(root, "coordinator"), "--config", cfg,
                     "--max-message", "4K"] + ch.batch_allow_args(root))
    assert coord.port is not None, coord.text()
    chan = grpc.insecure_channel("127.0.0.1:%d" % coord.port)
    try:
        stub = tpg.VectorSearchStub(chan)
        rng = np.random.default_rng(3)
        x = rng.normal(size=(400, D)).astype("float32")
        b = ch.write_batch(os.path.join(root, "batch"),
                           [ch.dp_json("v%03d" % i, x[i]) for i in range(len(x))])
        op = wait_op(stub, tp, stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b),
                                                timeout=30).operation_id)
        assert op.state == tp.Operation.SUCCEEDED, op

        def fn(queries):
            return lambda: stub.FindNeighbors(tp.FindNeighborsRequest(queries=queries),
                                              timeout=10)

        def still_serving():
            resp = fn([ch.query(tp, x[9], 3)])()
            assert resp.nearest_neighbors[0].neighbors[0].datapoint.datapoint_id == "v009", resp

        still_serving()
        cases = [
            ([ch.query(tp, x[0], 51)], IA, ["neighbor_count = 51", "1..50", "max_k"]),
            ([ch.query(tp, x[0], 5)] * 21, IA, ["21 queries", "max_queries_per_request = 20"]),
            ([ch.query(tp, x[0][:15], 5)], IA, ["15 values", "dimensions 16"]),
            ([ch.query(tp, np.ones(D + 1), 5)], IA, ["17 values", "dimensions 16"]),
            ([ch.query(tp, np.ones(2000), 5)], RE, ["larger than max", "4096"]),  # 8 KB > 4K
            ([ch.query(tp, x[i], 50) for i in range(20)], RE,      # a reply > 4K
             ["exceeds the maximum message size 4096"]),
        ]
        for queries, code, texts in cases:
            msg = expect_code(fn(queries), code, *texts)
            print("coordinator: %s: %s" % (code.name, msg))
            still_serving()
        # at the limits: accepted
        resp = fn([ch.query(tp, x[0], 50)])()
        assert len(resp.nearest_neighbors[0].neighbors) == 50
        resp = fn([ch.query(tp, x[i], 1) for i in range(20)])()
        assert [n.neighbors[0].datapoint.datapoint_id for n in resp.nearest_neighbors] == \
            ["v%03d" % i for i in range(20)]

        # a shard's own limits
        s = shards[0]
        st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.current_version == 1, st

        def sq(vec, k=5):
            return sp.ShardQuery(version=1, vector=[float(v) for v in vec], k=k)

        def shard_search(queries):
            return lambda: s.stub.Search(sp.ShardSearchRequest(queries=queries), timeout=10)

        big = np.ones(300000)  # 1.2 MB > 1M
        for queries, code, texts in [
                ([sq(x[0], 10001)], IA, ["k = 10001", "1..10000"]),
                ([sq(x[0])] * 10001, IA, ["10001 queries", "1..10000"]),
                ([sq(x[0][:8])], IA, ["8 values", "dimension is 16"]),
                ([sq(big)], RE, ["larger than max", "1048576"])]:
            msg = expect_code(shard_search(queries), code, *texts)
            print("shard: %s: %s" % (code.name, msg[:120]))
            r = s.stub.Search(sp.ShardSearchRequest(queries=[sq(x[1])]), timeout=10)
            assert len(r.results) == 1
            still_serving()
    finally:
        chan.close()
        if coord.proc.poll() is None:
            coord.proc.terminate()
        rc = coord.proc.wait(30)
        coord.thread.join(5)
        text = coord.text()
        assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text \
            and "LeakSanitizer" not in text, text
        assert rc == 0, "coordinator exit %s:\n%s" % (rc, text)
        for s in shards:
            s.stop()


def catches_sigterm(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return (int(line.split()[1], 16) >> (signal.SIGTERM - 1)) & 1
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def early_sigterm(bin_dir):
    root = sh.tmpdir("tsr-sig-")
    cfg = os.path.join(root, "c.json")
    with open(cfg, "w") as f:
        json.dump({"dimensions": D, "shards": ["127.0.0.1:1"]}, f)
    argvs = [[os.path.join(bin_dir, "tessera-shard"), "--listen", "127.0.0.1:0", "--data",
              os.path.join(root, "s")],
             [os.path.join(bin_dir, "tessera-coordinator"), "--listen", "127.0.0.1:0",
              "--data", os.path.join(root, "c"), "--config", cfg]]
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    for argv in argvs:
        for _ in range(8):
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 env=env, text=True)
            t0 = time.time()
            while not catches_sigterm(p.pid):
                assert p.poll() is None and time.time() - t0 < 20, "no SIGTERM handler"
                time.sleep(0.0005)
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=30)
            assert p.returncode == 0 and "SIGTERM: shutting down" in err, (argv[0],
                                                                            p.returncode, err)
    print("early SIGTERM: shard and coordinator exit 0 gracefully (8 times each)")


def main():
    for b in sh.bins():
        t0 = time.time()
        early_sigterm(b)
        run(b)
        print("ok: %s (%.1f s)" % (b, time.time() - t0))
    print("ok")


if __name__ == "__main__":
    main()
