#!/usr/bin/env bash
# gen_seeds.sh — (re)writes the seed inputs of the request harnesses into their committed
# corpora (tests/fuzz/corpus/<harness>/): each harness that knows seeds writes them with the
# real protobuf-c code of the real messages when TSR_FUZZ_SEEDS names a folder, and exits.
# Run after `make fuzz-build`; then commit the corpus folders.
set -eu
cd "$(dirname "$0")/../.."
for n in fuzz_shard_rpc fuzz_shard_wal fuzz_etcd_response; do  # the coordinator's: gen_seeds_coord.py
  mkdir -p "tests/fuzz/corpus/$n"
  TSR_FUZZ_SEEDS="tests/fuzz/corpus/$n" "build/fuzz/$n" -runs=0 >/dev/null 2>&1 || true
  echo "$n: $(ls "tests/fuzz/corpus/$n" | wc -l) inputs"
done
