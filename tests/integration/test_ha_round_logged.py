"""A leader killed between a streamed round's local log append and its etcd mirror
(docs/ha.md): etcd x1, coordinators x2 (TTL 2 s), 1 shard group x 1 replica.

The round (seq S) is in that coordinator's local log only. The other coordinator is
elected, then the killed one restarts as a follower. It must not
send that round to the shards: etcd never held it, so the next leader gives seq S to
another round, and a shard that had applied the orphan would drop the real round as a
resend — an acknowledged write lost (found by make chaos: removed ids served again,
upserts missing); nor may it keep the orphan in its own overlay (it would skip the real
round of seq S from etcd: its ReadIndexDatapoints would miss an acknowledged write).
Checks:
- an upsert acknowledged by the new leader is readable (ReadIndexDatapoints, the vector
  it was given) and is the k=1 answer to its own vector on BOTH coordinators;
- a remove acknowledged by the new leader: the id is gone from the answers of both;
- the write the killed leader never acknowledged is whole or absent: if an answer
  returns its id, Read returns it too.
Fails on the code before the fix (the restarted coordinator's writer caught the shard up
from its local log with term 0, before it knew etcd's rounds). Exit 77 only without etcd.
"""
import os
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402
from test_coord_stream import dp, read, remove, top1, upsert  # noqa: E402

D = 16
N = 500
TTL = 2


def on_leader(cl, c, fn, timeout=20):
    """fn(coordinator) on c, or on the one c names as the leader ("not the leader: the
    leader is ADDR"), retried until a coordinator takes it (an election settles).
    Returns (the coordinator that answered, the reply)."""
    t0 = time.time()
    while True:
        try:
            return c, fn(c)
        except grpc.RpcError as e:
            d = e.details() or ""
            if "not the leader" not in d or time.time() - t0 > timeout:
                raise
            named = d.rsplit(" ", 1)[-1]
            c = next((o for o in cl.coords if o.target == named and o.alive()), c)
            time.sleep(0.1)


def one_group(seed, name, n=N):
    """etcd x1, coordinators x2 (TTL), 1 shard group x 1 replica, loaded with n random
    vectors (ids <name[0]>0000..) as version 1. Returns (tessera_pb2, x, the cluster)."""
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    x = np.random.default_rng(seed).normal(size=(n, D)).astype("float32")
    root = sh.tmpdir("tsr-%s-" % name)
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("%s%04d" % (name[0], i), x[i])
                                                   for i in range(n)])
    cl = eh.HACluster(groups=1, replicas=1, coords=2, etcd_members=1, dims=D, ttl=TTL,
                      config={"nlist": 8, "pq_m": 4, "nprobe": 8})
    try:
        op = cl.leader().update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, (op, cl.logs())
        cl.wait_version(1)
    except BaseException:
        cl.stop()
        raise
    return tp, x, cl


def main():
    tp, x, cl = one_group(31, "ha-round-logged")
    try:
        lead = cl.leader()
        _, r = on_leader(cl, lead, lambda c: upsert(c, tp, [dp(tp, "before", x[0] + 5)]))
        assert r.stream_seq > 0, r

        # the follower comes back with the hook and becomes the leader
        hooked = cl.follower(lead)
        hooked.stop()
        hooked.start(env={"TSR_COORD_CRASH_AT": "round-logged"})
        lead.stop()  # SIGTERM: its lease is revoked, the hooked one is elected
        lead.start()
        assert cl.leader(timeout=TTL + 15) is hooked, cl.logs()
        orphan = (x[1] + 7).astype("float32")
        try:
            on_leader(cl, hooked, lambda c: upsert(c, tp, [dp(tp, "orphan", orphan)]))
            raise AssertionError("the hooked leader acknowledged a write it must die on")
        except grpc.RpcError as e:
            print("the hooked leader died in its round:", e.code())
        t0 = time.time()
        while hooked.alive():
            assert time.time() - t0 < 10, "the hooked leader did not exit"
            time.sleep(0.05)
        assert hooked.proc.proc.returncode == 137, hooked.proc.proc.returncode
        # the other one leads (the dead one's lease expired), then the killed one comes
        # back, without the hook, its orphan round in its local log: a follower
        assert cl.leader(timeout=TTL + 15) is lead, cl.logs()
        hooked.start()

        up = (x[2] + 9).astype("float32")
        new, got = on_leader(cl, lead, lambda c: upsert(c, tp, [dp(tp, "after", up)]))
        assert got.upserted == 1, got
        assert new is lead, "the restarted one leads"
        on_leader(cl, new, lambda c: remove(c, tp, ["before"]))
        for c in (lead, hooked):
            t0 = time.time()
            while True:  # a follower applies the leader's rounds from etcd's watch
                try:
                    ok = set(read(c, tp, ["after", "before"])) == {"after"}
                except grpc.RpcError:
                    ok = False
                if ok:
                    break
                assert time.time() - t0 < 10, ("directory", c.target, cl.logs())
                time.sleep(0.1)
            d = read(c, tp, ["after"])["after"]
            assert np.allclose(list(d.feature_vector), up, atol=1e-5), (c.target, d)
            assert top1(c, tp, up) == ["after"], (c.target, top1(c, tp, up), cl.logs())
            near = top1(c, tp, x[0] + 5, k=3)
            assert "before" not in near, ("a removed id answered", c.target, near)
            o = top1(c, tp, orphan)
            if o == ["orphan"]:
                assert "orphan" in read(c, tp, ["orphan"]), ("half an orphan", c.target)
        print("test_ha_round_logged: OK")
    except BaseException:
        print(cl.logs()[-8000:])
        raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
