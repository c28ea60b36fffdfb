"""tessera-shard streamed writes (issue 15, the shard side; docs/shard.md "Streamed writes").

Real tessera-shard processes over gRPC:
- byte-identical: shard A serves version 1 (a base) plus a delta made by Writes (new
  records, replaced and deleted base records, a delta record replaced and one deleted, a
  label written twice in one write); shard B serves the same final records as one staged
  version. Search (plain, token and numeric filters — one whose tokens only delta records
  have —, crowding, exact re-rank, sparse, sparse-only, return_ids / return_datapoints),
  Read and Stats answer exactly alike (labels, float distances, tags, datapoints);
- a Write is visible to the next Search at once; a resend of an applied seq is a no-op;
  a wrong version is FAILED_PRECONDITION, a bad record INVALID_ARGUMENT and nothing of
  the write is applied;
- kill -9 right after Writes were acknowledged: after the restart every acknowledged
  write is there (the same answers, the same stream seq);
- a torn log tail (the file cut by hand inside its last record): the shard starts, logs
  the file, the offset and why, and serves every complete record, not the torn one;
- fold: Stage with a wrong base_stream_seq is refused; Stage/Prepare/Commit of version 2
  with no records folds the delta (the answers stay those of B), the old log is removed,
  v000002/slice.faiss opens in stock Faiss with the same lists as B's and answers as the
  shard does, and a restart keeps the folded seq (old seqs stay deduplicated).
"""
import os
import re
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

import faiss  # noqa: E402
import grpc  # noqa: E402

D, NLIST, M = 16, 16, 4
COLORS = ["red", "green", "blue"]


def rec(sp, tp, label, lst, vec, i, tagbase="t", color=None, extra_ns=False, sparse=True):
    restricts = [("color", [color or COLORS[i % 3]], []), ("shape", ["sq" if i % 2 else "ci"],
                                                           ["x"] if i % 5 == 0 else [])]
    numeric = [("price", "int", i % 100)]
    if extra_ns:
        numeric.append(("weight", "double", float(i % 7) + 0.5))
    sp_emb = ([i % 40, 50 + i % 20], [1.0 + (i % 3), 0.5]) if sparse and i % 4 == 0 else None
    dp = H.datapoint(tp, "id%d" % label, vec, restricts=restricts, numeric=numeric,
                     tag="%s%d" % (tagbase, i % 7), sparse=sp_emb)
    return sp.StagedUpsert(label=label, list=lst, datapoint=dp)


def queries(sp, ix, xq, version=0):
    """A batch exercising every query feature (the same for A and B)."""
    Dq, Iq = ix.quantizer.search(xq, 6)
    qs = []
    for qi in range(len(xq)):
        for kind in range(9):
            q = sp.ShardQuery(version=version, k=10, return_ids=True,
                              return_datapoints=(kind % 3 == 0))
            if kind != 8:
                q.vector.extend(xq[qi].tolist())
                q.lists.extend(int(x) for x in Iq[qi])
                q.coarse_distances.extend(float(x) for x in Dq[qi])
            if kind == 1:
                q.restricts.add(namespace="color", allow_list=["purple", "red"])
            if kind == 2:
                q.restricts.add(namespace="color", allow_list=["purple"])  # delta only
            if kind == 3:
                q.numeric_restricts.add(namespace="price", op=1, value_int=40)
                q.restricts.add(namespace="shape", allow_list=["sq"], deny_list=["x"])
            if kind == 4:
                q.crowding_limit = 2
            if kind == 5:
                q.candidates = 40
                q.crowding_limit = 3
            if kind == 6:
                q.numeric_restricts.add(namespace="weight", op=4, value_double=3.0)
            if kind in (7, 8):
                q.sparse.dimensions.extend([qi % 40, 50 + qi % 20, 3])
                q.sparse.values.extend([1.0, 2.0, 0.5])
                q.crowding_limit = 2 if kind == 8 else 0
            qs.append(q)
    return sp.ShardSearchRequest(queries=qs)


def strip(resp):
    out = []
    for r in resp.results:
        out.append((list(r.labels), [float(x) for x in r.distances], list(r.crowding_tags),
                    list(r.sparse_labels), [float(x) for x in r.sparse_scores],
                    list(r.sparse_crowding_tags), list(r.ids), list(r.sparse_ids),
                    [x.SerializeToString(deterministic=True) for x in r.datapoints],
                    [x.SerializeToString(deterministic=True) for x in r.sparse_datapoints]))
    return out


def same(a, b, what):
    ra, rb = strip(a), strip(b)
    assert len(ra) == len(rb)
    bad = [i for i in range(len(ra)) if ra[i] != rb[i]]
    assert not bad, "%s: %d/%d results differ, first #%d:\n A %s\n B %s" % (
        what, len(bad), len(ra), bad[0], ra[bad[0]][:6], rb[bad[0]][:6])
    nonempty = sum(1 for r in ra if r[0] or r[3])
    assert nonempty > len(ra) // 2, "too many empty results: %d/%d" % (nonempty, len(ra))


def stats_view(st):
    return (st.vectors_count, st.sparse_vectors_count, list(st.lists), list(st.list_sizes))


def expect_code(fn, code, text=None):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        if text:
            for t in text:
                assert t in e.details(), (t, e.details())
        return e.details()
    raise AssertionError("expected %s" % code)


def wal_file(data, v):
    return os.path.join(data, "wal", "v%d.log" % v)


def make_stream(sp, tp, metric):
    """The data, a template, the base records, the writes and the final model."""
    rng = np.random.default_rng(15)
    n, nnew = 3000, 400
    centers = rng.normal(size=(24, D)).astype("float32") * 3
    xb = (centers[rng.integers(0, 24, n + nnew)] + rng.normal(size=(n + nnew, D))).astype("float32")
    xq = (centers[rng.integers(0, 24, 30)] + rng.normal(size=(30, D))).astype("float32")
    ix, tmpl = H.template_bytes(xb[:2000], NLIST, M, metric=metric)
    _, asg = ix.quantizer.search(xb, 1)
    asg = asg[:, 0].astype(int)
    lab = lambda i: 5 + 2 * i  # noqa: E731

    base = {}
    for i in range(n):
        if i % 50 == 7:  # sparse-only records
            base[lab(i)] = rec(sp, tp, lab(i), -1, None, i)
        else:
            base[lab(i)] = rec(sp, tp, lab(i), int(asg[i]), xb[i], i)

    # The stream: (seq, upserts, deletes); `final` is the model of the result.
    final = dict(base)
    writes = []
    seq = 0
    newi = list(range(n, n + nnew))
    for b in range(0, nnew, 40):
        seq += 1
        ups = []
        for i in newi[b:b + 40]:
            color = "purple" if i % 5 == 0 else None
            u = rec(sp, tp, lab(i), int(asg[i]), xb[i], i, tagbase="nt" if i % 2 else "t",
                    color=color, extra_ns=True)
            ups.append(u)
        # replace base records (other vector, other list, other restricts)
        for j in range(3):
            i = (b * 7 + j * 13) % n
            if i % 50 == 7:
                continue
            k = (i + 1234) % n
            ups.append(rec(sp, tp, lab(i), int(asg[k]), xb[k], k + 1, tagbase="nt",
                           extra_ns=True))
        dels = [lab((b * 11 + 5) % n), lab((b * 3 + 1) % n), 999999999]  # last: unknown
        dels = [x for x in dels if x not in {u.label for u in ups}]
        writes.append((seq, ups, dels))
    # a delta record replaced, one deleted, one label twice in one write
    seq += 1
    i0, i1 = n + 1, n + 2
    writes.append((seq, [rec(sp, tp, lab(i0), int(asg[5]), xb[5], 77, tagbase="zz"),
                         rec(sp, tp, lab(7), int(asg[9]), xb[9], 9),
                         rec(sp, tp, lab(7), int(asg[11]), xb[11], 11, extra_ns=True)],
                   [lab(i1)]))
    for s_, ups, dels in writes:
        for u in ups:
            final[u.label] = u
        for x in dels:
            final.pop(x, None)

    return ix, tmpl, xb, xq, asg, base, final, writes, seq, n


def write_all(sp, shard, writes, version=1):
    for s_, ups, dels in writes:
        rq = sp.ShardWriteRequest(version=version, seq=s_, upserts=ups)
        for x in dels:
            rq.deletes.add(label=x, list=-1)
        assert shard.stub.Write(rq, timeout=20).applied_seq == s_


def inner_product(sp, tp):
    """The byte-identical check once more with an inner-product index (no ADC terms)."""
    ix, tmpl, xb, xq, asg, base, final, writes, seq, n = make_stream(sp, tp, "IP")
    own = list(range(NLIST))
    A, B = H.Shard(H.tmpdir()), H.Shard(H.tmpdir())
    try:
        H.load(A, 1, 0, list(base.values()), template=tmpl, chunk=1000, own=own)
        H.load(B, 1, 0, [final[k] for k in sorted(final)], template=tmpl, chunk=1000, own=own)
        write_all(sp, A, writes)
        rq = queries(sp, ix, xq)
        same(A.stub.Search(rq, timeout=60), B.stub.Search(rq, timeout=60), "IP")
        print("byte-identical (IP): %d queries x 9 kinds" % len(xq))
    finally:
        A.stop()
        B.stop()


def main():
    sp, _, tp, _, _ = H.stubs()
    ix, tmpl, xb, xq, asg, base, final, writes, seq, n = make_stream(sp, tp, "L2")
    own = list(range(NLIST))
    da, db = H.tmpdir(), H.tmpdir()
    mport = H.free_port()
    A, B = H.Shard(da, extra=["--metrics-listen", "127.0.0.1:%d" % mport]), H.Shard(db)
    try:
        H.load(A, 1, 0, list(base.values()), template=tmpl, chunk=1000, own=own)
        H.load(B, 1, 0, [final[k] for k in sorted(final)], template=tmpl, chunk=1000, own=own)
        st0 = A.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st0.stream_seq == 0 and st0.delta_upserts == 0 and st0.wal_bytes == 0, st0

        # Refusals apply nothing.
        expect_code(lambda: A.stub.Write(sp.ShardWriteRequest(version=2, seq=1), timeout=10),
                    grpc.StatusCode.FAILED_PRECONDITION, ["version 2", "version is 1"])
        expect_code(lambda: A.stub.Write(sp.ShardWriteRequest(version=1, seq=0), timeout=10),
                    grpc.StatusCode.INVALID_ARGUMENT, ["seq"])
        bad = sp.ShardWriteRequest(version=1, seq=1, upserts=[writes[0][1][0]])
        bad.upserts.add(label=42, list=1, datapoint=H.datapoint(tp, "short", [1.0, 2.0]))
        expect_code(lambda: A.stub.Write(bad, timeout=10), grpc.StatusCode.INVALID_ARGUMENT,
                    ["upserts[1]", "feature_vector"])
        bad = sp.ShardWriteRequest(version=1, seq=1)
        bad.upserts.add(label=42, list=1,
                        datapoint=H.datapoint(tp, "nan", [float("nan")] * D))
        expect_code(lambda: A.stub.Write(bad, timeout=10), grpc.StatusCode.INVALID_ARGUMENT,
                    ["finite"])
        assert A.stub.Stats(sp.ShardStatsRequest(), timeout=10).stream_seq == 0

        # Writes, each visible at once.
        for s_, ups, dels in writes:
            rq = sp.ShardWriteRequest(version=1, seq=s_, upserts=ups)
            for x in dels:
                rq.deletes.add(label=x, list=-1)
            r = A.stub.Write(rq, timeout=20)
            assert r.applied_seq == s_, r
            u = ups[0]
            if u.list >= 0:
                Dq, Iq = ix.quantizer.search(np.array([u.datapoint.feature_vector], "float32"), 1)
                q = sp.ShardQuery(version=1, k=1, candidates=NLIST * 10)
                q.vector.extend(u.datapoint.feature_vector)
                q.lists.append(int(Iq[0, 0]))
                q.coarse_distances.append(float(Dq[0, 0]))
                got = A.stub.Search(sp.ShardSearchRequest(queries=[q]), timeout=10).results[0]
                assert list(got.labels) == [u.label], (s_, list(got.labels), u.label)
        last = seq

        # Resend of an applied seq: acknowledged, not applied.
        junk = sp.ShardWriteRequest(version=1, seq=2)
        junk.deletes.add(label=writes[3][1][0].label, list=-1)
        r = A.stub.Write(junk, timeout=10)
        assert r.applied_seq == last, r
        rr = A.stub.Read(sp.ShardReadRequest(labels=[writes[3][1][0].label]), timeout=10)
        assert rr.datapoints[0].found

        rq = queries(sp, ix, xq)
        ra, rb = A.stub.Search(rq, timeout=60), B.stub.Search(rq, timeout=60)
        same(ra, rb, "version + delta vs the same records staged")
        print("byte-identical: %d queries x 9 kinds" % len(xq))
        labels = sorted(set(final) | set(base) | {999999999})
        r1 = A.stub.Read(sp.ShardReadRequest(labels=labels), timeout=10)
        r2 = B.stub.Read(sp.ShardReadRequest(labels=labels), timeout=10)
        assert r1 == r2, "Read differs"
        sa = A.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        sb = B.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert stats_view(sa) == stats_view(sb), (stats_view(sa)[:2], stats_view(sb)[:2])
        assert sa.stream_seq == last and sa.wal_bytes > 0, sa
        nmask = sum(1 for k in base if k not in final or final[k] is not base[k])
        assert sa.delta_upserts == sum(1 for k in final if k not in base or final[k] is not base[k])
        assert sa.delta_deletes == sum(1 for k in base if k not in final), sa
        print("stats: %d upserts, %d deletes in the delta (%d base labels masked), wal %d bytes"
              % (sa.delta_upserts, sa.delta_deletes, nmask, sa.wal_bytes))

        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                                      timeout=5).read().decode()
        want = {"tessera_shard_stream_writes_total": len(writes),
                "tessera_shard_delta_records": sa.delta_upserts + sa.delta_deletes,
                "tessera_shard_wal_bytes": sa.wal_bytes, "tessera_shard_stream_seq": last,
                "tessera_vectors": sa.vectors_count, "tessera_lists": len(sa.lists)}
        for name, val in want.items():
            m = re.search(r"^" + name + r" (\S+)$", text, re.M)
            assert m and float(m.group(1)) == val, (name, m and m.group(1), val)

        # kill -9 right after the acknowledged writes: all of them are back.
        assert "Sanitizer" not in A.text() and "runtime error:" not in A.text(), A.text()
        A.kill()
        A = H.restart(A)
        same(A.stub.Search(rq, timeout=60), rb, "after kill -9 and the log replay")
        assert A.stub.Stats(sp.ShardStatsRequest(), timeout=10).stream_seq == last

        # Torn tail: one more write, then its record cut in half by hand.
        extra = rec(sp, tp, 777777, int(asg[3]), xb[3], 3)
        before = os.path.getsize(wal_file(da, 1))
        A.stub.Write(sp.ShardWriteRequest(version=1, seq=last + 1, upserts=[extra]), timeout=10)
        after = os.path.getsize(wal_file(da, 1))
        A.kill()
        with open(wal_file(da, 1), "r+b") as f:
            f.truncate(before + (after - before) // 2)
        A = H.restart(A)
        log = A.text()
        assert "v1.log: offset %d" % before in log and "dropping the tail" in log, log
        assert os.path.getsize(wal_file(da, 1)) == before
        st = A.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.stream_seq == last, st
        assert not A.stub.Read(sp.ShardReadRequest(labels=[777777]), timeout=10).datapoints[0].found
        same(A.stub.Search(rq, timeout=60), rb, "after a torn tail")

        # Fold: wrong base_stream_seq refused, then version 2 = version 1 + delta.
        expect_code(lambda: A.stub.Stage(sp.StageRequest(version=2, base_version=1, chunk=0,
                                                         base_stream_seq=last - 1), timeout=10),
                    grpc.StatusCode.FAILED_PRECONDITION,
                    ["base_stream_seq %d" % (last - 1), "%d" % last])
        A.stub.Stage(sp.StageRequest(version=2, base_version=1, chunk=0, base_stream_seq=last),
                     timeout=30)
        pr = A.stub.Prepare(sp.PrepareRequest(version=2), timeout=60)
        assert pr.ready and pr.vectors_count == sb.vectors_count, (pr, sb.vectors_count)
        expect_code(lambda: A.stub.Write(sp.ShardWriteRequest(version=1, seq=last + 1),
                                         timeout=10), grpc.StatusCode.FAILED_PRECONDITION,
                    ["prepared"])
        q1 = queries(sp, ix, xq, version=1)
        before_commit = A.stub.Search(q1, timeout=60)
        A.stub.Commit(sp.CommitRequest(version=2), timeout=30)
        # version 1 keeps its (frozen) delta for queries planned on it
        same(A.stub.Search(q1, timeout=60), before_commit, "version 1 after the commit")
        same(A.stub.Search(rq, timeout=60), rb, "folded version 2")
        assert not os.path.exists(wal_file(da, 1)), "the folded log is still there"
        st = A.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.current_version == 2 and st.stream_seq == last and st.delta_upserts == 0, st
        assert stats_view(st) == stats_view(sb)
        r = A.stub.Write(sp.ShardWriteRequest(version=2, seq=last), timeout=10)
        assert r.applied_seq == last and r.delta_records == 0, r

        # Stock Faiss: the folded slice holds B's lists (same labels, same codes).
        fa = faiss.read_index(os.path.join(da, "v000002", "slice.faiss"))
        fb = faiss.read_index(os.path.join(db, "v000001", "slice.faiss"))
        assert fa.ntotal == fb.ntotal == sb.vectors_count
        cs = fa.code_size
        for li in range(NLIST):
            def lst(fx):
                il = fx.invlists
                sz = il.list_size(li)
                if sz == 0:
                    return []
                ids = faiss.rev_swig_ptr(il.get_ids(li), sz).copy()
                codes = faiss.rev_swig_ptr(il.get_codes(li), sz * cs).copy().reshape(sz, cs)
                return sorted((int(a), bytes(c)) for a, c in zip(ids, codes))
            assert lst(fa) == lst(fb), "list %d differs" % li
        Dq, Iq = ix.quantizer.search(xq, 6)
        Iq = np.ascontiguousarray(Iq, dtype="int64")
        Dq = np.ascontiguousarray(Dq)
        fa.nprobe = 6
        k = 10
        FD = np.empty((len(xq), k), dtype="float32")
        FI = np.empty((len(xq), k), dtype="int64")
        fa.search_preassigned(len(xq), faiss.swig_ptr(xq), k, faiss.swig_ptr(Iq),
                              faiss.swig_ptr(Dq), faiss.swig_ptr(FD),
                              faiss.swig_ptr(FI), False)
        plain = A.stub.Search(rq, timeout=60).results[0::9]
        agree = sum(1 for i, r in enumerate(plain) if list(r.labels) == [int(x) for x in FI[i]
                                                                          if x >= 0])
        assert agree >= len(xq) - 1, agree
        print("folded slice in stock Faiss: same lists as B, %d/%d queries agree" %
              (agree, len(xq)))

        # Restart after the fold: the folded seq is kept, old seqs stay deduplicated.
        A.stop()
        A = H.Shard(da)
        st = A.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.current_version == 2 and st.stream_seq == last, st
        r = A.stub.Write(sp.ShardWriteRequest(version=2, seq=1, upserts=[extra]), timeout=10)
        assert r.applied_seq == last and r.delta_records == 0, r
        same(A.stub.Search(rq, timeout=60), rb, "after the restart")
    finally:
        A.stop()
        B.stop()
    inner_product(sp, tp)
    print("ok")


if __name__ == "__main__":
    main()
