# Query-time parts' CPU cost (owner: query). `make bench-query`: the filter's per-row test
# and the sparse index's build and search, one thread (bench/bench_query.c).
BENCH_QUERY_BIN := $(BUILD)/bench/bench_query

$(BENCH_QUERY_BIN): $(BUILD)/obj/bench/bench_query.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

.PHONY: bench-query
bench-query: $(BENCH_QUERY_BIN)
	@$(BENCH_QUERY_BIN)

# What the default exact re-rank costs (bench/bench_rerank.py: a 4-shard cluster on
# loopback, FindNeighbors with approximate_neighbor_count 0 vs the default, one run).
.PHONY: bench-rerank
bench-rerank: all
	@TSR_BIN=$(abspath $(BIN)) /usr/bin/python3 bench/bench_rerank.py
