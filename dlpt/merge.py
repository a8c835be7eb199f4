"""Several profiles as one: each input's tree under a `rank N` node (docs/ARCHITECTURE.md, "The model").

The one merge of dlpt: `dlpt import` of several files, the reading commands given several
profiles or a directory, and the Kineto importer given several traces all come here. It is
linear in the total number of nodes, frames and activities: each input's preorder arrays are
shifted and concatenated (its root becomes its rank node, so the result is in preorder with no
renumbering), and frames are interned once each.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from dlpt.cct import CCT
from dlpt.commwait import comm_wait_columns
from dlpt.errors import notice
from dlpt.frames import Frame, FrameTable
from dlpt.metrics import COL, METRICS
from dlpt.profile import Activities, Profile, unknown_device_events
from dlpt.version import __version__

RANK_PREFIX = "rank "


def rank_frame(rank: int, path: str = "") -> Frame:
    """The frame heading rank `rank`'s tree; `file` says which input it came from."""
    return Frame("rank", f"{RANK_PREFIX}{rank}", path)


def rank_of(frame: Frame) -> int | None:
    """The rank number of a `rank N` frame, else None."""
    if frame.kind != "rank" or not frame.name.startswith(RANK_PREFIX):
        return None
    text = frame.name[len(RANK_PREFIX):]
    return int(text) if text.isdigit() else None


def is_merged(profile: Profile) -> bool:
    """Does the profile already hold several ranks (every top node a `rank N` node)?"""
    kids = _top_nodes(profile)
    return len(kids) > 0 and all(profile.frame_of(int(k)).kind == "rank" for k in kids)


def _top_nodes(profile: Profile) -> np.ndarray:
    # One linear pass: CCT.children would sort every node by parent first.
    return np.flatnonzero(profile.cct.parent == 0)


def _first_rank(merged: Profile) -> int:
    nums = [rank_of(merged.frame_of(int(k))) for k in _top_nodes(merged)]
    return min((n for n in nums if n is not None), default=0)


def rank_numbers(profiles: list[Profile]) -> list[int]:
    """The rank of each input: the rank its meta records (torchrun's RANK, a trace's
    distributedInfo) when every input has one and no two share it; else the inputs' order.
    Repeated ranks usually mean two runs were mixed, which is worth a warning."""
    known = [p.meta.get("rank") for p in profiles]
    if all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in known):
        if len(set(known)) == len(known):
            return [int(r) for r in known]  # type: ignore[arg-type]
        notice("warning: several inputs are the same rank (two runs mixed?); numbering them "
               f"0..{len(profiles) - 1} in the order given")
    return list(range(len(profiles)))


def merge_profiles(profiles: list[Profile]) -> Profile:
    """One profile whose root holds a `rank N` node per input, in rank order; an input that is
    itself merged contributes its rank nodes as they are. Totals are the sums of the inputs'."""
    if len(profiles) == 1:
        return profiles[0]
    merged_in = [is_merged(p) for p in profiles]
    it = iter(rank_numbers([p for p, m in zip(profiles, merged_in) if not m]))
    keyed = [(None if m else next(it), p) for p, m in zip(profiles, merged_in)]
    keyed.sort(key=lambda rp: rp[0] if rp[0] is not None else _first_rank(rp[1]))
    table = FrameTable()
    root = table.intern(Frame("root", f"{len(profiles)} profiles"))
    parents = [np.array([-1], dtype=np.int64)]
    frames = [np.array([root], dtype=np.int64)]
    excs = [np.zeros((1, len(METRICS)), dtype=np.int64)]
    act_parts: list[Activities] = []
    ranks_meta: list[dict[str, Any]] = []
    offset = 1
    # Comm wait needs every rank's collective calls side by side: estimated here, where the
    # ranks meet (dlpt/commwait.py).
    singles = [p for rank, p in keyed if rank is not None]
    waits = dict(zip(map(id, singles), comm_wait_columns(singles) or []))
    for rank, p in keyed:
        cct = p.cct
        fmap = np.fromiter((table.intern(f) for f in p.frames), dtype=np.int64, count=len(p.frames))
        if rank is None:
            # Already merged: drop its root, keep its rank nodes (old id i becomes offset+i-1).
            shift = offset - 1
            par = cct.parent[1:]
            parents.append(np.where(par == 0, 0, par + shift))
            frames.append(fmap[cct.frame[1:]])
            excs.append(cct.exclusive[1:])
            excs[0] = excs[0] + cct.exclusive[:1]
            node_of = np.r_[0, np.arange(1, len(cct)) + shift]
            ranks_meta.extend(p.meta.get("ranks") or [])
            offset += len(cct) - 1
        else:
            # Its root becomes its rank node (old id i becomes offset+i).
            par = cct.parent + offset
            par[0] = 0
            fr = fmap[cct.frame]
            fr[0] = table.intern(rank_frame(rank, p.path))
            parents.append(par)
            frames.append(fr)
            exc = cct.exclusive
            if id(p) in waits:
                exc = exc.copy()
                exc[:, COL["comm_wait_time"]] += waits[id(p)]
            excs.append(exc)
            node_of = np.arange(len(cct)) + offset
            ranks_meta.append(_rank_meta(rank, p))
            offset += len(cct)
        act = p.activities
        if len(act):
            act_parts.append(Activities(**{f.name: _remap(f.name, getattr(act, f.name), node_of, fmap)
                                           for f in fields(Activities)}))
    if act_parts:
        activities = Activities(**{f.name: np.concatenate([getattr(a, f.name) for a in act_parts])
                                   for f in fields(Activities)})
    else:
        activities = Activities.empty()
    cct = CCT(np.concatenate(parents), np.concatenate(frames), np.concatenate(excs))
    sources: dict[str, str] = {}
    for p in profiles:
        for k, v in p.sources.items():
            sources.setdefault(k, v)
    meta = _merged_meta(profiles, ranks_meta)
    if waits:
        meta["comm_wait"] = "estimated per collective call from the ranks' start times (dlpt/commwait.py)"
    return Profile(frames=list(table.frames), cct=cct, activities=activities, meta=meta, sources=sources,
                   path=profiles[0].path)


def _remap(name: str, values: np.ndarray, node_of: np.ndarray, fmap: np.ndarray) -> np.ndarray:
    if name == "node":
        return node_of[values]
    if name == "name":
        return fmap[values]
    return values


def _rank_meta(rank: int, p: Profile) -> dict[str, Any]:
    m = p.meta
    out: dict[str, Any] = {"rank": rank, "path": p.path}
    for k in ("world_size", "local_rank", "host", "command", "source", "window", "gpu_idle", "memory",
              "unknown_device_events"):
        if m.get(k) is not None:
            out[k] = m[k]
    return out


def _merged_meta(profiles: list[Profile], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    sources = {p.collector for p in profiles}
    first = profiles[0].meta
    meta: dict[str, Any] = {
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "dlpt_version": __version__,
        "command": first.get("command", ""),
        "ranks": ranks,
        "world_size": max([int(r.get("world_size") or 0) for r in ranks] + [len(ranks)]),
    }
    skipped = sum(int(p.meta.get("skipped_events", 0) or 0) for p in profiles)
    if skipped:
        meta["skipped_events"] = skipped
    unknown = unknown_device_events(*profiles)
    if unknown:
        meta["unknown_device_events"] = unknown
    for k in ("torch_version", "cuda_version", "devices", "cuda_runtime_version"):
        if first.get(k) is not None:
            meta[k] = first[k]
    return meta
