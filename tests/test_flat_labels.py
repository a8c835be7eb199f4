"""The flat view's group of what has no key says what it holds (issue #34: a `<no source line>`
row at 20% of a short script, unexplained)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
