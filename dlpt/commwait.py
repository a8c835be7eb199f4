"""Comm wait: how long each rank's collectives waited for the last rank to arrive.

A collective finishes only once every rank has entered it, so a rank that enters early waits
for the last one. The recorder logs each collective op's calls (`meta.collectives`: the op's
path of frames, and each call's start and end in the wall clock). When all ranks' profiles are
read together, the k-th call of the same op path on each rank is one instance of the
collective (ranks issue their collectives in the same order: DDP's buckets, an all_reduce in the
step), and rank r waits in it over the interval

    [start(r), max over ranks of start]

For a GPU collective (NCCL) the recorder also logs each collective kernel, whose start on the
GPU stands for the rank's arrival: the kernel begins when its rank's stream reaches it and ends
once every rank has. This is an estimate: it assumes the ranks' clocks agree (one host: the same clock), that the
transfer starts once the last rank arrives, and that the rank waits for the result (a blocking
`dist.all_reduce`, the step's end for DDP's buckets). The op itself often returns at once
(the wait happens in `work.wait()`, outside any op), so its duration does not bound the wait;
a rank that overlaps an asynchronous collective with its own work is overestimated. A rank's
intervals overlap when it queues several collectives before the late rank arrives (DDP's
buckets): the wait is their union, each instance taking the part that earlier ones left. The
wait goes to `comm_wait_time` on the op's node (a kernel's: the node that launched it), under
the line that issued it; the rest of the call is the transfer (and, for a collective that
returns at once, work done later). gloo's collectives are host ops, so this is host-side timing;
NCCL's are timed on the GPUs, whose CUPTI timestamps share the host's clock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlpt.frames import Frame
from dlpt.profile import Profile


def _node_of_path(profile: Profile, path: list[list[Any]]) -> int | None:
    """The node reached from the root through frames equal to `path` (kind, name, file, line,
    function), or None where the profile has no such path."""
    cct = profile.cct
    node = 0
    for want in path:
        target = Frame(*want)
        nxt = None
        for c in cct.children(node).tolist():
            if profile.frames[cct.frame[c]] == target:
                nxt = c
                break
        if nxt is None:
            return None
        node = nxt
    return node


def collective_span(profile: Profile) -> int | None:
    """The time from the rank's first collective's start to its last one's end (ns), the stretch
    over which it ran in step with the others; None where it logged none."""
    log = profile.meta.collectives or []
    starts = [min(e["start"]) for e in log if e.get("start")]
    ends = [max(e["end"]) for e in log if e.get("end")]
    return int(max(ends) - min(starts)) if starts and ends else None


def comm_wait_columns(profiles: list[Profile]) -> list[np.ndarray] | None:
    """Each profile's comm_wait_time per node (one array per profile, its nodes' exclusive
    values), or None when fewer than two of them logged collective calls."""
    by_phase = comm_wait_by_phase(profiles)
    if by_phase is None:
        return None
    return [sum(d.values(), np.zeros(len(p.cct), dtype=np.int64)) for p, d in zip(profiles, by_phase)]


def comm_wait_by_phase(profiles: list[Profile]) -> list[dict[str | None, np.ndarray]] | None:
    """`comm_wait_columns` per phase (dlpt/phases.py): each profile's comm_wait_time per node for
    each phase its collectives ran in (None: a profile without phases). Calls are matched across
    ranks within a phase, so the start-up's rendezvous (DDP's first broadcast) never pairs with a
    step's all-reduce."""
    # A rank's collective ops' calls and its collective kernels (`"gpu"`), each kind matched
    # across ranks on its own. GPU recordings need both: the backward pass's ops (DDP's buckets)
    # are not seen on the host there, and NCCL's first call on a communicator waits on the host,
    # before any kernel, for every rank to join. Where a call and its kernel overlap, the union
    # below counts the wait once.
    logs = [[e for e in p.meta.collectives or [] if e.get("start")] for p in profiles]
    if sum(1 for g in logs if g) < 2:
        return None
    out: list[dict[str | None, np.ndarray]] = [{} for _ in profiles]
    calls: dict[tuple, list[tuple[int, int, np.ndarray, np.ndarray | None]]] = {}
    # A rank that logged collective kernels ran its collectives on the GPU (NCCL): its host calls
    # return at once, so a call's wait is what it blocked for, at most its own end (the first call
    # on a communicator blocks until every rank has joined); the kernels carry the rest.
    on_gpu = [any(e.get("gpu") for e in log) for log in logs]
    for r, (p, log) in enumerate(zip(profiles, logs)):
        for entry in log:
            node = _node_of_path(p, entry["path"])
            if node is None:
                continue
            key = (bool(entry.get("gpu")), entry.get("phase"), *(tuple(f) for f in entry["path"]))
            clip = on_gpu[r] and not entry.get("gpu")
            calls.setdefault(key, []).append((r, node, np.asarray(entry["start"], dtype=np.int64),
                                              np.asarray(entry["end"], dtype=np.int64) if clip else None))
    # Each instance's waiting interval on each rank: [own start, the last rank's start].
    spans: list[list[tuple[int, int, int, str | None]]] = [[] for _ in profiles]  # (start, last, node, phase)
    for key, per_rank in calls.items():
        if len(per_rank) < 2:
            continue  # an op on one rank only: nothing to wait for
        k = min(len(s) for _, _, s, _ in per_rank)
        starts = np.stack([s[:k] for _, _, s, _ in per_rank])
        last = starts.max(axis=0)
        for (r, node, _, ends), row in zip(per_rank, starts):
            until = last if ends is None else np.minimum(last, ends[:k])
            spans[r].extend(zip(row.tolist(), until.tolist(), [node] * k, [key[1]] * k))
    # A rank waits once for all the collectives it has queued: DDP issues a step's buckets one
    # after another without blocking, and each waits for the same late rank. Summing each
    # instance's interval would count that wait once per bucket, so each instance gets only the
    # part of its interval no earlier one covered (the union, handed out in start order).
    for r, items in enumerate(spans):
        covered = None
        for start, end, node, phase in sorted(items, key=lambda x: x[:3]):
            lo = start if covered is None else max(start, covered)
            if end > lo:
                col = out[r].setdefault(phase, np.zeros(len(profiles[r].cct), dtype=np.int64))
                col[node] += end - lo
            covered = end if covered is None else max(covered, end)
    return out
