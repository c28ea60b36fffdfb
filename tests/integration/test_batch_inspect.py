"""`tessera batch inspect` validates a batch (issue 41 item 6): by default it prints a
summary, not the records. On the demo's sample batch (gen_sample.py: JSON + CSV + Avro,
900 records) stdout is a few lines (files, records by kind, dense and sparse dimensions,
the token namespaces color and shape and the numeric ones price and rating), exit 0;
--records prints the 900 records as before. A batch with a JSON syntax error in the middle
of a file is rejected (exit 1) with the error named FILE:LINE and column on stderr (and
not "near end of file"), and the summary still shows what was read."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESSERA = os.path.join(os.environ["TSR_BIN"], "tessera")


def inspect(root, dims, *extra):
    return subprocess.run([TESSERA, "batch", "inspect", "--batch-root", root, "--dimensions",
                           str(dims)] + list(extra), capture_output=True, timeout=120,
                          text=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "batch")
        subprocess.run([sys.executable, os.path.join(HERE, "..", "data", "gen_sample.py"), root,
                        "--n", "900"], check=True, capture_output=True, timeout=120)
        r = inspect(root, 64)
        assert r.returncode == 0, (r.returncode, r.stderr)
        out = r.stdout
        print(out)
        assert len(out) < 4096 and len(out.splitlines()) < 30, "not a summary: %d bytes" % len(out)
        assert '"embedding"' not in out, out
        for want in ("3 files", "900 records", "dense dimensions: 64", "color", "shape",
                     "price", "rating", "token namespaces: 2", "numeric namespaces: 2",
                     "sparse dimensions: "):
            assert want in out, (want, out)
        assert "batch %s: accepted" % root in r.stderr, r.stderr
        r = inspect(root, 64, "--records")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == 900 and '"embedding"' in r.stdout

        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        with open(os.path.join(bad, "data.json"), "w") as f:
            f.write('{"id":"a","embedding":[1,2],"restricts":[{"namespace":"colour","allow":["red"]}]}\n'
                    '{"id":"b","embedding":[1,2\n'
                    '{"id":"c","embedding":[3,4]}\n')
        r = inspect(bad, 2)
        print(r.stderr + r.stdout)
        assert r.returncode == 1, r.returncode
        assert "data.json:2: INVALID_JSON_SYNTAX: column " in r.stderr, r.stderr
        assert "end of file" not in r.stderr, r.stderr
        assert "rejected" in r.stdout and "2 records" in r.stdout and "colour" in r.stdout, r.stdout
        r = inspect(bad, 2, "--records")
        assert r.returncode == 1 and r.stdout == "", r.stdout
    print("test_batch_inspect: OK")


if __name__ == "__main__":
    main()
