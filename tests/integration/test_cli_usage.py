"""The usage surface of the `tessera` binary: one parser for every command.

- a bad numeric flag is a usage error (exit 2) on one line that names the flag, the range
  and the value given, prefixed "tessera <command>: ", without the whole usage text;
- an unknown option names itself; a mistyped restrict (`--numeric 'price~=3'`,
  `--restrict 'color!=red'`) names the bad value and lists the accepted forms;
- `tessera --version`, `tessera help [GROUP [COMMAND]]`, `tessera index` (the group's
  commands), `tessera cluster --help`;
- every command's --help ends with its exit codes.

No server is needed: the one command that gets past its flags here aims at a closed port.
"""
import os
import re
import socket
import subprocess
import sys

BIN = os.path.join(os.environ.get("TSR_BIN", "bin"), "tessera")
failures = []


def run(*args):
    return subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=60)


def check(cond, what, r=None):
    if not cond:
        detail = "" if r is None else " (exit %d)\n  stdout: %r\n  stderr: %r" % (
            r.returncode, r.stdout[-800:], r.stderr[-800:])
        failures.append(what + detail)
        print("FAIL", what + detail)


def usage_error(args, prefix, *want):
    """args give exit 2 with one stderr line starting with prefix and holding every want."""
    r = run(*args)
    what = "tessera " + " ".join(args)
    check(r.returncode == 2, what + ": exit 2", r)
    lines = r.stderr.strip().splitlines()
    check(len(lines) >= 1 and lines[0].startswith(prefix), what + ": starts with " + prefix, r)
    check(all(w in r.stderr for w in want), what + ": names %r" % (want,), r)
    check("usage:" not in r.stderr, what + ": no whole usage text", r)
    return r


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "127.0.0.1:%d" % port


# ---- numeric flags: the flag, the range, the value
Q = ["query", "--target", "127.0.0.1:1", "--vector", "1,2"]
usage_error(Q + ["--k", "0"], "tessera query: --k:", "from 1 to 10000", "'0'")
usage_error(Q + ["--k", "abc"], "tessera query: --k:",
            "expected an integer from 1 to 10000, got 'abc'")
usage_error(Q + ["--k=7x"], "tessera query: --k:", "'7x'")
usage_error(Q + ["--fraction", "2"], "tessera query: --fraction:", "from 0 to 1", "'2'")
usage_error(Q + ["--alpha", "x"], "tessera query: --alpha:", "'x'")
usage_error(Q + ["--candidates", "-1"], "tessera query: --candidates:", "'-1'")
usage_error(Q + ["--crowding", "many"], "tessera query: --crowding:", "'many'")
usage_error(Q + ["--timeout-ms", "0"], "tessera query: --timeout-ms:", "'0'")
usage_error(["update", "--target", "t", "--batch-root", "b", "--max-invalid-records", "x"],
            "tessera update: --max-invalid-records:", "'x'")
usage_error(["update", "--target", "t", "--batch-root", "b", "--timeout-s", "soon"],
            "tessera update: --timeout-s:", "'soon'")
usage_error(["health", "--target", "t", "--timeout-ms", "0"], "tessera health: --timeout-ms:",
            "from 1 to 600000", "'0'")
usage_error(["index", "search", "--k", "0"], "tessera index search: --k:", "'0'")
usage_error(["index", "search", "--threads", "999"], "tessera index search: --threads:",
            "from 1 to 256")
usage_error(["index", "search", "--k-factor", "0.5"], "tessera index search: --k-factor:", "'0.5'")
usage_error(["index", "build", "--nlist", "x"], "tessera index build: --nlist:", "'x'")
usage_error(["index", "build", "--pq-nbits", "17"], "tessera index build: --pq-nbits:",
            "from 1 to 16")
usage_error(["batch", "inspect", "--batch-root", "b", "--dimensions", "x"],
            "tessera batch inspect: --dimensions:", "'x'")
usage_error(["cluster", "up", "--data", "d", "--shards", "0"], "tessera cluster up: --shards:",
            "from 1 to 64", "'0'")
usage_error(["cluster", "up", "--data", "d", "--port", "http"], "tessera cluster up: --port:",
            "'http'")
usage_error(["cluster", "up", "--data", "d", "--nlist", "0"], "tessera cluster up: --nlist:")

# ---- unknown options, missing values, missing required flags, stray arguments
usage_error(["query", "--kk", "3"], "tessera query: unknown option --kk", "--help")
usage_error(["stats", "--target"], "tessera stats: --target needs a value")
usage_error(["stats"], "tessera stats: --target is required")
usage_error(["shards", "add", "--target", "t"], "tessera shards add: --group is required")
usage_error(["shards", "add", "--target", "t", "--group", "nocolon"],
            "tessera shards add: --group nocolon: expected")
usage_error(["shards", "remove", "--target", "t", "--group", "256"],
            "tessera shards remove: --group")
usage_error(["read", "--target", "t"], "tessera read: expected at least one ID")
usage_error(["remove", "--target", "t"], "tessera remove: expected at least one ID")
usage_error(["upsert", "--target", "t"], "tessera upsert: --json is required")
usage_error(["upsert", "--target", "t", "--json", "-", "--per-call", "10001"],
            "tessera upsert: --per-call:")
usage_error(Q + ["stray"], "tessera query: unexpected argument 'stray'")
usage_error(["index", "info", "a", "b"], "tessera index info: unexpected argument 'b'")
usage_error(["index", "check"], "tessera index check: expected at least one FILE")

# ---- restricts: the bad value and the accepted forms
r = usage_error(Q + ["--numeric", "price~=3"], "tessera query: --numeric 'price~=3':",
                "< <= = == != >= >", "price>=3")
r = usage_error(Q + ["--restrict", "color!=red"], "tessera query: --restrict 'color!=red':",
                "NS=TOKEN", "--deny 'color=red'")
usage_error(Q + ["--deny", "color"], "tessera query: --deny 'color':", "NS=TOKEN")
usage_error(Q + ["--numeric", "price=>3"], "tessera query: --numeric 'price=>3':")
usage_error(Q + ["--numeric", "price >= 3"], "tessera query: --numeric 'price >= 3':")
# the accepted forms get past the parser: the closed port fails the call (exit 1, not 2)
target = closed_port()
for ok in (["--numeric", "price=3"], ["--numeric", "price==3"], ["--numeric", "price!=1.5f"],
           ["--numeric", "price<2.5"], ["--restrict", "color=red,blue", "--deny", "shape=box"]):
    r = run("query", "--target", target, "--vector", "1,2", "--timeout-ms", "3000", *ok)
    check(r.returncode == 1 and "tessera query: FindNeighbors on" in r.stderr,
          "query %s: accepted, fails only at the closed port" % " ".join(ok), r)
r = run("query", "--help")
check(r.returncode == 0 and "< <= = == != >= >" in r.stdout and "(= is ==)" in r.stdout,
      "query --help documents the = operator", r)

# ---- the top level
r = run("--version")
check(r.returncode == 0 and re.fullmatch(r"tessera \d+\.\d+\.\d+\S*\n", r.stdout) is not None,
      "tessera --version prints 'tessera X.Y.Z'", r)
for prog in ("tessera-shard", "tessera-coordinator"):
    r = subprocess.run([os.path.join(os.path.dirname(BIN), prog), "--version"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and re.fullmatch(prog + r" \d+\.\d+\.\d+\S*\n", r.stdout) is not None,
          "%s --version prints '%s X.Y.Z'" % (prog, prog), r)
r = subprocess.run([os.path.join(os.path.dirname(BIN), "tessera-coordinator"), "--help"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 0 and "MatchService" in r.stdout and "--version" in r.stdout,
      "tessera-coordinator --help names the Vertex MatchService it serves", r)
r = run("help")
check(r.returncode == 0 and "usage: tessera" in r.stdout and "cluster" in r.stdout,
      "tessera help prints the usage", r)
r = run("help", "query")
check(r.returncode == 0 and "usage: tessera query" in r.stdout, "tessera help query", r)
r = run("help", "index", "search")
check(r.returncode == 0 and "usage: tessera index search" in r.stdout,
      "tessera help index search", r)
r = run("index")
check(r.returncode == 2 and "usage: tessera index <command>" in r.stderr and "search" in r.stderr,
      "tessera index lists the index commands (exit 2: a command is missing)", r)
for args in (["index", "--help"], ["help", "index"]):
    r = run(*args)
    check(r.returncode == 0 and "usage: tessera index <command>" in r.stdout and "rewrite" in
          r.stdout, "tessera %s lists the index commands" % " ".join(args), r)
r = run("cluster", "--help")
check(r.returncode == 0 and "usage: tessera cluster <command>" in r.stdout and "up" in r.stdout,
      "tessera cluster --help lists its commands", r)
r = run("index", "bogus")
check(r.returncode == 2 and "unknown command 'index bogus'" in r.stderr and
      "tessera index --help" in r.stderr, "tessera index bogus", r)
r = run("bogus")
check(r.returncode == 2 and "tessera: unknown command 'bogus'" in r.stderr, "tessera bogus", r)
# a typo names the unknown word, not its options, and the nearest command (issue 41)
r = run("querry", "--target", "127.0.0.1:1")
check(r.returncode == 2 and "unknown command 'querry';" in r.stderr and
      "did you mean 'query'?" in r.stderr and "--target" not in r.stderr, "tessera querry", r)
r = run("cluster", "upp", "--data", "x")
check(r.returncode == 2 and "unknown command 'cluster upp'; did you mean 'cluster up'?" in
      r.stderr, "tessera cluster upp", r)
# a --target without a port is HOST:7000 (cluster up's default), not gRPC's 443
r = run("health", "--target", "localhost", "--timeout-ms", "500")
check(r.returncode == 0 or "localhost:7000" in r.stderr, "--target localhost is localhost:7000", r)
r = run()
check(r.returncode == 2 and "usage: tessera" in r.stderr, "tessera alone: usage, exit 2", r)

# ---- every command's --help: exit 0, on stdout, with its exit codes
for cmd in (["index", "build"], ["index", "search"], ["index", "check"], ["index", "info"],
            ["index", "rewrite"], ["batch", "inspect"], ["query"], ["update"], ["read"],
            ["upsert"], ["remove"], ["stats"], ["health"], ["cluster", "up"],
            ["shards", "add"], ["shards", "remove"], ["cluster", "add-group"]):
    r = run(*(cmd + ["--help"]))
    check(r.returncode == 0 and r.stdout.startswith("usage: tessera " + " ".join(cmd)) and
          re.search(r"Exit( status:)? 0", r.stdout) and
          re.search(r"\b2,? (on )?usage error", r.stdout.replace("\n", " ")),
          "tessera %s --help gives its exit codes" % " ".join(cmd), r)

if failures:
    print("%d failures" % len(failures))
    sys.exit(1)
print("tessera usage: numeric flags, restricts, help, --version: all checks passed")
