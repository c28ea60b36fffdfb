# rpc benchmark (owner: rpc). `make bench-rpc [BENCH_RPC_ARGS="--seconds 3 --size 1024 | --cqs N --pollers N | --chain 4"]`
BENCH_RPC_BIN := $(BUILD)/bench/bench_rpc
BENCH_RPC_ARGS ?=

$(BENCH_RPC_BIN): $(BUILD)/obj/bench/bench_rpc.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

bench-rpc: $(BENCH_RPC_BIN)
	$(BENCH_RPC_BIN) $(BENCH_RPC_ARGS)
