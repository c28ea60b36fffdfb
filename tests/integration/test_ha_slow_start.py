"""A term whose start-up outlasts the lease TTL (docs/ha.md): etcd x1, coordinators x2
(TTL 2 s), 1 shard group x 1 replica.

A coordinator that wins the election first serves the committed version, adopts its
predecessor's streamed rounds from etcd and catches the replicas up — tens of thousands
of rounds took ~12 s in a 60-minute chaos run, longer than the TTL. The lease thread
runs that start-up, so before the fix nothing renewed the lease meanwhile: etcd expired
it, the key went with it, and the winner logged "elected" and then, at its next renewal,
"stepping down (the lease expired)" — an election lost to its own start-up, and a second
one to run. The hook TSR_COORD_SLOW_START_MS=5000 (2.5 TTLs) stands for the long adoption.
Checks: the hooked coordinator is elected once and stays the leader (no "stepping down"
in its log, the same term in etcd), and it takes a streamed write and a query.
Fails on the code before the fix (its log shows "stepping down (the lease expired)").
Exit 77 only without etcd.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from test_coord_stream import dp, top1, upsert  # noqa: E402
from test_ha_round_logged import TTL, on_leader, one_group  # noqa: E402

SLOW_MS = 5000


def main():
    tp, x, cl = one_group(37, "ha-slow-start")
    try:
        lead = cl.leader()
        hooked = cl.follower(lead)
        hooked.stop()
        hooked.start(env={"TSR_COORD_SLOW_START_MS": str(SLOW_MS)})
        lead.stop()  # SIGTERM: its lease is revoked, the hooked one wins and starts slowly
        assert cl.leader(timeout=TTL + SLOW_MS / 1000 + 15) is hooked, cl.logs()
        text = hooked.proc.text()
        assert "the term's start-up sleeps first" in text, text[-3000:]
        assert "leader: elected" in text, text[-3000:]
        # a few TTLs more as the only coordinator: it must keep its key
        time.sleep(3 * TTL)
        text = hooked.proc.text()
        assert "stepping down" not in text, ("the winner lost its lease to its own start-up",
                                             text[-4000:])
        assert text.count("leader: elected") == 1, text[-4000:]
        assert "lease renewed" in text, text[-3000:]
        assert cl.leader(timeout=5) is hooked, cl.logs()
        v = (x[3] + 11).astype("float32")
        _, r = on_leader(cl, hooked, lambda c: upsert(c, tp, [dp(tp, "slow-start", v)]))
        assert r.upserted == 1, r
        assert top1(hooked, tp, v) == ["slow-start"], top1(hooked, tp, v)
        print("test_ha_slow_start: OK")
    except BaseException:
        print(cl.logs()[-8000:])
        raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
