#!/usr/bin/env python3
"""test_run_dirs -- a second local cluster never touches another's data (newcomer issue,
item 1: `TSR_PORT=7600 make demo` used to `rm -rf build/run` under a serving cluster).

deploy/local/run.sh (the script behind `make run` / `make demo`):
  * cluster A serves from its run folder; a demo on another port (default folder) runs in
    build/run-<port>, and A's folder, version and answers are untouched;
  * a demo pointed at A's folder (TSR_RUN_DIR) while A runs is refused with exit 1 and a
    message naming the locked folder, and A's data are untouched;
  * on the way, `tessera read` of a known and an unknown id names the one not found.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_harness import free_range  # noqa: E402
SHARDS = 2


def env_for(port, run_dir=None):
    e = dict(os.environ, TSR_PORT=str(port), TSR_SHARDS=str(SHARDS), TSR_BIN=BIN)
    e.pop("TSR_RUN_DIR", None)
    if run_dir:
        e["TSR_RUN_DIR"] = run_dir
    return e


def snapshot(d):
    """Relative paths under d (the data of the cluster), without logs."""
    out = set()
    for dp, _, files in os.walk(d):
        for f in files:
            rel = os.path.relpath(os.path.join(dp, f), d)
            if not rel.startswith("logs"):
                out.add(rel)
    return out


def stats(port):
    r = subprocess.run([os.path.join(BIN, "tessera"), "stats", "--target", "127.0.0.1:%d" % port],
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout


def main():
    fails = []
    tmp = tempfile.mkdtemp(prefix="tsr-rundirs-")
    a_dir = os.path.join(tmp, "a")
    pa = free_range(SHARDS)
    a = subprocess.Popen(["bash", "deploy/local/run.sh"], cwd=ROOT, env=env_for(pa, a_dir),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    b_default = None
    try:
        # wait for A to serve
        out = []
        deadline = time.time() + 240
        while time.time() < deadline:
            line = a.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("== serving on"):
                break
        if not out or not out[-1].startswith("== serving on"):
            print("".join(out))
            fails.append("cluster A did not start")
            return 1
        rc, st_a = stats(pa)
        before = snapshot(a_dir)
        # `tessera read` names the ids it did not find (newcomer issue, item 10)
        r = subprocess.run([os.path.join(BIN, "tessera"), "read", "--target", "127.0.0.1:%d" % pa,
                            "dp-00003", "no-such-id"], capture_output=True, text=True, timeout=30)
        print("read dp-00003 no-such-id: exit %d: %s" % (r.returncode, r.stderr.strip()))
        if r.returncode != 1 or '"dp-00003"' not in r.stdout or \
                not r.stderr.strip().endswith("1 of 2 ids not found: no-such-id"):
            fails.append("tessera read does not name the missing id: exit %d\n%s%s"
                         % (r.returncode, r.stdout, r.stderr))
        print("cluster A on %d serves from %s: %d files" % (pa, a_dir, len(before)))

        # 1. a demo on another port with the default folder: build/run-<port>
        pb = free_range(SHARDS)
        while pa <= pb <= pa + SHARDS or pb <= pa <= pb + SHARDS:
            pb = free_range(SHARDS)
        b_default = os.path.join(ROOT, "build", "run-%d" % pb)
        r = subprocess.run(["bash", "deploy/local/run.sh", "--demo"], cwd=ROOT, env=env_for(pb),
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            fails.append("demo on port %d: exit %d\n%s" % (pb, r.returncode, r.stdout[-3000:] + r.stderr))
        if ("build/run-%d/" % pb) not in r.stdout:
            fails.append("the demo on port %d did not use build/run-%d:\n%s" % (pb, pb, r.stdout[:500]))
        print("demo on port %d ran in build/run-%d: exit %d" % (pb, pb, r.returncode))

        # 2. a demo pointed at A's folder is refused while A runs
        pc = free_range(SHARDS)
        r = subprocess.run(["bash", "deploy/local/run.sh", "--demo"], cwd=ROOT, env=env_for(pc, a_dir),
                           capture_output=True, text=True, timeout=60)
        msg = (r.stdout + r.stderr).strip()
        print("demo pointed at A's folder: exit %d: %s" % (r.returncode, msg.splitlines()[-1] if msg else ""))
        if r.returncode != 1 or "in use by a running cluster" not in msg or a_dir not in msg:
            fails.append("a demo on A's folder was not refused: exit %d\n%s" % (r.returncode, msg))

        after = snapshot(a_dir)
        if before - after:
            fails.append("files of A's folder disappeared: %s" % sorted(before - after)[:10])
        rc2, st_a2 = stats(pa)
        if rc2 != 0 or st_a2 != st_a:
            fails.append("A's stats changed:\n%s\n--- now:\n%s" % (st_a, st_a2))
    finally:
        try:
            os.killpg(a.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            a.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(a.pid, signal.SIGKILL)
            a.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        if b_default:
            shutil.rmtree(b_default, ignore_errors=True)
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
