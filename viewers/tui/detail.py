"""The detail pane: the selected row's source with per-line shares, its call path, and the
kernels and copies beneath it. Everything is built from `rich.text.Text`, never from markup,
because kernel names are full of `[`, `]`, `<`, `>`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dlpt.frames import FUSED_PREFIX, Frame, is_library, short_path
from dlpt.metrics import COL, KIND_BREAKDOWN, METRIC, PC_METRICS, PC_PARTS
from dlpt.profile import Profile
from dlpt.stalls import limiter
from dlpt.viewers.format import fmt_bandwidth, fmt_bytes, fmt_metric, fmt_time, safe_text, short_kernel_name
from dlpt.viewers.tui.panedata import ActivityIndex, ActivityRow, LibraryViews, line_totals
from dlpt.viewers.tui.rows import FlatRows, Rows, TreeRows

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
    file_text: str | None = None  # the text of the frame's file, when the profile holds it
    lines: dict[int, np.ndarray] | None = None  # per-line metrics of the file (flat by line)
    activities: list[ActivityRow] | None = None
    note: str = ""
    hidden: int = 0  # children the table leaves out for holding none of the metric (rows.Outline)
    pc: dict[str, int] | None = None  # the row's PC samples and their parts (`--pc-samples`), as `primary`


def build_detail(v: LibraryViews, src: Rows, key: int, view: str, metric: str) -> Detail:
    """What the pane shows for row `key` of `src` (a view of the variant `v`)."""
    col = COL[metric]
    k1 = np.array([key])
    frame = src.frame(key)
    breakdown = {k.label: int(src.kind_values(k1, COL[k.time])[0]) for k in KIND_BREAKDOWN}
    note = ""
    activities = None
    if isinstance(src, TreeRows) and src.name == "top-down":
        path = [src.label(int(i)) for i in src.cct.path(key)]
        if v.activities is None:
            v.activities = ActivityIndex(v.profile)
        activities = v.activities.beneath(key, int(src.cct.end[key]))
        # A compiled kernel shared between lines: its full time and every line it spans.
        note = fused_note(src.profile, key, metric)
    elif isinstance(src, TreeRows):
        path = [src.label(int(i)) for i in src.cct.path(key)]
        note = "bottom-up: the path reads from the frame that did the work out to its outermost caller"
    else:
        assert isinstance(src, FlatRows)
        node = int(src.view.node[key])
        path = [v.top_down.label(int(i)) for i in v.profile.cct.path(node)] if node > 0 else []
        note = "call path: the group's costliest occurrence"
        if v.activities is None:
            v.activities = ActivityIndex(v.profile)
        activities = v.activities.of_nodes(src.view.owner == key)
    lines = None
    text = None
    if frame.has_source:
        text = v.profile.sources.get(frame.file)
        if text is not None and v.by_line is not None:
            lines = line_totals(v.by_line, frame.file)
    pc = {m: int(src.primary(k1, COL[m])[0]) for m in PC_METRICS}
    return Detail(frame=frame, view=view, metric=metric, pc=pc if pc["pc_samples"] else None,
                  primary=(src.primary_name, int(src.primary(k1, col)[0])),
                  secondary=(src.secondary_name, int(src.secondary(k1, col)[0])),
                  total=src.total(col), breakdown=breakdown, path=path, file_text=text, lines=lines,
                  activities=activities, note=note)


def _pct(v: int, total: int) -> str:
    return f"{100.0 * v / total:5.1f}%" if total > 0 else "     "


def render_detail(d: Detail) -> RenderableType:
    parts: list[RenderableType] = []
    fr = d.frame
    title = Text()
    # A kernel's full C++ name can fill the pane: the title has the short one, the end of the
    # pane the whole of it.
    name = short_kernel_name(fr.name, 70) if fr.kind == "kernel" else (fr.label() if fr.has_source else fr.name)
    title.append(safe_text(name) or "(root)", style="bold")
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
    if d.pc:
        parts.append(stall_text(d.pc, d.primary[0]))
    if d.note:
        parts.append(Text(d.note, style="italic"))
    if d.hidden:
        # The row may look like a leaf in the table: say what is beneath it, and how to see it.
        parts.append(Text(f"{d.hidden:,} of its children hold no {d.metric}: hidden from the table "
                          "(m picks another metric)", style="dim italic"))

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
    if fr.kind == "kernel" and short_kernel_name(fr.name, 70) != fr.name:
        parts.append(Text(""))
        parts.append(Text("full name", style="bold underline"))
        parts.append(Text(safe_text(fr.name)))
    return Group(*parts)


def _source(d: Detail) -> RenderableType:
    fr = d.frame
    if d.file_text is None:
        return Text(f"(source of {safe_text(fr.file)} is not in the profile)", style="dim")
    lines = d.file_text.splitlines()
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


def stall_text(pc: dict[str, int], scope: str) -> Text:
    """`PC samples (total) 110,873: stalled, global memory 62% · ready, not selected 27% · ...`,
    the parts of at least 1% largest first, then what the stalls say (dlpt.stalls.limiter)."""
    n = pc["pc_samples"]
    out = Text()
    out.append(f"PC samples ({scope}) {n:,}: ", style="bold")
    parts = sorted(((pc[m], m) for m in PC_PARTS if pc[m] * 100 >= n), reverse=True)
    out.append(" · ".join(f"{METRIC[m].about} {100 * v / n:.0f}%" for v, m in parts))
    row = np.zeros(len(COL), dtype=np.int64)
    for m, v in pc.items():
        row[COL[m]] = v
    lim = limiter(row)
    if lim is not None:
        out.append(f"\n→ {lim[0].name}: {lim[0].advice}", style="italic")
    return out


def _activities(rows: list[ActivityRow]) -> RenderableType:
    if not rows:
        return Text("no kernels or copies beneath this row", style="dim")
    t = Table(title=None, show_edge=False, pad_edge=False, box=None, expand=True)
    t.add_column(Text("kind"), no_wrap=True)
    t.add_column(Text("kernels and copies beneath"), ratio=1, no_wrap=True, overflow="ellipsis")
    t.add_column(Text("count"), justify="right", no_wrap=True)
    t.add_column(Text("time"), justify="right", no_wrap=True)
    t.add_column(Text("bytes"), justify="right", no_wrap=True)
    t.add_column(Text("bandwidth"), justify="right", no_wrap=True)
    for a in rows:
        name = short_kernel_name(a.name, 200) if a.kind == "kernel" else a.name
        t.add_row(Text(a.kind), Text(safe_text(name)), Text(f"{a.count:,}"), Text(fmt_time(a.time)),
                  Text(fmt_bytes(a.bytes) if a.bytes else ""), Text(fmt_bandwidth(a.bytes, a.time)))
    return t


def fused_note(profile: Profile, node: int, metric: str = "gpu_time") -> str:
    """For a `[fused K]` node: K's full time in this profile and every line it is shared
    between, one line of text for the detail pane ('' for other nodes)."""
    cct = profile.cct
    fr = profile.frame_of(node)
    if not fr.name.startswith(FUSED_PREFIX):
        return ""
    col = COL[metric]
    same = np.flatnonzero(cct.frame == cct.frame[node])
    total = int(cct.inclusive[same, col].sum())
    lines: list[str] = []
    for s in same.tolist():
        for a in reversed(cct.path(int(cct.parent[s]))):
            f = profile.frame_of(a)
            if f.has_source and not is_library(f):
                label = f"{short_path(f.file)}:{f.line}"
                if label not in lines:
                    lines.append(label)
                break
    head = fr.name[len(FUSED_PREFIX):-1]
    by_line = int((profile.meta.compiled_provenance or {}).get("pc_sample_lines_split_by_line") or 0)
    samples = ""
    if by_line and metric in PC_METRICS:
        samples = (f"\nPC samples: split by the generated lines they hit, each to the FX node of the op that wrote it "
                   f"({by_line} sampled lines in this recording); untagged lines by the shares above")
    return (f"compiled kernel {head}: {fmt_metric(metric, total)} in all, shared between the source lines "
            f"it was generated from ({len(same)} placements): {', '.join(lines) or '?'}"
            + share_weights(profile, fr.name) + samples)


def share_weights(profile: Profile, fused_name: str) -> str:
    """The weights a `[fused K]` node's shares used (the recorder keeps them in the profile's
    meta): per kernel of that name, the basis and each line's weight as a percentage."""
    entries = (profile.meta.compiled_provenance or {}).get("shares", {}).get(fused_name, [])
    out = []
    for e in entries:
        total = sum(int(w) for _, _, w in e.get("lines", [])) or 1
        parts = ", ".join(f"{short_path(f)}:{ln} {100 * int(w) / total:.1f}%" for f, ln, w in e.get("lines", []))
        bwd = " (backward)" if e.get("backward") else ""
        out.append(f"{e.get('kernel', '?')}{bwd}: shares {e.get('basis', '?')}: {parts}")
    return "".join(f"\n{x}" for x in out)
