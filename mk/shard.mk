# tessera-shard extras (owner: shard): the shard Search RPC-cost benchmark (issue 4,
# point 7). `make bench-rpc` runs it (as a prerequisite, beside rpc's own bench-rpc
# recipe); `make bench-shard-rpc [BENCH_SHARD_ARGS="--n 100000 --nprobe 16 --threads 4"]`
# runs only it.
#
# shard/ minus main.c is also a static library, libtsr_shard.a, so its modules (slice
# metadata, update phases, scan) can be linked into C unit tests: a unit test named
# tests/unit/test_shard_*.c is compiled with -Ishard (it includes "shard.h") and linked
# with the library before libtessera.a. `make all` builds the library too.
SHARD_LIB_OBJ := $(filter-out %/shard/main.o,$(call obj,$(SHARD_SRC)))
SHARD_LIB := $(BUILD)/libtsr_shard.a
BENCH_SHARD_ARGS ?=

all: $(SHARD_LIB)

$(SHARD_LIB): $(SHARD_LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/tests/unit/test_shard_%.o: tests/unit/test_shard_%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -Ishard -c $< -o $@

$(BUILD)/tests/test_shard_%: $(BUILD)/obj/tests/unit/test_shard_%.o $(SHARD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

.PHONY: bench-shard-rpc
$(BUILD)/bench/bench_shard: $(BUILD)/obj/bench/bench_shard.o $(SHARD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/bench/bench_shard.o: bench/bench_shard.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -Ishard -c $< -o $@

bench-shard-rpc: $(BUILD)/bench/bench_shard
	@$(BUILD)/bench/bench_shard $(BENCH_SHARD_ARGS)

bench-rpc: bench-shard-rpc

# Streamed writes on one shard (issue 15): Write records/s and ack latency at 1/16/64 per
# call, Search p50/p99 quiet vs under a 1,000 records/s stream vs with a delta vs folded.
# `make bench-shard-stream [BENCH_SHARD_STREAM_ARGS="--n 200000 --delta 20000"]`.
BENCH_SHARD_STREAM_ARGS ?=
.PHONY: bench-shard-stream
bench-shard-stream: all
	@/usr/bin/python3 bench/bench_shard_stream.py $(BENCH_SHARD_STREAM_ARGS)

# make bench-memory: memory per vector of 4 shards on the bench-search data (smaps_rollup
# anonymous / file-backed and the shards' Stats) and the exact re-rank's QPS with the raw
# vectors mapped vs on the heap (bench/bench_memory.py; BENCH_MEMORY_BEFORE_BIN=<bin dir of
# an older build> adds its row).
.PHONY: bench-memory
bench-memory: all testing-build $(BENCH_CLUSTER_BIN)
	@BENCH_CLUSTER_CLIENT=$(abspath $(BENCH_CLUSTER_BIN)) /usr/bin/python3 bench/bench_memory.py
