"""A shard started with --metrics-listen serves Prometheus text whose RPC counters and
latency histogram move when RPCs run (and unknown methods share one label), and the
documented gauges of what it serves (docs/operations.md): tessera_version,
tessera_vectors, tessera_lists — 0 when empty, then equal to Stats' current_version,
vectors_count and number of non-empty lists after a version is committed; and the memory
gauges (tessera_shard_anonymous_bytes, tessera_shard_mapped_bytes and per vector) equal to
Stats', with the raw vectors mapped after a commit and after a restart."""
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402
from shard_harness import free_port  # noqa: E402


def scrape(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()


def value(text, pattern):
    m = re.search(r"^" + re.escape(pattern) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def served_gauges(ch, mport):
    """tessera_version / tessera_vectors / tessera_lists: present at version 0 (all 0), and
    after a commit the served version, its dense datapoints and non-empty lists."""
    sp, spg, tp, _, _ = H.stubs()
    text = scrape(mport)
    for name in ("tessera_version", "tessera_vectors", "tessera_lists"):
        assert re.search(r"^%s 0$" % name, text, re.M), (name, text)
    rng = np.random.default_rng(3)
    d, nlist, m, n = 16, 8, 4, 300
    xt = rng.normal(size=(1000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xt, nlist, m)
    x = rng.normal(size=(n, d)).astype("float32")
    _, a = ix.quantizer.search(x, 1)
    ups = [sp.StagedUpsert(label=i, list=int(a[i, 0]), datapoint=H.datapoint(tp, "v%d" % i, x[i]))
           for i in range(n)]
    # plus one sparse-only datapoint: a datapoint, not a vector
    ups.append(sp.StagedUpsert(label=n, list=-1, datapoint=H.datapoint(
        tp, "sparse", sparse=([3, 9], [0.5, 1.0]))))

    class S:
        stub = spg.ShardStub(ch)
    H.load(S, 1, 0, ups, template=tmpl, own=list(range(nlist)))
    st = S.stub.Stats(sp.ShardStatsRequest(), timeout=5)
    assert st.current_version == 1 and st.vectors_count == n, st
    text = scrape(mport)
    got = {k: value(text, k) for k in ("tessera_version", "tessera_vectors", "tessera_lists")}
    want = {"tessera_version": 1, "tessera_vectors": n, "tessera_lists": len(st.lists)}
    assert got == want, (got, want)
    assert 0 < len(st.lists) <= nlist, st.lists
    print("ok: tessera_version %d, tessera_vectors %d, tessera_lists %d" %
          (got["tessera_version"], got["tessera_vectors"], got["tessera_lists"]))
    # memory (docs/shard.md "Memory"): a prepared version's vectors are mapped from the
    # vectors.f32 it wrote
    memory_gauges(S.stub, sp, mport, n, d, mapped=True)
    return n, d


def memory_gauges(stub, sp, mport, n, d, mapped):
    """Stats' anonymous / mapped bytes (and per vector) and the /metrics gauges agree; the
    raw vectors (n x d floats) are mapped (after a Prepare or a load from disk), or not."""
    st = stub.Stats(sp.ShardStatsRequest(), timeout=5)
    assert st.mapped_bytes == (n * d * 4 if mapped else 0), st
    # codes as scan blocks + labels + records at least; the vectors too when on the heap
    assert st.anonymous_bytes > n * (8 + 8 + (0 if mapped else d * 4)), st
    assert abs(st.anonymous_bytes_per_vector - st.anonymous_bytes / n) < 1e-6, st
    assert abs(st.mapped_bytes_per_vector - st.mapped_bytes / n) < 1e-6, st
    text = scrape(mport)
    for name, want in (("tessera_shard_anonymous_bytes", st.anonymous_bytes),
                       ("tessera_shard_mapped_bytes", st.mapped_bytes),
                       ("tessera_shard_anonymous_bytes_per_vector", st.anonymous_bytes_per_vector),
                       ("tessera_shard_mapped_bytes_per_vector", st.mapped_bytes_per_vector)):
        assert abs(value(text, name) - want) <= 1e-6 * max(1.0, want), (name, want, text[-2000:])
    print("ok: memory %s: anonymous %d B (%.1f per vector), mapped %d B (%.1f per vector)" %
          ("vectors mapped" if mapped else "vectors on the heap", st.anonymous_bytes,
           st.anonymous_bytes_per_vector, st.mapped_bytes, st.mapped_bytes_per_vector))


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
            n, dim = served_gauges(ch, mport)
            ch.close()
            p.terminate()
            p.wait(timeout=10)
            # restarted on the same data: the version is loaded, its vectors.f32 mapped
            p = subprocess.Popen([binp + "/tessera-shard", "--listen", "127.0.0.1:%d" % rpc,
                                  "--data", d + "/s", "--metrics-listen",
                                  "127.0.0.1:%d" % mport], stderr=subprocess.DEVNULL)
            ch = grpc.insecure_channel("127.0.0.1:%d" % rpc)
            grpc.channel_ready_future(ch).result(timeout=10)
            sp, spg = H.stubs()[:2]
            memory_gauges(spg.ShardStub(ch), sp, mport, n, dim, mapped=True)
        finally:
            p.terminate()
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
