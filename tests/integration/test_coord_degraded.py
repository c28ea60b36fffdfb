"""Degraded updates (`update_min_replicas`): 2 shard groups x R = 2 replicas on loopback.

1. With update_min_replicas 1 and one replica killed (kill -9), an update still commits:
   SUCCEEDED, GetOperation's `warnings` names exactly that replica as left out of the new
   version, queries during and after it never fail (a self-stopping 3-thread load), the
   new version's content is served (a new id found first, a deleted id gone), and the
   warnings survive a coordinator restart.
2. The killed replica restarts on its old version; reconcile re-seeds it from its sibling
   to the new version (Stats), with the same vector count; then its sibling is killed and
   the re-seeded replica alone answers exactly what the group answered before. A
   SIGSTOPped replica is left out the same way (its Stage times out); woken up, its staging
   leftover of the new version is aborted and it is re-seeded too.
3. A group with no replica left fails the update naming update_min_replicas and the group;
   the served version does not move.
The default (0 = every replica) failing an update is tested in test_coord_replicas.py.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_coord_replicas as tr  # noqa: E402  (restart_shard, start_coord, deadlines)

D = 16
N = 3000


def top_ids(cl, tp, xs, k=5):
    out = []
    for x in xs:
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, x, k, fraction=1.0)]), timeout=tr.DEADLINE_S)
        out.append([(n.datapoint.datapoint_id, round(n.distance, 3))
                    for n in r.nearest_neighbors[0].neighbors])
    return out


class Load:
    """Threads sending FindNeighbors (every list probed) until stopped; counts failures."""

    def __init__(self, cl, tp, xs, threads=3):
        import grpc
        self.answered = self.failed = 0
        self.errors = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

        def run(t):
            i = t
            while not self.stop.is_set():
                rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xs[i % len(xs)], 10,
                                                               fraction=1.0)])
                i += 1
                try:
                    cl.stub.FindNeighbors(rq, timeout=tr.DEADLINE_S)
                    ok, err = True, None
                except grpc.RpcError as e:
                    ok, err = False, "%s: %s" % (e.code(), e.details())
                with self.lock:
                    if ok:
                        self.answered += 1
                    else:
                        self.failed += 1
                        self.errors.append(err)

        self.threads = [threading.Thread(target=run, args=(t,), daemon=True)
                        for t in range(threads)]
        for th in self.threads:
            th.start()

    def finish(self):
        self.stop.set()
        for th in self.threads:
            th.join(30)


def wait_version(shard, want, timeout=30):
    _, _, sp, _ = ch.stubs()
    t0 = time.time()
    while True:
        try:
            st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=5)
            pending = [v for v in st.versions if v.state != sp.ShardVersion.SERVING]
            if st.current_version == want and not pending:
                return time.time() - t0, st
        except Exception:
            pass
        if time.time() - t0 > timeout:
            raise AssertionError("%s not on version %d after %ds" % (shard.target, want,
                                                                        timeout))
        time.sleep(0.1)


def main():
    tp, _, sp, _ = ch.stubs()
    rng = np.random.default_rng(21)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-degraded-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("r%05d" % i, x[i])
                                                   for i in range(N)])
    cfg = {"nlist": 16, "pq_m": 4, "nprobe": 4, "search_deadline_ms": tr.SEARCH_MS,
           "stage_deadline_ms": tr.SEARCH_MS * 2, "update_min_replicas": 1}
    cl = ch.Cluster(4, D, cfg)
    cl.stop_coord()
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = [[cl.shards[0].target, cl.shards[1].target],
                   [cl.shards[2].target, cl.shards[3].target]]
    with open(cl.config, "w") as f:
        json.dump(c, f)
    port, mport = ch.free_port(), ch.free_port()
    tr.start_coord(cl, port, mport)
    try:
        op = cl.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1 and not op.warnings, op
        xs = x[rng.choice(N, 32, replace=False)] + rng.normal(size=(32, D)).astype("float32") * .1

        # 1. one replica dead: the update commits without it and says so
        victim = cl.shards[1]
        victim.kill()
        far = (rng.normal(size=D) * 8).astype("float32")
        b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("new-far", far)],
                            ["r00007"])
        load = Load(cl, tp, xs)
        try:
            op = cl.update(b1)
        finally:
            load.finish()
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        assert len(op.warnings) == 1 and victim.target in op.warnings[0] and \
            "left out of version 2" in op.warnings[0], op.warnings
        assert load.failed == 0 and load.answered > 0, (load.failed, load.errors[:5])
        print("update with replica %s dead: SUCCEEDED v2, warning %r; load answered %d, "
              "failed %d" % (victim.target, op.warnings[0], load.answered, load.failed))
        assert cl.stats().version == 2
        r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, far, 1, fraction=1.0)]), timeout=tr.DEADLINE_S)
        assert r.version == 2 and \
            r.nearest_neighbors[0].neighbors[0].datapoint.datapoint_id == "new-far", r
        rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(
            ids=["r00007", "new-far"]), timeout=10)
        assert [d.datapoint_id for d in rd.datapoints] == ["new-far"], rd
        # the warning is part of the durable operation record
        cl.stop_coord()
        tr.start_coord(cl, port, mport)
        again = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=op.operation_id),
                                     timeout=10)
        assert again == op, (again, op)

        # 2. back on version 1, re-seeded to 2 from its sibling; then it answers alone
        before = top_ids(cl, tp, xs)
        back = tr.restart_shard(victim)
        cl.shards[1] = back
        took, st = wait_version(back, 2)
        sib = cl.shards[0].stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.vectors_count == sib.vectors_count, (st.vectors_count, sib.vectors_count)
        print("restarted replica re-seeded to version 2 in %.2fs (%d vectors, sibling %d)" %
              (took, st.vectors_count, sib.vectors_count))
        cl.shards[0].kill()
        t0 = time.time()
        while True:  # the coordinator notices the dead sibling; retries go to `back`
            try:
                alone = top_ids(cl, tp, xs)
                break
            except Exception:
                assert time.time() - t0 < 15
                time.sleep(0.2)
        assert alone == before, "re-seeded replica answers differently"
        print("sibling killed: the re-seeded replica alone answers the same %d queries" %
              len(xs))

        # 2a. a replica whose Prepare fails (its data dir immutable: the version cannot be
        # written; root only): left out at Prepare, re-seeded once writable again
        v = 3
        ro = cl.shards[2]
        if os.geteuid() == 0 and subprocess.run(["chattr", "+i", ro.data]).returncode == 0:
            try:
                b2a = ch.write_batch(os.path.join(root, "b2a"), [ch.dp_json("new-ro", far / 2)])
                op = cl.update(b2a)
            finally:
                subprocess.run(["chattr", "-i", ro.data], check=True)
            assert op.state == tp.Operation.SUCCEEDED and op.version == v, op
            assert any(("(%s) left out of version %d: its Prepare failed" % (ro.target, v)) in w
                       for w in op.warnings), op.warnings
            took, st = wait_version(ro, v)
            print("replica with a failing Prepare left out of version %d; writable again: "
                  "re-seeded in %.2fs" % (v, took))
            v += 1
        else:
            print("skipped the failing-Prepare case (needs root and chattr)")

        # 2b. a hung (SIGSTOPped) replica: its Stage times out, it is left out; woken up it
        # holds a staging leftover of the new version, which reconcile aborts (a version
        # still STAGING never counts as held) before re-seeding it
        hung = cl.shards[3]
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            b3 = ch.write_batch(os.path.join(root, "b3"), [ch.dp_json("new-hung", -far)])
            op = cl.update(b3)
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
        assert op.state == tp.Operation.SUCCEEDED and op.version == v, op
        # left out: the hung one, and shard 0's replica killed in step 2
        assert sorted(w.split(" left out")[0] for w in op.warnings) == sorted(
            ["shard 0 replica 0 (%s)" % cl.shards[0].target,
             "shard 1 replica 1 (%s)" % hung.target]), op.warnings
        took, st = wait_version(hung, v)
        print("SIGSTOPped replica left out of version %d, woken: re-seeded in %.2fs" % (v, took))
        before = top_ids(cl, tp, xs + [-far])
        cl.shards[2].kill()
        t0 = time.time()
        while True:
            try:
                alone = top_ids(cl, tp, xs + [-far])
                break
            except Exception:
                assert time.time() - t0 < 15
                time.sleep(0.2)
        assert alone == before and alone[-1][0][0] == "new-hung", (alone[-1], before[-1])

        # 3. a group with nobody left: FAILED, nothing changes
        cl.shards[2].kill()
        cl.shards[3].kill()
        b2 = ch.write_batch(os.path.join(root, "b2"), [ch.dp_json("never", x[3])])
        op = cl.update(b2)
        assert op.state == tp.Operation.FAILED and \
            ("update_min_replicas 1: shard 1 has 0 of 2 replicas left for version %d" % (v + 1)) \
            in op.error, op
        assert cl.stats().version == v
        print("group without replicas: FAILED: %s" % op.error)
    finally:
        cl.stop()
    print("test_coord_degraded: OK")


if __name__ == "__main__":
    main()
