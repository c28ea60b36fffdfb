"""tessera-shard vs stock Faiss 1.7.3 (issue 4, point 1).

A faiss-trained IVFPQ template is shipped in Stage chunk 0; 20k vectors assigned to the
shard's lists (every other list, so slice.faiss is written "sprs") are staged in chunks,
prepared and committed. Then:
- the committed v000001/slice.faiss opens in stock Faiss and holds exactly the staged
  labels in the right lists;
- for 1000 queries, Faiss's search_preassigned with the same lists and coarse distances
  returns the labels the shard's Search returns: same labels in the same order for >= 99%
  of the queries, distances within 1e-4 relative;
- the same with an inner-product index, and with one dimension per sub-quantizer (the
  shard keeps centroid ranks in its scan blocks, the slice Faiss's codes); exact re-rank returns the true nearest among the
  candidates; Stats and Read report what was staged; a restart serves the same answers;
- a second version with another template, held beside the first: one Search call whose
  queries alternate the two versions answers each query as a call of its version alone.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

import faiss  # noqa: E402


def run(metric, m=8):
    sp, _, tp, _, _ = H.stubs()
    rng = np.random.default_rng(7)
    d, nlist, n, nq, k, nprobe = 32, 64, 20000, 1000, 10, 16
    # Clustered data so that lists are uneven and distances meaningful.
    centers = rng.normal(size=(50, d)).astype("float32") * 4
    xb = (centers[rng.integers(0, 50, n)] + rng.normal(size=(n, d))).astype("float32")
    xq = (centers[rng.integers(0, 50, nq)] + rng.normal(size=(nq, d))).astype("float32")
    ix, tmpl = H.template_bytes(xb[:10000], nlist, m, metric=metric)
    _, assign = ix.quantizer.search(xb, 1)
    assign = assign[:, 0]
    owned = [li for li in range(nlist) if li % 2 == 0]
    mine = np.nonzero(assign % 2 == 0)[0]
    labels = mine * 3 + 1000  # global labels are not row numbers
    ups = [sp.StagedUpsert(label=int(labels[j]), list=int(assign[i]),
                           datapoint=H.datapoint(tp, "id%d" % i, xb[i]))
           for j, i in enumerate(mine)]

    data = H.tmpdir()
    shard = H.Shard(data)
    try:
        pr = H.load(shard, 1, 0, ups, template=tmpl, chunk=3000, own=owned)
        assert pr.vectors_count == len(mine), pr
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.current_version == 1 and st.vectors_count == len(mine), st
        assert st.dimension == d and st.nlist == nlist and st.metric == metric, st
        assert sum(st.list_sizes) == len(mine) and all(li % 2 == 0 for li in st.lists)

        # The slice opens in stock Faiss with exactly our labels in our lists.
        path = os.path.join(data, "v000001", "slice.faiss")
        assert open(path, "rb").read()[:4] == b"IwPQ"
        fx = faiss.read_index(path)
        assert fx.ntotal == len(mine) and fx.nlist == nlist and fx.d == d
        invl = fx.invlists
        for li in range(nlist):
            sz = invl.list_size(li)
            ids = faiss.rev_swig_ptr(invl.get_ids(li), sz).copy() if sz else np.zeros(0)
            want = np.sort(labels[assign[mine] == li])
            assert np.array_equal(np.sort(ids), want), "list %d differs" % li

        # Coarse step as the coordinator does it; keep only this shard's lists.
        Dq, Iq = ix.quantizer.search(xq, nprobe)
        Iq = Iq.astype("int64")
        own_mask = (Iq % 2 == 0)
        Iq_own = np.where(own_mask, Iq, -1)
        fx.nprobe = nprobe
        FD = np.empty((nq, k), dtype="float32")
        FI = np.empty((nq, k), dtype="int64")
        fx.search_preassigned(nq, faiss.swig_ptr(xq), k, faiss.swig_ptr(Iq_own),
                              faiss.swig_ptr(np.ascontiguousarray(Dq)), faiss.swig_ptr(FD),
                              faiss.swig_ptr(FI), False)

        same = 0
        worst = 0.0
        for b in range(0, nq, 100):
            rq = sp.ShardSearchRequest()
            for qi in range(b, b + 100):
                q = rq.queries.add(version=1, k=k)
                q.vector.extend(xq[qi].tolist())
                for p in range(nprobe):
                    if own_mask[qi, p]:
                        q.lists.append(int(Iq[qi, p]))
                        q.coarse_distances.append(float(Dq[qi, p]))
            resp = shard.stub.Search(rq, timeout=30)
            assert len(resp.results) == 100
            for j, r in enumerate(resp.results):
                qi = b + j
                fl = [x for x in FI[qi] if x >= 0]
                if list(r.labels) == fl:
                    same += 1
                n_ = min(len(r.distances), len(fl))
                for a, bb in zip(r.distances[:n_], FD[qi][:n_]):
                    worst = max(worst, abs(a - bb) / max(abs(bb), 1e-6))
        print("%s: same labels+order %d/%d, worst relative distance diff %.2e"
              % (metric, same, nq, worst))
        assert same >= 0.99 * nq, same
        assert worst <= 1e-4, worst

        # Exact re-rank: with candidates = all of the probed lists, the answer is the
        # exact top-k of the probed vectors.
        qi = 3
        q = sp.ShardQuery(version=1, k=k, candidates=10000)
        q.vector.extend(xq[qi].tolist())
        probed = [int(x) for x, o in zip(Iq[qi], own_mask[qi]) if o]
        q.lists.extend(probed)
        q.coarse_distances.extend([float(x) for x, o in zip(Dq[qi], own_mask[qi]) if o])
        r = shard.stub.Search(sp.ShardSearchRequest(queries=[q]), timeout=10).results[0]
        sel = mine[np.isin(assign[mine], probed)]
        if metric == "L2":
            ex = ((xb[sel] - xq[qi]) ** 2).sum(1)
            order = np.argsort(ex, kind="stable")[:k]
        else:
            ex = xb[sel] @ xq[qi]
            order = np.argsort(-ex, kind="stable")[:k]
        want = [int(sel[o] * 3 + 1000) for o in order]
        assert list(r.labels) == want, (list(r.labels), want)
        assert np.allclose(r.distances, ex[order], rtol=1e-4), (list(r.distances), ex[order])

        # Read returns the stored datapoint.
        rr = shard.stub.Read(sp.ShardReadRequest(labels=[int(labels[0]), 5]), timeout=10)
        assert rr.datapoints[0].found and rr.datapoints[0].datapoint.datapoint_id == "id%d" % mine[0]
        assert np.allclose(rr.datapoints[0].datapoint.feature_vector, xb[mine[0]])
        assert not rr.datapoints[1].found

        first = shard.stub.Search(rq, timeout=30)
        shard.stop()
        # Restart: the committed version is loaded from disk and answers the same.
        shard = H.Shard(data)
        again = shard.stub.Search(rq, timeout=30)
        assert [list(r.labels) for r in again.results] == [list(r.labels) for r in first.results]

        # Version 2, a complete overwrite with another template (half the sub-quantizers),
        # served while version 1 is still held: one Search call whose queries alternate
        # the two versions answers each as a call of that version alone (the call keeps
        # one scanner and makes it again when a query's index differs).
        ix2, tmpl2 = H.template_bytes(xb[:10000], nlist, m // 2, metric=metric)
        H.load(shard, 2, 0, ups, template=tmpl2, chunk=3000, own=owned)
        alone = {}
        for ver in (1, 2):
            rv = sp.ShardSearchRequest()
            for q in rq.queries[:40]:
                rv.queries.add().CopyFrom(q)
                rv.queries[-1].version = ver
            alone[ver] = [(list(r.labels), list(r.distances))
                          for r in shard.stub.Search(rv, timeout=30).results]
        mixed = sp.ShardSearchRequest()
        for i in range(40):
            for ver in (1, 2):
                mixed.queries.add().CopyFrom(rq.queries[i])
                mixed.queries[-1].version = ver
        got = [(list(r.labels), list(r.distances))
               for r in shard.stub.Search(mixed, timeout=30).results]
        assert alone[1] != alone[2], "the two templates answer alike: the check is void"
        for i in range(40):
            assert got[2 * i] == alone[1][i] and got[2 * i + 1] == alone[2][i], i
    finally:
        shard.stop()


def main():
    run("L2")
    run("IP")
    # One dimension per sub-quantizer: the shard's scan blocks hold centroid ranks (the
    # nibble stage); the slice must still hold Faiss's codes and Faiss must agree.
    run("L2", m=32)
    print("ok")


if __name__ == "__main__":
    main()
