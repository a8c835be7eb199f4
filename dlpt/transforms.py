"""Tree transformations: pure functions `(profile, options) -> profile`, in the manner of
pyinstrument's processors. None of them mutates its input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dlpt.cct import CCT, TreeBuilder
from dlpt.frames import is_library
from dlpt.profile import Profile


def propagate_down(cct: CCT, mask: np.ndarray) -> np.ndarray:
    """`out[i]` is true when node i or any of its ancestors has `mask` set."""
    out = mask.copy()
    depth = cct.depth
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(1, int(depth.max(initial=0)) + 2))
    for a, b in zip(bounds[:-1], bounds[1:]):
        lv = order[a:b]
        out[lv] |= out[cct.parent[lv]]
    return out


def collapse(profile: Profile, hidden_frames: np.ndarray) -> Profile:
    """Remove the nodes whose frame is hidden; their children move up to the nearest kept
    ancestor, merging with siblings of the same frame, and their own metrics go with them.
    Metric totals are unchanged."""
    cct = profile.cct
    hide = hidden_frames[cct.frame]
    hide[0] = False
    if not hide.any():
        return profile
    b = TreeBuilder(int(cct.frame[0]))
    parent = cct.parent.tolist()
    frame = cct.frame.tolist()
    hide_l = hide.tolist()
    new = [0] * len(parent)
    child = b.child
    for i in range(1, len(parent)):
        p = new[parent[i]]
        new[i] = p if hide_l[i] else child(p, frame[i])
    bparent, bframe, new_of_old = b.preorder()
    node_map = new_of_old[np.asarray(new, dtype=np.int64)]
    exc = np.zeros((len(bparent), cct.exclusive.shape[1]), dtype=np.int64)
    np.add.at(exc, node_map, cct.exclusive)
    act = replace(profile.activities, node=node_map[profile.activities.node])
    return replace(profile, cct=CCT(bparent, bframe, exc), activities=act)



def library_mask(profile: Profile) -> np.ndarray:
    return np.fromiter((is_library(f) for f in profile.frames), dtype=bool, count=len(profile.frames))


def hide_library(profile: Profile) -> Profile:
    """Hide torch internals, the standard library, C builtins and dlpt: what is left is the
    user's source lines, modules, ops and the GPU work beneath them."""
    return collapse(profile, library_mask(profile))


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
