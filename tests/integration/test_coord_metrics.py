"""The coordinator's /metrics (issue 7, "what must be true" 4): a curl-style GET over HTTP
(urllib) of a coordinator started with --metrics-listen, in front of 2 shard groups (group
0 with 2 replicas, group 1 with 1). Asserts the text is valid Prometheus exposition format
(every sample has a TYPE, histograms are cumulative and end in +Inf = _count), and that:
- shard health per group and replica (tessera_shard_up, _consecutive_failures,
  _group_up, _replicas_up) is 1/0 as it should be, and goes to 0 after a shard is killed;
- the served version (coordinator and per replica), vectors and lists per shard (plan and
  Stats) appear and move with an update;
- update progress (phase, files/records read, groups staged/prepared/committed, running)
  and results/errors by type (committed, rejected → EREJECTED, failed) move;
- query counters (tessera_queries_total, shards touched, lists probed, the rpc server's
  FindNeighbors count and the coordinator → shard Search calls) move with queries.
"""
import json
import os
import re
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 20000
NLIST = 32


def start_coord(cl, port, mport):
    """The coordinator on a fixed port (restarts keep it) with its metrics endpoint."""
    cl.start(listen_port=port, extra_args=["--metrics-listen", "127.0.0.1:%d" % mport])


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                    r',?)*)\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$')


def scrape(mport):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers.get("Content-Type", "")
        assert ctype.startswith("text/plain") and "0.0.4" in ctype, ctype
        return r.read().decode()


def parse(text):
    """{(name, frozenset(labels))): value}; checks the format on the way."""
    types, out = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            assert typ in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = typ
            continue
        if line.startswith("# HELP ") or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "not a Prometheus sample line: %r" % line
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or (base in types and types[base] == "histogram"), \
            "sample without TYPE: " + line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(name, labels)] = float(m.group(4))
    # histograms: cumulative buckets, +Inf == _count
    for (name, labels), v in out.items():
        if name.endswith("_count") and types.get(name[:-6]) == "histogram":
            inf = out.get((name[:-6] + "_bucket", labels | {("le", "+Inf")}))
            assert inf == v, (name, labels, inf, v)
    return types, out


def val(samples, name, **labels):
    """Sum over the series of `name` whose labels include `labels` (None when none)."""
    want = {(k, str(v)) for k, v in labels.items()}
    vs = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(vs) if vs else None


def wait_for(what, mport, pred, timeout=20):
    t0 = time.time()
    while True:
        _, s = parse(scrape(mport))
        if pred(s):
            return s
        if time.time() - t0 > timeout:
            raise AssertionError("timed out waiting for %s:\n%s" % (what, scrape(mport)))
        time.sleep(0.1)


def documented_metrics():
    """Metric names of the tables in docs/operations.md "## Metrics" (first column)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                        "operations.md")
    with open(path) as f:
        text = f.read()
    sec = text.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in sec.splitlines():
        if line.startswith("| `tessera_"):
            names.update(re.findall(r"`(tessera_[a-z0-9_]+)`", line.split("|")[1]))
    assert len(names) > 20, names
    return names


def check_docs(mport):
    """Every documented metric is in a scrape (the coordinator has seen updates, queries,
    failures by now), and every tessera_* family the coordinator exports is documented."""
    types, _ = parse(scrape(mport))
    docs = documented_metrics()
    exported = {n for n in types if n.startswith("tessera_")}
    missing = sorted(docs - exported)
    assert not missing, "documented in docs/operations.md but not in /metrics: %s" % missing
    # shard-only families are documented in prose; the coordinator does not export them
    undocumented = sorted(exported - docs)
    assert not undocumented, "in /metrics but not in docs/operations.md: %s" % undocumented
    print("docs/operations.md: all %d documented metrics present in a scrape" % len(docs))


def main():
    tp, _, sp, _ = ch.stubs()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-coord-metrics-")
    recs = [ch.dp_json("m%05d" % i, x[i]) for i in range(N)]
    b0 = ch.write_batch(os.path.join(root, "b0"), recs, per_file=N // 2)  # 2 files
    cl = ch.Cluster(3, D, {"nlist": NLIST, "pq_m": 4, "nprobe": 8})
    cl.stop_coord()
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = [[cl.shards[0].target, cl.shards[1].target], cl.shards[2].target]
    with open(cl.config, "w") as f:
        json.dump(c, f)
    port, mport = ch.free_port(), ch.free_port()
    start_coord(cl, port, mport)
    addr = [s.target for s in cl.shards]
    try:
        # health before any version: every replica up, version 0, idle
        s = wait_for("every replica up", mport, lambda s: all(
            val(s, "tessera_shard_up", address=a) == 1 for a in addr))
        types, _ = parse(scrape(mport))
        for fam, typ in [("tessera_shard_up", "gauge"), ("tessera_version", "gauge"),
                         ("tessera_shard_consecutive_failures", "gauge"),
                         ("tessera_update_phase", "gauge"), ("tessera_update_shards", "gauge"),
                         ("tessera_update_running", "gauge")]:
            assert types.get(fam) == typ, (fam, types.get(fam))
        assert val(s, "tessera_shard_up", shard=0, replica=1, address=addr[1]) == 1
        assert val(s, "tessera_shard_up", shard=1, replica=0, address=addr[2]) == 1
        assert val(s, "tessera_shard_replicas", shard=0) == 2
        assert val(s, "tessera_shard_replicas_up", shard=0) == 2
        assert val(s, "tessera_shard_consecutive_failures", address=addr[0]) == 0
        assert val(s, "tessera_version") == 0
        assert val(s, "tessera_update_phase", phase="idle") == 1
        assert val(s, "tessera_update_running") == 0

        # an update: watch it run from a scraper thread
        seen = {"running": 0, "phases": set()}
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                try:
                    _, w = parse(scrape(mport))
                except Exception:
                    continue
                if val(w, "tessera_update_running") == 1:
                    seen["running"] += 1
                for ph in ("validate", "stage", "prepare", "commit"):
                    if val(w, "tessera_update_phase", phase=ph) == 1:
                        seen["phases"].add(ph)
                time.sleep(0.01)

        th = threading.Thread(target=watch)
        th.start()
        t0 = time.time()
        op = cl.update(b0)
        took = time.time() - t0
        stop.set()
        th.join(30)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        s = wait_for("replica stats at version 1", mport, lambda s: all(
            val(s, "tessera_shard_version", address=a) == 1 for a in addr))
        assert seen["running"] >= 1, (seen, took)
        assert val(s, "tessera_version") == 1
        assert val(s, "tessera_update_running") == 0
        assert val(s, "tessera_update_phase", phase="idle") == 1
        assert val(s, "tessera_updates_total", result="committed") == 1
        assert val(s, "tessera_update_records_total") >= N
        assert val(s, "tessera_update_files_total") == 2 and val(s, "tessera_update_files_read") == 2
        assert val(s, "tessera_update_records_read") == N
        for step in ("total", "staged", "prepared", "committed"):
            assert val(s, "tessera_update_shards", step=step) == 2, (step, s)
        assert val(s, "tessera_plan_vectors") == N
        assert val(s, "tessera_plan_lists") == NLIST
        pv = [val(s, "tessera_plan_vectors", shard=g) for g in (0, 1)]
        sv = [val(s, "tessera_shard_vectors", address=a) for a in addr]
        assert sv[0] == sv[1] == pv[0] and sv[2] == pv[1], (pv, sv)
        sl = [val(s, "tessera_shard_lists", address=a) for a in addr]
        assert sl[0] == sl[1] and 0 < sl[0] + sl[2] <= NLIST, sl
        assert val(s, "tessera_shard_calls_total", method="/tessera.v1.Shard/Stage", code="OK") >= 3
        assert val(s, "tessera_shard_calls_total", method="/tessera.v1.Shard/Commit",
                   code="OK") == 3
        print("update: %.2fs, seen running in %d scrapes, phases %s; plan vectors %s, replica "
              "vectors %s, lists %s" % (took, seen["running"], sorted(seen["phases"]), pv, sv, sl))

        # queries move the query counters
        fn = "/tessera.v1.VectorSearch/FindNeighbors"
        q0 = val(s, "tessera_queries_total") or 0
        t0_ = val(s, "tessera_query_shards_touched_total") or 0
        r0 = val(s, "tessera_rpc_requests_total", method=fn, code="OK") or 0
        c0 = val(s, "tessera_shard_calls_total", method="/tessera.v1.Shard/Search") or 0
        for i in range(5):
            cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[
                ch.query(tp, x[i], 5, fraction=1.0), ch.query(tp, x[i + 1], 5)]), timeout=10)
        _, s = parse(scrape(mport))
        assert val(s, "tessera_queries_total") == q0 + 10, (q0, val(s, "tessera_queries_total"))
        assert val(s, "tessera_query_shards_touched_total") >= t0_ + 10
        assert val(s, "tessera_query_lists_probed_total") >= 5 * NLIST
        assert val(s, "tessera_rpc_requests_total", method=fn, code="OK") == r0 + 5
        assert val(s, "tessera_rpc_duration_seconds_count", method=fn) >= 5
        assert val(s, "tessera_shard_calls_total", method="/tessera.v1.Shard/Search") >= c0 + 10
        assert val(s, "tessera_shard_call_duration_seconds_count", address=addr[2]) >= 5

        # a rejected and a failed update count by result and error type
        bad = os.path.join(root, "bad")
        os.makedirs(bad)
        with open(os.path.join(bad, "p.json"), "w") as f:
            f.write('{"id": "z", "embedding": [1, 2]}\n')
        op = cl.update(bad)
        assert op.state == tp.Operation.REJECTED, op
        op = cl.update(os.path.join(root, "nope"))
        assert op.state in (tp.Operation.FAILED, tp.Operation.REJECTED), op
        _, s = parse(scrape(mport))
        assert val(s, "tessera_updates_total", result="rejected") >= 1, s
        assert val(s, "tessera_update_errors_total", type="EREJECTED") >= 1
        assert val(s, "tessera_update_errors_total") >= 2
        assert val(s, "tessera_version") == 1
        errs = {dict(ls)["type"]: v for (n, ls), v in s.items()
                if n == "tessera_update_errors_total"}
        print("update errors by type: %s" % errs)

        # kill the single replica of group 1 and one replica of group 0
        cl.shards[2].kill()
        cl.shards[1].kill()
        t0 = time.time()
        s = wait_for("killed shards down", mport, lambda s: val(
            s, "tessera_shard_up", address=addr[2]) == 0 and val(
            s, "tessera_shard_up", address=addr[1]) == 0 and (val(
                s, "tessera_shard_consecutive_failures", address=addr[2]) or 0) >= 1)
        dt = time.time() - t0
        assert val(s, "tessera_shard_group_up", shard=1) == 0
        assert val(s, "tessera_shard_replicas_up", shard=1) == 0
        assert val(s, "tessera_shard_group_up", shard=0) == 1
        assert val(s, "tessera_shard_replicas_up", shard=0) == 1
        assert val(s, "tessera_shard_up", address=addr[0]) == 1
        print("killed shards: up 0 after %.2fs, consecutive failures %d" %
              (dt, val(s, "tessera_shard_consecutive_failures", address=addr[2])))
        check_docs(mport)
        cl.shards[2] = sh.Shard(cl.shards[2].data)  # for a clean stop (new port, unused)
        cl.shards[1] = sh.Shard(cl.shards[1].data)
    finally:
        cl.stop()
    print("test_coord_metrics: OK")


if __name__ == "__main__":
    main()
