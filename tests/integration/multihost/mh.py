"""mh — a Tessera cluster across simulated hosts, for the fault tests (not a test itself).

    import mh
    with mh.Cluster(nshards=3) as cl:       # hosts: 0 coordinator, 1..S shards, S+1 client
        cl.start_shards(); cl.start_coord()  # each process in its own network namespace
        cl.update(batch_root)               # UpdateIndex + GetOperation polling
        load = mh.Load(cl, pool, deadline_s=2.0); load.start(); ...; load.stop()
        load.report("case 1")                # answered / failed by code / hung
    # leaving the block kills every process, unmounts what it mounted and removes every
    # namespace, veth and temp dir this run created (also on an exception); a later run
    # removes what a killed run left (namespaces: netns.py; tmpfs mounts: here)

The test process itself moves into the client host's network namespace (setns on the
main thread before any gRPC thread exists; threads inherit it), so its python grpcio
client reaches the coordinator only across the bridge, like a client on another machine.
`ip` keeps working from there (it names namespaces by file). Data dirs live in a mktemp
dir of the (shared) mount namespace; a tmpfs mounted on one (disk-full case) is mounted
before the shard starts, so the shard's `ip netns exec` mount namespace sees it.
"""
import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import coord_harness as ch  # noqa: E402
import netns  # noqa: E402
import shard_harness as sh  # noqa: E402

BIN = sh.BIN
SHARD_PORT = 7101
COORD_PORT = 7000
CLONE_NEWNET = 0x40000000

# Keepalive of the coordinator's shard channels (common/net/rpc_client.c defaults): a peer
# that stops answering pings is declared dead after at most KA_TIME + KA_TIMEOUT.
KA_TIME_S = 5.0
KA_TIMEOUT_S = 3.0


stubs = ch.stubs  # (tessera_pb2, tessera_pb2_grpc, shard_pb2, shard_pb2_grpc)


def enter_netns(name):
    """Moves the calling thread (and every thread it starts later) into namespace name."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open("/run/netns/" + name, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns %s: %s" % (name, os.strerror(e)))
    finally:
        os.close(fd)


def grpc_channel(target):
    import grpc
    # short reconnect backoff: the coordinator is killed and restarted in some cases.
    # min_reconnect_backoff is also the connect timeout (GRPC_C_CORE.md): keep it long
    # enough for a busy sanitizer build to send its SETTINGS frame.
    return grpc.insecure_channel(target, options=[
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 3000),
        ("grpc.max_reconnect_backoff_ms", 300)])


class Proc:
    """A tessera process in one host's namespace; stderr collected; port read from it."""

    def __init__(self, net, host, argv, env=None, name="proc"):
        self.name = name
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        if env:
            e.update(env)
        self.log = []
        self.port = None
        self.started_at = None
        argv = sh.test_argv(argv, env)
        self.proc = net.popen(host, argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              env=e, text=True)
        self.pid = self.proc.pid  # ip netns exec execs the binary: same pid
        got = threading.Event()

        def reader():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"\(port (\d+)\)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    self.started_at = time.monotonic()
                    got.set()
            got.set()

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()
        got.wait(60)
        if self.port is None:
            self.proc.kill()
            self.thread.join(5)
            raise RuntimeError("%s did not start:\n%s" % (name, self.text()))

    def text(self):
        return "\n".join(self.log)

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        os.kill(self.pid, sig)

    def kill9(self):
        if self.alive():
            self.signal(signal.SIGKILL)
        rc = self.proc.wait(20)
        self.thread.join(5)
        return rc

    def stop(self, timeout=30):
        """SIGTERM; asserts exit 0 and no sanitizer report."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("%s did not stop within %ds:\n%s" % (self.name, timeout,
                                                                    self.text()))
        self.thread.join(5)
        check_clean(self.name, self.text())
        assert rc == 0, "%s exit code %s:\n%s" % (self.name, rc, self.text())
        return rc

    def wait_exit(self, timeout=60):
        rc = self.proc.wait(timeout)
        self.thread.join(5)
        return rc


def reap_stale_mounts():
    """Unmounts the tmpfs of earlier runs that were killed before their teardown (the
    data dir names the pid: tsr-mh-<pid>-...)."""
    try:
        with open("/proc/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for ln in lines:
        f = ln.split()
        if len(f) < 3 or f[0] != "tsr-mh" or f[2] != "tmpfs":
            continue
        m = re.search(r"/tsr-mh-(\d+)-[^/]*/", f[1])
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        subprocess.run(["umount", "-l", f[1]], capture_output=True)
        shutil.rmtree(os.path.dirname(f[1]), True)


def check_clean(name, text):
    for bad in ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer",
                "ThreadSanitizer"):
        assert bad not in text, "%s: sanitizer report:\n%s" % (name, text)


class Cluster(ch.Api):
    """Coordinator on host 0, shard i on host 1+i, the test process on the last host."""

    def __init__(self, nshards=3, dims=16, config=None, prefix="tsr-mh-", replicas=1):
        """nshards shard processes; with replicas R, groups of R consecutive ones."""
        self.S = nshards
        self.R = replicas
        self.dims = dims
        self.net = netns.Net(nshards + 2)
        self.client_host = nshards + 1
        self.root = tempfile.mkdtemp(prefix="%s%d-" % (prefix, os.getpid()))
        self.mounts = []
        self.shards = [None] * nshards
        self.coord = None
        self.cfg = {"dimensions": dims, "nlist": 16, "pq_m": 4, "nprobe": 16,
                    "search_deadline_ms": 700, "stage_deadline_ms": 20000,
                    "shards": [self.shard_addr(i) for i in range(nshards)] if replicas == 1
                    else [[self.shard_addr(g * replicas + j) for j in range(replicas)]
                          for g in range(nshards // replicas)]}
        self.cfg.update(config or {})
        self.config = os.path.join(self.root, "coordinator.json")
        with open(self.config, "w") as f:
            json.dump(self.cfg, f)
        # The shards listen on non-loopback addresses: they accept only the coordinator,
        # which proves itself with this peer token (docs/security.md).
        self.peer_token = os.path.join(self.root, "peer.token")
        with open(self.peer_token, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        self._chan = None
        self.stub = None
        self.loads = []

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self):
        netns.skip_unless_available()
        reap_stale_mounts()
        atexit.register(self.teardown)
        self.net.setup()
        stubs()  # generate before leaving the root namespace (protoc is local anyway)
        enter_netns(self.net.ns(self.client_host))
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def teardown(self):
        for ld in self.loads:
            ld.stopping.set()
        if self._chan is not None:
            try:
                self._chan.close()
            except Exception:
                pass
            self._chan = None
        self.net.teardown()  # SIGKILLs every process it started (also stopped ones)
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m], capture_output=True)
        self.mounts = []
        shutil.rmtree(self.root, True)

    # -- addresses ------------------------------------------------------------------------
    def shard_host(self, i):
        return 1 + i

    def shard_addr(self, i):
        return "%s:%d" % (self.net.addr(self.shard_host(i)), SHARD_PORT)

    def coord_addr(self):
        return "%s:%d" % (self.net.addr(0), COORD_PORT)

    def shard_dir(self, i):
        return os.path.join(self.root, "shard-%d" % i)

    def mount_tmpfs(self, path, size):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tsr-mh", path],
                       check=True, capture_output=True)
        self.mounts.append(path)

    # -- processes ------------------------------------------------------------------------
    def start_shard(self, i, env=None):
        argv = [os.path.join(BIN, "tessera-shard"), "--listen", self.shard_addr(i),
                "--data", self.shard_dir(i), "--threads", "1", "--workers", "2",
                "--peer-token-file", self.peer_token]
        self.shards[i] = Proc(self.net, self.shard_host(i), argv, env, name="shard %d" % i)
        return self.shards[i]

    def start_shards(self):
        for i in range(self.S):
            self.start_shard(i)

    def start_coord(self, env=None):
        argv = [os.path.join(BIN, "tessera-coordinator"), "--listen", self.coord_addr(),
                "--data", os.path.join(self.root, "coordinator"), "--config", self.config,
                "--threads", "1", "--workers", "8", "--peer-token-file", self.peer_token,
                # clients here call without tokens (tests/integration/test_auth.py covers
                # them); batches are written under root
                "--insecure-no-auth", "--batch-root-allow", self.root]
        self.coord = Proc(self.net, 0, argv, env, name="coordinator")
        if self._chan is None:
            _, tpg, _, _ = stubs()
            self._chan = grpc_channel(self.coord_addr())
            self.stub = tpg.VectorSearchStub(self._chan)
        return self.coord

    def stop_all(self):
        """Graceful stop of everything still running; asserts clean exits."""
        if self.coord is not None and self.coord.alive():
            self.coord.stop()
        for s in self.shards:
            if s is not None and s.alive():
                s.stop()

    # UpdateIndex / GetOperation / GetIndexStats: coord_harness.Api (self.stub)

    def shard_stats(self, i, timeout=5):
        _, _, sp, spg = stubs()
        chan = grpc_channel(self.shard_addr(i))
        try:
            with open(self.peer_token) as f:
                md = [("authorization", "Bearer " + f.read().strip())]
            return spg.ShardStub(chan).Stats(sp.ShardStatsRequest(), timeout=timeout,
                                             metadata=md)
        finally:
            chan.close()

    def shard_versions(self):
        """[(current_version, [(version, state) not serving])] for every shard."""
        sp = stubs()[2]
        out = []
        for i in range(self.S):
            st = self.shard_stats(i)
            out.append((st.current_version,
                        sorted((v.version, v.state) for v in st.versions
                               if not v.current and v.state != sp.ShardVersion.SERVING)))
        return out

    def converge(self, want, timeout=20):
        """Waits until every shard's CURRENT is want with nothing staged or prepared."""
        t0 = time.time()
        while True:
            try:
                st = self.shard_versions()
            except Exception as e:  # a shard still starting
                st = [("error", str(e))]
            if all(cv == want and not pend for cv, pend in st):
                return time.time() - t0
            if time.time() - t0 > timeout:
                raise AssertionError("shards did not converge on version %d: %s\n%s" %
                                     (want, st, self.coord.text() if self.coord else ""))
            time.sleep(0.1)

    def established(self, host, peer):
        """Local ports of this host's ESTABLISHED TCP connections to peer ("a.b.c.d:p")."""
        r = self.net.run(host, ["ss", "-Htn", "state", "established", "dst", peer], timeout=10)
        out = []
        for ln in r.stdout.splitlines():
            f = ln.split()
            if len(f) >= 4:
                out.append(f[2])  # Recv-Q Send-Q Local Peer (state column omitted)
        return out


# ------------------------------------------------------------------------------- data --
def write_batch(root, records, deletes=()):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "part-00000.json"), "w") as f:
        for did, vec in records:
            f.write(json.dumps({"id": did, "embedding": [float(v) for v in vec]},
                               separators=(",", ":")))
            f.write("\n")
    if deletes:
        os.makedirs(os.path.join(root, "delete"), exist_ok=True)
        with open(os.path.join(root, "delete", "ids.txt"), "w") as f:
            for d in deletes:
                f.write(d + "\n")
    return root


def make_query(tp, vec, k=10, allow_partial=False):
    dp = tp.IndexDatapoint(feature_vector=[float(v) for v in vec])
    return tp.FindNeighborsRequest(queries=[tp.FindNeighborsRequest.Query(
        datapoint=dp, neighbor_count=k, allow_partial=allow_partial)])


def answer_ids(resp):
    return [n.datapoint.datapoint_id for n in resp.nearest_neighbors[0].neighbors]


# ------------------------------------------------------------------------------- load --
class Call:
    __slots__ = ("t0", "t1", "code", "details", "partial", "missing", "version", "ids", "qi")

    @property
    def latency(self):
        return self.t1 - self.t0


class Load:
    """A bounded, self-stopping FindNeighbors load: `threads` threads, each sending one
    query at a time from `pool` (vectors) with a client deadline of deadline_s; every
    other query sets allow_partial when partial=True. Stops at stop() or after max_s.
    A call counts as hung when the client's deadline fired (the server never answered)
    or when it took longer than deadline_s + 1 s."""

    def __init__(self, cl, pool, deadline_s=2.0, threads=4, partial=True, max_s=120.0,
                 pause_s=0.01):
        self.cl = cl
        self.pool = pool
        self.deadline_s = deadline_s
        self.nthreads = threads
        self.partial = partial
        self.max_s = max_s
        self.pause_s = pause_s
        self.calls = []
        self.mu = threading.Lock()
        self.stopping = threading.Event()
        self.threads = []
        cl.loads.append(self)

    def _run(self, tid):
        import grpc
        tp = stubs()[0]
        end = time.monotonic() + self.max_s
        i = tid
        while not self.stopping.is_set() and time.monotonic() < end:
            qi = i % len(self.pool)
            partial = self.partial and (i % 2 == 1)
            rq = make_query(tp, self.pool[qi], allow_partial=partial)
            c = Call()
            c.qi, c.partial, c.missing, c.version, c.ids, c.details = qi, partial, [], 0, [], ""
            c.t0 = time.monotonic()
            try:
                stub = self.cl.stub
                r = stub.FindNeighbors(rq, timeout=self.deadline_s)
                c.code = grpc.StatusCode.OK
                c.missing = list(r.missing_shards)
                c.version = r.version
                c.ids = answer_ids(r)
            except grpc.RpcError as e:
                c.code = e.code()
                c.details = e.details() or ""
            except ValueError:  # the channel was closed (teardown after a failure)
                return
            c.t1 = time.monotonic()
            with self.mu:
                self.calls.append(c)
            i += self.nthreads
            if self.pause_s:
                time.sleep(self.pause_s)

    def start(self):
        for t in range(self.nthreads):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def stop(self):
        self.stopping.set()
        for th in self.threads:
            th.join(self.deadline_s + 10)
            assert not th.is_alive(), "a load thread did not stop (client hang)"

    def snapshot(self):
        with self.mu:
            return list(self.calls)

    def hung(self, calls=None):
        import grpc
        calls = self.snapshot() if calls is None else calls
        return [c for c in calls if c.code == grpc.StatusCode.DEADLINE_EXCEEDED or
                c.latency > self.deadline_s + 1.0]

    def report(self, name, calls=None):
        """Prints and returns (answered, {code: n}, hung)."""
        import grpc
        calls = self.snapshot() if calls is None else calls
        answered = sum(1 for c in calls if c.code == grpc.StatusCode.OK)
        partial = sum(1 for c in calls if c.code == grpc.StatusCode.OK and c.missing)
        failed = {}
        for c in calls:
            if c.code != grpc.StatusCode.OK:
                failed[c.code.name] = failed.get(c.code.name, 0) + 1
        hung = len(self.hung(calls))
        lat = sorted(c.latency for c in calls)
        mx = lat[-1] if lat else 0.0
        fl = sorted(c.latency for c in calls if c.code != grpc.StatusCode.OK)
        print("%s: %d queries: answered %d (%d partial), failed %s, hung %d; "
              "max latency %.3fs, max failure latency %.3fs" %
              (name, len(calls), answered, partial,
               ", ".join("%s %d" % kv for kv in sorted(failed.items())) or "0", hung, mx,
               fl[-1] if fl else 0.0))
        sys.stdout.flush()
        return answered, failed, hung


def wait_until(pred, timeout, step=0.02):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def bootstrap(cl, n=3000, npool=48, seed=7):
    """Starts the shards and the coordinator, creates version 1 from n random vectors and
    records the full answer of each pool query. Returns (x, pool, baseline ids)."""
    import numpy as np
    tp = stubs()[0]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, cl.dims)).astype("float32")
    b = write_batch(os.path.join(cl.root, "b1"), [("x%05d" % i, x[i]) for i in range(n)])
    cl.start_shards()
    cl.start_coord()
    op = cl.update(b)
    assert op.state == tp.Operation.SUCCEEDED, op
    cl.converge(1)
    pool = [x[i] + 0.01 * rng.normal(size=cl.dims).astype("float32")
            for i in rng.choice(n, npool, replace=False)]
    base = []
    for v in pool:
        r = cl.stub.FindNeighbors(make_query(tp, v), timeout=10)
        assert not r.missing_shards and r.version == 1, r
        base.append(answer_ids(r))
        assert len(base[-1]) == 10, r
    return x, pool, base


def full_answer(cl, vec, want):
    """True when one query for vec answers without a missing shard and with ids want."""
    import grpc
    try:
        r = cl.stub.FindNeighbors(make_query(stubs()[0], vec), timeout=2)
    except grpc.RpcError:
        return False
    return not r.missing_shards and answer_ids(r) == want


def is_full(c, base):
    import grpc
    return c.code == grpc.StatusCode.OK and not c.missing and c.ids == base[c.qi]


def check_fault_calls(cl, load, base, victim, down_from, down_to, up_at, name, max_fail_s=None):
    """The assertions of fault cases 1-3 (see test_shard_kill.py); returns the time from
    up_at to the first full answer."""
    import grpc
    calls = load.snapshot()
    load.report(name, calls)
    vaddr = cl.shard_addr(victim)
    hung = load.hung(calls)
    assert not hung, "%d hung calls, e.g. %.3fs %s" % (len(hung), hung[0].latency, hung[0].code)
    for c in calls:
        assert c.code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), (c.code, c.details)
        if c.code == grpc.StatusCode.UNAVAILABLE:
            assert not c.partial, "an allow_partial call failed: %s" % c.details
            assert ("shard %d (%s)" % (victim, vaddr)) in c.details, c.details
        elif c.missing:
            assert c.missing == [vaddr], c.missing
        else:
            assert c.ids == base[c.qi], "answer differs from the full one"
    if max_fail_s is not None:
        slow = [c for c in calls if c.code != grpc.StatusCode.OK and c.latency > max_fail_s]
        assert not slow, "%d failures later than %.2fs, e.g. %.3fs" % (len(slow), max_fail_s,
                                                                      slow[0].latency)
        slow = [c for c in calls if c.latency > max_fail_s]
        assert not slow, "%d answers later than %.2fs, e.g. %.3fs" % (len(slow), max_fail_s,
                                                                     slow[0].latency)
    down = [c for c in calls if c.t0 >= down_from and c.t1 <= down_to]
    assert len(down) >= 4, "too few calls while the shard was down: %d" % len(down)
    for c in down:
        if c.partial:
            assert c.code == grpc.StatusCode.OK and c.missing == [vaddr], \
                (c.code, c.missing, "started %.3fs into the fault" % (c.t0 - down_from))
        else:
            assert c.code == grpc.StatusCode.UNAVAILABLE, \
                (c.code, "started %.3fs into the fault" % (c.t0 - down_from))
    after = [c for c in calls if c.t0 >= up_at + 2.0]
    assert len(after) >= 4, "too few calls after the restart: %d" % len(after)
    bad = [c for c in after if not is_full(c, base)]
    assert not bad, "%d calls 2 s after the restart were not full answers: %s %s" % (
        len(bad), bad[0].code, bad[0].details or bad[0].missing)
    full = [c.t1 for c in calls if c.t0 >= up_at and is_full(c, base)]
    first = min(full) - up_at if full else None
    print("%s: down %d calls; first full answer %.3fs after recovery began" %
          (name, len(down), first if first is not None else -1))
    return first


def probe_down(cl, victim, limit_s):
    """While shard victim is unreachable: GetIndexStats answers within limit_s with the
    shard not available, ReadIndexDatapoints of every id fails UNAVAILABLE naming it (or
    answers, when the shard holds none of them) within limit_s. Returns the two latencies."""
    import grpc
    tp = stubs()[0]
    t0 = time.monotonic()
    st = cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=limit_s + 2)
    t_stats = time.monotonic() - t0
    assert t_stats <= limit_s, "GetIndexStats took %.3fs" % t_stats
    assert not st.shards[victim].available, st.shards[victim]
    assert all(s.available for k, s in enumerate(st.shards) if k != victim), st
    t0 = time.monotonic()
    try:
        cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(
            ids=["x%05d" % i for i in range(200)]), timeout=limit_s + 2)
        raise AssertionError("ReadIndexDatapoints answered without shard %d" % victim)
    except grpc.RpcError as e:
        t_read = time.monotonic() - t0
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert ("shard %d (%s)" % (victim, cl.shard_addr(victim))) in e.details(), e.details()
    assert t_read <= limit_s, "ReadIndexDatapoints took %.3fs" % t_read
    print("while down: GetIndexStats %.3fs (shard %d unavailable), ReadIndexDatapoints "
          "UNAVAILABLE %.3fs" % (t_stats, victim, t_read))
    return t_stats, t_read
