"""Authentication and authorization on every public port (issue 14, "what must be true" 3).

A 2-shard cluster whose shards accept only the coordinator (--peer-token-file) and whose
coordinator has --auth-tokens (one query and one admin token). Then:
- the matrix {no token, unknown token, query token, admin token} x every RPC of every public
  service (tessera.v1.VectorSearch: FindNeighbors, ReadIndexDatapoints, UpdateIndex,
  GetOperation, GetIndexStats; Vertex container.v1 MatchService: Match, BatchMatch,
  BatchGetEmbeddings; Vertex aiplatform.v1 MatchService: FindNeighbors,
  ReadIndexDatapoints; aiplatform.v1 IndexService: GetIndex, UpdateIndex, UpsertDatapoints,
  RemoveDatapoints; tessera.v1 UpsertDatapoints, RemoveDatapoints;
  google.longrunning.Operations/GetOperation; grpc.health.v1.Health/Check) gives: health OK for all; no or unknown
  token UNAUTHENTICATED; query token OK on the read side and PERMISSION_DENIED on
  UpdateIndex; admin OK everywhere. With python grpcio and node grpc-js, each with plain
  metadata on loopback and, after a restart with --tls-cert, with call credentials over TLS;
- no status message and no log line holds a token;
- the CLI: `tessera stats --token-file F` (and TSR_TOKEN_FILE) answers, without it exit 1
  UNAUTHENTICATED;
- SIGHUP re-reads the token file (a removed token stops working, an added one works); a
  bad file on SIGHUP keeps the tokens loaded before and says so in the log;
- peer token: a shard answers a call without the peer token with UNAUTHENTICATED (health
  stays open), with it OK;
- protected mode: a coordinator (and a shard) on a non-loopback address without tokens
  refuses to start (exit 2, naming the flags); with --insecure-no-auth it starts.
"""
import base64
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402
import test_tls as tt  # noqa: E402  (certificates)
import vertex_harness as vh  # noqa: E402

D = 8
HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.join(HERE, "..", "interop", "node")
OK, UNAUTH, DENIED = 0, 16, 7
QUERY_TOKEN = "q-" + os.urandom(16).hex()
ADMIN_TOKEN = "a-" + os.urandom(16).hex()
UNKNOWN_TOKEN = "u-" + os.urandom(16).hex()
PEER_TOKEN = "p-" + os.urandom(16).hex()
VS = "tessera.v1.VectorSearch"
MS = "google.cloud.aiplatform.container.v1.MatchService"
V1 = "google.cloud.aiplatform.v1.MatchService"
IS = "google.cloud.aiplatform.v1.IndexService"
OPS = "google.longrunning.Operations"
HS = "grpc.health.v1.Health"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def calls(op_id, batch):
    """(service, method, request dict, request class, response class, role)."""
    tp = ch.stubs()[0]
    mp = vh.vstubs()[0]
    hp = sh.stubs()[3]
    v1 = vh.v1stubs()
    v = [0.5] * D
    return [
        (VS, "FindNeighbors", {"queries": [{"datapoint": {"feature_vector": v},
                                            "neighbor_count": 3}]},
         tp.FindNeighborsRequest, tp.FindNeighborsResponse, "query"),
        (VS, "ReadIndexDatapoints", {"ids": ["d0001"]}, tp.ReadIndexDatapointsRequest,
         tp.ReadIndexDatapointsResponse, "query"),
        (VS, "GetIndexStats", {}, tp.GetIndexStatsRequest, tp.GetIndexStatsResponse, "query"),
        (VS, "GetOperation", {"operation_id": op_id}, tp.GetOperationRequest, tp.Operation,
         "query"),
        (VS, "UpdateIndex", {"batch_root": batch}, tp.UpdateIndexRequest,
         tp.UpdateIndexResponse, "admin"),
        (MS, "Match", {"float_val": v, "num_neighbors": 3}, mp.MatchRequest, mp.MatchResponse,
         "query"),
        (MS, "BatchMatch", {"requests": [{"requests": [{"float_val": v, "num_neighbors": 3}]}]},
         mp.BatchMatchRequest, mp.BatchMatchResponse, "query"),
        (MS, "BatchGetEmbeddings", {"id": ["d0001"]}, mp.BatchGetEmbeddingsRequest,
         mp.BatchGetEmbeddingsResponse, "query"),
        (V1, "FindNeighbors", {"queries": [{"datapoint": {"datapoint_id": "q",
                                                          "feature_vector": v},
                                            "neighbor_count": 3}]},
         v1.FindNeighborsRequest, v1.FindNeighborsResponse, "query"),
        (V1, "ReadIndexDatapoints", {"ids": ["d0001"]}, v1.ReadIndexDatapointsRequest,
         v1.ReadIndexDatapointsResponse, "query"),
        # aiplatform.v1 IndexService and google.longrunning.Operations: the project keeps
        # only their messages (no service definitions), so these go as raw bytes
        (IS, "GetIndex", raw_str(1, INDEX), RAW, RAW, "query"),
        (IS, "UpdateIndex", raw_update(batch), RAW, RAW, "admin"),
        (IS, "UpsertDatapoints", raw_str(1, INDEX) + _field(2, raw_str(1, "auth-up") + _field(
            2, b"".join(__import__("struct").pack("<f", x) for x in v))), RAW, RAW, "admin"),
        (IS, "RemoveDatapoints", raw_str(1, INDEX) + raw_str(2, "auth-up"), RAW, RAW, "admin"),
        (VS, "UpsertDatapoints", {"datapoints": [{"datapoint_id": "auth-up2", "feature_vector": v}]},
         tp.UpsertDatapointsRequest, tp.UpsertDatapointsResponse, "admin"),
        (VS, "RemoveDatapoints", {"datapoint_ids": ["auth-up2"]}, tp.RemoveDatapointsRequest,
         tp.RemoveDatapointsResponse, "admin"),
        (OPS, "GetOperation", raw_str(1, op_id), RAW, RAW, "query"),
        (HS, "Check", {}, hp.HealthCheckRequest, hp.HealthCheckResponse, "open"),
    ]


INDEX = "projects/p/locations/l/indexes/i"


class RAW:
    """A request or response kept as its wire bytes (serializer and parser are identity)."""
    SerializeToString = staticmethod(lambda b: b)
    FromString = staticmethod(lambda b: b)


def _field(num, payload):
    """One length-delimited protobuf field (wire type 2)."""
    n, v = len(payload), b""
    while True:
        byte = n & 0x7F
        n >>= 7
        v += bytes([byte | (0x80 if n else 0)])
        if not n:
            break
    return bytes([num << 3 | 2]) + v + payload


def raw_str(num, text):
    return _field(num, text.encode())


def raw_update(batch):
    """UpdateIndexRequest{index: Index{name, metadata: {contentsDeltaUri: batch}}}."""
    from google.protobuf import struct_pb2
    meta = struct_pb2.Value()
    meta.struct_value.update({"contentsDeltaUri": batch})
    return _field(1, raw_str(1, INDEX) + _field(6, meta.SerializeToString()))


TOKENS = {"none": None, "unknown": UNKNOWN_TOKEN, "query": QUERY_TOKEN, "admin": ADMIN_TOKEN}


def expected(who, role):
    if role == "open":
        return OK
    if who in ("none", "unknown"):
        return UNAUTH
    if who == "query" and role == "admin":
        return DENIED
    return OK


def check_matrix(results, table, how):
    """results[who]["svc/method"] = (code, details)."""
    n = 0
    for who in TOKENS:
        for svc, meth, _, _, _, role in table:
            code, details = results[who][svc + "/" + meth]
            want = expected(who, role)
            if meth == "UpdateIndex" and want == OK and code == 9:
                assert "update in progress" in details, details  # an earlier one still runs
            else:
                assert code == want, (how, who, svc, meth, code, details, want)
            for t in (QUERY_TOKEN, ADMIN_TOKEN, UNKNOWN_TOKEN):
                assert t not in details, (how, who, meth, details)
            if code == DENIED:
                assert "admin" in details and "query" in details, details
            n += 1
    print("%s: %d calls (4 tokens x %d RPCs) as expected" % (how, n, len(table)))


def py_matrix(target, table, creds=None):
    res = {}
    for who, tok in TOKENS.items():
        if creds is None:
            chan = grpc.insecure_channel(target)
            md = [("authorization", "Bearer " + tok)] if tok else None
        else:
            cc = creds if tok is None else grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(tok))
            chan = grpc.secure_channel(target, cc, options=[
                ("grpc.ssl_target_name_override", "localhost")])
            md = None
        res[who] = {}
        for svc, meth, req, rq, rs, _ in table:
            f = chan.unary_unary("/%s/%s" % (svc, meth),
                                 request_serializer=rq.SerializeToString,
                                 response_deserializer=rs.FromString)
            msg = req if rq is RAW else json_format.ParseDict(req, rq())
            try:
                f(msg, metadata=md, timeout=30)
                res[who][svc + "/" + meth] = (OK, "")
            except grpc.RpcError as e:
                res[who][svc + "/" + meth] = (e.code().value[0], e.details() or "")
        chan.close()
    return res


def node_matrix(target, table, root, ca=None):
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules")):
        subprocess.check_call(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR)
    plan = {"target": target, "ca": ca, "name": "localhost", "tokens": TOKENS,
            "calls": [{"service": s, "method": m, "raw": base64.b64encode(r).decode()}
                      if rq is RAW else {"service": s, "method": m, "request": r}
                      for s, m, r, rq, _, _ in table]}
    p = write(os.path.join(root, "plan.json"), json.dumps(plan))
    r = subprocess.run(["node", os.path.join(NODE_DIR, "auth_client.js"), p],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["results"]
    return {who: {k: (v["code"], v["details"] or "") for k, v in d.items()}
            for who, d in out.items()}


def wait_idle(stub, root, md=None):
    """Until no update runs (the matrix's admin UpdateIndex): an update of a missing folder
    is refused while one runs, and otherwise fails at once."""
    tp = ch.stubs()[0]
    for _ in range(600):
        try:
            r = stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=os.path.join(root, "none")),
                                 metadata=md, timeout=10)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            time.sleep(0.1)
            continue
        for _ in range(600):
            op = stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                   metadata=md, timeout=10)
            if op.state in (tp.Operation.SUCCEEDED, tp.Operation.FAILED,
                            tp.Operation.REJECTED):
                return
            time.sleep(0.05)
    raise AssertionError("an update is still running")


def cli_checks(cl, root):
    tessera = os.path.join(ch.BIN, "tessera")
    tf = write(os.path.join(root, "cli.token"), QUERY_TOKEN + "\n")
    r = subprocess.run([tessera, "stats", "--target", cl.target, "--token-file", tf],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, TSR_TOKEN_FILE=tf)
    r = subprocess.run([tessera, "stats", "--target", cl.target], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    env.pop("TSR_TOKEN_FILE")
    r = subprocess.run([tessera, "stats", "--target", cl.target], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([tessera, "update", "--target", cl.target, "--batch-root", root,
                        "--token-file", tf], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "PERMISSION_DENIED" in r.stderr, (r.returncode, r.stderr)
    bad = write(os.path.join(root, "bad.token"), "tiny-secret\n")
    r = subprocess.run([tessera, "stats", "--target", cl.target, "--token-file", bad],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--token-file" in r.stderr and "tiny-secret" not in \
        r.stderr, r.stderr
    print("cli: --token-file and TSR_TOKEN_FILE answer; without a token UNAUTHENTICATED; a "
          "query token on update PERMISSION_DENIED; a bad token file exit 2")


def stats_code(cl, tok):
    tp = ch.stubs()[0]
    try:
        cl.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10,
                              metadata=[("authorization", "Bearer " + tok)])
        return OK
    except grpc.RpcError as e:
        return e.code().value[0]


def wait_log(cl, text, n0, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cl.coord.text().count(text) > n0:
            return
        time.sleep(0.05)
    raise AssertionError("no %r in the log:\n%s" % (text, cl.coord.text()))


def sighup(cl, tokens_file):
    new_query = "n-" + os.urandom(16).hex()
    write(tokens_file, "# rotated\nquery %s\nadmin %s\n" % (new_query, ADMIN_TOKEN))
    n0 = cl.coord.text().count("--auth-tokens %s:" % tokens_file)
    cl.coord.proc.send_signal(signal.SIGHUP)
    wait_log(cl, "--auth-tokens %s:" % tokens_file, n0)
    assert stats_code(cl, QUERY_TOKEN) == UNAUTH
    assert stats_code(cl, new_query) == OK
    write(tokens_file, "query %s\nquery\n" % QUERY_TOKEN)
    n0 = cl.coord.text().count("keeping the tokens loaded before")
    cl.coord.proc.send_signal(signal.SIGHUP)
    wait_log(cl, "keeping the tokens loaded before", n0)
    assert ":2: expected" in cl.coord.text(), cl.coord.text()
    assert stats_code(cl, new_query) == OK and stats_code(cl, QUERY_TOKEN) == UNAUTH
    assert cl.coord.proc.poll() is None
    print("SIGHUP: the rotated file took effect (old query token refused, new one served); "
          "a bad file was refused with file:line and the tokens before kept")
    return new_query


def peer_checks(cl):
    sp = sh.stubs()[0]
    hp, hpg = sh.stubs()[3], sh.stubs()[4]
    s = cl.shards[0]
    try:
        s.stub.Stats(sp.ShardStatsRequest(), timeout=10)
        raise AssertionError("a shard answered without the peer token")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
    s.stub.Stats(sp.ShardStatsRequest(), timeout=10,
                 metadata=[("authorization", "Bearer " + PEER_TOKEN)])
    r = hpg.HealthStub(s.channel).Check(hp.HealthCheckRequest(), timeout=10)
    assert r.status == hp.HealthCheckResponse.SERVING
    print("peer token: a shard refuses a call without it (UNAUTHENTICATED), serves one "
          "with it; health stays open")


def protected_mode(root, cfg):
    coord = os.path.join(ch.BIN, "tessera-coordinator")
    shard = os.path.join(ch.BIN, "tessera-shard")
    base = [coord, "--listen", "0.0.0.0:0", "--data", os.path.join(root, "pm"), "--config", cfg]
    r = subprocess.run(base, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--auth-tokens" in r.stderr and "--insecure-no-auth" in \
        r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([shard, "--listen", "0.0.0.0:0", "--data", os.path.join(root, "pms")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--peer-token-file" in r.stderr, (r.returncode, r.stderr)
    p = ch.Proc(base + ["--insecure-no-auth"])
    try:
        assert p.port is not None, p.text()
        t0 = time.time()  # logged just after the listen line
        while "WITHOUT authentication" not in p.text() and time.time() - t0 < 10:
            time.sleep(0.05)
        assert "WITHOUT authentication" in p.text(), p.text()
    finally:
        p.proc.terminate()
        p.proc.wait(30)
    print("protected mode: 0.0.0.0 without tokens refused (coordinator and shard, exit 2); "
          "--insecure-no-auth starts and logs it")


def main():
    tp = ch.stubs()[0]
    root = sh.tmpdir("tsr-auth-")
    c = tt.certs(root)
    tokens = write(os.path.join(root, "tokens"),
                   "# roles\n\nquery %s\nadmin %s   # the operator\n" % (QUERY_TOKEN, ADMIN_TOKEN))
    peer = write(os.path.join(root, "peer.token"), PEER_TOKEN + "\n")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, D)).astype("float32")
    batch = ch.write_batch(os.path.join(root, "b"),
                           [ch.dp_json("d%04d" % i, x[i]) for i in range(len(x))])
    auth = ["--auth-tokens", tokens, "--peer-token-file", peer]
    cl = ch.Cluster(2, D, {"nlist": 8, "pq_m": 4, "nprobe": 8},
                    shard_extra=["--peer-token-file", peer], coord_extra=auth)
    try:
        op = cl.update(batch, md=[("authorization", "Bearer " + ADMIN_TOKEN)])
        assert op.state == tp.Operation.SUCCEEDED, op
        table = calls(op.operation_id, batch)
        check_matrix(py_matrix(cl.target, table), table, "python grpcio, plain metadata")
        wait_idle(cl.stub, root, [("authorization", "Bearer " + ADMIN_TOKEN)])
        check_matrix(node_matrix(cl.target, table, root), table, "node grpc-js, plain metadata")
        wait_idle(cl.stub, root, [("authorization", "Bearer " + ADMIN_TOKEN)])
        cli_checks(cl, root)
        peer_checks(cl)
        # over TLS: call credentials
        cl.stop_coord()
        cl.start(extra_args=auth + ["--tls-cert", c["server.pem"], "--tls-key",
                                    c["server.key"]])
        creds = grpc.ssl_channel_credentials(tt.read(c["ca.pem"]))
        check_matrix(py_matrix(cl.target, table, creds), table, "python grpcio, TLS + call "
                     "credentials")
        wait_idle_tls(cl, creds, root)
        check_matrix(node_matrix(cl.target, table, root, c["ca.pem"]), table,
                     "node grpc-js, TLS + call credentials")
        wait_idle_tls(cl, creds, root)
        # back to plaintext for the reload case
        cl.stop_coord()
        cl.start(extra_args=auth)
        sighup(cl, tokens)
        for t in (QUERY_TOKEN, ADMIN_TOKEN, UNKNOWN_TOKEN, PEER_TOKEN):
            assert t not in cl.coord.text(), "a token is in the coordinator's log"
            for s in cl.shards:
                assert t not in s.text(), "a token is in a shard's log"
        print("logs: no token in the coordinator's or the shards' logs")
        protected_mode(root, cl.config)
    finally:
        cl.stop()
    print("test_auth: OK")
    return 0


def wait_idle_tls(cl, creds, root):
    chan = grpc.secure_channel(cl.target, grpc.composite_channel_credentials(
        creds, grpc.access_token_call_credentials(ADMIN_TOKEN)),
        options=[("grpc.ssl_target_name_override", "localhost")])
    wait_idle(ch.stubs()[1].VectorSearchStub(chan), root)
    chan.close()


if __name__ == "__main__":
    sys.exit(main())
