"""Issue 16, acceptance 3 (docs/ha.md): the leader cut off by the network during an update.

Simulated hosts (netns.py, one bridge): coordinators on hosts 0 and 1, one etcd member and
one shard replica on each of hosts 2, 3, 4 (2 shard groups: [h2, h3] and [h4, h3'] — the
shard on h3 serves group 0, a second one on h3 group 1), the client (bin/tessera, etcdctl)
on host 5. Lease TTL 2 s.

For each of two rounds: an update is started through `tessera update --target A,B`, and
0.4 s (round 1: the batch is being read) or 1.2 s (round 2: staging) later the leader's
link is cut (packets dropped, no reset: a pulled cable). The
other coordinator must become the leader, the update must end (SUCCEEDED, or FAILED
"interrupted" with nothing changed), the next update must succeed on the new leader; then
the link is healed and the old leader must come back as a follower.

Then the history check (no sleep decides anything): every value PREFIX/version ever had,
read from etcd's revisions (`etcdctl watch --rev 1`): the version numbers only increase,
no number is ever committed with two different contents, and every shard ends on exactly
the version etcd holds (and the old leader serves it too).
Exit 77 when etcd is not installed or the namespaces cannot be made (not root).
"""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import netns  # noqa: E402
import shard_harness as sh  # noqa: E402

D, N, TTL = 16, 30000, 2
PREFIX = "/tessera/netcut"
CLIENT = 5


def main():
    eh.skip_without_etcd()
    netns.skip_unless_available()
    rng = np.random.default_rng(33)
    root = sh.tmpdir("tsr-ha-netcut-")
    os.chmod(root, 0o755)
    batches = []
    for b in range(5):
        x = rng.normal(size=(N if b == 0 else N // 2, D)).astype("float32")
        batches.append(ch.write_batch(os.path.join(root, "b%d" % b),
                                      [ch.dp_json("n%d-%05d" % (b, i), x[i])
                                       for i in range(len(x))]))
    tsr = lambda *a: [os.path.join(ch.BIN, "tessera")] + list(a)  # noqa: E731
    with netns.Net(6) as net:
        A = lambda i: net.addr(i)  # noqa: E731
        cluster = ",".join("e%d=http://%s:2380" % (i, A(i)) for i in (2, 3, 4))
        endpoints = ",".join("%s:2379" % A(i) for i in (2, 3, 4))
        logs = {}

        def start(host, name, argv):
            f = open(os.path.join(root, name + ".log"), "a")
            logs[name] = os.path.join(root, name + ".log")
            p = net.popen(host, argv, stdout=f, stderr=f)
            f.close()
            return p

        for i in (2, 3, 4):
            start(i, "etcd-%d" % i, [eh.etcd_bin(), "--name", "e%d" % i, "--data-dir",
                                     os.path.join(root, "etcd-%d" % i),
                                     "--listen-client-urls", "http://%s:2379" % A(i),
                                     "--advertise-client-urls", "http://%s:2379" % A(i),
                                     "--listen-peer-urls", "http://%s:2380" % A(i),
                                     "--initial-advertise-peer-urls", "http://%s:2380" % A(i),
                                     "--initial-cluster", cluster, "--heartbeat-interval",
                                     "50", "--election-timeout", "500"])
        shards = [(2, 7101), (3, 7101), (4, 7102), (3, 7102)]
        for h, port in shards:
            start(h, "shard-%d-%d" % (h, port),
                  [os.path.join(ch.BIN, "tessera-shard"), "--listen", "%s:%d" % (A(h), port),
                   "--data", os.path.join(root, "shard-%d-%d" % (h, port)),
                   "--insecure-no-auth"])
        cfg = {"dimensions": D, "nlist": 16, "pq_m": 4, "nprobe": 4,
               "shards": [["%s:%d" % (A(h), p) for h, p in shards[:2]],
                          ["%s:%d" % (A(h), p) for h, p in shards[2:]]]}
        with open(os.path.join(root, "coordinator.json"), "w") as f:
            json.dump(cfg, f)
        coords = {}

        def start_coord(i):
            coords[i] = start(i, "coordinator-%d" % i, [
                os.path.join(ch.BIN, "tessera-coordinator"), "--listen", "%s:7000" % A(i),
                "--data", os.path.join(root, "coordinator-%d" % i), "--config",
                os.path.join(root, "coordinator.json"), "--etcd", endpoints, "--etcd-prefix",
                PREFIX, "--etcd-ttl", str(TTL), "--insecure-no-auth", "--batch-root-allow",
                root])

        targets = "%s:7000,%s:7000" % (A(0), A(1))

        def run(argv, timeout=120):
            return net.run(CLIENT, argv, timeout=timeout)

        def stats(i):
            r = run(tsr("stats", "--target", "%s:7000" % A(i), "--json"), 20)
            return json.loads(r.stdout) if r.returncode == 0 else None

        def leader(timeout=30, not_host=None):
            t_end = time.time() + timeout
            while time.time() < t_end:
                for i in (0, 1):
                    if i == not_host:
                        continue
                    s = stats(i)
                    if s and s.get("leader") == "%s:7000" % A(i):
                        return i
                time.sleep(0.2)
            raise AssertionError("no leader after %ds\n%s" % (timeout, tail_logs()))

        def tail_logs():
            out = []
            for n, p in sorted(logs.items()):
                if n.startswith("coordinator"):
                    with open(p) as f:
                        out.append("--- %s\n%s" % (n, "".join(f.readlines()[-15:])))
            return "\n".join(out)

        def update(b, timeout_s=120):
            r = run(tsr("update", "--target", targets, "--batch-root", batches[b],
                        "--timeout-s", str(timeout_s)), timeout_s + 60)
            return r.returncode, r.stdout, r.stderr

        # etcd up, then the first version
        t_end = time.time() + 60
        while run(["etcdctl", "--endpoints", endpoints, "endpoint", "health"],
                  20).returncode != 0:
            assert time.time() < t_end, "etcd not healthy"
            time.sleep(0.5)
        for i in (0, 1):  # a coordinator with --etcd needs etcd at start
            start_coord(i)
        leader()
        rc, out, err = update(0)
        assert rc == 0 and "SUCCEEDED, version 1" in out, (rc, out, err, tail_logs())
        outcomes = []
        committed = 1
        for rnd, (b, delay) in enumerate(((1, 0.4), (3, 1.2))):
            lead = leader()
            other = 1 - lead
            p = net.popen(CLIENT, tsr("update", "--target", targets, "--batch-root",
                                      batches[b], "--timeout-s", "120"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(delay)  # round 1: while the batch is read; round 2: while staging
            t_cut = time.time()
            net.cut(lead)
            new = leader(timeout=TTL * 5 + 10, not_host=lead)
            took = time.time() - t_cut
            out, err = p.communicate(timeout=200)
            first = (out.strip().splitlines() or [err.strip()])[0]
            assert p.returncode in (0, 1) and ("SUCCEEDED" in out or (
                "FAILED" in out and "interrupted" in out)), (p.returncode, out, err,
                                                              tail_logs())
            committed += "SUCCEEDED" in out
            rc, out2, err2 = update(b + 1)
            committed += rc == 0
            assert rc == 0 and "SUCCEEDED" in out2, (rc, out2, err2, tail_logs())
            net.heal(lead)
            outcomes.append("round %d: leader host %d cut %.1fs into an update -> %r; host %d "
                            "leader after %.1fs; next update %r" %
                            (rnd + 1, lead, delay, first, new, took, out2.splitlines()[0]))
            print(outcomes[-1])
            # the healed one comes back as a follower
            t_end = time.time() + 30
            while True:
                s = stats(lead)
                if s and s.get("leader") == "%s:7000" % A(new):
                    break
                assert time.time() < t_end, ("healed coordinator does not follow", s,
                                             tail_logs())
                time.sleep(0.3)

        # the history of PREFIX/version, from etcd's revisions: `etcdctl watch --rev 1`
        # replays every change and then waits; the timeout ends it with what it printed
        try:
            r = run(["etcdctl", "--endpoints", endpoints, "-w", "json", "watch", "--rev", "1",
                     PREFIX + "/version"], 8)
            text = r.stdout
        except subprocess.TimeoutExpired as e:
            text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        import base64
        history = []
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            for ev in json.loads(line).get("Events") or []:
                kv = ev["kv"]
                val = base64.b64decode(kv.get("value", "")).decode()
                m = re.search(r"^version (\d+)$", val, re.M)
                history.append((int(kv["mod_revision"]), int(m.group(1)) if m else None, val))
        history.sort()
        nums = [h[1] for h in history]
        assert len(history) == committed and None not in nums, ("history", committed, history)
        assert all(a < b for a, b in zip(nums, nums[1:])), "versions not increasing: %s" % nums
        contents = {}
        for _, v, val in history:
            contents.setdefault(v, set()).add(val)
        assert all(len(c) == 1 for c in contents.values()), "a version committed twice"
        held = nums[-1]
        for i in (0, 1):
            t_end = time.time() + 30
            while True:
                st = stats(i)
                vs = {x["version"] for x in st["shards"]} if st else None
                if st and st["version"] == held and vs == {held}:
                    break
                assert time.time() < t_end, ("host %d: %s, etcd holds %d" % (i, st, held))
                time.sleep(0.3)
        print("history: PREFIX/version took %s over %d revisions (increasing, one content "
              "each); both coordinators and every shard on version %d" %
              (nums, len(history), held))
    print("test_ha_netcut: OK")

if __name__ == "__main__":
    main()
