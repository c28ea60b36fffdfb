"""test_build_faiss -- `tessera index build` against stock Faiss 1.7.3.

For L2 and IP, with and without residuals, on clustered synthetic data (30k x 32,
nlist 100, PQ 8 x 8 bits; plus one 6-bit run):
  * the file loads with faiss.read_index and its ntotal / nlist / metric / by_residual /
    PQ shape are what was asked for, every vector is in the list of its nearest centroid;
  * Faiss's search on it equals `tessera index search` (same labels in the same order for
    >= 99% of 1000 queries at k = 10, distances within 1e-4 relative);
  * recall 10@10 at nprobe 16 is not below that of an index Faiss trains on the same
    data with the same parameters by more than 0.01.
Env: TSR_BIN (directory of the tessera binary).
"""
import os
import subprocess
import sys
import tempfile

import faiss
import numpy as np

TSR = os.path.join(os.environ.get("TSR_BIN", "bin"), "tessera")
N, D, NLIST, M = 30000, 32, 100, 8
NQ, K, NPROBE = 1000, 10, 16


def write_fvecs(path, a):
    n, d = a.shape
    b = np.empty((n, d + 1), dtype=np.float32)
    b[:, 0] = np.array([d], dtype=np.int32).view(np.float32)[0]
    b[:, 1:] = a
    b.tofile(path)


def read_vecs(path, dtype):
    a = np.fromfile(path, dtype=np.int32)
    if a.size == 0:
        return np.zeros((0, 0), dtype=dtype)
    d = a[0]
    return a.reshape(-1, d + 1)[:, 1:].copy().view(dtype)


def clustered(rng, n, d, nc):
    centers = rng.normal(size=(nc, d)).astype(np.float32) * 2.0
    lab = rng.integers(0, nc, n)
    return (centers[lab] + rng.normal(size=(n, d)).astype(np.float32)).astype(np.float32)


def recall(I, G):
    return float(np.mean([len(set(I[i]) & set(G[i])) / K for i in range(len(G))]))


def check_batch(tmp, failures):
    """--batch-root: dense records in id order get labels 0..n-1, ids in F.faiss.ids."""
    import json
    rng = np.random.default_rng(7)
    n, d = 3000, 16
    x = clustered(rng, n, d, 30)
    root = os.path.join(tmp, "batch")
    os.makedirs(os.path.join(root, "delete"))
    ids = ["id-%d" % i for i in range(n)]
    ids[5] = "odd\\id\nwith newline"
    order = rng.permutation(n)
    with open(os.path.join(root, "a.json"), "w") as fa, \
            open(os.path.join(root, "b.json"), "w") as fb:
        for j, i in enumerate(order):
            rec = {"id": ids[i], "embedding": [float(v) for v in x[i]]}
            (fa if j % 2 else fb).write(json.dumps(rec) + "\n")
        fb.write(json.dumps({"id": "sparse-only", "sparse_embedding":
                             {"values": [1.0], "dimensions": [3]}}) + "\n")
    with open(os.path.join(root, "delete", "d.txt"), "w") as f:
        f.write("never-existed\n")
    out = os.path.join(tmp, "b.faiss")
    r = subprocess.run([TSR, "index", "build", "--batch-root", root, "--dimensions", str(d),
                        "--nlist", "20", "--pq-m", "4", "--out", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append("batch build failed (%d): %s" % (r.returncode, r.stderr))
        return
    ix = faiss.read_index(out)
    if ix.ntotal != n:
        failures.append("batch build: ntotal %d, expected %d dense records" % (ix.ntotal, n))
        return
    with open(out + ".ids", "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    if lines[-1] != "":
        failures.append("batch build: id map does not end with a newline")
    # escapes: \\ -> \, \n -> newline, \r -> carriage return (left to right)
    def unescape(s):
        o, i = [], 0
        while i < len(s):
            if s[i] == "\\" and i + 1 < len(s):
                o.append({"\\": "\\", "n": "\n", "r": "\r"}[s[i + 1]])
                i += 2
            else:
                o.append(s[i])
                i += 1
        return "".join(o)
    got = [unescape(s) for s in lines[:-1]]
    want = sorted(ids, key=lambda s: s.encode("utf-8"))
    if got != want:
        failures.append("batch build: id map is not the dense ids in bytewise id order")
        return
    # label l must hold the vector of id got[l]: it sits in that vector's nearest list
    pos = {s: i for i, s in enumerate(ids)}
    ivf = faiss.downcast_index(ix)
    _, a = ivf.quantizer.search(x, 1)
    bad = 0
    for l in range(ivf.nlist):
        sz = ivf.invlists.list_size(l)
        if sz:
            for lab in faiss.rev_swig_ptr(ivf.invlists.get_ids(l), sz):
                bad += a[pos[got[int(lab)]], 0] != l
    if bad > 2:
        failures.append("batch build: %d labels are not in the list of their id's vector" % bad)
    print("batch build: %d labels, id map in id order, list assignment consistent (%d off)" %
          (n, bad))
    r = subprocess.run([TSR, "index", "build", "--batch-root", root, "--nlist", "20",
                        "--pq-m", "4", "--out", out], capture_output=True)
    if r.returncode != 2:
        failures.append("--batch-root without --dimensions: exit %d, expected 2" % r.returncode)
    r = subprocess.run([TSR, "index", "build", "--batch-root", root, "--dimensions", "17",
                        "--nlist", "20", "--pq-m", "1", "--out", out], capture_output=True)
    if r.returncode != 1:
        failures.append("batch with the wrong dimension: exit %d, expected 1" % r.returncode)


def main():
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(20261201)
    x = clustered(rng, N, D, 300)
    q = (x[rng.integers(0, N, NQ)] + 0.7 * rng.normal(size=(NQ, D))).astype(np.float32)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        xf = os.path.join(tmp, "x.fvecs")
        qf = os.path.join(tmp, "q.fvecs")
        write_fvecs(xf, x)
        write_fvecs(qf, q)
        # (metric, by_residual, nbits, compare recall with a Faiss-trained index): Faiss's
        # own training is the slow part of this test, so it runs for three variants only
        configs = [("l2", 1, 8, True), ("ip", 1, 8, True), ("l2", 0, 8, True),
                   ("ip", 0, 8, False), ("l2", 1, 6, False)]
        for metric, res, nbits, vs_faiss in configs:
            name = "%s %s nbits=%d" % (metric, "residual" if res else "no-residual", nbits)
            out = os.path.join(tmp, "t.faiss")
            cmd = [TSR, "index", "build", "--fvecs", xf, "--nlist", str(NLIST), "--pq-m",
                   str(M), "--pq-nbits", str(nbits), "--metric", metric, "--out", out]
            if not res:
                cmd.append("--no-residual")
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("%s: build failed (%d): %s" % (name, r.returncode, r.stderr))
                continue
            print(name, "|", r.stderr.strip().split(": ", 2)[-1])
            if metric == "l2" and res and nbits == 8:
                # same file for another thread count
                out2 = os.path.join(tmp, "t2.faiss")
                r2 = subprocess.run(cmd[:-1] + [out2, "--threads", "2"], capture_output=True)
                if r2.returncode != 0 or open(out, "rb").read() != open(out2, "rb").read():
                    failures.append("%s: --threads 2 does not give the same file" % name)
            ix = faiss.read_index(out)
            mt = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
            ivf = faiss.downcast_index(ix)
            shape = (ix.ntotal, ivf.nlist, ix.metric_type, bool(ivf.by_residual), ivf.pq.M,
                     ivf.pq.nbits, ix.d)
            want = (N, NLIST, mt, bool(res), M, nbits, D)
            if shape != want:
                failures.append("%s: faiss sees %r, expected %r" % (name, shape, want))
                continue
            # every vector sits in the list of its nearest coarse centroid
            _, a = ivf.quantizer.search(x[:2000], 1)
            invl = ivf.invlists
            where = {}
            for l in range(NLIST):
                sz = invl.list_size(l)
                if sz:
                    ids = faiss.rev_swig_ptr(invl.get_ids(l), sz)
                    for i in ids[ids < 2000]:
                        where[int(i)] = l
            bad = sum(1 for i in range(2000) if where.get(i) != a[i, 0])
            if bad > 2:  # exact near-ties may round either way
                failures.append("%s: %d of 2000 vectors not in their nearest list" % (name, bad))

            flat = faiss.IndexFlatL2(D) if metric == "l2" else faiss.IndexFlatIP(D)
            flat.add(x)
            _, G = flat.search(q, K)
            ix.nprobe = NPROBE
            Df, If = ix.search(q, K)
            r_t = recall(If, G)
            print("   recall 10@10 nprobe %d: tessera-built %.4f" % (NPROBE, r_t))
            if r_t < 0.3:
                failures.append("%s: recall %.4f is implausibly low" % (name, r_t))

            if vs_faiss:
                qz = faiss.IndexFlatL2(D) if metric == "l2" else faiss.IndexFlatIP(D)
                ref = faiss.IndexIVFPQ(qz, D, NLIST, M, nbits, mt)
                ref.by_residual = bool(res)
                ref.train(x)
                ref.add(x)
                ref.nprobe = NPROBE
                _, Ir = ref.search(q, K)
                r_f = recall(Ir, G)
                print("   faiss-built %.4f" % r_f)
                if r_t < r_f - 0.01:
                    failures.append("%s: recall %.4f is more than 0.01 below Faiss's %.4f" %
                                    (name, r_t, r_f))

            io = os.path.join(tmp, "I.ivecs")
            do = os.path.join(tmp, "D.fvecs")
            r = subprocess.run([TSR, "index", "search", "--index", out, "--queries", qf, "--k",
                                str(K), "--nprobe", str(NPROBE), "--out", io, "--distances", do],
                               capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("%s: index search failed: %s" % (name, r.stderr))
                continue
            It = read_vecs(io, np.int32)
            Dt = read_vecs(do, np.float32)
            same = float(np.mean(np.all(It == If, axis=1)))
            rel = np.abs(Dt - Df) / np.maximum(np.abs(Df), 1e-6)
            ok_d = float(np.mean(rel <= 1e-4))
            print("   tessera search vs faiss search: %.1f%% identical rows, %.2f%% distances "
                  "within 1e-4" % (100 * same, 100 * ok_d))
            if same < 0.99:
                failures.append("%s: only %.1f%% of rows identical" % (name, 100 * same))
            if ok_d < 0.99:
                failures.append("%s: distances differ beyond 1e-4 relative in %.2f%% of "
                                "entries" % (name, 100 * (1 - ok_d)))
        check_batch(tmp, failures)
        # usage and input errors
        r = subprocess.run([TSR, "index", "build", "--fvecs", xf], capture_output=True)
        if r.returncode != 2:
            failures.append("missing options: exit %d, expected 2" % r.returncode)
        bad = os.path.join(tmp, "bad.fvecs")
        with open(bad, "wb") as f:
            f.write(b"\x05\x00\x00\x00abc")
        r = subprocess.run([TSR, "index", "build", "--fvecs", bad, "--nlist", "4", "--pq-m",
                            "1", "--out", os.path.join(tmp, "o.faiss")], capture_output=True)
        if r.returncode != 1:
            failures.append("bad fvecs: exit %d, expected 1" % r.returncode)
        r = subprocess.run([TSR, "index", "build", "--fvecs", xf, "--nlist", "100", "--pq-m",
                            "5", "--out", os.path.join(tmp, "o.faiss")], capture_output=True)
        if r.returncode != 1:
            failures.append("pq-m not dividing d: exit %d, expected 1" % r.returncode)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
