"""`dlpt view`: the textual application. The model work (loading, preparing views, hiding
library frames, filtering) runs in thread workers; the UI thread only formats visible rows."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.markup import escape
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.timer import Timer
from textual.widgets import Footer, Input, Static
from textual.worker import Worker, WorkerState, get_current_worker

import dlpt.viewers.tui.actions as actions
from dlpt.errors import DlptError
from dlpt.metrics import COL, METRICS
from dlpt.phases import select_phase
from dlpt.profile import Profile, default_metric
from dlpt.transforms import hide_library_unless
from dlpt.viewers.format import safe_text
from dlpt.viewers.tui.detail import Detail, build_detail, render_detail
from dlpt.viewers.tui.header import COMPACT_BELOW, COMPACT_DETAIL, ViewState, render_header
from dlpt.viewers.tui.panedata import LibraryViews
from dlpt.viewers.tui.picker import offered_metrics
from dlpt.viewers.tui.rows import METRIC_CYCLE, FlatRows, Outline, Rows, TreeRows, bottom_up_rows
from dlpt.viewers.tui.search import filter_keys, has_match
from dlpt.viewers.tui.table import TreeTable
from dlpt.views import GROUPINGS, FlatView, flat

if TYPE_CHECKING:
    from dlpt.loader import Inputs


class DlptApp(App[int]):
    """Explore a profile: top-down, bottom-up and flat views, source, kernels and copies."""

    TITLE = "dlpt"
    # The palette's footer hint would take the room of dlpt's own keys at 80 columns.
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #header { height: auto; padding: 0 1; background: $boost; }
    #detail { height: 40%; border-top: solid $secondary; padding: 0 1; }
    #detail.hidden { display: none; }
    #search { dock: bottom; display: none; }
    #search.visible { display: block; }
    """

    # The footer shows the keys a newcomer needs first and fits 80 columns; the header names
    # the views with their keys (1 2 3), and `?` lists every key.
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("e", "hottest", "hot path"),
        Binding("b,backspace", "go_back", "back"),
        Binding("slash", "search", "search"),
        Binding("m", "pick_metric", "metric"),
        Binding("g", "grouping", "group"),
        Binding("l", "library", "library"),
        Binding("x", "export", "export"),
        Binding("1", "view('top-down')", "top-down", show=False),
        Binding("2", "view('bottom-up')", "bottom-up", show=False),
        Binding("3", "view('flat')", "flat", show=False),
        Binding("s", "metric", "next metric", show=False),
        Binding("d", "toggle_detail", "detail", show=False),
        Binding("escape", "clear_search", "clear", show=False),
    ]
    # Seconds the cursor rests on a row before the detail pane describes it: moving fast through
    # rows should not compute a detail per row.
    DETAIL_DELAY = 0.05
    VIEW_KEYS = [(b.key, b.description) for b in BINDINGS if isinstance(b, Binding) and b.action.startswith("view(")]

    def __init__(self, inputs: Inputs | None = None, profile: Profile | None = None, *,
                 include_library: bool = False, metric: str | None = None, phase: str = "all") -> None:
        super().__init__()
        if inputs is None and profile is None:
            raise ValueError("DlptApp needs inputs to open or a profile")
        # What to open (dlpt.loader.Inputs: several paths open as one merged profile), opened in
        # the background worker so that the loading screen comes up at once.
        self.inputs = inputs
        self.path = inputs.name if inputs is not None else None
        self.phase = phase  # the part of the run shown (dlpt/phases.py), chosen with `dlpt view --phase`
        self.base = profile
        self.include_library = include_library
        # None until the profile is read: then the model's default (`default_metric`).
        self.metric: str = metric or (default_metric(profile) if profile is not None else "")
        self.view = "top-down"
        self.by = "line"
        self.search_text = ""
        # The query applied before the search now running, while that search was just typed:
        # a query that matches nothing goes back to it rather than blank the table.
        self._replaced_query: str | None = None
        self.note = ""
        self._term: Size | None = None  # the screen size of the last Resize event (see term)
        self.variants: dict[bool, LibraryViews] = {}
        self.outlines: dict[tuple, Outline] = {}
        # Per outline: the (query, metric column) its filter was made for ("", -1: none), since a
        # filter keeps only matches that hold the metric (search.filter_keys); and, when it
        # leaves no row, why (`no match for 'x'`), which the empty table says.
        self._applied_query: dict[tuple, tuple[str, int]] = {}
        self._no_rows_why: dict[tuple, str] = {}
        self.detail: Detail | None = None
        self.error: str | None = None
        self.busy = ""
        self.last_export: str | None = None
        self._detail_timer: Timer | None = None
        # Where `b` goes back to: (view, grouping, row key, expanded rows or None) before each
        # jump (a view or grouping switch, the hot path), newest last.
        self.history: list[tuple[str, str, int | None, frozenset[int] | None]] = []
        self.started = time.perf_counter()

    # -- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(Text("dlpt · loading…"), id="header")
        yield TreeTable(id="table")
        with VerticalScroll(id="detail"):
            yield Static(Text(""), id="detail-body")
        yield Input(placeholder="search names and code (enter applies, empty clears, escape cancels)", id="search")
        yield Footer(compact=True)

    @property
    def table(self) -> TreeTable:
        return self.query_one(TreeTable)

    def on_mount(self) -> None:
        self.table.focus()
        self.on_resize()
        self._set_busy("loading")
        self._background(self._load, self._loaded)

    # -- background work --------------------------------------------------------------------

    def _set_busy(self, what: str) -> None:
        was_busy, self.busy = bool(self.busy), what
        self.table.loading = bool(what)
        if was_busy and not what and not isinstance(self.focused, Input):
            # A loading widget cannot hold focus: textual moved it on, to the detail pane, where
            # the arrow keys would scroll text instead of moving the cursor. Give it back.
            self.table.focus()
        self._render_header()

    def _shown(self) -> bool:
        """Whether the table is still on screen for deferred work to update.

        Work queued before the table went (a worker's result, the detail pane's timer, a message)
        can land after it: on quitting, the screen is torn down while that work runs on, and
        under load a shutdown outlasts the detail pane's wait, which then queried a table that
        was gone (issue #34). Every deferred callback asks this first and drops its work."""
        try:
            table = self.query_one(TreeTable)
        except NoMatches:  # removed
            return False
        # is_attached is false once the app exits; is_running, from the moment the table's
        # removal begins (it is unmounted, then detached).
        return table.is_attached and table.is_running

    def _deliver(self, then: Callable[..., None], *args: Any) -> None:
        """Call `then(*args)` on the UI thread for a worker, unless the table is gone."""
        if self._shown():
            then(*args)

    def _background(self, job: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Run `job` in a thread; `then(result)` on the UI thread unless a newer job replaced it
        or the table is gone."""

        def run() -> None:
            result = job()
            if not get_current_worker().is_cancelled:
                self.call_from_thread(self._deliver, then, result)

        self.run_worker(run, thread=True, group="model", exclusive=True, exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR:
            return
        err = event.worker.error
        msg = str(err) if isinstance(err, DlptError) else f"{type(err).__name__}: {err}"
        if not self.variants:
            # Nothing to show: leave with the message, which `dlpt view` prints as `dlpt: ...`.
            self.error = msg
            self.exit(2)
            return
        if not self._shown():
            return
        self._set_busy("")
        self.notify(safe_text(msg), title="dlpt", severity="error", timeout=8)

    def _variant_job(self, include_library: bool) -> LibraryViews:
        assert self.base is not None
        prof = hide_library_unless(self.base, include_library)
        src = TreeRows(prof, "top-down")
        # Build the cached arrays here, off the UI thread: subtree ends, child index, one prefix sum.
        prof.cct.children(0)
        _ = prof.cct.end
        src.prefix(COL[self.metric])
        return LibraryViews(prof, src)

    def _load(self) -> LibraryViews:
        if self.base is None:
            assert self.inputs is not None
            last = [0.0]

            def progress(what: str, done: int, total: int) -> None:
                # The loader would draw its own bar on the terminal the TUI owns: report here
                # instead, a few times a second.
                now = time.perf_counter()
                if now - last[0] > 0.1:
                    last[0] = now
                    pct = f" {100 * done // total}%" if total else ""
                    self.call_from_thread(self._deliver, self._set_busy, f"{what}{pct}")

            opened = self.inputs.open(progress)
            # The phase shown (`dlpt view --phase`); the TUI shows no diagnosis, so none is judged.
            self.base = select_phase(opened, self.phase)
        if not self.metric:
            self.metric = default_metric(self.base)
        return self._variant_job(self.include_library)

    def _loaded(self, v: LibraryViews) -> None:
        self.variants[self.include_library] = v
        self._set_busy("")
        self._show()

    # -- the current view -------------------------------------------------------------------

    @property
    def variant(self) -> LibraryViews | None:
        return self.variants.get(self.include_library)

    def _outline_key(self) -> tuple:
        return (self.include_library, self.view, self.by if self.view == "flat" else "")

    def _source(self, v: LibraryViews) -> Rows | None:
        if self.view == "top-down":
            return v.top_down
        if self.view == "bottom-up":
            return v.bottom_up
        return v.flats.get(self.by)

    @property
    def outline(self) -> Outline | None:
        return self.outlines.get(self._outline_key())

    def _show(self, keep_key: int | None = None) -> None:
        """Show the current view, building what it needs in the background first."""
        v = self.variant
        if v is None:
            lib = self.include_library
            self._set_busy("showing library frames" if lib else "hiding library frames")
            self._background(lambda: self._variant_job(lib), self._variant_ready)
            return
        src = self._source(v)
        if src is None:
            view, by, prof = self.view, self.by, v.profile
            self._set_busy(f"building the {view} view")
            job = (lambda: bottom_up_rows(prof)) if view == "bottom-up" else (lambda: FlatRows(prof, by))
            self._background(job, lambda s: self._source_ready(v, view, by, s))
            return
        key = self._outline_key()
        col = COL[self.metric]
        o = self.outlines.get(key)
        if o is None:
            o = self.outlines[key] = Outline(src, col)
            self._applied_query[key] = ("", -1)
            if self.view == "top-down" and keep_key is None:
                # Open where the time goes, the cursor on the hottest row, not on one closed row.
                r = o.open_hot_path()
                keep_key = int(o.keys[r]) if len(o) else None
        elif o.col != col:
            o.set_metric(col)
        want = (self.search_text, col if self.search_text else -1)
        if self._applied_query.get(key, ("", -1)) != want:
            query, metric = self.search_text, self.metric
            self._set_busy("searching")

            def search_job() -> tuple[np.ndarray | None, str]:
                """The filter, and why it leaves no row ('' when it leaves some)."""
                if not query:
                    return None, ""
                keep = filter_keys(src, query, col)
                if has_match(src, keep):
                    return keep, ""
                if has_match(src, filter_keys(src, query)):
                    return keep, f"no row matching {query!r} holds any {metric}"
                return keep, f"no match for {query!r}"

            def done(result: tuple[np.ndarray | None, str]) -> None:
                keep, why = result
                typed, self._replaced_query = self._replaced_query, None
                self._set_busy("")
                if why and typed is not None:
                    # A query just typed that finds nothing: keep the rows on screen and the
                    # query they were filtered by, and say so where it stays readable. (The
                    # filter of another view or metric that finds nothing here shows the
                    # table's empty state instead.)
                    self.search_text, self.note = typed, why
                    self.notify(escape(safe_text(self.note)), title="search", severity="warning", timeout=6)
                    self._show(keep_key)
                    return
                o.set_filter(keep)
                self._applied_query[key], self._no_rows_why[key] = want, why
                self._show(keep_key)

            self._background(search_job, done)
            return
        if keep_key is not None and o.row_of(keep_key) < 0 and src.is_tree and o.keep is None:
            o.reveal(keep_key)
            if o.row_of(keep_key) < 0:
                # The row holds none of this metric (the outline hides it): its nearest shown
                # ancestor keeps the cursor where the user was, not on the first row.
                keep_key = next((a for a in reversed(src.ancestors(keep_key)) if o.row_of(a) >= 0), None)
        # What an empty table says: no row matches, or (every row hidden) none holds the metric.
        why = self._no_rows_why.get(key) or f"no match for {self.search_text!r}"
        self.table.empty_message = f"{why} in this view" if o.keep is not None else f"no {self.metric} in this view"
        self.table.show(o, self.metric, keep_key)
        if self.table.current_key is None:
            self.update_detail()  # no row to describe: clear the pane rather than keep the last one
        self._render_header()

    def _variant_ready(self, v: LibraryViews) -> None:
        self.variants[self.include_library] = v
        self._set_busy("")
        self._show()

    def _source_ready(self, v: LibraryViews, view: str, by: str, src: Rows) -> None:
        if view == "bottom-up":
            v.bottom_up = src  # type: ignore[assignment]
        else:
            v.flats[by] = src  # type: ignore[assignment]
        self._set_busy("")
        self._show()

    # -- header -----------------------------------------------------------------------------

    def _render_header(self) -> None:
        try:
            header = self.query_one("#header", Static)
        except NoMatches:  # not composed yet, or gone
            return
        state = ViewState(self.view, self.by, self.metric, self.include_library, self.search_text, self.busy, self.note)
        header.update(render_header(self.base, self.path, self.VIEW_KEYS, state, self.term.width, self.compact))

    @property
    def term(self) -> Size:
        """The screen's size: the last Resize event's, which textual hands to `on_resize` before
        it stores it in `self.size`."""
        return self._term or self.size

    @property
    def compact(self) -> bool:
        """A short screen (80×24, a split pane): the table's rows come first."""
        return 0 < self.term.height < COMPACT_BELOW

    def on_resize(self, event: events.Resize | None = None) -> None:
        # On a short screen the detail pane keeps a few rows, not 40% of them.
        if event is not None:
            self._term = event.size
        try:
            self.query_one("#detail").styles.height = COMPACT_DETAIL if self.compact else "40%"
        except NoMatches:  # not composed yet (on_mount calls this again), or gone
            return
        self._render_header()

    # -- detail pane ------------------------------------------------------------------------

    def on_tree_table_highlighted(self, message: TreeTable.Highlighted) -> None:
        # Moving fast through rows should not compute a detail per row: wait for a pause.
        if self._detail_timer is not None:
            self._detail_timer.stop()
        if not self._shown():
            return
        # The table's timer, not the app's: textual stops a widget's timers when it is removed,
        # so a pending update goes with its table, while the app's ran on through its shutdown.
        self._detail_timer = self.table.set_timer(self.DETAIL_DELAY, self.update_detail)

    def update_detail(self) -> None:
        if not self._shown():
            return
        o, v = self.outline, self.variant
        if o is not None and self.table.outline is not o:
            # Mid-switch (`g` or `3` pressed, the next view built in the background): the table still shows
            # the last view's rows, whose cursor key means nothing in the new one. Its own highlight,
            # once it shows the new rows, brings the pane up to date.
            return
        key = self.table.current_key
        try:
            body = self.query_one("#detail-body", Static)
            pane = self.query_one("#detail", VerticalScroll)
        except NoMatches:  # a closing screen removes its widgets side by side: the pane went first
            return
        if o is None or v is None or key is None:
            body.update(Text(""))
            self.detail = None
            return
        self.detail = d = build_detail(v, o.rows, key, self.view, self.metric)
        d.hidden = o.hidden_children(key) if o.rows.is_tree else 0
        if d.frame.has_source and d.file_text is not None and v.by_line is None:
            prof = v.profile

            def job() -> FlatView:
                return flat(prof, "line")

            def done(fv: FlatView) -> None:
                v.by_line = fv
                self.update_detail()

            # A failure here is the pane's, not the app's: on_worker_state_changed reports it.
            self.run_worker(lambda: self._lines_job(job, done), thread=True, group="lines", exclusive=True,
                            exit_on_error=False)
        body.update(render_detail(d))
        pane.scroll_home(animate=False)

    def _lines_job(self, job: Callable[[], FlatView], done: Callable[[FlatView], None]) -> None:
        fv = job()
        self.call_from_thread(self._deliver, done, fv)

    # -- actions ----------------------------------------------------------------------------

    def _idle(self) -> bool:
        return self.variant is not None and not self.busy

    def _mark(self, with_expansion: bool = False) -> None:
        """Remember where the user is, for `b`."""
        o = self.outline
        exp = frozenset(o.expanded) if with_expansion and o is not None else None
        self.note = ""  # it was about the rows the user is leaving
        self.history.append((self.view, self.by, self.table.current_key, exp))
        del self.history[:-100]

    def action_go_back(self) -> None:
        """Go back to the view, row and expansion before the last jump (a browser's back)."""
        if not self._idle() or not self.history:
            self.bell()
            return
        view, by, key, exp = self.history.pop()
        self.view, self.by = view, by
        o = self.outline
        if o is not None and exp is not None:
            o.expanded = set(exp)
            o.rebuild()
        self._show(key)

    def action_view(self, view: str) -> None:
        if not self._idle() or view == self.view:
            return
        self._mark()
        self.view = view
        self._show()

    def action_grouping(self) -> None:
        if not self._idle():
            return
        self._mark()
        if self.view != "flat":
            self.view = "flat"
        else:
            self.by = GROUPINGS[(GROUPINGS.index(self.by) + 1) % len(GROUPINGS)]
        self._show()

    def metric_totals(self) -> dict[str, int]:
        tot = self.base.cct.exclusive.sum(axis=0) if self.base is not None else None
        return {m: int(tot[COL[m]]) if tot is not None else 0 for m in METRICS}

    def set_metric(self, metric: str | None) -> None:
        # The picker's answer comes after its screen closes, when the app may be closing too.
        if metric and metric != self.metric and self._idle() and self._shown():
            self.metric = metric
            self._show(self.table.current_key)

    def action_metric(self) -> None:
        """`s`: the next metric that this profile has, in the usual order."""
        if not self._idle():
            return
        cycle = [m for m in METRIC_CYCLE if m in offered_metrics(self.metric_totals(), self.metric)]
        i = cycle.index(self.metric) if self.metric in cycle else -1
        self.set_metric(cycle[(i + 1) % len(cycle)])

    # Keys that act through the app's own methods (viewers/tui/actions.py), as its methods.
    action_search = actions.action_search
    on_input_submitted = actions.on_input_submitted
    action_clear_search = actions.action_clear_search
    action_toggle_detail = actions.action_toggle_detail
    action_help = actions.action_help
    action_export = actions.action_export
    row_names = actions.row_names
    action_pick_metric = actions.action_pick_metric
    action_library = actions.action_library
    action_hottest = actions.action_hottest


def run_app(inputs: Inputs, include_library: bool = False, metric: str | None = None, phase: str = "all") -> int:
    """Run the TUI on `inputs` (several paths merged); raise DlptError when they cannot be opened."""
    for p in inputs.paths:
        if not os.path.exists(p):
            raise DlptError(f"{p}: no such file or directory")
    app = DlptApp(inputs, include_library=include_library, metric=metric, phase=phase)
    rc = app.run()
    if app.error:
        raise DlptError(app.error)
    return int(rc or 0)
