#!/usr/bin/env bash
# fuzz_long.sh SECONDS [HARNESS...] — a fuzzing campaign (`make fuzz-long FUZZ_SECONDS=N`):
# each libFuzzer harness of build/fuzz (or only those named) runs SECONDS seconds, one job
# (one process, in-process fuzzing: the -jobs=1 of libFuzzer without its extra fork), from its
# committed corpus tests/fuzz/corpus/<harness> plus a work folder build/fuzz/long/<harness>;
# then the inputs that add coverage are merged into the committed corpus (-merge=1: only
# new features are kept, so it stays minimized and `make test` replays it in seconds).
# Crash, leak, timeout and OOM inputs are left in build/fuzz/long/<harness>/ (artifacts) and
# counted. FUZZ_RUNS=N (environment): each harness stops after N executions (-runs=N) or
# SECONDS, whichever comes first (a campaign to 10^7 executions: FUZZ_RUNS=10000000). Prints
# one table: harness, executions, exec/s, coverage (cov: of libFuzzer's last
# status line), features (ft:), corpus size, crashes. Exits 1 when any harness crashed.
set -u
cd "$(dirname "$0")/../.."
secs=${1:-600}
shift || true
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in build/fuzz/fuzz_*; do [ -x "$f" ] && names+=("$(basename "$f")"); done
fi
rows=()
bad=0
runs=()
if [ -n "${FUZZ_RUNS:-}" ]; then
  case "$FUZZ_RUNS" in *[!0-9]*) echo "FUZZ_RUNS=$FUZZ_RUNS: expected a number of executions" >&2; exit 2;; esac
  runs=(-runs="$FUZZ_RUNS")
fi
for n in "${names[@]}"; do
  f=build/fuzz/$n
  [ -x "$f" ] || { echo "no harness $f (make fuzz-build)" >&2; exit 2; }
  work=build/fuzz/long/$n
  corpus=tests/fuzz/corpus/$n
  mkdir -p "$work/queue" "$corpus"
  log=$work/run.log
  echo "== $n for ${secs}s${FUZZ_RUNS:+ or $FUZZ_RUNS executions} ($(date -u +%H:%M:%S) UTC)" >&2
  "$f" -max_total_time="$secs" "${runs[@]}" -print_final_stats=1 -artifact_prefix="$work/" \
       "$work/queue" "$corpus" >"$log" 2>&1
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  crashes=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
            -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  [ "$crashes" -gt 0 ] && { bad=1; grep -E 'ERROR|SUMMARY' "$log" | head -5 >&2; }
  "$f" -merge=1 "$corpus" "$work/queue" >"$work/merge.log" 2>&1
  size=$(find "$corpus" -type f | wc -l)
  rows+=("$(printf '%-24s %12s %8s %7s %7s %7s %8s' "$n" "${execs:-?}" "${eps:-?}" \
            "${cov:-?}" "${ft:-?}" "$size" "$crashes")")
done
printf '%-24s %12s %8s %7s %7s %7s %8s\n' harness executions exec/s cov ft corpus crashes
printf '%s\n' "${rows[@]}"
exit $bad
