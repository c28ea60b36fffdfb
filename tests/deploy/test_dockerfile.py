#!/usr/bin/env python3
"""Static lint of deploy/docker/Dockerfile (no docker engine runs here).

Checks: multi-stage on Debian 12; the build stage runs `make deps` and `make`; every
package the Dockerfile installs exists in Debian 12 (`apt-cache show`); the binaries it
copies are exactly the ones the Makefile builds; the runtime stage runs as a non-root
user; and every shared library the built binaries need (ldd → dpkg -S) is provided by
the runtime packages or their dependencies (apt-cache depends --recurse).
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOCKERFILE = os.path.join(ROOT, "deploy", "docker", "Dockerfile")
BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def logical_lines(text):
    out, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        out.append(cur + s)
        cur = ""
    if cur:
        out.append(cur)
    return out


def main():
    lines = logical_lines(open(DOCKERFILE).read())
    stages = []  # [name, image, [instructions]]
    for ln in lines:
        ins, _, rest = ln.partition(" ")
        ins = ins.upper()
        if ins == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest.strip(), re.I)
            check(m is not None, "FROM line unparsable: " + ln)
            stages.append([m.group(2), m.group(1), []])
        else:
            check(bool(stages), "instruction before FROM: " + ln)
            stages[-1][2].append((ins, rest.strip()))
    check(len(stages) >= 2, "Dockerfile must be multi-stage")
    for name, image, _ in stages:
        check(re.match(r"debian:(12|bookworm)(-slim)?$", image) is not None,
              "stage %s: base %s is not Debian 12" % (name, image))
    build, runtime = stages[0], stages[-1]
    build_runs = " ".join(r for i, r in build[2] if i == "RUN")
    check("make deps" in build_runs, "build stage must run `make deps`")
    check(re.search(r"\bmake\b(?! deps)(?! clean)", build_runs.replace("make deps", "")) is not None,
          "build stage must run `make`")

    # packages installed anywhere
    pkgs = {}
    for name, _, ins in stages:
        for i, r in ins:
            if i != "RUN":
                continue
            for seg in re.split(r"&&|;", r):
                m = re.search(r"apt-get\s+install\s+(.*)", seg)
                if m:
                    for tok in m.group(1).split():
                        if not tok.startswith("-"):
                            pkgs.setdefault(name, []).append(tok)
    runtime_pkgs = pkgs.get(runtime[0], [])
    check(len(runtime_pkgs) >= 5, "runtime stage installs its libraries with apt-get")
    have_apt = shutil.which("apt-cache") is not None
    if have_apt:
        for stage, lst in pkgs.items():
            for p in lst:
                r = subprocess.run(["apt-cache", "show", p], capture_output=True, text=True)
                check(r.returncode == 0 and "Package: " + p in r.stdout,
                      "stage %s: package %s not in apt-cache show" % (stage, p))
    else:
        print("note: no apt-cache, package existence not checked")
    for p in runtime_pkgs:
        check(not p.endswith("-dev"), "runtime stage installs a -dev package: " + p)

    # binaries copied vs Makefile targets
    mk = open(os.path.join(ROOT, "Makefile")).read()
    made = set(re.findall(r"^\$\(BIN\)/([\w-]+):", mk, re.M))
    check(made == {"tessera", "tessera-shard", "tessera-coordinator"},
          "Makefile binaries changed: %s (update the Dockerfile and this test)" % sorted(made))
    copied = set()
    for i, r in runtime[2]:
        if i == "COPY":
            m = re.match(r"--from=(\S+)\s+(\S+)\s+(\S+)$", r)
            if m:
                check(m.group(1) == build[0], "COPY --from an unknown stage: " + r)
                check(m.group(2).startswith("/src/bin/"), "copied file not from bin/: " + r)
                copied.add(os.path.basename(m.group(2)))
    check(copied == made, "copied binaries %s != Makefile's %s" % (sorted(copied), sorted(made)))
    strip = [r for i, r in build[2] if i == "RUN" and "strip" in r]
    for b in made:
        check(any("bin/" + b in s for s in strip) or not strip, "strip misses " + b)

    # non-root user
    users = [r for i, r in runtime[2] if i == "USER"]
    check(bool(users), "runtime stage has no USER")
    if users:
        u = users[-1].split(":")[0]
        check(u not in ("root", "0"), "runtime runs as root")
    check(any(i == "ENTRYPOINT" for i, _ in runtime[2]), "runtime has no ENTRYPOINT")

    # shared libraries of the built binaries are covered by the runtime packages
    if have_apt and shutil.which("dpkg"):
        r = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                            "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
                           + runtime_pkgs, capture_output=True, text=True)
        closure = set(runtime_pkgs)
        for ln in r.stdout.splitlines():
            s = ln.strip()
            if s.startswith("Depends:") or s.startswith("PreDepends:"):
                closure.add(s.split(":", 1)[1].strip().strip("<>").split(":")[0])
            elif s and not s.startswith("|") and ":" not in s:
                closure.add(s)
        closure |= {"libc6", "libgcc-s1"}  # in the base image
        needs = {}  # library path -> binaries needing it
        for b in sorted(made):
            path = os.path.join(BIN, b)
            if not os.path.exists(path):
                print("note: %s not built, its libraries not checked" % b)
                continue
            out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
            for ln in out.splitlines():
                m = re.search(r"=>\s+(/\S+)", ln)
                # Sanitizer runtimes appear only in SANITIZE= builds (the suite also runs
                # against those); the image builds and ships release binaries.
                if m and re.search(r"/lib(asan|ubsan|tsan)\.so", m.group(1)):
                    continue
                if m:
                    needs.setdefault(m.group(1), set()).add(b)
        owner = {}
        paths = sorted(set(needs) | {os.path.realpath(p) for p in needs})
        d = subprocess.run(["dpkg", "-S"] + paths, capture_output=True, text=True)  # one call: fast
        for ln in d.stdout.splitlines():
            pkg, _, f = ln.partition(": ")
            owner[f.strip()] = pkg.split(":")[0].strip()
        checked = 0
        for lib, bins in sorted(needs.items()):
            pkg = owner.get(lib) or owner.get(os.path.realpath(lib))
            if not pkg:
                continue
            checked += 1
            check(pkg in closure, "%s need %s (package %s), not in the runtime image"
                  % (sorted(bins), lib, pkg))
        print("shared libraries checked:", checked)
    if fails:
        print("%d problem(s)" % len(fails))
        sys.exit(1)
    print("Dockerfile OK: %d stages, runtime packages %s, binaries %s"
          % (len(stages), runtime_pkgs, sorted(copied)))


if __name__ == "__main__":
    main()
