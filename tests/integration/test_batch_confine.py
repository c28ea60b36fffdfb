"""Confined batch roots (issue 14, "what must be true" 4).

A coordinator with --batch-root-allow ALLOWED (and an operator token) in front of 2 shards.
UpdateIndex with each of these batch roots answers PERMISSION_DENIED, and the message names
the allowed folder but no entry of the refused folder:
- /etc;
- ALLOWED/../.. (".." leads out);
- ALLOWED/link -> a folder outside that holds a batch (a symlinked root pointing out);
- ALLOWED/b2 whose evil.csv -> a file outside (a symlinked file pointing out);
- ALLOWED/b3 whose delete -> a folder outside (a symlinked delete/ folder);
- a missing path outside (no probing of what exists elsewhere).
A root inside (a real folder, and a symlink inside ALLOWED to a folder inside it) is
accepted and loads. A coordinator without --batch-root-allow refuses every root and names
the flag to set.
"""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 8
TOKEN = "admin-" + os.urandom(16).hex()


def main():
    tp = ch.stubs()[0]
    root = sh.tmpdir("tsr-confine-")
    allowed = os.path.join(root, "allowed")
    outside = os.path.join(root, "outside")
    os.makedirs(allowed)
    os.makedirs(outside)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, D)).astype("float32")
    recs = [ch.dp_json("d%04d" % i, x[i]) for i in range(len(x))]
    # outside: a batch whose entry names must never show up in an answer
    secret = ch.write_batch(os.path.join(outside, "secret-batch"), recs)
    with open(os.path.join(outside, "secret-entry.csv"), "w") as f:
        f.write("s1,1,2,3,4,5,6,7,8\n")
    os.makedirs(os.path.join(outside, "secret-deletes"))
    with open(os.path.join(outside, "secret-deletes", "secret-ids"), "w") as f:
        f.write("d0001\n")
    inside = ch.write_batch(os.path.join(allowed, "good"), recs)
    os.symlink(secret, os.path.join(allowed, "link"))
    b2 = ch.write_batch(os.path.join(allowed, "b2"), recs[:10])
    os.symlink(os.path.join(outside, "secret-entry.csv"), os.path.join(b2, "evil.csv"))
    b3 = ch.write_batch(os.path.join(allowed, "b3"), recs[:10])
    os.symlink(os.path.join(outside, "secret-deletes"), os.path.join(b3, "delete"))
    os.symlink(inside, os.path.join(allowed, "alias"))  # a symlink that stays inside

    tokens = os.path.join(root, "tokens")
    with open(tokens, "w") as f:
        f.write("admin %s\n" % TOKEN)
    md = [("authorization", "Bearer " + TOKEN)]
    real_allowed = os.path.realpath(allowed)
    cl = ch.Cluster(2, D, {"nlist": 4, "pq_m": 4, "nprobe": 4})
    try:
        # the harness allows the temp folder: restart with ALLOWED only
        cl.stop_coord()
        start_only(cl, ["--batch-root-allow", allowed, "--auth-tokens", tokens])
        refused = [("/etc", "/etc"),
                   (os.path.join(allowed, "..", ".."), "allowed/../.."),
                   (os.path.join(allowed, "link"), "symlinked root pointing out"),
                   (b2, "symlinked file pointing out"),
                   (b3, "symlinked delete/ pointing out"),
                   (os.path.join(outside, "missing"), "missing path outside"),
                   ("relative/path", "relative path")]
        etc = set(os.listdir("/etc"))
        for path, what in refused:
            try:
                cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=path), metadata=md,
                                    timeout=30)
                raise AssertionError("%s accepted" % what)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.PERMISSION_DENIED, (what, e.code(),
                                                                       e.details())
                msg = e.details()
            assert real_allowed in msg, (what, msg)
            for bad in ("secret", outside) + tuple(n for n in etc if len(n) > 3):
                assert bad not in msg.replace(real_allowed, ""), (what, bad, msg)
            print("refused (%s): %s" % (what, msg))
        for path in (inside, os.path.join(allowed, "alias")):
            op = cl.update(path, md=md)
            assert op.state == tp.Operation.SUCCEEDED, op
        print("accepted: a root inside and a symlink inside pointing inside")
        # no flag: every root refused, naming the flag
        cl.stop_coord()
        start_only(cl, ["--auth-tokens", tokens])
        try:
            cl.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=inside), metadata=md,
                                timeout=30)
            raise AssertionError("accepted without --batch-root-allow")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "--batch-root-allow" in \
                e.details(), e
            print("without --batch-root-allow: %s" % e.details())
    finally:
        cl.stop()
    print("test_batch_confine: OK")
    return 0


def start_only(cl, args):
    """Starts the coordinator with exactly these security flags (not the harness's)."""
    import coord_harness
    saved = coord_harness.batch_allow_args
    coord_harness.batch_allow_args = lambda *a: []
    try:
        cl.start(extra_args=args)
    finally:
        coord_harness.batch_allow_args = saved


if __name__ == "__main__":
    sys.exit(main())
