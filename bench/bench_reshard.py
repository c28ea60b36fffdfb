"""make bench-reshard: time and bytes of moving lists online (docs/resharding.md,
docs/performance.md "Resharding").

4 shard groups on loopback (one machine), N vectors (BENCH_RESHARD_N, default 100000) of
BENCH_RESHARD_DIMS (64) dims, nlist 256, PQ 16x8, loaded by one UpdateIndex. Then, side by
side in this one run:
  add      AddShardGroup: 4 -> 5 groups (lists move to a fresh shard)
  remove   RemoveShardGroup of group 0: 5 -> 4 groups (its lists spread over the rest)
  reload   the alternative without resharding: UpdateIndex of the same batch as a complete
           overwrite (every vector staged again; what growing cost before)
and per row: lists and datapoints moved, bytes read from the old owners (packed
IndexDatapoint), wall time from the call to SUCCEEDED, and per million vectors of the
index (bytes and seconds scaled linearly by 1e6 / N) and the ratio of the time to the reload.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402


def main():
    n = int(os.environ.get("BENCH_RESHARD_N", "100000"))
    d = int(os.environ.get("BENCH_RESHARD_DIMS", "64"))
    tp = ch.stubs()[0]
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(256, d)).astype("float32") * 3
    x = (centers[rng.integers(0, 256, n)] + rng.normal(size=(n, d))).astype("float32")
    root = sh.tmpdir("tsr-bench-reshard-")
    b = ch.write_batch(os.path.join(root, "b"), [ch.dp_json("v%07d" % i, x[i]) for i in range(n)],
                       per_file=20000)
    cl = ch.Cluster(4, d, {"nlist": 256, "pq_m": 16, "nprobe": 16, "stage_deadline_ms": 600000})
    extra = []
    rows = []
    try:
        t0 = time.time()
        op = cl.update(b, timeout=1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        print("loaded %d x %d into 4 groups in %.1f s (training included)" % (n, d, time.time() - t0))
        s = sh.Shard(os.path.join(cl.root, "new"))
        extra.append(s)
        t0 = time.time()
        r = cl.stub.AddShardGroup(tp.AddShardGroupRequest(replicas=[s.target]), timeout=30)
        op = cl.wait_op(r.operation_id, 1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        rows.append(("add 4->5", op.progress, time.time() - t0))
        t0 = time.time()
        r = cl.stub.RemoveShardGroup(tp.RemoveShardGroupRequest(group=0), timeout=30)
        op = cl.wait_op(r.operation_id, 1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        # the remove includes the drain wait (search_deadline_ms) before the group is retired
        rows.append(("remove 5->4", op.progress, time.time() - t0))
        t0 = time.time()
        op = cl.update(b, overwrite=True, timeout=1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        reload_s = time.time() - t0
        rows.append(("reload (overwrite)", None, reload_s))
    finally:
        try:
            cl.stop()
        finally:
            for e in extra:
                e.stop()
    scale = 1e6 / n
    print("\nN = %d vectors, d = %d, nlist 256 (per million: x %.1f)" % (n, d, scale))
    print("| operation | lists moved | datapoints moved | bytes moved | time (s) | bytes / 1M vectors | s / 1M vectors | time vs reload |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, pg, secs in rows:
        if pg is None:
            print("| %s | all | %d | - | %.2f | - | %.1f | 1.00 |" % (name, n, secs, secs * scale))
        else:
            print("| %s | %d | %d | %d | %.2f | %.0f | %.1f | %.2f |" % (
                name, pg.lists_total, pg.datapoints_moved, pg.bytes_moved, secs,
                pg.bytes_moved * scale, secs * scale, secs / reload_s))


if __name__ == "__main__":
    main()
