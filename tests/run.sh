#!/usr/bin/env bash
# Test runner for `make test`. Suites: unit, tools, interop, deploy, integration, faults,
# fuzz-replay, all.
# Every suite prints PASS/FAIL/SKIP per test and the runner exits non-zero if any failed.
# A test that cannot run here (no root, a missing tool) exits 77 (the automake convention)
# and shows as SKIP with its reason (its last output line), never as PASS.
# TSR_BIN (binaries) and TSR_BUILD (build dir) come from the Makefile.
set -u
cd "$(dirname "$0")/.."
# Several suites may be given: tests/run.sh unit integration fuzz-replay
suites=" ${*:-all} "
want() { [[ $suites == *" $1 "* || $suites == *" all "* ]]; }
fails=0; passes=0; skips=0; failed=()
PY=/usr/bin/python3
export PYTHONDONTWRITEBYTECODE=1
# Unbuffered: a failing test's traceback (stderr) stays after what it printed (stdout), so the
# tail the runner shows holds the assertion.
export PYTHONUNBUFFERED=1

run() { # name cmd...
  local name=$1; shift
  local t0=$(date +%s%N)
  local log; log=$(mktemp)
  "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    passes=$((passes+1)); local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf 'PASS %-50s %4d.%03ds\n' "$name" $((ms/1000)) $((ms%1000))
  elif [ $rc -eq 77 ]; then
    skips=$((skips+1))
    printf 'SKIP %-50s %s\n' "$name" "$(grep -v '^[[:space:]]*$' "$log" | tail -1)"
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
# The tree's own checkers (tests/tools: check-layers and its planted violations).
if want tools; then
  for t in tests/tools/test_*.py; do
    [ -f "$t" ] || continue
    run "tools/$(basename "$t")" $PY "$t"
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
# Deployment lint: the Dockerfile and the Kubernetes manifests against the Makefile and
# the binaries' flags (static checks; tests/deploy/). test_containers.py builds on the
# image and runs containers: `make test-deploy` runs it (.ci/run), not this suite.
if want deploy; then
  for t in tests/deploy/test_*.py; do
    [ -f "$t" ] || continue
    [ "$(basename "$t")" = test_containers.py ] && continue
    run "deploy/$(basename "$t")" $PY "$t"
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
echo "tests: $passes passed, $fails failed, $skips skipped"
[ $fails -eq 0 ] || { printf '  failed: %s\n' "${failed[@]}"; exit 1; }
