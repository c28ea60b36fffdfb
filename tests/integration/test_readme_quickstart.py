#!/usr/bin/env python3
"""test_readme_quickstart -- README's "Quick start by hand" works when pasted (issue 41, item
3: `cluster up ... &` followed at once by `update` got "Connection refused").

The block is read from README.md between the quick-start-begin and quick-start-end markers,
so the test follows the README, and run by bash as one script with `set -e -o pipefail` (a
command that fails ends it). The only changes: the build line (`make deps && make -j2`) is
skipped (the tree under test is built), the folders /var/tmp/tsr and /var/tmp/tsr-sample
become fresh temporary ones, port 7000 becomes ports chosen by tests/ports.py, and `bin/`
is $TSR_BIN. It must end with exit 0, the queries print hits, and the streamed write
`new-1` is the 1-nearest neighbour of the query vector it was made from.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from ports import free_range  # noqa: E402
sys.path.insert(0, HERE)
from test_cluster_up import report  # noqa: E402

BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))


def readme_block():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- quick-start-begin[^>]*-->\n(.*?)<!-- quick-start-end -->", text, re.S)
    if m is None:
        raise SystemExit("FAIL: README.md has no quick-start-begin / quick-start-end markers")
    lines = [l[4:] if l.startswith("    ") else l for l in m.group(1).strip("\n").split("\n")]
    return "\n".join(lines) + "\n"


def main():
    block = readme_block()
    shards = int(re.search(r"--shards (\d+)", block).group(1))
    port = free_range(shards)
    tmp = tempfile.mkdtemp(prefix="tsr-quickstart-")
    script = block.replace("make deps && make -j2\n", "")
    script = script.replace("/var/tmp/tsr-sample", os.path.join(tmp, "sample"))
    script = script.replace("/var/tmp/tsr", os.path.join(tmp, "data"))
    script = re.sub(r"\b7000\b", str(port), script)
    script = re.sub(r"(?m)(^|\s)bin/", lambda m: m.group(1) + BIN + "/", script)
    print("the README block as run:\n" + script)
    # output to a file: the block's `cluster up ... &` keeps running (and holding its
    # stdout) after the block ended
    log = os.path.join(tmp, "block.out")
    with open(log, "w") as logf:
        p = subprocess.Popen(["bash", "-c", "set -e -o pipefail\n" + script], cwd=ROOT,
                             stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    fails = []
    try:
        p.wait(timeout=600)
    except subprocess.TimeoutExpired:
        fails.append("the block did not end within 600 s")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        try:  # the `cluster up ... &` of the block
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    out = open(log).read()
    print(out[-4000:])
    if p.returncode != 0:
        fails.append("the block ended with exit %s" % p.returncode)
    if "Connection refused" in out or "UNAVAILABLE" in out:
        fails.append("a command could not reach the cluster")
    hits = re.findall(r"(?m)^\s*1\s+(\S+)", out)
    if len(hits) < 2 or hits[-1] != "new-1":
        fails.append("the queries' first hits are %s; the last one should be new-1" % hits)
    # wait for cluster up to stop (its ports and folders), then clean up
    for _ in range(100):
        if subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True).returncode != 0:
            break
        subprocess.run(["sleep", "0.2"])
    shutil.rmtree(tmp, ignore_errors=True)
    return report(fails)


if __name__ == "__main__":
    sys.exit(main())
