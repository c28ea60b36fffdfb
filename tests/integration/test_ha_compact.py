"""etcd history compaction by the leader (--etcd-compact S, docs/ha.md "etcd's history"):
etcd x3, coordinators x2, one shard; all real processes on loopback.

- Negative control, --etcd-compact 0: seconds after an update, etcd still answers a read
  at a revision from before it (nothing compacted the history).
- --etcd-compact 1: within seconds a read at that old revision fails with etcd's
  "required revision has been compacted" (read with etcdctl: etcd itself says so).
- A follower whose watch must resume from a revision compaction removed: the follower is
  stopped (SIGSTOP), the etcd member its watch stream is on is killed, the leader commits
  version 2 and compaction passes it; resumed (SIGCONT), the follower's watch cannot resume
  (its log says so), re-reads and restarts from the current revision: it serves version 2,
  and sees a streamed write the leader makes after that (ReadIndexDatapoints).
- Another update commits meanwhile, and every coordinator serves it.
Exit 77 only when etcd is not installed.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 8


def tessera(*args, timeout=120):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def mod_rev(cl, key):
    rc, out, err = cl.etcd.etcdctl("get", "-w", "json", key)
    assert rc == 0, err
    return int(json.loads(out)["kvs"][0]["mod_revision"])


def read_at(cl, rev, key):
    """(ok, text) of a read of key at revision rev."""
    rc, out, err = cl.etcd.etcdctl("get", "--rev", str(rev), key)
    return rc == 0, (out + err).strip()


def wait_compacted(cl, rev, key, timeout):
    """Seconds until a read at rev fails with "compacted"; AssertionError after timeout."""
    t0 = time.time()
    while True:
        ok, text = read_at(cl, rev, key)
        if not ok and "compacted" in text:
            return time.time() - t0
        assert time.time() - t0 < timeout, \
            "revision %d still readable after %ds (%s)\n%s" % (rev, timeout, text, cl.logs())
        time.sleep(0.2)


def update(cl, c, root, version):
    """tessera update on c; retried for up to 10 s only while it fails fast because etcd
    is electing a raft leader (after a member was killed: not what this test is about)."""
    t_end = time.time() + 10
    while True:
        rc, out, err = tessera("update", "--target", c.target, "--batch-root", root)
        if rc == 0 or "etcd unreachable, no update starts" not in err or time.time() > t_end:
            break
        time.sleep(0.5)
    assert rc == 0 and "SUCCEEDED, version %d" % version in out, (rc, out, err, cl.logs())


def restart_coords(cl, extra):
    for c in cl.coords:
        c.stop()
    cl.coord_extra = extra
    for c in cl.coords:
        c.start()
    return cl.leader(timeout=20)


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, D)).astype("float32")
    root = sh.tmpdir("tsr-ha-compact-")
    b = [ch.write_batch(os.path.join(root, "b%d" % i),
                        [ch.dp_json("v%d-%04d" % (i, j), x[j] + i) for j in range(300)])
         for i in range(3)]
    cl = eh.HACluster(groups=1, replicas=1, coords=2, dims=D, ttl=5,
                      config={"nlist": 8, "pq_m": 2, "nprobe": 4},
                      coord_extra=("--etcd-compact", "0"))
    vkey = cl.prefix + "/version"
    try:
        leader = cl.leader(timeout=20)
        update(cl, leader, b[0], 1)
        r1 = mod_rev(cl, vkey)
        # negative control: --etcd-compact 0 keeps the history
        time.sleep(3)
        ok, text = read_at(cl, r1 - 1, vkey)
        assert ok, "--etcd-compact 0: revision %d was compacted: %s" % (r1 - 1, text)
        print("--etcd-compact 0: revision %d still readable 3 s after the update" % (r1 - 1))

        # --etcd-compact 1: the leader compacts within seconds
        leader = restart_coords(cl, ("--etcd-compact", "1"))
        took = wait_compacted(cl, r1, vkey, 15)
        print("--etcd-compact 1: revision %d compacted %.1f s after the restart" % (r1, took))
        follower = cl.follower(leader)
        cl.wait_version(1)

        # a follower whose watch resumes from a compacted revision
        follower.proc.proc.send_signal(signal.SIGSTOP)
        try:
            cl.etcd.kill(0)  # the member both coordinators' watch streams are on
            cl.etcd.wait_healthy(members=[1, 2])  # raft may elect a new leader first
            update(cl, leader, b[1], 2)
            r2 = mod_rev(cl, vkey)
            took = wait_compacted(cl, r2 - 1, vkey, 15)
            print("version 2 committed at revision %d, compacted past it %.1f s later" %
                  (r2, took))
        finally:
            follower.proc.proc.send_signal(signal.SIGCONT)
        waited = cl.wait_version(2, timeout=15)
        t_end = time.time() + 15
        while "the watch could not resume" not in follower.proc.text():
            assert time.time() < t_end, "the follower's watch did not restart after " \
                "compaction:\n" + follower.proc.text()[-3000:]
            time.sleep(0.1)
        assert "compacted" in follower.proc.text(), follower.proc.text()[-3000:]
        print("follower on version 2 %.2f s after SIGCONT; its watch restarted from the "
              "current revision (its start revision was compacted)" % waited)

        # a streamed write on the leader reaches the follower (its stream watch works)
        up = tp.UpsertDatapointsRequest(datapoints=[tp.IndexDatapoint(
            datapoint_id="after-compact", feature_vector=[float(v) for v in x[0] + 9])])
        leader.stub.UpsertDatapoints(up, timeout=20)
        t_end = time.time() + 15
        while True:
            r = follower.stub.ReadIndexDatapoints(
                tp.ReadIndexDatapointsRequest(ids=["after-compact"]), timeout=10)
            if len(r.datapoints) == 1:
                break
            assert time.time() < t_end, "the follower does not see the streamed write"
            time.sleep(0.1)
        print("the follower sees the leader's streamed write")

        # and an update commits while compaction goes on
        update(cl, leader, b[2], 3)
        cl.wait_version(3, timeout=15)
        assert cl.etcd.committed_version(cl.prefix) == 3
        wait_compacted(cl, mod_rev(cl, vkey) - 1, vkey, 15)
        print("version 3 committed and served by both; history compacted past it")
    finally:
        cl.stop()
    print("test_ha_compact: OK")


if __name__ == "__main__":
    main()
