"""tessera-shard streamed writes and kill -9 at random moments (issue 15, point 2, the shard).

A writer sends Writes (1..20 upserts and deletes each, seqs in order) to a real
tessera-shard without pause; the shard is killed with SIGKILL at a random moment (12
rounds), while Writes are in flight. After each restart (the log replayed, a torn tail
cut): the applied seq S is at least the last acknowledged seq and at most one more (the
write in flight may or may not have reached the log), and the whole state (Read of every
label ever used, Stats counts) equals the model of writes 1..S exactly — every
acknowledged write is there and no write is half there. The writer then goes on from S+1.
"""
import os
import random
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

D, NLIST, M = 16, 16, 4


def main():
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(8)
    rnd = random.Random(8)
    n = 2000
    xb = rng.normal(size=(n, D)).astype("float32")
    ix, tmpl = H.template_bytes(xb, NLIST, M)

    def lst(v):
        return int(ix.quantizer.search(np.asarray([v], "float32"), 1)[1][0, 0])

    def dp(label, v):
        return H.datapoint(tp, "id%d" % label, v)

    model = {i: xb[i] for i in range(n)}
    data = H.tmpdir()
    s = H.Shard(data)
    H.load(s, 1, 0, [sp.StagedUpsert(label=i, list=lst(xb[i]), datapoint=dp(i, xb[i]))
                     for i in range(n)], template=tmpl, chunk=2000, own=list(range(NLIST)))
    writes = {}  # seq -> (upserts {label: vec}, deletes [label])
    nextlab = [n]
    seq = 0
    acked = 0
    try:
        for rnd_i in range(12):
            state = {"acked": acked, "seq": seq}

            def writer(shard, st):
                while True:
                    sq = st["seq"] + 1
                    if sq not in writes:
                        ups, dels = {}, []
                        for _ in range(rnd.randint(1, 20)):
                            lab = nextlab[0] if rnd.random() < 0.6 else rnd.randrange(nextlab[0])
                            nextlab[0] = max(nextlab[0], lab + 1)
                            if lab not in ups and lab not in dels:
                                if rnd.random() < 0.8:
                                    ups[lab] = rng.normal(size=D).astype("float32")
                                else:
                                    dels.append(lab)
                        writes[sq] = (ups, dels)
                    ups, dels = writes[sq]
                    rq = sp.ShardWriteRequest(version=1, seq=sq)
                    for lab, v in ups.items():
                        rq.upserts.add(label=lab, list=lst(v), datapoint=dp(lab, v))
                    for lab in dels:
                        rq.deletes.add(label=lab, list=-1)
                    st["seq"] = sq
                    try:
                        r = shard.stub.Write(rq, timeout=10)
                    except Exception:  # noqa: BLE001 (killed)
                        return
                    assert r.applied_seq == sq, r
                    st["acked"] = sq

            th = threading.Thread(target=writer, args=(s, state))
            th.start()
            time.sleep(rnd.uniform(0.05, 0.5))
            s.proc.send_signal(signal.SIGKILL)
            th.join(30)
            s.kill()
            acked, sent = state["acked"], state["seq"]
            s = H.restart(s)
            st = s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
            S = st.stream_seq
            assert acked <= S <= sent, (acked, S, sent)
            want = {i: xb[i] for i in range(n)}
            for q in range(1, S + 1):
                ups, dels = writes[q]
                want.update(ups)
                for lab in dels:
                    want.pop(lab, None)
            got = s.stub.Read(sp.ShardReadRequest(labels=list(range(nextlab[0]))),
                              timeout=60).datapoints
            for g in got:
                assert g.found == (g.label in want), (rnd_i, g.label, S)
                if g.found:
                    assert np.array_equal(np.asarray(g.datapoint.feature_vector, "float32"),
                                          want[g.label]), (rnd_i, g.label)
            assert st.vectors_count == len(want), (st.vectors_count, len(want))
            model = want
            torn = "dropping the tail" in s.text()
            print("round %2d: acked %4d, sent %4d, applied %4d%s" % (
                rnd_i, acked, sent, S, " (torn tail cut)" if torn else ""))
            seq = S
            for q in [k for k in writes if k > S]:
                del writes[q]  # the writer makes a new seq S+1 (the old one never acked)
        assert len(model) == st.vectors_count
    finally:
        s.stop()
    print("ok")


if __name__ == "__main__":
    main()
