#!/usr/bin/env python3
"""gen_seeds_coord.py — writes the seed inputs of fuzz_coord_rpc and fuzz_coord_stream_log
into tests/fuzz/corpus/<harness>/ with the real protos (compiled by grpc_tools.protoc into a
temporary folder): a few valid requests per coordinator method (byte 0 = the method's index
in fuzz_coord_rpc.c's table; 252 and 254 for the rows added later, AddShardGroup and
RemoveShardGroup), and valid coordinator logs (u32 len | u32 crc32 | record).
Run from anywhere: /usr/bin/python3 tests/fuzz/gen_seeds_coord.py"""
import os
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTOS = ["tessera/v1/tessera.proto", "tessera/v1/shard.proto", "tessera/v1/coord_log.proto",
          "google/cloud/aiplatform/container/v1/match_service.proto",
          "google/cloud/aiplatform/v1/match_service.proto",
          "google/cloud/aiplatform/v1/index_service.proto",
          "google/cloud/aiplatform/v1/index.proto", "google/longrunning/operations.proto",
          "google/rpc/status.proto"]
# fuzz_coord_rpc.c's table
FN, READ, STATS, UPDATE, GETOP, UPSERT, REMOVE, MATCH, BMATCH, BGET, V1FN, V1READ, \
    GETINDEX, V1UPDATE, LROGETOP, V1UPSERT, V1REMOVE, CREATE = range(18)
# the rows added later are picked by byte 0 >= 252 (fuzz_coord_rpc.c: method_of)
ADDGROUP, RMGROUP = 252, 254
EP = "projects/p/locations/l/indexEndpoints/e"
IX = "projects/p/locations/l/indexes/i"


def main():
    tmp = tempfile.mkdtemp(prefix="tsr-seeds-")
    subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I" + ROOT + "/proto",
                           "--python_out=" + tmp] + PROTOS)
    sys.path.insert(0, tmp)
    from tessera.v1 import tessera_pb2 as t, shard_pb2 as sh, coord_log_pb2 as cl
    from google.cloud.aiplatform.container.v1 import match_service_pb2 as c1
    from google.cloud.aiplatform.v1 import match_service_pb2 as m1, index_service_pb2 as i1
    from google.longrunning import operations_pb2 as lro

    out = os.path.join(ROOT, "tests/fuzz/corpus/fuzz_coord_rpc")
    os.makedirs(out, exist_ok=True)

    def seed(name, sel, msg):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([sel]) + msg.SerializeToString())

    vec = [0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 3.0, 1.0]

    def tdp(i, with_meta=False):
        d = t.IndexDatapoint(datapoint_id="id%d" % i, feature_vector=vec)
        d.restricts.add(namespace="color", allow_list=["red"], deny_list=["blue"])
        d.numeric_restricts.add(namespace="price", value_int=5)
        d.crowding_tag.crowding_attribute = "c%d" % (i % 3)
        if with_meta:
            d.embedding_metadata.update({"a": 1, "b": {"c": [1, "x"]}})
        return d

    q = t.FindNeighborsRequest(index_endpoint=EP, deployed_index_id="d")
    q.queries.add(datapoint=tdp(1), neighbor_count=5)
    seed("fn_dense", FN, q)
    q2 = t.FindNeighborsRequest()
    qq = q2.queries.add(neighbor_count=3, approximate_neighbor_count=10,
                        per_crowding_attribute_neighbor_count=1)
    qq.datapoint.feature_vector.extend(vec)
    qq.datapoint.sparse_embedding.values.extend([1.0, 2.0])
    qq.datapoint.sparse_embedding.dimensions.extend([3, 70])
    qq.rrf.alpha = 0.5
    seed("fn_hybrid_rrf", FN, q2)
    seed("read", READ, t.ReadIndexDatapointsRequest(ids=["id1", "id2", "nope"]))
    seed("stats", STATS, t.GetIndexStatsRequest())
    seed("update", UPDATE, t.UpdateIndexRequest(batch_root="/tmp", is_complete_overwrite=True))
    seed("update_outside", UPDATE, t.UpdateIndexRequest(batch_root="/etc/../etc"))
    seed("getop", GETOP, t.GetOperationRequest(operation_id="op-1-1"))
    up = t.UpsertDatapointsRequest(datapoints=[tdp(1, True), tdp(40)])
    seed("upsert", UPSERT, up)
    up.update_mask.paths.append("all_restricts")
    seed("upsert_mask", UPSERT, up)
    seed("remove", REMOVE, t.RemoveDatapointsRequest(datapoint_ids=["id1", "id99"]))

    mr = c1.MatchRequest(deployed_index_id="d", float_val=vec, num_neighbors=5)
    mr.restricts.add(name="color", allow_tokens=["red"])
    mr.numeric_restricts.add(name="price", value_float=2.5, op=c1.NumericNamespace.GREATER)
    seed("match", MATCH, mr)
    mr2 = c1.MatchRequest(deployed_index_id="d", embedding_id="id3", embedding_enabled=True)
    seed("match_by_id", MATCH, mr2)
    bm = c1.BatchMatchRequest()
    per = bm.requests.add(deployed_index_id="d")
    per.requests.append(mr)
    per.requests.append(mr2)
    seed("batch_match", BMATCH, bm)
    seed("batch_get", BGET, c1.BatchGetEmbeddingsRequest(deployed_index_id="d", id=["id1", "x"]))

    v = m1.FindNeighborsRequest(index_endpoint=EP, deployed_index_id="d",
                                return_full_datapoint=True)
    vq = v.queries.add(neighbor_count=4)
    vq.datapoint.feature_vector.extend(vec)
    vq.datapoint.restricts.add(namespace="color", allow_list=["red"])
    seed("v1_fn", V1FN, v)
    seed("v1_read", V1READ, m1.ReadIndexDatapointsRequest(index_endpoint=EP, deployed_index_id="d",
                                                          ids=["id1", "id2"]))
    seed("v1_getindex", GETINDEX, i1.GetIndexRequest(name=IX))
    ui = i1.UpdateIndexRequest()
    ui.index.name = IX
    ui.index.metadata.struct_value.update({"contentsDeltaUri": "file:///tmp",
                                           "isCompleteOverwrite": True})
    ui.update_mask.paths.append("metadata")
    seed("v1_updateindex", V1UPDATE, ui)
    seed("lro_getop", LROGETOP, lro.GetOperationRequest(name=IX + "/operations/op-1-1"))
    vu = i1.UpsertDatapointsRequest(index=IX)
    d = vu.datapoints.add(datapoint_id="n1", feature_vector=vec)
    d.embedding_metadata.update({"k": "v"})
    seed("v1_upsert", V1UPSERT, vu)
    seed("v1_remove", V1REMOVE, i1.RemoveDatapointsRequest(index=IX, datapoint_ids=["id1"]))
    seed("create_index", CREATE, i1.GetIndexRequest(name=IX))
    seed("add_group", ADDGROUP, t.AddShardGroupRequest(replicas=["127.0.0.1:3", "127.0.0.1:4"]))
    seed("add_group_dup", ADDGROUP, t.AddShardGroupRequest(replicas=["127.0.0.1:1"]))
    seed("add_group_twice", ADDGROUP, t.AddShardGroupRequest(replicas=["h:1", "h:1"]))
    seed("add_group_badchar", ADDGROUP, t.AddShardGroupRequest(replicas=["a b:1"]))
    seed("add_group_empty", ADDGROUP, t.AddShardGroupRequest())
    seed("remove_group", RMGROUP, t.RemoveShardGroupRequest(group=1))
    seed("remove_group_0", RMGROUP, t.RemoveShardGroupRequest(group=0))
    seed("remove_group_unknown", RMGROUP, t.RemoveShardGroupRequest(group=7))

    # fuzz_coord_stream_log: a header and two rounds (as stream.c writes them)
    out = os.path.join(ROOT, "tests/fuzz/corpus/fuzz_coord_stream_log")
    os.makedirs(out, exist_ok=True)

    def frame(rec):
        b = rec.SerializeToString()
        return struct.pack("<II", len(b), zlib.crc32(b) & 0xffffffff) + b

    log = frame(cl.CoordLogRecord(version=1, seq=0, next_label=32, next_seq=1, group_seq=[0, 0]))
    with open(os.path.join(out, "header"), "wb") as f:
        f.write(log)
    w = sh.ShardWriteRequest(version=1, seq=1)
    u = w.upserts.add(label=32, list=1)
    u.datapoint.CopyFrom(tdp(100))
    w.deletes.add(label=1, list=1)
    r1 = cl.CoordLogRecord(version=1, seq=1, next_label=33, removed_ids=["id5"])
    r1.writes.add(group=0, write=w)
    log += frame(r1)
    w2 = sh.ShardWriteRequest(version=1, seq=2)
    w2.deletes.add(label=32, list=1)
    r2 = cl.CoordLogRecord(version=1, seq=2, next_label=33, removed_ids=["id100"])
    r2.writes.add(group=1, write=w2)
    log += frame(r2)
    with open(os.path.join(out, "header_two_rounds"), "wb") as f:
        f.write(log)
    with open(os.path.join(out, "two_rounds_torn"), "wb") as f:
        f.write(log[:-7])
    subprocess.call(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
