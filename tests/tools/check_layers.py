#!/usr/bin/env python3
"""check_layers -- the include rules of the tree (docs/architecture.md, "Layers").

common/ is split into layers; a file may include headers of its own layer and of the
layers listed for it below, never of a layer above. Rules checked, per #include "...":

  1. common/<L>/...  includes "<M>/x.h" only when M is L or in ALLOWED[L];
     a bare "x.h" (no folder) only when x.h is in the same folder.
  2. An internal header (<name>_int.h) of common/<L>/ is included only by files of
     common/<L>/ and by white-box tests (tests/unit, tests/fuzz).
  3. common/ never includes a header of an application folder (cli/, shard/,
     coordinator/), and the application folders never include each other's headers.
  4. Generated protobuf headers (tessera/, grpc/, google/) are included only by the
     net layer and by the application folders, bench/ and tests/.

Exit 0 when clean; exit 1 with one line per violation:
  check-layers: FILE:LINE: includes "HDR": WHY
Usage: check_layers.py [--root DIR]
"""
import os
import re
import sys

LAYERS = ["core", "index", "query", "batch", "store", "net"]
ALLOWED = {
    "core": [],
    "index": ["core"],
    "query": ["core", "index"],
    "batch": ["core"],
    "store": ["core"],
    "net": ["core"],
}
PROTO_DIRS = ("tessera/", "grpc/", "google/")
PROTO_OK = {"net"}
APPS = ["cli", "shard", "coordinator"]
WHITEBOX = ("tests/unit/", "tests/fuzz/")
SCANNED = ["common", "cli", "shard", "coordinator", "bench", "tests"]
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def sources(root):
    for top in SCANNED:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("node_modules", "corpus", "data")]
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    p = os.path.join(dirpath, f)
                    yield os.path.relpath(p, root).replace(os.sep, "/")


def app_headers(root):
    """{header basename: app folder} for the headers of cli/, shard/, coordinator/."""
    out = {}
    for app in APPS:
        d = os.path.join(root, app)
        if os.path.isdir(d):
            for f in os.listdir(d):
                if f.endswith(".h"):
                    out[f] = app
    return out


def check_file(root, rel, apps, errors):
    parts = rel.split("/")
    layer = parts[1] if parts[0] == "common" and len(parts) == 3 else None
    top = parts[0]
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            m = INC.match(line)
            if not m:
                continue
            hdr = m.group(1)

            def bad(why):
                errors.append('check-layers: %s:%d: includes "%s": %s' % (rel, lineno, hdr, why))

            folder = hdr.split("/")[0] if "/" in hdr else None
            base = hdr.rsplit("/", 1)[-1]
            if hdr.startswith(PROTO_DIRS):
                if top == "common" and layer not in PROTO_OK:
                    bad("generated protobuf headers belong to the net layer and the "
                        "applications; layer %s may not include them" % layer)
                continue
            if folder in LAYERS:
                if not os.path.isfile(os.path.join(root, "common", hdr)):
                    bad("no such header in common/")
                    continue
                if layer is not None and folder != layer and folder not in ALLOWED[layer]:
                    below = ", ".join([layer] + ALLOWED[layer])
                    bad("layer %s may include only %s (%s is not below it)" % (layer, below, folder))
                if base.endswith("_int.h") and folder != layer and not rel.startswith(WHITEBOX):
                    bad("%s is internal to common/%s/ (only its own files and white-box "
                        "tests may include it)" % (base, folder))
                continue
            if folder is None:
                here = os.path.dirname(rel)
                if layer is not None:
                    if not os.path.isfile(os.path.join(root, here, hdr)):
                        bad("a bare include in common/ must name a header of the same folder")
                    continue
                owner = apps.get(base)
                if owner and top in APPS and owner != top:
                    bad("%s/ may not include a header of %s/" % (top, owner))
                continue
            if top == "common" and folder in APPS:
                bad("common/ may not include application headers")


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    if len(argv) == 3 and argv[1] == "--root":
        root = argv[2]
    elif len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = os.path.abspath(root)
    apps = app_headers(root)
    errors = []
    n = 0
    for rel in sources(root):
        n += 1
        check_file(root, rel, apps, errors)
    for e in errors:
        print(e)
    if errors:
        print("check-layers: %d violation(s) in %d files (rules: docs/architecture.md)" % (len(errors), n))
        return 1
    print("check-layers: %d files, layers %s: no violation" % (n, ", ".join(LAYERS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
