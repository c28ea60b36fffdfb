"""Shard replicas (issue 7): 2 shard groups x R = 2 replicas on loopback.

1. A bounded, self-stopping FindNeighbors load (python grpcio thread pool, every query
   probes every list so it needs both groups); kill -9 of one replica mid-load. Asserts:
   no query fails and none hangs (the calls in flight to the victim at that instant are
   retried on its sibling within their deadline), every answer equals the answer taken
   before the kill, and the coordinator counted failovers (/metrics).
2. The victim restarts on its address; reconcile sees it (tessera_shard_up 1) and it holds
   the coordinator's version; then its sibling is killed under load: still no failure
   (so the restarted replica answers). A SIGSTOPped (hung) replica under load: no failure
   either, every answer within the deadline (per-attempt deadline, then the sibling).
3. With both back, an UpdateIndex adds new ids: it commits on every replica — each
   replica's Stats names the new version, the replicas of a group hold the same vectors,
   and a Shard.Read at the new version on each replica finds the same new labels as its
   sibling (the groups together all of them). A wiped replica restarted empty is re-seeded
   from its sibling by reconcile and answers identically. Then a replica killed before an update makes
   the update FAIL naming it (a version is only the group's when all replicas have it).
Counts answered/failed/hung are printed at the end.
"""
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 3000
DEADLINE_S = 3.0        # client deadline of each query
SEARCH_MS = 2000        # search_deadline_ms (the coordinator's per-query shard deadline)
# Sanitizer binaries (ThreadSanitizer: 5-15x slower) on a loaded machine overrun a 1 s
# first attempt, leaving no time for the failover: scale both deadlines with them.
if "san-" in os.path.basename(os.path.dirname(os.path.abspath(ch.BIN))):
    DEADLINE_S, SEARCH_MS = DEADLINE_S * 4, SEARCH_MS * 4


def start_coord(cl, port, mport):
    """The coordinator on a fixed port (restarts keep it) with its metrics endpoint."""
    cl.start(listen_port=port, extra_args=["--metrics-listen", "127.0.0.1:%d" % mport])


def metrics(mport):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        return r.read().decode()


def metric(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    tot, seen = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            tot += float(m.group(4))
            seen = True
    return tot if seen else None


restart_shard = sh.restart  # same data dir and address, after a kill


class Load:
    """Threads sending one-query FindNeighbors requests until stopped."""

    def __init__(self, cl, tp, xs, expect, threads=4):
        self.cl, self.tp, self.xs, self.expect = cl, tp, xs, expect
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.inflight = 0
        self.answered = self.failed = self.hung = self.wrong = 0
        self.errors = []
        self.slowest = 0.0
        self.pool = cf.ThreadPoolExecutor(threads)
        self.futs = [self.pool.submit(self.run, t) for t in range(threads)]

    def run(self, t):
        import grpc
        i = t
        while not self.stop.is_set():
            q = i % len(self.xs)
            i += 7
            rq = self.tp.FindNeighborsRequest(queries=[ch.query(self.tp, self.xs[q], 10,
                                                                fraction=1.0)])
            with self.lock:
                self.inflight += 1
            t0 = time.time()
            try:
                r = self.cl.stub.FindNeighbors(rq, timeout=DEADLINE_S)
                ok, err = True, None
            except grpc.RpcError as e:
                ok, err = False, "%s: %s" % (e.code(), e.details())
            dt = time.time() - t0
            with self.lock:
                self.inflight -= 1
                self.slowest = max(self.slowest, dt)
                if dt > DEADLINE_S + 2.0:
                    self.hung += 1
                elif not ok:
                    self.failed += 1
                    self.errors.append(err)
                else:
                    self.answered += 1
                    got = [(n.datapoint.datapoint_id, round(n.distance, 3))
                           for n in r.nearest_neighbors[0].neighbors]
                    if got != self.expect[q]:
                        self.wrong += 1
                        self.errors.append("query %d: %s != %s" % (q, got, self.expect[q]))

    def finish(self):
        self.stop.set()
        for f in self.futs:
            f.result(60)
        self.pool.shutdown()


def answers(cl, tp, xs):
    out = []
    for x in xs:
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, x, 10,
                                                                            fraction=1.0)]),
                                  timeout=10)
        out.append([(n.datapoint.datapoint_id, round(n.distance, 3))
                    for n in r.nearest_neighbors[0].neighbors])
    return out


def wait_for(what, fn, timeout=20):
    t0 = time.time()
    while True:
        v = fn()
        if v:
            return time.time() - t0
        if time.time() - t0 > timeout:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.1)


def under_load(cl, tp, xs, expect, victim, before=1.5, after=2.0):
    load = Load(cl, tp, xs, expect)
    time.sleep(before)
    with load.lock:
        at_kill = load.inflight
    victim.kill()
    time.sleep(after)
    load.finish()
    return load, at_kill


def bad_configs(root):
    """Replica lists the config must refuse, naming the problem (exit 2)."""
    cases = [([["127.0.0.1:1", "127.0.0.1:1"]], "listed twice"),
             (["127.0.0.1:1", ["127.0.0.1:2", "127.0.0.1:1"]], "also a replica of shards[0]"),
             ([{"replicas": []}], "non-empty array"),
             ([["127.0.0.1:%d" % (10 + i) for i in range(17)]], "at most 16"),
             ([{"replicas": ["127.0.0.1:1"], "x": 1}], "unknown key"),
             ([["127.0.0.1:1", 5]], "replicas[1]"),
             # a 1000-byte address used to smash the coordinator's stack (metrics label
             # buffer) on the first reconcile pass; a comma would split the metrics labels
             (["a" * 1000 + ":1"], "longer than 255"),
             (["127.0.0.1:1,127.0.0.1:2"], "bad character at byte 11")]
    for shards, want in cases:
        path = os.path.join(root, "bad.json")
        with open(path, "w") as f:
            json.dump({"dimensions": 16, "shards": shards}, f)
        r = subprocess.run([os.path.join(ch.BIN, "tessera-coordinator"), "--listen",
                            "127.0.0.1:0", "--data", os.path.join(root, "bad-data"), "--config",
                            path], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and want in r.stderr, (shards, r.returncode, r.stderr)
    print("config: %d bad replica lists refused with a message" % len(cases))


def removed_group(cl):
    """A config that drops a shard group the stored version uses is refused at start
    (before: the coordinator started, and the next update indexed its per-group arrays
    with the dropped group's number)."""
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = c["shards"][:1]
    path = os.path.join(cl.root, "one-group.json")
    with open(path, "w") as f:
        json.dump(c, f)
    r = subprocess.run([os.path.join(ch.BIN, "tessera-coordinator"), "--listen",
                        "127.0.0.1:0", "--data", os.path.join(cl.root, "coordinator"),
                        "--config", path], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "may not be removed" in r.stderr, (r.returncode, r.stderr)
    print("config without a group the stored version uses: refused (%s)" %
          r.stderr.strip().splitlines()[-1][-100:])


def main():
    tp, _, sp, _ = ch.stubs()
    rng = np.random.default_rng(17)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-replicas-")
    bad_configs(root)
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("r%05d" % i, x[i])
                                                   for i in range(N)])
    cfg = {"nlist": 16, "pq_m": 4, "nprobe": 4, "search_deadline_ms": SEARCH_MS}
    cl = ch.Cluster(4, D, cfg)
    cl.stop_coord()
    # 2 groups x 2 replicas: [[s0, s1], [s2, s3]]
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = [[cl.shards[0].target, cl.shards[1].target],
                   {"replicas": [cl.shards[2].target, cl.shards[3].target]}]
    with open(cl.config, "w") as f:
        json.dump(c, f)
    port, mport = ch.free_port(), ch.free_port()
    start_coord(cl, port, mport)
    totals = {"answered": 0, "failed": 0, "hung": 0}
    try:
        op = cl.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        assert op.progress.shards_total == 2 and op.progress.shards_committed == 2, op
        st = cl.stats()
        assert len(st.shards) == 2 and all(s.available and s.version == 1 for s in st.shards), st
        for s in cl.shards:
            ss = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            assert ss.current_version == 1, (s.target, ss)
        g0 = [s.stub.Stats(sp.ShardStatsRequest(), timeout=10).vectors_count
              for s in cl.shards]
        assert g0[0] == g0[1] and g0[2] == g0[3] and g0[0] + g0[2] == N, g0
        xs = x[rng.choice(N, 64, replace=False)] + rng.normal(size=(64, D)).astype("float32") * .1
        expect = answers(cl, tp, xs)

        # 1. kill -9 one replica of group 0 under load
        victim = cl.shards[1]
        load, at_kill = under_load(cl, tp, xs, expect, victim)
        for k in totals:
            totals[k] += getattr(load, k)
        m = metrics(mport)
        fo = metric(m, "tessera_shard_failovers_total") or 0
        up = metric(m, "tessera_shard_up", address=victim.target)
        print("kill -9 of replica %s under load: %d in flight at the kill, answered %d, "
              "failed %d, hung %d, wrong %d, slowest %.3fs, failovers %d" %
              (victim.target, at_kill, load.answered, load.failed, load.hung, load.wrong,
               load.slowest, fo))
        assert load.failed == 0 and load.hung == 0 and load.wrong == 0, load.errors[:5]
        assert load.answered > 20, load.answered
        assert load.slowest < SEARCH_MS / 1000.0 + 0.5, load.slowest
        assert up == 0, (up, m)
        assert fo >= 1, "no failover counted:\n" + m
        assert "marked down" in cl.coord.text(), cl.coord.text()

        # 2. restart it on its address; reconcile sees it; then kill its sibling under load
        cl.shards[1] = victim = restart_shard(victim)
        took = wait_for("the restarted replica to be up", lambda: metric(
            metrics(mport), "tessera_shard_up", address=victim.target) == 1)
        ss = victim.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert ss.current_version == 1 and ss.vectors_count == g0[1], ss
        m = metrics(mport)
        assert metric(m, "tessera_shard_version", address=victim.target) == 1, m
        print("restarted replica up again after %.2fs at version %d" % (took, ss.current_version))
        sib = cl.shards[0]
        load, at_kill = under_load(cl, tp, xs, expect, sib, before=1.0, after=1.5)
        for k in totals:
            totals[k] += getattr(load, k)
        print("kill -9 of its sibling %s: %d in flight, answered %d, failed %d, hung %d, "
              "wrong %d" % (sib.target, at_kill, load.answered, load.failed, load.hung,
                            load.wrong))
        assert load.failed == 0 and load.hung == 0 and load.wrong == 0, load.errors[:5]
        cl.shards[0] = restart_shard(sib)
        wait_for("the sibling to be up", lambda: metric(
            metrics(mport), "tessera_shard_up", address=cl.shards[0].target) == 1)

        # 2b. SIGSTOP (hung, not dead: the connection stays up) of a replica of group 1:
        # its attempts hit the per-attempt deadline (half the query's) and are retried on
        # the sibling, so queries still answer within their deadline
        hung = cl.shards[2]
        load = Load(cl, tp, xs, expect)
        time.sleep(0.5)
        hung.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3.0)
        finally:
            hung.proc.send_signal(signal.SIGCONT)
        load.finish()
        for k in totals:
            totals[k] += getattr(load, k)
        print("SIGSTOP of replica %s for 3 s under load: answered %d, failed %d, hung %d, "
              "wrong %d, slowest %.3fs" % (hung.target, load.answered, load.failed, load.hung,
                                           load.wrong, load.slowest))
        assert load.failed == 0 and load.hung == 0 and load.wrong == 0, load.errors[:5]
        assert load.slowest < DEADLINE_S, load.slowest
        wait_for("the stopped replica up again", lambda: metric(
            metrics(mport), "tessera_shard_up", address=hung.target) == 1)

        # 3. an update commits on every replica
        newids = ["n%04d" % i for i in range(200)]
        xn = rng.normal(size=(200, D)).astype("float32") * 2
        b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json(newids[i], xn[i])
                                                       for i in range(200)])
        op = cl.update(b1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        assert op.progress.shards_committed == 2, op
        vec = []
        found = []
        labels = list(range(N, N + 200))  # new ids get the next labels, in id order
        for s in cl.shards:
            ss = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            assert ss.current_version == 2, (s.target, ss)
            vec.append(ss.vectors_count)
            rd = s.stub.Read(sp.ShardReadRequest(version=2, labels=labels), timeout=10)
            found.append({d.datapoint.datapoint_id for d in rd.datapoints if d.found})
        assert vec[0] == vec[1] and vec[2] == vec[3] and vec[0] + vec[2] == N + 200, vec
        assert found[0] == found[1] and found[2] == found[3], found
        assert found[0] | found[2] == set(newids) and not found[0] & found[2], found
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, xn[5], 1)]),
                                  timeout=10)
        assert r.version == 2 and \
            r.nearest_neighbors[0].neighbors[0].datapoint.datapoint_id == newids[5], r
        print("update with R=2: version 2 on every replica, vectors per replica %s, new ids "
              "per group %d + %d" % (vec, len(found[0]), len(found[2])))

        expect = answers(cl, tp, xs)  # at version 2, every replica up

        # a wiped replica (replaced disk) comes back empty: reconcile re-seeds it from its
        # sibling at the served version
        wiped = cl.shards[3]
        wiped.stop()
        shutil.rmtree(wiped.data)
        cl.shards[3] = wiped = restart_shard(wiped)
        took = wait_for("the wiped replica re-seeded", lambda: wiped.stub.Stats(
            sp.ShardStatsRequest(), timeout=10).current_version == 2, timeout=60)
        ss = wiped.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert ss.vectors_count == vec[2], (ss, vec)
        rd = wiped.stub.Read(sp.ShardReadRequest(version=2, labels=labels), timeout=10)
        assert {d.datapoint.datapoint_id for d in rd.datapoints if d.found} == found[2]
        sib_st = cl.shards[2].stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert list(ss.lists) == list(sib_st.lists) and \
            list(ss.list_sizes) == list(sib_st.list_sizes), (ss, sib_st)
        wait_for("the wiped replica up", lambda: metric(
            metrics(mport), "tessera_shard_up", address=wiped.target) == 1)
        # the log line is read from the coordinator's pipe by another thread: under a slow
        # (TSan) build it can trail the shard's own Stats, so wait for it
        wait_for("the re-seed logged", lambda: "re-seeded at version 2" in cl.coord.text(),
                 timeout=10)
        load, _ = under_load(cl, tp, xs, expect, cl.shards[2], before=0.2, after=1.5)
        for k in totals:
            totals[k] += getattr(load, k)
        assert load.failed == 0 and load.hung == 0, load.errors[:5]
        assert load.wrong == 0, load.errors[:5]  # the re-seeded copy answers the same
        print("wiped replica re-seeded from its sibling in %.2fs (%d vectors, lists %s); "
              "then its sibling killed: answered %d, failed %d" %
              (took, ss.vectors_count, len(ss.lists), load.answered, load.failed))
        cl.shards[2] = restart_shard(cl.shards[2])
        wait_for("group 1 up", lambda: metric(metrics(mport), "tessera_shard_replicas_up",
                                              shard=1) == 2)

        # a replica down: the update fails naming it, version 2 stays everywhere
        dead = cl.shards[3]
        dead.kill()
        b2 = ch.write_batch(os.path.join(root, "b2"), [ch.dp_json("late", xn[0])])
        op = cl.update(b2)
        assert op.state == tp.Operation.FAILED and dead.target in op.error, op
        for s in cl.shards[:3]:
            ss = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            assert ss.current_version == 2, (s.target, ss)
        assert cl.stats().version == 2
        m = metrics(mport)
        assert (metric(m, "tessera_update_errors_total", type="EUNAVAILABLE") or 0) >= 1, m
        print("update with a replica down: FAILED (%s)" % op.error[:120])
        cl.shards[3] = restart_shard(dead)
    finally:
        cl.stop()
    removed_group(cl)
    print("answered %d, failed %d, hung %d" % (totals["answered"], totals["failed"],
                                               totals["hung"]))
    print("test_coord_replicas: OK")


if __name__ == "__main__":
    main()
