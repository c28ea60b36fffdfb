"""make bench-ha-elect: how fast a follower takes over when the leader dies, with the
election watched (the default: a watch on PREFIX/leader makes a follower campaign as soon
as the key is deleted) and polled (TSR_LEADER_WATCH=0: followers campaign every ttl/3,
at least 200 ms, the behaviour before the watch) — side by side in one run
(docs/ha.md "Failover timings").

One etcd member (BENCH_ELECT_ETCD members), one shard, two coordinators with lease TTL
BENCH_ELECT_TTL (2) s. Each round (BENCH_ELECT_ROUNDS per mode, 5; the modes alternate
round by round so that machine noise hits both alike): kill -9 of the leader, then
`etcdctl watch PREFIX/leader` (started before the kill) timestamps the key's DELETE (the
dead leader's lease expired: etcd checks leases every 500 ms) and the next PUT (the new
leader's key); both coordinators start afresh for each round. Printed per
mode: delete -> new leader and kill -> new leader (median, min, max), and their ratio.
"""
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import etcd_harness as eh  # noqa: E402


class KeyWatch:
    """etcdctl watch KEY in the background: (monotonic time, "PUT"|"DELETE") per event."""

    def __init__(self, etcd, key):
        env = dict(os.environ, ETCDCTL_API="3")
        self.p = subprocess.Popen(["etcdctl", "--endpoints", etcd.endpoints, "watch", key],
                                  stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        self.events, self.cv = [], threading.Condition()
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()
        time.sleep(0.3)  # the watch is established (etcdctl prints nothing until an event)

    def read(self):
        for line in self.p.stdout:
            line = line.strip()
            if line in ("PUT", "DELETE"):
                with self.cv:
                    self.events.append((time.monotonic(), line))
                    self.cv.notify_all()

    def wait(self, kind, after, timeout):
        """The time of the first event of kind after time `after` (None on timeout)."""
        t_end = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, k in self.events:
                    if k == kind and t >= after:
                        return t
                left = t_end - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)


def one_round(cl, watch, env):
    """Both coordinators started with env; kill -9 of the leader; the two intervals. The
    survivor is stopped (its lease revoked) so that the next round starts afresh."""
    for c in cl.coords:
        c.start(env=env)
    try:
        leader = cl.leader(timeout=20)
        t_end = time.time() + 20
        while True:  # both hold a lease and a member key: the follower can campaign
            try:
                if all(len(c.ha(2)[0]) == 2 for c in cl.coords):
                    break
            except Exception:
                pass
            assert time.time() < t_end, "the coordinators do not list each other"
            time.sleep(0.1)
        t_kill = time.monotonic()
        leader.kill()
        t_del = watch.wait("DELETE", t_kill, cl.ttl + 10)
        t_put = watch.wait("PUT", t_del, cl.ttl + 10) if t_del else None
        if t_put is None:
            raise AssertionError("no new leader key after the kill:\n%s" % cl.logs())
        return t_put - t_del, t_put - t_kill
    finally:
        for c in cl.coords:
            c.stop()


def main():
    eh.skip_without_etcd()
    rounds = int(os.environ.get("BENCH_ELECT_ROUNDS", "5"))
    ttl = int(os.environ.get("BENCH_ELECT_TTL", "2"))
    members = int(os.environ.get("BENCH_ELECT_ETCD", "1"))
    modes = [("watched", {}), ("polled", {"TSR_LEADER_WATCH": "0"})]
    got = {name: [] for name, _ in modes}
    cl = eh.HACluster(groups=1, replicas=1, coords=0, etcd_members=members, ttl=ttl)
    try:
        cl.coords = [eh.Coord(cl, i) for i in range(2)]
        watch = KeyWatch(cl.etcd, cl.prefix + "/leader")
        try:
            for r in range(rounds):
                for name, extra in modes:
                    got[name].append(one_round(cl, watch, dict(os.environ, **extra)))
                    print("round %d %-8s delete -> leader %.3f s, kill -> leader %.3f s"
                          % ((r, name) + got[name][-1]), flush=True)
        finally:
            watch.stop()
    finally:
        cl.stop()

    def stat(xs):
        return "%6.3f s  (%5.3f .. %5.3f)" % (statistics.median(xs), min(xs), max(xs))

    print("leader key deleted -> new leader key, and kill -9 -> new leader key; TTL %d s, "
          "%d rounds each, etcd x%d" % (ttl, rounds, members))
    print("%-9s %-30s %-30s" % ("election", "delete -> new leader", "kill -> new leader"))
    for name, _ in modes:
        print("%-9s %-30s %-30s" % (name, stat([a for a, _ in got[name]]),
                                     stat([b for _, b in got[name]])))
    w = [statistics.median(x) for x in zip(*got["watched"])]
    p = [statistics.median(x) for x in zip(*got["polled"])]
    print("polled / watched (medians): delete -> leader %.1fx, kill -> leader %.2fx"
          % (p[0] / w[0], p[1] / w[1]))


if __name__ == "__main__":
    main()
