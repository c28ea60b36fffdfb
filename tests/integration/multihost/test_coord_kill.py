#!/usr/bin/env python3
"""Fault case 4 (issue 7): kill -9 of the coordinator at each step of an update, with the
shards in their own namespaces staying up, under a query load.

TSR_COORD_CRASH_AT=staged|prepared|flipped|committed makes the coordinator _exit(137)
right after that step of an update (docs/coordinator.md). Each update adds one far-away
vector `new-<step>` and deletes one old id; the load (2 threads, client deadline 2 s)
queries that vector the whole time. After the crash the coordinator is restarted on its
host without the hook. Asserts, for every step:
- the crash happened (exit 137); no call hangs; calls fail only with UNAVAILABLE;
- never a mix: every answer is consistent with the version it reports (`new-<step>` is
  the top hit exactly when the answer's version is the new one), and only the old and
  the new version ever appear;
- after the restart (once the client has reconnected) every shard's CURRENT (shard Stats) is the coordinator's version —
  the old one for staged/prepared, the new one for flipped/committed — with nothing
  staged or prepared left; GetIndexStats agrees; every answer after that reports it;
- ReadIndexDatapoints of the deleted and the new id match that version.
Finally a normal update works from there.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mh  # noqa: E402

STEPS = ["staged", "prepared", "flipped", "committed"]


def main():
    import grpc
    tp = mh.stubs()[0]
    with mh.Cluster(3) as cl:
        x, pool, base = mh.bootstrap(cl)
        rng = np.random.default_rng(11)
        version = 1
        for n, step in enumerate(STEPS):
            nid = "new-%s" % step
            gone = "x%05d" % n
            v = rng.normal(size=cl.dims).astype("float32") * 10
            b = mh.write_batch(os.path.join(cl.root, "b-" + step), [(nid, v)], [gone])
            cl.coord.stop()
            cl.start_coord(env={"TSR_COORD_CRASH_AT": step})
            load = mh.Load(cl, [v], deadline_s=2.0, threads=2, partial=False).start()
            time.sleep(0.3)
            try:
                cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b), timeout=10)
            except grpc.RpcError:
                pass
            rc = cl.coord.wait_exit(60)
            assert rc == 137, (step, rc, cl.coord.text())
            t_crash = time.monotonic()
            time.sleep(0.5)  # queries meet a dead coordinator
            cl.start_coord()
            expect = version + (1 if step in ("flipped", "committed") else 0)
            took = cl.converge(expect)

            def answers():
                try:
                    cl.stub.FindNeighbors(mh.make_query(tp, v), timeout=2)
                    return True
                except grpc.RpcError:
                    return False
            # the client's own channel reconnects with a backoff (100-300 ms)
            back = mh.wait_until(answers, 10)
            assert back is not None, "the restarted coordinator does not answer"
            t_conv = time.monotonic()
            time.sleep(1.0)
            load.stop()
            calls = load.snapshot()
            load.report("kill -9 coordinator after %s" % step, calls)
            hung = load.hung(calls)
            assert not hung, "%d hung calls" % len(hung)
            seen = set()
            for c in calls:
                assert c.code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), \
                    (step, c.code, c.details)
                if c.code != grpc.StatusCode.OK:
                    continue
                assert not c.missing, (step, c.missing)
                seen.add(c.version)
                assert c.version in (version, version + 1), (step, c.version, version)
                if c.version == version + 1:
                    assert c.ids[0] == nid, (step, c.version, c.ids[:3])
                else:
                    assert nid not in c.ids, (step, c.version, c.ids[:3])
                if c.t0 >= t_conv:
                    assert c.version == expect, (step, c.version, expect)
            down = [c for c in calls if c.t0 >= t_crash and c.t1 < cl.coord.started_at]
            assert down and all(c.code == grpc.StatusCode.UNAVAILABLE for c in down), step
            after = [c for c in calls if c.t0 >= t_conv]
            bad = [c for c in after if c.code != grpc.StatusCode.OK]
            assert after and not bad, (step, len(after), len(bad),
                                       bad and (bad[0].t0 - t_conv, bad[0].details))
            st = cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10)
            assert st.version == expect, (step, st)
            assert all(s.version == expect for s in st.shards), (step, st)
            rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=[gone, nid]),
                                             timeout=10)
            ids = [d.datapoint_id for d in rd.datapoints]
            assert ids == ([nid] if expect > version else [gone]), (step, ids)
            print("kill -9 coordinator after %-9s -> every shard on version %d %.2fs after "
                  "the restart (client reconnected %.2fs later); versions answered: %s" %
                  (step, expect, took, back, sorted(seen)))
            version = expect
        b = mh.write_batch(os.path.join(cl.root, "b-last"), [("last", x[0])])
        op = cl.update(b)
        assert op.state == tp.Operation.SUCCEEDED and op.version == version + 1, op
        cl.converge(version + 1)
        cl.stop_all()
    print("test_coord_kill: OK")


if __name__ == "__main__":
    main()
