"""TLS on every port of a cluster (issue 7, "what must be true" 5).

Certificates are made with the openssl CLI in a mktemp dir: a CA, a server certificate
(SAN localhost + 127.0.0.1), a client certificate, and a second, unrelated CA with its own
client certificate. Then:
- bad TLS flags: a missing file, a key that does not match the certificate, swapped cert
  and key, a client CA without a certificate, a shard client cert without a CA → exit 2 with
  a message naming the flag and the file;
- a TLS-only cluster: 2 shards serving mutual TLS (they require the coordinator's client
  certificate) and a coordinator whose public port is TLS; an UpdateIndex and FindNeighbors
  through a python grpcio client that trusts the CA answer (exact self-match);
- refused: a plaintext client (UNAVAILABLE), a client trusting the other CA (UNAVAILABLE),
  a plaintext or certificate-less client on a shard port;
- mutual TLS on the coordinator (restarted with --tls-client-ca): a client without a
  certificate is refused, one with a certificate signed by the other CA too, one with the
  right certificate answers;
- the CLI: `tessera query/stats/read --tls-ca` (and --tls-cert/--tls-key against mutual TLS) answers,
  without the client certificate it fails with exit 1, an unreadable --tls-ca is exit 2;
- `tessera cluster up --tls-cert --tls-key --tls-ca --mtls`: every port mutual TLS; stats
  over mutual TLS show both shards available (the coordinator reached them over mutual TLS).
"""
import json
import os
import subprocess
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 16
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (args, r.stderr)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
            "-subj", "/CN=tessera test " + name,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d, name, ca, cn, san=None, usage="serverAuth,clientAuth"):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        if san:
            f.write("subjectAltName=%s\n" % san)
        f.write("extendedKeyUsage=%s\n" % usage)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext",
            cwd=d)


def certs(root):
    d = os.path.join(root, "pki")
    os.makedirs(d)
    make_ca(d, "ca")
    make_ca(d, "otherca")
    make_leaf(d, "server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1")
    make_leaf(d, "client", "ca", "tessera-client", usage="clientAuth")
    make_leaf(d, "otherclient", "otherca", "intruder", usage="clientAuth")
    return {k: os.path.join(d, k) for k in
            ["ca.pem", "otherca.pem", "server.pem", "server.key", "client.pem", "client.key",
             "otherclient.pem", "otherclient.key"]}


def read(p):
    with open(p, "rb") as f:
        return f.read()


def expect_code(fn, code, text=None):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        if text:
            assert text in e.details(), (text, e.details())
        return e.details()
    raise AssertionError("expected %s" % code)


def bad_flags(root, c, bin_dir):
    shard = os.path.join(bin_dir, "tessera-shard")
    coord = os.path.join(bin_dir, "tessera-coordinator")
    data = os.path.join(root, "bad-data")
    missing = os.path.join(root, "nope.pem")
    base = [shard, "--listen", "127.0.0.1:0", "--data", data]
    cases = [
        (base + ["--tls-cert", missing, "--tls-key", c["server.key"]],
         ["--tls-cert", missing, "No such file"]),
        (base + ["--tls-cert", c["server.pem"], "--tls-key", c["client.key"]],
         ["--tls-key", c["client.key"], "does not match", c["server.pem"]]),
        (base + ["--tls-cert", c["server.key"], "--tls-key", c["server.pem"]],
         ["--tls-cert", "private key", "swapped"]),
        (base + ["--tls-cert", c["server.pem"]], ["--tls-cert and --tls-key"]),
        (base + ["--tls-client-ca", c["ca.pem"]], ["--tls-client-ca needs --tls-cert"]),
        (base + ["--tls-cert", c["server.pem"], "--tls-key", c["server.key"],
                 "--tls-client-ca", c["server.key"]],
         ["--tls-client-ca", c["server.key"], "expected a PEM certificate"]),
        (base + ["--max-message", "12q"], ["--max-message:", "got '12q'", "expected a size"]),
        ([coord, "--listen", "127.0.0.1:0", "--data", data, "--config", missing,
          "--shard-tls-cert", c["client.pem"], "--shard-tls-key", c["client.key"]],
         ["--shard-tls-cert needs --shard-tls-ca"]),
        ([coord, "--listen", "127.0.0.1:0", "--data", data, "--config", missing,
          "--shard-tls-ca", missing], ["--shard-tls-ca", missing]),
    ]
    for argv, want in cases:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        for w in want:
            assert w in r.stderr, (argv, w, r.stderr)
    assert not os.path.exists(data), "a refused start must not create the data dir"
    for exe in (shard, coord):
        r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "--tls-cert" in r.stdout and "--max-message" in r.stdout
    r = subprocess.run([coord, "--help"], capture_output=True, text=True, timeout=30)
    assert "--shard-tls-ca" in r.stdout and "--shard-tls-server-name" in r.stdout


def start_coord(cl_root, bin_dir, cfg, c, mtls):
    argv = [os.path.join(bin_dir, "tessera-coordinator"), "--listen", "127.0.0.1:0",
            "--data", os.path.join(cl_root, "coordinator"), "--config", cfg,
            "--tls-cert", c["server.pem"], "--tls-key", c["server.key"],
            "--shard-tls-ca", c["ca.pem"], "--shard-tls-cert", c["client.pem"],
            "--shard-tls-key", c["client.key"]] + ch.batch_allow_args(cl_root)
    if mtls:
        argv += ["--tls-client-ca", c["ca.pem"]]
    p = ch.Proc(argv)
    if p.port is None:
        p.proc.kill()
        raise RuntimeError("coordinator did not start:\n" + p.text())
    return p


def stop_proc(p):
    if p.proc.poll() is None:
        p.proc.terminate()
    rc = p.proc.wait(30)
    p.thread.join(5)
    text = p.text()
    assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text \
        and "LeakSanitizer" not in text, "sanitizer report:\n" + text
    assert rc == 0, "coordinator exit %s:\n%s" % (rc, text)


def tls_channel(port, ca=None, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(root_certificates=read(ca) if ca else None,
                                         private_key=read(key) if key else None,
                                         certificate_chain=read(cert) if cert else None)
    return grpc.secure_channel("127.0.0.1:%d" % port, creds)


def find(chan, tp, vec, k=3, timeout=10):
    stub = ch.stubs()[1].VectorSearchStub(chan)
    return stub.FindNeighbors(tp.FindNeighborsRequest(queries=[ch.query(tp, vec, k)]),
                              timeout=timeout)


def run(bin_dir):
    tp, tpg, sp, _ = ch.stubs()
    root = sh.tmpdir("tsr-tls-")
    c = certs(root)
    bad_flags(root, c, bin_dir)

    shard_tls = ["--tls-cert", c["server.pem"], "--tls-key", c["server.key"],
                 "--tls-client-ca", c["ca.pem"]]
    shards = [sh.Shard(os.path.join(root, "shard-%d" % i), extra=shard_tls, bin_dir=bin_dir)
              for i in range(2)]
    cfg = os.path.join(root, "coordinator.json")
    with open(cfg, "w") as f:
        json.dump({"dimensions": D, "nlist": 8, "pq_m": 4, "nprobe": 8,
                   "shards": [s.target for s in shards]}, f)
    coord = start_coord(root, bin_dir, cfg, c, mtls=False)
    chans = []
    try:
        assert "TLS" in coord.text(), coord.text()
        good = tls_channel(coord.port, c["ca.pem"])
        chans.append(good)
        stub = tpg.VectorSearchStub(good)
        rng = np.random.default_rng(7)
        x = rng.normal(size=(400, D)).astype("float32")
        b = ch.write_batch(os.path.join(root, "batch"),
                           [ch.dp_json("v%03d" % i, x[i]) for i in range(len(x))])
        r = stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=b), timeout=30)
        t0 = time.time()
        while True:
            op = stub.GetOperation(tp.GetOperationRequest(operation_id=r.operation_id),
                                   timeout=10)
            if op.state in (tp.Operation.SUCCEEDED, tp.Operation.REJECTED, tp.Operation.FAILED):
                break
            assert time.time() - t0 < 120, op
            time.sleep(0.05)
        assert op.state == tp.Operation.SUCCEEDED, op  # Stage/Commit went over mutual TLS
        for i in (0, 123, 399):
            resp = find(good, tp, x[i])
            nb = resp.nearest_neighbors[0].neighbors
            assert nb and nb[0].datapoint.datapoint_id == "v%03d" % i, resp
        print("TLS client trusting the CA: FindNeighbors answers (exact self-match)")

        plain = grpc.insecure_channel("127.0.0.1:%d" % coord.port)
        chans.append(plain)
        expect_code(lambda: find(plain, tp, x[0], timeout=5), UNAVAILABLE)
        other = tls_channel(coord.port, c["otherca.pem"])
        chans.append(other)
        expect_code(lambda: find(other, tp, x[0], timeout=5), UNAVAILABLE)
        print("plaintext client and client trusting another CA: UNAVAILABLE")

        # the internal ports: TLS only, and they want the coordinator's client certificate
        _, spg, _, _, _ = sh.stubs()
        for s in shards:
            for chan in (grpc.insecure_channel(s.target), tls_channel(s.port, c["ca.pem"]),
                         tls_channel(s.port, c["ca.pem"], c["otherclient.pem"],
                                     c["otherclient.key"])):
                chans.append(chan)
                expect_code(lambda: spg.ShardStub(chan).Stats(sp.ShardStatsRequest(), timeout=5),
                            UNAVAILABLE)
            okc = tls_channel(s.port, c["ca.pem"], c["client.pem"], c["client.key"])
            chans.append(okc)
            st = spg.ShardStub(okc).Stats(sp.ShardStatsRequest(), timeout=10)
            assert st.current_version == 1, st
        print("shard ports: plaintext / no client cert / foreign cert refused, client cert ok")

        cli = os.path.join(bin_dir, "tessera")
        vec = ",".join("%g" % v for v in x[5])
        target = "127.0.0.1:%d" % coord.port
        q = [cli, "query", "--target", target, "--vector", vec, "--k", "2", "--json"]
        r = subprocess.run(q + ["--tls-ca", c["ca.pem"]], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and "v005" in r.stdout, (r.stdout, r.stderr)
        r = subprocess.run(q + ["--tls-ca", c["ca.pem"], "--tls-server-name", "localhost"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "v005" in r.stdout, (r.stdout, r.stderr)
        r = subprocess.run(q, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run(q + ["--tls-ca", os.path.join(root, "nope.pem")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "--tls-ca" in r.stderr and "nope.pem" in r.stderr, r.stderr
        r = subprocess.run([cli, "stats", "--target", target, "--tls-ca", c["ca.pem"]],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "version 1" in r.stdout, (r.stdout, r.stderr)
        r = subprocess.run([cli, "read", "--target", target, "--tls-ca", c["ca.pem"], "v007"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and '"v007"' in r.stdout, (r.stdout, r.stderr)
        print("CLI query/stats/read --tls-ca answer; plaintext CLI fails; bad --tls-ca exit 2")
        # `tessera health`: the probe that works with TLS (kubelet's grpc: probes do not)
        hc = [cli, "health", "--target", target]
        r = subprocess.run(hc + ["--tls-ca", c["ca.pem"]], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "SERVING", (r.stdout, r.stderr)
        r = subprocess.run(hc + ["--tls-ca", c["ca.pem"], "--service", "no.such.Service"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "NOT_FOUND" in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run(hc + ["--timeout-ms", "3000"], capture_output=True, text=True,
                           timeout=30)  # plaintext against the TLS port
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run(hc + ["--timeout-ms", "0"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 2, (r.returncode, r.stderr)
        dead = [cli, "health", "--target", "127.0.0.1:%d" % ch.free_port(), "--timeout-ms",
                "3000"]
        r = subprocess.run(dead, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, (r.returncode, r.stderr)
        print("tessera health: SERVING over TLS (exit 0); unknown service, plaintext, dead port "
              "exit 1")

        # mutual TLS on the public port
        for chan in chans[:3]:
            chan.close()
        stop_proc(coord)
        coord = start_coord(root, bin_dir, cfg, c, mtls=True)
        assert "mutual TLS" in coord.text(), coord.text()
        nocert = tls_channel(coord.port, c["ca.pem"])
        chans.append(nocert)
        expect_code(lambda: find(nocert, tp, x[0], timeout=5), UNAVAILABLE)
        foreign = tls_channel(coord.port, c["ca.pem"], c["otherclient.pem"], c["otherclient.key"])
        chans.append(foreign)
        expect_code(lambda: find(foreign, tp, x[0], timeout=5), UNAVAILABLE)
        withcert = tls_channel(coord.port, c["ca.pem"], c["client.pem"], c["client.key"])
        chans.append(withcert)
        t0 = time.time()
        while True:  # the restarted coordinator reconnects to the shards
            try:
                resp = find(withcert, tp, x[42])
                break
            except grpc.RpcError as e:
                assert e.code() == UNAVAILABLE and time.time() - t0 < 15, (e.code(), e.details())
                time.sleep(0.2)
        assert resp.nearest_neighbors[0].neighbors[0].datapoint.datapoint_id == "v042", resp
        print("mutual TLS: no client cert / foreign cert refused, client cert answers")
        target = "127.0.0.1:%d" % coord.port
        q = [cli, "query", "--target", target, "--vector", vec, "--k", "2", "--json",
             "--tls-ca", c["ca.pem"]]
        r = subprocess.run(q + ["--tls-cert", c["client.pem"], "--tls-key", c["client.key"]],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "v005" in r.stdout, (r.stdout, r.stderr)
        r = subprocess.run(q, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run(q + ["--tls-cert", c["client.pem"], "--tls-key", c["server.key"]],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "does not match" in r.stderr, r.stderr
        print("CLI with --tls-cert/--tls-key answers mutual TLS; without: exit 1")
    finally:
        for chan in chans:
            chan.close()
        if coord.proc.poll() is None:
            stop_proc(coord)
        for s in shards:
            s.stop()


def cluster_up(bin_dir):
    """`tessera cluster up --tls-* --mtls`: every port mutual TLS, stats shows both shards up."""
    root = sh.tmpdir("tsr-tls-up-")
    c = certs(root)
    cli = os.path.join(bin_dir, "tessera")
    r = subprocess.run([cli, "cluster", "up", "--data", os.path.join(root, "d"), "--tls-cert",
                        c["server.pem"]], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--tls-ca" in r.stderr, r.stderr
    p = sh.free_range(2)  # coordinator p, shards p+1, p+2
    sup = subprocess.Popen([cli, "cluster", "up", "--data", os.path.join(root, "d"), "--shards",
                            "2", "--port", str(p), "--dimensions", "16", "--nlist", "8",
                            "--pq-m", "4", "--tls-cert", c["server.pem"], "--tls-key",
                            c["server.key"], "--tls-ca", c["ca.pem"], "--mtls"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        st = [cli, "stats", "--target", "127.0.0.1:%d" % p, "--json", "--tls-ca", c["ca.pem"],
              "--tls-cert", c["client.pem"], "--tls-key", c["client.key"]]
        t0 = time.time()
        while True:
            r = subprocess.run(st, capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                j = json.loads(r.stdout)
                if len(j["shards"]) == 2 and all(s["available"] for s in j["shards"]):
                    break
            assert time.time() - t0 < 30, (r.stdout, r.stderr)
            time.sleep(0.3)
        r = subprocess.run(st[:-4], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, (r.stdout, r.stderr)  # no client certificate
        print("cluster up --mtls: stats over mutual TLS, both shards available over mutual TLS")
    finally:
        sup.terminate()
        out, err = sup.communicate(timeout=30)
        assert sup.returncode == 0, (sup.returncode, err)


def main():
    for b in sh.bins():
        t0 = time.time()
        run(b)
        cluster_up(b)
        print("ok: %s (%.1f s)" % (b, time.time() - t0))
    print("ok")


if __name__ == "__main__":
    main()
