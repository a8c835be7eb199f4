"""The flat view's group of what has no key says what it holds (issue #34: a `<no source line>`
row at 20% of a short script, unexplained)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import by_hand

import dlpt
from dlpt.metrics import COL
from dlpt.views import flat

DATA = Path(__file__).parent / "data"


def test_no_source_line_names_its_reasons_largest_first() -> None:
    prof = dlpt.load(str(DATA / "gpu_gptfast_compile.dlpt"))
    label = flat(prof, "line").labels[-1]
    # The oracle, from the raw tree: the `<unattributed: …>` frames directly under the root, by
    # their subtrees' GPU idle and host time.
    cct, frames = prof.cct, prof.frames
    cols = [COL["gpu_idle_time"], COL["host_time"]]
    tops = {}
    for node in np.flatnonzero(cct.parent == 0).tolist():
        fr = frames[int(cct.frame[node])]
        if fr.kind == "unattributed":
            tops[fr.name[len("<unattributed: "):-1]] = int(cct.inclusive[node, cols].sum())
    assert len(tops) >= 2, tops
    first, second = sorted(tops, key=lambda r: -tops[r])[:2]
    assert label.startswith(f"<no source line: {first}; "), label
    assert second[:40] in label, (second, label)
    # The root's own work (dlpt starting and ending the program) is named too.
    if cct.exclusive[0, cols].sum() > 0:
        assert "outside the program's code" in label or label.endswith("more>"), label
    # Groupings whose `<no …>` row holds every other kind of work keep the bare label.
    assert flat(prof, "kernel").labels[-1] == "<no GPU activity>"
    assert flat(prof, "op").labels[-1] == "<no op>"


def test_a_profile_with_nothing_unkeyed_keeps_the_bare_label() -> None:
    from dlpt.cct import TreeBuilder
    from dlpt.collectors.assembly import ActivityColumns, build_profile
    from dlpt.frames import Frame, FrameTable, source_frame

    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    line = b.child(0, frames.intern(source_frame("prog.py", 3, "<module>")))
    cols = ActivityColumns()
    cols.extra["host_time"] = (np.array([line]), np.array([5_000_000]))
    prof = build_profile(b, frames, cols, {"source": "record"})
    assert flat(prof, "line").labels[-1] == "<no source line>"


def test_the_roots_own_work_is_named_even_alone() -> None:
    """The root's own time (dlpt starting and ending the program) is the one thing without a
    line: the row says so, in a tree of the root alone and beside a line of the program."""
    from dlpt.frames import Frame, source_frame

    root = Frame("root", "r")
    alone = by_hand([(-1, root, {"host_time": 2_000_000})])
    for by in ("line", "function", "file", "kernel", "op"):
        fv = flat(alone, by)  # a tree of one node: one row, the one for no key, holding the root's time
        assert len(fv.labels) == 1 and int(fv.exclusive[0, COL["host_time"]]) == 2_000_000, by
    assert flat(alone, "line").labels == ["<no source line: outside the program's code>"]
    prof = by_hand([(-1, root, {"host_time": 2_000_000}),
                    (0, source_frame("prog.py", 3, "<module>"), {"host_time": 5_000_000})])
    assert flat(prof, "line").labels[-1] == "<no source line: outside the program's code>"
    assert flat(prof, "file").labels[-1] == "<no file: outside the program's code>"


def test_no_source_line_weighs_each_nanosecond_once_and_names_each_kind_of_top() -> None:
    """Three tops under the root hold work with no line: an `<unattributed: …>` frame first in
    the tree (3 ms of host time), another one holding a 2 ms kernel (gpu_time and kernel_time
    both say those 2 ms: counted once), and an op outside any Python frame (1 ms of its own).
    Named largest first, the first node of the tree by its reason, the op as such."""
    from dlpt.frames import Frame, source_frame, unattributed_frame

    prof = by_hand([
        (-1, Frame("root", "r"), {}),
        (0, unattributed_frame("start-up"), {"host_time": 3_000_000}),
        (0, unattributed_frame("no launch record"), {}),
        (2, Frame("kernel", "k"), {"gpu_time": 2_000_000, "kernel_time": 2_000_000, "kernel_count": 1}),
        (0, Frame("op", "aten::copy_"), {"cpu_time": 1_000_000}),
        (0, source_frame("prog.py", 3, "<module>"), {"host_time": 9_000_000}),
    ])
    want = "<no source line: start-up; no launch record; ops outside any Python frame>"  # three: no "more"
    assert flat(prof, "line").labels[-1] == want


def test_no_source_line_shows_three_reasons_of_at_most_60_characters() -> None:
    """Four reasons, largest first: one of exactly 60 characters shown whole, one of 61 cut to
    59 and an ellipsis, a third, and the fourth counted as "1 more"."""
    from dlpt.frames import Frame, unattributed_frame

    r60, r61 = "a" * 60, "b" * 61
    prof = by_hand([(-1, Frame("root", "r"), {})] + [
        (0, unattributed_frame(r), {"host_time": ns})
        for r, ns in ((r60, 4_000), (r61, 3_000), ("third", 2_000), ("fourth", 1_000))])
    assert flat(prof, "line").labels[-1] == f"<no source line: {r60}; {'b' * 59}…; third; 1 more>"
