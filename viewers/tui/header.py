"""The lines above the table: the program, its devices and totals, why the GPU waits, the view
tabs with their keys, and the state of the view (metric, library frames, filter, work under
way, the last search's outcome). Kept out of `app.py`, which holds the application's flow."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from dlpt.metrics import KIND_BREAKDOWN
from dlpt.profile import Profile, unknown_device_events, unknown_device_text
from dlpt.viewers.format import fmt_time, safe_text
from dlpt.viewers.report import memory_lines, wait_lines
from dlpt.viewers.tui.panedata import device_names, kind_totals, program_name


@dataclass
class ViewState:
    """What the last header line reports about the current view."""

    view: str
    by: str
    metric: str
    include_library: bool
    search_text: str = ""
    busy: str = ""
    # A line about the last search when it changed nothing (`no match for 'x'`), shown until
    # the next search: a notification alone goes away while the user may still be reading.
    note: str = ""


# Below this many rows the screen is short (80×24 is the default terminal): the header drops the
# memory sparkline and the detail pane keeps COMPACT_DETAIL rows (app.py), so the table shows ten.
COMPACT_BELOW = 30
COMPACT_DETAIL = 7

# The sparkline line's words around the sparkline (viewers/report.py memory_lines), and the
# header's padding: what the sparkline leaves of the width.
_SPARK_FRAME = len("  allocated over the run ") + len("  (▲ at the peak)") + 2


def render_header(prof: Profile | None, path: str | None, view_keys: list[tuple[str, str]], state: ViewState,
                  width: int = 0, compact: bool = False) -> Text:
    """The header's text; `view_keys` are (key, view) of the view tabs, in order. Each line is
    one row, cut with an ellipsis where it is wider than the screen: wrapped, the header took
    9 of 24 rows and left the table 3. The memory sparkline fits `width` (0: the report's 60
    columns); `compact` (a short screen) leaves it out."""
    t = Text()
    if prof is None:
        t.append("dlpt · ", style="bold")
        t.append(safe_text(path or ""))
        t.append("  loading…", style="italic")
        return t
    kind = "recorded" if prof.collector == "record" else "Kineto trace"
    t.append("dlpt · ", style="bold")
    t.append(program_name(prof), style="bold")
    t.append(f" ({kind}) · {device_names(prof)}\n")
    tot = kind_totals(prof)
    if tot["gpu_time"]:
        t.append(f"GPU {fmt_time(tot['gpu_time'])}", style="bold")
        t.append(": " + " · ".join(f"{k.label} {fmt_time(tot[k.time])}" for k in KIND_BREAKDOWN if tot[k.time]))
    else:
        unknown = unknown_device_events(prof)
        t.append("no GPU activity" + (" that dlpt reads" if unknown else "") + " in this profile", style="bold")
        if unknown:
            t.append(f" ({unknown_device_text(unknown)})")
    if tot["cpu_time"]:
        t.append(f" · host ops {fmt_time(tot['cpu_time'])}")
    t.append("\n")
    spark = 0 if compact else min(60, width - _SPARK_FRAME) if width else 60
    for line in wait_lines(prof) + memory_lines(prof, spark):  # why the GPU waits; what holds its memory
        t.append(line + "\n")
    # The views as tabs with their keys, the current one highlighted.
    for key, view in view_keys:
        name = f"flat by {state.by}" if view == "flat" else view
        t.append(f" {key} {name} ", style="reverse bold" if view == state.view else "dim")
    t.append(f"  metric {state.metric} · library {'shown' if state.include_library else 'hidden'}")
    if state.search_text:
        t.append(" · filter ")
        t.append(safe_text(repr(state.search_text)), style="bold")
    if state.busy:
        t.append(f" · {state.busy}…", style="italic")
    if state.note:  # a line of its own: the tabs line is cut at the screen's width, the note must not be
        t.append("\n")
        t.append(safe_text(state.note), style="bold yellow")
    return _fit(t, width - 2)  # the header's padding: one column each side


def _fit(t: Text, width: int) -> Text:
    """Each line of `t` cut to `width` cells with an ellipsis (unchanged for width <= 0)."""
    if width <= 0:
        return t
    lines = t.split("\n")
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)
