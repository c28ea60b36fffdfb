# tessera-shard extras: the RPC-cost benchmark (issue 4, point 7).
#   make bench-rpc [BENCH_RPC_ARGS="--n 100000 --nprobe 16 --threads 4"]
SHARD_LIB_OBJ := $(filter-out %/shard/main.o,$(call obj,$(SHARD_SRC)))
BENCH_RPC_ARGS ?=

$(BUILD)/bench/bench_shard: $(BUILD)/obj/bench/bench_shard.o $(SHARD_LIB_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/bench/bench_shard.o: bench/bench_shard.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -Ishard -c $< -o $@

bench-rpc: $(BUILD)/bench/bench_shard
	@$(BUILD)/bench/bench_shard $(BENCH_RPC_ARGS)
