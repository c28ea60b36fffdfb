"""A call to the wrong port says which port it reached (issue 41 item 8): a coordinator
method (tessera.v1.VectorSearch/FindNeighbors, the Vertex MatchService) sent to a shard's
port answers UNIMPLEMENTED with a message saying that this port is a tessera shard and
that the coordinator listens on its own port; a tessera.v1.Shard method sent to the
coordinator's port says this port is the coordinator and shards are elsewhere. An unknown
method of a service the port does serve keeps the plain message (no misleading hint)."""
import os
import sys

import grpc

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402


def unimplemented(target, path):
    chan = grpc.insecure_channel(target)
    try:
        chan.unary_unary(path)(b"", timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNIMPLEMENTED, (path, e.code(), e.details())
        return e.details()
    finally:
        chan.close()
    raise AssertionError("%s on %s: answered OK" % (path, target))


def main():
    root = sh.tmpdir("tsr-wrongport-")
    cl = ch.Cluster(1, 8, {"nlist": 4, "pq_m": 2}, root=root)
    try:
        shard = cl.shards[0].target
        for path in ("/tessera.v1.VectorSearch/FindNeighbors",
                     "/google.cloud.aiplatform.container.v1.MatchService/Match"):
            msg = unimplemented(shard, path)
            print("shard port, %s: %s" % (path, msg))
            assert path in msg, msg
            assert "tessera shard" in msg and "tessera-coordinator" in msg, msg
        msg = unimplemented(cl.target, "/tessera.v1.Shard/Search")
        print("coordinator port, Shard/Search: %s" % msg)
        assert "tessera coordinator" in msg and "tessera-shard" in msg, msg
        # a method typo within a service the port serves: no hint about other ports
        msg = unimplemented(shard, "/tessera.v1.Shard/Serch")
        assert msg == "unknown method /tessera.v1.Shard/Serch", msg
        msg = unimplemented(cl.target, "/tessera.v1.VectorSearch/FindNeighbours")
        assert msg == "unknown method /tessera.v1.VectorSearch/FindNeighbours", msg
    finally:
        cl.stop()
    print("test_wrong_port: OK")


if __name__ == "__main__":
    main()
