# tessera-shard extras (owner: shard): the shard Search RPC-cost benchmark (issue 4,
# point 7). `make bench-rpc` runs it (as a prerequisite, beside rpc's own bench-rpc
# recipe); `make bench-shard-rpc [BENCH_SHARD_ARGS="--n 100000 --nprobe 16 --threads 4"]`
# runs only it.
SHARD_LIB_OBJ := $(filter-out %/shard/main.o,$(call obj,$(SHARD_SRC)))
BENCH_SHARD_ARGS ?=

.PHONY: bench-shard-rpc
$(BUILD)/bench/bench_shard: $(BUILD)/obj/bench/bench_shard.o $(SHARD_LIB_OBJ) $(LIB)
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
