"""Issue 16, acceptance 2 (docs/ha.md): kill -9 of the leader at each step of an update —
staged, prepared, just after the etcd commit (flipped), committed — with etcd x3,
coordinators x2 (--etcd, TTL 2 s) and 2 shard groups x 2 replicas.

Each step is hit exactly with the coordinator's crash hook: the leader runs with
TSR_COORD_CRASH_AT=STEP and _exit(137)s there (the same as a kill -9 at that instant: no
handler runs). For each step:
- the other coordinator becomes the leader and settles the update by the version etcd
  holds;
- `tessera update --target LEADER,OTHER`, started before the crash, reports the outcome:
  FAILED "interrupted" with etcd's version unchanged when the crash came before the etcd
  commit (staged, prepared), SUCCEEDED with the new version after it (flipped, committed);
- every shard of every group ends on exactly the version etcd holds (PREFIX/version), and
  both coordinators serve it.
Exit 77 only when etcd is not installed.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
N = 1200
TTL = 2
STEPS = [("staged", False), ("prepared", False), ("flipped", True), ("committed", True)]


def tessera(*args, timeout=240):
    r = subprocess.run([os.path.join(ch.BIN, "tessera")] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


problems = []  # every step runs; the test fails at the end naming each failed check


def expect(cond, what):
    if not cond:
        problems.append(what)
        print("FAIL: " + what)
    return cond


def settled(cl, want, timeout=30):
    """Waits until every shard and both coordinators are on version want."""
    t_end = time.time() + timeout
    while True:
        vs = cl.shard_versions()
        cs = {}
        for c in cl.coords:
            try:
                cs[c.target] = c.stats().version
            except Exception as e:
                cs[c.target] = str(e).splitlines()[0][:60]
        if set(vs.values()) == {want} and set(cs.values()) == {want}:
            return vs
        if time.time() > t_end:
            raise AssertionError("not settled on version %d after %ds: shards %s, "
                                 "coordinators %s\n%s" % (want, timeout, vs, cs, cl.logs()))
        time.sleep(0.2)


def main():
    eh.skip_without_etcd()
    rng = np.random.default_rng(12)
    root = sh.tmpdir("tsr-ha-kill-")
    batches = []
    for b in range(len(STEPS) + 1):
        x = rng.normal(size=(N, D)).astype("float32")
        batches.append(ch.write_batch(os.path.join(root, "b%d" % b),
                                      [ch.dp_json("k%d-%05d" % (b, i), x[i])
                                       for i in range(N)]))
    cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=TTL,
                      config={"nlist": 8, "pq_m": 4, "nprobe": 4})
    try:
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", batches[0])
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, cl.logs())
        version = 1
        for k, (step, after_commit) in enumerate(STEPS):
            # the crashing coordinator must be the leader: stop both, start it alone
            a, b = cl.coords[k % 2], cl.coords[(k + 1) % 2]
            for c in (a, b):
                c.stop()
            a.start(env={"TSR_COORD_CRASH_AT": step})
            assert cl.leader(timeout=TTL + 15) is a
            b.start()
            t0 = time.time()
            rc, out, err = tessera("update", "--target", a.target + "," + b.target,
                                   "--batch-root", batches[k + 1], "--timeout-s", "40")
            a.proc.proc.wait(30)
            assert a.proc.proc.returncode == 137, (step, a.proc.proc.returncode, a.proc.text())
            held = cl.etcd.committed_version(cl.prefix)
            first = (out.splitlines() or err.strip().splitlines() or [""])[-1 if not out else 0]
            if after_commit:
                expect(held == version + 1, "%s: etcd holds %s, want %d" % (step, held,
                                                                           version + 1))
                expect(rc == 0 and "SUCCEEDED, version %d" % (version + 1) in out,
                       "%s: tessera update said %r, want SUCCEEDED" % (step, first))
            else:
                expect(held == version, "%s: etcd holds %s, want %d" % (step, held, version))
                expect(rc == 1 and "FAILED" in out and "interrupted" in out,
                       "%s: tessera update said %r, want FAILED interrupted" % (step, first))
            version = held if held else version
            expect("answered by %s" % b.target in err, "%s: no failover said: %s" % (step, err))
            a.start()  # back, without the hook
            vs = settled(cl, held)
            print("kill at %-9s: tessera update said %r after %.1fs; etcd holds %d; "
                  "%d shards on it" % (step, first, time.time() - t0, held, len(vs)))
        # the cluster still takes updates
        rc, out, err = tessera("update", "--target", cl.targets, "--batch-root", batches[1])
        expect(rc == 0 and "SUCCEEDED" in out, "a last update: %s" % (out + err)[:300])
        held = cl.etcd.committed_version(cl.prefix)
        settled(cl, held)
        print("a last update: %s" % out.splitlines()[0])
    finally:
        for s in cl.shards:
            s.proc.send_signal(signal.SIGCONT)
        cl.stop()
    assert not problems, "%d problem(s):\n  %s" % (len(problems), "\n  ".join(problems))
    print("test_ha_update_kill: OK")


if __name__ == "__main__":
    main()
