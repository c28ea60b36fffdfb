#!/usr/bin/env python3
"""test_cluster_add_group -- a shard group added to a `tessera cluster up` cluster is
supervised and comes back after a restart (issue 41, item 4: a group added with `tessera
shards add` to a process run by hand was not in coordinator.json and not supervised; after a
restart the coordinator routed to it and, that process down, every query failed).

  a. `tessera cluster add-group --data DIR` on a running 2-shard cluster with data: exit 0,
     the supervisor starts the group's tessera-shard, stats shows 3 groups up and the group
     holds vectors, a query answers;
  b. killed with SIGKILL, the added group's process is restarted by cluster up ("shard-2
     was killed by signal 9 (SIGKILL); restarting ...") and queries answer again;
  c. cluster up stopped and started again on the same --data: it starts the added group
     with the shards ("shard-2 listening"), stats shows 3 groups up with every vector, and
     a query right after "listening" answers.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_cluster_up import Cluster, SHARDS, report, run, load_sample  # noqa: E402
from shard_harness import free_range  # noqa: E402

N = 600


def query_ok(target, q):
    r = run(["query", "--target", target, "--vector", q, "--k", "5"])
    return r.returncode == 0 and len([l for l in r.stdout.splitlines() if "dp-" in l]) == 5, r


def stats_groups(target):
    """[(addr, state, vectors)] of `tessera stats`."""
    r = run(["stats", "--target", target])
    rows = re.findall(r"(?m)^\s+shard (?:\d+\s+)?(\S+)\s+(\S+)\s+version \d+\s+vectors (\d+)", r.stdout)
    return [(a, s, int(v)) for a, s, v in rows], r.stdout


def main():
    fails = []
    tmp = tempfile.mkdtemp(prefix="tsr-addgroup-")
    data = os.path.join(tmp, "d")
    port = free_range(SHARDS + 4)
    target = "127.0.0.1:%d" % port
    c = None
    try:
        c = Cluster(data, port)
        if c.wait_line("coordinator listening", 90) is None:
            fails.append("cluster up did not start:\n%s" % "".join(c.lines))
            return 1
        q = load_sample(data, port, fails)
        r = run(["cluster", "add-group", "--data", data], timeout=300)
        print("a. cluster add-group: exit %d\n%s%s" % (r.returncode, r.stdout[-600:], r.stderr[-600:]))
        m = re.search(r"shard-2 on 127\.0\.0\.1:(\d+)", r.stdout)
        if r.returncode != 0 or m is None:
            fails.append("a. add-group: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
            return 1
        gport = int(m.group(1))
        rows, text = stats_groups(target)
        print("a. stats after add-group:\n" + text)
        added = [x for x in rows if x[0] == "127.0.0.1:%d" % gport]
        if len(rows) != 3 or any(s != "up" for _, s, _ in rows) or not added or added[0][2] == 0 \
                or sum(v for _, _, v in rows) != N:
            fails.append("a. stats after add-group: %s" % rows)
        ok, r = query_ok(target, q)
        if not ok:
            fails.append("a. query after add-group: %s %s" % (r.stdout, r.stderr))
        # b. the added group's process dies: cluster up restarts it
        pids = subprocess.run(["pgrep", "-f", "tessera-shard --listen 127.0.0.1:%d" % gport],
                              capture_output=True, text=True).stdout.split()
        if len(pids) != 1:
            fails.append("b. the added group's process: pids %s" % pids)
        else:
            os.kill(int(pids[0]), signal.SIGKILL)
            t0 = time.time()
            while time.time() - t0 < 30 and not query_ok(target, q)[0]:
                time.sleep(0.3)
            ok, r = query_ok(target, q)
            line = c.wait_line("shard-2 was killed", 5) or ""
            print("b. SIGKILL of shard-2: queries answer again after %.1f s (%s)"
                  % (time.time() - t0, line.strip()))
            # the restart line says what happened (it read "exited (status 0, signal 9)")
            if "shard-2 was killed by signal 9 (SIGKILL); restarting" not in line:
                fails.append("b. the restart line: %r" % line)
            if not ok:
                fails.append("b. after SIGKILL of the added group: %s %s" % (r.stdout, r.stderr))
        c.stop()
        c = None
        # c. a restart brings the added group back with the shards
        c = Cluster(data, port)
        line = c.wait_line("coordinator listening", 90)
        if line is None:
            fails.append("c. restart did not start:\n%s" % "".join(c.lines))
            return 1
        ok, r = query_ok(target, q)
        listen = c.wait_line("shard-2 listening", 5)
        rows, text = stats_groups(target)
        print("c. restart: query %s, %s, stats:\n%s" % ("ok" if ok else "FAILED",
                                                        (listen or "no shard-2 line").strip(), text))
        if not ok:
            fails.append("c. query after the restart: %s %s" % (r.stdout, r.stderr))
        if listen is None or "127.0.0.1:%d" % gport not in listen:
            fails.append("c. the restart did not start shard-2 on %d:\n%s" % (gport, "".join(c.lines)))
        if len(rows) != 3 or any(s != "up" for _, s, _ in rows) or sum(v for _, _, v in rows) != N:
            fails.append("c. stats after the restart: %s" % rows)
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report(fails)


if __name__ == "__main__":
    sys.exit(main())
