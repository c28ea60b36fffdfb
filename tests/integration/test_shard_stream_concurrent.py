"""tessera-shard streamed writes under concurrent queries (issue 15, point 1, on one shard).

A real tessera-shard holds a committed version; one writer sends Writes of 1..64 random
upserts (new labels and existing ones, moved to other lists) and deletes, in seq order,
while 4 threads run Searches (plain, filtered, crowded, sparse, re-ranked) and Reads
without pause. After every OK:
- a query with each upserted vector (k = 1, every list probed, exact re-rank) returns that
  label first, and Read returns the new datapoint;
- each deleted label is not found by Read and never comes back from a query with its old
  vector.
No query may fail. At the end the whole state is checked against a model (Read of every
label ever used), and once more after a kill -9 and a restart (the log replayed) and after
a fold (Stage/Prepare/Commit of the next version, no records).
"""
import os
import random
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

D, NLIST, M = 32, 32, 8


def main():
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(3)
    rnd = random.Random(3)
    n = 6000
    xb = rng.normal(size=(n, D)).astype("float32")
    ix, tmpl = H.template_bytes(xb[:4000], NLIST, M)

    def lst(v):
        return int(ix.quantizer.search(np.asarray([v], "float32"), 1)[1][0, 0])

    def dp(label, v):
        return H.datapoint(tp, "id%d" % label, v, restricts=[("c", ["a" if label % 2 else "b"], [])],
                           tag="t%d" % (label % 5),
                           sparse=([label % 30, 40], [1.0, 0.25]) if label % 3 == 0 else None)

    model = {}
    ups = []
    for i in range(n):
        model[i] = xb[i]
        ups.append(sp.StagedUpsert(label=i, list=lst(xb[i]), datapoint=dp(i, xb[i])))
    data = H.tmpdir()
    s = H.Shard(data, extra=["--workers", "3"])
    stop = threading.Event()
    errors = []
    nq = [0]
    try:
        H.load(s, 1, 0, ups, template=tmpl, chunk=2000, own=list(range(NLIST)))

        def probe(v):
            Dq, Iq = ix.quantizer.search(np.asarray([v], "float32"), NLIST)
            return [int(x) for x in Iq[0]], [float(x) for x in Dq[0]]

        def query(v, **kw):
            q = sp.ShardQuery(version=1, k=kw.pop("k", 1), **kw)
            q.vector.extend([float(x) for x in v])
            li, dd = probe(v)
            q.lists.extend(li)
            q.coarse_distances.extend(dd)
            return q

        def reader(seed):
            r = random.Random(seed)
            while not stop.is_set():
                v = rng_local[seed].normal(size=D).astype("float32")
                kind = r.randrange(5)
                q = query(v, k=10)
                if kind == 1:
                    q.restricts.add(namespace="c", allow_list=["a"])
                elif kind == 2:
                    q.crowding_limit = 2
                elif kind == 3:
                    q.sparse.dimensions.extend([r.randrange(30), 40])
                    q.sparse.values.extend([1.0, 1.0])
                elif kind == 4:
                    q.candidates = 50
                try:
                    s.stub.Search(sp.ShardSearchRequest(queries=[q]), timeout=30)
                    s.stub.Read(sp.ShardReadRequest(version=1, labels=[r.randrange(n + 3000)]),
                                timeout=30)
                    nq[0] += 1
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))
                    return

        rng_local = {i: np.random.default_rng(100 + i) for i in range(4)}
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()

        nextlab = n
        seq = 0
        t0 = time.time()
        nrec = 0
        for w in range(150):
            seq += 1
            rq = sp.ShardWriteRequest(version=1, seq=seq)
            nu = rnd.randint(0, 64)
            labs = set()
            upd = {}
            for _ in range(nu):
                if rnd.random() < 0.5 or not model:
                    lab = nextlab
                    nextlab += 1
                else:
                    lab = rnd.choice(list(model))
                if lab in labs:
                    continue
                labs.add(lab)
                v = rng.normal(size=D).astype("float32")
                upd[lab] = v
                rq.upserts.add(label=lab, list=lst(v), datapoint=dp(lab, v))
            dels = []
            for _ in range(rnd.randint(0, 8 if nu else 3)):
                lab = rnd.choice(list(model))
                if lab not in labs:
                    labs.add(lab)
                    dels.append((lab, model[lab]))
                    rq.deletes.add(label=lab, list=-1)
            r = s.stub.Write(rq, timeout=30)
            assert r.applied_seq == seq, r
            nrec += len(rq.upserts) + len(rq.deletes)
            for lab, v in upd.items():
                model[lab] = v
            for lab, _ in dels:
                model.pop(lab, None)
            # read-your-writes, checked on every write
            batch = [query(v, candidates=200) for v in upd.values()]
            batch += [query(v, k=10, candidates=200) for _, v in dels]
            if batch:
                res = s.stub.Search(sp.ShardSearchRequest(queries=batch), timeout=30).results
                for (lab, _), rr in zip(upd.items(), res[:len(upd)]):
                    assert list(rr.labels)[:1] == [lab], (seq, lab, list(rr.labels))
                for (lab, _), rr in zip(dels, res[len(upd):]):
                    assert lab not in rr.labels, (seq, "deleted", lab)
            got = s.stub.Read(sp.ShardReadRequest(version=1, labels=[lab for lab in labs]),
                              timeout=30).datapoints
            for g in got:
                assert g.found == (g.label in model), (seq, g.label)
        dt = time.time() - t0
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors[:3]
        print("%d writes (%d records) with 4 query threads in %.1fs; %d queries+reads ran"
              % (seq, nrec, dt, nq[0]))

        def check_model(shard, version):
            labels = list(range(nextlab))
            got = shard.stub.Read(sp.ShardReadRequest(version=version, labels=labels),
                                  timeout=60).datapoints
            for g in got:
                assert g.found == (g.label in model), g.label
                if g.found:
                    assert np.array_equal(np.asarray(g.datapoint.feature_vector, "float32"),
                                          model[g.label]), g.label
            st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            assert st.vectors_count == len(model), (st.vectors_count, len(model))
            assert sum(st.list_sizes) == len(model)
            return st

        check_model(s, 1)
        assert "Sanitizer" not in s.text() and "runtime error:" not in s.text(), s.text()
        s.kill()
        s = H.restart(s)
        st = check_model(s, 1)
        assert st.stream_seq == seq, st
        s.stub.Stage(sp.StageRequest(version=2, base_version=1, chunk=0, base_stream_seq=seq),
                     timeout=30)
        assert s.stub.Prepare(sp.PrepareRequest(version=2), timeout=60).ready
        s.stub.Commit(sp.CommitRequest(version=2), timeout=30)
        st = check_model(s, 2)
        assert st.delta_upserts == 0 and st.stream_seq == seq, st
    finally:
        stop.set()
        s.stop()
    print("ok")


if __name__ == "__main__":
    main()
