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


def render_header(prof: Profile | None, path: str | None, view_keys: list[tuple[str, str]], state: ViewState) -> Text:
    """The header's text; `view_keys` are (key, view) of the view tabs, in order."""
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
    for line in wait_lines(prof) + memory_lines(prof):  # why the GPU waits; what holds its memory
        t.append(line + "\n")
    # The views as tabs with their keys, the current one highlighted.
    for key, view in view_keys:
        name = f"flat by {state.by}" if view == "flat" else view
        t.append(f" {key} {name} ", style="reverse bold" if view == state.view else "dim")
    t.append(f"  metric {state.metric} · library {'shown' if state.include_library else 'hidden'}")
    if state.search_text:
        t.append(" · filter ")
        t.append(safe_text(repr(state.search_text)), style="bold")
    if state.note:
        t.append(" · ")
        t.append(safe_text(state.note), style="bold yellow")
    if state.busy:
        t.append(f" · {state.busy}…", style="italic")
    return t
