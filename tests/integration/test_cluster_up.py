#!/usr/bin/env python3
"""test_cluster_up -- `tessera cluster up` checks its start instead of looping (newcomer
issue, item 2: on a busy port or a data folder in use it printed "listening" for a port it
never got, then restarted the failing process forever, its error only in a log file —
another cluster's).

  a. a port of the range held by another socket: exit 1 within a few seconds, naming the port;
  b. the --data of a running cluster: exit 1 naming the locked folder; the running
     cluster's answers, processes and log files are untouched;
  c. "listening" is printed only once the cluster answers: a query sent right after the
     line (on a restart that loads stored data) gets its hits;
  d. a process that fails at start-up (a bad config) ends cluster up with exit 1 within a
     few seconds and the tail of that process's log, instead of a restart loop;
  e. --metrics-listen HOST:PORT: the coordinator serves /metrics on PORT, shard i on
     PORT+1+i, the shards with tessera_version, tessera_vectors and tessera_lists;
  f. a --data whose kept coordinator.json names other shard ports (another --port) is refused;
  g. a flag that contradicts the kept coordinator.json (--dimensions 128 on a folder at 64,
     --distance, --nlist, --pq-m, --nprobe, --shards) stops the start (exit 1, nothing
     started) naming the flag, both values and what to do; so does one that contradicts a
     --config file, and --etcd-local on a folder served without etcd (test_ha_cluster_up
     checks the converse); a flag that agrees (--dimensions 64) starts as before (case c).
"""
import os
import shutil
import signal
import socket
import subprocess
import re
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_harness import free_range  # noqa: E402
TESSERA = os.path.join(BIN, "tessera")
SHARDS = 2


class Cluster:
    """A `tessera cluster up` in its own session, stdout read line by line."""

    def __init__(self, data, port, *extra):
        self.port = port
        self.p = subprocess.Popen([TESSERA, "cluster", "up", "--data", data, "--shards",
                                   str(SHARDS), "--port", str(port)] + list(extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        self.lines = []

    def wait_line(self, needle, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.p.stdout.readline()
            if not line:
                return None
            self.lines.append(line)
            if needle in line:
                return line
        return None

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
            except ProcessLookupError:
                pass


def run(args, timeout=30):
    return subprocess.run([TESSERA] + args, capture_output=True, text=True, timeout=timeout)


def up_once(data, port, timeout, *extra):
    """Runs cluster up expected to fail: (exit code or None on timeout, output, seconds)."""
    t0 = time.time()
    p = subprocess.Popen([TESSERA, "cluster", "up", "--data", data, "--shards", str(SHARDS),
                          "--port", str(port)] + list(extra), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out, time.time() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        return None, out, time.time() - t0


def log_sizes(data):
    d = os.path.join(data, "logs")
    return {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}


def case_busy_port(tmp, fails):
    base = free_range(SHARDS)
    busy = base + 2  # shard-1's port
    s = socket.socket()
    s.bind(("127.0.0.1", busy))
    s.listen(1)
    try:
        rc, out, secs = up_once(os.path.join(tmp, "busy"), base, 8)
    finally:
        s.close()
    print("a. port %d held: exit %s after %.1f s: %s" % (busy, rc, secs, out.strip().splitlines()[-1:]))
    if rc is None or rc == 0 or secs > 5:
        fails.append("a busy port: expected a non-zero exit within 5 s, got %s after %.1f s:\n%s"
                     % (rc, secs, out[-2000:]))
    elif str(busy) not in out or "in use" not in out:
        fails.append("a busy port: the message does not name port %d:\n%s" % (busy, out))
    if "listening" in out:
        fails.append("a busy port: 'listening' was printed:\n%s" % out)


def case_data_in_use(tmp, fails, a_data, a_port):
    r0 = run(["stats", "--target", "127.0.0.1:%d" % a_port])
    rc0, st0 = r0.returncode, r0.stdout
    logs0 = log_sizes(a_data)
    base = free_range(SHARDS)
    while a_port <= base <= a_port + SHARDS or base <= a_port <= base + SHARDS:
        base = free_range(SHARDS)
    rc, out, secs = up_once(a_data, base, 8)
    print("b. data of a running cluster: exit %s after %.1f s: %s"
          % (rc, secs, out.strip().splitlines()[-1:]))
    if rc is None or rc == 0 or secs > 5:
        fails.append("data in use: expected a non-zero exit within 5 s, got %s after %.1f s:\n%s"
                     % (rc, secs, out[-2000:]))
    elif a_data not in out or "in use" not in out:
        fails.append("data in use: the message does not name %s:\n%s" % (a_data, out))
    if "listening" in out:
        fails.append("data in use: 'listening' was printed:\n%s" % out)
    time.sleep(0.5)
    st1 = run(["stats", "--target", "127.0.0.1:%d" % a_port]).stdout
    if rc0 != 0 or st1 != st0:
        fails.append("data in use: the running cluster's stats changed:\n%s\n--- now:\n%s" % (st0, st1))
    logs1 = log_sizes(a_data)
    if logs1 != logs0:
        fails.append("data in use: the running cluster's logs were written to: %s -> %s" % (logs0, logs1))


def case_bad_config(tmp, fails):
    cfg = os.path.join(tmp, "bad.json")
    with open(cfg, "w") as f:
        f.write('{"dimensions": 0}\n')
    rc, out, secs = up_once(os.path.join(tmp, "badcfg"), free_range(SHARDS), 10, "--config", cfg)
    print("d. bad config: exit %s after %.1f s" % (rc, secs))
    if rc is None or rc == 0 or secs > 6:
        fails.append("bad config: expected a non-zero exit within 6 s, got %s after %.1f s:\n%s"
                     % (rc, secs, out[-2000:]))
    elif "dimensions" not in out or "coordinator" not in out:
        fails.append("bad config: the coordinator's own error is not printed:\n%s" % out)
    if "restarting" in out or "listening" in out:
        fails.append("bad config: restarted or said listening:\n%s" % out)


def load_sample(data, port, fails):
    """Applies a small generated batch, made inside the cluster's --data folder (which
    `cluster up` allows as a batch root); returns the query vector (comma-separated)."""
    sample = os.path.join(data, "sample")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests", "data", "gen_sample.py"),
                    os.path.join(sample, "batch"), "--n", "600", "--no-avro"], check=True,
                   capture_output=True)
    r = run(["update", "--target", "127.0.0.1:%d" % port, "--batch-root",
             os.path.join(sample, "batch")], timeout=120)
    if r.returncode != 0:
        fails.append("update failed: %s %s" % (r.stdout[-1000:], r.stderr[-1000:]))
    with open(os.path.join(sample, "query.txt")) as f:
        return f.read().strip()


def scrape(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()


def gauge(text, name):
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else None


def case_listening_is_true(tmp, fails, data, port, q, nrec):
    """A restart loads the stored version: the query right after the line must work. The
    same run serves /metrics (--metrics-listen): coordinator on M, shard i on M+1+i, the
    shards with tessera_version / tessera_vectors / tessera_lists of what they loaded."""
    mport = free_range(SHARDS)
    while port <= mport <= port + SHARDS or mport <= port <= mport + SHARDS:
        mport = free_range(SHARDS)
    c = Cluster(data, port, "--metrics-listen", "127.0.0.1:%d" % mport, "--dimensions", "64")
    try:
        line = c.wait_line("coordinator listening", 90)
        if line is None:
            fails.append("restart: no 'listening' line:\n%s" % "".join(c.lines))
            return
        r = run(["query", "--target", "127.0.0.1:%d" % port, "--vector", q, "--k", "3"])
        hits = [l for l in r.stdout.splitlines() if "dp-" in l]
        print("c. query right after '%s': exit %d, %d hits" % (line.strip(), r.returncode, len(hits)))
        if r.returncode != 0 or len(hits) != 3:
            fails.append("the query right after 'listening' failed: exit %d\n%s%s"
                         % (r.returncode, r.stdout, r.stderr))
        vectors = 0
        for i in range(SHARDS + 1):
            try:
                text = scrape(mport + i)
            except OSError as e:
                fails.append("metrics on %d: %s" % (mport + i, e))
                continue
            if gauge(text, "tessera_version") != 1:
                fails.append("metrics on %d: tessera_version %s, expected 1"
                             % (mport + i, gauge(text, "tessera_version")))
            if i > 0:  # a shard
                vectors += gauge(text, "tessera_vectors") or 0
                if not gauge(text, "tessera_lists"):
                    fails.append("metrics on %d (shard-%d): tessera_lists %s"
                                 % (mport + i, i - 1, gauge(text, "tessera_lists")))
        print("e. /metrics on %d..%d: the shards hold %d vectors" % (mport, mport + SHARDS, vectors))
        if vectors != nrec:
            fails.append("metrics: the shards' tessera_vectors add up to %d, not %d" % (vectors, nrec))
    finally:
        c.stop()


def case_contradicting_flags(tmp, fails, data, port):
    """g. A's folder (written with the defaults: 64 dimensions, SQUARED_L2, nlist 64, pq_m 16,
    nprobe 8, 2 shards) with flags that say otherwise: refused, each naming flag and values."""
    cases = [(["--dimensions", "128"], ["--dimensions 128", "dimensions 64"]),
             (["--distance", "DOT_PRODUCT"], ["--distance DOT_PRODUCT", "distance SQUARED_L2"]),
             (["--nlist", "32"], ["--nlist 32", "nlist 64"]),
             (["--pq-m", "8"], ["--pq-m 8", "pq_m 16"]),
             (["--nprobe", "4"], ["--nprobe 4", "nprobe 8"])]
    cfg0 = open(os.path.join(data, "coordinator.json")).read()
    for flags, want in cases:
        rc, out, secs = up_once(data, port, 8, *flags)
        print("g. %s on a kept config: exit %s: %s" % (" ".join(flags), rc,
                                                       out.strip().splitlines()[:1]))
        missing = [w for w in want + ["coordinator.json", "another --data", "drop"] if w not in out]
        if rc != 1 or missing or "listening" in out or "starting" in out:
            fails.append("%s on a kept config at other values: exit %s, missing %s:\n%s"
                         % (" ".join(flags), rc, missing, out))
    # --shards: the kept shard list is 2 groups; SHARDS is already on the command line
    p = subprocess.run([TESSERA, "cluster", "up", "--data", data, "--port", str(port),
                        "--shards", "3"], capture_output=True, text=True, timeout=15)
    print("g. --shards 3 on a kept 2-shard config: exit %d" % p.returncode)
    if p.returncode != 1 or "--shards 3" not in p.stderr or "--shards %d" % SHARDS not in p.stderr:
        fails.append("--shards 3 on a kept 2-shard config: exit %d\n%s" % (p.returncode, p.stderr))
    if open(os.path.join(data, "coordinator.json")).read() != cfg0:
        fails.append("the kept coordinator.json changed")
    # --etcd-local on a folder whose index was served without etcd (DIR/coordinator)
    if os.access(os.environ.get("TSR_ETCD") or shutil.which("etcd") or "/usr/bin/etcd", os.X_OK):
        rc, out, secs = up_once(data, port, 8, "--etcd-local", "1")
        print("g. --etcd-local 1 on a folder served without etcd: exit %s" % rc)
        if rc != 1 or "--etcd-local 1" not in out or "without --etcd-local" not in out:
            fails.append("--etcd-local 1 on a folder served without etcd: exit %s\n%s" % (rc, out))
    # --config FILE with a flag it contradicts
    cfg = os.path.join(tmp, "c32.json")
    with open(cfg, "w") as f:
        f.write(cfg0.replace('"dimensions": 64', '"dimensions": 32'))
    rc, out, secs = up_once(os.path.join(tmp, "withcfg"), free_range(SHARDS), 8, "--config", cfg,
                            "--dimensions", "64")
    print("g. --dimensions 64 with a --config at 32: exit %s" % rc)
    if rc != 1 or "--dimensions 64" not in out or "dimensions 32" not in out or cfg not in out:
        fails.append("--dimensions 64 with --config at 32: exit %s\n%s" % (rc, out))


def report(fails):
    """Prints each failure (or "ok"); the exit status of a test."""
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("ok")
    return 1 if fails else 0


def main():
    fails = []
    tmp = tempfile.mkdtemp(prefix="tsr-clusterup-")
    a = None
    try:
        case_busy_port(tmp, fails)
        case_bad_config(tmp, fails)
        a_data = os.path.join(tmp, "a")
        a_port = free_range(SHARDS)
        a = Cluster(a_data, a_port)
        if a.wait_line("coordinator listening", 60) is None:
            fails.append("cluster A did not start:\n%s" % "".join(a.lines))
            return 1
        # wait until A answers (the old code printed the line at once)
        for _ in range(100):
            if run(["stats", "--target", "127.0.0.1:%d" % a_port]).returncode == 0:
                break
            time.sleep(0.2)
        q = load_sample(a_data, a_port, fails)
        case_data_in_use(tmp, fails, a_data, a_port)
        if a.p.poll() is not None:
            fails.append("cluster A's supervisor exited: %s" % a.p.returncode)
        a.stop()
        a = None
        # f. A's folder on another port: its coordinator.json names A's shard ports
        rc, out, secs = up_once(a_data, free_range(SHARDS), 8)
        print("f. A's folder on another port: exit %s after %.1f s" % (rc, secs))
        if rc != 1 or "coordinator.json" not in out or "listening" in out:
            fails.append("a kept coordinator.json for other ports was used: exit %s\n%s" % (rc, out))
        case_contradicting_flags(tmp, fails, a_data, a_port)
        case_listening_is_true(tmp, fails, a_data, a_port, q, 600)
    finally:
        if a is not None:
            a.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report(fails)


if __name__ == "__main__":
    sys.exit(main())
