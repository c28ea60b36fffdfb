"""`--target A,B,...` of the online commands (docs/ha.md), with the real bin/tessera against
a real coordinator and 2 shards; the other address is a loopback port nobody listens on (a
coordinator that is down):

- query, read, stats, health, upsert, remove and update given DEAD,LIVE all succeed, and
  say on stderr that LIVE answered (and why DEAD did not); given LIVE,DEAD they succeed
  without a word;
- DEAD1,DEAD2: the command fails (exit 1) naming the last one tried and "(tried all 2)";
- an empty entry ("A,,B") is a usage error (exit 2).
The leader redirect and the failover of a running update are tested against real
followers in test_ha_failover.py and test_ha_update_kill.py.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 8
N = 400


def run(cl, *args, stdin=None):
    r = subprocess.run([os.path.join(cl.bin, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=120, input=stdin)
    return r.returncode, r.stdout, r.stderr


def main():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-ha-cli-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("c%04d" % i, x[i])
                                                   for i in range(N)])
    cl = ch.Cluster(2, D, {"nlist": 4, "pq_m": 2, "nprobe": 4})
    dead, dead2 = "127.0.0.1:%d" % ch.free_port(), "127.0.0.1:%d" % ch.free_port()
    live = cl.target
    try:
        both = dead + "," + live
        rc, out, err = run(cl, "update", "--target", both, "--batch-root", b0, "--timeout-s",
                           "120")
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err)
        assert "answered by %s (%s: UNAVAILABLE" % (live, dead) in err, err
        vec = ",".join("%g" % v for v in x[5])
        cases = [
            ("query", ["query", "--target", both, "--vector", vec, "--k", "3", "--json"]),
            ("read", ["read", "--target", both, "c0005"]),
            ("stats", ["stats", "--target", both, "--json"]),
            ("health", ["health", "--target", both]),
            ("remove", ["remove", "--target", both, "c0399"]),
        ]
        for name, argv in cases:
            rc, out, err = run(cl, *argv)
            assert rc == 0, (name, rc, out, err)
            assert "answered by %s" % live in err, (name, err)
            rc2, out2, err2 = run(cl, *[a if a != both else live + "," + dead for a in argv])
            assert rc2 == 0 and "answered by" not in err2, (name, rc2, out2, err2)
            print("%-7s DEAD,LIVE ok (%s); LIVE,DEAD ok, quiet" % (name, err.strip()))
        got = json.loads(run(cl, "query", "--target", both, "--vector", vec, "--k", "1",
                             "--json")[1])
        assert got[0]["neighbors"][0]["id"] == "c0005", got
        st = json.loads(run(cl, "stats", "--target", both, "--json")[1])
        assert st["version"] == 1 and st["vectors"] == N - 1, st  # c0399 removed
        line = json.dumps(ch.dp_json("new1", x[0] + 0.5)) + "\n"
        rc, out, err = run(cl, "upsert", "--target", both, "--json", "-", stdin=line)
        assert rc == 0 and "upserted 1 datapoint" in out, (rc, out, err)
        assert "answered by %s" % live in err, err
        rc, out, err = run(cl, "read", "--target", both, "new1")
        assert rc == 0 and '"new1"' in out, (rc, out, err)

        rc, out, err = run(cl, "stats", "--target", dead + "," + dead2)
        assert rc == 1 and "GetIndexStats on %s (tried all 2) failed: UNAVAILABLE" % dead2 in err, \
            (rc, out, err)
        rc, out, err = run(cl, "query", "--target", dead + ",," + live, "--vector", vec)
        assert rc == 2 and "expected ADDR[,ADDR...]" in err, (rc, out, err)
        print("all dead: exit 1 (%s); empty entry: exit 2" % "tried all 2")
    finally:
        cl.stop()
    print("test_ha_cli: OK")


if __name__ == "__main__":
    main()
