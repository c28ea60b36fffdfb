"""ports — loopback ports for test processes, shared by the integration harness
(tests/integration/shard_harness.py) and the container test (tests/deploy/test_containers.py).

A port from bind(0) lies in the kernel's ephemeral range, the range outgoing connections take
their source ports from: a CI run once failed when a coordinator restarted on such a port and
found it taken ("metrics listener: cannot listen on ...: address already in use"), and another
when kube play published two containers on the same closed-then-reused ephemeral port. So a
port handed out here is below that range (ip_local_port_range), free when it is picked, and
never one this process handed out before; it comes from a private RNG, so a test's
random.seed() neither fixes nor shifts it.
"""
import random
import socket

_handed_out = set()
_rng = random.Random()


def _ephemeral_low():
    """The low end of the kernel's ephemeral range (at least 12000)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(int(f.read().split()[0]), 12000)
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    """A loopback TCP port free now, below the ephemeral range, never handed out before."""
    low = _ephemeral_low()
    for _ in range(2000):
        port = _rng.randrange(10000, low)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError("no free loopback port below %d" % low)


def free_range(n):
    """A port p such that p..p+n are all free on loopback now, below the ephemeral range (a
    local cluster: coordinator p, shards p+1..p+n)."""
    low = _ephemeral_low()
    for _ in range(500):
        p = _rng.randrange(10000, low - n - 1)
        ports = range(p, p + n + 1)
        if not _handed_out.intersection(ports) and all(_bindable(q) for q in ports):
            _handed_out.update(ports)
            return p
    raise RuntimeError("no free port range below %d" % low)
