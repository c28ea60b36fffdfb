#!/usr/bin/env python3
"""Smoke test of netns.py: two simulated hosts, a TCP echo across the bridge; cutting
host 1's link makes it fail, healing makes it work again; teardown leaves no namespace
(and nothing in the root namespace) behind, also when the test body raises."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

PY = sys.executable
SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7777)); s.listen(16); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.settimeout(2)
    try: c.sendall(c.recv(100))
    except OSError: pass
    c.close()
"""
CLIENT = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], 7777), timeout=float(sys.argv[2]))
    c.settimeout(float(sys.argv[2])); c.sendall(b"ping"); d = c.recv(100)
    print(d.decode()); sys.exit(0 if d == b"ping" else 1)
except OSError as e:
    print("error", e); sys.exit(2)
"""


def echo(net, timeout=1.0):
    r = net.run(1, [PY, "-c", CLIENT, net.addr(0), str(timeout)], timeout=timeout + 10)
    return r.returncode == 0


def link_names(ip_o_link):
    """Interface names of `ip -o link` output ("3: name@peer: <...>")."""
    return {line.split(": ")[1].split("@")[0] for line in ip_o_link.splitlines() if ": " in line}


def main():
    netns.skip_unless_available()
    before_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    net = netns.Net(2)
    with net:
        assert len(net.leftovers()) == 3, net.leftovers()
        srv = net.popen(0, [PY, "-c", SERVER, net.addr(0)], stdout=subprocess.PIPE, text=True)
        assert srv.stdout.readline().strip() == "ready"
        assert echo(net), "echo across the bridge failed"
        # the server is not reachable from the root namespace (traffic stays inside)
        r = subprocess.run([PY, "-c", CLIENT, net.addr(0), "0.5"], capture_output=True, timeout=10)
        assert r.returncode != 0, "host namespace reached the simulated host"
        net.cut(1)
        t0 = time.time()
        assert not echo(net, 1.0), "echo worked across a cut link"
        assert time.time() - t0 < 5
        net.heal(1)
        ok = False
        for _ in range(30):  # the bridge forwards at once; allow for ARP
            if echo(net, 1.0):
                ok = True
                break
            time.sleep(0.1)
        assert ok, "echo did not come back after heal"
        print("echo ok, cut -> fails, heal -> ok")
    assert net.leftovers() == [], net.leftovers()
    assert srv.poll() is not None, "server process survived teardown"
    after_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    # nothing of this run in the root namespace (other software, e.g. podman, may add or
    # remove its own links meanwhile: only names this run could have made count)
    added = link_names(after_links) - link_names(before_links)
    ours = sorted(n for n in added if n.startswith((net._if, "tsr", "br0", "eth0")))
    assert not ours, "links of this run left in the root namespace: %s" % ours

    # teardown on an exception
    net2 = netns.Net(2)
    try:
        with net2:
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert net2.leftovers() == [], net2.leftovers()
    # parallel runs do not clash: two nets at once with the same addresses
    with netns.Net(2) as a, netns.Net(2) as b:
        assert a.tag != b.tag and set(a.leftovers()).isdisjoint(b.leftovers())
    print("teardown clean")


if __name__ == "__main__":
    main()
