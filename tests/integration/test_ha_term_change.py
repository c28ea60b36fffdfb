"""An update commits only under the leader term it began in (docs/ha.md "A term change
mid-update"; coordinator/txn.c tsr__txn_flip). The case `make chaos` found (seed 1, Dec 7),
made deterministic:

etcd x1, 2 shard groups x 1 replica, coordinators A and B (TTL 2 s), a base of 600 ids
(d 16), 60 streamed writes. A fold prepares one group at a time; shard 1's Prepare sleeps
20 s (TSR_SHARD_SLOW_PREPARE_MS, before it takes the update lock and checks the
term: as a Prepare waiting for the one before it).
1. A fold on A: Prepare(2) is done on shard 0 under A's term T1 and sleeping on shard 1.
   A and shard 1 are stopped (SIGSTOP) until B leads (term T2) and B's reconcile has
   aborted the prepared version 2 on shard 0 (shard 1 cannot hear it). B is killed; A and
   shard 1 are continued; A finds its lease gone and leads again (term T3 > T2) while
   shard 1 still sleeps.
2. Shard 1 answers ready: every Prepare succeeded, but one group's version 2 is gone. The
   fold must not commit ("leader term T1 became T3: not committed"): the operation ends
   FAILED with that message, etcd still names version 1, every id reads back. (Without the
   check A commits version 2 under T3, which passes the etcd fence, and every Read then
   fails "version 2: not held by this shard".)
3. Shard 1 restarted without the sleep; a second fold on A commits version 2; every base and streamed id reads back bit for bit.
Exit 77 only when etcd is not installed.
"""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402
import stream_model as sm  # noqa: E402

D = 16
N = 600
SLEEP_MS = 20000


def wait(what, cond, timeout, cl):
    t_end = time.time() + timeout
    while time.time() < t_end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("%s: not after %d s\n%s" % (what, timeout, cl.logs()[-6000:]))


def leads(c):
    try:
        return c.ha(1)[1] == c.target
    except Exception:
        return False


def read_all(c, tp, model):
    """Every id of model reads back from c bit for bit."""
    got = sm.read_state(c.stub, tp, model)
    bad = [d for d in sorted(model) if got.get(d) != sm.Rec(d, model[d])]
    assert not bad, "%d ids not read back as written, e.g. %s" % (len(bad), bad[:5])


def committed(cl):
    return cl.etcd.committed_version(cl.prefix)


def restart_shard1(cl, A, tp, model, env):
    """Shard 1 stopped and started again on its address and data with env; returns it once
    A reads from it again (A's channel reconnected)."""
    old = cl.shards[1]
    old.stop()
    s1 = sh.Shard(old.data, extra=["--listen", old.target], env=env)
    cl.shards[1] = cl.groups[1][0] = s1
    t_end = time.time() + 30
    while True:
        try:
            read_all(A, tp, model)
            return s1
        except Exception:
            if time.time() > t_end:
                raise
            time.sleep(0.2)


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(29)
    cl = eh.HACluster(groups=2, replicas=1, coords=2, etcd_members=1, dims=D,
                      config={"nlist": 8, "pq_m": 4})
    stopped = []
    try:
        model = {"x%04d" % i: (rng.normal(size=D) * 3).astype("float32") for i in range(N)}
        b0 = ch.write_batch(os.path.join(cl.root, "b0"),
                            [ch.dp_json(d, v) for d, v in sorted(model.items())])
        A = cl.leader(15)
        B = cl.follower(A)
        op = A.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        new = {"s%03d" % i: (rng.normal(size=D) * 3).astype("float32") for i in range(60)}
        A.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=[
            tp.IndexDatapoint(datapoint_id=d, feature_vector=[float(f) for f in v])
            for d, v in sorted(new.items())]), timeout=30)
        model.update(new)
        s0 = cl.shards[0]
        s1 = restart_shard1(cl, A, tp, model, {"TSR_SHARD_SLOW_PREPARE_MS": str(SLEEP_MS)})

        cl.wait_version(1, 30)  # B too: its start-up as leader lists no shard then
        # 1. Prepare(2) done on shard 0 under T1, asleep on shard 1; B leads, aborts 2 on 0
        r = A.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=30)
        wait("shard 1's Prepare asleep", lambda: "Prepare sleeps first" in s1.text(), 30, cl)
        t_sleep = time.time()
        assert "Prepare(2): built" in s0.text(), s0.text()[-3000:]
        for p in (A.proc.proc, s1.proc):
            p.send_signal(signal.SIGSTOP)
            stopped.append(p)
        wait("B leads", lambda: leads(B), 15, cl)
        wait("B's reconcile aborts version 2 on shard 0",
             lambda: "aborted prepared version 2" in s0.text(), 15, cl)
        print("B leads; version 2 aborted on shard 0 %.1f s into shard 1's Prepare"
              % (time.time() - t_sleep))
        B.kill()
        for p in stopped:
            p.send_signal(signal.SIGCONT)
        stopped = []
        wait("A leads again", lambda: leads(A), 15, cl)
        left = SLEEP_MS / 1000.0 - (time.time() - t_sleep)
        assert left > 0.5, "A led again only after shard 1's Prepare (%.1f s late): the " \
            "test checked nothing\n%s" % (-left, A.proc.text()[-4000:])
        print("A leads again %.1f s before shard 1's Prepare answers" % left)

        # 2. every Prepare answered ready, under a newer term: not committed
        op = A.wait_op(r.operation_id, 60)
        assert op.state == tp.Operation.FAILED and "not committed" in op.error \
            and "became" in op.error, (op, A.proc.text()[-4000:])
        assert committed(cl) == 1, "etcd names version %s" % committed(cl)
        read_all(A, tp, model)
        print("fold under a changed term: FAILED (%s); etcd still names version 1; %d ids "
              "read back" % (op.error, len(model)))

        # 3. the next fold commits
        restart_shard1(cl, A, tp, model, None)  # (a Prepare without the sleep)
        op = A.fold(120)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, (op, A.proc.text()[-4000:])
        assert committed(cl) == 2
        read_all(A, tp, model)
        print("the next fold: version 2, %d ids read back bit for bit" % len(model))
    finally:
        for p in stopped:
            p.send_signal(signal.SIGCONT)
        cl.stop()
    print("test_ha_term_change: OK")


if __name__ == "__main__":
    main()
