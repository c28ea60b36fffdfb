#!/usr/bin/env python3
"""Fault case 5 (issue 7): the disk of one shard fills up during an update.

Shard 0's data dir is a tmpfs mounted by the test (before the shard starts, so the
shard's namespace sees it). After version 1 is served, the tmpfs is shrunk to what
version 1 uses + 64 KiB, and an update adding 20000 vectors (about 6700 for shard 0, far
more than 64 KiB) runs under the query load of test_shard_kill. Writing version 2 (the
shard writes it when asked to Prepare) fails with ENOSPC. Asserts:
- the operation FAILS, its error names shard 0 (address), the call and
  "No space left on device";
- version 1 keeps serving: every query during and after the update is a full answer
  from version 1 (same neighbours as before), none fails, none hangs;
- every shard ends on version 1 with nothing staged or prepared (the others aborted);
- nothing is corrupted: no temporary entries left on the tmpfs; shard 0 killed -9 and
  restarted loads version 1 (logged, no refusal) and answers in full;
- with space again (tmpfs grown), the same update succeeds (version 2 everywhere);
- part B (commit_on_full_disk): the disk fills after the commit point; see there.
"""
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mh  # noqa: E402

VICTIM = 0


def used_bytes(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def remount(path, size):
    subprocess.run(["mount", "-o", "remount,size=%d" % size, path], check=True,
                   capture_output=True)


def fill(path):
    """Fills the file system of path completely; returns the filler's path."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for n in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * n)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def commit_on_full_disk(cl, data, tp, y):
    """Part B: the disk fills up after the commit point. The coordinator is killed right
    after it flipped its CURRENT to version 3 (every shard has prepared 3, none committed);
    shard 0's disk is then filled completely, and the coordinator restarted. Reconcile's
    Commit(3) on shard 0 cannot write its CURRENT (ENOSPC): asserts that shard 0 keeps
    version 3 prepared (CURRENT on disk still 2) and queries on version 3 are answered in
    full meanwhile (a shard answers a prepared version that is named), the coordinator
    logs the failed Commit naming the shard and ENOSPC, and once space is freed the shard
    converges on 3; restarted, it loads 3."""
    import grpc
    b = write_batch_near(cl, y)
    cl.coord.stop()
    cl.start_coord(env={"TSR_COORD_CRASH_AT": "flipped"})
    try:
        cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b), timeout=10)
    except grpc.RpcError:
        pass
    assert cl.coord.wait_exit(60) == 137, cl.coord.text()
    filler = fill(data)
    cl.start_coord()
    mh.wait_until(lambda: "No space left on device" in cl.coord.text(), 10, step=0.1)
    line = [ln for ln in cl.coord.log if "No space left on device" in ln]
    assert line and "shard %d " % VICTIM in line[0] and cl.shard_addr(VICTIM) in line[0] and \
        "Commit(3)" in line[0], \
        cl.coord.text()
    print("coordinator log: %s" % line[0])
    # reconcile commits the shards one after the other (the victim is the first): wait for
    # the others rather than reading them the moment the victim's failure is logged
    mh.wait_until(lambda: all(cv == 3 for k, (cv, _) in enumerate(cl.shard_versions())
                              if k != VICTIM), 10, step=0.1)
    st = cl.shard_versions()
    assert st[VICTIM][0] == 2 and (3, mh.stubs()[2].ShardVersion.PREPARED) in st[VICTIM][1], st
    assert all(cv == 3 for k, (cv, _) in enumerate(st) if k != VICTIM), st
    with open(os.path.join(data, "CURRENT")) as f:
        assert f.read().strip() == "v000002"
    for k in range(5):
        r = cl.stub.FindNeighbors(mh.make_query(tp, y[k] + 100.0), timeout=5)
        # every shard (shard 0 too) answered for version 3; the new far-away ids are found
        assert r.version == 3 and not r.missing_shards, r
        assert all(i.startswith("z") for i in mh.answer_ids(r)), mh.answer_ids(r)
    print("shard 0 with a full disk holds version 3 prepared (CURRENT 2) and answers for it")
    os.unlink(filler)
    took = cl.converge(3)
    print("space freed: shard 0 committed version 3 %.2fs later" % took)
    cl.shards[VICTIM].kill9()
    sh = cl.start_shard(VICTIM)
    assert "serving version 3" in sh.text() and "refused" not in sh.text(), sh.text()
    cl.converge(3)


def write_batch_near(cl, y):
    return mh.write_batch(os.path.join(cl.root, "b3"),
                          [("z%05d" % k, y[k] + 100.0) for k in range(50)])


def main():
    import grpc
    tp = mh.stubs()[0]
    with mh.Cluster(3) as cl:
        data = cl.shard_dir(VICTIM)
        cl.mount_tmpfs(data, 16 << 20)
        x, pool, base = mh.bootstrap(cl)
        used = used_bytes(data)
        remount(data, used + (64 << 10))
        print("shard %d: tmpfs holds %d KiB after version 1, shrunk to %d KiB" %
              (VICTIM, used >> 10, (used >> 10) + 64))
        rng = np.random.default_rng(5)
        y = rng.normal(size=(20000, cl.dims)).astype("float32")
        big = mh.write_batch(os.path.join(cl.root, "b2"),
                             [("y%05d" % i, y[i]) for i in range(len(y))])
        load = mh.Load(cl, pool, deadline_s=2.0, partial=False).start()
        time.sleep(0.5)
        op = cl.update(big)
        time.sleep(0.5)
        load.stop()
        calls = load.snapshot()
        load.report("disk full on shard %d during an update" % VICTIM, calls)
        print("operation: %s: %s" % (tp.Operation.State.Name(op.state), op.error))
        assert op.state == tp.Operation.FAILED, op
        assert ("shard %d (%s)" % (VICTIM, cl.shard_addr(VICTIM))) in op.error, op.error
        assert "No space left on device" in op.error and "Prepare" in op.error, op.error
        assert not load.hung(calls)
        bad = [c for c in calls if not (mh.is_full(c, base) and c.version == 1)]
        assert not bad, "%d queries not answered in full from version 1: %s %s v%d" % (
            len(bad), bad[0].code, bad[0].details, bad[0].version)
        assert len(calls) >= 10, len(calls)
        cl.converge(1)
        left = [n for n in os.listdir(data) if n.startswith(".tmp") or n.endswith(".tmp")]
        assert not left, "temporary entries left on the full disk: %s" % left
        assert sorted(n for n in os.listdir(data) if n.startswith("v")) == ["v000001"], \
            os.listdir(data)
        # restart the full shard: it must load version 1 as it is
        cl.shards[VICTIM].kill9()
        sh = cl.start_shard(VICTIM)
        assert "refused" not in sh.text(), sh.text()
        assert "serving version 1" in sh.text(), sh.text()
        cl.converge(1)
        back = mh.wait_until(lambda: mh.full_answer(cl, pool[0], base[0]), 5)
        assert back is not None
        for qi in range(len(pool)):
            r = cl.stub.FindNeighbors(mh.make_query(tp, pool[qi]), timeout=5)
            assert r.version == 1 and not r.missing_shards and mh.answer_ids(r) == base[qi]
        print("shard %d restarted on the full disk: serves version 1 in full" % VICTIM)
        # free space: the same update now succeeds
        remount(data, 16 << 20)
        op = cl.update(big)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        cl.converge(2)
        r = cl.stub.FindNeighbors(mh.make_query(tp, y[7]), timeout=5)
        assert r.version == 2 and mh.answer_ids(r)[0] == "y00007", r
        print("with space again the update succeeds: version 2 everywhere")
        commit_on_full_disk(cl, data, tp, y)
        cl.stop_all()
    del grpc
    print("test_disk_full: OK")


if __name__ == "__main__":
    main()
