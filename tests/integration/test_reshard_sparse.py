"""Sparse-only and hybrid queries across resharding (issue 41, item 1; docs/resharding.md
"Sparse-only datapoints"), with one coordinator and with --etcd, each through a restart.

Before: after `tessera shards remove` every sparse-only and hybrid query failed for good
(`UNAVAILABLE: shard N (...) failed: UNAVAILABLE: shard group removed`): the coordinator
sent a query's sparse part to every group of the version, the removed one included.

Index: dense-only, hybrid (dense + sparse) and sparse-only datapoints (sparse-only ones are
placed by the hash of their id, not by a list). Every check compares against a ground truth
computed here from the vectors: dense = exact squared L2 over every datapoint with a dense
vector (the queries probe every list and re-rank more candidates than a group holds, so the
answer is exact), sparse = exact dot products over every datapoint with a sparse vector,
hybrid = the RRF of both exact lists (docs/query-semantics.md: depth max(k, rrf_depth),
competition ranks, k0 60; random values, so no ties). Checked on every coordinator:
- after the first update; after `tessera shards add` (one group more: the hash placement
  changes, the sparse-only ids whose group changed are moved); after `tessera shards
  remove --group 0` with the removed group's process stopped; after streamed upserts of
  new sparse-only and hybrid datapoints and a fold; after a restart of every coordinator;
- every datapoint (sparse-only ones included) readable by id through the coordinator,
  on exactly one live group (Shard.Read of every label: no loss, no duplicate);
- GetIndexStats shards_count counts the live groups only, and `tessera stats` lists no
  removed group as a shard (issue 41, item 4: it counted it in "shards N" and printed a
  `gone` row, after every restart too).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D, NLIST, VOCAB, K, ALPHA, K0, DEPTH = 8, 8, 120, 10, 0.6, 60, 100
ND, NH, NS = 300, 700, 900      # dense-only, hybrid, sparse-only datapoints
TTL = 4


class Data:
    """The datapoints (id -> dense vector or None, sparse dict or None) and the queries."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.dense, self.sparse, self.recs = {}, {}, []
        self.add("d", ND, True, False)
        self.add("h", NH, True, True)
        self.add("s", NS, False, True)
        r = self.rng
        self.qd = [r.normal(size=D).astype("float32") * 3 for _ in range(6)]
        self.qs = [self.rand_sparse(3) for _ in range(6)]

    def rand_sparse(self, n):
        dims = sorted(int(v) for v in self.rng.choice(VOCAB, n, replace=False))
        return dims, [float(v) for v in self.rng.uniform(0.1, 1.0, n)]

    def add(self, prefix, n, dense, sparse, start=0):
        out = []
        for i in range(start, start + n):
            did = "%s%05d" % (prefix, i)
            v = self.rng.normal(size=D).astype("float32") * 3 if dense else None
            sp = self.rand_sparse(5) if sparse else None
            self.dense[did] = v
            self.sparse[did] = dict(zip(*sp)) if sp else None
            out.append((did, v, sp))
        self.recs += out
        return out

    def dense_list(self, q, depth):
        ids = [d for d, v in self.dense.items() if v is not None]
        x = np.stack([self.dense[d] for d in ids])
        dist = ((x - q) ** 2).sum(axis=1)
        o = np.argsort(dist, kind="stable")[:depth]
        return [(ids[i], float(dist[i])) for i in o]

    def sparse_list(self, q, depth):
        qd = dict(zip(*q))
        sc = [(d, sum(w * qd.get(k, 0.0) for k, w in s.items()))
              for d, s in self.sparse.items() if s is not None]
        sc = [p for p in sc if p[1] > 0]
        sc.sort(key=lambda p: -p[1])
        return sc[:depth]

    def hybrid(self, qv, qs):
        dl, sl = self.dense_list(qv, DEPTH), self.sparse_list(qs, DEPTH)
        score, drank = {}, {}
        for r, (d, _) in enumerate(dl):
            score[d] = ALPHA / (K0 + r + 1)
            drank[d] = r
        for r, (d, _) in enumerate(sl):
            score[d] = score.get(d, 0.0) + (1 - ALPHA) / (K0 + r + 1)
        order = sorted(score, key=lambda d: (-score[d], drank.get(d, 10 ** 6)))
        return order[:K]


def requests(tp, data):
    """(name, request, expected ids, expected distances (dense) or sparse scores or None)."""
    out = []
    for i, q in enumerate(data.qd):
        want = data.dense_list(q, K)
        out.append(("dense %d" % i, ch.query(tp, q, K, cand=5000, fraction=1.0),
                    [d for d, _ in want], ("distance", [v for _, v in want])))
    for i, q in enumerate(data.qs):
        want = data.sparse_list(q, K)
        out.append(("sparse %d" % i, ch.query(tp, None, K, sparse=q),
                    [d for d, _ in want], ("sparse_distance", [v for _, v in want])))
    for i, (qv, qs) in enumerate(zip(data.qd, data.qs)):
        out.append(("hybrid %d" % i, ch.query(tp, qv, K, sparse=qs, alpha=ALPHA, cand=5000,
                                              fraction=1.0),
                    data.hybrid(qv, qs), None))
    return out


def check_answers(coords, tp, data, when):
    reqs = requests(tp, data)
    for c in coords:
        for name, q, want, dist in reqs:
            try:
                r = c.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
            except Exception as e:  # noqa: BLE001 - the failure is the finding
                raise AssertionError("%s: %s query failed on %s: %s"
                                     % (when, name, c.target, str(e)[:400]))
            nb = r.nearest_neighbors[0].neighbors
            got = [n.datapoint.datapoint_id for n in nb]
            assert got == want, "%s: %s query on %s:\n got  %s\n want %s" % (
                when, name, c.target, got, want)
            if dist:
                field, vals = dist
                g = [getattr(n, field) for n in nb]
                assert np.allclose(g, vals, rtol=1e-3, atol=1e-3), (when, name, g, vals)
    print("  %s: %d dense, %d sparse, %d hybrid queries equal to the ground truth on %d "
          "coordinator(s)" % (when, len(data.qd), len(data.qs), len(data.qd), len(coords)))


def fnv_group(did, ngroups, removed):
    """The group of a sparse-only id (coordinator/update_plan.c tsr__group_of): FNV-1a 64
    of the id with the routing basis (common/core/hash.h) modulo the group count, then the
    next group not removed."""
    h = 1469598103934665603
    for b in did.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    g = h % ngroups
    while g in removed:
        g = (g + 1) % ngroups
    return g


def check_placement(coord, tp, data, live, ngroups, removed, before=None):
    """Every datapoint readable by id, its sparse vector as written; every label on exactly
    one live group (live: group number -> shard); every sparse-only id on the group of its
    hash. Returns {sparse-only id: group}; prints the share whose group changed since
    `before`."""
    ids = sorted(data.dense)
    for k in range(0, len(ids), 1000):
        part = ids[k:k + 1000]
        r = coord.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=part), timeout=30)
        got = {d.datapoint_id: d for d in r.datapoints}
        missing = [d for d in part if d not in got]
        assert not missing, "datapoints lost: %d, e.g. %s" % (len(missing), missing[:5])
        for did in part:
            sp = data.sparse[did]
            if sp is not None:
                d = got[did].sparse_embedding
                assert dict(zip(d.dimensions, d.values)) == as_f32(sp), did
    spb = sh.stubs()[0]
    nlabels = len(ids) + 1000
    seen = np.zeros(nlabels, dtype=np.int64)
    where = {}
    for g, s in live.items():
        r = s.stub.Read(spb.ShardReadRequest(version=0, labels=list(range(nlabels))),
                        timeout=30)
        for lab, d in enumerate(r.datapoints):
            seen[lab] += d.found
            if d.found and d.list < 0:
                where[d.datapoint.datapoint_id] = g
    assert (seen <= 1).all(), "labels on two groups: %s" % np.nonzero(seen > 1)[0][:10]
    assert int(seen.sum()) == len(ids), "labels held %d, datapoints %d" % (seen.sum(), len(ids))
    sp_only = [d for d in ids if data.dense[d] is None]
    assert sorted(where) == sp_only, "sparse-only ids held: %d of %d" % (len(where),
                                                                          len(sp_only))
    wrong = [d for d in sp_only if where[d] != fnv_group(d, ngroups, removed)]
    assert not wrong, "sparse-only ids off their hash group: %s" % wrong[:5]
    if before:
        common = [d for d in sp_only if d in before]
        n = sum(1 for d in common if before[d] != where[d])
        per = [sum(1 for d in sp_only if where[d] == g) for g in sorted(live)]
        print("  sparse-only ids whose group changed: %d of %d (%.0f%%); per live group %s"
              % (n, len(common), 100.0 * n / len(common), per))
    return where


def as_f32(d):
    """d's values as the float32 a shard stores."""
    return {k: float(np.float32(v)) for k, v in d.items()}


def tessera(*args, timeout=300):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def check_stats(coord, tp, nlive, removed):
    st = coord.stats()
    assert st.shards_count == nlive, "shards_count %d, live groups %d" % (st.shards_count, nlive)
    assert [k for k, s in enumerate(st.shards) if s.removed] == removed, st
    rc, out, err = tessera("stats", "--target", coord.target)
    assert rc == 0, (out, err)
    assert "shards %d\n" % nlive in out and "gone" not in out, out
    rows = [ln for ln in out.splitlines() if ln.startswith("  shard ")]
    assert len(rows) == nlive, out
    if removed:
        assert "removed groups %s\n" % " ".join(map(str, removed)) in out, out
    rc, out, err = tessera("stats", "--target", coord.target, "--json")
    js = json.loads(out)
    assert len(js["shards"]) == nlive and js["removed_groups"] == removed, js
    assert all(not s.get("removed") for s in js["shards"]), js


def upserts(tp, data):
    """New sparse-only and hybrid datapoints, as UpsertDatapoints messages."""
    dps = []
    for did, v, sp in data.add("s", 60, False, True, start=NS) + \
            data.add("h", 40, True, True, start=NH):
        p = tp.IndexDatapoint(datapoint_id=did)
        if v is not None:
            p.feature_vector.extend([float(a) for a in v])
        p.sparse_embedding.dimensions.extend(sp[0])
        p.sparse_embedding.values.extend(sp[1])
        dps.append(p)
    return dps


def batch(data, root):
    return ch.write_batch(os.path.join(root, "b1"), [ch.dp_json(d, v, sparse=sp)
                                                     for d, v, sp in data.recs])


CONFIG = {"nlist": NLIST, "pq_m": 4, "nprobe": NLIST}


def run_single():
    print("one coordinator:")
    tp = ch.stubs()[0]
    data = Data(41)
    root = sh.tmpdir("tsr-reshard-sparse-")
    b1 = batch(data, root)
    cl = ch.Cluster(3, D, CONFIG)
    extra = []
    try:
        op = cl.update(b1)
        assert op.state == tp.Operation.SUCCEEDED, op
        live = list(cl.shards)
        check_answers([cl], tp, data, "version 1, 3 groups")
        where = check_placement(cl, tp, data, dict(enumerate(live)), 3, set())
        s3 = sh.Shard(os.path.join(cl.root, "shard-new-3"))
        extra.append(s3)
        rc, out, err = tessera("shards", "add", "--target", cl.target, "--group", s3.target)
        assert rc == 0 and "succeeded: version 2" in out, (rc, out, err)
        live.append(s3)
        moved_line(cl.coord.text(), "add")
        check_answers([cl], tp, data, "after shards add (4 groups)")
        where = check_placement(cl, tp, data, dict(enumerate(live)), 4, set(), where)
        check_stats(cl, tp, 4, [])
        rc, out, err = tessera("shards", "remove", "--target", cl.target, "--group", "0")
        assert rc == 0 and "succeeded: version 3" in out, (rc, out, err)
        gone = live.pop(0)
        moved_line(cl.coord.text(), "remove")
        time.sleep(cl_deadline_s(cl) + 0.5)  # queries planned before may still call it
        gone.stop()
        check_answers([cl], tp, data, "after shards remove --group 0 (its shard stopped)")
        check_placement(cl, tp, data, dict(enumerate(live, 1)), 4, {0}, where)
        check_stats(cl, tp, 3, [0])
        cl.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=upserts(tp, data)),
                                 timeout=30)
        check_answers([cl], tp, data, "after streamed upserts")
        op = cl.fold()
        assert op.state == tp.Operation.SUCCEEDED, op
        check_answers([cl], tp, data, "after a fold")
        check_placement(cl, tp, data, dict(enumerate(live, 1)), 4, {0})
        cl.stop_coord()
        cl.start()
        check_answers([cl], tp, data, "after a restart")
        check_stats(cl, tp, 3, [0])
    finally:
        try:
            cl.stop()
        finally:
            for s in extra:
                s.stop()


def moved_line(log, what):
    """Prints the coordinator's count of the datapoints the last move re-homed (for
    docs/resharding.md "Sparse-only datapoints")."""
    lines = [ln for ln in log.splitlines() if "change group" in ln]
    print("  %s: %s" % (what, lines[-1].split("reshard ")[-1] if lines else "(no line)"))


def cl_deadline_s(cl):
    with open(cl.config) as f:
        return json.load(f).get("search_deadline_ms", 2000) / 1000.0


def run_etcd():
    eh.skip_without_etcd()
    print("with --etcd (2 coordinators):")
    tp = ch.stubs()[0]
    data = Data(42)
    root = sh.tmpdir("tsr-reshard-sparse-ha-")
    b1 = batch(data, root)
    cl = eh.HACluster(groups=2, replicas=1, coords=2, etcd_members=1, dims=D, ttl=TTL,
                      config=CONFIG)
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", b1)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        cl.wait_version(1)
        live = [g[0] for g in cl.groups]
        check_answers(cl.coords, tp, data, "version 1, 2 groups")
        where = check_placement(cl.coords[0], tp, data, dict(enumerate(live)), 2, set())
        s2 = sh.Shard(os.path.join(cl.root, "shard-new-2"), bin_dir=cl.bin)
        cl.shards.append(s2)
        rc, out, err = tessera("shards", "add", "--target", cl.targets, "--group", s2.target)
        assert rc == 0 and "succeeded: version 2" in out, (rc, out, err, cl.logs())
        cl.wait_version(2, timeout=30)
        live.append(s2)
        check_answers(cl.coords, tp, data, "after shards add (3 groups)")
        where = check_placement(cl.coords[0], tp, data, dict(enumerate(live)), 3, set(), where)
        rc, out, err = tessera("shards", "remove", "--target", cl.targets, "--group", "0")
        assert rc == 0 and "succeeded: version 3" in out, (rc, out, err, cl.logs())
        cl.wait_version(3, timeout=30)
        gone = live.pop(0)
        time.sleep(cl_deadline_s(cl) + 0.5)
        gone.stop()
        check_answers(cl.coords, tp, data, "after shards remove --group 0 (its shard stopped)")
        check_placement(cl.coords[1], tp, data, dict(enumerate(live, 1)), 3, {0}, where)
        for c in cl.coords:
            check_stats(c, tp, 2, [0])
        leader = cl.leader(timeout=TTL + 15)
        leader.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=upserts(tp, data)),
                                     timeout=30)
        check_answers([leader], tp, data, "after streamed upserts (leader)")
        op = leader.fold()
        assert op.state == tp.Operation.SUCCEEDED, op
        cl.wait_version(op.version, timeout=30)
        check_answers(cl.coords, tp, data, "after a fold")
        for c in cl.coords:
            c.stop()
        for c in cl.coords:
            c.start()
        cl.wait_version(op.version, timeout=30)
        cl.leader(timeout=TTL + 15)
        check_answers(cl.coords, tp, data, "after a restart of both coordinators")
        check_placement(cl.coords[0], tp, data, dict(enumerate(live, 1)), 3, {0})
        for c in cl.coords:
            check_stats(c, tp, 2, [0])
    finally:
        cl.stop()


def main():
    run_single()
    run_etcd()
    print("test_reshard_sparse: OK")


if __name__ == "__main__":
    main()
