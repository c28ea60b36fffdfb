"""A fold under streamed writes with the coordinator killed at each of its steps (issue 15,
docs/streaming.md "Folding": writes flow during the fold's Prepare, the rounds streamed
meanwhile are carried to the new version before its commit point).

Cluster: tessera-coordinator + 2 shard groups, 4000 vectors (d 16, nlist 16), every shard's
Prepare slowed 1 s (TSR_SHARD_SLOW_PREPARE_MS) so writes flow through it. A writer streams
upserts of new ids (20 per call) all along, the coordinator down included (those calls'
outcome is unknown). For each crash point of the fold (TSR_COORD_CRASH_AT = prepared: in
the Prepare, writes flowing; caught-up: the rounds carried to N+1, before the flip;
flipped: past the commit point, before the Commit fan-out) the coordinator is killed and
restarted without the hook: before the flip the fold is rolled back (the version stays,
reconcile aborts the shards' prepared catch-up version), after it the new version is
committed everywhere (reconcile); each time every acknowledged write is readable and every
label is on exactly one group (test_reshard.lists_checker). Last, a fold without a crash
under the writer succeeds, the same checks; then with the writer stopped, a fold empties
every delta.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_reshard as tr  # noqa: E402
import test_reshard_crash as rc  # noqa: E402

N = rc.N
D = rc.D


def fold(cl, crash=None):
    """Requests a fold; with crash, waits for the coordinator's hook exit and restarts it.
    Returns the finished operation (None after a crash)."""
    tp = ch.stubs()[0]
    if crash:
        cl.stop_coord()
        cl.start(env={"TSR_COORD_CRASH_AT": crash})
    r = cl.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=30)
    if not crash:
        return cl.wait_op(r.operation_id, 120)
    try:
        code = cl.wait_exit(120)
    except Exception:
        print(cl.coord.text()[-6000:])
        st = cl.wait_op(r.operation_id, 5)
        raise AssertionError("the fold did not reach %s: %s" % (crash, st))
    assert code == 137, "coordinator exit %s, expected the crash hook's 137" % code
    cl.start()
    return None


def acks(wr, k=40, timeout=30):
    """Waits until the writer has k more writes acknowledged (a restarted coordinator
    refuses writes until its replicas answered its catch-up)."""
    a0, t0 = len(wr["acked"]), time.time()
    while len(wr["acked"]) < a0 + k:
        assert time.time() - t0 < timeout, "no write acknowledged in %ds" % timeout
        time.sleep(0.05)


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(11)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-fold-crash-")
    b1 = ch.write_batch(os.path.join(root, "b1"),
                        [ch.dp_json("a%05d" % i, x[i]) for i in range(N)])
    os.environ["TSR_SHARD_SLOW_PREPARE_MS"] = "1000"  # the shards inherit it
    cl = ch.Cluster(2, D, {"nlist": 16, "pq_m": 4, "nprobe": 4, "stream_fold_records": 0})
    wr = None
    try:
        assert cl.update(b1, timeout=120).state == tp.Operation.SUCCEEDED
        v = cl.stats().version
        wr = rc.writer_start(cl, x)
        time.sleep(0.5)
        for crash, moves in (("prepared", 0), ("caught-up", 0), ("flipped", 1)):
            acks(wr)
            fold(cl, crash)
            v += moves
            time.sleep(0.3)
            # the writer goes on: check what it had acknowledged so far
            rc.check_writes(cl, cl.shards, dict(wr, acked=list(wr["acked"])),
                            "fold, coordinator killed at %s" % crash, v)
        acks(wr)
        op = fold(cl)
        assert op.state == tp.Operation.SUCCEEDED and op.version == v + 1, op
        v += 1
        rc.writer_stop(wr)
        rc.check_writes(cl, cl.shards, wr, "fold under writes", v)
        carried = [ln for ln in cl.coord.text().splitlines() if "caught up on seqs" in ln]
        assert carried, "the fold carried no round (no 'caught up on seqs' line)"
        print("  " + carried[-1].split("stream: ")[-1])
        op = fold(cl)
        assert op.state == tp.Operation.SUCCEEDED and op.version == v + 1, op
        v += 1
        rc.check_writes(cl, cl.shards, wr, "fold, no writes", v)
        sp = sh.stubs()[0]
        for s in cl.shards:
            st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            assert st.delta_upserts == 0 and st.delta_deletes == 0, st
        # nothing to fold: refused, the version stays
        try:
            fold(cl)
            raise AssertionError("a fold with nothing streamed was accepted")
        except Exception as e:  # noqa: BLE001
            assert "nothing to fold" in str(e), e
        assert cl.stats().version == v
        # the CLI: `tessera update --fold` says the same; --fold with a batch is a usage error
        import subprocess
        cli = os.path.join(cl.bin, "tessera")
        p = subprocess.run([cli, "update", "--target", cl.target, "--fold"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "nothing to fold" in p.stderr, (p.returncode, p.stderr)
        p = subprocess.run([cli, "update", "--target", cl.target, "--fold", "--batch-root",
                            root], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--fold takes no --batch-root" in p.stderr, p.stderr
        p = subprocess.run([cli, "update", "--target", cl.target], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and "--batch-root DIR or --fold" in p.stderr, p.stderr
        wr = rc.writer_start(cl, x, wr)
        acks(wr)
        rc.writer_stop(wr)
        p = subprocess.run([cli, "update", "--target", cl.target, "--fold"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "SUCCEEDED" in p.stdout, (p.stdout, p.stderr)
        print("tessera update --fold: " + p.stdout.strip().splitlines()[0])
        assert cl.stats().version == v + 1
    finally:
        if wr and not wr["stop"].is_set():
            rc.writer_stop(wr)
        cl.stop()
    print("test_stream_fold_crash: OK")


if __name__ == "__main__":
    main()
