"""The soak's verdict rule (tests/chaos/soak_rule.py) on synthetic series shaped like the
30-minute soak's (24 rows, one every 75 s): flat, warm-up then flat, etcd's raft-log
sawtooth (at several phases and periods) are not growth; a linear leak, a leak under a
sawtooth, and an fd leak are. No cluster: runs in the tools suite of `make test`, in well
under a second.
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import soak_rule  # noqa: E402

T = [75.0 * i for i in range(1, 25)]  # `make soak SECONDS=1800`: 24 rows
FAILS = []


def check(what, got, want):
    if got != want:
        FAILS.append("%s: %s, expected %s" % (what, "GROWING" if got else "flat",
                                              "GROWING" if want else "flat"))


def saw(t, period, phase, lo=65.0, per_s=0.1):
    """etcd's RSS: +6 MiB a minute, back to lo at each raft snapshot (every period s)."""
    return lo + per_s * ((t + phase) % period)


def old_rule_flags(xs):
    """The rule before soak_rule (first-quarter vs last-quarter means): kept here only to
    show that the sawtooth below is the case it misread."""
    k = max(1, len(xs) // 4)
    m0, m1 = sum(xs[:k]) / k, sum(xs[-k:]) / k
    return m1 - m0 >= 0.10 * m0 + 8


def main():
    rng = random.Random(7)
    # a flat process with noise
    flat = [35 + rng.uniform(-1, 1) for _ in T]
    check("flat", soak_rule.rss_grows(flat)[4], False)
    # the leader coordinator of Dec 3: 26 -> 34 MiB in the first 10 minutes, then +0.6
    warm = [26 + min(t, 600) / 600 * 8 + t / 1800 * 0.6 for t in T]
    check("warm-up then flat", soak_rule.rss_grows(warm)[4], False)
    # etcd of Dec 3 (docs/reliability.md): 65 MiB at 75 s, +6 MiB a minute, down to 86 MiB
    # at ~1,240 s (the raft snapshot), 137 MiB at the end
    etcd = [58 + 0.105 * t if t < 1240 else 86 + 0.085 * (t - 1240) for t in T]
    check("etcd sawtooth of Dec 3", soak_rule.rss_grows(etcd)[4], False)
    if not old_rule_flags(etcd):
        FAILS.append("the old rule does not flag the sawtooth: the test shows nothing")
    for period in (600, 900, 1200, 1500):
        for phase in range(0, period, 100):
            xs = [saw(t, period, phase) + rng.uniform(-2, 2) for t in T]
            check("sawtooth period %d phase %d" % (period, phase),
                  soak_rule.rss_grows(xs)[4], False)
    # a leak: 1 MiB a minute on a flat process (16 MiB between the thirds)
    leak = [35 + t / 60 + rng.uniform(-1, 1) for t in T]
    check("linear leak 1 MiB/min", soak_rule.rss_grows(leak)[4], True)
    # a leak under etcd's sawtooth, at every phase: 3 MiB a minute (caught at every phase;
    # 1-2 MiB a minute only at some, see soak_rule.py)
    for phase in range(0, 1200, 100):
        xs = [saw(t, 1200, phase) + 3 * t / 60 for t in T]
        check("leak 3 MiB/min under a sawtooth, phase %d" % phase,
              soak_rule.rss_grows(xs)[4], True)
    # fds: a jitter of 18-20 is flat; one more fd every row is a leak
    check("fds jitter", soak_rule.fds_grow([18 + rng.randint(0, 2) for _ in T])[4], False)
    check("fd leak", soak_rule.fds_grow([18 + i for i in range(len(T))])[4], True)
    # None samples (a process gone) are skipped; too few rows decide nothing
    check("None samples", soak_rule.rss_grows([None if i % 5 == 0 else x
                                               for i, x in enumerate(leak)])[4], True)
    check("two rows", soak_rule.rss_grows([10.0, 500.0])[4], False)
    if FAILS:
        print("test_soak_rule: FAIL\n  " + "\n  ".join(FAILS))
        return 1
    print("test_soak_rule: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
