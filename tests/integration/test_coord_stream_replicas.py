"""Streamed writes with replicas, catch-up and the background fold (issue 15), real processes.

2 shard groups x 2 replicas (d 16, nlist 16), a 2000-vector first version,
stream_fold_records 400:
1. every replica of a group applies each round (Stats.stream_seq equal);
2. kill -9 of one replica of group 0, writes go on (OK from its sibling); it is restarted
   and caught up by reconcile (its stream_seq reaches its sibling's); then the sibling is
   killed and every acknowledged write is answered by the caught-up replica;
3. both replicas of group 1 down: a write touching group 1 is UNAVAILABLE (outcome unknown:
   logged, sent to the groups that answered; or no live replica: nothing written); after
   they restart and reconcile caught them up, everything acknowledged is there and the
   outcome-unknown write is there whole (a "nothing written" one is absent);
   a wiped replica is re-seeded from its sibling with the streamed writes and answers
   every acknowledged write alone;
4. the background fold: past 400 streamed writes the coordinator folds them into version 2
   (tessera_stream_folds_total, the coordinator log of version 1 removed), every write is
   still there, and writes go on on version 2;
5. /metrics: tessera_stream_writes_total, rounds, log bytes, overlay records.
"""
import json
import os
import re
import shutil
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
from test_coord_replicas import metric, metrics, restart_shard, start_coord  # noqa: E402
from test_coord_stream import dp, read, top1, upsert  # noqa: E402

D = 16
N = 2000


def seqs(cl, sp, idx):
    return [cl.shards[i].stub.Stats(sp.ShardStatsRequest(), timeout=10).stream_seq for i in idx]


def wait(cond, what, timeout=20):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.1)


def check_all(cl, tp, model):
    rd = read(cl, tp, sorted(model))
    assert set(rd) == set(model), set(model) ^ set(rd)
    for i, v in model.items():
        got = top1(cl, tp, v)
        assert got == [i], (i, got)


def main():
    tp, _, sp, _ = ch.stubs()
    rng = np.random.default_rng(23)
    x = (rng.normal(size=(N, D)) * 2).astype("float32")
    root = sh.tmpdir("tsr-coord-stream-rep-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("r%05d" % i, x[i])
                                                   for i in range(N)])
    cl = ch.Cluster(4, D, {"nlist": 16, "pq_m": 4, "nprobe": 4, "stream_fold_records": 400})
    cl.stop_coord()
    with open(cl.config) as f:
        c = json.load(f)
    c["shards"] = [[cl.shards[0].target, cl.shards[1].target],
                   [cl.shards[2].target, cl.shards[3].target]]
    with open(cl.config, "w") as f:
        json.dump(c, f)
    port, mport = ch.free_port(), ch.free_port()
    start_coord(cl, port, mport)
    model = {}
    n = [0]

    def put(k, scale=2.0):
        vs = {}
        for _ in range(k):
            vs["w%05d" % n[0]] = (rng.normal(size=D) * scale).astype("float32")
            n[0] += 1
        r = upsert(cl, tp, [dp(tp, i, v) for i, v in vs.items()])
        model.update(vs)
        return r

    try:
        op = cl.update(b0)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 1, op
        # 1. both replicas of each group apply every round
        for _ in range(10):
            put(5)
        s = seqs(cl, sp, range(4))
        assert s[0] == s[1] > 0 and s[2] == s[3] > 0, s
        check_all(cl, tp, model)

        # 2. a replica down, writes go on; restarted, it is caught up
        cl.shards[1].kill()
        for _ in range(10):
            put(5)
        check_all(cl, tp, model)
        cl.shards[1] = restart_shard(cl.shards[1])
        wait(lambda: seqs(cl, sp, [0, 1])[0] == seqs(cl, sp, [0, 1])[1], "replica 1 caught up")
        cl.shards[0].kill()
        check_all(cl, tp, model)  # group 0 answered by the caught-up replica alone
        cl.shards[0] = restart_shard(cl.shards[0])
        wait(lambda: seqs(cl, sp, [0, 1])[0] == seqs(cl, sp, [0, 1])[1], "replica 0 back")

        # 3. group 1 wholly down
        cl.shards[2].kill()
        cl.shards[3].kill()
        vs = {"dark%d" % j: (rng.normal(size=D) * 2).astype("float32") for j in range(20)}
        codes = []
        for attempt in range(2):
            try:
                upsert(cl, tp, [dp(tp, i, v) for i, v in vs.items()])
                codes.append("OK")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
                assert "outcome unknown" in e.details() or "no live replica" in e.details(), \
                    e.details()
                codes.append(e.details())
        assert "OK" not in codes, codes
        print("group 1 down:", codes)
        cl.shards[2] = restart_shard(cl.shards[2])
        cl.shards[3] = restart_shard(cl.shards[3])
        logged = [int(re.search(r"logged as seq (\d+)", m).group(1)) for m in codes
                  if "outcome unknown" in m]
        want = max(logged) if logged else 0
        wait(lambda: min(seqs(cl, sp, [2, 3])) >= want, "group 1 caught up to seq %d" % want)
        wait(lambda: cl.stats().shards[1].available, "group 1 answers")
        check_all(cl, tp, model)
        got = read(cl, tp, sorted(vs))
        if logged:  # logged: applied on every group once they are back, never half
            assert len(got) == len(vs), sorted(got)
            model.update(vs)
            print("the outcome-unknown write (seq %d) was applied by reconcile" % want)
        else:
            assert not got, sorted(got)

        # 3b. a wiped replica (replaced disk): re-seeded from its sibling with the streamed
        # writes (the directory plus the overlay), at the group's last seq
        wiped = cl.shards[1]
        wiped.stop()
        shutil.rmtree(wiped.data)
        cl.shards[1] = wiped = restart_shard(wiped)

        def same():
            a, b = (cl.shards[i].stub.Stats(sp.ShardStatsRequest(), timeout=10) for i in (0, 1))
            return (b.current_version == 1 and a.vectors_count == b.vectors_count and
                    a.stream_seq == b.stream_seq)
        wait(same, "the wiped replica re-seeded", timeout=60)
        cl.shards[0].kill()
        check_all(cl, tp, model)  # group 0 answered by the re-seeded replica alone
        cl.shards[0] = restart_shard(cl.shards[0])
        wait(lambda: len(set(seqs(cl, sp, [0, 1]))) == 1, "replica 0 back")

        # 4. the background fold
        text = metrics(mport)
        # 20 acknowledged rounds, plus each outcome-unknown write of step 3 (logged); a
        # "no live replica" refusal writes no round
        rounds = metric(text, "tessera_stream_rounds_total")
        assert rounds >= 20 + len(logged), ("rounds", rounds, len(logged))
        assert metric(text, "tessera_stream_writes_total", op="upsert") >= 100
        assert metric(text, "tessera_stream_log_bytes") > 0
        while len(model) < 420:
            put(50)
        wait(lambda: cl.stats().version == 2, "the fold to version 2", timeout=60)
        wait(lambda: os.listdir(os.path.join(cl.root, "coordinator", "stream")) ==
             ["v000002.log"], "the old log removed")
        assert metric(metrics(mport), "tessera_stream_folds_total") >= 1
        assert metric(metrics(mport), "tessera_stream_overlay_records") < 400
        check_all(cl, tp, model)
        r = put(3)
        assert r.version == 2, r
        check_all(cl, tp, model)
        st = cl.stats()
        assert st.vectors_count == N + len(model), (st.vectors_count, N, len(model))
        print("test_coord_stream_replicas: OK (%d streamed datapoints)" % len(model))
    except BaseException:
        print(cl.coord.text()[-6000:])
        raise
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
