# Tessera — GNU Makefile.
#   make            build bin/tessera, bin/tessera-shard, bin/tessera-coordinator, libtessera.a
#   make test       build and run every test (layers, unit, tools, interop, deploy, integration,
#                   fuzz-corpus replay)
#   make check-layers  the include rules between common/'s layers (part of make test)
#   make test-san   the unit, interop, integration and fault tests against ASan+UBSan
#   make test-ha    the high-availability tests alone (etcd + several coordinators)
#   make chaos [SECONDS=120] [SEED=1]   random faults + history checker (docs/reliability.md)
#   make soak [SECONDS=N]   steady load: RSS, fds, p50/p99 per interval and a verdict
#   make deps       install the Debian packages the project needs (idempotent)
#   make SANITIZE=address,undefined | SANITIZE=thread   sanitizer build under build/san-*/
#   make TESTING=1  the test build under build/testing/ (test hooks and A/B knobs compiled
#                   in: docs/testing.md; sanitizer builds have them too, bin/ never)
#   make fuzz FUZZ_SECONDS=N   run each libFuzzer harness for N seconds
#   make fuzz-long [FUZZ_SECONDS=N]  a campaign: N s (default 600) per harness, corpus merged, a table
#   make bench-search | bench-ingest | bench-rpc | bench-e2e | bench-query | bench-cluster | bench-knn | bench-memory | bench-ha | bench-ha-elect   benchmarks (not part of test)

CC       ?= cc
OPT      ?= -O2
WERROR   ?=
PKGS     := grpc gpr libprotobuf-c jansson libuv avro-c
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
BLAS_LIBS  := -lopenblas

# Three kinds of build. The release one (bin/) holds no test hook or A/B knob. A test
# build compiles them in (-DTSR_TESTING: the table of common/core/testing.h, the only
# difference): `make TESTING=1` (build/testing/bin: the unit tests, and the integration
# tests that set a hook, via TSR_TEST_BIN) and every sanitizer build.
comma := ,
ifdef SANITIZE
  VARIANT := san-$(subst $(comma),-,$(SANITIZE))
  BUILD   := build/$(VARIANT)
  BIN     := $(BUILD)/bin
  LIB     := $(BUILD)/libtessera.a
  SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
  OPT     := -O1
  TESTFLAGS := -DTSR_TESTING
else ifdef TESTING
  BUILD   := build/testing
  BIN     := $(BUILD)/bin
  LIB     := $(BUILD)/libtessera.a
  SANFLAGS :=
  TESTFLAGS := -DTSR_TESTING
else
  BUILD   := build/release
  BIN     := bin
  LIB     := libtessera.a
  SANFLAGS :=
  TESTFLAGS :=
endif

CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) -g -pthread -Wall -Wextra -Wstrict-prototypes \
           -Wmissing-prototypes -Wno-unused-parameter $(WERROR) $(SANFLAGS) $(TESTFLAGS) -MMD -MP \
           -Icommon -Ibuild/gen $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := -pthread $(SANFLAGS)
LDLIBS  := $(PKG_LIBS) $(BLAS_LIBS) -lz -lm

AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma

# ---- generated protobuf-c code ---------------------------------------------------------
PROTOS     := $(wildcard proto/tessera/v1/*.proto proto/grpc/health/v1/*.proto proto/google/cloud/aiplatform/container/v1/*.proto proto/google/cloud/aiplatform/v1/*.proto proto/google/rpc/*.proto proto/google/protobuf/*.proto proto/google/longrunning/*.proto proto/etcd/v3/*.proto)
PROTO_C    := $(patsubst proto/%.proto,build/gen/%.pb-c.c,$(PROTOS))
PROTO_H    := $(PROTO_C:.c=.h)

build/gen/%.pb-c.c build/gen/%.pb-c.h: proto/%.proto
	@mkdir -p build/gen
	protoc-c --proto_path=proto --c_out=build/gen $<

# ---- sources ----------------------------------------------------------------------------
COMMON_SRC := $(wildcard common/*/*.c)
CLI_SRC    := $(wildcard cli/*.c)
SHARD_SRC  := $(wildcard shard/*.c)
COORD_SRC  := $(wildcard coordinator/*.c coordinator/frontend/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(patsubst build/gen/%.c,$(BUILD)/obj/gen/%.o,$(PROTO_C))

TARGETS := $(LIB) $(BIN)/tessera
ifneq ($(SHARD_SRC),)
TARGETS += $(BIN)/tessera-shard
endif
ifneq ($(COORD_SRC),)
TARGETS += $(BIN)/tessera-coordinator
endif
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

.PHONY: check-layers fuzz-build all deps test test-bins testing-build test-san test-ha test-unit test-interop test-integration test-fuzz-replay fuzz fuzz-long chaos soak clean \
        bench-search bench-ingest bench-rpc bench-e2e run demo python-client
all: $(TARGETS)

# Keep objects that pattern-rule chains would otherwise delete as intermediates.
.SECONDARY:

$(BUILD)/obj/%_avx2.o: %_avx2.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@
$(BUILD)/obj/%_avx512.o: %_avx512.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(AVX512_FLAGS) -c $< -o $@
$(BUILD)/obj/gen/%.o: build/gen/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -Wno-missing-prototypes -c $< -o $@
$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(BIN)/tessera: $(call obj,$(CLI_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/tessera-shard: $(call obj,$(SHARD_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/tessera-coordinator: $(call obj,$(COORD_SRC)) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

# ---- tests ------------------------------------------------------------------------------
# TSR_BIN: the binaries under test (the release ones in `make test`); TSR_TEST_BIN: the
# test build's, which the harnesses start for a process given a test hook or A/B knob
# (tests/integration/shard_harness.py, test_bin); TSR_BUILD: the unit tests and shims,
# always from a test build (they set knobs). A sanitizer build is all three.
export TSR_BIN := $(abspath $(BIN))
ifeq ($(TESTFLAGS),)
TEST_BUILD := $(abspath build/testing)
export TSR_BUILD := $(TEST_BUILD)
export TSR_TEST_BIN := $(TEST_BUILD)/bin
else
export TSR_BUILD := $(abspath $(BUILD))
export TSR_TEST_BIN := $(abspath $(BIN))
endif

# `make test` also builds the ASan+UBSan binaries (tests that probe hostile input run them
# too, via TSR_SAN_BIN), the test build (unit tests, hooks) and the libFuzzer harnesses
# whose corpora it replays.
SAN_BIN := $(abspath build/san-address-undefined/bin)
ifeq ($(TESTFLAGS),)
test: all fuzz-build
	@$(MAKE) --no-print-directory check-layers
	@$(MAKE) --no-print-directory TESTING=1 all test-bins
	@$(MAKE) --no-print-directory SANITIZE=address,undefined all
	@TSR_SAN_BIN=$(SAN_BIN) tests/run.sh all
else
test: all $(UNIT_BINS) fuzz-build
	@$(MAKE) --no-print-directory check-layers
	@tests/run.sh all
endif

# The unit tests' binaries of this build (`make TESTING=1 test-bins`).
test-bins: $(UNIT_BINS)

# The test build's binaries, for the benchmarks that compare A/B knobs: their harnesses
# start it for a process given a knob (TSR_TEST_BIN; docs/testing.md).
testing-build:
	@$(MAKE) --no-print-directory TESTING=1 all

# The unit, integration and fault suites against the ASan+UBSan build (the fuzz-corpus
# replay, always sanitized, runs in `make test`). .ci/run runs it after `make test`.
ifndef SANITIZE
test-san:
	@$(MAKE) --no-print-directory SANITIZE=address,undefined test-san
else
test-san: all $(UNIT_BINS)
	@TSR_SAN_BIN=$(TSR_BIN) tests/run.sh unit interop integration faults
endif

# The high-availability tests alone (docs/ha.md; `make test` runs them too): real etcd x3,
# coordinators x2, shard groups x replicas; each SKIPs (exit 77) only without etcd.
test-ha: all
	@fails=0; for t in tests/integration/test_ha_*.py tests/integration/test_reshard_ha.py \
	    tests/integration/test_reshard_sparse.py \
	    tests/integration/test_reshard_ha_crash.py tests/interop/test_ha_clients.py; do \
	  echo "== $$t"; /usr/bin/python3 $$t; rc=$$?; \
	  if [ $$rc -ne 0 ] && [ $$rc -ne 77 ]; then fails=$$((fails+1)); echo "FAIL $$t"; fi; \
	done; test $$fails -eq 0

# Chaos (docs/reliability.md "Chaos"): an HA cluster in network namespaces (root + etcd;
# exit 77 = SKIP otherwise), a seeded fault schedule for SECONDS under queries, streamed
# writes and batch updates, then the history checker; fails on any violation. CI runs the
# 2-minute one (.ci/run). The history and the processes' logs stay under build/chaos/.
# `make soak SECONDS=N [SOAK_ARGS="--etcd-compact S --fold N"]`: steady load, RSS / fds /
# p50 / p99 per interval, a verdict.
SECONDS ?= 120
SEED ?= 1
chaos: all testing-build
	@/usr/bin/python3 tests/chaos/chaos.py --seconds $(SECONDS) --seed $(SEED); rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "chaos: SKIP (needs root for network namespaces, and etcd)"; \
	  else exit $$rc; fi
soak: all testing-build
	@/usr/bin/python3 tests/chaos/soak.py --seconds $(SECONDS) $(SOAK_ARGS); rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "soak: SKIP (needs etcd)"; else exit $$rc; fi

# The include rules of docs/architecture.md ("Layers"): a file includes only its own layer
# and the layers below it; an internal header (*_int.h) only from its own folder. Then no
# call loop between the files of a folder (from the built objects' symbols), and in
# common/, shard/, coordinator/ no file over 1500 lines, no function over 150.
# The source checks run first; the call graph needs only the objects (nothing is linked).
CALLGRAPH_DIRS := coordinator coordinator/frontend shard cli $(sort $(dir $(COMMON_SRC)))
CALLGRAPH_OBJ  := $(call obj,$(COMMON_SRC) $(SHARD_SRC) $(COORD_SRC) $(CLI_SRC))
check-layers:
	@/usr/bin/python3 tests/tools/check_layers.py
	@/usr/bin/python3 tests/tools/check_size.py $(COMMON_SRC) $(SHARD_SRC) $(COORD_SRC)
	@$(MAKE) --no-print-directory -s $(CALLGRAPH_OBJ)
	@/usr/bin/python3 tests/tools/callgraph.py --quiet --build $(BUILD) $(patsubst %/,%,$(CALLGRAPH_DIRS))

ifeq ($(TESTFLAGS),)
test-unit:
	@$(MAKE) --no-print-directory TESTING=1 test-unit
test-interop: all
	@$(MAKE) --no-print-directory TESTING=1 all test-bins
	@tests/run.sh interop
test-integration: all
	@$(MAKE) --no-print-directory TESTING=1 all test-bins
	@tests/run.sh integration
else
test-unit: all $(UNIT_BINS)
	@tests/run.sh unit
test-interop: all $(UNIT_BINS)
	@tests/run.sh interop
test-integration: all $(UNIT_BINS)
	@tests/run.sh integration
endif

# ---- fuzzing (clang + libFuzzer) -----------------------------------------------------------
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -DTSR_TESTING -O1 -g -pthread -fsanitize=fuzzer-no-link,address,undefined \
               -fno-sanitize-recover=all -Icommon -Ibuild/gen $(PKG_CFLAGS)
FUZZ_COMMON_OBJ := $(patsubst %.c,build/fuzz/obj/%.o,$(COMMON_SRC)) $(patsubst build/gen/%.c,build/fuzz/obj/gen/%.o,$(PROTO_C))
FUZZ_SECONDS ?= 60

build/fuzz/obj/%_avx2.o: %_avx2.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
build/fuzz/obj/%_avx512.o: %_avx512.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
build/fuzz/obj/gen/%.o: build/gen/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
# -MMD -MP: an object follows the headers it includes (build/**/*.d are included below), so an
# incremental fuzz build never links objects compiled against an older struct layout
build/fuzz/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
# coordinator/frontend/ sees the coordinator's headers (coord.h) like the files beside them
build/fuzz/obj/coordinator/frontend/%.o: FUZZ_CFLAGS += -Icoordinator
# The request harnesses of the servers (fuzz_shard_*, fuzz_coord_*) link the server's
# modules (its main.c left out) and see its internal headers.
FUZZ_SHARD_OBJ := $(patsubst %.c,build/fuzz/obj/%.o,$(filter-out shard/main.c,$(SHARD_SRC)))
FUZZ_COORD_OBJ := $(patsubst %.c,build/fuzz/obj/%.o,$(filter-out coordinator/main.c,$(COORD_SRC)))
$(filter build/fuzz/fuzz_shard_%,$(FUZZ_BINS)): build/fuzz/%: tests/fuzz/%.c $(FUZZ_SHARD_OBJ) $(FUZZ_COMMON_OBJ) tests/fuzz/fuzz_shard_common.h tests/fuzz/fuzz_tmp.h
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Ishard -fsanitize=fuzzer $(filter-out %.h,$^) -o $@ $(LDLIBS)
$(filter build/fuzz/fuzz_coord_%,$(FUZZ_BINS)): build/fuzz/%: tests/fuzz/%.c $(FUZZ_COORD_OBJ) $(FUZZ_COMMON_OBJ) tests/fuzz/fuzz_coord_common.h tests/fuzz/fuzz_tmp.h
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Icoordinator -fsanitize=fuzzer $(filter-out %.h,$^) -o $@ $(LDLIBS)
build/fuzz/%: tests/fuzz/%.c $(FUZZ_COMMON_OBJ)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)

fuzz-build: $(FUZZ_BINS)

test-fuzz-replay: $(FUZZ_BINS)
	@tests/run.sh fuzz-replay

# A campaign: each harness FUZZ_SECONDS (default 600 here) with its corpus kept minimized
# (tests/fuzz/fuzz_long.sh prints the table of docs/reliability.md); FUZZ_HARNESSES=... for
# some only.
FUZZ_LONG_SECONDS := $(if $(filter command line environment,$(origin FUZZ_SECONDS)),$(FUZZ_SECONDS),600)
fuzz-long: $(FUZZ_BINS)
	@tests/fuzz/fuzz_long.sh $(FUZZ_LONG_SECONDS) $(FUZZ_HARNESSES)

fuzz: $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p build/fuzz/corpus/$$n; \
	  echo "== $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build/fuzz/corpus/$$n tests/fuzz/corpus/$$n 2>&1 | \
	    grep -E 'stat::number_of_executed_units|ERROR|SUMMARY' ; done

# ---- the main job (README) --------------------------------------------------------------
run: deps
	@$(MAKE) --no-print-directory all
	@deploy/local/run.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@deploy/local/run.sh --demo

# ---- python client stubs (grpcio) ----------------------------------------------------------
# Vertex's MatchService needs google/rpc/status.proto compiled too (BatchMatch answers carry
# a google.rpc.Status); google/protobuf/any.proto comes with python3-protobuf.
PY_PROTOS := google/cloud/aiplatform/container/v1/match_service.proto google/rpc/status.proto \
             tessera/v1/tessera.proto tessera/v1/shard.proto
python-client:
	@mkdir -p build/python
	/usr/bin/python3 -m grpc_tools.protoc -Iproto --python_out=build/python \
	  --grpc_python_out=build/python $(PY_PROTOS)
	@echo "python stubs in build/python: PYTHONPATH=build/python /usr/bin/python3, then e.g." \
	  "from google.cloud.aiplatform.container.v1 import match_service_pb2, match_service_pb2_grpc"

# ---- dependencies -------------------------------------------------------------------------
deps:
	@.ci/deps.sh

clean:
	rm -rf build bin libtessera.a

# Per-area fragments (benchmarks, extra targets), one file per owner.
-include $(wildcard mk/*.mk)

-include $(shell find build -name '*.d' 2>/dev/null)
