"""`-f html`: one self-contained page per profile, to open in any browser, offline.

The page holds the text report's headline and diagnosis (the same functions `dlpt report` calls),
a flame graph of the calling-context tree (d3-flame-graph), flat tables by line, function,
kernel and op, the source of the selected line with per-line figures in its margin, a picker
over every metric the profile has, a rank picker for multi-rank profiles and the timeline when
the recording kept one. Data and scripts are inline: nothing is fetched when it is viewed.

A very large tree is pruned for the flame graph only (nodes under `MIN_SHARE` of every metric
fold into their parent, whose width already holds them); the page says how many were left out.
The tables come from the whole profile."""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any, TextIO, cast

import numpy as np

from dlpt.frames import FUSED_PREFIX, Frame
from dlpt.metrics import METRIC, METRICS, metric_unit
from dlpt.profile import Profile
from dlpt.ranks import rank_nodes, select_rank
from dlpt.scope import Scope
from dlpt.version import __version__
from dlpt.viewers.exporters.base import ExportOptions
from dlpt.viewers.format import safe_text, short_kernel_name
from dlpt.viewers.report import diagnosis_lines, frame_text, header
from dlpt.views import flat

# The vendored scripts, pinned (viewers/html/vendor/README.md says where they come from).
VENDOR = ("d3-7.9.2.min.js", "d3-flame-graph-4.1.3.min.js")
GROUPINGS = ("line", "function", "kernel", "op")
# The flame graph shows at most this many nodes; below MIN_SHARE of every metric's total a node
# is under a pixel wide on any screen, so it folds into its parent first.
MAX_FLAME_NODES = 40_000
MIN_SHARE = 1e-4
# Rows per flat table: the top rows of every metric, joined.
TABLE_ROWS = 200


def _asset(name: str) -> str:
    return resources.files("dlpt.viewers").joinpath("html").joinpath(name).read_text(encoding="utf-8")


def _json(data: Any) -> str:
    """JSON safe inside a <script> element: `<` can only occur in strings, where \\u003c reads the same."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(data: dict[str, Any]) -> str:
    """The whole page: the template with the stylesheet, the vendored scripts, the page's own
    script and the data inlined."""
    page = _asset("page.html")
    parts = {
        "/*DLPT_CSS*/": _asset("vendor/d3-flame-graph-4.1.3.css") + _asset("page.css"),
        "/*DLPT_LIBS*/": "\n".join(_asset(f"vendor/{v}") for v in VENDOR),
        "/*DLPT_APP*/": _asset("page.js"),
        "/*DLPT_DATA*/": _json(data),
        "DLPT_TITLE": html.escape(str(data.get("title", "dlpt"))),
    }
    # One pass over the template, so that no inlined part is searched for another's marker.
    out, i = [], 0
    while True:
        hits = [(page.find(k, i), k) for k in parts if page.find(k, i) >= 0]
        if not hits:
            out.append(page[i:])
            return "".join(out)
        at, key = min(hits)
        out += [page[i:at], parts[key]]
        i = at + len(key)


def frame_kind(frame: Frame) -> str:
    """How the flame graph colours a frame: its kind, with fused kernels' shares apart from ops."""
    if frame.kind == "op" and frame.name.startswith(FUSED_PREFIX):
        return "fused"
    return frame.kind


def _name(profile: Profile, frame: Frame) -> str:
    if frame.kind == "kernel":
        return safe_text(short_kernel_name(frame.name, 70))
    return safe_text(frame.label())


def _metrics(profile: Profile) -> list[str]:
    tot = profile.cct.exclusive.sum(axis=0)
    return [m for i, m in enumerate(METRICS) if tot[i] > 0]


def _tree(profile: Profile, metrics: list[str]) -> dict[str, Any]:
    """The CCT for the flame graph: parents, frame ids and the inclusive value of each metric,
    pruned to the nodes that are at least MIN_SHARE of some metric (and at most MAX_FLAME_NODES)."""
    cct = profile.cct
    cols = [METRICS.index(m) for m in metrics]
    inc = cct.inclusive[:, cols] if cols else np.zeros((len(cct), 0), dtype=np.int64)
    totals = np.maximum(inc[0], 1) if len(cct) else np.ones(len(cols))
    share = (inc / totals).max(axis=1) if cols else np.zeros(len(cct))
    share[0] = 1.0
    # Small trees are drawn whole; a large one loses its smallest nodes first.
    limit = 0.0
    if int((share > 0).sum()) > MAX_FLAME_NODES:
        limit = max(MIN_SHARE, float(np.sort(share)[::-1][MAX_FLAME_NODES - 1]))
    keep = (share >= limit) & (share > 0)
    # A node is kept only under a kept parent (preorder: parents come first).
    parent = cct.parent
    for i in np.flatnonzero(keep)[1:].tolist():
        if not keep[parent[i]]:
            keep[i] = False
    ids = np.flatnonzero(keep)
    new = np.full(len(cct), -1, dtype=np.int64)
    new[ids] = np.arange(len(ids))
    par = np.where(ids == 0, -1, new[parent[ids]]) if len(ids) else ids
    return {"parent": par.tolist(), "frame": cct.frame[ids].tolist(),
            "values": {m: inc[ids, k].tolist() for k, m in enumerate(metrics)},
            "nodes": int(len(cct)), "shown": int(len(ids)), "folded": int((share > 0).sum()) - int(len(ids)), "min_share": limit}


def _table(profile: Profile, by: str, metrics: list[str]) -> dict[str, Any]:
    """One flat view (dlpt.views.flat, what the report's flat table is made of), its rows in the
    profile's group order (ties sort as the report sorts them), the top TABLE_ROWS of each metric."""
    fv = flat(profile, by)
    cols = [METRICS.index(m) for m in metrics]
    exc, inc = fv.exclusive[:, cols], fv.inclusive[:, cols]
    chosen: set[int] = set()
    for k in range(len(cols)):
        order = np.argsort(-exc[:, k], kind="stable")
        chosen.update(g for g in order[:TABLE_ROWS].tolist() if exc[g, k] > 0 or inc[g, k] > 0)
    rows = sorted(chosen)
    out_rows = []
    for g in rows:
        fr = fv.frame[g]
        name = _name(profile, fr) if by in ("line", "kernel") else safe_text(fv.labels[g])
        code = safe_text(profile.source_line(fr.file, fr.line)) if by == "line" and fr.has_source else ""
        out_rows.append([name, code, fr.file if fr.has_source else "", int(fr.line) if fr.has_source else 0,
                         safe_text(fr.name) if by == "kernel" else ""])
    return {"rows": out_rows, "self": {m: exc[rows, k].tolist() for k, m in enumerate(metrics)},
            "total": {m: inc[rows, k].tolist() for k, m in enumerate(metrics)}, "groups": len(fv.labels)}


def _margin(profile: Profile, metrics: list[str]) -> dict[str, list]:
    """Per source line of every stored file: the line's self and total value of each metric."""
    fv = flat(profile, "line")
    cols = [METRICS.index(m) for m in metrics]
    out: dict[str, list] = {}
    for g, fr in enumerate(fv.frame):
        if fr.has_source and fr.file in profile.sources and (fv.inclusive[g, cols] > 0).any():
            out.setdefault(fr.file, []).append(
                [int(fr.line), fv.exclusive[g, cols].tolist(), fv.inclusive[g, cols].tolist()])
    return out


def view_data(profile: Profile, metrics: list[str]) -> dict[str, Any]:
    return {"tree": _tree(profile, metrics), "tables": {by: _table(profile, by, metrics) for by in GROUPINGS},
            "margin": _margin(profile, metrics)}


def _timeline(profile: Profile) -> dict[str, list[float]]:
    """meta.timeline as lists of numbers; every key is optional, anything else is left out."""
    t = profile.meta.timeline
    if not isinstance(t, dict):
        return {}
    out = {}
    for k in ("t", "gpu_busy", "mem_t", "allocated", "reserved"):
        v = cast(dict[str, Any], t).get(k)
        if isinstance(v, list) and all(isinstance(x, int | float) for x in v):
            out[k] = v
    return out


def page_data(profile: Profile, metric: str, scope: Scope | None = None) -> dict[str, Any]:
    # The command's one decision on library frames and torch.compile's one-off work (dlpt.scope):
    # the page's tables rank as the report's flat view does, and its headline says so.
    prof = (scope or Scope()).apply(profile)
    metrics = _metrics(prof) or [metric]
    if metric in metrics:
        metrics.remove(metric)
    metrics.insert(0, metric)
    views = [{"label": "all ranks" if rank_nodes(prof) else "", **view_data(prof, metrics)}]
    if len(rank_nodes(prof)) > 1:
        views += [{"label": f"rank {r}", **view_data(select_rank(prof, r), metrics)} for r, _ in rank_nodes(prof)]
    used = sorted({f for v in views for f in v["tree"]["frame"]})
    frames = {str(i): [frame_kind(prof.frames[i]), frame_text(prof, prof.frames[i]),
                       prof.frames[i].file if prof.frames[i].has_source else "", int(prof.frames[i].line)]
              for i in used}
    files = {f for v in views for f in v["margin"]}
    files |= {fr[2] for fr in frames.values() if fr[2]}
    head = header(prof, metric)
    return {"kind": "profile", "title": head[0], "version": __version__, "metric": metric,
            "metrics": [{"name": m, "unit": metric_unit(m), "about": METRIC[m].about} for m in metrics],
            "header": head, "diagnosis": [ln for ln in diagnosis_lines(prof) if ln.strip()],
            "frames": frames, "views": views, "timeline": _timeline(prof),
            "sources": {f: prof.sources[f] for f in sorted(files) if f in prof.sources}}


def diff_page_data(doc: dict[str, Any], title: str) -> dict[str, Any]:
    """A `dlpt diff` document (dlpt.diff.diff_json) as the diff page's data: the rows as they are."""
    return {"kind": "diff", "title": title, "version": __version__, "diff": doc}


class HtmlExporter:
    name = "html"
    suffix = ".html"
    description = "one self-contained HTML page: headline, flame graph, tables, source, timeline (offline)"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        out.write(render_page(page_data(profile, options.metric_for(profile), options.scope)))


def notebook_html(profile: Profile, height: int = 640) -> str:
    """The page in an iframe sized for a notebook cell: its scripts and styles stay its own."""
    page = render_page(page_data(profile, ExportOptions().metric_for(profile)))
    return (f'<iframe class="dlpt-view" srcdoc="{html.escape(page, quote=True)}" '
            f'style="width:100%;height:{height}px;border:1px solid #ddd" sandbox="allow-scripts"></iframe>')
