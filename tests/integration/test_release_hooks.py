"""Release binaries ignore the test hooks (issue 40, must-be-true 2; docs/testing.md).

The hooks of common/core/testing.h exist only in test builds. Against the release binaries
(TSR_BIN; SKIP when TSR_BIN is the test build itself, as in `make test-san`):
1. A coordinator started with TSR_COORD_CRASH_AT=plant-ack-unlogged (in a test build: the
   stream writer acknowledges rounds it never logged) takes streamed upserts; it is killed
   -9 and restarted: every acknowledged write is there (ReadIndexDatapoints, its vector bit
   for bit; FindNeighbors finds it), and no process logged a "(test hook)" line.
2. A second cluster with every hook of the table set at once in every process's
   environment (crash points at steps that each call below passes, 60 s sleeps): a batch
   update succeeds within 30 s, a streamed write with TSR_COORD_CRASH_AT=round-logged and
   one with staged are acknowledged, and the coordinator is still running.
The processes run the binaries as built (as_built: the harness would otherwise start the
test build for a process given a hook). Run on the test build (TSR_BIN=build/testing/bin
TSR_TEST_BIN=/nonexistent) it fails at part 1: the planted bug loses the writes.
"""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 1000


def dp(tp, did, vec):
    p = tp.IndexDatapoint(datapoint_id=did)
    p.feature_vector.extend([float(v) for v in vec])
    return p


def read(cl, tp, ids):
    r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=30)
    return {d.datapoint_id: list(d.feature_vector) for d in r.datapoints}


def top1(cl, tp, vec):
    q = ch.query(tp, vec, 1, fraction=1.0)
    r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
    return [n.datapoint.datapoint_id for n in r.nearest_neighbors[0].neighbors]


def no_hook_lines(cl):
    for p in [cl.coord] + cl.shards:
        assert "(test hook)" not in p.text(), p.text()


def base(cl, tp, root, x):
    b0 = ch.write_batch(os.path.join(root, "b0"),
                        [ch.dp_json("x%05d" % i, x[i]) for i in range(N)])
    op = cl.update(b0, timeout=30)
    assert op.state == tp.Operation.SUCCEEDED, op


def planted_ack(tp, root, x, rng):
    """Part 1: plant-ack-unlogged, streamed upserts, kill -9, restart."""
    port = sh.free_port()
    cl = ch.Cluster(2, D, {"nlist": 8, "pq_m": 4, "nprobe": 8}, as_built=True)
    try:
        base(cl, tp, root, x)
        cl.stop_coord()
        env = {"TSR_COORD_CRASH_AT": "plant-ack-unlogged"}
        cl.start(env=env, listen_port=port)
        model = {}
        for r in range(10):
            ids = ["s%02d-%d" % (r, j) for j in range(3)]
            vecs = [rng.normal(size=D).astype("float32") * 5 for _ in ids]
            resp = cl.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(
                datapoints=[dp(tp, i, v) for i, v in zip(ids, vecs)]), timeout=30)
            assert resp.upserted == len(ids), resp
            model.update(zip(ids, vecs))
        cl.stop_coord(sig=signal.SIGKILL)
        cl.start(env=env, listen_port=port)
        got = read(cl, tp, sorted(model))
        lost = sorted(set(model) - set(got))
        assert not lost, "acknowledged writes lost after kill -9: %s\n%s" % (
            lost, cl.coord.text())
        for i, v in model.items():
            assert np.array_equal(np.array(got[i], dtype="float32"), v), i
        for i in sorted(model)[:5]:
            assert top1(cl, tp, model[i]) == [i], i
        no_hook_lines(cl)
        print("plant-ack-unlogged on the release coordinator: %d acknowledged upserts all "
              "there after kill -9 and restart" % len(model))
    finally:
        cl.stop()


def every_hook(tp, root, x, rng):
    """Part 2: every hook of the table set in every process, a batch update and writes."""
    hooks = {"TSR_SHARD_CRASH_AT": "prepare", "TSR_COORD_CRASH_AT": "staged"}
    for k in sh.test_knobs():
        if k.endswith("_MS"):
            hooks[k] = "60000"
    assert len(hooks) >= 6, hooks
    saved = dict(os.environ)
    os.environ.update(hooks)  # the shards inherit them too
    port = sh.free_port()
    cl = ch.Cluster(2, D, {"nlist": 8, "pq_m": 4, "nprobe": 8}, as_built=True)
    try:
        t0 = time.time()
        base(cl, tp, root, x)
        took = time.time() - t0
        assert took < 30, took
        for step in ("staged", "round-logged", "committed"):
            cl.stop_coord()
            cl.start(env={"TSR_COORD_CRASH_AT": step}, listen_port=port)
            v = rng.normal(size=D).astype("float32") * 5
            cl.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(
                datapoints=[dp(tp, "w-" + step, v)]), timeout=30)
            b = ch.write_batch(os.path.join(root, "b-" + step), [ch.dp_json("u-" + step, v)])
            op = cl.update(b, timeout=30)
            assert op.state == tp.Operation.SUCCEEDED, (step, op)
            assert cl.coord.proc.poll() is None, cl.coord.text()
            assert sorted(read(cl, tp, ["w-" + step, "u-" + step])) == \
                ["u-" + step, "w-" + step], step
        no_hook_lines(cl)
        print("every hook set (%s): updates and writes as without them (first update "
              "%.1fs)" % (", ".join(sorted(hooks)), took))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        cl.stop()


def main():
    if os.path.abspath(sh.BIN) == os.path.abspath(sh.TEST_BIN):
        print("SKIP: TSR_BIN is the test build (%s): it has the hooks" % sh.BIN)
        return 77
    tp = ch.stubs()[0]
    rng = np.random.default_rng(40)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-release-hooks-")
    planted_ack(tp, root, x, rng)
    every_hook(tp, root, x, rng)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
