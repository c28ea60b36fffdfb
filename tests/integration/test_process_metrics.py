"""The standard process_* metrics of Prometheus client libraries (issue 41 item 7) on every
binary that serves /metrics: a coordinator and a shard, each started with
--metrics-listen, are scraped; each must export process_cpu_seconds_total (counter),
process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
process_max_fds and process_start_time_seconds (gauges) with plausible values: RSS > 0 and
not above the virtual size, CPU time >= 0, start time within a minute before now and not
after, 0 < open fds <= max fds, and values that agree with /proc/<pid> read here."""
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import coord_harness as ch  # noqa: E402
import shard_harness as sh  # noqa: E402

FAMILIES = {
    "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "process_start_time_seconds": "gauge",
}


def scrape(mport):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
        return r.read().decode()


def check(what, text, pid, t_before):
    vals = {}
    for name, typ in FAMILIES.items():
        assert re.search(r"^# TYPE %s %s$" % (name, typ), text, re.M), \
            "%s: no '# TYPE %s %s' in /metrics" % (what, name, typ)
        m = re.search(r"^%s (\S+)$" % name, text, re.M)
        assert m, "%s: no sample of %s" % (what, name)
        vals[name] = float(m.group(1))
    now = time.time()
    assert vals["process_resident_memory_bytes"] > 1 << 20, (what, vals)
    assert vals["process_resident_memory_bytes"] <= vals["process_virtual_memory_bytes"], vals
    assert vals["process_cpu_seconds_total"] >= 0, vals
    st = vals["process_start_time_seconds"]
    assert t_before - 2 <= st <= now + 1, (what, "start time", st, t_before, now)
    assert 0 < vals["process_open_fds"] <= vals["process_max_fds"], (what, vals)
    # the same process, read from outside
    nfds = len(os.listdir("/proc/%d/fd" % pid))
    assert abs(vals["process_open_fds"] - nfds) <= 8, (what, vals["process_open_fds"], nfds)
    with open("/proc/%d/limits" % pid) as f:
        lim = [ln for ln in f if ln.startswith("Max open files")][0].split()
    assert vals["process_max_fds"] == float(lim[3]), (what, vals["process_max_fds"], lim)
    print("%s: %s" % (what, ", ".join("%s=%g" % kv for kv in sorted(vals.items()))))
    return vals


def main():
    t0 = time.time()
    root = sh.tmpdir("tsr-procmetrics-")
    smport, cmport = ch.free_port(), ch.free_port()
    cl = ch.Cluster(1, 8, {"nlist": 4, "pq_m": 2}, root=root,
                    shard_extra=["--metrics-listen", "127.0.0.1:%d" % smport])
    cl.stop_coord()
    cl.start(extra_args=["--metrics-listen", "127.0.0.1:%d" % cmport])
    try:
        s1 = check("shard", scrape(smport), cl.shards[0].proc.pid, t0)
        c1 = check("coordinator", scrape(cmport), cl.coord.proc.pid, t0)
        # the coordinator restarted after the shard: its start time is the later one
        assert c1["process_start_time_seconds"] >= s1["process_start_time_seconds"] - 0.02
        # CPU time is a counter: it does not go back
        for _ in range(50):
            scrape(cmport)
        c2 = check("coordinator", scrape(cmport), cl.coord.proc.pid, t0)
        assert c2["process_cpu_seconds_total"] >= c1["process_cpu_seconds_total"]
        assert c2["process_start_time_seconds"] == c1["process_start_time_seconds"]
    finally:
        cl.stop()
    print("test_process_metrics: OK")


if __name__ == "__main__":
    main()
