"""`tessera update` output and silent successes (issue 13 items 8 and 9), with the real
bin/tessera against a coordinator and 2 shards:

- a rejected batch names FILE:LINE: TYPE on the human lines (as `batch inspect` does), the
  JSON report is not printed unless asked (--json prints it within the operation, --report
  FILE writes it), and its counts add up: records = valid + invalid (a 2-line file with one
  bad line: 2 = 1 + 1; before: "records": 1);
- an empty batch_root is REJECTED ("nothing to apply") and the version stays (before: it
  SUCCEEDED with a new version equal to the last);
- deleting ids the index does not hold succeeds with a warning counting and naming them
  (before: no word), on stderr and in the operation's warnings; tessera_update_records_total
  grows by the lines read (before: a delete line counted twice).
"""
import json
import os
import re
import subprocess
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 8
N = 400


def update(cl, root, *extra):
    r = subprocess.run([os.path.join(cl.bin, "tessera"), "update", "--target", cl.target,
                        "--batch-root", root, "--timeout-s", "120"] + list(extra),
                       capture_output=True, text=True, timeout=180)
    return r.returncode, r.stdout, r.stderr


def records_metric(mport):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        m = re.search(r"^tessera_update_records_total (\S+)$", r.read().decode(), re.M)
    return float(m.group(1))


def put(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-cli-update-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("u%04d" % i, x[i])
                                                   for i in range(N)])
    cl = ch.Cluster(2, D, {"nlist": 4, "pq_m": 2, "nprobe": 2})
    mport = ch.free_port()
    try:
        cl.stop_coord()
        cl.start(extra_args=["--metrics-listen", "127.0.0.1:%d" % mport])
        rc, out, err = update(cl, b0)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err)
        assert "batch: %d records (%d valid, 0 invalid); %d upserts" % (N, N, N) in out, out
        assert '"batch_root"' not in out + err, (out, err)  # no JSON report by default
        print("good batch:", out.strip().replace("\n", " | "))

        # 8. a rejected batch: file:line and type on the human lines, counts add up
        bad = os.path.join(root, "bad")
        put(os.path.join(bad, "x.json"),
            json.dumps(ch.dp_json("ok", x[0])) + "\n" + json.dumps(ch.dp_json("short", x[1][:3]))
            + "\n")
        rc, out, err = update(cl, bad)
        assert rc == 1 and "REJECTED: 1 invalid record; max_invalid_records is 0" in out, \
            (rc, out, err)
        assert "x.json:2: EMBEDDING_SIZE_MISMATCH: " in out, out
        assert "batch: 2 records (1 valid, 1 invalid)" in out, out
        assert '"batch_root"' not in out + err and len((out + err).splitlines()) < 8, (out, err)
        print("rejected batch:", out.strip().replace("\n", " | "))
        rep_path = os.path.join(root, "report.json")
        rc, out, err = update(cl, bad, "--json", "--report", rep_path)
        assert rc == 1, (rc, out, err)
        o = json.loads(out)
        assert o["state"] == "REJECTED", o
        for rep in (o["report"], json.load(open(rep_path))):
            assert rep["records"] == 2 == rep["valid_records"] + rep["invalid_records"], rep
            assert rep["valid_records"] == 1 and rep["invalid_records"] == 1, rep
            assert rep["files"][0]["errors"][0]["line"] == 2, rep
        # tolerated: it succeeds and still names the skipped record
        rc, out, err = update(cl, bad, "--max-invalid-records", "1")
        assert rc == 0 and "SUCCEEDED, version 2" in out, (rc, out, err)
        assert "x.json:2: EMBEDDING_SIZE_MISMATCH" in out, out

        # 9. an empty batch_root: REJECTED, the version stays
        empty = os.path.join(root, "empty")
        os.makedirs(empty)
        rc, out, err = update(cl, empty)
        assert rc == 1 and "REJECTED" in out and "nothing to apply" in out, (rc, out, err)
        assert cl.stats().shards[0].version == 2, cl.stats()
        print("empty batch:", out.strip().replace("\n", " | "))

        # 9. deletes of unknown ids: done, with a warning counting and naming them
        dels = ch.write_batch(os.path.join(root, "dels"), [],
                              deletes=["u0001", "nope-1", "nope-2"])
        before = records_metric(mport)
        rc, out, err = update(cl, dels)
        assert rc == 0 and "SUCCEEDED, version 3" in out, (rc, out, err)
        # 3 lines read (before: the deletes were counted twice, 6)
        assert records_metric(mport) - before == 3, (before, records_metric(mport))
        want = "2 deleted ids are not in the index (version 2), ignored: 'nope-1', 'nope-2'"
        assert "warning: " + want in err, err
        rc, out, err = update(cl, dels, "--json")
        o = json.loads(out)
        assert o["state"] == "SUCCEEDED" and any(
            "3 deleted ids are not in the index (version 3)" in w for w in o["warnings"]), o
        print("unknown deletes:", want)
    finally:
        cl.stop()
    print("test_cli_update: OK")


if __name__ == "__main__":
    main()
