#!/usr/bin/python3
"""search_answers — search answers, bit for bit, of `tessera index search` and of a shard.

A refactoring of the search path (the scanner, the kernels, the PQ encoder) must not change
one bit of an answer. This records the exact answers (labels and the raw bytes of the float
distances) of a fixed set of searches and compares them with stored digests:

- `tessera index search` on Faiss-written files: IwPQ L2 and IP (M = 8), IwPQ L2 with one
  dimension per sub-quantizer (M = 32: the centroid-rank blocks), IwQR (refined and
  --no-refine), at nprobe 1 / 4 / 32 and k 1 / 10, with the automatic kernels, with
  --simd scalar, without the prefilter (TSR_SEARCH_FILTER=0), and search_preassigned
  (--lists / --coarse-dis);
- a tessera-shard given the same vectors (it PQ-encodes them itself): plain top-k,
  restricts (allow / deny), crowding, exact re-rank, at several nprobe and k, L2 and IP.

The data and the Faiss-trained indexes are made here from fixed seeds with one OpenMP
thread; the digests were recorded with the code before the scanner refactoring. They
depend on the machine's Faiss/BLAS build (training, the coarse step's sgemm), so on
another machine regenerate them with the code you trust (--record) before a change.

usage: test_search_answers.py (make test runs it: --check) [--record F | --check F] [--dump F]
  default: --check tests/interop/search_answers.json
  --dump F  also write every answer in full (hex floats) to F, for a diff.
Env: TSR_BIN = directory of the binaries (default bin).
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import faiss

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import shard_harness as H  # noqa: E402
from test_search_faiss import write_fvecs, write_ivecs  # noqa: E402

BIN = os.environ.get("TSR_BIN", "bin")
D, NLIST, N, NQ = 32, 32, 6000, 40


def data():
    rng = np.random.default_rng(40)
    centers = rng.normal(size=(40, D)).astype("float32") * 4
    xb = (centers[rng.integers(0, 40, N)] + rng.normal(size=(N, D))).astype("float32")
    xq = (centers[rng.integers(0, 40, NQ)] + rng.normal(size=(NQ, D))).astype("float32")
    return xb, xq


def faiss_index(xb, metric, m, refine=False):
    faiss.omp_set_num_threads(1)
    mt = faiss.METRIC_L2 if metric == "L2" else faiss.METRIC_INNER_PRODUCT
    q = faiss.IndexFlatL2(D) if metric == "L2" else faiss.IndexFlatIP(D)
    if refine:
        ix = faiss.IndexIVFPQR(q, D, NLIST, m, 8, m, 8)
    else:
        ix = faiss.IndexIVFPQ(q, D, NLIST, m, 8, mt)
    ix.cp.seed = 5
    ix.pq.cp.seed = 5
    ix.train(xb[:4000])
    ix.add(xb)
    ix._q = q
    return ix


def cli_cases(tmp, xb, xq, out):
    qp = os.path.join(tmp, "q.fvecs")
    write_fvecs(qp, xq)
    files = {}
    for name, metric, m, refine in (("pq_l2_m8", "L2", 8, False), ("pq_ip_m8", "IP", 8, False),
                                    ("pq_l2_m32", "L2", 32, False), ("qr_l2_m8", "L2", 8, True)):
        ix = faiss_index(xb, metric, m, refine)
        path = os.path.join(tmp, name + ".faiss")
        faiss.write_index(ix, path)
        files[name] = (path, ix)
    envs = (("auto", {}), ("scalar", {"TSR_SIMD": "scalar"}),
            ("nofilter", {"TSR_SEARCH_FILTER": "0"}))
    for name, (path, ix) in sorted(files.items()):
        variants = [((), "")] + ([(("--no-refine",), "-norefine")] if name.startswith("qr") else [])
        for nprobe in (1, 4, 32):
            for k in (1, 10):
                for extra, sfx in variants:
                    for ename, env in envs:
                        ip_ = os.path.join(tmp, "I.ivecs")
                        dp_ = os.path.join(tmp, "D.fvecs")
                        cmd = [os.path.join(BIN, "tessera"), "index", "search", "--index", path,
                               "--queries", qp, "--k", str(k), "--nprobe", str(nprobe),
                               "--out", ip_, "--distances", dp_] + list(extra)
                        e = dict(os.environ)
                        e.update(env)
                        # the knobs exist in the test build only (docs/testing.md)
                        subprocess.run(H.test_argv(cmd, env), check=True, env=e,
                                       stdout=subprocess.DEVNULL)
                        key = "cli/%s%s/np%d/k%d/%s" % (name, sfx, nprobe, k, ename)
                        out[key] = open(ip_, "rb").read() + open(dp_, "rb").read()
        # search_preassigned: shuffled lists, some missing, perturbed coarse distances
        rng = np.random.default_rng(3)
        Dq, Iq = ix.quantizer.search(xq, 8)
        for i in range(NQ):
            p = rng.permutation(8)
            Iq[i], Dq[i] = Iq[i][p], Dq[i][p]
        Iq[::3, 2] = -1
        Dq = Dq * np.float32(1.001)
        lp, cp = os.path.join(tmp, "L.ivecs"), os.path.join(tmp, "C.fvecs")
        write_ivecs(lp, Iq)
        write_fvecs(cp, Dq)
        ip_, dp_ = os.path.join(tmp, "I.ivecs"), os.path.join(tmp, "D.fvecs")
        subprocess.run([os.path.join(BIN, "tessera"), "index", "search", "--index", path,
                        "--queries", qp, "--k", "10", "--lists", lp, "--coarse-dis", cp,
                        "--out", ip_, "--distances", dp_], check=True, stdout=subprocess.DEVNULL)
        out["cli/%s/preassigned" % name] = open(ip_, "rb").read() + open(dp_, "rb").read()


def shard_cases(xb, xq, out):
    sp, _, tp, _, _ = H.stubs()
    for metric, m in (("L2", 8), ("IP", 8), ("L2", 32)):
        ix, tmpl = H.template_bytes(xb[:4000], NLIST, m, metric=metric, seed=9)
        _, assign = ix.quantizer.search(xb, 1)
        assign = assign[:, 0]
        ups = [sp.StagedUpsert(label=int(i * 7 + 3), list=int(assign[i]),
                               datapoint=H.datapoint(tp, "id%d" % i, xb[i],
                                                     restricts=[("c", ["c%d" % (i % 5)], [])],
                                                     tag="t%d" % (i % 11)))
               for i in range(N)]
        shard = H.Shard(H.tmpdir())
        try:
            H.load(shard, 1, 0, ups, template=tmpl, chunk=3000)
            for nprobe in (1, 4, 16):
                Dq, Iq = ix.quantizer.search(xq, nprobe)
                for k, cand, crowd, restr in ((1, 0, 0, None), (10, 0, 0, None),
                                              (10, 0, 0, ("c", ["c1", "c3"], [])),
                                              (10, 0, 0, ("c", [], ["c2"])),
                                              (10, 0, 2, None), (10, 50, 0, None),
                                              (10, 50, 2, ("c", ["c0", "c4"], []))):
                    rq = sp.ShardSearchRequest()
                    for qi in range(NQ):
                        q = rq.queries.add(version=1, k=k, candidates=cand, crowding_limit=crowd)
                        q.vector.extend(xq[qi].tolist())
                        q.lists.extend(int(x) for x in Iq[qi])
                        q.coarse_distances.extend(float(x) for x in Dq[qi])
                        if restr:
                            q.restricts.add(namespace=restr[0], allow_list=restr[1],
                                            deny_list=restr[2])
                    resp = shard.stub.Search(rq, timeout=60)
                    b = b""
                    for r in resp.results:
                        b += struct.pack("<%dq" % len(r.labels), *r.labels)
                        b += struct.pack("<%df" % len(r.distances), *r.distances) + b"|"
                    key = "shard/%s_m%d/np%d/k%d/cand%d/crowd%d/%s" % (
                        metric, m, nprobe, k, cand, crowd,
                        "-".join(restr[1] + ["!" + x for x in restr[2]]) if restr else "all")
                    out[key] = b
        finally:
            shard.stop()


def main():
    args = sys.argv[1:]
    mode, path, dump = "check", os.path.join(HERE, "search_answers.json"), None
    while args:
        a = args.pop(0)
        if a in ("--record", "--check"):
            mode, path = a[2:], args.pop(0)
        elif a == "--dump":
            dump = args.pop(0)
        else:
            sys.exit(__doc__)
    xb, xq = data()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cli_cases(tmp, xb, xq, out)
    shard_cases(xb, xq, out)
    dig = {k: hashlib.sha256(v).hexdigest() for k, v in sorted(out.items())}
    if dump:
        with open(dump, "w") as f:
            for k, v in sorted(out.items()):
                f.write("%s %s\n" % (k, v.hex()))
    if mode == "record":
        with open(path, "w") as f:
            json.dump(dig, f, indent=0, sort_keys=True)
            f.write("\n")
        print("search_answers: recorded %d answers in %s" % (len(dig), path))
        return 0
    want = json.load(open(path))
    bad = [k for k in sorted(set(want) | set(dig)) if want.get(k) != dig.get(k)]
    for k in bad:
        print("DIFFERS: %s" % k)
    print("search_answers: %d answers, %d differ" % (len(dig), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
