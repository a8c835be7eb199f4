"""`dlpt view`'s first screen and what the user reads on it: the tree opens on its hot path,
column headers stand over their numbers, `/` finds what the code column shows (and says so when
it finds nothing), and the metric picker fits 80×24. The real app, driven through Pilot."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA
from rich.cells import cell_len
from test_tui import run_async, settle
from textual.containers import Vertical
from textual.widgets import OptionList

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import Frame, FrameTable
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.viewers.tui import DlptApp
from dlpt.viewers.tui.picker import MetricPicker

SMALL = str(DATA / "gpu_train_small.dlpt")


def _many_kernels_profile(every_metric: bool = False) -> Profile:
    """A line whose kernels number in the tens of millions, more than a 7-wide column holds;
    `every_metric`: a little of every metric besides, so that the picker offers them all."""
    ft = FrameTable([Frame("root", "<root>")])
    b = TreeBuilder(0)
    mod = ft.intern(Frame("python", "<module> (train.py:1)", "train.py", 1, "<module>"))
    k = ft.intern(Frame("kernel", "gemm"))
    k2 = ft.intern(Frame("kernel", "relu"))
    n1, n2 = b.path([mod, k]), b.path([mod, k2])
    parent, frame, new = b.preorder()
    exc = np.zeros((len(parent), len(METRICS)), dtype=np.int64)
    for node, count, ns in ((n1, 12_345_678, 98_765_432_100), (n2, 1_000, 5_000)):
        exc[new[node], COL["kernel_count"]] = count
        exc[new[node], COL["kernel_time"]] = exc[new[node], COL["gpu_time"]] = ns
    if every_metric:
        exc[new[n2]] += 7
    return Profile(ft.frames, CCT(parent, frame, exc), meta={"source": "record"}, sources={"train.py": "main()\n"})


# ---- the metric picker fits 80×24 -----------------------------------------------------------

@pytest.mark.parametrize("every_metric", [False, True])
@run_async
async def test_metric_picker_fits_80x24(every_metric: bool) -> None:
    app = DlptApp(profile=_many_kernels_profile(every_metric))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()
        picker = app.screen
        assert isinstance(picker, MetricPicker)
        assert len(picker.metrics) == (len(METRICS) if every_metric else 3)
        box, ol = picker.query_one(Vertical), picker.query_one(OptionList)
        assert picker.region.contains_region(box.region)
        # One frame, the list inside it: its last rows scroll, never run out through the border.
        assert box.content_region.contains_region(ol.region)
        widest = max(cell_len(ol.get_option_at_index(i).prompt.plain) for i in range(ol.option_count))
        assert widest <= ol.scrollable_content_region.width  # no option wraps or runs past the frame
        assert ol.virtual_size.height == ol.option_count  # one line each


# ---- snapshots (pytest --snapshot-update regenerates them) --------------------------------------

def test_snapshot_metric_picker_80x24(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    assert snap_compare(DlptApp(SMALL), terminal_size=(80, 24), run_before=before)
