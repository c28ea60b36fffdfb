#!/usr/bin/env python3
"""Fault case 6 (issue 7): a corrupted file in a shard's version directory.

Version 1 and 2 are served (every shard holds v1 as its fallback and v2 as CURRENT).
A: shard 1 is killed, one byte of v000002/vectors.f32 is flipped, the shard is restarted.
   Asserts: the shard refuses version 2 with an error naming the file, its CRC-32 and the
   MANIFEST's, reverts to version 1 (Stats: CURRENT 1; CURRENT file says v000001; the
   corrupt v000002 directory is removed) and serves it. The coordinator (still on 2)
   logs that it cannot repair the shard; under the query load of test_shard_kill
   queries never hang: non-partial ones fail UNAVAILABLE naming shard 1 and the version
   it does not hold, allow_partial ones are answered naming it in missing_shards.
   A complete overwrite then brings every shard to version 3 with full answers.
B: the MANIFEST of shard 2's CURRENT version (3) is damaged (one byte of a file line):
   the shard refuses it because the manifest's own checksum does not match, and reverts
   to version 2.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mh  # noqa: E402


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x5A]))


def current_file(cl, i):
    with open(os.path.join(cl.shard_dir(i), "CURRENT")) as f:
        return f.read().strip()


def main():
    import grpc
    tp = mh.stubs()[0]
    with mh.Cluster(3) as cl:
        x, pool, base = mh.bootstrap(cl)
        rng = np.random.default_rng(3)
        far = rng.normal(size=cl.dims).astype("float32") * 10
        b2 = mh.write_batch(os.path.join(cl.root, "b2"), [("far", far)])
        op = cl.update(b2)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        cl.converge(2)
        # ---- A: a data file of CURRENT
        load = mh.Load(cl, pool, deadline_s=2.0).start()
        time.sleep(0.5)
        victim = 1
        vaddr = cl.shard_addr(victim)
        cl.shards[victim].kill9()
        vf = os.path.join(cl.shard_dir(victim), "v000002", "vectors.f32")
        flip(vf, os.path.getsize(vf) // 2)
        sh = cl.start_shard(victim)
        text = sh.text()
        assert "version 2 (CURRENT) refused" in text and "vectors.f32: checksum crc32" in text \
            and "MANIFEST says" in text, text
        line = [ln for ln in sh.log if "refused" in ln][0]
        print("shard %d log: %s" % (victim, line))
        assert "falling back to version 1" in text, text
        st = cl.shard_stats(victim)
        assert st.current_version == 1, st
        assert current_file(cl, victim) == "v000001"
        assert not os.path.exists(os.path.dirname(vf)), "the corrupt version is still there"
        time.sleep(2.5)  # queries meet the reverted shard; reconciliation runs
        load.stop()
        calls = load.snapshot()
        load.report("corrupt vectors.f32 on shard %d" % victim, calls)
        assert not load.hung(calls)
        after = [c for c in calls if c.t0 >= sh.started_at + 1.0]
        assert len(after) >= 4, len(after)
        for c in after:
            if c.partial:
                assert c.code == grpc.StatusCode.OK and c.missing == [vaddr], (c.code, c.missing)
            else:
                assert c.code == grpc.StatusCode.UNAVAILABLE, c.code
                assert ("shard %d (%s) failed: FAILED_PRECONDITION" % (victim, vaddr)) in \
                    c.details and "version 2: not held by this shard (current 1)" in c.details, \
                    c.details
        for c in calls:
            assert c.code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), c.code
        print("client sees: %s" % [c.details for c in after if not c.partial][0])
        ok = mh.wait_until(lambda: "does not hold" in cl.coord.text(), 5, step=0.1)
        assert ok is not None, cl.coord.text()
        print("coordinator log: %s" % [ln for ln in cl.coord.log if "does not hold" in ln][0])
        # repair: re-apply the data with a complete overwrite
        b3 = mh.write_batch(os.path.join(cl.root, "b3"),
                            [("x%05d" % i, x[i]) for i in range(len(x))] + [("far", far)])
        op = cl.update(b3, overwrite=True)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 3, op
        cl.converge(3)
        for qi in range(len(pool)):
            r = cl.stub.FindNeighbors(mh.make_query(tp, pool[qi]), timeout=5)
            assert r.version == 3 and not r.missing_shards and mh.answer_ids(r) == base[qi]
        print("complete overwrite: every shard on version 3, full answers")
        # ---- B: the MANIFEST of CURRENT
        victim = 2
        cl.shards[victim].kill9()
        mf = os.path.join(cl.shard_dir(victim), "v000003", "MANIFEST")
        with open(mf, "rb") as f:
            m = f.read()
        off = m.index(b"\nfile ") + 7  # inside the first file name
        flip(mf, off)
        sh = cl.start_shard(victim)
        text = sh.text()
        line = [ln for ln in sh.log if "refused" in ln]
        assert line and "version 3 (CURRENT) refused" in line[0] and "MANIFEST" in line[0] \
            and "checksum" in line[0], text
        print("shard %d log: %s" % (victim, line[0]))
        st = cl.shard_stats(victim)
        assert st.current_version == 2, st
        assert current_file(cl, victim) == "v000002"
        assert not os.path.exists(os.path.dirname(mf))
        cl.stop_all()
    print("test_corrupt: OK")


if __name__ == "__main__":
    main()
