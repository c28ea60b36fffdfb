#!/usr/bin/python3
"""bench_memory — memory per vector of a shard, and what reading the raw vectors through the
page cache costs the exact re-rank (issue 20, "Memory").

Data and cluster as bench_cluster (bench_search's 1M x 64 clustered data, IVF4000 PQ64 x 8,
the Faiss-built file as the template; BENCH_N for a smaller run): a coordinator + 4
tessera-shard on loopback, loaded once through UpdateIndex. Then, per mode, the 4 shards are
restarted on the same data directories (the version is loaded from disk, as after any
restart), the vectors.f32 files are read once (so they are in the page cache), and measured:
  - each shard's /proc/<pid>/smaps_rollup: Anonymous (what the kernel cannot evict) and the
    file-backed rest of Rss (the mapped vectors.f32 when mapped, plus the binary and its
    libraries), summed over the 4 shards, per vector; the same figures of freshly started
    empty shards are subtracted (the process's own heap, stacks and code);
  - the shards' own Stats (anonymous_bytes / mapped_bytes when the binary reports them);
  - FindNeighbors through the coordinator, nprobe 16, 4 calls in flight, one query per call
    (bench/bench_cluster.c): PQ distances and the exact re-rank (100 candidates per shard).
Modes (BENCH_MEMORY_MODES, default "before,heap,mmap"): before = the binaries of
BENCH_MEMORY_BEFORE_BIN (skipped when unset), heap = TSR_BIN with TSR_SHARD_VECTORS=heap
(raw vectors copied to the heap at load, the old way), mmap = TSR_BIN as shipped.

Run: make bench-memory [BENCH_MEMORY_BEFORE_BIN=<bin dir of an older build>]
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_cluster as bc  # noqa: E402
import bench_search as bs  # noqa: E402
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

MODES = os.environ.get("BENCH_MEMORY_MODES", "before,heap,mmap").split(",")
BEFORE = os.environ.get("BENCH_MEMORY_BEFORE_BIN", "")
NOW_BIN = os.path.dirname(os.path.abspath(bs.BIN))
NPROBE = 16


def rollup(pid):
    out = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[2] == "kB":
                out[p[0].rstrip(":")] = int(p[1]) * 1024
    return {"anon": out.get("Anonymous", 0), "file": out.get("Rss", 0) - out.get("Anonymous", 0)}


def warm(datadir):
    for root, _, files in os.walk(datadir):
        for f in files:
            if f == "vectors.f32":
                with open(os.path.join(root, f), "rb") as fh:
                    while fh.read(1 << 22):
                        pass


def restart_shards(cl, bin_dir, env):
    for s in cl.shards:
        s.stop()
    new = []
    for s in cl.shards:
        t0 = time.time()
        while True:
            try:
                new.append(sh.Shard(s.data, extra=["--listen", s.target], env=env,
                                    bin_dir=bin_dir))
                break
            except RuntimeError:
                if time.time() - t0 > 30:
                    raise
                time.sleep(0.3)
    cl.shards = new


def empty_baseline(bin_dir, env):
    s = sh.Shard(sh.tmpdir("tsr-mem-empty-"), env=env, bin_dir=bin_dir)
    try:
        time.sleep(0.5)
        return rollup(s.proc.pid)
    finally:
        s.stop()


def shard_stats(s):
    sp = sh.stubs()[0]
    return s.stub.Stats(sp.ShardStatsRequest(), timeout=30)


def main():
    xq_p, xq, gt, ix_p, batch = bc.data()
    modes = [m for m in MODES if m != "before" or BEFORE]
    bins = {"before": BEFORE, "heap": NOW_BIN, "mmap": NOW_BIN}
    envs = {"before": {}, "heap": {"TSR_SHARD_VECTORS": "heap"}, "mmap": {}}
    t_start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    tp = ch.stubs()[0]
    cl = ch.Cluster(4, bs.D, {"nlist": bs.NLIST, "pq_m": bs.M, "nprobe": NPROBE,
                              "plan": "balanced", "stage_chunk": 5000,
                              "stage_deadline_ms": 1800000}, template=ix_p)
    rows = []
    try:
        t0 = time.time()
        op = cl.update(batch, timeout=7200)
        assert op.state == tp.Operation.SUCCEEDED, op
        n = cl.stats().vectors_count
        bc.log("loaded %d vectors in %.0fs" % (n, time.time() - t0))
        for mode in modes:
            base = empty_baseline(bins[mode], envs[mode])
            restart_shards(cl, bins[mode], envs[mode])
            for s in cl.shards:
                warm(s.data)
            r = {"mode": mode, "anon": 0, "file": 0, "anon_q": 0, "file_q": 0, "s_anon": 0,
                 "s_mapped": 0, "s_mem": 0}
            for s in cl.shards:
                ru = rollup(s.proc.pid)
                r["anon"] += ru["anon"] - base["anon"]
                r["file"] += ru["file"] - base["file"]
                st = shard_stats(s)
                r["s_mem"] += st.memory_bytes
                r["s_anon"] += getattr(st, "anonymous_bytes", 0)
                r["s_mapped"] += getattr(st, "mapped_bytes", 0)
            pq = bc.c_client("coord", ix_p, xq_p, NPROBE, 4, 1, cl.target, 0)
            ex = bc.c_client("coord", ix_p, xq_p, NPROBE, 4, 1, cl.target, -1)
            for s in cl.shards:  # after the queries: the vector pages the re-rank touched
                ru = rollup(s.proc.pid)
                r["anon_q"] += ru["anon"] - base["anon"]
                r["file_q"] += ru["file"] - base["file"]
            r["pq_qps"], r["ex_qps"] = pq["qps"], ex["qps"]
            r["pq_recall"], r["ex_recall"] = bc.recall(pq["I"], gt), bc.recall(ex["I"], gt)
            # measured once more after the other modes' noise: the median of two rounds
            ex2 = bc.c_client("coord", ix_p, xq_p, NPROBE, 4, 1, cl.target, -1)
            r["ex_qps"] = (r["ex_qps"] + ex2["qps"]) / 2
            bc.log("%s: %s" % (mode, {k: v for k, v in r.items()}))
            rows.append(r)
    finally:
        cl.stop()
    print()
    print("Shard memory, %d x %d (bench_search %s data), IVF%d / PQ%d x 8; 4 shards on this "
          "machine, summed; %s UTC. smaps = /proc/<pid>/smaps_rollup minus an empty shard's; "
          "stats = the shards' Stats. Re-rank: FindNeighbors nprobe %d, 4 in flight, one query "
          "per call, vectors.f32 in the page cache" % (n, bs.D, bs.GEN, bs.NLIST, bs.M, t_start,
                                                       NPROBE))
    print("| mode | smaps anonymous B/vector | smaps file-backed B/vector | the same after the "
          "queries | stats anonymous B/vector | stats mapped B/vector | PQ QPS | recall | "
          "exact QPS | recall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %.1f | %.1f | %.1f / %.1f | %s | %s | %.0f | %.3f | %.0f | %.3f |" %
              (r["mode"], r["anon"] / n, r["file"] / n, r["anon_q"] / n, r["file_q"] / n,
               "%.1f" % (r["s_anon"] / n) if r["s_anon"] else "-",
               "%.1f" % (r["s_mapped"] / n) if r["s_mapped"] else "-",
               r["pq_qps"], r["pq_recall"], r["ex_qps"], r["ex_recall"]))
    by = {r["mode"]: r for r in rows}
    if "heap" in by and "mmap" in by:
        print()
        print("exact re-rank QPS, mmap / heap: %.2f" % (by["mmap"]["ex_qps"] /
                                                       by["heap"]["ex_qps"]))


if __name__ == "__main__":
    main()
