#!/usr/bin/env python3
"""demo_explain -- one line saying how a demo query's answer differs from the plain one.

deploy/local/run.sh runs the plain query, then the same query with one feature added
(restrict, deny, numeric restrict, crowding, hybrid), and calls this with both outputs of
`tessera query` and demo.json (each sample datapoint's color, shape, price, shop and
sparse dims, written by tests/data/gen_sample.py).

Usage: demo_explain.py DEMO_JSON PLAIN_OUT FEATURE_OUT WHAT
  WHAT: restrict:NS=TOKEN | deny:NS=TOKEN | numeric:NS>=VALUE | crowding:N | hybrid:DIM:V,...
"""
import json
import operator
import re
import sys

OPS = [(">=", operator.ge), ("<=", operator.le), ("!=", operator.ne), ("==", operator.eq),
       (">", operator.gt), ("<", operator.lt), ("=", operator.eq)]


def hit_ids(path):
    out = []
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*\d+\s+(\S+)\s+distance", line)
            if m:
                out.append(m.group(1))
    return out


def describe(what, attrs, new):
    """(field shown next to each id, a true sentence about the new answer)."""
    kind, _, arg = what.partition(":")
    if kind in ("restrict", "deny"):
        ns, _, tok = arg.partition("=")
        same = [x for x in new if attrs[x][ns] == tok]
        if kind == "restrict":
            return ns, ("every hit is %s=%s" % (ns, tok) if len(same) == len(new)
                        else "%d of %d hits are %s=%s" % (len(same), len(new), ns, tok))
        return ns, ("no hit is %s=%s" % (ns, tok) if not same
                    else "%d hits are still %s=%s" % (len(same), ns, tok))
    if kind == "numeric":
        for sym, fn in OPS:
            if sym in arg:
                ns, val = arg.split(sym, 1)
                ok = [x for x in new if fn(attrs[x][ns], float(val))]
                return ns, ("every hit has %s%s%s" % (ns, sym, val) if len(ok) == len(new)
                            else "%d of %d hits have %s%s%s" % (len(ok), len(new), ns, sym, val))
    if kind == "crowding":
        per = {}
        for x in new:
            per[attrs[x]["shop"]] = per.get(attrs[x]["shop"], 0) + 1
        return "shop", "at most %d hit(s) per shop now (limit %s)" % (max(per.values() or [0]), arg)
    if kind == "hybrid":
        dims = {int(p.split(":")[0]) for p in arg.split(",") if p}
        sp = [x for x in new if dims & set(attrs[x]["sparse"])]
        return None, "%d hit(s) match the sparse query (%s)" % (len(sp), ", ".join(sp) or "none")
    return None, ""


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        attrs = json.load(f)
    base, new = hit_ids(sys.argv[2]), hit_ids(sys.argv[3])
    what = sys.argv[4]
    field, sentence = describe(what, attrs, new)

    def show(x):
        return "%s (%s)" % (x, attrs[x][field]) if field and x in attrs else x

    out = [x for x in base if x not in new]
    came = [x for x in new if x not in base]
    if not out and not came:
        change = "same hits" + ("" if base == new else ", new order: " + " ".join(new))
    else:
        change = "%d of %d hits replaced: out %s; in %s" % (
            len(out), len(base), ", ".join(map(show, out)) or "-", ", ".join(map(show, came)) or "-")
    print("  -> what changed: %s; %s" % (change, sentence))


if __name__ == "__main__":
    main()
