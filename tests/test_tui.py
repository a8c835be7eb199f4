"""`dlpt view`: the real app driven through textual's Pilot on real GPU traces (run on CPU)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from conftest import TRACE_SOURCES, trace_path
from rich.console import Console
from textual.widgets import Static

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import Frame, FrameTable
from dlpt.loader import Inputs, open_profile
from dlpt.metrics import COL, KERNEL, exclusive_matrix
from dlpt.profile import Activities, Profile
from dlpt.sources import snapshot_sources
from dlpt.viewers.tui import DlptApp
from dlpt.viewers.tui.detail import render_detail
from dlpt.viewers.tui.help import KEYS, HelpScreen
from dlpt.viewers.tui.rows import METRIC_CYCLE, FlatRows, Outline, TreeRows
from dlpt.viewers.tui.search import filter_keys

GPT = str(trace_path("gpt_train"))
COPIES = str(trace_path("copies"))
TOOLS = str(TRACE_SOURCES)


def run_async(fn):
    """Run an async test on its own event loop (no asyncio plugin is needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


@pytest.fixture(scope="module")
def gpt() -> Profile:
    prof = open_profile(GPT)
    # The traces name `capture_traces.py` relative to where it ran; its text is in tests/data/tools.
    prof.sources.update(snapshot_sources(prof, [TOOLS]))
    return prof


async def settle(pilot) -> None:
    """Wait until background work is done and the detail pane has caught up."""
    app = pilot.app
    for _ in range(200):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not app.busy and not any(w.is_running for w in app.workers):
            break
    await pilot.pause(0.08)  # the detail pane waits 50 ms for the cursor to rest
    await app.workers.wait_for_complete()
    await pilot.pause()


def gpu_total(prof: Profile) -> int:
    return int(prof.cct.exclusive[:, COL["gpu_time"]].sum())


def header_text(app: DlptApp) -> str:
    return str(app.query_one("#header", Static).content)


def visible_strip_text(app: DlptApp, y: int) -> str:
    return app.table.render_line(y).text


@run_async
async def test_opens_with_header_and_rows(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        header = header_text(app)
        assert "NVIDIA H200" in header
        for part in ("kernels 8.57 ms", "HtoD", "DtoH", "DtoD", "memset"):
            assert part in header
        # It opens on the hot path (tests/test_tui_screen.py), the program's line at the top.
        assert app.row_names()[0] == "capture_traces.py:145 <module>" and len(app.outline) > 1
        assert app.table.total == gpu_total(gpt)
        await pilot.press("home")
        assert "100.0%" in visible_strip_text(app, 1)
        await settle(pilot)
        assert app.detail is not None and app.detail.primary[1] == gpu_total(gpt)


@run_async
async def test_views_conserve_totals(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        totals = {}
        for key, view in (("1", "top-down"), ("2", "bottom-up"), ("3", "flat")):
            await pilot.press(key)
            await settle(pilot)
            assert app.view == view
            o = app.outline
            col = COL["gpu_time"]
            # The top-level rows of every view add up to the same total.
            if o.rows.is_tree:
                totals[view] = int(o.rows.primary(o.rows.roots(), col).sum())
            else:
                totals[view] = int(o.rows.primary(np.arange(len(o.rows)), col).sum())
            assert app.table.total == totals[view]
        assert totals["top-down"] == totals["bottom-up"] == totals["flat"] == gpu_total(gpt)
        # Bottom-up's first level are the frames that did the work: kernels, copies, memsets.
        await pilot.press("2")
        await settle(pilot)
        kinds = {app.outline.rows.frame(int(k)).kind for k in app.outline.keys}
        # (and, with host and idle time, the Python events and modules a trace names)
        assert kinds <= {"kernel", "memcpy", "memset", "unattributed", "op", "python", "module"}
        assert "kernel" in kinds


@run_async
async def test_expand_collapse_keys(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        # Close the hot path it opened on, climbing it: `left` closes an open row, then goes up.
        await pilot.press(*["left"] * 2 * (int(app.outline.depth[app.table.cursor]) + 1))
        # The root's rows: the program's <module> line. The GPU idle that no line caused (work
        # queued between launched kernels) is a row of its own under gpu_idle_time; it holds no
        # gpu_time, so here it is left out, and counted below the rows.
        tops = [app.row_names()[i] for i in range(len(app.outline))]
        assert tops == ["capture_traces.py:145 <module>"], tops
        assert app.outline.hidden() == 1 and "(1 row with no gpu_time hidden" in visible_strip_text(app, 2)
        assert not app.outline.expanded
        await pilot.press("enter")
        assert app.row_names()[:2] == ["capture_traces.py:145 <module>", "capture_traces.py:59 run"]
        await pilot.press("down", "right")
        n = len(app.outline)
        assert n > 2
        await pilot.press("down")
        assert app.table.cursor == 2
        await pilot.press("left")  # on a closed row: go to its parent
        assert app.table.cursor == 1
        await pilot.press("left")  # on an open row: close it
        assert len(app.outline) == 2
        await pilot.press("up", "space")
        assert len(app.outline) == 1
        # Clicking the ▸ mark opens the row (line 0 is the column header).
        await pilot.click("#table", offset=(0, 1))
        assert len(app.outline) == 2


@run_async
async def test_expand_hottest_path(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        o, t = app.outline, app.table
        src = o.rows
        key = t.current_key
        assert not src.has_children(key)  # it went all the way down
        col = COL["gpu_time"]
        for node in src.cct.path(key):
            sibs = src.cct.children(src.cct.parent[node])
            assert src.inclusive(np.array([node]), col)[0] == src.inclusive(sibs, col).max()
        assert app.detail is not None and app.detail.frame.kind in ("kernel", "memcpy", "memset")
        assert app.detail.activities and app.detail.activities[0].count >= 1


@run_async
async def test_search_filters_rows_and_ancestors(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"MmBackward0", "enter")
        await settle(pilot)
        assert app.search_text == "MmBackward0"
        o = app.outline
        src = o.rows
        names = app.row_names()
        assert any(n == "MmBackward0" for n in names)
        hit = {int(k) for k in o.keys if "mmbackward0" in src.label(int(k)).casefold()}
        assert hit
        for k in o.keys.tolist():
            # Every row matches or lies on the path to a match.
            sub = range(k, int(src.cct.end[k]))
            assert k in hit or any(h in sub for h in hit)
        assert "filter" in header_text(app)
        await pilot.press("down")
        await settle(pilot)
        found = app.table.current_key
        await pilot.press("escape")
        await settle(pilot)
        # The filter is gone; the row the user was on stays under the cursor, in its context.
        assert app.search_text == "" and app.outline.keep is None
        assert app.table.current_key == found and app.row_names()[0] == "capture_traces.py:145 <module>"


@run_async
async def test_metric_cycle_resorts(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("e", "s")
        await settle(pilot)
        assert app.metric == "kernel_time"
        assert app.table.total == int(gpt.cct.exclusive[:, COL["kernel_time"]].sum())
        await pilot.press("s", "s", "s", "s")
        await settle(pilot)
        assert app.metric == "memset_time"
        o = app.outline
        col = COL["memset_time"]
        vals = o.rows.primary(o.keys, col)
        # Siblings are in descending order of the metric.
        for r in range(len(o) - 1):
            nxt = np.flatnonzero(o.depth[r + 1:] <= o.depth[r])
            if len(nxt) and o.depth[r + 1 + nxt[0]] == o.depth[r]:
                assert vals[r] >= vals[r + 1 + nxt[0]]
        assert "memset_time" in header_text(app)


@run_async
async def test_library_frames_toggle(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        hidden_names = app.row_names()
        assert not any(n.startswith("torch/") for n in hidden_names)
        await pilot.press("l")
        await settle(pilot)
        assert app.include_library
        await pilot.press("e")
        await settle(pilot)
        names = app.row_names()
        assert any(n.startswith("torch/") or n.startswith("nn/") or "modules/" in n for n in names)
        assert app.table.total == gpu_total(gpt)
        assert "library shown" in header_text(app)
        await pilot.press("l")
        await settle(pilot)
        assert app.row_names() == hidden_names  # the hidden variant kept its expansion


@run_async
async def test_flat_grouping_cycle(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        assert app.view == "flat" and app.by == "line"
        seen = []
        for _ in range(4):
            await pilot.press("g")
            await settle(pilot)
            seen.append(app.by)
            assert isinstance(app.outline.rows, FlatRows)
            assert app.table.total == gpu_total(gpt)
        assert seen == ["function", "file", "kernel", "op"]
        await pilot.press("g", "g", "g")  # op -> line -> function -> file... back to kernel
        await settle(pilot)
        await pilot.press("g")
        await settle(pilot)
        assert app.by == "kernel"
        # Kernel names are drawn literally: template brackets and `::` survive.
        text = "\n".join(visible_strip_text(app, y) for y in range(1, 20))
        assert "<" in text and "::" in text
        assert app.detail is not None and app.detail.activities


@run_async
async def test_detail_shows_source_with_line_shares(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        await pilot.press("home", "left", "enter", "down")  # the program's line, closed, opened
        await settle(pilot)
        d = app.detail
        assert d is not None and d.frame.function == "run" and d.file_text is not None
        assert d.lines is not None and d.lines  # per-line totals from the flat-by-line view
        assert sum(int(v[COL["gpu_time"]]) for v in d.lines.values()) <= gpu_total(gpt)
        con = Console(width=100, record=True, no_color=True)
        con.print(render_detail(d))
        text = con.export_text()
        assert "capture_traces.py" in text and "def run" in text
        assert "%" in text and "call path" in text


@run_async
async def test_export_hotspots(tmp_path) -> None:
    trace = tmp_path / "copies.pt.trace.json.gz"
    shutil.copy(COPIES, trace)
    app = DlptApp(Inputs([str(trace)]))
    old_mask = os.umask(0o022)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("x")
            await settle(pilot)
    finally:
        os.umask(old_mask)
    out = tmp_path / "copies.pt.trace.json.gz.hotspots.json"
    assert app.last_export == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # a file like any other, not a private 0600 one
    doc = json.loads(out.read_text())
    assert doc["schema"] == "dlpt.hotspots/2" and doc["metric"] == "gpu_time"
    assert doc["summary"]["memcpy_time"]["HtoD"] > 0 and doc["hotspots"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dlpt-")]  # no temporary left


@run_async
async def test_help_screen(gpt: Profile) -> None:
    app = DlptApp(profile=gpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


def test_help_lists_the_metrics_s_cycles_through() -> None:
    """From the list `s` cycles through, in its order (a hand-written copy left host_time out)."""
    text = dict(KEYS)["s"]
    at = [text.find(m) for m in METRIC_CYCLE]
    assert -1 not in at and at == sorted(at), text
    assert "host_time" in text


def _markup_profile() -> Profile:
    """A tiny hand-built profile whose names look like rich markup and escape sequences."""
    ft = FrameTable([Frame("root", "<root>")])
    b = TreeBuilder(0)
    line = ft.intern(Frame("python", "f (user.py:3)", "user.py", 3, "f"))
    op = ft.intern(Frame("op", "[bold red]aten::mm[/]"))
    k = ft.intern(Frame("kernel", "[link=x]void k<float, [1]>::run\x1b[2J"))
    leaf = b.path([line, op, k])
    parent, frame, new = b.preorder()
    node = np.array([new[leaf]] * 2)
    exc = exclusive_matrix(len(parent), node, np.array([KERNEL] * 2), np.array([500, 700]), np.zeros(2, np.int64),
                           np.zeros(0, np.int64), np.zeros(0, np.int64))
    acts = Activities(node=node, kind=np.array([KERNEL] * 2), name=np.array([k, k]), device=np.zeros(2, np.int64),
                      stream=np.zeros(2, np.int64), start=np.array([0, 1000]), duration=np.array([500, 700]),
                      bytes=np.zeros(2, np.int64))
    return Profile(ft.frames, CCT(parent, frame, exc), acts, {"source": "record", "command": "python [x].py"},
                   {"user.py": "a = 1\nb = 2\nc = f()\n"}, path="markup.dlpt")


@run_async
async def test_names_are_never_markup(monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = DlptApp(profile=_markup_profile())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.no_color
        await pilot.press("e")
        await settle(pilot)
        lines = [visible_strip_text(app, y) for y in range(1, 4)]
        assert "[bold red]aten::mm[/]" in lines[1]
        assert "[link=x]" in app.detail.frame.name
        svg = app.export_screenshot()
        assert "[bold&#160;red]aten::mm[/]" in svg or "[bold red]aten::mm[/]" in svg
        assert "\\x1b[2J" in svg  # the escape sequence shows as text, never acts
        assert "[x].py" in header_text(app)


def test_outline_model_filter_and_reveal(gpt: Profile) -> None:
    src = TreeRows(gpt)
    o = Outline(src, COL["gpu_time"])
    leaf = int(np.flatnonzero(gpt.cct.exclusive[:, COL["gpu_time"]] > 0)[-1])
    r = o.reveal(leaf)
    assert r >= 0 and int(o.keys[r]) == leaf
    assert [int(k) for k in o.keys[:r + 1] if k in set(src.cct.path(leaf))] == src.cct.path(leaf)
    keep = filter_keys(src, "aten::mm")
    assert keep[0] and keep[src.cct.path(leaf)[0]]
    o.set_filter(keep)
    assert all(keep[o.keys])


def test_outline_counts_the_rows_it_hides(gpt: Profile) -> None:
    """The count follows the rows the open rows would show: opening adds, closing takes away."""
    src = TreeRows(gpt)
    col = COL["gpu_time"]
    o = Outline(src, col)
    top = o.hidden()
    assert top == int((src.inclusive(src.roots(), col) == 0).sum()) == 1  # the GPU idle no line caused
    r = next(r for r in range(len(o)) if o.hidden_children(int(o.keys[r])))
    beneath = o.hidden_children(int(o.keys[r]))
    assert o.expand(r) and o.hidden() == top + beneath
    assert (src.primary(o.keys, col) > 0).all()
    assert o.collapse(r) and o.hidden() == top


def test_cli_view_missing_file(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "dlpt", "view", str(tmp_path / "nope.dlpt")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and "nope.dlpt" in r.stderr


def test_cli_view_without_a_terminal_refuses_at_once() -> None:
    # stdin and stdout are pipes here, as in CI or `ssh host dlpt view ...`: the full-screen app
    # would write escape codes and wait for keys forever.
    r = subprocess.run([sys.executable, "-m", "dlpt", "view", "tests/data/gpu_train_small.dlpt"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.PIPE)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("dlpt: ") and len(r.stderr.splitlines()) == 1
    assert "dlpt report tests/data/gpu_train_small.dlpt" in r.stderr


# -- snapshots (pytest --snapshot-update regenerates them) --------------------------------------

def _app() -> DlptApp:
    prof = open_profile(GPT)
    prof.sources.update(snapshot_sources(prof, [TOOLS]))
    return DlptApp(profile=prof)


def test_snapshot_top_down(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        await pilot.press("home", "down")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=before)


def test_snapshot_flat_by_kernel(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("3", "g", "g", "g")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=before)


def test_snapshot_help(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=before)


def test_snapshot_hot_path_80x24(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=(80, 24), run_before=before)


def test_snapshot_metric_picker(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=(80, 24), run_before=before)
