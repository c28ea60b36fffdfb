"""Issue 16, acceptance 1 (docs/ha.md): etcd x3, coordinators x2 (--etcd, lease TTL 2 s),
4 shard groups x 2 replicas, all real processes on loopback.

- Before the kill: both coordinators name the same leader in GetIndexStats (fields 13/14)
  and list both; a follower refuses UpsertDatapoints with UNAVAILABLE "not the leader:
  the leader is ADDR" naming the leader.
- kill -9 of the leader under a 4-thread query load spread over both coordinators (thread
  t starts on coordinator t % 2): 0 failed queries for a client that retries once on the
  other coordinator, and every answer is the one from before the kill.
- A new leader within TTL + 1 s of the kill (the survivor names itself).
- The next UpdateIndex succeeds (`tessera update --target DEAD,SURVIVOR`): every shard ends
  on the version etcd holds (PREFIX/version).
- The killed coordinator restarted with an EMPTY --data folder (acceptance 6) joins as a
  follower and gives the same answers as the leader, from etcd and the shards alone.
Exit 77 only when etcd is not installed; a coordinator without --etcd fails the test.
"""
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 2000
TTL = 2
DEADLINE_S = 3.0
if "san-" in os.path.basename(os.path.dirname(os.path.abspath(ch.BIN))):
    DEADLINE_S *= 4


def tessera(*args, stdin=None, timeout=180):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout, input=stdin)
    return r.returncode, r.stdout, r.stderr


def answer(stub, tp, x, timeout):
    r = stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, x, 10, fraction=1.0)]),
                           timeout=timeout)
    return [(n.datapoint.datapoint_id, round(n.distance, 3))
            for n in r.nearest_neighbors[0].neighbors]


class Load:
    """threads clients; client t sends one query at a time, first to coordinator t % 2,
    and on a failure retries it once on the other one. A query failed only when both
    attempts failed."""

    def __init__(self, cl, tp, xs, expect, threads=4):
        self.cl, self.tp, self.xs, self.expect = cl, tp, xs, expect
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = self.failed = self.retried = self.wrong = 0
        self.errors = []
        self.pool = cf.ThreadPoolExecutor(threads)
        self.futs = [self.pool.submit(self.run, t) for t in range(threads)]

    def run(self, t):
        import grpc
        i, order = t, [self.cl.coords[t % 2], self.cl.coords[(t + 1) % 2]]
        while not self.stop.is_set():
            q = i % len(self.xs)
            i += 5
            got, errs = None, []
            for c in order:
                try:
                    got = answer(c.stub, self.tp, self.xs[q], DEADLINE_S)
                    break
                except grpc.RpcError as e:
                    errs.append("%s: %s: %s" % (c.target, e.code(), e.details()))
                except ValueError as e:  # a closed channel (the killed coordinator)
                    errs.append("%s: %s" % (c.target, e))
            with self.lock:
                if errs and got is not None:
                    self.retried += 1
                if got is None:
                    self.failed += 1
                    self.errors.append(" / ".join(errs))
                elif got != self.expect[q]:
                    self.wrong += 1
                    self.errors.append("query %d: %s != %s" % (q, got, self.expect[q]))
                else:
                    self.answered += 1

    def finish(self):
        self.stop.set()
        for f in self.futs:
            f.result(60)
        self.pool.shutdown()


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(16)
    x = rng.normal(size=(N, D)).astype("float32")
    xs = x[rng.choice(N, 40, replace=False)] + 0.01
    root = sh.tmpdir("tsr-ha-failover-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("f%05d" % i, x[i])
                                                   for i in range(N)])
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("g%05d" % i, x[i] + 1)
                                                   for i in range(200)])
    cl = eh.HACluster(groups=4, replicas=2, coords=2, dims=D, ttl=TTL,
                      config={"nlist": 16, "pq_m": 4, "nprobe": 4})
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b0)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        leader = cl.leader()
        follower = cl.follower(leader)
        coords, named = follower.ha()
        assert sorted(coords) == sorted(c.target for c in cl.coords), (coords, named)
        print("leader %s, follower %s; coordinators %s" % (leader.target, follower.target,
                                                           coords))

        # a write to the follower: UNAVAILABLE naming the leader (the CLI following it, and
        # streamed writes across a failover: test_ha_writes.py)
        import grpc
        up = tp.UpsertDatapointsRequest(datapoints=[tp.IndexDatapoint(
            datapoint_id="w1", feature_vector=[float(v) for v in x[1] + 2])])
        try:
            follower.stub.UpsertDatapoints(up, timeout=10)
            raise AssertionError("the follower accepted a write")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and \
                "not the leader: the leader is %s" % leader.target in e.details(), \
                (e.code(), e.details())
            print("follower refuses a write: %s" % e.details())
        # the follower moves to the committed version by itself (it follows PREFIX/version)
        t_end = time.time() + 10
        while follower.stats().version != 1:
            assert time.time() < t_end, "the follower is not on version 1 after 10 s"
            time.sleep(0.05)

        expect = [answer(leader.stub, tp, q, 10) for q in xs]
        assert expect == [answer(follower.stub, tp, q, 10) for q in xs], \
            "the coordinators answer differently before the kill"
        load = Load(cl, tp, xs, expect)
        time.sleep(1.5)
        t_kill = time.time()
        leader.kill()
        new = cl.leader(timeout=TTL + 10, exclude=(leader,))
        took = time.time() - t_kill
        time.sleep(1.5)
        load.finish()
        print("kill -9 of the leader under load: %d answered (%d after a retry), %d failed, "
              "%d wrong; new leader %s after %.2f s (TTL %d s)" %
              (load.answered, load.retried, load.failed, load.wrong, new.target, took, TTL))
        assert load.failed == 0 and load.wrong == 0, load.errors[:5]
        assert load.answered > 20, load.answered
        assert new is follower, (new.target, follower.target)
        late = None if took <= TTL + 1.0 else "new leader after %.2f s > TTL + 1 s" % took

        rc, out, err = tessera("update", "--target", leader.target + "," + new.target,
                               "--batch-root", b1)
        assert rc == 0 and "SUCCEEDED, version 2" in out, (rc, out, err, cl.logs())
        versions = cl.shard_versions()
        held = cl.etcd.committed_version(cl.prefix)
        assert held == 2 and set(versions.values()) == {2}, (held, versions)
        print("next update: %s; etcd holds version %s, every shard on it" %
              (out.splitlines()[0], held))

        # the killed coordinator back with an empty local folder: a follower, same answers
        shutil.rmtree(leader.data, ignore_errors=True)
        leader.start()
        t_end = time.time() + 10
        while any(c.stats().version != 2 for c in (new, leader) if c.alive()) and \
                time.time() < t_end:
            time.sleep(0.05)
        expect2 = [answer(new.stub, tp, q, 10) for q in xs]
        t_end = time.time() + 30
        while True:
            try:
                got = [answer(leader.stub, tp, q, 10) for q in xs]
                if got == expect2:
                    break
            except grpc.RpcError:
                got = None
            assert time.time() < t_end, "restarted coordinator answers differently"
            time.sleep(0.2)
        assert cl.leader() is new, "the restarted coordinator took the leadership back"
        print("restarted with an empty --data: follower, same %d answers as the leader" %
              len(xs))
        assert late is None, late  # checked last: the other checks ran
    finally:
        cl.stop()
    print("test_ha_failover: OK")


if __name__ == "__main__":
    main()
