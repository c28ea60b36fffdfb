#!/usr/bin/python3
"""bench_stream — streamed writes and a fold under load (issue 15, "what must be true" 4, 5;
docs/streaming.md). `make bench-stream`.

Data: bench_e2e.py's generator and cache (hier data, default rng 7): BENCH_STREAM_N (default
1,000,000) x 64, IVF BENCH_STREAM_NLIST (1024) / PQ16, the template built by `tessera index
build`; a cluster of tessera-coordinator + 4 tessera-shard on loopback (one replica each)
loaded with it through UpdateIndex; `stream_fold_records` 0 (no background fold: the fold
measured is the one part 3 starts). Clients are python grpcio, one channel per process: the
client "threads" are PROCESSES (multiprocessing, spawn), because one python process's GIL
holds grpcio to ~1 core of work.

One run measures, in order:
1. writes: UpsertDatapoints of new ids (vectors from the data distribution) at 1, 16 and 64
   records per call with 1 and 8 client processes, BENCH_STREAM_SECONDS (5) each:
   records/s acknowledged, ack latency p50 / p99;
2. queries: FindNeighbors (one query per call, k 10, nprobe BENCH_STREAM_NPROBE (16)) from
   BENCH_STREAM_QPROCS (2) processes, BENCH_STREAM_QSECONDS (8) per window, alternating
   quiet / with a stream of BENCH_STREAM_RATE (1000) records/s (4 processes, 50 records per
   call, paced) twice:
   QPS, p50, p99 per window, and the ratio under the stream / quiet;
3. fold (BENCH_STREAM_FOLD=0 skips it): the delta is filled to BENCH_STREAM_FOLD_FRACTION
   (0.10) of N (8 processes, 64 per call); quiet queries with the delta; then the fold —
   UpdateIndex with fold_stream, an update with no record — while the query processes run nonstop: failed queries, p50 / p99 during the
   fold vs quiet with the delta and after it; then every shard's folded
   vNNNNNN/slice.faiss opens in stock Faiss (faiss.read_index), holds every vector (the sum
   of ntotal = the index's count), and for BENCH_STREAM_FAISS_Q (200) queries Faiss's
   search_preassigned with the same lists and coarse distances returns the labels
   Shard.Search returns (same rule as tests/integration/test_shard_faiss.py); the merged
   Faiss answer, labels read back as ids with Shard.Read, equals the cluster's
   FindNeighbors (approximate_neighbor_count 0, same nprobe). One more client process
   upserts one record per call, paced to BENCH_STREAM_FOLD_WRITE_RATE (20)/s, from before
   the fold to after it: how long a streamed write arriving during the fold waits for
   its acknowledgement (docs/streaming.md "Writes during a fold").
BENCH_STREAM_PARTS=fold runs part 3 only, for profiling the fold; part 3 also prints a
timeline of the fold (queries per 0.5 s step, their p50 and max, and the update's log lines
of the coordinator and shards at their time).
Prints ONE table per part. Env: the above, BENCH_STREAM_OUT (cache, default
build/bench-stream), TSR_BIN, BENCH_STREAM_CONFIG (a JSON object merged into the
coordinator's config, for an A/B of one key).

BENCH_STREAM_AB=DIR (another build's bin directory, e.g. of the commit before a change):
parts 1-2 run on two clusters at once, A (DIR's binaries) and B (TSR_BIN's), each window
A B then B A, and print side by side with the ratio B / A (medians): on a shared
machine whose load moves between runs, a before/after read from one run. Part 3 (the
fold) then runs on B only.
"""
import json
import multiprocessing as mp
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
N = int(os.environ.get("BENCH_STREAM_N", 1000000))
NLIST = int(os.environ.get("BENCH_STREAM_NLIST", 1024))
NPROBE = int(os.environ.get("BENCH_STREAM_NPROBE", 16))
K = 10
SECONDS = float(os.environ.get("BENCH_STREAM_SECONDS", 5))
QSECONDS = float(os.environ.get("BENCH_STREAM_QSECONDS", 8))
QPROCS = int(os.environ.get("BENCH_STREAM_QPROCS", 2))
RATE = float(os.environ.get("BENCH_STREAM_RATE", 1000))
FOLD = os.environ.get("BENCH_STREAM_FOLD", "1") != "0"
PARTS = os.environ.get("BENCH_STREAM_PARTS", "all")   # "fold": part 3 only (profiling)
FOLD_FRACTION = float(os.environ.get("BENCH_STREAM_FOLD_FRACTION", 0.10))
FAISS_Q = int(os.environ.get("BENCH_STREAM_FAISS_Q", 200))
# BENCH_STREAM_CONFIG: JSON object merged into the coordinator's config (an A/B of a key,
# e.g. '{"fold_build_cpu_percent": 100}')
EXTRA_CONFIG = json.loads(os.environ.get("BENCH_STREAM_CONFIG", "{}"))
FOLD_WRITE_RATE = int(os.environ.get("BENCH_STREAM_FOLD_WRITE_RATE", 20))  # writes/s in the fold
AB = os.environ.get("BENCH_STREAM_AB", "")
OUT = os.environ.get("BENCH_STREAM_OUT", os.path.join(ROOT, "build", "bench-stream"))
D = 64


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Worker processes (spawned: no grpc state is inherited)

_W = {}


def _stub(target, stub_dir):
    """The stub of `target`, one channel per target and process (a pool process serves
    both clusters of BENCH_STREAM_AB: a stub cached for the first target only sent every
    window of both to that one cluster, up to 2026-12-04)."""
    if "tp" not in _W:
        sys.path.insert(0, stub_dir)
        import grpc
        from tessera.v1 import tessera_pb2
        _W.update(tp=tessera_pb2, grpc=grpc)
    key = ("stub", target)
    if key not in _W:
        from tessera.v1 import tessera_pb2_grpc
        ch = _W["grpc"].insecure_channel(target)
        _W[key] = tessera_pb2_grpc.VectorSearchStub(ch)
        _W[("chan", target)] = ch
        # bytes in, bytes out: no (de)serialization in the window
        _W[("upsert_raw", target)] = ch.unary_unary("/tessera.v1.VectorSearch/UpsertDatapoints")
    return _W[key], _W["tp"], _W["grpc"]


def _vectors(sample_p):
    if "sample" not in _W:
        _W["sample"] = np.load(sample_p)
    return _W["sample"]


def w_warm(args):
    target, stub_dir, sample_p = args
    _stub(target, stub_dir)
    _vectors(sample_p)
    return os.getpid()


def _sync(ready, go):
    """Tells the parent this process is ready, waits for the start time it sets, returns
    it (every process of a measurement starts at the same moment, whatever its set-up
    took)."""
    ready.put(os.getpid())
    while go.value == 0.0:
        time.sleep(0.005)
    t0 = go.value
    while time.time() < t0:
        time.sleep(0.001)
    return t0


def _request_bytes(tp, xs, rng, wid, seed, k, per_call):
    """The serialized UpsertDatapointsRequest of call k: per_call new ids, vectors near
    random sample rows."""
    rows = rng.integers(0, len(xs), per_call)
    vs = xs[rows] + rng.normal(size=(per_call, D)).astype("float32") * 0.3
    dps = [tp.IndexDatapoint(datapoint_id="s%s-%d-%d" % (wid, seed, k * per_call + j),
                             feature_vector=vs[j].tolist()) for j in range(per_call)]
    return tp.UpsertDatapointsRequest(datapoints=dps).SerializeToString()


def w_write(args):
    """Upserts of new ids, per_call records per call, from the start time for `seconds` (or until
    `quota` records are acknowledged); rate > 0 paces it to that many records/s. The
    requests are serialized before the start (up to `prebuild` calls; more are built on the fly),
    so that the window's client cost is the gRPC call itself; it also stops when stop_p
    exists. Returns (records acknowledged, [call latency s], errors, CPU seconds of this
    process in the window, [call start time])."""
    (target, stub_dir, sample_p, wid, per_call, sync, seconds, rate, quota, seed, prebuild,
     stop_p) = args
    _, tp, grpc = _stub(target, stub_dir)
    call = _W[("upsert_raw", target)]
    xs = _vectors(sample_p)
    rng = np.random.default_rng(seed)
    reqs = [_request_bytes(tp, xs, rng, wid, seed, k, per_call) for k in range(prebuild)]
    n, lat, errors, k, starts = 0, [], [], 0, []
    t0 = _sync(*sync)
    cpu0 = time.process_time()
    while True:
        now = time.time()
        if now >= t0 + seconds or (quota and n >= quota) or (stop_p and os.path.exists(stop_p)):
            break
        if rate > 0:
            due = t0 + k * per_call / rate
            if due > now:
                time.sleep(due - now)
        rq = reqs[k] if k < len(reqs) else _request_bytes(tp, xs, rng, wid, seed, k, per_call)
        a = time.perf_counter()
        ts = time.time()
        try:
            call(rq, timeout=60)
            lat.append(time.perf_counter() - a)
            starts.append(ts)
            n += per_call
        except grpc.RpcError as e:
            errors.append("%s: %s" % (e.code().name, e.details()))
            if len(errors) >= 20:
                break
            time.sleep(0.05)
        k += 1
    return n, lat, errors, time.process_time() - cpu0, starts


def w_query(args):
    """FindNeighbors, one query per call, from the start time for `seconds` or until stop_p
    exists.
    Returns [(t_start, latency s, ok)] and the first errors."""
    target, stub_dir, xq_p, sync, seconds, stop_p, seed = args
    stub, tp, grpc = _stub(target, stub_dir)
    if "xq" not in _W:
        _W["xq"] = np.load(xq_p)
    xq = _W["xq"]
    rng = np.random.default_rng(seed)
    out, errors = [], []
    t0 = _sync(*sync)
    i = int(rng.integers(0, len(xq)))
    while time.time() < t0 + seconds and not (stop_p and os.path.exists(stop_p)):
        q = tp.FindNeighborsRequest.Query(
            datapoint=tp.IndexDatapoint(feature_vector=xq[i % len(xq)].tolist()),
            neighbor_count=K, fraction_leaf_nodes_to_search_override=NPROBE / NLIST)
        i += 1
        a = time.perf_counter()
        ts = time.time()
        try:
            stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
            out.append((ts, time.perf_counter() - a, True))
        except grpc.RpcError as e:
            out.append((ts, time.perf_counter() - a, False))
            if len(errors) < 5:
                errors.append("%s: %s" % (e.code().name, e.details()))
    return out, errors


# ---------------------------------------------------------------------------------------
# The parent

def cluster_cpu(cl):
    """CPU seconds (user + system) used so far by the coordinator and the shards."""
    tick = os.sysconf("SC_CLK_TCK")
    tot = 0.0
    for p in [cl.coord.proc] + [s.proc for s in cl.shards]:
        with open("/proc/%d/stat" % p.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tot += (int(fields[11]) + int(fields[12])) / tick
    return tot


def pct(a, p):
    a = np.sort(np.asarray(a))
    return float(a[min(len(a) - 1, int(len(a) * p))]) if len(a) else float("nan")


class Bench:
    def __init__(self, cl, pool, stub_dir, sample_p, xq_p):
        self.cl, self.pool, self.stub_dir = cl, pool, stub_dir
        self.sample_p, self.xq_p = sample_p, xq_p
        self.seed = 0

    def group(self):
        """A start group: (ready queue, start time) shared by the processes of one
        measurement."""
        return (self.mgr.Queue(), self.mgr.Value("d", 0.0))

    def start(self, grp, n):
        """Waits until n processes of grp are ready, starts them together; returns t0."""
        for _ in range(n):
            grp[0].get(timeout=1800)
        grp[1].value = t0 = time.time() + 0.1
        return t0

    def writes(self, procs, per_call, seconds, rate=0.0, quota=0, grp=None, stop_p=""):
        """procs writer processes; returns (AsyncResult, t0) — t0 None when grp is given
        (the caller starts the group). Each process serializes its requests first: as many
        calls as `rate` needs, or its quota, or a guess of what it can send."""
        if rate > 0:
            prebuild = int(seconds * rate / per_call) + 1
        elif quota:
            prebuild = quota // per_call + 1
        else:
            prebuild = int(seconds * {1: 600, 16: 250}.get(per_call, 80))
        own = grp is None
        grp = grp or self.group()
        args = []
        for p in range(procs):
            self.seed += 1
            args.append((self.cl.target, self.stub_dir, self.sample_p, p, per_call, grp,
                         seconds, rate, quota, self.seed, prebuild, stop_p))
        res = self.pool.map_async(w_write, args, chunksize=1)
        return res, (self.start(grp, procs) if own else None)

    def queries(self, procs, seconds, stop_p="", grp=None):
        own = grp is None
        grp = grp or self.group()
        args = []
        for p in range(procs):
            self.seed += 1
            args.append((self.cl.target, self.stub_dir, self.xq_p, grp, seconds, stop_p,
                         self.seed))
        res = self.pool.map_async(w_query, args, chunksize=1)
        return res, (self.start(grp, procs) if own else None)


def write_row(b, procs, per_call, tag=""):
    """One write window: (per_call, procs, records/s, calls/s, p50 ms, p99 ms, errors,
    cluster CPU %, clients CPU %)."""
    res, t0 = b.writes(procs, per_call, SECONDS)
    time.sleep(max(0.0, t0 - time.time()))
    c0 = cluster_cpu(b.cl)
    out = res.get(SECONDS + 600)
    c1 = cluster_cpu(b.cl)
    n = sum(o[0] for o in out)
    lat = [x for o in out for x in o[1]]
    errs = [e for o in out for e in o[2]]
    ccpu = sum(o[3] for o in out)
    row = (per_call, procs, n / SECONDS, len(lat) / SECONDS, pct(lat, 0.5) * 1e3,
           pct(lat, 0.99) * 1e3, len(errs), 100.0 * (c1 - c0) / SECONDS,
           100.0 * ccpu / SECONDS)
    log("  %swrites %2d/call x %d procs: %.0f records/s, p50 %.2f ms, p99 %.2f ms, "
        "errors %d %s" % (tag, per_call, procs, row[2], row[4], row[5], len(errs), errs[:1]))
    return row


def write_table(b):
    rows = []
    for procs in (1, 8):
        for per_call in (1, 16, 64):
            rows.append(write_row(b, procs, per_call))
    print()
    print("| records per call | client processes | records/s acknowledged | calls/s | "
          "ack p50 ms | ack p99 ms | failed calls | cluster CPU % | clients CPU % |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %d | %d | %.0f | %.0f | %.2f | %.2f | %d | %.0f | %.0f |" % r)
    print("(CPU %%: of one core, over the window; the machine has %d cores, load average "
          "%.1f now)" % (os.cpu_count(), os.getloadavg()[0]))
    best = max(r[2] for r in rows if r[0] == 64)
    print("records/s at 64 per call (best of 1 and 8 clients): %.0f (goal >= 20000: %s)" %
          (best, "met" if best >= 20000 else "NOT met"))
    return rows


def query_window(b, seconds, stream_rate):
    grp = b.group()
    res, _ = b.queries(QPROCS, seconds, grp=grp)
    wres = None
    if stream_rate > 0:   # 4 processes, 50 records per call, paced to stream_rate together
        wres, _ = b.writes(4, 50, seconds, rate=stream_rate / 4, grp=grp)
    b.start(grp, QPROCS + (4 if stream_rate > 0 else 0))
    out = res.get(seconds + 600)
    recs = [x for o in out for x in o[0]]
    errs = [e for o in out for e in o[1]]
    lat = [x[1] for x in recs if x[2]]
    w = wres.get(seconds + 600) if wres else None
    return {"qps": len(lat) / seconds, "p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3,
            "failed": sum(1 for x in recs if not x[2]), "errors": errs,
            "stream": sum(x[0] for x in w) / seconds if w else 0.0,
            "stream_p50": pct([t for x in w for t in x[1]], 0.5) * 1e3 if w else float("nan")}


def query_table(b):
    wins = []
    for rep in range(2):
        for rate in (0.0, RATE):
            r = query_window(b, QSECONDS, rate)
            r["label"] = "with a %.0f records/s stream" % RATE if rate else "quiet"
            wins.append(r)
            log("  queries %s: %.0f QPS p50 %.2f ms p99 %.2f ms, failed %d, stream %.0f/s" %
                (r["label"], r["qps"], r["p50"], r["p99"], r["failed"], r["stream"]))
    print()
    print("| FindNeighbors, %d client processes, nprobe %d, k %d | QPS | p50 ms | p99 ms | "
          "failed | stream records/s acknowledged | stream ack p50 ms |" % (QPROCS, NPROBE, K))
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in wins:
        print("| %s | %.0f | %.2f | %.2f | %d | %.0f | %.2f |" % (
            r["label"], r["qps"], r["p50"], r["p99"], r["failed"], r["stream"],
            r["stream_p50"]))
    quiet = np.median([r["p50"] for r in wins if not r["stream"]])
    busy = np.median([r["p50"] for r in wins if r["stream"]])
    print("query p50 under the stream / quiet: %.2fx (goal <= 1.2x)" % (busy / quiet))
    return wins


def ab_tables(ba, bb, reps=2):
    """BENCH_STREAM_AB: the same windows on cluster A (the binaries of BENCH_STREAM_AB) and
    B (TSR_BIN), alternated A B A B so both see the same machine; medians, ratios B / A."""
    print()
    print("A = %s, B = %s; every row: windows A B then B A (x %d), medians" % (
        os.path.relpath(ba.cl.bin, ROOT), os.path.relpath(bb.cl.bin, ROOT), reps))
    print()
    print("| records per call | client processes | A records/s | B records/s | B / A | "
          "A ack p50 ms | B ack p50 ms | A ack p99 ms | B ack p99 ms | "
          "A cluster CPU us/record | B cluster CPU us/record |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for procs in (1, 8):
        for per_call in (1, 16, 64):
            ra, rb = [], []
            for rep in range(reps):   # A B, then B A: neither always goes first
                for name in ("AB" if rep % 2 == 0 else "BA"):
                    if name == "A":
                        ra.append(write_row(ba, procs, per_call, "A "))
                    else:
                        rb.append(write_row(bb, procs, per_call, "B "))
            med = lambda rows, i: float(np.median([r[i] for r in rows]))  # noqa: E731
            cpu = lambda rows: float(np.median([r[7] * 1e4 / max(r[2], 1e-9)  # noqa: E731
                                                for r in rows]))
            print("| %d | %d | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.0f |" % (
                per_call, procs, med(ra, 2), med(rb, 2), med(rb, 2) / max(med(ra, 2), 1e-9),
                med(ra, 4), med(rb, 4), med(ra, 5), med(rb, 5), cpu(ra), cpu(rb)))
    print("(load average %.1f now)" % os.getloadavg()[0])
    print()
    print("| FindNeighbors p50 ms | A quiet | A with a %.0f records/s stream | A ratio | "
          "B quiet | B with the stream | B ratio |" % RATE)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rep in range(reps):
        w = {}
        for name, b in (("A", ba), ("B", bb)) if rep % 2 == 0 else (("B", bb), ("A", ba)):
            for rate in (0.0, RATE):
                r = query_window(b, QSECONDS, rate)
                w[(name, rate)] = r["p50"]
                log("  %s queries %s: p50 %.2f ms, stream %.0f/s" % (
                    name, "stream" if rate else "quiet", r["p50"], r["stream"]))
        print("| round %d | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2fx |" % (
            rep + 1, w[("A", 0.0)], w[("A", RATE)], w[("A", RATE)] / w[("A", 0.0)],
            w[("B", 0.0)], w[("B", RATE)], w[("B", RATE)] / w[("B", 0.0)]))
    print("(load average %.1f now)" % os.getloadavg()[0])


def shard_stats(cl):
    import coord_harness as ch
    sp = ch.stubs()[2]
    return [s.stub.Stats(sp.ShardStatsRequest(), timeout=30) for s in cl.shards]


def fold_timeline(cl, recs, f0, f1, step=0.5):
    """The fold window in steps of `step` s (queries started, p50 / max latency ms), with the
    update's log lines of the coordinator and the shards (their UTC timestamps) placed at
    their time: which phase of the fold the queries wait on."""
    import calendar
    import re
    events = []
    procs = [("coord", cl.coord)] + [("shard%d" % i, s) for i, s in enumerate(cl.shards)]
    pat = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z \S+ \w+: (.*)$")
    for name, pr in procs:
        text = pr.text() if hasattr(pr, "text") else pr.proc.text()
        for line in text.splitlines():
            m = pat.match(line)
            if not m:
                continue
            y, mo, d, h, mi, sec, ms = (int(x) for x in m.groups()[:7])
            t = calendar.timegm((y, mo, d, h, mi, sec)) + ms / 1000.0
            if f0 - 1.0 <= t <= f1 + 1.0 and re.search(
                    r"update|Prepare|prepared|committed|Commit|version|fold|dropping|behind|failed over|coalesced", m.group(8)):
                events.append((t, name, m.group(8)[:150]))
    events.sort()
    print()
    print("Fold timeline (t = seconds after the UpdateIndex call; queries started in each "
          "%.1f s step):" % step)
    print("| t | queries | p50 ms | max ms | log lines in the step |")
    print("|---:|---:|---:|---:|---|")
    t = f0 - 1.0
    while t < f1 + 1.0:
        lat = sorted(x[1] * 1e3 for x in recs if t <= x[0] < t + step)
        ev = ["%s +%.2f: %s" % (n, et - f0, m) for et, n, m in events if t <= et < t + step]
        print("| %+.1f | %d | %s | %s | %s |" % (
            t - f0, len(lat), "%.1f" % lat[len(lat) // 2] if lat else "-",
            "%.1f" % lat[-1] if lat else "-", "<br>".join(ev)))
        t += step


def fold_part(b, ix_p, xq):
    import coord_harness as ch
    tp, _, sp, _ = ch.stubs()
    cl = b.cl
    st = shard_stats(cl)
    delta = sum(s.delta_upserts for s in st)
    want = int(N * FOLD_FRACTION)
    if delta > want * 1.05:   # parts 1-2 streamed more than the fraction: fold them first
        t0 = time.time()
        op = cl.fold(timeout=3600)
        assert op.state == tp.Operation.SUCCEEDED, op
        log("  folded the %d records of parts 1-2 first (%.1fs)" % (delta, time.time() - t0))
        delta = sum(s.delta_upserts for s in shard_stats(cl))
    t0 = time.time()
    if delta < want:
        per = (want - delta + 7) // 8
        res, _ = b.writes(8, 64, 3600, quota=per)
        out = res.get(7200)
        errs = [e for o in out for e in o[2]]
        assert not errs, errs[:3]
    st = shard_stats(cl)
    delta = sum(s.delta_upserts for s in st)
    fill_s = time.time() - t0
    log("  delta filled to %d records (%.1f%% of %d) in %.1fs; WAL bytes %d" % (
        delta, 100.0 * delta / N, N, fill_s, sum(s.wal_bytes for s in st)))
    quiet = query_window(b, QSECONDS, 0)
    # the fold: UpdateIndex with fold_stream (an update with no record; writes flow during
    # its Prepare, docs/streaming.md "Writes during a fold")
    stop_p = os.path.join(cl.root, "stop-queries")
    res, q0 = b.queries(QPROCS, 3600, stop_p)
    # one writer, single upserts paced to FOLD_WRITE_RATE/s: how long a streamed write
    # waits when it arrives during the fold (docs/streaming.md "Writes during a fold")
    wres = b.writes(1, 1, 3600, rate=FOLD_WRITE_RATE, stop_p=stop_p)[0] if FOLD_WRITE_RATE \
        else None
    time.sleep(max(0.0, q0 - time.time()) + 2.0)
    f0 = time.time()
    r = cl.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=60)
    op = cl.wait_op(r.operation_id, 3600)
    f1 = time.time()
    time.sleep(2.0)
    open(stop_p, "w").close()
    out = res.get(600)
    wout = wres.get(600) if wres else []
    os.unlink(stop_p)
    assert op.state == tp.Operation.SUCCEEDED, op
    recs = [x for o in out for x in o[0]]
    errs = [e for o in out for e in o[1]]
    during = [x for x in recs if f0 <= x[0] <= f1]
    lat = [x[1] for x in during if x[2]]
    failed = sum(1 for x in recs if not x[2])
    fold_timeline(cl, recs, f0, f1)
    after = query_window(b, QSECONDS, 0)
    st2 = shard_stats(cl)
    if wout:  # the writer's records are in the delta now: fold them too (no load), so
        # that the slices Faiss opens hold every vector the cluster answers from
        op2 = cl.fold(timeout=3600)
        assert op2.state == tp.Operation.SUCCEEDED, op2
    import faiss
    import stream_model as sm
    faiss.omp_set_num_threads(1)
    tmpl = faiss.read_index(ix_p, faiss.IO_FLAG_MMAP)
    fz = sm.faiss_slices_check(cl, tmpl, xq[:FAISS_Q], NPROBE, NLIST, K)
    print()
    print("Fold of a %.1f%% delta (%d streamed records) into %d vectors: the update took "
          "%.1fs (call to SUCCEEDED seen; operation %d ms); delta after it %d (the paced "
          "writer's records)" % (
              100.0 * delta / N, delta, N, f1 - f0, op.end_time_ms - op.start_time_ms,
              sum(s.delta_upserts + s.delta_deletes for s in st2)))
    print("| FindNeighbors, %d client processes | queries | failed | QPS | p50 ms | p99 ms |"
          % QPROCS)
    print("|---|---:|---:|---:|---:|---:|")
    print("| quiet, delta present | %d | %d | %.0f | %.2f | %.2f |" % (
        quiet["qps"] * QSECONDS, quiet["failed"], quiet["qps"], quiet["p50"], quiet["p99"]))
    print("| **during the fold** | %d | %d | %.0f | %.2f | %.2f |" % (
        len(during), failed, len(lat) / max(1e-9, f1 - f0), pct(lat, .5) * 1e3,
        pct(lat, .99) * 1e3))
    print("| quiet, after the fold | %d | %d | %.0f | %.2f | %.2f |" % (
        after["qps"] * QSECONDS, after["failed"], after["qps"], after["p50"], after["p99"]))
    print("failed queries over the whole fold window (%d queries): %d %s; p99 during the fold "
          "/ quiet p99 (delta present): %.2fx (goal <= 2x)" % (
              len(recs), failed, errs[:2], pct(lat, .99) * 1e3 / quiet["p99"]))
    wl = [(t, x) for o in wout for t, x in zip(o[4], o[1])]
    wd = [x for t, x in wl if f0 <= t <= f1]
    print("streamed writes (1 record per call, paced to %d/s) during the fold: %d acknowledged, "
          "%d failed; ack p50 %.1f ms, max %.1f ms (outside the fold: p50 %.1f ms, %d writes)"
          % (FOLD_WRITE_RATE, len(wd), sum(len(o[2]) for o in wout), pct(wd, .5) * 1e3,
             max(wd or [0]) * 1e3, pct([x for t, x in wl if not f0 <= t <= f1], .5) * 1e3,
             len(wl) - len(wd)))
    if wout:
        print("(the writer's %d records were folded by a second update with no load before "
              "the Faiss check)" % len(wl))
    print("folded slices in stock Faiss %s: %d slices, ntotal %d = index count %d; %d "
          "queries: shard answers equal Faiss's for %d/%d (shard, query) pairs, worst "
          "distance rel. diff %.2g; cluster top-%d ids equal the merged Faiss answer for "
          "%d/%d" % (fz["faiss"], fz["slices"], fz["ntotal"], fz["count"], fz["nq"],
                     fz["same"], fz["pairs"], fz["worst"], K, fz["cluster_same"], fz["nq"]))


def main():
    os.environ.setdefault("BENCH_E2E_N", str(N))
    os.environ.setdefault("BENCH_E2E_NLIST", str(NLIST))
    os.environ.setdefault("BENCH_E2E_OUT", OUT)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import bench_e2e as be   # data generation and cache, shared with bench-e2e
    import coord_harness as ch
    import shard_harness as sh
    xb_p, xq_p, ix_p, batch = be.data()
    xq = be.read_fvecs(xq_p)
    xb = be.read_fvecs(xb_p)
    rng = np.random.default_rng(11)
    sample_p = os.path.join(OUT, "stream_sample_%d.npy" % N)
    np.save(sample_p, xb[rng.choice(len(xb), min(len(xb), 20000), replace=False)])
    del xb
    xq_np = os.path.join(OUT, "stream_q_%d.npy" % N)
    np.save(xq_np, xq)
    tp = ch.stubs()[0]
    stub_dir = sh._stub_dir
    t_start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    load0 = os.getloadavg()[0]
    def cluster(bin_dir=None):
        return ch.Cluster(4, D, dict({"nlist": NLIST, "pq_m": be.M, "nprobe": NPROBE,
                                      "stage_chunk": 5000, "stream_fold_records": 0},
                                     **EXTRA_CONFIG),
                          template=ix_p, bin_dir=bin_dir,
                          coord_extra=["--batch-root-allow", os.path.abspath(OUT)])
    cl = cluster()
    cla = None
    pool = mgr = None
    try:
        if AB:
            cla = cluster(AB)
        for c in [x for x in (cla, cl) if x]:
            t0 = time.time()
            op = c.update(batch, timeout=3600)
            assert op.state == tp.Operation.SUCCEEDED, op
            log("loaded %d vectors in %.1fs" % (c.stats().vectors_count, time.time() - t0))
        ctx = mp.get_context("spawn")
        npool = max(8, QPROCS + 4)   # every task of a start group needs its own process
        pool = ctx.Pool(npool)
        pool.map(w_warm, [(c.target, stub_dir, sample_p) for c in (cla, cl) if c] *
                 (2 * npool))
        b = Bench(cl, pool, stub_dir, sample_p, xq_np)
        b.mgr = mgr = ctx.Manager()
        print("bench_stream: %d x %d, IVF%d/PQ%d, 4 shards (1 replica each) + coordinator on "
              "loopback; python grpcio clients, one process per client (multiprocessing); "
              "%s UTC, load average %.1f at the start" % (N, D, NLIST, be.M, t_start, load0))
        if cla:
            ba = Bench(cla, pool, stub_dir, sample_p, xq_np)
            ba.mgr = mgr
            ab_tables(ba, b)
            cla.stop()
            cla = None
        elif PARTS != "fold":
            write_table(b)
            query_table(b)
        if FOLD:
            fold_part(b, ix_p, xq)
        print("load average at the end %.1f; %s UTC" % (os.getloadavg()[0],
                                                        time.strftime("%H:%M", time.gmtime())))
    finally:
        if pool:
            pool.terminate()
            pool.join()
        if mgr:
            mgr.shutdown()
        if cla:
            cla.stop()
        cl.stop()


if __name__ == "__main__":
    main()
