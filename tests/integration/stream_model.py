"""Shared pieces of the streamed-write tests (not a test itself): docs/streaming.md.

- StreamCluster: a coordinator in front of shard groups given as a replica count per group
  (e.g. [2, 1]: group 0 = two tessera-shard replicas, group 1 = one), on a fixed coordinator
  port so that a restart keeps the address; kill -9 / restart of a replica or of the
  coordinator.
- Rec / rec_of(): a datapoint as a plain, comparable value (id, float32 vector bytes,
  sorted restricts, numeric, crowding tag) — what an upsert sent and what
  ReadIndexDatapoints returns are compared through it, exactly (the vector bit for bit).
- Model: the expected contents, an id -> Rec map with Vertex's upsert / all_restricts /
  remove semantics.
- History + check_history(): the recorded operations of a run (kind, payload, start, end,
  outcome OK / ERR(code) / UNKNOWN) and the checker of test_stream_crash.py: per id the
  writes are sequential (one writer per id), so the final value of an id must be the value
  of its last acknowledged write or of one unacknowledged write after it; an
  unacknowledged request is all or nothing over the ids no later write touched; nothing is
  duplicated (ReadIndexDatapoints and a full-probe query give each id at most once, and the
  index's count equals the resolved model's).
- read_state(), full_probe(): the cluster's view of a set of ids.
"""
import json
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402


def grpc_mod():
    import grpc
    return grpc


# ---------------------------------------------------------------------------------------
# Datapoints as values

class Rec(tuple):
    """(id, vector bytes (float32), restricts, numeric, tag): hashable, exact."""
    __slots__ = ()

    def __new__(cls, did, vec, restricts=(), numeric=(), tag=""):
        v = np.asarray(vec, dtype="float32").tobytes()
        r = tuple(sorted((ns, tuple(sorted(a)), tuple(sorted(d))) for ns, a, d in restricts))
        n = tuple(sorted((ns, kind, float(val)) for ns, kind, val in numeric))
        return tuple.__new__(cls, (did, v, r, n, tag or ""))

    @property
    def id(self):
        return self[0]

    @property
    def vec(self):
        return np.frombuffer(self[1], dtype="float32")

    def with_restricts(self, restricts, numeric):
        return Rec(self[0], self.vec, restricts, numeric, self[4])

    def short(self):
        return "%s(vec[0]=%.4f restricts=%s numeric=%s tag=%r)" % (
            self[0], self.vec[0] if len(self.vec) else float("nan"), self[2], self[3], self[4])


def rec_of(dp):
    """A Rec from a tessera.v1.IndexDatapoint (as ReadIndexDatapoints returns it)."""
    num = []
    for n in dp.numeric_restricts:
        kind = n.WhichOneof("Value")
        if kind is None:
            continue
        num.append((n.namespace, kind[len("value_"):], getattr(n, kind)))
    return Rec(dp.datapoint_id, list(dp.feature_vector),
               [(r.namespace, list(r.allow_list), list(r.deny_list)) for r in dp.restricts],
               num, dp.crowding_tag.crowding_attribute)


def to_pb(tp, rec, restricts_only=False):
    """A tessera.v1.IndexDatapoint for an upsert of rec (restricts_only: id + restricts)."""
    dp = tp.IndexDatapoint(datapoint_id=rec[0])
    if not restricts_only:
        dp.feature_vector.extend(rec.vec.tolist())
        if rec[4]:
            dp.crowding_tag.crowding_attribute = rec[4]
    for ns, a, d in rec[2]:
        dp.restricts.add(namespace=ns, allow_list=list(a), deny_list=list(d))
    for ns, kind, val in rec[3]:
        n = dp.numeric_restricts.add(namespace=ns)
        setattr(n, "value_" + kind, int(val) if kind == "int" else val)
    return dp


def to_json(rec):
    """The batch JSON record (docs/batch-format.md) of rec."""
    return ch.dp_json(rec[0], rec.vec, restricts=[(ns, list(a), list(d)) for ns, a, d in rec[2]],
                      numeric=[(ns, kind, int(v) if kind == "int" else v)
                               for ns, kind, v in rec[3]],
                      tag=rec[4] or None)


def random_rec(rng, did, d, centers=None):
    """A datapoint with a random vector (near a random centre when given), 0-2 token
    restricts, 0-1 numeric restrict, maybe a crowding tag. Values exact in float32."""
    if centers is not None:
        v = centers[rng.integers(0, len(centers))] + rng.normal(size=d)
    else:
        v = rng.normal(size=d) * 3
    v = v.astype("float32")
    restricts = []
    for ns in ("color", "shape")[:int(rng.integers(0, 3))]:
        restricts.append((ns, ["t%d" % rng.integers(0, 5)],
                          ["n%d" % rng.integers(0, 3)] if rng.random() < 0.3 else []))
    numeric = []
    if rng.random() < 0.5:
        numeric.append(("price", "int", int(rng.integers(-1000, 1000))))
    tag = "g%d" % rng.integers(0, 20) if rng.random() < 0.3 else ""
    return Rec(did, v, restricts, numeric, tag)


def random_restricts(rng):
    r = random_rec(rng, "x", 1)
    return list(r[2]) or [("color", ("t9",), ())], list(r[3])


# ---------------------------------------------------------------------------------------
# The model

class Model:
    """Expected contents: id -> Rec."""

    def __init__(self, recs=()):
        self.m = {r.id: r for r in recs}

    def copy(self):
        c = Model()
        c.m = dict(self.m)
        return c

    def upsert(self, recs, restricts_only=False):
        for r in recs:
            if restricts_only:
                assert r.id in self.m, r.id
                self.m[r.id] = self.m[r.id].with_restricts(r[2], r[3])
            else:
                self.m[r.id] = r

    def remove(self, ids):
        for i in ids:
            self.m.pop(i, None)

    def apply(self, op):
        if op.kind == "upsert":
            self.upsert(op.recs, op.restricts_only)
        elif op.kind == "remove":
            self.remove(op.ids)
        elif op.kind == "batch":
            if op.overwrite:
                self.m = {}
            self.remove(op.ids)
            self.upsert(op.recs)
        else:
            raise ValueError(op.kind)


# ---------------------------------------------------------------------------------------
# Operations and their history

OK, ERR, UNKNOWN = "OK", "ERR", "UNKNOWN"
# Codes after which the request surely did nothing (validated before anything is written).
DEFINITE_ERRORS = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                   "NOT_FOUND", "UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED")


class Op:
    def __init__(self, kind, recs=(), ids=(), restricts_only=False, overwrite=False):
        self.kind = kind
        self.recs = list(recs)
        self.ids = list(ids)
        self.restricts_only = restricts_only
        self.overwrite = overwrite
        self.start = self.end = None
        self.outcome = None
        self.code = ""
        self.resp = None
        self.writer = 0

    def touched(self):
        return [r.id for r in self.recs] + list(self.ids)

    @property
    def seq(self):
        return getattr(self.resp, "stream_seq", 0) if self.resp is not None else 0

    @property
    def version(self):
        return getattr(self.resp, "version", 0) if self.resp is not None else 0

    def __repr__(self):
        return "%s#%d[%s %s..%s %s%s seq=%s v=%s]" % (
            self.kind, id(self) % 10000, self.outcome, "%.3f" % (self.start or 0),
            "%.3f" % (self.end or 0), len(self.recs) + len(self.ids),
            " restricts" if self.restricts_only else "", self.seq, self.version)


class History:
    def __init__(self):
        self.ops = []

    def add(self, op):
        self.ops.append(op)

    def acked(self):
        return [o for o in self.ops if o.outcome == OK]

    def dump(self, path):
        with open(path, "w") as f:
            for o in self.ops:
                f.write(json.dumps({"kind": o.kind, "outcome": o.outcome, "code": o.code,
                                    "start": o.start, "end": o.end, "seq": o.seq,
                                    "version": o.version, "ids": o.touched()[:5],
                                    "n": len(o.touched())}) + "\n")


def call(stub, op, tp, timeout=30, metadata=None):
    """Runs op (upsert/remove) on a tessera.v1.VectorSearch stub; fills start, end, outcome.
    OK: acknowledged. ERR: a definite error (nothing written). UNKNOWN: anything else
    (UNAVAILABLE, DEADLINE_EXCEEDED, a dropped connection...): the write may or may not be
    applied."""
    grpc = grpc_mod()
    op.start = time.time()
    try:
        if op.kind == "upsert":
            rq = tp.UpsertDatapointsRequest(
                datapoints=[to_pb(tp, r, op.restricts_only) for r in op.recs])
            if op.restricts_only:
                rq.update_mask.paths.append("all_restricts")
            op.resp = stub.UpsertDatapoints(rq, timeout=timeout, metadata=metadata)
        else:
            op.resp = stub.RemoveDatapoints(tp.RemoveDatapointsRequest(datapoint_ids=op.ids),
                                            timeout=timeout, metadata=metadata)
        op.outcome = OK
    except grpc.RpcError as e:
        op.code = "%s: %s" % (e.code().name, (e.details() or "")[:300])
        op.outcome = ERR if e.code().name in DEFINITE_ERRORS else UNKNOWN
    op.end = time.time()
    return op


# ---------------------------------------------------------------------------------------
# The cluster's view

def read_state(stub, tp, ids, chunk=1000):
    """id -> Rec for the ids ReadIndexDatapoints finds; raises on an id returned twice or
    one not asked for."""
    out = {}
    ids = sorted(set(ids))
    for k in range(0, len(ids), chunk):
        part = ids[k:k + chunk]
        rd = stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=part), timeout=60)
        asked = set(part)
        for dp in rd.datapoints:
            assert dp.datapoint_id in asked, "ReadIndexDatapoints returned %r, not asked for" \
                % dp.datapoint_id
            assert dp.datapoint_id not in out, "ReadIndexDatapoints returned %r twice" \
                % dp.datapoint_id
            out[dp.datapoint_id] = rec_of(dp)
    return out


def full_probe(stub, tp, vecs, k=1, chunk=200, cand=None):
    """FindNeighbors with every list probed (fraction 1.0): per vector the list of
    (id, distance)."""
    out = []
    for s in range(0, len(vecs), chunk):
        rq = tp.FindNeighborsRequest(queries=[ch.query(tp, v, k, fraction=1.0, cand=cand)
                                              for v in vecs[s:s + chunk]])
        r = stub.FindNeighbors(rq, timeout=120)
        for nn in r.nearest_neighbors:
            out.append([(n.datapoint.datapoint_id, n.distance) for n in nn.neighbors])
    return out


def diff_states(want, got, limit=8):
    """Human-readable differences between two id -> Rec maps (empty when equal)."""
    out = []
    for i in sorted(set(want) | set(got)):
        w, g = want.get(i), got.get(i)
        if w != g:
            out.append("%s: want %s, got %s" % (i, w.short() if w else "absent",
                                                 g.short() if g else "absent"))
            if len(out) >= limit:
                out.append("...")
                break
    return out


def check_no_duplicates(stub, tp, model_recs, sample, k=10):
    """A full-probe query (k) with each sampled record's vector: no id twice in one answer."""
    vecs = [r.vec for r in sample]
    for r, ans in zip(sample, full_probe(stub, tp, vecs, k)):
        ids = [i for i, _ in ans]
        assert len(ids) == len(set(ids)), "id returned twice for the vector of %s: %s" % \
            (r.id, ids)


def check_history(hist, initial, got, all_ids):
    """The checker of a recorded history (see the module comment); raises AssertionError
    naming the violations. Returns (resolved Model, notes)."""
    resolved, notes, hard, soft = classify_history(hist, initial, got, all_ids)
    errors = hard + soft
    if errors:
        raise AssertionError("history check failed (%d):\n  %s" % (len(errors),
                                                                     "\n  ".join(errors[:15])))
    return resolved, notes


def classify_history(hist, initial, got, all_ids):
    """hist: History whose writes to any one id are sequential (each op's ids belong to one
    writer); initial: Model before the first op; got: id -> Rec the cluster holds for
    all_ids. Returns (resolved Model, notes, hard, soft): hard = ids whose only possible
    value is the acknowledged one and that do not hold it (an acknowledged write lost or a
    removed id back); soft = ids with unacknowledged writes after the last acknowledged one
    that hold none of the possible values, and unacknowledged requests half applied (these
    can be transient while a resend of an unknown-outcome round is pending)."""
    by_id = {}
    for o in hist.ops:
        if o.outcome == ERR or o.kind not in ("upsert", "remove"):
            continue
        for i in set(o.touched()):
            by_id.setdefault(i, []).append(o)
    hard, soft = [], []
    resolved = Model()
    applied_unknown = {}   # unacknowledged op -> ids (touched by no later op) where it shows
    for i in sorted(all_ids):
        ops = sorted(by_id.get(i, []), key=lambda o: o.start)
        last_ok = max([k for k, o in enumerate(ops) if o.outcome == OK], default=-1)
        # the acknowledged value, then any later unacknowledged write on top of any
        # earlier candidate (an all_restricts update applies to the value below it)
        state = initial.m.get(i)
        for o in ops[:last_ok + 1]:
            state = _value_after(o, i, state)
        cand = [(None, state)]
        for o in ops[last_ok + 1:]:
            seen = set((id(c), s) for c, s in cand)
            for _, s in list(cand):
                v = _value_after(o, i, s)
                if (id(o), v) not in seen:
                    seen.add((id(o), v))
                    cand.append((o, v))
        g = got.get(i)
        match = [o for o, s in cand if s == g]
        if not match:
            msg = "%s: holds %s; possible: %s (ops on it: %s)" % (
                i, g.short() if g else "absent",
                sorted(set(s.short() if s else "absent" for _, s in cand)), ops)
            (soft if len(cand) > 1 else hard).append(msg)
            continue
        if g is not None:
            resolved.m[i] = g
        if ops and ops[-1].outcome == UNKNOWN:
            u = ops[-1]
            shows = any(o is u for o in match)
            alt = any(o is not u for o in match)
            applied_unknown.setdefault(u, {"yes": [], "no": [], "either": []})[
                "either" if shows and alt else ("yes" if shows else "no")].append(i)
    for u, st in applied_unknown.items():
        if st["yes"] and st["no"]:
            soft.append("unacknowledged %r half applied: shows on %s, not on %s" %
                        (u, st["yes"][:5], st["no"][:5]))
    notes = {"unknown_ops": sum(1 for o in hist.ops if o.outcome == UNKNOWN),
             "unknown_applied": sum(1 for st in applied_unknown.values() if st["yes"]),
             "unknown_absent": sum(1 for st in applied_unknown.values() if st["no"])}
    return resolved, notes, hard, soft


def _value_after(op, did, state):
    if op.kind == "remove":
        return None
    for r in reversed(op.recs):  # the later copy wins
        if r.id == did:
            if op.restricts_only:
                return state.with_restricts(r[2], r[3]) if state is not None else state
            return r
    return state


# ---------------------------------------------------------------------------------------
# A cluster with replica groups and a fixed coordinator port

class StreamCluster(ch.Cluster):
    """groups: replicas per group, e.g. [2, 1]. self.groups[g] = list of sh.Shard."""

    def __init__(self, groups, dims, config=None, coord_extra=(), env=None):
        self.group_sizes = list(groups)
        n = sum(groups)
        self.port = ch.free_port()
        self.mport = ch.free_port()
        self.coord_extra = list(coord_extra)
        self.coord_env = env
        self.dims = dims
        super().__init__(n, dims, config, env=env, coord_extra=coord_extra)
        self.stop_coord()
        self.groups = []
        k = 0
        for g in groups:
            self.groups.append(self.shards[k:k + g])
            k += g
        with open(self.config) as f:
            c = json.load(f)
        c["shards"] = [[s.target for s in grp] if len(grp) > 1 else grp[0].target
                       for grp in self.groups]
        with open(self.config, "w") as f:
            json.dump(c, f)
        self.restart_coord()

    def restart_coord(self, env=None, timeout=30):
        t0 = time.time()
        while True:
            try:
                self.start(env or self.coord_env, listen_port=self.port,
                           extra_args=self.coord_extra +
                           ["--metrics-listen", "127.0.0.1:%d" % self.mport])
                return
            except RuntimeError:
                if time.time() - t0 > timeout:
                    raise
                time.sleep(0.3)

    def kill_coord(self):
        return self.stop_coord(signal.SIGKILL)

    def kill_shard(self, g, r):
        s = self.groups[g][r]
        s.kill()
        return s

    def restart_shard(self, g, r):
        old = self.groups[g][r]
        new = sh.restart(old)
        self.groups[g][r] = new
        self.shards[self.shards.index(old)] = new
        return new

    def shard_stats(self):
        _, _, sp, _ = ch.stubs()
        out = []
        for grp in self.groups:
            row = []
            for s in grp:
                try:
                    row.append(s.stub.Stats(sp.ShardStatsRequest(), timeout=10))
                except Exception as e:  # noqa: a dead replica
                    row.append(e)
            out.append(row)
        return out

    def wait_replicas_agree(self, timeout=60):
        """Until the replicas of each group report the same version and stream seq."""
        t0 = time.time()
        while True:
            st = self.shard_stats()
            ok = all(not isinstance(x, Exception) for row in st for x in row) and all(
                len(set((x.current_version, x.stream_seq, x.vectors_count) for x in row)) == 1
                for row in st)
            if ok:
                return time.time() - t0
            if time.time() - t0 > timeout:
                raise AssertionError("replicas do not agree after %ds: %s" % (timeout, [
                    [(x.current_version, x.stream_seq, x.vectors_count)
                     if not isinstance(x, Exception) else "down" for x in row] for row in st]))
            time.sleep(0.2)

    def metrics(self):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.mport,
                                    timeout=10) as r:
            return r.read().decode()

    def replica_view(self):
        """address -> (up, lagging) as the coordinator's /metrics shows them."""
        import re
        out = {}
        for line in self.metrics().splitlines():
            m = re.match(r'^tessera_shard_(up|lagging)\{.*address="([^"]*)".*\} (\S+)$', line)
            if m:
                out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
        return out

    def wait_coord_sees_all(self, timeout=30):
        """Until the coordinator counts every replica up and none lagging."""
        t0 = time.time()
        while True:
            v = self.replica_view()
            if len(v) == len(self.shards) and all(x.get("up") == 1 and not x.get("lagging")
                                                  for x in v.values()):
                return time.time() - t0
            if time.time() - t0 > timeout:
                raise AssertionError("the coordinator does not see every replica up and "
                                     "caught up after %ds: %s\n%s" % (
                                         timeout, v, self.coord.text()[-3000:]))
            time.sleep(0.1)

    def wait_ready(self, tp, timeout=60):
        """Until a full-probe query answers (every group serves)."""
        grpc = grpc_mod()
        t0 = time.time()
        while True:
            try:
                self.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[
                    ch.query(tp, [0.0] * self.dims, 1, fraction=1.0)]), timeout=10)
                return time.time() - t0
            except grpc.RpcError as e:
                if time.time() - t0 > timeout:
                    raise AssertionError("cluster not serving after %ds: %s\n%s" % (
                        timeout, e, self.coord.text()[-3000:]))
                time.sleep(0.2)


# ---------------------------------------------------------------------------------------
# Folded slices in stock Faiss

def faiss_slices_check(cl, template, xq, nprobe, nlist, k):
    """Every shard's current vNNNNNN/slice.faiss opened with faiss.read_index; for each query
    Faiss's search_preassigned with the coordinator's lists and coarse distances (those the
    shard owns) against the shard's Search (PQ distances, candidates 0) — the rule of
    test_shard_faiss.py; then the merged Faiss answer (labels read back as ids with
    Shard.Read) against the cluster's FindNeighbors (approximate_neighbor_count 0, the same
    nprobe). template: a faiss IndexIVFPQ with the coordinator's quantizer (kept alive by the
    caller). Returns the counts (the caller asserts)."""
    import faiss
    tp, _, sp, _ = ch.stubs()
    xq = np.ascontiguousarray(xq, dtype="float32")
    nq = len(xq)
    Dq, Iq = template.quantizer.search(xq, nprobe)
    Iq = Iq.astype("int64")
    ntotal, same, pairs, worst = 0, 0, 0, 0.0
    merged = [[] for _ in range(nq)]   # (distance, label, shard)
    shards = [g[0] for g in cl.groups] if getattr(cl, "groups", None) else cl.shards
    for si, s in enumerate(shards):
        ss = s.stub.Stats(sp.ShardStatsRequest(), timeout=30)
        path = os.path.join(s.data, "v%06d" % ss.current_version, "slice.faiss")
        fx = faiss.read_index(path)
        ntotal += fx.ntotal
        own_mask = np.isin(Iq, list(ss.lists))
        Iq_own = np.where(own_mask, Iq, -1)
        fx.nprobe = nprobe
        FD = np.empty((nq, k), dtype="float32")
        FI = np.empty((nq, k), dtype="int64")
        fx.search_preassigned(nq, faiss.swig_ptr(xq), k, faiss.swig_ptr(Iq_own),
                              faiss.swig_ptr(np.ascontiguousarray(Dq)), faiss.swig_ptr(FD),
                              faiss.swig_ptr(FI), False)
        for b0 in range(0, nq, 100):
            rq = sp.ShardSearchRequest()
            for qi in range(b0, min(nq, b0 + 100)):
                m = own_mask[qi]
                rq.queries.add(version=ss.current_version, vector=xq[qi].tolist(),
                               lists=Iq[qi][m].tolist(), coarse_distances=Dq[qi][m].tolist(),
                               k=k, candidates=0)
            resp = s.stub.Search(rq, timeout=120)
            for j, res in enumerate(resp.results):
                qi = b0 + j
                fl = [int(x) for x in FI[qi] if x >= 0]
                pairs += 1
                if list(res.labels) == fl:
                    same += 1
                    for a, bb in zip(res.distances, FD[qi][:len(fl)]):
                        worst = max(worst, abs(a - bb) / max(1e-6, abs(bb)))
                for dd, lab in zip(FD[qi], FI[qi]):
                    if lab >= 0:
                        merged[qi].append((float(dd), int(lab), si))
    cluster_same = 0
    for qi in range(nq):
        top = sorted(merged[qi])[:k]
        ids = []
        for dd, lab, si in top:
            r = shards[si].stub.Read(sp.ShardReadRequest(labels=[lab]), timeout=30)
            ids.append(r.datapoints[0].datapoint.datapoint_id)
        q = ch.query(tp, xq[qi], k, fraction=nprobe / nlist, cand=0)
        resp = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=60)
        got = [n.datapoint.datapoint_id for n in resp.nearest_neighbors[0].neighbors]
        cluster_same += got == ids
    return {"faiss": faiss.__version__, "slices": len(shards), "ntotal": ntotal,
            "count": cl.stats().vectors_count, "nq": nq, "same": same, "pairs": pairs,
            "worst": worst, "cluster_same": cluster_same}
