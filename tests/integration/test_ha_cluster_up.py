#!/usr/bin/env python3
"""`tessera cluster up --coordinators 2 --etcd-local 3` (issue 16; docs/ha.md):

  a. without etcd (TSR_ETCD naming no executable): exit 1 at once with a message saying
     etcd is not installed, nothing started; --coordinators 2 without --etcd-local is a
     usage error (exit 2);
  b. it announces "cluster: coordinator-<i> listening on ADDR" for i = 0, 1 (and each
     etcd member) once everything answers;
  c. `tessera update --target C0,C1` succeeds and both coordinators give the same answers,
     one of them named the leader by both (`tessera stats --json`: coordinators, leader);
  d. kill -9 of the leader coordinator: the other answers at once, the supervisor
     restarts the killed one (same address), which serves the same answers again;
  e. kill -9 of an etcd member: restarted by the supervisor; an update still succeeds;
  f. SIGTERM stops everything: exit 0 within 5 s, no process killed after the grace period
     (the etcd leader used to wait for a stopped peer: "etcd-2 did not stop in 5000 ms;
     killing"), no process of the run left;
  g. the folder (etcd-0..2 kept) without --etcd-local, or with --etcd-local 1: exit 1 naming
     --etcd-local 3, nothing started.
Exit 77 only when etcd is not installed.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402
from test_cluster_up import Cluster, TESSERA  # noqa: E402

D = 8
N = 600


def tsr(*args, timeout=180):
    r = subprocess.run([TESSERA] + list(args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def pids_of(data, what):
    """pids of processes whose command line holds the data folder and `what`."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if data in cmd and what in cmd:
            out.append(int(p))
    return out


def query(target, vec):
    rc, out, err = tsr("query", "--target", target, "--vector", vec, "--k", "5", "--json")
    assert rc == 0, (target, rc, out, err)
    return [n["id"] for n in json.loads(out)[0]["neighbors"]], err


def main():
    eh.skip_without_etcd()
    tmp = sh.tmpdir("tsr-ha-up-")
    # a.
    r = subprocess.run([TESSERA, "cluster", "up", "--data", os.path.join(tmp, "no"),
                        "--coordinators", "2", "--etcd-local", "3"], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, TSR_ETCD="/nonexistent/etcd"))
    assert r.returncode == 1 and "needs etcd, which is not installed" in r.stderr, r
    assert not os.path.exists(os.path.join(tmp, "no")), "a folder was made without etcd"
    no_etcd = r.stderr.strip()
    r = subprocess.run([TESSERA, "cluster", "up", "--data", os.path.join(tmp, "no"),
                        "--coordinators", "2"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "needs --etcd-local" in r.stderr, r
    print("a. no etcd: exit 1 (%s); --coordinators 2 alone: exit 2" % no_etcd[:90])

    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, D)).astype("float32")
    data = os.path.join(tmp, "c")
    b0 = ch.write_batch(os.path.join(data, "b0"), [ch.dp_json("u%04d" % i, x[i])
                                                   for i in range(N)])
    port = sh.free_range(2 + 2 + 6)
    c = Cluster(data, port, "--coordinators", "2", "--etcd-local", "3", "--dimensions", str(D),
                "--nlist", "8", "--pq-m", "2", "--nprobe", "8")
    try:
        # b.
        coords = []
        for i in range(2):
            line = c.wait_line("cluster: coordinator-%d listening on " % i, 120)
            assert line is not None, "".join(c.lines)
            coords.append(line.split("listening on ")[1].split()[0])
        line = c.wait_line("cluster: etcd-2 listening on ", 10)
        assert line is not None, "".join(c.lines)
        both = ",".join(coords)
        print("b. %s" % " ".join(l.strip() for l in c.lines if l.startswith("cluster:")))
        # c.
        rc, out, err = tsr("update", "--target", both, "--batch-root", b0)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err)
        vec = ",".join("%g" % v for v in x[7])
        a0, a1 = query(coords[0], vec)[0], query(coords[1], vec)[0]
        assert a0 == a1 and a0[0] == "u0007", (a0, a1)
        # a coordinator's member list is a cache refreshed from etcd every few seconds
        # (no etcd call on GetIndexStats), so a member that joined last may show late
        t_end = time.time() + 30
        while True:
            st = [json.loads(tsr("stats", "--target", t, "--json")[1]) for t in coords]
            if all(sorted(s.get("coordinators") or []) == sorted(coords) for s in st) or \
                    time.time() > t_end:
                break
            time.sleep(0.5)
        assert st[0].get("leader") and st[0]["leader"] == st[1].get("leader"), st
        assert all(sorted(s["coordinators"]) == sorted(coords) for s in st), st
        leader = st[0]["leader"]
        li = coords.index(leader)
        print("c. update ok; same answers on both; leader %s" % leader)
        # d.
        pids = pids_of(data, "coordinator-%d " % li)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        got, err = query(coords[1 - li] + "," + leader, vec)
        assert got == a0, got
        t_end = time.time() + 60
        while True:
            new = pids_of(data, "coordinator-%d " % li)
            if new and new != pids:
                rc, out, err = tsr("query", "--target", leader, "--vector", vec, "--k", "5",
                                   "--json")
                if rc == 0:
                    break
            assert time.time() < t_end, "coordinator-%d not restarted:\n%s" % (li, "".join(c.lines))
            time.sleep(0.3)
        assert [n["id"] for n in json.loads(out)[0]["neighbors"]] == a0
        print("d. kill -9 of the leader: the other answered; restarted, same answers")
        # e.
        epids = pids_of(data, "--name etcd-1 ")
        assert len(epids) == 1, epids
        os.kill(epids[0], signal.SIGKILL)
        rc, out, err = tsr("update", "--target", both, "--batch-root", b0)
        assert rc == 0 and "SUCCEEDED, version 2" in out, (rc, out, err)
        t_end = time.time() + 30
        while not [p for p in pids_of(data, "--name etcd-1 ") if p not in epids]:
            assert time.time() < t_end, "etcd-1 not restarted"
            time.sleep(0.3)
        print("e. kill -9 of etcd-1: update ok; etcd-1 restarted")
    finally:
        t_stop = time.time()
        c.stop()
        t_stop = time.time() - t_stop
    # f.
    rest = c.p.stdout.read()
    assert c.p.returncode == 0, (c.p.returncode, "".join(c.lines[-20:]) + rest)
    left = pids_of(data, "")
    assert not left, "processes left: %s" % left
    # every process stops on SIGTERM (the etcd members one at a time, so that none waits
    # for a stopped peer): none is killed after the grace period
    assert "did not stop" not in rest and t_stop < 5, (t_stop, rest)
    print("f. SIGTERM: exit 0 in %.1f s, nothing killed, nothing left" % t_stop)
    # g. the folder of a 3-member etcd without --etcd-local, or with another member count
    for extra in ([], ["--coordinators", "2", "--etcd-local", "1"]):
        r = subprocess.run([TESSERA, "cluster", "up", "--data", data, "--shards", "2", "--port",
                            str(port)] + extra, capture_output=True, text=True, timeout=20)
        assert r.returncode == 1 and "contradicts" in r.stderr and "--etcd-local 3" in r.stderr, \
            (extra, r.returncode, r.stderr)
    print("g. its folder without --etcd-local, or with --etcd-local 1: refused (exit 1)")
    print("test_ha_cluster_up: OK")


if __name__ == "__main__":
    main()
