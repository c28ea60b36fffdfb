#!/usr/bin/python3
"""soak — steady query + streamed-write load on a small HA cluster for N seconds, sampling
every process; `make soak SECONDS=N` (docs/reliability.md "Soak").

The cluster (tests/integration/etcd_harness.py, loopback): etcd x3, 2 coordinators with
--etcd, 2 shard groups x 2 replicas; a base batch of 2,000 datapoints (d=16). Load: 2 query
threads (FindNeighbors k 10 on either coordinator, no pause) and 1 writer (UpsertDatapoints
of 1-8 datapoints or RemoveDatapoints on a pool of 2,000 ids, on the leader; 50 calls/s at
most). Every interval (SECONDS/24, at least 5 s) one row: queries/s, query p50 / p99,
writes/s, write p99, errors, and the RSS (MiB) and open file descriptors (/proc/PID) of each
process. The verdict (tests/chaos/soak_rule.py): after the warm-up sixth of the rows, a
process's RSS or fds GROW when both the minimum and the maximum of the last third exceed
the first third's by more than 10 % + 8 MiB (fds: 8), so that etcd's raft-log sawtooth is
not read as a leak and a leak, alone or under a sawtooth, still is; p99 is steady when the
last quarter's mean is below 2x the first's. Exit 1 when a process's RSS or fds grow (a
leak), 0 otherwise; 77 without etcd.
"""
import argparse
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import coord_harness as ch  # noqa: E402
import soak_rule  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D, NBASE, POOL = 16, 2000, 2000


def proc_sample(pid):
    """(RSS in MiB, open fds) of pid, (None, None) when it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            rss = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024.0
        return rss, len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, StopIteration):
        return None, None


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


class Load:
    def __init__(self, cl, tp, seconds):
        self.cl, self.tp = cl, tp
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.q, self.w, self.errs = [], [], 0
        self.leader = 0

    def take(self):
        with self.lock:
            q, w, e = self.q, self.w, self.errs
            self.q, self.w, self.errs = [], [], 0
        return q, w, e

    def querier(self, i):
        rng = random.Random(i)
        grpc = sh_grpc()
        while not self.stop.is_set():
            c = self.cl.coords[rng.randint(0, 1)]
            v = [rng.gauss(0, 1) for _ in range(D)]
            t0 = time.time()
            try:
                c.stub.FindNeighbors(self.tp.FindNeighborsRequest(
                    queries=[ch.query(self.tp, v, 10)]), timeout=10)
                with self.lock:
                    self.q.append(time.time() - t0)
            except grpc.RpcError:
                with self.lock:
                    self.errs += 1

    def writer(self):
        rng = random.Random(99)
        grpc = sh_grpc()
        while not self.stop.is_set():
            c = self.cl.coords[self.leader]
            t0 = time.time()
            try:
                if rng.random() < 0.75:
                    dps = []
                    for _ in range(rng.randint(1, 8)):
                        dp = self.tp.IndexDatapoint(datapoint_id="s%05d" % rng.randrange(POOL))
                        dp.feature_vector.extend([rng.gauss(0, 1) for _ in range(D)])
                        dps.append(dp)
                    c.stub.UpsertDatapoints(self.tp.UpsertDatapointsRequest(datapoints=dps),
                                            timeout=10)
                else:
                    c.stub.RemoveDatapoints(self.tp.RemoveDatapointsRequest(
                        datapoint_ids=["s%05d" % rng.randrange(POOL)
                                       for _ in range(rng.randint(1, 4))]), timeout=10)
                with self.lock:
                    self.w.append(time.time() - t0)
            except grpc.RpcError as e:
                if "not the leader" in (e.details() or ""):
                    self.leader = 1 - self.leader
                with self.lock:
                    self.errs += 1
            time.sleep(max(0.0, 0.02 - (time.time() - t0)))


def sh_grpc():
    import grpc
    return grpc


def verdict(rows, names):
    n = len(rows)
    k = max(1, n // 4)
    first, last = rows[:k], rows[-k:]
    out, leak = [], False

    def mean(rs, f):
        xs = [f(r) for r in rs if f(r) is not None]
        return sum(xs) / len(xs) if xs else float("nan")

    out.append("  per process, first third -> last third after warm-up (soak_rule.py): "
               "min / max")
    for j, name in enumerate(names):
        r = soak_rule.rss_grows([row["rss"][j] for row in rows])
        f = soak_rule.fds_grow([row["fds"][j] for row in rows])
        leak |= r[4] or f[4]
        out.append("  %-9s RSS %6.1f -> %6.1f / %6.1f -> %6.1f MiB (%s)   fds %3.0f -> %3.0f / "
                   "%3.0f -> %3.0f (%s)" % (name, r[0], r[1], r[2], r[3],
                                            "GROWING" if r[4] else "flat", f[0], f[1], f[2],
                                            f[3], "GROWING" if f[4] else "flat"))
    p0, p1 = mean(first, lambda r: r["qp99"]), mean(last, lambda r: r["qp99"])
    out.append("  query p99 %.1f -> %.1f ms (%s)" % (p0, p1, "steady" if p1 < 2 * p0
                                                     else "NOT steady"))
    w0, w1 = mean(first, lambda r: r["wp99"]), mean(last, lambda r: r["wp99"])
    out.append("  write p99 %.1f -> %.1f ms (%s)" % (w0, w1, "steady" if w1 < 2 * w0
                                                     else "NOT steady"))
    out.append("verdict: %s" % ("NOT flat (a leak?)" if leak else "flat"))
    return "\n".join(out), leak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--etcd-compact", type=int, default=None,
                    help="the coordinators' --etcd-compact S (default: theirs, 300)")
    ap.add_argument("--fold", type=int, default=None,
                    help="config stream_fold_records (default: the coordinator's, 100000)")
    args = ap.parse_args()
    eh.skip_without_etcd()
    rng = random.Random(1)
    root = sh.tmpdir("tsr-soak-")
    recs = [ch.dp_json("b%05d" % i, [rng.gauss(0, 1) for _ in range(D)]) for i in range(NBASE)]
    batch = ch.write_batch(os.path.join(root, "b0"), recs)
    config = {"nlist": 16, "pq_m": 4, "nprobe": 8}
    if args.fold is not None:
        config["stream_fold_records"] = args.fold
    extra = () if args.etcd_compact is None else ("--etcd-compact", str(args.etcd_compact))
    print("soak: --etcd-compact %s, stream_fold_records %s" % (
        "default" if args.etcd_compact is None else args.etcd_compact,
        "default" if args.fold is None else args.fold))
    cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=5, config=config,
                      coord_extra=extra)
    try:
        tp = ch.stubs()[0]
        leader = cl.leader(timeout=30)
        op = leader.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        cl.wait_version(1, 30)
        procs = [("coord%d" % c.i, c.proc.proc.pid) for c in cl.coords]
        procs += [("shard%d/%d" % (g, r), s.proc.pid) for g, grp in enumerate(cl.groups)
                  for r, s in enumerate(grp)]
        procs += [("etcd%d" % i, p.pid) for i, p in enumerate(cl.etcd.procs)]
        names = [n for n, _ in procs]
        load = Load(cl, tp, args.seconds)
        load.leader = cl.coords.index(leader)
        threads = [threading.Thread(target=load.querier, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=load.writer))
        for t in threads:
            t.start()
        interval = max(5.0, args.seconds / 24.0)
        rows = []
        print("soak: %.0f s, a row every %.0f s; RSS MiB / open fds per process" %
              (args.seconds, interval))
        print("%6s %6s %7s %7s %6s %7s %4s  %s" % ("t(s)", "q/s", "q p50", "q p99", "w/s",
                                                   "w p99", "err", "  ".join(
                                                       "%-11s" % n for n in names)))
        t0 = time.time()
        try:
            while time.time() - t0 < args.seconds:
                time.sleep(interval)
                q, w, e = load.take()
                samp = [proc_sample(pid) for _, pid in procs]
                row = {"t": time.time() - t0, "qps": len(q) / interval,
                       "qp50": pct(q, 50) * 1000, "qp99": pct(q, 99) * 1000,
                       "wps": len(w) / interval, "wp99": pct(w, 99) * 1000, "err": e,
                       "rss": [s[0] for s in samp], "fds": [s[1] for s in samp]}
                rows.append(row)
                print("%6.0f %6.0f %7.2f %7.2f %6.1f %7.2f %4d  %s" % (
                    row["t"], row["qps"], row["qp50"], row["qp99"], row["wps"], row["wp99"],
                    e, "  ".join("%5.1f/%-5s" % (s[0] or 0, s[1] or 0) for s in samp)),
                    flush=True)
        finally:
            load.stop.set()
            for t in threads:
                t.join(30)
        text, leak = verdict(rows, names)
        print(text)
        return 1 if leak else 0
    finally:
        cl.stop()


if __name__ == "__main__":
    sys.exit(main())
