"""`/` search over a view's rows: which rows match a query, as a mask over the rows' keys.

A row matches when its name or the line of code the table shows beside it contains the query:
the user types what is on screen, and a line reads `train.py:49 forward  ▸ x = self.mlp(x)`,
so `mlp` must find it. Pure data over the model, like `rows.py`."""

from __future__ import annotations

import numpy as np

from dlpt.viewers.tui.labels import frame_label
from dlpt.viewers.tui.rows import Rows, TreeRows


def _contains(q: str, *texts: str) -> bool:
    return any(q in t.casefold() for t in texts)


def matching_frames(source: Rows, query: str) -> np.ndarray:
    """Frames of the source's profile whose label, full name or line of code contains `query`
    (case-insensitive, literal)."""
    q = query.casefold()
    frames = source.profile.frames
    return np.fromiter((_contains(q, frame_label(f), f.name, source.frame_code(f)) for f in frames),
                       dtype=bool, count=len(frames))


def match_keys(source: Rows, query: str) -> np.ndarray:
    """A mask over the rows' keys: the rows whose name or code contains `query`."""
    if isinstance(source, TreeRows):
        # One test per distinct frame, not per node: a million nodes share a few thousand frames.
        hit = matching_frames(source, query)[source.cct.frame]
        hit[0] = False
        return hit
    q = query.casefold()
    n = len(source)  # flat: one level, each group on its own
    return np.fromiter((_contains(q, source.label(k), source.frame(k).name, source.code(k)) for k in range(n)),
                       dtype=bool, count=n)


def with_ancestors(source: Rows, hit: np.ndarray) -> np.ndarray:
    """The rows of `hit` and (in trees) their ancestors, so that every match is shown under its
    call path."""
    if not isinstance(source, TreeRows):
        return hit
    cct = source.cct
    keep = hit.copy()
    # Climb from every match at once, one level per pass; stop where the path is known.
    anc = np.unique(cct.parent[np.flatnonzero(hit)])
    while len(anc):
        anc = anc[~keep[anc]]
        keep[anc] = True
        anc = np.unique(cct.parent[anc])
        anc = anc[anc >= 0]
    keep[0] = True
    return keep


def filter_keys(source: Rows, query: str, col: int | None = None) -> np.ndarray:
    """A mask over the rows' keys: rows whose name or code contains `query`, and (in trees)
    their ancestors. With `col`, only matches that hold something of that metric column: the
    table hides the others (rows.Outline), and an ancestor kept for a hidden match alone would
    stand in the filtered table with no match beneath it."""
    hit = match_keys(source, query)
    if col is not None:
        hit &= source.holding(col)
    return with_ancestors(source, hit)


def has_match(source: Rows, keep: np.ndarray) -> bool:
    """Whether a filter mask leaves any row to show: a top-level row it keeps (in a tree, a
    kept match keeps its top-level ancestor)."""
    roots = source.roots()
    return bool(len(roots) and keep[roots].any())
