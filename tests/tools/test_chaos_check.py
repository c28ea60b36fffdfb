"""The chaos history checker (tests/chaos/check.py) on synthetic histories: a clean one
passes, and each rule fails on a history that breaks it (so that a green `make chaos` means
something). No cluster: runs in the tools suite of `make test`, in well under a second.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import check  # noqa: E402

V1, V2 = [[1.0, 2.0], "r"], [[3.0, 4.0], "g"]


def op(kind, start, end, outcome, **kw):
    r = {"type": "op", "op": kind, "start": start, "end": end, "outcome": outcome,
         "coord": 0}
    r.update(kw)
    return r


def final(state, count=None, version=2):
    out = []
    for c in (0, 1):
        out.append({"type": "final", "coord": c, "state": {k: [v] for k, v in state.items()},
                    "count": len(state) if count is None else count, "version": version})
    return out


def base():
    ops = [op("batch", 0.0, 1.0, "ok", k=0, dps={"base-0": V1}, ids=[], version=1),
           op("upsert", 2.0, 2.1, "ok", writer=0, n=1, dps={"w0-000": V1, "w0-001": V2},
              version=1, seq=1),
           op("remove", 3.0, 3.1, "ok", writer=0, n=2, ids=["w0-001"], version=1, seq=2),
           op("query", 3.5, 3.6, "ok", ids=["w0-000", "base-0"], version=1),
           op("batch", 4.0, 5.0, "ok", k=1, dps={"b1-00": V2}, ids=["base-0"], version=2),
           op("upsert", 6.0, 6.1, "unknown", writer=0, n=3, dps={"w0-002": V1, "w0-003": V2})]
    return ops, final({"w0-000": V1, "b1-00": V2})


def violations(ops, finals):
    bad, _ = check.check({}, ops, [], finals)
    return sorted({r for r, _ in bad}), bad


def main():
    ops, fin = base()
    rules, bad = violations(ops, fin)
    assert rules == [], bad
    # the unknown write applied whole passes too
    rules, bad = violations(ops, final({"w0-000": V1, "b1-00": V2, "w0-002": V1,
                                        "w0-003": V2}))
    assert rules == [], bad
    cases = {
        "final": final({"b1-00": V2}),                                   # acked upsert lost
        "whole": final({"w0-000": V1, "b1-00": V2, "w0-002": V1}),       # half applied
        "dup": final({"w0-000": V1, "b1-00": V2}, count=3),              # count != ids
    }
    for rule, f in cases.items():
        rules, bad = violations(ops, f)
        assert rules == [rule], (rule, bad)
    back = final({"w0-000": V1, "b1-00": V2, "w0-001": V2})              # removed id back
    assert violations(ops, back)[0] == ["final"]
    o = copy.deepcopy(ops) + [op("query", 3.2, 3.3, "ok", ids=["w0-001"], version=1)]
    assert violations(o, fin)[0] == ["removed"]
    o = copy.deepcopy(ops) + [op("query", 3.2, 3.3, "ok", ids=["w0-000"], version=7)]
    assert violations(o, fin)[0] == ["version"]
    o = copy.deepcopy(ops)
    o[2]["seq"] = 0                                                      # seq went back
    assert violations(o, fin)[0] == ["order"]
    # served: a query aimed at w0-000 with its acknowledged value must return it
    aimed = dict(aim="w0-000", aimv=V1[0], version=1)
    o = copy.deepcopy(ops) + [op("query", 3.2, 3.3, "ok", ids=["w0-000"], **aimed)]
    assert violations(o, fin)[0] == [], violations(o, fin)
    o = copy.deepcopy(ops) + [op("query", 3.2, 3.3, "ok", ids=["base-0"], **aimed)]
    assert violations(o, fin)[0] == ["served"]
    # ... unless another write of the id started before the query ended (here: unknown)
    o = copy.deepcopy(ops) + [op("upsert", 3.15, 3.4, "unknown", writer=0, n=9,
                                 dps={"w0-000": V2}),
                              op("query", 3.2, 3.3, "ok", ids=["base-0"], **aimed)]
    assert "served" not in violations(o, final({"w0-000": V2, "b1-00": V2}))[0]
    # ... and a follower's miss right after the acknowledgement is one too (FOLLOWER_LAG_S
    # is 0 since the read index: no follower tolerance any more)
    o = copy.deepcopy(ops) + [op("query", 2.5, 2.6, "ok", ids=["base-0"], **aimed)]
    o[-1]["coord"] = 1
    assert violations(o, fin)[0] == ["served"], violations(o, fin)
    print("test_chaos_check: a clean history passes; final, whole, dup, removed, served, "
          "version and order each fail on a history that breaks them")


if __name__ == "__main__":
    main()
