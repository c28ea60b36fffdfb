#!/usr/bin/env python3
"""Interop: a python grpcio client against the C rpc server (common/net/rpc_server.c).

Runs the unit-test binary in serve mode (TSR_RPC_TEST_SERVE=1 $TSR_BUILD/tests/test_rpc),
generates python stubs from the project's proto/ into a temp dir with grpc_tools.protoc,
and checks: grpc.health.v1 Health/Check (SERVING, NOT_FOUND for an unknown service),
a raw-bytes echo, error codes and messages (INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED), a protobuf message packed by protobuf-c in C and
parsed by python (tessera.v1.Shard/Stats), and a clean shutdown of the server.
"""
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("TSR_BUILD", os.path.join(ROOT, "build", "release"))
SERVER = os.path.join(BUILD, "tests", "test_rpc")


def gen_stubs(out):
    protos = ["tessera/v1/tessera.proto", "tessera/v1/shard.proto", "grpc/health/v1/health.proto"]
    args = ["protoc", "-I" + os.path.join(ROOT, "proto"), "--python_out=" + out,
            "--grpc_python_out=" + out] + protos
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed")
    sys.path.insert(0, out)


def expect_error(fn, code, substr=None):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"expected {code}, got {e.code()}: {e.details()}"
        if substr is not None:
            assert substr in (e.details() or ""), f"{substr!r} not in {e.details()!r}"
        return e
    raise AssertionError(f"expected {code}, call succeeded")


def main():
    if not os.access(SERVER, os.X_OK):
        raise SystemExit(f"{SERVER} not built (make {SERVER})")
    with tempfile.TemporaryDirectory() as tmp:
        gen_stubs(tmp)
        # The generated grpc/health/v1 package would clash with grpcio's own "grpc"
        # package: load the message module by path and call Check with a plain stub.
        spec = importlib.util.spec_from_file_location(
            "tsr_health_pb2", os.path.join(tmp, "grpc", "health", "v1", "health_pb2.py"))
        health_pb2 = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(health_pb2)
        from tessera.v1 import shard_pb2, shard_pb2_grpc  # noqa: E402

        env = dict(os.environ, TSR_RPC_TEST_SERVE="1")
        srv = subprocess.Popen([SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        try:
            line = srv.stdout.readline().decode()
            assert line.startswith("PORT "), f"unexpected server output {line!r}"
            port = int(line.split()[1])
            target = f"127.0.0.1:{port}"
            with grpc.insecure_channel(target) as ch:
                grpc.channel_ready_future(ch).result(timeout=10)

                check = ch.unary_unary(
                    "/grpc.health.v1.Health/Check",
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
                r = check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert r.status == health_pb2.HealthCheckResponse.SERVING, r
                expect_error(lambda: check(
                    health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5),
                    grpc.StatusCode.NOT_FOUND, "unknown service")

                echo = ch.unary_unary("/tessera.test.Echo/Echo")  # raw bytes in and out
                echo_long = ch.unary_unary("/tessera.test.Echo/EchoLong")
                for payload in (b"", b"x", bytes(range(256)) * 100, os.urandom(1 << 20)):
                    assert echo(payload, timeout=5) == payload
                    assert echo_long(payload, timeout=5) == payload

                fail = ch.unary_unary("/tessera.test.Echo/Fail")
                expect_error(lambda: fail(b"dimension 3, expected 64", timeout=5),
                             grpc.StatusCode.INVALID_ARGUMENT,
                             "bad request: dimension 3, expected 64")
                fail_tsr = ch.unary_unary("/tessera.test.Echo/FailTsr")
                expect_error(lambda: fail_tsr(b"notfound", timeout=5),
                             grpc.StatusCode.NOT_FOUND, "not found")
                expect_error(lambda: fail_tsr(b"tserr", timeout=5),
                             grpc.StatusCode.UNAVAILABLE, "shard 3 at")
                expect_error(lambda: ch.unary_unary("/tessera.v1.Nope/Nothing")(b"", timeout=5),
                             grpc.StatusCode.UNIMPLEMENTED, "/tessera.v1.Nope/Nothing")
                slow = ch.unary_unary("/tessera.test.Echo/Slow")
                expect_error(lambda: slow(b"800", timeout=0.1), grpc.StatusCode.DEADLINE_EXCEEDED)
                assert slow(b"20", timeout=5) == b"20"
                big = ch.unary_unary("/tessera.test.Echo/Big")
                expect_error(lambda: big(b"5242880", timeout=5),
                             grpc.StatusCode.RESOURCE_EXHAUSTED, "maximum message size")

                shard = shard_pb2_grpc.ShardStub(ch)
                st = shard.Stats(shard_pb2.ShardStatsRequest(), timeout=5)
                assert st.current_version == 42 and st.vectors_count == 60, st
                assert list(st.lists) == [1, 5, 9] and list(st.list_sizes) == [10, 20, 30], st
                assert st.metric == "L2" and st.dimension == 64 and st.nlist == 16, st
                assert st.versions[0].state == shard_pb2.ShardVersion.SERVING, st
                # not implemented by the test server: UNIMPLEMENTED through the stub too
                expect_error(lambda: shard.Search(shard_pb2.ShardSearchRequest(), timeout=5),
                             grpc.StatusCode.UNIMPLEMENTED)

                # hostile peers: raw garbage, a truncated HTTP/2 preface, a connection
                # closed at once; the server must keep serving
                for junk in (os.urandom(4096), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(64),
                             b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b""):
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                        s.sendall(junk)
                        s.settimeout(1)
                        try:
                            s.recv(65536)
                        except (socket.timeout, ConnectionResetError):
                            pass
                r = check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert r.status == health_pb2.HealthCheckResponse.SERVING, r

                # parallel calls from python threads
                futs = [echo.future(b"p%d" % i, timeout=5) for i in range(64)]
                assert [f.result() for f in futs] == [b"p%d" % i for i in range(64)]
        finally:
            srv.stdin.close()
            try:
                rc = srv.wait(timeout=15)
            except subprocess.TimeoutExpired:
                srv.kill()
                raise AssertionError("server did not shut down within 15 s")
        assert rc == 0, f"server exited with {rc}"
    print("ok")


if __name__ == "__main__":
    main()
