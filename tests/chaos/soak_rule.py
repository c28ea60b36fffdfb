"""soak_rule — the soak's verdict on one process's series (RSS in MiB, or open fds), kept
apart from tests/chaos/soak.py (no cluster, no gRPC) so that tests/tools/test_soak_rule.py
can check it on synthetic series in `make test`.

The rule (docs/reliability.md "Soak"): the first sixth of the rows is warm-up (a process
reaching its working size: caches, gRPC buffers, the stream log) and is left out; the rest
is cut into thirds. A series GROWS when both its minimum and its maximum over the last third
exceed those over the first third by more than the tolerance (RSS: 10 % of the first
third's minimum + 8 MiB; fds: 8).

Why minima and maxima, not means: etcd keeps its raft log in memory until a snapshot every
--snapshot-count entries, so its RSS is a sawtooth (a climb of ~6 MiB a minute, then a fall
of ~90 MiB every ~20 minutes at the soak's load). A window's mean depends on where the
window falls in the cycle (the first-quarter vs last-quarter means called it a leak); but a
sawtooth that drops inside the run does not raise both the floor and the ceiling: after the
drop the last third's minimum is low, before it the last third's maximum is at most the
cycle's peak. A leak, alone or under a sawtooth, raises both. What this rule cannot tell:
a sawtooth whose period is longer than the run (no drop seen) looks like a leak; run longer.
"""

RSS_FRAC, RSS_MIB, FDS = 0.10, 8.0, 8.0


def windows(xs):
    """The first and the last third of xs after the warm-up sixth (None values dropped).
    Returns (first, last); both empty when fewer than 3 values remain (too short a run to
    say anything)."""
    xs = [x for x in xs if x is not None]
    skip = len(xs) // 6
    rest = xs[skip:]
    if len(rest) < 3:
        return [], []
    k = max(1, len(rest) // 3)
    return rest[:k], rest[-k:]


def grows(xs, frac, abs_tol):
    """(lo0, lo1, hi0, hi1, growing) of series xs: the minima and maxima of the first and
    last third (see the top) and whether both rose by more than frac * lo0 + abs_tol."""
    first, last = windows(xs)
    if not first:
        nan = float("nan")
        return nan, nan, nan, nan, False
    lo0, lo1, hi0, hi1 = min(first), min(last), max(first), max(last)
    tol = frac * lo0 + abs_tol
    return lo0, lo1, hi0, hi1, (lo1 - lo0 > tol and hi1 - hi0 > tol)


def rss_grows(xs):
    return grows(xs, RSS_FRAC, RSS_MIB)


def fds_grow(xs):
    return grows(xs, 0.0, FDS)
