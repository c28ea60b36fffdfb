#!/usr/bin/env python3
"""Replicas across simulated hosts (issue 7): 2 shard groups x R = 2 replicas, each replica
on its own host, under the query load of test_shard_kill (no allow_partial: every query
needs both groups; client deadline 2 s, search_deadline_ms 700, so one attempt on a
replica gets 350 ms while its sibling is untried).

1. The link of replica 0 of group 1 is cut (packets dropped: a hang, not a refusal).
2. It is healed; once the coordinator is connected to it again (and 2 s more), the link of
   its sibling is cut, so the healed replica must carry the group alone.
3. Healed again.
Asserts: not one query fails or hangs; every answer is the full answer taken before the
faults; none takes longer than the deadline + 1 s; the coordinator reconnects to each healed
replica within 3 s.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mh  # noqa: E402


def main():
    import grpc
    with mh.Cluster(4, replicas=2) as cl:
        x, pool, base = mh.bootstrap(cl)
        load = mh.Load(cl, pool, deadline_s=2.0, partial=False).start()
        time.sleep(1.0)
        for victim in (2, 3):
            addr = cl.shard_addr(victim)
            cl.net.cut(cl.shard_host(victim))
            time.sleep(5.0)
            cl.net.heal(cl.shard_host(victim))
            back = mh.wait_until(lambda: cl.established(0, addr), 3.0, step=0.1)
            assert back is not None, "no connection to replica %s 3 s after the heal" % addr
            print("replica %d (%s): cut 5 s, connected again %.2fs after the heal" %
                  (victim, addr, back))
            time.sleep(2.0)
        load.stop()
        calls = load.snapshot()
        load.report("cut link of one replica (R = 2)", calls)
        assert not load.hung(calls)
        bad = [c for c in calls if not mh.is_full(c, base)]
        assert not bad, "%d queries not answered in full: %s %s" % (len(bad), bad[0].code,
                                                                    bad[0].details)
        slow = [c for c in calls if c.latency > 0.7 + 1.0]
        assert not slow, "%d answers later than 1.7 s" % len(slow)
        assert len(calls) >= 100, len(calls)
        del grpc
        cl.stop_all()
    print("test_replica_cut: OK")


if __name__ == "__main__":
    main()
