"""Coalesced shard calls (coordinator/coalesce.c, docs/coordinator.md "Coalesced shard
calls"): a coordinator in front of 4 shards with coalesce_inflight 1, so that concurrent
FindNeighbors requests wait for the group's call in flight and share the next one.

1. Reference answers, one request at a time (never queued): 160 requests of 1-3 queries
   with random k, nprobe, token and numeric restricts, crowding, PQ or exact distances.
2. The same requests from 24 threads, three rounds: every answer equals its reference
   (ids, distances, order), and /metrics shows coalesced calls carrying more than one
   request each on average (the test fails if nothing was coalesced).
3. Requests with a deadline too short to be met mixed into the load: they may fail by their
   deadline (DEADLINE_EXCEEDED, or the coordinator's UNAVAILABLE naming the shard call's
   DEADLINE_EXCEEDED), and every other request still gets its reference answer (a batch
   that fails as a whole — its earliest deadline — is sent again request by request).
4. coalesce_inflight 0 (restart): the same answers, and the coalesced counters stay 0.
"""
import concurrent.futures as cf
import json
import os
import random
import re
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 6000
NREQ = 160
THREADS = 24


def metric(mport, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        text = r.read().decode()
    tot = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if m and m.group(1) == name:
            tot += float(m.group(3))
    return tot


def make_requests(tp, rng, xs):
    reqs = []
    for i in range(NREQ):
        qs = []
        for j in range(rng.randint(1, 3)):
            v = xs[rng.randrange(len(xs))] + np.float32(0.01) * rng.random()
            kind = rng.randrange(4)
            restricts = [("color", ["c%d" % rng.randrange(3)], [])] if kind == 1 else None
            numeric = [("rank", "int", rng.randrange(N), 3)] if kind == 2 else None  # LESS
            crowding = rng.choice([0, 0, 1, 2])
            qs.append(ch.query(tp, v, k=rng.randint(1, 20), crowding=crowding,
                               cand=rng.choice([None, 0]), fraction=rng.choice([0.1, 0.3, 1.0]),
                               restricts=restricts, numeric=numeric))
        reqs.append(tp.FindNeighborsRequest(queries=qs))
    return reqs


def answer_of(r):
    return [[(n.datapoint.datapoint_id, n.distance) for n in nn.neighbors]
            for nn in r.nearest_neighbors]


def concurrent_round(cl, reqs, ref, short=()):
    """Every request from THREADS threads (short: indexes sent with a 2 ms deadline too).
    Returns (wrong, failed, short_failed)."""
    import grpc
    jobs = [(i, 30.0) for i in range(len(reqs))] + [(i, 0.002) for i in short]
    random.Random(len(short)).shuffle(jobs)

    def one(job):
        i, tmo = job
        try:
            r = cl.stub.FindNeighbors(reqs[i], timeout=tmo)
        except grpc.RpcError as e:
            return (i, tmo, e.code(), e.details())
        return (i, tmo, None, answer_of(r))

    wrong = failed = short_failed = 0
    with cf.ThreadPoolExecutor(THREADS) as pool:
        for i, tmo, code, got in pool.map(one, jobs):
            if code is not None:
                # a 2 ms request fails by its own deadline: the client's, or the shard call's
                # that the coordinator cut to it (UNAVAILABLE "shard i ... failed:
                # DEADLINE_EXCEEDED", docs/coordinator.md "Replicas")
                if tmo < 1 and (code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                        code == grpc.StatusCode.UNAVAILABLE and "DEADLINE_EXCEEDED" in got)):
                    short_failed += 1
                else:
                    failed += 1
                    print("request %d failed: %s: %s" % (i, code, got))
            elif got != ref[i]:
                wrong += 1
                if wrong <= 3:
                    print("request %d: %s\n  != reference %s" % (i, got, ref[i]))
    return wrong, failed, short_failed


def main():
    rng = random.Random(7)
    xs = np.random.default_rng(7).standard_normal((N, D)).astype(np.float32)
    mport = sh.free_port()
    cl = ch.Cluster(nshards=4, dims=D, config={"nlist": 32, "pq_m": 8, "nprobe": 4,
                                              "coalesce_inflight": 1},
                    coord_extra=["--metrics-listen", "127.0.0.1:%d" % mport])
    try:
        recs = [ch.dp_json("id%d" % i, xs[i], restricts=[("color", ["c%d" % (i % 3)], [])],
                           numeric=[("rank", "int", i)], tag="t%d" % (i % 7))
                for i in range(N)]
        batch = ch.write_batch(os.path.join(cl.root, "batch"), recs)
        cl.update(batch)
        tp = ch.stubs()[0]
        reqs = make_requests(tp, rng, xs)

        ref = [answer_of(cl.stub.FindNeighbors(r, timeout=30)) for r in reqs]
        assert metric(mport, "tessera_coalesced_calls_total") == 0, \
            "one request at a time was coalesced"
        print("reference: %d requests (%d queries), one at a time" %
              (len(reqs), sum(len(r.queries) for r in reqs)))

        for rnd in range(3):
            wrong, failed, _ = concurrent_round(cl, reqs, ref)
            assert wrong == 0 and failed == 0, "round %d: %d wrong, %d failed" % (rnd, wrong, failed)
        calls = metric(mport, "tessera_coalesced_calls_total")
        rqs = metric(mport, "tessera_coalesced_requests_total")
        print("%d threads x 3 rounds: every answer equals the reference; %d coalesced calls "
              "carried %d requests (%.1f each)" % (THREADS, calls, rqs, rqs / max(calls, 1)))
        assert calls > 0 and rqs > calls, "nothing was coalesced under %d threads" % THREADS

        short = [rng.randrange(len(reqs)) for _ in range(60)]
        wrong, failed, short_failed = concurrent_round(cl, reqs, ref, short)
        print("with %d requests of a 2 ms deadline mixed in: %d of them failed by their "
              "deadline, the others all answered as the reference" %
              (len(short), short_failed))
        assert wrong == 0 and failed == 0, "%d wrong, %d failed" % (wrong, failed)
        assert "each sent again alone" in cl.coord.text(), \
            "no coalesced call failed as a whole: the per-request retry was not exercised"

        cl.stop_coord()
        with open(cl.config) as f:
            cfg = json.load(f)
        cfg["coalesce_inflight"] = 0
        with open(cl.config, "w") as f:
            json.dump(cfg, f)
        cl.start(extra_args=["--metrics-listen", "127.0.0.1:%d" % mport])
        wrong, failed, _ = concurrent_round(cl, reqs, ref)
        assert wrong == 0 and failed == 0, "coalesce off: %d wrong, %d failed" % (wrong, failed)
        assert metric(mport, "tessera_coalesced_calls_total") == 0, "coalesce_inflight 0 coalesced"
        print("coalesce_inflight 0: same answers, nothing coalesced")
    finally:
        cl.stop()
    print("test_coord_coalesce: OK")


if __name__ == "__main__":
    main()
