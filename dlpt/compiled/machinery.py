"""Which frames of a recording belong to torch.compile's machinery rather than to a kernel: the
region ops around a compiled frame's run, the autograd wrappers and annotations between them and
the kernels, autotuning, and Inductor's CUDA-graph runtime (fused.py reads them to find units)."""

from __future__ import annotations

import re

from dlpt.compile_time import is_autotuning
from dlpt.frames import Frame, is_library

# The autotuning rule is the model's (compile time is told apart there): one rule for both.
__all__ = ["is_autotuning", "is_aten_op", "is_transparent", "REGION_PREFIX", "CUDAGRAPH_RUNTIME"]


REGION_PREFIX = "Torch-Compiled Region: "
# Inductor's CUDA-graph runtime: replays launch compiled kernels from here, with no generated frame.
# (Not compile_fx.py: kernels benchmarked while compiling run under it, and are not the model's.)
CUDAGRAPH_RUNTIME = re.compile(r"/_inductor/(?:cudagraph_trees|cudagraph_utils)\.py$")


def is_aten_op(f: Frame) -> bool:
    """An aten operator's frame: what launched the device work right beneath it (no replay did)."""
    return f.kind == "op" and f.name.startswith("aten::")


def is_transparent(f: Frame) -> bool:
    """Frames between a compiled region's op and its kernels that say nothing of which kernel:
    the autograd wrappers of the compiled graphs, Inductor's `## Call CompiledFxGraph ##`
    annotation, the backward marker, library Python frames."""
    if f.kind == "op":
        return f.name in _WRAPPER_OPS or f.name.startswith(("## ", "autograd::engine::evaluate_function: Compiled"))
    if f.kind == "backward":
        return True
    return f.kind == "python" and is_library(f) and "torchinductor" not in f.file


_WRAPPER_OPS = frozenset({"CompiledFunction", "CompiledFunctionBackward"})
