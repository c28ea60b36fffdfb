"""Wall-clock steps do not touch the coordinator's intervals (issue 12: deadlines and
back-off were computed from CLOCK_REALTIME).

The coordinator runs under tests/shim/clockstep.c (LD_PRELOAD, built by `make all` as
BUILD/tests/clockstep.so): its CLOCK_REALTIME, gettimeofday() and time() are the real wall
clock plus an offset the test writes into a file, so the test steps the clock the
coordinator sees by an hour back and forward while it runs. One shard group of two
replicas. Asserts, for each step:
  - reconcile keeps its pace: Shard.Stats calls (tessera_shard_calls_total) over a few
    seconds stay at about one pass a second. With the old wall-clock sleep a step back made
    the reconcile thread spin (its deadline already past: thousands of Stats a second) and
    a step forward put it to sleep for the hour (no Stats at all);
  - queries still answer, and fail over: with one replica killed every query is answered
    by the other, the dead one is marked down (back-off), and once it restarts it is
    marked up again within seconds and answers queries again.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
from test_coord_replicas import answers as ask, metric, metrics, restart_shard, wait_for  # noqa: E402

D = 16
N = 1500
HOUR_MS = 3600 * 1000
STATS = "/tessera.v1.Shard/Stats"
WINDOW_S = 3.0


def stats_calls(mport):
    return metric(metrics(mport), "tessera_shard_calls_total", method=STATS) or 0


def stats_rate(mport, settle=1.5):
    """Stats calls per second the reconcile thread makes, after `settle` seconds (a sleep
    that began before a step ends first)."""
    time.sleep(settle)
    c0 = stats_calls(mport)
    time.sleep(WINDOW_S)
    return (stats_calls(mport) - c0) / WINDOW_S


def step(path, offset_ms):
    with open(path + ".tmp", "w") as f:
        f.write("%d\n" % offset_ms)
    os.replace(path + ".tmp", path)
    time.sleep(0.05)  # the shim re-reads the file every 5 ms


def main():
    shim = os.path.join(os.environ.get("TSR_BUILD", "build/release"), "tests", "clockstep.so")
    assert os.path.exists(shim), "%s missing: run make all" % shim
    tp, _, _, _ = ch.stubs()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-clock-")
    offset = os.path.join(root, "clock-offset-ms")
    step(offset, 0)
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("c%05d" % i, x[i])
                                                   for i in range(N)])
    env = {"LD_PRELOAD": shim, "TSR_CLOCKSTEP_FILE": offset,
           "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0") +
           ":verify_asan_link_order=0"}
    cl = ch.Cluster(2, D, {"nlist": 8, "pq_m": 4, "nprobe": 8})
    cl.stop_coord()
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = [[cl.shards[0].target, cl.shards[1].target]]  # one group, two replicas
    with open(cl.config, "w") as f:
        json.dump(c, f)
    mport = ch.free_port()
    cl.start(env, extra_args=["--metrics-listen", "127.0.0.1:%d" % mport])
    try:
        op = cl.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        xs = x[rng.choice(N, 20, replace=False)]
        expect = ask(cl, tp, xs)

        base = stats_rate(mport)
        print("reconcile: %.1f Stats/s with the clock untouched" % base)
        assert 0.5 <= base <= 10, base

        # a step back by an hour: the old wall-clock deadline of the reconcile sleep was
        # already past -> a busy loop of Stats
        step(offset, -HOUR_MS)
        back = stats_rate(mport)
        print("reconcile: %.1f Stats/s after a step of the wall clock by -1 h" % back)
        assert 0.5 <= back <= 10, "reconcile pace after a step back: %.1f Stats/s" % back
        assert ask(cl, tp, xs) == expect

        # a step forward by an hour (two from the last): the old sleep lasted the hour
        step(offset, +HOUR_MS)
        fwd = stats_rate(mport)
        print("reconcile: %.1f Stats/s after a step of the wall clock by +2 h" % fwd)
        assert 0.5 <= fwd <= 10, "reconcile pace after a step forward: %.1f Stats/s" % fwd
        assert ask(cl, tp, xs) == expect

        # back-off and failover across a step: replica 1 dies, queries fail over to
        # replica 0 and replica 1 is marked down; the clock steps back by two hours; the
        # replica restarts and is marked up again within seconds, then answers queries
        victim = cl.shards[1]
        victim.kill()
        assert ask(cl, tp, xs) == expect
        wait_for("the dead replica marked down", lambda: metric(
            metrics(mport), "tessera_shard_up", address=victim.target) == 0, 10)
        step(offset, -HOUR_MS)
        assert ask(cl, tp, xs) == expect
        cl.shards[1] = victim = restart_shard(victim)
        took = wait_for("the restarted replica marked up", lambda: metric(
            metrics(mport), "tessera_shard_up", address=victim.target) == 1, 10)
        print("a replica restarted after a -2 h step: up again in %.1fs" % took)
        searched = lambda: metric(metrics(mport), "tessera_shard_calls_total",  # noqa: E731
                                  address=victim.target, method="/tessera.v1.Shard/Search") or 0
        s0 = searched()
        for _ in range(3):
            assert ask(cl, tp, xs) == expect
        assert searched() > s0, "the restarted replica got no query"
        back2 = stats_rate(mport, settle=0.5)
        assert 0.5 <= back2 <= 10, back2
        step(offset, 0)
        cl.stop_coord()
    finally:
        cl.stop()
    print("test_coord_clock: OK")


if __name__ == "__main__":
    main()
