"""A streamed round whose etcd mirror answer is lost (docs/ha.md "Streamed writes and etcd"):
etcd x1, coordinators x2 (TTL 2 s), 1 shard group x 1 replica.

The leader mirrors each round in etcd before any shard sees it (coordinator/stream_ha.c).
When etcd's answer is lost, the round may be there or not. The code before this test
cut the round from its local log, told the clients "nothing was written" and gave the
seq to the next round — whose mark etcd then refused, forever: a 60-minute chaos run saw
a leader refuse every write for 25 minutes (docs/reliability.md).

Two hooks, each firing once in the hooked leader (TSR_COORD_CRASH_AT):
- mirror-answer-lost: a landed round is put again, as a retry after a lost answer. It must
  settle as logged (the read-back finds the same bytes): the write is acknowledged,
  readable on both coordinators, and the next write takes the next seq.
- mirror-doubt: a landed round is taken as in doubt. The client gets UNAVAILABLE "outcome
  unknown"; the leader re-reads etcd's rounds, finds the round and sends it to the shards:
  the write becomes readable and the k=1 answer to its vector on both coordinators, and
  the next write is acknowledged within a few seconds with a later seq (no seq reused).
Exit 77 only without etcd.
"""
import os
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from test_coord_stream import dp, read, top1, upsert  # noqa: E402
from test_ha_round_logged import on_leader, one_group  # noqa: E402

D = 16
N = 400
TTL = 2


def lead_with(cl, env):
    """Restarts the follower with env and makes it the leader (the leader is stopped and
    started again as a follower). Returns the new leader."""
    lead = cl.leader()
    hooked = cl.follower(lead)
    hooked.stop()
    hooked.start(env=env)
    lead.stop()  # SIGTERM: its lease is revoked, the hooked one is elected
    lead.start()
    assert cl.leader(timeout=TTL + 15) is hooked, cl.logs()
    return hooked


def upsert_retry(cl, c, tp, dps, timeout=15):
    """An upsert retried on UNAVAILABLE (an election, a leader re-reading etcd)."""
    t0 = time.time()
    while True:
        try:
            return on_leader(cl, c, lambda x: upsert(x, tp, dps))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() - t0 > timeout:
                raise
            time.sleep(0.2)


def visible(cl, tp, did, vec, timeout=10):
    """did is readable with vec and the k=1 answer to vec on every coordinator."""
    for c in cl.coords:
        t0 = time.time()
        while True:
            try:
                got = read(c, tp, [did]).get(did)
                ok = got is not None and np.allclose(list(got.feature_vector), vec, atol=1e-5)
                ok = ok and top1(c, tp, vec) == [did]
            except grpc.RpcError:
                ok = False
            if ok:
                break
            assert time.time() - t0 < timeout, ("not visible", did, c.target, cl.logs())
            time.sleep(0.1)


def main():
    tp, x, cl = one_group(37, "mirror-doubt", n=N)
    try:
        # 1. a retry after a lost answer settles as logged
        hooked = lead_with(cl, {"TSR_COORD_CRASH_AT": "mirror-answer-lost"})
        v1 = (x[1] + 6).astype("float32")
        _, r1 = on_leader(cl, hooked, lambda c: upsert(c, tp, [dp(tp, "lost1", v1)]))
        assert r1.upserted == 1 and r1.stream_seq > 0, r1
        assert "an earlier try of this round had landed" in hooked.proc.text(), cl.logs()
        v2 = (x[2] + 6).astype("float32")
        _, r2 = upsert_retry(cl, hooked, tp, [dp(tp, "lost2", v2)])
        assert r2.stream_seq == r1.stream_seq + 1, (r1, r2)
        visible(cl, tp, "lost1", v1)
        visible(cl, tp, "lost2", v2)

        # 2. a round in doubt: outcome unknown, then found in etcd and applied
        hooked = lead_with(cl, {"TSR_COORD_CRASH_AT": "mirror-doubt"})
        v3 = (x[3] + 8).astype("float32")
        try:
            on_leader(cl, hooked, lambda c: upsert(c, tp, [dp(tp, "doubt", v3)]))
            raise AssertionError("the hooked leader acknowledged a round it holds in doubt")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert "outcome unknown" in (e.details() or ""), e.details()
        t0 = time.time()
        v4 = (x[4] + 8).astype("float32")
        c4, r4 = upsert_retry(cl, hooked, tp, [dp(tp, "after", v4)])
        took = time.time() - t0
        print("the write after the one in doubt: acknowledged in %.2f s, seq %d (by %s)"
              % (took, r4.stream_seq, c4.target))
        assert c4 is hooked, "the hooked leader stays the leader"
        # the round in doubt had landed in etcd: it holds the seq after lost2's
        assert r4.stream_seq == r2.stream_seq + 2, (r2, r4, cl.logs())
        visible(cl, tp, "doubt", v3)
        visible(cl, tp, "after", v4)
        for did, vec in (("lost1", v1), ("lost2", v2)):
            visible(cl, tp, did, vec)
        assert "etcd's streamed rounds read again" in hooked.proc.text(), cl.logs()
        print("test_ha_mirror_doubt: OK")
    except BaseException:
        print(cl.logs()[-8000:])
        raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
