"""`dlpt view` as a newcomer meets it: a CPU-only profile, the cursor on screen whatever the
keys, 80×24 terminals, the line's code in the table, the metric picker, going back, and where
the hot path stops. The real app, driven through textual's Pilot."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import DATA, TRACE_SOURCES, trace_path
from rich.console import Console
from test_tui import header_text, run_async, settle, visible_strip_text
from textual.widgets import Footer

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import Frame, FrameTable
from dlpt.loader import open_profile
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.sources import snapshot_sources
from dlpt.viewers.tui import DlptApp
from dlpt.viewers.tui.detail import render_detail
from dlpt.viewers.tui.picker import MetricPicker

CPU = str(DATA / "cpu_train_small.dlpt")


@pytest.fixture(scope="module")
def gpt() -> Profile:
    prof = open_profile(str(trace_path("gpt_train")))
    prof.sources.update(snapshot_sources(prof, [str(TRACE_SOURCES)]))
    return prof


def assert_cursor_on_screen(app: DlptApp) -> None:
    """The cursor's row is among the rows drawn, and the line drawn there is that row."""
    t = app.table
    top = int(t.scroll_offset.y)
    assert top <= t.cursor < top + t.visible_rows(), (t.cursor, top, t.visible_rows())
    o = t.outline
    drawn = visible_strip_text(app, t.cursor - top + 1)
    frame = o.rows.frame(int(o.keys[t.cursor]))
    expect = f"{os.path.basename(frame.file)}:{frame.line}" if frame.has_source else o.rows.label(int(o.keys[t.cursor]))[:8]
    assert expect in drawn, (expect, drawn)
    # Nothing takes the last line of the table away (a horizontal scrollbar did).
    assert not t.show_horizontal_scrollbar


# ---- a profile without GPU activity ---------------------------------------------------------

@run_async
async def test_cpu_profile_opens_on_host_time() -> None:
    app = DlptApp(CPU)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.metric == "host_time"  # the recording sampled it: the time on each line
        assert app.table.total == int(app.base.cct.exclusive[:, COL["host_time"]].sum()) > 0
        # The program's <module> holds nearly all of it (a few ms are dlpt's start and end, and
        # imports' tokenizing before the program's first line: rows of their own).
        first = visible_strip_text(app, 1)
        assert "<module>" in first and float(re.search(r"(\d+\.\d)%", first).group(1)) >= 99.0, first
        assert "no GPU activity" in header_text(app) and "metric host_time" in header_text(app)
        # The hot path follows real time: every step is the costliest child.
        await pilot.press("e")
        await settle(pilot)
        src, key = app.outline.rows, app.table.current_key
        assert int(src.primary(np.array([key]), COL["host_time"])[0]) > 0
        # `s` steps only through metrics this profile has: with no GPU activity, none of the GPU ones.
        seen = set()
        for _ in range(4):
            await pilot.press("s")
            await settle(pilot)
            seen.add(app.metric)
        totals = app.metric_totals()
        assert all(totals[m] > 0 for m in seen) and "gpu_time" not in seen


@run_async
async def test_metric_given_on_the_command_line_wins() -> None:
    app = DlptApp(CPU, metric="gpu_time")
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.metric == "gpu_time" and app.table.total == 0


# ---- the cursor stays on screen -------------------------------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
@run_async
async def test_cursor_stays_visible(gpt: Profile, size: tuple[int, int]) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("e")  # a long path: the selected leaf is far below the first screen
        await settle(pilot)
        assert app.table.cursor > app.table.visible_rows()
        assert_cursor_on_screen(app)
        await pilot.press("home")
        await settle(pilot)
        # Down past the screen's bottom, and three screens on (the whole outline took 8 s a size)
        for _ in range(min(len(app.outline) - 1, 3 * app.table.visible_rows())):
            await pilot.press("down")
            assert_cursor_on_screen(app)
        await pilot.press("pageup", "pageup")
        assert_cursor_on_screen(app)
        await pilot.press("end")
        await settle(pilot)
        assert_cursor_on_screen(app)
        # Opening the last row adds rows below it; the cursor stays where it was, on screen.
        await pilot.press("home", "down", "down")
        await pilot.press("e")
        await settle(pilot)
        assert_cursor_on_screen(app)


# ---- 80 columns -----------------------------------------------------------------------------

@run_async
async def test_80x24_shows_the_keys_and_whole_line_numbers(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        footer = app.query_one(Footer)
        assert footer.region.bottom == 24
        text = "".join(s.text for s in app.screen._compositor.render_strips()[-1:])
        for hint in ("q quit", "? help", "e hot path", "b back", "m metric"):
            assert hint in text, text
        o = app.outline
        top = int(app.table.scroll_offset.y)
        shown = 0
        for r in range(top, min(top + app.table.visible_rows(), len(o))):
            fr = o.rows.frame(int(o.keys[r]))
            if fr.has_source:
                line = visible_strip_text(app, r - top + 1)
                assert f"{os.path.basename(fr.file)}:{fr.line} " in line, line
                shown += 1
        await pilot.press("home")
        await settle(pilot)
        for r in range(min(app.table.visible_rows(), len(o))):
            fr = o.rows.frame(int(o.keys[r]))
            if fr.has_source:
                assert f"{os.path.basename(fr.file)}:{fr.line} " in visible_strip_text(app, r + 1)
                shown += 1
        assert shown >= 2


@run_async
async def test_code_beside_the_line_when_the_table_is_wide(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        o = app.outline
        with_code = 0
        for r in range(min(app.table.visible_rows(), len(o))):
            key = int(o.keys[r])
            fr = o.rows.frame(key)
            if fr.has_source:
                code = gpt.source_line(fr.file, fr.line)
                assert code
                line = visible_strip_text(app, r + 1)
                assert f"▸ {code}"[:20] in line, line
                with_code += 1
        assert with_code >= 3


@run_async
async def test_kernel_names_stay_short_in_the_detail_pane(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("3", "g", "g", "g")  # flat by kernel
        await settle(pilot)
        o = app.outline
        names = [o.rows.frame(int(k)).name for k in o.keys]
        r = max(range(len(names)), key=lambda i: len(names[i]) if o.rows.frame(int(o.keys[i])).kind == "kernel" else 0)
        assert len(names[r]) > 150
        app.table.move_to(r)
        await settle(pilot)
        con = Console(width=78, record=True, color_system=None)
        con.print(render_detail(app.detail))
        lines = con.export_text().splitlines()
        assert len(lines[0]) <= 78  # the title: one line
        joined = "".join(ln.strip() for ln in lines[lines.index("full name") + 1:])
        assert joined.replace(" ", "") == names[r].replace(" ", "")  # the whole name, at the end


# ---- picking a metric, going back -----------------------------------------------------------

async def open_picker(pilot, app: DlptApp) -> MetricPicker:
    """Press `m`; the metric picker is the screen."""
    await pilot.press("m")
    await pilot.pause()
    picker = app.screen
    assert isinstance(picker, MetricPicker)
    return picker


@run_async
async def test_metric_picker(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        picker = await open_picker(pilot, app)
        totals = app.metric_totals()
        assert picker.metrics == [m for m in METRICS if totals[m]]
        assert picker.metrics[0] == "gpu_time"
        await pilot.press("escape")
        await pilot.pause()
        assert app.metric == "gpu_time" and not isinstance(app.screen, MetricPicker)
        await pilot.press("m")
        await pilot.pause()
        steps = app.screen.metrics.index("dtod_time")
        await pilot.press(*["down"] * steps, "enter")
        await settle(pilot)
        assert app.metric == "dtod_time"
        assert app.table.total == int(gpt.cct.exclusive[:, COL["dtod_time"]].sum()) > 0
        assert "metric dtod_time" in header_text(app)


@run_async
async def test_back_undoes_the_hot_path_and_view_switches(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("enter", "down")
        await settle(pilot)
        keys, cursor = app.outline.keys.copy(), app.table.cursor
        await pilot.press("e")
        await settle(pilot)
        assert len(app.outline) > len(keys)
        await pilot.press("3")
        await settle(pilot)
        assert app.view == "flat"
        await pilot.press("b")  # back to the expanded tree, on the row `e` ended on
        await settle(pilot)
        assert app.view == "top-down" and len(app.outline) > len(keys)
        assert_cursor_on_screen(app)
        await pilot.press("backspace")  # back to before `e`
        await settle(pilot)
        assert np.array_equal(app.outline.keys, keys) and app.table.cursor == cursor
        await pilot.press("b")  # nothing left: nothing changes
        await settle(pilot)
        assert np.array_equal(app.outline.keys, keys) and app.view == "top-down"


# ---- where the hot path stops ---------------------------------------------------------------

def _self_heavy_profile() -> Profile:
    """`train.py:10` calls an op with 80 ms of its own work, which calls `aten::empty` (0.1 ms);
    a second line costs 20 ms beneath it through a chain."""
    ft = FrameTable([Frame("root", "<root>")])
    b = TreeBuilder(0)
    mod = ft.intern(Frame("python", "<module> (train.py:20)", "train.py", 20, "<module>"))
    line = ft.intern(Frame("python", "step (train.py:10)", "train.py", 10, "step"))
    big = ft.intern(Frame("op", "aten::big_op"))
    empty = ft.intern(Frame("op", "aten::empty"))
    other = ft.intern(Frame("python", "step (train.py:11)", "train.py", 11, "step"))
    small = ft.intern(Frame("op", "aten::add"))
    n_big = b.path([mod, line, big])
    n_empty = b.path([mod, line, big, empty])
    n_small = b.path([mod, other, small])
    parent, frame, new = b.preorder()
    exc = np.zeros((len(parent), len(METRICS)), dtype=np.int64)
    for node, ns in ((n_big, 80_000_000), (n_empty, 100_000), (n_small, 20_000_000)):
        exc[new[node], COL["cpu_time"]] = ns
    return Profile(ft.frames, CCT(parent, frame, exc), meta={"source": "record"},
                   sources={"train.py": "\n" * 9 + "y = big(x)\nz = y + 1\n" + "\n" * 8 + "main()\n"})


@run_async
async def test_hot_path_stops_where_the_row_does_the_work() -> None:
    app = DlptApp(profile=_self_heavy_profile())
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.metric == "cpu_time"
        await pilot.press("e")
        await settle(pilot)
        assert app.outline.rows.label(app.table.current_key) == "aten::big_op"
        assert "aten::empty" not in app.row_names()
        await pilot.press("right")  # it is still there to open
        await settle(pilot)
        assert "aten::empty" in app.row_names()
