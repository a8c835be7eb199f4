"""Why the GPU waits, in an imported trace: `host_time`, `sync_time` and `gpu_idle_time` on the
nodes of the linked tree, and the window/idle figures of the profile's meta (dlpt/idle.py has
the rule and the meta contract).

- `host_time`: the self time of each `python_function` event (its duration less that of the
  Python events directly inside it, ops included in it): the time its line was the innermost.
- `sync_time`: the duration of each runtime `*Synchronize` event (CUDA's stream, device, event
  synchronize, the driver's and HIP's), on the node of the op or Python event around it.
- `gpu_idle_time`: per device, the window runs from its first activity's start to its last one's
  end; busy is the union of its kernels, copies and memsets; idle is blamed (`dlpt.idle.blame`)
  on the self intervals of the innermost Python, op and annotation events of the threads that
  call the CUDA runtime, and a synchronize's own interval counts as sync.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dlpt.cct import TreeBuilder, add_exact, distinct
from dlpt.collectors.assembly import ActivityColumns
from dlpt.collectors.kineto.columns import GpuRows
from dlpt.collectors.kineto.decode import LAUNCH, PY
from dlpt.frames import FrameTable
from dlpt.header import Header
from dlpt.idle import activity_windows, blame, idle_column, split_by_device, timeline

if TYPE_CHECKING:
    from dlpt.collectors.kineto.link import _Spans

I64 = np.int64
# cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cuStreamSynchronize,
# cuCtxSynchronize, hipStreamSynchronize, hipDeviceSynchronize, ...
_SYNC = re.compile(r"^(cuda|cu|hip)\w*Synchronize$")


def is_sync_call(name: str) -> bool:
    """Is this runtime or driver call a synchronize, where the host blocks until the GPU is done?"""
    return _SYNC.match(name) is not None


def _nearest(par: np.ndarray, selected: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For each span in idx, its nearest ancestor among the `selected` spans, or -1; all spans at
    once, one level per step."""
    q = par[idx].copy()
    climb = np.flatnonzero(q >= 0)
    climb = climb[~selected[q[climb]]]
    while len(climb):
        q[climb] = par[q[climb]]
        climb = climb[q[climb] >= 0]
        climb = climb[~selected[q[climb]]]
    return q


def python_self_time(spans: _Spans) -> tuple[np.ndarray, np.ndarray]:
    """(Python spans, their self time): duration less that of the nearest Python spans inside."""
    par = np.asarray(spans.parent, dtype=I64)
    dur = spans.end - spans.start
    py = spans.kind == PY
    idx = np.flatnonzero(py)
    anc = _nearest(par, py, idx)
    child = np.zeros(len(par), dtype=I64)
    has = anc >= 0
    add_exact(child, anc[has], dur[idx[has]])
    return idx, np.maximum(dur[idx] - child[idx], 0)


def self_intervals(spans: _Spans, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, span) of the pieces of time during which each selected span is the innermost
    selected span open on its thread. Spans nest on their thread (nest.py), so the
    owner changes only at a boundary: a span's start hands the time to it, its end back to its
    nearest selected ancestor. At equal times ends come before starts, inner ends first and
    outer starts first (their positions in `spans.order`), so the last event at a time leaves
    the right owner; zero-length pieces are dropped."""
    start, end, thread = spans.start, spans.end, spans.thread
    idx = np.flatnonzero(selected & (end > start))
    if not len(idx):
        z = np.zeros(0, dtype=I64)
        return z, z, z
    sel = np.zeros(len(start), dtype=bool)
    sel[idx] = True
    par = np.asarray(spans.parent, dtype=I64)
    anc = _nearest(par, sel, idx)
    del sel
    # One tie key for (end before start, inner end first, outer start first): the span's
    # position in `spans.order`, negated for ends, starts shifted above every end.
    pos = np.empty(len(start), dtype=I64)
    pos[spans.order] = np.arange(len(spans.order))
    tie = np.r_[pos[idx] + I64(len(start) + 1), -pos[idx]]
    del pos
    t = np.r_[start[idx], end[idx]]
    th = np.r_[thread[idx], thread[idx]]
    o = np.lexsort((tie, t, th))
    del tie
    t, th = t[o], th[o]
    owner = np.r_[idx, anc][o]
    del o
    keep = (th[:-1] == th[1:]) & (t[1:] > t[:-1]) & (owner[:-1] >= 0)
    del th
    k = np.flatnonzero(keep)
    return t[k], t[k + 1], owner[k]


def wait_metrics(spans: _Spans, raw_end: np.ndarray, node_ids: Callable[[np.ndarray], np.ndarray],
                 gpu: GpuRows,
                 builder: TreeBuilder, frames: FrameTable, base: int, base_ns: int, out: ActivityColumns,
                 meta: Header, launch: np.ndarray | None = None) -> None:
    """Add host_time, sync_time and gpu_idle_time to `out.extra` (nodes made in `builder` as
    needed, idle's named rows under `base`) and the window, gpu_idle and timeline figures to
    `meta`. `node_ids` gives the tree nodes of spans (the linker makes them on demand).
    `raw_end` is each span's end before nesting clipped it: a synchronize counts whole.
    `launch` (each GPU row's launch span, -1 for none) tells when each GPU activity was launched
    (the launch call's end): idle while launched work waited to start is `queued`, not the host's
    (dlpt/idle.py)."""
    kind, start = spans.kind, spans.start
    launches = np.flatnonzero(kind == LAUNCH)
    sync = np.zeros(len(kind), dtype=bool)
    sync[launches] = spans.names_where(is_sync_call)[launches]
    sync_idx = np.flatnonzero(sync)
    out.extra["sync_time"] = (node_ids(sync_idx), np.maximum(raw_end[sync_idx] - start[sync_idx], 0))
    py_idx, py_self = python_self_time(spans)
    has = py_self > 0
    out.extra["host_time"] = (node_ids(py_idx[has]), py_self[has])

    # GPU busy per device, in the spans' clock (ns from the trace's base time).
    g_dev, g_start = gpu.device, gpu.start
    g_end = g_start + gpu.dur
    skipped: dict[str, int] = {}
    busy = split_by_device(g_dev, g_start, g_end, skipped)
    windows = activity_windows(busy)
    ready = None
    if launch is not None:
        has = launch >= 0
        # Queued once the launch call returned: the call's own time is the host's.
        launched = np.where(has, raw_end[np.maximum(launch, 0)], g_start)
        ready = split_by_device(g_dev[has], launched[has], g_start[has])
    if not windows:
        if len(kind):  # no GPU work: the window is the host's
            meta.window = {"start": base_ns + int(start.min()), "end": base_ns + int(raw_end.max())}
        return
    # Host intervals: the threads that call the runtime, their innermost Python, op and
    # annotation spans, and their synchronize calls (a launch's own time is its op's).
    launching = np.isin(spans.thread, distinct(spans.thread[launches]))
    chosen = launching & ((kind != LAUNCH) | sync)
    hs, he, owner = self_intervals(spans, chosen)
    h_node = node_ids(owner)
    res = blame(len(builder), windows, busy, hs, he, h_node, spans.thread[owner], sync[owner], ready)
    res.skipped.update(skipped)
    out.extra["gpu_idle_time"] = idle_column(res, builder, frames, base)
    w0 = min(w[0] for w in windows.values())
    w1 = max(w[1] for w in windows.values())
    meta.window = {"start": base_ns + w0, "end": base_ns + w1}
    meta.gpu_idle = res.meta()
    meta.timeline = timeline(windows, busy, w0, w1)
