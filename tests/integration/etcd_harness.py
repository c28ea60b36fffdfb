"""Helpers for the high-availability tests (docs/ha.md; not a test itself).

- Etcd: an M-member etcd cluster from Debian's /usr/bin/etcd on free loopback ports, data
  under a mktemp dir; kill / stop / restart of one member; `get` of a key (etcdctl).
- HACluster: that etcd, G shard groups x R replicas (tessera-shard) and N coordinators
  started with --etcd on fixed ports (so that a restart keeps its address), with kill -9
  of one coordinator, the leader as the coordinators report it (GetIndexStats field 14,
  read from the raw reply so that this works with the protos of before and after it was
  added), and the Api helpers of coord_harness (update, wait_op, stats) on any of them.
- skip_without_etcd(): exit 77 (SKIP) when etcd is not installed: the only reason an HA
  test may skip. A coordinator without --etcd support is a failure, not a skip.
Everything lives under one mktemp dir removed at exit; every process is stopped by stop().
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import coord_harness as ch
import shard_harness as sh

ETCD_CANDIDATES = ("/usr/bin/etcd", "/usr/local/bin/etcd")


def etcd_bin():
    for c in ETCD_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("etcd")


def skip_without_etcd():
    if etcd_bin() is None:
        print("SKIP: etcd is not installed (apt-get install etcd-server)")
        sys.exit(77)


class Etcd:
    def __init__(self, n=3, root=None):
        self.root = root or sh.tmpdir("tsr-etcd-")
        os.makedirs(self.root, exist_ok=True)
        self.n = n
        self.procs = [None] * n
        self.logs = [os.path.join(self.root, "etcd-%d.log" % i) for i in range(n)]
        # free_port() closes the port before etcd binds it, so another process may take it
        # in between (the machine runs other tests and chaos runs): a member that exits
        # with "address already in use" gets the whole cluster restarted on new ports.
        for attempt in range(3):
            self.client = [sh.free_port() for _ in range(n)]
            self.peer = [sh.free_port() for _ in range(n)]
            self.cluster = ",".join("m%d=http://127.0.0.1:%d" % (i, self.peer[i])
                                    for i in range(n))
            for i in range(n):
                self.start(i)
            try:
                self.wait_healthy(starting=True)
                return
            except RuntimeError:
                if attempt == 2 or not self._bind_failed():
                    raise
            for i in range(n):
                if self.procs[i].poll() is None:
                    self.procs[i].kill()
                self.procs[i].wait()
                shutil.rmtree(os.path.join(self.root, "m%d" % i), ignore_errors=True)

    def _bind_failed(self):
        """True when a member exited because its port was taken."""
        for i, p in enumerate(self.procs):
            if p is not None and p.poll() is not None:
                try:
                    with open(self.logs[i]) as f:
                        if "address already in use" in f.read():
                            return True
                except OSError:
                    pass
        return False

    @property
    def endpoints(self):
        return ",".join("127.0.0.1:%d" % p for p in self.client)

    def start(self, i):
        curl = "http://127.0.0.1:%d" % self.client[i]
        purl = "http://127.0.0.1:%d" % self.peer[i]
        argv = [etcd_bin(), "--name", "m%d" % i, "--data-dir",
                os.path.join(self.root, "m%d" % i), "--listen-client-urls", curl,
                "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                "--initial-advertise-peer-urls", purl, "--initial-cluster", self.cluster,
                "--initial-cluster-state", "new", "--heartbeat-interval", "50",
                "--election-timeout", "500"]
        log = open(self.logs[i], "a")
        self.procs[i] = subprocess.Popen(argv, stdout=log, stderr=log)
        log.close()

    def healthy(self, i, timeout=1.0):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.client[i],
                                        timeout=timeout) as r:
                return json.loads(r.read().decode()).get("health") == "true"
        except Exception:
            return False

    def wait_healthy(self, timeout=30, members=None, starting=False):
        t_end = time.time() + timeout
        members = range(self.n) if members is None else members
        while time.time() < t_end:
            if all(self.healthy(i) for i in members):
                return
            if starting and self._bind_failed():
                break
            time.sleep(0.1)
        raise RuntimeError("etcd not healthy after %ds:\n%s" % (timeout, self.log_tail()))

    def log_tail(self, lines=10):
        out = []
        for p in self.logs:
            try:
                with open(p) as f:
                    out += f.read().splitlines()[-lines:]
            except OSError:
                pass
        return "\n".join(out)

    def kill(self, i, sig=signal.SIGKILL):
        p = self.procs[i]
        if p and p.poll() is None:
            p.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                p.wait(20)

    def etcdctl(self, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        r = subprocess.run(["etcdctl", "--endpoints", self.endpoints, "--dial-timeout", "2s",
                            "--command-timeout", "5s"] + list(args), capture_output=True,
                           text=True, timeout=30, env=env)
        return r.returncode, r.stdout, r.stderr

    def keys(self, prefix):
        rc, out, err = self.etcdctl("get", "--prefix", "--keys-only", prefix)
        assert rc == 0, err
        return [k for k in out.splitlines() if k]

    def committed_version(self, prefix):
        """The version PREFIX/version names ("tessera-version 1\nversion N\n..."; ha-core's
        coordinator/meta.h), 0 when the key is absent; None when etcd does not answer."""
        rc, out, err = self.etcdctl("get", "--print-value-only", prefix + "/version")
        if rc != 0:
            return None
        for line in out.splitlines():
            if line.startswith("version "):
                return int(line.split()[1])
        return 0

    def stop(self):
        for i, p in enumerate(self.procs):
            if p and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


def _varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def ha_fields(raw):
    """(coordinators, leader) from the bytes of a GetIndexStatsResponse: fields 13
    (repeated string) and 14 (string), whatever the generated stubs know."""
    coords, leader, i = [], "", 0
    while i < len(raw):
        key, i = _varint(raw, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            _, i = _varint(raw, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            n, i = _varint(raw, i)
            if field == 13:
                coords.append(raw[i:i + n].decode())
            elif field == 14:
                leader = raw[i:i + n].decode()
            i += n
        else:
            raise ValueError("wire type %d in GetIndexStatsResponse" % wt)
    return coords, leader


class Coord(ch.Api):
    """One coordinator of an HACluster (a LoggedProc with its channel and stub)."""

    def __init__(self, cl, i):
        self.cl, self.i = cl, i
        self.port = sh.free_port()
        self.target = "127.0.0.1:%d" % self.port
        self.data = os.path.join(cl.root, "coordinator-%d" % i)
        self.proc = None

    def start(self, extra=(), env=None):
        import grpc
        argv = [os.path.join(self.cl.bin, "tessera-coordinator"), "--listen", self.target,
                "--data", self.data, "--config", self.cl.config,
                "--etcd", self.cl.etcd.endpoints, "--etcd-prefix", self.cl.prefix,
                "--etcd-ttl", str(self.cl.ttl), "--advertise", self.target]
        argv += ch.batch_allow_args(self.cl.root) + list(self.cl.coord_extra) + list(extra)
        self.proc = sh.LoggedProc(argv, env)
        if self.proc.port is None:
            self.proc.proc.kill()
            raise AssertionError("coordinator-%d did not start with --etcd:\n%s"
                                 % (self.i, self.proc.text()))
        self.channel = grpc.insecure_channel(self.target)
        self.stub = ch.stubs()[1].VectorSearchStub(self.channel)
        self.raw_stats = self.channel.unary_unary(
            "/tessera.v1.VectorSearch/GetIndexStats",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b)
        return self

    def alive(self):
        return self.proc is not None and self.proc.proc.poll() is None

    def ha(self, timeout=5):
        """(coordinators, leader) as this coordinator reports them."""
        raw = self.raw_stats(ch.stubs()[0].GetIndexStatsRequest(), timeout=timeout)
        return ha_fields(raw)

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.proc.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.proc.wait(20)
        try:
            self.channel.close()
        except Exception:
            pass

    def stop(self):
        """SIGTERM (after a SIGCONT); a coordinator this stop ends must exit 0 within 30 s
        with no sanitizer report (one that died before, e.g. a crash hook, is not judged)."""
        if self.proc is None:
            return
        p = self.proc.proc
        rc = None
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
                self.kill()
                raise AssertionError("coordinator-%d did not stop within 30 s of SIGTERM:\n%s"
                                     % (self.i, self.proc.text()[-4000:]))
        self.kill()
        if rc is not None:
            self.proc.thread.join(5)
            text = self.proc.text()
            for bad in ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer",
                        "WARNING: ThreadSanitizer"):
                assert bad not in text, "coordinator-%d: sanitizer report:\n%s" % (self.i, text)
            assert rc == 0, "coordinator-%d exit code %s:\n%s" % (self.i, rc, text[-4000:])


class HACluster:
    def __init__(self, groups=2, replicas=2, coords=2, etcd_members=3, dims=16, config=None,
                 ttl=2, coord_extra=(), shard_extra=()):
        import uuid
        self.root = sh.tmpdir("tsr-ha-")
        self.bin = ch.BIN
        self.ttl = ttl
        self.prefix = "/tessera/test-" + uuid.uuid4().hex[:8]
        self.coord_extra = coord_extra
        self.etcd = Etcd(etcd_members, os.path.join(self.root, "etcd"))
        self.shards, self.coords = [], []
        try:
            self.groups = []
            for g in range(groups):
                grp = []
                for r in range(replicas):
                    s = sh.Shard(os.path.join(self.root, "shard-%d-%d" % (g, r)),
                                 extra=shard_extra, bin_dir=self.bin)
                    self.shards.append(s)
                    grp.append(s)
                self.groups.append(grp)
            cfg = {"dimensions": dims,
                   "shards": [[s.target for s in grp] for grp in self.groups]}
            cfg.update(config or {})
            self.config = os.path.join(self.root, "coordinator.json")
            with open(self.config, "w") as f:
                json.dump(cfg, f)
            for i in range(coords):
                self.coords.append(Coord(self, i).start())
        except BaseException:
            self.stop()
            raise

    @property
    def targets(self):
        return ",".join(c.target for c in self.coords)

    def leader(self, timeout=10, exclude=()):
        """The coordinator every live one names as the leader (waits up to timeout for
        them to agree on a live one). Raises AssertionError naming what they said."""
        t_end = time.time() + timeout
        said = {}
        while time.time() < t_end:
            said = {}
            for c in self.coords:
                if c.alive():
                    try:
                        said[c.target] = c.ha(2)[1]
                    except Exception as e:  # grpc errors while it starts or dies
                        said[c.target] = "error: %s" % str(e).splitlines()[0][:80]
            names = set(said.values())
            if len(names) == 1:
                name = names.pop()
                for c in self.coords:
                    if c.target == name and c.alive() and c not in exclude:
                        return c
            time.sleep(0.05)
        raise AssertionError("no agreed live leader after %.1fs: %s" % (timeout, said))

    def wait_version(self, v, timeout=10):
        """Waits until every live coordinator serves version v (a follower moves to a
        committed version within its polling period, not at once). Returns the seconds."""
        t0 = time.time()
        while True:
            got = {}
            for c in self.coords:
                if c.alive():
                    try:
                        got[c.target] = c.stats().version
                    except Exception as e:
                        got[c.target] = str(e).splitlines()[0][:60]
            if set(got.values()) == {v}:
                return time.time() - t0
            if time.time() - t0 > timeout:
                raise AssertionError("coordinators not on version %d after %ds: %s"
                                     % (v, timeout, got))
            time.sleep(0.05)

    def follower(self, leader):
        return next(c for c in self.coords if c is not leader and c.alive())

    def shard_versions(self):
        tp = ch.stubs()[2]
        out = {}
        for s in self.shards:
            if s.proc.poll() is None:
                out[s.target] = s.stub.Stats(tp.ShardStatsRequest(), timeout=10).current_version
        return out

    def logs(self):
        return "\n".join("--- coordinator-%d\n%s" % (c.i, c.proc.text() if c.proc else "")
                         for c in self.coords)

    def stop(self):
        errors = []
        for c in self.coords:
            try:
                c.stop()
            except BaseException as e:
                errors.append(e)
        for s in self.shards:
            try:
                s.proc.send_signal(signal.SIGCONT)
                s.stop()
            except BaseException as e:
                errors.append(e)
        self.etcd.stop()
        if errors:
            raise errors[0]
