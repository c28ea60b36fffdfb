"""Crash safety of a move with --etcd (issue 19, acceptance 2; docs/resharding.md "Crash
safety"): etcd x1, two coordinators with --etcd (TTL 4 s), 2 shard groups of 1 replica,
4,000 vectors. The steps test_reshard_ha does not do, each with `tessera shards add|remove
--target FOLLOWER,LEADER` (the follower refuses naming the leader, the CLI goes there):

1. add, the leader killed at "staged" (TSR_COORD_CRASH_AT: it _exit(137)s there, as a
   kill -9): rolled back; the add retried on the new leader succeeds (the new shard's staged
   leftover aborted);
2. add, the leader killed at "committed" (after the etcd commit and the Commit fan-out):
   complete;
3. remove of group 0, the leader killed at "staged", then at "prepared": rolled back each
   time; retried, it succeeds;
4. remove of group 1, the leader killed at "flipped" (right after the etcd commit):
   complete;
5. add, the receiving shard killed at its Prepare (TSR_SHARD_CRASH_AT=prepare): the move
   fails, nothing changes (the leader keeps the failed add's group number, removed, in its
   groups only: docs/resharding.md "With --etcd"); the shard restarted, the add retried
   succeeds;
6. add, the receiving shard killed at its Commit: the move stands, the leader's reconcile
   commits it on the restarted shard;
7. remove of group 2, the leader killed at "committed": complete;
8. add under streamed writes (a writer thread on both coordinators, the follower refuses
   naming the leader) run by the leader, the FOLLOWER killed (kill -9) while the added
   shard's Prepare runs (slowed 3 s): the move completes; the follower restarted serves
   the new version with the same groups and every acknowledged write;
9. add under streamed writes (the added shard's Prepare slowed 1.5 s so that rounds
   accumulate), the leader killed at "caught-up" (its catch-up sent to N+1, before the etcd
   commit): rolled back, every acknowledged write readable on both coordinators; retried
   on the new leader under writes, it succeeds (the catch-up of docs/resharding.md "Writes
   during a move").
The crashing leader alternates between the two coordinators. After each step: etcd holds
the version the step must leave (N+1 past the commit transaction, N before it); both
coordinators (the killed one restarted without the hook) serve that version with the same
groups, the expected ones (GetIndexStats shards and removed marks); every live shard is on
it; every label is on exactly one live group (test_reshard.lists_checker: Shard.Read of
every label on every shard) and a rolled-back add's shard holds none; the index counts the
N vectors; queries answer on both coordinators with the answers of before the moves (every
list probed with PQ distances: the answer does not depend on the plan). With streamed writes
(8, 9) the same, counting the acknowledged writes (each labelled once, readable on both
coordinators, the index between N + acknowledged and N + sent), the queries denying the
writes' restrict.
Exit 77 only when etcd is not installed.
"""
import os
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
import test_reshard_ha as rh  # noqa: E402  (sets tr.N to its N)

N = rh.N
D = rh.D
NLIST = rh.NLIST
TTL = rh.TTL


class Run:
    """The cluster and what the test expects of it: the version, the groups ((address,
    removed) per group number) and the shards of the live groups."""

    def __init__(self, cl, rq, before):
        self.cl, self.rq, self.before = cl, rq, before
        self.version = 1
        self.groups = [(g[0].target, False) for g in cl.groups]
        self.live = [g[0] for g in cl.groups]
        self.timings = []

    def other(self, c):
        return next(o for o in self.cl.coords if o is not c)

    def check(self, label, t0, leader_extra=(), out_of_index=()):
        """Both coordinators and every live shard on self.version with self.groups (the
        leader with leader_extra appended), every label once, queries answered on both."""
        cl = self.cl
        if not all(c.alive() for c in cl.coords):  # the survivor alone settles the shards
            rh.settled(cl, self.live, self.version, live_only=bool(leader_extra))
            for c in cl.coords:
                if not c.alive():
                    rh.start(c)  # without the hook: a follower learning from etcd
        got = rh.settled(cl, self.live, self.version, live_only=bool(leader_extra))
        assert got == [g for g in self.groups if not (leader_extra and g[1])], (label, got)
        if leader_extra:
            lead = cl.leader(timeout=TTL + 15)
            assert rh.groups_of(lead) == self.groups + list(leader_extra), \
                (label, rh.groups_of(lead))
            assert rh.groups_of(self.other(lead)) == self.groups, \
                (label, rh.groups_of(self.other(lead)))
        per = tr.lists_checker(self.live, N + 100, N)
        tr.holds_none(out_of_index, N + 100, label)
        for c in cl.coords:
            assert c.stats().vectors_count == N, (label, c.target, c.stats())
            r = c.stub.FindNeighbors(self.rq, timeout=30).nearest_neighbors
            assert all(tr.same_answer(p, q) for p, q in zip(r, self.before)), \
                (label, c.target)
        dt = time.time() - t0
        self.timings.append((label, dt))
        print("%s: version %d on both coordinators, %d groups (%d live), datapoints per live "
              "group %s, queries answered on both (%.1fs)"
              % (label, self.version, len(self.groups), len(self.live), per, dt))

    def check_writes(self, label, t0, wr, out_of_index=()):
        """check() under streamed writes (wr: writer_start's, stopped): every acknowledged
        write readable on both coordinators, every label at most once and the batch's plus
        the acknowledged ones exactly once, the query answers (denying the writes) as
        before."""
        cl = self.cl
        if not all(c.alive() for c in cl.coords):
            rh.settled(cl, self.live, self.version)
            for c in cl.coords:
                if not c.alive():
                    rh.start(c)
        got = rh.settled(cl, self.live, self.version)
        assert got == self.groups, (label, got)
        acked = wr["acked"]
        assert acked, "no write acknowledged"
        top = N + 2 * wr["sent"] + 2000  # labels: one per upsert tried, and some slack
        per = tr.lists_checker(self.live, top, N + len(acked), at_least=True)
        tr.holds_none(out_of_index, top, label)
        for c in cl.coords:  # a follower reads the leader's mirrored rounds: a moment
            t_end = time.time() + 10
            while True:
                n = rh.readable(c, acked)
                count = c.stats().vectors_count
                ok = n == len(acked) and N + len(acked) <= count <= N + wr["sent"]
                if ok or time.time() > t_end:
                    break
                time.sleep(0.2)
            assert ok, "%s on %s: %d of %d acknowledged writes readable, %d vectors (want " \
                "%d..%d)" % (label, c.target, n, len(acked), count, N + len(acked),
                             N + wr["sent"])
            r = c.stub.FindNeighbors(self.rq_w, timeout=30).nearest_neighbors
            assert all(tr.same_answer(p, q) for p, q in zip(r, self.before_w)), \
                (label, c.target)
        dt = time.time() - t0
        self.timings.append((label, dt))
        print("%s: version %d on both coordinators, %d groups (%d live), %d writes "
              "acknowledged of %d sent (%d calls failed, longest wait %.2fs), datapoints per "
              "live group %s, queries answered on both (%.1fs)"
              % (label, self.version, len(self.groups), len(self.live), len(acked),
                 wr["sent"], wr["failed"], wr["max_s"], per, dt))

    def arm(self, crasher, step):
        """crasher becomes the leader with TSR_COORD_CRASH_AT=step; the other one runs
        without the hook, as a follower."""
        other = self.other(crasher)
        crasher.stop()           # a leader's stop revokes its lease: the other one leads
        rh.start(crasher, env={"TSR_COORD_CRASH_AT": step})
        other.stop()             # now the crasher leads
        assert self.cl.leader(timeout=TTL + 15) is crasher
        rh.start(other)
        self.cl.wait_version(self.version, timeout=30)

    def leader_crash(self, crasher, step, kind, group, completes, armed=None):
        """`tessera shards KIND --group GROUP` run by crasher as the leader, which _exit(137)s
        at step (armed(), when given, is called once it leads). Returns the CLI's (rc, out,
        err)."""
        cl = self.cl
        self.arm(crasher, step)
        if armed:
            armed()
        other = self.other(crasher)
        t0 = time.time()
        rc, out, err = rh.tessera("shards", kind, "--target", other.target + "," +
                                  crasher.target, "--group", group, "--timeout-s", "40")
        try:
            crasher.proc.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s %s: the leader did not reach the crash hook: %s %s %s\n%s"
                                 % (kind, step, rc, out, err, cl.logs()))
        assert crasher.proc.proc.returncode == 137, (step, crasher.proc.proc.returncode,
                                                     crasher.proc.text()[-3000:])
        held = cl.etcd.committed_version(cl.prefix)
        want = self.version + 1 if completes else self.version
        assert held == want, "%s %s: etcd holds version %s, want %d" % (kind, step, held,
                                                                         want)
        assert cl.leader(timeout=TTL + 15) is other
        # the CLI follows the operation on the survivor, which settled it in its etcd
        # record: SUCCEEDED with N+1, or FAILED "interrupted"
        if completes:
            assert rc == 0 and "succeeded: version %d" % want in out, (step, rc, out, err)
        else:
            assert rc == 1 and "interrupted" in err, (step, rc, out, err)
        self.version = want
        return t0, rc, out, err

    def cli_line(self, rc, out, err):
        lines = (out + err).strip().splitlines()
        return "exit %d (%s)" % (rc, lines[-1][:90] if lines else "")


def writer_start(cl, x, wr):
    """A thread streaming upserts of new ids (test_reshard.stream_batch: 10 per call,
    restricted src=w) to the coordinators in turn until the leader takes them (a follower
    refuses naming the leader); wr["acked"] the ids acknowledged, wr["sent"] the ids sent
    (a call that failed may or may not have been applied), wr["failed"] the failed calls,
    wr["max_s"] the longest call. Stopped by writer_stop."""
    tp = ch.stubs()[0]
    wr["stop"] = threading.Event()

    def run():
        while not wr["stop"].is_set():
            ids, dps = tr.stream_batch(tp, x, wr["sent"], 10)
            wr["sent"] += 10
            t0 = time.time()
            ok = False
            for c in cl.coords:
                if not c.alive():
                    continue
                try:
                    c.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=dps),
                                            timeout=30)
                    ok = True
                    break
                except Exception:  # noqa: BLE001 - a follower, or a leader dying: unknown
                    pass
            wr["max_s"] = max(wr["max_s"], time.time() - t0)
            if ok:
                wr["acked"] += ids
            else:
                wr["failed"] += 1
                time.sleep(0.2)
            time.sleep(0.03)

    wr["thread"] = threading.Thread(target=run)
    wr["thread"].start()


def writer_stop(wr):
    wr["stop"].set()
    wr["thread"].join()


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(31)
    centers = rng.normal(size=(NLIST, D)).astype("float32") * 4
    x = (centers[rng.integers(0, NLIST, N)] + rng.normal(size=(N, D))).astype("float32")
    root = sh.tmpdir("tsr-reshard-ha-crash-")
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("a%05d" % i, x[i])
                                                   for i in range(N)])
    t_all = time.time()
    cl = eh.HACluster(groups=2, replicas=1, coords=2, etcd_members=1, dims=D, ttl=TTL,
                      config={"nlist": NLIST, "pq_m": 4, "nprobe": 8})
    try:
        rc, out, err = rh.tessera("update", "--target", cl.targets, "--batch-root", b1)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        cl.wait_version(1)
        leader = cl.leader(timeout=TTL + 15)
        qv = x[rng.integers(0, N, 16)] + rng.normal(size=(16, D)).astype("float32") * 0.3
        rq = tp.FindNeighborsRequest(queries=[ch.query(tp, v, 10, cand=0, fraction=1.0)
                                              for v in qv])
        before = leader.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        run = Run(cl, rq, before)
        # the queries of steps 8 and 9, denying the streamed writes' restrict
        run.rq_w = tp.FindNeighborsRequest(queries=[
            ch.query(tp, v, 10, cand=0, fraction=1.0, restricts=[("src", [], ["w"])])
            for v in qv])
        run.before_w = leader.stub.FindNeighbors(run.rq_w, timeout=30).nearest_neighbors
        a, b = cl.coords

        def new_shard(name, env=None):
            s = sh.Shard(os.path.join(cl.root, name), env=env, bin_dir=cl.bin)
            cl.shards.append(s)  # stopped by cl.stop()
            return s

        def plain(kind, group, label):
            """A move with no crash through FOLLOWER,LEADER: it must succeed."""
            t0 = time.time()
            lead = cl.leader(timeout=TTL + 15)
            rc, out, err = rh.move(cl, run.version + 1, kind, "--target",
                                   run.other(lead).target + "," + lead.target,
                                   "--group", group)
            assert rc == 0 and "succeeded: version %d" % (run.version + 1) in out, \
                (label, rc, out, err, cl.logs())
            run.version += 1
            return t0

        # 1. add, the leader killed at staged: rolled back; retried, it succeeds
        s2 = new_shard("shard-new-2")
        t0, *cli = run.leader_crash(a, "staged", "add", s2.target, completes=False)
        run.check("add, leader killed at staged: rolled back, CLI %s" % run.cli_line(*cli),
                  t0, out_of_index=[s2])
        t0 = plain("add", s2.target, "add retried")
        run.groups.append((s2.target, False))
        run.live.append(s2)
        run.check("add retried after the rollback: succeeded", t0)

        # 2. add, the leader killed at committed: complete
        s3 = new_shard("shard-new-3")
        t0, *cli = run.leader_crash(b, "committed", "add", s3.target, completes=True)
        run.groups.append((s3.target, False))
        run.live.append(s3)
        run.check("add, leader killed at committed: complete, CLI %s" % run.cli_line(*cli),
                  t0)

        # 3. remove of group 0, the leader killed at staged then at prepared: rolled back;
        #    retried, it succeeds
        for crasher, step in ((a, "staged"), (b, "prepared")):
            t0, *cli = run.leader_crash(crasher, step, "remove", "0", completes=False)
            run.check("remove, leader killed at %s: rolled back, CLI %s"
                      % (step, run.cli_line(*cli)), t0)
        t0 = plain("remove", "0", "remove retried")
        run.groups[0] = (run.groups[0][0], True)
        run.live.remove(cl.groups[0][0])
        run.check("remove retried after the rollbacks: succeeded", t0)

        # 4. remove of group 1, the leader killed at flipped: complete
        t0, *cli = run.leader_crash(a, "flipped", "remove", "1", completes=True)
        run.groups[1] = (run.groups[1][0], True)
        run.live.remove(cl.groups[1][0])
        run.check("remove, leader killed at flipped: complete, CLI %s" % run.cli_line(*cli),
                  t0)

        # 5. add, the receiving shard killed at its Prepare: the move fails, nothing changes;
        #    the shard restarted, the add retried succeeds
        s4 = new_shard("shard-new-4", env={"TSR_SHARD_CRASH_AT": "prepare"})
        t0 = time.time()
        lead = cl.leader(timeout=TTL + 15)
        rc, out, err = rh.tessera("shards", "add", "--target", run.other(lead).target + "," +
                                  lead.target, "--group", s4.target, "--timeout-s", "60")
        assert rc == 1 and "FAILED" in err, (rc, out, err, cl.logs())
        assert s4.proc.wait(30) == 137, s4.text()[-2000:]
        s4.kill()
        assert cl.etcd.committed_version(cl.prefix) == run.version
        run.check("add, receiving shard killed at Prepare: failed, rolled back, CLI %s"
                  % run.cli_line(rc, out, err), t0, leader_extra=[(s4.target, True)])
        s4 = sh.restart(s4)
        cl.shards.append(s4)
        t0 = plain("add", s4.target, "add retried after the shard restart")
        run.groups += [(s4.target, True), (s4.target, False)]  # the failed add's number
        run.live.append(s4)
        run.check("add retried after the shard restart: succeeded", t0)

        # 6. add, the receiving shard killed at its Commit: the move stands; reconcile
        #    commits it on the restarted shard
        s5 = new_shard("shard-new-5", env={"TSR_SHARD_CRASH_AT": "commit"})
        t0 = plain("add", s5.target, "add, receiving shard killed at Commit")
        assert s5.proc.wait(30) == 137, s5.text()[-2000:]
        s5.kill()
        s5 = sh.restart(s5)
        cl.shards.append(s5)
        run.groups.append((s5.target, False))
        run.live.append(s5)
        run.check("add, receiving shard killed at Commit: complete (reconciled)", t0)

        # 7. remove of group 2, the leader killed at committed: complete
        t0, *cli = run.leader_crash(b, "committed", "remove", "2", completes=True)
        run.groups[2] = (run.groups[2][0], True)
        run.live.remove(s2)
        run.check("remove, leader killed at committed: complete, CLI %s"
                  % run.cli_line(*cli), t0)
        assert run.version == 8, run.version
        assert [g[0] for g in run.groups if not g[1]] == [s.target for s in (s3, s4, s5)]

        # 8. add under streamed writes run by the leader, the follower killed -9 while the
        #    added shard's Prepare sleeps: the move completes; the follower, restarted,
        #    serves the new version with the same groups and every acknowledged write
        wr = {"acked": [], "sent": 0, "failed": 0, "max_s": 0.0}
        lead = cl.leader(timeout=TTL + 15)
        foll = run.other(lead)
        s6 = new_shard("shard-new-6", env={"TSR_SHARD_SLOW_PREPARE_MS": "3000"})
        writer_start(cl, x, wr)
        time.sleep(0.5)
        t0 = time.time()
        res = {}
        cli_th = threading.Thread(target=lambda: res.update(out=rh.tessera(
            "shards", "add", "--target", foll.target + "," + lead.target, "--group",
            s6.target, "--timeout-s", "60")))
        cli_th.start()
        t_end = time.time() + 30
        while "Prepare sleeps first" not in s6.text():
            assert time.time() < t_end and cli_th.is_alive(), \
                ("the add did not reach the new shard's Prepare", res, cl.logs())
            time.sleep(0.05)
        foll.kill()  # SIGKILL, in the middle of the leader's move
        cli_th.join(90)
        time.sleep(0.5)
        writer_stop(wr)
        rc, out, err = res["out"]
        assert rc == 0 and "succeeded: version %d" % (run.version + 1) in out, \
            (rc, out, err, cl.logs())
        assert cl.leader(timeout=TTL + 15) is lead
        run.version += 1
        run.groups.append((s6.target, False))
        run.live.append(s6)
        run.check_writes("add under writes, follower killed -9 during the move: complete, "
                         "the follower restarted on it", t0, wr)

        # 9. add under streamed writes, the leader killed at caught-up (after its catch-up,
        #    before the etcd commit): rolled back with every acknowledged write; retried on
        #    the new leader under writes, it succeeds
        s7 = new_shard("shard-new-7", env={"TSR_SHARD_SLOW_PREPARE_MS": "1500"})

        def writes_flowing():
            writer_start(cl, x, wr)
            time.sleep(0.5)

        crasher = foll
        t0, *cli = run.leader_crash(crasher, "caught-up", "add", s7.target, completes=False,
                                    armed=writes_flowing)
        time.sleep(0.5)
        writer_stop(wr)
        assert "caught up on seqs" in crasher.proc.text(), "the killed leader carried no round"
        run.check_writes("add under writes, leader killed at caught-up: rolled back, CLI %s"
                         % run.cli_line(*cli), t0, wr, out_of_index=[s7])
        writer_start(cl, x, wr)
        time.sleep(0.5)
        t0 = plain("add", s7.target, "add under writes retried")
        time.sleep(0.5)
        writer_stop(wr)
        lead = cl.leader(timeout=TTL + 15)
        assert lead is run.other(crasher), "the leader changed during the retried add"
        assert "leftover version 10 aborted" in lead.proc.text(), lead.proc.text()[-3000:]
        assert "caught up on seqs" in lead.proc.text(), "the retried add carried no round"
        run.groups.append((s7.target, False))
        run.live.append(s7)
        run.check_writes("add under writes retried on the new leader: succeeded", t0, wr)
        assert run.version == 10, run.version
        print("test_reshard_ha_crash: OK (%.1fs)" % (time.time() - t_all))
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
