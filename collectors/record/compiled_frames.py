"""Which frames of a recording belong to torch.compile's machinery rather than to a kernel: the
region ops around a compiled frame's run, the autograd wrappers and annotations between them and
the kernels, autotuning, and Inductor's CUDA-graph runtime (fused.py reads them to find units)."""

from __future__ import annotations

import re

from dlpt.frames import Frame, is_library

# Frames that benchmark candidate kernels: Triton configs on a kernel's first run, max-autotune's
# choices while compiling. The outermost one on a path heads an autotuning subtree.
_AUTOTUNE_FILE = re.compile(r"/_inductor/(?:runtime/benchmarking|select_algorithm|autotune_process"
                            r"|runtime/coordinate_descent_tuner)\.py$")
_AUTOTUNE_FUNCS = frozenset({"autotune_to_one_config", "benchmark_all_configs", "coordinate_descent_tuning"})


def is_autotuning(f: Frame) -> bool:
    return f.kind == "python" and (bool(_AUTOTUNE_FILE.search(f.file)) or (
        f.function in _AUTOTUNE_FUNCS and f.file.endswith("/_inductor/runtime/triton_heuristics.py")))


REGION_PREFIX = "Torch-Compiled Region: "
# Inductor's CUDA-graph runtime: replays launch compiled kernels from here, with no generated frame.
# (Not compile_fx.py: kernels benchmarked while compiling run under it, and are not the model's.)
CUDAGRAPH_RUNTIME = re.compile(r"/_inductor/(?:cudagraph_trees|cudagraph_utils)\.py$")


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
