# search helper: `make bench-search` (BENCH_N=200000 for a quick run; see bench/bench_search.py)
bench-search: all testing-build
	@/usr/bin/python3 bench/bench_search.py

# make bench-knn: the coarse step alone (tsr_knn, k = nprobe of the 4000 centroids), scalar
# vs AVX-512 row scan alternated in one process (bench/bench_knn.c), on bench-search's data
# (bench/out: made by `make bench-search` or `make bench-cluster`).
BENCH_KNN_BIN := $(BUILD)/bench/bench_knn
BENCH_KNN_DATA := bench/out/v2_n1000000_d64_s2024

$(BENCH_KNN_BIN): $(BUILD)/obj/bench/bench_knn.o $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

.PHONY: bench-knn
ifeq ($(TESTFLAGS),)
bench-knn: # it alternates the kernels with TSR_SIMD: a knob of the test build
	@$(MAKE) --no-print-directory TESTING=1 bench-knn
else
bench-knn: $(BENCH_KNN_BIN)
	@ix=$$(ls $(BENCH_KNN_DATA)_ivf4000_pq64x8_*.faiss 2>/dev/null | head -1); \
	if [ -z "$$ix" ] || [ ! -f $(BENCH_KNN_DATA)_q2000.fvecs ]; then \
	  echo "bench-knn: no bench data in bench/out (run make bench-search or make bench-cluster first)" >&2; exit 1; fi; \
	$(BENCH_KNN_BIN) --index $$ix --queries $(BENCH_KNN_DATA)_q2000.fvecs
endif
