#!/usr/bin/env python3
"""Batch input rules of SPEC §2, end to end through `tessera batch inspect`.

Each case builds a batch_root in a temp dir, runs the CLI and checks exit code, stdout
(JSON lines sorted by id, deletes last) and the JSON report (--report). Every rule has a
case that fails without it.
"""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

BIN = os.environ.get("TSR_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "bin"))
TESSERA = os.path.join(BIN, "tessera")
failures = []


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


class Batch:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="tsr_batch_rules_")

    def put(self, name, data):
        p = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def inspect(self, dims, *extra):
        rep = os.path.join(self.root + "_report.json")
        r = subprocess.run([TESSERA, "batch", "inspect", "--batch-root", self.root,
                            "--dimensions", str(dims), "--report", rep, "--records"] + list(extra),
                           capture_output=True, timeout=120)
        with open(rep) as f:
            report = json.load(f)
        os.unlink(rep)
        lines = [json.loads(l) for l in r.stdout.decode().splitlines()]
        return r.returncode, lines, report, r.stderr.decode()

    def close(self):
        shutil.rmtree(self.root)


def case(fn):
    b = Batch()
    try:
        fn(b)
        print("ok  ", fn.__name__)
    except AssertionError as e:
        failures.append(fn.__name__)
        print("FAIL", fn.__name__, e)
    finally:
        b.close()
    return fn


def errors_of(report):
    return [(f["file"], e.get("line", e.get("record")), e["type"]) for f in report["files"]
            for e in f["errors"]]


@case
def seed_csv_and_json(b):
    b.put("feature_file_1.csv",
          "6,7,-8.1,40:0.1,901:-0.2,1111:0.5,crowding_tag=test,color=red,color=blue,"
          "color=!purple,ratio=0.1f\n"
          "8,1,2,#ratio=0.1f,#size=3i,#weight=0.3d\n")
    b.put("feature_file_2.json",
          '{"id": "3", "sparse_embedding": {"values": [0.1, 0.2], "dimensions": [1, 4]}}\n'
          '{"id": "4", "sparse_embedding": {"values": [-0.4, 0.2, -1.3], "dimensions": [10, 20, 20]}}\n')
    b.put("delete/delete_file.txt", "99\n")
    rc, lines, rep, _ = b.inspect(2)
    assert rc == 0, (rc, rep)
    assert [l["id"] for l in lines] == ["3", "4", "6", "8", "99"], lines
    six = lines[2]
    assert six == {"id": "6", "embedding": [7, -8.1],
                   "sparse_embedding": {"values": [0.1, -0.2, 0.5], "dimensions": [40, 901, 1111]},
                   "restricts": [{"namespace": "color", "allow": ["red", "blue"], "deny": ["purple"]},
                                 {"namespace": "ratio", "allow": ["0.1f"]}],
                   "crowding_tag": "test"}, six
    assert lines[3]["numeric_restricts"] == [{"namespace": "ratio", "value_float": 0.1},
                                             {"namespace": "size", "value_int": 3},
                                             {"namespace": "weight", "value_double": 0.3}], lines[3]
    assert lines[1]["sparse_embedding"]["dimensions"] == [10, 20]
    assert f32(lines[1]["sparse_embedding"]["values"][1]) == f32(f32(0.2) + f32(-1.3))
    assert lines[4] == {"id": "99", "delete": True}
    assert rep["accepted"] is True and rep["upserts"] == 4 and rep["deletes"] == 1
    assert rep["records"] == 5 == rep["valid_records"] + rep["invalid_records"], rep


@case
def floats_round_trip(b):
    vals = ["0.1", "1e-45", "3.4028235e38", "-0.0", "0x1.8p1", "16777217", "1.17549435E-38f"]
    b.put("a.csv", "x," + ",".join(vals) + "\n")
    rc, lines, rep, _ = b.inspect(len(vals))
    assert rc == 0, rep
    want = [f32(float.fromhex(v) if "0x" in v else float(v.rstrip("f"))) for v in vals]
    got = [f32(v) for v in lines[0]["embedding"]]
    assert got == want, (got, want)
    # shortest form: 0.1 prints as 0.1, not 0.100000001
    assert '"embedding": [0.1,' in json.dumps(lines[0]), lines[0]


@case
def too_many_objects(b):
    for i in range(5001):
        b.put("f%05d.csv" % i, "")
    rc, lines, rep, _ = b.inspect(1)
    assert rc == 1 and lines == [], rc
    assert any("5001 objects" in e for e in rep["errors"]), rep["errors"]


@case
def subfolder_rejected(b):
    b.put("a.csv", "x,1\n")
    b.put("extra/b.csv", "y,1\n")
    rc, _, rep, _ = b.inspect(1)
    assert rc == 1
    assert any("subfolder 'extra/'" in e for e in rep["errors"]), rep["errors"]


@case
def bad_suffix_rejected(b):
    b.put("a.csv", "x,1\n")
    b.put("a.txt", "y,1\n")
    rc, _, rep, _ = b.inspect(1)
    assert rc == 1
    assert any("'a.txt' has an unsupported suffix" in e for e in rep["errors"]), rep["errors"]


@case
def gzip_named_json_rejected(b):
    b.put("data.json", gzip.compress(b'{"id": "1", "embedding": [1]}\n'))
    rc, _, rep, _ = b.inspect(1, "--max-invalid-records", "100")
    assert rc == 1
    assert any("data.json" in e and "gzip" in e for e in rep["errors"]), rep["errors"]


@case
def data_and_delete_conflict(b):
    b.put("a.json", '{"id": "1", "embedding": [1]}\n{"id": "2", "embedding": [2]}\n')
    b.put("delete/ids", "2\n")
    rc, _, rep, _ = b.inspect(1)
    assert rc == 1
    assert any("id '2' is in data file a.json (line 2) and in delete file delete/ids" in e
               for e in rep["errors"]), rep["errors"]


@case
def duplicates_counted_once(b):
    b.put("a.csv", "1,1\n1,2\n")
    b.put("b.json", '{"id": "1", "embedding": [3]}\n')
    rc, lines, rep, _ = b.inspect(1)
    assert rc == 0, rep
    assert lines == [{"id": "1", "embedding": [3]}], lines
    assert rep["upserts"] == 1 and rep["duplicates"] == 2 and rep["records"] == 3, rep
    assert rep["valid_records"] == rep["upserts"] + rep["deletes"] + rep["duplicates"], rep
    assert rep["warnings_total"] == 1 and "appears 3 times" in rep["warnings"][0], rep["warnings"]


@case
def record_error_types(b):
    b.put("a.csv", "\n"                      # 1 EMPTY_LINE
          "a,1,2,3\n"                        # 2 EMBEDDING_SIZE_MISMATCH
          "b,1,2,5:1,3\n"                    # 3 dense after sparse
          "c,1,2,#s=1i,#s=2i\n"              # 4 repeated #name
          "d,1,2,crowding_tag=x,crowding_tag=y\n"  # 5 two crowding tags
          .encode() + b"\xff\xfe,1,2\n" +  # 6 INVALID_ENCODING (id)
          b"e,NaN,1\n"                        # 7
          b"f,1,Infinity\n")                 # 8
    b.put("b.json",
          '{"id": "x", "embedding": [1, 2, 3]}\n'
          '{"id": "y", "sparse_embedding": {"values": [1, 2], "dimensions": [1]}}\n'
          '{"id": "z", "embedding": [1, 2], "numeric_restricts": [{"namespace": "s", "value_int": 1, "op": "LESS"}]}\n'
          '{"id": "w", "embedding": [1, 2], "numeric_restricts": [{"namespace": "s", "value_int": 1, "value_double": 2}]}\n'
          '{"id": "v", "embedding": [1, 2], "restricts": [{"namespace": "c", "allow_list": ["r"]}]}\n')
    rc, lines, rep, _ = b.inspect(2)
    assert rc == 1 and lines == []
    got = errors_of(rep)
    want = [("a.csv", 1, "EMPTY_LINE"), ("a.csv", 2, "EMBEDDING_SIZE_MISMATCH"),
            ("a.csv", 3, "INVALID_CSV_SYNTAX"), ("a.csv", 4, "DUPLICATE_NAMESPACE"),
            ("a.csv", 5, "MULTIPLE_VALUES"), ("a.csv", 6, "INVALID_ENCODING"),
            ("a.csv", 7, "INVALID_EMBEDDING"), ("a.csv", 8, "INVALID_EMBEDDING"),
            ("b.json", 1, "EMBEDDING_SIZE_MISMATCH"), ("b.json", 2, "INVALID_SPARSE_EMBEDDING"),
            ("b.json", 3, "OP_IN_DATAPOINT"), ("b.json", 4, "MULTIPLE_VALUES"),
            ("b.json", 5, "PARSING_ERROR")]
    assert got == want, got
    msgs = [e["message"] for f in rep["files"] for e in f["errors"]]
    assert any("did you mean 'allow'" in m for m in msgs), msgs
    assert rep["error_counts"]["INVALID_EMBEDDING"] == 2, rep["error_counts"]
    assert rep["invalid_records"] == 13 and rep["valid_records"] == 0


@case
def max_invalid_records(b):
    b.put("a.csv", "a,1\nb,1,2\n\nc,3\n")
    rc, lines, rep, _ = b.inspect(1)
    assert rc == 1 and lines == [] and rep["accepted"] is False
    assert "2 invalid records; max_invalid_records is 0" in rep["rejected_reason"], rep
    rc, lines, rep, _ = b.inspect(1, "--max-invalid-records", "1")
    assert rc == 1
    rc, lines, rep, err = b.inspect(1, "--max-invalid-records", "2")
    assert rc == 0 and [l["id"] for l in lines] == ["a", "c"], (rc, lines)
    assert errors_of(rep) == [("a.csv", 2, "EMBEDDING_SIZE_MISMATCH"), ("a.csv", 3, "EMPTY_LINE")]
    assert "a.csv:2: EMBEDDING_SIZE_MISMATCH" in err, err


@case
def counts_add_up(b):
    # a 2-line file, one bad: 2 records read = 1 valid + 1 invalid (before: "records": 1)
    b.put("x.json", '{"id": "a", "embedding": [1, 2]}\n{"id": "b", "embedding": [1]}\n')
    rc, lines, rep, err = b.inspect(2)
    assert rc == 1 and rep["records"] == 2 and rep["valid_records"] == 1, rep
    assert rep["invalid_records"] == 1 and rep["upserts"] == 1, rep
    assert "x.json:2: EMBEDDING_SIZE_MISMATCH" in err, err


@case
def nothing_to_apply_rejected(b):
    # an empty batch_root (before: accepted, and an update made a version equal to the last)
    rc, lines, rep, _ = b.inspect(2)
    assert rc == 1 and rep["accepted"] is False, rep
    assert "nothing to apply: batch_root holds no data file" in rep["rejected_reason"], rep
    # only empty files; and only invalid records although tolerated
    b.put("a.json", "")
    rc, lines, rep, _ = b.inspect(2)
    assert rc == 1 and "no valid record and no id to delete in 1 file" in rep["rejected_reason"]
    b.put("a.json", '{"id": "a", "embedding": [1]}\n')
    rc, lines, rep, _ = b.inspect(2, "--max-invalid-records", "5")
    assert rc == 1 and "nothing to apply" in rep["rejected_reason"], rep
    # one delete id is something to apply
    b.put("delete/ids.txt", "gone\n")
    rc, lines, rep, _ = b.inspect(2, "--max-invalid-records", "5")
    assert rc == 0 and rep["deletes"] == 1, rep


@case
def usage_errors(b):
    for args in ([], ["--batch-root", b.root], ["--batch-root", b.root, "--dimensions", "x"],
                 ["--batch-root", b.root, "--dimensions", "2", "--bogus"]):
        r = subprocess.run([TESSERA, "batch", "inspect"] + args, capture_output=True, timeout=30)
        assert r.returncode == 2, (args, r.returncode)
    r = subprocess.run([TESSERA, "batch", "inspect", "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0 and b"--batch-root" in r.stdout


if failures:
    print("failed:", failures)
    sys.exit(1)
print("all batch rule cases passed")
