#!/usr/bin/env bash
# The README's main job: start a local cluster (1 coordinator + 4 shards on loopback,
# supervised by `tessera cluster up`), apply a generated sample batch (dense + sparse +
# restricts + numeric restricts + crowding tags), print a plain query's answer, then the
# same query with each feature added (restrict, deny, numeric restrict, crowding, hybrid)
# and one line saying what it changed, then keep serving until Ctrl-C.
#   deploy/local/run.sh [--demo]   (--demo: exit after the queries)
# Env: TSR_PORT (default 7000), TSR_RUN_DIR (default build/run-$TSR_PORT: one folder per
# port, so a second local cluster never touches the first one's data), TSR_SHARDS (default 4).
set -euo pipefail
cd "$(dirname "$0")/../.."
demo=0; [ "${1:-}" = "--demo" ] && demo=1
port=${TSR_PORT:-7000}; dir=${TSR_RUN_DIR:-build/run-$port}; shards=${TSR_SHARDS:-4}
bin=${TSR_BIN:-bin}
target=127.0.0.1:$port
# The coordinator takes $port and shard i takes $port+1+i: refuse to start when one of them
# is in use (otherwise the supervisor restarts the process that cannot bind, forever).
for p in $(seq "$port" $((port + shards))); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p is in use (the cluster needs $port..$((port + shards))); pick others, e.g." \
         "TSR_PORT=$((port + 100)) make $([ $demo = 1 ] && echo demo || echo run)" >&2
    exit 1
  fi
done
# The folder is rebuilt from scratch: refuse when a process still holds one of its data
# directories (each holds DIR/LOCK with flock while it runs), whatever port it serves.
if [ -d "$dir" ]; then
  for lock in "$dir"/coordinator/LOCK "$dir"/shard-*/LOCK; do
    [ -f "$lock" ] || continue
    if ! flock -n "$lock" true 2>/dev/null; then
      echo "$dir is in use by a running cluster ($lock is locked); stop it first, or pick" \
           "another folder: TSR_RUN_DIR=build/run-other TSR_PORT=$((port + 100))" \
           "make $([ $demo = 1 ] && echo demo || echo run)" >&2
      exit 1
    fi
  done
fi
rm -rf "$dir"; mkdir -p "$dir"
echo "== generating a sample batch in $dir/sample/batch"
/usr/bin/python3 tests/data/gen_sample.py "$dir/sample/batch" --n 6000 --dims 64
echo "== starting the cluster: $bin/tessera cluster up --data $dir --shards $shards --port $port"
"$bin/tessera" cluster up --data "$dir" --shards "$shards" --port "$port" &
cluster=$!
stop() { kill -TERM "$cluster" 2>/dev/null || true; wait "$cluster" 2>/dev/null || true; }
trap stop EXIT
trap 'exit 130' INT TERM
for i in $(seq 1 100); do
  "$bin/tessera" stats --target "$target" >/dev/null 2>&1 && break
  kill -0 "$cluster" 2>/dev/null || { echo "cluster exited; see $dir/logs"; exit 1; }
  sleep 0.2
done
"$bin/tessera" stats --target "$target" >/dev/null || { echo "coordinator not answering; see $dir/logs"; exit 1; }
echo "== applying the batch: tessera update --target $target --batch-root $dir/sample/batch"
"$bin/tessera" update --target "$target" --batch-root "$dir/sample/batch"
"$bin/tessera" stats --target "$target"
q=$(cat "$dir/sample/query.txt")
sp=$(cat "$dir/sample/sparse.txt")
echo
echo "== tessera query --target $target --vector <64 floats from $dir/sample/query.txt> --k 5"
"$bin/tessera" query --target "$target" --vector "$q" --k 5 | tee "$dir/sample/answer-plain.txt"
# The same query with one feature added; demo_explain.py says what changed (the sample
# data make every feature change the answer: tests/data/gen_sample.py).
n=0
feature() { # TITLE WHAT FLAGS...
  local title=$1 what=$2; shift 2
  n=$((n + 1))
  echo
  echo "== $title: $*"
  "$bin/tessera" query --target "$target" --vector "$q" --k 5 "$@" | tee "$dir/sample/answer-$n.txt"
  /usr/bin/python3 deploy/local/demo_explain.py "$dir/sample/demo.json" \
    "$dir/sample/answer-plain.txt" "$dir/sample/answer-$n.txt" "$what"
}
feature "restrict (only red)" restrict:color=red --restrict color=red
feature "deny (no red)" deny:color=red --deny color=red
feature "numeric restrict (price >= 50)" 'numeric:price>=50' --numeric 'price>=50'
feature "crowding (one hit per shop)" crowding:1 --crowding 1
feature "hybrid (dense + sparse, RRF)" "hybrid:$sp" --sparse "$sp" --alpha 0.5
echo
echo "== tessera read --target $target dp-00003"
"$bin/tessera" read --target "$target" dp-00003 | cut -c1-160
if [ $demo = 1 ]; then
  echo "== demo done; stopping the cluster"
  exit 0
fi
echo
echo "== serving on $target (logs in $dir/logs); Ctrl-C to stop"
wait "$cluster"
