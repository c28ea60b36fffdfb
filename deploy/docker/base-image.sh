#!/usr/bin/env bash
# Makes the Debian 12 base image the Dockerfile's FROM lines name, from Debian's own
# packages with debootstrap, when it is missing (no registry is needed or reached).
# Every name a FROM uses is tagged: docker.io/library/debian:12 and :12-slim.
# About 2.5 minutes on 2 cores; ~200 MB. Needs root (debootstrap) and podman.
#   deploy/docker/base-image.sh [--force]
set -euo pipefail
names=(docker.io/library/debian:12 docker.io/library/debian:12-slim)
mirror=${TSR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "${1:-}" != "--force" ]; then
  have=1
  for n in "${names[@]}"; do podman image exists "$n" || have=0; done
  [ $have = 1 ] && exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "base-image: debootstrap bookworm (minbase) from $mirror"
nice -n 10 debootstrap --variant=minbase bookworm "$tmp/rootfs" "$mirror" >"$tmp/log" 2>&1 \
  || { tail -20 "$tmp/log"; exit 1; }
# The security and updates suites too, as on a stock Debian 12 image.
cat > "$tmp/rootfs/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"*
# podman import leaves the image's config empty: give it the PATH and CMD of Debian's own
# image (a container or pod of the base image itself would otherwise find no program).
tar -C "$tmp/rootfs" -c . | podman import -q \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' - "${names[0]}" >/dev/null
for n in "${names[@]:1}"; do podman tag "${names[0]}" "$n"; done
echo "base-image: ${names[*]}"
