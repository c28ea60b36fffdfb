"""Folding the streamed delta under query load and streamed writes (issue 15, "what must be
true" 5, scaled for `make test`; the 1M figures come from `make bench-stream`).

Cluster: tessera-coordinator + 2 shard groups (group 0 of 2 replicas), a base version of
20000 vectors (d 32, nlist 64, PQ 8). A 10 % delta is streamed in (2000 new ids, 200
replaced vectors, 200 removes). Then 3 query threads (full probe and default nprobe) run
nonstop while the fold runs — UpdateIndex with fold_stream (`tessera update --fold`), the
background fold's update on demand — and a writer streams one new id per call through it.
Every shard's Prepare sleeps 1.5 s first (TSR_SHARD_SLOW_PREPARE_MS) so the fold's
Prepare is long enough to write through, and the coordinator sleeps 1 s between the fold's
catch-up and its flip (TSR_COORD_SLOW_FLIP_MS). Checks:
- 0 failed queries; every answer is from the old or the new version, and no removed id
  appears in any answer;
- writes are not held by the fold's Prepare (docs/streaming.md "Folding"): at least one
  write was sent after GetOperation said PREPARING and acknowledged while it still said
  so (before, the stream lock was held from the plan through the Commit fan-out: such a
  write was acknowledged only after the commit point); every write acknowledged;
- after the fold: each shard's delta holds exactly the writer's records (carried to the
  new version by the catch-up), the contents are unchanged plus the writer's records
  (ReadIndexDatapoints of every streamed and a sample of base ids, bit for bit; the
  count);
- a second fold with no load empties every delta; every shard's folded vNNNNNN/slice.faiss
  opens in stock Faiss and holds every vector of the shard (sum of ntotal = the index's
  count); for 300 queries Faiss's search_preassigned with the same lists and coarse
  distances returns the labels Shard.Search returns for >= 99 % of the (shard, query)
  pairs, distances within 1e-4 relative (the rule of test_shard_faiss.py), and the merged
  Faiss answer read back as ids equals the cluster's FindNeighbors (PQ distances, same
  nprobe) for >= 97 % of the queries;
- the two replicas of group 0 hold the same version and count;
- no query was refused as behind the stream (the coordinator's log): between the catch-up
  and the flip, queries on the served version demand its own groups' seqs;
- each replica's fold build was paced to fold_build_cpu_percent (25 % of a core, the
  default; the shard's Prepare log line), the batch update's was not.
Query p50 / p99 during the fold vs before it, and the writes' ack times, are printed, not
asserted.
"""
import os
import re
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import stream_model as sm  # noqa: E402

D = 32
N = int(os.environ.get("TSR_STREAM_FOLD_N", 20000))
NLIST = 64
NPROBE = 8
SEED = int(os.environ.get("TSR_STREAM_SEED", int(time.time()) % 100000))


def main():
    try:
        import faiss
    except ImportError:
        print("test_stream_fold: SKIP: python3 faiss is not installed")
        sys.exit(77)
    faiss.omp_set_num_threads(1)
    tp, _, sp, _ = ch.stubs()
    print("test_stream_fold: seed %d (TSR_STREAM_SEED)" % SEED)
    rng = np.random.default_rng(SEED)
    centers = rng.normal(size=(100, D)) * 4
    base = [sm.random_rec(rng, "b%06d" % i, D, centers) for i in range(N)]
    root = sh.tmpdir("tsr-stream-fold-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [sm.to_json(r) for r in base], per_file=10000)
    # every shard's Prepare sleeps first: the fold's Prepare is long enough to write through
    os.environ["TSR_SHARD_SLOW_PREPARE_MS"] = "1500"
    # and the coordinator's fold sleeps after it copied the overlay into the new version's
    # directory, before its catch-up: the writes of that second are the ones its catch-up
    # re-applies (tsr__stream_overlay_finish)
    # and it sleeps 1 s between its catch-up and its flip: queries planned on the served
    # version meanwhile must demand that version's stream seqs, not the new one's
    cl = sm.StreamCluster([2, 1], D, {"nlist": NLIST, "pq_m": 8, "nprobe": NPROBE},
                          env={"TSR_COORD_SLOW_FOLD_DIR_MS": "1000",
                               "TSR_COORD_SLOW_FLIP_MS": "1000"})
    stop = threading.Event()
    threads = []
    try:
        op0 = cl.update(b0, timeout=300)
        assert op0.state == tp.Operation.SUCCEEDED, op0
        model = sm.Model(base)
        n_new, n_rep, n_rem = N // 10, N // 100, N // 100
        new = [sm.random_rec(rng, "s%06d" % i, D, centers) for i in range(n_new)]
        rep = [sm.random_rec(rng, "b%06d" % i, D, centers) for i in range(0, n_rep * 7, 7)]
        rem = ["b%06d" % i for i in range(3, n_rem * 7, 7)]
        t0 = time.time()
        for k in range(0, len(new), 100):
            op = sm.call(cl.stub, sm.Op("upsert", new[k:k + 100]), tp)
            assert op.outcome == sm.OK, op.code
        for k in range(0, len(rep), 100):
            op = sm.call(cl.stub, sm.Op("upsert", rep[k:k + 100]), tp)
            assert op.outcome == sm.OK, op.code
        op = sm.call(cl.stub, sm.Op("remove", ids=rem), tp)
        assert op.outcome == sm.OK, op.code
        model.upsert(new + rep)
        model.remove(rem)
        st = cl.shard_stats()
        delta = sum(x.delta_upserts + x.delta_deletes for row in st for x in row[:1])
        print("streamed %d upserts + %d removes in %.1fs; delta %d records over the groups" %
              (len(new) + len(rep), len(rem), time.time() - t0, delta))
        assert delta > 0, "no delta after the streamed writes: %s" % st
        removed = set(rem)
        xq = np.array([r.vec for r in new[:100] + rep[:50]] +
                      [centers[i % 100] + rng.normal(size=D) for i in range(150)],
                      dtype="float32")
        lat = []          # (t, latency, ok, version)
        bad = []

        def client(t):
            import grpc
            from tessera.v1 import tessera_pb2_grpc
            chan = grpc.insecure_channel(cl.target)
            stub = tessera_pb2_grpc.VectorSearchStub(chan)
            i = t
            while not stop.is_set():
                frac = 1.0 if t == 0 else 0.0
                rq = tp.FindNeighborsRequest(queries=[ch.query(tp, xq[i % len(xq)], 10,
                                                               fraction=frac)])
                i += 3
                a = time.time()
                try:
                    r = stub.FindNeighbors(rq, timeout=30)
                    ids = [n.datapoint.datapoint_id for n in r.nearest_neighbors[0].neighbors]
                    if removed & set(ids):
                        bad.append("removed id returned: %s" % (removed & set(ids)))
                    lat.append((a, time.time() - a, True, r.version))
                except grpc.RpcError as e:
                    lat.append((a, time.time() - a, False, 0))
                    bad.append("%s: %s" % (e.code().name, e.details()))
            chan.close()

        for t in range(3):
            threads.append(threading.Thread(target=client, args=(t,)))
            threads[-1].start()
        time.sleep(3.0)
        f0 = time.time()
        r = cl.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=30)
        # the writer's operations in order: a new id, a new vector for a streamed id, the
        # removal of a base id; (sent, acked, state before, after) each
        wrecs, wrep, wrem, wlog = [], [], [], []

        def op_state():
            return cl.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                        timeout=10).state

        def writer():
            done = (tp.Operation.SUCCEEDED, tp.Operation.FAILED, tp.Operation.REJECTED)
            after_done = 0
            while not stop.is_set() and after_done < 5:
                before = op_state()
                kind = len(wlog) % 3
                if kind == 0:
                    rec = sm.random_rec(rng_w, "w%05d" % len(wrecs), D, centers)
                    op = sm.call(cl.stub, sm.Op("upsert", [rec]), tp)
                elif kind == 1:
                    rec = sm.random_rec(rng_w, new[len(wrep)].id, D, centers)
                    op = sm.call(cl.stub, sm.Op("upsert", [rec]), tp)
                else:
                    rid = "b%06d" % (5 + 7 * len(wrem))   # not among rep / rem (0, 3 mod 7)
                    op = sm.call(cl.stub, sm.Op("remove", ids=[rid]), tp)
                if op.outcome != sm.OK:
                    bad.append("streamed write during the fold: %s" % op.code)
                    return
                [wrecs, wrep, wrem][kind].append(rid if kind == 2 else rec)
                wlog.append((op.start, op.end, before, op_state()))
                after_done += before in done
                time.sleep(0.05)

        rng_w = np.random.default_rng(SEED + 1)
        wt = threading.Thread(target=writer)
        wt.start()
        opf = cl.wait_op(r.operation_id, timeout=300)
        f1 = time.time()
        wt.join(60)
        time.sleep(1.0)
        stop.set()
        for th in threads:
            th.join(60)
        assert opf.state == tp.Operation.SUCCEEDED and opf.version == op0.version + 1, opf
        assert not bad, bad[:5]
        for i, w in enumerate(wlog):   # in acknowledgement order
            if i % 3 == 2:
                model.remove([wrem[i // 3]])
            else:
                model.upsert([[wrecs, wrep][i % 3][i // 3]])
        versions = set(x[3] for x in lat)
        assert versions <= {op0.version, opf.version} and opf.version in versions, versions
        quiet = np.array([x[1] for x in lat if x[0] < f0])
        during = np.array([x[1] for x in lat if f0 <= x[0] <= f1])
        print("fold of %d delta records: %.2fs; %d queries, 0 failed, 0 removed ids; p50 / p99 "
              "ms quiet %.1f / %.1f, during the fold (%d queries) %.1f / %.1f" % (
                  delta, f1 - f0, len(lat), np.median(quiet) * 1e3,
                  np.percentile(quiet, 99) * 1e3, len(during),
                  np.median(during) * 1e3 if len(during) else float("nan"),
                  np.percentile(during, 99) * 1e3 if len(during) else float("nan")))
        prep = tp.Operation.PREPARING
        through = [w for w in wlog if w[2] == prep and w[3] == prep]
        in_fold = [w for w in wlog if w[0] <= f1]
        print("streamed writes during the fold: %d acknowledged (%d sent and acknowledged "
              "while the fold was PREPARING), ack max %.1f ms; %d in all" % (
                  len(in_fold), len(through),
                  max((w[1] - w[0]) * 1e3 for w in in_fold) if in_fold else float("nan"),
                  len(wlog)))
        assert through, "no write went through while the fold was PREPARING: %s" % [
            (round(w[1] - w[0], 3), w[2], w[3]) for w in wlog[:20]]
        # between the catch-up and the flip the groups' seqs are the new version's; a query
        # on the served one that demanded them waited 100 ms per group, was refused as
        # behind and asked again (every fold's commit point cost a ~207 ms query, Dec 6)
        clog = cl.coord.text()
        assert "the fold's flip after its catch-up sleeps first" in clog, "hook not seen"
        assert "behind the streamed writes a query demands" not in clog, [
            l for l in clog.splitlines() if "behind the streamed writes" in l][:3]
        # the fold's Prepare went to the 3 replicas one at a time (fold_prepare_parallel
        # 1, the default): each sleeps 1.5 s first, so the phase took >= 4.5 s (~1.5 s
        # when they prepare at once)
        fold_v = opf.version
        m = re.search(r"version %d: plan \d+ ms, stage \d+, prepare (\d+)" % fold_v, clog)
        assert m and int(m.group(1)) >= 3 * 1500, (
            "the fold's Prepare did not take the replicas one at a time: %s" %
            (m.group(0) if m else "no phase line for version %d" % fold_v))
        # every replica's fold build was paced to fold_build_cpu_percent (25, the
        # default) of a core; the batch update's build was not (it holds the writes)
        for s in [s for grp in cl.groups for s in grp]:
            lines = s.text().splitlines()
            fb = [l for l in lines if "Prepare(%d): built in" % fold_v in l]
            bb = [l for l in lines if "Prepare(%d): built in" % op0.version in l]
            assert fb and "paced to 25 % of a core" in fb[0], (s.target, fb)
            assert bb and "paced" not in bb[0], (s.target, bb)
        # the fold's build and update threads ran at the background priority (nice 10,
        # core/parallel.h) and ended with it: every thread left in the coordinator and the
        # shards has the process's own nice — a thread the build started (or one gRPC made
        # from it) would keep nice 10 and slow the queries it later serves
        procs = [cl.coord.proc] + [s.proc for grp in cl.groups for s in grp]
        base_nice = os.getpriority(os.PRIO_PROCESS, 0)
        for p in procs:
            for t in os.listdir("/proc/%d/task" % p.pid):
                try:
                    with open("/proc/%d/task/%s/stat" % (p.pid, t)) as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue   # the thread ended meanwhile
                assert int(fields[16]) == base_nice, (p.args[0], t, fields[16])
        # the writer's operations sent once the fold said STAGING (its stream lock held, S
        # taken) are the new version's delta, carried by the catch-up or streamed after the
        # flip; the ones acknowledged before S (the fold plans before it takes the lock) are
        # in its slices; nothing else is in the delta (a new vector that moves its id to
        # another group leaves a delete of its old label there)
        cl.wait_replicas_agree()
        st = cl.shard_stats()
        for row in st:
            for x in row:
                assert x.current_version == opf.version, x
        late = [i for i, w in enumerate(wlog) if w[2] not in (tp.Operation.PENDING,
                                                             tp.Operation.READING)]
        ups = sum(row[0].delta_upserts for row in st)
        dels = sum(row[0].delta_deletes for row in st)
        late_ups = sum(1 for i in late if i % 3 != 2)
        assert late_ups <= ups <= len(wrecs) + len(wrep), (st, late_ups, len(wlog))
        assert len(late) - late_ups <= dels <= len(wrem) + len(wrep), (st, late, len(wlog))
        ids = [r.id for r in new + rep + wrecs] + rem + wrem + \
            ["b%06d" % i for i in range(0, N, 37)]
        got = sm.read_state(cl.stub, tp, ids)
        diff = sm.diff_states({i: model.m[i] for i in ids if i in model.m}, got)
        assert not diff, "contents changed by the fold:\n  " + "\n  ".join(diff)
        assert cl.stats().vectors_count == len(model.m), (cl.stats(), len(model.m))
        # a second fold (no load) folds the writer's records too
        opf = cl.fold(timeout=300)
        assert opf.state == tp.Operation.SUCCEEDED, opf
        # contents unchanged, delta empty, replicas agree (after the second fold)
        cl.wait_replicas_agree()
        for row in cl.shard_stats():
            for x in row:
                assert x.current_version == opf.version and \
                    x.delta_upserts == 0 and x.delta_deletes == 0, x
        got = sm.read_state(cl.stub, tp, ids)
        diff = sm.diff_states({i: model.m[i] for i in ids if i in model.m}, got)
        assert not diff, "contents changed by the fold:\n  " + "\n  ".join(diff)
        assert cl.stats().vectors_count == len(model.m), (cl.stats(), len(model.m))
        # the folded slices in stock Faiss
        tmpl = faiss.read_index(os.path.join(cl.root, "coordinator", "v%06d" % opf.version,
                                             "template.faiss"))
        fz = sm.faiss_slices_check(cl, tmpl, xq,
                                   NPROBE, NLIST, 10)
        print("folded slices in stock Faiss %s: ntotal %d, index count %d; shard == Faiss for "
              "%d/%d (shard, query) pairs, worst rel. distance diff %.2g; cluster == merged "
              "Faiss for %d/%d queries" % (fz["faiss"], fz["ntotal"], fz["count"], fz["same"],
                                           fz["pairs"], fz["worst"], fz["cluster_same"],
                                           fz["nq"]))
        assert fz["ntotal"] == fz["count"] == len(model.m), fz
        assert fz["same"] >= 0.99 * fz["pairs"] and fz["worst"] < 1e-4, fz
        assert fz["cluster_same"] >= 0.97 * fz["nq"], fz
    finally:
        stop.set()
        for th in threads:
            th.join(60)
        cl.stop()
    print("test_stream_fold: OK")


if __name__ == "__main__":
    main()
