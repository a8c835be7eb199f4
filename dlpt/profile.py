"""A profile in memory: frames, the calling-context tree, the GPU activities beneath it, and
what is known about the run. Collectors make one; the store saves and loads it; views and
viewers only read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlpt.cct import CCT
from dlpt.frames import Frame
from dlpt.header import Header
from dlpt.metrics import COL, REGISTRY, fmt_metric

ACTIVITY_COLUMNS = ("node", "kind", "name", "device", "stream", "start", "duration", "bytes", "count")


@dataclass
class Activities:
    """GPU activities (struct of arrays). `name` is the frame id of the activity's leaf frame,
    whose name is the kernel or copy name. An imported trace has one row per activity (`count`
    1, `start` in absolute nanoseconds); a recording aggregates online, one row per (node,
    name) with `count` activities, their total `duration` and `bytes`, and `start` 0."""

    node: np.ndarray
    kind: np.ndarray
    name: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    bytes: np.ndarray
    count: np.ndarray | None = None  # None: one activity per row

    def __post_init__(self) -> None:
        if self.count is None:
            self.count = np.ones(len(self.node), dtype=np.int64)

    @classmethod
    def empty(cls) -> Activities:
        return cls(*(np.zeros(0, dtype=np.int64) for _ in ACTIVITY_COLUMNS))

    def __len__(self) -> int:
        return len(self.node)


@dataclass(frozen=True)
class PhaseTable:
    """Each phase's exclusive metrics per node of one tree, and each activity row's phase.

    `node`, `phase` and `exclusive` are rows: node id, phase index into `names`, that node's
    exclusive metrics in that phase (a node may have a row per phase; a node of no phase — a row
    its collector could place in none — has none). `activity_phase` has one entry per activity
    row (-1: none). `cct` and `activities` are the objects the ids index: a transformation that
    makes a new tree leaves the table behind (`dlpt.phases.table_of` checks them). Made and read
    by dlpt/phases.py; kept here beside the profile that holds it."""

    names: tuple[str, ...]
    node: np.ndarray
    phase: np.ndarray
    exclusive: np.ndarray
    activity_phase: np.ndarray
    cct: CCT
    activities: Activities

    def rows(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, exclusive rows) of phase `name`; empty when the run had none of it."""
        if name not in self.names:
            return np.zeros(0, np.int64), np.zeros((0, self.exclusive.shape[1]), np.int64)
        sel = self.phase == self.names.index(name)
        return self.node[sel], self.exclusive[sel]


@dataclass
class Profile:
    frames: list[Frame]
    cct: CCT
    activities: Activities = field(default_factory=Activities.empty)
    meta: Header = field(default_factory=Header)  # what is known about the run (dlpt/header.py)
    sources: dict[str, str] = field(default_factory=dict)  # file name → its text, as recorded
    path: str = ""
    # Each phase's metrics (dlpt/phases.py): read through `dlpt.phases.table_of`, which checks
    # that the table indexes this profile's own tree.
    phases: PhaseTable | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        # `meta` given as a dict (user code, tests, profiles built by hand: Profile.meta was one)
        # becomes the typed header, here at its one door, so every reader can trust it is one.
        if name == "meta" and not isinstance(value, Header):
            value = Header.from_dict(value)
        object.__setattr__(self, name, value)

    @property
    def collector(self) -> str:
        """What made the profile: `record` for `dlpt record`, `kineto` for an imported trace,
        `mixed` for ranks of both merged (stored as `meta.source`). Not to be confused with
        `sources`, the text of the program's files."""
        return self.meta.source if self.meta.source is not None else "kineto"

    def __repr__(self) -> str:
        """One short line (the dataclass's own repr would print every array). In a notebook the
        HTML view shows instead (`_repr_html_`, bound by the `dlpt` package)."""
        metric = default_metric(self)
        total = int(self.cct.exclusive[:, COL[metric]].sum()) if len(self.cct) else 0
        name = self.path or self.meta.command or "in memory"
        value = fmt_metric(metric, total)
        return (f"<dlpt.Profile {name!r} ({self.collector}): {len(self.cct):,} nodes, "
                f"{len(self.activities):,} activity rows, {metric} {value}>")

    def frame_of(self, node: int) -> Frame:
        return self.frames[int(self.cct.frame[node])]

    def call_path(self, node: int) -> list[Frame]:
        return [self.frame_of(i) for i in self.cct.path(node)]

    def source_line(self, file: str, line: int) -> str:
        """The text of a line from the profile's source snapshot ('' when it was not stored)."""
        text = self.sources.get(file)
        if not text or line <= 0:
            return ""
        lines = text.splitlines()
        return lines[line - 1].strip() if line <= len(lines) else ""


def default_metric(*profiles: Profile) -> str:
    """The metric every view ranks by when the user names none: `gpu_time` when any of the
    profiles has GPU activity; else `host_time` (wall-clock time on each line: pure Python, sleeps
    and ops alike, what a CPU profiler shows) when the recording sampled it; else `cpu_time`
    (host ops' self time) when any has host op time, as older CPU recordings and traces have;
    else the first metric of the registry that has values (GPU memory alone, a metric of a
    newer collector); else `gpu_time`. Reports, exports, the TUI, diffs and GraphFrames all
    start from this one rule, so they agree on what a profile shows."""
    tot = sum((p.cct.exclusive.sum(axis=0) for p in profiles), np.zeros(len(COL), dtype=np.int64))
    for m in ("gpu_time", "host_time", "cpu_time", *(r.name for r in REGISTRY)):
        if tot[COL[m]]:
            return m
    return "gpu_time"


def unknown_device_events(*profiles: Profile) -> dict[str, int]:
    """{category: count}, most first, of the device events of kinds dlpt does not read that the
    importer skipped (meta `unknown_device_events`, collectors/kineto/columns.py), over the
    profiles: a trace of hardware dlpt does not know has its work there, not in `kernel`."""
    out: dict[str, int] = {}
    for p in profiles:
        for cat, n in (p.meta.unknown_device_events or {}).items():
            out[cat] = out.get(cat, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def unknown_device_text(counts: dict[str, int], limit: int = 5) -> str:
    """`456,123 device events of unknown kinds skipped: mtia_kernel (456,000), foo (123)`."""
    total = sum(counts.values())
    # Category names come from the file: escape what a terminal would act on.
    kinds = [f"{cat if cat.isprintable() else cat.encode('unicode_escape').decode()} ({n:,})"
             for cat, n in list(counts.items())[:limit]]
    if len(counts) > limit:
        kinds.append(f"{len(counts) - limit} more kinds")
    return f"{total:,} device event{'s' if total != 1 else ''} of unknown kinds skipped: {', '.join(kinds)}"
