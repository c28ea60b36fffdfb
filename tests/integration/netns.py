"""netns — simulated hosts for multi-host tests: N network namespaces on one bridge.

    from netns import Net, skip_unless_available
    skip_unless_available()                 # exit 0 with "SKIP: needs root + ip netns"
    with Net(3) as net:                     # hosts 0..2 at 10.77.0.1 .. 10.77.0.3 (/24)
        p = net.popen(0, [shard_bin, "--listen", net.addr(0) + ":7001", ...])
        net.run(1, ["python3", "client.py"], timeout=10)
        net.cut(2); ...; net.heal(2)        # link of host 2 down / up
    # leaving the block (or an exception, or exit) kills the processes and removes
    # every namespace and link this run created

Layout: the bridge lives in its own "hub" namespace (nothing is added to the root
namespace, and two runs can use the same addresses without clashing); host i is a
namespace whose eth0 is one end of a veth pair, the other end enslaved to the bridge.
cut(i) sets the hub end down (the host keeps its address: packets are dropped, no
reset — as with a pulled cable). Names carry the pid and a random tag
("tsr-<pid>-<tag>-…"), so parallel runs do not clash, and a later run removes what a
killed run (pid gone) left behind.
"""
import atexit
import os
import random
import re
import signal
import subprocess
import sys

SKIP_MSG = "SKIP: needs root + ip netns"


class NetnsUnavailable(RuntimeError):
    pass


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise NetnsUnavailable("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r


def list_namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def _reap_stale():
    """Removes namespaces of earlier runs whose process no longer exists."""
    for ns in list_namespaces():
        m = re.match(r"^tsr-(\d+)-[0-9a-f]+-", ns)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _ip("netns", "del", ns, check=False)
        except PermissionError:
            pass


def available():
    """True when this process can create namespaces, veths and bridges."""
    if os.geteuid() != 0:
        return False
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    probe = "tsr-%d-probe-x" % os.getpid()
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "tsrprobe0", "type", "bridge")
        return True
    except NetnsUnavailable:
        return False
    finally:
        _ip("netns", "del", probe, check=False)


def skip_unless_available():
    if not available():
        print(SKIP_MSG)
        sys.exit(77)


class Net:
    def __init__(self, n, subnet="10.77.0", prefix=24):
        if not 1 <= n <= 200:
            raise ValueError("1..200 hosts")
        self.n = n
        self.subnet = subnet
        self.prefix = prefix
        tag = "%04x" % random.getrandbits(16)
        self.tag = "tsr-%d-%s" % (os.getpid(), tag)
        # interface names are limited to 15 characters
        self._if = "t%x%s" % (os.getpid() & 0xFFFFFF, tag[:2])
        self.hub = self.tag + "-hub"
        self.hosts = ["%s-n%d" % (self.tag, i) for i in range(n)]
        self._procs = []
        self._up = False

    # -- lifecycle ------------------------------------------------------------------------
    def setup(self):
        _reap_stale()
        atexit.register(self.teardown)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        self._up = True
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge", "stp_state", "0",
                "forward_delay", "0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.hosts):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                b = "%sb%d" % (self._if, i)  # hub end; the host end is eth0
                # create both ends directly inside their namespaces
                _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", b,
                    "netns", self.hub)
                _ip("-n", self.hub, "link", "set", b, "master", "br0")
                _ip("-n", self.hub, "link", "set", b, "up")
                _ip("-n", ns, "addr", "add", "%s/%d" % (self.addr(i), self.prefix), "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except Exception:
            self.teardown()
            raise
        return self

    def teardown(self):
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._procs = []
        if not self._up:
            return
        for ns in self.hosts + [self.hub]:
            _ip("netns", "del", ns, check=False)  # takes its veth ends with it
        self._up = False

    def __enter__(self):
        return self.setup()

    def __exit__(self, *exc):
        self.teardown()
        return False

    # -- use ------------------------------------------------------------------------------
    def addr(self, i):
        return "%s.%d" % (self.subnet, i + 1)

    def ns(self, i):
        return self.hosts[i]

    def _argv(self, i, argv):
        return ["ip", "netns", "exec", self.hosts[i]] + list(argv)

    def popen(self, i, argv, **kw):
        """Starts argv in host i (own process group, killed at teardown). Returns the Popen."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self._argv(i, argv), **kw)
        self._procs.append(p)
        return p

    def run(self, i, argv, timeout=30, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self._argv(i, argv), timeout=timeout, **kw)

    def cut(self, i):
        _ip("-n", self.hub, "link", "set", "%sb%d" % (self._if, i), "down")

    def heal(self, i):
        _ip("-n", self.hub, "link", "set", "%sb%d" % (self._if, i), "up")

    def leftovers(self):
        """Namespaces of this run that still exist (empty after teardown)."""
        return [ns for ns in list_namespaces() if ns.startswith(self.tag)]
