"""Filters and crowding through the shard's Search (issue 4, points 2 and 3).

- SPEC §3 worked example A–H: every listed query gives exactly the listed matches;
- numeric restricts: every op with int / float / double query values against int /
  float / double datapoint values (int vs int exact, mixed as double), a missing
  namespace never matches, several numeric restricts AND, numeric AND tokens, tokens
  AND across namespaces; the same filters on the sparse search;
- crowding: for several limits, with and without re-rank, with a filter, and on the
  sparse list, the shard's answer equals the greedy pass (computed here) over the
  shard's own unfiltered/uncrowded full ranked list.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

sp, _, tp, _, _ = H.stubs()
OP = tp.NumericRestriction


def setup():
    rng = np.random.default_rng(11)
    d, nlist = 8, 4
    xt = rng.normal(size=(3000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xt, nlist, 2, nbits=4)
    return rng, d, nlist, ix, tmpl


def upsert(ix, label, dp, vec):
    _, a = ix.quantizer.search(np.asarray([vec], dtype="float32"), 1)
    return sp.StagedUpsert(label=label, list=int(a[0, 0]), datapoint=dp)


def query(ix, nlist, vec, k=1000, restricts=(), numeric=(), crowd=0, cand=0, sparse=None,
          sparse_k=0, dense=True):
    q = sp.ShardQuery(version=0, k=k, crowding_limit=crowd, candidates=cand, sparse_k=sparse_k,
                      return_ids=True)
    if dense:
        q.vector.extend([float(v) for v in vec])
        D, I = ix.quantizer.search(np.asarray([vec], dtype="float32"), nlist)
        q.lists.extend(int(x) for x in I[0])
        q.coarse_distances.extend(float(x) for x in D[0])
    for ns, allow, deny in restricts:
        q.restricts.add(namespace=ns, allow_list=allow, deny_list=deny)
    for ns, op, kind, val in numeric:
        n = q.numeric_restricts.add(namespace=ns, op=op)
        setattr(n, "value_" + kind, val)
    if sparse is not None:
        q.sparse.dimensions.extend(sparse[0])
        q.sparse.values.extend(sparse[1])
    return q


def search(shard, q):
    return shard.stub.Search(sp.ShardSearchRequest(queries=[q]), timeout=20).results[0]


def cmp(a, op, b):
    return {OP.LESS: a < b, OP.LESS_EQUAL: a <= b, OP.EQUAL: a == b,
            OP.GREATER_EQUAL: a >= b, OP.GREATER: a > b, OP.NOT_EQUAL: a != b}[op]


def as_value(kind, v):
    """The value as the shard compares it: int stays int, float is float32."""
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(np.float32(v))
    return float(v)


def main(bin_dir):
    rng, d, nlist, ix, tmpl = setup()
    data = H.tmpdir()
    shard = H.Shard(data, bin_dir=bin_dir)
    print("== %s" % bin_dir)
    try:
        ups = []
        # --- worked example, namespace color; all get a shape too for the AND test.
        ex = {"A": ([], []), "B": (["red"], []), "C": (["blue"], []), "D": (["orange"], []),
              "E": (["red", "blue"], []), "F": (["red"], ["blue"]),
              "G": (["red", "blue"], ["blue"]), "H": ([], ["blue"])}
        shapes = {"A": "square", "B": "square", "C": "circle", "D": "square", "E": "circle",
                  "F": "square", "G": "circle", "H": "square"}
        names = {}
        for i, (name, (allow, deny)) in enumerate(sorted(ex.items())):
            v = rng.normal(size=d)
            r = [("shape", [shapes[name]], [])]
            if allow or deny:
                r.append(("color", allow, deny))
            lab = 100 + i
            names[lab] = name
            ups.append(upsert(ix, lab, H.datapoint(tp, name, v, restricts=r,
                                                   sparse=([1, 2], [1.0, 0.5])), v))
        # --- numeric datapoints: values of each type, some missing.
        nums = {}
        kinds = ["int", "float", "double"]
        for i in range(60):
            v = rng.normal(size=d)
            kind = kinds[i % 3]
            val = (i % 11) - 5 if kind == "int" else ((i % 11) - 5) * 0.5
            numeric = [("n", kind, val)] if i % 7 != 0 else []  # every 7th: no "n"
            if i % 2 == 0:
                numeric.append(("m", "int", i))
            lab = 1000 + i
            nums[lab] = (kind, val if numeric and numeric[0][0] == "n" else None,
                         i if i % 2 == 0 else None)
            ups.append(upsert(ix, lab, H.datapoint(tp, "n%d" % i, v, numeric=numeric,
                                                   sparse=([2], [0.25])), v))
        # --- crowding datapoints: 400 with 8 tags, some untagged.
        for i in range(400):
            v = rng.normal(size=d)
            tag = None if i % 9 == 0 else "t%d" % (i % 8)
            sparse = ([i % 5, 7], [float(rng.random()), float(rng.random())])
            ups.append(upsert(ix, 5000 + i, H.datapoint(tp, "c%d" % i, v, tag=tag,
                                                        restricts=[("grp", ["g%d" % (i % 3)], [])],
                                                        sparse=sparse), v))
        H.load(shard, 1, 0, ups, template=tmpl, own=list(range(nlist)))
        qv = rng.normal(size=d)

        def matches(restricts=(), numeric=(), labels=None):
            got = set()
            for dense in (True, False):
                r = search(shard, query(ix, nlist, qv, restricts=restricts, numeric=numeric,
                                        sparse=([1, 2, 7], [1.0, 1.0, 1.0]), dense=dense))
                s = set(r.labels) if dense else set(r.sparse_labels)
                if labels is not None:
                    s &= labels
                if dense:
                    got = s
                else:
                    assert s == got, ("sparse and dense filters disagree", s, got)
            return got

        # Worked example (SPEC §3).
        ex_labels = set(names)
        cases = [([("color", ["red"], [])], "BEFG"), ([("color", ["blue"], [])], "CE"),
                 ([("color", ["red", "blue"], [])], "BCE"), ([("color", [], ["blue"])], "ABDFH"),
                 ([], "ABCDEFGH"),
                 # AND across namespaces
                 ([("color", ["red"], []), ("shape", ["square"], [])], "BF"),
                 ([("color", [], ["blue"]), ("shape", ["circle"], [])], ""),
                 ([("shape", ["circle", "square"], []), ("color", ["orange", "blue"], [])], "CDE"),
                 # unknown token / namespace
                 ([("color", ["green"], [])], ""), ([("nosuch", [], ["x"])], "ABCDEFGH")]
        for restricts, want in cases:
            got = "".join(sorted(names[lab] for lab in matches(restricts, labels=ex_labels)))
            assert got == want, (restricts, got, want)
            print("restricts %-70s -> %s" % (restricts, got or "-"))

        # Numeric: every op x query type against every datapoint type.
        num_labels = set(nums)
        ops = [OP.LESS, OP.LESS_EQUAL, OP.EQUAL, OP.GREATER_EQUAL, OP.GREATER, OP.NOT_EQUAL]
        checked = 0
        for op in ops:
            for qkind, qval in (("int", 0), ("int", 2), ("float", 0.5), ("double", -1.5),
                                ("double", 1.0), ("float", -2.5)):
                want = set()
                for lab, (kind, val, _) in nums.items():
                    if val is None:
                        continue  # missing namespace never matches
                    a, b = as_value(kind, val), as_value(qkind, qval)
                    if kind == "int" and qkind == "int":
                        ok = cmp(int(a), op, int(b))
                    else:
                        ok = cmp(float(a), op, float(b))
                    if ok:
                        want.add(lab)
                got = matches(numeric=[("n", op, qkind, qval)], labels=num_labels)
                assert got == want, (op, qkind, qval, sorted(got ^ want))
                checked += 1
        # AND of two numeric restricts, and with a token restrict.
        want = {lab for lab, (k, v, m) in nums.items()
                if v is not None and m is not None and as_value(k, v) >= 0 and m < 30}
        got = matches(numeric=[("n", OP.GREATER_EQUAL, "int", 0), ("m", OP.LESS, "int", 30)],
                      labels=num_labels)
        assert got == want, sorted(got ^ want)
        assert matches(numeric=[("missing", OP.NOT_EQUAL, "int", 0)], labels=num_labels) == set()
        got = matches(restricts=[("color", ["red"], [])], numeric=[("n", OP.EQUAL, "int", 0)])
        assert got == set(), got
        print("numeric: %d op/type combinations exact; AND, missing namespace ok" % checked)

        # Crowding = greedy pass over the shard's own uncrowded ranked list.
        tags_of = {}
        full = search(shard, query(ix, nlist, qv, k=10000))
        full_labels = list(full.labels)
        for lab, t in zip(full.labels, full.crowding_tags):
            tags_of[lab] = t

        def greedy(ranked, k, c):
            out, cnt = [], {}
            for lab in ranked:
                t = tags_of[lab]
                if t and c and c < k:  # an untagged datapoint is never limited
                    if cnt.get(t, 0) >= c:
                        continue
                    cnt[t] = cnt.get(t, 0) + 1
                out.append(lab)
                if len(out) == k:
                    break
            return out

        # every datapoint in exact order (all of them re-ranked with the raw vectors)
        exact_labels = list(search(shard, query(ix, nlist, qv, k=10000, cand=10000)).labels)
        for k, c in ((10, 1), (20, 2), (30, 3), (50, 7), (10, 10), (5, 0), (100, 1)):
            r = search(shard, query(ix, nlist, qv, k=k, crowd=c))
            want = greedy(full_labels, k, c)
            assert list(r.labels) == want, (k, c, list(r.labels), want)
            # with a filter: greedy over the filtered ranked list
            r = search(shard, query(ix, nlist, qv, k=k, crowd=c,
                                    restricts=[("grp", ["g1"], [])]))
            flt = [lab for lab in full_labels if 5000 <= lab and (lab - 5000) % 3 == 1]
            assert list(r.labels) == greedy(flt, k, c), (k, c)
            # with exact re-rank of 60 candidates: greedy over the re-ranked candidates,
            # which are the PQ top-60 united, when crowding is active (0 < c < k), with the
            # crowded PQ top-60 (so one tag cannot fill them and leave fewer than k)
            r = search(shard, query(ix, nlist, qv, k=k, crowd=c, cand=60))
            nc = max(k, 60)  # candidates below k count as k
            cands = set(search(shard, query(ix, nlist, qv, k=nc)).labels)
            if c and c < k:
                cands |= set(search(shard, query(ix, nlist, qv, k=nc, crowd=c)).labels)
            ranked = [lab for lab in exact_labels if lab in cands]
            assert list(r.labels) == greedy(ranked, k, c), (k, c, "rerank")
            # sparse list
            sq = ([0, 1, 2, 3, 4, 7], [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
            fs = search(shard, query(ix, nlist, qv, k=10000, sparse=sq, dense=False))
            for lab, t in zip(fs.sparse_labels, fs.sparse_crowding_tags):
                tags_of[lab] = t
            assert list(fs.sparse_scores) == sorted(fs.sparse_scores, reverse=True)
            r = search(shard, query(ix, nlist, qv, k=k, crowd=c, sparse=sq, dense=False))
            assert list(r.sparse_labels) == greedy(list(fs.sparse_labels), k, c), (k, c, "sparse")
        print("crowding: greedy pass equal for 7 (k, c) pairs x {plain, filtered, re-ranked, sparse}")
    finally:
        shard.stop()
    print("ok")


if __name__ == "__main__":
    for b in H.bins():  # release, then the ASan+UBSan build under `make test`
        main(b)
