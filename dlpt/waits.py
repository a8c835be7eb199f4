"""Why the GPU waits, and what holds its memory, as figures: the window, GPU busy and idle with
idle's split, sync and host time; the memory peak. The one reading of the profile's `window`,
`gpu_idle` and `memory` meta (written by both collectors: collectors/record/, the Kineto
importer) that every view shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from dlpt.header import GpuIdle, Header
from dlpt.metrics import COL
from dlpt.profile import Profile

IDLE_PARTS = ("host", "sync", "start-up", "unattributed", "queued")


@dataclass
class Waits:
    """Totals in ns. `wall` is the recording's window (the longest of the ranks'); `device_time`
    the sum of the devices' windows, which busy and idle add up to. None where the profile does
    not know (older profiles, CPU-only recordings have no GPU figures)."""

    wall: int | None = None
    device_time: int | None = None
    busy: int | None = None
    idle: int | None = None
    idle_parts: dict[str, int] = field(default_factory=dict)
    sync_time: int = 0
    host_time: int = 0
    devices: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    after_sync: int = 0  # idle in gaps that began while the host was blocked in a sync (dlpt/idle.py)

    @property
    def busy_share(self) -> float | None:
        return self.busy / self.device_time if self.busy is not None and self.device_time else None

    def to_json(self) -> dict[str, Any]:
        """The hotspots/report `summary` fields (ns; the caller converts units)."""
        out: dict[str, Any] = {"wall_time": self.wall, "gpu_busy_time": self.busy, "gpu_idle_time": self.idle,
                               "sync_time": self.sync_time, "host_time": self.host_time}
        if self.idle is not None:
            out["idle"] = {k: self.idle_parts.get(k, 0) for k in IDLE_PARTS}
        return out


def rank_window(meta: Header) -> tuple[int | None, GpuIdle | None]:
    """(wall time of the recording window, the gpu_idle figures) of one profile's or one merged
    rank's meta; None where it has none."""
    win = meta.window
    wall = int(win["end"]) - int(win["start"]) if isinstance(win, dict) and "end" in win and "start" in win else None
    if isinstance(win, dict) and "wall" in win:
        wall = int(win["wall"])  # a phase's window (dlpt/phases.py): the time spent in it, not its span
    gi = meta.gpu_idle
    return wall, gi if isinstance(gi, dict) else None


def waits(profile: Profile) -> Waits:
    """The profile's wait figures; a merged profile's are its ranks' summed (wall: the longest)."""
    tot = profile.cct.exclusive.sum(axis=0)
    out = Waits(sync_time=int(tot[COL["sync_time"]]), host_time=int(tot[COL["host_time"]]))
    for m in profile.meta.per_rank():
        wall, gi = rank_window(m)
        if wall is not None:
            out.wall = max(out.wall or 0, wall)
        if gi is None:
            continue
        devs = gi.get("devices") or {}
        out.devices += len(devs)
        out.device_time = (out.device_time or 0) + sum(int(d.get("window", 0)) for d in devs.values())
        out.busy = (out.busy or 0) + int(gi.get("busy", 0))
        out.idle = (out.idle or 0) + int(gi.get("idle", 0))
        for k in IDLE_PARTS:
            out.idle_parts[k] = out.idle_parts.get(k, 0) + int(cast(dict[str, Any], gi).get(k, 0))
        out.after_sync += int(gi.get("after_sync", 0))
        for k, v in (gi.get("skipped") or {}).items():
            out.skipped[k] = out.skipped.get(k, 0) + int(v)
    return out


@dataclass
class MemoryPeak:
    """The GPU memory headline: the allocated peak (summed over devices and ranks), the reserved
    peak, where and when the largest one was reached, the bytes of CUDA-graph pools, what was
    allocated before the recording, and the allocated series over time (bytes, for a sparkline)."""

    peak_allocated: int
    peak_reserved: int = 0
    peak_at: str = ""
    peak_step: int | None = None
    graph_pools: int = 0
    before_recording: int = 0
    series: list[int] = field(default_factory=list)
    oom: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved, "peak_at": self.peak_at,
                "peak_step": self.peak_step, "graph_pools": self.graph_pools,
                "before_recording": self.before_recording}


def memory_peak(profile: Profile) -> MemoryPeak | None:
    """The profile's memory headline, None when it recorded no GPU memory."""
    metas = profile.meta.per_rank()
    out: MemoryPeak | None = None
    best = -1
    for m in metas:
        mem = m.memory
        if not isinstance(mem, dict) or not mem.get("peak_allocated"):
            continue
        peak = int(mem["peak_allocated"])
        if out is None:
            out = MemoryPeak(0)
        out.peak_allocated += peak
        out.peak_reserved += int(mem.get("peak_reserved") or 0)
        out.graph_pools += int(mem.get("graph_pools") or 0)
        out.before_recording += int(mem.get("before_recording") or 0)
        if peak > best:
            best = peak
            out.peak_at, out.peak_step = str(mem.get("peak_at") or ""), mem.get("peak_step")
            out.oom = mem.get("oom")
    if out is not None and len(metas) == 1:
        tl = profile.meta.timeline or {}
        out.series = [int(v) for v in tl.get("allocated") or []]
    return out
