"""Helpers for the tessera-shard integration tests (not a test itself).

- stubs(): python grpcio stubs generated at test time from the project's protos into a
  temp dir (grpc_tools.protoc), so nothing is written into the source tree;
- Shard: starts bin/tessera-shard (TSR_BIN, default ./bin) on an ephemeral loopback port,
  reads the port from its log, and stops it (SIGTERM, or SIGKILL for crash tests);
- template_bytes(): a faiss-trained IndexIVFPQ (no vectors) serialized, shipped in
  StageRequest.template_faiss of chunk 0;
- load(): drives Stage (chunks) / Prepare / Commit from a python client.
"""
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from ports import free_port, free_range  # noqa: E402,F401  (the harness's users call sh.free_*)
import knobs  # noqa: E402
BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
# The test build (`make TESTING=1`; a sanitizer build is one too): the only binaries that
# read test hooks and A/B knobs (common/core/testing.h). A release binary ignores them.
TEST_BIN = os.environ.get("TSR_TEST_BIN", os.path.join(ROOT, "build", "testing", "bin"))


def test_knobs():
    """The environment variables of the table in common/core/testing.h (hooks and A/B
    knobs; tests/knobs.py reads it)."""
    return knobs.variables()


def test_argv(argv, env=None):
    """argv with its binary taken from TEST_BIN when the process's environment (os.environ
    plus env) sets a test knob and the binary is a release one (TSR_BIN): one rule for every
    harness, so that a test that sets a hook runs the build that has it. A binary from any
    other folder (a test build already, or one a test names on purpose) is kept."""
    e = dict(os.environ, **(env or {}))
    knobs = [k for k in test_knobs() if e.get(k)]
    exe = argv[0]
    if not knobs or os.path.abspath(os.path.dirname(exe)) != os.path.abspath(BIN) or \
            os.path.abspath(TEST_BIN) == os.path.abspath(BIN):
        return list(argv)
    test_exe = os.path.join(TEST_BIN, os.path.basename(exe))
    if not os.path.exists(test_exe):
        raise RuntimeError("%s is set: it needs the test build (make TESTING=1), and %s is "
                           "missing" % (", ".join(knobs), test_exe))
    return [test_exe] + list(argv[1:])

_stub_dir = None


def tmpdir(prefix="tsr-shard-"):
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d


def stubs():
    """Returns (shard_pb2, shard_pb2_grpc, tessera_pb2, health_pb2, health_pb2_grpc)."""
    global _stub_dir
    if _stub_dir is None:
        _stub_dir = tmpdir("tsr-stubs-")
        protos = ["tessera/v1/shard.proto", "tessera/v1/tessera.proto"]
        subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc",
                               "-I", os.path.join(ROOT, "proto"),
                               "--python_out=" + _stub_dir, "--grpc_python_out=" + _stub_dir]
                              + protos, cwd=ROOT)
        # The health proto's python package would be "grpc.health.v1", which the grpc
        # package itself shadows: generate it under another file path (same proto package,
        # so the method is still /grpc.health.v1.Health/Check).
        hd = os.path.join(_stub_dir, "hsrc", "tsr_health")
        os.makedirs(hd)
        shutil.copy(os.path.join(ROOT, "proto", "grpc", "health", "v1", "health.proto"), hd)
        subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc",
                               "-I", os.path.join(_stub_dir, "hsrc"),
                               "--python_out=" + _stub_dir, "--grpc_python_out=" + _stub_dir,
                               "tsr_health/health.proto"])
        sys.path.insert(0, _stub_dir)
    from tessera.v1 import shard_pb2, shard_pb2_grpc, tessera_pb2
    from tsr_health import health_pb2, health_pb2_grpc
    return shard_pb2, shard_pb2_grpc, tessera_pb2, health_pb2, health_pb2_grpc


def start_listening(start, port=0, what="process"):
    """start(p) starts a process listening on 127.0.0.1:p and returns its LoggedProc. port 0:
    on a free_port(), and on another (up to 5 tries) when the start finds that one taken
    meanwhile; a given port is tried once. Raises RuntimeError with the log when it did not
    start."""
    for attempt in range(1 if port else 5):
        p = port or free_port()
        lp = start(p)
        if lp.port is not None:
            return lp
        lp.proc.kill()
        if port or "cannot listen on 127.0.0.1:%d" % p not in lp.text():
            break
    raise RuntimeError("%s did not start:\n%s" % (what, lp.text()))


def bins():
    """The bin dirs to test: TSR_BIN, plus the ASan+UBSan build when `make test` exports
    TSR_SAN_BIN and it holds a tessera-shard."""
    out = [BIN]
    san = os.environ.get("TSR_SAN_BIN")
    if san and os.path.exists(os.path.join(san, "tessera-shard")) and \
            os.path.abspath(san) != os.path.abspath(BIN):
        out.append(san)
    return out


class LoggedProc:
    """A process whose stderr is collected line by line into self.log; self.port is the N of
    its first "(port N)" line (the listen line of both binaries), None if none came in 30 s."""

    def __init__(self, argv, env=None, as_built=False):
        """as_built: run argv[0] itself even when env sets a test knob (test_argv)."""
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        if env:
            e.update(env)
        if not as_built:
            argv = test_argv(argv, env)
        self.argv = argv
        self.log = []
        self.port = None
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     env=e, text=True)
        got = threading.Event()

        def reader():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"\(port (\d+)\)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()
        got.wait(30)

    def text(self):
        return "\n".join(self.log)


class Shard(LoggedProc):
    def __init__(self, data, extra=(), env=None, bin_dir=None, as_built=False):
        """Listens on a free_port() (start_listening: so that a restart on the same address
        finds it free) unless extra has its own --listen. as_built: see LoggedProc."""
        self.data = data
        argv = [os.path.join(bin_dir or BIN, "tessera-shard"), "--data", data] + list(extra)
        if "--listen" in extra:
            LoggedProc.__init__(self, argv, env, as_built)
            if self.port is None:
                self.proc.kill()
                raise RuntimeError("shard did not start:\n" + self.text())
        else:
            start_listening(lambda p: LoggedProc.__init__(
                self, argv + ["--listen", "127.0.0.1:%d" % p], env, as_built) or self,
                what="shard")
        self.target = "127.0.0.1:%d" % self.port
        import grpc
        self.channel = grpc.insecure_channel(self.target)
        sp, spg, _, _, _ = stubs()
        self.stub = spg.ShardStub(self.channel)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Stops the process; returns its exit code. Fails on a sanitizer report. A second
        stop (e.g. a cluster's teardown after a test killed this shard) returns the code."""
        if getattr(self, "stopped_rc", None) is not None:
            return self.stopped_rc
        try:
            self.channel.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("shard did not stop within %ds" % timeout)
        self.thread.join(5)
        text = "\n".join(self.log)
        if sig != signal.SIGKILL:
            assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text \
                and "LeakSanitizer" not in text and "ThreadSanitizer" not in text, \
                "sanitizer report:\n" + text
            assert rc == 0, "shard exit code %s:\n%s" % (rc, text)
        self.stopped_rc = rc
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)


def restart(old, timeout=15):
    """A new tessera-shard on the same data dir and address as `old` (which is dead)."""
    t0 = time.time()
    while True:
        try:
            return Shard(old.data, extra=["--listen", old.target])
        except RuntimeError:
            if time.time() - t0 > timeout:
                raise
            time.sleep(0.2)  # the port may take a moment to be free again


def template_bytes(xt, nlist, m, nbits=8, metric="L2", seed=123):
    """Trains a faiss IndexIVFPQ on xt; returns (index without vectors, serialized bytes)."""
    import faiss
    import numpy as np
    # One OpenMP thread: on a busy 2-core machine faiss's spinning threads make training
    # 100x slower.
    faiss.omp_set_num_threads(1)
    d = xt.shape[1]
    if metric == "L2":
        q = faiss.IndexFlatL2(d)
        ix = faiss.IndexIVFPQ(q, d, nlist, m, nbits)
    else:
        q = faiss.IndexFlatIP(d)
        ix = faiss.IndexIVFPQ(q, d, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    ix.cp.seed = seed
    ix.pq.cp.seed = seed
    ix.train(np.ascontiguousarray(xt, dtype="float32"))  # noqa
    ix._q = q  # keep the quantizer alive
    return ix, faiss.serialize_index(ix).tobytes()


def datapoint(tessera_pb2, did, vec=None, restricts=None, numeric=None, tag=None, sparse=None):
    dp = tessera_pb2.IndexDatapoint(datapoint_id=did)
    if vec is not None:
        dp.feature_vector.extend([float(v) for v in vec])
    for ns, allow, deny in restricts or []:
        dp.restricts.add(namespace=ns, allow_list=allow, deny_list=deny)
    for ns, kind, val in numeric or []:
        n = dp.numeric_restricts.add(namespace=ns)
        setattr(n, "value_" + kind, val)
    if tag is not None:
        dp.crowding_tag.crowding_attribute = tag
    if sparse is not None:
        dims, vals = sparse
        dp.sparse_embedding.dimensions.extend(dims)
        dp.sparse_embedding.values.extend(vals)
    return dp


def stage_all(shard, version, base, upserts, template=b"", deletes=(), chunk=2000,
              own=None, timeout=60):
    """upserts: list of StagedUpsert. Stages in chunks; returns the last StageResponse."""
    sp = stubs()[0]
    resp = None
    i = 0
    c = 0
    while True:
        part = upserts[i:i + chunk]
        rq = sp.StageRequest(version=version, base_version=base, chunk=c, upserts=part)
        if c == 0:
            rq.template_faiss = template
            for lab, lst in deletes:
                rq.deletes.add(label=lab, list=lst)
            if own is not None:
                rq.own_lists.extend(own)
        resp = shard.stub.Stage(rq, timeout=timeout)
        i += chunk
        c += 1
        if i >= len(upserts):
            return resp


def load(shard, version, base, upserts, template=b"", deletes=(), chunk=2000, own=None):
    sp = stubs()[0]
    stage_all(shard, version, base, upserts, template, deletes, chunk, own)
    pr = shard.stub.Prepare(sp.PrepareRequest(version=version), timeout=120)
    assert pr.ready, pr.reason
    shard.stub.Commit(sp.CommitRequest(version=version), timeout=30)
    return pr


def wait_port_closed(proc, timeout=10):
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < timeout:
        time.sleep(0.05)
