"""Columns → `Profile`: the assembly both collectors end in (the Kineto importer's linker and
the recorder's trie converter fill `ActivityColumns` beside a `TreeBuilder`; `build_profile`
renumbers the tree and totals every node's metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import FrameTable
from dlpt.header import Header
from dlpt.metrics import COL, collective_mask, exclusive_matrix
from dlpt.profile import Activities, Profile
from dlpt.transforms import prune_empty


@dataclass
class ActivityColumns:
    """What a collector hands over: activity rows and per-node metrics (node ids are the
    builder's, before its preorder renumbering)."""

    node: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    name: list[int] = field(default_factory=list)
    device: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    duration: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)  # activities per row; empty: one each
    cpu_node: list[int] | np.ndarray = field(default_factory=list)
    cpu_self: list[int] | np.ndarray = field(default_factory=list)
    # Further metric columns by name (host_time, sync_time, gpu_idle_time, ...): builder node ids
    # and their values, totalled per node like the rest.
    extra: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    skipped: int = 0


def build_profile(builder: TreeBuilder, frames: FrameTable, cols: ActivityColumns, meta: Header) -> Profile:
    """Renumber the tree in preorder and total the metrics of every node."""
    parent, frame, new_of_old = builder.preorder()
    i64 = np.int64
    act = Activities(
        node=new_of_old[np.asarray(cols.node, dtype=i64)] if cols.node else np.zeros(0, i64),
        kind=np.asarray(cols.kind, dtype=i64), name=np.asarray(cols.name, dtype=i64),
        device=np.asarray(cols.device, dtype=i64), stream=np.asarray(cols.stream, dtype=i64),
        start=np.asarray(cols.start, dtype=i64), duration=np.asarray(cols.duration, dtype=i64),
        bytes=np.asarray(cols.nbytes, dtype=i64),
        count=np.asarray(cols.count, dtype=i64) if cols.count else None,
    )
    cpu_node = new_of_old[np.asarray(cols.cpu_node, dtype=i64)] if len(cols.cpu_node) else np.zeros(0, i64)
    exc = exclusive_matrix(len(parent), act.node, act.kind, act.duration, act.bytes,
                           cpu_node, np.asarray(cols.cpu_self, dtype=i64), act.count,
                           collective=collective_mask(frames.frames, act.name, act.kind))
    for metric, (nodes, values) in cols.extra.items():
        if len(nodes):
            exc[:, COL[metric]] += np.bincount(new_of_old[np.asarray(nodes, dtype=i64)],
                                               weights=np.asarray(values, dtype=i64),
                                               minlength=len(parent)).astype(i64)
    # Nodes with nothing beneath them (a call that reached no op or GPU work) say nothing.
    return prune_empty(Profile(frames=list(frames.frames), cct=CCT(parent, frame, exc), activities=act, meta=meta))
