#!/usr/bin/env python3
"""The cluster in containers, from the image `make image` built (run by `make test-deploy`).

1. A podman network; 4 shard containers and a coordinator container, each with its data in
   a named volume and `--restart always`; the batch folder mounted read-only into the
   coordinator, its config and client token file too; the peer token file (owned by the
   image's uid, 0400) mounted read-only into every container; the coordinator's port
   published on loopback only. Authentication is on (docs/security.md): the coordinator
   runs with --auth-tokens, --peer-token-file and --batch-root-allow /batch, each shard with
   --peer-token-file.
2. The batch (tests/data/gen_sample.py) applied and queried from the host with bin/tessera
   (its admin token in TSR_TOKEN_FILE); a call without a token is refused UNAUTHENTICATED;
   the same batch applied to a local `tessera cluster up` gives the same top-10.
3. A shard container's process killed (SIGKILL of its pid, as a crash or the OOM killer):
   its restart policy brings it back, at the same version, the answers unchanged. Then
   `podman kill` of it, which podman 4.3 counts as a user stop (the policy leaves it down),
   and `podman start`: same version, same answers.
4. `podman stop` / `podman start` of every container: version and answers unchanged.
5. `podman kube play` of Pod / Deployment / PersistentVolumeClaim / ConfigMap forms derived
   from deploy/k8s (podman has no StatefulSet or Service: the shard StatefulSet becomes one
   Pod per ordinal with its claim, and the ConfigMap's shard addresses name those pods),
   loaded and queried the same way. The manifests' Secret volumes (tessera-auth) become
   read-only hostPath folders holding this run's tokens: podman 4.3's kube play does not
   decode a Secret's data, ignores stringData, items and defaultMode, and panics on a
   secret volume without `optional` (docs/operations.md "what was run"); the claim
   tessera-batch becomes a read-only hostPath of the batch folder.

`cluster up` gets --batch-root-allow for the batch folder.
Everything made here has the unique prefix tsrt<pid>- and is removed by name in `finally`
(also on SIGTERM / SIGINT).
Exit 77 when podman is not installed. Env: TSR_IMAGE (default tessera:<version>),
TSR_BIN (host binaries, default bin/), TSR_DEPLOY_KEEP=1 keeps everything for a post-mortem.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
K8S = os.path.join(ROOT, "deploy", "k8s")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range: tests/ports.py)
SHARDS = 4
DIMS = 64
N = 6000
UID = 10001  # the image's user (Dockerfile USER, manifests runAsUser)
P = "tsrt%d-" % os.getpid()
made = {"container": [], "volume": [], "network": []}
t_start = time.time()


def log(msg):
    print("[%6.1fs] %s" % (time.time() - t_start, msg), flush=True)


def version_of_image():
    with open(os.path.join(ROOT, "common", "core", "version.h")) as f:
        return re.search(r'#define TSR_VERSION "([^"]+)"', f.read()).group(1)


IMAGE = os.environ.get("TSR_IMAGE") or "tessera:" + version_of_image()


def sh(*args, check=True, timeout=120):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
    return r


def podman(*args, **kw):
    return sh("nice", "-n", "10", "podman", *args, **kw)


PEER_TOKEN = "/run/secrets/tessera/peer-token"  # as in deploy/k8s (the Secret's mount)


def write_secret(path, text):
    """A token file as the containers' user reads it: owned by UID, mode 0400."""
    with open(path, "w") as f:
        f.write(text)
    os.chown(path, UID, UID)
    os.chmod(path, 0o400)


def make_tokens(tmp):
    """This run's tokens: client tokens (admin, query), the peer token, the CLI's token file."""
    auth = {"admin": "adm-" + os.urandom(12).hex(), "query": "qry-" + os.urandom(12).hex(),
            "peer": "peer-" + os.urandom(16).hex()}
    auth["tokens_text"] = "# test tokens\nadmin %s\nquery %s\n" % (auth["admin"], auth["query"])
    d = os.path.join(tmp, "secrets")
    os.makedirs(d)
    os.chmod(d, 0o755)
    auth["peer_file"] = os.path.join(d, "peer-token")
    write_secret(auth["peer_file"], auth["peer"] + "\n")
    auth["cli_file"] = os.path.join(tmp, "admin.token")  # the host's CLI (root) reads it
    with open(auth["cli_file"], "w") as f:
        f.write(auth["admin"] + "\n")
    os.chmod(auth["cli_file"], 0o600)
    return auth


class Cli:
    """bin/tessera against one coordinator address (TSR_TOKEN_FILE: the admin token)."""

    def __init__(self, target, token_file=None):
        self.target, self.env = target, dict(os.environ)
        self.env.pop("TSR_TOKEN_FILE", None)
        if token_file:
            self.env["TSR_TOKEN_FILE"] = token_file

    def run(self, *args, check=True, timeout=60):
        r = subprocess.run([os.path.join(BIN, "tessera")] + list(args) + ["--target", self.target],
                           capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError("tessera %s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    def stats(self):
        return json.loads(self.run("stats", "--json").stdout)

    def wait_ready(self, version=None, what="cluster", timeout=120):
        """Until stats answers with every shard available (and at VERSION if given)."""
        deadline, last = time.time() + timeout, None
        while time.time() < deadline:
            r = self.run("stats", "--json", check=False, timeout=10)
            if r.returncode == 0:
                last = json.loads(r.stdout)
                if all(s["available"] for s in last["shards"]) and \
                        (version is None or (last["version"] == version and
                                             all(s["version"] == version for s in last["shards"]))):
                    return last
            else:
                last = r.stderr.strip()
            time.sleep(0.5)
        raise RuntimeError("%s not ready in %ds (want version %s): %s" % (what, timeout, version, last))

    def update(self, batch_root):
        return self.run("update", "--batch-root", batch_root, timeout=300)

    def top10(self, query):
        out = json.loads(self.run("query", "--vector", query, "--k", "10", "--json").stdout)
        return ids_of(out)


def ids_of(doc):
    """The neighbor ids of the first query of `tessera query --json`."""
    return [n["id"] for n in doc[0]["neighbors"]]


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
    log("ok: " + msg)


# ---- the containers' cluster ------------------------------------------------------------

def coord_config(shard_addrs):
    # The same index parameters as `tessera cluster up`'s defaults (cli/cmd_cluster.c).
    return {"dimensions": DIMS, "distance": "SQUARED_L2", "nlist": 64, "pq_m": 16,
            "pq_nbits": 8, "nprobe": 8, "shards": shard_addrs}


def run_shard(i, net, auth):
    name, vol = P + "shard-%d" % i, P + "shard-%d-data" % i
    podman("volume", "create", vol)
    made["volume"].append(vol)
    made["container"].append(name)
    podman("run", "-d", "--name", name, "--network", net, "--restart", "always",
           "-v", vol + ":/var/lib/tessera", "-v", auth["peer_file"] + ":" + PEER_TOKEN + ":ro",
           "--entrypoint", "tessera-shard", IMAGE,
           "--listen", "0.0.0.0:7001", "--data", "/var/lib/tessera", "--peer-token-file", PEER_TOKEN)
    return name


def run_coordinator(net, port, etc_dir, batch_dir, auth):
    name, vol = P + "coord", P + "coord-data"
    podman("volume", "create", vol)
    made["volume"].append(vol)
    made["container"].append(name)
    args = ["--listen", "0.0.0.0:7000", "--data", "/var/lib/tessera",
            "--config", "/etc/tessera/coordinator.json", "--auth-tokens", "/etc/tessera/tokens",
            "--peer-token-file", PEER_TOKEN, "--batch-root-allow", "/batch"]
    podman("run", "-d", "--name", name, "--network", net, "--restart", "always",
           "-p", "127.0.0.1:%d:7000" % port,
           "-v", vol + ":/var/lib/tessera", "-v", etc_dir + ":/etc/tessera:ro",
           "-v", auth["peer_file"] + ":" + PEER_TOKEN + ":ro",
           "-v", batch_dir + ":/batch:ro", "--entrypoint", "tessera-coordinator", IMAGE, *args)
    return name


def state(name):
    r = podman("inspect", "--format", "{{.State.Status}} {{.RestartCount}}", name)
    st, n = r.stdout.split()
    return st, int(n)


def container_cluster(tmp, batch_dir, query, want, auth):
    net = P + "net"
    podman("network", "create", net)
    made["network"].append(net)
    etc = os.path.join(tmp, "etc")
    os.makedirs(etc)
    os.chmod(etc, 0o755)
    shard_names = [P + "shard-%d" % i for i in range(SHARDS)]
    with open(os.path.join(etc, "coordinator.json"), "w") as f:
        json.dump(coord_config([n + ":7001" for n in shard_names]), f)
    os.chmod(os.path.join(etc, "coordinator.json"), 0o644)
    write_secret(os.path.join(etc, "tokens"), auth["tokens_text"])
    t0 = time.time()
    for i in range(SHARDS):
        run_shard(i, net, auth)
    port = free_port()
    coord = run_coordinator(net, port, etc, batch_dir, auth)
    cli = Cli("127.0.0.1:%d" % port, auth["cli_file"])
    cli.wait_ready(what="containers' cluster")
    log("containers' cluster up in %.1fs (coordinator on 127.0.0.1:%d)" % (time.time() - t0, port))
    r = Cli(cli.target).run("stats", "--json", check=False)
    check(r.returncode == 1 and "UNAUTHENTICATED" in r.stderr,
          "a call without a token is refused UNAUTHENTICATED (%s)" % r.stderr.strip()[:80])
    out = cli.update("/batch").stdout.strip()
    log("update: " + out.splitlines()[-1] if out else "update done")
    st = cli.wait_ready()
    version = st["version"]
    check(st["vectors"] == N, "containers' cluster holds %d vectors at version %d" % (N, version))
    got = cli.top10(query)
    check(got == want, "containers' top-10 == cluster up's top-10 %s" % got[:3])
    check(sh("podman", "exec", coord, "id", "-u").stdout.strip() == str(UID),
          "the coordinator runs as uid %d" % UID)
    r = sh("podman", "exec", coord, "sh", "-c", "command -v cc gcc clang make || true")
    check(r.stdout.strip() == "", "no compiler or make in the runtime image")

    # A shard's process killed (SIGKILL from outside, as a crash or the OOM killer does):
    # back by its restart policy, at the same version, same answers. Podman 4.3 counts
    # `podman kill` as a stop by the user, which a restart policy leaves alone (checked
    # below: it stays down until `podman start`), so the crash is a kill of its process.
    victim = shard_names[2]
    _, before = state(victim)
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", victim).stdout)
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline:
        st_, n = state(victim)
        if st_ == "running" and n > before:
            break
        time.sleep(0.5)
    check(st_ == "running" and n > before, "%s's process killed, restarted by its policy (restarts %d -> %d)"
          % (victim, before, n))
    st = cli.wait_ready(version, "after the kill")
    check(all(s["version"] == version for s in st["shards"]),
          "every shard serves version %d after the kill" % version)
    check(cli.top10(query) == want, "same top-10 after the kill")
    podman("kill", victim)
    time.sleep(2)
    check(state(victim)[0] in ("exited", "stopped"), "`podman kill %s`: down (a user stop)" % victim)
    podman("start", victim)
    st = cli.wait_ready(version, "after podman kill + start")
    check(cli.top10(query) == want, "same top-10 after `podman kill` + `podman start` at version %d" % version)

    # Every container stopped and started again: nothing lost.
    everything = shard_names + [coord]
    podman("stop", "-t", "10", *everything, timeout=180)
    check(all(state(n)[0] in ("exited", "stopped") for n in everything), "every container stopped")
    podman("start", *shard_names)
    podman("start", coord)
    st = cli.wait_ready(version, "after stop/start")
    check(st["version"] == version and st["vectors"] == N,
          "version %d and %d vectors kept across stop/start" % (version, N))
    check(cli.top10(query) == want, "same top-10 after stop/start")


# ---- podman kube play of the manifests --------------------------------------------------

def docs_shards(docs):
    return range(docs[("StatefulSet", "tessera-shard")]["spec"]["replicas"])


def load_manifests():
    import yaml
    docs = {}
    for fn in sorted(os.listdir(K8S)):
        if fn.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, fn)) as f:
                for d in yaml.safe_load_all(f):
                    if d:
                        docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def kube_forms(docs, port, batch_dir, auth):
    """Pod / Deployment / PVC / ConfigMap documents podman can play, from the manifests.

    Renames everything with the prefix; the StatefulSet becomes Pods <prefix>tessera-shard-<i>
    each with a claim <prefix>data-tessera-shard-<i> (as Kubernetes names a claim template's
    claims); the ConfigMap's shards name those pods; the coordinator's port gets a loopback
    hostPort, the batch claim a read-only hostPath of the batch folder and each Secret
    volume a read-only hostPath folder of this run's tokens (secret_dir). Everything else
    (command, args, ports, probes, securityContext, mounts) is the manifests' own."""
    import copy
    sts = copy.deepcopy(docs[("StatefulSet", "tessera-shard")])
    dep = copy.deepcopy(docs[("Deployment", "tessera-coordinator")])
    cm = copy.deepcopy(docs[("ConfigMap", "tessera-coordinator-config")])
    # The coordinators of the manifests run on etcd (docs/ha.md) with an emptyDir cache;
    # podman cannot reach etcd's image (no registry here): the played form is one
    # coordinator on the local backend, its --data on a claim (test_ha_* run the etcd form
    # with real processes).
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "tessera-coordinator-data"},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    out, names = [], []
    tmpl = sts["spec"]["volumeClaimTemplates"][0]
    for i in range(sts["spec"]["replicas"]):
        pod_name = P + "tessera-shard-%d" % i
        claim = P + "%s-tessera-shard-%d" % (tmpl["metadata"]["name"], i)
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim}, "spec": copy.deepcopy(tmpl["spec"])})
        spec = copy.deepcopy(sts["spec"]["template"]["spec"])
        spec.setdefault("volumes", []).append(
            {"name": tmpl["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        secrets_as_host_paths(spec, auth, "shard-%d" % i)
        spec["hostname"] = pod_name
        loopback_host_ports(spec)
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "labels": sts["spec"]["template"]["metadata"]["labels"]},
                    "spec": spec})
        names.append(pod_name)
        made["volume"].append(claim)
    cfg_key = next(iter(cm["data"]))
    cfg = json.loads(cm["data"][cfg_key])
    cfg["shards"] = ["%s:%s" % (n, cfg["shards"][0].rsplit(":", 1)[1]) for n in names]
    # The manifests' index parameters are sized for production (nlist 1024, 128 dims):
    # the test batch has 64 dims and 6000 vectors, so those two follow the batch.
    cfg.update({"dimensions": DIMS, "nlist": 64, "pq_m": 16, "nprobe": 8})
    cm["metadata"]["name"] = P + cm["metadata"]["name"]
    cm["data"][cfg_key] = json.dumps(cfg)
    pvc["metadata"]["name"] = P + pvc["metadata"]["name"]
    made["volume"].append(pvc["metadata"]["name"])
    dep["metadata"]["name"] = P + dep["metadata"]["name"]
    dep["spec"]["replicas"] = 1
    pod = dep["spec"]["template"]["spec"]
    pod.pop("affinity", None)
    c = pod["containers"][0]
    for flag in ("--etcd", "--etcd-prefix", "--etcd-ttl", "--advertise"):
        if flag in c["args"]:
            i = c["args"].index(flag)
            del c["args"][i:i + 2]
    c.pop("env", None)
    data_vol = next(m["name"] for m in c["volumeMounts"]
                    if m["mountPath"] == c["args"][c["args"].index("--data") + 1])
    allow = c["args"][c["args"].index("--batch-root-allow") + 1]
    batch_vol = next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == allow)
    for v in pod["volumes"]:
        if "configMap" in v:
            v["configMap"]["name"] = cm["metadata"]["name"]
        if v["name"] == batch_vol:  # the claim tessera-batch: this run's batch folder
            del v["persistentVolumeClaim"]
            v["hostPath"] = {"path": batch_dir, "type": "Directory"}
        elif v["name"] == data_vol:
            v.pop("emptyDir", None)
            v["persistentVolumeClaim"] = {"claimName": pvc["metadata"]["name"]}
    secrets_as_host_paths(pod, auth, "coordinator")
    loopback_host_ports(pod)
    grpc = next(p for p in c["ports"] if p["name"] == "grpc")
    grpc["hostPort"] = port
    return [cm, pvc] + out + [dep]


def secrets_as_host_paths(pod_spec, auth, who):
    """Each Secret volume (tessera-auth: keys tokens, peer-token) becomes a hostPath folder
    holding this run's values of the keys it projects (its items, else every key), owned by
    the image's user and 0400 as the Secret's defaultMode 0440 + fsGroup give in Kubernetes.
    Podman 4.3 cannot play the Secret itself (see the module's docstring)."""
    values = {"tokens": auth["tokens_text"], "peer-token": auth["peer"] + "\n"}
    for v in pod_spec.get("volumes", []):
        sec = v.pop("secret", None)
        if sec is None:
            continue
        d = os.path.join(auth["tmp"], "kube-secret-%s-%s" % (who, v["name"]))
        os.makedirs(d)
        os.chmod(d, 0o755)
        items = sec.get("items") or [{"key": k, "path": k} for k in values]
        for it in items:
            write_secret(os.path.join(d, it["path"]), values[it["key"]])
        v["hostPath"] = {"path": d, "type": "Directory"}


def loopback_host_ports(pod_spec):
    """Podman kube play publishes every containerPort on the host (on its own number when
    hostPort is absent): give each a free loopback port, so pods never clash or leak out."""
    for c in pod_spec["containers"]:
        for p in c.get("ports", []):
            p["hostPort"], p["hostIP"] = free_port(), "127.0.0.1"


def kube_play(tmp, batch_dir, query, want, auth):
    import yaml
    docs = load_manifests()
    port = free_port()
    forms = kube_forms(docs, port, batch_dir, auth)
    path = os.path.join(tmp, "kube.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(forms, f, sort_keys=False)
    net = P + "knet"
    podman("network", "create", net)
    made["network"].append(net)
    t0 = time.time()
    podman("kube", "play", "--network", net, path, timeout=300)
    cli = Cli("127.0.0.1:%d" % port, auth["cli_file"])
    cli.wait_ready(what="kube play cluster")
    log("kube play: %d documents (%s) running in %.1fs" % (
        len(forms), ", ".join(sorted({d["kind"] for d in forms})), time.time() - t0))
    cli.update("/batch")
    st = cli.wait_ready()
    check(st["vectors"] == N and len(st["shards"]) == len(docs_shards(docs)),
          "kube play cluster holds %d vectors on %d shards (the StatefulSet's replicas)"
          % (N, len(st["shards"])))
    check(cli.top10(query) == want, "kube play cluster's top-10 == cluster up's top-10")
    # Each container of the forms: the manifests' user, probe and metrics port at work.
    running = prefixed("ps")
    for owner, c in kube_containers(forms):
        name = next((n for n in running if n.startswith(owner + "-") and n.endswith("-" + c["name"])), None)
        check(name is not None, "kube play made a container for %s/%s" % (owner, c["name"]))
        uid = sh("podman", "exec", name, "id", "-u", check=False).stdout.strip()
        check(uid == str(UID), "%s runs as uid %d (securityContext)" % (name, UID))
        # kubelet's grpc: probe is grpc.health.v1 Check on that port; podman 4.3 does not
        # run grpc: probes, so the same check runs inside the container.
        for probe in ("readinessProbe", "livenessProbe"):
            pport = c[probe]["grpc"]["port"]
            r = sh("podman", "exec", name, "tessera", "health", "--target", "127.0.0.1:%d" % pport,
                   check=False)
            check(r.returncode == 0, "%s: %s (grpc health on :%d) answers %s"
                  % (name, probe, pport, r.stdout.strip() or r.stderr.strip()))
        mport = next(p for p in c["ports"] if p["name"] == "metrics")
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport["hostPort"], timeout=10).read()
        check(re.search(rb"^tessera_process_start_time_seconds ", body, re.M) is not None,
              "%s: /metrics answers on its metrics port %d (prometheus.io/port)" % (name, mport["containerPort"]))
        if c["name"] == "coordinator":  # (shards do not set tessera_version yet)
            check(re.search(rb"^tessera_version %d\b" % st["version"], body, re.M) is not None,
                  "%s: /metrics says tessera_version %d" % (name, st["version"]))


def kube_containers(forms):
    """(pod or deployment name, container spec) of every container of the played forms."""
    for d in forms:
        if d["kind"] == "Pod":
            for c in d["spec"]["containers"]:
                yield d["metadata"]["name"], c
        elif d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                yield d["metadata"]["name"], c


# ---- the reference: the same batch in a local `tessera cluster up` ----------------------

def local_reference(tmp, batch_dir, query):
    port = free_port()
    while any(_in_use(port + i) for i in range(1, SHARDS + 1)):
        port = free_port()
    args = [os.path.join(BIN, "tessera"), "cluster", "up", "--data", os.path.join(tmp, "local"),
            "--shards", str(SHARDS), "--port", str(port), "--batch-root-allow", batch_dir]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cli = Cli("127.0.0.1:%d" % port)
        cli.wait_ready(what="cluster up")
        cli.update(batch_dir)
        cli.wait_ready()
        want = cli.top10(query)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return want


def _in_use(port):
    s = socket.socket()
    try:
        return s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        s.close()


def cleanup():
    if os.environ.get("TSR_DEPLOY_KEEP") == "1":
        log("TSR_DEPLOY_KEEP=1: kept %s and all named %s*" % (made, P))
        return
    # By name, in dependency order; each step is tried even if an earlier one failed. What
    # kube play made (pods <name>-pod-0, ConfigMap volumes, ...) is found by the prefix.
    for _ in range(2):
        for name in prefixed("pod"):
            sh("podman", "pod", "rm", "-f", "-t", "0", name, check=False)
        for name in set(made["container"]) | set(prefixed("ps")):
            sh("podman", "rm", "-f", "-v", "-t", "0", name, check=False)
        for name in set(made["volume"]) | set(prefixed("volume")):
            sh("podman", "volume", "rm", "-f", name, check=False)
        for name in set(made["network"]) | set(prefixed("network")):
            sh("podman", "network", "rm", "-f", name, check=False)
        left = prefixed("pod") + prefixed("ps") + prefixed("volume") + prefixed("network")
        if not left:
            return
    print("cleanup left behind: %s" % left)


def prefixed(what):
    """Names of this run's podman objects of one kind (pods, containers, volumes, networks)."""
    cmd = {"pod": ["pod", "ps", "--format", "{{.Name}}"], "ps": ["ps", "-a", "--format", "{{.Names}}"],
           "volume": ["volume", "ls", "--format", "{{.Name}}"],
           "network": ["network", "ls", "--format", "{{.Name}}"]}[what]
    out = sh("podman", *cmd, check=False).stdout.split()
    return [x for x in out if x.startswith(P)]


def main():
    if shutil.which("podman") is None:
        print("SKIP: podman not installed (.ci/deps-deploy.sh installs it; make test-deploy)")
        sys.exit(77)
    if sh("podman", "image", "exists", IMAGE, check=False).returncode != 0:
        print("FAIL: image %s missing: run `make image` (make test-deploy does)" % IMAGE)
        sys.exit(1)
    for b in ("tessera", "tessera-shard", "tessera-coordinator"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("FAIL: %s/%s not built (make all)" % (BIN, b))
            sys.exit(1)
    log("image %s" % IMAGE)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` cleans up
    tmp = tempfile.mkdtemp(prefix=P)
    ok = False
    try:
        os.chmod(tmp, 0o755)  # the containers' user reads the mounted folders
        auth = make_tokens(tmp)
        auth["tmp"] = tmp
        batch = os.path.join(tmp, "sample", "batch")
        sh("/usr/bin/python3", os.path.join(ROOT, "tests", "data", "gen_sample.py"), batch,
           "--n", str(N), "--dims", str(DIMS))
        for d, _, files in os.walk(os.path.join(tmp, "sample")):
            os.chmod(d, 0o755)
            for fn in files:
                os.chmod(os.path.join(d, fn), 0o644)
        with open(os.path.join(tmp, "sample", "query.txt")) as f:
            query = f.read().strip()
        want = local_reference(tmp, batch, query)
        check(len(want) == 10, "cluster up's top-10: %s ..." % want[:3])
        container_cluster(tmp, batch, query, want, auth)
        cleanup_containers_only()
        kube_play(tmp, batch, query, want, auth)
        ok = True
    finally:
        if not ok:
            for name in prefixed("ps"):
                r = sh("podman", "logs", "--tail", "15", name, check=False)
                if r.returncode == 0:
                    print("---- podman logs %s\n%s%s" % (name, r.stdout, r.stderr))
        cleanup()
        if os.environ.get("TSR_DEPLOY_KEEP") != "1":
            shutil.rmtree(tmp, ignore_errors=True)
    log("PASS")


def cleanup_containers_only():
    """The first cluster goes before kube play starts (2 cores: one cluster at a time)."""
    for name in made["container"]:
        sh("podman", "rm", "-f", "-v", "-t", "0", name, check=False)


if __name__ == "__main__":
    main()
