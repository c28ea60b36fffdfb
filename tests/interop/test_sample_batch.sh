#!/usr/bin/env bash
# The demo's sample batch (JSON + CSV + Avro written by python avro, restricts without a
# deny list, numeric restricts, sparse parts, crowding tags) is accepted whole by
# `tessera batch inspect`, and the three formats agree on what they carry.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 tests/data/gen_sample.py "$tmp/batch" --n 900
"$TSR_BIN/tessera" batch inspect --batch-root "$tmp/batch" --dimensions 64 >"$tmp/out.jsonl" 2>"$tmp/report.txt" || {
  cat "$tmp/report.txt"; exit 1; }
n=$(wc -l <"$tmp/out.jsonl")
[ "$n" -eq 900 ] || { echo "expected 900 records, got $n"; exit 1; }
/usr/bin/python3 - "$tmp/out.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
for i, r in enumerate(recs):
    assert r["id"] == "dp-%05d" % i, r["id"]
    assert len(r["embedding"]) == 64
    assert r["crowding_tag"] == "shop-%d" % (i % 20), r
    ns = {x["namespace"]: x.get("allow", []) for x in r["restricts"]}
    assert ns["color"] == [["red", "green", "blue", "orange"][i % 4]], r
    nums = {x["namespace"]: x for x in r["numeric_restricts"]}
    assert nums["price"]["value_int"] == i % 100, r
    assert abs(nums["rating"]["value_float"] - (i % 50) / 2.0) < 1e-6, r
    assert ("sparse_embedding" in r) == (i % 3 == 0), r
print("ok", len(recs))
PY
