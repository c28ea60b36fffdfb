"""Filters, numeric restricts, crowding, sparse and hybrid RRF through the coordinator vs
an independent numpy computation (issue 5, "what must be true" 2), plus
ReadIndexDatapoints and return_full_datapoint.

Exact setup: 800 datapoints, d 16, nlist 8 with nprobe = nlist
(fraction_leaf_nodes_to_search_override 1.0) and approximate_neighbor_count 800 (every
candidate re-ranked with the stored vectors), so the dense answer is the exact one. The
index is trained by the coordinator from the first batch. Run for SQUARED_L2 and COSINE.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

N, D, K = 800, 16, 10
RRF_DEPTH = 100  # the coordinator's default rrf_depth
COLORS = ["red", "blue", "green", "orange"]


def tok_match(q, dp):
    """SPEC §3 token restricts. q, dp: {ns: (allow set, deny set)}."""
    for ns, (qa, qd) in q.items():
        da, dd = dp.get(ns, (set(), set()))
        if qd & da:
            return False
        if qa:
            if not (qa & da):
                return False
            if qa & dd:
                return False
    return True


OPS = {1: lambda a, b: a < b, 2: lambda a, b: a <= b, 3: lambda a, b: a == b,
       4: lambda a, b: a >= b, 5: lambda a, b: a > b, 6: lambda a, b: a != b}


def num_match(qs, dp):
    for ns, kind, val, op in qs:
        if ns not in dp:
            return False
        if not OPS[op](dp[ns], val):
            return False
    return True


def run(distance):
    tp = ch.stubs()[0]
    rng = np.random.default_rng(11)
    x = rng.normal(size=(N, D)).astype("float32")
    recs, toks, nums, tags, sparse = [], [], [], [], []
    for i in range(N):
        allow = sorted(set(rng.choice(COLORS, rng.integers(0, 3), replace=False)))
        deny = ["blue"] if rng.random() < 0.1 else []
        toks.append({"color": (set(allow), set(deny))})
        price = int(rng.integers(0, 100))
        nums.append({"price": price})
        tag = "s%d" % (i % 5)
        tags.append(tag)
        sp = None
        if i % 2 == 0:
            dims = sorted(rng.choice(60, rng.integers(2, 6), replace=False).tolist())
            vals = rng.random(len(dims)).astype("float32").tolist()
            sp = (dims, vals)
        sparse.append(sp)
        recs.append(ch.dp_json("p%04d" % i, x[i], sparse=sp, restricts=[("color", allow, deny)],
                               numeric=[("price", "int", price)], tag=tag))
    root = sh.tmpdir("tsr-coord-filt-")
    batch = ch.write_batch(os.path.join(root, "b"), recs, per_file=300)
    cl = ch.Cluster(4, D, {"nlist": 8, "pq_m": 4, "nprobe": 2, "distance": distance})
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        xs = x.copy()
        if distance == "COSINE":
            xs /= np.linalg.norm(xs, axis=1, keepdims=True)
        xq = rng.normal(size=(40, D)).astype("float32")
        queries = []
        for j in range(40):
            qr = {}
            rs = []
            if j % 4 != 0:
                a = [COLORS[j % 4], COLORS[(j + 1) % 4]] if j % 3 else [COLORS[j % 4]]
                d = ["blue"] if j % 5 == 0 else []
                rs.append(("color", a, d))
                qr["color"] = (set(a), set(d))
            ns = []
            if j % 2 == 0:
                ns.append(("price", "int", 30 + j, 4 if j % 4 else 1))
            if j % 7 == 0:
                ns.append(("price", "double", 80.5, 2))
            sq = None
            if j % 3 != 2:
                dims = sorted(rng.choice(60, 4, replace=False).tolist())
                sq = (dims, rng.random(4).astype("float32").tolist())
            queries.append((xq[j], rs, qr, ns, sq))
        # reference
        def passing(qr, ns):
            return [i for i in range(N) if tok_match(qr, toks[i]) and num_match(ns, nums[i])]

        def dense_ref(qv, ok, crowd=0, depth=K):
            q = qv / np.linalg.norm(qv) if distance == "COSINE" else qv
            if distance == "SQUARED_L2":
                dist = ((xs[ok] - q) ** 2).sum(1)
                order = sorted(range(len(ok)), key=lambda t: (dist[t], ok[t]))
            else:
                dist = xs[ok] @ q
                order = sorted(range(len(ok)), key=lambda t: (-dist[t], ok[t]))
            return greedy([(ok[t], float(dist[t])) for t in order], crowd, depth)

        def sparse_ref(sq, ok, crowd=0, depth=K):
            qd = dict(zip(sq[0], sq[1]))
            out = []
            for i in ok:
                if sparse[i] is None:
                    continue
                shared = [v * qd[dd] for dd, v in zip(*sparse[i]) if dd in qd]
                if shared:
                    out.append((i, float(np.float32(sum(shared)))))
            out.sort(key=lambda t: (-t[1], t[0]))
            return greedy(out, crowd, depth)

        def greedy(cands, crowd, depth=K):
            if not crowd:
                return cands[:depth]
            cnt, out = {}, []
            for lab, dv in cands:
                if cnt.get(tags[lab], 0) >= crowd:
                    continue
                cnt[tags[lab]] = cnt.get(tags[lab], 0) + 1
                out.append((lab, dv))
                if len(out) == K:
                    break
            return out

        def ranks(lst):
            # competition ranking: equal values share the rank of the first of them
            out, prev = {}, None
            for i, (lab, v) in enumerate(lst):
                if i == 0 or v != prev:
                    r = i + 1
                out[lab] = r
                prev = v
            return out

        def rrf(dl, sl, alpha):
            # docs/query-semantics.md: lists of depth max(K, rrf_depth = 100), uncrowded;
            # ties by score, then dense rank (absent last), then label
            rd, rs = ranks(dl), ranks(sl)
            sc = {}
            for lab, r in rd.items():
                sc[lab] = sc.get(lab, 0.0) + alpha / (60.0 + r)
            for lab, r in rs.items():
                sc[lab] = sc.get(lab, 0.0) + (1 - alpha) / (60.0 + r)
            keep = [lab for lab in sc if (alpha > 0 and lab in rd) or (alpha < 1 and lab in rs)]
            return sorted(keep, key=lambda lab: (-sc[lab], rd.get(lab, 1 << 30), lab))[:K]

        checked = {"dense": 0, "crowd": 0, "sparse": 0, "rrf": 0, "rrf0": 0}
        for j, (qv, rs, qr, ns, sq) in enumerate(queries):
            ok = passing(qr, ns)
            nq = [(a, b, c, d) for a, b, c, d in ns]
            mk = lambda **kw: ch.query(tp, restricts=rs, numeric=nq, fraction=1.0, cand=N, **kw)
            qs = [mk(vec=qv), mk(vec=qv, crowding=2)]
            if sq:
                qs += [mk(sparse=sq), mk(vec=qv, sparse=sq, alpha=0.5),
                       mk(vec=qv, sparse=sq, alpha=0.0)]
            resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=qs), timeout=30)
            nn = resp.nearest_neighbors
            lab = lambda n: int(n.datapoint.datapoint_id[1:])
            ref = dense_ref(qv, ok)
            got = [(lab(n), n.distance) for n in nn[0].neighbors]
            assert [g[0] for g in got] == [r[0] for r in ref], (j, got, ref)
            assert np.allclose([g[1] for g in got], [r[1] for r in ref], rtol=1e-4, atol=1e-4)
            assert not any(n.sparse_only for n in nn[0].neighbors), (j,)
            checked["dense"] += 1
            refc = dense_ref(qv, ok, 2)
            assert [lab(n) for n in nn[1].neighbors] == [r[0] for r in refc], (j,)
            checked["crowd"] += 1
            if sq:
                refs = sparse_ref(sq, ok)
                gots = [(lab(n), n.sparse_distance) for n in nn[2].neighbors]
                assert [g[0] for g in gots] == [r[0] for r in refs], (j, gots, refs)
                assert np.allclose([g[1] for g in gots], [r[1] for r in refs], rtol=1e-5)
                checked["sparse"] += 1
                deep, deeps = dense_ref(qv, ok, 0, RRF_DEPTH), sparse_ref(sq, ok, 0, RRF_DEPTH)
                r5 = rrf(deep, deeps, 0.5)
                assert [lab(n) for n in nn[3].neighbors] == r5, (j, [lab(n) for n in nn[3].neighbors], r5)
                dmap, smap = dict(deep), dict(deeps)
                for n in nn[3].neighbors:
                    if lab(n) in smap:
                        assert abs(n.sparse_distance - smap[lab(n)]) < 1e-4
                    if lab(n) in dmap:
                        assert abs(n.distance - dmap[lab(n)]) < 1e-3 * max(1, abs(dmap[lab(n)]))
                    # found only by the sparse search: said so (the CLI prints `distance -`)
                    assert n.sparse_only == (lab(n) not in dmap), (j, lab(n), n)
                checked["rrf"] += 1
                r0 = rrf(deep, deeps, 0.0)
                assert [lab(n) for n in nn[4].neighbors] == r0 == [r[0] for r in refs], (j,)
                checked["rrf0"] += 1
        print(distance, "checked", checked)

        # ReadIndexDatapoints and return_full_datapoint
        rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(
            ids=["p0002", "nope", "p0007"]), timeout=10)
        assert [d.datapoint_id for d in rd.datapoints] == ["p0002", "p0007"], rd
        d2 = rd.datapoints[0]
        assert np.allclose(list(d2.feature_vector), xs[2], atol=1e-6)
        assert d2.crowding_tag.crowding_attribute == tags[2]
        assert list(d2.sparse_embedding.dimensions) == sparse[2][0]
        assert d2.numeric_restricts[0].value_int == nums[2]["price"]
        resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, vec=x[5], fraction=1.0, cand=N, k=3)],
            return_full_datapoint=True), timeout=10)
        top = resp.nearest_neighbors[0].neighbors[0].datapoint
        assert top.datapoint_id == "p0005" and len(top.feature_vector) == D, top
        assert top.restricts[0].namespace == "color"
    finally:
        cl.stop()


def main():
    run("SQUARED_L2")
    run("COSINE")
    print("test_coord_filters: OK")


if __name__ == "__main__":
    main()
