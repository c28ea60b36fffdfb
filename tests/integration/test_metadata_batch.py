"""embedding_metadata through a batch (issue 17): JSON records carrying embedding_metadata
are loaded with UpdateIndex; tessera.v1 ReadIndexDatapoints and FindNeighbors with
return_full_datapoint return it equal (a google.protobuf.Struct: JSON numbers come back
as doubles, the only change protobuf's JSON mapping makes); FindNeighbors without
return_full_datapoint does not send it; the container API's BatchGetEmbeddings returns it too.
It stays through a delta update that does not touch
its record (the shard copies records into version N+1) and through a restart of every shard
(the shard's meta file), and is gone when its record is replaced without it.

Refused, never dropped: metadata over 64 KiB serialized, a metadata that is not an object
(both: the batch is REJECTED, the report names the file, the line and
`embedding_metadata`), and an Avro file whose writer schema has an embedding_metadata field
(the Avro format cannot carry it: the file is an error saying so). Nothing changes then.
A Struct nested 200000 deep over gRPC is INVALID_ARGUMENT before it is unpacked (protobuf-c
would recurse once per level), and the coordinator lives. `tessera upsert` (a streamed write)
carries it, `tessera read` prints it, and it survives kill -9 of every shard (WAL replay).
"""
import json
import os
import sys

import numpy as np
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

D = 8
N = 300


def as_struct_json(o):
    """o as it reads back from a google.protobuf.Struct: every number a float."""
    if isinstance(o, dict):
        return {k: as_struct_json(v) for k, v in o.items()}
    if isinstance(o, list):
        return [as_struct_json(v) for v in o]
    if isinstance(o, bool) or o is None or isinstance(o, str):
        return o
    return float(o)


def metadata_of(i):
    """Varied metadata for record i (None for every third record)."""
    if i % 3 == 0:
        return None
    m = {"title": "item %d \u00e9\u6f22" % i, "rank": i, "price": i * 0.25,
         "in_stock": i % 2 == 0, "discontinued": None,
         "tags": ["t%d" % (i % 5), i % 7, [], {}], "dims": {"w": {"cm": [i, i + 0.5]}}}
    if i % 9 == 1:
        m["long"] = "x" * 5000
    return m


def _varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _ld(num, payload):
    return bytes([num << 3 | 2]) + _varint(len(payload)) + payload


def deep_struct(depth):
    """A google.protobuf.Struct {"a": {"a": ... {}}} nested depth objects deep (3 message
    levels each: map entry, Value, Struct), built without copying it depth times."""
    parts, n = [], 0
    for _ in range(depth):
        value_len = 1 + len(_varint(n)) + n
        entry_len = 3 + 1 + len(_varint(value_len)) + value_len
        parts.append(b"\x0a" + _varint(entry_len) + b"\x0a\x01a\x12" + _varint(value_len) +
                     b"\x2a" + _varint(n))
        n = 1 + len(_varint(entry_len)) + entry_len
    return b"".join(reversed(parts))


def hostile_nesting(cl, tp):
    """Struct is recursive and protobuf-c's unpack recurses per level: a few MB nested
    200000 deep must be refused before the unpack (INVALID_ARGUMENT), not crash."""
    import grpc
    import struct
    ident = lambda b: b  # noqa: E731
    idx = b"projects/p/locations/l/indexes/i"
    vec = _ld(2, b"".join(struct.pack("<f", 0.5) for _ in range(D)))
    for depth, ok in ((60, True), (200000, False)):
        dp = _ld(1, b"q") + vec + _ld(8, deep_struct(depth))
        for method, req in (("/tessera.v1.VectorSearch/FindNeighbors", _ld(3, _ld(1, dp))),
                            ("/google.cloud.aiplatform.v1.MatchService/FindNeighbors",
                             _ld(3, _ld(1, dp))),
                            ("/google.cloud.aiplatform.v1.IndexService/UpsertDatapoints",
                             _ld(1, idx) + _ld(2, dp))):
            f = cl.channel.unary_unary(method, request_serializer=ident,
                                       response_deserializer=ident)
            try:
                f(req, timeout=30)
                code, det = grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                code, det = e.code(), e.details()
            if ok:  # accepted by the check (an upsert may still be refused by its path)
                assert "nest deeper" not in det, (method, depth, code, det)
            else:
                assert code == grpc.StatusCode.INVALID_ARGUMENT and \
                    "sub-messages nest deeper than 256 levels" in det, (method, code, det)
    assert cl.coord.proc.poll() is None, "coordinator died"
    print("nesting: 60 JSON levels of metadata accepted, 200000 (%d bytes) INVALID_ARGUMENT "
          "before the unpack, on tessera.v1 and aiplatform.v1; the coordinator lives" %
          len(deep_struct(200000)))


def read(cl, tp, ids):
    r = cl.stub.ReadIndexDatapoints(tp.ReadIndexDatapointsRequest(ids=ids), timeout=30)
    return {d.datapoint_id: d for d in r.datapoints}


def md(dp):
    return json_format.MessageToDict(dp.embedding_metadata) \
        if dp.HasField("embedding_metadata") else None


def main():
    tp = ch.stubs()[0]
    rng = np.random.default_rng(17)
    x = rng.normal(size=(N, D)).astype("float32")
    root = sh.tmpdir("tsr-meta-")
    recs = []
    for i in range(N):
        r = ch.dp_json("m%04d" % i, x[i])
        if metadata_of(i) is not None:
            r["embedding_metadata"] = metadata_of(i)
        recs.append(r)
    recs[3]["embedding_metadata"] = {}  # an empty object: nothing to store
    b1 = ch.write_batch(os.path.join(root, "b1"), recs, per_file=120)
    ids = ["m%04d" % i for i in range(N)]
    cl = ch.Cluster(2, D, {"nlist": 4, "pq_m": 2, "nprobe": 4})
    try:
        op = cl.update(b1)
        assert op.state == tp.Operation.SUCCEEDED, op

        def check_all(tag, changed=()):
            got = read(cl, tp, ids)
            assert len(got) == N, (tag, len(got))
            for i in range(N):
                want = None if i in changed else metadata_of(i)
                have = md(got["m%04d" % i])
                assert have == (as_struct_json(want) if want is not None else None), \
                    (tag, i, have, want)
            return got

        check_all("v1")
        # FindNeighbors: the neighbors' full datapoints carry it, plain answers do not
        qs = [5, 7, 10, 11]
        for full in (True, False):
            r = cl.stub.FindNeighbors(tp.FindNeighborsRequest(
                queries=[ch.query(tp, x[i], 3, fraction=1.0) for i in qs],
                return_full_datapoint=full), timeout=30)
            for i, nn in zip(qs, r.nearest_neighbors):
                top = nn.neighbors[0].datapoint
                assert top.datapoint_id == "m%04d" % i, (i, top.datapoint_id)
                for nb in nn.neighbors:
                    j = int(nb.datapoint.datapoint_id[1:])
                    want = as_struct_json(metadata_of(j)) if full and metadata_of(j) else None
                    assert md(nb.datapoint) == want, (full, j, md(nb.datapoint))
        # the container API's BatchGetEmbeddings (Embedding.embedding_metadata = 7)
        import vertex_harness as vh
        mp, mpg = vh.vstubs()
        ge = mpg.MatchServiceStub(cl.channel).BatchGetEmbeddings(
            mp.BatchGetEmbeddingsRequest(id=ids[:12]), timeout=30)
        assert [e.id for e in ge.embeddings] == ids[:12], ge
        for i, e in enumerate(ge.embeddings):
            want = metadata_of(i)
            have = json_format.MessageToDict(e.embedding_metadata) \
                if e.HasField("embedding_metadata") else None
            assert have == (as_struct_json(want) if want else None), (i, have)
        print("v1: %d records, metadata read back equal (ReadIndexDatapoints, full "
              "FindNeighbors datapoints, container BatchGetEmbeddings; none without "
              "return_full_datapoint)" % N)

        # a delta that does not touch most records; m0001 replaced without metadata,
        # m0002 replaced with new metadata, m0004 deleted
        new2 = {"replaced": True, "n": [1, 2, 3]}
        r1 = ch.dp_json("m0001", x[1])
        r2 = dict(ch.dp_json("m0002", x[2]), embedding_metadata=new2)
        b2 = ch.write_batch(os.path.join(root, "b2"), [r1, r2], deletes=["m0004"])
        op = cl.update(b2)
        assert op.state == tp.Operation.SUCCEEDED, op
        got = read(cl, tp, ids)
        assert "m0004" not in got and md(got["m0001"]) is None, got.get("m0001")
        assert md(got["m0002"]) == as_struct_json(new2), md(got["m0002"])
        for i in range(5, N):
            want = metadata_of(i)
            assert md(got["m%04d" % i]) == (as_struct_json(want) if want else None), i
        print("v2 (delta): untouched records keep their metadata, a replaced record takes "
              "the new one's (or none), a deleted one is gone")

        # every shard restarted: read back from the shards' stored versions
        for k, s in enumerate(cl.shards):
            s.stop()
            cl.shards[k] = sh.restart(s)
        import grpc
        import time
        t0 = time.time()
        while True:  # the coordinator reconnects to the restarted shards (with backoff)
            try:
                got = read(cl, tp, ids[5:])
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() - t0 > 60:
                    raise
                time.sleep(0.2)
        for i in range(5, N):
            want = metadata_of(i)
            assert md(got["m%04d" % i]) == (as_struct_json(want) if want else None), i
        print("after a restart of every shard: the same metadata")

        # refused, never dropped
        big = ch.dp_json("big", x[0])
        big["embedding_metadata"] = {"blob": "y" * 70000}
        bad = [("too large", [ch.dp_json("ok1", x[0]), big],
                "line 2", "\"embedding_metadata\" is more than 65536 bytes serialized"),
               ("not an object", [dict(ch.dp_json("s", x[0]), embedding_metadata="red")],
                "line 1", "\"embedding_metadata\" must be a JSON object"),
               ("misspelt", [dict(ch.dp_json("s", x[0]), metadata={"a": 1})],
                "line 1", "did you mean 'embedding_metadata'")]
        st0 = cl.stats()
        for what, rr, where, msg in bad:
            b = ch.write_batch(os.path.join(root, "bad-" + what.replace(" ", "-")), rr)
            op = cl.update(b)
            assert op.state == tp.Operation.REJECTED, (what, op)
            rep = json.loads(op.report_json)
            errs = [(f["file"], e["line"], e["type"], e["message"])
                    for f in rep["files"] for e in f["errors"]]
            assert len(errs) == 1, (what, errs)
            f, line, typ, m = errs[0]
            assert f == "part-00000.json" and line == int(where.split()[1]), (what, errs)
            assert typ == "PARSING_ERROR" and msg in m, (what, errs)
        # Avro: a writer schema with embedding_metadata is refused (the format cannot carry it)
        import avro.datafile
        import avro.io
        import avro.schema
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "..", "data", "feature_vector.avsc")) as f:
            schema = json.load(f)
        schema["fields"].append({"name": "embedding_metadata", "type": ["null", "string"],
                                 "default": None})
        ab = os.path.join(root, "bad-avro")
        os.makedirs(ab)
        with open(os.path.join(ab, "part.avro"), "wb") as f:
            w = avro.datafile.DataFileWriter(f, avro.io.DatumWriter(),
                                             avro.schema.parse(json.dumps(schema)))
            w.append({"id": "a1", "embedding": [float(v) for v in x[0]], "sparse_embedding": None,
                      "restricts": None, "numeric_restricts": None, "crowding_tag": None,
                      "embedding_metadata": "{\"k\": 1}"})
            w.close()
        op = cl.update(ab)
        text = op.report_json + op.error
        assert op.state == tp.Operation.REJECTED, op
        assert "part.avro" in text and "cannot carry embedding metadata" in text, text[:2000]
        st1 = cl.stats()
        assert st1.version == st0.version and st1.vectors_count == st0.vectors_count, (st0, st1)
        print("refused (batch REJECTED, nothing changed): metadata over 64 KiB, not an object, "
              "misspelt, and an Avro schema with embedding_metadata")
        hostile_nesting(cl, tp)

        # the CLI: `tessera upsert` (JSON lines) carries it, `tessera read` prints it
        import subprocess
        line = dict(ch.dp_json("cli-1", x[9]), embedding_metadata={"via": "cli", "n": [1, 2]})
        exe = os.path.join(ch.BIN, "tessera")
        p = subprocess.run([exe, "upsert", "--target", cl.target, "--json", "-"],
                           input=json.dumps(line) + "\n", capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert md(read(cl, tp, ["cli-1"])["cli-1"]) == {"via": "cli", "n": [1.0, 2.0]}
        p = subprocess.run([exe, "read", "--target", cl.target, "cli-1"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["embedding_metadata"] == {"via": "cli", "n": [1.0, 2.0]}, \
            p.stdout
        # a streamed write lives in the shards' write-ahead log until the next fold: kill -9
        # every shard, restart, and the replayed log still holds the metadata
        for k, s_ in enumerate(cl.shards):
            s_.kill()
            cl.shards[k] = sh.restart(s_)
        t0 = time.time()
        while True:
            try:
                got = read(cl, tp, ["cli-1"])
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() - t0 > 60:
                    raise
                time.sleep(0.2)
        assert md(got["cli-1"]) == {"via": "cli", "n": [1.0, 2.0]}, got
        print("tessera upsert carries embedding_metadata, tessera read prints it; it survives "
              "kill -9 of every shard (write-ahead log replay)")
    finally:
        cl.stop()
    print("ok")


if __name__ == "__main__":
    main()
