#!/usr/bin/env bash
# Installs the Debian packages Tessera needs; quiet and quick when all are present.
# TSR_DEPS=build installs only what building the three binaries needs (the container
# image's build stage: no clang, test libraries, python or node).
set -euo pipefail
cd "$(dirname "$0")/.."
build_pkgs=(
  build-essential pkg-config
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libjansson-dev libuv1-dev libavro-dev libopenblas-dev zlib1g-dev
)
if [ "${TSR_DEPS:-all}" = build ]; then
  pkgs=("${build_pkgs[@]}")
else
  pkgs=(
    "${build_pkgs[@]}" clang libclang-rt-14-dev libcmocka-dev
    python3-faiss python3-numpy python3-avro python3-grpcio python3-grpc-tools python3-protobuf python3-yaml
    iproute2 curl openssl etcd-server etcd-client
  )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ "${TSR_DEPS:-all}" = build ] || command -v node >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# node packages of the interop tests (grpc-js, @google-cloud/aiplatform), from the lock
# file: installed when missing or older than the lock file
nm=tests/interop/node/node_modules
if [ "${TSR_DEPS:-all}" != build ] && [ -f tests/interop/node/package-lock.json ] &&
   { [ ! -d "$nm" ] || [ tests/interop/node/package-lock.json -nt "$nm/.package-lock.json" ]; }; then
  (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
