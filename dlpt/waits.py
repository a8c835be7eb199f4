"""Why the GPU waits, as figures: the window, GPU busy and idle with idle's split, sync and host
time. The one reading of the profile's `window` and `gpu_idle` meta (written by both collectors:
collectors/record/trie_converter.py, the Kineto importer) that every view shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlpt.metrics import COL
from dlpt.profile import Profile

IDLE_PARTS = ("host", "sync", "start-up", "unattributed")


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


def _one(meta: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    win = meta.get("window")
    wall = int(win["end"]) - int(win["start"]) if isinstance(win, dict) and "end" in win and "start" in win else None
    gi = meta.get("gpu_idle")
    return wall, gi if isinstance(gi, dict) else None


def waits(profile: Profile) -> Waits:
    """The profile's wait figures; a merged profile's are its ranks' summed (wall: the longest)."""
    tot = profile.cct.exclusive.sum(axis=0)
    out = Waits(sync_time=int(tot[COL["sync_time"]]), host_time=int(tot[COL["host_time"]]))
    metas = [r for r in profile.meta.get("ranks") or [] if isinstance(r, dict)] or [profile.meta]
    for m in metas:
        wall, gi = _one(m)
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
            out.idle_parts[k] = out.idle_parts.get(k, 0) + int(gi.get(k, 0))
        for k, v in (gi.get("skipped") or {}).items():
            out.skipped[k] = out.skipped.get(k, 0) + int(v)
    return out
