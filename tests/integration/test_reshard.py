"""Grow and shrink online (issue 19): AddShardGroup 2 -> 3 groups (through `tessera shards
add`), then RemoveShardGroup of group 0 (3 -> 2), while a client queries nonstop and
another streams upserts; then a coordinator restart.

Scaled down for `make test` (~15 s on 2 busy cores): 20000 vectors, d 16, nlist 64, trained
by the coordinator from the first batch. Queries probe every list (fraction 1.0) with PQ
distances (approximate_neighbor_count 0) and deny the token the streamed writes carry, so an
answer does not depend on the partition plan: every answer during and after a move must
equal the answer before it (ids, or equal distances where PQ distances tie).
Checks after each move: 0 failed queries; every label of the index present exactly once
over the live groups (Shard.Read of every label on every shard: lists_checker()); dense
datapoints per live group within 10 % of the mean; the operation's progress (lists and
bytes moved) in GetOperation, GetIndexStats, `tessera stats` and /metrics; an UpdateIndex
during a move is refused ("update in progress"); GetIndexStats marks the removed group; the
removed group's shard is stopped and queries still answer. At the end: 0 failed writes and
every acknowledged write readable; after a coordinator restart the groups come from the
stored version (the new shard is still queried).
The writer also replaces earlier streamed ids with another vector (often another list, so
another label and group) and removes some, so the moves' catch-up (docs/resharding.md
"Writes during a move": writes flow while the moved lists are read, staged and prepared,
the rounds since are carried to the new version) is checked exactly: each replaced id
reads back with its last vector, a removed one is gone, every label on one group. Each
added shard's Prepare is slowed by SLOW_PREPARE_S (TSR_SHARD_SLOW_PREPARE_MS, the build of
a large version; it stays in the index, so every later move has one slow Prepare too);
each move prints the longest write call that overlapped it beside the move's duration and
that wait must stay below SLOW_PREPARE_S: writes flow during Prepare (before the catch-up
a write waited for the whole move, so at least that long).
`make test-reshard-large` runs the issue's shape at a larger size (TSR_RESHARD_N,
TSR_RESHARD_DIMS, TSR_RESHARD_NLIST, TSR_RESHARD_GROUPS=start,grown,shrunk,
TSR_RESHARD_CLIENTS).
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

N = int(os.environ.get("TSR_RESHARD_N", "20000"))
D = int(os.environ.get("TSR_RESHARD_DIMS", "16"))
NLIST = int(os.environ.get("TSR_RESHARD_NLIST", "64"))
# groups at the start, after growing (one add at a time), after shrinking (removing the
# lowest live group each time); query threads
START, GROW, SHRINK = (int(v) for v in os.environ.get("TSR_RESHARD_GROUPS", "2,3,2").split(","))
CLIENTS = int(os.environ.get("TSR_RESHARD_CLIENTS", "1"))
# the share of the lists each query probes: which lists a query probes depends only on the
# centroids, never on the plan, so any fraction keeps the answers plan-independent; 1.0
# (every list) at the test's size, less at 1M where a full scan of 24 queries per call
# outlasts the search deadline on a loaded 2-core machine
FRACTION = float(os.environ.get("TSR_RESHARD_FRACTION", "1.0"))
# every added shard's Prepare sleeps this long first (a large build); no write may wait
# as long (writes flow during Prepare)
SLOW_PREPARE_S = float(os.environ.get("TSR_RESHARD_SLOW_PREPARE_S", "3"))


def lists_checker(shards, nlabels, expect=None, at_least=False):
    """Every label 0 .. nlabels (the coordinator's counter starts at 0) on at most one of
    shards (their current version) and `expect` (default N) labels on exactly one. Returns
    the datapoints held per shard."""
    expect = N if expect is None else expect
    sp = sh.stubs()[0]
    seen = np.zeros(nlabels + 1, dtype=np.int64)
    per = []
    for s in shards:
        held = 0
        for k in range(0, nlabels + 1, 5000):
            labels = list(range(k, min(k + 5000, nlabels + 1)))
            r = s.stub.Read(sp.ShardReadRequest(version=0, labels=labels), timeout=30)
            for lab, d in zip(labels, r.datapoints):
                if d.found:
                    seen[lab] += 1
                    held += 1
        per.append(held)
    twice = np.nonzero(seen > 1)[0]
    assert len(twice) == 0, "labels on more than one group: %s" % twice[:10]
    once = int((seen == 1).sum())
    if at_least:  # streamed writes go on: every batch datapoint at least
        assert once >= expect, "labels present once: %d, expected >= %d" % (once, expect)
    else:
        assert once == expect, "labels present once: %d, expected %d" % (once, expect)
    return per


def holds_none(shards, nlabels, label):
    """None of the labels 0 .. nlabels on any live one of shards (out of the index: a new
    group whose add was rolled back serves no version; a staged leftover is not read)."""
    sp = sh.stubs()[0]
    for s in shards:
        if s.proc.poll() is not None:
            continue
        try:
            r = s.stub.Read(sp.ShardReadRequest(version=0, labels=list(range(nlabels + 1))),
                            timeout=30)
            held = sum(1 for d in r.datapoints if d.found)
        except Exception:  # noqa: BLE001 - no version at all: holds nothing
            held = 0
        assert held == 0, "%s: a shard out of the index holds %d datapoints" % (label, held)


def balanced(per):
    mean = sum(per) / len(per)
    assert all(abs(p - mean) <= 0.10 * mean for p in per), \
        "vectors per group %s not within 10%% of the mean %.0f" % (per, mean)


def stream_batch(tp, x, i, n):
    """The streamed writer's batch i: ids w<i>..w<i+n-1>, each a shifted base vector, all
    tagged src=w (the queries deny it, so their answers do not depend on the writes)."""
    ids = ["w%06d" % (i + j) for j in range(n)]
    dps = []
    for j, did in enumerate(ids):
        p = tp.IndexDatapoint(datapoint_id=did)
        p.feature_vector.extend([float(v) for v in x[(i + j) * 7 % len(x)] + 0.5])
        p.restricts.add(namespace="src", allow_list=["w"])
        dps.append(p)
    return ids, dps


def same_answer(a, b):
    ia = [n.datapoint.datapoint_id for n in a.neighbors]
    ib = [n.datapoint.datapoint_id for n in b.neighbors]
    if ia == ib:
        return True
    da = [round(n.distance, 3) for n in a.neighbors]
    db = [round(n.distance, 3) for n in b.neighbors]
    return da == db


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(19)
    centers = rng.normal(size=(NLIST, D)).astype("float32") * 4
    x = (centers[rng.integers(0, NLIST, N)] + rng.normal(size=(N, D))).astype("float32")
    root = sh.tmpdir("tsr-reshard-")
    b1 = ch.write_batch(os.path.join(root, "b1"),
                        [ch.dp_json("a%06d" % i, x[i]) for i in range(N)], per_file=10000)
    mport = ch.free_port()
    cl = ch.Cluster(START, D, {"nlist": NLIST, "pq_m": 4, "nprobe": 8,
                               "stage_deadline_ms": 600000},
                    coord_extra=["--metrics-listen", "127.0.0.1:%d" % mport])
    extra = []
    try:
        op = cl.update(b1, timeout=300)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        # refusals: nothing starts, nothing changes
        import grpc
        for call, arg, want in (
                (cl.stub.RemoveShardGroup, tp.RemoveShardGroupRequest(group=7),
                 grpc.StatusCode.INVALID_ARGUMENT),
                (cl.stub.AddShardGroup, tp.AddShardGroupRequest(),
                 grpc.StatusCode.INVALID_ARGUMENT)):
            try:
                call(arg, timeout=30)
                raise AssertionError("%s accepted" % arg)
            except grpc.RpcError as e:
                assert e.code() == want, e
        r = cl.stub.AddShardGroup(tp.AddShardGroupRequest(replicas=[cl.shards[1].target]),
                                  timeout=30)  # a shard of the index: refused by the move
        op = cl.wait_op(r.operation_id, 60)
        assert op.state == tp.Operation.FAILED and "also a replica" in op.error, op
        assert cl.stats().version == 1 and len(cl.stats().shards) == START
        qv = x[rng.integers(0, N, 24)] + rng.normal(size=(24, D)).astype("float32") * 0.3
        # streamed writes carry the token src=w; the queries deny it, so their answers stay
        # those of the batch's datapoints while the writes go on
        rq = tp.FindNeighborsRequest(queries=[ch.query(tp, v, 10, cand=0, fraction=FRACTION,
                                                       restricts=[("src", [], ["w"])])
                                              for v in qv])
        before = cl.stub.FindNeighbors(rq, timeout=30).nearest_neighbors
        stop = threading.Event()
        st = {"ok": 0, "fail": [], "diff": 0}

        def client():
            while not stop.is_set():
                try:
                    r = cl.stub.FindNeighbors(rq, timeout=30)
                except Exception as e:  # noqa: BLE001 - every failure counts
                    st["fail"].append(str(e)[:300])
                    continue
                for a, b in zip(r.nearest_neighbors, before):
                    if not same_answer(a, b):
                        st["diff"] += 1
                st["ok"] += 1

        # acked: ids ever acknowledged; vec: id -> the base vector index of its last
        # acknowledged upsert (+0.5), gone: ids whose last acknowledged write removed them;
        # calls: (start, end) of every write call
        wr = {"acked": [], "fail": [], "max_s": 0.0, "vec": {}, "gone": set(), "calls": []}

        def timed(fn):
            t0 = time.time()
            try:
                fn()
                return True
            except Exception as e:  # noqa: BLE001 - every failure counts
                wr["fail"].append(str(e)[:300])
                return False
            finally:
                t1 = time.time()
                wr["calls"].append((t0, t1))
                wr["max_s"] = max(wr["max_s"], t1 - t0)

        def writer():
            i, it = 0, 0
            wrng = np.random.default_rng(7)
            while not stop.is_set():
                ids, dps = stream_batch(tp, x, i, 20)
                if timed(lambda: cl.stub.UpsertDatapoints(
                        tp.UpsertDatapointsRequest(datapoints=dps), timeout=60)):
                    wr["acked"] += ids
                    for j, did in enumerate(ids):
                        wr["vec"][did] = (i + j) * 7 % len(x)
                i += 20
                it += 1
                live_ids = sorted(wr["vec"])
                if it % 2 == 0 and len(live_ids) > 40:
                    # replace 6 earlier ids with another base vector (another list, often
                    # another group: a new label), remove 2 others
                    pick = [live_ids[k] for k in wrng.choice(len(live_ids), 8, replace=False)]
                    rep_ids, rm_ids = pick[:6], pick[6:]
                    ks = [int(wrng.integers(0, len(x))) for _ in rep_ids]
                    rdps = []
                    for did, k in zip(rep_ids, ks):
                        p = tp.IndexDatapoint(datapoint_id=did)
                        p.feature_vector.extend([float(v) for v in x[k] + 0.5])
                        p.restricts.add(namespace="src", allow_list=["w"])
                        rdps.append(p)
                    if timed(lambda: cl.stub.UpsertDatapoints(
                            tp.UpsertDatapointsRequest(datapoints=rdps), timeout=60)):
                        for did, k in zip(rep_ids, ks):
                            wr["vec"][did] = k
                    if timed(lambda: cl.stub.RemoveDatapoints(
                            tp.RemoveDatapointsRequest(datapoint_ids=rm_ids), timeout=60)):
                        for did in rm_ids:
                            del wr["vec"][did]
                            wr["gone"].add(did)
                time.sleep(0.02)

        def held_line(opid):
            """The coordinator's account of what streamed writes waited for in a move."""
            for line in cl.coord.text().splitlines():
                if opid in line and "streamed writes held" in line:
                    return "  " + line.split("reshard %s: " % opid)[-1]
            return "  (no 'streamed writes held' line for %s)" % opid

        def waits_during(t0, t1):
            """The longest write call that overlapped [t0, t1] (0 when none did)."""
            return max([b - a for a, b in list(wr["calls"]) if b >= t0 and a <= t1] or [0.0])

        ths = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in ths:
            t.start()
        tw = threading.Thread(target=writer)
        tw.start()
        live = list(cl.shards)       # the shard of each live group, by group number
        groups = list(range(START))  # live group numbers
        version = 1
        removed_addrs = []
        try:
            first = True
            while len(groups) < GROW:
                # grow: a fresh shard becomes the next group (the first one through the CLI)
                s3 = sh.Shard(os.path.join(cl.root, "shard-new-%d" % len(extra)),
                              env={"TSR_SHARD_SLOW_PREPARE_MS": "%d" % (SLOW_PREPARE_S * 1000)})
                extra.append(s3)
                g = START + len(extra) - 1
                t0 = time.time()
                if first:
                    cli = subprocess.run([os.path.join(ch.BIN, "tessera"), "shards", "add",
                                          "--target", cl.target, "--group", s3.target],
                                         capture_output=True, text=True, timeout=600)
                    assert cli.returncode == 0 and "succeeded: version %d" % (version + 1) \
                        in cli.stdout, cli
                    m = re.search(r"operation (\S+) \(group %d\)" % g, cli.stderr)
                    assert m, cli.stderr
                    opid = m.group(1)
                else:
                    r = cl.stub.AddShardGroup(tp.AddShardGroupRequest(replicas=[s3.target]),
                                              timeout=30)
                    assert r.group == g, r
                    opid = r.operation_id
                op = cl.wait_op(opid, 600)
                dt = time.time() - t0
                version += 1
                assert op.state == tp.Operation.SUCCEEDED and op.version == version, op
                pg = op.progress
                assert pg.lists_total > 0 and pg.lists_moved == pg.lists_total, pg
                assert pg.datapoints_moved > 0 and pg.bytes_moved > 0, pg
                wait = waits_during(t0, t0 + dt)
                print("add group %d: %d lists, %d datapoints, %d bytes moved in %.2fs; longest "
                      "write wait during it %.2fs" % (g, pg.lists_total, pg.datapoints_moved,
                                                      pg.bytes_moved, dt, wait))
                print(held_line(opid))
                assert dt >= SLOW_PREPARE_S and wait < SLOW_PREPARE_S, \
                    "a write waited %.2fs during a %.2fs move (Prepare %.1fs)" % (
                        wait, dt, SLOW_PREPARE_S)
                live.append(s3)
                groups.append(g)
                per = lists_checker([live[k] for k in groups], N + 2 * len(wr["acked"]) + 2000, N,
                                    at_least=True)
                print("  datapoints per group:", per)
                balanced(per)
                if first:
                    # the progress in GetIndexStats, `tessera stats` and /metrics
                    stats = cl.stats()
                    assert stats.last_operation_id == opid, stats
                    assert stats.last_operation_progress.lists_moved == pg.lists_total, stats
                    js = json.loads(subprocess.run(
                        [os.path.join(ch.BIN, "tessera"), "stats", "--target", cl.target,
                         "--json"], capture_output=True, text=True, timeout=30).stdout)
                    assert js["reshard"]["bytes_moved"] == pg.bytes_moved, js
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                                                timeout=10) as h:
                        text = h.read().decode()
                    assert 'tessera_reshard_lists{step="moved"} %d' % pg.lists_total in text
                    assert "tessera_reshard_bytes_moved %d" % pg.bytes_moved in text
                first = False
            first = True
            while len(groups) > SHRINK:
                g = groups[0]
                t0 = time.time()
                r = cl.stub.RemoveShardGroup(tp.RemoveShardGroupRequest(group=g), timeout=30)
                if first:  # one operation at a time: a batch update is refused meanwhile
                    try:
                        cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b1), timeout=30)
                        busy = None
                    except Exception as e:  # noqa: BLE001
                        busy = str(e)
                    assert busy and "update in progress" in busy, busy
                first = False
                op = cl.wait_op(r.operation_id, 600)
                dt = time.time() - t0
                version += 1
                assert op.state == tp.Operation.SUCCEEDED and op.version == version, op
                pg = op.progress
                wait = waits_during(t0, t0 + dt)
                print("remove group %d: %d lists, %d datapoints, %d bytes moved in %.2fs; "
                      "longest write wait during it %.2fs" %
                      (g, pg.lists_total, pg.datapoints_moved, pg.bytes_moved, dt, wait))
                print(held_line(r.operation_id))
                if extra:  # a slow shard prepares in this move too
                    assert dt >= SLOW_PREPARE_S and wait < SLOW_PREPARE_S, \
                        "a write waited %.2fs during a %.2fs move (Prepare %.1fs)" % (
                            wait, dt, SLOW_PREPARE_S)
                groups.remove(g)
                per = lists_checker([live[k] for k in groups], N + 2 * len(wr["acked"]) + 2000, N,
                                    at_least=True)
                print("  datapoints per group:", per)
                balanced(per)
                stats = cl.stats()
                assert [not s.removed for s in stats.shards] == \
                    [k in groups for k in range(len(stats.shards))], stats
                assert stats.vectors_count >= N, stats
                # the removed group's process is no longer needed, and nothing calls it
                live[g].stop()
                removed_addrs.append((live[g].target, time.strftime(
                    "%Y-%m-%dT%H:%M:%S", time.gmtime())))
            time.sleep(2.5)  # reconcile passes (about one a second) while it is down
            for line in cl.coord.text().splitlines():
                for a, gone in removed_addrs:  # lines logged after its removal (UTC stamps)
                    assert not (a in line and line[:19] > gone and
                                ("marked down" in line or "reconcile" in line)), \
                        "a removed group's replica is still called: " + line
        finally:
            stop.set()
            for t in ths:
                t.join()
            tw.join()
        print("queries during the moves: %d ok, %d failed, %d differing answers" %
              (st["ok"], len(st["fail"]), st["diff"]))
        assert not st["fail"], st["fail"][:3]
        assert st["diff"] == 0, st["diff"]
        assert st["ok"] > 0
        print("streamed writes during the moves: %d acknowledged, %d failed, longest wait "
              "%.2fs (%d calls; %d ids replaced at least once, %d removed)" %
              (len(wr["acked"]), len(wr["fail"]), wr["max_s"], len(wr["calls"]),
               sum(1 for d, k in wr["vec"].items() if k != int(d[1:]) * 7 % len(x)),
               len(wr["gone"])))
        assert not wr["fail"], wr["fail"][:3]
        acked = sorted(wr["vec"])  # live at the end
        assert len(acked) > 0 and wr["gone"]
        per = lists_checker([live[k] for k in groups], N + len(wr["acked"]) * 2 + 2000,
                            N + len(acked))
        balanced(per)
        for k in range(0, len(acked), 1000):
            r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=acked[k:k + 1000]),
                                            timeout=30)
            assert len(r.datapoints) == len(acked[k:k + 1000]), "acknowledged writes missing"
            for d in r.datapoints:  # the last acknowledged vector of each
                want = x[wr["vec"][d.datapoint_id]] + 0.5
                assert np.allclose(list(d.feature_vector), want, atol=1e-4), d.datapoint_id
        gone = sorted(wr["gone"])
        r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=gone), timeout=30)
        assert not r.datapoints, "removed ids still readable: %s" % \
            [d.datapoint_id for d in r.datapoints][:5]
        # restart: the groups come from the stored version, not the config file
        cl.stop_coord()
        cl.start()
        r = cl.stub.FindNeighbors(rq, timeout=30)
        for a, b in zip(r.nearest_neighbors, before):
            assert same_answer(a, b), (a, b)
        stats = cl.stats()
        assert [not s.removed for s in stats.shards] == \
            [k in groups for k in range(len(stats.shards))], stats
        assert all(stats.shards[k].available and stats.shards[k].address == live[k].target
                   for k in groups), stats
        print("test_reshard: OK")
    finally:
        try:
            cl.stop()
        finally:
            for s in extra:
                s.stop()


if __name__ == "__main__":
    main()
