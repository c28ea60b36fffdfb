"""Crash safety of a move (issue 19, "what must be true" 2): kill -9 of the leader
coordinator at each step of AddShardGroup and of RemoveShardGroup (TSR_COORD_CRASH_AT=staged,
prepared, flipped, committed: the process _exit(137)s there, as a kill -9 would) and of
the receiving shard (TSR_SHARD_CRASH_AT=stage: a Stage chunk after chunk 0, in the middle
of its staging; prepare; commit). After each, the restarted
coordinator's committed version decides: the move is complete (version + 1, the new
groups) or rolled back (same version, same groups), the shards converge to that version
(reconcile), and the checker over the lists of every group (Shard.Read of every label on
every shard, test_reshard.lists_checker) finds every datapoint exactly once. A rolled-back
move is then retried and succeeds (the new shard's leftover staged version is aborted).
Last, an add under streamed writes with the coordinator killed after its catch-up, before
its flip (TSR_COORD_CRASH_AT=caught-up): rolled back with every acknowledged write
readable, then retried under writes (docs/resharding.md "Writes during a move").
Then an add under streamed writes whose RECEIVING shard dies at its catch-up Write
(TSR_SHARD_CRASH_AT=catchup: on the Write's arrival; restarted, =catchup-logged: once the
Write is in its catch-up log, fsynced, not acknowledged): the move fails and rolls back
each time (the version stays, every acknowledged write readable, every label on exactly
one live group); the restarted shard holds its prepared catch-up version (the log
replayed), which the retried add aborts; restarted without the hook, the add retried under
writes succeeds, the same checks.
One cluster runs the whole sequence (a few thousand vectors) to stay well under a minute.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_reshard as tr  # noqa: E402

N = 4000
D = 16
tr.N = N


def converge(cl, live, timeout=30):
    """Waits until every live shard serves the coordinator's version; returns it."""
    sp = sh.stubs()[0]
    t0 = time.time()
    while True:
        v = cl.stats().version
        cur = [s.stub.Stats(sp.ShardStatsRequest(), timeout=10).current_version for s in live]
        if all(c == v for c in cur):
            return v
        if time.time() - t0 > timeout:
            raise AssertionError("shards %s did not reach version %d" % (cur, v))
        time.sleep(0.2)


def check(cl, live, others, label):
    """Every datapoint once over live; none on others (dead or out of the index)."""
    v = converge(cl, live)
    per = tr.lists_checker(live, N - 1, N)
    tr.holds_none(others, N - 1, label)
    st = cl.stats()
    assert st.vectors_count == N, st
    print("%s: version %d, datapoints per live group %s" % (label, v, per))
    return v


def move(cl, rq, crash=None):
    """Starts the move; with crash, waits for the coordinator to die and restarts it.
    Returns the finished operation (None after a crash)."""
    tp = ch.stubs()[0]
    if crash:
        cl.stop_coord()
        cl.start(env={"TSR_COORD_CRASH_AT": crash})
    if isinstance(rq, tp.AddShardGroupRequest):
        r = cl.stub.AddShardGroup(rq, timeout=30)
    else:
        r = cl.stub.RemoveShardGroup(rq, timeout=30)
    if not crash:
        return cl.wait_op(r.operation_id, 60)
    rc = cl.wait_exit(60)
    assert rc == 137, "coordinator exit %s, expected the crash hook's 137" % rc
    cl.start()
    return None


def restart_shard(old, env=None, timeout=15):
    """sh.restart with env (a test hook for the restarted process, or None)."""
    t0 = time.time()
    while True:
        try:
            return sh.Shard(old.data, extra=["--listen", old.target], env=env)
        except RuntimeError:
            if time.time() - t0 > timeout:
                raise
            time.sleep(0.2)  # the port may take a moment to be free again


def writer_start(cl, x, wr=None):
    """A thread streaming upserts of new ids (20 per call) until writer_stop; wr["acked"]
    the ids acknowledged, wr["n"] the ids sent (acknowledged or not: a call that fails
    while the coordinator is down may or may not have been applied)."""
    tp = ch.stubs()[0]
    wr = wr or {"acked": [], "n": 0}
    wr["stop"] = threading.Event()

    def run():
        while not wr["stop"].is_set():
            ids = ["w%06d" % (wr["n"] + j) for j in range(20)]
            dps = [tp.IndexDatapoint(datapoint_id=i, feature_vector=[float(v) for v in
                                                                     x[k % N] + 0.5])
                   for k, i in enumerate(ids, wr["n"])]
            wr["n"] += 20
            try:
                cl.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=dps),
                                         timeout=30)
                wr["acked"] += ids
            except Exception:  # noqa: BLE001 - the coordinator may be down: unknown
                time.sleep(0.1)
            time.sleep(0.02)

    wr["thread"] = threading.Thread(target=run)
    wr["thread"].start()
    return wr


def writer_stop(wr):
    wr["stop"].set()
    wr["thread"].join()


def check_writes(cl, live, wr, label, version):
    """As check, with streamed writes: every acknowledged id readable, every label on at
    most one live group and the batch's plus the acknowledged ones on exactly one."""
    tp = ch.stubs()[0]
    assert converge(cl, live) == version, label
    acked = wr["acked"]
    assert len(acked) > 0, "no write acknowledged"
    for k in range(0, len(acked), 1000):
        r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=acked[k:k + 1000]),
                                        timeout=30)
        assert len(r.datapoints) == len(acked[k:k + 1000]), "%s: acknowledged writes " \
            "missing" % label
    per = tr.lists_checker(live, N + wr["n"] + 100, N + len(acked), at_least=True)
    print("%s: version %d, %d writes acknowledged, datapoints per live group %s" %
          (label, version, len(acked), per))


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-reshard-crash-")
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("a%05d" % i, x[i]) for i in range(N)])
    cl = ch.Cluster(2, D, {"nlist": 16, "pq_m": 4, "nprobe": 4})
    extra = []
    try:
        assert cl.update(b1, timeout=120).state == tp.Operation.SUCCEEDED
        s0, s1 = cl.shards
        # 1. add, coordinator killed after staging: rolled back, then retried
        a = sh.Shard(os.path.join(cl.root, "a"))
        extra.append(a)
        move(cl, tp.AddShardGroupRequest(replicas=[a.target]), crash="staged")
        assert check(cl, [s0, s1], [a], "add, coordinator killed at staged") == 1
        assert len(cl.stats().shards) == 2
        op = move(cl, tp.AddShardGroupRequest(replicas=[a.target]))
        assert op.state == tp.Operation.SUCCEEDED, op
        assert check(cl, [s0, s1, a], [], "add retried") == 2
        # 2. remove group 2, killed after prepare: rolled back
        move(cl, tp.RemoveShardGroupRequest(group=2), crash="prepared")
        assert check(cl, [s0, s1, a], [], "remove, coordinator killed at prepared") == 2
        # 3. remove group 2, killed right after the commit point: complete
        move(cl, tp.RemoveShardGroupRequest(group=2), crash="flipped")
        assert check(cl, [s0, s1], [], "remove, coordinator killed at flipped") == 3
        assert [s.removed for s in cl.stats().shards] == [False, False, True]
        # 4. add, killed after the Commit fan-out: complete
        b = sh.Shard(os.path.join(cl.root, "b"))
        extra.append(b)
        move(cl, tp.AddShardGroupRequest(replicas=[b.target]), crash="committed")
        assert check(cl, [s0, s1, b], [], "add, coordinator killed at committed") == 4
        # 5. the receiving shard dies in the middle of its staging (a Stage chunk after chunk
        #    0: its partial staging left on disk), then, restarted, at Prepare: the move
        #    fails each time, nothing changes; restarted without a hook, the add is retried
        c = sh.Shard(os.path.join(cl.root, "c"), env={"TSR_SHARD_CRASH_AT": "stage"})
        extra.append(c)
        for hook in ("stage", "prepare"):
            if hook != "stage":
                c = restart_shard(c, {"TSR_SHARD_CRASH_AT": hook})
                extra.append(c)
            op = move(cl, tp.AddShardGroupRequest(replicas=[c.target]))
            assert op.state == tp.Operation.FAILED, op
            assert c.proc.wait(30) == 137
            assert "TSR_SHARD_CRASH_AT=%s: exiting" % hook in c.text(), hook
            c.kill()
            assert check(cl, [s0, s1, b], [], "add, receiving shard killed at %s" % hook) == 4
        c = sh.restart(c)
        extra.append(c)
        op = move(cl, tp.AddShardGroupRequest(replicas=[c.target]))
        assert op.state == tp.Operation.SUCCEEDED, op
        assert check(cl, [s0, s1, b, c], [], "add retried after the shard restart") == 5
        # 6. the receiving shard dies at Commit (after the commit point): the move stands;
        #    reconcile commits it on the restarted shard
        d = sh.Shard(os.path.join(cl.root, "d"), env={"TSR_SHARD_CRASH_AT": "commit"})
        extra.append(d)
        op = move(cl, tp.AddShardGroupRequest(replicas=[d.target]))
        assert op.state == tp.Operation.SUCCEEDED, op
        assert d.proc.wait(30) == 137
        d.kill()
        d = sh.restart(d)
        extra.append(d)
        assert check(cl, [s0, s1, b, c, d], [], "add, receiving shard killed at commit") == 6
        # 7. the remaining steps of each kind: remove killed at staged (rolled back) and at
        #    committed (complete); add killed at prepared (rolled back), retried and killed
        #    at flipped (complete)
        move(cl, tp.RemoveShardGroupRequest(group=0), crash="staged")
        assert check(cl, [s0, s1, b, c, d], [], "remove, coordinator killed at staged") == 6
        move(cl, tp.RemoveShardGroupRequest(group=0), crash="committed")
        assert check(cl, [s1, b, c, d], [], "remove, coordinator killed at committed") == 7
        e = sh.Shard(os.path.join(cl.root, "e"))
        extra.append(e)
        move(cl, tp.AddShardGroupRequest(replicas=[e.target]), crash="prepared")
        assert check(cl, [s1, b, c, d], [e], "add, coordinator killed at prepared") == 7
        move(cl, tp.AddShardGroupRequest(replicas=[e.target]), crash="flipped")
        assert check(cl, [s1, b, c, d, e], [], "add, coordinator killed at flipped") == 8
        st = cl.stats()
        assert [s.address for s in st.shards if not s.removed] == \
            [x.target for x in (s1, b, c, d, e)], st
        # 8. writes flowing during an add (docs/resharding.md "Writes during a move"), the
        #    coordinator killed after its catch-up, before its flip: rolled back with every
        #    acknowledged write readable; retried under writes: complete, the same
        f = sh.Shard(os.path.join(cl.root, "f"), env={"TSR_SHARD_SLOW_PREPARE_MS": "1500"})
        extra.append(f)
        wr = writer_start(cl, x)
        time.sleep(0.5)
        move(cl, tp.AddShardGroupRequest(replicas=[f.target]), crash="caught-up")
        time.sleep(0.5)
        writer_stop(wr)
        check_writes(cl, [s1, b, c, d, e], wr, "add under writes, coordinator killed at "
                     "caught-up", 8)
        tr.holds_none([f], N + 3 * wr["n"], "the rolled-back add's shard")
        wr = writer_start(cl, x, wr)
        time.sleep(0.5)
        op = move(cl, tp.AddShardGroupRequest(replicas=[f.target]))
        assert op.state == tp.Operation.SUCCEEDED, op
        time.sleep(0.5)
        writer_stop(wr)
        check_writes(cl, [s1, b, c, d, e, f], wr, "add under writes retried", 9)
        carried = [ln for ln in cl.coord.text().splitlines() if "caught up on seqs" in ln]
        assert carried, "the retried add carried no round (no 'caught up on seqs' line)"
        print("  " + carried[-1].split("stream: ")[-1])
        # 9. writes flowing during an add whose receiving shard dies at its catch-up Write:
        #    first on the Write's arrival (catchup), then, restarted, once the Write is in its
        #    catch-up log (catchup-logged): each time the move fails and rolls back (version
        #    9 stays, every acknowledged write readable, every label on one live group) and
        #    the restarted shard holds its prepared catch-up version 10 (its log replayed:
        #    0 Writes, then 1), which the next add aborts first; restarted without the hook,
        #    the add under writes succeeds.
        sp = sh.stubs()[0]
        live = [s1, b, c, d, e, f]
        slow = {"TSR_SHARD_SLOW_PREPARE_MS": "1500"}
        g = sh.Shard(os.path.join(cl.root, "g"), env=dict(slow, TSR_SHARD_CRASH_AT="catchup"))
        extra.append(g)
        n_carried = len(carried)
        for hook, replayed in (("catchup", None), ("catchup-logged", 0), (None, 1)):
            t0 = time.time()
            if replayed is not None:  # the shard restarted after the last try's crash
                g = restart_shard(g, dict(slow, TSR_SHARD_CRASH_AT=hook) if hook else slow)
                extra.append(g)
                held = {(v.version, v.state) for v in
                        g.stub.Stats(sp.ShardStatsRequest(), timeout=10).versions}
                assert (10, sp.ShardVersion.PREPARED) in held, held
                want = "prepared catch-up version 10: %d writes replayed" % replayed
                assert want in g.text(), (want, g.text()[-2000:])
                tr.holds_none([g], N + 3 * wr["n"], "the restarted shard of a failed add")
            wr = writer_start(cl, x, wr)
            time.sleep(0.5)
            op = move(cl, tp.AddShardGroupRequest(replicas=[g.target]))
            time.sleep(0.5)
            writer_stop(wr)
            if hook:
                assert op.state == tp.Operation.FAILED, op
                assert g.proc.wait(30) == 137, g.text()[-2000:]
                assert "TSR_SHARD_CRASH_AT=%s: exiting" % hook in g.text()
                g.kill()
                check_writes(cl, live, wr, "add under writes, receiving shard killed at %s "
                             "(%.1fs)" % (hook, time.time() - t0), 9)
                st = cl.stats()
                assert [s.address for s in st.shards if not s.removed] == \
                    [x.target for x in live], st
            else:
                assert op.state == tp.Operation.SUCCEEDED, op
                check_writes(cl, live + [g], wr, "add under writes retried after the shard "
                             "restarts (%.1fs)" % (time.time() - t0), 10)
        # the retried adds aborted the leftover first (the coordinator says so), the shard
        # did, and the successful one carried rounds to the new shard's catch-up version
        coord_log = cl.coord.text()
        aborted = coord_log.count("new group replica %s: leftover version 10 aborted"
                                  % g.target)
        assert aborted == 2, "leftover version 10 aborted %d times, want 2" % aborted
        assert "aborted prepared version 10" in g.text(), g.text()[-2000:]
        carried = [ln for ln in coord_log.splitlines() if "caught up on seqs" in ln]
        assert len(carried) > n_carried, "the last add carried no round"
        print("  " + carried[-1].split("stream: ")[-1])
        print("test_reshard_crash: OK")
    finally:
        try:
            cl.stop()
        finally:
            for s in extra:
                if s.proc.poll() is None:
                    s.stop()
                else:
                    s.kill()


if __name__ == "__main__":
    main()
