"""`dlpt view` as a newcomer meets it: a CPU-only profile, the cursor on screen whatever the
keys, 80×24 terminals, the line's code in the table, the metric picker, going back, and where
the hot path stops. The real app, driven through textual's Pilot."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import DATA, TRACE_SOURCES, trace_path
from rich.cells import cell_len
from rich.console import Console
from test_tui import header_text, run_async, settle, visible_strip_text
from textual.widgets import Footer

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import Frame, FrameTable
from dlpt.loader import Inputs, open_profile
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.sources import snapshot_sources
from dlpt.viewers.tui import DlptApp
from dlpt.viewers.tui.detail import render_detail
from dlpt.viewers.tui.labels import fit_label, frame_label
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
    app = DlptApp(Inputs([CPU]))
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
    app = DlptApp(Inputs([CPU]), metric="gpu_time")
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.metric == "gpu_time" and app.table.total == 0
        # No row holds any: the table says so, and how many rows it leaves out.
        assert len(app.outline) == 0 and "no gpu_time in this view" in visible_strip_text(app, 1)
        assert re.search(r"\(\d+ rows with no gpu_time hidden; m picks another metric\)", visible_strip_text(app, 2))


# ---- rows without the metric ----------------------------------------------------------------

def _render(renderable) -> str:
    con = Console(width=100, record=True, no_color=True)
    con.print(renderable)
    return con.export_text()


@run_async
async def test_rows_without_the_metric_are_hidden_and_counted() -> None:
    """Under host_time, `opt.step()` opened onto `aten::` rows at 0.0% with blank values: its
    ops have CPU time, the line has the wall time. Such rows are left out, and counted."""
    app = DlptApp(Inputs([CPU]))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        o, col = app.outline, COL["host_time"]
        src = o.rows
        step = next(int(k) for k in o.keys if src.label(int(k)).startswith("examples/transformer_train.py:86 "))
        kids = src.children(step)
        assert len(kids) and (src.inclusive(kids, col) == 0).all() and (src.inclusive(kids, COL["cpu_time"]) > 0).all()
        assert not o.expandable(step) and o.hidden_children(step) == len(kids)
        # Every row open: each one shown holds some host time.
        r = 0
        while r < len(o) and len(o) < 5000:
            o.expand(r)
            r += 1
        app.table.structure_changed()
        assert (src.primary(o.keys, col) > 0).all()
        # Below the last row, what was left out: every open row's children without host time.
        await pilot.press("end")
        await settle(pilot)
        n = o.hidden()
        assert n >= len(kids)
        drawn = [visible_strip_text(app, y) for y in range(1, app.table.visible_rows() + 1)]
        assert f"({n:,} rows with no host_time hidden; m picks another metric)" in "\n".join(drawn)
        # opt.step()'s detail pane says what is beneath it.
        app.table.move_to(o.row_of(step))
        await settle(pilot)
        assert f"{len(kids)} of its children hold no host_time: hidden" in _render(render_detail(app.detail))
        # Under cpu_time the ops are there to open...
        app.set_metric("cpu_time")
        await settle(pilot)
        assert app.table.current_key == step and o.expandable(step)
        await pilot.press("right", "down")
        await settle(pilot)
        op = app.table.current_key
        assert src.parent(op) == step and src.label(op).startswith("aten::")
        # ...and back under host_time, the cursor on one goes to its line, not to the first row.
        app.set_metric("host_time")
        await settle(pilot)
        assert app.table.current_key == step


@run_async
async def test_a_search_whose_matches_hold_none_of_the_metric() -> None:
    app = DlptApp(Inputs([CPU]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        keys = app.outline.keys.copy()
        await pilot.press("slash", *"aten::add_", "enter")
        await settle(pilot)
        # The ops match, but hold no host time: the table stays as it was, and says why.
        assert app.search_text == "" and np.array_equal(app.outline.keys, keys)
        assert "no row matching 'aten::add_' holds any host_time" in header_text(app)
        app.set_metric("cpu_time")
        await settle(pilot)
        await pilot.press("slash", *"aten::add_", "enter")
        await settle(pilot)
        o = app.outline
        hits = [int(k) for k in o.keys if o.rows.label(int(k)) == "aten::add_"]
        assert app.search_text == "aten::add_" and hits
        # Back to host_time, the filter kept: no row it keeps holds any, and the table says so.
        app.set_metric("host_time")
        await settle(pilot)
        assert len(app.outline) == 0
        assert "no row matching 'aten::add_' holds any host_time in this view" in visible_strip_text(app, 1)


# ---- names cut to the column ----------------------------------------------------------------

FROZEN = Frame("python", "_find_and_load (<frozen importlib._bootstrap>:690)", "<frozen importlib._bootstrap>",
               690, "_find_and_load")
LONG = Frame("python", "f (x.py:34)", "/venv/site-packages/torch/_functorch/_aot_autograd/collect_metadata_analysis.py",
             34, "run_functionalized_fw_and_collect_metadata")


def test_file_names_keep_their_start_and_line() -> None:
    """A file name cut to the column loses its directory, then its middle: never its start or
    its line (cut from the left, `<frozen importlib._bootstrap>:690` read `…lib._bootstrap>:690`)."""
    label = frame_label(FROZEN)
    assert fit_label(FROZEN, label, 40) == "<frozen importlib._bootstrap>:690 _find…"
    assert fit_label(FROZEN, label, 24) == "<frozen …_bootstrap>:690"
    assert fit_label(FROZEN, label, 16) == "_bootstrap:690"
    label = frame_label(LONG)
    assert fit_label(LONG, label, 40) == "collect_metadata_analysis.py:34 run_fun…"
    for width in range(12, 32):
        cut = fit_label(LONG, label, width)
        assert cell_len(cut) <= width and cut.startswith("coll") and cut.endswith(".py:34"), (width, cut)
    # A file's row in the flat view is a path: its directory goes first, whole.
    path = "_aot_autograd/collect_metadata_analysis.py"
    assert fit_label(LONG, path, 35) == "…/collect_metadata_analysis.py"
    assert fit_label(LONG, path, 20) == "collect_me…alysis.py"


@run_async
async def test_deep_library_rows_keep_their_file_names() -> None:
    app = DlptApp(Inputs([CPU]))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("l")
        await settle(pilot)
        await pilot.press("e")  # deep in the import machinery: little room beside the indentation
        await settle(pilot)
        drawn = "\n".join(visible_strip_text(app, y) for y in range(1, app.table.visible_rows() + 1))
        assert "_bootstrap" in drawn and "lib._bootstrap" not in drawn.replace("importlib._bootstrap", "")


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
        # Down past the screen's bottom and half a screen on: every press past the bottom scrolls
        # (three screens took 6.5 s a size; the whole outline 8 s)
        for _ in range(min(len(app.outline) - 1, app.table.visible_rows() * 3 // 2)):
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
