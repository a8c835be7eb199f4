"""`dlpt report`: the three views as aligned plain text, or as JSON rows."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlpt.findings import findings
from dlpt.frames import Frame, short_path
from dlpt.metrics import COL, KIND_BREAKDOWN, METRICS, fmt_bytes, metric_column, metric_unit
from dlpt.phases import ALL, COMPILE, STEADY, phase_figures
from dlpt.profile import Profile, unknown_device_events, unknown_device_text
from dlpt.ranks import rank_spread, rank_values
from dlpt.viewers.format import bar, fmt_metric, fmt_time, safe_text, short_kernel_name
from dlpt.viewers.hotspots import summary
from dlpt.viewers.pcsamples import pc_lines
from dlpt.views import bottom_up, bottom_up_self, flat
from dlpt.waits import memory_peak, waits


@dataclass
class ReportOptions:
    view: str = "top-down"
    by: str = "line"
    metric: str = "gpu_time"
    depth: int | None = None
    top: int | None = None
    min_percent: float = 0.5
    full_names: bool = False


def frame_text(profile: Profile, frame: Frame, full: bool = False, width: int = 70) -> str:
    """A frame as one line: source frames with their code, kernels shortened."""
    if frame.kind in ("kernel",) and not full:
        return safe_text(short_kernel_name(frame.name, width))
    text = frame.label()
    if frame.has_source:
        code = profile.source_line(frame.file, frame.line)
        if code:
            text = f"{text}  ▸ {code}"
    if not full and len(text) > width + 30:
        text = text[: width + 29] + "…"
    return safe_text(text)


def header(profile: Profile, metric: str) -> list[str]:
    s = summary(profile, metric, unit="ns")
    cct = profile.cct
    tot = cct.exclusive.sum(axis=0)
    gpu = int(tot[COL["gpu_time"]])
    src = profile.meta.command or profile.path or ""
    kind = "recorded" if profile.collector == "record" else "Kineto trace"
    lines = [f"dlpt · {safe_text(os.path.basename(str(src)) if not profile.meta.command else str(src))} ({kind})"]
    steps = profile.meta.steps
    if isinstance(steps, list) and len(steps) == 2:
        # A --steps window: every figure below covers those steps only.
        lines[0] += f" · steps {steps[0]}–{steps[1] - 1} (--steps {steps[0]}:{steps[1]})"
    split = " · ".join(f"{k.label} {fmt_time(tot[COL[k.time]])}" for k in KIND_BREAKDOWN if tot[COL[k.time]])
    unknown = unknown_device_events(profile)
    none = (f" (no GPU activity that dlpt reads in this profile; {unknown_device_text(unknown)})" if unknown
            else " (no GPU activity in this profile)")
    lines.append(f"GPU time {fmt_time(gpu)}" + (f": {split}" if split else none))
    if tot[COL["cpu_time"]]:
        lines.append(f"host op time {fmt_time(tot[COL['cpu_time']])}")
    lines += phase_lines(profile) + wait_lines(profile) + memory_lines(profile)
    col = metric_column(metric)
    total = int(tot[col])
    if total:
        def pct(v: float) -> str:
            return f"{100.0 * v / total:.1f}%"

        extra = [f"attributed to source lines {pct(s['attributed_to_source'])}"]
        if s["backward_time"]:
            extra.append(f"backward {pct(s['backward_time'])}")
        for reason, v in s["unattributed"].items():
            extra.append(f"unattributed ({reason}) {pct(v)}")
        lines.append(f"{metric}: " + " · ".join(extra))
    lines += rank_lines(profile, metric) + compile_lines(profile) + graph_lines(profile) + pc_lines(profile)
    if profile.collector == "kineto":
        lines.append("note: traces name each Python function by its def line; `dlpt record` gives call-site lines")
    return lines


def _pct(v: float) -> str:  # a busy share of 0.04% is not "0.0%"
    return f"{v:.2f}%" if 0 < v < 1 else f"{v:.1f}%"


def phase_lines(profile: Profile) -> list[str]:
    """The run's phases (dlpt/phases.py) with their wall time, the steady state's GPU busy share
    and sync time, and which phase the figures below show: `phases: start-up 3.10 s · compile
    45.2 s · steady 8.12 s (GPU busy 97.9%, sync 12.1 ms); showing all (--phase picks one)`."""
    figs = phase_figures(profile)
    if not figs:
        return []
    parts = []
    for f in figs:
        text = f"{f.name} {fmt_time(f.wall)}"
        if f.name == STEADY:
            extra = [f"GPU busy {_pct(100.0 * f.busy_share)}"] if f.busy_share is not None else []
            if f.sync:
                extra.append(f"sync {fmt_time(f.sync)}")
            text += f" ({', '.join(extra)})" if extra else ""
        parts.append(text)
    shown = profile.meta.phase if profile.meta.phase is not None else ALL
    what = (f"showing {shown} (--phase {shown})" if shown != ALL
            else "showing all (--phase picks one; the diagnosis reads the steady state)")
    return [f"phases: {' · '.join(parts)}; {what}"]


def wait_lines(profile: Profile) -> list[str]:
    """Why the GPU waits, in one line (dlpt.waits): `wall 0.96 s · GPU busy 3.6% · idle 96.4%
    (host 91%, sync 2%, start-up 7%) · sync 12.1 ms`; idle's parts are shares of the idle time."""
    w = waits(profile)
    parts: list[str] = []
    pct = _pct

    if w.wall is not None:
        parts.append(f"wall {fmt_time(w.wall)}")
    if w.busy is not None and w.device_time:
        idle = w.idle or 0
        split = ", ".join(f"{k} {pct(100.0 * v / idle)}" for k, v in w.idle_parts.items() if v and idle)
        parts.append(f"GPU busy {pct(100.0 * w.busy / w.device_time)}")
        parts.append(f"idle {pct(100.0 * idle / w.device_time)}" + (f" ({split})" if split else ""))
    if w.sync_time:
        parts.append(f"sync {fmt_time(w.sync_time)}")
    if w.host_time and w.busy is None:
        parts.append(f"host time {fmt_time(w.host_time)}")
    lines = [" · ".join(parts)] if parts else []
    if w.skipped:
        lines.append("note: idle analysis skipped " + ", ".join(f"{v} {k}" for k, v in w.skipped.items()))
    return lines


def memory_lines(profile: Profile, spark_width: int = 60) -> list[str]:
    """The GPU memory headline (dlpt.waits.memory_peak): `GPU memory: peak 1.62 GiB allocated
    (reserved 2.00 GiB) at step 12, line model.py:88`, and allocated memory over the run as a
    sparkline `spark_width` wide, its peak marked (none under 8 columns)."""
    m = memory_peak(profile)
    if m is None:
        return []
    text = f"GPU memory: peak {fmt_bytes(m.peak_allocated)} allocated (reserved {fmt_bytes(m.peak_reserved)})"
    if m.peak_step is not None:
        text += f" at step {m.peak_step}"
    if m.peak_at:
        file, _, num = m.peak_at.rpartition(":")
        text += f", line {safe_text(f'{short_path(file)}:{num}' if num.isdigit() else m.peak_at)}"
    extra = []
    if m.graph_pools:
        extra.append(f"CUDA-graph pools {fmt_bytes(m.graph_pools)}")
    if m.before_recording:
        extra.append(f"{fmt_bytes(m.before_recording)} allocated before the recording")
    lines = [text + (f" ({'; '.join(extra)})" if extra else "")]
    if len(m.series) > 1 and spark_width >= 8:
        lines.append(f"  allocated over the run {sparkline(m.series, spark_width)}  (▲ at the peak)")
    if m.oom:
        lines.append(f"  out of memory: {fmt_bytes(int(m.oom.get('requested', 0)))} asked for; live by line at "
                     "the failure in meta['memory']['oom']")
    return lines


def sparkline(values: list[int], width: int) -> str:
    """Values as block characters, `width` wide (each the maximum of its stretch), the peak's
    position marked with ▲."""
    blocks = "▁▂▃▄▅▆▇█"
    n = len(values)
    cols = [max(values[i * n // width:max((i + 1) * n // width, i * n // width + 1)]) for i in range(min(width, n))]
    top = max(cols) or 1
    chars = [blocks[min(int(v / top * (len(blocks) - 1) + 0.5), len(blocks) - 1)] for v in cols]
    chars[cols.index(max(cols))] = "▲"
    return "".join(chars)


def compile_lines(profile: Profile) -> list[str]:
    """torch.compile's one-off work on a line of its own (`dlpt.compile_time`), e.g.
    `torch.compile: 0.74 s GPU (autotuning) · 12.1 s host op time (compiling)`."""
    s = profile.meta.torch_compile
    if not s:
        return []
    # The wall-clock time spent compiling, as a user reads it, is the compile phase's.
    figs = {f.name: f for f in phase_figures(profile)}
    parts = [f"compiling {fmt_time(figs[COMPILE].wall)} of the wall (compile phase)"] if COMPILE in figs else []
    parts += [f"{fmt_time(v['gpu_time'])} GPU ({kind})" for kind, v in s.items() if v.get("gpu_time")]
    parts += [f"{fmt_time(v['cpu_time'])} host op time ({kind})" for kind, v in s.items() if v.get("cpu_time")]
    parts += [f"{fmt_time(v['host_time'])} host time ({kind})" for kind, v in s.items() if v.get("host_time")]
    if not parts:
        return []
    wall = waits(profile).wall
    if wall and any(int(v.get("host_time") or 0) > wall for v in s.values()):
        parts.append("host time sums every thread's: Inductor's compile workers run side by side")
    how = ("ranked with the rest (--include-compile)" if profile.meta.torch_compile_included
           else "not in the flat view; --include-compile ranks it")
    return [f"torch.compile: {' · '.join(parts)} ({how})"]


def graph_lines(profile: Profile) -> list[str]:
    """A recording that traced CUDA-graph replays per graph (`--cuda-graph-trace graph`,
    collectors/native/device.h) says how its kernel times inside replays were made."""
    c = profile.meta.collector
    if not isinstance(c, dict) or c.get("graph_trace") != "graph":
        return []
    spans, traced = int(c.get("graph_replays_per_graph") or 0), int(c.get("graph_replays_per_kernel") or 0)
    if not spans and not traced:
        return []  # no CUDA graph was replayed: nothing to say of how replays were traced
    each = "replay traced as one span" if spans == 1 else "replays traced as one span each"
    return [f"CUDA graphs: {spans:,} {each}, split over their kernels as each graph's first replay ran them "
            f"({traced:,} {'replay' if traced == 1 else 'replays'} traced per kernel; --cuda-graph-trace node traces all)"]


def rank_lines(profile: Profile, metric: str) -> list[str]:
    """Several ranks: each rank's total and communication share, and the straggler verdict
    (dlpt.ranks.straggler says the rule)."""
    from dlpt.findings import RANK_WHY
    from dlpt.ranks import (
        STRAGGLER_MIN_SHARE,
        WAIT_METRICS,
        judged_straggler,
        left_out_text,
        rank_totals,
        ranks_without_gpu,
    )

    totals = rank_totals(profile, metric)
    if len(totals) < 2:
        return []

    def comm(t: dict[str, Any]) -> str:
        return f" (communication {t['comm_percent']:.1f}%)" if t["comm"] else ""

    lines = [f"{len(totals)} ranks, {metric} per rank: "
             + " · ".join(f"rank {t['rank']} {fmt_metric(metric, t[metric])}{comm(t)}" for t in totals)]
    left_out = ranks_without_gpu(profile, metric)
    if left_out and len(left_out) < len(totals):
        lines.append(left_out_text(left_out))
    # One story of several ranks: where the diagnosis found ranks waiting for another, the
    # straggler is the one it names (dlpt.findings.rank_wait), whatever the metric shown.
    wait = next((f for f in findings(profile) if f.rule == "rank-wait"), None)
    if wait is not None and RANK_WHY in wait.figure:
        lines.append(f"straggler: {safe_text(wait.figure.split(RANK_WHY, 1)[1])} (the others wait for it: "
                     "rank-wait, below)")
        return lines
    if metric in WAIT_METRICS:
        return lines  # a wait says who was kept waiting, not who is slow
    v, phase = judged_straggler(profile, metric)
    if v is None or not any(v["compute"].values()):
        return lines  # nothing computed in this metric: no rank is slower than another
    slow = f"rank {v['rank']}"
    # Judged on the steady state (dlpt.scope), whatever phase the view shows: said so.
    of = " in the steady state" if phase == "steady" else ""
    if not v["straggler"]:
        # The rule holds the excess to a share of the slowest rank's compute; said against the
        # others' median, as the excess is, that share is MIN / (1 - MIN).
        need = 100 * STRAGGLER_MIN_SHARE / (1 - STRAGGLER_MIN_SHARE)
        pct = f"{v['excess_percent']:.1f}%" if v["excess_percent"] is not None else "infinitely"  # ≤ 5.3% here
        lines.append(f"ranks balanced{of}: the slowest, {slow}, computes {pct} more than the "
                     f"median of the others (a straggler needs {need:.1f}%)")
        return lines
    # Against a median near zero a share means nothing (118470%): the median itself says it.
    pct = (f" ({v['excess_percent']:.1f}%)" if v["excess_percent"] is not None and v["excess_percent"] <= 100
           else f" (the others' median: {fmt_metric(metric, v['compute'][str(v['rank'])] - v['excess'])})")
    text = (f"straggler: {slow} computes {fmt_metric(metric, v['excess'])}{pct} more "
            f"than the median of the others{of}")
    if v["line"]:
        ln = v["line"]
        code = profile.source_line(ln["file"], ln["line"])
        where = safe_text(ln["label"] + (f"  ▸ {code}" if code else ""))
        text += f"; most on {where} (+{fmt_metric(metric, ln['excess'])} over any other rank)"
    lines.append(text)
    if v["comm_wait"] is not None:
        how = "mirrors the excess" if v["mirrored"] else "does not mirror the excess"
        lines.append(f"  the other ranks wait {fmt_metric(metric, max(v['comm_wait'], 0))} longer in collectives "
                     f"than {slow}: {how}")
    return lines


def _row(pct: float, inc: str, exc: str, name: str, indent: int = 0) -> str:
    return f"{pct:6.1f}% {bar(pct / 100.0, 8)} {inc:>10} {exc:>10}  {'  ' * indent}{name}"


def _head(first: str = "incl", second: str = "self") -> str:
    return f"{'%':>7} {'':8} {first:>10} {second:>10}  name"


@dataclass
class Hidden:
    """Rows a report left out, by the option that left them out, so the note names the right one."""

    by_top: int = 0
    by_min: int = 0

    def note(self, opts: ReportOptions, unit: str = "node") -> str:
        parts = []
        if self.by_top:
            parts.append(f"{self.by_top} beyond --top {opts.top}")
        if self.by_min:
            parts.append(f"{self.by_min} under --min-percent {opts.min_percent:g}")
        if not parts:
            return ""
        show = " ".join((["--top 0"] if self.by_top else []) + (["--min-percent 0"] if self.by_min else []))
        n = self.by_top + self.by_min
        return f"({n} {unit}{'s' if n != 1 else ''} hidden: {', '.join(parts)}; {show} shows them)"


def visible_children(cct, i: int, inc: np.ndarray, opts: ReportOptions, hidden: Hidden) -> list[int]:
    """The children of node i that a tree report shows, biggest first: at least
    --min-percent of the total and, at every level (the first included), the --top biggest."""
    kids = cct.children(i)
    kids = kids[np.argsort(-inc[kids], kind="stable")]
    limit = int(inc[0]) * opts.min_percent / 100.0
    keep = (inc[kids] >= limit) & (inc[kids] > 0)
    # Nodes with none of the metric are not rows at all: only those above zero count as hidden.
    hidden.by_min += int(((inc[kids] > 0) & ~keep).sum())
    shown = kids[keep]
    if opts.top:
        hidden.by_top += max(len(shown) - opts.top, 0)
        shown = shown[: opts.top]
    return shown.tolist()


def self_column(profile: Profile, col: int, inverted: bool) -> np.ndarray:
    """Each node's self value in one metric; in a bottom-up tree only its level-one rows have
    one (dlpt.views.bottom_up_self says why)."""
    return bottom_up_self(profile.cct)[:, col] if inverted else profile.cct.exclusive[:, col]


def render_tree(profile: Profile, opts: ReportOptions, title: str, inverted: bool = False) -> list[str]:
    """A tree view as text; `inverted`: `profile` is a bottom-up tree."""
    cct = profile.cct
    col = metric_column(opts.metric)
    inc = cct.inclusive[:, col]
    exc = self_column(profile, col, inverted)
    total = int(inc[0])
    lines = [title, _head()]
    if total <= 0:
        return lines + [f"(no {opts.metric} in this profile)"]
    hidden = Hidden()
    stack: list[tuple[int, int]] = [(c, 0) for c in visible_children(cct, 0, inc, opts, hidden)[::-1]]
    while stack:
        i, d = stack.pop()
        lines.append(_row(100.0 * inc[i] / total, fmt_metric(opts.metric, inc[i]),
                          fmt_metric(opts.metric, exc[i]) if exc[i] else "",
                          frame_text(profile, profile.frame_of(i), opts.full_names), d))
        if opts.depth is not None and d + 1 >= opts.depth:
            continue
        stack.extend((c, d + 1) for c in visible_children(cct, i, inc, opts, hidden)[::-1])
    note = hidden.note(opts)
    if note:
        lines.append(note)
    return lines


def flat_rows(profile: Profile, opts: ReportOptions, hidden: Hidden | None = None) -> list[dict[str, Any]]:
    fv = flat(profile, opts.by)
    col = metric_column(opts.metric)
    total = int(profile.cct.exclusive[:, col].sum())
    order = np.argsort(-fv.exclusive[:, col], kind="stable")
    spread = rank_values(profile, fv.owner, len(fv.labels), profile.cct.exclusive[:, col])
    rows = []
    for g in order.tolist():
        if fv.exclusive[g, col] <= 0 and fv.inclusive[g, col] <= 0:
            continue
        fr = fv.frame[g]
        rows.append({
            "name": fv.labels[g], "frame": fr, "file": fr.file, "line": fr.line, "function": fr.function,
            "self": int(fv.exclusive[g, col]), "total": int(fv.inclusive[g, col]),
            "percent": round(100.0 * fv.exclusive[g, col] / total, 3) if total else 0.0,
            "metrics": {m: int(v) for m, v in zip(METRICS, fv.exclusive[g].tolist())},
        })
        if spread is not None:
            rows[-1]["per_rank"] = {str(r): int(v) for r, v in zip(spread[0], spread[1][g].tolist())}
    hidden = hidden if hidden is not None else Hidden()
    if opts.min_percent:
        n = len(rows)
        rows = [r for r in rows if r["percent"] >= opts.min_percent or r["total"] * 100.0 >= total * opts.min_percent]
        hidden.by_min += n - len(rows)
    if opts.top:
        hidden.by_top += max(len(rows) - opts.top, 0)
        rows = rows[: opts.top]
    return rows


def _spread_text(metric: str, per_rank: dict[str, int] | None) -> str:
    if per_rank is None:
        return ""
    lo, med, hi, who = rank_spread([int(r) for r in per_rank], list(per_rank.values()))
    return (f"{fmt_metric(metric, lo):>10} {fmt_metric(metric, int(round(med))):>10} "
            f"{fmt_metric(metric, hi):>10} {'r' + str(who):>5}  ")


def render_flat(profile: Profile, opts: ReportOptions) -> list[str]:
    hidden = Hidden()
    rows = flat_rows(profile, opts, hidden)
    lines = [f"flat view by {opts.by}, {opts.metric} (self = owned by the {opts.by}; total = everything beneath it)",
             _head("self", "total")]
    if rows and "per_rank" in rows[0]:
        lines[0] += "; min / median / max: self on each rank, and the rank with the max"
        lines[1] = _head("self", "total").replace("name", f"{'min':>10} {'median':>10} {'max':>10} {'rank':>5}  name")
    for r in rows:
        fr = r["frame"]
        if opts.by == "kernel" and fr.kind == "kernel" and not opts.full_names:
            name = short_kernel_name(fr.name, 70)
        elif opts.by == "line":
            name = frame_text(profile, fr, opts.full_names)
        else:
            name = r["name"]
        lines.append(_row(r["percent"], fmt_metric(opts.metric, r["self"]),
                          fmt_metric(opts.metric, r["total"]),
                          _spread_text(opts.metric, r.get("per_rank")) + safe_text(name)))
    if not rows and not hidden.by_min:
        lines.append(f"(no {opts.metric} in this profile)")
    note = hidden.note(opts, "row")
    if note:
        lines.append(note)
    return lines


def render(profile: Profile, opts: ReportOptions) -> str:
    """The report as text. `profile` has already been through `hide_library_unless` (library frames hidden or not)."""
    lines = header(profile, opts.metric) + [""]
    if opts.view == "flat":
        lines += render_flat(profile, opts)
    elif opts.view == "bottom-up":
        lines += render_tree(bottom_up(profile), opts,
                             f"bottom-up view, {opts.metric}: each frame's self time, then its callers "
                             "(incl: the time through each caller)", inverted=True)
    else:
        lines += render_tree(profile, opts, f"top-down view, {opts.metric}")
    lines += diagnosis_lines(profile)
    return "\n".join(lines) + "\n"


def diagnosis_lines(profile: Profile) -> list[str]:
    """The diagnosis (dlpt.findings): each finding that crossed its threshold, with its figure,
    its lines and its remedy; nothing when none did."""
    found = findings(profile)
    if not found:
        return []
    out = ["", "diagnosis"]
    for f in found:
        share = f" [{f.share:.0%} of the {f.of}]" if f.share is not None and f.of else ""
        out.append(f"  {f.rule}{share}: {safe_text(f.figure)}")
        for ln in f.lines:
            file, _, num = ln.rpartition(":")
            code = profile.source_line(file, int(num)) if num.isdigit() else ""
            where = f"{short_path(file)}:{num}" if num.isdigit() else ln
            out.append(f"    {safe_text(where)}" + (f"  ▸ {safe_text(code)}" if code else ""))
        out.append(f"    → {safe_text(f.remedy)}")
    return out


def render_json(profile: Profile, opts: ReportOptions) -> dict[str, Any]:
    """The same view as data: tree views as nested nodes, flat as rows. Every value is an
    integer in its metric's unit (`unit` for the chosen metric, `units` for all: ns, bytes,
    count), summary included; only `percent` is a float."""
    col = metric_column(opts.metric)
    doc: dict[str, Any] = {"schema": "dlpt.report/1", "view": opts.view, "metric": opts.metric,
                           "unit": metric_unit(opts.metric), "units": {m: metric_unit(m) for m in METRICS},
                           "summary": summary(profile, opts.metric, unit="ns")}
    if opts.view == "flat":
        doc["by"] = opts.by
        flat_hidden = Hidden()
        doc["rows"] = [{k: v for k, v in r.items() if k != "frame"} for r in flat_rows(profile, opts, flat_hidden)]
        doc["hidden"] = {"by_top": flat_hidden.by_top, "by_min_percent": flat_hidden.by_min}
        return doc
    inverted = opts.view == "bottom-up"
    prof = bottom_up(profile) if inverted else profile
    cct = prof.cct
    inc = cct.inclusive[:, col]
    exc = self_column(prof, col, inverted)
    total = int(inc[0])
    hidden = Hidden()

    def node(i: int, d: int) -> dict[str, Any]:
        fr = prof.frame_of(i)
        out: dict[str, Any] = {"name": fr.name, "kind": fr.kind, "file": fr.file, "line": fr.line,
                               "function": fr.function, "inclusive": int(inc[i]),
                               "exclusive": int(exc[i])}
        if opts.depth is None or d + 1 < opts.depth:
            out["children"] = [node(c, d + 1) for c in visible_children(cct, i, inc, opts, hidden)]
        return out

    doc["total"] = total
    doc["roots"] = [node(c, 0) for c in visible_children(cct, 0, inc, opts, hidden)] if total > 0 else []
    doc["hidden"] = {"by_top": hidden.by_top, "by_min_percent": hidden.by_min}
    return doc
