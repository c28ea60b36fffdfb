#!/usr/bin/python3
"""check — the history checker of the chaos run (tests/chaos/chaos.py), runnable alone on a
saved history: `python3 tests/chaos/check.py HISTORY` (exit 0: no violation, 1: violations,
2: the history is unusable).

The history is JSON lines: one "meta" line, one "op" line per call (op = upsert | remove |
batch | query; start / end in seconds; outcome ok | err | unknown), "fault" lines and one
"final" line per coordinator (what ReadIndexDatapoints returned for every id ever used,
after every fault was healed, and GetIndexStats' count and version).

Model. Every id is written by one client only (a writer's own ids; the batch thread's base
and batch ids), so an id's writes are sequential from the client's side. An "err" write did
nothing (a definite error: refused by a follower, invalid, a FAILED update). An "unknown"
write (UNAVAILABLE, a deadline, a dropped connection, an update whose end was not seen) may
take effect at any time after its start — also after later writes of the same id (as in
Jepsen's model: it may still sit in a queue) — or never. So an id's final value must be
the value of its last acknowledged write (absent after a remove or a batch's delete; absent
before the base batch) or the value of one of its unknown writes.

Rules (each broken instance is one violation, listed):
- final:    every id's final value is allowed by the model above (an acknowledged write
            lost, a removed id back, a value no write left);
- whole:    an unknown write is applied whole or not at all: over the ids it wrote that no
            later write touched, its value shows on all or on none;
- dup:      ReadIndexDatapoints returns an id at most once; GetIndexStats' count equals the
            number of ids present; both coordinators return the same contents;
- removed:  no query returns a streamed id whose removal was acknowledged before the query
            started, unless an upsert of that id (acknowledged or unknown) started after
            the removal did and before the query ended (on any coordinator: FOLLOWER_LAG_S
            is 0 since the read index, below);
- served:   a query aimed at a streamed id with the vector of its last acknowledged upsert
            (full probe, k = 4: the record itself is at distance 0) returns the id, unless
            another write of that id (acknowledged or unknown, other than that upsert) started
            before the query ended (on any coordinator: FOLLOWER_LAG_S is 0). The query's vector is the
            history's "aimv" (recorded since Dec 3); in older histories it is rebuilt from the
            driver's window of the 50 latest upserted values, and a query is judged only when
            that window held one value of the id at its start and no other 0.2 s before;
- version:  every query is answered from one committed version: the reply's version is
            the base batch's, an acknowledged update's, one a write acknowledgement named or
            the final one (any version up to the final one when an update's outcome is
            unknown);
- order:    versions strictly increase: an update acknowledged before another started has
            the lower version; a write acknowledged before another started has a lower or
            equal (version, stream seq); a write that started after an update was
            acknowledged names that version or a later one.
Not violations, counted: queries answered by a coordinator still on an older version than
an update acknowledged before they started (a follower moves to a new version when its
watch sees it, docs/ha.md), and unknown writes that took effect after a later acknowledged
write of the same id.
"""
import bisect
import collections
import json
import sys

DEFINITE = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "NOT_FOUND",
            "UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED", "ALREADY_EXISTS")
ABSENT = None
# Read-your-writes on a follower (a coordinator other than the one that acknowledged the
# write): none allowed since the read index (coordinator/readidx.c: a follower reads etcd's
# newest round before a query and waits for its watch; every shard query demands the group's
# seq). Before it, a follower learnt that a replica missed a write only at its next Stats
# pass and returns within 1.5 s of the write were tolerated (docs/reliability.md "Chaos").
# 0: a follower's stale answer is a violation like any other.
FOLLOWER_LAG_S = 0


def key(v):
    return None if v is None else json.dumps(v)


def load(path):
    meta, ops, faults, finals = {}, [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise SystemExit("check: %s line %d: not JSON (%s)" % (path, n, e))
            t = r.get("type")
            if t == "meta":
                meta = r
            elif t == "op":
                if "start" not in r or "end" not in r or "outcome" not in r:
                    raise SystemExit("check: %s line %d: an op without start/end/outcome"
                                     % (path, n))
                ops.append(r)
            elif t == "fault":
                faults.append(r)
            elif t == "final":
                finals.append(r)
    return meta, ops, faults, finals


def effects(op):
    """id -> value this write leaves (ABSENT for a remove / a batch's delete)."""
    out = {}
    if op["op"] == "remove":
        for i in op.get("ids", []):
            out[i] = ABSENT
    elif op["op"] in ("upsert", "batch"):
        for i in op.get("ids", []):  # a batch's deletes
            out[i] = ABSENT
        for i, v in op.get("dps", {}).items():
            out[i] = v
    return out


def check(meta, ops, faults, finals):
    """Returns (violations: list of (rule, text), notes: dict of counters)."""
    bad = []
    notes = collections.Counter()
    writes = sorted((o for o in ops if o["op"] != "query"), key=lambda o: o["start"])
    per_id = collections.defaultdict(list)  # id -> [(op, value)] in start order
    for o in writes:
        for i, v in effects(o).items():
            per_id[i].append((o, v))

    # ---- final, whole, dup
    if len(finals) < 2:
        bad.append(("final", "the history has %d final reads (want one per coordinator): "
                    "the run did not end" % len(finals)))
    views = []
    for fin in finals:
        state = {}
        for i, vals in fin["state"].items():
            if len(vals) != 1:
                bad.append(("dup", "coordinator %s: ReadIndexDatapoints returned %s %d times"
                            % (fin["coord"], i, len(vals))))
            state[i] = vals[0]
        if fin.get("count") is not None and fin["count"] != len(state):
            bad.append(("dup", "coordinator %s: GetIndexStats counts %d datapoints, %d ids "
                        "are present" % (fin["coord"], fin["count"], len(state))))
        views.append(state)
    if len(views) == 2 and views[0] != views[1]:
        diff = sorted(i for i in set(views[0]) | set(views[1])
                      if views[0].get(i) != views[1].get(i))
        bad.append(("dup", "the coordinators return different contents for %d ids (%s)"
                    % (len(diff), ", ".join(diff[:5]))))
    state = views[0] if views else {}
    for i, hist in per_id.items():
        last_ok = ABSENT
        for o, v in hist:
            if o["outcome"] == "ok":
                last_ok = v
        unknown = [(o, v) for o, v in hist if o["outcome"] == "unknown"]
        got = state.get(i, ABSENT)
        if key(got) == key(last_ok):
            continue
        hit = [o for o, v in unknown if key(v) == key(got)]
        if not hit:
            bad.append(("final", "%s: holds %s, the last acknowledged write (%s) left %s%s"
                        % (i, short(got), describe(last_ok_op(hist)), short(last_ok),
                           "; %d unknown write(s) allow none of it" % len(unknown)
                           if unknown else "")))
            continue
        ok_after = [o for o, v in hist if o["outcome"] == "ok" and o["start"] > hit[-1]["end"]]
        if ok_after:
            notes["unknown writes applied after a later acknowledged one"] += 1
    for o in writes:
        if o["outcome"] != "unknown":
            continue
        applied = missing = 0
        for i, v in effects(o).items():
            hist = per_id[i]
            later = [p for p, _ in hist if p["start"] > o["start"] and p["outcome"] != "err"]
            if later:
                continue
            others = {key(w) for p, w in hist if p is not o and p["outcome"] != "err"}
            if key(v) in others:
                continue  # the same value another write leaves: not telling
            if key(state.get(i, ABSENT)) == key(v):
                applied += 1
            else:
                missing += 1
        if applied and missing:
            bad.append(("whole", "%s: an unknown write shows on %d of its ids and not on %d"
                        % (describe(o), applied, missing)))

    # ---- removed (per id: the acknowledged removes by end, the writes that put a value by
    # start, the first start of an unknown one; bisect per query, as the history is long)
    rem_by_end, put_starts, unk_first = {}, {}, {}
    for i, hist in per_id.items():
        rems = sorted((o for o, v in hist if v is ABSENT and o["outcome"] == "ok"
                       and o["op"] == "remove"), key=lambda o: o["end"])
        rem_by_end[i] = ([o["end"] for o in rems], rems)
        puts = [o for o, v in hist if v is not ABSENT and o["outcome"] != "err"]
        put_starts[i] = sorted(o["start"] for o in puts)
        unk_first[i] = min([o["start"] for o in puts if o["outcome"] == "unknown"] or
                           [float("inf")])
    for q in ops:
        if q["op"] != "query" or q["outcome"] != "ok":
            continue
        for i in q.get("ids", []):
            if not i.startswith("w") or i not in rem_by_end:
                continue
            ends, rems = rem_by_end[i]
            k = bisect.bisect_left(ends, q["start"])  # the removes that ended before it
            if k == 0:
                continue
            r = rems[k - 1]  # the latest of them
            starts = put_starts[i]
            j = bisect.bisect_right(starts, r["start"])
            again = unk_first[i] < q["end"] or (j < len(starts) and starts[j] < q["end"])
            if not again and q["coord"] != r.get("coord") and \
                    q["start"] - r["end"] < FOLLOWER_LAG_S:
                notes["removed ids a follower returned within %.1f s of the removal "
                      "(known gap, docs/reliability.md)" % FOLLOWER_LAG_S] += 1
            elif not again:
                bad.append(("removed", "query at %.3f-%.3f (coordinator %s, version %s) "
                            "returned %s, removed by %s" % (q["start"], q["end"], q["coord"],
                                                            q.get("version"), i, describe(r))))

    served(ops, per_id, bad, notes)

    # ---- version, order
    batches = [o for o in writes if o["op"] == "batch"]
    ok_batches = [o for o in batches if o["outcome"] == "ok"]
    acked = [o for o in writes if o["op"] != "batch" and o["outcome"] == "ok"]
    allowed = {o["version"] for o in ok_batches} | {o["version"] for o in acked}
    allowed |= {f.get("version") for f in finals}
    top = max([f.get("version") or 0 for f in finals] + [0])
    unknown_batch = any(o["outcome"] == "unknown" for o in batches)
    for q in ops:
        if q["op"] != "query" or q["outcome"] != "ok":
            continue
        v = q.get("version", 0)
        if v in allowed or (unknown_batch and 1 <= v <= top):
            pass
        else:
            bad.append(("version", "query at %.3f (coordinator %s) answered from version %s, "
                        "not a committed one (%s)" % (q["start"], q["coord"], v,
                                                      sorted(x for x in allowed if x))))
        older = [b for b in ok_batches if b["end"] < q["start"] and b["version"] > v]
        if older:
            notes["queries answered from a version older than an acknowledged update"] += 1
    for a in ok_batches:
        for b in ok_batches:
            if a["end"] < b["start"] and not a["version"] < b["version"]:
                bad.append(("order", "update %s (version %d) acknowledged before update %s "
                            "(version %d) started" % (a.get("k"), a["version"], b.get("k"),
                                                      b["version"])))
    best, j = None, 0  # the highest (version, seq) acknowledged before each write started
    by_end = sorted(acked, key=lambda o: o["end"])
    for w in sorted(acked, key=lambda o: o["start"]):
        while j < len(by_end) and by_end[j]["end"] < w["start"]:
            p = by_end[j]
            if best is None or (p["version"], p["seq"]) > (best["version"], best["seq"]):
                best = p
            j += 1
        if best is not None and (w["version"], w["seq"]) < (best["version"], best["seq"]):
            bad.append(("order", "%s acknowledged with (version %d, seq %d) after %s had "
                        "(version %d, seq %d)" % (describe(w), w["version"], w["seq"],
                                                  describe(best), best["version"],
                                                  best["seq"])))
    for w in acked:
        newer = [b for b in ok_batches if b["end"] < w["start"] and b["version"] > w["version"]]
        if newer:
            bad.append(("order", "%s acknowledged on version %d, after update %s committed "
                        "version %d" % (describe(w), w["version"], newer[0].get("k"),
                                        newer[0]["version"])))
    return bad, notes


class Window:
    """The driver's window (tests/chaos/chaos.py `recent`: the 50 latest upserted (id,
    value) pairs, appended when a call ends) replayed forward in time: at(t) gives it as it
    stood at t (t never decreasing between calls) as id -> set of values."""

    def __init__(self, ups):
        self.ups, self.j, self.window = ups, 0, []

    def at(self, t):
        while self.j < len(self.ups) and self.ups[self.j]["end"] < t:
            o = self.ups[self.j]
            self.window = (self.window + [(k, json.dumps(v[0]))
                                          for k, v in o["dps"].items()])[-50:]
            self.j += 1
        out = collections.defaultdict(set)
        for k, v in self.window:
            out[k].add(v)
        return out


def served(ops, per_id, bad, notes):
    """The "served" rule (module docstring): an acknowledged upsert is answered."""
    ups = sorted((o for o in ops if o["op"] == "upsert"), key=lambda o: o["end"])
    now_w, before_w = Window(ups), Window(ups)
    acked = collections.defaultdict(list)  # (id, value key) -> acknowledged upserts
    for o in ups:
        if o["outcome"] == "ok":
            for k, v in o["dps"].items():
                acked[(k, json.dumps(v[0]))].append(o)
    for q in sorted((o for o in ops if o["op"] == "query"), key=lambda o: o["start"]):
        i = q.get("aim")
        if q["op"] != "query" or q["outcome"] != "ok" or not i or not i.startswith("w"):
            continue
        if "aimv" in q:
            value = json.dumps(q["aimv"])
        else:
            now, before = now_w.at(q["start"]), before_w.at(q["start"] - 0.2)
            if len(now[i]) != 1 or not before[i] <= now[i]:
                notes["aimed queries not judged (older history, the vector is ambiguous)"] += 1
                continue
            value = next(iter(now[i]))
        if i in q.get("ids", []):
            continue
        mine = [o for o in acked.get((i, value), []) if o["end"] < q["start"]]
        if not mine:
            continue
        w = mine[-1]  # the latest acknowledged (ups is in end order)
        hist = per_id.get(i, [])
        notes["aimed queries the served rule judged"] += 1
        others = [o for o, _ in hist if o is not w and o["outcome"] != "err"
                  and o["start"] < q["end"] and (o["start"] > w["start"]
                                                 or o["outcome"] == "unknown")]
        if others:
            continue
        if q["coord"] != w.get("coord") and q["start"] - w["end"] < FOLLOWER_LAG_S:
            notes["acknowledged upserts a follower missed within %.1f s of the "
                   "acknowledgement (known gap, docs/reliability.md)" % FOLLOWER_LAG_S] += 1
            continue
        bad.append(("served", "query at %.3f-%.3f (coordinator %s, version %s) aimed at %s "
                    "with the value of %s did not return it (returned %s)"
                    % (q["start"], q["end"], q["coord"], q.get("version"), i, describe(w),
                       ", ".join(q.get("ids", [])) or "nothing")))


def last_ok_op(hist):
    oks = [o for o, _ in hist if o["outcome"] == "ok"]
    return oks[-1] if oks else None


def describe(o):
    if o is None:
        return "none"
    who = ("writer %s #%s" % (o.get("writer"), o.get("n")) if o["op"] != "batch"
           else "update %s" % o.get("k"))
    return "%s %s [%.3f-%.3f %s%s]" % (o["op"], who, o["start"], o["end"], o["outcome"],
                                       " v%s/seq%s" % (o.get("version"), o.get("seq"))
                                       if o["outcome"] == "ok" and o["op"] != "batch" else "")


def short(v):
    if v is None:
        return "absent"
    return "vec[%s..] %s" % (",".join("%g" % x for x in v[0][:2]), v[1])


def summary(meta, ops, faults, bad, notes):
    out = ["check: seed %s, %s s%s" % (meta.get("seed"), meta.get("seconds"),
                                        ", planted bug " + meta["plant"]
                                        if meta.get("plant") else "")]
    by = collections.Counter((o["op"], o["outcome"]) for o in ops)
    out.append("operations: %d" % len(ops))
    for kind in ("query", "upsert", "remove", "batch"):
        out.append("  %-7s ok %6d  err %5d  unknown %5d" % (kind, by[(kind, "ok")],
                                                            by[(kind, "err")],
                                                            by[(kind, "unknown")]))
    fk = collections.Counter(f["kind"] for f in faults)
    out.append("faults: %d (%s)" % (len(faults), ", ".join("%s %d" % kv
                                                           for kv in sorted(fk.items()))))
    for k, n in sorted(notes.items()):
        out.append("note: %s: %d" % (k, n))
    rules = collections.Counter(r for r, _ in bad)
    out.append("violations: %d%s" % (len(bad), " (%s)" % ", ".join(
        "%s %d" % kv for kv in sorted(rules.items())) if bad else ""))
    for r, text in bad[:40]:
        out.append("  [%s] %s" % (r, text))
    if len(bad) > 40:
        out.append("  ... %d more" % (len(bad) - 40))
    return "\n".join(out)


def main(argv):
    if len(argv) != 1:
        print("usage: check.py HISTORY", file=sys.stderr)
        return 2
    meta, ops, faults, finals = load(argv[0])
    bad, notes = check(meta, ops, faults, finals)
    print(summary(meta, ops, faults, bad, notes))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
