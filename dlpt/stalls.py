"""GPU PC samples' stall reasons: CUPTI's names onto the model's metric family (dlpt.metrics,
`pc_samples`, `pc_issued`, `stall_*`), what a kernel's dominant stall says to try, and the
diagnosis's rule that says it (`kernel_stalls`, one of dlpt/findings.py's RULES).

CUPTI names each reason per GPU architecture as a counter, `smsp__pcsamp_warps_issue_stalled_
long_scoreboard` and so on (its `..._not_issued` variants are not collected: see
collectors/native/pcsampling.h). Nsight Compute's "Warp State Statistics" section gives what
each one means; the columns keep the ones its guide names as the usual limiters apart and put
the rest in `stall_other`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from dlpt.evidence import Evidence, Lines, column
from dlpt.finding import Finding
from dlpt.frames import short_kernel_name
from dlpt.metrics import COL

if TYPE_CHECKING:
    from dlpt.profile import Profile

# CUPTI's reason (the counter name's tail after `stalled_`) → the metric it counts in.
REASONS = {
    "selected": "pc_issued",
    "long_scoreboard": "stall_long_scoreboard",
    "lg_throttle": "stall_lg_throttle",
    "short_scoreboard": "stall_short_scoreboard",
    "mio_throttle": "stall_mio_throttle",
    "math_pipe_throttle": "stall_math_pipe",
    "tex_throttle": "stall_other",
    "wait": "stall_wait",
    "barrier": "stall_barrier",
    "membar": "stall_barrier",
    "branch_resolving": "stall_branch",
    "no_instructions": "stall_no_instruction",
    "not_selected": "stall_not_selected",
}


def stall_metric(cupti_name: str) -> str:
    """The metric a CUPTI stall reason counts in: `smsp__pcsamp_warps_issue_stalled_wait` →
    `stall_wait`; a reason this table does not know (a newer GPU's) → `stall_other`."""
    tail = cupti_name.rsplit("stalled_", 1)[-1] if "stalled_" in cupti_name else cupti_name
    return REASONS.get(tail, "stall_other")


class Limiter(NamedTuple):
    name: str  # what limits the kernel, in a finding's words
    parts: tuple[str, ...]  # the stall metrics that say so
    advice: str


# What a dominant stall says: the groups a finding names, each with what to try (Nsight
# Compute's guide and the CUDA best-practices guide alike).
LIMITERS = (
    Limiter("memory-bound", ("stall_long_scoreboard", "stall_lg_throttle"),
            "fuse it with its neighbours or move fewer bytes (lower precision, no materialised copies)"),
    Limiter("math-bound", ("stall_math_pipe", "stall_mio_throttle", "stall_short_scoreboard"),
            "use tensor cores or a lower precision (bf16, TF32) for this work"),
    Limiter("latency-bound", ("stall_wait", "stall_no_instruction", "stall_branch", "stall_not_selected"),
            "raise occupancy or the work per thread (larger blocks, fewer dependent steps)"),
    Limiter("synchronisation-bound", ("stall_barrier",),
            "fewer barriers or less work between them (block-wide reductions, memory fences)"),
)


def limiter(row: np.ndarray) -> tuple[Limiter, float] | None:
    """The group of stalls with the most of a node's stalled samples, and its share of all its
    samples; None with no stalled samples."""
    stalled = int(row[COL["pc_samples"]]) - int(row[COL["pc_issued"]])
    if stalled <= 0:
        return None
    best = max(LIMITERS, key=lambda g: sum(int(row[COL[m]]) for m in g.parts))
    return best, sum(int(row[COL[m]]) for m in best.parts) / int(row[COL["pc_samples"]])


def kernel_samples(profile: Profile) -> list[tuple[str, np.ndarray]]:
    """Each kernel's PC-sample metrics over every line that launched it (its leaves' inclusive
    rows, the samples on its own source lines included), most samples first: [(kernel name,
    metrics row)]. Empty when the profile holds no PC samples."""
    col = COL["pc_samples"]
    exc = profile.cct.exclusive
    if not exc[:, col].any():
        return []
    inc = profile.cct.inclusive
    by: dict[str, np.ndarray] = {}
    for i in np.flatnonzero(inc[:, col]).tolist():
        f = profile.frame_of(i)
        if f.kind == "kernel":
            by[f.name] = by.get(f.name, 0) + inc[i]
    return sorted(by.items(), key=lambda kv: -int(kv[1][col]))


def kernel_stalls(e: Evidence) -> Finding | None:
    """`--pc-samples`: the kernel with the most PC samples, what its stalls say (dlpt.stalls),
    on its own source lines (else the lines that launched it). Its share: its kernel time's."""
    p = e.steady if e.steady.cct.exclusive[:, COL["pc_samples"]].any() else e.whole
    hot = kernel_samples(p)
    lim = limiter(hot[0][1]) if hot else None
    if lim is None:
        return None
    name, row = hot[0]
    group, part = lim
    cct, mask = p.cct, np.zeros(len(p.cct), dtype=bool)
    for i in np.flatnonzero(np.array([f.kind == "kernel" and f.name == name for f in p.frames])[cct.frame]).tolist():
        mask[i:int(cct.end[i])] = True
    lines = Lines(p)
    top = lines.top(lines.sums(np.where(mask, column(p, "pc_samples"), 0).astype(np.float64)))
    # Of the steady state's device time, as the other rules' shares (its busy time only).
    share = e.split.share(int(row[COL["gpu_time"]])) if p is e.steady else None
    stalls = ", ".join(m[len("stall_"):].replace("_", " ") for m in group.parts if row[COL[m]])
    return Finding("kernel-stalls", top, f"{short_kernel_name(name, 60)}: {group.name}, {part:.0%} of its "
                   f"{int(row[COL['pc_samples']]):,} PC samples ({stalls})", group.advice, share, e.of)
