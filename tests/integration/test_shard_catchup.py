"""tessera-shard catch-up versions over gRPC (docs/resharding.md "Writes during a move",
step 1), with kill -9:

- version 1 (600 datapoints) with streamed writes seq 1..3; Stage of version 2 on it with
  capture_delta at base_stream_seq 3 (chunk 0 deletes 20 base labels and upserts 5 new
  ones); Writes seq 4..6 go on to version 1 and are acknowledged; Prepare(2) is ready
  (without capture_delta it refuses: "writes arrived after Stage" — checked first on a
  staging that is then replaced); version 2 holds seq 1..3 and the staged edits, not 4..6;
- Writes naming version 2 carry seqs 4..6 (a resend of 5 is acknowledged, not applied
  twice); a Write to version 1 is still taken while 2 waits (seq 7, then carried too);
- kill -9, restart: version 1 still current with every write, version 2 still prepared
  with its catch-up (its log replayed);
- Commit(2): version 2 serves exactly the model (every label read back, vector bit for
  bit), applied seq 7; Write seq 8 on it; kill -9, restart: the same, applied seq 8.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

D, NLIST, M, N = 16, 16, 4, 600


def main():
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(19)
    xb = rng.normal(size=(N, D)).astype("float32")
    ix, tmpl = H.template_bytes(xb, NLIST, M)

    def lst(v):
        return int(ix.quantizer.search(np.asarray([v], "float32"), 1)[1][0, 0])

    def up(label, v):
        return sp.StagedUpsert(label=label, list=lst(v),
                               datapoint=H.datapoint(tp, "id%d" % label, v))

    v1 = {i: xb[i] for i in range(N)}  # label -> vector, version 1 with its writes
    writes = {}  # seq -> (upserts {label: vec}, deletes [label])
    for sq in range(1, 9):
        ups = {N + 10 * sq + k: rng.normal(size=D).astype("float32") for k in range(3)}
        ups[int(rng.integers(0, 100))] = rng.normal(size=D).astype("float32")  # a replace
        dels = [100 + sq]
        writes[sq] = (ups, dels)

    def write(shard, version, sq):
        ups, dels = writes[sq]
        rq = sp.ShardWriteRequest(version=version, seq=sq)
        for lab, v in ups.items():
            rq.upserts.append(up(lab, v))
        for lab in dels:
            rq.deletes.add(label=lab, list=-1)
        return shard.stub.Write(rq, timeout=30).applied_seq

    def apply(model, sq):
        ups, dels = writes[sq]
        model.update(ups)
        for lab in dels:
            model.pop(lab, None)

    def check(shard, version, model, what):
        labels = list(range(N + 200))
        r = shard.stub.Read(sp.ShardReadRequest(version=version, labels=labels), timeout=30)
        for lab, d in zip(labels, r.datapoints):
            if lab in model:
                assert d.found, "%s: label %d missing" % (what, lab)
                got = np.asarray(d.datapoint.feature_vector, dtype="float32")
                assert np.array_equal(got, model[lab]), "%s: label %d differs" % (what, lab)
            else:
                assert not d.found, "%s: label %d present" % (what, lab)

    def versions(shard):
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=30)
        return st.current_version, st.stream_seq, {v.version: v.state for v in st.versions}

    data = H.tmpdir("tsr-shard-catchup-")
    s = H.Shard(data)
    try:
        H.load(s, 1, 0, [up(i, xb[i]) for i in range(N)], template=tmpl,
               own=list(range(NLIST)))
        for sq in (1, 2, 3):
            assert write(s, 1, sq) == sq
            apply(v1, sq)
        staged_new = {N + 150 + k: rng.normal(size=D).astype("float32") for k in range(5)}
        staged_del = list(range(300, 320))

        def stage(capture, seq):
            rq = sp.StageRequest(version=2, base_version=1, chunk=0, base_stream_seq=seq,
                                 capture_delta=capture)
            rq.upserts.extend(up(lab, v) for lab, v in staged_new.items())
            for lab in staged_del:
                rq.deletes.add(label=lab, list=lst(xb[lab]))
            rq.own_lists.extend(range(NLIST))
            s.stub.Stage(rq, timeout=30)

        # without capture_delta: a write after Stage breaks the Prepare (as before)
        stage(False, 3)
        assert write(s, 1, 4) == 4
        apply(v1, 4)
        try:
            s.stub.Prepare(sp.PrepareRequest(version=2), timeout=60)
            raise AssertionError("Prepare after a write accepted without capture_delta")
        except Exception as e:  # noqa: BLE001
            assert "writes arrived after Stage" in str(e), e
        # with it, at seq 4: seqs 5, 6 reach version 1 only
        stage(True, 4)
        v2 = dict(v1)
        v2.update(staged_new)
        for lab in staged_del:
            v2.pop(lab, None)
        for sq in (5, 6):
            assert write(s, 1, sq) == sq
            apply(v1, sq)
        pr = s.stub.Prepare(sp.PrepareRequest(version=2), timeout=60)
        assert pr.ready, pr.reason
        check(s, 2, v2, "prepared version 2 before its catch-up")
        assert write(s, 1, 7) == 7  # the served version still takes writes
        apply(v1, 7)
        check(s, 1, v1, "version 1")
        for sq in (5, 6, 7):  # the catch-up
            assert write(s, 2, sq) == sq
            apply(v2, sq)
        assert write(s, 2, 5) == 7  # a resend: acknowledged, not applied again
        check(s, 2, v2, "version 2 caught up")

        s.kill()
        s = H.restart(s)
        cur, seq, vs = versions(s)
        assert cur == 1 and seq == 7 and vs.get(2) == sp.ShardVersion.PREPARED, (cur, seq, vs)
        check(s, 1, v1, "version 1 after kill -9")
        check(s, 2, v2, "prepared version 2 after kill -9")

        s.stub.Commit(sp.CommitRequest(version=2), timeout=30)
        cur, seq, _ = versions(s)
        assert cur == 2 and seq == 7, (cur, seq)
        check(s, 0, v2, "version 2 committed")
        assert write(s, 2, 8) == 8
        apply(v2, 8)
        s.kill()
        s = H.restart(s)
        cur, seq, _ = versions(s)
        assert cur == 2 and seq == 8, (cur, seq)
        check(s, 0, v2, "version 2 after kill -9")
        print("test_shard_catchup: OK")
    finally:
        s.stop()  # the data dir goes at exit (H.tmpdir)


if __name__ == "__main__":
    main()
