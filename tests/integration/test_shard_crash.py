"""kill -9 of tessera-shard during an update (issue 4, point 4).

Version 1 is committed. Then version 2 is staged / prepared / committed, and the shard
is killed with SIGKILL:
- between Stage chunks and while a Stage call is in flight -> the restarted shard serves
  version 1, holds no version 2, answers exactly as before;
- at several moments during Prepare -> it serves version 1; version 2 is either absent or
  complete and PREPARED (then Commit after the restart serves it);
- right after Commit returned -> it serves version 2.
After every restart: the MANIFEST of every version directory checks (sizes and CRC-32,
recomputed here independently, plus the MANIFEST's own checksum), no temporary
directory is left, CURRENT names a complete
version. Finally a corrupted current version is refused with a clear error and the shard
falls back to the previous good version.
"""
import os
import sys
import threading
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import shard_harness as H  # noqa: E402

sp, _, tp, _, _ = H.stubs()


def check_dir(data):
    """Independent check of the data dir (docs/storage.md format); returns the versions."""
    names = sorted(os.listdir(data))
    assert not [n for n in names if n.startswith(".tmp") or n.endswith(".tmp")], names
    vers = []
    for n in names:
        if not (n.startswith("v") and n[1:].isdigit()):
            continue
        vd = os.path.join(data, n)
        text = open(os.path.join(vd, "MANIFEST"), "rb").read()
        lines = text.decode().split("\n")
        assert lines[0] == "tessera-manifest 1" and lines[1] == "version " + n, lines[:2]
        last = [ln for ln in lines if ln.startswith("checksum crc32 ")]
        assert len(last) == 1, lines
        body = text[:text.index(b"checksum crc32 ")]
        assert zlib.crc32(body) == int(last[0].split()[2], 16), "MANIFEST checksum"
        files = set()
        for ln in lines[2:]:
            if not ln.startswith("file "):
                continue
            _, fname, size, algo, crc = ln.split()
            b = open(os.path.join(vd, fname), "rb").read()
            assert algo == "crc32" and len(b) == int(size) and zlib.crc32(b) == int(crc, 16), \
                (vd, fname)
            files.add(fname)
        assert files == {"slice.faiss", "meta", "vectors.f32"}, files
        assert set(os.listdir(vd)) == files | {"MANIFEST"}, os.listdir(vd)
        vers.append(int(n[1:]))
    cur = open(os.path.join(data, "CURRENT")).read()
    assert cur.endswith("\n") and int(cur.strip()[1:]) in vers, (cur, vers)
    return vers


def main():
    rng = np.random.default_rng(5)
    d, nlist, m = 64, 64, 16
    n1, n2 = 5000, 15000
    xt = rng.normal(size=(10000, d)).astype("float32")
    ix, tmpl = H.template_bytes(xt, nlist, m)
    x1 = rng.normal(size=(n1, d)).astype("float32")
    x2 = rng.normal(size=(n2, d)).astype("float32")
    _, a1 = ix.quantizer.search(x1, 1)
    _, a2 = ix.quantizer.search(x2, 1)
    ups1 = [sp.StagedUpsert(label=i, list=int(a1[i, 0]), datapoint=H.datapoint(tp, "a%d" % i, x1[i]))
            for i in range(n1)]
    # version 2: 15000 new labels, and 1000 deletes of version 1's
    ups2 = [sp.StagedUpsert(label=100000 + i, list=int(a2[i, 0]),
                            datapoint=H.datapoint(tp, "b%d" % i, x2[i])) for i in range(n2)]
    dels2 = [(i, int(a1[i, 0])) for i in range(1000)]

    xq = rng.normal(size=(20, d)).astype("float32")
    Dq, Iq = ix.quantizer.search(xq, 8)
    rq = sp.ShardSearchRequest()
    for i in range(20):
        q = rq.queries.add(k=10)
        q.vector.extend(xq[i].tolist())
        q.lists.extend(int(x) for x in Iq[i])
        q.coarse_distances.extend(float(x) for x in Dq[i])

    def answers(shard):
        return [list(r.labels) for r in shard.stub.Search(rq, timeout=20).results]

    data = H.tmpdir()
    shard = H.Shard(data)
    H.load(shard, 1, 0, ups1, template=tmpl, chunk=2500, own=list(range(nlist)))
    base = answers(shard)

    def restart(expect_version, expect_vectors):
        nonlocal shard
        shard = H.Shard(data)
        st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        assert st.current_version == expect_version, st
        assert st.vectors_count == expect_vectors, st
        check_dir(data)
        return st

    # 1. kill between Stage chunks, and 2. while a Stage call is in flight.
    H.stage_all(shard, 2, 1, ups2[:10000], deletes=dels2, chunk=5000)
    shard.kill()
    st = restart(1, n1)
    assert [v.version for v in st.versions] == [1], st.versions
    assert answers(shard) == base
    for delay in (0.0, 0.05, 0.2):
        t = threading.Thread(target=lambda: _swallow(lambda: H.stage_all(
            shard, 2, 1, ups2, deletes=dels2, chunk=n2)))
        t.start()
        time.sleep(delay)
        shard.kill()
        t.join()
        st = restart(1, n1)
        assert [v.version for v in st.versions] == [1], st.versions
        assert answers(shard) == base
    print("kill -9 during Stage: version 1 served, nothing of version 2 kept")

    # 3. kill during Prepare at several moments.
    outcomes = []
    for delay in (0.0, 0.1, 0.4, 0.8):
        H.stage_all(shard, 2, 1, ups2, deletes=dels2, chunk=10000)
        t = threading.Thread(target=lambda: _swallow(
            lambda: shard.stub.Prepare(sp.PrepareRequest(version=2), timeout=60)))
        t0 = time.time()
        t.start()
        time.sleep(delay)
        shard.kill()
        t.join()
        st = restart(1, n1)
        assert answers(shard) == base
        held = {v.version: v for v in st.versions}
        if 2 in held:
            assert held[2].state == sp.ShardVersion.PREPARED, held[2]
            assert held[2].vectors_count == n1 - 1000 + n2, held[2]
            outcomes.append("prepared")
            shard.stub.Abort(sp.AbortRequest(version=2), timeout=10)
            assert not os.path.exists(os.path.join(data, "v000002"))
        else:
            outcomes.append("absent")
        print("  kill at %.2fs into Prepare (%.2fs): version 2 %s" % (delay, time.time() - t0,
                                                                    outcomes[-1]))
    # A prepared version survives a restart and can then be committed.
    H.stage_all(shard, 2, 1, ups2, deletes=dels2, chunk=10000)
    assert shard.stub.Prepare(sp.PrepareRequest(version=2), timeout=60).ready
    shard.kill()
    st = restart(1, n1)
    assert {v.version: v.state for v in st.versions}[2] == sp.ShardVersion.PREPARED
    assert answers(shard) == base
    print("kill -9 during Prepare: %s; prepared version survives a restart" % outcomes)

    # 4. kill right after Commit returned.
    shard.stub.Commit(sp.CommitRequest(version=2), timeout=10)
    new = answers(shard)
    shard.kill()
    restart(2, n1 - 1000 + n2)
    assert answers(shard) == new
    assert all(lab >= 1000 for r in new for lab in r), "a deleted label came back"
    rd = shard.stub.Read(sp.ShardReadRequest(labels=[5, 2000, 100007]), timeout=10)
    assert [x.found for x in rd.datapoints] == [False, True, True]
    print("kill -9 right after Commit: version 2 served")

    # 5. corrupt the current version: refused, previous good version served.
    shard.stop()
    p = os.path.join(data, "v000002", "slice.faiss")
    b = bytearray(open(p, "rb").read())
    b[len(b) // 2] ^= 0xFF
    open(p, "wb").write(bytes(b))
    shard = H.Shard(data)
    st = shard.stub.Stats(sp.ShardStatsRequest(), timeout=10)
    assert st.current_version == 1 and st.vectors_count == n1, st
    assert answers(shard) == base
    log = "\n".join(shard.log)
    assert "version 2 (CURRENT) refused" in log and "MANIFEST says" in log, log
    print("corrupt current version refused:", [ln for ln in shard.log if "refused" in ln][0])
    # The data dir now says what is served, and version 2 can be built again.
    assert open(os.path.join(data, "CURRENT")).read() == "v000001\n"
    assert check_dir(data) == [1]
    H.load(shard, 2, 1, ups2[:100])
    assert shard.stub.Stats(sp.ShardStatsRequest(), timeout=10).vectors_count == n1 + 100
    shard.stop()
    print("ok")


def _swallow(fn):
    try:
        fn()
    except Exception:
        pass


if __name__ == "__main__":
    main()
