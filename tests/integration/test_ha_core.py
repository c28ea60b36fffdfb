"""The coordinator's etcd backend and election (issue 16; docs/coordinator.md "Metadata
backends", "Leader, followers, failover"), with a real etcd (/usr/bin/etcd) and real
coordinators and shards on loopback.

1. Empty --data (acceptance 6): a coordinator with --etcd loads an index and is killed -9;
   a new coordinator with an EMPTY --data folder and the same --etcd answers the same
   FindNeighbors and ReadIndexDatapoints (the version's small files come from etcd, its id
   directory from the shards: etcd holds no directory blob, only its summary, and a
   listing that does not match the summary is refused and retried), and, once the dead
   one's lease expired, it is the leader and the next UpdateIndex succeeds.
2. Two coordinators on one etcd: exactly one leader; the follower answers queries,
   refuses UpdateIndex and UpsertDatapoints with UNAVAILABLE naming the leader, and moves
   to the version the leader commits; GetIndexStats lists both and the leader; kill -9 of
   the leader -> the follower is the leader within TTL + 1 s (measured, printed) and its
   UpdateIndex succeeds; every shard ends on the version etcd holds.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
TTL = 2
ETCD = os.environ.get("TSR_ETCD_BIN", "/usr/bin/etcd")


class Etcd:
    """A one-member etcd on free loopback ports in a temp dir; stop() kills it."""

    def __init__(self):
        self.dir = sh.tmpdir("tsr-etcd-")
        cport, pport = sh.free_port(), sh.free_port()
        curl, purl = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
        self.endpoints = "127.0.0.1:%d" % cport
        self.cport = cport
        self.argv = [ETCD, "--name", "m0", "--data-dir", os.path.join(self.dir, "m0"),
                     "--listen-client-urls", curl, "--advertise-client-urls", curl,
                     "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                     "--initial-cluster", "m0=" + purl, "--initial-cluster-state", "new",
                     "--heartbeat-interval", "50", "--election-timeout", "500"]
        self.start()

    def start(self):
        """Starts (or restarts, same ports and data) the member."""
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        import socket
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", self.cport), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("etcd did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def coord(cl, data, etcd, prefix, extra=(), env=None):
    """Another coordinator in front of cl's shards with its own data folder."""
    argv = [os.path.join(cl.bin, "tessera-coordinator"), "--listen", "127.0.0.1:0",
            "--data", data, "--config", cl.config, "--etcd", etcd.endpoints,
            "--etcd-prefix", prefix, "--etcd-ttl", str(TTL)]
    argv += ch.batch_allow_args(cl.root) + list(extra)
    p = ch.Proc(argv, env)
    if p.port is None:
        p.proc.kill()
        raise RuntimeError("coordinator did not start:\n" + p.text())
    tp, tpg, _, _ = ch.stubs()
    p.target = "127.0.0.1:%d" % p.port
    p.channel = grpc.insecure_channel(p.target)
    p.stub = tpg.VectorSearchStub(p.channel)
    return p


def stop(p, sig=signal.SIGTERM):
    p.channel.close()
    if p.proc.poll() is None:
        p.proc.send_signal(sig)
    rc = p.proc.wait(30)
    text = p.text()
    if sig != signal.SIGKILL:
        assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text, text
        assert rc == 0, "coordinator exit code %s:\n%s" % (rc, text)


def etcdctl(etcd, *args):
    r = subprocess.run(["etcdctl", "--endpoints", etcd.endpoints, "--dial-timeout", "2s"] +
                       list(args), capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return r.stdout


def check_no_directory_blob(etcd, prefix):
    """etcd holds the version's small files and, for the directory, only its summary."""
    keys = etcdctl(etcd, "get", "--prefix", "--keys-only", prefix + "/").split()
    blobs = [k for k in keys if "/blobs/" in k]
    assert blobs and not [k for k in blobs if "/directory/" in k], keys
    rec = etcdctl(etcd, "get", "--print-value-only", prefix + "/version")
    assert "\ndirsum " in rec and "file directory" not in rec, rec
    return rec


def answers(tp, stub, x, ids):
    res = []
    for i in range(0, len(x), 97):
        r = stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, x[i], k=10)]),
                               timeout=20)
        res.append([(n.datapoint.datapoint_id, round(n.distance, 4))
                    for n in r.nearest_neighbors[0].neighbors])
    rd = stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=20)
    res.append([(d.datapoint_id, tuple(round(v, 5) for v in d.feature_vector))
                for d in rd.datapoints])
    return res


def update(tp, stub, root, timeout=120):
    r = stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=root), timeout=30)
    t0 = time.time()
    while True:
        op = stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id), timeout=10)
        if op.state in (tp.Operation.SUCCEEDED, tp.Operation.FAILED, tp.Operation.REJECTED):
            return op
        assert time.time() - t0 < timeout, op
        time.sleep(0.05)


def wait_stats(tp, stub, ok, timeout):
    """Polls GetIndexStats until ok(stats); returns (stats, the seconds waited)."""
    t0 = time.time()
    while True:
        st = stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10)
        if ok(st):
            return st, time.time() - t0
        assert time.time() - t0 < timeout, st
        time.sleep(0.05)


def wait_leader(tp, stub, want, timeout):
    """Polls GetIndexStats until it names `want` as leader; returns the seconds waited."""
    return wait_stats(tp, stub, lambda st: st.leader == want, timeout)[1]


def shard_versions(cl):
    _, _, sp, _ = ch.stubs()
    return [s.stub.Stats(sp.ShardStatsRequest(), timeout=10).current_version
            for s in cl.shards]


def check_fencing(cl):
    """Every shard holds the new leader's term (DATA/leader-term) and refuses calls with an
    older one; term 0 (local backend) is not checked."""
    _, _, sp, _ = ch.stubs()
    for s in cl.shards:
        with open(os.path.join(s.data, "leader-term")) as f:
            term = int(f.read())
        assert term > 1, term
        calls = [("Commit", sp.CommitRequest(version=3, leader_term=term - 1)),
                 ("Abort", sp.AbortRequest(version=4, leader_term=1)),
                 ("Stage", sp.StageRequest(version=4, base_version=3, leader_term=term - 1)),
                 ("Prepare", sp.PrepareRequest(version=4, leader_term=1)),
                 ("Release", sp.ReleaseRequest(below_version=3, leader_term=1)),
                 ("Write", sp.ShardWriteRequest(version=3, seq=10 ** 9, leader_term=1))]
        for name, rq in calls:
            try:
                getattr(s.stub, name)(rq, timeout=10)
                raise AssertionError("%s with an older term was accepted" % name)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, e)
                assert e.details() == "leader term %d is older than %d" % (
                    rq.leader_term, term), (name, e.details())
        s.stub.Abort(sp.AbortRequest(version=99), timeout=10)  # term 0: not checked
        s.stub.Abort(sp.AbortRequest(version=99, leader_term=term), timeout=10)
    print("fencing: %d shards refuse Stage/Prepare/Commit/Abort/Release/Write of an older "
          "term" % len(cl.shards))


def test_empty_data(etcd, x, b0, b1):
    tp = ch.stubs()[0]
    prefix = "/tessera/t-empty"
    cl = ch.Cluster(nshards=2, dims=D, config={"nlist": 16, "pq_m": 4},
                    coord_extra=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                                 "--etcd-ttl", str(TTL)])
    try:
        wait_leader(tp, cl.stub, cl.target, 10)
        op = update(tp, cl.stub, b0)
        assert op.state == tp.Operation.SUCCEEDED, op
        ids = ["x%05d" % i for i in range(0, 2000, 131)] + ["nope"]
        before = answers(tp, cl.stub, x, ids)
        rec = check_no_directory_blob(etcd, prefix)
        cl.stop_coord(signal.SIGKILL)
        data = os.path.join(cl.root, "coordinator")
        shutil.rmtree(data)
        os.makedirs(data)
        # a directory summary the shards' listing does not match (its digest's last hex
        # digit changed): refused, retried; the true record is put back 2.5 s later
        line = [ln for ln in rec.split("\n") if ln.startswith("dirsum ")][0]
        bad = line[:-1] + ("0" if line[-1] != "0" else "1")
        etcdctl(etcd, "put", prefix + "/version", rec.replace(line, bad))
        fix = threading.Timer(2.5, lambda: etcdctl(etcd, "put", prefix + "/version", rec))
        fix.start()
        cl.start(extra_args=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                             "--etcd-ttl", str(TTL)])
        fix.join()
        assert cl.stats().version == 1, cl.coord.text()
        after = answers(tp, cl.stub, x, ids)
        assert after == before, "answers differ after a restart with an empty --data"
        text = cl.coord.text()
        assert "loaded into the cache" in text, text
        assert "the version record says" in text and ": refused" in text, text
        assert "directory of version 1 rebuilt from 2 shard group(s)" in text, text
        # the killed coordinator's lease still holds the leader key for up to TTL
        wait_leader(tp, cl.stub, cl.target, TTL + 5)
        op = update(tp, cl.stub, b1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        t0 = time.time()
        while shard_versions(cl) != [2, 2]:
            assert time.time() - t0 < 20, shard_versions(cl)
            time.sleep(0.1)
        check_no_directory_blob(etcd, prefix)
        print("empty --data: same %d answers from etcd and the shards (no directory blob in "
              "etcd; a listing that does not match its summary refused, then retried); "
              "update -> v2" % len(before))
    finally:
        cl.stop()


def test_two_coordinators(etcd, x, b0, b1, b2):
    tp = ch.stubs()[0]
    prefix = "/tessera/t-two"
    cl = ch.Cluster(nshards=2, dims=D, config={"nlist": 16, "pq_m": 4},
                    coord_extra=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                                 "--etcd-ttl", str(TTL)])
    b = None
    try:
        wait_leader(tp, cl.stub, cl.target, 10)
        b = coord(cl, os.path.join(cl.root, "coord-b"), etcd, prefix)
        wait_leader(tp, b.stub, cl.target, 10)  # b is a follower naming a
        # the members list is the lease thread's read of PREFIX/members/ (every TTL/3); the
        # leader's name can come first from the watch (a CI run under ASan saw it empty)
        wait_stats(tp, b.stub, lambda st: sorted(st.coordinators) ==
                   sorted([cl.target, b.target]), TTL + 5)
        try:
            b.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b0), timeout=10)
            raise AssertionError("a follower accepted UpdateIndex")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert e.details() == "not the leader: the leader is " + cl.target, e.details()
        try:
            dp = tp.IndexDatapoint(datapoint_id="s1", feature_vector=[0.0] * D)
            b.stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=[dp]), timeout=10)
            raise AssertionError("a follower accepted UpsertDatapoints")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert cl.target in e.details(), e.details()
        op = update(tp, cl.stub, b0)
        assert op.state == tp.Operation.SUCCEEDED, op
        t0 = time.time()
        while b.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10).version != 1:
            assert time.time() - t0 < 10, b.text()
            time.sleep(0.01)
        lag = time.time() - t0
        ids = ["x%05d" % i for i in range(0, 2000, 173)]
        assert answers(tp, b.stub, x, ids) == answers(tp, cl.stub, x, ids)
        op = update(tp, cl.stub, b1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        got = b.stub.GetOperation(tp.GetOperationRequest(operation_id=op.operation_id),
                                  timeout=10)  # records in etcd: any coordinator answers
        assert got.state == tp.Operation.SUCCEEDED and got.version == 2, got
        # kill -9 of the leader: b takes over when the lease expires
        cl.stop_coord(signal.SIGKILL)
        t_kill = time.time()
        took = wait_leader(tp, b.stub, b.target, TTL + 10)
        took = time.time() - t_kill
        assert took <= TTL + 1.0, "failover took %.2f s (TTL %d s)" % (took, TTL)
        op = update(tp, b.stub, b2)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 3, (op, b.text())
        t0 = time.time()
        while shard_versions(cl) != [3, 3]:
            assert time.time() - t0 < 20, shard_versions(cl)
            time.sleep(0.1)
        print("two coordinators: follower refuses writes naming the leader, follows v1 %.2f s "
              "after GetOperation said SUCCEEDED; kill -9 of the leader -> new leader in %.2f s "
              "(TTL %d s); update -> v3" % (lag, took, TTL))
        check_fencing(cl)
    finally:
        if b:
            stop(b)
        cl.stop()


def test_crash_steps(etcd, x, batches):
    """kill -9 (_exit) of the leader at each step of an update: the follower takes over,
    GetOperation on it reports the outcome (SUCCEEDED after the etcd commit, else FAILED
    interrupted), and every shard ends on exactly the version etcd holds."""
    tp = ch.stubs()[0]
    _, _, sp, _ = ch.stubs()
    prefix = "/tessera/t-crash"
    cl = ch.Cluster(nshards=2, dims=D, config={"nlist": 16, "pq_m": 4},
                    coord_extra=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                                 "--etcd-ttl", str(TTL)])
    procs = []
    try:
        wait_leader(tp, cl.stub, cl.target, 10)
        op = update(tp, cl.stub, batches[0])
        assert op.state == tp.Operation.SUCCEEDED, op
        cl.stop_coord()  # SIGTERM revokes its lease: the next one wins at once
        version = 1
        for i, step in enumerate(["staged", "prepared", "flipped", "committed"]):
            x_ = coord(cl, os.path.join(cl.root, "cx%d" % i), etcd, prefix,
                       env={"TSR_COORD_CRASH_AT": step})
            procs.append(x_)
            wait_leader(tp, x_.stub, x_.target, TTL + 5)
            y = coord(cl, os.path.join(cl.root, "cy%d" % i), etcd, prefix)
            procs.append(y)
            wait_leader(tp, y.stub, x_.target, 10)
            r = x_.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=batches[1 + i]),
                                    timeout=30)
            assert x_.proc.wait(60) == 137, x_.text()
            wait_leader(tp, y.stub, y.target, TTL + 5)
            after = step in ("flipped", "committed")
            if after:
                version += 1
            t0 = time.time()
            while True:
                got = y.stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                          timeout=10)
                if got.state in (tp.Operation.SUCCEEDED, tp.Operation.FAILED):
                    break
                assert time.time() - t0 < 10, got
                time.sleep(0.1)
            if after:
                assert got.state == tp.Operation.SUCCEEDED and got.version == version, got
            else:
                assert got.state == tp.Operation.FAILED and "interrupted" in got.error, got
            t0 = time.time()
            while True:
                sts = [s.stub.Stats(sp.ShardStatsRequest(), timeout=10) for s in cl.shards]
                cur = [st.current_version for st in sts]
                pend = [v.version for st in sts for v in st.versions
                        if not v.current and v.state != sp.ShardVersion.SERVING]
                if cur == [version] * len(cl.shards) and not pend:
                    break
                assert time.time() - t0 < 20, (step, cur, pend, y.text())
                time.sleep(0.1)
            assert y.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10).version == version
            stop(y)  # the next crashing coordinator wins at once
            print("crash at %s: %s, every shard on version %d" %
                  (step, tp.Operation.State.Name(got.state), version))
    finally:
        for p in procs:
            if p.proc.poll() is None:
                stop(p)
        cl.stop()


def test_stream_failover(etcd, x, b0):
    """Streamed writes on the leader, kill -9 of it: the new leader rebuilds the overlay,
    label counter and seqs from etcd's copy of the coordinator log: it reads the streamed
    ids, its own streamed writes get fresh labels (every id is found at distance 0 by its
    own vector), and a batch update folds them all into the next version."""
    tp = ch.stubs()[0]
    prefix = "/tessera/t-stream"
    cl = ch.Cluster(nshards=2, dims=D, config={"nlist": 16, "pq_m": 4},
                    coord_extra=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                                 "--etcd-ttl", str(TTL)])
    b = None
    rng = np.random.default_rng(5)
    v = (rng.normal(size=(60, D)) * 3).astype("float32")

    def upsert(stub, lo, hi):
        dps = [tp.IndexDatapoint(datapoint_id="s%03d" % i, feature_vector=[float(f) for f in v[i]])
               for i in range(lo, hi)]
        stub.UpsertDatapoints(tp.UpsertDatapointsRequest(datapoints=dps), timeout=30)

    def check(stub, n):
        ids = ["s%03d" % i for i in range(n)]
        rd = stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=20)
        assert sorted(d.datapoint_id for d in rd.datapoints) == ids, rd
        for i in range(n):
            r = stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, v[i], k=1, fraction=1.0)]), timeout=20)
            nb = r.nearest_neighbors[0].neighbors[0]
            assert nb.datapoint.datapoint_id == "s%03d" % i and nb.distance < 1e-3, (i, r)
    try:
        wait_leader(tp, cl.stub, cl.target, 10)
        assert update(tp, cl.stub, b0).state == tp.Operation.SUCCEEDED
        b = coord(cl, os.path.join(cl.root, "coord-b"), etcd, prefix)
        wait_leader(tp, b.stub, cl.target, 10)
        for lo in range(0, 30, 10):
            upsert(cl.stub, lo, lo + 10)
        cl.stub.RemoveDatapoints(tp.RemoveDatapointsRequest(datapoint_ids=["x00001"]),
                                 timeout=20)
        t0 = time.time()  # the follower replays the mirrored rounds: it reads them too
        want = ["s%03d" % i for i in range(30)]
        while True:
            rd = b.stub.ReadIndexDatapoints(
                tp.ReadIndexDatapointsRequest(ids=want + ["x00001"]), timeout=20)
            if sorted(d.datapoint_id for d in rd.datapoints) == want:
                break
            assert time.time() - t0 < 5, rd
            time.sleep(0.01)
        follower_lag = time.time() - t0
        check(b.stub, 30)
        cl.stop_coord(signal.SIGKILL)
        wait_leader(tp, b.stub, b.target, TTL + 5)
        assert "restored from etcd (3 rounds" in b.text() or \
            "restored from etcd (4 rounds" in b.text(), b.text()
        check(b.stub, 30)
        upsert(b.stub, 30, 60)
        check(b.stub, 60)
        rd = b.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=["x00001"]), timeout=20)
        assert len(rd.datapoints) == 0, rd
        root = ch.write_batch(os.path.join(cl.root, "fold"), [ch.dp_json("f0", x[0] + 5)])
        op = update(tp, b.stub, root)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, (op, b.text())
        check(b.stub, 60)
        print("stream failover: the follower reads 30 streamed ids + a remove after %.2f s; "
              "they survive kill -9 of the leader; 30 more on the new leader, fresh labels; "
              "folded into v2" % follower_lag)
    finally:
        if b:
            stop(b)
        cl.stop()


def test_etcd_loss(x, b0, b1):
    """etcd gone: queries go on on both coordinators; UpdateIndex fails fast with UNAVAILABLE
    naming etcd; the leader steps down by its own clock before its lease could expire;
    nothing changed on the shards; etcd back -> a leader again and updates work."""
    tp = ch.stubs()[0]
    etcd = Etcd()
    prefix = "/tessera/t-loss"
    cl = ch.Cluster(nshards=2, dims=D, config={"nlist": 16, "pq_m": 4},
                    coord_extra=["--etcd", etcd.endpoints, "--etcd-prefix", prefix,
                                 "--etcd-ttl", str(TTL)])
    b = None
    try:
        wait_leader(tp, cl.stub, cl.target, 10)
        assert update(tp, cl.stub, b0).state == tp.Operation.SUCCEEDED
        b = coord(cl, os.path.join(cl.root, "coord-b"), etcd, prefix)
        wait_leader(tp, b.stub, cl.target, 10)
        ids = ["x%05d" % i for i in range(0, 2000, 173)]
        before = answers(tp, cl.stub, x, ids)
        etcd.stop()
        t_cut = time.time()
        t0 = time.time()
        try:
            cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b1), timeout=30)
            raise AssertionError("UpdateIndex accepted without etcd")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "etcd" in e.details(), e
        fail_fast = time.time() - t0
        for stub in (cl.stub, b.stub):
            assert answers(tp, stub, x, ids) == before
        while "stepping down (etcd did not renew the lease in time)" not in cl.coord.text():
            assert time.time() - t_cut < TTL + 3, cl.coord.text()
            time.sleep(0.05)
        stepped = time.time() - t_cut
        assert stepped < TTL, "the leader stepped down %.2f s after the cut (TTL %d)" % (
            stepped, TTL)
        assert shard_versions(cl) == [1, 1]
        etcd.start()
        t0 = time.time()
        lead = None
        while lead is None:  # one of them names itself the leader
            for target, stub in ((cl.target, cl.stub), (b.target, b.stub)):
                if stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10).leader == target:
                    lead = stub
            assert time.time() - t0 < TTL + 10, (cl.coord.text(), b.text())
            time.sleep(0.1)
        op = update(tp, lead, b1)
        assert op.state == tp.Operation.SUCCEEDED and op.version == 2, op
        print("etcd lost: queries go on, UpdateIndex refused in %.2f s naming etcd, the leader "
              "stepped down %.2f s after the cut (TTL %d s); etcd back: update -> v2" %
              (fail_fast, stepped, TTL))
    finally:
        if b:
            stop(b)
        cl.stop()
        etcd.stop()


def main():
    rng = np.random.default_rng(16)
    x = rng.normal(size=(2000, D)).astype("float32")
    root = sh.tmpdir("tsr-ha-core-")
    b0 = ch.write_batch(os.path.join(root, "b0"), [ch.dp_json("x%05d" % i, x[i])
                                                   for i in range(2000)])
    b1 = ch.write_batch(os.path.join(root, "b1"), [ch.dp_json("y%05d" % i, x[i] + 1)
                                                   for i in range(300)],
                        deletes=["x%05d" % i for i in range(0, 2000, 7)])
    b2 = ch.write_batch(os.path.join(root, "b2"), [ch.dp_json("z%05d" % i, x[i] - 1)
                                                   for i in range(100)])
    etcd = Etcd()
    try:
        test_empty_data(etcd, x, b0, b1)
        test_two_coordinators(etcd, x, b0, b1, b2)
        more = [ch.write_batch(os.path.join(root, "c%d" % i),
                               [ch.dp_json("c%d-%05d" % (i, j), x[j] * (i + 2))
                                for j in range(200)]) for i in range(4)]
        test_crash_steps(etcd, x, [b0] + more)
        test_stream_failover(etcd, x, b0)
        test_etcd_loss(x, b0, b1)
    finally:
        etcd.stop()
    print("test_ha_core: OK")


if __name__ == "__main__":
    main()
