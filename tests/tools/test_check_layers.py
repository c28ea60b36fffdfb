#!/usr/bin/env python3
"""test_check_layers -- check_layers.py passes on the tree and fails, naming the file,
the line and the rule, on each planted violation (in a copy of the sources)."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TOOL = os.path.join(HERE, "check_layers.py")
PY = sys.executable


def run(root):
    r = subprocess.run([PY, TOOL, "--root", root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def copy_tree(dst):
    for top in ("common", "cli", "shard", "coordinator", "bench", "tests/unit", "tests/fuzz"):
        src = os.path.join(ROOT, top)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dst, top),
                            ignore=lambda d, names: [n for n in names
                                                     if os.path.isfile(os.path.join(d, n))
                                                     and not n.endswith((".c", ".h"))])


def plant(root, rel, include):
    p = os.path.join(root, rel)
    with open(p) as f:
        s = f.read()
    with open(p, "w") as f:
        f.write('#include "%s"\n' % include + s)


CASES = [
    # (file, include, what the message must say)
    ("common/core/error.c", "index/knn.h", 'common/core/error.c:1: includes "index/knn.h": layer core may include only core'),
    ("common/batch/batch.c", "net/rpc.h", "layer batch may include only batch, core"),
    ("common/index/knn.c", "query/topk.h", "layer index may include only index, core"),
    ("cli/main.c", "index/kmeans_int.h", "kmeans_int.h is internal to common/index/"),
    ("common/query/filter.c", "net/rpc_int.h", "rpc_int.h is internal to common/net/"),
    ("common/store/store.c", "tessera/v1/shard.pb-c.h", "layer store may not include them"),
    ("common/index/ivfpq.c", "coord.h", "a bare include in common/ must name a header of the same folder"),
    ("coordinator/query.c", "shard.h", "coordinator/ may not include a header of shard/"),
]


def main():
    fails = []
    rc, out = run(ROOT)
    print(out.strip())
    if rc != 0:
        fails.append("the tree itself has violations")
    for rel, inc, want in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            copy_tree(tmp)
            rc, out = run(tmp)
            if rc != 0:
                fails.append("the clean copy fails: " + out)
                continue
            plant(tmp, rel, inc)
            rc, out = run(tmp)
            line = next((l for l in out.splitlines() if want in l), None)
            print("planted %-26s in %-26s -> exit %d: %s" % (inc, rel, rc, line))
            if rc != 1 or line is None or rel not in line:
                fails.append("planted %s in %s: exit %d, output:\n%s" % (inc, rel, rc, out))
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
