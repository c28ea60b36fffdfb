"""Interop and hostile-file tests of `tessera index check | info | rewrite` (faiss_io).

1. For every variant (L2/IP x by_residual 0/1 x NoMap/Array/Hashtable x full/sprs lists,
   plus IndexIVFPQR) a file written by stock Faiss is accepted by `check`, described by
   `info` as Faiss itself describes it, and `rewrite` reproduces it byte for byte.
2. Unsupported files (other index types, other metrics) are rejected with a message that
   names the fourcc / field and the offset.
3. Every prefix of small valid files and a few thousand single-byte flips are fed to one
   `check` process: it must never die of a signal or hang, must reject every prefix and
   every flip of a structural byte (counts, fourccs, shapes, bool bytes, ...), and any
   flipped file it accepts must rewrite to itself. Runs with $TSR_SAN_BIN too if set.

Run with /usr/bin/python3 (faiss 1.7.3); $TSR_BIN is the bin dir of `tessera`.
"""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import faiss

# One OpenMP thread: the indexes are tiny and spinning threads crawl on a loaded machine.
faiss.omp_set_num_threads(1)

BIN = os.environ.get("TSR_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "bin")
TESSERA = os.path.join(BIN, "tessera")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def run(args, timeout=120, exe=TESSERA, cwd=None):
    return subprocess.run([exe, "index"] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)


# ---- 1. variants written by stock Faiss -----------------------------------------------------

DM_NAMES = {0: "none", 1: "array", 2: "hashtable"}


def make_index(metric, by_residual, dm, sparse, nbits, seed):
    rng = np.random.default_rng(seed)
    d, M = 8, 4
    nlist = 64 if sparse else 16
    xt = rng.standard_normal((600, d)).astype("float32")
    quantizer = faiss.IndexFlatL2(d) if metric == faiss.METRIC_L2 else faiss.IndexFlatIP(d)
    ix = faiss.IndexIVFPQ(quantizer, d, nlist, M, nbits, metric)
    ix.by_residual = bool(by_residual)
    ix.cp.min_points_per_centroid = 1
    ix.train(xt)
    if dm:
        ix.set_direct_map_type(dm)
    # sparse: few vectors in many lists -> at most nlist/2 non-empty lists -> "sprs"
    xb = xt[: (20 if sparse else 400)]
    if dm == faiss.DirectMap.Hashtable or (dm == 0 and seed % 2):
        ix.add_with_ids(xb, (np.arange(len(xb), dtype="int64") * 7919 + 13)[::-1].copy())
    else:
        ix.add(xb)
    ix.nprobe = 1 + seed % 5
    return ix


def faiss_facts(path):
    """What Faiss itself reads from the file, in `info`'s vocabulary."""
    ix = faiss.read_index(path)
    ivf = faiss.extract_index_ivf(ix)
    pq = faiss.downcast_index(ix)
    refine = isinstance(pq, faiss.IndexIVFPQR)
    invl = ivf.invlists
    nonempty = sum(1 for i in range(ivf.nlist) if invl.list_size(i) > 0)
    q = faiss.downcast_index(ivf.quantizer)
    facts = {
        "fourcc": "IwQR" if refine else "IwPQ",
        "d": ix.d,
        "ntotal": ix.ntotal,
        "nlist": ivf.nlist,
        "nprobe": ivf.nprobe,
        "metric": "l2" if ix.metric_type == faiss.METRIC_L2 else "ip",
        "by_residual": bool(pq.by_residual),
        "code_size": pq.code_size,
        "pq_m": pq.pq.M,
        "pq_nbits": pq.pq.nbits,
        "direct_map": DM_NAMES[ivf.direct_map.type],
        "list_type": "full" if nonempty > ivf.nlist // 2 else "sprs",
        "nonempty_lists": nonempty,
        "is_trained": bool(ix.is_trained),
        "quantizer": "IxF2" if q.metric_type == faiss.METRIC_L2 else "IxFI",
    }
    if refine:
        facts.update({"refine_pq_m": pq.refine_pq.M, "refine_pq_nbits": pq.refine_pq.nbits,
                      "refine_code_size": pq.refine_pq.code_size})
    return facts


def check_valid_file(path, tmp, label):
    r = run(["check", path])
    if r.returncode != 0:
        fail(f"{label}: check exit {r.returncode}: {r.stderr.strip()}")
        return
    r = run(["info", path])
    if r.returncode != 0:
        fail(f"{label}: info exit {r.returncode}: {r.stderr.strip()}")
        return
    lines = r.stdout.strip().splitlines()
    if len(lines) != 1:
        fail(f"{label}: info printed {len(lines)} lines")
    info = json.loads(r.stdout)
    for k, v in faiss_facts(path).items():
        if info.get(k) != v:
            fail(f"{label}: info {k} = {info.get(k)!r}, faiss says {v!r}")
    out = os.path.join(tmp, "rewrite.out")
    r = run(["rewrite", path, out])
    if r.returncode != 0:
        fail(f"{label}: rewrite exit {r.returncode}: {r.stderr.strip()}")
        return
    with open(path, "rb") as a, open(out, "rb") as b:
        if a.read() != b.read():
            fail(f"{label}: rewrite is not byte-identical")
    if os.path.exists(out + ".tmp"):
        fail(f"{label}: rewrite left {out}.tmp behind")
    faiss.read_index(out)  # and it loads in Faiss
    os.unlink(out)
    return info


def test_variants(tmp):
    seed, n, types = 0, 0, set()
    for metric in (faiss.METRIC_L2, faiss.METRIC_INNER_PRODUCT):
        for by_residual in (0, 1):
            for dm in (0, faiss.DirectMap.Array, faiss.DirectMap.Hashtable):
                for sparse in (0, 1):
                    seed += 1
                    nbits = (8, 5, 8, 3)[seed % 4]
                    ix = make_index(metric, by_residual, dm, sparse, nbits, seed)
                    path = os.path.join(tmp, f"v{seed}.faiss")
                    faiss.write_index(ix, path)
                    label = f"variant metric={metric} res={by_residual} dm={dm} sparse={sparse} nbits={nbits}"
                    info = check_valid_file(path, tmp, label)
                    if info:
                        types.add((info["metric"], info["by_residual"], info["direct_map"], info["list_type"]))
                        if info["list_type"] != ("sprs" if sparse else "full"):
                            fail(f"{label}: list_type {info['list_type']}")
                    n += 1
    if len(types) != 24:
        fail(f"only {len(types)} distinct variants covered")
    # IndexIVFPQR (IwQR)
    rng = np.random.default_rng(99)
    xt = rng.standard_normal((600, 8)).astype("float32")
    ix = faiss.IndexIVFPQR(faiss.IndexFlatL2(8), 8, 8, 4, 6, 2, 8)
    ix.cp.min_points_per_centroid = 1
    ix.train(xt)
    ix.add(xt[:300])
    ix.k_factor = 2.5
    path = os.path.join(tmp, "refine.faiss")
    faiss.write_index(ix, path)
    info = check_valid_file(path, tmp, "IwQR")
    if info and abs(info.get("k_factor", 0) - 2.5) > 1e-6:
        fail(f"IwQR k_factor {info.get('k_factor')}")
    print(f"variants: {n} IwPQ files + 1 IwQR checked")


# ---- 2. unsupported files -------------------------------------------------------------------

def expect_reject(path, label, *needles):
    r = run(["check", path])
    msg = r.stderr.strip()
    if r.returncode != 1 or len(msg.splitlines()) != 1:
        fail(f"{label}: check exit {r.returncode}, stderr {msg!r}")
        return
    for s in needles:
        if s not in msg:
            fail(f"{label}: message {msg!r} does not contain {s!r}")


def test_unsupported(tmp):
    rng = np.random.default_rng(5)
    xt = rng.standard_normal((300, 8)).astype("float32")
    flat = faiss.IndexIVFFlat(faiss.IndexFlatL2(8), 8, 4)
    flat.train(xt)
    p = os.path.join(tmp, "ivfflat.faiss")
    faiss.write_index(flat, p)
    expect_reject(p, "IVFFlat", "offset 0", '"IwFl"', "fourcc")
    # IVFPQ over an HNSW quantizer: the quantizer fourcc is named with its offset
    ix = faiss.IndexIVFPQ(faiss.IndexHNSWFlat(8, 4), 8, 4, 2, 4)
    ix.cp.min_points_per_centroid = 1
    ix.train(xt)
    p = os.path.join(tmp, "hnswq.faiss")
    faiss.write_index(ix, p)
    expect_reject(p, "HNSW quantizer", "offset 53", "quantizer.fourcc", '"IHNf"')
    # another metric: metric_arg is present, message says unsupported metric
    ix = faiss.IndexIVFPQ(faiss.IndexFlatL2(8), 8, 4, 2, 4)
    ix.cp.min_points_per_centroid = 1
    ix.train(xt)
    ix.metric_type = faiss.METRIC_Lp
    ix.metric_arg = 3.0
    p = os.path.join(tmp, "lp.faiss")
    faiss.write_index(ix, p)
    expect_reject(p, "METRIC_Lp", "offset 33", "index.metric_type", "metric 4 is not supported")
    # trailing garbage
    good = os.path.join(tmp, "good.faiss")
    faiss.write_index(make_index(faiss.METRIC_L2, 1, 0, 0, 4, 3), good)
    data = open(good, "rb").read()
    p = os.path.join(tmp, "trailing.faiss")
    open(p, "wb").write(data + b"\0")
    expect_reject(p, "trailing", f"offset {len(data)}", "trailing")
    # usage errors and --help
    for args, rc in ((["check"], 2), (["info"], 2), (["info", good, good], 2), (["rewrite", good], 2),
                     (["check", "--bogus", good], 2), (["check", "--help"], 0), (["info", "--help"], 0),
                     (["rewrite", "--help"], 0), (["check", os.path.join(tmp, "missing")], 1)):
        r = run(args)
        if r.returncode != rc:
            fail(f"tessera index {' '.join(args)}: exit {r.returncode}, expected {rc}")
    print("unsupported / usage: checked")


# ---- 3. prefixes and byte flips -------------------------------------------------------------

def layout(buf):
    """Splits a valid IwPQ/IwQR file into regions (start, end, kind):
    strict: any change must be rejected; bool: a change other than x^1 must be rejected;
    metric: index metric_type (its low byte ^1 is another valid metric); free: payload
    (floats, codes, ids, direct-map entries, nprobe, sparse list numbers) may stay valid."""
    regions, pos = [], 0

    def take(n, kind):
        nonlocal pos
        regions.append((pos, pos + n, kind))
        pos += n
        return buf[pos - n:pos]

    def u64(kind="strict"):
        return struct.unpack("<Q", take(8, kind))[0]

    def header(metric_kind):
        take(4, "strict")        # d
        take(8, "strict")        # ntotal
        take(16, "strict")       # dummies
        take(1, "bool")          # is_trained
        take(4, metric_kind)     # metric_type

    def pq():
        d, M, nbits = u64(), u64(), u64()
        n = u64()
        take(4 * n, "free")
        return (M * nbits + 7) // 8

    top = take(4, "strict")
    header("metric")
    nlist = u64()
    u64("free")                  # nprobe
    take(4, "strict")
    header("strict")
    take(4 * u64(), "free")      # centroids
    dm = take(1, "strict")[0]
    take(8 * u64(), "free")
    if dm == 2:
        take(16 * u64(), "free")
    take(1, "bool")              # by_residual
    cs = u64()
    pq()
    take(4, "strict")            # ilar
    u64()
    u64()
    lt = take(4, "strict")
    n = u64()
    sizes = []
    if lt == b"full":
        sizes = [u64() for _ in range(n)]
    else:
        for _ in range(n // 2):
            u64("free")          # list_no: another increasing list number is still valid
            sizes.append(u64())
    for s in sizes:
        take(s * cs, "free")
        take(s * 8, "free")
    if top == b"IwQR":
        pq()
        take(u64(), "free")
        take(4, "free")          # k_factor
    assert pos == len(buf), (pos, len(buf))
    return regions


def must_reject(regions, pos, x):
    for a, b, kind in regions:
        if a <= pos < b:
            if kind == "strict":
                return True
            if kind == "bool":
                return x != 1
            if kind == "metric":
                return not (pos == a and x == 1)
            return False
    raise AssertionError(pos)


def run_check_many(exe, names, cwd):
    """One `check` process over many files: {name: ok?}. Fails on a signal or a timeout."""
    try:
        r = subprocess.run([exe, "index", "check"] + names, capture_output=True, text=True,
                           timeout=300, cwd=cwd)
    except subprocess.TimeoutExpired:
        fail(f"{exe}: check timed out on {len(names)} files")
        return None
    if r.returncode < 0:
        fail(f"{exe}: check died of signal {-r.returncode}: {r.stderr[-2000:]}")
        return None
    res = {}
    for line in r.stdout.splitlines():
        if line.endswith(": ok"):
            res[line[:-4]] = True
    pat = re.compile(r"^tessera index check: (\S+): offset \d+: \S+: .+")
    for line in r.stderr.splitlines():
        m = pat.match(line)
        if not m:
            fail(f"{exe}: unexpected stderr line {line!r}")
            continue
        res[m.group(1)] = False
    if len(res) != len(names):
        fail(f"{exe}: {len(res)} result lines for {len(names)} files")
    if r.returncode != (0 if all(res.values()) else 1):
        fail(f"{exe}: check exit {r.returncode}")
    return res


def test_hostile(tmp, exes):
    rng = np.random.default_rng(11)
    xt = rng.standard_normal((200, 4)).astype("float32")
    bases = []
    for k, (metric, dm, sparse) in enumerate(((faiss.METRIC_L2, faiss.DirectMap.Hashtable, 0),
                                              (faiss.METRIC_INNER_PRODUCT, faiss.DirectMap.Array, 1),
                                              (faiss.METRIC_L2, 0, 0))):
        q = faiss.IndexFlatL2(4) if metric == faiss.METRIC_L2 else faiss.IndexFlatIP(4)
        nlist = 12 if sparse else 4
        ix = faiss.IndexIVFPQ(q, 4, nlist, 2, 3, metric)
        ix.cp.min_points_per_centroid = 1
        ix.train(xt)
        if dm:
            ix.set_direct_map_type(dm)
        if dm == faiss.DirectMap.Hashtable:
            ix.add_with_ids(xt[:24], np.arange(24, dtype="int64") * 3 + 1)
        else:
            ix.add(xt[:4 if sparse else 24])
        p = os.path.join(tmp, f"base{k}.faiss")
        faiss.write_index(ix, p)
        bases.append(open(p, "rb").read())
    r = faiss.IndexIVFPQR(faiss.IndexFlatL2(4), 4, 4, 2, 3, 2, 4)
    r.cp.min_points_per_centroid = 1
    r.train(xt)
    r.add(xt[:16])
    p = os.path.join(tmp, "base3.faiss")
    faiss.write_index(r, p)
    bases.append(open(p, "rb").read())

    hdir = os.path.join(tmp, "hostile")
    os.mkdir(hdir)
    names, expect_bad, flipped = [], {}, {}
    for k, data in enumerate(bases):
        for n in range(len(data)):       # every proper prefix, the empty one included
            name = f"p{k}_{n}"
            open(os.path.join(hdir, name), "wb").write(data[:n])
            names.append(name)
            expect_bad[name] = True
    rnd = random.Random(1234)
    for i in range(3000):
        k = rnd.randrange(len(bases))
        data = bases[k]
        regions = layout(data)
        if i % 2:   # half the flips aimed at structural bytes, half anywhere
            strict = [(a, b) for a, b, kind in regions if kind != "free"]
            a, b = rnd.choice(strict)
            pos = rnd.randrange(a, b)
        else:
            pos = rnd.randrange(len(data))
        x = rnd.randrange(1, 256)
        mutated = bytearray(data)
        mutated[pos] ^= x
        name = f"f{i}"
        open(os.path.join(hdir, name), "wb").write(mutated)
        names.append(name)
        expect_bad[name] = must_reject(regions, pos, x)
        flipped[name] = bytes(mutated)
    import time
    for exe in exes:
        t0 = time.time()
        res = run_check_many(exe, names, hdir)
        print(f"  check of {len(names)} files: {time.time() - t0:.1f}s")
        if res is None:
            continue
        wrong = [n for n in names if expect_bad[n] and res.get(n, False)]
        for n in wrong[:10]:
            fail(f"{exe}: accepted hostile file {n}")
        accepted = [n for n in names if res.get(n)]
        # an accepted file is canonical: it rewrites to itself (a sample: rewrite fsyncs)
        for n in random.Random(5).sample(accepted, min(15, len(accepted))):
            out = os.path.join(hdir, "rw.out")
            rr = subprocess.run([exe, "index", "rewrite", n, out], capture_output=True,
                                timeout=60, cwd=hdir)
            if rr.returncode != 0 or open(out, "rb").read() != flipped[n]:
                fail(f"{exe}: accepted flipped file {n} does not rewrite to itself")
        print(f"hostile ({exe}): {len(names)} files, {sum(expect_bad.values())} must fail, "
              f"{len(accepted)} accepted (payload flips), {len(wrong)} wrongly accepted")


def main():
    import time
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="tsr_faiss_files_")
    try:
        test_variants(tmp)
        print(f"  {time.time() - t0:.1f}s")
        test_unsupported(tmp)
        print(f"  {time.time() - t0:.1f}s")
        exes = [TESSERA]
        san = os.environ.get("TSR_SAN_BIN")
        if san:
            exes.append(os.path.join(san, "tessera"))
        test_hostile(tmp, exes)
        print(f"  {time.time() - t0:.1f}s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
