"""The three views of a profile: top-down (the CCT itself), bottom-up (callers of each frame,
inverted) and flat (grouped by line, function, file, kernel or op). All of them conserve the
totals of the top-down tree."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from dlpt.cct import CCT, distinct, renumber, sum_rows
from dlpt.errors import DlptError
from dlpt.frames import ACTIVITY_KINDS, Frame, short_path
from dlpt.metrics import COL, TIME_METRICS
from dlpt.transforms import propagate_down

if TYPE_CHECKING:
    # Annotations only: views take the profile they are given (dlpt.profile's conveniences
    # reach views through dlpt.interop, so a runtime import would close a circle).
    from dlpt.profile import Profile

VIEWS = ("top-down", "bottom-up", "flat")
GROUPINGS = ("line", "function", "file", "kernel", "op")
NO_GROUP = {"line": "<no source line>", "function": "<no function>", "file": "<no file>",
            "kernel": "<no GPU activity>", "op": "<no op>"}


def check_view(view: str, by: str = "line") -> None:
    if view not in VIEWS:
        raise DlptError(f"unknown view {view!r}; choose one of: {', '.join(VIEWS)}")
    if by not in GROUPINGS:
        raise DlptError(f"unknown grouping {by!r}; choose one of: {', '.join(GROUPINGS)}")


def group_key(frame: Frame, by: str) -> tuple | None:
    """The key a frame contributes to a flat grouping, or None when it has none."""
    k = frame.kind
    if by == "line":
        return (frame.file, frame.line) if frame.has_source else None
    if by == "function":
        if k == "python":
            return (frame.file, frame.function or frame.name)
        return None
    if by == "file":
        return (frame.file,) if k == "python" and frame.file else None
    if by == "kernel":
        return (k, frame.name) if k in ACTIVITY_KINDS else None
    if by == "op":
        return (frame.name,) if k == "op" else None
    raise DlptError(f"unknown grouping {by!r}; choose one of: {', '.join(GROUPINGS)}")


@dataclass
class FlatView:
    """Groups in no particular order. `exclusive[g]` is the time owned by the group — each
    node's metrics go to its innermost ancestor-or-self with a key — so the rows sum to the
    tree's total. `inclusive[g]` counts each subtree once even under recursion. `frame[g]` is a
    representative frame; `node[g]` the node with the most inclusive time of the group."""

    by: str
    labels: list[str]
    frame: list[Frame]
    exclusive: np.ndarray
    inclusive: np.ndarray
    node: np.ndarray
    occurrences: np.ndarray
    owner: np.ndarray  # group of each CCT node (-1: none), for drilling down


def _label(frame: Frame, by: str) -> str:
    if by == "line":
        return frame.label()
    # Paths read as in `--by line` (`Frame.label`): the last two components, never absolute.
    if by == "function":
        return f"{frame.function} ({short_path(frame.file)})" if frame.file else frame.name
    if by == "file":
        return short_path(frame.file)
    return frame.name


def flat(profile: Profile, by: str = "line") -> FlatView:
    cct = profile.cct
    n = len(cct)
    frame_group = np.full(len(profile.frames), -1, dtype=np.int64)
    keys: dict[tuple, int] = {}
    labels: list[str] = []
    reps: list[Frame] = []
    for fi in distinct(cct.frame).tolist():
        fr = profile.frames[fi]
        k = group_key(fr, by)
        if k is None:
            continue
        g = keys.get(k)
        if g is None:
            g = keys[k] = len(labels)
            labels.append(_label(fr, by))
            reps.append(fr)
        frame_group[fi] = g
    node_group = frame_group[cct.frame]
    node_group[0] = -1
    # Owner group of every node: its own, else its parent's (parents precede children).
    owner = node_group.copy()
    todo = np.flatnonzero(owner < 0)[1:] if n > 1 else np.zeros(0, dtype=np.int64)
    anc = cct.parent[todo]
    while len(todo):
        anc_group = node_group[anc]
        done = (anc_group >= 0) | (anc <= 0)
        owner[todo[done]] = np.where(anc[done] > 0, anc_group[done], -1)
        todo, anc = todo[~done], cct.parent[anc[~done]]
    none = len(labels)
    G = none + 1
    ncol = cct.exclusive.shape[1]
    exc = np.zeros((G, ncol), dtype=np.int64)
    np.add.at(exc, np.where(owner >= 0, owner, none), cct.exclusive)
    # Inclusive: only the outermost node of a group on each path counts.
    keyed = np.flatnonzero(node_group >= 0)
    end = cct.end
    top = np.zeros(n, dtype=bool)
    open_count = [0] * G
    stack: list[tuple[int, int]] = []
    for i, g in zip(keyed.tolist(), node_group[keyed].tolist()):
        while stack and stack[-1][0] <= i:
            open_count[stack.pop()[1]] -= 1
        if open_count[g] == 0:
            top[i] = True
        stack.append((int(end[i]), g))
        open_count[g] += 1
    inc = np.zeros((G, ncol), dtype=np.int64)
    tops = np.flatnonzero(top)
    np.add.at(inc, node_group[tops], cct.inclusive[tops])
    inc[none] = exc[none]
    occ = np.bincount(node_group[keyed], minlength=G)
    best = np.zeros(G, dtype=np.int64)
    if len(keyed):
        val = cct.inclusive[keyed, 0]
        order = np.lexsort((val, node_group[keyed]))
        gs = node_group[keyed][order]
        last = np.r_[np.flatnonzero(np.diff(gs)), len(gs) - 1]
        best[gs[last]] = keyed[order][last]
    label = no_group_label(cct, profile.frames, owner, by)
    labels.append(label)
    reps.append(Frame("unattributed", label))
    return FlatView(by, labels, reps, exc, inc, best, occ, owner)


UNATTRIBUTED_PREFIX = "<unattributed: "
# The work on the tree's root itself: what ran outside every frame (dlpt's own start and end).
ROOT_REASON = "outside the program's code"


def no_group_label(cct: CCT, frames: list[Frame], owner: np.ndarray, by: str) -> str:
    """The label of a flat view's group of what has no key (`<no source line>`), saying what it
    holds: its named reasons (an `<unattributed: …>` frame at the top of the tree — GPU idle at
    start-up, work queued, memory allocated before the recording, a kernel with no launch
    record…; the root's own work; ops outside any Python frame), largest time first, so that a
    user reading `<no source line>` at 20% knows what it is. Groupings by kernel and op keep
    the bare label: there it holds all the work of the other kinds."""
    base = NO_GROUP[by]
    if by not in ("line", "function", "file") or len(cct) == 0:
        return base
    # (The root is always among them: its group is -1. With none at all, `sums` below is empty.)
    none = np.flatnonzero(owner < 0)
    # The top-level ancestor of each node: in preorder, the last depth-1 node at or before it.
    idx = np.arange(len(cct))
    top = np.maximum.accumulate(np.where(cct.depth == 1, idx, 0))
    times = [c for m, c in COL.items() if m in TIME_METRICS and m != "gpu_time"]
    weight = cct.exclusive[none][:, times].sum(axis=1) if times else np.zeros(len(none))
    # Summed per top-level node in numpy (a trace without stacks has most of its nodes here);
    # the root's own work has top 0. Only the few distinct tops are named in Python.
    live = weight > 0
    tops, where = np.unique(np.where(none[live] > 0, top[none[live]], 0), return_inverse=True)
    per_top = np.bincount(where, weights=weight[live], minlength=len(tops))
    sums: dict[str, float] = {}
    for t, w in zip(tops.tolist(), per_top.tolist()):
        fr = frames[int(cct.frame[t])] if t > 0 else None
        if fr is None:
            reason = ROOT_REASON
        elif fr.kind == "unattributed" and fr.name.startswith(UNATTRIBUTED_PREFIX):
            reason = fr.name[len(UNATTRIBUTED_PREFIX):].rstrip(">")
        elif fr.kind == "op":
            reason = "ops outside any Python frame"
        else:
            reason = fr.name
        sums[reason] = sums.get(reason, 0.0) + w
    if not sums:
        return base
    ranked = sorted(sums, key=lambda r: -sums[r])
    shown = "; ".join(r if len(r) <= 60 else r[:59] + "…" for r in ranked[:3])
    more = f"; {len(ranked) - 3} more" if len(ranked) > 3 else ""
    return f"{base[:-1]}: {shown}{more}>"


def bottom_up(profile: Profile) -> Profile:
    """The inverted tree: level one holds every frame that has exclusive metrics, its children
    are its callers, and so on to the outermost frame. Each node's exclusive metrics sit at
    the end of its reversed path, so inclusive values read as 'through this caller chain'; its
    rows' self values are `bottom_up_self`, not that `exclusive`.

    Built level by level in numpy: the inverted node at level k of a source node is
    (inverted node at level k-1, frame of its k-th ancestor)."""
    cct = profile.cct
    src = np.flatnonzero(cct.exclusive.any(axis=1))
    src = src[src > 0]
    nf = int(cct.frame.max()) + 1
    parents = [np.array([-1], dtype=np.int64)]
    frames_ = [cct.frame[:1]]
    inv = np.zeros(len(src), dtype=np.int64)   # current inverted node of each source node
    anc = src.copy()                            # the ancestor whose frame comes next
    live = np.arange(len(src))
    next_id = 1
    while len(live):
        keys = inv[live] * nf + cct.frame[anc[live]]
        uniq, first, where = np.unique(keys, return_index=True, return_inverse=True)
        parents.append(inv[live[first]])
        frames_.append(cct.frame[anc[live[first]]])
        inv[live] = next_id + where
        next_id += len(uniq)
        anc[live] = cct.parent[anc[live]]
        live = live[anc[live] > 0]
    bparent, bframe, new_of_old = renumber(np.concatenate(parents), np.concatenate(frames_))
    exc = np.zeros((len(bparent), cct.exclusive.shape[1]), dtype=np.int64)
    if len(src):
        exc = sum_rows(new_of_old[inv], cct.exclusive[src], len(bparent))
    exc[0] += cct.exclusive[0]
    # Activities refer to top-down nodes, which an inverted tree does not have.
    return replace(profile, cct=CCT(bparent, bframe, exc), activities=type(profile.activities).empty())


def bottom_up_self(tree: CCT) -> np.ndarray:
    """The self values of a bottom-up tree's rows (`bottom_up(profile).cct`), every metric
    column. A level-one row is a frame where time was spent: its self value is all of its value
    (that frame's self time over the run). A caller row has none: time only flows through it,
    and its inclusive value says how much. The root keeps its own.

    Read a "self" column from this, never from `tree.exclusive`: the inverted tree stores each
    path's time at the path's outermost caller — that is what makes its inclusive values the
    time through each caller chain — so `exclusive` would show the time as the self time of the
    outermost caller (`<module>`), which spent none of it."""
    out = np.zeros_like(tree.exclusive)
    level_one = np.flatnonzero(tree.parent == 0)
    out[level_one] = tree.inclusive[level_one]
    out[0] = tree.exclusive[0]
    return out


def node_flags(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """(has a source line on its path, lies under a `[backward]` marker) for every node."""
    kinds = np.array([f.kind for f in profile.frames], dtype=object)
    src = np.array([f.has_source for f in profile.frames], dtype=bool)
    cct = profile.cct
    on_src = propagate_down(cct, src[cct.frame])
    in_bwd = propagate_down(cct, (kinds == "backward")[cct.frame])
    return on_src, in_bwd
