"""`dlpt diff` as text: the model's `Diff` (dlpt.diff) as aligned rows, largest change first."""

from __future__ import annotations

import os

from dlpt.diff import Diff, DiffRow, row_label
from dlpt.metrics import COL
from dlpt.viewers.format import fmt_metric, safe_text, short_kernel_name


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
        code = (r.b or r.a).code if (r.b or r.a) else ""  # type: ignore[union-attr]
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
