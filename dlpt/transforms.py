"""Tree transformations: pure functions `(profile, options) -> profile`, in the manner of
pyinstrument's processors. None of them mutates its input."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dlpt.cct import CCT, renumber, sum_rows
from dlpt.frames import is_library
from dlpt.metrics import COL

if TYPE_CHECKING:
    # Annotations only: the transforms rebuild the profile they are given (`replace`), and
    # dlpt.profile's conveniences reach them through dlpt.interop.
    from dlpt.profile import Profile


def propagate_down(cct: CCT, mask: np.ndarray) -> np.ndarray:
    """`out[i]` is true when node i or any of its ancestors has `mask` set."""
    out = mask.copy()
    for lv in cct.levels[1:]:
        out[lv] |= out[cct.parent[lv]]
    return out


def nearest_marked(cct: CCT, mask: np.ndarray) -> np.ndarray:
    """`out[i]` is the nearest of node i and its ancestors that has `mask` set, or -1."""
    out = np.where(mask, np.arange(len(mask)), -1)
    for lv in cct.levels[1:]:
        lv = lv[out[lv] < 0]
        out[lv] = out[cct.parent[lv]]
    return out


def collapse(profile: Profile, hidden_frames: np.ndarray) -> Profile:
    """Remove the nodes whose frame is hidden; their children move up to the nearest kept
    ancestor, merging with siblings of the same frame, and their own metrics go with them.
    Metric totals are unchanged."""
    cct = profile.cct
    hide = np.asarray(hidden_frames, dtype=bool)[cct.frame]
    # A frame with no caller to take its time (under the root, or a rank's node) stays: what runs
    # before a program's first line (an import's tokenizing) is shown where it is. The root stays
    # by the same line: its "parent" (`max(-1, 0)`) is itself, a `root` frame.
    top = np.fromiter((f.kind in ("root", "rank") for f in profile.frames), dtype=bool, count=len(profile.frames))
    hide &= ~top[cct.frame[np.maximum(cct.parent, 0)]]
    if not hide.any():
        return profile
    bparent, bframe, node_map = merge_map(cct, hide)
    exc = sum_rows(node_map, cct.exclusive, len(bparent))
    act = replace(profile.activities, node=node_map[profile.activities.node])
    return replace(profile, cct=CCT(bparent, bframe, exc), activities=act)


def merge_map(cct: CCT, hide: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parent, frame, node_map) of the tree without the `hide` nodes (a mask over nodes; never
    the root), in preorder: a hidden node's children move up to its nearest kept ancestor,
    merging with siblings of the same frame; `node_map[i]` is where node i (or, hidden, its
    nearest kept ancestor) went.

    Vectorised by levels: a kept node's new identity is (new identity of its nearest kept
    ancestor, frame), assigned for all nodes of one kept-depth at once with `np.unique`, so a
    million-node tree takes a few dozen numpy passes rather than a Python loop per node."""
    n = len(cct)
    parent = cct.parent
    # Nearest kept strict ancestor of every node.
    ka = parent.copy()
    live = np.flatnonzero(ka > 0)
    live = live[hide[ka[live]]]
    while len(live):
        ka[live] = parent[ka[live]]
        live = live[(ka[live] > 0) & hide[ka[live]]]
    kept = np.flatnonzero(~hide)[1:]
    # Depth among kept nodes only: merged nodes always share it.
    kdepth = np.zeros(n, dtype=np.int64)
    anc = ka[kept].copy()
    live = np.arange(len(kept))
    while len(live):
        kdepth[kept[live]] += 1
        a = anc[live]
        nxt = live[a > 0]
        anc[nxt] = ka[anc[nxt]]
        live = nxt
    merged = np.zeros(n, dtype=np.int64)
    nf = int(cct.frame.max()) + 1
    new_parent = [np.array([-1], dtype=np.int64)]
    new_frame = [cct.frame[:1]]
    next_id = 1
    order = kept[np.argsort(kdepth[kept], kind="stable")]
    cuts = np.flatnonzero(np.diff(kdepth[order])) + 1
    for lv in np.split(order, cuts):
        if not len(lv):
            continue
        keys = merged[ka[lv]] * nf + cct.frame[lv]
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        merged[lv] = next_id + inv
        new_parent.append(merged[ka[lv[first]]])
        new_frame.append(cct.frame[lv[first]])
        next_id += len(uniq)
    hidden_nodes = np.flatnonzero(hide)
    merged[hidden_nodes] = merged[ka[hidden_nodes]]
    bparent, bframe, new_of_old = renumber(np.concatenate(new_parent), np.concatenate(new_frame))
    return bparent, bframe, new_of_old[merged]


_DEF = re.compile(r"^\s*(?:async\s+)?def\s")


def def_line_mask(profile: Profile) -> np.ndarray:
    """Per frame: a recording's source frame that stands on its function's `def` line. A frame
    reads its `def` line only before its first line runs — a torch.compile'd function, whose
    compiled code runs beneath its untouched frame — so its time belongs to the line that called
    it. Imported traces name every function by its def line: none there."""
    out = np.zeros(len(profile.frames), dtype=bool)
    if profile.collector not in ("record", "mixed"):
        return out
    split: dict[str, list[str]] = {}
    for i, f in enumerate(profile.frames):
        if f.kind != "python" or not f.has_source or f.file not in profile.sources:
            continue
        lines = split.get(f.file)
        if lines is None:
            lines = split[f.file] = profile.sources[f.file].splitlines()
        out[i] = f.line <= len(lines) and bool(_DEF.match(lines[f.line - 1]))  # has_source: line > 0
    return out


def def_lines_to_callers(profile: Profile, also: np.ndarray | None = None) -> Profile:
    """`collapse` of the frames on a `def` line (`def_line_mask`), and of `also` (a frame mask)."""
    hidden = def_line_mask(profile)
    if also is not None:
        hidden |= also
    return collapse(profile, hidden)


def library_mask(profile: Profile) -> np.ndarray:
    return np.fromiter((is_library(f) for f in profile.frames), dtype=bool, count=len(profile.frames))


def hide_library(profile: Profile) -> Profile:
    """Hide torch internals, the standard library, C builtins and dlpt: what is left is the
    user's source lines, modules, ops and the GPU work beneath them."""
    return collapse(profile, library_mask(profile))


def hide_library_unless(profile: Profile, include_library: bool) -> Profile:
    """`hide_library`, unless the user asked to see library frames (`--include-library`): the
    one switch every view, export and report goes through."""
    return profile if include_library else hide_library(profile)


def focus(profile: Profile, node: int) -> Profile:
    """The subtree of `node` as a tree of its own (its ancestors become the root's place)."""
    cct = profile.cct
    lo, hi = node, int(cct.end[node])
    idx = np.arange(lo, hi)
    parent = np.where(idx == lo, -1, cct.parent[lo:hi] - lo)
    act_sel = (profile.activities.node >= lo) & (profile.activities.node < hi)
    acts = profile.activities
    act = type(acts)(**{k: getattr(acts, k)[act_sel] for k in acts.__dataclass_fields__})
    act.node = act.node - lo
    return replace(profile, cct=CCT(parent, cct.frame[lo:hi], cct.exclusive[lo:hi]), activities=act)


def prune_empty(profile: Profile) -> Profile:
    """Drop the nodes whose every inclusive metric is zero, and the frames no node or activity
    uses any more. A recording walks every Python call; calls with no op or GPU work beneath
    (torch.compile's tracing, imports) would otherwise fill the tree — 790k of 793k nodes of a
    recorded compile — without changing any total. Preorder survives: a kept node's ancestors
    are kept (their inclusive metrics are at least its own)."""
    cct = profile.cct
    keep = np.asarray(cct.inclusive.any(axis=1), dtype=bool)
    keep[0] = True
    acts = profile.activities
    if keep.all():
        used = np.zeros(len(profile.frames), dtype=bool)
        used[cct.frame] = True
        used[acts.name] = True
        if used.all():
            return profile
    new_id = np.cumsum(keep) - 1
    idx = np.flatnonzero(keep)
    parent = np.where(idx == 0, -1, new_id[np.maximum(cct.parent[idx], 0)])
    frame = cct.frame[idx]
    used = np.zeros(len(profile.frames), dtype=bool)
    used[frame] = True
    used[acts.name] = True
    frame_id = np.cumsum(used) - 1
    frames = [f for f, u in zip(profile.frames, used.tolist()) if u]
    act = replace(acts, node=new_id[acts.node], name=frame_id[acts.name])
    return replace(profile, frames=frames, cct=CCT(parent, frame_id[frame], cct.exclusive[idx]), activities=act)


def drop_subtrees(profile: Profile, drop: np.ndarray) -> Profile:
    """The profile without the `drop` nodes (whole subtrees, all metrics zero): preorder kept."""
    if not drop.any():
        return profile
    cct = profile.cct
    keep = ~drop
    keep[0] = True
    new_id = np.cumsum(keep) - 1
    idx = np.flatnonzero(keep)
    parent = np.where(idx == 0, -1, new_id[np.maximum(cct.parent[idx], 0)])
    acts = profile.activities
    return replace(profile, cct=CCT(parent, cct.frame[idx], cct.exclusive[idx]),
                   activities=replace(acts, node=new_id[acts.node]))


def fold_into_parents(profile: Profile, fold: np.ndarray) -> Profile:
    """The profile without the `fold` nodes and their subtrees, each folded subtree's inclusive
    metrics added to its parent's own: every total is kept, the tree gets smaller. For subtrees
    with no activities (a folded node's GPU rows would lose their node)."""
    cct = profile.cct
    fold = propagate_down(cct, fold & (np.arange(len(fold)) > 0))
    if not fold.any():
        return profile
    acts = profile.activities
    if len(acts) and fold[acts.node].any():
        raise ValueError("fold_into_parents: folded nodes hold activities")
    tops = np.flatnonzero(fold & ~fold[np.maximum(cct.parent, 0)])
    exc = cct.exclusive.copy()
    np.add.at(exc, cct.parent[tops], cct.inclusive[tops])
    exc[fold] = 0
    return drop_subtrees(replace(profile, cct=CCT(cct.parent, cct.frame, exc)), fold)


def to_block(profile: Profile, entry_file: str) -> Profile:
    """A recording of one block of code that runs in `entry_file` (a notebook cell), as its user
    reads it, pyinstrument's cell view alike: the threads under the root that never ran the
    block's code and hold nothing but host time (threads that were running before it: a notebook
    kernel's heartbeat, I/O and control threads) dropped with their host time; then every frame
    outside the block's code on the other paths (the kernel's machinery: the block's callers and
    what they did beside it) hidden, the block's outermost frames moving up to the root, the
    machinery's own time going to the root. Threads the block started stay
    (beneath the line that started them), as does any thread with GPU work, ops or memory."""
    cct, frames = profile.cct, profile.frames
    mine = np.fromiter((f.kind == "python" and f.file == entry_file for f in frames), dtype=bool,
                       count=len(frames))
    if not mine[cct.frame].any():
        return profile
    others = np.delete(cct.inclusive, [COL["host_time"]], axis=1).any(axis=1)
    has_mine = np.zeros(len(cct), dtype=bool)
    for i in np.flatnonzero(mine[cct.frame]).tolist():  # mark ancestors, each once
        j = i
        while j >= 0 and not has_mine[j]:
            has_mine[j] = True
            j = int(cct.parent[j])
    thread = np.fromiter((f.kind == "thread" for f in frames), dtype=bool, count=len(frames))[cct.frame]
    top = np.flatnonzero((cct.parent == 0) & thread & ~has_mine & ~others)
    drop = np.zeros(len(cct), dtype=bool)
    for t in top.tolist():
        drop[t:int(cct.end[t])] = True
    keep = ~drop
    new_id = np.cumsum(keep) - 1
    idx = np.flatnonzero(keep)
    parent = np.where(idx == 0, -1, new_id[np.maximum(cct.parent[idx], 0)])
    acts = profile.activities
    kept = replace(profile, cct=CCT(parent, cct.frame[idx], cct.exclusive[idx]),
                   activities=replace(acts, node=new_id[acts.node]))
    # The callers: every node outside the block's code and outside the threads kept (the
    # kernel's machinery around the block: its callers, and what they did beside it while it ran,
    # such as compiling the cell), never the root.
    below = propagate_down(kept.cct, mine[kept.cct.frame])
    tops = (kept.cct.parent == 0) & thread[idx]
    callers = ~below & ~propagate_down(kept.cct, tops)
    callers[0] = False
    if not callers.any():
        return kept
    bparent, bframe, node_map = merge_map(kept.cct, callers)
    exc = sum_rows(node_map, kept.cct.exclusive, len(bparent))
    return replace(kept, cct=CCT(bparent, bframe, exc), activities=replace(kept.activities, node=node_map[kept.activities.node]))


FOLD_SHARE = 0.001


def fold_sampled_library(prof: Profile) -> Profile:
    """Library subtrees that only the sampler saw (host and idle time, nothing else) and that
    hold under 0.1% of either fold into their caller: the sampler walks every import and every
    call torch makes in Python, thousands of contexts a view would hide anyway, while their
    time stays on the line that called them."""
    cct = prof.cct
    inc = cct.inclusive
    sampled = [COL["host_time"], COL["gpu_idle_time"]]
    only = ~np.delete(inc, sampled, axis=1).any(axis=1)
    small = np.ones(len(cct), dtype=bool)
    for c in sampled:
        small &= inc[:, c] < FOLD_SHARE * max(int(inc[0, c]), 1)
    lib = np.fromiter((is_library(f) for f in prof.frames), dtype=bool, count=len(prof.frames))[cct.frame]
    # A subtree at the top (under the root, or a phase's node, which becomes the root) stays: its
    # caller would be the root, whose own time no view shows.
    top = np.fromiter((f.kind in ("root", "phase") for f in prof.frames), dtype=bool, count=len(prof.frames))
    lib &= ~top[cct.frame[np.maximum(cct.parent, 0)]]
    return prune_empty(fold_into_parents(prof, only & small & lib))  # and the frames no node uses now
