"""GPU memory by line from a list of allocator events: what each node allocated, and what it
still held at the device's peak (DESIGN §9, "Memory"). Pure numpy, exact integers.

An event is (device, address, signed bytes, node): bytes > 0 allocate, bytes < 0 free. Each
free is matched to the allocation it ends — the latest earlier event at the same address on
the same device, when that one is an allocation (a caching allocator never hands out a live
address twice). What cannot be matched belongs to memory allocated before the recording: a
free with no allocation before it, and allocations made before the window (node -1). Those
bytes are a named remainder, `BEFORE_RECORDING`; they never make a node's figure negative.

The peak of a device is the first moment its allocated total is highest: the allocator's own
counter when the events carry it (a trace's "Total Allocated"), else the in-window live bytes
plus the remainder still live. At that moment, each in-window allocation still live counts in
its node's `peak_bytes`; the sum over nodes plus the remainder at the peak is the peak.

The recorder computes the same figures online in its native part (collectors/native/memory.h);
this module is how imported traces get them, and the oracle the tests check the recorder with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlpt.frames import FrameTable, is_library

I64 = np.int64
# The named row (kind `unattributed`) that holds memory allocated before the recording began.
BEFORE_RECORDING = "allocated before the recording"
# Most points a memory-over-time series keeps (the TUI and the report draw a few hundred).
TIMELINE_POINTS = 2000


@dataclass
class DevicePeak:
    """One device's peak: the allocated total, the event at which it was first reached, the
    remainder from before the recording live then, and the reserved peak where known."""

    peak_allocated: int = 0
    index: int = -1  # position of the peak's event in the input, -1 without events
    before: int = 0
    peak_reserved: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "before_recording": self.before}


@dataclass
class MemoryResult:
    """Per node (the ids the events name): bytes and number of allocations in the window, and
    bytes live at each device's peak, summed over devices. Per device: its peak."""

    alloc_bytes: np.ndarray
    alloc_count: np.ndarray
    peak_bytes: np.ndarray
    devices: dict[int, DevicePeak] = field(default_factory=dict)
    unmatched_frees: int = 0  # frees with no allocation in the window: counted in the remainder

    @property
    def before(self) -> int:
        """Bytes from before the recording live at the devices' peaks, all devices together."""
        return sum(d.before for d in self.devices.values())

    @property
    def peak_allocated(self) -> int:
        return sum(d.peak_allocated for d in self.devices.values())

    def meta(self) -> dict[str, Any]:
        return {"peak_allocated": self.peak_allocated,
                "peak_reserved": sum(d.peak_reserved for d in self.devices.values()),
                "before_recording": self.before, "unmatched_frees": self.unmatched_frees,
                "devices": {str(k): v.to_dict() for k, v in sorted(self.devices.items())}}


def _lifetimes(addr: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(end, matched) of one device's events in time order: for an allocation, the position of
    the next event at its address (its free, or an allocation that shows the free was missed),
    len(addr) when it outlives the events; for a free, whether an allocation precedes it."""
    n = len(addr)
    order = np.lexsort((np.arange(n), addr))
    a_s, b_s = addr[order], nbytes[order]
    same_next = np.r_[a_s[1:] == a_s[:-1], False]
    end = np.empty(n, dtype=I64)
    end[order] = np.where(same_next, np.r_[order[1:], n], n)
    matched = np.zeros(n, dtype=bool)
    matched[order] = np.r_[False, same_next[:-1] & (b_s[:-1] > 0)]
    return end, matched


def _running(n: int, at: np.ndarray, until: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Bytes live after each of n events, for blocks of `size` live from event `at` up to (not
    after) event `until`."""
    up = np.bincount(at, weights=size, minlength=n + 1)
    down = np.bincount(until, weights=size, minlength=n + 1)
    return np.cumsum(np.rint(up - down).astype(I64))[:n]


def attribute(n_nodes: int, device: np.ndarray, addr: np.ndarray, nbytes: np.ndarray, node: np.ndarray,
              total: np.ndarray | None = None, reserved: np.ndarray | None = None,
              base: dict[int, int] | None = None) -> MemoryResult:
    """The memory metrics of events in time order (see the module's docstring).

    `total`: the allocator's allocated total after each event, -1 where unknown; `reserved`: its
    reserved total likewise; `base`: bytes allocated before the recording per device, where known
    (the remainder is at least what the unmatched frees need, so it never goes negative)."""
    device = np.asarray(device, dtype=I64)
    addr = np.asarray(addr, dtype=I64)
    nbytes = np.asarray(nbytes, dtype=I64)
    node = np.asarray(node, dtype=I64)
    res = MemoryResult(np.zeros(n_nodes, I64), np.zeros(n_nodes, I64), np.zeros(n_nodes, I64))
    keep = nbytes != 0
    for d in np.unique(device[keep]).tolist():
        idx = np.flatnonzero(keep & (device == d))
        a, b, nd = addr[idx], nbytes[idx], node[idx]
        n = len(idx)
        end, matched = _lifetimes(a, b)
        alloc = b > 0
        mine = alloc & (nd >= 0)
        ai = np.flatnonzero(mine)
        res.alloc_bytes += np.bincount(nd[ai], weights=b[ai], minlength=n_nodes).astype(I64)
        res.alloc_count += np.bincount(nd[ai], minlength=n_nodes).astype(I64)
        live = _running(n, ai, end[ai], b[ai])
        old = np.flatnonzero(alloc & (nd < 0))
        lone = np.flatnonzero(~alloc & ~matched)
        res.unmatched_frees += len(lone)
        # The remainder from before the recording: its allocations in, its frees (and frees of
        # blocks never seen allocated) out, from a base large enough that it never goes negative.
        held = _running(n, old, end[old], b[old]) - np.cumsum(np.bincount(lone, weights=-b[lone], minlength=n)
                                                               .astype(I64))[:n]
        floor = max(0, -int(held.min())) if n else 0
        held = held + max(floor, int((base or {}).get(d, 0)))
        tot = total[idx] if total is not None else None
        if tot is not None and (tot >= 0).all():
            # The allocator's counter is the truth; what it holds beyond the in-window live
            # blocks is the remainder.
            peak_i = int(np.argmax(tot))
            peak = int(tot[peak_i])
            before = max(0, peak - int(live[peak_i]))
        else:
            t = live + held
            peak_i = int(np.argmax(t))
            peak = int(t[peak_i])
            before = int(held[peak_i])
        at_peak = ai[(ai <= peak_i) & (end[ai] > peak_i)]
        res.peak_bytes += np.bincount(nd[at_peak], weights=b[at_peak], minlength=n_nodes).astype(I64)
        rv = reserved[idx] if reserved is not None else None
        res.devices[int(d)] = DevicePeak(peak, int(idx[peak_i]), before,
                                         int(rv.max()) if rv is not None and len(rv) else 0)
    return res


def node_place(parent: list[int], frame: list[int], frames: FrameTable, node: int) -> str:
    """A node's place for a headline: its innermost source line outside library code (`file:line`;
    the innermost library line where there is none), else, where there
    are no Python frames (a trace without stacks), its outermost op (`aten::linear`, not the
    `aten::empty` inside it), else its own name."""
    outer = ""
    innermost = ""
    n = node
    while n > 0:
        f = frames[frame[n]]
        if f.has_source:
            if not is_library(f):  # the user's line, as every view shows it with library frames hidden
                return f"{f.file}:{f.line}"
            innermost = innermost or f"{f.file}:{f.line}"
        if f.kind in ("op", "python", "unattributed"):
            outer = f.name
        n = parent[n]
    return innermost or outer


def running_total(device: np.ndarray, addr: np.ndarray, nbytes: np.ndarray, which: int) -> np.ndarray:
    """One device's in-window allocated total after each of its events (matched frees only), for
    a memory-over-time picture where the events carry no totals."""
    sel = (np.asarray(device) == which) & (np.asarray(nbytes) != 0)
    a, b = np.asarray(addr, dtype=I64)[sel], np.asarray(nbytes, dtype=I64)[sel]
    end, _ = _lifetimes(a, b)
    ai = np.flatnonzero(b > 0)
    return _running(len(a), ai, end[ai], b[ai])


def timeline(t: np.ndarray, values: np.ndarray, t0: int, t1: int, points: int = TIMELINE_POINTS) -> list[int]:
    """A series sampled at events (times `t`, each value holding until the next event) as at
    most `points` bins over [t0, t1): each bin's highest level, the one it starts with included,
    so no peak is lost between points."""
    t = np.asarray(t, dtype=I64)
    values = np.asarray(values, dtype=I64)
    if not len(t):
        return []
    order = np.argsort(t, kind="stable")
    t, values = t[order], values[order]
    span = max(t1 - t0, 1)
    points = max(1, min(points, len(t)))
    b = np.clip((t - t0) * points // span, 0, points - 1)
    hi = np.full(points, -1, dtype=I64)
    np.maximum.at(hi, b, values)
    before = np.searchsorted(b, np.arange(points), side="left") - 1  # the last event of an earlier bin
    level = np.where(before >= 0, values[np.maximum(before, 0)], 0)
    return np.maximum(hi, level).tolist()
