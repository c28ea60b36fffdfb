# Streamed writes and the fold under load (owner: stream-checks; issue 15 points 4 and 5).
#   make bench-stream   1M x 64, 4 shards: records/s acknowledged at 1/16/64 per call with 1
#                       and 8 client processes, ack p50/p99; query QPS/p50/p99 quiet vs under
#                       a 1,000 records/s stream; then a 10 % delta folded under query load
#                       and the folded slices checked in stock Faiss (bench/bench_stream.py;
#                       BENCH_STREAM_N=100000 for a quick run, other BENCH_STREAM_* in its
#                       header).
.PHONY: bench-stream
bench-stream: all
	@TSR_BIN=$(abspath $(BIN)) /usr/bin/python3 bench/bench_stream.py
