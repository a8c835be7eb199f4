"""The TUI's keys that act through the app's own methods: search (`/`, escape), the detail pane,
help, the metric picker, library frames, the hottest path, and writing hotspots (`e`). Plain
functions of the app, bound as DlptApp's methods in app.py (textual finds them there), so that
app.py keeps the views' state and rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Input

from dlpt.output import write_json, write_output
from dlpt.viewers.format import safe_text
from dlpt.viewers.tui.help import HelpScreen
from dlpt.viewers.tui.picker import MetricPicker

if TYPE_CHECKING:
    from dlpt.viewers.tui.app import DlptApp


def export_path(profile_path: str) -> str:
    """`<profile>.hotspots.json` beside the profile (a directory of traces: beside it)."""
    p = profile_path.rstrip("/\\") if profile_path else ""
    return (p or "dlpt") + ".hotspots.json"


def action_search(app: DlptApp) -> None:
    if not app._idle():
        return
    box = app.query_one("#search", Input)
    box.add_class("visible")
    box.focus()
    # The current filter, selected: typing replaces it, an arrow key edits it, enter keeps it.
    # A textual whose Input cannot select would have typing extend it: there the box opens
    # empty (the header shows the filter).
    if hasattr(box, "select_all"):
        box.value = app.search_text
        box.select_all()
    else:
        box.value = ""


def on_input_submitted(app: DlptApp, event: Input.Submitted) -> None:
    if not app._shown():
        return
    event.input.remove_class("visible")
    app.table.focus()
    query = event.value.strip()
    # The last search's outcome is old news now, whatever this one finds (or if it is the same).
    if app.note:
        app.note = ""
        app._render_header()
    if query == app.search_text:
        return
    app._replaced_query, app.search_text = app.search_text, query
    app._show(app.table.current_key)  # stay on the row if the filter keeps it


def action_clear_search(app: DlptApp) -> None:
    box = app.query_one("#search", Input)
    if box.has_class("visible"):
        box.remove_class("visible")
        app.table.focus()
        return
    if app.search_text and app._idle():
        app.search_text, app.note = "", ""
        app._show(app.table.current_key)  # the row found stays under the cursor, in its context


def action_toggle_detail(app: DlptApp) -> None:
    app.query_one("#detail").toggle_class("hidden")


def action_help(app: DlptApp) -> None:
    app.push_screen(HelpScreen())


def action_export(app: DlptApp) -> None:
    if app.base is None or app.busy:
        return
    from dlpt.viewers.hotspots import hotspots

    prof, metric, lib = app.base, app.metric, app.include_library
    out = export_path(prof.path or app.path or "")
    app._set_busy("exporting hotspots")

    def job() -> str:
        doc = hotspots(prof, metric=metric, top=20, include_library=lib)
        write_output(out, lambda f: write_json(f, doc))
        return out

    def done(path: str) -> None:
        app._set_busy("")
        app.last_export = path
        app.notify(f"hotspots written to {safe_text(path)}", title="export", timeout=6)

    app._background(job, done)


def row_names(app: DlptApp) -> list[str]:
    """The names of the visible rows, in order (for tests and scripting)."""
    o = app.outline
    return [] if o is None else [o.rows.label(int(k)) for k in o.keys]


def action_pick_metric(app: DlptApp) -> None:
    if app._idle():
        app.push_screen(MetricPicker(app.metric_totals(), app.metric), app.set_metric)


def action_library(app: DlptApp) -> None:
    if not app._idle():
        return
    app.include_library = not app.include_library
    app.history.clear()  # rows of the other preparation are other nodes
    app._show()


def action_hottest(app: DlptApp) -> None:
    o = app.outline
    if o is None or app.busy or not len(o):
        return
    app._mark(with_expansion=True)
    r = o.expand_hottest(app.table.cursor)
    app.table.structure_changed()
    app.table.move_to(r)
