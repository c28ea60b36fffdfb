#!/usr/bin/env bash
# Installs what `make image` and `make test-deploy` need: podman (a daemonless engine with
# Docker's CLI and Dockerfile format), runc and debootstrap; then, only when missing, the
# podman settings this kind of machine needs (docs/operations.md "Container image"):
#   - default_ulimits: the sandbox has no CAP_SYS_RESOURCE, so podman's raised default
#     nofile/nproc limits fail with "setrlimit ... Operation not permitted";
#   - runtime runc + cgroupfs: crun refuses the hybrid cgroup layout.
# Idempotent and quiet when all is present. Needs root (apt-get) when something is missing.
set -euo pipefail
# With recommends. netavark + aardvark-dns: containers reach each other by name (netavark
# runs iptables, which a minimal machine lacks: "netavark: No such file or directory");
# catatonit: the pause process of pods (podman kube play).
pkgs=(podman runc debootstrap netavark aardvark-dns catatonit iptables)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps-deploy: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
conf=/etc/containers/containers.conf
if [ ! -e "$conf" ]; then
  echo "deps-deploy: writing $conf"
  mkdir -p "$(dirname "$conf")"
  cat > "$conf" <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
fi
