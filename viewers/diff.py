"""`dlpt diff` as text, the model's `Diff` (dlpt.diff) as aligned rows, largest change first, and
as the `dlpt.diff/1` JSON document."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dlpt.diff import Diff, DiffRow, Entry, row_label
from dlpt.metrics import COL, METRICS, metric_unit
from dlpt.viewers.format import fmt_metric, safe_text, short_kernel_name

SCHEMA = "dlpt.diff/1"


def _signed(metric: str, v: int) -> str:
    if v == 0:
        return "0"
    return ("+" if v > 0 else "-") + fmt_metric(metric, abs(v))


def _pct(r: DiffRow) -> str:
    if r.before == 0:
        return "new" if r.after else "0%"
    return f"{r.percent:+.1f}%"


def render_text(d: Diff, top: int | None = 20, show_unchanged: bool = False) -> str:
    """Aligned text: one row per matched entry, largest absolute change first."""
    m = d.metric
    col = COL[m]
    before, after = int(d.a_total[col]), int(d.b_total[col])
    pct = f" ({100.0 * (after - before) / before:+.1f}%)" if before else ""
    lines = [
        f"dlpt diff · by {d.by} · {m}",
        f"  A (before) {safe_text(os.path.basename(d.a_name) or d.a_name)}: {fmt_metric(m, before)}",
        f"  B (after)  {safe_text(os.path.basename(d.b_name) or d.b_name)}: {fmt_metric(m, after)}",
        f"  change     {_signed(m, after - before)}{pct}",
        "",
    ]
    rows = d.rows if show_unchanged else [r for r in d.rows if r.delta]
    shown = rows[:top] if top else rows
    if not shown:
        lines.append(f"no differences in {m}")
        return "\n".join(lines) + "\n"
    table = [("change", "%", "before", "after", "matched by", d.by)]
    for r in shown:
        label = row_label(r, d.by)
        if d.by == "kernel" and r.entry.frame.kind == "kernel":
            label = short_kernel_name(label, 90)
        code = r.entry.code
        if code:
            label = f"{label}  ▸ {code}"
        table.append((_signed(m, r.delta), _pct(r), fmt_metric(m, r.before), fmt_metric(m, r.after),
                      r.match, safe_text(label)))
    widths = [max(len(row[k]) for row in table) for k in range(5)]
    for row in table:
        cells = [row[k].rjust(widths[k]) for k in range(4)] + [row[4].ljust(widths[4]), row[5]]
        lines.append("  ".join(cells).rstrip())
    rest = len(rows) - len(shown)
    if rest > 0:
        lines.append(f"… {rest} more changed rows (--top 0 shows all)")
    return "\n".join(lines) + "\n"


def _side(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    f = e.frame
    return {"label": e.label, "kind": f.kind, "file": f.file, "line": f.line, "function": f.function}


def diff_json(d: Diff, top: int | None = None) -> dict[str, Any]:
    """The `dlpt.diff/1` document: integer values in the metric's unit, totals of every metric
    for each run, and the rows (all of them when `top` is None or 0)."""
    rows = d.rows[:top] if top else d.rows
    col = COL[d.metric]

    def totals(t: np.ndarray) -> dict[str, int]:
        return {m: int(t[COL[m]]) for m in METRICS}

    counts: dict[str, int] = {}
    for r in d.rows:
        counts[r.match] = counts.get(r.match, 0) + 1
    before, after = int(d.a_total[col]), int(d.b_total[col])
    return {
        "schema": SCHEMA, "by": d.by, "metric": d.metric, "unit": metric_unit(d.metric),
        "units": {m: metric_unit(m) for m in METRICS},
        "a": {"path": d.a_name, "total": totals(d.a_total)},
        "b": {"path": d.b_name, "total": totals(d.b_total)},
        "before": before, "after": after, "delta": after - before,
        "percent": round(100.0 * (after - before) / before, 3) if before else None,
        "matched": counts,
        "rows": [{
            "label": row_label(r, d.by), "match": r.match,
            "before": r.before, "after": r.after, "delta": r.delta,
            "percent": None if r.percent is None else round(r.percent, 3),
            "a": _side(r.a), "b": _side(r.b),
            "code": r.entry.code,
        } for r in rows],
    }
