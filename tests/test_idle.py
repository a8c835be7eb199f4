"""Idle blame (dlpt/idle.py) against a nanosecond-by-nanosecond oracle, its invariants, bad input,
the named rows, the timeline and the summary every viewer reads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlpt import idle
from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.frames import Frame, FrameTable
from dlpt.idle import blame, busy_union, largest_remainder, split_by_device, timeline
from dlpt.metrics import COL
from dlpt.waits import waits


def _a(x):
    return np.asarray(x, dtype=np.int64)


def _oracle(n_nodes, windows, busy, hosts):
    """Walk every nanosecond of every device: busy if any of its intervals covers it; else
    start-up before its first activity; else shared equally by the threads whose interval covers
    it (a thread's overlapping intervals: the one that started first, longest first, holds it);
    else unattributed."""
    per = np.zeros(n_nodes)
    sync = 0.0
    totals = {"idle": 0, "start-up": 0, "unattributed": 0, "busy": 0}
    for dev, (w0, w1) in windows.items():
        b = [(max(s, w0), min(e, w1)) for s, e in busy.get(dev, []) if min(e, w1) > max(s, w0)]
        first = min((s for s, _ in b), default=None)
        for t in range(w0, w1):
            if any(s <= t < e for s, e in b):
                totals["busy"] += 1
                continue
            totals["idle"] += 1
            if first is None:
                totals["unattributed"] += 1
                continue
            if t < first:
                totals["start-up"] += 1
                continue
            holder = {}
            for s, e, n, th, sy in sorted(hosts, key=lambda h: (h[3], h[0], -h[1])):
                if s <= t < e and th not in holder:
                    holder[th] = (n, sy)
            if not holder:
                totals["unattributed"] += 1
            for n, sy in holder.values():
                per[n] += 1 / len(holder)
                sync += sy / len(holder)
    return per, sync, totals


intervals = st.lists(st.tuples(st.integers(0, 120), st.integers(-3, 40)), max_size=10)
host_runs = st.lists(st.lists(st.tuples(st.integers(-2, 30), st.integers(0, 8), st.integers(0, 4), st.booleans()),
                              max_size=8), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(busy0=intervals, busy1=intervals, threads=host_runs)
def test_blame_matches_the_oracle(busy0, busy1, threads):
    windows = {0: (10, 130), 1: (0, 90)}
    busy = {0: [(s, s + d) for s, d in busy0], 1: [(s, s + d) for s, d in busy1]}
    hosts = []
    for tid, runs in enumerate(threads):
        for start, length, node, sy in runs:  # overlapping within a thread on purpose
            hosts.append((start * 4, start * 4 + length * 5, node, tid, sy))
    h = list(zip(*hosts)) if hosts else [[]] * 5
    res = blame(5, windows, {d: (_a([s for s, _ in b]), _a([e for _, e in b])) for d, b in busy.items()},
                _a(h[0]), _a(h[1]), _a(h[2]), _a(h[3]), np.asarray(h[4], dtype=bool))
    per, sync, truth = _oracle(5, windows, busy, hosts)
    tot = res.totals()
    for k in ("idle", "busy", "start-up", "unattributed"):
        assert tot[k] == truth[k], k
    # Conserved exactly; each node, and the sync part, within rounding of the oracle's fractions.
    assert int(res.per_node.sum()) + tot["start-up"] + tot["unattributed"] == tot["idle"]
    assert tot["host"] + tot["sync"] + tot["start-up"] + tot["unattributed"] == tot["idle"]
    # Each (node, sync) key is rounded once (largest remainder, to the floor or the ceiling of its
    # share), so a node is off by less than one per key it has: two where it both synced and not
    # (hypothesis found a node 1.17 off, with a sync and a plain interval, against a bound of one).
    keys = np.ones(5)
    for n in {h[2] for h in hosts if h[4]} & {h[2] for h in hosts if not h[4]}:
        keys[n] = 2
    assert np.all(np.abs(res.per_node - per) < keys + 1e-6)
    # Each (node, sync) key is rounded once, so the sync total is off by less than one per key.
    assert abs(tot["sync"] - sync) < max(1, len({h[2] for h in hosts if h[4]})) + 1e-6
    assert (res.per_node >= 0).all()


def test_union_of_unordered_overlapping_intervals():
    s, e = busy_union(_a([50, 0, 10, 70, 60]), _a([55, 20, 15, 80, 75]))
    assert s.tolist() == [0, 50, 60] and e.tolist() == [20, 55, 80]
    s, e = busy_union(_a([5, 9]), _a([5, 3]))  # empty and negative: dropped
    assert len(s) == 0


def test_one_thread_shares_a_gap_by_its_lines_host_time_two_threads_equally():
    # Busy [0, 10) and [100, 110): one gap of 90 ns. Thread 0 runs node 1 for 30 ns, then node 2
    # for 60; thread 1 runs node 3 over the last 30 ns of the gap.
    res = blame(4, {0: (0, 110)}, {0: (_a([0, 100]), _a([10, 110]))},
                _a([10, 40, 70]), _a([40, 100, 100]), _a([1, 2, 3]), _a([0, 0, 1]))
    assert res.per_node.tolist() == [0, 30, 30 + 15, 15]
    assert res.totals() == {"busy": 20, "idle": 90, "host": 90, "sync": 0, "start-up": 0, "unattributed": 0, "queued": 0}


def test_sync_part_and_start_up_and_unattributed():
    # Start-up [0, 20); busy [20, 30); idle [30, 100): sync interval on node 1 for [30, 60),
    # nothing for [60, 80), node 2 for [80, 100).
    res = blame(3, {0: (0, 100)}, {0: (_a([20]), _a([30]))},
                _a([30, 80]), _a([60, 100]), _a([1, 2]), _a([0, 0]), np.array([True, False]))
    tot = res.totals()
    assert (tot["start-up"], tot["sync"], tot["host"], tot["unattributed"]) == (20, 30, 20, 20)
    assert res.meta()["devices"]["0"] == {"window": 100, "busy": 10, "idle": 90, "start-up": 20, "unattributed": 20, "queued": 0}


def test_bad_input_is_skipped_and_said():
    busy, skipped = {}, {}
    busy = split_by_device(_a([0, -1, 0, 0, 0]), _a([10, 5, 30, 500, 40]), _a([20, 9, 25, 600, 45]), skipped)
    res = blame(3, {0: (0, 100), 1: (50, 50)}, busy,
                _a([30, 40, 60, 60]), _a([20, 70, 90, 95]), _a([1, 7, 2, 1]), _a([0, 0, 0, 0]))
    res.skipped.update(skipped)
    assert res.skipped == {idle.NO_DEVICE: 1, idle.NEGATIVE_GPU: 1, idle.OUTSIDE_GPU: 1, idle.EMPTY_WINDOW: 1,
                           idle.NEGATIVE_HOST: 1, idle.UNKNOWN_NODE: 1, idle.OVERLAP_HOST: 1}
    tot = res.totals()
    assert tot["idle"] == 100 - 10 - 5 and tot["start-up"] == 10
    assert int(res.per_node.sum()) + tot["start-up"] + tot["unattributed"] == tot["idle"]
    assert res.meta()["skipped"] == res.skipped


def test_host_clock_that_does_not_line_up_is_said_not_blamed():
    res = blame(2, {0: (1_000_000, 1_000_100)}, {0: (_a([1_000_010]), _a([1_000_020]))},
                _a([0, 50]), _a([40, 90]), _a([1, 1]), _a([0, 0]))
    assert res.skipped == {idle.HOST_CLOCK: 2}
    assert res.per_node.sum() == 0 and res.totals()["unattributed"] == 80


def test_a_device_with_no_activity_is_all_unattributed_not_startup():
    res = blame(2, {0: (0, 100)}, {}, _a([0]), _a([100]), _a([1]), _a([0]))
    assert res.totals()["unattributed"] == 100 and res.per_node.sum() == 0


@given(st.lists(st.floats(0, 1e6), max_size=20), st.integers(-3, 3))
def test_largest_remainder_is_exact(values, off):
    v = np.asarray(values)
    total = max(int(round(v.sum())) + off, 0) if len(v) else 0
    out = largest_remainder(v, total)
    assert int(out.sum()) == total and (out >= 0).all()
    if off == 0 and len(v):
        assert np.all(np.abs(out - v) < 1 + 1e-9)


def test_timeline_bins_and_fractions():
    busy = {0: (_a([0, 50]), _a([25, 100])), 1: (_a([0]), _a([100]))}
    tl = timeline({0: (0, 100), 1: (0, 100)}, busy, 0, 100, bins=4)
    assert tl == {"t": [0, 25, 50, 75], "gpu_busy": [1.0, 0.5, 1.0, 1.0]}
    assert len(timeline({0: (0, 10**9)}, {0: (_a([0]), _a([5]))}, 0, 10**9)["t"]) == idle.TIMELINE_BINS


def test_idle_rows_conserve_idle_in_the_tree_and_the_summary_reads_them():
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    line = b.child(0, frames.intern(Frame("python", "f (a.py:3)", "a.py", 3, "f")))
    res = blame(len(b), {0: (0, 100)}, {0: (_a([20, 90]), _a([30, 95]))}, _a([30]), _a([60]), _a([line]), _a([0]),
                np.array([True]))
    cols = ActivityColumns()
    cols.extra["gpu_idle_time"] = idle.idle_column(res, b, frames, 0)
    cols.extra["sync_time"] = (_a([line]), _a([30]))
    prof = build_profile(b, frames, cols, {"window": {"start": 0, "end": 100}, "gpu_idle": res.meta()})
    names = {f.name for f in prof.frames}
    assert f"<unattributed: {idle.IDLE_STARTUP}>" in names and f"<unattributed: {idle.IDLE_UNATTRIBUTED}>" in names
    assert int(prof.cct.exclusive[:, COL["gpu_idle_time"]].sum()) == res.totals()["idle"] == 85
    w = waits(prof)
    assert (w.wall, w.busy, w.idle, w.sync_time, w.device_time) == (100, 15, 85, 30, 100)
    assert w.idle_parts == {"host": 0, "sync": 30, "start-up": 20, "unattributed": 35, "queued": 0}
    assert w.busy_share == 0.15 and w.to_json()["idle"]["start-up"] == 20


def test_summary_of_a_profile_without_the_figures():
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    prof = build_profile(b, frames, ActivityColumns(), {})
    w = waits(prof)
    assert w.wall is None and w.busy is None and w.busy_share is None and w.to_json()["gpu_idle_time"] is None


def test_timeline_bins_by_hand():
    # A 4 ns window from t=100, bins of 1 ns: busy [101, 103) on one device.
    tl = timeline({0: (100, 104)}, {0: (_a([101]), _a([103]))}, 100, 104)
    assert tl == {"t": [0, 1, 2, 3], "gpu_busy": [0.0, 1.0, 1.0, 0.0]}
    # Two devices share each bin: device 1 idle throughout halves the fraction.
    tl = timeline({0: (100, 104), 1: (100, 104)}, {0: (_a([101]), _a([103]))}, 100, 104)
    assert tl["gpu_busy"] == [0.0, 0.5, 0.5, 0.0]
    # One bin of 3 ns, busy 1 ns of it: a third, to four decimals.
    assert timeline({0: (0, 3)}, {0: (_a([0]), _a([1]))}, 0, 3, bins=1) == {"t": [0], "gpu_busy": [0.3333]}
    # A 1 ns window is one bin; an empty window, or no device, none.
    assert timeline({0: (7, 8)}, {0: (_a([7]), _a([8]))}, 7, 8) == {"t": [0], "gpu_busy": [1.0]}
    assert timeline({0: (5, 5)}, {}, 5, 5) == {"t": [], "gpu_busy": []}
    assert timeline({}, {}, 0, 10) == {"t": [], "gpu_busy": []}


def test_idle_after_a_sync_by_hand():
    """`after_sync`: in a gap that began while some thread was in a sync, the part after the
    sync returned. Window [0, 200), busy [0, 10) [50, 60) [120, 130) [180, 200): gaps [10, 50),
    [60, 120), [130, 180). Syncs (their union): [5, 30) on thread 0, [60, 140) on thread 1 and
    [130, 150) on thread 0, one run [60, 150). Gap [10, 50) began in [5, 30): 50 - 30 = 20 after it;
    [60, 120) began in [60, 150), which outlasts it: 0; [130, 180) began in it too: 180 - 150 = 30."""
    res = blame(5, {0: (0, 200)}, {0: (_a([0, 50, 120, 180]), _a([10, 60, 130, 200]))},
                _a([5, 30, 130, 60]), _a([30, 50, 150, 140]), _a([1, 2, 1, 3]), _a([0, 0, 0, 1]),
                np.array([True, False, True, True]))
    assert res.after_sync == 20 + 0 + 30
    # No sync: nothing after one; a gap that began before the only sync did: nothing either.
    res = blame(5, {0: (0, 200)}, {0: (_a([0, 50]), _a([10, 60]))}, _a([5, 20]), _a([20, 40]), _a([1, 2]),
                _a([0, 0]), np.array([False, True]))
    assert res.after_sync == 0


def test_idle_while_work_was_queued_is_not_the_hosts():
    """`ready[d]`: when device d had launched work waiting (each launch to its start). Window
    [0, 100), busy [0, 10) [60, 70) [90, 100); idle gaps [10, 60) and [70, 90) (70 ns). Work
    queued [20, 60) and [75, 80) (a launch's wait from before the window, [-5, 3), is clipped
    away): queued 40 + 5 = 45; the rest, [10, 20) [70, 75) [80, 90), 25 ns, is the host's,
    here node 1's, running the whole window."""
    busy = {0: (_a([0, 60, 90]), _a([10, 70, 100]))}
    ready = {0: (_a([20, 75, -5]), _a([60, 80, 3])), 1: (_a([0]), _a([100]))}  # device 1: no window
    res = blame(2, {0: (0, 100)}, busy, _a([0]), _a([100]), _a([1]), _a([0]), ready=ready)
    assert res.meta()["devices"]["0"] == {"window": 100, "busy": 30, "idle": 70, "start-up": 0, "unattributed": 0,
                                          "queued": 45}
    assert res.per_node.tolist() == [0, 25] and (res.host, res.sync) == (25, 0)
    # A host clock that is not the GPU's (host intervals all outside the window): its launch
    # times are not the GPU's either, so nothing counts as queued; the idle is unattributed.
    res = blame(2, {0: (0, 100)}, busy, _a([500]), _a([600]), _a([1]), _a([0]), ready=ready)
    assert res.meta()["devices"]["0"]["queued"] == 0 and res.totals()["unattributed"] == 70
    assert res.skipped == {idle.HOST_CLOCK: 1}


def test_host_intervals_on_unknown_nodes_are_skipped_and_counted():
    """Nodes 0 .. n_nodes - 1 exist (node 0 the root included); -1 and n_nodes do not. A
    negative interval is counted as negative only; an empty one on an unknown node is still
    an interval on an unknown node."""
    res = blame(3, {0: (0, 100)}, {0: (_a([0]), _a([10]))},
                _a([10, 40, 50, 60, 70, 80]), _a([40, 50, 60, 60, 65, 100]), _a([0, -1, 3, 7, 9, 2]),
                _a([0, 0, 0, 0, 0, 0]))
    assert res.skipped == {idle.UNKNOWN_NODE: 3, idle.NEGATIVE_HOST: 1}
    # Idle [10, 100): node 0 holds [10, 40), node 2 [80, 100); [40, 80) is no known node's.
    assert res.per_node.tolist() == [30, 0, 20] and res.totals()["unattributed"] == 40


def test_largest_remainder_by_hand():
    """Floors, then one more for the largest remainders; one less, when the floors overshoot,
    from the smallest remainders of the entries that have one to give."""
    v = np.array([0.2, 0.7, 1.5])  # floors [0, 0, 1]: 2 short, to 0.7 and then 1.5's 0.5
    assert largest_remainder(v, 3).tolist() == [0, 1, 2]
    assert largest_remainder(v, 1).tolist() == [0, 0, 1]  # the floors: nothing short
    assert largest_remainder(np.array([2.1, 0.6]), 3).tolist() == [2, 1]  # by remainder, not by size
    # Far short: every entry gets the whole part of short / n, the rest by remainder (ties in order).
    assert largest_remainder(np.array([1.0, 1.0]), 5).tolist() == [3, 2]
    assert largest_remainder(np.array([1.0, 1.0, 1.0]), 10).tolist() == [4, 3, 3]  # 7 short: 2 each, 1 left
    # Over: floors [0, 2, 0, 1] sum to 3.
    v = np.array([0.9, 2.95, 0.5, 1.4])
    assert largest_remainder(v, 2).tolist() == [0, 2, 0, 0]  # 1.4's 0.4 gives first
    assert largest_remainder(v, 1).tolist() == [0, 1, 0, 0]  # then 2.95's
    assert largest_remainder(v, 0).tolist() == [0, 0, 0, 0]  # then 2.95's second
    assert largest_remainder(np.array([-0.5, 2.0]), 2).tolist() == [0, 2]  # a negative share is 0
    assert largest_remainder(np.zeros(0), 0).tolist() == []
    assert largest_remainder(np.zeros(0), 3).tolist() == []  # no entries: nothing to share it among


def test_empty_intervals_and_edges_of_the_window():
    """Intervals are half-open, [start, end). A GPU activity that ends as the window starts, or
    starts as it ends, is outside it; an empty one is no activity (neither negative nor outside).
    An empty host interval is no interval: inside another of its thread, it is not cut. Host
    intervals that only touch the window are outside it: the clocks do not line up."""
    busy = {0: (_a([-10, 100, 50, 200, 0]), _a([0, 110, 50, 200, 10]))}
    res = blame(3, {0: (0, 100)}, busy, _a([10, 20]), _a([40, 20]), _a([1, 2]), _a([0, 0]))
    assert res.skipped == {idle.OUTSIDE_GPU: 2}
    assert res.per_node.tolist() == [0, 30, 0]
    assert res.meta()["devices"]["0"] == {"window": 100, "busy": 10, "idle": 90, "start-up": 0, "unattributed": 60,
                                          "queued": 0}
    res = blame(3, {0: (0, 100)}, busy, _a([-20, 100]), _a([0, 120]), _a([1, 2]), _a([0, 0]))
    assert res.skipped == {idle.OUTSIDE_GPU: 2, idle.HOST_CLOCK: 2} and res.per_node.sum() == 0
    # A device of an empty window is skipped, not the devices after it.
    res = blame(3, {0: (50, 50), 1: (0, 100)}, {1: busy[0]}, _a([10]), _a([40]), _a([1]), _a([0]))
    assert res.skipped == {idle.EMPTY_WINDOW: 1, idle.OUTSIDE_GPU: 2}
    assert list(res.meta()["devices"]) == ["1"] and res.per_node.tolist() == [0, 30, 0]


def test_host_inside_one_of_two_windows_is_on_the_gpus_clock():
    """Two devices: the host intervals overlap the first one's window only. The clocks line up
    (no HOST_CLOCK), and the queued work of each device is still read."""
    busy = {0: (_a([0, 60]), _a([10, 100])), 1: (_a([1000, 1090]), _a([1010, 1100]))}
    ready = {0: (_a([20]), _a([60])), 1: (_a([1020]), _a([1090]))}
    res = blame(2, {0: (0, 100), 1: (1000, 1100)}, busy, _a([0]), _a([100]), _a([1]), _a([0]), ready=ready)
    assert res.skipped == {}
    assert res.meta()["devices"]["0"]["queued"] == 40 and res.meta()["devices"]["1"]["queued"] == 70
    assert res.per_node.tolist() == [0, 10] and res.meta()["devices"]["1"]["unattributed"] == 10


def test_blame_without_nodes():
    """A tree of no nodes: every host interval is on an unknown node; the idle is unattributed."""
    res = blame(0, {0: (0, 100)}, {0: (_a([0]), _a([10]))}, _a([10]), _a([90]), _a([0]), _a([0]))
    assert res.per_node.tolist() == [] and (res.host, res.sync) == (0, 0)
    assert res.skipped == {idle.UNKNOWN_NODE: 1} and res.totals()["unattributed"] == 90


def test_a_gap_that_begins_as_a_sync_returns_is_not_after_it():
    """Intervals are half-open: a sync [5, 10) no longer blocks its thread at 10. Window
    [0, 100), busy [0, 10) [50, 100): the one gap, [10, 50), begins as the sync returns, not
    while it runs, so none of its 40 ns is after a sync. The same sync one nanosecond longer,
    [5, 11), is running as the gap begins: 50 - 11 = 39 ns after it."""
    busy = {0: (_a([0, 50]), _a([10, 100]))}
    res = blame(2, {0: (0, 100)}, busy, _a([5]), _a([10]), _a([1]), _a([0]), np.array([True]))
    assert res.after_sync == 0
    res = blame(2, {0: (0, 100)}, busy, _a([5]), _a([11]), _a([1]), _a([0]), np.array([True]))
    assert res.after_sync == 39


def test_an_interval_cut_to_nothing_is_not_counted_again_on_another_clock():
    """One thread's intervals [500, 600) and [550, 600): the second lies inside the first and ends
    with it, so the cut leaves it nothing and it is dropped, counted once as cut. The one left is
    outside the window [0, 100) (busy [0, 10)): one host interval on another clock, not two."""
    res = blame(2, {0: (0, 100)}, {0: (_a([0]), _a([10]))}, _a([500, 550]), _a([600, 600]), _a([1, 1]), _a([0, 0]))
    assert res.skipped == {idle.OVERLAP_HOST: 1, idle.HOST_CLOCK: 1}
    assert res.per_node.tolist() == [0, 0] and res.totals()["unattributed"] == 90


@pytest.mark.parametrize("ht, hs, he, want", [
    ([0, 0, 1], [0, 10, 0], [10, 20, 5], True),  # one after another (touching), a new thread from 0
    ([0, 1], [10, 0], [20, 5], True),  # a later thread may start earlier
    ([0, 0, 0], [0, 10, 20], [5, 15, 25], True),
    ([0, 0], [0, 5], [10, 20], False),  # overlapping the one before
    ([0, 0, 0], [0, 10, 12], [5, 15, 20], False),  # overlapping the one before, not the first
    ([0, 0], [5, 5], [5, 9], False),  # equal starts (a zero-length one first)
    ([0, 0, 0], [0, 10, 10], [5, 10, 12], False),  # equal starts, not the first
    ([1, 0], [0, 0], [1, 1], False),  # threads out of order
    ([0, 2, 1], [0, 0, 0], [1, 1, 1], False),  # out of order after the first
])
def test_sorted_disjoint_is_what_the_sort_would_leave_alone(ht, hs, he, want) -> None:
    """The shortcut that skips sorting host intervals (`_disjoint_per_thread`): true only where
    the intervals are in (thread, start) order, starts strictly increasing on a thread, each
    starting no earlier than the previous one of its thread ends; each case by hand. Written for
    the eight mutants of the check that the whole-module run left alive (docs/MUTATION.md)."""
    from dlpt.idle import _disjoint_per_thread, _sorted_disjoint

    a = [np.asarray(x, dtype=np.int64) for x in (hs, he, ht)]
    assert _sorted_disjoint(*a) is want
    order, starts, cut = _disjoint_per_thread(*a)
    # Where it holds, the order is as given and nothing is cut; the sort would leave it so too.
    assert (order is None) == want and (not want or (cut == 0 and np.array_equal(starts, a[0])))
