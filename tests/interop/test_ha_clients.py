"""The stock-client snippets of docs/ha.md, read from that file and run as they are against
a real 2-coordinator cluster (etcd x3, TTL 2 s, 2 shard groups x 2 replicas):

- python grpcio (`coordinator_channel`): 2 threads of queries over the round-robin channel
  for 4 s while one coordinator (the follower, then, in the node part, the leader) is
  killed -9: 0 failed queries, the answers equal to a direct call's; an UpdateIndex through
  the same channel succeeds whichever coordinator round-robin picks first (a follower's
  UNAVAILABLE refusal is retried on the leader);
- node @grpc/grpc-js (`coordinatorClient`, tests/interop/node/ha_client.js): the same,
  killing the leader meanwhile: 0 failed queries, then an UpdateIndex through the client
  succeeds once the new leader is elected.
Exit 77 only when etcd is not installed.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import coord_harness as ch  # noqa: E402
import etcd_harness as eh  # noqa: E402
import shard_harness as sh  # noqa: E402

DOC = os.path.join(HERE, "..", "..", "docs", "ha.md")
NODE_DIR = os.path.join(HERE, "node")
D, N, TTL = 16, 1200, 2


def snippet(lang):
    with open(DOC) as f:
        text = f.read()
    m = re.search(r"<!-- snippet: %s -->\n```\w+\n(.*?)```\n<!-- end snippet -->" % lang, text,
                  re.S)
    assert m, "docs/ha.md has no %s snippet" % lang
    return m.group(1)


def python_part(cl, tp, xs, expect, b1):
    ns = {}
    exec(compile(snippet("python"), "docs/ha.md:python", "exec"), ns)
    channel = ns["coordinator_channel"]([c.target for c in cl.coords])
    stub = ch.stubs()[1].VectorSearchStub(channel)
    leader = cl.leader()
    follower = cl.follower(leader)
    stop = threading.Event()
    res = {"answered": 0, "failed": 0, "wrong": 0, "errors": []}
    lock = threading.Lock()

    def run(t):
        import grpc
        i = t
        while not stop.is_set():
            q = i % len(xs)
            i += 1
            try:
                r = stub.FindNeighbors(tp.FindNeighborsRequest(
                    queries=[ch.query(tp, xs[q], 10, fraction=1.0)]), timeout=5)
                got = [n.datapoint.datapoint_id for n in r.nearest_neighbors[0].neighbors]
                with lock:
                    res["answered"] += 1
                    res["wrong"] += got != expect[q]
            except grpc.RpcError as e:
                with lock:
                    res["failed"] += 1
                    res["errors"].append("%s: %s" % (e.code(), e.details()))

    ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    time.sleep(1.5)
    follower.kill()
    time.sleep(2.5)
    stop.set()
    for t in ts:
        t.join(30)
    print("python round-robin channel, follower killed -9 meanwhile: %(answered)d answered, "
          "%(failed)d failed, %(wrong)d wrong" % res)
    assert res["failed"] == 0 and res["wrong"] == 0, res["errors"][:5]
    follower.start()
    cl.wait_version(1)
    ups = []
    for _ in range(2):  # round-robin: one of the two starts on the follower
        r = stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b1), timeout=30)
        op = cl.leader().wait_op(r.operation_id)
        ups.append(tp.Operation.State.Name(op.state))
    assert ups == ["SUCCEEDED", "SUCCEEDED"], ups
    print("python: 2 UpdateIndex through the channel: %s" % ups)
    channel.close()


def node_part(cl, tp, xs, expect, b1, tmp):
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    sn = os.path.join(tmp, "snippet.js")
    with open(sn, "w") as f:
        f.write(snippet("node"))
    plan = os.path.join(tmp, "plan.json")
    queries = [{"datapoint": {"datapoint_id": "q", "feature_vector": [float(v) for v in x]},
                "neighbor_count": 10, "fraction_leaf_nodes_to_search_override": 1.0}
               for x in xs]
    with open(plan, "w") as f:
        json.dump({"queries": queries, "seconds": 6, "batch_root": b1}, f)
    env = dict(os.environ, NODE_PATH=os.path.join(NODE_DIR, "node_modules"))
    p = subprocess.Popen(["node", os.path.join(NODE_DIR, "ha_client.js"), sn,
                          cl.targets, plan], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    time.sleep(2.5)
    leader = cl.leader()
    leader.kill()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    got = json.loads(out)
    wrong = sum(got["first"][str(q)] != expect[q] for q in range(len(xs))
                if str(q) in got["first"])
    print("node round-robin client, leader killed -9 meanwhile: %d answered, %d failed, "
          "%d wrong; then UpdateIndex: %s" % (got["answered"], got["failed"], wrong,
                                               got.get("update")))
    assert got["failed"] == 0 and wrong == 0, got["errors"]
    assert "operation_id" in (got.get("update") or {}), got.get("update")
    op = cl.leader(exclude=(leader,)).wait_op(got["update"]["operation_id"])
    assert op.state == tp.Operation.SUCCEEDED, op


def main():
    eh.skip_without_etcd()
    tp = ch.stubs()[0]
    rng = np.random.default_rng(8)
    x = rng.normal(size=(N, D)).astype("float32")
    tmp = sh.tmpdir("tsr-ha-clients-")
    b0 = ch.write_batch(os.path.join(tmp, "b0"), [ch.dp_json("p%05d" % i, x[i])
                                                  for i in range(N)])
    b1 = ch.write_batch(os.path.join(tmp, "b1"), [ch.dp_json("p%05d" % i, x[i])
                                                  for i in range(10)])
    xs = x[:20] + 0.01
    cl = eh.HACluster(groups=2, replicas=2, coords=2, dims=D, ttl=TTL,
                      config={"nlist": 8, "pq_m": 4, "nprobe": 8})
    try:
        op = cl.coords[0].update(b0) if cl.leader() is cl.coords[0] else cl.coords[1].update(b0)
        assert op.state == tp.Operation.SUCCEEDED, op
        cl.wait_version(1)
        leader = cl.leader()
        expect = [[n.datapoint.datapoint_id for n in leader.stub.FindNeighbors(
            tp.FindNeighborsRequest(queries=[ch.query(tp, q, 10, fraction=1.0)]),
            timeout=10).nearest_neighbors[0].neighbors] for q in xs]
        python_part(cl, tp, xs, expect, b1)
        node_part(cl, tp, xs, expect, b1, tmp)
    finally:
        cl.stop()
    print("test_ha_clients: OK")


if __name__ == "__main__":
    main()
