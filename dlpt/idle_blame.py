"""GPU idle time blamed on the host lines that ran meanwhile (docs/ARCHITECTURE.md, "Why the GPU
waits"). Pure numpy over intervals, exact integers, no loop per interval in Python.

Per device, busy is the union of its kernel, copy and memset intervals, and idle is the window
less busy. The idle before the device's first activity is *start-up*, a named row of its own.
Every other idle nanosecond goes to the host intervals `(start, end, node, thread)` that cover
it: within each stretch between two interval boundaries, the threads running share it equally,
so one thread's lines share a gap by their time in it. Idle no interval covers is
*unattributed*. Per-node idle + start-up + unattributed = idle, to the nanosecond.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

I64 = np.int64
# The named rows (kind `unattributed`) that hold the idle no line is blamed for.
IDLE_STARTUP = "GPU idle before the first kernel (start-up)"
IDLE_UNATTRIBUTED = "GPU idle with no host line sampled"


def busy_union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint intervals covering the same time as the (unordered, overlapping) input;
    empty and negative intervals are dropped."""
    start, end = np.asarray(start, dtype=I64), np.asarray(end, dtype=I64)
    ok = end > start
    start, end = start[ok], end[ok]
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    # A new run starts where an interval begins after everything before it has ended.
    new = np.r_[True, start[1:] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(start)] - 1
    return start[first], reach[last]


def idle_gaps(busy_s: np.ndarray, busy_e: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, np.ndarray]:
    """The idle intervals of a window given its busy union (sorted, disjoint)."""
    s = np.clip(busy_s, w0, w1)
    e = np.clip(busy_e, w0, w1)
    keep = e > s
    s, e = s[keep], e[keep]
    gs = np.r_[np.int64(w0), e]
    ge = np.r_[s, np.int64(w1)]
    keep = ge > gs
    return gs[keep], ge[keep]


def _largest_remainder(values: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to `total` (values' floors plus one for the largest remainders)."""
    floor = np.floor(values).astype(I64)
    short = int(total - floor.sum())
    if short > 0 and len(values):
        order = np.argsort(-(values - floor), kind="stable")[:short]
        floor[order] += 1
    return floor


@dataclass
class DeviceIdle:
    window: int = 0
    busy: int = 0
    idle: int = 0
    startup: int = 0
    unattributed: int = 0
    blamed: int = 0
    sync: int = 0


@dataclass
class IdleBlame:
    """Per-node idle (int64, summed over devices), and the totals by what the host did."""

    per_node: np.ndarray
    devices: dict[int, DeviceIdle] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        d = self.devices.values()
        blamed = sum(x.blamed for x in d)
        sync = sum(x.sync for x in d)
        return {"busy": sum(x.busy for x in d), "idle": sum(x.idle for x in d), "host": blamed - sync,
                "sync": sync, "start-up": sum(x.startup for x in d), "unattributed": sum(x.unattributed for x in d)}

    def meta(self) -> dict:
        """`meta["gpu_idle"]`: the totals, per device, and what was skipped."""
        out: dict = dict(self.totals())
        out["devices"] = {str(k): {"window": v.window, "busy": v.busy, "idle": v.idle, "start-up": v.startup,
                                   "unattributed": v.unattributed} for k, v in sorted(self.devices.items())}
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        return out


def blame(n_nodes: int, windows: dict[int, tuple[int, int]], busy: dict[int, tuple[np.ndarray, np.ndarray]],
          h_start: np.ndarray, h_end: np.ndarray, h_node: np.ndarray, h_thread: np.ndarray,
          h_sync: np.ndarray | None = None) -> IdleBlame:
    """Blame each device's idle time on the host intervals (all in one clock, ns).

    `windows[d]` = (start, end) of device d's window; `busy[d]` = its activity intervals (any
    order, overlaps allowed); host intervals: one row each, `h_sync` marks those spent blocked
    in a synchronisation (their share counts as `sync` in the totals)."""
    out = IdleBlame(per_node=np.zeros(n_nodes, dtype=I64))
    hs, he = np.asarray(h_start, dtype=I64), np.asarray(h_end, dtype=I64)
    hn, ht = np.asarray(h_node, dtype=I64), np.asarray(h_thread, dtype=I64)
    hy = np.zeros(len(hs), dtype=bool) if h_sync is None else np.asarray(h_sync).astype(bool)
    bad = (he <= hs) | (hn < 0) | (hn >= n_nodes)
    if bad.any():
        out.skipped["host intervals empty or on unknown nodes"] = int(bad.sum())
        hs, he, hn, ht, hy = hs[~bad], he[~bad], hn[~bad], ht[~bad], hy[~bad]
    for dev, (w0, w1) in sorted(windows.items()):
        w0, w1 = int(w0), int(w1)
        if w1 <= w0:
            out.skipped["devices with an empty window"] = out.skipped.get("devices with an empty window", 0) + 1
            continue
        bs, be = busy.get(dev, (np.zeros(0, I64), np.zeros(0, I64)))
        us, ue = busy_union(bs, be)
        gs, ge = idle_gaps(us, ue, w0, w1)
        d = out.devices[dev] = DeviceIdle(window=w1 - w0)
        d.idle = int((ge - gs).sum())
        d.busy = d.window - d.idle
        if len(us) == 0:
            d.unattributed = d.idle  # no activity at all: nothing is "before the first kernel"
            continue
        if len(gs) and gs[0] == w0 and ge[0] <= max(int(us[0]), w0):
            d.startup = int(ge[0] - gs[0])
            gs, ge = gs[1:], ge[1:]
        if not len(gs):
            continue
        shares, sync = _shares(gs, ge, hs, he, ht, hy)
        per_node = _largest_remainder(np.bincount(hn, weights=shares, minlength=n_nodes),
                                      int(np.floor(shares.sum() + 0.5)))
        d.blamed = int(per_node.sum())
        d.sync = int(min(round(sync), d.blamed))
        d.unattributed = d.idle - d.startup - d.blamed
        if d.unattributed < 0:  # rounding can only ever be off by a nanosecond or so
            per_node[np.argmax(per_node)] += d.unattributed
            d.blamed += d.unattributed
            d.unattributed = 0
        out.per_node += per_node
    return out


def _shares(gs: np.ndarray, ge: np.ndarray, hs: np.ndarray, he: np.ndarray, ht: np.ndarray,
            hy: np.ndarray) -> tuple[np.ndarray, float]:
    """Each host interval's share of the idle gaps (floats), and the part on sync intervals.

    Boundaries: every gap and interval end. Between two boundaries the idle density is 0 or 1
    and the number of threads running is constant, so the share density is idle / threads there;
    G(t) is its integral, and an interval's share is G(end) − G(start)."""
    if not len(hs):
        return np.zeros(0), 0.0
    b = np.sort(np.concatenate([gs, ge, hs, he]))  # np.unique's hashing is slower than a sort here
    b = b[np.r_[True, b[1:] != b[:-1]]]
    # Idle in [b_k, b_k+1): the segment lies inside a gap or outside all of them.
    seg_len = np.diff(b).astype(np.float64)
    k = np.searchsorted(gs, b[:-1], side="right") - 1
    in_gap = (k >= 0) & (b[:-1] < ge[np.maximum(k, 0)])
    # Threads running in each segment: per thread, intervals do not overlap; count starts - ends.
    i0, i1 = np.searchsorted(b, hs), np.searchsorted(b, he)
    delta = np.bincount(i0, minlength=len(b)) - np.bincount(i1, minlength=len(b))
    running = np.cumsum(delta)[:-1]
    dens = np.where(in_gap & (running > 0), seg_len / np.maximum(running, 1), 0.0)
    g = np.r_[0.0, np.cumsum(dens)]
    shares = g[i1] - g[i0]
    return shares, float(shares[hy].sum())


def busy_timeline(us: np.ndarray, ue: np.ndarray, w0: int, w1: int, bins: int = 200) -> list[float]:
    """The busy fraction of each of `bins` equal stretches of the window, from a busy union."""
    if w1 <= w0 or bins <= 0:
        return []
    edges = np.linspace(w0, w1, bins + 1)
    # Busy time up to t: the union's cumulative length, interpolated inside an interval.
    cum = np.r_[0, np.cumsum(ue - us)]

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(us, t, side="right") - 1
        inside = np.where(k >= 0, np.clip(t - us[np.maximum(k, 0)], 0, (ue - us)[np.maximum(k, 0)]), 0)
        return np.where(k >= 0, cum[np.maximum(k, 0)] + inside, 0)

    b = upto(edges) if len(us) else np.zeros(len(edges))
    return np.round(np.diff(b) / np.diff(edges), 4).tolist()
