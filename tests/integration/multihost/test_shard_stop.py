#!/usr/bin/env python3
"""Fault case 2 (issue 7): SIGSTOP of a shard under load, across simulated hosts.

A stopped process keeps its sockets: the kernel still accepts and ACKs, nothing answers.
Under the load of test_shard_kill (client deadline 2 s, search_deadline_ms 700), shard 1
gets SIGSTOP, stays stopped until HTTP/2 keepalive has dropped the coordinator's
connection to it, then gets SIGCONT. Asserts:
- no call hangs and none takes longer than the coordinator's deadline + 1 s (failures come
  at the 0.7 s deadline, not later); failures are UNAVAILABLE naming shard 1, allow_partial
  calls are answered naming it in missing_shards;
- keepalive detects the stopped peer: the coordinator's ESTABLISHED connection to the
  shard (seen with `ss` in the coordinator's namespace) is gone within keepalive time +
  timeout (common/net/rpc_client.c: 5 s + 3 s) + 3 s slack;
- GetIndexStats and ReadIndexDatapoints answer within the deadline + 1 s while stopped;
- every call started 2 s after SIGCONT is a full answer, with the same coordinator.
"""
import os
import signal
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
        conns = cl.established(0, cl.shard_addr(VICTIM))
        assert conns, "no connection from the coordinator to shard %d" % VICTIM
        t_stop = time.monotonic()
        cl.shards[VICTIM].signal(signal.SIGSTOP)
        limit = mh.KA_TIME_S + mh.KA_TIMEOUT_S + 3.0
        took = mh.wait_until(lambda: not set(conns) & set(cl.established(0, cl.shard_addr(VICTIM))),
                             limit, step=0.1)
        assert took is not None, "keepalive did not drop the connection to the stopped " \
            "shard within %.1fs (connections %s)" % (limit, cl.established(0, cl.shard_addr(VICTIM)))
        print("keepalive dropped the coordinator's connection to the stopped shard after %.2fs"
              % took)
        mh.probe_down(cl, VICTIM, 0.7 + 1.0)
        t_cont = time.monotonic()
        cl.shards[VICTIM].signal(signal.SIGCONT)
        time.sleep(3.5)
        load.stop()
        first = mh.check_fault_calls(cl, load, base, VICTIM, t_stop + 0.1, t_cont, t_cont,
                                     "SIGSTOP shard", max_fail_s=0.7 + 1.0)
        assert first is not None
        assert cl.coord.alive() and cl.coord.pid == coord_pid
        cl.stop_all()
    print("test_shard_stop: OK")


if __name__ == "__main__":
    main()
