#!/usr/bin/python3
"""bench_cluster — what the cluster delivers under concurrent clients (issue 20).

Data: bench_search's (BENCH_N, default 1M x 64, clustered v2, seed 2024; IVF BENCH_NLIST 4000,
PQ64 x 8, L2), cached in BENCH_OUT (bench/out) and shared with `make bench-search`; the index
file is the Faiss-built one when bench-search made it, else `tessera index build` makes one.
The cluster: tessera-coordinator (--template = that file, so the same quantizer) + 4
tessera-shard on loopback, loaded through UpdateIndex with the same vectors (CSV batch, ids
v%06d = the row, so labels compare with the file's).

One run measures, side by side, for nprobe 16 and 64, single queries and batches of 32 per
call, 1 / 4 / 16 calls in flight (bench/bench_cluster.c, C client threads, one call in flight
each):
  cluster   FindNeighbors through the coordinator, PQ distances (approximate_neighbor_count
            = 0, what the in-process engine and Faiss compute);
  inproc    tsr_ivfpq_search on the same file in one process, the same threads and batches;
  split     the same engine doing the cluster's division of work without its processes and
            calls: the probed lists split 4 ways (list % 4), each part searched on its own
            (its own table, quantization and top-k, as a shard) and merged — what the 4
            partitions cost before any RPC ("split / in-process");
  faiss     Debian's Faiss 1.7.3 on the same file: the same number of processes (forked after
            loading: python threads would share the GIL), one OpenMP thread each, same batches;
  ping      bare grpc.health.v1.Health/Check calls to the coordinator, one per query, the same
            threads: the calls/s these cores carry with no work at all. "bound" = the most
            any distributed design with one client call per request could reach on these
            cores: 1 / (1 / in-process QPS + 1 / (queries per call x ping calls/s)) (the
            engine's work plus one bare call per request, nothing for the shards' calls);
and at 4 in flight the cluster with the exact re-rank default (approximate_neighbor_count
unset = 100): the cost of exact distances and the recall they buy. QPS = queries/s, p50 /
p99 per call (µs), recall 10@10 against exact search. Everything runs on this machine's 2
cores, the clients included, so "in flight" beyond 2 measures queueing, not more cores.

Env: BENCH_N, BENCH_NLIST, BENCH_NQ (2000), BENCH_OUT, BENCH_CLUSTER_NPROBES ("16,64"),
BENCH_CLUSTER_INFLIGHT ("1,4,16"), BENCH_CLUSTER_BATCHES ("1,32"), BENCH_CLUSTER_CLIENT, TSR_BIN,
BENCH_CLUSTER_MIN_CALLS (20): every timed pass repeats the query set until each client thread
(or Faiss process) makes at least this many calls (2,000 queries in batches of 32 at 16 in
flight are ~4 calls each: the ramp-up and the drain were half the pass, and the cluster's
pipeline suffered more from them than the engines);
BENCH_CLUSTER_RUNS (1): the measurement repeated on the one loaded cluster, a table per run;
BENCH_CLUSTER_COALESCE ("2,0"): the coordinator's coalesce_inflight for the cluster column
(the first) and for an A/B column beside it (the others; the coordinator restarts between
them on the same shards, each row measured under every setting back to back in alternating
order, docs/coordinator.md "Coalesced shard calls"). "" = the config's default only;
BENCH_CLUSTER_PLAN ("balanced"): the partition plan, "locality" puts neighbouring lists on
one shard (docs/coordinator.md), so a query touches fewer shards.
"""
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import numpy as np  # noqa: E402
import faiss  # noqa: E402
import bench_search as bs  # noqa: E402  (data, keys and cache of bench-search)
import coord_harness as ch  # noqa: E402

NPROBES = [int(x) for x in os.environ.get("BENCH_CLUSTER_NPROBES", "16,64").split(",")]
INFLIGHT = [int(x) for x in os.environ.get("BENCH_CLUSTER_INFLIGHT", "1,4,16").split(",")]
BATCHES = [int(x) for x in os.environ.get("BENCH_CLUSTER_BATCHES", "1,32").split(",")]
RUNS = int(os.environ.get("BENCH_CLUSTER_RUNS", 1))
COALESCE = [int(x) for x in os.environ.get("BENCH_CLUSTER_COALESCE", "2,0").split(",") if x]
PLAN = os.environ.get("BENCH_CLUSTER_PLAN", "balanced")
CLIENT = os.environ.get("BENCH_CLUSTER_CLIENT",
                        os.path.join(ROOT, "build", "release", "bench", "bench_cluster"))
K = bs.K
MIN_CALLS = int(os.environ.get("BENCH_CLUSTER_MIN_CALLS", 20))


def repeat(inflight, batch):
    """Rounds of the query set per timed pass: >= MIN_CALLS calls per client thread."""
    return max(1, -(-MIN_CALLS * inflight * batch // bs.NQ))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def data():
    os.makedirs(bs.OUT, exist_ok=True)
    xb_p = os.path.join(bs.OUT, bs.KEY + "_base.fvecs")
    xq_p = os.path.join(bs.OUT, bs.KEY + "_q%d.fvecs" % bs.NQ)
    if not (os.path.exists(xb_p) and os.path.exists(xq_p)):
        log("generating %d x %d vectors (bench_search's generator)" % (bs.N, bs.D))
        xb, xq = bs.gen_data()
        bs.write_fvecs(xb_p, xb)
        bs.write_fvecs(xq_p, xq)
    xb = np.fromfile(xb_p, dtype="float32").reshape(bs.N, bs.D + 1)[:, 1:]
    xq = np.ascontiguousarray(np.fromfile(xq_p, dtype="float32").reshape(bs.NQ, bs.D + 1)[:, 1:])

    def make_gt(path):
        flat = faiss.IndexFlatL2(bs.D)
        flat.add(np.ascontiguousarray(xb))
        faiss.omp_set_num_threads(2)
        _, I = flat.search(xq, K)
        faiss.omp_set_num_threads(1)
        np.save(path, I)
    gt = np.load(bs.cached(bs.KEY + "_q%d_gt%d.npy" % (bs.NQ, K), make_gt))
    ix_p = os.path.join(bs.OUT, bs.IKEY + "_faiss.faiss")
    if not os.path.exists(ix_p):
        ix_p = os.path.join(bs.OUT, bs.IKEY + "_tessera.faiss")
    if not os.path.exists(ix_p):
        log("building IVF%d,PQ%d with tessera index build (2 threads)" % (bs.NLIST, bs.M))
        subprocess.check_call([bs.BIN, "index", "build", "--fvecs", xb_p, "--nlist",
                               str(bs.NLIST), "--pq-m", str(bs.M), "--threads", "2",
                               "--out", ix_p + ".tmp"])
        os.replace(ix_p + ".tmp", ix_p)
    batch = os.path.join(bs.OUT, bs.KEY + "_csv")
    if not os.path.isdir(batch):
        log("writing the CSV batch")
        os.makedirs(batch + ".tmp", exist_ok=True)
        per = 50000
        for f in range(0, bs.N, per):
            with open(os.path.join(batch + ".tmp", "part-%04d.csv" % (f // per)), "w") as fh:
                for i in range(f, min(bs.N, f + per)):
                    fh.write("v%06d," % i + ",".join("%.7g" % v for v in xb[i]) + "\n")
        os.replace(batch + ".tmp", batch)
    return xq_p, xq, gt, ix_p, batch


def recall(I, gt):
    return float(np.mean([len(set(I[i]) & set(gt[i])) / K for i in range(len(gt))]))


def c_client(mode, ix_p, xq_p, nprobe, inflight, batch, target=None, candidates=0):
    out = os.path.join(bs.OUT, "cluster_labels.bin")
    argv = [CLIENT, "--mode", mode, "--index", ix_p, "--queries", xq_p, "--nprobe",
            str(nprobe), "--k", str(K), "--inflight", str(inflight), "--batch", str(batch),
            "--out", out, "--warmup", str(max(200, 4 * inflight * batch)),
            "--repeat", str(repeat(inflight, batch))]
    if target:
        argv += ["--target", target, "--candidates", str(candidates)]
    if mode == "split":
        argv += ["--split", "4"]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("bench_cluster %s failed:\n%s%s" % (mode, p.stderr, p.stdout))
    r = json.loads(p.stdout)
    if mode != "ping":
        r["I"] = np.fromfile(out, dtype="int64").reshape(-1, K)
    return r


_FZ = {}


def _faiss_part(args):
    lo, hi, batch, start, rounds = args
    ix, xq = _FZ["ix"], _FZ["xq"]
    while time.time() < start:
        time.sleep(0.0005)
    lat, out = [], np.empty((hi - lo, K), dtype="int64")
    for _ in range(rounds):
        for i in range(lo, hi, batch):
            j = min(hi, i + batch)
            t0 = time.perf_counter()
            _, I = ix.search(xq[i:j], K)
            lat.append((time.perf_counter() - t0) * 1e6)
            out[i - lo:j - lo] = I
    return lat, out, time.time()


def faiss_run(ix, xq, nprobe, inflight, batch):
    ix.nprobe = nprobe
    _FZ["ix"], _FZ["xq"] = ix, xq
    n = len(xq)
    ctx = mp.get_context("fork")
    with ctx.Pool(inflight) as pool:
        pool.map(_faiss_part, [(0, min(n, 200), batch, 0, 1)] * inflight)  # warm-up
        start = time.time() + 0.3
        rounds = repeat(inflight, batch)
        parts = pool.map(_faiss_part, [(n * t // inflight, n * (t + 1) // inflight, batch, start,
                                        rounds) for t in range(inflight)])
    lat = np.sort(np.concatenate([np.asarray(p[0]) for p in parts]))
    wall = max(p[2] for p in parts) - start
    return {"qps": n * rounds / wall, "p50_us": float(lat[len(lat) // 2]),
            "p99_us": float(lat[int(0.99 * (len(lat) - 1))]),
            "I": np.concatenate([p[1] for p in parts])}


def main():
    if not os.path.exists(CLIENT):
        sys.exit("bench_cluster: the C client %s is missing (make bench-cluster builds it)" %
                 CLIENT)
    xq_p, xq, gt, ix_p, batch = data()
    fz = faiss.read_index(ix_p)
    t_start, load0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.getloadavg()[0]
    tp = ch.stubs()[0]
    cl = ch.Cluster(4, bs.D, {"nlist": bs.NLIST, "pq_m": bs.M, "nprobe": 16,
                              "plan": PLAN, "stage_chunk": 5000,
                              # a 1M load's Prepare (250k vectors per shard) on a loaded
                              # 2-core machine can outlast the 120 s default
                              "stage_deadline_ms": 1800000}, template=ix_p,
                    coord_extra=["--batch-root-allow", os.path.abspath(bs.OUT)])
    runs = []
    try:
        t0 = time.time()
        op = cl.update(batch, timeout=3600)
        assert op.state == tp.Operation.SUCCEEDED, op
        st = cl.stats()
        log("loaded %d vectors in %.0fs, per shard %s" %
            (st.vectors_count, time.time() - t0, [s.vectors_count for s in st.shards]))
        for run in range(RUNS):
            rows, t_run, l_run = [], time.strftime("%H:%M", time.gmtime()), os.getloadavg()[0]
            for nprobe in NPROBES:
                for b in BATCHES:
                    for t in INFLIGHT:
                        rows.append({"nprobe": nprobe, "batch": b, "inflight": t})
            # each row under every coordinator setting back to back (the order alternates
            # row by row, so a restart serves two measurements and a drift of the machine
            # hits both sides alike), then the engines
            cur = None
            for idx, r in enumerate(rows):
                order = list(range(max(len(COALESCE), 1)))
                for j in (order if idx % 2 == 0 else order[::-1]):
                    if COALESCE and COALESCE[j] != cur:
                        cur = COALESCE[j]
                        restart_coord(cl, tp, cur)
                    measure_cluster(cl, ix_p, xq_p, r, j)
            for r in rows:
                measure(ix_p, xq_p, xq, gt, fz, r)
            runs.append((rows, t_run, l_run, os.getloadavg()[0]))
            report(runs[-1], run + 1, t_start, load0)
    finally:
        cl.stop()


def restart_coord(cl, tp, co):
    """The coordinator again on the same shards and data with coalesce_inflight co; back
    when it answers a query."""
    cl.stop_coord()
    with open(cl.config) as f:
        cfg = json.load(f)
    cfg["coalesce_inflight"] = co
    with open(cl.config, "w") as f:
        json.dump(cfg, f)
    cl.start(extra_args=["--batch-root-allow", os.path.abspath(bs.OUT)])
    rq = tp.FindNeighborsRequest(queries=[ch.query(tp, [0.0] * bs.D, 10)])
    for _ in range(600):
        try:
            cl.stub.FindNeighbors(rq, timeout=10)
            break
        except Exception:
            time.sleep(0.1)
    log("coordinator restarted with coalesce_inflight %d" % co)


def measure_cluster(cl, ix_p, xq_p, r, j):
    """Row r's cluster figures under the coordinator's j-th setting (PQ distances; at 4 in
    flight also with the exact re-rank, under the first setting)."""
    nprobe, b, t = r["nprobe"], r["batch"], r["inflight"]
    key = "cluster" if j == 0 else "cluster%d" % j
    r[key] = c_client("coord", ix_p, xq_p, nprobe, t, b, cl.target, 0)
    if t == 4 and j == 0:
        r["rerank"] = c_client("coord", ix_p, xq_p, nprobe, t, b, cl.target, -1)
    if j == 0:
        r["ping"] = c_client("ping", ix_p, xq_p, nprobe, t, 1, cl.target)
    log("nprobe %d batch %d in flight %d: %s %.0f QPS" % (nprobe, b, t, key, r[key]["qps"]))


def measure(ix_p, xq_p, xq, gt, fz, r):
    """Row r's engines: the in-process engine and Faiss at its nprobe, batch and in flight;
    then the recall of every column."""
    nprobe, b, t = r["nprobe"], r["batch"], r["inflight"]
    r["inproc"] = c_client("inproc", ix_p, xq_p, nprobe, t, b)
    r["split"] = c_client("split", ix_p, xq_p, nprobe, t, b)
    r["faiss"] = faiss_run(fz, xq, nprobe, t, b)
    for key in [k for k in r if k in ("cluster", "inproc", "split", "faiss", "rerank") or
                k.startswith("cluster")]:
        if "I" in r[key]:
            r[key]["recall"] = recall(r[key].pop("I"), gt)
    log("nprobe %d batch %d in flight %d: cluster %.0f, inproc %.0f, split %.0f, faiss %.0f QPS"
        % (nprobe, b, t, r["cluster"]["qps"], r["inproc"]["qps"], r["split"]["qps"],
           r["faiss"]["qps"]))


def report(run, n, t_start, load0):
    """Prints run n's tables (stdout)."""
    rows, t_run, l_run, l_end = run
    print()
    print("Run %d of %d. Cluster throughput: %d x %d (bench_search %s data), IVF%d / PQ%d x 8, L2; "
          "%d queries (repeated to >= %d calls per client thread), k=%d; coordinator + 4 shards "
          "(%s plan) + clients on this machine's 2 cores; "
          "started %s UTC (load %.1f), this run %s UTC, load %.1f at its start, %.1f at its end"
          % (n, RUNS, bs.N, bs.D, bs.GEN, bs.NLIST, bs.M, bs.NQ, MIN_CALLS, K, PLAN, t_start,
             load0, t_run,
             l_run, l_end))
    if COALESCE:
        print("cluster = coalesce_inflight %d; %s" % (COALESCE[0], "; ".join(
            "cluster%d = coalesce_inflight %d (%s)" % (j, co, "off" if co == 0 else "on")
            for j, co in enumerate(COALESCE) if j)))
    extra = ["cluster%d" % j for j in range(1, len(COALESCE))]
    print("| nprobe | queries/call | in flight | cluster QPS | p50 µs | p99 µs | recall | "
          "in-process QPS | p50 µs | cluster / in-process | split-4 QPS | split / in-process |"
          " ping calls/s | bound / in-process |"
          " Faiss 1.7.3 QPS | cluster / Faiss |"
          " p99 / p50 (cluster) |" + "".join(" %s QPS | p50 µs | p99 µs | %s / in-process |"
                                            % (x, x) for x in extra))
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" +
          "---:|---:|---:|---:|" * len(extra))
    for r in rows:
        c, i, f, pg, sp = r["cluster"], r["inproc"], r["faiss"], r["ping"], r["split"]
        bound = 1 / (1 / i["qps"] + 1 / (r["batch"] * pg["qps"]))
        print("| %d | %d | %d | %.0f | %.0f | %.0f | %.3f | %.0f | %.0f | %.2f | %.0f | %.2f | "
              "%.0f | %.2f | %.0f | %.2f | %.1f |" % (
                  r["nprobe"], r["batch"], r["inflight"], c["qps"], c["p50_us"], c["p99_us"],
                  c["recall"], i["qps"], i["p50_us"], c["qps"] / i["qps"], sp["qps"],
                  sp["qps"] / i["qps"], pg["qps"], bound / i["qps"], f["qps"],
                  c["qps"] / f["qps"], c["p99_us"] / c["p50_us"]) +
              "".join(" %.0f | %.0f | %.0f | %.2f |" % (r[x]["qps"], r[x]["p50_us"],
                                                         r[x]["p99_us"], r[x]["qps"] / i["qps"])
                      for x in extra))
    print()
    print("Exact distances (re-rank of 100 candidates per shard, the default) at 4 in flight:")
    print("| nprobe | queries/call | PQ QPS | recall | exact QPS | recall | exact / PQ |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "rerank" in r:
            c, e = r["cluster"], r["rerank"]
            print("| %d | %d | %.0f | %.3f | %.0f | %.3f | %.2f |" %
                  (r["nprobe"], r["batch"], c["qps"], c["recall"], e["qps"], e["recall"],
                   e["qps"] / c["qps"]))
    fails = sum(r[k].get("fails", 0) for r in rows for k in ["inproc", "split", "rerank"] +
                ["cluster"] + extra if k in r)
    same = all(abs(r[k]["recall"] - r["inproc"]["recall"]) < 0.005 for r in rows
               for k in ["cluster", "split"] + extra)
    print()
    print("failed calls: %d; cluster and split recall equal in-process recall (±0.005) in "
          "every row: %s"
          % (fails, "yes" if same else "NO"), flush=True)


if __name__ == "__main__":
    main()
