"""GPU memory from a Kineto trace's `[memory]` events (torch.profiler's `profile_memory=True`).

Each `[memory]` event is one call of the caching allocator, on the host thread that made it:
"Bytes" (negative for a free), "Addr", "Device Type" (1: CUDA, 6: HIP), "Device Id", and the allocator's
totals after it, "Total Allocated" and "Total Reserved". An event belongs where the host was on
its thread at that moment: the innermost host span around it (an op, or a Python function
where the trace has stacks), so that backward allocations sit under `[backward]` below their
forward line as the kernels do. dlpt/memory.py then matches frees to allocations and attributes
each device's peak. Events before the trace's window (its first host span or GPU activity) and
frees of blocks allocated before it belong to the named remainder; events on a thread with no
span around them to a named row of their own.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns
from dlpt.frames import FrameTable, unattributed_frame
from dlpt.header import Header
from dlpt.memory import BEFORE_RECORDING, attribute, node_place, timeline

MEMORY_EVENT = "[memory]"
# c10::DeviceType as Kineto writes "Device Type": CUDA, and HIP, which ROCm builds of torch record
# for the same caching allocator's events (a TraceLens MI300X trace).
GPU_DEVICE_TYPES = (1, 6)
NO_SPAN = "memory outside any op"
PROFILER_STEP = "ProfilerStep#"


def _ns(x: object) -> int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return None
    return round(x * 1000)


class MemoryEvents:
    """The GPU (CUDA, HIP) `[memory]` events of a trace, in event order, a chunk at a time (`add`)."""

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.key: list[tuple] = []  # (pid, tid)
        self.device: list[int] = []
        self.addr: list[int] = []
        self.nbytes: list[int] = []
        self.total: list[int] = []
        self.reserved: list[int] = []
        self.other = 0  # host (CPU) memory events: not GPU memory
        self.damaged = 0
        self.meta = Header()  # its `memory` and `timeline`, for the profile's (add_meta)

    def add(self, events: list) -> None:
        for e in events:
            if e.name != MEMORY_EVENT or e.ph != "i":
                continue
            a = e.args
            if a is None:
                self.damaged += 1
                continue
            if a.device_type not in GPU_DEVICE_TYPES:
                self.other += 1
                continue
            t = _ns(e.ts)
            if t is None or a.addr < 0 or a.device_id < 0:
                self.damaged += 1
                continue
            self.ts.append(t)
            self.key.append((e.pid, e.tid))
            self.device.append(a.device_id)
            self.addr.append(a.addr)
            self.nbytes.append(a.mem_bytes)
            self.total.append(a.total_allocated)
            self.reserved.append(a.total_reserved)

    def __len__(self) -> int:
        return len(self.ts)


def _innermost(starts: list[int], members: list[int], end_l: list[int], parent: list[int], ts: int) -> int:
    """The innermost span of one thread around time ts: the last span to start at or before it,
    or the nearest of its enclosing spans still open then (spans nest); -1 for none."""
    k = bisect.bisect_right(starts, ts) - 1
    j = members[k] if k >= 0 else -1
    while j >= 0 and end_l[j] < ts:
        j = parent[j]
    return j


def place_memory(mem: MemoryEvents, thread_ids: dict[tuple, int], thread: np.ndarray, start: np.ndarray,
                 order: np.ndarray, parent: list[int], end_l: list[int], names: list[str],
                 node_of_span: Callable[[int], int], builder: TreeBuilder, frames: FrameTable, base: int,
                 window_start: int | None, out: ActivityColumns) -> None:
    """alloc_bytes, alloc_count and peak_bytes into `out.extra` (builder node ids), the memory
    meta into `mem.meta`. Spans: their thread, start, nesting order (by thread, then start),
    parent and clipped end, as the linker made them."""
    if not len(mem):
        return
    by_thread: dict[int, tuple[list[int], list[int]]] = {}
    th_sorted = thread[order]
    for t in np.unique(th_sorted).tolist():
        sel = order[th_sorted == t]
        by_thread[t] = (start[sel].tolist(), sel.tolist())
    n = len(mem)
    span_of = np.full(n, -1, dtype=np.int64)
    node = np.full(n, -1, dtype=np.int64)
    no_span = -1
    for i, (key, at) in enumerate(zip(mem.key, mem.ts)):
        if window_start is not None and at < window_start:
            continue  # before the window: the remainder's
        t = thread_ids.get(key, -1)
        j = _innermost(*by_thread[t], end_l, parent, at) if t in by_thread else -1
        if j >= 0:
            span_of[i] = j
            node[i] = node_of_span(j)
        else:
            if no_span < 0:
                no_span = builder.child(base, frames.intern(unattributed_frame(NO_SPAN)))
            node[i] = no_span
    before_node = builder.child(base, frames.intern(unattributed_frame(BEFORE_RECORDING)))
    # In time order: threads' events interleave, and a trace may list one out of place; the
    # allocator's totals follow its calls in time.
    ts = np.asarray(mem.ts, dtype=np.int64)
    o = np.argsort(ts, kind="stable")
    ts, node, span_of = ts[o], node[o], span_of[o]
    total = np.asarray(mem.total, dtype=np.int64)[o]
    reserved = np.asarray(mem.reserved, dtype=np.int64)[o]
    device = np.asarray(mem.device, dtype=np.int64)[o]
    res = attribute(len(builder), device, np.asarray(mem.addr, dtype=np.int64)[o],
                    np.asarray(mem.nbytes, dtype=np.int64)[o], node, total=total, reserved=reserved)
    res.peak_bytes[before_node] += res.before
    for metric, col in (("alloc_bytes", res.alloc_bytes), ("alloc_count", res.alloc_count),
                        ("peak_bytes", res.peak_bytes)):
        nz = np.flatnonzero(col)
        out.extra[metric] = (nz, col[nz])
    figures = res.meta()
    figures["host_memory_events"] = mem.other
    figures["damaged_memory_events"] = mem.damaged
    top = max(res.devices, key=lambda d: res.devices[d].peak_allocated)
    pk = res.devices[top].index
    figures["peak_at"] = node_place(builder.parent, builder.frame, frames, int(node[pk])) if node[pk] >= 0 else BEFORE_RECORDING
    figures["peak_step"] = _step_at(span_of[pk], parent, names)
    mem.meta.memory = figures
    on = device == top
    ts = ts[on]
    t0, t1 = int(ts.min()), int(ts.max()) + 1
    alloc_series = timeline(ts, np.maximum(total[on], 0), t0, t1)
    mem.meta.timeline = {"mem_t": np.linspace(0, t1 - t0, len(alloc_series) + 1)[:-1].astype(np.int64).tolist(),
                            "allocated": alloc_series, "reserved": timeline(ts, np.maximum(reserved[on], 0), t0, t1),
                            "mem_device": top}


def add_meta(meta: Header, mem: MemoryEvents) -> None:
    """The memory meta into a profile's; the timeline's keys beside those already there."""
    if mem.meta.memory is not None:
        meta.memory = mem.meta.memory
    if mem.meta.timeline is not None:
        if meta.timeline is not None:
            meta.timeline.update(mem.meta.timeline)  # beside the busy fraction's keys
        else:
            meta.timeline = mem.meta.timeline


def _step_at(span: int, parent: list[int], names: list[str]) -> int | None:
    """The profiler step (`ProfilerStep#N` annotation) around a span, if any."""
    j = int(span)
    while j >= 0:
        if names[j].startswith(PROFILER_STEP):
            try:
                return int(names[j][len(PROFILER_STEP):])
            except ValueError:
                return None
        j = parent[j]
    return None
