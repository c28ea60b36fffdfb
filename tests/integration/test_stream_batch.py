"""Batch updates in the middle of a stream (issue 15, "what must be true" 3;
docs/streaming.md "Folding, and batches").

Cluster: tessera-coordinator + group 0 of 2 replicas + group 1 of 1 replica; version 1 from a
batch of 2000 vectors. Four writer threads (disjoint ids; seeded, seed printed) stream
upserts, all_restricts updates and removes in batches of 1-20 without pause, over base ids,
their own new ids, and the ids the batch will replace, delete or create. In the middle an
UpdateIndex with a batch root of JSON records commits: records replacing base ids and ids
streamed before it, records for new ids (some of which the stream writes too), and a delete
file naming base and streamed ids (8000 new records by default, TSR_STREAM_BATCH_NEW, so
that the update lasts long enough for streamed writes to queue behind it). Every streamed
call must be OK (writes wait through an update, they are not refused).

The model: the acknowledged stream writes in stream_seq order, the batch applied between
the last write answered with the old version and the first answered with the new one (the
batch's commit point). The final state — every id ever used, read with
ReadIndexDatapoints, vectors bit for bit — must equal it; GetIndexStats counts it exactly (a
write racing the batch is neither lost nor applied twice); full-probe queries return no id
twice; every write's version is the old or the new one and versions never go back in seq
order.

Before that, 4 writers hit the same 40 ids at once: each id must end with the value of its
acknowledged write of the highest stream_seq (the stream applies in acknowledgement order).
Phase 2 does the same with is_complete_overwrite: the batch replaces everything, streamed
writes before it included (the documented rule), streamed writes after it stay.
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
WRITERS = 4
SAN = "san-" in os.path.basename(os.path.dirname(os.path.abspath(ch.BIN)))
# new ids in each batch
NEW = int(os.environ.get("TSR_STREAM_BATCH_NEW", 2000 if SAN else 8000))
SEED = int(os.environ.get("TSR_STREAM_SEED", int(time.time()) % 100000))


class Writer(threading.Thread):
    """Streams ops over its ids until stopped; every op recorded in hist."""

    def __init__(self, w, cl, tp, hist, pool, stable, prefix, seed):
        super().__init__()
        self.prefix = prefix
        # ids that exist before and after the batch: the only ones removes leave alone and
        # all_restricts updates touch (an all_restricts of a missing id is INVALID_ARGUMENT)
        self.stable = [i for i in pool if i in stable]
        self.removable = [i for i in pool if i not in stable]
        self.w, self.cl, self.tp, self.hist = w, cl, tp, hist
        self.pool = list(pool)           # ids this writer may touch (besides its new ones)
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.oks = 0
        self.errors = []
        self.nnew = 0

    def run(self):
        rng = self.rng
        while not self.stop.is_set():
            n = int(rng.integers(1, 21))
            kind = rng.random()
            if kind < 0.15:
                pick = rng.choice(len(self.removable), min(n, len(self.removable)),
                                  replace=False)
                op = sm.Op("remove", ids=[self.removable[j] for j in pick])
            elif kind < 0.25 and self.stable:
                pick = rng.choice(len(self.stable), min(n, len(self.stable)), replace=False)
                recs = []
                for j in pick:
                    rs, num = sm.random_restricts(rng)
                    recs.append(sm.Rec(self.stable[j], [0.0] * D, rs, num))
                op = sm.Op("upsert", recs, restricts_only=True)
            else:
                ids = []
                for _ in range(n):
                    if rng.random() < 0.3:
                        ids.append("%sw%d-%05d" % (self.prefix, self.w, self.nnew))
                        self.pool.append(ids[-1])
                        self.removable.append(ids[-1])
                        self.nnew += 1
                    else:
                        ids.append(self.pool[int(rng.integers(0, len(self.pool)))])
                ids = list(dict.fromkeys(ids))
                op = sm.Op("upsert", [sm.random_rec(rng, i, D) for i in ids])
            sm.call(self.cl.stub, op, self.tp, timeout=60)
            op.writer = self.w
            with self.lock:
                self.hist.add(op)
                if op.outcome != sm.OK:
                    self.errors.append("%r: %s" % (op, op.code))
                else:
                    self.oks += 1
            if op.outcome != sm.OK:
                time.sleep(0.1)


def run_phase(cl, tp, model, batch_recs, batch_dels, root, overwrite, seed, pools, stable,
              prefix, what):
    """Streams while one batch update commits; checks the final state against the model.
    Returns the new model."""
    hist = sm.History()
    bdir = ch.write_batch(os.path.join(root, what), [sm.to_json(r) for r in batch_recs],
                          batch_dels)
    writers = [Writer(w, cl, tp, hist, pools[w], stable, prefix, seed + w)
               for w in range(len(pools))]
    v_old = cl.stats().version
    for w in writers:
        w.start()
    try:
        t0 = time.time()
        while sum(w.oks for w in writers) < 40:
            assert not any(w.errors for w in writers), [w.errors[:3] for w in writers]
            assert time.time() - t0 < 60, "no streamed write acknowledged in 60 s"
            time.sleep(0.02)
        oks_before = sum(w.oks for w in writers)
        t_call = time.time()
        r = cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=bdir,
                                                      is_complete_overwrite=overwrite),
                                timeout=30)
        op = cl.wait_op(r.operation_id, 300)
        t_done = time.time()
        assert op.state == tp.Operation.SUCCEEDED, op
        oks_during = sum(w.oks for w in writers) - oks_before
        t1 = time.time()
        while sum(w.oks for w in writers) < oks_before + oks_during + 40:
            assert time.time() - t1 < 60, "no streamed write acknowledged after the batch"
            time.sleep(0.02)
    finally:
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(120)
    errs = [e for w in writers for e in w.errors]
    assert not errs, "streamed writes failed around the batch:\n  " + "\n  ".join(errs[:5])
    vb = op.version
    assert vb > v_old, (vb, v_old)
    acked = sorted(hist.acked(), key=lambda o: (o.seq, o.start))
    last_v = 0
    for o in acked:
        assert o.version in (v_old, vb), "write answered version %d, neither %d nor %d: %r" % (
            o.version, v_old, vb, o)
        assert o.version >= last_v, "versions go back in seq order at %r" % o
        last_v = o.version
    before = [o for o in acked if o.version < vb]
    after = [o for o in acked if o.version >= vb]
    # racing: writes sent before the commit point and answered after it
    racing = sum(1 for o in after if o.start < op.end_time_ms / 1000.0)
    m = model.copy()
    for o in before:
        m.apply(o)
    bop = sm.Op("batch", batch_recs, batch_dels, overwrite=overwrite)
    m.apply(bop)
    for o in after:
        m.apply(o)
    all_ids = set(model.m) | set(r.id for r in batch_recs) | set(batch_dels) | \
        set(i for o in hist.ops for i in o.touched())
    got = sm.read_state(cl.stub, tp, all_ids)
    diff = sm.diff_states(m.m, got)
    assert not diff, "%s: the final state differs from the model (batch at its commit " \
        "point, stream in acknowledgement order):\n  %s" % (what, "\n  ".join(diff))
    st = cl.stats()
    assert st.version == vb and st.vectors_count == len(m.m), (st.version, vb,
                                                                st.vectors_count, len(m.m))
    recs = list(m.m.values())
    sm.check_no_duplicates(cl.stub, tp, recs, [recs[k] for k in range(0, len(recs),
                                                                      max(1, len(recs) // 150))])
    print("%s: %d streamed writes acknowledged (%d before the commit point, %d after, %d of "
          "them sent before it), batch of %d records + %d deletes committed version %d in "
          "%.2fs (call to SUCCEEDED seen); final %d ids equal the model" %
          (what, len(acked), len(before), len(after), racing, len(batch_recs), len(batch_dels),
           vb, t_done - t_call, len(m.m)))
    return m


def same_ids(cl, tp, model, seed):
    """4 writers on the same 40 ids (20 existing, 20 new) at once: each id ends with the
    value of its acknowledged write of the highest stream_seq (writes of one round share a
    seq: then one of them) — the stream applies in acknowledgement (seq) order. Returns the
    new model."""
    hist, lock = sm.History(), threading.Lock()
    ids = sorted(model.m)[:20] + ["same-%02d" % i for i in range(20)]

    def writer(t):
        rng = np.random.default_rng(seed + t)
        for _ in range(100):
            pick = [ids[j] for j in rng.choice(len(ids), int(rng.integers(1, 6)),
                                               replace=False)]
            if rng.random() < 0.2:
                op = sm.Op("remove", ids=pick)
            else:
                op = sm.Op("upsert", [sm.random_rec(rng, i, D) for i in pick])
            sm.call(cl.stub, op, tp)
            with lock:
                hist.add(op)

    th = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for x in th:
        x.start()
    for x in th:
        x.join(300)
    bad = [o for o in hist.ops if o.outcome != sm.OK]
    assert not bad, ["%r %s" % (o, o.code) for o in bad[:5]]
    got = sm.read_state(cl.stub, tp, ids)
    m = model.copy()
    ties = 0
    for i in ids:
        ops = [o for o in hist.ops if i in o.touched()]
        if not ops:
            continue
        top = max(o.seq for o in ops)
        last = [o for o in ops if o.seq == top]
        ties += len(last) > 1
        cands = [sm._value_after(o, i, None) for o in last]
        assert got.get(i) in cands, "%s holds %s, its last acknowledged write (seq %d) left " \
            "%s" % (i, got[i].short() if i in got else "absent", top,
                    [c.short() if c else "absent" for c in cands])
        if i in got:
            m.m[i] = got[i]
        else:
            m.m.pop(i, None)
    assert cl.stats().vectors_count == len(m.m), (cl.stats().vectors_count, len(m.m))
    print("same ids from 4 writers: %d writes acknowledged; every id holds its highest-seq "
          "write (%d ids with two writes in that round)" % (len(hist.ops), ties))
    return m


def main():
    tp = ch.stubs()[0]
    print("test_stream_batch: seed %d (TSR_STREAM_SEED)" % SEED)
    rng = np.random.default_rng(SEED)
    centers = rng.normal(size=(16, D)) * 4
    base = [sm.random_rec(rng, "b%05d" % i, D, centers) for i in range(NBASE)]
    root = sh.tmpdir("tsr-stream-batch-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [sm.to_json(r) for r in base])
    cl = sm.StreamCluster([2, 1], D, {"nlist": 16, "pq_m": 4, "nprobe": 4})
    try:
        op0 = cl.update(b0)
        assert op0.state == tp.Operation.SUCCEEDED, op0
        model = same_ids(cl, tp, sm.Model(base), SEED + 7)
        # phase 1: a delta batch. It replaces base ids 0..599, deletes 600..799, creates
        # n00000.. (NEW); the writers also touch every one of those ids (and their own).
        brecs = [sm.random_rec(rng, "b%05d" % i, D, centers) for i in range(600)]
        brecs += [sm.random_rec(rng, "n%05d" % i, D, centers) for i in range(NEW)]
        bdels = ["b%05d" % i for i in range(600, 800)] + \
            ["p1w0-%05d" % i for i in range(0, 40, 3)]
        ids = ["b%05d" % i for i in range(NBASE)] + ["n%05d" % i for i in range(0, NEW, 10)]
        pools = [ids[w::WRITERS] for w in range(WRITERS)]
        model = run_phase(cl, tp, model, brecs, bdels, root, False, SEED + 1, pools,
                          set("b%05d" % i for i in range(600)) & set(model.m), "p1",
                          "delta batch")
        # phase 2: a complete overwrite: 750 ids that exist now and NEW new ones
        live = sorted(model.m)
        keep = [live[int(j)] for j in rng.choice(len(live), 750, replace=False)]
        brecs = [sm.random_rec(rng, i, D, centers) for i in keep]
        brecs += [sm.random_rec(rng, "o%05d" % i, D, centers) for i in range(NEW)]
        ids = live + ["o%05d" % i for i in range(0, NEW, 10)]
        pools = [ids[w::WRITERS] for w in range(WRITERS)]
        run_phase(cl, tp, model, brecs, [], root, True, SEED + 2, pools, set(keep), "p2",
                  "complete overwrite")
    finally:
        cl.stop()
    print("test_stream_batch: OK")


if __name__ == "__main__":
    main()
