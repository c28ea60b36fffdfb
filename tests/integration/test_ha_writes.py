"""Writes with several coordinators (docs/ha.md): etcd x3, coordinators x2 (TTL 2 s), 2
shard groups x 2 replicas.

- `tessera upsert --target FOLLOWER` and `tessera remove --target FOLLOWER`: the follower
  refuses with "not the leader: the leader is ADDR", the CLI goes straight to ADDR and says
  which coordinator answered; the datapoint is readable (then gone) on both coordinators.
- kill -9 of the leader after those streamed writes: the new leader takes the next
  UpdateIndex (SUCCEEDED, every shard on the version etcd holds) and the next upsert, and
  the streamed write made before the kill is still served.
Exit 77 only when etcd is not installed.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 1000
TTL = 2


def tessera(*args, stdin=None, timeout=180):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout, input=stdin)
    return r.returncode, r.stdout, r.stderr


problems = []  # every check runs; the test fails at the end naming each failed one


def expect(cond, what):
    if not cond:
        problems.append(what)
        print("FAIL: " + what)
    return cond


def wait_read(c, did, present, timeout=10):
    t_end = time.time() + timeout
    while True:
        rc, out, err = tessera("read", "--target", c.target, did)
        if (rc == 0) == present:
            return True
        if time.time() > t_end:
            return expect(False, "ReadIndexDatapoints(%s) on %s: %s, want %s (%s)" % (
                did, c.target, "found" if rc == 0 else "not found",
                "found" if present else "not found", err.strip()))
        time.sleep(0.1)


def main():
    eh.skip_without_etcd()
    rng = np.random.default_rng(21)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-ha-writes-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("h%05d" % i, x[i])
                                                   for i in range(N)])
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("j%05d" % i, x[i] + 1)
                                                   for i in range(100)])
    cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=TTL,
                      config={"nlist": 8, "pq_m": 4, "nprobe": 8})
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b0)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        leader = cl.leader()
        follower = cl.follower(leader)
        for did in ("w1", "w2"):
            line = json.dumps(ch.dp_json(did, x[3] + 3)) + "\n"
            rc, out, err = tessera("upsert", "--target", follower.target, "--json", "-",
                                   stdin=line)
            assert rc == 0 and "upserted 1 datapoint" in out, (rc, out, err)
            assert "answered by %s (%s: UNAVAILABLE: not the leader: the leader is %s" % (
                leader.target, follower.target, leader.target) in err, err
        rc, out, err = tessera("remove", "--target", follower.target, "w2")
        assert rc == 0 and "removed 1" in out, (rc, out, err)
        wait_read(leader, "w1", True)
        wait_read(leader, "w2", False)
        # a follower serves the leader's streamed writes too (reads and queries)
        wait_read(follower, "w1", True)
        wait_read(follower, "w2", False)
        print("upsert/remove --target FOLLOWER: redirected to the leader (%s); both "
              "coordinators serve the writes" % err.strip()[:90])

        leader.kill()
        new = cl.leader(timeout=TTL + 10, exclude=(leader,))
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b1)
        expect(rc == 0 and "SUCCEEDED, version 2" in out,
               "the new leader's first UpdateIndex after the old leader's streamed writes: "
               "%s" % (out.strip().splitlines() or [err.strip()])[0])
        held = cl.etcd.committed_version(cl.prefix)
        expect(held == 2 and set(cl.shard_versions().values()) == {2},
               "etcd holds %s, shards on %s" % (held, cl.shard_versions()))
        wait_read(new, "w1", True)
        line = json.dumps(ch.dp_json("w3", x[4] + 3)) + "\n"
        rc, out, err = tessera("upsert", "--target", cl.targets, "--json", "-", stdin=line)
        expect(rc == 0 and "upserted 1 datapoint" in out, "upsert on the new leader: %s" %
               (out + err).strip()[:200])
        wait_read(new, "w3", True)
        print("after kill -9 of the leader (new leader %s): checks done"
              % new.target)
    finally:
        cl.stop()
    assert not problems, "%d problem(s):\n  %s" % (len(problems), "\n  ".join(problems))
    print("test_ha_writes: OK")


if __name__ == "__main__":
    main()
