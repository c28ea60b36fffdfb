#!/usr/bin/env python3
"""test_cluster_up_auth -- `tessera cluster up --auth-tokens FILE` protects every port (issue
41, item 9: it protected the coordinator only; on the same host a call to a shard's port
without any token was answered: Shard.Read returned stored datapoints, Shard.Abort was
accepted).

  a. the first run makes DIR/peer-token, mode 0600;
  b. with python grpcio, Shard.Read and Shard.Abort on a shard's port without a token are
     refused with UNAUTHENTICATED, as is a wrong token; with DIR/peer-token they are
     answered (the token is the shards' real one); Health/Check stays open;
  c. the coordinator still works: an update and a query with the client token answer (it
     calls the shards with the peer token), a query without a token is UNAUTHENTICATED;
  d. a restart on the same --data keeps the same peer token and still queries.
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import shard_harness as sh  # noqa: E402
from test_cluster_up import Cluster, SHARDS, report, run  # noqa: E402
from shard_harness import free_range  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
ADMIN = "a-" + os.urandom(16).hex()


def shard_calls(port, token):
    """(Read code, Abort code) on a shard's port with token (None: no metadata)."""
    sp, spg, _, hp, hpg = sh.stubs()
    md = None if token is None else [("authorization", "Bearer " + token)]
    codes = []
    with grpc.insecure_channel("127.0.0.1:%d" % port) as chan:
        stub = spg.ShardStub(chan)
        for call in (lambda: stub.Read(sp.ShardReadRequest(version=1, labels=[0, 1, 2]),
                                       timeout=10, metadata=md),
                     lambda: stub.Abort(sp.AbortRequest(version=99), timeout=10, metadata=md)):
            try:
                call()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
        health = hpg.HealthStub(chan).Check(hp.HealthCheckRequest(service=""), timeout=10)
    return codes, health.status


def main():
    fails = []
    tmp = tempfile.mkdtemp(prefix="tsr-clusterup-auth-")
    data = os.path.join(tmp, "d")
    tokens = os.path.join(tmp, "tokens")
    token_file = os.path.join(tmp, "admin.token")
    with open(tokens, "w") as f:
        f.write("admin %s\n" % ADMIN)
    with open(token_file, "w") as f:
        f.write(ADMIN + "\n")
    port = free_range(SHARDS)
    target = "127.0.0.1:%d" % port
    c = None
    try:
        for attempt in (1, 2):
            c = Cluster(data, port, "--auth-tokens", tokens)
            if c.wait_line("coordinator listening", 90) is None:
                fails.append("run %d did not start:\n%s" % (attempt, "".join(c.lines)))
                return 1
            pt = os.path.join(data, "peer-token")
            if not os.path.isfile(pt):
                fails.append("a. no %s" % pt)
                return 1
            mode = stat.S_IMODE(os.stat(pt).st_mode)
            peer = open(pt).read().strip()
            print("a. run %d: %s mode %04o, %d characters" % (attempt, pt, mode, len(peer)))
            if mode != 0o600 or len(peer) < 32:
                fails.append("a. peer token mode %04o, %d characters" % (mode, len(peer)))
            if attempt == 1:
                first_peer = peer
                sample = os.path.join(data, "sample")
                subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests", "data",
                                                                 "gen_sample.py"),
                                os.path.join(sample, "batch"), "--n", "300", "--no-avro"],
                               check=True, capture_output=True)
                r = run(["update", "--target", target, "--token-file", token_file,
                         "--batch-root", os.path.join(sample, "batch")], timeout=120)
                if r.returncode != 0:
                    fails.append("c. update with the token: exit %d %s" % (r.returncode, r.stderr))
                q = open(os.path.join(sample, "query.txt")).read().strip()
            elif peer != first_peer:
                fails.append("d. the restart made another peer token")
            r = run(["query", "--target", target, "--token-file", token_file, "--vector", q,
                     "--k", "3"])
            hits = [l for l in r.stdout.splitlines() if "dp-" in l]
            print("c. run %d: query with the token: exit %d, %d hits" % (attempt, r.returncode,
                                                                          len(hits)))
            if r.returncode != 0 or len(hits) != 3:
                fails.append("c. run %d: query with the token: exit %d %s"
                             % (attempt, r.returncode, r.stderr))
            r = run(["query", "--target", target, "--vector", q, "--k", "3"])
            if r.returncode == 0 or "UNAUTHENTICATED" not in r.stderr:
                fails.append("c. query without a token: exit %d %s" % (r.returncode, r.stderr))
            for i in range(SHARDS):
                sport = port + 1 + i
                for name, tok, want in (("no token", None, grpc.StatusCode.UNAUTHENTICATED),
                                        ("a client token", ADMIN, grpc.StatusCode.UNAUTHENTICATED),
                                        ("the peer token", peer, grpc.StatusCode.OK)):
                    codes, health = shard_calls(sport, tok)
                    print("b. run %d: shard-%d with %s: Read %s, Abort %s, health %s"
                          % (attempt, i, name, codes[0].name, codes[1].name, health))
                    if codes != [want, want]:
                        fails.append("b. shard-%d with %s: Read %s, Abort %s, expected %s"
                                     % (i, name, codes[0].name, codes[1].name, want.name))
                    if health != 1:
                        fails.append("b. shard-%d health with %s: %s" % (i, name, health))
            c.stop()
            c = None
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report(fails)


if __name__ == "__main__":
    sys.exit(main())
