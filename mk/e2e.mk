# End-to-end benchmark and the full-size update test (owner: e2e).
#   make bench-e2e      coordinator + 4 shards on loopback vs in-process search and Faiss
#                       (bench/bench_e2e.py; BENCH_E2E_* env vars, see its header)
#   make bench-update   tests/integration/test_coord_update.py at its real size (200k)
BENCH_E2E_BIN := $(BUILD)/bench/bench_e2e

$(BENCH_E2E_BIN): $(BUILD)/obj/bench/bench_e2e.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

.PHONY: bench-update
bench-e2e: all testing-build $(BENCH_E2E_BIN)
	@BENCH_E2E_CLIENT=$(abspath $(BENCH_E2E_BIN)) /usr/bin/python3 bench/bench_e2e.py

bench-update: all
	@TSR_COORD_UPDATE_N=$${TSR_COORD_UPDATE_N:-200000} /usr/bin/python3 tests/integration/test_coord_update.py

# make bench-cluster: the cluster under concurrent clients (1, 4, 16 calls in flight, single
# queries and batches of 32, nprobe 16 and 64) beside the in-process engine on the same file
# and threads and Debian's Faiss, with recall (bench/bench_cluster.py; BENCH_CLUSTER_* env).
BENCH_CLUSTER_BIN := $(BUILD)/bench/bench_cluster

$(BENCH_CLUSTER_BIN): $(BUILD)/obj/bench/bench_cluster.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

.PHONY: bench-cluster
bench-cluster: all $(BENCH_CLUSTER_BIN)
	@BENCH_CLUSTER_CLIENT=$(abspath $(BENCH_CLUSTER_BIN)) /usr/bin/python3 bench/bench_cluster.py
