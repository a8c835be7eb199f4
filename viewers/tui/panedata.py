"""What the header and the detail pane show beside the table: one preparation of the profile
and its views (`LibraryViews`), the GPU activities beneath a row, per-line totals of a file, and the
profile's name, devices and totals. Pure data over the model, like `model.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from dlpt.metrics import ACTIVITY_KIND_INFO, COL, METRICS
from dlpt.profile import Activities, Profile
from dlpt.viewers.format import safe_text
from dlpt.viewers.tui.rows import FlatRows, TreeRows
from dlpt.views import FlatView


def activity_counts(acts: Activities) -> np.ndarray:
    """How many GPU activities each activity row stands for: its `count` where rows are
    aggregated (one row per kernel name at a node), else one each."""
    count = getattr(acts, "count", None)
    return np.ones(len(acts), dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)


@dataclass
class LibraryViews:
    """One preparation of the profile (library frames hidden or shown) and its views, built
    on first use and kept, so switching back is instant."""

    profile: Profile
    top_down: TreeRows
    bottom_up: TreeRows | None = None
    flats: dict[str, FlatRows] = field(default_factory=dict)
    by_line: FlatView | None = None
    activities: ActivityIndex | None = None


# -- the detail pane's data ------------------------------------------------------------------

@dataclass
class ActivityRow:
    kind: str
    name: str
    count: int
    time: int
    bytes: int


class ActivityIndex:
    """GPU activities sorted by node, so those beneath a top-down subtree are one slice."""

    def __init__(self, profile: Profile) -> None:
        a = profile.activities
        self.order = np.argsort(a.node, kind="stable")
        self.node = a.node[self.order]
        self.profile = profile

    def _summarise(self, sel: np.ndarray, top: int) -> list[ActivityRow]:
        a = self.profile.activities
        if len(sel) == 0:
            return []
        names = a.name[sel]
        kinds = a.kind[sel]
        key = names * 8 + kinds
        uniq, inv = np.unique(key, return_inverse=True)
        t = np.bincount(inv, weights=a.duration[sel]).astype(np.int64)
        c = np.bincount(inv, weights=activity_counts(a)[sel]).astype(np.int64)
        b = np.bincount(inv, weights=a.bytes[sel]).astype(np.int64)
        out = []
        for g in np.argsort(-t, kind="stable")[:top].tolist():
            k = int(uniq[g])
            out.append(ActivityRow(ACTIVITY_KIND_INFO[k % 8].short if k % 8 < len(ACTIVITY_KIND_INFO) else "?", self.profile.frames[k // 8].name,
                                   int(c[g]), int(t[g]), int(b[g])))
        return out

    def beneath(self, lo: int, hi: int, top: int = 10) -> list[ActivityRow]:
        """The activities of nodes lo..hi-1 grouped by (name, kind), costliest first."""
        a, b = np.searchsorted(self.node, [lo, hi])
        return self._summarise(self.order[a:b], top)

    def of_nodes(self, mask: np.ndarray, top: int = 10) -> list[ActivityRow]:
        """The activities whose node is set in `mask` (a boolean over CCT nodes)."""
        nodes = self.profile.activities.node
        return self._summarise(np.flatnonzero(mask[nodes]) if len(nodes) else nodes, top)


def line_totals(fv: FlatView, file: str) -> dict[int, np.ndarray]:
    """Per line of `file`: the row of metrics the flat-by-line view gives it (owned time)."""
    out: dict[int, np.ndarray] = {}
    for g, fr in enumerate(fv.frame[:-1]):
        if fr.file == file:
            out[fr.line] = fv.exclusive[g]
    return out


_WS = re.compile(r"\s+")


def program_name(profile: Profile) -> str:
    """The program or trace the profile is of, one line."""
    cmd = profile.meta.command or ""
    if cmd:
        return safe_text(_WS.sub(" ", cmd))
    # The file's name is what identifies a trace; its directory only widens the header.
    path = (profile.path or "").rstrip("/\\")
    return safe_text(path.replace("\\", "/").rsplit("/", 1)[-1] or "(unnamed profile)")


def device_names(profile: Profile) -> str:
    devs = profile.meta.devices or []
    names = [str(d.get("name", "?")) for d in devs if isinstance(d, dict)]
    if not names:
        return "no GPU" if profile.meta.gpu is False else "device unknown"
    uniq = sorted(set(names))
    return safe_text(", ".join(f"{len([n for n in names if n == u])}× {u}" if names.count(u) > 1 else u
                               for u in uniq))


def kind_totals(profile: Profile) -> dict[str, int]:
    tot = profile.cct.exclusive.sum(axis=0)
    return {m: int(tot[COL[m]]) for m in METRICS}
