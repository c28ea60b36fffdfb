"""Folds with --etcd (docs/ha.md "Folds with --etcd"): streamed writes are not held by a
fold's Prepare, and the new version's directory is rebuilt from the shards' listing plus
the rounds its catch-up carried, named in etcd's version record, not uploaded as a blob.

etcd x1, 2 shard groups x 1 replica, coordinators x2 (TTL 2 s), a base of 2000 ids (d 16).
Every shard's Prepare sleeps 1.5 s (TSR_SHARD_SLOW_PREPARE_MS) and the leader's fold 1 s
after it copied the overlay (TSR_COORD_SLOW_FOLD_DIR_MS), so writes land in the fold.
1. Streamed before the fold: 200 new ids, 20 base ids replaced, 20 removed. A fold
   (fold_stream) while a writer streams one write per call: new ids, a new vector for an
   id streamed before the fold, the removal of another one and of a base id. At least one
   write is acknowledged while the operation still says PREPARING (it was held to the
   commit point with --etcd before), every write is acknowledged, the version is 2.
2. etcd's record of version 2 has "carry 1 S T" (S < T), a directory summary and no
   directory blob; version 1's mirrored rounds are still in etcd.
3. The follower moves to version 2 by rebuilding its directory from the shards and the
   carried rounds (its log says so): every id of the model reads back bit for bit on the
   leader and the follower, no removed id does, and each written vector finds its id
   first (k = 1, every list probed).
4. kill -9 of the leader: the follower leads and answers the same; a third coordinator
   started with an EMPTY --data folder answers the same. More writes, a second fold on
   the new leader (version 3, carried from 2): the third coordinator follows it, the model
   still holds, and version 1's mirrored rounds are gone from etcd (dropped two versions on).
A rebuild that ignored the carried rounds lists fewer entries than the summary and is
refused: the follower would never reach version 2.
Exit 77 only when etcd is not installed.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402

D = 16
N = 2000


class Model:
    """id -> vector of every id that must be there; removed ids that must not."""

    def __init__(self):
        self.v, self.gone = {}, set()

    def upsert(self, did, vec):
        self.v[did] = np.asarray(vec, dtype="float32")
        self.gone.discard(did)

    def remove(self, did):
        self.v.pop(did, None)
        self.gone.add(did)


def upsert(stub, tp, items):
    dps = [tp.IndexDatapoint(datapoint_id=d, feature_vector=[float(f) for f in v])
           for d, v in items]
    stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=dps), timeout=30)


def remove(stub, tp, ids):
    stub.RemoveDatapoints(tp.RemoveDatapointsRequest(datapoint_ids=list(ids)), timeout=30)


def check(name, c, tp, model, probe):
    """Every model id reads back bit for bit on c, no removed one does; the probed ids'
    own vectors find them first."""
    ids = sorted(model.v)
    got = {}
    for i in range(0, len(ids), 500):
        rd = c.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids[i:i + 500]),
                                        timeout=30)
        for d in rd.datapoints:
            got[d.datapoint_id] = np.asarray(d.feature_vector, dtype="float32")
    missing = [d for d in ids if d not in got]
    assert not missing, "%s: %d model ids not read back, e.g. %s" % (name, len(missing),
                                                                      missing[:5])
    wrong = [d for d in ids if not np.array_equal(got[d], model.v[d])]
    assert not wrong, "%s: %d ids read back with another vector, e.g. %s" % (name, len(wrong),
                                                                             wrong[:5])
    rd = c.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=sorted(model.gone)),
                                    timeout=30)
    assert not rd.datapoints, "%s: removed ids read back: %s" % (
        name, [d.datapoint_id for d in rd.datapoints][:5])
    for did in probe:
        r = c.stub.FindNeighbors(tp.FindNeighborsRequest(
            queries=[ch.query(tp, model.v[did], k=1, fraction=1.0)]), timeout=30)
        nb = r.nearest_neighbors[0].neighbors
        assert nb and nb[0].datapoint.datapoint_id == did, (name, did, r)
    return len(ids)


def make(c, tp, model, w):
    """One write ("upsert", id, vec) / ("remove", id) on c, and into the model."""
    if w[0] == "upsert":
        upsert(c.stub, tp, [(w[1], w[2])])
        model.upsert(w[1], w[2])
    else:
        remove(c.stub, tp, [w[1]])
        model.remove(w[1])


def fold_with_writes(cl, lead, tp, model, tag, writes):
    """A fold on lead while `writes` (("upsert", id, vec) / ("remove", id)) are streamed one
    per call; returns (operation, writes acknowledged while it said PREPARING)."""
    r = lead.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=30)
    in_prepare, done, k = 0, False, 0
    t_end = time.time() + 120
    while time.time() < t_end:
        op = lead.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                    timeout=10)
        if op.state in (tp.Operation.SUCCEEDED, tp.Operation.FAILED, tp.Operation.REJECTED):
            done = True
            break
        if op.state == tp.Operation.PREPARING and k < len(writes):
            make(lead, tp, model, writes[k])
            k += 1
            op2 = lead.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                         timeout=10)
            in_prepare += op2.state == tp.Operation.PREPARING
        else:
            time.sleep(0.02)
    assert done, "%s: the fold did not finish in 120 s:\n%s" % (tag, cl.logs()[-4000:])
    for w in writes[k:]:  # the rest after it: every write of the list is made
        make(lead, tp, model, w)
    print("%s: %d of %d writes made during the fold, %d acknowledged while it said "
          "PREPARING" % (tag, k, len(writes), in_prepare))
    return op, in_prepare


def stream_keys(cl, v):
    return cl.etcd.keys("%s/stream/%020d/" % (cl.prefix, v))


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(17)
    x = (rng.normal(size=(N, D)) * 3).astype("float32")
    os.environ["TSR_SHARD_SLOW_PREPARE_MS"] = "1500"
    os.environ["TSR_COORD_SLOW_FOLD_DIR_MS"] = "1000"
    cl = eh.HACluster(groups=2, replicas=1, coords=2, etcd_members=1, dims=D,
                      config={"nlist": 16, "pq_m": 4})
    del os.environ["TSR_SHARD_SLOW_PREPARE_MS"], os.environ["TSR_COORD_SLOW_FOLD_DIR_MS"]
    try:
        model = Model()
        b0 = ch.write_batch(os.path.join(cl.root, "b0"), [ch.dp_json("x%05d" % i, x[i])
                                                          for i in range(N)])
        lead = cl.leader(15)
        op = lead.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        for i in range(N):
            model.upsert("x%05d" % i, x[i])
        fol = cl.follower(lead)
        cl.wait_version(1, 20)

        new = [("s%04d" % i, (rng.normal(size=D) * 3).astype("float32")) for i in range(200)]
        rep = [("x%05d" % i, (rng.normal(size=D) * 3).astype("float32"))
               for i in range(0, 200, 10)]
        for k in range(0, len(new), 50):
            upsert(lead.stub, tp, new[k:k + 50])
        upsert(lead.stub, tp, rep)
        rem = ["x%05d" % i for i in range(5, 205, 10)]
        remove(lead.stub, tp, rem)
        for d, v in new + rep:
            model.upsert(d, v)
        for d in rem:
            model.remove(d)

        writes = [("upsert", "w%04d" % i, (rng.normal(size=D) * 3).astype("float32"))
                  for i in range(12)]
        writes[3:3] = [("upsert", "s0001", (rng.normal(size=D) * 3).astype("float32")),
                       ("remove", "s0002"), ("remove", "x00300")]
        op, in_prepare = fold_with_writes(cl, lead, tp, model, "fold 1", writes)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, (op, cl.logs()[-4000:])
        assert in_prepare >= 1, "no write was acknowledged while the fold prepared:\n" + \
            cl.logs()[-4000:]

        rec = cl.etcd.etcdctl("get", "--print-value-only", cl.prefix + "/version")[1]
        line = [ln for ln in rec.split("\n") if ln.startswith("carry ")]
        assert line, "version 2's record names no carried rounds:\n" + rec
        _, frm, after, upto = line[0].split()
        assert int(frm) == 1 and int(after) < int(upto), line
        assert "\ndirsum " in rec and "file directory" not in rec, rec
        assert not [k for k in cl.etcd.keys(cl.prefix + "/") if "/directory/" in k]
        assert stream_keys(cl, 1), "version 1's mirrored rounds are gone while 2 serves"
        print("etcd: version 2 carries %s (rounds %d..%d of version 1), no directory blob"
              % (line[0], int(after) + 1, int(upto)))

        probe = ["s0000", "s0001", "x00000", "x00010"] + ["w%04d" % i for i in range(12)]
        lag = cl.wait_version(2, 30)
        n = check("leader", lead, tp, model, probe)
        check("follower", fol, tp, model, probe)
        assert "carried onto the shards' listing" in fol.proc.text(), fol.proc.text()[-3000:]
        print("follower on version 2 after %.2f s: %d ids, every one bit for bit, directory "
              "rebuilt from the shards and the carried rounds" % (lag, n))

        lead.kill()
        lead2 = cl.leader(cl.ttl + 10, exclude=(lead,))
        assert lead2 is fol, lead2.target
        check("new leader", fol, tp, model, probe)
        third = eh.Coord(cl, 2)
        cl.coords.append(third)
        third.start()
        cl.wait_version(2, 30)
        check("empty --data", third, tp, model, probe)
        assert "carried onto the shards' listing" in third.proc.text()

        upsert(fol.stub, tp, [("t0000", x[0] + 7)])
        model.upsert("t0000", x[0] + 7)
        writes = [("upsert", "u%04d" % i, (rng.normal(size=D) * 3).astype("float32"))
                  for i in range(8)] + [("remove", "w0000"), ("remove", "s0003")]
        op, _ = fold_with_writes(cl, fol, tp, model, "fold 2", writes)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 3, (op, cl.logs()[-4000:])
        cl.wait_version(3, 30)
        probe += ["t0000"] + ["u%04d" % i for i in range(8)]
        probe.remove("w0000")
        check("new leader, v3", fol, tp, model, probe)
        check("third, v3", third, tp, model, probe)
        assert not stream_keys(cl, 1), "version 1's mirrored rounds still in etcd at v3"
        print("kill -9 of the leader: the follower leads with the same %d ids; a coordinator "
              "with an empty --data answers the same; a second fold (v3) on the new leader "
              "followed; version 1's rounds dropped from etcd" % n)
    finally:
        cl.stop()
    print("test_ha_fold: OK")


if __name__ == "__main__":
    main()
