"""kill -9 during streamed writes, many rounds, a checker over the whole history (issue 15,
"what must be true" 2; docs/streaming.md "Durable when acknowledged").

Cluster: tessera-coordinator + group 0 of 2 replicas + group 1 of 1 replica, a base version
of 2000 vectors. Two writer threads (disjoint ids, so each id's writes are sequential) send
upserts (new ids, new vectors for existing ids — moves between groups —, all_restricts
updates) and removes in batches of 1-50; every call is recorded (start, end, outcome: OK,
a definite error, or UNKNOWN for UNAVAILABLE / deadline / a dropped connection).
Each round (seeded RNG, seed printed) waits for a random number of OKs, then a random 0-5 ms,
then kill -9 of, in turn, the coordinator, a random replica of group 0, the coordinator, the
single replica of group 1 — and restarts it. Writers keep going throughout. After each
round the writers pause and the checker (stream_model.classify_history) runs on every id
ever used, read through ReadIndexDatapoints:
- every acknowledged write is there exactly (vector bit for bit, restricts, numeric, tag),
  every acknowledged remove absent — at once after the restart (an unacknowledged write
  pending a resend may settle for up to 20 s);
- an unacknowledged write is either fully there or fully absent (over the ids no later
  write touched), and an upsert that moved an id leaves it somewhere (old or new value);
- nothing is duplicated: GetIndexStats counts exactly the resolved model, and full-probe
  queries (k = 10) never return an id twice.
At the end: the replicas of group 0 agree (version, stream seq, count); each of them alone
(its sibling killed) serves the same contents; then every process is killed -9 at once and
restarted (log replay) and the check runs again.
Between the rounds and the end checks, writers still streaming, the coordinator exits at
each step of a batch update (staged, prepared, flipped, committed — writes queued behind
the update): the batch is wholly there iff its operation SUCCEEDED, and the history check
holds after each.
The checker is first run on synthetic histories (a lost write, a half-applied request)
to show it fails.

TSR_STREAM_CRASH_ROUNDS (default 12), TSR_STREAM_SEED.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import stream_model as sm  # noqa: E402

D = 16
NBASE = 2000
SAN = "san-" in os.path.basename(os.path.dirname(os.path.abspath(ch.BIN)))
ROUNDS = int(os.environ.get("TSR_STREAM_CRASH_ROUNDS", 6 if SAN else 12))
SEED = int(os.environ.get("TSR_STREAM_SEED", int(time.time()) % 100000))
WRITERS = 2


def checker_self_test():
    """The checker fails on a lost write, a half-applied request and a duplicate value."""
    rng = np.random.default_rng(1)
    a, b, c = (sm.random_rec(rng, i, 4) for i in ("a", "b", "c"))
    init = sm.Model([a])
    h = sm.History()
    u = sm.Op("upsert", [b, c])
    u.start, u.end, u.outcome = 1, 2, sm.OK
    h.add(u)
    _, _, hard, _ = sm.classify_history(h, init, {"a": a, "b": b}, {"a", "b", "c"})
    assert hard and "c: holds absent" in hard[0], hard
    u.outcome = sm.UNKNOWN
    _, _, hard, soft = sm.classify_history(h, init, {"a": a, "b": b}, {"a", "b", "c"})
    assert not hard and soft and "half applied" in soft[0], (hard, soft)
    _, _, hard, soft = sm.classify_history(h, init, {"a": a}, {"a", "b", "c"})
    assert not hard and not soft, (hard, soft)
    r = sm.Op("remove", ids=["a"])
    r.start, r.end, r.outcome = 3, 4, sm.OK
    h.add(r)
    _, _, hard, _ = sm.classify_history(h, init, {"a": a, "b": b, "c": c}, {"a", "b", "c"})
    assert hard and "a: holds" in hard[0], hard


class Writers:
    def __init__(self, cl, tp, rng_seed, base, hist):
        self.cl, self.tp, self.hist = cl, tp, hist
        self.lock = threading.Lock()
        self.ok_event = threading.Event()
        self.pause = threading.Event()
        self.paused = [threading.Event() for _ in range(WRITERS)]
        self.stop = threading.Event()
        self.oks = 0
        self.errors = []
        self.threads = []
        for w in range(WRITERS):
            mine = [r for k, r in enumerate(base) if k % WRITERS == w]
            th = threading.Thread(target=self.run, args=(w, mine, rng_seed + 101 * w))
            th.start()
            self.threads.append(th)

    def run(self, w, mine, seed):
        rng = np.random.default_rng(seed)
        live = {r.id: r for r in mine}  # this writer's view: every id's latest written value
        nnew = 0
        while not self.stop.is_set():
            if self.pause.is_set():
                self.paused[w].set()
                time.sleep(0.02)
                continue
            self.paused[w].clear()
            n = int(rng.integers(1, 51))
            ids = list(live)
            kind = rng.random()
            if kind < 0.2 and ids:
                pick = rng.choice(len(ids), min(n, len(ids)), replace=False)
                op = sm.Op("remove", ids=[ids[j] for j in pick])
            elif kind < 0.3 and ids:
                pick = rng.choice(len(ids), min(n, len(ids)), replace=False)
                recs = []
                for j in pick:
                    rs, num = sm.random_restricts(rng)
                    recs.append(live[ids[j]].with_restricts(rs, num))
                op = sm.Op("upsert", recs, restricts_only=True)
            else:
                nold = int(rng.integers(0, n + 1)) if kind < 0.6 else 0
                pick = rng.choice(len(ids), min(nold, len(ids)), replace=False)
                new_ids = [ids[j] for j in pick]
                while len(new_ids) < n:
                    new_ids.append("w%d-%06d" % (w, nnew))
                    nnew += 1
                op = sm.Op("upsert", [sm.random_rec(rng, i, D) for i in new_ids])
            op.writer = w
            try:
                sm.call(self.cl.stub, op, self.tp, timeout=20)
            except Exception as e:  # noqa: the channel was closed by a coordinator restart
                op.outcome, op.code, op.end = sm.UNKNOWN, repr(e)[:200], time.time()
            with self.lock:
                self.hist.add(op)
            if op.outcome == sm.ERR:   # every id picked exists: no error is expected
                self.errors.append("%r: %s" % (op, op.code))
            # The writer's view follows what may now be there (an unknown remove: keep the
            # id out of later picks, so that its outcome stays checkable).
            if op.outcome in (sm.OK, sm.UNKNOWN):
                if op.kind == "remove":
                    for i in op.ids:
                        live.pop(i, None)
                elif op.outcome == sm.OK or not op.restricts_only:
                    for r in op.recs:
                        if op.restricts_only:
                            live[r.id] = live[r.id].with_restricts(r[2], r[3])
                        else:
                            live[r.id] = r
                if op.outcome == sm.UNKNOWN and op.kind == "upsert":
                    for r in op.recs:      # unknown outcome: leave the id alone from now on
                        live.pop(r.id, None)
            if op.outcome == sm.OK:
                with self.lock:
                    self.oks += 1
                self.ok_event.set()
            else:
                time.sleep(0.05)

    def hold(self, timeout=60):
        self.pause.set()
        t0 = time.time()
        for e in self.paused:
            while not e.is_set():
                assert time.time() - t0 < timeout, "writers did not pause"
                time.sleep(0.02)

    def resume(self):
        for e in self.paused:
            e.clear()
        self.pause.clear()

    def finish(self):
        self.stop.set()
        for th in self.threads:
            th.join(120)


def check(cl, tp, hist, initial, all_ids, what, settle=20.0, extra=0):
    """The checker on the cluster's current contents; soft violations may settle for up to
    `settle` seconds (a pending resend), hard ones fail at once. extra: records of batch
    updates (ids no writer touches) the index holds besides the history's."""
    t0 = time.time()
    while True:
        got = sm.read_state(cl.stub, tp, all_ids)
        resolved, notes, hard, soft = sm.classify_history(hist, initial, got, all_ids)
        assert not hard, "%s: acknowledged writes not there (%d):\n  %s\n%s" % (
            what, len(hard), "\n  ".join(hard[:10]), cl.coord.text()[-4000:])
        if not soft:
            break
        if time.time() - t0 > settle:
            raise AssertionError("%s: unacknowledged writes half there after %.0fs (%d):\n  %s"
                                 % (what, settle, len(soft), "\n  ".join(soft[:10])))
        time.sleep(0.5)
    st = cl.stats()
    assert st.vectors_count == len(resolved.m) + extra, "%s: GetIndexStats counts %d, the " \
        "history resolves to %d ids + %d batch records (a duplicate or a lost record)" % (
            what, st.vectors_count, len(resolved.m), extra)
    recs = list(resolved.m.values())
    sample = [recs[k] for k in range(0, len(recs), max(1, len(recs) // 150))]
    sm.check_no_duplicates(cl.stub, tp, recs, sample)
    return resolved, notes


def crash_in_updates(cl, tp, hist, initial, base, writers, root, rng):
    """While the writers stream, the coordinator is made to exit (_exit 137) at each step of
    a batch update (TSR_COORD_CRASH_AT = staged | prepared | flipped | committed; streamed
    writes queue behind the update's stream lock) and restarted. The batch adds 1000 new
    ids and deletes the previous batch's (ids no writer touches): they must be all there iff
    GetOperation says SUCCEEDED after the restart (flipped, committed), all absent
    otherwise; the stream's history check runs after each. Returns the batch records the
    index holds."""
    held = []
    for k, step in enumerate(["staged", "prepared", "flipped", "committed"]):
        recs = [sm.random_rec(rng, "u%d-%04d" % (k, i), D) for i in range(1000)]
        bdir = ch.write_batch(os.path.join(root, "u%d" % k), [sm.to_json(r) for r in recs],
                              [r.id for r in held])
        cl.stop_coord()
        cl.restart_coord(env={"TSR_COORD_CRASH_AT": step})
        cl.wait_ready(tp)
        time.sleep(0.3)
        op_id = cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=bdir),
                                    timeout=30).operation_id
        rc = cl.wait_exit(120)
        assert rc == 137, (step, rc, cl.coord.text()[-3000:])
        cl.restart_coord()
        cl.wait_ready(tp)
        op = cl.stub.GetOperation(tp.GetOperationRequest(operation_id=op_id), timeout=10)
        ok = op.state == tp.Operation.SUCCEEDED
        assert ok == (step in ("flipped", "committed")), (step, op)
        got = sm.read_state(cl.stub, tp, [r.id for r in recs + held])
        want = {r.id: r for r in (recs if ok else held)}
        diff = sm.diff_states(want, got)
        assert not diff, "update interrupted after %s (%s): batch records:\n  %s" % (
            step, tp.Operation.State.Name(op.state), "\n  ".join(diff))
        if ok:
            held = recs
        writers.hold()
        all_ids = set(r.id for r in base) | set(i for o in hist.ops for i in o.touched())
        _, notes = check(cl, tp, hist, initial, all_ids, "update interrupted after " + step,
                         extra=len(held))
        print("update interrupted after %-9s while streaming: %s, its batch %s; history %d "
              "ops, unknown %d: checked" % (step, tp.Operation.State.Name(op.state),
                                            "all there" if ok else "all absent",
                                            len(hist.ops), notes["unknown_ops"]))
        writers.resume()
    return len(held)


def main():
    checker_self_test()
    tp = ch.stubs()[0]
    print("test_stream_crash: seed %d (TSR_STREAM_SEED), %d rounds" % (SEED, ROUNDS))
    rng = np.random.default_rng(SEED)
    base = [sm.random_rec(rng, "b%05d" % i, D) for i in range(NBASE)]
    root = sh.tmpdir("tsr-stream-crash-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [sm.to_json(r) for r in base])
    cl = sm.StreamCluster([2, 1], D, {"nlist": 16, "pq_m": 4, "nprobe": 4})
    hist = sm.History()
    writers = None
    kills = {"replica": 0, "coordinator": 0, "single": 0}
    try:
        op0 = cl.update(b0)
        assert op0.state == tp.Operation.SUCCEEDED, op0
        initial = sm.Model(base)
        writers = Writers(cl, tp, SEED, base, hist)
        for rnd in range(ROUNDS):
            want = writers.oks + int(rng.integers(3, 20))
            t0 = time.time()
            while writers.oks < want:
                assert not writers.errors, writers.errors[:5]
                assert time.time() - t0 < 120, "no progress: %d OKs, errors %s\n%s" % (
                    writers.oks, writers.errors[:3], cl.coord.text()[-3000:])
                writers.ok_event.wait(1)
                writers.ok_event.clear()
            time.sleep(float(rng.random()) * 0.005)
            target = ("coordinator", "replica", "coordinator", "single")[rnd % 4]
            if target == "coordinator":
                cl.kill_coord()
                time.sleep(float(rng.random()) * 0.3)
                cl.restart_coord()
            else:
                g, r = (1, 0) if target == "single" else (0, int(rng.integers(0, 2)))
                cl.kill_shard(g, r)
                time.sleep(0.2 + float(rng.random()) * 0.5)   # writes go on meanwhile
                cl.restart_shard(g, r)
            kills[target] += 1
            cl.wait_ready(tp)
            time.sleep(0.3)   # a few writes after the restart
            writers.hold()
            all_ids = set(r.id for r in base) | set(i for o in hist.ops for i in o.touched())
            _, notes = check(cl, tp, hist, initial, all_ids, "round %d (kill %s)" % (rnd, target))
            print("round %d: kill -9 %s after %d OKs; history %d ops, unknown %d (applied %d, "
                  "absent %d): checked" % (rnd, target, writers.oks, len(hist.ops),
                                           notes["unknown_ops"], notes["unknown_applied"],
                                           notes["unknown_absent"]))
            writers.resume()
        extra = crash_in_updates(cl, tp, hist, initial, base, writers, root, rng)
        writers.finish()
        assert not writers.errors, writers.errors[:5]
        all_ids = set(r.id for r in base) | set(i for o in hist.ops for i in o.touched())
        cl.wait_replicas_agree()
        resolved, notes = check(cl, tp, hist, initial, all_ids, "end", extra=extra)
        # each replica of group 0 alone serves the same contents
        for r in range(2):
            cl.wait_coord_sees_all()
            cl.kill_shard(0, r)
            check(cl, tp, hist, initial, all_ids, "group 0 replica %d alone" % (1 - r), 0,
                  extra)
            cl.restart_shard(0, r)
            cl.wait_replicas_agree()
        # everything killed at once, restarted: the logs are replayed
        cl.kill_coord()
        for g, grp in enumerate(cl.groups):
            for r in range(len(grp)):
                cl.kill_shard(g, r)
        for g, grp in enumerate(cl.groups):
            for r in range(len(grp)):
                cl.restart_shard(g, r)
        cl.restart_coord()
        cl.wait_ready(tp)
        check(cl, tp, hist, initial, all_ids, "after kill -9 of every process", 0, extra)
        acked = len(hist.acked())
        print("%d rounds (kills: %s), %d writes recorded, %d acknowledged, %d unknown (%d "
              "applied, %d absent); every acknowledged write there, no unacknowledged one "
              "half there, no duplicate; replicas agree; same after a kill -9 of all" %
              (ROUNDS, kills, len(hist.ops), acked, notes["unknown_ops"],
               notes["unknown_applied"], notes["unknown_absent"]))
    except BaseException:
        print("seed %d; the last of %d recorded ops:" % (SEED, len(hist.ops)))
        for o in hist.ops[-30:]:
            print("  %r %s %s" % (o, o.touched()[:4], o.code))
        raise
    finally:
        if writers:
            writers.finish()
        cl.stop()
    print("test_stream_crash: OK")


if __name__ == "__main__":
    main()
