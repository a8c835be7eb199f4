"""The detail pane: the selected row's source with per-line shares, its call path, and the
kernels and copies beneath it. Everything is built from `rich.text.Text`, never from markup,
because kernel names are full of `[`, `]`, `<`, `>`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dlpt.frames import Frame
from dlpt.metrics import COL
from dlpt.viewers.format import fmt_bandwidth, fmt_bytes, fmt_metric, fmt_time, safe_text
from dlpt.viewers.tui.model import ActivityRow

BEFORE, AFTER = 2, 3  # source lines shown around the selected one: the pane is short at 80x24
HOT = 0.05  # lines holding this share of the metric or more are highlighted


@dataclass
class Detail:
    """What the pane shows for one row, computed by the app from the model."""

    frame: Frame
    view: str
    metric: str
    primary: tuple[str, int]
    secondary: tuple[str, int]
    total: int
    breakdown: dict[str, int]
    path: list[str]
    source: str | None = None  # the file's text, when the profile holds it
    lines: dict[int, np.ndarray] | None = None  # per-line metrics of the file (flat by line)
    activities: list[ActivityRow] | None = None
    note: str = ""


def _pct(v: int, total: int) -> str:
    return f"{100.0 * v / total:5.1f}%" if total > 0 else "     "


def render_detail(d: Detail) -> RenderableType:
    parts: list[RenderableType] = []
    fr = d.frame
    title = Text()
    title.append(safe_text(fr.label() if fr.has_source else fr.name) or "(root)", style="bold")
    title.append(f"  [{fr.kind}]", style="dim")
    parts.append(title)
    m = d.metric
    head = Text()
    head.append(f"{d.metric}: ")
    head.append(f"{d.primary[0]} {fmt_metric(m, d.primary[1])} ({_pct(d.primary[1], d.total).strip()})", style="bold")
    head.append(f" · {d.secondary[0]} {fmt_metric(m, d.secondary[1])}")
    parts.append(head)
    br = [f"{name} {fmt_time(v)}" for name, v in d.breakdown.items() if v]
    if br:
        parts.append(Text("GPU " + " · ".join(br)))
    if d.note:
        parts.append(Text(d.note, style="italic"))

    if fr.has_source:
        parts.append(_source(d))

    if d.path:
        parts.append(Text(""))
        parts.append(Text("call path", style="bold underline"))
        for i, p in enumerate(d.path):
            parts.append(Text("  " * min(i, 20) + safe_text(p)))

    if d.activities is not None:
        parts.append(Text(""))
        parts.append(_activities(d.activities))
    return Group(*parts)


def _source(d: Detail) -> RenderableType:
    fr = d.frame
    if d.source is None:
        return Text(f"(source of {safe_text(fr.file)} is not in the profile)", style="dim")
    lines = d.source.splitlines()
    lo, hi = max(fr.line - BEFORE, 1), min(fr.line + AFTER, len(lines))
    col = COL[d.metric]
    total = d.total
    out = Text()
    out.append(f"{safe_text(fr.file)}  (share of {d.metric} per line)\n", style="underline")
    if lo > hi:
        out.append(f"(line {fr.line} is past the end of the file)", style="dim")
        return out
    for ln in range(lo, hi + 1):
        row = d.lines.get(ln) if d.lines else None
        v = int(row[col]) if row is not None else 0
        share = v / total if total > 0 else 0.0
        pct = f"{100.0 * share:5.1f}%" if v else "      "
        style = ""
        if share >= HOT:
            style = "bold red"
        elif v:
            style = "yellow"
        if ln == fr.line:
            style = (style + " reverse").strip()
        out.append(f"{pct} ", style="bold red" if share >= HOT else ("yellow" if v else "dim"))
        out.append(f"{ln:5d} ", style="dim")
        # `▶` marks the selected line where reverse video is not available.
        out.append("▶ " if ln == fr.line else "  ")
        out.append(safe_text(lines[ln - 1].rstrip()), style=style)
        if ln < hi:
            out.append("\n")
    return out


def _activities(rows: list[ActivityRow]) -> RenderableType:
    if not rows:
        return Text("no kernels or copies beneath this row", style="dim")
    t = Table(title=None, show_edge=False, pad_edge=False, box=None, expand=True)
    t.add_column(Text("kind"), no_wrap=True)
    t.add_column(Text("kernels and copies beneath"), ratio=1, overflow="fold")
    t.add_column(Text("count"), justify="right", no_wrap=True)
    t.add_column(Text("time"), justify="right", no_wrap=True)
    t.add_column(Text("bytes"), justify="right", no_wrap=True)
    t.add_column(Text("bandwidth"), justify="right", no_wrap=True)
    for a in rows:
        t.add_row(Text(a.kind), Text(safe_text(a.name)), Text(f"{a.count:,}"), Text(fmt_time(a.time)),
                  Text(fmt_bytes(a.bytes) if a.bytes else ""), Text(fmt_bandwidth(a.bytes, a.time)))
    return t
