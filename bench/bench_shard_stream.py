"""Streamed writes on one tessera-shard (issue 15, the shard side): `make bench-shard-stream
[BENCH_SHARD_STREAM_ARGS="--n 200000"]`.

One real tessera-shard (bin/) serves a committed version of n random vectors (d, nlist
lists, PQ m x 8). A python gRPC client then measures, side by side:
- Write: records/s acknowledged and the ack latency p50 / p99 at 1, 16 and 64 records per
  call (one writer, seqs in order, as the coordinator sends one group's writes);
- Search (k 10, nprobe 16, one client thread) p50 / p99, A/B interleaved in blocks (the
  machine may be shared): quiet vs with a ~1,000 records/s stream running; version 1
  with a delta of `--delta` records vs the folded version 2 (both served side by side
  after the fold's Commit); version 2 quiet vs under the stream.
The python client's own cost is part of every figure (it is the same in each column).
"""
import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import shard_harness as H  # noqa: E402


def pct(a, p):
    return float(np.percentile(np.asarray(a) * 1000.0, p)) if a else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--nlist", type=int, default=256)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--writes", type=int, default=300, help="calls per batch size")
    ap.add_argument("--queries", type=int, default=1500)
    ap.add_argument("--delta", type=int, default=10000)
    a = ap.parse_args()
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(1)
    xb = rng.normal(size=(a.n, a.d)).astype("float32")
    ix, tmpl = H.template_bytes(xb[:min(a.n, 20 * a.nlist)], a.nlist, a.m)
    _, asg = ix.quantizer.search(xb, 1)
    ups = [sp.StagedUpsert(label=i, list=int(asg[i, 0]),
                           datapoint=tp.IndexDatapoint(datapoint_id="id%d" % i,
                                                       feature_vector=xb[i].tolist()))
           for i in range(a.n)]
    data = H.tmpdir("tsr-bench-stream-")
    s = H.Shard(data)
    try:
        t0 = time.time()
        H.load(s, 1, 0, ups, template=tmpl, chunk=5000, own=list(range(a.nlist)))
        print("base: %d x %d, nlist %d, PQ %dx8 (loaded in %.1fs)" % (a.n, a.d, a.nlist, a.m,
                                                                    time.time() - t0))
        del ups
        s.version = 1
        seq = [0]
        nextlab = [a.n]
        pool = rng.normal(size=(4096, a.d)).astype("float32")
        _, pasg = ix.quantizer.search(pool, 1)

        wlock = threading.Lock()  # one write at a time, seqs in order (as the coordinator)

        def write(nrec):
            with wlock:
                return write_locked(nrec)

        def write_locked(nrec):
            seq[0] += 1
            rq = sp.ShardWriteRequest(version=s.version, seq=seq[0])
            for _ in range(nrec):
                j = nextlab[0] % len(pool)
                rq.upserts.add(label=nextlab[0], list=int(pasg[j, 0]),
                               datapoint=tp.IndexDatapoint(datapoint_id="s%d" % nextlab[0],
                                                           feature_vector=pool[j].tolist()))
                nextlab[0] += 1
            t = time.perf_counter()
            s.stub.Write(rq, timeout=30)
            return time.perf_counter() - t

        xq = rng.normal(size=(a.queries, a.d)).astype("float32")
        Dq, Iq = ix.quantizer.search(xq, 16)
        reqs = []
        for i in range(a.queries):
            q = sp.ShardQuery(version=0, k=10)
            q.vector.extend(xq[i].tolist())
            q.lists.extend(int(x) for x in Iq[i])
            q.coarse_distances.extend(float(x) for x in Dq[i])
            reqs.append(sp.ShardSearchRequest(queries=[q]))

        def run_queries(idx, ver):
            lat = []
            for i in idx:
                r = reqs[i]
                r.queries[0].version = ver
                t = time.perf_counter()
                s.stub.Search(r, timeout=30)
                lat.append(time.perf_counter() - t)
            return lat

        active = threading.Event()
        stop = threading.Event()
        wrote = [0, 0.0]

        def streamer():  # ~1,000 records/s while active: 16 records every 16 ms
            while not stop.is_set():
                if not active.is_set():
                    time.sleep(0.002)
                    continue
                t = time.perf_counter()
                write(16)
                wrote[0] += 16
                time.sleep(max(0.0, 0.016 - (time.perf_counter() - t)))
                wrote[1] += time.perf_counter() - t

        def ab(name_a, name_b, ver_a, ver_b, stream_b, rounds=10):
            """Alternates blocks of the same queries between two settings (so the load of
            a shared machine hits both alike)."""
            la, lb = [], []
            blk = max(1, len(reqs) // rounds)
            for r in range(rounds):
                idx = range(r * blk, (r + 1) * blk)
                la += run_queries(idx, ver_a)
                if stream_b:
                    active.set()
                    time.sleep(0.02)
                lb += run_queries(idx, ver_b)
                active.clear()
            pa, pb = pct(la, 50), pct(lb, 50)
            print("  %-30s %8.3f %8.3f" % (name_a, pa, pct(la, 99)))
            print("  %-30s %8.3f %8.3f   %.2fx" % (name_b, pb, pct(lb, 99), pb / pa))

        th = threading.Thread(target=streamer)
        th.start()
        try:
            print("\nWrite (one writer)        records/s   ack p50 ms   ack p99 ms")
            for per in (1, 16, 64):
                lat = []
                t0 = time.perf_counter()
                for _ in range(a.writes):
                    lat.append(write(per))
                dt = time.perf_counter() - t0
                print("  %3d per call           %9.0f   %10.2f   %10.2f" % (
                    per, per * a.writes / dt, pct(lat, 50), pct(lat, 99)))
            print("\nSearch k 10 nprobe 16 (A/B interleaved)  p50 ms   p99 ms")
            st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            w0 = wrote[:]
            ab("quiet (delta %d)" % (st.delta_upserts + st.delta_deletes),
               "under the stream", 1, 1, True)
            print("  (stream rate while on: %.0f records/s)" % (
                (wrote[0] - w0[0]) / max(1e-9, wrote[1] - w0[1])))
            while True:
                st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
                held = st.delta_upserts + st.delta_deletes
                if held >= a.delta:
                    break
                write(min(64, a.delta - held))
            t0 = time.perf_counter()
            s.stub.Stage(sp.StageRequest(version=2, base_version=1, chunk=0,
                                         base_stream_seq=seq[0]), timeout=60)
            s.stub.Prepare(sp.PrepareRequest(version=2), timeout=600)
            s.stub.Commit(sp.CommitRequest(version=2), timeout=60)
            fold = time.perf_counter() - t0
            s.version = 2
            ab("folded version 2", "version 1 + delta %d" % held, 2, 1, False)
            print("  (fold of %d delta records: %.1fs)" % (held, fold))
            ab("quiet (version 2, small delta)", "under the stream", 2, 2, True)
        finally:
            stop.set()
            th.join()
    finally:
        s.stop()


if __name__ == "__main__":
    main()
