"""Vertex AI MatchService wire compatibility (issue 6, "what must be true" 1, 2, 4).

A python grpcio client built from the test's own hand-written copy of Vertex's
match_service.proto (tests/integration/vertex_client_proto/, not the server's proto/ file)
talks to a real 4-shard cluster (tessera-shard x4 + tessera-coordinator started with
--deployed-index-id) and must get from Match, BatchMatch and BatchGetEmbeddings exactly
what tessera.v1 FindNeighbors / ReadIndexDatapoints answer for the same queries:
restricts, numeric restricts, crowding, nprobe knobs, approx_num_neighbors,
embedding_id, embedding_enabled, sparse-only and hybrid RRF. Also checks the documented
crowding_attribute mapping, per-index statuses in BatchMatch, deployed_index_id, bad
requests (INVALID_ARGUMENT / NOT_FOUND naming the field), the health service name, and
that a neighbor list obeys its filters (so a mapping that dropped a filter on both paths
would still fail).
"""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import vertex_harness as vh  # noqa: E402

IDX = "tessera-idx"
K = 10


def tok_match(q, dp):
    for ns, (qa, qd) in q.items():
        da, dd = dp
        if qd & da:
            return False
        if qa and (not (qa & da) or (qa & dd)):
            return False
    return True


OPS = {1: lambda a, b: a < b, 2: lambda a, b: a <= b, 3: lambda a, b: a == b,
       4: lambda a, b: a >= b, 5: lambda a, b: a > b, 6: lambda a, b: a != b}


def expect_error(fn, code, *needles):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details(), code)
        for s in needles:
            assert s in e.details(), (s, e.details())
        return e.details()
    raise AssertionError("expected %s %s" % (code, needles))


def run(bin_dir, distance="SQUARED_L2", nq=24):
    tp = ch.stubs()[0]
    mp, mpg = vh.vstubs()
    D = vh.dataset()
    root = sh.tmpdir("tsr-vertex-")
    batch = ch.write_batch(os.path.join(root, "b"), D.recs, per_file=300)
    orig = ch.Proc
    ch.Proc = lambda argv, env=None, as_built=False: orig(argv + ["--deployed-index-id", IDX],
                                                         env, as_built)
    try:
        cl = ch.Cluster(4, D.d, {"nlist": 8, "pq_m": 4, "nprobe": 2, "distance": distance},
                        bin_dir=bin_dir)
    finally:
        ch.Proc = orig
    try:
        op = cl.update(batch)
        assert op.state == tp.Operation.SUCCEEDED, op
        vs = mpg.MatchServiceStub(cl.channel)
        rng = np.random.default_rng(21)

        def mreq(vec=None, k=K, restricts=(), numeric=(), crowd=0, approx=0, frac=0.0,
                 pct=0, sparse=None, alpha=None, eid="", emb=False, idx=IDX):
            m = mp.MatchRequest(deployed_index_id=idx, num_neighbors=k,
                                per_crowding_attribute_num_neighbors=crowd,
                                approx_num_neighbors=approx,
                                fraction_leaf_nodes_to_search_override=frac,
                                leaf_nodes_to_search_percent_override=pct,
                                embedding_id=eid, embedding_enabled=emb)
            if vec is not None:
                m.float_val.extend([float(v) for v in vec])
            for ns, a, dn in restricts:
                m.restricts.add(name=ns, allow_tokens=a, deny_tokens=dn)
            for ns, kind, val, opv in numeric:
                n = m.numeric_restricts.add(name=ns, op=opv)
                setattr(n, "value_" + kind, val)
            if sparse is not None:
                m.sparse_embedding.dimension.extend(sparse[0])
                m.sparse_embedding.float_val.extend(sparse[1])
            if alpha is not None:
                m.rrf.alpha = alpha
            return m

        def fn(vec=None, k=K, restricts=(), numeric=(), crowd=0, approx=None, frac=0.0,
               sparse=None, alpha=None, full=False):
            q = ch.query(tp, vec=vec, k=k, sparse=sparse, crowding=crowd, cand=approx,
                         fraction=frac, restricts=list(restricts),
                         numeric=list(numeric), alpha=alpha)
            return cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[q], return_full_datapoint=full), timeout=30).nearest_neighbors[0]

        def same(mr, nn, what):
            got = [(n.id, n.distance, n.sparse_distance) for n in mr.neighbor]
            ref = [(n.datapoint.datapoint_id, n.distance, n.sparse_distance)
                   for n in nn.neighbors]
            assert got == ref, (what, got, ref)
            for n in mr.neighbor:
                assert n.crowding_attribute == vh.crowding_attribute(D.tags[n.id]), \
                    (what, n.id, D.tags[n.id], n.crowding_attribute)
            counts["nonempty"] += bool(got)

        counts = {"match": 0, "filtered": 0, "crowd": 0, "knobs": 0, "sparse": 0, "rrf": 0,
                  "nonempty": 0}
        batch_items, batch_refs = [], []
        for j in range(nq):
            qv = rng.normal(size=D.d).astype("float32")
            rs, qr = [], {}
            if j % 3:
                a = [vh.COLORS[j % 4], vh.COLORS[(j + 1) % 4]] if j % 2 else [vh.COLORS[j % 4]]
                dn = ["blue"] if j % 5 == 0 else []
                rs.append(("color", a, dn))
                qr["color"] = (set(a), set(dn))
            ns = []
            if j % 2 == 0:
                ns.append(("price", "int", 20 + j, (j % 6) + 1))
            if j % 4 == 1:
                ns.append(("w", "double", 9.5, 2))
            kw = dict(restricts=rs, numeric=ns)
            # dense, exact knobs
            mr = vs.Match(mreq(qv, frac=1.0, approx=D.n, **kw), timeout=30)
            nn = fn(qv, frac=1.0, approx=D.n, **kw)
            same(mr, nn, ("dense", j))
            counts["match"] += 1
            batch_items.append(mreq(qv, frac=1.0, approx=D.n, **kw))
            batch_refs.append(nn)
            for n in mr.neighbor:  # the filters really apply
                assert tok_match(qr, D.toks[n.id]), (j, n.id)
                for nsn, kind, val, opv in ns:
                    v = D.price[n.id] if nsn == "price" else D.price[n.id] / 7.0
                    assert OPS[opv](v, val), (j, n.id, nsn, v, opv, val)
            counts["filtered"] += bool(rs or ns)
            # crowding
            mr = vs.Match(mreq(qv, crowd=2, frac=1.0, approx=D.n, **kw), timeout=30)
            same(mr, fn(qv, crowd=2, frac=1.0, approx=D.n, **kw), ("crowd", j))
            per = {}
            for n in mr.neighbor:
                if D.tags[n.id]:
                    per[n.crowding_attribute] = per.get(n.crowding_attribute, 0) + 1
            assert max(per.values() or [0]) <= 2, per
            counts["crowd"] += 1
            # the default nprobe (no override) and the deprecated percent field
            same(vs.Match(mreq(qv, **kw), timeout=30), fn(qv, **kw), ("default", j))
            same(vs.Match(mreq(qv, pct=50, **kw), timeout=30), fn(qv, frac=0.5, **kw),
                 ("pct", j))
            same(vs.Match(mreq(qv, pct=10, frac=0.75, approx=40, **kw), timeout=30),
                 fn(qv, frac=0.75, approx=40, **kw), ("frac wins", j))
            counts["knobs"] += 3
            # sparse-only and hybrid
            if j % 3 != 2:
                dims = sorted(rng.choice(60, 4, replace=False).tolist())
                sq = (dims, rng.random(4).astype("float32").tolist())
                mr = vs.Match(mreq(sparse=sq, **kw), timeout=30)
                same(mr, fn(sparse=sq, **kw), ("sparse", j))
                assert all(n.distance == 0 and n.sparse_distance > 0 for n in mr.neighbor)
                counts["sparse"] += 1
                for al in (0.5, 0.0, 1.0):
                    mr = vs.Match(mreq(qv, sparse=sq, alpha=al, frac=1.0, approx=D.n, **kw),
                                  timeout=30)
                    same(mr, fn(qv, sparse=sq, alpha=al, frac=1.0, approx=D.n, **kw),
                         ("rrf", al, j))
                    counts["rrf"] += 1
        print(distance, "Match == FindNeighbors:", counts)
        if distance != "SQUARED_L2":
            # the distance is FindNeighbors' (dot product, larger is nearer), also for a
            # query by embedding_id (the stored, for COSINE normalized, vector)
            for i in (5, 123):
                mr = vs.Match(mreq(eid="p%04d" % i, frac=1.0, approx=D.n), timeout=30)
                same(mr, fn(D.x[i], frac=1.0, approx=D.n), ("embedding_id", distance, i))
                ds = [n.distance for n in mr.neighbor]
                assert ds == sorted(ds, reverse=True) and len(ds) == K, ds
                xs = D.x / np.linalg.norm(D.x, axis=1, keepdims=True) \
                    if distance == "COSINE" else D.x
                ref = xs @ xs[i]
                top = np.argsort(-ref, kind="stable")[:K]
                assert [n.id for n in mr.neighbor] == ["p%04d" % t for t in top], distance
                assert np.allclose(ds, ref[top], rtol=1e-4, atol=1e-4)
            return
        assert counts["nonempty"] > 0.8 * (counts["match"] + counts["crowd"] + counts["knobs"] +
                                           counts["sparse"] + counts["rrf"]), counts

        # the crowding_attribute mapping covers numeric, non-canonical and hashed tags
        seen = {}
        for t in vh.TAGS:
            seen[t] = vh.crowding_attribute(t)
        assert seen["42"] == 42 and seen["-7"] == -7 and seen["0"] == 0
        assert seen["9223372036854775807"] == 2 ** 63 - 1
        assert seen["-9223372036854775808"] == -2 ** 63
        for t in ("007", "s1", "9223372036854775808", "-0", "+5", "ünï"):
            assert 0 <= seen[t] < 2 ** 63 and seen[t] not in (0, 7, 5), (t, seen[t])
        ids = ["p%04d" % i for i in range(len(vh.TAGS) * 2)]
        ge = vs.BatchGetEmbeddings(mp.BatchGetEmbeddingsRequest(deployed_index_id=IDX, id=ids),
                                   timeout=30)
        got_tags = {e.id: e.crowding_attribute for e in ge.embeddings}
        for i in ids:
            assert got_tags[i] == vh.crowding_attribute(D.tags[i]), (i, D.tags[i], got_tags[i])
        print("crowding_attribute mapping:", {t: seen[t] for t in vh.TAGS[:6]})

        # BatchGetEmbeddings == ReadIndexDatapoints, unknown ids omitted, order kept
        ids = ["p0007", "nope", "p0002", "q003", "p0007"]
        ge = vs.BatchGetEmbeddings(mp.BatchGetEmbeddingsRequest(deployed_index_id=IDX, id=ids),
                                   timeout=30)
        rd = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=30)
        assert [e.id for e in ge.embeddings] == [d.datapoint_id for d in rd.datapoints] == \
            ["p0007", "p0002", "q003", "p0007"], ge
        for e, d in zip(ge.embeddings, rd.datapoints):
            assert list(e.float_val) == list(d.feature_vector)
            assert list(e.sparse_embedding.dimension) == list(d.sparse_embedding.dimensions)
            assert list(e.sparse_embedding.float_val) == list(d.sparse_embedding.values)
            assert [(r.name, list(r.allow_tokens), list(r.deny_tokens)) for r in e.restricts] == \
                [(r.namespace, list(r.allow_list), list(r.deny_list)) for r in d.restricts]
            got_num = sorted((n.name, n.WhichOneof("Value"), getattr(n, n.WhichOneof("Value")))
                             for n in e.numeric_restricts)
            ref_num = sorted((n.namespace, n.WhichOneof("Value"), getattr(n, n.WhichOneof("Value")))
                             for n in d.numeric_restricts)
            assert got_num == ref_num and len(got_num) == 2, (got_num, ref_num)
        assert np.allclose(list(ge.embeddings[1].float_val), D.x[2])
        assert len(ge.embeddings[2].float_val) == 0 and ge.embeddings[2].sparse_embedding.dimension
        print("BatchGetEmbeddings == ReadIndexDatapoints for", ids)

        # embedding_id: query by the stored vector; float_val wins when both are set
        for i in (5, 123, 640):
            mr = vs.Match(mreq(eid="p%04d" % i, frac=1.0, approx=D.n), timeout=30)
            same(mr, fn(D.x[i], frac=1.0, approx=D.n), ("embedding_id", i))
            assert mr.neighbor[0].id == "p%04d" % i and mr.neighbor[0].distance < 1e-4
        qv = rng.normal(size=D.d).astype("float32")
        same(vs.Match(mreq(qv, eid="p0005"), timeout=30), fn(qv), "float_val wins")
        mr = vs.Match(mreq(eid="p0009", restricts=[("color", ["red"], [])], crowd=1), timeout=30)
        same(mr, fn(D.x[9], restricts=[("color", ["red"], [])], crowd=1), "embedding_id+filters")
        expect_error(lambda: vs.Match(mreq(eid="no-such-id"), timeout=30),
                     grpc.StatusCode.NOT_FOUND, "embedding_id", "no-such-id")
        expect_error(lambda: vs.Match(mreq(eid="q002"), timeout=30),
                     grpc.StatusCode.INVALID_ARGUMENT, "q002", "no dense embedding")
        print("embedding_id ok")

        # embedding_enabled: the neighbors' stored embeddings, in neighbor order
        qv = rng.normal(size=D.d).astype("float32")
        mr = vs.Match(mreq(qv, emb=True, restricts=[("color", ["green"], [])]), timeout=30)
        nn = fn(qv, restricts=[("color", ["green"], [])], full=True)
        same(mr, nn, "embedding_enabled")
        assert [e.id for e in mr.embeddings] == [n.id for n in mr.neighbor]
        for e, n in zip(mr.embeddings, nn.neighbors):
            i = int(e.id[1:])
            assert np.allclose(list(e.float_val), D.x[i]) and \
                list(e.float_val) == list(n.datapoint.feature_vector)
            assert e.crowding_attribute == mr.neighbor[[m.id for m in mr.neighbor].index(e.id)].crowding_attribute
            assert "green" in [t for r in e.restricts for t in r.allow_tokens]
            assert {x.name for x in e.numeric_restricts} == {"price", "w"}
        assert len(vs.Match(mreq(qv), timeout=30).embeddings) == 0
        print("embedding_enabled ok:", len(mr.embeddings), "embeddings")

        # BatchMatch: per index, in order, each with a status; a failing index does not
        # fail the others
        bad = mreq(np.zeros(3, "float32"))
        breq = mp.BatchMatchRequest(requests=[
            mp.BatchMatchRequest.BatchMatchRequestPerIndex(
                deployed_index_id=IDX, requests=batch_items[:10], low_level_batch_size=4),
            mp.BatchMatchRequest.BatchMatchRequestPerIndex(
                deployed_index_id="someone-else", requests=batch_items[:2]),
            mp.BatchMatchRequest.BatchMatchRequestPerIndex(
                deployed_index_id=IDX, requests=[batch_items[0], bad]),
            mp.BatchMatchRequest.BatchMatchRequestPerIndex(
                deployed_index_id=IDX, requests=[mreq(eid="gone-id")]),
            mp.BatchMatchRequest.BatchMatchRequestPerIndex(
                deployed_index_id=IDX, requests=batch_items[10:]),
        ])
        br = vs.BatchMatch(breq, timeout=60)
        assert [r.deployed_index_id for r in br.responses] == \
            [IDX, "someone-else", IDX, IDX, IDX], br.responses
        codes = [r.status.code for r in br.responses]
        assert codes == [0, grpc.StatusCode.NOT_FOUND.value[0],
                         grpc.StatusCode.INVALID_ARGUMENT.value[0],
                         grpc.StatusCode.NOT_FOUND.value[0], 0], codes
        assert "someone-else" in br.responses[1].status.message
        assert "requests[2].requests[1]" in br.responses[2].status.message and \
            "float_val has 3 values" in br.responses[2].status.message, br.responses[2].status
        assert "gone-id" in br.responses[3].status.message
        assert [len(r.responses) for r in br.responses] == [10, 0, 0, 0, len(batch_items) - 10]
        for r, nn in zip(list(br.responses[0].responses) + list(br.responses[4].responses),
                         batch_refs):
            same(r, nn, "batch")
        assert len(vs.BatchMatch(mp.BatchMatchRequest(), timeout=30).responses) == 0
        expect_error(lambda: vs.BatchMatch(mp.BatchMatchRequest(requests=[
            mp.BatchMatchRequest.BatchMatchRequestPerIndex()] * 1001), timeout=30),
            grpc.StatusCode.INVALID_ARGUMENT, "1001 indexes", "at most 1000")
        print("BatchMatch ok: statuses", codes)

        # deployed_index_id: the configured one or empty; anything else NOT_FOUND
        qv = rng.normal(size=D.d).astype("float32")
        same(vs.Match(mreq(qv, idx=""), timeout=30), fn(qv), "empty deployed_index_id")
        expect_error(lambda: vs.Match(mreq(qv, idx="other"), timeout=30),
                     grpc.StatusCode.NOT_FOUND, "deployed_index_id", "other", IDX)
        expect_error(lambda: vs.BatchGetEmbeddings(mp.BatchGetEmbeddingsRequest(
            deployed_index_id="other", id=["p0001"]), timeout=30),
            grpc.StatusCode.NOT_FOUND, "other")

        # bad requests name the field
        IA = grpc.StatusCode.INVALID_ARGUMENT
        cases = [
            (mreq(np.zeros(3, "float32")), "float_val has 3 values"),
            (mreq(), "float_val, embedding_id and sparse_embedding are all empty"),
            (mreq(qv, k=-1), "num_neighbors = -1"),
            (mreq(qv, k=100000), "num_neighbors = 100000"),
            (mreq(qv, crowd=-2), "per_crowding_attribute_num_neighbors"),
            (mreq(qv, approx=-1), "approx_num_neighbors"),
            (mreq(qv, frac=1.5), "fraction_leaf_nodes_to_search_override"),
            (mreq(qv, pct=150), "leaf_nodes_to_search_percent_override"),
            (mreq(qv, sparse=([1, 2], [0.5])), "sparse_embedding has 1 float_val and 2"),
            (mreq(qv, sparse=([1], [0.5]), alpha=2.0), "rrf.alpha"),
            (mreq(qv, numeric=[("price", "int", 3, 0)]), "OPERATOR_UNSPECIFIED"),
            (mreq(qv, numeric=[("price", "int", 3, 9)]), "unknown op 9"),
            (mreq(qv, restricts=[("", ["red"], [])]), "restricts[0].name is empty"),
        ]
        nv = mreq(qv)
        nv.numeric_restricts.add(name="price", op=1)
        cases.append((nv, "numeric_restricts[0] (price) has no value"))
        nan = mreq(qv)
        nan.float_val[3] = float("nan")
        cases.append((nan, "float_val[3] is not finite"))
        for m, needle in cases:
            expect_error(lambda: vs.Match(m, timeout=30), IA, needle)
        expect_error(lambda: cl.channel.unary_unary(
            "/" + vh.SERVICE + "/Match")(b"\xff\xff\xff", timeout=30), IA, "malformed")
        print("bad requests:", len(cases) + 1, "INVALID_ARGUMENT with the field named")

        # deadline: an already-expired deadline (1 us; 0.5 ms once raced a fast answer under
        # load) gives DEADLINE_EXCEEDED, and the server
        # goes on answering
        expect_error(lambda: vs.Match(mreq(qv), timeout=1e-6), grpc.StatusCode.DEADLINE_EXCEEDED)
        same(vs.Match(mreq(qv), timeout=30), fn(qv), "after deadline")

        # health reports the Vertex service name
        _, _, _, hp, hpg = sh.stubs()
        h = hpg.HealthStub(cl.channel).Check(hp.HealthCheckRequest(service=vh.SERVICE),
                                             timeout=10)
        assert h.status == hp.HealthCheckResponse.SERVING, h
    finally:
        cl.stop()


def main():
    for b in sh.bins():  # release, then the ASan+UBSan build under `make test`
        run(b)
        run(b, "DOT_PRODUCT", nq=6)
        print("ok with", b)
    print("test_vertex_python: OK")


if __name__ == "__main__":
    main()
