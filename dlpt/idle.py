"""Why the GPU waits: busy and idle time per device, idle blamed on the host lines that ran
meanwhile, and the figures both collectors write into a profile's meta (docs/ARCHITECTURE.md,
"Why the GPU waits"). Pure numpy over intervals, exact integers, no Python loop per interval.

The rule. Per device, *busy* is the union of its kernel, copy and memset intervals inside its
window, *idle* the window less busy. Idle before the device's first activity is **start-up**, a
named row. Every other idle nanosecond goes to the host intervals that cover it: within each
stretch between two boundaries, the threads running share it equally, so one thread's lines
share a gap by their host time in it. Idle that no host interval covers is **unattributed**, a
named row. per-node idle + start-up + unattributed = idle, to the nanosecond.

API (all times ns, one clock; node ids are the collector's, e.g. a `TreeBuilder`'s before
preorder renumbering):

- `busy_union(start, end) -> (start, end)`: sorted, disjoint cover of unordered, overlapping
  intervals.
- `split_by_device(device, start, end) -> (busy, skipped)`: GPU intervals grouped per device,
  the ones with no device id (< 0) counted.
- `activity_windows(busy) -> {device: (start, end)}`: a trace's windows, each device's first
  activity's start to its last one's end.
- `blame(n_nodes, windows, busy, h_start, h_end, h_node, h_thread, h_sync=None) -> IdleBlame`:
  `windows[d]` the window of device d, `busy[d]` its (start, end) arrays; one row per host
  interval `(start, end, node, thread, is_sync)`. A thread's intervals should not overlap (run
  lengths of samples, or the self intervals of nested spans); overlaps are cut and counted.
  `IdleBlame.per_node` is int64 per node summed over devices; `.totals()` the figures, `.meta()`
  the `meta.gpu_idle` dict, `.skipped` what bad input was left out and why.
- `idle_column(res, builder, frames, root)`: the `gpu_idle_time` column (nodes, values) for
  `ActivityColumns.extra`, with the start-up and unattributed rows made under `root`, so that the
  tree's sum equals the total idle.
- `timeline(windows, busy, start, end)`: `meta.timeline`, the busy fraction in at most 500
  equal bins of the window.

`dlpt.waits.waits(profile)` is the one reading of these meta fields for every viewer.

The meta contract: `meta.window = {"start", "end"}` (wall = end − start);
`meta.gpu_idle = {"busy", "idle", "host", "sync", "start-up", "unattributed", "devices":
{"0": {"window", "busy", "idle", "start-up", "unattributed"}}, "skipped": {reason: count}}`;
`meta.timeline = {"t": [ns from the window's start], "gpu_busy": [fraction]}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from dlpt.cct import TreeBuilder, distinct
from dlpt.frames import FrameTable, unattributed_frame
from dlpt.header import GpuIdle, Timeline

I64 = np.int64
# The named rows (kind `unattributed`, `<unattributed: ...>`) holding the idle no line is blamed for.
IDLE_STARTUP = "GPU idle before the first kernel (start-up)"
IDLE_UNATTRIBUTED = "GPU idle with no host line running"
IDLE_QUEUED = "GPU idle with work queued (launch latency, a graph's nodes, dependencies, a profiler's records)"
STARTUP_FRAME = unattributed_frame(IDLE_STARTUP)
UNATTRIBUTED_FRAME = unattributed_frame(IDLE_UNATTRIBUTED)
QUEUED_FRAME = unattributed_frame(IDLE_QUEUED)
TIMELINE_BINS = 500

# Reasons in `skipped`, so that viewers and tests name them the same way.
NO_DEVICE = "GPU activities without a device id"
NEGATIVE_GPU = "GPU activities with a negative duration"
OUTSIDE_GPU = "GPU activities outside the window"
EMPTY_WINDOW = "devices with an empty window"
NEGATIVE_HOST = "host intervals with a negative duration"
UNKNOWN_NODE = "host intervals on unknown nodes"
OVERLAP_HOST = "host intervals overlapping another of their thread (cut)"
HOST_CLOCK = "host intervals all outside the GPU windows (clocks do not line up)"


def _add(skipped: dict[str, int], reason: str, n: int) -> None:
    if n:
        skipped[reason] = skipped.get(reason, 0) + int(n)


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=I64).reshape(-1)


def busy_union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint intervals covering the same time as the (unordered, overlapping) input;
    empty and negative intervals are dropped."""
    start, end = _arr(start), _arr(end)
    ok = end > start
    start, end = start[ok], end[ok]
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    # A new run starts where an interval begins after everything before it has ended.
    first = np.flatnonzero(np.r_[True, start[1:] > reach[:-1]])
    last = np.r_[first[1:], len(start)] - 1
    return start[first], reach[last]


def split_by_device(device: np.ndarray, start: np.ndarray, end: np.ndarray,
                    skipped: dict[str, int] | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """GPU intervals per device; those without a device id (< 0) are counted in `skipped`."""
    device, start, end = _arr(device), _arr(start), _arr(end)
    if skipped is not None:
        _add(skipped, NO_DEVICE, int((device < 0).sum()))
    out = {}
    for d in distinct(device[device >= 0]).tolist():
        sel = device == d
        out[int(d)] = (start[sel], end[sel])
    return out


def activity_windows(busy: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, tuple[int, int]]:
    """Each device's window in a trace: its first activity's start to its last one's end
    (negative-duration activities do not stretch it)."""
    out = {}
    for d, (s, e) in busy.items():
        s, e = _arr(s), _arr(e)
        ok = e >= s
        if ok.any():
            out[d] = (int(s[ok].min()), int(e[ok].max()))
    return out


@dataclass
class DeviceIdle:
    window: int = 0
    busy: int = 0
    idle: int = 0
    startup: int = 0
    unattributed: int = 0
    queued: int = 0  # idle while the GPU had work launched and waiting: not the host's doing


@dataclass
class IdleBlame:
    """Per-node idle (int64, summed over devices), the per-device figures, the split of the
    blamed idle between sync and other host intervals, and what was skipped."""

    per_node: np.ndarray
    devices: dict[int, DeviceIdle] = field(default_factory=dict)
    host: int = 0
    sync: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    # Idle after a sync: in a gap that began while a launching thread was blocked in a sync (the
    # GPU ran dry while the host waited), the part after the sync returned, until the host
    # launched again. With the idle during syncs (`sync`), what syncs in a loop cost
    # (dlpt/evidence.py). Part of the blamed idle, not a part of its own.
    after_sync: int = 0

    def totals(self) -> dict[str, int]:
        d = self.devices.values()
        return {"busy": sum(x.busy for x in d), "idle": sum(x.idle for x in d), "host": self.host,
                "sync": self.sync, "start-up": sum(x.startup for x in d),
                "unattributed": sum(x.unattributed for x in d), "queued": sum(x.queued for x in d)}

    def meta(self) -> GpuIdle:
        """`meta.gpu_idle`: the totals, per device, and what was skipped."""
        out: dict[str, Any] = dict(self.totals())
        out["devices"] = {str(k): {"window": v.window, "busy": v.busy, "idle": v.idle, "start-up": v.startup,
                                   "unattributed": v.unattributed, "queued": v.queued}
                          for k, v in sorted(self.devices.items())}
        out["skipped"] = dict(self.skipped)
        out["after_sync"] = self.after_sync
        return cast(GpuIdle, out)  # its keys are GpuIdle's (dlpt/header.py), in the order files have them


def _disjoint_per_thread(hs: np.ndarray, he: np.ndarray,
                         ht: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, int]:
    """(order, new starts, number cut): the intervals sorted by thread and start, each starting no
    earlier than the end of every earlier interval of its thread (one dropped when that leaves
    nothing), so that a thread runs at most one interval at any time. Order None: as given."""
    if len(hs) and _sorted_disjoint(hs, he, ht):
        # Already sorted and one at a time per thread (a trace's self intervals, a recording's
        # run lengths): the sort below would give this order and cut nothing; it would also
        # hold a dozen copies of the columns at once, the largest part of a read's peak memory.
        return None, hs, 0
    order = np.lexsort((-he, hs, ht))
    s, e, t = hs[order], he[order], ht[order]
    if not len(s):
        return order, s, 0
    # The running maximum of the ends within each thread, through ranks so that one cumulative
    # maximum over the whole array serves every thread without overflow.
    times = np.sort(e)  # np.unique by sorting: its hashing is slower on large columns
    times = times[np.r_[True, times[1:] != times[:-1]]]
    group = np.cumsum(np.r_[False, t[1:] != t[:-1]])
    width = I64(len(times) + 1)
    key = group * width + np.searchsorted(times, e) + 1
    reach = np.maximum.accumulate(key)
    prev = np.r_[I64(0), reach[:-1]]
    same = np.r_[False, t[1:] == t[:-1]]
    prev_end = np.where(same, times[np.clip(prev - group * width - 1, 0, len(times) - 1)], s)
    cut = same & (prev_end > s)
    return order, np.where(cut, prev_end, s), int(cut.sum())


def _sorted_disjoint(hs: np.ndarray, he: np.ndarray, ht: np.ndarray) -> bool:
    """Are the intervals in (thread, start) order, starts strictly increasing within a thread and
    each starting no earlier than the one before it on its thread ends?"""
    same = ht[1:] == ht[:-1]
    return bool((ht[1:] >= ht[:-1]).all() and not (same & ((hs[1:] <= hs[:-1]) | (hs[1:] < he[:-1]))).any())


def _cum_length(gs: np.ndarray, ge: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Time up to each t inside the (sorted, disjoint) intervals gs..ge, exactly."""
    length = ge - gs
    cum = np.r_[I64(0), np.cumsum(length)]
    k = np.searchsorted(gs, t, side="right") - 1
    kk = np.maximum(k, 0)
    inside = np.clip(t - gs[kk], 0, length[kk]) if len(gs) else np.zeros(len(t), I64)
    return np.where(k >= 0, cum[kk] + inside, 0) if len(gs) else np.zeros(len(t), I64)


def _device_shares(gs: np.ndarray, ge: np.ndarray, hs: np.ndarray,
                   he: np.ndarray) -> tuple[np.ndarray, int]:
    """Each host interval's share of the idle gaps (floats) and the idle they share (exact).

    Boundaries: every gap and interval end. Between two boundaries the number of intervals
    running (one per thread) is constant, so the share density is idle / running there; G is its
    integral at the boundaries, and an interval's share is G(end) − G(start)."""
    if not len(hs) or not len(gs):
        return np.zeros(len(hs)), 0
    if (hs[1:] >= he[:-1]).all() and int((ge - gs).sum()) < 2**53:
        # One interval at a time (one thread launches, mostly): the density is the idle itself, and
        # each interval's share the idle inside it, with no sort of the boundaries. Floats below
        # 2**53 are exact, so this is to the bit what the integral below gives.
        inside = _cum_length(gs, ge, he) - _cum_length(gs, ge, hs)
        return inside.astype(np.float64), int(inside.sum())
    b = np.concatenate([gs, ge, hs, he])
    b.sort()
    b = b[np.r_[True, b[1:] != b[:-1]]]
    seg_idle = np.diff(_cum_length(gs, ge, b))
    i0, i1 = np.searchsorted(b, hs), np.searchsorted(b, he)
    n_b = len(b)
    del b  # the columns here are several times the host intervals: freed as soon as done with
    running = np.bincount(i0, minlength=n_b)
    running -= np.bincount(i1, minlength=n_b)
    running = np.cumsum(running[:-1])
    on = running > 0
    dens = np.where(on, seg_idle / np.maximum(running, 1), 0.0)
    del running
    blamed = int(seg_idle[on].sum())
    del seg_idle, on
    g = np.r_[0.0, np.cumsum(dens)]
    del dens
    return g[i1] - g[i0], blamed


def largest_remainder(values: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to `total` exactly, each within one of its (float) value: floors, then
    one more for the largest remainders (one less for the smallest, when floats overshot)."""
    out = np.floor(np.maximum(values, 0)).astype(I64)
    frac = values - out
    short = int(total) - int(out.sum())
    if not len(out) or short == 0:
        return out
    if short > 0:
        out += short // len(out)
        out[np.argsort(-frac, kind="stable")[: short % len(out)]] += 1
    else:
        # Only the positive entries can give back; take from the smallest remainders first.
        cand = np.flatnonzero(out > 0)
        cand = cand[np.argsort(frac[cand], kind="stable")]
        while short < 0 and len(cand):
            take = cand[: -short]
            out[take] -= 1
            short += len(take)
            cand = cand[out[cand] > 0]
    return out


def blame(n_nodes: int, windows: dict[int, tuple[int, int]], busy: dict[int, tuple[np.ndarray, np.ndarray]],
          h_start: np.ndarray, h_end: np.ndarray, h_node: np.ndarray, h_thread: np.ndarray,
          h_sync: np.ndarray | None = None,
          ready: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> IdleBlame:
    """Blame each device's idle time on the host intervals that ran meanwhile (module docstring).
    `ready[d]`: when device d had work queued (each launch to its start): idle inside it is
    `queued`, not blamed on the host. Bad input is skipped and counted in `.skipped`, never raised."""
    out = IdleBlame(per_node=np.zeros(n_nodes, dtype=I64))
    hs, he, hn, ht = _arr(h_start), _arr(h_end), _arr(h_node), _arr(h_thread)
    hy = np.zeros(len(hs), dtype=bool) if h_sync is None else np.asarray(h_sync).reshape(-1).astype(bool)
    _add(out.skipped, NEGATIVE_HOST, int((he < hs).sum()))
    bad_node = (hn < 0) | (hn >= n_nodes)
    _add(out.skipped, UNKNOWN_NODE, int((bad_node & (he >= hs)).sum()))
    keep = (he > hs) & ~bad_node
    if not keep.all():  # copies of every column, held to the end: only when some go
        hs, he, hn, ht, hy = hs[keep], he[keep], hn[keep], ht[keep], hy[keep]
    order, hs2, cut = _disjoint_per_thread(hs, he, ht)
    _add(out.skipped, OVERLAP_HOST, cut)
    if order is not None:
        hs, he, hn, hy = hs2, he[order], hn[order], hy[order]
        keep = he > hs
        hs, he, hn, hy = hs[keep], he[keep], hn[keep], hy[keep]

    shares = np.zeros(len(hs))
    blamed = 0
    overlaps_any = any(bool(((he > int(w0)) & (hs < int(w1))).any()) for w0, w1 in windows.values())
    if len(hs) and not overlaps_any:
        ready = None  # the host's clock is not the GPU's: its launch times say nothing either
    sync_s, sync_e = busy_union(hs[hy], he[hy])  # when some launching thread was blocked in a sync
    for dev, (w0, w1) in sorted(windows.items()):
        w0, w1 = int(w0), int(w1)
        if w1 <= w0:
            _add(out.skipped, EMPTY_WINDOW, 1)
            continue
        bs, be = busy.get(dev, (np.zeros(0, I64), np.zeros(0, I64)))
        bs, be = _arr(bs), _arr(be)
        _add(out.skipped, NEGATIVE_GPU, int((be < bs).sum()))
        _add(out.skipped, OUTSIDE_GPU, int(((be >= bs) & ((be <= w0) | (bs >= w1)) & (be > bs)).sum()))
        us, ue = busy_union(np.clip(bs, w0, w1), np.clip(be, w0, w1))
        d = out.devices[dev] = DeviceIdle(window=w1 - w0)
        d.busy = int((ue - us).sum())
        d.idle = d.window - d.busy
        if not len(us):
            d.unattributed = d.idle  # no activity at all: nothing is "before the first kernel"
            continue
        first = int(us[0])
        d.startup = first - w0
        # The gaps after the first activity: between the busy runs, and after the last one.
        gs, ge = ue, np.r_[us[1:], I64(w1)]
        g = ge > gs
        gs, ge = gs[g], ge[g]
        if ready and dev in ready:
            # The parts of the gaps where no launched work was waiting: the host's to explain.
            rs, re_ = busy_union(np.clip(_arr(ready[dev][0]), first, w1), np.clip(_arr(ready[dev][1]), first, w1))
            cs, ce = np.r_[I64(first), re_], np.r_[rs, I64(w1)]
            keep = ce > cs
            total = int((ge - gs).sum())
            gs, ge, _ = clip_to_spans(cs[keep], ce[keep], gs, ge)
            d.queued = total - int((ge - gs).sum())
        hs_c, he_c = np.clip(hs, first, w1), np.clip(he, first, w1)
        live = he_c > hs_c
        all_live = bool(live.all())
        if len(sync_s) and len(gs):
            k = np.searchsorted(sync_s, gs, side="right") - 1
            until = sync_e[np.maximum(k, 0)]
            drained = (k >= 0) & (gs < until)
            out.after_sync += int(np.maximum(ge - np.maximum(gs, until), 0)[drained].sum())
        if all_live:  # no copies of the columns when every interval is inside the window
            dev_shares, dev_blamed = _device_shares(gs, ge, hs_c, he_c)
            shares += dev_shares
        else:
            dev_shares, dev_blamed = _device_shares(gs, ge, hs_c[live], he_c[live])
            shares[live] += dev_shares
        blamed += dev_blamed
        d.unattributed = d.idle - d.startup - d.queued - dev_blamed
    if len(hs) and windows and not overlaps_any:
        _add(out.skipped, HOST_CLOCK, len(hs))
    # One rounding over (node, sync) keys for all devices: per node, host and sync are exact
    # integers, and their sums are the blamed idle to the nanosecond.
    keys = hn * 2 + hy.astype(I64)
    per_key = largest_remainder(np.bincount(keys, weights=shares, minlength=2 * n_nodes), blamed)
    per_key = per_key.reshape(-1, 2) if n_nodes else np.zeros((0, 2), I64)
    out.per_node = per_key.sum(axis=1)
    out.host, out.sync = int(per_key[:, 0].sum()), int(per_key[:, 1].sum())
    return out


def merged_meta(results: list[IdleBlame], skipped: dict[str, int]) -> GpuIdle:
    """`meta.gpu_idle` of several results over one window's parts (the phases of a run):
    their figures summed, device by device."""
    out = IdleBlame(per_node=np.zeros(0, dtype=I64), skipped=dict(skipped))
    for r in results:
        out.host += r.host
        out.sync += r.sync
        out.after_sync += r.after_sync
        for d, v in r.devices.items():
            t = out.devices.setdefault(d, DeviceIdle())
            t.window += v.window
            t.busy += v.busy
            t.idle += v.idle
            t.startup += v.startup
            t.unattributed += v.unattributed
            t.queued += v.queued
    return out.meta()


def idle_column(res: IdleBlame, builder: TreeBuilder, frames: FrameTable,
                root: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The `gpu_idle_time` column for `ActivityColumns.extra`: the blamed nodes, plus the start-up
    and unattributed rows made under `root` (only those that hold time), so that the tree's sum
    equals the total idle."""
    nz = np.flatnonzero(res.per_node)
    tot = res.totals()
    rows = [(STARTUP_FRAME, tot["start-up"]), (UNATTRIBUTED_FRAME, tot["unattributed"]),
            (QUEUED_FRAME, tot["queued"])]
    nodes = [builder.child(root, frames.intern(f)) for f, v in rows if v]
    vals = [v for _, v in rows if v]
    return np.r_[nz, np.asarray(nodes, dtype=I64)], np.r_[res.per_node[nz], np.asarray(vals, dtype=I64)]


def timeline(windows: dict[int, tuple[int, int]], busy: dict[int, tuple[np.ndarray, np.ndarray]],
             start: int, end: int, bins: int = TIMELINE_BINS) -> Timeline:
    """`meta.timeline`: the window [start, end) in at most `bins` equal stretches (`t`, each
    stretch's start in ns from `start`) and the fraction of the devices' time busy in each
    (`gpu_busy`, busy time summed over devices / (devices × stretch))."""
    span = int(end) - int(start)
    if span <= 0 or not windows:
        return {"t": [], "gpu_busy": []}
    n = max(1, min(bins, span))
    edges = start + (np.arange(n + 1, dtype=np.float64) * span / n).round().astype(I64)
    busy_at = np.zeros(n + 1, dtype=I64)
    for dev, (w0, w1) in windows.items():
        bs, be = busy.get(dev, (np.zeros(0, I64), np.zeros(0, I64)))
        us, ue = busy_union(np.clip(_arr(bs), w0, w1), np.clip(_arr(be), w0, w1))
        busy_at += _cum_length(us, ue, edges)  # the same cumulative length, of busy runs
    frac = np.diff(busy_at) / (np.diff(edges).clip(1) * len(windows))
    return {"t": (edges[:-1] - start).tolist(), "gpu_busy": np.round(frac, 4).tolist()}


def clip_to_spans(ss: np.ndarray, se: np.ndarray, hs: np.ndarray,
                  he: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the intervals hs..he inside the sorted, disjoint stretches ss..se:
    (starts, ends, index of the interval each piece came from)."""
    hs, he = _arr(hs), _arr(he)
    if not len(ss) or not len(hs):
        return np.zeros(0, I64), np.zeros(0, I64), np.zeros(0, I64)
    k0 = np.searchsorted(se, hs, side="right")  # the first stretch ending after the start
    k1 = np.searchsorted(ss, he, side="left")  # one past the last stretch starting before the end
    n = np.maximum(k1 - k0, 0)
    src = np.repeat(np.arange(len(hs)), n)
    k = np.repeat(k0, n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
    s = np.maximum(hs[src], ss[k])
    e = np.minimum(he[src], se[k])
    ok = e > s
    return s[ok], e[ok], src[ok]


def blame_phases(n_nodes: int, windows: dict[int, tuple[int, int]], busy: dict[int, tuple[np.ndarray, np.ndarray]],
                 spans: dict[int, tuple[np.ndarray, np.ndarray]], h_start: np.ndarray, h_end: np.ndarray,
                 h_node: np.ndarray, h_thread: np.ndarray, h_sync: np.ndarray | None,
                 node_in_phase: Any,
                 ready: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[dict[int, IdleBlame], dict[str, int]]:
    """`blame` for each phase of a run (dlpt/phases.py): `spans[p]` are phase p's sorted, disjoint
    stretches of the window. The idle inside them is blamed on the host intervals' pieces inside
    them — each piece's node moved into phase p by `node_in_phase(nodes, p)` (a sample taken as
    the phase changed may name the last phase's node) — and time outside them counts as busy, so
    that it is neither idle nor blamed. Each result's figures are of p's stretches alone: summed
    over the phases, busy, idle and every node's blame are the run's, to the nanosecond.
    Returns the results per phase and what bad input was left out (counted once for the run)."""
    hs, he, hn, ht = _arr(h_start), _arr(h_end), _arr(h_node), _arr(h_thread)
    hy = np.zeros(len(hs), dtype=bool) if h_sync is None else np.asarray(h_sync).reshape(-1).astype(bool)
    skipped: dict[str, int] = {}
    _add(skipped, NEGATIVE_HOST, int((he < hs).sum()))
    bad_node = (hn < 0) | (hn >= n_nodes)
    _add(skipped, UNKNOWN_NODE, int((bad_node & (he >= hs)).sum()))
    keep = ~bad_node
    hs, he, hn, ht, hy = hs[keep], he[keep], hn[keep], ht[keep], hy[keep]
    for _d, (w0, w1) in sorted(windows.items()):
        bs, be = busy.get(_d, (np.zeros(0, I64), np.zeros(0, I64)))
        bs, be = _arr(bs), _arr(be)
        if w1 <= w0:
            _add(skipped, EMPTY_WINDOW, 1)
        _add(skipped, NEGATIVE_GPU, int((be < bs).sum()))
        _add(skipped, OUTSIDE_GPU, int(((be >= bs) & ((be <= w0) | (bs >= w1)) & (be > bs)).sum()))
    # Every phase's pieces first: moving a node into a phase may make nodes, which every
    # phase's result must have room for.
    pieces = {}
    for p, (ss, se) in spans.items():
        ps, pe, src = clip_to_spans(_arr(ss), _arr(se), hs, he)
        pieces[p] = (ps, pe, node_in_phase(hn[src], p) if len(src) else hn[src], src)
    n = max([n_nodes] + [int(x[2].max()) + 1 for x in pieces.values() if len(x[2])])
    out = {}
    for p, (ss, se) in spans.items():
        ss, se = _arr(ss), _arr(se)
        ps, pe, pn, src = pieces[p]
        pbusy = {}
        for d, (w0, w1) in windows.items():
            # Outside the phase is "busy" here: the gaps between its stretches, and before and after them.
            inner = ss[1:], se[:-1]
            outside_s = np.r_[I64(w0), inner[1], se[-1:]] if len(ss) else np.r_[I64(w0)]
            outside_e = np.r_[ss[:1], inner[0], I64(w1)] if len(ss) else np.r_[I64(w1)]
            bs, be = busy.get(d, (np.zeros(0, I64), np.zeros(0, I64)))
            pbusy[d] = (np.r_[_arr(bs), outside_s], np.r_[_arr(be), outside_e])
        res = blame(n, windows, pbusy, ps, pe, pn, ht[src], hy[src], ready)
        for d, (w0, w1) in windows.items():
            if d in res.devices:
                dv = res.devices[d]
                cs, ce = np.clip(ss, w0, w1), np.clip(se, w0, w1)
                dv.window = int((ce - cs).sum())
                dv.busy = dv.window - dv.idle
        # The input checks are the run's (above); a phase's own run adds what only it can tell.
        for k in (OVERLAP_HOST, HOST_CLOCK):
            _add(skipped, k, res.skipped.get(k, 0))
        res.skipped = {}
        out[p] = res
    return out, skipped
