"""`dlpt view`'s first screen and what the user reads on it: the tree opens on its hot path,
column headers stand over their numbers, `/` finds what the code column shows (and says so when
it finds nothing), and the metric picker fits 80×24. The real app, driven through Pilot."""

from __future__ import annotations

import asyncio
import re
import threading

import numpy as np
import pytest
from conftest import DATA
from rich.cells import cell_len
from test_tui import header_text, run_async, settle, visible_strip_text
from test_tui_nav import assert_cursor_on_screen, open_picker
from textual.containers import Vertical
from textual.widgets import Input, OptionList, Static
from textual.worker import WorkerState

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import Frame, FrameTable
from dlpt.loader import Inputs
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.viewers.tui import DlptApp
from dlpt.viewers.tui.rows import OPEN_SHARE
from dlpt.viewers.tui.table import TreeTable

SMALL = str(DATA / "gpu_train_small.dlpt")
# Text of a line of code the sample's table shows beside `transformer_train.py:49 forward`, in
# no frame's name: only a search over the code finds it.
CODE_ONLY = "self.mlp"


async def search(pilot, *keys: str) -> None:
    """Type a search (`/`, the keys, enter) and wait for it to apply."""
    await pilot.press("slash", *keys, "enter")
    await settle(pilot)


def assert_detail_is_the_cursor_row(app: DlptApp) -> None:
    """The detail pane describes the row under the cursor, or nothing when no row is shown."""
    key = app.table.current_key
    if key is None:
        assert app.detail is None
        assert str(app.query_one("#detail-body", Static).content) == ""
    else:
        assert key in set(app.outline.keys.tolist())
        assert app.detail is not None and app.detail.frame == app.outline.rows.frame(key)


# ---- the tree opens on its hot path ---------------------------------------------------------

@pytest.mark.parametrize("path", [SMALL, str(DATA / "gpu_nanogpt_b8.dlpt"), str(DATA / "cpu_train_small.dlpt")])
@run_async
async def test_opens_on_the_hot_path(path: str) -> None:
    app = DlptApp(Inputs([path]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        o, t = app.outline, app.table
        src, col = o.rows, COL[app.metric]
        key = t.current_key
        route = src.cct.path(key)
        assert len(route) >= 2, route  # it opened, and went down (the stop rule is checked below)
        total = src.total(col)
        for node in route:
            # Each step is the costliest row among its siblings...
            sibs = src.cct.children(src.cct.parent[node])
            assert src.inclusive(np.array([node]), col)[0] == src.inclusive(sibs, col).max()
            # ...and holds a real share of the total.
            assert src.inclusive(np.array([node]), col)[0] >= OPEN_SHARE * total
        assert all(k in o.expanded for k in route[:-1]) and key not in o.expanded
        # It stops on a leaf, where the children are each small, or where the row does the work.
        kids = src.cct.children(key)
        if len(kids):
            hottest = src.inclusive(kids, col).max()
            assert hottest < OPEN_SHARE * total or hottest <= src.secondary(np.array([key]), col)[0]
        assert_cursor_on_screen(app)
        assert_detail_is_the_cursor_row(app)
        # `b` has nothing to go back to: the opening is where the user starts.
        assert app.history == []


# ---- column headers over their numbers ------------------------------------------------------

def assert_headers_over_numbers(app: DlptApp) -> int:
    """Each header's right edge is its column's numbers' right edge, read from the drawn lines
    alone: the cells between one header's end and the next are blank or end where it ends. The
    number of value cells checked."""
    head = visible_strip_text(app, 0)
    tokens = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", head)]
    assert tokens[0][0] == "name" and tokens[1][0] == "%"
    lines = [visible_strip_text(app, y) for y in range(1, app.table.visible_rows() + 1)]
    note = app.table.hidden_note()  # the line below the rows that counts those hidden: no columns
    lines = [ln for ln in lines if ln.strip() and (not note or ln.strip() != note)]
    assert lines
    checked = 0
    for ln in lines:
        assert len(ln) == len(head)
        for (name, _, end), (_, _, prev_end) in zip(tokens[1:], tokens[:-1]):
            cell = ln[prev_end:end]
            assert end == len(ln) or ln[end] == " ", (name, ln)
            if name == "%":
                assert ln[end - 1] == "%", (head, ln)  # every row has its percentage
            elif cell.strip():
                assert ln[end - 1] != " ", (name, head, ln)
            checked += bool(cell.strip())
    return checked


@pytest.mark.parametrize("size", [(80, 24), (140, 40), (200, 50)])
@run_async
async def test_headers_align_with_their_numbers(size: tuple[int, int]) -> None:
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        n = assert_headers_over_numbers(app)
        for keys in (["2"], ["3"], ["g", "g", "g"]):  # bottom-up, flat by line, flat by kernel
            await pilot.press(*keys)
            await settle(pilot)
            n += assert_headers_over_numbers(app)
        assert n >= 20
        # Every value column the table draws, with its header: the columns that fit.
        spans = app.table.column_spans()
        assert spans[-1][3] == app.table.scrollable_content_region.width
        if size[0] >= 200:
            assert {h for h, *_ in spans} >= {"%", "self", "total", "kernel", "HtoD", "DtoH", "#kern", "#copy"}


@run_async
async def test_headers_align_over_the_rank_columns() -> None:
    """Several ranks: the flat view's min, median, max and rank columns, headers over values."""
    from test_ranks import gpu_profile, merge_profiles

    a = gpu_profile({10: [("gemm", 5000)], 20: [("relu", 7000)]}, rank=0)
    b = gpu_profile({10: [("gemm", 14_000_000)], 20: [("relu", 1000)]}, rank=1)
    app = DlptApp(profile=merge_profiles([a, b]))
    async with app.run_test(size=(160, 20)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        assert {"min", "median", "max", "rank"} <= set(visible_strip_text(app, 0).split())
        assert assert_headers_over_numbers(app) >= 10


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


@run_async
async def test_numbers_are_never_cut() -> None:
    app = DlptApp(profile=_many_kernels_profile())
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        assert "12,346,678" in visible_strip_text(app, 1)  # the line: its kernels and more, whole
        assert_headers_over_numbers(app)
        await pilot.press("3", "g", "g", "g")  # flat by kernel
        await settle(pilot)
        assert "12,345,678" in visible_strip_text(app, 1)
        assert_headers_over_numbers(app)


# ---- search covers the code column ----------------------------------------------------------

@run_async
async def test_search_finds_the_code_shown_beside_a_line() -> None:
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        await search(pilot, *CODE_ONLY)
        o = app.outline
        src = o.rows
        assert app.search_text == CODE_ONLY and len(o)
        hits = [int(k) for k in o.keys if CODE_ONLY in src.code(int(k))]
        assert hits and not any(CODE_ONLY in src.label(int(k)) for k in o.keys)
        for k in o.keys.tolist():  # every row matches or is on the path to a match
            assert k in hits or any(k in src.cct.path(h) for h in hits)
        drawn = "\n".join(visible_strip_text(app, y) for y in range(1, app.table.visible_rows() + 1))
        assert CODE_ONLY in drawn
        assert "no match" not in header_text(app)
        assert_detail_is_the_cursor_row(app)


@run_async
async def test_search_without_a_match_keeps_the_table_and_says_so() -> None:
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        keys, cursor = app.outline.keys.copy(), app.table.cursor
        await search(pilot, *"xyzzy")
        # The rows stay as they were, unfiltered, the cursor where it was...
        assert np.array_equal(app.outline.keys, keys) and app.table.cursor == cursor
        assert app.search_text == "" and app.outline.keep is None
        # ...and the user is told, in a notification and on the header's status line.
        assert any("no match for 'xyzzy'" in n.message for n in app._notifications)
        assert "no match for 'xyzzy'" in header_text(app)
        assert_detail_is_the_cursor_row(app)
        # A filter that matches, then one that does not: the first stays.
        await search(pilot, *CODE_ONLY)
        filtered = app.outline.keys.copy()
        await search(pilot, "ctrl+u", *"nothing-here")
        assert app.search_text == CODE_ONLY and np.array_equal(app.outline.keys, filtered)
        assert "no match for 'nothing-here'" in header_text(app)
        assert_detail_is_the_cursor_row(app)
        # The next search, even one that keeps the filter as it is, ends the message.
        await search(pilot)
        assert app.search_text == CODE_ONLY and "no match" not in header_text(app)


@run_async
async def test_the_search_box_opens_on_the_filter_selected() -> None:
    """`/` shows the current filter selected: typing replaces it (it was appended to)."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await search(pilot, *CODE_ONLY)
        box = app.query_one("#search", Input)
        box.select_on_focus = False  # whatever textual does on focus, the app selects
        await pilot.press("slash")
        await pilot.pause()
        assert box.value == CODE_ONLY and box.selected_text == CODE_ONLY
        await pilot.press(*"self.", "enter")
        await settle(pilot)
        assert app.search_text == "self."


@run_async
async def test_the_search_box_opens_empty_where_input_cannot_select(monkeypatch) -> None:
    monkeypatch.delattr(Input, "select_all")
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await search(pilot, *CODE_ONLY)
        await pilot.press("slash")
        await pilot.pause()
        assert app.query_one("#search", Input).value == ""


@run_async
async def test_a_view_without_a_match_says_so_and_clears_the_detail() -> None:
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await search(pilot, *CODE_ONLY)
        assert app.detail is not None
        await pilot.press("3", "g", "g", "g")  # flat by kernel: no kernel has that code
        await settle(pilot)
        assert app.by == "kernel" and len(app.outline) == 0
        assert f"no match for '{CODE_ONLY}'" in visible_strip_text(app, 1)
        assert_detail_is_the_cursor_row(app)  # nothing shown, nothing described
        await pilot.press("escape")
        await settle(pilot)
        assert len(app.outline) > 0 and app.detail is not None


@run_async
async def test_a_detail_update_between_views_leaves_the_pane_alone() -> None:
    """`g` pressed fast: the app's view (flat by line, built before) is ahead of the table, which
    still shows flat by kernel. The pane's pending update reads the kernel view's cursor, whose key
    means nothing among the lines (an IndexError past their count: the app's crash, before); it
    now waits for the table's own highlight of the new rows."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("3")  # flat by line
        await settle(pilot)
        while app.by != "kernel":  # each grouping built on the way (`g`)
            await pilot.press("g")
            await settle(pilot)
        by_kernel = app.outline
        app.table.move_to(len(by_kernel) - 1)  # a row past the lines' count
        await pilot.pause()
        shown = app.detail
        app.by = "line"  # the app's view moves on (its outline built before); the table not yet
        assert app.outline is not None and app.outline is not app.table.outline
        assert len(app.outline) <= app.table.current_key
        app.update_detail()
        assert app.detail is shown  # the pane left as it was: no detail of a row of another view
    assert app._exception is None


@run_async
async def test_the_table_keeps_the_keys_after_background_work() -> None:
    """A search or a view built in the background makes the table `loading` for a moment;
    after it the arrow keys still move the table's cursor (they went to the detail pane)."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        # A filter that leaves several rows in every view (CODE_ONLY leaves one line of code
        # that holds GPU time), so that `down` has a row to go to.
        for keys in (["slash", *"self.", "enter"], ["3"], ["2"]):
            await pilot.press(*keys)
            await settle(pilot)
            assert app.focused is app.table, keys
            await pilot.press("home", "down")
            assert app.table.cursor == 1, keys


# ---- the metric picker fits 80×24 -----------------------------------------------------------

@pytest.mark.parametrize("every_metric", [False, True])
@run_async
async def test_metric_picker_fits_80x24(every_metric: bool) -> None:
    app = DlptApp(profile=_many_kernels_profile(every_metric))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        picker = await open_picker(pilot, app)
        assert len(picker.metrics) == (len(METRICS) if every_metric else 3)
        box, ol = picker.query_one(Vertical), picker.query_one(OptionList)
        assert picker.region.contains_region(box.region)
        # One frame, the list inside it: its last rows scroll, never run out through the border.
        assert box.content_region.contains_region(ol.region)
        widest = max(cell_len(ol.get_option_at_index(i).prompt.plain) for i in range(ol.option_count))
        assert widest <= ol.scrollable_content_region.width  # no option wraps or runs past the frame
        assert ol.virtual_size.height == ol.option_count  # one line each


# ---- snapshots (pytest --snapshot-update regenerates them) --------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_snapshot_first_screen(snap_compare, size: tuple[int, int]) -> None:
    """What `dlpt view` opens on: the hot path, headers over their numbers."""

    async def before(pilot) -> None:
        await settle(pilot)

    assert snap_compare(DlptApp(Inputs([SMALL])), terminal_size=size, run_before=before)


def test_snapshot_metric_picker_80x24(snap_compare) -> None:
    async def before(pilot) -> None:
        await settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    assert snap_compare(DlptApp(Inputs([SMALL])), terminal_size=(80, 24), run_before=before)


# ---- a short screen -------------------------------------------------------------------------

@pytest.mark.parametrize("path", [SMALL, str(DATA / "gpu_nanogpt_b8.dlpt")])
@run_async
async def test_a_short_screen_gives_the_table_its_rows(path: str) -> None:
    """At 80×24 the header's lines are cut, not wrapped, the memory sparkline and most of the
    detail pane give way, and the table shows at least 10 rows (it showed 3)."""
    app = DlptApp(Inputs([path]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        header = app.query_one("#header", Static)
        lines = header_text(app).splitlines()
        assert header.size.height == len(lines) and all(cell_len(ln) <= 78 for ln in lines)
        assert not any("allocated over the run" in ln for ln in lines)
        assert app.table.visible_rows() >= 10
    tall = DlptApp(Inputs([path]))
    async with tall.run_test(size=(120, 50)) as pilot:  # a tall screen keeps them
        await settle(pilot)
        assert any("allocated over the run" in ln for ln in header_text(tall).splitlines())


@run_async
async def test_a_screen_resized_short_gets_the_short_layout() -> None:
    """Textual hands the new size to on_resize before storing it: the layout follows the event's."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        assert not app.compact
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        assert app.compact and str(app.query_one("#detail").styles.height) == "7"
        assert all(cell_len(ln) <= 78 for ln in header_text(app).splitlines())
        assert app.table.visible_rows() >= 10


# ---- deferred work after the widgets are gone -----------------------------------------------
# Work armed while the table is on screen can land after it went: a worker's result or error, the
# detail pane's 50 ms timer, a message, the picker's answer. Under load the app's shutdown
# outlasted that timer, whose update then queried a table already removed (issue #34). Each
# test arms such work, removes the table or quits, lets the work land, and checks that it did
# nothing: touching the missing widgets raised, and the app ended with that exception.

def _blocking(monkeypatch, name: str, fail: bool = False) -> threading.Event:
    """Make `dlpt.viewers.tui.app.<name>` (work the app runs in a thread) wait for the returned
    event, then run (or, with `fail`, raise)."""
    import dlpt.viewers.tui.app as tui_app

    release = threading.Event()
    real = getattr(tui_app, name)

    def held(*args, **kwargs):
        assert release.wait(30), f"{name} was never released"
        if fail:
            raise RuntimeError(f"{name} failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(tui_app, name, held)
    return release


def _landings(monkeypatch) -> threading.Event:
    """Set once a worker's outcome has reached the UI thread (whatever the app then did with it)."""
    landed = threading.Event()
    real_deliver = DlptApp._deliver

    def deliver(self: DlptApp, *args) -> None:
        try:
            real_deliver(self, *args)
        finally:
            landed.set()

    real_changed = DlptApp.on_worker_state_changed

    def changed(self: DlptApp, event) -> None:
        try:
            real_changed(self, event)
        finally:
            if event.state == WorkerState.ERROR:
                landed.set()

    monkeypatch.setattr(DlptApp, "_deliver", deliver)
    monkeypatch.setattr(DlptApp, "on_worker_state_changed", changed)
    return landed


async def _wait_for(flag: threading.Event) -> None:
    for _ in range(500):
        if flag.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the work never landed")


async def on_a_source_row(pilot, app: DlptApp) -> None:
    """Put the cursor on the first row that is a line of code, and wait until its detail pane
    has asked for the file's per-line totals (built in a thread)."""
    o = app.outline
    r = next(r for r in range(len(o)) if o.rows.frame(int(o.keys[r])).has_source)
    app.table.move_to(r)
    for _ in range(200):
        await pilot.pause(0.02)
        if any(w.group == "lines" and w.is_running for w in app.workers):
            return
    raise AssertionError("no per-line totals were asked for")


async def _arm(pilot, app: DlptApp, monkeypatch, work: str) -> threading.Event:
    """Start `work` in its thread, held there; the event releases it."""
    if work == "per-line totals":
        release = _blocking(monkeypatch, "flat")
        await on_a_source_row(pilot, app)
    else:
        release = _blocking(monkeypatch, "filter_keys", fail=work == "search error")
        await pilot.press("slash", *CODE_ONLY, "enter")
        assert app.busy == "searching"
    return release


def _dropped(app: DlptApp, work: str) -> bool:
    """Whether the work's outcome left the app as it was."""
    if work == "per-line totals":
        return app.variant is not None and app.variant.by_line is None
    return app.busy == "searching" and app.search_text == CODE_ONLY and not app._notifications


WORKS = ["search result", "search error", "per-line totals"]


@pytest.mark.parametrize("work", WORKS)
@run_async
async def test_work_landing_as_the_table_unmounts(monkeypatch, work: str) -> None:
    """The work lands while the table is being unmounted: still in the DOM, its removal begun.
    (A worker's error is a message, which the app reads once the removal it awaits is done.)"""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        landed = _landings(monkeypatch)
        release = await _arm(pilot, app, monkeypatch, work)

        async def on_unmount(self: TreeTable) -> None:
            release.set()
            if work != "search error":
                await _wait_for(landed)  # the loop runs on meanwhile: the work lands now

        monkeypatch.setattr(TreeTable, "on_unmount", on_unmount, raising=False)
        await app.table.remove()
        await _wait_for(landed)
        assert not app.query(TreeTable)
        await pilot.pause(0.1)
        assert _dropped(app, work)
    assert app._exception is None


@run_async
async def test_work_landing_after_quitting(monkeypatch) -> None:
    """`q` while the detail pane's per-line totals are built: they land once the app has exited,
    its widgets not yet torn down. (A search's worker is cancelled on exit before it lands.)"""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        landed = _landings(monkeypatch)
        release = await _arm(pilot, app, monkeypatch, "per-line totals")
        await pilot.press("q")
        assert app.query(TreeTable)
        release.set()
        await _wait_for(landed)
        assert _dropped(app, "per-line totals")
    assert app._exception is None and app.return_code == 0


@run_async
async def test_a_queued_detail_update_goes_with_its_table(monkeypatch) -> None:
    # The update waits long enough that the table is surely gone when its time comes.
    monkeypatch.setattr(DlptApp, "DETAIL_DELAY", 0.5)
    late: list[bool] = []
    real = DlptApp.update_detail

    def update_detail(self: DlptApp) -> None:
        late.append(not self.query(TreeTable))
        real(self)

    monkeypatch.setattr(DlptApp, "update_detail", update_detail)
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        o = app.outline
        # A row that is not a line of code: its detail starts no thread of its own.
        r = next(r for r in range(len(o)) if not o.rows.frame(int(o.keys[r])).has_source and r != app.table.cursor)
        app.table.move_to(r)
        await pilot.pause()
        assert app._detail_timer is not None
        await app.table.remove()
        await pilot.pause(0.8)  # past its time
    assert app._exception is None
    assert True not in late  # the timer went with the table: no update was even tried


@run_async
async def test_the_detail_pane_gone_before_the_table() -> None:
    """Closing the screen removes its widgets side by side: the pane can go first, while the
    table's timer still runs."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await app.query_one("#detail").remove()
        await pilot.press("home")
        await pilot.pause(0.2)  # past the detail pane's wait
        assert app.table.cursor == 0
    assert app._exception is None


@run_async
async def test_a_failure_building_per_line_totals_is_reported(monkeypatch) -> None:
    """The detail pane's per-line totals failing is the pane's trouble: said, the app goes on."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        landed = _landings(monkeypatch)
        _blocking(monkeypatch, "flat", fail=True).set()
        o = app.outline
        app.table.move_to(next(r for r in range(len(o)) if o.rows.frame(int(o.keys[r])).has_source))
        await _wait_for(landed)
        # The notice is posted from the worker's failure: on a loaded machine it came later than
        # the 0.1 s this waited before (a full run beside a mutation run). Wait up to 10 s for it.
        for _ in range(200):
            if any("flat failed" in n.message for n in app._notifications):
                break
            await pilot.pause(0.05)
        assert any("flat failed" in n.message for n in app._notifications)
        await pilot.press("down")
        await settle(pilot)
        assert_detail_is_the_cursor_row(app)
    assert app._exception is None


@pytest.mark.parametrize("late", ["detail timer", "highlight message", "picker answer", "search box"])
@run_async
async def test_late_callbacks_after_the_table_is_gone(late: str) -> None:
    """What reaches the app after the table went, from work armed before: each does nothing."""
    app = DlptApp(Inputs([SMALL]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        table = app.table
        if late == "picker answer":
            await open_picker(pilot, app)
        elif late == "search box":
            await pilot.press("slash", *CODE_ONLY)
        await table.remove()
        if late == "detail timer":
            app.update_detail()  # what a timer armed just before calls
        elif late == "highlight message":
            app.post_message(TreeTable.Highlighted(table, int(app.outline.keys[0])))
        elif late == "picker answer":
            await pilot.press("down", "enter")
        else:
            await pilot.press("enter")
        await pilot.pause(0.2)
    assert app._exception is None
