"""Grow and shrink online with --etcd (docs/resharding.md "With --etcd"): etcd x1, two
coordinators with --etcd (TTL 2 s), 2 shard groups.

1. AddShardGroup (2 -> 3) and RemoveShardGroup of group 0 (3 -> 2), each through
   `tessera shards add|remove --target FOLLOWER`: the follower refuses naming the leader
   and the CLI retries there. Meanwhile a query thread alternates between both
   coordinators (a failed query is retried once on the other one: 0 may fail; every
   answer equals the answer before the moves: the queries probe every list with PQ
   distances and deny the streamed writes' token, so the answer does not depend on the
   plan) and a writer streams upserts (every acknowledged write readable at the end, on
   both coordinators). After each move: both coordinators serve the new version and the
   same groups (GetIndexStats shards, removed marks) and every label is on exactly one
   live group (test_reshard.lists_checker: Shard.Read of every label on every shard).
1c. A failed add on the leader (a dead address) keeps its group number, removed, in that
   leader's groups only; the leader is deposed (SIGSTOP past its lease, then SIGCONT) and
   the new leader adds another shard under the same number: the old leader, a follower
   now, gives the number to the committed version's group and serves it.
2. The leader _exit(137)s during an add (TSR_COORD_CRASH_AT, as a kill -9 there): at
   "prepared" (before the etcd commit: the other coordinator becomes the leader and
   settles the old version, groups unchanged), then the add retried with the roles swapped
   at "flipped" (right after the etcd commit: the new leader serves the version etcd holds
   with the new group, learnt from the version and not from its config, and reconcile
   commits it on every shard, the new group included; the new shard's staged leftover of
   the first try was aborted by the retried add). After each: both coordinators answer
   from that plan, every label once.
3. The follower restarted with an empty --data answers the same (groups, plan and
   directory from etcd + the shards; version 5 is a move's, whose directory etcd still
   holds as a blob: its catch-up's writes sit in the shards' delta, docs/coordinator.md).
4. An update after the moves (version 6): etcd holds no directory blob of it; the
   follower restarted with an empty --data lists its directory from version 6's groups
   (Shard.List, the removed group skipped) and answers the same.
Fails on a tree where resharding refuses --etcd (step 1's CLI exits 1). Exit 77 only when
etcd is not installed.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_reshard as tr  # noqa: E402

N = 4000
D = 16
NLIST = 32
TTL = 4
tr.N = N


def tessera(*args, timeout=180):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def start(c, env=None):
    """c.start(env), tried again (twice at most) when the coordinator exited at start
    because etcd did not answer in time (it refuses to start without etcd, by design; the
    single etcd member of this test is slow at times on a loaded machine)."""
    for attempt in range(3):
        try:
            return c.start(env=env)
        except AssertionError as e:
            if "no member answered" not in str(e) or attempt == 2:
                raise
            print("coordinator-%d: etcd did not answer at start, starting it again" % c.i)
            time.sleep(1)


def move(cl, want, *args):
    """`tessera shards ARGS`, run again (twice at most) when the move failed because its
    leader lost the lease meanwhile (fenced at the commit transaction: etcd still holds the
    version before; a client runs it again on the new leader). Returns (rc, out, err)."""
    for attempt in range(3):
        rc, out, err = tessera("shards", *args)
        lost = "no longer the leader" in out + err or "interrupted" in out + err
        if rc == 0 or not lost or attempt == 2:
            return rc, out, err
        held = cl.etcd.committed_version(cl.prefix)
        assert held == want - 1, "a failed move changed etcd's version: %s" % held
        print("the move's leader lost its lease (machine load): run again: %s"
              % (out + err).strip().splitlines()[-1][:160])


def groups_of(c):
    """(address, removed) of each group as coordinator c reports them."""
    return [(s.address, s.removed) for s in c.stats().shards]


def readable(c, ids):
    """How many of ids coordinator c's ReadIndexDatapoints returns (1,000 per call)."""
    tp = ch.stubs()[0]
    n = 0
    for k in range(0, len(ids), 1000):
        r = c.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids[k:k + 1000]),
                                       timeout=30)
        n += len(r.datapoints)
    return n


def settled(cl, live, want, timeout=40, live_only=False):
    """Waits until every live shard and every live coordinator is on version want and the
    coordinators report the same groups (with live_only, the same groups not removed: a
    leader's failed add keeps its number, removed, in that leader's groups only). Returns
    those groups."""
    sp = sh.stubs()[0]
    t_end = time.time() + timeout
    while True:
        vs = [s.stub.Stats(sp.ShardStatsRequest(), timeout=10).current_version for s in live]
        cs, gs = {}, {}
        for c in cl.coords:
            if c.alive():
                try:
                    cs[c.target] = c.stats().version
                    gs[c.target] = tuple(g for g in groups_of(c) if not (live_only and g[1]))
                except Exception as e:  # noqa: BLE001 - starting or dying
                    cs[c.target] = str(e).splitlines()[0][:60]
        if set(vs) == {want} and set(cs.values()) == {want} and len(set(gs.values())) == 1:
            return list(list(gs.values())[0])
        if time.time() > t_end:
            raise AssertionError("not settled on version %d after %ds: shards %s, coordinators "
                                 "%s, groups %s\n%s" % (want, timeout, vs, cs, gs, cl.logs()))
        time.sleep(0.2)


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(23)
    centers = rng.normal(size=(NLIST, D)).astype("float32") * 4
    x = (centers[rng.integers(0, NLIST, N)] + rng.normal(size=(N, D))).astype("float32")
    root = sh.tmpdir("tsr-reshard-ha-")
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("a%05d" % i, x[i])
                                                   for i in range(N)])
    cl = eh.HACluster(groups=2, replicas=1, coords=2, etcd_members=1, dims=D, ttl=TTL,
                      config={"nlist": NLIST, "pq_m": 4, "nprobe": 8})
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b1)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        cl.wait_version(1)
        leader = cl.leader(timeout=TTL + 15)
        follower = cl.follower(leader)
        qv = x[rng.integers(0, N, 16)] + rng.normal(size=(16, D)).astype("float32") * 0.3
        rq = tp.FindNeighborsRequest(queries=[ch.query(tp, v, 10, cand=0, fraction=1.0,
                                                       restricts=[("src", [], ["w"])])
                                              for v in qv])
        before = leader.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        r = follower.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        assert all(tr.same_answer(a, b) for a, b in zip(r, before)), "coordinators differ"

        stop = threading.Event()
        st = {"ok": 0, "retried": 0, "fail": [], "diff": 0}

        def client():
            i = 0
            while not stop.is_set():
                order = [cl.coords[i % 2], cl.coords[(i + 1) % 2]]
                i += 1
                got, errs = None, []
                for c in order:  # one retry, on the other coordinator
                    try:
                        got = c.stub.FindNeighbors(rq, timeout=10)
                        break
                    except Exception as e:  # noqa: BLE001 - every failure counts
                        errs.append("%s: %s" % (c.target, str(e)[:200]))
                if got is None:
                    st["fail"].append(errs)
                    continue
                st["retried"] += len(errs)
                for a, b in zip(got.nearest_neighbors, before):
                    if not tr.same_answer(a, b):
                        st["diff"] += 1
                st["ok"] += 1

        wr = {"acked": [], "fail": [], "max_s": 0.0}

        def writer():
            i = 0
            while not stop.is_set():
                ids, dps = tr.stream_batch(tp, x, i, 10)
                t0 = time.time()
                ok, errs = False, []
                for c in (leader, follower):  # the follower refuses: "not the leader"
                    try:
                        c.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=dps),
                                                timeout=60)
                        ok = True
                        break
                    except Exception as e:  # noqa: BLE001
                        errs.append(str(e)[:200])
                if ok:
                    wr["acked"] += ids
                else:
                    wr["fail"].append(errs)
                wr["max_s"] = max(wr["max_s"], time.time() - t0)
                i += 10
                time.sleep(0.03)

        ths = [threading.Thread(target=client), threading.Thread(target=writer)]
        for t in ths:
            t.start()
        live = [g[0] for g in cl.groups]
        try:
            # 1a. add a group through the follower
            s2 = sh.Shard(os.path.join(cl.root, "shard-new-2"), bin_dir=cl.bin)
            cl.shards.append(s2)
            t0 = time.time()
            rc, out, err = move(cl, 2, "add", "--target", follower.target,
                                "--group", s2.target)
            assert rc == 0 and "succeeded: version 2" in out, (rc, out, err, cl.logs())
            live.append(s2)
            groups = settled(cl, live, 2)
            assert groups == [(s.target, False) for s in live], groups
            per = tr.lists_checker(live, N + len(wr["acked"]) + 2000, N, at_least=True)
            print("add through the follower: %.1fs, version 2, datapoints per group %s"
                  % (time.time() - t0, per))
            assert "channels opened" in follower.proc.text(), follower.proc.text()[-2000:]
            # 1b. remove group 0 through the follower
            t0 = time.time()
            rc, out, err = move(cl, 3, "remove", "--target", follower.target,
                                "--group", "0")
            assert rc == 0 and "succeeded: version 3" in out, (rc, out, err, cl.logs())
            gone = live.pop(0)
            groups = settled(cl, live, 3)
            assert groups == [(gone.target, True)] + [(s.target, False) for s in live], groups
            per = tr.lists_checker(live, N + len(wr["acked"]) + 2000, N, at_least=True)
            print("remove through the follower: %.1fs, version 3, datapoints per group %s"
                  % (time.time() - t0, per))
            time.sleep(0.5)
        finally:
            stop.set()
            for t in ths:
                t.join()
        print("queries during the moves: %d answered (%d retried on the other coordinator), "
              "%d failed, %d differing" % (st["ok"], st["retried"], len(st["fail"]),
                                            st["diff"]))
        assert not st["fail"], st["fail"][:3]
        assert st["diff"] == 0 and st["ok"] > 0, st
        print("streamed writes during the moves: %d acknowledged, %d failed, longest wait "
              "%.2fs" % (len(wr["acked"]), len(wr["fail"]), wr["max_s"]))
        assert not wr["fail"], wr["fail"][:3]
        acked = wr["acked"]
        assert acked
        tr.lists_checker(live, N + len(acked) + 2000, N + len(acked))
        for c in cl.coords:  # the follower reads the leader's mirrored rounds: a moment
            t_end = time.time() + 10
            while True:
                n = readable(c, acked)
                if n == len(acked) or time.time() > t_end:
                    break
                time.sleep(0.2)
            assert n == len(acked), "%s: %d of %d acknowledged writes" % (c.target, n,
                                                                          len(acked))
        total = N + len(acked)

        # 1c. a failed add on the leader keeps its group number (removed) there; that leader
        #     is then deposed (SIGSTOP past the lease) and the new leader adds another shard
        #     under the same number: the old one, a follower now, must serve that version
        rc, out, err = tessera("shards", "add", "--target", leader.target, "--group",
                               "127.0.0.1:1", "--timeout-s", "60")
        assert rc == 1 and "FAILED" in err, (rc, out, err)
        assert [x[1] for x in groups_of(leader)] == [True, False, False, True], \
            groups_of(leader)
        leader.proc.proc.send_signal(signal.SIGSTOP)
        try:
            t_end = time.time() + TTL + 20
            while follower.ha(5)[1] != follower.target:
                assert time.time() < t_end, "no new leader while the old one is stopped"
                time.sleep(0.2)
        finally:
            leader.proc.proc.send_signal(signal.SIGCONT)
        t_end = time.time() + TTL + 20
        while leader.ha(5)[1] != follower.target:
            assert time.time() < t_end, "the old leader does not name the new one"
            time.sleep(0.2)
        leader, follower = follower, leader
        s3 = sh.Shard(os.path.join(cl.root, "shard-new-3"), bin_dir=cl.bin)
        cl.shards.append(s3)
        rc, out, err = move(cl, 4, "add", "--target", follower.target, "--group", s3.target)
        assert rc == 0 and "succeeded: version 4" in out, (rc, out, err, cl.logs())
        live.append(s3)
        groups = settled(cl, live, 4)
        assert groups == [(gone.target, True)] + [(s.target, False) for s in live], groups
        tr.lists_checker(live, total + 2000, total)
        print("a failed add on a leader that was then deposed: its group number given to "
              "the new leader's add, served by both (version 4, %d groups)" % len(groups))

        # 2. the leader dies during an add: before the etcd commit (prepared: rolled back,
        #    the new shard keeps a staged leftover), then, the add retried with the roles
        #    swapped, right after it (flipped: the new leader settles the new version)
        s4 = sh.Shard(os.path.join(cl.root, "shard-new-4"), bin_dir=cl.bin)
        cl.shards.append(s4)
        a, b = leader, follower
        version = 4
        for step, after_commit in (("prepared", False), ("flipped", True)):
            for c in (a, b):
                c.stop()
            start(a, env={"TSR_COORD_CRASH_AT": step})
            assert cl.leader(timeout=TTL + 15) is a
            start(b)
            cl.wait_version(version, timeout=30)
            t0 = time.time()
            rc, out, err = tessera("shards", "add", "--target", b.target + "," + a.target,
                                   "--group", s4.target, "--timeout-s", "40")
            try:
                a.proc.proc.wait(30)
            except subprocess.TimeoutExpired:
                raise AssertionError("%s: the leader did not reach the crash hook: %s %s %s\n%s"
                                     % (step, rc, out, err, cl.logs()))
            assert a.proc.proc.returncode == 137, (step, a.proc.proc.returncode,
                                                   a.proc.text()[-3000:])
            held = cl.etcd.committed_version(cl.prefix)
            want = version + 1 if after_commit else version
            assert held == want, "%s: etcd holds version %s, want %d" % (step, held, want)
            assert cl.leader(timeout=TTL + 15) is b
            if after_commit:
                live.append(s4)
            # b alone: it serves etcd's version and its reconcile settled every shard on it
            groups = settled(cl, live, want)
            assert groups == [(gone.target, True)] + [(s.target, False) for s in live], \
                (step, groups)
            print("leader killed at %s of an add: `tessera shards add` exit %d (%s); the new "
                  "leader settled version %d with %d groups in %.1fs"
                  % (step, rc, (out or err).strip().splitlines()[-1][:90], want, len(groups),
                     time.time() - t0))
            start(a)  # back, without the hook: a follower learning the groups from etcd
            groups2 = settled(cl, live, want)
            assert groups2 == groups, (step, groups2, groups)
            tr.lists_checker(live, total + 2000, total)
            for c in (a, b):
                r = c.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
                assert all(tr.same_answer(p, q) for p, q in zip(r, before)), (step, c.target)
            version = want
            a, b = b, a  # the retry goes to the other coordinator as the crashing leader
        assert version == 5

        # 3. the follower restarted with an empty --data
        fol = cl.follower(cl.leader(timeout=TTL + 15))
        fol.stop()
        shutil.rmtree(fol.data)
        start(fol)
        groups3 = settled(cl, live, 5)
        assert groups3 == groups, (groups3, groups)
        r = fol.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        assert all(tr.same_answer(p, q) for p, q in zip(r, before)), fol.target
        assert fol.stats().vectors_count == total, fol.stats()
        print("follower restarted with an empty --data: version 5, %d groups, same answers"
              % len(groups3))

        # 4. an update after the moves: version 6 has the groups file and, in etcd, only its
        # directory's summary; the follower restarted with an empty --data lists the
        # directory from version 6's groups (the removed one skipped), not the config's
        b6 = ch.write_batch(os.path.join(root, "b6"), [ch.dp_json("a%05d" % i, x[i])
                                                       for i in range(10)])
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b6)
        assert rc == 0 and "SUCCEEDED, version 6" in out, (rc, out, err, cl.logs())
        settled(cl, live, 6)
        keys = cl.etcd.keys(cl.prefix + "/blobs/")
        assert keys and not [k for k in keys if "/blobs/6/directory/" in k], keys
        fol = cl.follower(cl.leader(timeout=TTL + 15))
        fol.stop()
        shutil.rmtree(fol.data)
        start(fol)
        groups4 = settled(cl, live, 6)
        assert groups4 == groups, (groups4, groups)
        r = fol.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        assert all(tr.same_answer(p, q) for p, q in zip(r, before)), fol.target
        assert fol.stats().vectors_count == total, fol.stats()
        want = "directory of version 6 rebuilt from %d shard group(s)" % len(groups)
        assert want in fol.proc.text(), fol.proc.text()[-3000:]
        print("update -> version 6 (no directory blob in etcd); follower restarted with an "
              "empty --data: its directory listed from the %d groups of version 6, same "
              "answers" % len(groups))
        print("test_reshard_ha: OK")
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
