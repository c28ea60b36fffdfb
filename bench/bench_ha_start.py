"""make bench-ha: start-up of a coordinator with the etcd backend (docs/coordinator.md
"Start-up cost").

For each size N (BENCH_HA_N, comma list, default 20000,100000): 2 shards, one etcd member,
N records of BENCH_HA_DIMS (16) dims loaded by one update; then the coordinator is restarted
three ways and the time from spawn to serving (its "(port N)" line) is measured:
  empty   --etcd with an EMPTY --data: template, plan and directory downloaded from etcd
  cached  --etcd with the --data of the last run (the files match the digests in etcd)
  local   no --etcd, same --data (today's local backend, for comparison)
and the directory's size and the download time the coordinator logs are printed.
"""
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
    t0 = time.time()
    cl.start(extra_args=extra)
    took = time.time() - t0
    text = cl.coord.text()
    cl.stop_coord()
    m = re.search(r"loaded into the cache \((\d+) bytes, (\d+) ms\)", text)
    return took, (int(m.group(1)), int(m.group(2))) if m else None


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
        dsize = os.path.getsize(os.path.join(data, "v000001", "directory"))
        shutil.rmtree(data)
        os.makedirs(data)
        empty, dl = timed_start(cl, extra)
        cached, _ = timed_start(cl, extra)
        local, _ = timed_start(cl, [])
        return dsize, dl, empty, cached, local
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
    print("%10s %12s %14s %14s %12s %12s" % ("ids", "directory B", "etcd download",
                                                "start empty", "start cached", "start local"))
    for n, dsize, dl, empty, cached, local in rows:
        print("%10d %12d %11s ms %12.2f s %10.2f s %10.2f s" % (
            n, dsize, dl[1] if dl else "-", empty, cached, local))


if __name__ == "__main__":
    main()
