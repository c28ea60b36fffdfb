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
