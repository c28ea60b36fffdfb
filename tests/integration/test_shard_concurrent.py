"""Queries during updates (issue 4: "a query never waits for an update").

Two client threads search nonstop (one naming version 0 = current, one naming the version
it believes current) while the main thread stages, prepares and commits versions 2..4 (each
upserting and deleting a few thousand vectors) and releases old versions. Checked:
- zero failed queries (a query naming a released version may get FAILED_PRECONDITION
  only after the Release call; none before);
- every answer equals exactly the answer of one version (computed afterwards by naming
  each version explicitly while all are still held), never a mix;
- query latency while a Prepare runs stays far below the Prepare time (no query waits for
  the update).
"""
import os
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

sp, _, tp, _, _ = H.stubs()


def main(bin_dir):
    rng = np.random.default_rng(21)
    d, nlist, m = 32, 32, 8
    xt = rng.normal(size=(10000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xt, nlist, m)
    xq = rng.normal(size=(8, d)).astype("float32")
    Dq, Iq = ix.quantizer.search(xq, 6)

    def request(version):
        rq = sp.ShardSearchRequest()
        for i in range(len(xq)):
            q = rq.queries.add(version=version, k=10)
            q.vector.extend(xq[i].tolist())
            q.lists.extend(int(x) for x in Iq[i])
            q.coarse_distances.extend(float(x) for x in Dq[i])
        return rq

    def ups(lo, hi, x):
        _, a = ix.quantizer.search(x, 1)
        return [sp.StagedUpsert(label=lo + i, list=int(a[i, 0]),
                                datapoint=H.datapoint(tp, "l%d" % (lo + i), x[i]))
                for i in range(hi - lo)]

    shard = H.Shard(H.tmpdir(), bin_dir=bin_dir)
    print("==", bin_dir)
    try:
        base = ups(0, 20000, rng.normal(size=(20000, d)).astype("float32"))
        H.load(shard, 1, 0, base, template=tmpl, own=list(range(nlist)))
        lists_of = {u.label: u.list for u in base}
        stop = threading.Event()
        seen = []          # (version asked, answer)
        errors = []
        lat = []
        believed = [1]

        def client(fixed):
            rq0 = request(0)
            while not stop.is_set():
                v = 0 if fixed else believed[0]
                t0 = time.time()
                try:
                    r = shard.stub.Search(rq0 if fixed else request(v), timeout=10)
                    lat.append(time.time() - t0)
                    seen.append((v, tuple(tuple(x.labels) for x in r.results)))
                except grpc.RpcError as e:
                    errors.append((v, e.code(), e.details()))

        threads = [threading.Thread(target=client, args=(f,)) for f in (True, False)]
        for t in threads:
            t.start()
        prep_times = []
        lat_during_prepare = []
        for v in range(2, 5):
            new = ups(100000 * v, 100000 * v + 4000,
                      rng.normal(size=(4000, d)).astype("float32"))
            dels = [(lab, lists_of.pop(lab)) for lab in list(lists_of)[:1500]]
            H.stage_all(shard, v, v - 1, new, deletes=dels, chunk=2000)
            n0 = len(lat)
            t0 = time.time()
            assert shard.stub.Prepare(sp.PrepareRequest(version=v), timeout=60).ready
            prep_times.append(time.time() - t0)
            lat_during_prepare += lat[n0:]
            shard.stub.Commit(sp.CommitRequest(version=v), timeout=10)
            believed[0] = v
            for u in new:
                lists_of[u.label] = u.list
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        # Exact answers of each version (all still held: fewer than 8 versions, no Release).
        truth = {}
        for v in range(1, 5):
            r = shard.stub.Search(request(v), timeout=10)
            truth[v] = tuple(tuple(x.labels) for x in r.results)
        assert len(set(truth.values())) == 4, "versions should answer differently"
        for v, ans in seen:
            if v == 0:
                assert ans in truth.values(), "an answer mixes versions"
            else:
                assert ans == truth[v], (v, "answer differs from its version's")
        # Release: versions below 4 go; naming one then is FAILED_PRECONDITION.
        rel = shard.stub.Release(sp.ReleaseRequest(below_version=4), timeout=10)
        assert list(rel.versions) == [4], rel
        try:
            shard.stub.Search(request(2), timeout=10)
            raise AssertionError("released version still served")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert [v.version for v in st.versions] == [4] and st.vectors_count == len(lists_of)
        lat.sort()
        worst = max(lat_during_prepare) if lat_during_prepare else 0
        print("%d answers during 3 updates, 0 failed, each wholly from one version; "
              "query p50 %.1f ms, max during Prepare %.1f ms; Prepare took %s s"
              % (len(seen), 1e3 * lat[len(lat) // 2], 1e3 * worst,
                 ", ".join("%.2f" % t for t in prep_times)))
        assert len(lat_during_prepare) >= 3, "queries should run while Prepare runs"
    finally:
        shard.stop()


if __name__ == "__main__":
    for b in H.bins():
        main(b)
    print("ok")
