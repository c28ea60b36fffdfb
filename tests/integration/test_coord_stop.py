"""A coordinator stops promptly on SIGTERM while an update waits on a shard (real processes).

2 shards (d 16, nlist 8), version 1 from a first batch. Shard 0 is restarted with
TSR_SHARD_SLOW_PREPARE_MS=60000 (its Prepare sleeps 60 s first, as the build of a large
version would take, while the process keeps answering keepalives: a frozen process would
not do, gRPC's keepalive ends the call after a few seconds) and a second update starts:
its Prepare waits on shard 0 (the stage deadline is 120 s). SIGTERM to the coordinator:
it must exit 0 within 15 s — it waits 5 s for the update, then cancels the update's shard
calls ("cancelling its shard calls" in its log) — instead of waiting out the Prepare (the
code before this test: 60 s). Shard 0 restarted without the hook, the coordinator
restarted: version 1 is served, the stopped update is FAILED, and the same update run
again commits version 2 with every record.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16


def main():
    tp, _, _, _ = ch.stubs()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3000, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-stop-")
    b1 = ch.write_batch(os.path.join(root, "b1"),
                        [ch.dp_json("a%05d" % i, x[i]) for i in range(2000)])
    b2 = ch.write_batch(os.path.join(root, "b2"),
                        [ch.dp_json("b%05d" % i, x[i]) for i in range(2000, 3000)])
    cl = ch.Cluster(2, D, {"nlist": 8, "pq_m": 4, "nprobe": 8, "stage_deadline_ms": 120000})
    try:
        op = cl.update(b1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op

        slow = cl.shards[0]
        slow.stop()
        cl.shards[0] = slow = sh.Shard(slow.data, extra=["--listen", slow.target],
                                       env={"TSR_SHARD_SLOW_PREPARE_MS": "60000"})
        t0 = time.time()
        while not cl.stats().shards[0].available:  # the coordinator has seen it again
            assert time.time() - t0 < 30, "the restarted shard 0 is not available"
            time.sleep(0.1)
        r = cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b2), timeout=30)
        t0 = time.time()
        while True:  # the update is past reading, waiting on the frozen shard
            st = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                      timeout=10).state
            if any("Prepare sleeps first" in ln for ln in slow.log):
                break
            assert st not in (tp.Operation.SUCCEEDED, tp.Operation.FAILED), st
            assert time.time() - t0 < 60, "the update's Prepare did not reach shard 0"
            time.sleep(0.05)
        t0 = time.time()
        cl.stop_coord(timeout=15)  # exit 0 within 15 s, no sanitizer report
        took = time.time() - t0
        text = cl.coord.text()
        assert "cancelling its shard calls" in text, text[-3000:]
        print("stopped in %.1f s with the update waiting on a slow Prepare" % took)

        slow.kill()  # it sleeps in the hook (a shard's own stop waits for its handlers)
        cl.shards[0] = sh.restart(slow)
        cl.start()
        t0 = time.time()
        while True:
            try:
                st = cl.stats()
                break
            except Exception:  # noqa: BLE001 - not serving yet
                assert time.time() - t0 < 30, "the restarted coordinator does not answer"
                time.sleep(0.2)
        assert st.version == 1 and st.vectors_count == 2000, st
        op = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                  timeout=10)
        assert op.state == tp.Operation.FAILED, op
        t0 = time.time()
        while True:  # reconcile settles the stopped update's leftovers; then it runs again
            op = cl.update(b2)
            if op.state == tp.Operation.SUCCEEDED:
                break
            assert time.time() - t0 < 60, op
            time.sleep(0.5)
        assert op.version == 2, op
        assert cl.stats().vectors_count == 3000, cl.stats()
        print("test_coord_stop: OK")
    except BaseException:
        print(cl.coord.text()[-6000:] if cl.coord else "")
        raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
