#!/usr/bin/env python3
"""test_callgraph -- callgraph.py finds a planted call loop between two files of a folder
(a.c calls b.c, b.c calls back into a.c), names both files, exits 1; one-way calls and a
file calling itself pass (exit 0). Objects are compiled with cc in a temporary folder."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "callgraph.py")

SRC_LOOP = {
    "a.c": "int b_fn(int); int a_fn(int x) { return x ? b_fn(x - 1) : 0; }\n",
    "b.c": "int a_fn(int); int b_fn(int x) { return a_fn(x); }\n",
    "c.c": "int b_fn(int); static int self(int x) { return x ? self(x - 1) : 0; }\n"
           "int c_fn(int x) { return b_fn(x) + self(x); }\n",
}
SRC_ONE_WAY = dict(SRC_LOOP, **{"b.c": "int b_fn(int x) { return x + 1; }\n"})


def build(tmp, srcs):
    obj = os.path.join(tmp, "build", "obj", "pkg")
    os.makedirs(obj, exist_ok=True)
    for name, text in srcs.items():
        c = os.path.join(tmp, name)
        with open(c, "w") as f:
            f.write(text)
        subprocess.run(["cc", "-c", c, "-o", os.path.join(obj, name[:-2] + ".o")], check=True)
    r = subprocess.run([sys.executable, TOOL, "--quiet", "--build", os.path.join(tmp, "build"), "pkg"],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = build(tmp, SRC_LOOP)
        print("planted loop: exit %d: %s" % (rc, out.strip().splitlines()[0] if out.strip() else ""))
        if rc != 1 or "call loop among a.c, b.c" not in out or "a.c -> b.c -> a.c" not in out:
            fails.append("the planted loop was not reported:\n" + out)
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = build(tmp, SRC_ONE_WAY)
        print("one-way calls: exit %d: %s" % (rc, out.strip()))
        if rc != 0:
            fails.append("one-way calls reported as a loop:\n" + out)
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
