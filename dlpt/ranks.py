"""Several ranks (docs/ARCHITECTURE.md), once profiles are merged (`dlpt.merge`): each rank's
share of the tree (per-rank totals, per-rank values of any grouping, one rank's tree alone) and
the straggler verdict. Who this process is and where its profile goes is the recorder's
(collectors/record/rank_env.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from dlpt.errors import DlptError
from dlpt.header import Header
from dlpt.merge import rank_of
from dlpt.metrics import COL, COUNT_METRICS, is_collective, metric_column
from dlpt.profile import Profile

# ----- a merged profile -----


def rank_nodes(profile: Profile) -> list[tuple[int, int]]:
    """(rank, node) of each `rank N` node under the root, in tree order; [] for one rank."""
    out = []
    for k in profile.cct.children(0).tolist():
        r = rank_of(profile.frame_of(k))
        if r is not None:
            out.append((r, int(k)))
    return out


def is_multi_rank(profile: Profile) -> bool:
    return len(rank_nodes(profile)) > 1


def select_rank(profile: Profile, rank: int) -> Profile:
    """Rank `rank`'s tree alone, its `rank N` node as the root. A profile of one rank is its
    own answer when it is that rank."""
    from dlpt.transforms import focus

    nodes = rank_nodes(profile)
    for r, node in nodes:
        if r == rank:
            out = focus(profile, node)
            # The merged header without its ranks, this rank's own fields over it.
            mine = next((m for m in profile.meta.ranks or [] if m.rank == rank), Header())
            return replace(out, meta=replace(profile.meta, ranks=None).updated(mine))
    have = [r for r, _ in nodes]
    if not have:
        own = profile.meta.rank if profile.meta.rank is not None else 0
        if own == rank:
            return profile
        have = [own]
    raise DlptError(f"no rank {rank} in {profile.path or 'the profile'}; it has rank "
                    f"{', '.join(map(str, have))}: choose one of those with --rank")


def node_rank_index(profile: Profile) -> tuple[list[int], np.ndarray]:
    """(ranks, index of each node's rank in `ranks`, -1 above the rank nodes): rank nodes head
    contiguous preorder slices, so this is one slice assignment per rank."""
    nodes = rank_nodes(profile)
    idx = np.full(len(profile.cct), -1, dtype=np.int64)
    end = profile.cct.end
    for j, (_, node) in enumerate(nodes):
        idx[node:end[node]] = j
    return [r for r, _ in nodes], idx


def per_rank_groups(profile: Profile, owner: np.ndarray, n_groups: int, values: np.ndarray) -> tuple[list[int], np.ndarray]:
    """(ranks, matrix[g, j]): the sum of `values` (one per node) over the nodes that group g
    owns on rank ranks[j]. `owner` is the group of each node, -1 for none (counted in the last
    group, as the flat view does)."""
    ranks, ridx = node_rank_index(profile)
    R = max(len(ranks), 1)
    own = np.where(owner >= 0, owner, n_groups - 1)
    sel = ridx >= 0
    flat_index = own[sel] * R + ridx[sel]
    m = np.bincount(flat_index, weights=values[sel], minlength=n_groups * R).astype(np.int64)
    return ranks, m.reshape(n_groups, R)


def rank_values(profile: Profile, owner: np.ndarray, n_groups: int,
                values: np.ndarray) -> tuple[list[int], np.ndarray] | None:
    """`per_rank_groups` when the profile holds several ranks, None for one: the per-rank
    columns of every view (report, hotspots, TUI)."""
    if not is_multi_rank(profile):
        return None
    return per_rank_groups(profile, owner, n_groups, values)


class RankSpread(NamedTuple):
    low: int
    median: float
    high: int
    rank: int  # the rank that has `high` (the first, on a tie)


def rank_spread(ranks: Sequence[int], values: Sequence[int] | np.ndarray) -> RankSpread:
    """(min, median, max, the rank with the max) of one group's values on each rank."""
    vals = np.asarray(values, dtype=np.int64)
    k = int(np.argmax(vals))
    return RankSpread(int(vals.min()), float(np.median(vals)), int(vals[k]), int(ranks[k]))


def comm_values(profile: Profile, metric: str) -> np.ndarray:
    """The communication part of `metric` at each node (exclusive): for the GPU metrics that
    count kernels (gpu_time, kernel_time, comm_time) the collective kernels' time, comm_time;
    for cpu_time the host time of collective ops (`is_collective`) and of the ops beneath them;
    for host_time the estimated wait in collectives (comm_wait_time, dlpt/commwait.py), so a
    rank that sat in an all_reduce waiting for a slower one does not count that as compute;
    zero for the others (copies, bytes, counts)."""
    cct = profile.cct
    if metric == "host_time":
        return cct.exclusive[:, COL["comm_wait_time"]]
    if metric in ("gpu_time", "kernel_time", "comm_time"):
        return cct.exclusive[:, COL["comm_time"]]
    if metric == "cpu_time":
        from dlpt.transforms import propagate_down

        coll = np.fromiter((f.kind == "op" and is_collective(f.name) for f in profile.frames), dtype=bool,
                           count=len(profile.frames))
        under = propagate_down(cct, coll[cct.frame])
        return np.where(under, cct.exclusive[:, COL["cpu_time"]], 0)
    return np.zeros(len(cct), dtype=np.int64)


def compute_values(profile: Profile, metric: str) -> np.ndarray:
    """The compute part of `metric` at each node: the metric less its communication; host_time
    also less the host's wait for its own GPU (sync_time). A rank kept waiting by an NCCL
    collective waits at its next sync (`.item()`), while its comm wait is estimated on the line
    that issued the collective, where the host did not block: each is taken from its own line,
    and `straggler` counts a line's compute as at least 0, so neither line gives up more than it
    holds and one wait is not taken twice."""
    ex = profile.cct.exclusive
    if metric == "host_time":
        return ex[:, COL["host_time"]] - ex[:, COL["sync_time"]] - comm_values(profile, metric)
    return ex[:, metric_column(metric)] - comm_values(profile, metric)


def rank_totals(profile: Profile, metric: str) -> list[dict[str, Any]]:
    """Per rank: the metric, its communication part (`comm`, and its share `comm_percent`),
    gpu_time, comm_time (collective kernels) and cpu_time."""
    inc = profile.cct.inclusive
    col = metric_column(metric)
    ranks, ridx = node_rank_index(profile)
    sel = ridx >= 0
    comm = np.bincount(ridx[sel], weights=comm_values(profile, metric)[sel], minlength=len(ranks)).astype(np.int64)
    out = []
    for j, (r, node) in enumerate(rank_nodes(profile)):
        row = inc[node]
        total = int(row[col])
        out.append({"rank": r, metric: total, "comm": int(comm[j]),
                    "comm_percent": round(100.0 * comm[j] / total, 3) if total else 0.0,
                    "gpu_time": int(row[COL["gpu_time"]]), "comm_time": int(row[COL["comm_time"]]),
                    "cpu_time": int(row[COL["cpu_time"]])})
    return out


# ----- the straggler -----

# A rank is called the straggler when its compute exceeds the median of the other ranks' by at
# least this share of its own compute: below that, step-to-step noise dominates (a 2% spread
# between identical ranks is ordinary), and every run would name one.
# Metrics of waiting, not of work: a rank that waits more is not slower (it is the one kept
# waiting), so the straggler rule is never applied to them.
WAIT_METRICS = frozenset({"comm_wait_time", "gpu_idle_time", "sync_time"})
STRAGGLER_MIN_SHARE = 0.05
# The comm wait mirrors the excess when the fast ranks wait in collectives at least this share of
# the slow rank's extra compute longer than it does.
MIRROR_MIN_SHARE = 0.5


# The metrics a rank with no GPU has as much as any other: host op time, the host's time on
# each line, and the wait in collectives (estimated from host calls, gloo's included). Every
# other metric is measured on the GPU (times, copies, counts, idle and sync time, memory), and a
# rank with no GPU activity has none of it: not fast, but not taking part.
HOST_METRICS = frozenset({"cpu_time", "host_time", "comm_wait_time"})
_GPU_ACTIVITY = [COL[m] for m in ("gpu_time", *COUNT_METRICS)]


def ranks_without_gpu(profile: Profile, metric: str) -> list[int]:
    """The ranks with no GPU activity (no kernel, copy or memset), when `metric` is measured on
    the GPU; [] for the host metrics (HOST_METRICS), in which every rank takes part. The
    straggler rule leaves them out: beside a GPU rank, a CPU-only rank would be the fastest
    and make the other a straggler by all of its GPU time."""
    if metric in HOST_METRICS:
        return []
    inc = profile.cct.inclusive
    return [r for r, node in rank_nodes(profile) if not inc[node, _GPU_ACTIVITY].any()]


def straggler(profile: Profile, metric: str, fv: Any = None) -> dict[str, Any] | None:
    """The straggler verdict of a merged profile: None for one rank, or when fewer than two
    ranks take part. The rule:

    0. in a metric measured on the GPU, the ranks with no GPU activity are left out
       (`ranks_without_gpu`, listed in `left_out`); the others take part;
    1. each rank's compute = its `metric` less its communication (`compute_values`: collective
       kernels for the GPU metrics, collective ops' host time for cpu_time, comm wait and the
       wait for its own GPU for host_time), summed over the lines of the flat view by line, each
       line's at least 0;
    2. the slowest rank S has the most compute; its excess = compute(S) - median(compute of the
       other ranks); S is the straggler when excess >= STRAGGLER_MIN_SHARE * compute(S);
    3. the straggler line is the source line (flat view by line, library frames hidden or not
       by `hide_library_unless`) whose compute on S (taken as at least 0 on every rank) exceeds
       its compute on every other rank by the most;
    4. wait = median(communication of the other ranks) - communication(S): how much longer the
       fast ranks sit in collectives; it mirrors the excess when wait >= MIRROR_MIN_SHARE *
       excess (None when no rank communicated in this metric).

    `fv`: the profile's flat view by line, where the caller has it (`stragglers`).
    """
    from dlpt.views import flat

    if metric in WAIT_METRICS:
        return None
    totals = rank_totals(profile, metric)
    if len(totals) < 2:
        return None
    all_ranks, ridx = node_rank_index(profile)
    left_out = ranks_without_gpu(profile, metric)
    keep = np.array([j for j, r in enumerate(all_ranks) if r not in left_out], dtype=np.int64)
    if len(keep) < 2:
        return None
    ranks = [all_ranks[j] for j in keep.tolist()]
    comp_node = compute_values(profile, metric)
    fv = fv if fv is not None else flat(profile, "line")
    _, m = per_rank_groups(profile, fv.owner, len(fv.labels), comp_node)
    # A line's compute is at least 0: a wait is estimated where the rank waited on others (comm
    # wait on the line that issued the collective, where an NCCL rank's host did not block), which
    # would make that line negative, and every other rank's line look slower; and a rank's compute
    # is the sum of its lines' (on two H100, the wait of rank 0 in `.item()` made a straggler's
    # 1.00 s sleep read as 603 ms more host time).
    m = np.maximum(m, 0)
    compute = m.sum(axis=0).astype(np.int64)[keep]
    comm = np.array([t["comm"] for t in totals], dtype=np.int64)[keep]
    s = int(np.argmax(compute))
    others = np.delete(np.arange(len(ranks)), s)
    median = float(np.median(compute[others]))
    excess = int(compute[s] - median)
    share = excess / compute[s] if compute[s] > 0 else 0.0
    out: dict[str, Any] = {
        "rank": ranks[s], "metric": metric, "straggler": bool(compute[s] > 0 and share >= STRAGGLER_MIN_SHARE),
        "compute": {str(r): int(c) for r, c in zip(ranks, compute)},
        # "X% more than the median of the others": the excess against that median, as said.
        "excess": excess, "excess_percent": round(100.0 * excess / median, 3) if median > 0 else None,
        "comm_wait": None, "mirrored": None, "line": None, "left_out": left_out,
    }
    if comm.any():
        wait = int(np.median(comm[others]) - comm[s])
        out["comm_wait"] = wait
        out["mirrored"] = bool(excess > 0 and wait >= MIRROR_MIN_SHARE * excess)
    lines = m[:-1][:, keep]  # the last group is <no source line>: a verdict names a line
    if len(lines):
        line_excess = lines[:, s] - lines[:, others].max(axis=1)
        g = int(np.argmax(line_excess))
        if line_excess[g] > 0:
            fr = fv.frame[g]
            out["line"] = {"file": fr.file, "line": fr.line, "function": fr.function, "label": fv.labels[g],
                           "excess": int(line_excess[g]),
                           "per_rank": {str(r): int(v) for r, v in zip(ranks, lines[g])}}
    return out


def stragglers(profile: Profile) -> dict[str, dict[str, Any] | None]:
    """`straggler` in every metric the profile has values of (wait metrics left out), one flat
    view shared: what a command keeps of the steady state for its views (dlpt.scope)."""
    from dlpt.views import flat

    if not is_multi_rank(profile):
        return {}
    have = np.asarray(profile.cct.exclusive.any(axis=0), dtype=bool)
    names = [m for m, i in COL.items() if have[i] and m not in WAIT_METRICS]
    fv = flat(profile, "line") if names else None
    return {m: straggler(profile, m, fv) for m in names}


def judged_straggler(profile: Profile, metric: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the straggler verdict in `metric`, the phase it is of): the one a command judged on the
    steady state (`meta.stragglers`, dlpt.scope), else `straggler` of the profile as given
    (phase None)."""
    kept = profile.meta.stragglers
    if isinstance(kept, dict) and isinstance(kept.get("verdicts"), dict):
        return kept["verdicts"].get(metric), kept.get("phase")
    return straggler(profile, metric), None


def left_out_text(ranks: Sequence[int]) -> str:
    """`rank 1 has no GPU activity; left out of the straggler rule` (or `ranks 1, 3 have ...`)."""
    who = f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} have"
    return f"{who} no GPU activity; left out of the straggler rule"
