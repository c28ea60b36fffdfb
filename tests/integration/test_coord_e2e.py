"""Coordinator + 4 shards vs one-process search (issue 5, "what must be true" 1).

A Faiss IndexIVFPQ (nlist 64, m 8) trained here is the coordinator's --template; 20000
vectors are upserted through UpdateIndex; then 1000 queries through FindNeighbors
(nprobe 8, k 10) must give the same top-10 as stock Faiss searching the same vectors in
one index (ids "v%06d" sort like their numbers, so the coordinator's labels equal Faiss's
sequential ids), and with crowding (per_crowding 2 over 7 tags) exactly the greedy pass
over Faiss's candidate order. Stats: vectors per shard add up, plan balance, shards
touched per query. The four shards' slice.faiss files merged with stock Faiss's
merge_from give the reference's answers (the offline backup docs/operations.md describes).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402


def main():
    import faiss
    faiss.omp_set_num_threads(1)
    tp = ch.stubs()[0]
    rng = np.random.default_rng(5)
    N, D, NQ, K = 20000, 32, 1000, 10
    centers = rng.normal(size=(40, D)).astype("float32") * 3
    x = (centers[rng.integers(0, 40, N)] + rng.normal(size=(N, D))).astype("float32")
    xq = (centers[rng.integers(0, 40, NQ)] + rng.normal(size=(NQ, D))).astype("float32")
    ix, tbytes = sh.template_bytes(x[:10000], 64, 8)
    root = sh.tmpdir("tsr-coord-e2e-")
    tpath = os.path.join(root, "template.faiss")
    with open(tpath, "wb") as f:
        f.write(tbytes)
    tags = ["t%d" % (i % 7) for i in range(N)]
    recs = [ch.dp_json("v%06d" % i, x[i], tag=tags[i]) for i in range(N)]
    batch = ch.write_batch(os.path.join(root, "batch1"), recs, per_file=5000)

    cl = ch.Cluster(4, D, {"nprobe": 8}, template=tpath)
    try:
        t0 = time.time()
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        assert op.version == 1 and op.report.valid_records == N, op
        print("update of %d vectors: %.2fs" % (N, time.time() - t0))
        st = cl.stats()
        assert st.vectors_count == N and st.version == 1 and st.shards_count == 4, st
        assert sum(s.vectors_count for s in st.shards) == N, st
        assert all(s.available and s.version == 1 for s in st.shards), st
        # the shards' memory passed through: the raw vectors are mapped from vectors.f32
        assert all(s.anonymous_bytes > s.vectors_count * 16 and
                   s.mapped_bytes == s.vectors_count * D * 4 for s in st.shards), st
        print("per shard:", [s.vectors_count for s in st.shards], "imbalance %.3f" %
              st.plan_imbalance)

        # reference: one faiss index with every vector, ids 0..N-1
        ix.add(x)
        ix.nprobe = 8
        Dr, Ir = ix.search(xq, K)
        t0 = time.time()
        got = []
        for b in range(0, NQ, 250):
            # cand=0: PQ distances, as Faiss's IndexIVFPQ reports them (the coordinator
            # re-ranks exactly by default, approximate_neighbor_count)
            rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xq[i], K, cand=0, qid="q%d" % i)
                                                  for i in range(b, b + 250)])
            resp = cl.stub.FindNeighbors(rq, timeout=60)
            assert resp.version == 1
            assert len(resp.nearest_neighbors) == 250
            for i, nn in enumerate(resp.nearest_neighbors):
                assert nn.id == "q%d" % (b + i)
                got.append([(int(n.datapoint.datapoint_id[1:]), n.distance) for n in nn.neighbors])
        dt = time.time() - t0
        same = 0
        worst = 0.0
        for i in range(NQ):
            ids = [g[0] for g in got[i]]
            if ids == list(Ir[i]):
                same += 1
            else:
                # only a near-tie may reorder: the distances must agree anyway
                dd = np.array([g[1] for g in got[i]])
                rel = np.max(np.abs(dd - Dr[i]) / np.maximum(1e-6, np.abs(Dr[i])))
                worst = max(worst, rel)
            dd = np.array([g[1] for g in got[i]])
            assert np.allclose(dd, Dr[i], rtol=1e-4, atol=1e-4), (i, dd, Dr[i])
        print("top-10 identical for %d/%d queries (others differ only by near ties, worst "
              "relative distance difference %.2g); %.0f queries/s" % (same, NQ, worst, NQ / dt))
        assert same >= NQ - 3, same

        # crowding: greedy over Faiss's candidate order
        Dc, Ic = ix.search(xq[:200], 500)
        # cand=0: the greedy pass over Faiss's PQ order (no exact re-rank)
        rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xq[i], K, crowding=2, cand=0)
                                              for i in range(200)])
        resp = cl.stub.FindNeighbors(rq, timeout=60)
        csame = 0
        for i, nn in enumerate(resp.nearest_neighbors):
            cnt = {}
            ref = []
            for lab in Ic[i]:
                if lab < 0:
                    break
                t = tags[lab]
                if cnt.get(t, 0) >= 2:
                    continue
                cnt[t] = cnt.get(t, 0) + 1
                ref.append(int(lab))
                if len(ref) == K:
                    break
            ids = [int(n.datapoint.datapoint_id[1:]) for n in nn.neighbors]
            tg = [n.datapoint.crowding_tag.crowding_attribute for n in nn.neighbors]
            assert all(tg.count(t) <= 2 for t in tg), tg
            assert tg == [tags[j] for j in ids]
            csame += ids == ref
        print("crowded top-10 identical to the greedy single-node answer: %d/200" % csame)
        assert csame >= 199, csame
        st = cl.stats()
        print("queries served %d, mean shards touched per query %.2f (of 4, nprobe 8)" %
              (st.queries_served, st.mean_shards_touched))
        assert 1.0 <= st.mean_shards_touched <= 4.0

        # docs/operations.md "Backups": every shard's slice is a stock Faiss file, and
        # merge_from of the four gives one index of the whole cluster = the reference
        merged = None
        for s in cl.shards:
            part = faiss.read_index(os.path.join(s.data, "v000001", "slice.faiss"))
            if merged is None:
                merged = part
            else:
                merged.merge_from(part, 0)
        assert merged.ntotal == N, merged.ntotal
        merged.nprobe = 8
        Dm, Im = merged.search(xq, K)
        msame = int(sum((Im[i] == Ir[i]).all() for i in range(NQ)))
        assert msame >= NQ - 3 and np.allclose(Dm, Dr, rtol=1e-4, atol=1e-4), msame
        print("the 4 slices merged with faiss merge_from: %d vectors, top-10 as the reference "
              "for %d/%d queries" % (merged.ntotal, msame, NQ))
    finally:
        cl.stop()
    print("test_coord_e2e: OK")


if __name__ == "__main__":
    main()
