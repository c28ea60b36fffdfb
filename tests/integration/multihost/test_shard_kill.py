#!/usr/bin/env python3
"""Fault case 1 (issue 7): kill -9 of a shard under load, across simulated hosts.

Coordinator, 3 shards and this client each in their own network namespace. Under a
query load (4 threads, client deadline 2 s, coordinator search_deadline_ms 700, every
query probing every list so it needs every shard; every other query sets allow_partial),
shard 1 is killed with SIGKILL and restarted 2 s later on the same address, without
touching the coordinator. Asserts:
- no call hangs: every call ends before its deadline (+1 s slack) with an answer or
  UNAVAILABLE naming the shard; allow_partial calls are answered, and an answer that
  lacks shard 1 names it in missing_shards (and only it);
- while the shard is down, every non-partial call fails and every partial one names it;
- GetIndexStats (shard 1 not available) and ReadIndexDatapoints (UNAVAILABLE naming it)
  answer within the deadline + 1 s while it is down;
- every call started 2 s after the restarted shard listens is a full answer (the same
  neighbours as before the fault), and the coordinator process is the same one.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mh  # noqa: E402

VICTIM = 1


def main():
    with mh.Cluster(3) as cl:
        x, pool, base = mh.bootstrap(cl)
        coord_pid = cl.coord.pid
        load = mh.Load(cl, pool, deadline_s=2.0).start()
        time.sleep(1.5)
        rc = cl.shards[VICTIM].kill9()  # returns once the process is gone
        t_kill = time.monotonic()
        assert rc == -9, rc
        time.sleep(0.3)
        mh.probe_down(cl, VICTIM, 0.7 + 1.0)
        time.sleep(1.0)
        t_restart = time.monotonic()
        cl.start_shard(VICTIM)
        up_at = cl.shards[VICTIM].started_at
        print("shard %d restarted, listening %.3fs after the restart began" %
              (VICTIM, up_at - t_restart))
        time.sleep(3.5)
        load.stop()
        mh.check_fault_calls(cl, load, base, VICTIM, t_kill + 0.3, t_restart, up_at, "kill -9 shard",
                             max_fail_s=0.7 + 1.0)
        assert cl.coord.alive() and cl.coord.pid == coord_pid, "the coordinator was restarted"
        cl.stop_all()
    print("test_shard_kill: OK")


if __name__ == "__main__":
    main()
