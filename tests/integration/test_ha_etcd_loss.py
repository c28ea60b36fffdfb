"""Issue 16, acceptance 4 (docs/ha.md): losing etcd members. etcd x3, coordinators x2
(--etcd, the default TTL 5 s), 2 shard groups x 2 replicas.

- 1 of 3 members killed (-9): nothing changes: the same leader, the same answers on both
  coordinators, an update succeeds.
- 2 of 3 killed (no quorum): queries go on from the committed version on both
  coordinators (same answers); UpdateIndex on either coordinator fails fast (within 10 s)
  with UNAVAILABLE, a message naming etcd on at least one of them, and nothing is
  half-applied (every shard and coordinator stays on the committed version).
- both members back: `tessera update --target A,B` succeeds again and every shard ends on
  the version etcd holds.
Exit 77 only when etcd is not installed.
"""
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 1200
TTL = 5  # the default --etcd-ttl: an etcd member loss (and its raft election) must not cost the lease


def tessera(*args, timeout=240):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


problems = []  # checks that do not stop the run; the test fails at the end naming them


def answers(c, tp, xs):
    out = []
    for x in xs:
        r = c.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, x, 10,
                                                                          fraction=1.0)]),
                                 timeout=10)
        out.append([n.datapoint.datapoint_id for n in r.nearest_neighbors[0].neighbors])
    return out


def main():
    eh.skip_without_etcd()
    import grpc
    tp = ch.stubs()[0]
    rng = np.random.default_rng(4)
    root = sh.tmpdir("tsr-ha-etcd-loss-")
    bs = []
    for b in range(4):
        x = rng.normal(size=(N, D)).astype("float32")
        bs.append(ch.write_batch(os.path.join(root, "b%d" % b),
                                 [ch.dp_json("e%d-%05d" % (b, i), x[i]) for i in range(N)]))
    xs = rng.normal(size=(20, D)).astype("float32")
    cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=TTL,
                      config={"nlist": 8, "pq_m": 4, "nprobe": 8})
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", bs[0])
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        leader = cl.leader()
        cl.wait_version(1)
        before = answers(leader, tp, xs)

        cl.etcd.kill(0)
        time.sleep(TTL + 1)  # longer than a lease: a leader that lost it would show
        assert cl.leader() is leader, "the leader changed after 1 of 3 etcd members was lost"
        for c in cl.coords:
            got = answers(c, tp, xs)
            assert got == before, (c.target, c is leader, c.stats().version,
                                   [(a, b) for a, b in zip(got, before) if a != b][:2])
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", bs[1])
        assert rc == 0 and "SUCCEEDED, version 2" in out, (rc, out, err, cl.logs())
        assert cl.leader() is leader
        cl.wait_version(2)
        v2 = answers(leader, tp, xs)
        print("1 of 3 etcd members lost: same leader, same answers, update -> version 2")

        cl.etcd.kill(1)
        time.sleep(TTL + 1)
        for c in cl.coords:
            assert answers(c, tp, xs) == v2, "answers changed without etcd quorum: " + c.target
        msgs = []
        for c in cl.coords:
            t0 = time.time()
            try:
                r = c.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=bs[2]), timeout=10)
                op = c.wait_op(r.operation_id, 60)
                problems.append("%s (%s) accepted an update without etcd quorum after %.1fs; "
                                "the operation ended %s: %s" % (
                                    c.target, "leader" if c is leader else "follower",
                                    time.time() - t0, tp.Operation.State.Name(op.state),
                                    op.error))
                print("FAIL: " + problems[-1])
                continue
            except grpc.RpcError as e:
                dt = time.time() - t0
                assert e.code() == grpc.StatusCode.UNAVAILABLE, (c.target, e.code(),
                                                                 e.details())
                assert dt < 10, dt
                msgs.append("%s after %.2fs: %s" % (c.target, dt, e.details()))
        if not any("etcd" in m for m in msgs):
            problems.append("no UpdateIndex refusal names etcd: %s" % msgs)
            print("FAIL: " + problems[-1])
        assert set(cl.shard_versions().values()) == {2}, cl.shard_versions()
        for c in cl.coords:
            assert c.stats().version == 2 and answers(c, tp, xs) == v2, c.target
        print("2 of 3 lost: queries go on (version 2); UpdateIndex refused:\n  " +
              "\n  ".join(msgs))

        cl.etcd.start(0)
        cl.etcd.start(1)
        cl.etcd.wait_healthy()
        t0 = time.time()
        while True:  # each try waits up to 30 s for a leader (the CLI's UpdateIndex timeout)
            rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", bs[3])
            if rc == 0 or time.time() - t0 > 60:
                break
        assert rc == 0 and "SUCCEEDED, version 3" in out, \
            ("no update within 60 s of etcd's quorum back", rc, out, err, cl.logs())
        held = cl.etcd.committed_version(cl.prefix)
        assert held == 3 and set(cl.shard_versions().values()) == {3}, \
            (held, cl.shard_versions())
        print("etcd back: update -> version 3 after %.1fs, every shard on it" %
              (time.time() - t0))
    finally:
        cl.stop()
    assert not problems, "%d problem(s):\n  %s" % (len(problems), "\n  ".join(problems))
    print("test_ha_etcd_loss: OK")


if __name__ == "__main__":
    main()
