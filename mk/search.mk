# search helper: `make bench-search` (BENCH_N=200000 for a quick run; see bench/bench_search.py)
bench-search: all
	@/usr/bin/python3 bench/bench_search.py
