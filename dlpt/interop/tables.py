"""Views as pandas tables: how flat views and trees reach users who analyse in notebooks
(`Profile.to_dataframe`). Every metric keeps its integer unit (ns, bytes, counts); inclusive
columns carry an `_inc` suffix."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlpt.metrics import COL, METRICS
from dlpt.transforms import hide_library_unless
from dlpt.views import bottom_up, bottom_up_self, check_view, flat

if TYPE_CHECKING:
    import pandas as pd

    from dlpt.profile import Profile

def frame_columns(profile: Profile) -> dict[str, np.ndarray]:
    """Per-frame-id attribute arrays (`name` is the frame's display label), so node tables are
    one fancy-index per column instead of a Python loop per node."""
    frames = profile.frames
    n = len(frames)
    return {
        "name": np.fromiter((f.label() for f in frames), dtype=object, count=n),
        "kind": np.fromiter((f.kind for f in frames), dtype=object, count=n),
        "file": np.fromiter((f.file for f in frames), dtype=object, count=n),
        "line": np.fromiter((f.line for f in frames), dtype=np.int64, count=n),
        "function": np.fromiter((f.function for f in frames), dtype=object, count=n),
    }


def _metric_columns(exclusive: np.ndarray, inclusive: np.ndarray) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    for m in METRICS:
        cols[m] = exclusive[:, COL[m]]
    for m in METRICS:
        cols[f"{m}_inc"] = inclusive[:, COL[m]]
    return cols


def tree_dataframe(profile: Profile, inverted: bool = False) -> pd.DataFrame:
    """One row per CCT node, indexed by node id (preorder, so `df.loc[i:end]` is a subtree).
    `inverted`: `profile` is a bottom-up tree, whose self columns hold time on the frames that
    spent it and none on their callers (dlpt.views.bottom_up_self)."""
    import pandas as pd

    cct = profile.cct
    fc = frame_columns(profile)
    data: dict[str, np.ndarray] = {k: v[cct.frame] for k, v in fc.items()}
    data["depth"] = cct.depth
    data["parent"] = cct.parent
    data.update(_metric_columns(bottom_up_self(cct) if inverted else cct.exclusive, cct.inclusive))
    df = pd.DataFrame(data)
    df.index.name = "node"
    return df


def flat_dataframe(profile: Profile, by: str = "line") -> pd.DataFrame:
    """One row per group of the flat view, costliest GPU time first. `node` is the group's
    costliest node (for drilling down); `occurrences` how many tree nodes the group has."""
    import pandas as pd

    fv = flat(profile, by)
    data: dict[str, object] = {
        "name": [f.label() if by == "line" else lbl for f, lbl in zip(fv.frame, fv.labels)],
        "kind": [f.kind for f in fv.frame],
        "file": [f.file for f in fv.frame],
        "line": np.array([f.line if by == "line" else 0 for f in fv.frame], dtype=np.int64),
        "function": [f.function for f in fv.frame],
        "occurrences": fv.occurrences.astype(np.int64),
        "node": fv.node,
    }
    if by == "line":
        data["code"] = [profile.source_line(f.file, f.line) for f in fv.frame]
    data.update(_metric_columns(fv.exclusive, fv.inclusive))
    df = pd.DataFrame(data)
    df.index.name = "group"
    # The last group holds what no frame claims; keep it (totals must add up) but rank the rest.
    order = np.argsort(-fv.exclusive[:, COL["gpu_time"]], kind="stable")
    return df.iloc[order]


def view_dataframe(profile: Profile, view: str = "top-down", by: str = "line",
                   include_library: bool = False) -> pd.DataFrame:
    """The chosen view (top-down, bottom-up or flat grouped `by`) as a DataFrame. Library
    frames are hidden unless `include_library`; no total changes either way."""
    check_view(view, by)
    prof = hide_library_unless(profile, include_library)
    if view == "top-down":
        return tree_dataframe(prof)
    if view == "bottom-up":
        return tree_dataframe(bottom_up(prof), inverted=True)
    return flat_dataframe(prof, by)
