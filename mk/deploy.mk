# The container image and the containers' cluster test (owner: image; docs/operations.md
# "Container image").
#   make image         builds deploy/docker/Dockerfile with podman into tessera:<version>
#                      and tessera:dev (makes the Debian base image first when missing)
#   make test-deploy   the image, then tests/deploy/test_containers.py: a coordinator and 4
#                      shards in containers on a podman network, and podman kube play of
#                      the Kubernetes manifests' Pod forms (not part of `make test`)
# Podman work runs under `nice -n 10` (the build is CPU-bound; others share the machine).
TSR_VERSION_STR := $(shell sed -n 's/^\#define TSR_VERSION "\(.*\)"/\1/p' common/core/version.h 2>/dev/null)
IMAGE ?= tessera
PODMAN_BUILD_JOBS ?= 2

.PHONY: image test-deploy deps-deploy
deps-deploy:
	@.ci/deps-deploy.sh

image: deps-deploy
	@deploy/docker/base-image.sh
	@t0=$$(date +%s); \
	  nice -n 10 podman build --pull=never --jobs $(PODMAN_BUILD_JOBS) -f deploy/docker/Dockerfile \
	    -t $(IMAGE):$(TSR_VERSION_STR) -t $(IMAGE):dev . && \
	  echo "image $(IMAGE):$(TSR_VERSION_STR) (also $(IMAGE):dev): built in $$(( $$(date +%s) - t0 ))s," \
	    "$$(podman image inspect --format '{{.Size}}' $(IMAGE):$(TSR_VERSION_STR)) bytes"

test-deploy: image all
	@TSR_IMAGE=$(IMAGE):$(TSR_VERSION_STR) /usr/bin/python3 tests/deploy/test_containers.py
