#!/usr/bin/env python3
"""callgraph — which file of a folder calls which, from the built objects; fails on a loop.

For each FOLDER (a source folder such as coordinator, shard or common/index) it reads the
objects of that folder's .c files, BUILD/obj/FOLDER/*.o, with `nm`: file A calls file B
when a symbol A.o leaves undefined is defined (globally) by B.o. Only the files of the
folder are nodes; calls into other folders (common's libraries, gRPC, libc) are not edges.
A file calling itself is not an edge. Data symbols count like functions: a file that
reads another's global depends on it just the same.

It prints the graph (one line per file: the files it calls, with the symbols), then every
call loop, one per strongly connected component, as "a.c -> b.c -> a.c". The exit status
is 0 when there is no loop, 1 when there is one, 2 on a usage error (e.g. no objects:
build first, `make all`).

    python3 tests/tools/callgraph.py [--build build/release] [--quiet] FOLDER...
"""
import argparse
import os
import subprocess
import sys

DEFINED = set("ABCDGRSTVWi")  # nm -P types of a global definition (uppercase = global)


def nm_symbols(objs):
    """{object path: (defined globals, undefined)} of the objects, with one nm run."""
    out = subprocess.run(["nm", "-P", "-A"] + objs, check=True, capture_output=True,
                         text=True).stdout
    syms = {o: (set(), set()) for o in objs}
    for line in out.splitlines():
        obj, _, rest = line.partition(": ")
        parts = rest.split()
        if obj not in syms or len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        defined, undefined = syms[obj]
        if kind in ("U", "w", "v"):
            undefined.add(name)
        elif kind in DEFINED and kind != "i" and kind.isupper():
            defined.add(name)
    return syms


def graph_of(objdir, srcdir=None):
    """{file: {callee file: sorted symbols}} for the objects in objdir (not recursive).
    With srcdir, only objects whose .c is still there (a removed file's stale object is
    not a node)."""
    objs = sorted(f for f in os.listdir(objdir) if f.endswith(".o") and
                  (srcdir is None or os.path.isfile(os.path.join(srcdir, f[:-2] + ".c"))))
    paths = [os.path.join(objdir, o) for o in objs]
    found = nm_symbols(paths) if paths else {}
    syms = {o[:-2] + ".c": found[p] for o, p in zip(objs, paths)}
    owner = {}
    for f, (defined, _) in syms.items():
        for s in defined:
            owner.setdefault(s, f)
    graph = {f: {} for f in syms}
    for f, (_, undefined) in syms.items():
        for s in undefined:
            g = owner.get(s)
            if g is not None and g != f:
                graph[f].setdefault(g, []).append(s)
    for f in graph:
        for g in graph[f]:
            graph[f][g].sort()
    return graph


def sccs(graph):
    """Strongly connected components (Tarjan, iterative), each a list of files."""
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        onstack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    onstack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in onstack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def cycle_in(graph, comp):
    """One loop through the files of a strongly connected component (breadth-first from
    its first file back to itself)."""
    members = set(comp)
    start = comp[0]
    prev = {}
    frontier = [start]
    seen = set()
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + list(reversed(path[:-1])) + [start] if v != start \
                        else [start, start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp + [comp[0]]


def layers(graph):
    """Files ordered bottom-up (callees before callers); only meaningful without loops."""
    order, done = [], set()

    def visit(v, path):
        if v in done or v in path:
            return
        path.add(v)
        for w in sorted(graph[v]):
            visit(w, path)
        path.discard(v)
        done.add(v)
        order.append(v)

    for v in sorted(graph):
        visit(v, set())
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build/release",
                    help="build directory holding obj/ (default build/release)")
    ap.add_argument("--quiet", action="store_true", help="print only the loops")
    ap.add_argument("folders", nargs="+", metavar="FOLDER")
    a = ap.parse_args()
    status = 0
    for folder in a.folders:
        folder = folder.rstrip("/")
        objdir = os.path.join(a.build, "obj", folder)
        if not os.path.isdir(objdir) or not any(f.endswith(".o") for f in os.listdir(objdir)):
            print(f"callgraph: no objects in {objdir} (build first: make all)", file=sys.stderr)
            return 2
        graph = graph_of(objdir, folder if os.path.isdir(folder) else None)
        loops = [c for c in sccs(graph) if len(c) > 1]
        if not a.quiet:
            print(f"{folder}/: which file calls which (bottom-up)")
            for f in layers(graph):
                callees = graph[f]
                if not callees:
                    print(f"  {f}: -")
                    continue
                desc = "; ".join(f"{g} ({', '.join(callees[g][:4])}"
                                 f"{', ...' if len(callees[g]) > 4 else ''})"
                                 for g in sorted(callees))
                print(f"  {f} -> {desc}")
        if loops:
            status = 1
            for comp in loops:
                cyc = cycle_in(graph, comp)
                edges = []
                for x, y in zip(cyc, cyc[1:]):
                    edges.append(f"{x} -> {y} ({', '.join(graph[x][y][:3])})")
                print(f"callgraph: {folder}/: call loop among {', '.join(comp)}: "
                      f"{' -> '.join(cyc)}", file=sys.stderr)
                for e in edges:
                    print(f"    {e}", file=sys.stderr)
        elif not a.quiet:
            print(f"  no call loop in {folder}/")
    if a.quiet and status == 0:
        print(f"callgraph: {len(a.folders)} folders, no call loop between their files")
    return status


if __name__ == "__main__":
    sys.exit(main())
