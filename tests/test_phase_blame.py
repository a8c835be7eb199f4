"""GPU idle blamed phase by phase (`dlpt.idle.blame_phases`, `merged_meta`), in process, on
intervals small enough to blame by hand with the rule of dlpt/idle.py's docstring: idle before a
device's first activity is start-up; every other idle nanosecond goes to the host intervals that
cover it, the threads running at once sharing it equally; idle no interval covers is
unattributed. A phase's own figures are of its stretches alone; time outside them is neither its
idle nor its blame. The recorder calls these in its subprocess recordings only, which the
mutation tool (tools/mutate.py) cannot see; these tests judge them in process."""

from __future__ import annotations

import numpy as np

from dlpt.idle import NEGATIVE_HOST, UNKNOWN_NODE, blame_phases, merged_meta

A = np.asarray

# One device, its window [0, 100) ns, busy [10, 20) and [60, 70). Phases: start-up [0, 30), steady
# [30, 100). Host intervals (start, end, node, thread, sync):
WINDOWS = {0: (0, 100)}
BUSY = {0: (A([10, 60]), A([20, 70]))}
SPANS = {0: (A([0]), A([30])), 2: (A([30]), A([100]))}
HOST = [
    (0, 30, 1, 1, False),   # start-up code
    (30, 55, 2, 1, False),  # a steady line
    (40, 50, 5, 2, False),  # another thread meanwhile
    (55, 60, 3, 1, True),   # a sync
    (70, 90, 4, 1, False),  # a line after the second kernel; [90, 100) no line runs
]


def _host(rows: list[tuple[int, int, int, int, bool]]) -> tuple[np.ndarray, ...]:
    cols = list(zip(*rows))
    return A(cols[0]), A(cols[1]), A(cols[2]), A(cols[3]), A(cols[4], dtype=bool)


def _same(nodes: np.ndarray, p: int) -> np.ndarray:
    return nodes


def test_each_phase_is_blamed_on_its_own_stretches() -> None:
    res, skipped = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(HOST), _same)
    assert skipped == {}
    start, steady = res[0], res[2]
    # Start-up [0, 30): [0, 10) before the first kernel is start-up; [20, 30) goes to node 1.
    d = start.devices[0]
    assert (d.window, d.busy, d.idle, d.startup, d.unattributed) == (30, 10, 20, 10, 0)
    assert start.per_node.tolist() == [0, 10, 0, 0, 0, 0, 0, 0, 0, 0]
    assert (start.host, start.sync) == (10, 0)
    # Steady [30, 100): [30, 40) node 2; [40, 50) node 2 and node 5's thread, 5 each; [50, 55)
    # node 2; [55, 60) the sync, node 3; [70, 90) node 4; [90, 100) no line: unattributed.
    d = steady.devices[0]
    assert (d.window, d.busy, d.idle, d.startup, d.unattributed) == (70, 10, 60, 0, 10)
    assert steady.per_node.tolist() == [0, 0, 20, 5, 20, 5, 0, 0, 0, 0]
    assert (steady.host, steady.sync) == (45, 5)


def test_the_phases_add_up_to_the_run() -> None:
    res, skipped = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(HOST), _same)
    m = merged_meta(list(res.values()), skipped)
    assert {k: m[k] for k in ("busy", "idle", "host", "sync", "start-up", "unattributed", "queued")} == {
        "busy": 20, "idle": 80, "host": 55, "sync": 5, "start-up": 10, "unattributed": 10, "queued": 0}
    assert m["devices"]["0"] == {"window": 100, "busy": 20, "idle": 80, "start-up": 10, "unattributed": 10,
                                 "queued": 0}
    # Conservation: every idle nanosecond is a line's, start-up's or no line's.
    per_node = sum(r.per_node for r in res.values())
    assert int(per_node.sum()) + m["start-up"] + m["unattributed"] == m["idle"]


def test_a_node_moved_into_its_phase_gets_the_phase_s_blame() -> None:
    # A sample taken as the phase changed names the last phase's node: node_in_phase moves it
    # (here node 2 becomes node 12 in the steady phase, beyond the run's 10 nodes).
    def moved(nodes: np.ndarray, p: int) -> np.ndarray:
        return np.where(nodes == 2, 12, nodes) if p == 2 else nodes

    res, _ = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(HOST), moved)
    steady = res[2]
    assert len(steady.per_node) == 13 and len(res[0].per_node) == 13  # room in every phase's result
    assert steady.per_node[12] == 20 and steady.per_node[2] == 0
    assert res[0].per_node[1] == 10  # the start-up phase keeps its own nodes


def test_bad_host_intervals_are_counted_once_for_the_run() -> None:
    rows = HOST + [(50, 40, 6, 3, False),  # a negative duration
                   (20, 25, 10, 3, False),  # a node the run does not have (it has 0..9)
                   (22, 22, 99, 4, False),  # an empty one on such a node: counted too
                   (65, 65, 7, 5, False)]  # empty, on a node it has: nothing wrong, nothing blamed
    res, skipped = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(rows), _same)
    assert skipped == {NEGATIVE_HOST: 1, UNKNOWN_NODE: 2}
    # ... and left out of the blame: the figures are those of the clean input.
    assert res[0].per_node.tolist()[:6] == [0, 10, 0, 0, 0, 0]
    assert res[2].per_node.tolist()[:6] == [0, 0, 20, 5, 20, 5]


def test_a_phase_of_several_stretches_and_bad_gpu_input() -> None:
    # Three phases over [0, 100): steady [0, 30) and [60, 100) around a compile [30, 60). Busy
    # [10, 20) and [40, 50) and [70, 80); one host line [0, 100) on one thread (node 1).
    windows = {0: (0, 100), 1: (50, 50)}  # device 1: an empty window
    busy = {0: (A([10, 40, 70, -10, 100, 150, 95, 85]), A([20, 50, 80, 0, 110, 150, 90, 85]))}
    # the last five: ending at the window's start, starting at its end, empty and outside, negative,
    # empty inside: two outside, one negative, the empty ones neither
    spans = {2: (A([0, 60]), A([30, 100])), 1: (A([30]), A([60]))}
    hs, he, hn, ht, hy = _host([(0, 100, 1, 1, False)])
    res, skipped = blame_phases(3, windows, busy, spans, hs, he, hn, ht, hy, _same)
    assert skipped == {"GPU activities with a negative duration": 1, "GPU activities outside the window": 2,
                       "devices with an empty window": 1}
    steady, comp = res[2], res[1]
    # Steady: [0, 10) start-up; [20, 30), [60, 70), [80, 100) the line: 40. Its window 70, busy 20.
    d = steady.devices[0]
    assert (d.window, d.busy, d.idle, d.startup, d.unattributed) == (70, 20, 50, 10, 0)
    assert steady.per_node.tolist() == [0, 40, 0]
    # Compile [30, 60): [30, 40) and [50, 60) the line. Its window 30, busy 10; no start-up (the
    # time before it counts as busy here).
    d = comp.devices[0]
    assert (d.window, d.busy, d.idle, d.startup, d.unattributed) == (30, 10, 20, 0, 0)
    assert comp.per_node.tolist() == [0, 20, 0]
    assert steady.skipped == {} and comp.skipped == {}  # the run's, counted once (above)


def test_host_intervals_overlapping_on_a_thread_are_cut_and_counted() -> None:
    # Thread 1's intervals [30, 55) and [50, 60) overlap by 5 ns: cut, counted, blamed once.
    rows = [(0, 30, 1, 1, False), (30, 55, 2, 1, False), (50, 60, 3, 1, False), (70, 100, 4, 1, False)]
    res, skipped = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(rows), _same)
    assert skipped == {"host intervals overlapping another of their thread (cut)": 1}
    steady = res[2]
    assert int(steady.per_node.sum()) + steady.devices[0].unattributed == steady.devices[0].idle == 60
    assert steady.per_node[2] + steady.per_node[3] == 30  # [30, 60) once, whoever holds [50, 55)


def test_the_root_node_is_a_node() -> None:
    # Host time on node 0 (the tree's root: a sample outside every frame) is blamed like any
    # line's: [90, 100), which no other interval covers, goes to it.
    res, skipped = blame_phases(10, WINDOWS, BUSY, SPANS, *_host(HOST + [(90, 100, 0, 2, False)]), _same)
    assert skipped == {}
    assert res[2].per_node[0] == 10 and res[2].devices[0].unattributed == 0


def test_merged_meta_sums_every_figure_of_the_phases() -> None:
    from dlpt.idle import DeviceIdle, IdleBlame

    a = IdleBlame(per_node=np.zeros(3, dtype=np.int64), host=5, sync=2, after_sync=3,
                  devices={0: DeviceIdle(window=40, busy=10, idle=30, startup=4, unattributed=1, queued=6)})
    b = IdleBlame(per_node=np.zeros(3, dtype=np.int64), host=7, sync=1, after_sync=4,
                  devices={0: DeviceIdle(window=60, busy=50, idle=10, startup=0, unattributed=2, queued=5),
                           1: DeviceIdle(window=9, busy=9)})
    m = merged_meta([a, b], {"host intervals on unknown nodes": 2})
    assert (m["host"], m["sync"], m["after_sync"]) == (12, 3, 7)
    assert (m["busy"], m["idle"], m["start-up"], m["unattributed"], m["queued"]) == (69, 40, 4, 3, 11)
    assert m["devices"] == {"0": {"window": 100, "busy": 60, "idle": 40, "start-up": 4, "unattributed": 3, "queued": 11},
                            "1": {"window": 9, "busy": 9, "idle": 0, "start-up": 0, "unattributed": 0, "queued": 0}}
    assert m["skipped"] == {"host intervals on unknown nodes": 2}


def test_clip_to_spans_cuts_intervals_at_the_stretches() -> None:
    from dlpt.idle import clip_to_spans

    ss, se = A([0, 50, 80]), A([30, 60, 100])
    # [20, 90) crosses all three stretches; [35, 45) lies between them; [55, 55) is empty;
    # [85, 120) runs past the last one.
    s, e, src = clip_to_spans(ss, se, A([20, 35, 55, 85]), A([90, 45, 55, 120]))
    assert list(zip(s.tolist(), e.tolist(), src.tolist())) == [(20, 30, 0), (50, 60, 0), (80, 90, 0), (85, 100, 3)]
    for empty in (clip_to_spans(A([]), A([]), A([1]), A([2])), clip_to_spans(ss, se, A([]), A([]))):
        assert [len(x) for x in empty] == [0, 0, 0]
