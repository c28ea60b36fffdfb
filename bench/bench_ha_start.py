"""make bench-ha: start-up of a coordinator with the etcd backend (docs/coordinator.md
"Start-up cost").

For each size N (BENCH_HA_N, comma list, default 20000,100000): 2 shards, one etcd member,
N records of BENCH_HA_DIMS (16) dims loaded by one update; then the coordinator is restarted
four ways and the time from spawn to serving (its "(port N)" line) is measured:
  shards  --etcd with an EMPTY --data: template and plan from etcd, the id directory listed
          from the shards (Shard.List) and checked against its summary in PREFIX/version
  blob    the same, the version record rewritten as one written before the directory left
          etcd (the directory uploaded by this script as PREFIX/blobs/1/directory/ chunks,
          a "file directory LEN DIGEST" line): the coordinator downloads it as before
  cached  --etcd with the --data of the last run (the files match the record)
  local   no --etcd, same --data (the local backend, for comparison)
and the directory's size and the times the coordinator logs (the rebuild from the shards,
the whole load into the cache) are printed, side by side.
"""
import base64
import json
import urllib.request
import os
import re
import shutil
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_ha_core as ha  # noqa: E402


def timed_start(cl, extra):
    """(seconds from spawn to serving, ms of the load into the cache or None, ms of the
    directory's rebuild from the shards or None)."""
    t0 = time.time()
    cl.start(extra_args=extra)
    took = time.time() - t0
    text = cl.coord.text()
    cl.stop_coord()
    m = re.search(r"loaded into the cache \([^)]*, (\d+) ms\)", text)
    r = re.search(r"rebuilt from \d+ shard group\(s\): \d+ ids, \d+ bytes, (\d+) ms", text)
    return took, int(m.group(1)) if m else None, int(r.group(1)) if r else None


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for c in b:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def etcd_put(etcd, key, value):
    """One put through etcd's JSON gateway (binary values)."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value).decode()}).encode()
    urllib.request.urlopen(urllib.request.Request(
        "http://%s/v3/kv/put" % etcd.endpoints, data=body), timeout=30).read()


def old_record(etcd, prefix, directory):
    """PREFIX/version as a coordinator before this change wrote it: the directory as a blob
    in 1 MiB chunks and its "file directory LEN DIGEST" line instead of "dirsum"."""
    rec = ha.etcdctl(etcd, "get", "--print-value-only", prefix + "/version")
    line = [ln for ln in rec.split("\n") if ln.startswith("dirsum ")][0]
    chunk = 1 << 20
    for k in range(0, max(len(directory), 1), chunk):
        etcd_put(etcd, "%s/blobs/1/directory/%08d" % (prefix, k // chunk),
                 directory[k:k + chunk])
    old = "file directory %d %016x" % (len(directory), fnv1a64(directory))
    ha.etcdctl(etcd, "put", prefix + "/version", rec.strip("\n").replace(line, old) + "\n")


def one(n, dims, etcd):
    tp = ch.stubs()[0]
    prefix = "/tessera/bench-%d" % n
    extra = ["--etcd", etcd.endpoints, "--etcd-prefix", prefix]
    cl = ch.Cluster(nshards=2, dims=dims, config={"nlist": 256, "pq_m": 4},
                    coord_extra=extra)
    try:
        ha.wait_leader(tp, cl.stub, cl.target, 10)
        rng = np.random.default_rng(1)
        x = rng.normal(size=(n, dims)).astype("float32")
        root = ch.write_batch(os.path.join(cl.root, "b0"),
                              [ch.dp_json("id-%09d" % i, x[i]) for i in range(n)])
        op = ha.update(tp, cl.stub, root, timeout=1800)
        assert op.state == tp.Operation.SUCCEEDED, op
        cl.stop_coord()
        data = os.path.join(cl.root, "coordinator")
        with open(os.path.join(data, "v000001", "directory"), "rb") as f:
            directory = f.read()
        shutil.rmtree(data)
        os.makedirs(data)
        shards = timed_start(cl, extra)
        cached = timed_start(cl, extra)
        local = timed_start(cl, [])
        old_record(etcd, prefix, directory)
        shutil.rmtree(data)
        os.makedirs(data)
        blob = timed_start(cl, extra)
        return len(directory), shards, blob, cached[0], local[0]
    finally:
        cl.stop()


def main():
    sizes = [int(s) for s in os.environ.get("BENCH_HA_N", "20000,100000").split(",")]
    dims = int(os.environ.get("BENCH_HA_DIMS", "16"))
    etcd = ha.Etcd()
    rows = []
    try:
        for n in sizes:
            rows.append((n,) + one(n, dims, etcd))
    finally:
        etcd.stop()
    print("%10s %12s %12s %12s %12s %12s %12s %12s %12s" % (
        "ids", "directory B", "list shards", "load shards", "start shards", "load blob",
        "start blob", "start cached", "start local"))
    dash = lambda v: "-" if v is None else v  # noqa: E731
    for n, dsize, sh_, bl, cached, local in rows:
        print("%10d %12d %9s ms %9s ms %10.2f s %9s ms %10.2f s %10.2f s %10.2f s" % (
            n, dsize, dash(sh_[2]), dash(sh_[1]), sh_[0], dash(bl[1]), bl[0], cached, local))


if __name__ == "__main__":
    main()
