#!/usr/bin/env python3
"""Parses every manifest in deploy/k8s/ and checks the parts that must agree.

- every document has apiVersion, kind, metadata.name; names are DNS-1123 labels;
- Services select pods that exist (selector ⊆ pod template labels), workload selectors
  match their own template labels, and every Service targetPort names a container port;
- the shard StatefulSet: serviceName is a headless Service, a volumeClaimTemplate per pod
  mounted by the container at the path given to --data;
- probes use the gRPC health protocol (grpc:) on the container's gRPC port (= --listen);
- prometheus.io/port annotations name a declared container port (= --metrics-listen);
- the ConfigMap's coordinator JSON: only keys the coordinator knows, the required ones
  present, distance valid, shard addresses are <sts>-<i>.<headless svc>:<shard grpc port>
  for i = 0..replicas-1, exactly;
- volumes mounted by containers are declared (volumes or claim templates), and the
  coordinator mounts the ConfigMap at the directory of its --config file;
- the manifests agree with the image (deploy/docker/Dockerfile, `make image`): image
  tessera:<TSR_VERSION>, the command is a binary the image copies, runAsUser/runAsGroup are
  the image's USER, every container port is EXPOSEd, --data is the image's VOLUME;
- authentication (docs/security.md) agrees between the pods: every shard has
  --peer-token-file, the coordinator --auth-tokens, --peer-token-file and --batch-root-allow,
  none has --insecure-no-auth; each token file is a key of a Secret volume mounted read-only
  at the file's folder (the coordinator's peer token the same Secret key as the shards'),
  the batch-root-allow folder a read-only mount; no Secret (no token value) is in the repo.
- high availability (docs/ha.md): the coordinator Deployment has >= 2 replicas only with
  --etcd (without it: 1 replica, strategy Recreate: one commit point); its --etcd
  endpoints are exactly <sts>-<i>.<headless svc>:<client port> of the etcd StatefulSet
  (when deploy/k8s has one; else any external endpoint), --advertise is $(POD_IP):<grpc
  port> with POD_IP from status.podIP, --data is not a shared claim (each replica its own
  cache); the etcd StatefulSet starts its members in Parallel and its --initial-cluster
  names exactly its pods at their peer port;
- every flag given to a Tessera binary is one that binary's --help lists (TSR_BIN, built
  by `make`), and every etcd flag one `etcd --help` lists when etcd is installed.
"""
import subprocess
import json
import os
import re
import sys

try:
    import yaml
except ImportError:  # python3-yaml is in .ci/deps.sh; without it there is nothing to parse with
    print("SKIP: python3-yaml not installed")
    sys.exit(77)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
K8S = os.path.join(ROOT, "deploy", "k8s")
KNOWN_KEYS = {"dimensions", "distance", "nlist", "pq_m", "pq_nbits", "nprobe", "shards", "plan",
              "search_deadline_ms", "stage_deadline_ms", "max_k", "max_queries_per_request", "seed"}
REQUIRED_KEYS = {"dimensions", "distance", "nlist", "pq_m", "pq_nbits", "nprobe", "shards"}
DISTANCES = {"SQUARED_L2", "L1", "COSINE", "DOT_PRODUCT"}
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def arg_after(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def image_facts():
    """What the manifests must agree with: the Dockerfile's runtime stage and the version."""
    with open(os.path.join(ROOT, "common", "core", "version.h")) as f:
        version = re.search(r'#define TSR_VERSION "([^"]+)"', f.read()).group(1)
    with open(os.path.join(ROOT, "deploy", "docker", "Dockerfile")) as f:
        text = f.read()
    runtime = text[text.rindex("\nFROM "):]
    user = re.findall(r"^USER\s+(\d+):(\d+)", runtime, re.M)
    return {
        "image": "tessera:" + version,
        "binaries": set(re.findall(r"^COPY --from=\S+\s+\S+\s+(/\S+)", runtime, re.M)),
        "user": (int(user[-1][0]), int(user[-1][1])) if user else None,
        "expose": {int(p) for ln in re.findall(r"^EXPOSE\s+(.*)", runtime, re.M) for p in ln.split()},
        "volume": re.findall(r'^VOLUME\s+\["([^"]+)"', runtime, re.M),
    }


IMAGE = image_facts()


def container_checks(kind, name, pod, docs_by_kind):
    spec = pod["spec"]
    sc = spec.get("securityContext", {})
    check((sc.get("runAsUser"), sc.get("runAsGroup")) == IMAGE["user"] and sc.get("runAsNonRoot"),
          "%s %s: securityContext runAsUser/runAsGroup %s != the image's USER %s"
          % (kind, name, (sc.get("runAsUser"), sc.get("runAsGroup")), IMAGE["user"]))
    cs = spec.get("containers", [])
    check(len(cs) >= 1, "%s %s: no containers" % (kind, name))
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    out = []
    for c in cs:
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        args = [str(a) for a in c.get("args", [])]
        check(c.get("image") == IMAGE["image"], "%s/%s: image %s != make image's %s"
              % (name, c["name"], c.get("image"), IMAGE["image"]))
        cmd = c.get("command", [None])[0]
        check(cmd in IMAGE["binaries"], "%s/%s: command %s is not a binary of the image %s"
              % (name, c["name"], cmd, sorted(IMAGE["binaries"])))
        for p in ports.values():
            check(p in IMAGE["expose"], "%s/%s: port %d not EXPOSEd by the image" % (name, c["name"], p))
        check(arg_after(args, "--data") in IMAGE["volume"], "%s/%s: --data %s is not the image's VOLUME %s"
              % (name, c["name"], arg_after(args, "--data"), IMAGE["volume"]))
        listen = arg_after(args, "--listen")
        check(listen is not None, "%s/%s: no --listen" % (name, c["name"]))
        grpc_port = port_of(listen) if listen else None
        check(ports.get("grpc") == grpc_port,
              "%s/%s: container port grpc %s != --listen port %s" % (name, c["name"], ports.get("grpc"), grpc_port))
        metrics = arg_after(args, "--metrics-listen")
        if metrics:
            check(ports.get("metrics") == port_of(metrics), "%s/%s: metrics port != --metrics-listen" % (name, c["name"]))
        ann = pod["metadata"].get("annotations", {})
        if "prometheus.io/port" in ann:
            check(int(ann["prometheus.io/port"]) in ports.values(),
                  "%s: prometheus.io/port %s not a container port" % (name, ann["prometheus.io/port"]))
            check(ann.get("prometheus.io/path", "/metrics") == "/metrics", "%s: metrics path" % name)
        for pname in ("readinessProbe", "livenessProbe"):
            p = c.get(pname)
            check(p is not None, "%s/%s: no %s" % (name, c["name"], pname))
            if p:
                check("grpc" in p, "%s/%s: %s is not a grpc health probe" % (name, c["name"], pname))
                check(p.get("grpc", {}).get("port") == grpc_port,
                      "%s/%s: %s port != gRPC port %s" % (name, c["name"], pname, grpc_port))
        for m in c.get("volumeMounts", []):
            check(m["name"] in vols or m["name"] in pod.get("_claims", set()),
                  "%s/%s: volumeMount %s has no volume" % (name, c["name"], m["name"]))
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        data = arg_after(args, "--data")
        check(data in mounts, "%s/%s: --data %s is not a mounted volume" % (name, c["name"], data))
        out.append((c, ports, args, mounts, vols))
    return out


def secret_key(name, c, vols, path):
    """(secretName, key) of the Secret volume file PATH is in, checking that the volume is
    mounted read-only at PATH's folder and projects that key as PATH's file name."""
    folder, fname = os.path.split(path)
    m = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == folder), None)
    check(m is not None, "%s/%s: %s is not in a mounted volume" % (name, c["name"], path))
    if m is None:
        return None
    check(m.get("readOnly") is True, "%s/%s: %s is not mounted readOnly" % (name, c["name"], folder))
    sec = vols.get(m["name"], {}).get("secret")
    check(sec is not None, "%s/%s: %s is not on a Secret volume" % (name, c["name"], path))
    if sec is None:
        return None
    items = sec.get("items")
    key = next((i["key"] for i in items if i["path"] == fname), None) if items else fname
    check(key is not None, "%s/%s: Secret volume %s does not project %s" % (name, c["name"], m["name"], fname))
    return sec.get("secretName"), key


def auth_checks(sc, dc, docs):
    """The shards accept only the coordinator's peer token; the coordinator needs client
    tokens and confines batch roots (docs/security.md)."""
    check(not any(d["kind"] == "Secret" for d in docs),
          "a Secret is in deploy/k8s: token values never go into the repository")
    peers = set()
    for c, _, args, _, vols in sc:
        check("--insecure-no-auth" not in args, "shard/%s: --insecure-no-auth" % c["name"])
        f = arg_after(args, "--peer-token-file")
        check(f is not None, "shard/%s: no --peer-token-file (a shard on 0.0.0.0 refuses to start)" % c["name"])
        if f:
            peers.add(secret_key("tessera-shard", c, vols, f))
    c, _, args, mounts, vols = dc[0]
    check("--insecure-no-auth" not in args, "coordinator: --insecure-no-auth")
    for flag in ("--auth-tokens", "--peer-token-file", "--batch-root-allow"):
        check(arg_after(args, flag) is not None, "coordinator: no %s" % flag)
    if arg_after(args, "--auth-tokens"):
        secret_key("tessera-coordinator", c, vols, arg_after(args, "--auth-tokens"))
    if arg_after(args, "--peer-token-file"):
        mine = secret_key("tessera-coordinator", c, vols, arg_after(args, "--peer-token-file"))
        check(peers == {mine}, "coordinator's peer token %s != the shards' %s" % (mine, sorted(peers, key=str)))
    allow = arg_after(args, "--batch-root-allow")
    m = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == allow), None)
    check(m is not None and m.get("readOnly") is True,
          "coordinator: --batch-root-allow %s is not a read-only mounted volume" % allow)


def ha_checks(by, dep, c, args, vols):
    """Several coordinators on etcd (docs/ha.md)."""
    check(dep["spec"]["replicas"] >= 2, "coordinator with --etcd: %d replica(s), want >= 2"
          % dep["spec"]["replicas"])
    eps = arg_after(args, "--etcd").split(",")
    ets = by.get(("StatefulSet", "tessera-etcd"))
    if ets is not None:
        esvc = by.get(("Service", ets["spec"]["serviceName"]))
        check(esvc is not None and esvc["spec"].get("clusterIP") == "None",
              "etcd StatefulSet's Service %s is missing or not headless" % ets["spec"]["serviceName"])
        check(ets["spec"].get("podManagementPolicy") == "Parallel",
              "etcd StatefulSet: podManagementPolicy must be Parallel (a member alone has no quorum)")
        ec = ets["spec"]["template"]["spec"]["containers"][0]
        eports = {p.get("name"): p["containerPort"] for p in ec.get("ports", [])}
        n = ets["spec"]["replicas"]
        name, svc = ets["metadata"]["name"], ets["spec"]["serviceName"]
        want = ["%s-%d.%s:%d" % (name, i, svc, eports.get("client")) for i in range(n)]
        check(eps == want, "coordinator --etcd %s != the etcd pods %s" % (eps, want))
        check(n % 2 == 1 and n >= 3, "etcd: %d members (want an odd number >= 3)" % n)
        eargs = [str(a) for a in ec.get("args", [])]
        ic = arg_after(eargs, "--initial-cluster") or ""
        wantic = ",".join("%s-%d=http://%s-%d.%s:%d" % (name, i, name, i, svc, eports.get("peer"))
                          for i in range(n))
        check(ic == wantic, "etcd --initial-cluster %s != %s" % (ic, wantic))
        if esvc:
            sp = {p["port"] for p in esvc["spec"]["ports"]}
            check({eports.get("client"), eports.get("peer")} <= sp,
                  "etcd Service lacks the client or peer port")
        claims = {t["metadata"]["name"] for t in ets["spec"].get("volumeClaimTemplates", [])}
        dd = arg_after(eargs, "--data-dir")
        mounts = {m["mountPath"]: m["name"] for m in ec.get("volumeMounts", [])}
        check(mounts.get(dd) in claims, "etcd --data-dir %s is not on a per-pod claim" % dd)
    else:
        check(all(re.match(r"^[^,:]+:\d+$", e) for e in eps), "--etcd %s: expected host:port,..." % eps)
    adv = arg_after(args, "--advertise")
    grpc_port = port_of(arg_after(args, "--listen"))
    check(adv == "$(POD_IP):%d" % grpc_port, "coordinator --advertise %s != $(POD_IP):%d" % (adv, grpc_port))
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP",
          "coordinator: env POD_IP is not status.podIP")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    dv = vols.get(mounts.get(arg_after(args, "--data")), {})
    check("persistentVolumeClaim" not in dv,
          "coordinator --data on a claim: %d replicas would share it (use emptyDir: it is a cache)"
          % dep["spec"]["replicas"])


def help_flags(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", r.stdout + r.stderr))


def flag_checks(docs):
    """Every --flag of a container's args is one its binary knows."""
    tsr_bin = os.environ.get("TSR_BIN", os.path.join(ROOT, "bin"))
    known = {}
    for d in docs:
        if d["kind"] not in ("StatefulSet", "Deployment"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            cmd = c.get("command", [None])[0] or ""
            base = os.path.basename(cmd)
            if base.startswith("tessera"):
                exe = os.path.join(tsr_bin, base)
                check(os.access(exe, os.X_OK), "%s: no %s to check its flags against (make all)" % (d["metadata"]["name"], exe))
                if not os.access(exe, os.X_OK):
                    continue
                argv = [exe, "--help"]
            elif base == "etcd":
                exe = "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
                if exe is None:
                    print("note: etcd not installed: the etcd flags are not checked")
                    continue
                argv = [exe, "--help"]
            else:
                continue
            if exe not in known:
                known[exe] = help_flags(argv) or set()
            for a in c.get("args", []):
                a = str(a)
                if a.startswith("--"):
                    flag = a.split("=", 1)[0]
                    check(flag in known[exe], "%s/%s: %s is not a flag of %s --help"
                          % (d["metadata"]["name"], c["name"], flag, base))


def main():
    docs = []
    for fn in sorted(os.listdir(K8S)):
        if fn.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, fn)) as f:
                for d in yaml.safe_load_all(f):
                    if d is not None:
                        d["_file"] = fn
                        docs.append(d)
    check(len(docs) >= 6, "expected >= 6 manifests, found %d" % len(docs))
    by = {}
    for d in docs:
        for k in ("apiVersion", "kind", "metadata"):
            check(k in d, "%s: missing %s" % (d["_file"], k))
        name = d["metadata"]["name"]
        check(re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", name) is not None, "bad name " + name)
        check((d["kind"], name) not in by, "duplicate %s %s" % (d["kind"], name))
        by[(d["kind"], name)] = d
    kinds = {}
    for (k, n), d in by.items():
        kinds.setdefault(k, []).append(d)

    sts = by.get(("StatefulSet", "tessera-shard"))
    dep = by.get(("Deployment", "tessera-coordinator"))
    cm = by.get(("ConfigMap", "tessera-coordinator-config"))
    check(sts is not None and dep is not None and cm is not None, "missing shard StatefulSet, coordinator Deployment or ConfigMap")
    if fails:
        sys.exit(1)

    workloads = kinds.get("StatefulSet", []) + kinds.get("Deployment", [])
    for w in workloads:
        tl = w["spec"]["template"]["metadata"]["labels"]
        ml = w["spec"]["selector"]["matchLabels"]
        check(all(tl.get(k) == v for k, v in ml.items()), "%s: selector does not match its template" % w["metadata"]["name"])
    # Services: select exactly one workload, targetPorts exist
    for s in kinds.get("Service", []):
        sel = s["spec"]["selector"]
        hits = [w for w in workloads if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        check(len(hits) == 1, "Service %s selects %d workloads" % (s["metadata"]["name"], len(hits)))
        if hits:
            cports = {}
            for c in hits[0]["spec"]["template"]["spec"]["containers"]:
                for p in c.get("ports", []):
                    cports[p.get("name")] = p["containerPort"]
            for p in s["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                val = cports.get(tp) if isinstance(tp, str) else tp
                check(val in cports.values(), "Service %s port %s: targetPort %s not a container port" % (s["metadata"]["name"], p["port"], tp))
                check(val == p["port"], "Service %s: port %s != container port %s" % (s["metadata"]["name"], p["port"], val))

    # shard StatefulSet
    hsvc = by.get(("Service", sts["spec"]["serviceName"]))
    check(hsvc is not None, "StatefulSet serviceName %s has no Service" % sts["spec"]["serviceName"])
    check(hsvc is not None and hsvc["spec"].get("clusterIP") == "None", "shard Service is not headless")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    check(len(claims) >= 1, "StatefulSet has no volumeClaimTemplates")
    spod = sts["spec"]["template"]
    spod["_claims"] = claims
    sc = container_checks("StatefulSet", "tessera-shard", spod, kinds)
    shard_port = port_of(arg_after(sc[0][2], "--listen"))
    data_mount = sc[0][3].get(arg_after(sc[0][2], "--data"))
    check(data_mount in claims, "shard --data is not on the per-pod claim (%s)" % data_mount)
    check(any(p["port"] == shard_port for p in hsvc["spec"]["ports"]), "headless Service lacks the shard gRPC port")

    # coordinator Deployment
    dpod = dep["spec"]["template"]
    dc = container_checks("Deployment", "tessera-coordinator", dpod, kinds)
    c, ports, args, mounts, vols = dc[0]
    if arg_after(args, "--etcd") is None:
        check(dep["spec"]["replicas"] == 1 and dep["spec"].get("strategy", {}).get("type") == "Recreate",
              "coordinator without --etcd must be 1 replica with strategy Recreate (one commit point)")
    else:
        ha_checks(by, dep, c, args, vols)
    conf = arg_after(args, "--config")
    check(conf is not None, "coordinator has no --config")
    cdir, cfile = os.path.split(conf)
    check(cdir in mounts, "coordinator --config dir %s not mounted" % cdir)
    vol = vols.get(mounts.get(cdir), {})
    check(vol.get("configMap", {}).get("name") == cm["metadata"]["name"], "config dir is not the ConfigMap")
    for v in vols.values():
        if "persistentVolumeClaim" in v:
            check(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in by,
                  "claim %s not declared" % v["persistentVolumeClaim"]["claimName"])

    auth_checks(sc, dc, docs)
    flag_checks(docs)

    # config JSON
    check(cfile in cm["data"], "ConfigMap has no key %s" % cfile)
    cfg = json.loads(cm["data"][cfile])
    unknown = set(cfg) - KNOWN_KEYS
    check(not unknown, "config keys unknown to the coordinator: %s" % sorted(unknown))
    check(REQUIRED_KEYS <= set(cfg), "config misses %s" % sorted(REQUIRED_KEYS - set(cfg)))
    check(cfg.get("distance") in DISTANCES, "distance %s" % cfg.get("distance"))
    check(cfg["dimensions"] % cfg["pq_m"] == 0, "dimensions must be a multiple of pq_m")
    check(cfg["pq_nbits"] == 8, "pq_nbits must be 8")
    check(1 <= cfg["nprobe"] <= cfg["nlist"], "nprobe out of 1..nlist")
    n = sts["spec"]["replicas"]
    want = ["%s-%d.%s:%d" % (sts["metadata"]["name"], i, hsvc["metadata"]["name"], shard_port) for i in range(n)]
    check(cfg["shards"] == want, "config shards %s != StatefulSet pods %s" % (cfg["shards"], want))
    check(cfg["nlist"] >= n, "fewer lists than shards")

    if fails:
        print("%d problem(s)" % len(fails))
        sys.exit(1)
    print("k8s manifests OK: %d documents, %d shards, shard port %d, coordinator port %d"
          % (len(docs), n, shard_port, port_of(arg_after(args, "--listen"))))


if __name__ == "__main__":
    main()
