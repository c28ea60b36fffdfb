"""`tessera index search` on hostile index files: every prefix of a small valid file (every
byte offset for the header part, then a stride) and random byte flips must exit 0 or 1 with a
message — never a signal, never a hang — with the release binary and, when TSR_SAN_BIN is set,
with the ASan+UBSan one (a sanitizer report makes the process exit with a signal or code != 0/1)."""
import os
import random
import subprocess
import sys
import tempfile

import faiss
import numpy as np


def write_fvecs(path, x):
    n, d = x.shape
    out = np.empty((n, d + 1), dtype=np.float32)
    out[:, 0] = np.array([d], dtype=np.int32).view(np.float32)[0]
    out[:, 1:] = x
    out.tofile(path)


def main():
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(3)
    d, nlist = 8, 4
    xb = rng.standard_normal((300, d)).astype(np.float32)
    ix = faiss.IndexIVFPQ(faiss.IndexFlatL2(d), d, nlist, 4, 4)
    ix.train(xb)
    ix.add(xb)
    good = faiss.serialize_index(ix).tobytes()
    bins = [os.environ["TSR_BIN"]]
    if os.environ.get("TSR_SAN_BIN"):
        bins.append(os.environ["TSR_SAN_BIN"])
    rnd = random.Random(11)
    cases = [good[:n] for n in list(range(0, 120)) + list(range(120, len(good), 53))]
    for _ in range(100):
        b = bytearray(good)
        b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        cases.append(bytes(b))
    with tempfile.TemporaryDirectory() as tmp:
        q = os.path.join(tmp, "q.fvecs")
        write_fvecs(q, xb[:5])
        bad = os.path.join(tmp, "bad.faiss")
        for binp in bins:
            counts = {0: 0, 1: 0}
            for i, data in enumerate(cases):
                with open(bad, "wb") as f:
                    f.write(data)
                try:
                    r = subprocess.run([binp + "/tessera", "index", "search", "--index", bad,
                                        "--queries", q, "--k", "3", "--nprobe", "2",
                                        "--out", os.path.join(tmp, "o.ivecs")],
                                       capture_output=True, timeout=20)
                except subprocess.TimeoutExpired:
                    sys.exit("case %d: search hung (%s)" % (i, binp))
                if r.returncode not in (0, 1):
                    sys.exit("case %d: exit %d (%s)\n%s" % (i, r.returncode, binp, r.stderr.decode()[-2000:]))
                if r.returncode == 1 and not r.stderr.strip():
                    sys.exit("case %d: exit 1 without a message" % i)
                counts[r.returncode] += 1
            # the prefixes shorter than the file are all invalid
            assert counts[1] >= len(cases) - 100, counts
            print("%s: %d cases, %d rejected, %d accepted (flips of payload bytes)" %
                  (binp, len(cases), counts[1], counts[0]))


if __name__ == "__main__":
    main()
