"""Several profiles as one: each input's tree under a `rank N` node (docs/ARCHITECTURE.md, "The model").

The one merge of dlpt: `dlpt import` of several files, the reading commands given several
profiles or a directory, and the Kineto importer given several traces all come here. It is
linear in the total number of nodes, frames and activities: each input's preorder arrays are
shifted and concatenated (its root becomes its rank node, so the result is in preorder with no
renumbering), and frames are interned once each.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from dlpt.cct import CCT
from dlpt.commwait import collective_span, comm_wait_by_phase
from dlpt.errors import DlptError
from dlpt.frames import Frame, FrameTable
from dlpt.header import Header
from dlpt.metrics import COL, METRICS
from dlpt.phases import PHASES, STEADY, phase_profile_rows, table_of
from dlpt.profile import Activities, PhaseTable, Profile, unknown_device_events
from dlpt.runs import run_conflict
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


def _rank_numbers_of(merged: Profile) -> list[int]:
    nums = [rank_of(merged.frame_of(int(k))) for k in _top_nodes(merged)]
    return [n for n in nums if n is not None]


def _first_rank(merged: Profile) -> int:
    return min(_rank_numbers_of(merged), default=0)


def rank_numbers(profiles: list[Profile], taken: set[int] | None = None) -> list[int]:
    """The rank of each input: the rank its meta records (torchrun's RANK, a trace's
    distributedInfo) when every input has one and no two share it (`merge_profiles` refuses
    inputs that share one: dlpt/runs.py); else the inputs' order, skipping the numbers in
    `taken` (the ranks of inputs that are already merged)."""
    known = [p.meta.rank for p in profiles]
    if all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in known):
        if len(set(known)) == len(known) and not set(known) & (taken or set()):
            return [int(r) for r in known]  # type: ignore[arg-type]
    free = (k for k in range(len(profiles) + len(taken or ())) if k not in (taken or set()))
    return [next(free) for _ in profiles]


def merge_profiles(profiles: list[Profile], as_ranks: bool = False) -> Profile:
    """One profile whose root holds a `rank N` node per input, in rank order; an input that is
    itself merged contributes its rank nodes as they are. Totals are the sums of the inputs'.

    Inputs that are not the ranks of one run (`dlpt.runs.run_conflict`: the same rank twice,
    different world sizes or runs, profiled far apart) are refused with a DlptError that names
    two of them; `as_ranks` merges them anyway, numbering every rank 0..N-1 in the order given."""
    if len(profiles) == 1:
        return profiles[0]
    merged_in = [is_merged(p) for p in profiles]
    counts = [len(_top_nodes(p)) if m else 1 for p, m in zip(profiles, merged_in)]  # ranks of each
    if not as_ranks:
        why = run_conflict(profiles, merged_in)
        if why is not None:
            raise DlptError(f"{why}, so they are not the ranks of one run; to merge them as ranks anyway "
                            f"(numbered 0..{sum(counts) - 1} in the order given), pass --as-ranks")
    renumber: dict[int, list[int]] = {}  # input index -> the new numbers of its rank nodes
    if as_ranks:
        # Every rank numbered in the order given, those of merged inputs too.
        starts = np.r_[0, np.cumsum(counts)[:-1]].tolist()
        keyed = list(zip(starts, range(len(profiles))))
        renumber = {i: list(range(starts[i], starts[i] + counts[i])) for i, m in enumerate(merged_in) if m}
    else:
        taken = {r for p, m in zip(profiles, merged_in) if m for r in _rank_numbers_of(p)}
        it = iter(rank_numbers([p for p, m in zip(profiles, merged_in) if not m], taken))
        keyed = [(_first_rank(p) if m else next(it), i) for i, (p, m) in enumerate(zip(profiles, merged_in))]
    keyed.sort(key=lambda ri: ri[0])
    table = FrameTable()
    root = table.intern(Frame("root", f"{len(profiles)} profiles"))
    parents = [np.array([-1], dtype=np.int64)]
    frames = [np.array([root], dtype=np.int64)]
    excs = [np.zeros((1, len(METRICS)), dtype=np.int64)]
    act_parts: list[Activities] = []
    ranks_meta: list[Header] = []
    offset = 1
    # Comm wait needs every rank's collective calls side by side: estimated here, where the
    # ranks meet (dlpt/commwait.py).
    singles = [i for _, i in keyed if not merged_in[i]]
    waits = dict(zip(singles, comm_wait_by_phase([profiles[i] for i in singles]) or []))
    # Each phase's rows follow their nodes (dlpt/phases.py), once any input has phases: an input
    # without them is all steady state.
    phased = any(table_of(p) is not None for p in profiles)
    names: list[str] = list(PHASES)
    ph_node: list[np.ndarray] = []
    ph_phase: list[np.ndarray] = []
    ph_exc: list[np.ndarray] = []
    ph_act: list[np.ndarray] = []
    for rank, i in keyed:
        p = profiles[i]
        cct = p.cct
        fmap = np.fromiter((table.intern(f) for f in p.frames), dtype=np.int64, count=len(p.frames))
        if merged_in[i]:
            # Already merged: drop its root, keep its rank nodes (old id i becomes offset+i-1).
            shift = offset - 1
            par = cct.parent[1:]
            parents.append(np.where(par == 0, 0, par + shift))
            fr = fmap[cct.frame[1:]]
            metas = [replace(m) for m in p.meta.ranks or []]
            if i in renumber:  # --as-ranks: its ranks take the numbers given them
                for j, (node, new_rank) in enumerate(zip(_top_nodes(p).tolist(), renumber[i])):
                    old_frame = p.frame_of(node)
                    fr[node - 1] = table.intern(rank_frame(new_rank, old_frame.file))
                    if j < len(metas):
                        metas[j].rank = new_rank
            frames.append(fr)
            excs.append(cct.exclusive[1:])
            excs[0] = excs[0] + cct.exclusive[:1]
            node_of = np.r_[0, np.arange(1, len(cct)) + shift]
            ranks_meta.extend(metas)
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
            if i in waits:
                exc = exc.copy()
                for col in waits[i].values():
                    exc[:, COL["comm_wait_time"]] += col
            excs.append(exc)
            node_of = np.arange(len(cct)) + offset
            ranks_meta.append(_rank_meta(rank, p))
            offset += len(cct)
        if phased:
            t = phase_profile_rows(p)
            names.extend(n for n in t.names if n not in names)
            code = np.asarray([names.index(n) for n in t.names], dtype=np.int64)
            ph_node.append(node_of[t.node])
            ph_phase.append(code[t.phase] if len(t.phase) else t.phase)
            ph_exc.append(t.exclusive)
            ph_act.append(code[t.activity_phase] if len(t.activity_phase) else t.activity_phase)
            for ph, col in waits.get(i, {}).items():  # comm wait, estimated here, in its phase
                nz = np.flatnonzero(col)
                rows = np.zeros((len(nz), len(METRICS)), dtype=np.int64)
                rows[:, COL["comm_wait_time"]] = col[nz]
                ph_node.append(node_of[nz])
                ph_phase.append(np.full(len(nz), names.index(ph if ph in names else STEADY), dtype=np.int64))
                ph_exc.append(rows)
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
        meta.comm_wait = "estimated per collective call from the ranks' start times (dlpt/commwait.py)"
        dropped = sum(sum((profiles[i].meta.collectives_dropped or {}).values()) for i in singles)
        if dropped:
            meta.comm_wait += f"; {dropped:,} collective entries past the log's limit were not kept: it is short"
    out = Profile(frames=list(table.frames), cct=cct, activities=activities, meta=meta, sources=sources,
                  path=profiles[0].path)
    if phased:
        out.phases = PhaseTable(tuple(names), np.concatenate(ph_node), np.concatenate(ph_phase),
                                np.concatenate(ph_exc), np.concatenate(ph_act) if ph_act else np.zeros(0, np.int64),
                                cct, activities)
    return out


def _remap(name: str, values: np.ndarray, node_of: np.ndarray, fmap: np.ndarray) -> np.ndarray:
    if name == "node":
        return node_of[values]
    if name == "name":
        return fmap[values]
    return values


def _rank_meta(rank: int, p: Profile) -> Header:
    """The rank's entry in the merged header's `ranks`: its own figures, and what tells ranks of
    one run from other runs (dlpt/runs.py), kept for the next merge."""
    m = p.meta
    return Header(rank=rank, path=p.path, world_size=m.world_size, local_rank=m.local_rank, host=m.host,
                  command=m.command, source=m.source, window=m.window, gpu_idle=m.gpu_idle, memory=m.memory,
                  phases=m.phases, run_id=m.run_id, start_time=m.start_time, wall_window=m.wall_window,
                  host_pids=m.host_pids, unknown_device_events=m.unknown_device_events,
                  collective_span=collective_span(p) or None)


def _merged_meta(profiles: list[Profile], ranks: list[Header]) -> Header:
    sources = {p.collector for p in profiles}
    first = profiles[0].meta
    skipped = sum(p.meta.skipped_events or 0 for p in profiles)
    return Header(
        source=sources.pop() if len(sources) == 1 else "mixed",
        dlpt_version=__version__,
        command=first.command if first.command is not None else "",
        ranks=ranks,
        world_size=max([r.world_size or 0 for r in ranks] + [len(ranks)]),
        skipped_events=skipped or None,
        unknown_device_events=unknown_device_events(*profiles) or None,
        torch_version=first.torch_version, cuda_version=first.cuda_version, devices=first.devices,
        cuda_runtime_version=first.cuda_runtime_version)
