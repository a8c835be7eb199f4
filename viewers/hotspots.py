"""Hotspots: the source lines that cost the most, in the stable `dlpt.hotspots/2` schema that
CI jobs and dashboards read (docs/ARCHITECTURE.md). The document is shaped here, from the
model's flat view, totals and per-rank values; `summary` is also the report JSON's summary.
`read_hotspots` reads a document back, a `/1` one too."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dlpt.errors import DlptError
from dlpt.findings import findings
from dlpt.frames import ACTIVITY_KINDS
from dlpt.metrics import COL, COPY_KINDS, COUNT_METRICS, METRICS, PC_PARTS, metric_column, metric_unit
from dlpt.phases import ALL, phase_figures
from dlpt.profile import Profile, default_metric
from dlpt.ranks import judged_straggler, rank_totals, rank_values, ranks_without_gpu
from dlpt.scope import Scope
from dlpt.stalls import limiter
from dlpt.views import flat, node_flags
from dlpt.waits import memory_peak, waits

# /2: a hotspot's place in the ranking is `position` (1 = costliest). /1 called it `rank`, which
# everywhere else — `summary.ranks`, `summary.straggler`, `per_rank` — is a process rank.
SCHEMA = "dlpt.hotspots/2"
SCHEMA_V1 = "dlpt.hotspots/1"


def us(ns: float | int) -> float:
    return round(float(ns) / 1000.0, 3)


def _exact(v: float | int) -> int:
    return int(v)


def _memcpy(row: np.ndarray, conv: Callable[[int], Any] = us) -> dict[str, Any]:
    return {k.split: conv(row[COL[k.time]]) for k in COPY_KINDS}


def _value(ns: int, metric: str) -> float:
    return us(ns) if metric_unit(metric) == "ns" else float(ns)


def summary(profile: Profile, metric: str = "gpu_time", unit: str = "us") -> dict[str, Any]:
    """Totals of the profile. `unit="us"`: times as microsecond floats (the hotspots schema);
    `unit="ns"`: every value an integer in its metric's unit (`dlpt report --format json`)."""
    col = metric_column(metric)
    t = us if unit == "us" else _exact

    def val(v: int) -> Any:
        return _value(v, metric) if unit == "us" else int(v)

    cct = profile.cct
    tot = cct.exclusive.sum(axis=0)
    on_src, in_bwd = node_flags(profile)
    unatt: dict[str, float] = {}
    for i in np.flatnonzero(np.array([f.kind == "unattributed" for f in profile.frames])[cct.frame]).tolist():
        name = profile.frame_of(i).name
        reason = name[len("<unattributed: "):-1] if name.startswith("<unattributed: ") else name
        v = int(cct.inclusive[i, col])
        if v:  # a row that holds another metric (GPU idle's start-up row under gpu_time) says nothing here
            unatt[reason] = unatt.get(reason, 0) + val(v)
    out: dict[str, Any] = {
        "gpu_time": t(tot[COL["gpu_time"]]), "kernel_time": t(tot[COL["kernel_time"]]),
        "comm_time": t(tot[COL["comm_time"]]),
        "memset_time": t(tot[COL["memset_time"]]), "memcpy_time": _memcpy(tot, t),
        "cpu_time": t(tot[COL["cpu_time"]]),
        "attributed_to_source": val(int(cct.exclusive[on_src, col].sum())),
        "backward_time": val(int(cct.exclusive[in_bwd, col].sum())),
        "unattributed": unatt,
    }
    # Why the GPU waits (dlpt.waits): the window, GPU busy and idle with idle's split, sync and
    # host time; null where the profile does not know (older profiles; no GPU).
    for k, v in waits(profile).to_json().items():
        out[k] = {p: t(x) for p, x in v.items()} if isinstance(v, dict) else (None if v is None else t(v))
    # The run's phases (dlpt/phases.py) and which one the figures above are of.
    out["phase"] = profile.meta.phase if profile.meta.phase is not None else ALL
    figs = phase_figures(profile)
    if figs:
        out["phases"] = {f.name: {"wall_time": t(f.wall), "gpu_busy_time": None if f.busy is None else t(f.busy),
                                  "gpu_idle_time": None if f.idle is None else t(f.idle), "sync_time": t(f.sync)}
                         for f in figs}
    mem = memory_peak(profile)
    if mem is not None:
        out["memory"] = mem.to_json()
    out["findings"] = [f.to_json() for f in findings(profile)]
    out.update(_rank_summary(profile, metric, t, val))
    return out


def _rank_summary(profile: Profile, metric: str, t: Any = us, val: Any = None) -> dict[str, Any]:
    """`ranks` (each rank's totals) and `straggler` (dlpt.ranks.straggler) for several ranks, in
    the units `summary` uses (`t` for times, `val` for values of `metric`)."""
    if val is None:
        def val(v: int) -> Any:
            return _value(v, metric)
    totals = rank_totals(profile, metric)
    if len(totals) < 2:
        return {}
    ranks = []
    for r in totals:
        row = {"rank": r["rank"], "gpu_time": t(r["gpu_time"]), "cpu_time": t(r["cpu_time"]),
               "comm_time": t(r["comm_time"]), "comm": val(r["comm"]), "comm_percent": r["comm_percent"]}
        row[metric] = val(r[metric])
        ranks.append(row)
    v, phase = judged_straggler(profile, metric)
    if v is None:
        # Fewer than two ranks take part (the others have no GPU activity in a GPU metric): no
        # verdict, said in the verdict's own shape.
        return {"ranks": ranks, "straggler": {
            "rank": None, "straggler": False, "excess": None, "excess_percent": None, "mirrored": None,
            "comm_wait": None, "line": None, "left_out": ranks_without_gpu(profile, metric), "phase": phase or "all"}}
    verdict = {"rank": v["rank"], "straggler": v["straggler"], "excess": val(v["excess"]),
               "excess_percent": v["excess_percent"], "mirrored": v["mirrored"],
               "comm_wait": t(v["comm_wait"]) if v["comm_wait"] is not None else None,
               "line": None, "left_out": v["left_out"], "phase": phase or "all"}
    if v["line"]:
        ln = v["line"]
        verdict["line"] = {"file": ln["file"], "line": ln["line"], "function": ln["function"],
                           "code": profile.source_line(ln["file"], ln["line"]),
                           "excess": val(ln["excess"])}
    return {"ranks": ranks, "straggler": verdict}


def hotspots(profile: Profile, metric: str | None = None, top: int = 20,
             include_library: bool = False, include_compile: bool = False) -> dict[str, Any]:
    """The hotspots document for `profile`, ranked by `metric` (default: `default_metric`);
    torch.compile's one-off work is left out unless `include_compile` (dlpt.compile_time)."""
    return hotspots_document(Scope(include_library, include_compile).apply(profile), metric, top)


def pc_fields(row: np.ndarray) -> dict[str, Any]:
    """A hotspot's PC samples (`dlpt record --pc-samples`): the count, the issued ones, each
    stall part by its metric's name without `stall_`, and what limits it (dlpt.stalls)."""
    lim = limiter(row)
    return {"samples": int(row[COL["pc_samples"]]), "issued": int(row[COL["pc_issued"]]),
            "stalls": {m[len("stall_"):]: int(row[COL[m]]) for m in PC_PARTS if m.startswith("stall_")},
            "limiter": lim[0].name if lim else None}


def hotspots_document(view: Profile, metric: str | None = None, top: int = 20) -> dict[str, Any]:
    """The hotspots document for a profile already in its command's `Scope`."""
    profile = view
    metric = metric or default_metric(profile)
    col = metric_column(metric)
    cct = view.cct
    fv = flat(view, "line")
    total = int(cct.exclusive[:, col].sum())
    _, in_bwd = node_flags(view)
    owner = fv.owner
    none = len(fv.labels) - 1
    # Backward share and top activities of every group, from the nodes each group owns.
    own = np.where(owner >= 0, owner, none)
    bwd = np.zeros(len(fv.labels), dtype=np.int64)
    np.add.at(bwd, own[in_bwd], cct.exclusive[in_bwd, col])
    leaf_kind = np.array([f.kind in ACTIVITY_KINDS for f in view.frames], dtype=bool)[cct.frame]
    leaves = np.flatnonzero(leaf_kind)
    count_cols = [COL[m] for m in COUNT_METRICS]
    rows = [g for g in np.argsort(-fv.exclusive[:, col], kind="stable").tolist()
            if g != none and fv.exclusive[g, col] > 0][: max(top, 0)]
    spread = rank_values(view, owner, len(fv.labels), cct.exclusive[:, col])
    wanted = set(rows)
    kern: dict[int, dict[str, list[int]]] = {g: {} for g in rows}
    for i in leaves.tolist():
        g = int(own[i])
        if g in wanted:
            name = view.frame_of(i).name
            acc = kern[g].setdefault(name, [0, 0])
            acc[0] += int(cct.exclusive[i, COL["gpu_time"]])
            acc[1] += int(cct.exclusive[i, count_cols].sum())
    has_pc = bool(cct.exclusive[:, COL["pc_samples"]].any())
    out = []
    for position, g in enumerate(rows, 1):
        fr = fv.frame[g]
        row = fv.exclusive[g]
        node = int(fv.node[g])
        path = [f.label() for f in view.call_path(node) if f.has_source]
        tk = sorted(kern[g].items(), key=lambda kv: -kv[1][0])[:5]
        out.append({
            "position": position, "file": fr.file, "line": fr.line, "function": fr.function,
            "code": profile.source_line(fr.file, fr.line),
            "gpu_time": us(row[COL["gpu_time"]]),
            "percent": round(100.0 * row[col] / total, 3) if total else 0.0,
            "kernel_time": us(row[COL["kernel_time"]]), "memcpy_time": _memcpy(row),
            "memset_time": us(row[COL["memset_time"]]), "cpu_time": us(row[COL["cpu_time"]]),
            "backward_time": _value(int(bwd[g]), metric),
            "count": int(row[count_cols].sum()),
            "call_path": path,
            "top_kernels": [{"name": k, "time": us(v[0]), "count": v[1]} for k, v in tk],
            **({metric: _value(int(row[col]), metric)} if metric not in ("gpu_time", "kernel_time",
                                                                          "memset_time", "cpu_time") else {}),
        })
        if has_pc:
            out[-1]["pc_sampling"] = pc_fields(row)
        if spread is not None:
            out[-1]["per_rank"] = {str(r): _value(int(v), metric) for r, v in zip(spread[0], spread[1][g].tolist())}
    meta = profile.meta
    return {
        "schema": SCHEMA,
        "profile": {"path": profile.path, "source": profile.collector,
                    "command": meta.command if meta.command is not None else "",
                    "dlpt_version": meta.dlpt_version if meta.dlpt_version is not None else ""},
        "unit": "us",
        "metric": metric,
        "summary": summary(view, metric),
        "hotspots": out,
    }


def read_hotspots(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """A hotspots document — a file's path or the parsed JSON — in the current schema, whichever
    schema wrote it: a `dlpt.hotspots/1` document comes back as `/2`, each hotspot's `rank`
    renamed `position`, so that a CI gate comparing today's export with a stored one reads both
    the same way. Anything else is a DlptError that says what it is."""
    where, doc = "hotspots document", source
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        try:
            with open(where, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as e:
            raise DlptError(f"{where}: cannot read ({e.strerror or e})") from None
        except ValueError as e:
            raise DlptError(f"{where}: not JSON ({e}); expected a dlpt hotspots document") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or schema not in (SCHEMA, SCHEMA_V1):
        raise DlptError(f"{where}: schema {schema!r}, not a dlpt hotspots document this dlpt reads "
                        f"({SCHEMA_V1} or {SCHEMA})")
    if schema == SCHEMA:
        return doc
    out = {**doc, "schema": SCHEMA}
    out["hotspots"] = [{("position" if k == "rank" else k): v for k, v in h.items()} for h in doc.get("hotspots", [])]
    return out


__all__ = ["SCHEMA", "SCHEMA_V1", "hotspots", "hotspots_document", "read_hotspots", "summary", "METRICS"]
