"""torch.compile's one-off work, told apart from the program's steady state.

Compiling (Dynamo's `convert_frame`, with AOTAutograd and Inductor beneath it) and autotuning
(benchmarking candidate kernels: a Triton kernel's first run, `max-autotune`'s choices; the
recorder gathers it under a `[torch.compile autotuning]` node) happen once, yet in a short run
they can outweigh the model. The tree keeps them where they ran; the headline shows them on a
line of their own, and the flat view, the hotspots and diff leave them out unless asked
(`--include-compile`). This module is the one rule for which nodes that is.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from dlpt.frames import Frame
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.transforms import drop_subtrees, propagate_down

AUTOTUNING = Frame("op", "[torch.compile autotuning]")

# Frames that benchmark candidate kernels: Triton configs on a kernel's first run, max-autotune's
# choices while compiling. The outermost one on a path heads an autotuning subtree.
_AUTOTUNE_FILE = re.compile(r"/_inductor/(?:runtime/benchmarking|select_algorithm|autotune_process"
                            r"|runtime/coordinate_descent_tuner)\.py$")
_AUTOTUNE_FUNCS = frozenset({"autotune_to_one_config", "benchmark_all_configs", "coordinate_descent_tuning"})
# Dynamo calls back into Python (convert_frame) only to compile a frame: a compiled frame's
# later runs go through its guards in C and never pass here.
_COMPILE_FILE = re.compile(r"/_dynamo/convert_frame\.py$")


def is_autotuning(f: Frame) -> bool:
    if f.function == "<module>":
        return False  # importing the module (torch imports Dynamo lazily, e.g. in AdamW) compiles nothing
    return f == AUTOTUNING or (f.kind == "python" and (bool(_AUTOTUNE_FILE.search(f.file)) or (
        f.function in _AUTOTUNE_FUNCS and f.file.endswith("/_inductor/runtime/triton_heuristics.py"))))


def compile_kind(f: Frame) -> str:
    """'autotuning', 'compiling', or '' for frames of the program's steady state."""
    if is_autotuning(f):
        return "autotuning"
    if f.kind == "python" and f.function != "<module>" and _COMPILE_FILE.search(f.file):
        return "compiling"
    return ""


def compile_roots(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """(outermost compile nodes, their kinds as strings): no root lies beneath another."""
    cct = profile.cct
    kinds = np.array([compile_kind(f) for f in profile.frames], dtype=object)
    mark = (kinds != "")[cct.frame]
    mark[0] = False
    if not mark.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)

    above = propagate_down(cct, mark)[np.maximum(cct.parent, 0)]
    roots = np.flatnonzero(mark & ~above)
    roots = roots[roots > 0]
    return roots, kinds[cct.frame[roots]]


def compile_summary(profile: Profile) -> dict[str, dict[str, int]]:
    """Per kind ('autotuning', 'compiling'), every metric's total beneath its nodes (nonzero only)."""
    roots, kinds = compile_roots(profile)
    inc = profile.cct.inclusive
    out: dict[str, dict[str, int]] = {}
    for kind in ("autotuning", "compiling"):
        sel = roots[kinds == kind]
        if len(sel):
            tot = inc[sel].sum(axis=0)
            vals = {m: int(tot[COL[m]]) for m in METRICS if int(tot[COL[m]])}
            if vals:
                out[kind] = vals
    return out


def compile_apart(profile: Profile, include_compile: bool = False) -> Profile:
    """The profile with its torch.compile summary in `meta.torch_compile` (for the headline;
    read it before library frames are hidden: Dynamo's frames are library frames), and, unless
    `include_compile`, without the compile subtrees: what the flat view, hotspots and diff rank.
    Pure; without compile work, the profile itself."""
    roots, _ = compile_roots(profile)
    if not len(roots):
        return profile


    meta = replace(profile.meta, torch_compile=compile_summary(profile), torch_compile_included=bool(include_compile))
    out = replace(profile, meta=meta)
    if include_compile:
        return out
    drop = np.zeros(len(profile.cct), dtype=bool)
    drop[roots] = True

    return drop_subtrees(out, propagate_down(profile.cct, drop))
