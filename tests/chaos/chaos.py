#!/usr/bin/python3
"""chaos — a seeded random fault schedule against a whole HA cluster, every operation
recorded, then the history checker (check.py). `make chaos SECONDS=N SEED=S`.

The cluster (docs/reliability.md "Chaos"): simulated hosts on one bridge (netns.py), one
process per host: etcd x3 (hosts 0-2), 2 shard groups x 2 replicas (hosts 3-6),
2 coordinators with --etcd, lease TTL 2 s (hosts 7, 8), and this driver (host 9: it
enters that namespace itself before gRPC starts a thread). Shard 0/0's and coordinator 0's
data folders are small tmpfs mounts (the "disk" fault fills them); the coordinators run
under tests/shim/clockstep.c (the "clock" fault steps their wall clock).

The schedule comes from random.Random(SEED) alone and is printed before the run (the same
seed gives the same schedule; the timing of the workload around it varies). One fault at a
time, each healed before the next: kill (kill -9, restart after the fault's duration), stop
(SIGSTOP ... SIGCONT), cut (the host's link down ... up: packets dropped, no reset), disk
(the tmpfs filled ... emptied), clock (the wall clock stepped by +-30 s .. +-1 h ... back).

While it runs: 2 query threads (FindNeighbors, full probe, via a random coordinator, retried
once on the other), 2 writers (UpsertDatapoints / RemoveDatapoints of their own ids, sent to
the coordinator they believe leads), 1 batch thread (UpdateIndex every few seconds: new
ids, new values of base ids, deletes; or, 4 times in 10, a fold of the streamed writes,
UpdateIndex with fold_stream, which lets the writers' rounds through its Prepare and
carries them: docs/ha.md "Folds with --etcd"). Every call is one JSON line of the history (start,
end, outcome ok / err / unknown, what it wrote or what it got). Then everything is healed,
the final contents are read on both coordinators, and check.py judges the history; exit 1
on any violation (2: the cluster could not be set up or healed). Exit 77 without root or
etcd.
"""
import argparse
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import check  # noqa: E402
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import netns  # noqa: E402
import shard_harness as sh  # noqa: E402

D, NBASE, TTL = 8, 600, 2
ETCD_HOSTS, SHARD_HOSTS, COORD_HOSTS, CLIENT = (0, 1, 2), ((3, 4), (5, 6)), (7, 8), 9
TMPFS_MB = 48
IDS_PER_WRITER = 80
PREFIX = "/tessera/chaos"


def enter_netns(name):
    """Moves this (still single-threaded) process into namespace `name`; threads made
    afterwards (gRPC's included) inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/var/run/netns/" + name, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns " + name)
    finally:
        os.close(fd)


def schedule(seed, seconds, nodes):
    """The fault schedule: [(t, kind, target, duration, arg)], from the seed alone."""
    rng = random.Random(seed)
    kinds = [("kill", 4), ("stop", 3), ("cut", 3), ("disk", 1), ("clock", 1)]
    targets = {"kill": nodes, "stop": nodes, "cut": nodes, "disk": ["shard0/0", "coord0"],
               "clock": ["coord0", "coord1"]}
    out, t = [], 4.0
    while True:
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        target = rng.choice(targets[kind])
        dur = round(rng.uniform(0.5, 4.0), 1)
        arg = rng.choice((-1, 1)) * rng.choice((30, 600, 3600)) if kind == "clock" else 0
        if t + dur > seconds - 3:
            break
        out.append((round(t, 1), kind, target, dur, arg))
        t += dur + rng.uniform(1.0, 4.0)
    return out


class Node:
    def __init__(self, run, name, host, argv, env=None):
        self.run, self.name, self.host, self.argv, self.env = run, name, host, argv, env
        self.log = os.path.join(run.root, name.replace("/", "-") + ".log")
        self.proc = None
        self.stopped = False

    def start(self):
        e = dict(os.environ)
        e.update(self.env or {})
        with open(self.log, "a") as f:
            self.proc = self.run.net.popen(self.host, sh.test_argv(self.argv, self.env),
                                           stdout=f, stderr=f, env=e)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill(self):
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(20)

    def terminate(self):
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class Run:
    def __init__(self, args):
        self.args = args
        self.root = sh.tmpdir("tsr-chaos-")
        os.chmod(self.root, 0o755)
        self.net = netns.Net(10)
        self.nodes = {}
        self.mounts = []
        self.hist = open(args.history, "w")
        self.hlock = threading.Lock()
        self.t0 = time.time()
        self.stop_ev = threading.Event()
        self.leader_guess = 0
        self.recent = []  # (id, vector) of recent writes: the queries aim at them
        self.rlock = threading.Lock()

    # -- history ---------------------------------------------------------------------------
    def record(self, rec):
        with self.hlock:
            self.hist.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def now(self):
        return time.time() - self.t0

    # -- the cluster -------------------------------------------------------------------------
    def addr(self, host, port):
        return "%s:%d" % (self.net.addr(host), port)

    def setup(self):
        A = self.net.addr
        tmpfs = [os.path.join(self.root, "shard0-0"), os.path.join(self.root, "coord0")]
        for d in tmpfs:
            os.makedirs(d)
            subprocess.check_call(["mount", "-t", "tmpfs", "-o", "size=%dm" % TMPFS_MB,
                                   "tsr-chaos", d])
            self.mounts.append(d)
        cluster = ",".join("e%d=http://%s:2380" % (i, A(h)) for i, h in enumerate(ETCD_HOSTS))
        self.endpoints = ",".join("%s:2379" % A(h) for h in ETCD_HOSTS)
        for i, h in enumerate(ETCD_HOSTS):
            self.nodes["etcd%d" % i] = Node(self, "etcd%d" % i, h, [
                eh.etcd_bin(), "--name", "e%d" % i, "--data-dir",
                os.path.join(self.root, "etcd%d" % i),
                "--listen-client-urls", "http://%s:2379" % A(h),
                "--advertise-client-urls", "http://%s:2379" % A(h),
                "--listen-peer-urls", "http://%s:2380" % A(h),
                "--initial-advertise-peer-urls", "http://%s:2380" % A(h),
                "--initial-cluster", cluster, "--heartbeat-interval", "50",
                "--election-timeout", "500"])
        groups = []
        for g, hosts in enumerate(SHARD_HOSTS):
            grp = []
            for r, h in enumerate(hosts):
                name = "shard%d/%d" % (g, r)
                self.nodes[name] = Node(self, name, h, [
                    os.path.join(ch.BIN, "tessera-shard"), "--listen", self.addr(h, 7001),
                    "--data", os.path.join(self.root, "shard%d-%d" % (g, r)),
                    "--insecure-no-auth"])
                grp.append(self.addr(h, 7001))
            groups.append(grp)
        self.config = os.path.join(self.root, "coordinator.json")
        with open(self.config, "w") as f:
            json.dump({"dimensions": D, "nlist": 8, "pq_m": 4, "nprobe": 8,
                       "shards": groups}, f)
        shim = os.path.join(os.environ.get("TSR_BUILD", "build/release"), "tests",
                            "clockstep.so")
        self.coord_targets = []
        for i, h in enumerate(COORD_HOSTS):
            clock = os.path.join(self.root, "clock%d" % i)
            with open(clock, "w") as f:
                f.write("0\n")
            env = {"LD_PRELOAD": os.path.abspath(shim), "TSR_CLOCKSTEP_FILE": clock}
            if self.args.plant:
                env["TSR_COORD_CRASH_AT"] = self.args.plant
            self.nodes["coord%d" % i] = Node(self, "coord%d" % i, h, [
                os.path.join(ch.BIN, "tessera-coordinator"), "--listen", self.addr(h, 7000),
                "--data", os.path.join(self.root, "coord%d" % i), "--config", self.config,
                "--etcd", self.endpoints, "--etcd-prefix", PREFIX, "--etcd-ttl", str(TTL),
                "--advertise", self.addr(h, 7000), "--insecure-no-auth",
                "--batch-root-allow", self.root], env)
            self.coord_targets.append(self.addr(h, 7000))
        for name in sorted(self.nodes, key=lambda n: not n.startswith("etcd")):
            self.nodes[name].start()
            if name == "etcd2":
                self.wait_etcd()

    def wait_etcd(self, timeout=30):
        import urllib.request
        t_end = time.time() + timeout
        while time.time() < t_end:
            try:
                for h in ETCD_HOSTS:
                    with urllib.request.urlopen("http://%s:2379/health" % self.net.addr(h),
                                                timeout=1) as r:
                        assert json.loads(r.read().decode()).get("health") == "true"
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("etcd not healthy after %ds" % timeout)

    def teardown(self):
        for n in self.nodes.values():
            try:
                n.terminate()
            except Exception:
                n.kill()
        keep = os.path.join(os.path.dirname(os.path.abspath(self.args.history)),
                            "logs-%d" % self.args.seed)
        shutil.rmtree(keep, ignore_errors=True)
        os.makedirs(keep)
        for n in self.nodes.values():
            if os.path.exists(n.log):
                shutil.copy(n.log, keep)
        self.net.teardown()
        for d in self.mounts:
            subprocess.run(["umount", "-l", d], capture_output=True)

    def connect(self):
        import grpc
        self.grpc = grpc
        self.tp, tpg, _, _ = ch.stubs()
        self.chans = [grpc.insecure_channel(t) for t in self.coord_targets]
        self.stubs = [tpg.VectorSearchStub(c) for c in self.chans]

    # -- the workload ------------------------------------------------------------------------
    def vec(self, rng):
        return [rng.randint(-64, 64) / 8.0 for _ in range(D)]

    def dp(self, did, val):
        dp = self.tp.IndexDatapoint(datapoint_id=did)
        dp.feature_vector.extend(val[0])
        dp.restricts.add(namespace="color", allow_list=[val[1]])
        return dp

    def outcome(self, e):
        code = e.code().name
        msg = (e.details() or "")[:200]
        if code in check.DEFINITE or "not the leader" in msg:
            return "err", code + ": " + msg
        return "unknown", code + ": " + msg

    def writer(self, w):
        rng = random.Random(self.args.seed * 1000 + w)
        ids = ["w%d-%03d" % (w, i) for i in range(IDS_PER_WRITER)]
        n = 0
        while not self.stop_ev.is_set():
            n += 1
            c = self.leader_guess
            rec = {"type": "op", "op": None, "writer": w, "n": n, "coord": c}
            if rng.random() < 0.7:
                vals = {did: [self.vec(rng), rng.choice("rgb")]
                        for did in rng.sample(ids, rng.randint(1, 4))}
                rec.update(op="upsert", dps=vals)
                rq = self.tp.UpsertDatapointsRequest(
                    datapoints=[self.dp(k, v) for k, v in vals.items()])
                call = self.stubs[c].UpsertDatapoints
            else:
                gone = rng.sample(ids, rng.randint(1, 3))
                rec.update(op="remove", ids=gone)
                rq = self.tp.RemoveDatapointsRequest(datapoint_ids=gone)
                call = self.stubs[c].RemoveDatapoints
            rec["start"] = self.now()
            try:
                r = call(rq, timeout=5)
                rec.update(outcome="ok", version=r.version, seq=r.stream_seq)
            except self.grpc.RpcError as e:
                rec["outcome"], rec["code"] = self.outcome(e)
                if "not the leader" in rec["code"] or e.code().name in (
                        "UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    self.leader_guess = 1 - c
                    time.sleep(0.05)
            rec["end"] = self.now()
            self.record(rec)
            if rec["op"] == "upsert":
                with self.rlock:
                    self.recent = (self.recent + [(k, v[0]) for k, v in
                                                  rec["dps"].items()])[-50:]
            time.sleep(rng.uniform(0, 0.03))

    def querier(self, q):
        rng = random.Random(self.args.seed * 1000 + 100 + q)
        while not self.stop_ev.is_set():
            with self.rlock:
                aim = rng.choice(self.recent) if self.recent and rng.random() < 0.7 else None
            v = aim[1] if aim else self.vec(rng)
            rq = self.tp.FindNeighborsRequest(queries=[ch.query(self.tp, v, 4, fraction=1.0)])
            first = rng.randint(0, 1)
            rec = {"type": "op", "op": "query", "q": q, "aim": aim[0] if aim else None}
            if aim:
                rec["aimv"] = v  # the checker's "served" rule compares it with the writes
            for c in (first, 1 - first):
                rec.update(coord=c, start=self.now())
                try:
                    r = self.stubs[c].FindNeighbors(rq, timeout=5)
                    rec.update(outcome="ok", version=r.version,
                               ids=[n.datapoint.datapoint_id
                                    for n in r.nearest_neighbors[0].neighbors])
                    rec.pop("code", None)
                    break
                except self.grpc.RpcError as e:
                    rec["outcome"], rec["code"] = self.outcome(e)
            rec["end"] = self.now()
            self.record(rec)
            time.sleep(rng.uniform(0, 0.02))

    def batches(self):
        rng = random.Random(self.args.seed * 1000 + 200)
        k = 0
        while not self.stop_ev.wait(rng.uniform(3.0, 8.0)):
            k += 1
            if rng.random() < 0.4:  # a fold: no records; the streamed writes go through it
                self.update(None, {"type": "op", "op": "batch", "k": k, "fold": True,
                                   "dps": {}, "ids": []})
                continue
            vals = {"b%d-%02d" % (k, i): [self.vec(rng), rng.choice("rgb")] for i in range(20)}
            base = rng.sample(range(NBASE), 15)
            for i in base[:10]:
                vals["base-%04d" % i] = [self.vec(rng), rng.choice("rgb")]
            dels = ["base-%04d" % i for i in base[10:]]
            root = ch.write_batch(os.path.join(self.root, "batch-%d" % k),
                                  [ch.dp_json(d, v[0], restricts=[("color", [v[1]], [])])
                                   for d, v in vals.items()], deletes=dels)
            self.update(root, {"type": "op", "op": "batch", "k": k, "dps": vals,
                               "ids": dels})

    def update(self, root, rec):
        """UpdateIndex on the leader (tries both), then GetOperation on either until done."""
        rec["start"] = self.now()
        op_id = None
        for c in (self.leader_guess, 1 - self.leader_guess):
            try:
                rq = (self.tp.UpdateIndexRequest(batch_root=root) if root else
                      self.tp.UpdateIndexRequest(fold_stream=True))
                op_id = self.stubs[c].UpdateIndex(rq, timeout=10).operation_id
                rec["coord"] = c
                break
            except self.grpc.RpcError as e:
                rec["outcome"], rec["code"] = self.outcome(e)
        if op_id is not None:
            rec["outcome"], rec["code"] = "unknown", "no final state within 60 s"
            t_end = time.time() + 60
            while time.time() < t_end:
                try:
                    op = self.stubs[rec["coord"] if time.time() % 2 < 1 else
                                    1 - rec["coord"]].GetOperation(
                        self.tp.GetOperationRequest(operation_id=op_id), timeout=5)
                except self.grpc.RpcError:
                    time.sleep(0.2)
                    continue
                if op.state == self.tp.Operation.SUCCEEDED:
                    rec.update(outcome="ok", version=op.version, code="")
                    break
                if op.state in (self.tp.Operation.FAILED, self.tp.Operation.REJECTED):
                    rec.update(outcome="err", code="%s: %s" % (
                        self.tp.Operation.State.Name(op.state), op.error[:200]))
                    break
                time.sleep(0.1)
        rec["end"] = self.now()
        self.record(rec)
        return rec

    # -- faults ------------------------------------------------------------------------------
    def fill(self, target, on):
        d = self.mounts[0] if target.startswith("shard") else self.mounts[1]
        path = os.path.join(d, "chaos-fill")
        if not on:
            if os.path.exists(path):
                os.unlink(path)
            return
        with open(path, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass

    def clock(self, target, offset_s):
        with open(os.path.join(self.root, "clock%s" % target[-1]), "w") as f:
            f.write("%d\n" % (offset_s * 1000))

    def fault(self, kind, target, dur, arg):
        node = self.nodes[target]
        rec = {"type": "fault", "kind": kind, "target": target, "dur": dur, "arg": arg,
               "start": self.now()}
        if kind == "kill":
            node.kill()
            time.sleep(dur)
            node.start()
        elif kind == "stop":
            node.signal(signal.SIGSTOP)
            time.sleep(dur)
            node.signal(signal.SIGCONT)
        elif kind == "cut":
            self.net.cut(node.host)
            time.sleep(dur)
            self.net.heal(node.host)
        elif kind == "disk":
            self.fill(target, True)
            time.sleep(dur)
            self.fill(target, False)
        elif kind == "clock":
            self.clock(target, arg)
            time.sleep(dur)
            self.clock(target, 0)
        rec["end"] = self.now()
        self.record(rec)

    def heal_all(self):
        for i in range(self.net.n):
            self.net.heal(i)
        for t in ("shard0/0", "coord0"):
            self.fill(t, False)
        for t in ("coord0", "coord1"):
            self.clock(t, 0)
        for n in self.nodes.values():
            n.signal(signal.SIGCONT)
            if not n.alive():
                n.start()

    # -- set-up and the end ------------------------------------------------------------------
    def first_update(self):
        rng = random.Random(self.args.seed)
        vals = {"base-%04d" % i: [self.vec(rng), rng.choice("rgb")] for i in range(NBASE)}
        root = ch.write_batch(os.path.join(self.root, "batch-0"),
                              [ch.dp_json(d, v[0], restricts=[("color", [v[1]], [])])
                               for d, v in vals.items()])
        t_end = time.time() + 60
        while time.time() < t_end:
            rec = self.update(root, {"type": "op", "op": "batch", "k": 0, "dps": vals,
                                     "ids": []})
            if rec["outcome"] == "ok":
                return rec
            self.leader_guess = 1 - self.leader_guess
            time.sleep(0.5)
        raise RuntimeError("the first update did not succeed: %s" % rec)

    def read_final(self, ids):
        """Both coordinators' view of every id (ReadIndexDatapoints), once they agree and
        are stable (or after 60 s); recorded as "final" lines."""
        t_end = time.time() + 60
        last = None
        while True:
            views = []
            try:
                for c in (0, 1):
                    got = {}
                    for k in range(0, len(ids), 500):
                        r = self.stubs[c].ReadIndexDatapoints(
                            self.tp.ReadIndexDatapointsRequest(ids=ids[k:k + 500]), timeout=20)
                        for dp in r.datapoints:
                            allow = [a for rr in dp.restricts if rr.namespace == "color"
                                     for a in rr.allow_list]
                            got.setdefault(dp.datapoint_id, []).append(
                                [list(dp.feature_vector), allow[0] if allow else ""])
                    st = self.stubs[c].GetIndexStats(self.tp.GetIndexStatsRequest(), timeout=10)
                    views.append((got, st.vectors_count, st.version))
            except self.grpc.RpcError as e:
                views = None
                err = e
            if views and views[0] == views[1] and views == last:
                break
            last = views
            if time.time() > t_end:
                if views is None:
                    raise RuntimeError("final read failed: %s" % err)
                break
            time.sleep(1.0)
        for c, (got, count, version) in enumerate(views):
            self.record({"type": "final", "coord": c, "state": got, "count": count,
                         "version": version, "t": self.now()})

    def wait_writable(self, timeout=60):
        t_end = time.time() + timeout
        while time.time() < t_end:
            for c in (0, 1):
                try:
                    r = self.stubs[c].RemoveDatapoints(
                        self.tp.RemoveDatapointsRequest(datapoint_ids=["never-used"]), timeout=5)
                    self.leader_guess = c
                    return r
                except self.grpc.RpcError:
                    pass
            time.sleep(0.3)
        raise RuntimeError("no coordinator takes writes %ds after healing" % timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--history", default=None, help="the history file (JSON lines; "
                    "default build/chaos/history-SEED.jsonl)")
    ap.add_argument("--plant", default="", help="a planted bug for the checker's own test: "
                    "TSR_COORD_CRASH_AT for the coordinators (plant-ack-unlogged)")
    ap.add_argument("--schedule-only", action="store_true", help="print the schedule, exit")
    args = ap.parse_args()
    nodes = ["etcd0", "etcd1", "etcd2", "shard0/0", "shard0/1", "shard1/0", "shard1/1",
             "coord0", "coord1"]
    sched = schedule(args.seed, args.seconds, nodes)
    print("chaos: seed %d, %.0f s, %d faults scheduled:" % (args.seed, args.seconds,
                                                           len(sched)))
    for t, kind, target, dur, arg in sched:
        print("  t=%6.1fs %-5s %-9s %4.1fs%s" % (t, kind, target, dur,
                                                 " %+ds" % arg if arg else ""))
    if args.schedule_only:
        return 0
    eh.skip_without_etcd()
    netns.skip_unless_available()
    if args.history is None:
        os.makedirs("build/chaos", exist_ok=True)
        args.history = "build/chaos/history-%d.jsonl" % args.seed
    run = Run(args)
    run.net.setup()
    run.record({"type": "meta", "seed": args.seed, "seconds": args.seconds,
                "plant": args.plant, "schedule": sched, "nbase": NBASE})
    try:
        enter_netns(run.net.ns(CLIENT))
        run.setup()
        run.connect()
        run.first_update()
        # One clock for the whole history (the base batch's times included: resetting it
        # here once made a batch of the first seconds look older than the base batch, a
        # false "order" violation); the schedule's times count from the workload's start.
        w0 = run.now()
        print("chaos: cluster up, base batch committed (%.1f s); running" % w0)
        threads = [threading.Thread(target=run.writer, args=(w,)) for w in range(2)]
        threads += [threading.Thread(target=run.querier, args=(q,)) for q in range(2)]
        threads.append(threading.Thread(target=run.batches))
        for t in threads:
            t.start()
        try:
            for t, kind, target, dur, arg in sched:
                delay = t + w0 - run.now()
                if delay > 0:
                    time.sleep(delay)
                run.fault(kind, target, dur, arg)
            time.sleep(max(0.0, args.seconds + w0 - run.now()))
        finally:
            run.stop_ev.set()
            for t in threads:
                t.join(90)
        run.heal_all()
        run.wait_writable()
        ids = ["base-%04d" % i for i in range(NBASE)]
        ids += ["w%d-%03d" % (w, i) for w in range(2) for i in range(IDS_PER_WRITER)]
        run.hist.flush()
        ids += sorted({d for d in read_ids(args.history) if d.startswith("b")})
        run.read_final(sorted(set(ids)))
    except RuntimeError as e:
        print("chaos: %s" % e)
        for n in run.nodes.values():
            print("--- %s (last lines)" % n.name)
            try:
                with open(n.log) as f:
                    print("".join(f.readlines()[-8:]))
            except OSError:
                pass
        return 2
    finally:
        run.hist.close()
        run.teardown()
    print("chaos: history in %s, the processes' logs in %s/logs-%d/"
          % (args.history, os.path.dirname(args.history), args.seed))
    return check.main([args.history])


def read_ids(path):
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("op") == "batch":
                yield from r.get("dps", {})


if __name__ == "__main__":
    sys.exit(main())
