"""bench/ryw_cost.py (docs/ha.md "Known gaps", the read index): FindNeighbors p50 on a follower and the leader, read index on vs off (the hook
TSR_COORD_CRASH_AT=no-read-index), alternated: each round restarts the follower with or
without the hook and times 1500 sequential queries (k 10, default nprobe) on each."""
import os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import coord_harness as ch, etcd_harness as eh, stream_model as sm

D, N, Q = 16, 5000, 1500
rng = np.random.default_rng(3)
x = rng.normal(size=(N, D)).astype("float32")
cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=2,
                  config={"nlist": 32, "pq_m": 4, "nprobe": 8})
tp = ch.stubs()[0]
try:
    b0 = ch.write_batch(os.path.join(cl.root, "b0"), [ch.dp_json("h%05d" % i, x[i]) for i in range(N)])
    leader = cl.leader(); fol = cl.follower(leader)
    assert leader.update(b0).state == tp.Operation.SUCCEEDED
    cl.wait_version(1)
    for i in range(20):  # some streamed rounds so seqs are non-zero
        sm.call(leader.stub, sm.Op("upsert", recs=[sm.Rec("s%d" % i, x[i] + 0.5)]), tp)
    res = {}
    def timeit(c):
        ts = []
        for i in range(Q):
            rq = tp.FindNeighborsRequest(queries=[ch.query(tp, x[i % N], 10)])
            t = time.perf_counter(); c.stub.FindNeighbors(rq, timeout=10); ts.append(time.perf_counter() - t)
        return np.percentile(ts, 50) * 1e3, np.percentile(ts, 99) * 1e3
    for rnd in range(3):
        for mode in ("on", "off"):
            fol.kill(); 
            fol.start(env={"TSR_COORD_CRASH_AT": "no-read-index"} if mode == "off" else None)
            cl.wait_version(1, timeout=30); time.sleep(1)
            timeit(fol)  # warm
            f = timeit(fol); l = timeit(leader)
            res.setdefault(mode, []).append((f, l))
            print("round %d read index %-3s: follower p50 %.3f ms p99 %.3f ms | leader p50 %.3f ms p99 %.3f ms"
                  % (rnd, mode, f[0], f[1], l[0], l[1]), flush=True)
    for mode in ("on", "off"):
        fs = [r[0][0] for r in res[mode]]; ls = [r[1][0] for r in res[mode]]
        print("median of rounds, read index %s: follower p50 %.3f ms, leader p50 %.3f ms" % (mode, np.median(fs), np.median(ls)))
finally:
    cl.stop()
