"""Bad requests to tessera-shard (issue 4, point 5) and the python grpcio client (point 6).

Every malformed or inconsistent request gets INVALID_ARGUMENT with a message naming the
field (malformed protobuf on every method, wrong dimension, unknown / unowned / duplicate
list, k <= 0 or > 10000, empty query, lists vs coarse_distances mismatch, NaN, bad sparse,
bad numeric op, bad Stage content); a version the shard does not hold and out-of-order
update calls get FAILED_PRECONDITION; too many prepared versions RESOURCE_EXHAUSTED; an unknown method gets UNIMPLEMENTED; Health/Check
answers SERVING. The shard keeps serving after all of it and exits cleanly.
"""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

sp, _, tp, hp, hpg = H.stubs()


def expect(code, fn, *args, contains=None):
    try:
        fn(*args, timeout=10)
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        assert e.details(), "no message"
        if contains:
            assert contains in e.details(), (contains, e.details())
        return e.details()
    raise AssertionError("expected %s" % code)


def main(bin_dir):
    rng = np.random.default_rng(3)
    d, nlist = 16, 8
    xt = rng.normal(size=(3000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xt, nlist, 4, nbits=4)
    data = H.tmpdir()
    shard = H.Shard(data, bin_dir=bin_dir)
    print("== %s" % bin_dir)
    try:
        h = hpg.HealthStub(shard.channel).Check(hp.HealthCheckRequest(), timeout=5)
        assert h.status == hp.HealthCheckResponse.SERVING
        h = hpg.HealthStub(shard.channel).Check(hp.HealthCheckRequest(service="tessera.v1.Shard"),
                                                timeout=5)
        assert h.status == hp.HealthCheckResponse.SERVING

        # Empty shard: version 0, nothing owned.
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=5)
        assert st.current_version == 0 and st.vectors_count == 0
        IA, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
        expect(FP, shard.stub.Stage, sp.StageRequest(version=1, chunk=0), contains="template")
        expect(FP, shard.stub.Prepare, sp.PrepareRequest(version=1))
        expect(FP, shard.stub.Commit, sp.CommitRequest(version=1))
        expect(FP, shard.stub.Stage, sp.StageRequest(version=1, chunk=3, template_faiss=tmpl))
        expect(IA, shard.stub.Stage, sp.StageRequest(version=1, template_faiss=b"IwPQjunk"),
               contains="template_faiss")

        _, a = ix.quantizer.search(xt[:500], 1)
        ups = [sp.StagedUpsert(label=i, list=int(a[i, 0]), datapoint=H.datapoint(tp, "x%d" % i, xt[i]))
               for i in range(500)]
        bad_dim = sp.StagedUpsert(label=9999, list=0, datapoint=H.datapoint(tp, "bad", xt[0][:5]))
        expect(IA, shard.stub.Stage, sp.StageRequest(version=1, template_faiss=tmpl,
                                                     upserts=[bad_dim]), contains="dimension")
        bad_list = sp.StagedUpsert(label=9999, list=nlist, datapoint=H.datapoint(tp, "b", xt[0]))
        expect(IA, shard.stub.Stage, sp.StageRequest(version=1, template_faiss=tmpl,
                                                     upserts=[bad_list]), contains="list")
        owned = [0, 1, 2, 3, 4, 5, 6]  # list 7 is not this shard's
        ups = [u for u in ups if u.list in owned]
        H.load(shard, 1, 0, ups, template=tmpl, own=owned)
        expect(FP, shard.stub.Stage, sp.StageRequest(version=1, chunk=0), contains="already")
        expect(FP, shard.stub.Abort, sp.AbortRequest(version=1), contains="current")
        shard.stub.Abort(sp.AbortRequest(version=77), timeout=5)  # unknown: no-op
        shard.stub.Commit(sp.CommitRequest(version=1), timeout=5)  # idempotent

        D, I = ix.quantizer.search(xt[:1], 3)

        def q(**kw):
            base = dict(version=1, k=10, vector=xt[0].tolist(), lists=[0],
                        coarse_distances=[1.0])
            base.update(kw)
            return sp.ShardSearchRequest(queries=[sp.ShardQuery(**base)])

        ok = shard.stub.Search(q(), timeout=5)
        assert len(ok.results) == 1
        cases = [
            (q(vector=xt[0][:5].tolist()), "dimension"),
            (q(lists=[7]), "lists[0] = 7"),
            (q(lists=[8]), "lists[0] = 8"),
            (q(lists=[-1]), "lists[0] = -1"),
            (q(lists=[0, 0], coarse_distances=[1.0, 1.0]), "twice"),
            (q(lists=[0, 1]), "coarse_distances"),
            (q(k=0), "k = 0"),
            (q(k=-5), "k = -5"),
            (q(k=10001), "k = 10001"),
            (q(k=2 ** 31 - 1), "k = 2147483647"),
            (q(candidates=-1), "candidates"),
            (q(candidates=100000), "candidates"),
            (q(crowding_limit=-1), "crowding_limit"),
            (q(vector=[], lists=[], coarse_distances=[]), "empty query"),
            (q(vector=[], lists=[0], coarse_distances=[1.0]), "empty query"),
            (q(vector=[float("nan")] * d), "finite"),
            (q(coarse_distances=[float("inf")]), "finite"),
            (sp.ShardSearchRequest(), "queries"),
        ]
        sq = sp.ShardQuery(version=1, k=5)
        sq.sparse.dimensions.extend([1, 2])
        sq.sparse.values.extend([1.0])
        cases.append((sp.ShardSearchRequest(queries=[sq]), "sparse"))
        nq = q()
        nq.queries[0].numeric_restricts.add(namespace="n", value_int=3)  # op unspecified
        cases.append((nq, "filters"))
        nq = q()
        nq.queries[0].numeric_restricts.add(namespace="n", op=3)  # no value
        cases.append((nq, "no value"))
        for rq, want in cases:
            msg = expect(IA, shard.stub.Search, rq, contains=want)
            print("INVALID_ARGUMENT: %s" % msg)
        msg = expect(FP, shard.stub.Search, q(version=5), contains="version 5")
        print("FAILED_PRECONDITION: %s" % msg)

        # Malformed protobuf on every method (raw bytes, no stub serialization).
        for m in ("Search", "Read", "Stage", "Prepare", "Commit", "Abort", "Release", "Stats"):
            call = shard.channel.unary_unary("/tessera.v1.Shard/" + m,
                                             request_serializer=None,
                                             response_deserializer=None)
            for junk in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x08" + b"\xff" * 11):
                expect(IA, call, junk, contains="malformed")
        # Unknown method and unknown service.
        for path in ("/tessera.v1.Shard/Nope", "/no.Such/Method"):
            call = shard.channel.unary_unary(path, request_serializer=None,
                                             response_deserializer=None)
            expect(grpc.StatusCode.UNIMPLEMENTED, call, b"")

        # Prepared versions pile up only to a bound: then RESOURCE_EXHAUSTED, not a crash.
        one = [ups[0]]
        for v in range(2, 13):
            H.stage_all(shard, v, 1, one)
            assert shard.stub.Prepare(sp.PrepareRequest(version=v), timeout=30).ready
        H.stage_all(shard, 13, 1, one)
        expect(grpc.StatusCode.RESOURCE_EXHAUSTED, shard.stub.Prepare,
               sp.PrepareRequest(version=13), contains="versions held")
        for v in range(2, 14):
            shard.stub.Abort(sp.AbortRequest(version=v), timeout=10)
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=5)
        assert [v.version for v in st.versions] == [1], st.versions

        # Still serving.
        assert len(shard.stub.Search(q(), timeout=5).results) == 1
        assert shard.stub.Stats(sp.ShardStatsRequest(), timeout=5).current_version == 1
    finally:
        shard.stop()
    print("ok")


if __name__ == "__main__":
    for b in H.bins():  # release, then the ASan+UBSan build under `make test`
        main(b)
