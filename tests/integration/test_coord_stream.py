"""Streamed writes through the coordinator (issue 15, docs/streaming.md), real processes.

A 3-shard cluster (d 16, nlist 16) with a 3000-vector first version, then:
- before any index: UpsertDatapoints is FAILED_PRECONDITION;
- validation: a wrong dimension, a NaN, an empty id, a bad update_mask path are
  INVALID_ARGUMENT naming datapoints[i], its id and the field; 10001 datapoints are
  RESOURCE_EXHAUSTED; nothing of a rejected request is written (all or nothing);
- read-your-writes: after each OK, FindNeighbors (k=1, every list probed) returns the
  upserted id first, and ReadIndexDatapoints returns its vector;
- a moved id (upserted with a far vector) is found once, at its new place, and its old
  shard no longer holds it (a Shard.Read of the old label on the old shard);
- remove: never returned again, Read omits it, unknown ids are counted;
- update_mask all_restricts: restricts change, the vector stays; an unknown id is
  INVALID_ARGUMENT;
- GetIndexStats counts include the stream;
- kill -9 of the coordinator right after OKs, restart: every acknowledged write is there;
  a torn tail appended to the coordinator log is dropped with a log line;
- a batch update after streamed writes keeps them unless the batch deletes / replaces
  them, streamed writes racing it are all there once (none lost, none doubled), and
  streamed writes go on on the new version; a complete overwrite replaces everything;
- the CLI: tessera upsert (file, stdin; a bad line named, nothing sent), tessera remove.
"""
import math
import os
import signal
import sys
import threading

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 3000


def dp(tp, did, vec, restricts=None):
    p = tp.IndexDatapoint(datapoint_id=did)
    p.feature_vector.extend([float(v) for v in vec])
    for ns, allow in restricts or []:
        p.restricts.add(namespace=ns, allow_list=allow)
    return p


def upsert(cl, tp, dps, mask=None):
    rq = tp.UpsertDatapointsRequest(datapoints=dps)
    if mask:
        rq.update_mask.paths.extend(mask)
    return cl.stub.UpsertDatapoints(rq, timeout=30)


def remove(cl, tp, ids):
    return cl.stub.RemoveDatapoints(tp.RemoveDatapointsRequest(datapoint_ids=ids), timeout=30)


def top1(cl, tp, vec, k=1, restricts=None):
    q = ch.query(tp, vec, k, fraction=1.0, restricts=restricts)
    r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(queries=[q]), timeout=30)
    return [n.datapoint.datapoint_id for n in r.nearest_neighbors[0].neighbors]


def read(cl, tp, ids):
    r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=30)
    return {d.datapoint_id: d for d in r.datapoints}


def expect_error(fn, code, *needles):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        for n in needles:
            assert n in e.details(), (n, e.details())
        return e.details()
    raise AssertionError("no error, expected %s" % code)


def check_validation(cl, tp, x):
    good = dp(tp, "ok-1", x[0] + 50)
    bad = dp(tp, "bad-dim", [1.0] * (D - 1))
    msg = expect_error(lambda: upsert(cl, tp, [good, bad]), grpc.StatusCode.INVALID_ARGUMENT,
                       "datapoints[1]", "bad-dim", "EMBEDDING_SIZE_MISMATCH")
    print("wrong dimension:", msg)
    nan = dp(tp, "bad-nan", [0.0] * D)
    nan.feature_vector[3] = float("nan")
    expect_error(lambda: upsert(cl, tp, [nan]), grpc.StatusCode.INVALID_ARGUMENT,
                 "datapoints[0]", "bad-nan", "embedding[3]", "NaN")
    expect_error(lambda: upsert(cl, tp, [dp(tp, "", x[1])]), grpc.StatusCode.INVALID_ARGUMENT,
                 "datapoints[0]", "id is empty")
    r = dp(tp, "bad-ns", x[1])
    r.restricts.add(namespace="", allow_list=["a"])
    expect_error(lambda: upsert(cl, tp, [r]), grpc.StatusCode.INVALID_ARGUMENT,
                 "datapoints[0]", "restricts[0].namespace")
    expect_error(lambda: upsert(cl, tp, [good], mask=["feature_vector"]),
                 grpc.StatusCode.INVALID_ARGUMENT, "update_mask.paths[0]", "all_restricts")
    many = [dp(tp, "m%d" % i, x[i % N]) for i in range(10001)]
    expect_error(lambda: upsert(cl, tp, many), grpc.StatusCode.RESOURCE_EXHAUSTED, "10001")
    # all or nothing: ok-1 (valid, sent with bad-dim) was not written
    assert "ok-1" not in read(cl, tp, ["ok-1"])
    assert top1(cl, tp, x[0] + 50) != ["ok-1"]


def check_rywrites(cl, tp, rng, x):
    """Upserts in small requests, each checked at once. Returns {id: vector}."""
    model = {}
    for r in range(15):
        ids = ["s%03d-%d" % (r, j) for j in range(1 + r % 4)]
        vecs = [x[rng.integers(0, N)] + rng.normal(size=D).astype("float32") * 0.01
                for _ in ids]
        resp = upsert(cl, tp, [dp(tp, i, v) for i, v in zip(ids, vecs)])
        assert resp.upserted == len(ids) and resp.version == 1 and resp.stream_seq > 0, resp
        for i, v in zip(ids, vecs):
            got = top1(cl, tp, v)
            assert got == [i], (i, got)
            model[i] = v
        rd = read(cl, tp, ids)
        for i, v in zip(ids, vecs):
            assert np.allclose(list(rd[i].feature_vector), v, atol=1e-6), i
    return model


def check_move(cl, tp, x):
    """a000007 goes far away: found once at the new place; its old shard lost it."""
    _, _, sp, spg = ch.stubs()
    did = "a000007"
    far = x[7] + 40.0
    before = cl.stats()
    upsert(cl, tp, [dp(tp, did, far)])
    assert top1(cl, tp, far) == [did]
    near_old = top1(cl, tp, x[7], k=50)
    assert near_old.count(did) <= 1
    assert np.allclose(list(read(cl, tp, [did])[did].feature_vector), far)
    # no shard holds two copies: count the id over every shard's answer for the far vector
    seen = 0
    for s in cl.shards:
        stub = spg.ShardStub(grpc.insecure_channel(s.target))
        st = stub.Stats(sp.ShardStatsRequest(), timeout=10)
        seen += st.vectors_count
    assert seen == before.vectors_count, (seen, before.vectors_count)
    return far


def check_remove(cl, tp, model):
    ids = sorted(model)[:6]
    r = remove(cl, tp, ids + ["never-there"])
    assert r.removed == 6 and r.unknown == 1, r
    for i in ids:
        assert i not in top1(cl, tp, model[i], k=10)
        del model[i]
    assert not read(cl, tp, ids)
    r = remove(cl, tp, ids[:2])
    assert r.removed == 0 and r.unknown == 2, r


def check_mask(cl, tp, model):
    did = sorted(model)[0]
    v = model[did]
    upsert(cl, tp, [dp(tp, did, [], [("color", ["red"])])], mask=["all_restricts"])
    rd = read(cl, tp, [did])[did]
    assert np.allclose(list(rd.feature_vector), v), "the vector must stay"
    assert [(r.namespace, list(r.allow_list)) for r in rd.restricts] == [("color", ["red"])]
    assert top1(cl, tp, v, restricts=[("color", ["red"], [])]) == [did]
    assert top1(cl, tp, v, restricts=[("color", ["blue"], [])]) != [did]
    expect_error(lambda: upsert(cl, tp, [dp(tp, "nope", [], [("c", ["x"])])],
                                mask=["all_restricts"]),
                 grpc.StatusCode.INVALID_ARGUMENT, "datapoints[0]", "nope", "all_restricts")


def check_restart(cl, tp, model):
    """kill -9 right after OKs, a torn tail in the log, restart: everything acknowledged."""
    rng = np.random.default_rng(9)
    last = {}
    for j in range(5):
        v = rng.normal(size=D).astype("float32") * 3
        upsert(cl, tp, [dp(tp, "k%d" % j, v)])
        last["k%d" % j] = v
    cl.stop_coord(signal.SIGKILL)
    logs = os.path.join(cl.root, "coordinator", "stream")
    names = sorted(os.listdir(logs))
    assert names == ["v000001.log"], names
    with open(os.path.join(logs, names[-1]), "ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02\x03\x04half a record")
    with open(os.path.join(logs, "v000007.log"), "wb") as f:  # a stale log: removed
        f.write(b"x")
    cl.start()
    text = cl.coord.text()
    assert "dropping the tail" in text, text
    assert sorted(os.listdir(logs)) == ["v000001.log"], os.listdir(logs)
    model.update(last)
    for i, v in last.items():
        assert top1(cl, tp, v) == [i], i
    rd = read(cl, tp, sorted(model))
    assert set(rd) == set(model), set(model) - set(rd)


def check_batch_after_stream(cl, tp, model, root):
    ids = sorted(model)
    gone, replaced = ids[0], ids[1]
    newv = np.full(D, 7.0, dtype="float32")
    b = ch.write_batch(os.path.join(root, "b2"), [ch.dp_json(replaced, newv),
                                                 ch.dp_json("batch-new", newv + 1)], [gone])
    st0 = cl.stats()
    # streamed writes racing the update: queued while it holds the stream lock, applied on
    # version 1 before its plan or on version 2 after its commit: neither lost nor doubled
    racing, stop = {}, threading.Event()

    def writer():
        j = 0
        while not stop.is_set():
            v = np.full(D, -5.0 - j * 0.25, dtype="float32")
            upsert(cl, tp, [dp(tp, "race-%d" % j, v)])
            racing["race-%d" % j] = v
            j += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        op = cl.update(b)
    finally:
        stop.set()
        t.join()
    assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
    assert len(racing) >= 2, len(racing)
    model.update(racing)
    del model[gone]
    model[replaced] = newv
    model["batch-new"] = newv + 1
    rd = read(cl, tp, sorted(model) + [gone])
    assert set(rd) == set(model), (set(model) ^ set(rd))
    for i, v in model.items():
        assert top1(cl, tp, v) == [i], i
    st = cl.stats()
    assert st.version == 2 and st.vectors_count == st0.vectors_count + len(racing), (st, st0)
    _, _, sp, spg = ch.stubs()
    held = sum(spg.ShardStub(grpc.insecure_channel(x.target)).Stats(
        sp.ShardStatsRequest(), timeout=10).vectors_count for x in cl.shards)
    assert held == st.vectors_count, (held, st.vectors_count)  # no shard holds a double
    logs = sorted(os.listdir(os.path.join(cl.root, "coordinator", "stream")))
    assert logs == ["v000002.log"], logs
    # streaming goes on, on version 2
    r = upsert(cl, tp, [dp(tp, "after", newv - 3)])
    assert r.version == 2
    assert top1(cl, tp, newv - 3) == ["after"]


def check_cli(cl, tp, root):
    """tessera upsert (file and stdin) / tessera remove round trip; a bad line is named."""
    import json
    import subprocess
    cli = os.path.join(ch.BIN, "tessera")
    good = os.path.join(root, "up.json")
    vecs = {"cli-%d" % i: [float(i * 3 + j % 5) for j in range(D)] for i in range(3)}
    with open(good, "w") as f:
        for i, v in vecs.items():
            f.write(json.dumps({"id": i, "embedding": v, "crowding_tag": "t"}) + "\n")
    r = subprocess.run([cli, "upsert", "--target", cl.target, "--json", good, "--per-call", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "upserted 3 datapoints" in r.stdout, (r.stdout, r.stderr)
    for i, v in vecs.items():
        assert top1(cl, tp, v) == [i], i
    line = json.dumps({"id": "cli-x", "embedding": [1.0] * (D + 1)})
    r = subprocess.run([cli, "upsert", "--target", cl.target, "--json", "-"],
                       input=json.dumps({"id": "cli-y", "embedding": [2.0] * D}) + "\n" + line
                       + "\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "stdin line 2: EMBEDDING_SIZE_MISMATCH" in r.stderr and \
        "nothing was sent" in r.stderr, (r.stdout, r.stderr)
    assert "cli-y" not in read(cl, tp, ["cli-y"])
    r = subprocess.run([cli, "remove", "--target", cl.target, "cli-0", "cli-1", "cli-zz"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "removed 2, unknown 1" in r.stdout, (r.stdout, r.stderr)
    assert set(read(cl, tp, list(vecs))) == {"cli-2"}


def check_overwrite(cl, tp, model, root):
    """A complete overwrite replaces everything, streamed writes included."""
    b = ch.write_batch(os.path.join(root, "b3"), [ch.dp_json("only-%d" % i, np.full(D, i))
                                                 for i in range(300)])
    op = cl.update(b, overwrite=True)
    assert op.state == tp.Operation.SUCCEEDED, op
    assert not read(cl, tp, sorted(model)), "streamed writes survived a complete overwrite"
    st = cl.stats()
    assert st.vectors_count == 300, st.vectors_count
    assert top1(cl, tp, np.full(D, 7)) == ["only-7"]


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(N, D)) * 2).astype("float32")
    root = sh.tmpdir("tsr-coord-stream-")
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("a%06d" % i, x[i])
                                                   for i in range(N)])
    cl = ch.Cluster(3, D, {"nlist": 16, "pq_m": 4, "nprobe": 4})
    try:
        expect_error(lambda: upsert(cl, tp, [dp(tp, "early", x[0])]),
                     grpc.StatusCode.FAILED_PRECONDITION, "no index")
        op = cl.update(b1)
        assert op.state == tp.Operation.SUCCEEDED, op
        check_validation(cl, tp, x)
        model = check_rywrites(cl, tp, rng, x)
        st = cl.stats()
        assert st.vectors_count == N + len(model), (st.vectors_count, N, len(model))
        model["a000007"] = check_move(cl, tp, x)
        check_remove(cl, tp, model)
        check_mask(cl, tp, model)
        st = cl.stats()
        assert st.vectors_count == N + len(model) - 1, (st.vectors_count, len(model))
        check_restart(cl, tp, model)
        check_batch_after_stream(cl, tp, model, root)
        check_cli(cl, tp, root)
        check_overwrite(cl, tp, model, root)
        assert math.isfinite(cl.stats().plan_imbalance)
        print("test_coord_stream: OK")
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
