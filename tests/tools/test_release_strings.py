"""No test hook or A/B knob in a release binary (issue 40, must-be-true 2; docs/testing.md).

For each release binary (TSR_BIN, default bin/: tessera-coordinator, tessera-shard,
tessera), `strings -a` (every section, debug info included) must hold none of:
- the environment variable of any row of common/core/testing.h's table (as a whole name:
  TSR_SIMD, not TSR_SIMD_MAX, which is an operator's setting);
- any hook name among its values that is not an ordinary word (plant-ack-unlogged,
  mirror-answer-lost, mirror-doubt, no-read-index, no-demand, caught-up, round-logged,
  catchup-logged: every value with a '-');
- the hooks' log text "(test hook)".
Run on a test build (TSR_BIN=build/testing/bin) it fails: that build has them all.
SKIP when TSR_BIN is the test build of the run (TSR_TEST_BIN, as in `make test-san`).
"""
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import knobs  # noqa: E402

BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
BINARIES = ("tessera-coordinator", "tessera-shard", "tessera")


def needles():
    out = []
    for _, var, _, values, _ in knobs.table():
        out.append((var, re.compile(r"(?<![A-Z0-9_])%s(?![A-Z0-9_])" % re.escape(var))))
        for v in values:
            if "-" in v:
                out.append((v, re.compile(r"(?<![a-z0-9-])%s(?![a-z0-9-])" % re.escape(v))))
    out.append(("(test hook)", re.compile(re.escape("(test hook)"))))
    return out


def main():
    test_bin = os.environ.get("TSR_TEST_BIN")
    if test_bin and os.path.abspath(test_bin) == os.path.abspath(BIN):
        print("SKIP: TSR_BIN is the test build (%s)" % BIN)
        return 77
    if not shutil.which("strings"):
        print("SKIP: no strings (binutils)")
        return 77
    ns = needles()
    assert len(ns) >= 19 + 8, [n for n, _ in ns]
    found = []
    for b in BINARIES:
        path = os.path.join(BIN, b)
        if not os.path.exists(path):
            found.append("%s: missing (build it: make)" % path)
            continue
        text = subprocess.run(["strings", "-a", path], capture_output=True, text=True,
                              check=True).stdout
        for name, rx in ns:
            m = rx.search(text)
            if m:
                line = text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end())]
                found.append("%s: holds %s (in %r)" % (path, name, line[:100]))
        print("%s: none of %d hook and knob names" % (path, len(ns)))
    if found:
        print("\n".join(found))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
