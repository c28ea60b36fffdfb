"""Helpers for the Vertex MatchService tests (not a test itself).

- vstubs(): python grpcio stubs generated with grpc_tools.protoc into a mktemp dir from
  the CLIENT's hand-written copy of Vertex's match_service.proto
  (tests/integration/vertex_client_proto/), never from the server's proto/ file;
- crowding_attribute(): an independent implementation of the documented tag -> int64
  mapping (docs/vertex-compat.md);
- dataset(): a small index with restricts, numeric restricts, crowding tags (numeric and
  not), sparse and sparse-only datapoints, written as a batch, plus its arrays.
"""
import os
import subprocess
import sys

import numpy as np

import coord_harness as ch
import shard_harness as sh

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_PROTO = os.path.join(HERE, "vertex_client_proto")
SERVICE = "google.cloud.aiplatform.container.v1.MatchService"
_stub_dir = None


def vstubs():
    """(match_service_pb2, match_service_pb2_grpc) of the client's own proto copy."""
    global _stub_dir
    if _stub_dir is None:
        import grpc_tools
        wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        _stub_dir = sh.tmpdir("tsr-vstubs-")
        subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I", CLIENT_PROTO,
                               "-I", wkt, "--python_out=" + _stub_dir,
                               "--grpc_python_out=" + _stub_dir, "match_service.proto",
                               "google/rpc/status.proto"])
        sys.path.insert(0, _stub_dir)
    import match_service_pb2
    import match_service_pb2_grpc
    return match_service_pb2, match_service_pb2_grpc


_v1_dir = None


def v1stubs():
    """match_service_pb2 of the public google.cloud.aiplatform.v1 MatchService, from the
    project's copy (proto/google/cloud/aiplatform/v1). Compiled under the module path tsrv1/
    (the import line rewritten), so that no generated google/ folder shadows the protobuf
    package's; the proto package, and so the wire names, stay google.cloud.aiplatform.v1."""
    global _v1_dir
    if _v1_dir is None:
        import grpc_tools
        wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        src = os.path.join(HERE, "..", "..", "proto", "google", "cloud", "aiplatform", "v1")
        _v1_dir = sh.tmpdir("tsr-v1stubs-")
        os.makedirs(os.path.join(_v1_dir, "tsrv1"))
        for name in ("match_service.proto", "index.proto"):
            with open(os.path.join(src, name)) as f:
                text = f.read().replace('import "google/cloud/aiplatform/v1/',
                                        'import "tsrv1/')
            with open(os.path.join(_v1_dir, "tsrv1", name), "w") as f:
                f.write(text)
        subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I", _v1_dir,
                               "-I", wkt, "--python_out=" + _v1_dir,
                               "tsrv1/match_service.proto", "tsrv1/index.proto"])
        sys.path.insert(0, _v1_dir)
    from tsrv1 import match_service_pb2
    return match_service_pb2


def crowding_attribute(tag):
    """docs/vertex-compat.md: "" -> 0; a canonical decimal int64 -> itself; else FNV-1a 64
    of the UTF-8 bytes with the top bit cleared."""
    if not tag:
        return 0
    body = tag[1:] if tag.startswith("-") else tag
    canon = body.isascii() and body.isdigit() and (body == "0" and tag == "0" or
                                                   not body.startswith("0"))
    if canon and -2 ** 63 <= int(tag) < 2 ** 63:
        return int(tag)
    h = 14695981039346656037
    for b in tag.encode():
        h ^= b
        h = (h * 1099511628211) % 2 ** 64
    return h & (2 ** 63 - 1)


TAGS = ["42", "-7", "007", "s1", "s2", "9223372036854775808", "-0", "0",
        "9223372036854775807", "-9223372036854775808", "+5", "ünï"]
COLORS = ["red", "blue", "green", "orange"]


class Data:
    pass


def dataset(n=800, d=16, seed=5, sparse_only=10):
    """n dense datapoints p0000.. (every second with a sparse part) and sparse_only
    sparse-only ones q000.., with restricts (color), numeric restricts (price int, w
    double) and crowding tags from TAGS (some datapoints without a tag)."""
    rng = np.random.default_rng(seed)
    D = Data()
    D.n, D.d = n, d
    D.x = rng.normal(size=(n, d)).astype("float32")
    D.recs, D.tags, D.sparse, D.toks, D.price = [], {}, {}, {}, {}
    for i in range(n + sparse_only):
        did = "p%04d" % i if i < n else "q%03d" % (i - n)
        allow = sorted(set(rng.choice(COLORS, rng.integers(0, 3), replace=False)))
        deny = ["blue"] if rng.random() < 0.1 else []
        price = int(rng.integers(0, 100))
        tag = None if i % 13 == 0 else TAGS[i % len(TAGS)]
        sp = None
        if i % 2 == 0 or i >= n:
            dims = sorted(rng.choice(60, rng.integers(2, 6), replace=False).tolist())
            sp = (dims, rng.random(len(dims)).astype("float32").tolist())
        D.tags[did] = tag or ""
        D.sparse[did] = sp
        D.toks[did] = (set(allow), set(deny))
        D.price[did] = price
        D.recs.append(ch.dp_json(did, D.x[i] if i < n else None, sparse=sp,
                                 restricts=[("color", allow, deny)],
                                 numeric=[("price", "int", price), ("w", "double", price / 7.0)],
                                 tag=tag))
    return D
