"""A shard started with --metrics-listen serves Prometheus text whose RPC counters and
latency histogram move when RPCs run (and unknown methods share one label), and the
documented shard gauges tessera_version, tessera_vectors and tessera_lists (0 on an empty
shard; test_cluster_up checks them on a loaded one)."""
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from shard_harness import free_port  # noqa: E402


def scrape(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()


def value(text, pattern):
    m = re.search(r"^" + re.escape(pattern) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    binp = os.environ["TSR_BIN"]
    rpc, mport = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([binp + "/tessera-shard", "--listen", "127.0.0.1:%d" % rpc,
                              "--data", d + "/s", "--metrics-listen", "127.0.0.1:%d" % mport],
                             stderr=subprocess.DEVNULL)
        try:
            ch = grpc.insecure_channel("127.0.0.1:%d" % rpc)
            grpc.channel_ready_future(ch).result(timeout=10)
            stats = ch.unary_unary("/tessera.v1.Shard/Stats")
            stats(b"", timeout=5)
            key = 'tessera_rpc_requests_total{method="/tessera.v1.Shard/Stats",code="OK"}'
            before = value(scrape(mport), key)
            for _ in range(3):
                stats(b"", timeout=5)
            try:
                ch.unary_unary("/nope.Svc/M" + str(time.time()))(b"", timeout=5)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNIMPLEMENTED
            text = scrape(mport)
            after = value(text, key)
            assert after == before + 3, (before, after)
            assert value(text, 'tessera_rpc_duration_seconds_count{method="/tessera.v1.Shard/Stats"}') >= 4
            assert 'method="unknown",code="UNIMPLEMENTED"' in text
            assert "/nope.Svc" not in text
            for g in ("tessera_version", "tessera_vectors", "tessera_lists"):
                assert re.search(r"^%s 0$" % g, text, re.M), (g, text[:3000])
            print("ok: Stats counter %d -> %d" % (before, after))
        finally:
            p.terminate()
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
