# Batch ingest benchmark (owner: batch). `make bench-ingest [BENCH_RECORDS=N]`:
# 1M records of dimension 64 per format (CSV, JSON, Avro), one reader thread.
# Data is generated once under build/bench-ingest/ (not in the source tree).
BENCH_RECORDS ?= 1000000
BENCH_DIMS    ?= 64
BENCH_INGEST_DIR := build/bench-ingest

$(BUILD)/bench/bench_ingest: bench/bench_ingest.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)

bench-ingest: $(BUILD)/bench/bench_ingest
	@mkdir -p $(BENCH_INGEST_DIR)
	@f=$(BENCH_INGEST_DIR)/bench_$(BENCH_RECORDS)_$(BENCH_DIMS).avro; \
	  if [ ! -f $$f ]; then echo "generating $$f with python avro (once)"; \
	    /usr/bin/python3 bench/gen_avro.py $$f.tmp $(BENCH_RECORDS) $(BENCH_DIMS) && mv $$f.tmp $$f; fi; \
	  taskset -c 0 $(BUILD)/bench/bench_ingest --dir $(BENCH_INGEST_DIR) --records $(BENCH_RECORDS) \
	    --dims $(BENCH_DIMS) --avro $$f
