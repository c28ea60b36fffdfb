#!/usr/bin/env bash
# Test runner for `make test`. Suites: unit, interop, integration, faults, fuzz-replay, all.
# Every suite prints PASS/FAIL per test and the runner exits non-zero if any failed.
# TSR_BIN (binaries) and TSR_BUILD (build dir) come from the Makefile.
set -u
cd "$(dirname "$0")/.."
# Several suites may be given: tests/run.sh unit integration fuzz-replay
suites=" ${*:-all} "
want() { [[ $suites == *" $1 "* || $suites == *" all "* ]]; }
fails=0; passes=0; failed=()
PY=/usr/bin/python3
export PYTHONDONTWRITEBYTECODE=1

run() { # name cmd...
  local name=$1; shift
  local t0=$(date +%s%N)
  local log; log=$(mktemp)
  if "$@" >"$log" 2>&1; then
    passes=$((passes+1)); local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf 'PASS %-50s %4d.%03ds\n' "$name" $((ms/1000)) $((ms%1000))
  else
    fails=$((fails+1)); failed+=("$name")
    printf 'FAIL %-50s\n' "$name"; sed 's/^/    | /' "$log" | tail -60
  fi
  rm -f "$log"
}

if want unit; then
  for t in "$TSR_BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run "unit/$(basename "$t")" "$t"
  done
fi
if want interop; then
  for t in tests/interop/test_*.py; do
    [ -f "$t" ] || continue
    run "interop/$(basename "$t")" $PY "$t"
  done
  for t in tests/interop/test_*.sh; do
    [ -f "$t" ] || continue
    run "interop/$(basename "$t")" bash "$t"
  done
fi
if want integration; then
  for t in tests/integration/test_*.py; do
    [ -f "$t" ] || continue
    run "integration/$(basename "$t")" $PY "$t"
  done
  for t in tests/integration/test_*.sh; do
    [ -f "$t" ] || continue
    run "integration/$(basename "$t")" bash "$t"
  done
fi
# Fault tests across network namespaces (need root for `ip netns`; they create and remove
# their own namespaces). Also runnable alone: tests/run.sh faults.
if want faults; then
  for t in tests/integration/multihost/test_*.py; do
    [ -f "$t" ] || continue
    run "faults/$(basename "$t")" $PY "$t"
  done
fi
if want fuzz-replay; then
  for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    n=$(basename "$f")
    [ -d "tests/fuzz/corpus/$n" ] || continue
    run "fuzz-replay/$n" "$f" -runs=0 "tests/fuzz/corpus/$n"
  done
fi
echo "---- $passes passed, $fails failed"
[ $fails -eq 0 ] || { printf '  failed: %s\n' "${failed[@]}"; exit 1; }
