#!/usr/bin/python3
"""bench_e2e — a query through the cluster vs the same query in one process (issue 5, 6).

Data: BENCH_E2E_N (default 200000) x 64 float32, clustered, numpy default_rng(7);
BENCH_E2E_NQ (2000) queries drawn the same way. BENCH_E2E_GEN=hier (default): 16 topics
N(0, 3^2) per coordinate, 125 sub-centres per topic (topic + N(0, 1.5^2)), points = a
sub-centre + N(0, 1) — neighbouring lists share a topic, as real embeddings have; flat: 2000
centres N(0, 2^2), unit noise — no structure above the clusters, so no plan can keep a
query's lists on fewer shards. One index, IVF BENCH_E2E_NLIST (1024) / PQ BENCH_E2E_M (16) x 8 bits, L2, trained and
filled by `tessera index build` (one Faiss IwPQ file, also read by Faiss). The cluster:
tessera-coordinator (--template = that file, so the same quantizer) + 4 tessera-shard on
loopback, loaded with the same vectors through UpdateIndex (CSV batch, ids v000000.. so the
coordinator's labels equal the file's row numbers) — once with `plan: balanced`, once with
`plan: locality`.

Per plan, bench/bench_e2e.c (C client, common/net/rpc) times, query by query interleaved:
in-process tsr_ivfpq_search on the file; "direct" = coarse step + one Shard.Search per
touched shard in parallel + merge, done by the client (the sum of the parts); and one
FindNeighbors through the coordinator. coordinator added = coord - direct. Then QPS with 4
client threads, the python grpcio client (its own overhead = python - C at p50), Faiss
1.7.3 on the same file (python, one thread), and `tessera index search` (one batch, one
thread). Shards touched per query: GetIndexStats (mean_shards_touched over the bench's
queries) per plan.

Prints ONE table. The machine is shared; repeat (BENCH_E2E_REPEAT, default 3 C-client runs
per plan, the table shows their median) and compare within a run. Every plan's cluster is up
at once and the runs alternate (run 1 of each plan, then run 2, ...), so a load that comes
and goes falls on all plans alike; with two plans or more the run also prints, per round,
the ratio of each plan's coordinator p50 to the first plan's, and their median.

Env: BENCH_E2E_CANDIDATES (0: the coordinator's exact re-rank off, as on the direct path),
BENCH_E2E_N, BENCH_E2E_NQ, BENCH_E2E_NLIST, BENCH_E2E_M, BENCH_E2E_NPROBE (16),
BENCH_E2E_K (10), BENCH_E2E_PLANS ("balanced,locality"), BENCH_E2E_REPEAT (3),
BENCH_E2E_OUT (cache dir, default build/bench-e2e), BENCH_E2E_CLIENT (the C client binary),
BENCH_E2E_PERF=1 (perf record the coordinator during one extra run; needs perf),
BENCH_E2E_THREADS=1 (each coordinator thread's context switches and CPU during one extra
run, from /proc), TSR_BIN.

Metadata backend (issue 16, docs/ha.md): a plan name with the suffix "@etcd" runs the
coordinator with --etcd on a 3-member etcd started for it (tests/integration/
etcd_harness.py; data under the cluster's temp dir). BENCH_E2E_ETCD=1 makes the default
plans "balanced,balanced@etcd": the same cluster on the local and on the etcd backend,
side by side (queries must not touch etcd: their p50 should be the same). "@etcd-poll" is
"@etcd" with TSR_RPC_STREAM_POLL=1: the coordinator's etcd watch thread blocks in gRPC's
completion queue as a poller (what it did before streams_nowait, common/net/rpc.h).
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import coord_harness as ch  # noqa: E402

N = int(os.environ.get("BENCH_E2E_N", 200000))
NQ = int(os.environ.get("BENCH_E2E_NQ", 2000))
NLIST = int(os.environ.get("BENCH_E2E_NLIST", 1024))
M = int(os.environ.get("BENCH_E2E_M", 16))
NPROBE = int(os.environ.get("BENCH_E2E_NPROBE", 16))
K = int(os.environ.get("BENCH_E2E_K", 10))
PLANS = os.environ.get("BENCH_E2E_PLANS", "balanced,balanced@etcd"
                       if os.environ.get("BENCH_E2E_ETCD") == "1"
                       else "balanced,locality").split(",")
REPEAT = int(os.environ.get("BENCH_E2E_REPEAT", 3))
OUT = os.environ.get("BENCH_E2E_OUT", os.path.join(ROOT, "build", "bench-e2e"))
CLIENT = os.environ.get("BENCH_E2E_CLIENT",
                        os.path.join(ROOT, "build", "release", "bench", "bench_e2e"))
BIN = ch.BIN
GEN = os.environ.get("BENCH_E2E_GEN", "hier")
# The coordinator's exact re-rank (candidates per shard; the product's default is on): 0
# here, so the coordinator does the same work as the direct path and the in-process search
# (PQ distances) and "coordinator added" is what distribution costs; BENCH_E2E_CANDIDATES=N
# measures the re-rank's cost on top (bench-cluster measures it too).
CANDIDATES = int(os.environ.get("BENCH_E2E_CANDIDATES", 0))
D = 64
KEY = "%s_n%d_d%d_nq%d" % (GEN, N, D, NQ)
IKEY = "%s_ivf%d_pq%d" % (KEY, NLIST, M)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def write_fvecs(path, a):
    a = np.ascontiguousarray(a, dtype="float32")
    n, d = a.shape
    out = np.empty((n, d + 1), dtype="float32")
    out[:, 0] = np.array([d], dtype="int32").view("float32")[0]
    out[:, 1:] = a
    out.tofile(path + ".tmp")
    os.replace(path + ".tmp", path)


def read_fvecs(path):
    raw = np.fromfile(path, dtype="float32")
    d = raw[:1].view("int32")[0]
    return raw.reshape(-1, d + 1)[:, 1:].copy()


def read_ivecs(path):
    raw = np.fromfile(path, dtype="int32")
    return raw.reshape(-1, raw[0] + 1)[:, 1:]


def data():
    os.makedirs(OUT, exist_ok=True)
    xb_p, xq_p = os.path.join(OUT, KEY + "_base.fvecs"), os.path.join(OUT, KEY + "_q.fvecs")
    if not os.path.exists(xq_p):
        log("generating %d x %d clustered vectors and %d queries" % (N, D, NQ))
        rng = np.random.default_rng(7)
        if GEN == "flat":
            cent = rng.normal(size=(2000, D)).astype("float32") * 2
        else:
            topics = rng.normal(size=(16, D)).astype("float32") * 3
            cent = (np.repeat(topics, 125, axis=0) +
                    rng.normal(size=(2000, D)).astype("float32") * 1.5)
        xb = cent[rng.integers(0, 2000, N)] + rng.normal(size=(N, D)).astype("float32")
        xq = cent[rng.integers(0, 2000, NQ)] + rng.normal(size=(NQ, D)).astype("float32")
        write_fvecs(xb_p, xb)
        write_fvecs(xq_p, xq)
    ix_p = os.path.join(OUT, IKEY + ".faiss")
    if not os.path.exists(ix_p):
        log("building IVF%d,PQ%d with tessera index build" % (NLIST, M))
        t0 = time.time()
        subprocess.check_call([os.path.join(BIN, "tessera"), "index", "build", "--fvecs", xb_p,
                               "--nlist", str(NLIST), "--pq-m", str(M), "--threads", "2",
                               "--out", ix_p])
        log("  built in %.1fs" % (time.time() - t0))
    batch = os.path.join(OUT, KEY + "_batch")
    if not os.path.isdir(batch):
        log("writing the CSV batch")
        xb = read_fvecs(xb_p)
        os.makedirs(batch + ".tmp", exist_ok=True)
        per = 25000
        for f in range(0, N, per):
            with open(os.path.join(batch + ".tmp", "part-%04d.csv" % (f // per)), "w") as fh:
                for i in range(f, min(N, f + per)):
                    fh.write("v%06d," % i + ",".join("%.6g" % v for v in xb[i]) + "\n")
        os.replace(batch + ".tmp", batch)
    return xb_p, xq_p, ix_p, batch


def pstats(lat_us):
    a = np.sort(np.asarray(lat_us))
    return {"p50_us": float(a[len(a) // 2]), "p99_us": float(a[min(len(a) - 1, int(len(a) * 0.99))]),
            "qps": float(len(a) / (a.sum() / 1e6))}


def faiss_bench(ix_p, xq, tsr_I):
    import faiss
    faiss.omp_set_num_threads(1)
    ix = faiss.read_index(ix_p)
    ix.nprobe = NPROBE
    lat = []
    I1 = np.empty((len(xq), K), dtype="int64")
    for r in range(2):  # first pass warms up
        lat = []
        for i in range(len(xq)):
            t0 = time.perf_counter()
            _, I = ix.search(xq[i:i + 1], K)
            lat.append((time.perf_counter() - t0) * 1e6)
            I1[i] = I[0]
    one = pstats(lat)
    t0 = time.perf_counter()
    _, IB = ix.search(xq, K)
    one["batch_qps"] = len(xq) / (time.perf_counter() - t0)
    # python's own cost of a call: an empty numpy slice + a no-op C call
    t0 = time.perf_counter()
    for i in range(len(xq)):
        xq[i:i + 1]
        ix.is_trained
    one["py_call_us"] = (time.perf_counter() - t0) * 1e6 / len(xq)
    one["same_topk_as_tessera"] = int((IB == tsr_I).all(axis=1).sum())
    return one


def tsr_index_search(ix_p, xq_p):
    out = os.path.join(OUT, "I.ivecs")
    best = None
    for r in range(3):
        p = subprocess.run([os.path.join(BIN, "tessera"), "index", "search", "--index", ix_p,
                            "--queries", xq_p, "--k", str(K), "--nprobe", str(NPROBE),
                            "--out", out, "--stats"], capture_output=True, text=True, check=True)
        st = json.loads(p.stderr.strip().splitlines()[-1])
        best = st if best is None or st["qps"] > best["qps"] else best
    return best, read_ivecs(out)


def py_client(cl, tp, xq, n):
    lat = []
    for r in range(2):
        lat = []
        for i in range(n):
            rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xq[i], K,
                                                           fraction=NPROBE / NLIST)])
            t0 = time.perf_counter()
            cl.stub.FindNeighbors(rq, timeout=10)
            lat.append((time.perf_counter() - t0) * 1e6)
    return pstats(lat)


def start_plan(name, ix_p, xq_p, batch, stack):
    """Starts plan `name`'s cluster (and its etcd), loads it, and returns its context; the
    ExitStack stops them. Every plan of a run is up at once, so that the client runs can
    alternate between them (main): a shared machine's load then falls on every plan alike."""
    tp = ch.stubs()[0]
    plan, _, backend = name.partition("@")
    etcd, extra = None, ["--batch-root-allow", os.path.abspath(OUT)]
    env = None
    if backend == "etcd-poll":  # the watch thread blocks in gRPC (before streams_nowait)
        env = dict(os.environ, TSR_RPC_STREAM_POLL="1")
    if backend in ("etcd", "etcd-poll"):
        import etcd_harness as eh
        if eh.etcd_bin() is None:
            sys.exit("bench_e2e: %s needs etcd (apt-get install etcd-server)" % name)
        etcd = eh.Etcd(3)
        stack.callback(etcd.stop)
        extra += ["--etcd", etcd.endpoints, "--etcd-prefix", "/tessera/bench-e2e"]
    elif backend:
        sys.exit("bench_e2e: plan %s: unknown backend %s (etcd, etcd-poll)" % (name, backend))
    cl = ch.Cluster(4, D, {"nlist": NLIST, "pq_m": M, "nprobe": NPROBE, "plan": plan,
                           "stage_chunk": 5000, "approximate_neighbor_count": CANDIDATES},
                    template=ix_p, coord_extra=extra, env=env)
    stack.callback(cl.stop)
    if etcd:  # the coordinator elects itself leader on etcd first
        t_end = time.time() + 60
        while cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10).leader == "":
            assert time.time() < t_end, "no leader elected after 60 s"
            time.sleep(0.1)
    t0 = time.time()
    op = cl.update(batch, timeout=900)
    assert op.state == tp.Operation.SUCCEEDED, op
    load_s = time.time() - t0
    st = cl.stats()
    log("plan %s: loaded %d vectors in %.1fs, per shard %s, imbalance %.3f" %
        (name, st.vectors_count, load_s, [s.vectors_count for s in st.shards],
         st.plan_imbalance))
    planf = os.path.join(cl.root, "coordinator", "v%06d" % st.version, "plan")
    argv = [CLIENT, "--coord", cl.target, "--shards", ",".join(s.target for s in cl.shards),
            "--index", ix_p, "--plan", planf, "--queries", xq_p, "--nprobe", str(NPROBE),
            "--k", str(K), "--version", str(st.version), "--threads", "4"]
    return {"plan": name, "cl": cl, "argv": argv, "runs": [], "load_s": load_s,
            "q0": st.queries_served, "m0": st.mean_shards_touched}


def measure_run(ctx):
    """One C-client run on plan ctx (appended to ctx["runs"])."""
    p = subprocess.run(ctx["argv"], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("bench_e2e failed:\n" + p.stderr + p.stdout)
    ctx["runs"].append(json.loads(p.stdout))
    j = ctx["runs"][-1]
    log("  %s run %d: inproc p50 %.0f, direct p50 %.0f, coord p50 %.0f us; added %.0f us "
        "(paired %.0f); same top-k %d/%d; load %s" %
        (ctx["plan"], len(ctx["runs"]), j["inproc"]["p50_us"], j["direct"]["p50_us"],
         j["coord"]["p50_us"], j["coord"]["p50_us"] - j["direct"]["p50_us"],
         j["paired_diff_p50_us"], j["same_topk_inproc_coord"], j["queries"],
         os.getloadavg()[0]))


def finish_plan(ctx, xq):
    """After the runs: shards touched, the python client, the optional profiles."""
    tp = ch.stubs()[0]
    cl = ctx["cl"]
    st = cl.stats()
    q1, m1 = st.queries_served, st.mean_shards_touched
    touched = (m1 * q1 - ctx["m0"] * ctx["q0"]) / max(1, q1 - ctx["q0"])
    py = py_client(cl, tp, xq, min(1000, len(xq)))
    if os.environ.get("BENCH_E2E_PERF") == "1":
        perf_profile(cl, ctx["argv"])
    if os.environ.get("BENCH_E2E_THREADS") == "1":
        thread_profile(ctx["plan"], cl, ctx["argv"])
    return {"plan": ctx["plan"], "runs": ctx["runs"], "touched": touched, "py": py,
            "load_s": ctx["load_s"], "imbalance": st.plan_imbalance}


def perf_profile(cl, argv):
    data = os.path.join(OUT, "perf-coord.data")
    pr = subprocess.Popen(["perf", "record", "-g", "-F", "2000", "-o", data, "-p",
                           str(cl.coord.proc.pid)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    subprocess.run(argv, capture_output=True)
    pr.send_signal(2)
    pr.wait(60)
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,sym",
                          "--stdio", "-g", "none", "--percent-limit", "1"],
                         capture_output=True, text=True)
    log("perf (coordinator during one bench run), written to %s:\n%s" %
        (data, "\n".join(rep.stdout.splitlines()[:60])))


def task_sample(pid):
    """{tid: (cpu ticks, voluntary, involuntary context switches, syscall it sleeps in)}
    of every thread of pid, from /proc."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        d = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(d + "stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(d + "status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(d + "syscall") as f:
                sc = f.read().split()[0]
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12]),
                         int(status["voluntary_ctxt_switches"]),
                         int(status["nonvoluntary_ctxt_switches"]), sc)
    return out


def thread_profile(name, cl, argv):
    """BENCH_E2E_THREADS=1: the coordinator's threads during one more C-client run: context
    switches and CPU of each (a thread that is not on the query path but switches about as
    often as queries arrive takes part in handling them, e.g. a gRPC poller)."""
    pid = cl.coord.proc.pid
    a = task_sample(pid)
    p = subprocess.run(argv, capture_output=True, text=True)
    b = task_sample(pid)
    j = json.loads(p.stdout)
    names = {"7": "read", "232": "epoll_wait", "281": "epoll_pwait", "202": "futex",
             "23": "select", "230": "clock_nanosleep", "0": "read", "35": "nanosleep"}
    log("threads of the coordinator (%s) during one more run (%d queries through it; "
        "syscall each sleeps in after the run):" % (name, j["queries"]))
    tot = 0
    for tid in sorted(b):
        if tid not in a:
            continue
        cpu = b[tid][0] - a[tid][0]
        vol, nvol = b[tid][1] - a[tid][1], b[tid][2] - a[tid][2]
        tot += vol + nvol
        log("  tid %7d: %7d voluntary + %5d involuntary switches, cpu %5d ms, sleeps in %s"
            % (tid, vol, nvol, cpu * 10, names.get(b[tid][3], b[tid][3])))
    log("  all threads: %d switches" % tot)


def med(runs, path, key):
    return statistics.median(r[path][key] for r in runs)


def main():
    if not os.path.exists(CLIENT):
        sys.exit("bench_e2e: the C client %s is missing (make bench-e2e builds it)" % CLIENT)
    xb_p, xq_p, ix_p, batch = data()
    load0 = os.getloadavg()
    t_start = time.strftime("%H:%M", time.gmtime())
    xq = read_fvecs(xq_p)
    tsr_st, tsr_I = tsr_index_search(ix_p, xq_p)
    fz = faiss_bench(ix_p, xq, tsr_I)
    with contextlib.ExitStack() as stack:
        ctxs = [start_plan(p, ix_p, xq_p, batch, stack) for p in PLANS]
        for _ in range(REPEAT):  # alternate: run r of every plan, then run r + 1
            for ctx in ctxs:
                measure_run(ctx)
        res = [finish_plan(ctx, xq) for ctx in ctxs]

    cols = []
    for r in res:
        cols.append(r["plan"])
    print()
    print("End to end: %d x %d (%s data), IVF%d / PQ%d x 8, L2; %d queries, k=%d, nprobe=%d; "
          "coordinator + 4 shards on loopback; %s-%s UTC, load average %.1f at the start, "
          "%.1f at the end" %
          (N, D, GEN, NLIST, M, NQ, K, NPROBE, t_start, time.strftime("%H:%M", time.gmtime()),
           load0[0], os.getloadavg()[0]))
    hdr = "| path (one query per call unless noted) |"
    sep = "|---|"
    for c in cols:
        hdr += " %s p50 µs | p99 µs | QPS |" % c
        sep += "---:|---:|---:|"
    print(hdr)
    print(sep)

    def row(name, f):
        line = "| %s |" % name
        for r in res:
            p50, p99, qps = f(r)
            line += " %s | %s | %s |" % tuple("—" if v is None else "%.0f" % v
                                             for v in (p50, p99, qps))
        print(line)

    row("in-process, tsr_ivfpq_search on the file (C)",
        lambda r: (med(r["runs"], "inproc", "p50_us"), med(r["runs"], "inproc", "p99_us"),
                   med(r["runs"], "inproc", "qps")))
    row("in-process, `tessera index search` (one batch, 1 thread)",
        lambda r: (None, None, tsr_st["qps"]))
    row("Faiss 1.7.3 on the file (python, 1 thread)",
        lambda r: (fz["p50_us"], fz["p99_us"], fz["qps"]))
    row("Faiss 1.7.3, one batch", lambda r: (None, None, fz["batch_qps"]))
    row("bare hop: Health/Check to the coordinator (inline handler)",
        lambda r: (med(r["runs"], "hop", "p50_us"), med(r["runs"], "hop", "p99_us"),
                   med(r["runs"], "hop", "qps")))
    row("direct: coarse + Search fan-out to the shards + merge (C client)",
        lambda r: (med(r["runs"], "direct", "p50_us"), med(r["runs"], "direct", "p99_us"),
                   med(r["runs"], "direct", "qps")))
    row("**through the coordinator** (C client)",
        lambda r: (med(r["runs"], "coord", "p50_us"), med(r["runs"], "coord", "p99_us"),
                   med(r["runs"], "coord", "qps")))
    row("through the coordinator, 4 client threads (C)",
        lambda r: (None, None, statistics.median(x["coord_threads_qps"] for x in r["runs"])))
    row("through the coordinator (python grpcio client)",
        lambda r: (r["py"]["p50_us"], r["py"]["p99_us"], r["py"]["qps"]))

    def line(name, f, fmt="%.0f"):
        print("| %s |" % name + "".join((" " + fmt + " | | |") % f(r) for r in res))

    line("**coordinator added at p50** (coord − direct), µs",
         lambda r: med(r["runs"], "coord", "p50_us") - med(r["runs"], "direct", "p50_us"))
    line("coordinator added, median of per-query differences, µs",
         lambda r: statistics.median(x["paired_diff_p50_us"] for x in r["runs"]))
    line("coordinator added minus the bare hop (its own work and fan-out), µs",
         lambda r: med(r["runs"], "coord", "p50_us") - med(r["runs"], "direct", "p50_us") -
         med(r["runs"], "hop", "p50_us"))
    line("coordinator vs in-process at p50 (ratio)",
         lambda r: med(r["runs"], "coord", "p50_us") / med(r["runs"], "inproc", "p50_us"),
         "%.1fx")
    line("python client overhead at p50 (python − C), µs",
         lambda r: r["py"]["p50_us"] - med(r["runs"], "coord", "p50_us"))
    line("**mean shards touched per query** (of 4; GetIndexStats)", lambda r: r["touched"],
         "%.2f")
    print()
    for r in res:
        added = [x["coord"]["p50_us"] - x["direct"]["p50_us"] for x in r["runs"]]
        same = [x["same_topk_inproc_coord"] for x in r["runs"]]
        print("%s: plan imbalance %.3f, load %.1fs; coordinator added per run (µs): %s; "
              "same top-%d as in-process: %s of %d" %
              (r["plan"], r["imbalance"], r["load_s"], ", ".join("%.0f" % a for a in added), K,
               ", ".join(map(str, same)), NQ))
    print("Faiss: same top-%d as `tessera index search` for %d/%d queries; python's own cost "
          "per Faiss call ~%.1f µs (not subtracted)" %
          (K, fz["same_topk_as_tessera"], NQ, fz["py_call_us"]))
    if len(res) > 1:  # paired by round: the runs of one round ran back to back
        base = res[0]
        for r in res[1:]:
            rat = [b["coord"]["p50_us"] / a["coord"]["p50_us"]
                   for a, b in zip(base["runs"], r["runs"])]
            print("%s vs %s, coordinator p50 per round (alternated runs): ratio median %.3f, "
                  "min %.3f, max %.3f over %d rounds (%s)" %
                  (r["plan"], base["plan"], statistics.median(rat), min(rat), max(rat),
                   len(rat), ", ".join("%.3f" % x for x in rat)))
    goal = max(med(r["runs"], "coord", "p50_us") - med(r["runs"], "direct", "p50_us")
               for r in res)
    print("goal: the coordinator adds <= 300 µs at p50: %s (%.0f µs)" %
          ("met" if goal <= 300 else "NOT met", goal))


if __name__ == "__main__":
    main()
