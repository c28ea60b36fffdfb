#!/usr/bin/env bash
# The demo's sample batch (JSON + CSV + Avro written by python avro, restricts without a
# deny list, numeric restricts, sparse parts, crowding tags) is accepted whole by
# `tessera batch inspect`, and the three formats agree on what they carry; without the
# python avro package the generator fails clearly instead of writing JSON.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 tests/data/gen_sample.py "$tmp/batch" --n 900
"$TSR_BIN/tessera" batch inspect --records --batch-root "$tmp/batch" --dimensions 64 >"$tmp/out.jsonl" 2>"$tmp/report.txt" || {
  cat "$tmp/report.txt"; exit 1; }
n=$(wc -l <"$tmp/out.jsonl")
[ "$n" -eq 900 ] || { echo "expected 900 records, got $n"; exit 1; }
/usr/bin/python3 - "$tmp/out.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "tests/data")
from gen_sample import attrs
recs = [json.loads(l) for l in open(sys.argv[1])]
for i, r in enumerate(recs):
    a = attrs(i)
    assert r["id"] == "dp-%05d" % i, r["id"]
    assert len(r["embedding"]) == 64
    assert r["crowding_tag"] == a["shop"], r
    ns = {x["namespace"]: x.get("allow", []) for x in r["restricts"]}
    assert ns["color"] == [a["color"]] and ns["shape"] == [a["shape"]], r
    nums = {x["namespace"]: x for x in r["numeric_restricts"]}
    assert nums["price"]["value_int"] == a["price"], r
    assert abs(nums["rating"]["value_float"] - a["rating"]) < 1e-6, r
    assert ("sparse_embedding" in r) == (i % 3 == 0), r
print("ok", len(recs))
PY
# Without the python avro package, Avro is not silently replaced by JSON: an error naming
# the package, unless --no-avro asks for JSON.
out=$(/usr/bin/python3 -S tests/data/gen_sample.py "$tmp/noavro" --n 30 2>&1) && {
  echo "gen_sample.py without the avro package did not fail: $out"; exit 1; }
case "$out" in *"'avro' package is missing"*) ;; *) echo "unclear error: $out"; exit 1;; esac
[ ! -e "$tmp/noavro/part-2.json" ] || { echo "JSON written instead of Avro"; exit 1; }
/usr/bin/python3 -S tests/data/gen_sample.py "$tmp/noavro2" --n 30 --no-avro
[ -e "$tmp/noavro2/part-2.json" ] || { echo "--no-avro did not write part-2.json"; exit 1; }
echo "ok: no silent JSON without avro"
