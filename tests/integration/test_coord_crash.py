"""kill -9 of the coordinator at each step of an update (issue 5, "what must be true" 4).

TSR_COORD_CRASH_AT=staged|prepared|saved|flipped|committed makes the coordinator _exit(137)
right after that step. After each crash the coordinator is restarted (same data dir,
same port) without the hook; within a few seconds every shard must serve exactly the
coordinator's version — the old one for staged/prepared (nothing of the new version may
stay behind), the new one for flipped/committed — with no staged or prepared leftovers,
and queries answer from that version with the right contents.

Operations survive it (coordinator/oplog.c): GetOperation after the restart answers for the
interrupted update — SUCCEEDED with the new version when the crash came after the commit
point (flipped, committed), FAILED "interrupted ... before its commit point" otherwise — and
for the finished ones of earlier runs, unchanged; new operation ids never repeat old ones; a
damaged record file is named in a warning and the coordinator still starts.
"""
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16


def shard_state(cl):
    _, _, sp, _ = ch.stubs()
    out = []
    for s in cl.shards:
        st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        out.append((st.current_version,
                    sorted((v.version, v.state) for v in st.versions if not v.current and
                           v.state != sp.ShardVersion.SERVING)))
    return out


def converge(cl, want, timeout=20):
    t0 = time.time()
    while True:
        st = shard_state(cl)
        if all(cv == want and not pend for cv, pend in st):
            return time.time() - t0
        if time.time() - t0 > timeout:
            raise AssertionError("shards did not converge on version %d: %s\n%s" %
                                 (want, st, cl.coord.text()))
        time.sleep(0.1)


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2000, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-crash-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("x%05d" % i, x[i])
                                                   for i in range(2000)])
    port = ch.free_port()
    cl = ch.Cluster(4, D, {"nlist": 16, "pq_m": 4, "nprobe": 16})
    cl.stop_coord()
    cl.start(listen_port=port)
    try:
        op0 = cl.update(b0)
        assert op0.state == tp.Operation.SUCCEEDED, op0
        version = 1
        op_ids = {op0.operation_id}
        # saved: v(N+1) stored but not the commit point; the next update must still be
        # able to write N+1 (it failed "version already committed" before Dec 5)
        for n, step in enumerate(["staged", "prepared", "saved", "flipped", "committed"]):
            nid = "new-%s" % step
            v = rng.normal(size=D).astype("float32") * 10
            b = ch.write_batch(os.path.join(root, "b-" + step), [ch.dp_json(nid, v)],
                               ["x%05d" % n])
            cl.stop_coord()
            cl.start(env={"TSR_COORD_CRASH_AT": step}, listen_port=port)
            op_id = cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b),
                                        timeout=10).operation_id
            assert op_id not in op_ids, (op_id, op_ids)
            op_ids.add(op_id)
            rc = cl.wait_exit(60)
            assert rc == 137, (step, rc, cl.coord.text())
            if step == "prepared":  # a damaged record and a stray file: named, not fatal
                with open(os.path.join(cl.root, "coordinator", "operations",
                                       "op-999-1.pb"), "wb") as f:
                    f.write(b"\xff\xff\xff garbage")
            cl.start(listen_port=port)
            expect = version + (1 if step in ("flipped", "committed") else 0)
            took = converge(cl, expect)
            got = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=op_id), timeout=10)
            if expect > version:
                assert got.state == tp.Operation.SUCCEEDED and got.version == expect, (step, got)
            else:
                assert got.state == tp.Operation.FAILED and got.version == 0 and \
                    "interrupted" in got.error and "before its commit point" in got.error, \
                    (step, got)
            assert got.end_time_ms >= got.start_time_ms > 0, got
            old = cl.stub.GetOperation(tp.GetOperationRequest(
                operation_id=op0.operation_id), timeout=10)
            assert old == op0, (old, op0)
            if step == "prepared":
                assert "op-999-1.pb: not a packed tessera.v1.Operation" in cl.coord.text(), \
                    cl.coord.text()
            st = cl.stats()
            assert st.version == expect, (step, st)
            assert all(s.version == expect for s in st.shards), st
            resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[tp.FindNeighborsRequest.Query(
                    datapoint=tp.IndexDatapoint(feature_vector=v.tolist()), neighbor_count=1)]),
                timeout=10)
            assert resp.version == expect
            top = resp.nearest_neighbors[0].neighbors[0].datapoint.datapoint_id
            rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(
                ids=["x%05d" % n, nid]), timeout=10)
            ids = [d.datapoint_id for d in rd.datapoints]
            if expect > version:
                assert top == nid and ids == [nid], (step, top, ids)
            else:
                assert top != nid and ids == ["x%05d" % n], (step, top, ids)
            print("crash after %-9s -> every shard on version %d after restart (%.2fs); "
                  "operation %s: %s %s" % (step, expect, took, op_id,
                                           tp.Operation.State.Name(got.state), got.error))
            version = expect
        # `tessera update` waits through a coordinator crash after the commit point and
        # reports the outcome it finds after the restart
        b = ch.write_batch(os.path.join(root, "b-cli"), [ch.dp_json("cli", x[1])])
        cl.stop_coord()
        cl.start(env={"TSR_COORD_CRASH_AT": "flipped"}, listen_port=port)
        cli = subprocess.Popen([os.path.join(cl.bin, "tessera"), "update", "--target",
                                cl.target, "--batch-root", b, "--timeout-s", "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert cl.wait_exit(60) == 137, cl.coord.text()
        time.sleep(0.5)  # the CLI meets an unreachable coordinator for a while
        cl.start(listen_port=port)
        out, errs = cli.communicate(timeout=60)
        version += 1
        assert cli.returncode == 0 and "SUCCEEDED, version %d" % version in out, (out, errs)
        assert "coordinator unavailable" in errs, errs
        converge(cl, version)
        print("tessera update across a crash after the flip:", out.strip())
        # and the next normal update works from there
        b = ch.write_batch(os.path.join(root, "b-last"), [ch.dp_json("last", x[0])])
        op = cl.update(b)
        assert op.state == tp.Operation.SUCCEEDED and op.version == version + 1, op
        assert op.operation_id not in op_ids, (op.operation_id, op_ids)
        converge(cl, version + 1)
        # a graceful restart keeps every record as GetOperation showed it
        cl.stop_coord()
        cl.start(listen_port=port)
        for o in (op0, op):
            again = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=o.operation_id),
                                         timeout=10)
            assert again == o, (again, o)
    finally:
        cl.stop()
    print("test_coord_crash: OK")


if __name__ == "__main__":
    main()
