"""Idle blame against a nanosecond-by-nanosecond oracle, and its invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dlpt.idle_blame import blame, busy_timeline, busy_union


def _oracle(n_nodes, w0, w1, busy, hosts):
    """Walk every nanosecond: busy if any busy interval covers it; else start-up before the
    first busy start, else shared equally by the host intervals covering it, else unattributed."""
    per = np.zeros(n_nodes)
    first = min((s for s, e in busy if e > s), default=None)
    startup = unattr = idle = 0
    for t in range(w0, w1):
        if any(s <= t < e for s, e in busy):
            continue
        idle += 1
        if first is None:
            unattr += 1
            continue
        if t < first:
            startup += 1
            continue
        cover = [n for s, e, n in hosts if s <= t < e]
        if not cover:
            unattr += 1
        for n in cover:
            per[n] += 1 / len(cover)
    return per, idle, startup, unattr


intervals = st.lists(st.tuples(st.integers(0, 120), st.integers(0, 40)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(busy=intervals, threads=st.lists(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 4)), max_size=8),
                                        min_size=1, max_size=3))
def test_blame_matches_the_oracle(busy, threads):
    w0, w1 = 10, 130
    b = [(s, s + d) for s, d in busy]
    hosts = []
    for runs in threads:
        t = 0
        for gap, node in runs:  # one thread's intervals do not overlap, as the sampler's runs
            hosts.append((t, t + gap * 5, node))
            t += gap * 5
    res = blame(5, {0: (w0, w1)}, {0: (np.array([s for s, _ in b], dtype=np.int64), np.array([e for _, e in b], dtype=np.int64))},
                np.array([h[0] for h in hosts], dtype=np.int64), np.array([h[1] for h in hosts], dtype=np.int64),
                np.array([h[2] for h in hosts], dtype=np.int64),
                np.array([tid for tid, runs in enumerate(threads) for _ in runs], dtype=np.int64))
    per, idle, startup, unattr = _oracle(5, w0, w1, b, hosts)
    tot = res.totals()
    assert tot["idle"] == idle and tot["start-up"] == startup
    assert abs(tot["unattributed"] - unattr) <= 1
    # Conserved exactly; each node within rounding of the oracle's fractions.
    assert int(res.per_node.sum()) + tot["start-up"] + tot["unattributed"] == tot["idle"]
    assert np.all(np.abs(res.per_node - per) <= 1.0 + 1e-9)


def test_union_of_unordered_overlapping_intervals():
    s, e = busy_union(np.array([50, 0, 10, 70, 60]), np.array([55, 20, 15, 80, 75]))
    assert s.tolist() == [0, 50, 60] and e.tolist() == [20, 55, 80]
    s, e = busy_union(np.array([5, 9]), np.array([5, 3]))  # empty and negative: dropped
    assert len(s) == 0


def test_bad_input_is_skipped_and_said():
    res = blame(3, {0: (0, 100), 1: (50, 50)}, {0: (np.array([10]), np.array([20]))},
                np.array([30, 40, 60]), np.array([20, 70, 90]), np.array([1, 7, 2]), np.zeros(3, dtype=np.int64))
    assert res.skipped["host intervals empty or on unknown nodes"] == 2
    assert res.skipped["devices with an empty window"] == 1
    tot = res.totals()
    assert tot["idle"] == 90 and tot["start-up"] == 10
    assert int(res.per_node.sum()) + tot["start-up"] + tot["unattributed"] == 90


def test_a_device_with_no_activity_is_all_unattributed_not_startup():
    res = blame(2, {0: (0, 100)}, {}, np.array([0]), np.array([100]), np.array([1]), np.array([0]))
    assert res.totals()["unattributed"] == 100 and res.per_node.sum() == 0


def test_busy_timeline():
    us, ue = busy_union(np.array([0, 50]), np.array([25, 100]))
    assert busy_timeline(us, ue, 0, 100, bins=4) == [1.0, 0.0, 1.0, 1.0]
