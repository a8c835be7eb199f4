"""Phases of a run: start-up, compile and the steady state (docs/ARCHITECTURE.md, "Phases").

A run spends its first seconds importing, building the model and loading weights, may spend
minutes compiling (Dynamo and Inductor, autotuning, CUDA-graph warm-up and capture), and only
then runs the steps the program exists for. Figures over the whole run mix the three: a
compiled decode loop that keeps the GPU 98% busy reads 2% busy over a run that was mostly
compiling. So the collectors keep every metric per phase, and the views and the diagnosis pick
the phase they speak of.

How a profile holds them. A collector builds its tree with one `phase` frame under the root per
phase it saw (the recorder interns contexts under its current phase's node; an importer may put
events under the phase of their time), then `split_phases` merges those subtrees into the one
tree every view reads — the whole run, as a profile without phases would be — and keeps a
`PhaseTable` beside it: each phase's exclusive metrics per node, and each activity row's phase.
`select_phase(profile, name)` gives a phase as a profile of its own (the same tree, that phase's
metrics, its window and idle figures in meta), so every view, export and rule reads it unchanged.

The phase figures in meta (`meta.phases`, written by the collector): per phase its `wall`
(ns of the window spent in it), its `window` (first start, last end) and `gpu_idle` (the same
dict as `meta.gpu_idle`, of its stretches alone); `meta.phase_spans` the stretches
themselves, `[start, end, name]` in the window's clock, in order.

A profile with no phase table (an older file, a trace without steps, a profile a transformation
made) is all steady state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlpt.cct import CCT, sum_rows
from dlpt.frames import Frame
from dlpt.header import Header, PhaseMeta, Window
from dlpt.metrics import COL
from dlpt.profile import Activities, PhaseTable, Profile
from dlpt.transforms import merge_map, nearest_marked, prune_empty

STARTUP, COMPILE, STEADY = "start-up", "compile", "steady"
PHASES = (STARTUP, COMPILE, STEADY)  # in the order a run goes through them
ALL = "all"
# What `--phase` takes: a phase, `all` (the whole run), and `startup` for `start-up`.
PHASE_CHOICES = (STEADY, COMPILE, STARTUP, "startup", ALL)
PHASE_KIND = "phase"
I64 = np.int64


def phase_frame(name: str) -> Frame:
    """The frame a collector heads a phase's subtree with (`name`: the collector's own phase)."""
    return Frame(PHASE_KIND, name)


def phase_name(choice: str) -> str:
    """`--phase`'s value as a phase name (`startup` → `start-up`)."""
    return STARTUP if choice == "startup" else choice


def table_of(profile: Profile) -> PhaseTable | None:
    """The profile's phase table, if it has one that indexes its own tree and activities."""
    t = profile.phases
    if t is None or t.cct is not profile.cct or t.activities is not profile.activities:
        return None
    return t


def has_phases(profile: Profile) -> bool:
    return table_of(profile) is not None


def split_phases(phased: Profile, names: dict[str, str]) -> Profile:
    """The tree with one `phase` frame per phase under the root (`phased`) as one tree whose
    phases are kept in a `PhaseTable`. `names` maps each phase frame's name to the phase it
    belongs to (several frames may make one phase: the recorder's warm-up is start-up or steady
    state, whether the program had steps); frames it does not name keep their own name."""
    cct = phased.cct
    is_phase = np.fromiter((f.kind == PHASE_KIND for f in phased.frames), dtype=bool, count=len(phased.frames))
    if not is_phase.any():
        return phased
    own = np.zeros(len(phased.frames), dtype=I64) - 1
    order: list[str] = [p for p in PHASES]
    for fid in np.flatnonzero(is_phase).tolist():
        final = names.get(phased.frames[fid].name, phased.frames[fid].name)
        if final not in order:
            order.append(final)
        own[fid] = order.index(final)
    mark = is_phase[cct.frame]
    mark[0] = False
    top = nearest_marked(cct, mark)
    node_phase = np.where(top >= 0, own[cct.frame[np.maximum(top, 0)]], -1)
    bparent, bframe, node_map = merge_map(cct, mark)
    exc = sum_rows(node_map, cct.exclusive, len(bparent))
    acts = phased.activities
    act = replace(acts, node=node_map[acts.node])
    merged = replace(phased, cct=CCT(bparent, bframe, exc), activities=act)
    # Rows per (merged node, phase): two phase frames of one phase merge their nodes' rows.
    has = (node_phase >= 0) & cct.exclusive.any(axis=1)
    idx = np.flatnonzero(has)
    key = node_map[idx] * len(order) + node_phase[idx]
    uniq, inv = np.unique(key, return_inverse=True)
    rows = sum_rows(inv, cct.exclusive[idx], len(uniq))
    table_node, table_phase = uniq // len(order), uniq % len(order)
    act_phase = node_phase[acts.node] if len(acts) else np.zeros(0, I64)
    # Each phase's sync time in its figures, which outlive the table (a view's transformations
    # leave it behind; the header reads meta).
    phases: dict[str, PhaseMeta] = {k: PhaseMeta(**v) for k, v in (merged.meta.phases or {}).items()
                                    if isinstance(v, dict)}
    for k, name in enumerate(order):
        if name in phases:
            phases[name]["sync"] = int(rows[table_phase == k, COL["sync_time"]].sum())
    if phases:
        merged = replace(merged, meta=replace(merged.meta, phases=phases))
    # Drop what is now empty (frames of the phase nodes), keeping the table's ids in step.
    return _with_table(merged, tuple(order), table_node, table_phase, rows, act_phase)


def _with_table(profile: Profile, names: tuple[str, ...], node: np.ndarray, phase: np.ndarray,
                exclusive: np.ndarray, act_phase: np.ndarray) -> Profile:
    """`profile` pruned of empty nodes and unused frames, with its phase table renumbered to match."""
    cct = profile.cct
    keep = np.asarray(cct.inclusive.any(axis=1), dtype=bool)
    keep[0] = True
    new_id = np.cumsum(keep) - 1
    out = prune_empty(profile)
    table = PhaseTable(names, new_id[node], phase.astype(I64), exclusive, act_phase.astype(I64), out.cct,
                       out.activities)
    return replace(out, phases=table)


def phase_profile_rows(profile: Profile) -> PhaseTable:
    """The profile's table, or one that puts all of it in the steady state (a profile without
    phases is all steady state): what a merge of ranks concatenates."""
    t = table_of(profile)
    if t is not None:
        return t
    cct = profile.cct
    nz = np.flatnonzero(cct.exclusive.any(axis=1))
    return PhaseTable(PHASES, nz, np.full(len(nz), PHASES.index(STEADY), I64), cct.exclusive[nz],
                      np.full(len(profile.activities), PHASES.index(STEADY), I64), cct, profile.activities)


def select_phase(profile: Profile, name: str) -> Profile:
    """Phase `name` as a profile of its own: the same tree with that phase's metrics (nodes
    left empty dropped), its activities, and its window and GPU idle figures in meta (per rank
    too). `all`, or a profile without phases, gives the profile as it is (a profile without
    phases is all steady state; its other phases are empty)."""
    name = phase_name(name)
    t = table_of(profile)
    if name == ALL:
        return profile
    if t is None:
        if name == STEADY:
            return profile
        t = phase_profile_rows(profile)
    nodes, rows = t.rows(name)
    exc = np.zeros_like(profile.cct.exclusive)
    if len(nodes):
        np.add.at(exc, nodes, rows)
    acts = profile.activities
    k = t.names.index(name) if name in t.names else -2
    sel = t.activity_phase == k
    act = Activities(**{f: getattr(acts, f)[sel] for f in acts.__dataclass_fields__})
    meta = phase_meta(profile.meta, name)
    out = replace(profile, cct=CCT(profile.cct.parent, profile.cct.frame, exc), activities=act, meta=meta,
                  phases=None)
    return prune_empty(out)


def phase_meta(meta: Header, name: str) -> Header:
    """`meta` as phase `name`'s: its window (with its `wall`, the time spent in the phase) and its
    GPU idle figures in place of the run's, for the profile and each merged rank; `phase` names it."""
    def one(m: Header) -> Header:
        ph = (m.phases or {}).get(name)
        if isinstance(ph, dict):
            gi = ph.get("gpu_idle")
            win: Window = {**(ph.get("window") or Window()), "wall": int(ph.get("wall", 0))}
            return replace(m, window=win, gpu_idle=gi if isinstance(gi, dict) else None)
        if m.phases:
            # the run had no such phase
            return replace(m, window=Window(start=0, end=0, wall=0), gpu_idle=None)
        return replace(m)

    out = one(meta)
    if meta.ranks is not None:
        out.ranks = [one(r) for r in meta.ranks]
    out.phase = name
    return out


@dataclass(frozen=True)
class PhaseFigures:
    """One phase's time: `wall` (ns of the run in it, the longest of the ranks'), its GPU busy and
    idle time over the devices' time in it, and the host's sync time in it."""

    name: str
    wall: int
    device_time: int = 0
    busy: int | None = None
    idle: int | None = None
    sync: int = 0

    @property
    def busy_share(self) -> float | None:
        return self.busy / self.device_time if self.busy is not None and self.device_time else None


def phase_figures(profile: Profile) -> list[PhaseFigures]:
    """The phases the run went through, in order, with their figures; [] for a profile without
    phase figures (an older profile, a trace without steps)."""
    metas = profile.meta.per_rank()
    if not any(m.phases for m in metas):
        return []
    t = table_of(profile)
    out = []
    for name in PHASES:
        walls = [int((m.phases or {}).get(name, {}).get("wall", 0)) for m in metas]
        if not max(walls, default=0):
            continue
        dev = busy = idle = 0
        known = False
        for m in metas:
            gi = ((m.phases or {}).get(name) or {}).get("gpu_idle")
            if isinstance(gi, dict):
                known = True
                dev += sum(int(d.get("window", 0)) for d in (gi.get("devices") or {}).values())
                busy += int(gi.get("busy", 0))
                idle += int(gi.get("idle", 0))
        sync = sum(int((m.phases or {}).get(name, {}).get("sync", 0)) for m in metas)
        if t is not None and not sync:
            _, rows = t.rows(name)
            sync = int(rows[:, COL["sync_time"]].sum()) if len(rows) else 0
        out.append(PhaseFigures(name, max(walls), dev, busy if known else None, idle if known else None, sync))
    return out


__all__ = ["ALL", "COMPILE", "PHASES", "PHASE_CHOICES", "STARTUP", "STEADY", "PhaseFigures", "PhaseTable",
           "has_phases", "phase_figures", "phase_frame", "phase_meta", "phase_name", "phase_profile_rows",
           "select_phase", "split_phases", "table_of"]
