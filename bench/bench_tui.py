"""Benchmark of `dlpt view`: time to the first screen and key-press latency, on a synthetic
profile with 1M calling-context nodes and on the gpt_train fixture. Prints a table.

    python bench/bench_tui.py [--nodes 1000000] [--repeat 15]
"""

from __future__ import annotations

import os

import numpy as np

from dlpt.cct import CCT
from dlpt.frames import Frame, FrameTable
from dlpt.metrics import DTOD, DTOH, HTOD, KERNEL, MEMSET, exclusive_matrix
from dlpt.profile import Activities, Profile

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "kineto",
                       "gpt_train.pt.trace.json.gz")

_KERNELS = [
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::"
    "CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)"
    "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl<...>::{lambda(int)#1})",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)",
    "triton_poi_fused_add_mul_relu_[0]",
]
_OPS = ["aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::add_", "aten::copy_",
        "aten::layer_norm", "aten::native_layer_norm", "aten::scaled_dot_product_attention", "aten::relu",
        "aten::to", "aten::_to_copy", "aten::clone", "aten::zero_", "aten::fill_", "aten::view"]
_COPIES = [("memcpy", "Memcpy HtoD (Pageable -> Device)", HTOD), ("memcpy", "Memcpy DtoH (Device -> Pinned)", DTOH),
           ("memcpy", "Memcpy DtoD (Device -> Device)", DTOD), ("memset", "Memset (Device)", MEMSET)]


def synthetic_profile(n: int, seed: int = 0, maxdepth: int = 14) -> Profile:
    """A random calling-context tree of `n` nodes in preorder, with frames shaped like a real
    training step: user lines, modules, torch's module machinery, ops, then kernels and copies."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([1, 0, -1, -2, -3], size=n, p=[0.5, 0.2, 0.15, 0.1, 0.05]).tolist()
    depth = [0] * n
    parent = [-1] * n
    last = [0] * (maxdepth + 2)
    cur = 0
    for i in range(1, n):
        c = min(max(cur + steps[i], 1), maxdepth, cur + 1)
        depth[i] = c
        parent[i] = last[c - 1]
        last[c] = i
        cur = c
    d = np.asarray(depth)
    leaf = np.r_[d[1:] <= d[:-1], True]
    leaf[0] = False
    ft = FrameTable([Frame("root", "<root>")])
    user = [ft.intern(Frame("python", f"step (train.py:{ln})", "train.py", ln, "step")) for ln in range(20, 60)]
    model = [ft.intern(Frame("python", f"forward (model.py:{ln})", "model.py", ln, "forward")) for ln in range(10, 200)]
    mods = [ft.intern(Frame("module", f"Block_{k}")) for k in range(24)]
    lib = [ft.intern(Frame("python", "_call_impl (torch/nn/modules/module.py:1750)",
                           "torch/nn/modules/module.py", 1750, "_call_impl"))]
    ops = [ft.intern(Frame("op", o)) for o in _OPS]
    kern = [ft.intern(Frame("kernel", k)) for k in _KERNELS]
    copies = [(ft.intern(Frame(kind, name)), k) for kind, name, k in _COPIES]
    frame = np.zeros(n, dtype=np.int64)
    for lo, hi, pool in ((1, 2, user), (2, 4, model), (4, 5, mods), (5, 6, lib), (6, maxdepth + 1, ops)):
        sel = np.flatnonzero((d >= lo) & (d < hi))
        frame[sel] = np.asarray(pool)[rng.integers(0, len(pool), len(sel))]
    leaves = np.flatnonzero(leaf)
    is_copy = rng.random(len(leaves)) < 0.08
    kinds = np.full(len(leaves), KERNEL)
    pick = rng.integers(0, len(copies), len(leaves))
    kinds[is_copy] = np.array([k for _, k in copies])[pick[is_copy]]
    frame[leaves] = np.where(is_copy, np.array([f for f, _ in copies])[pick],
                             np.asarray(kern)[rng.integers(0, len(kern), len(leaves))])
    dur = rng.lognormal(9, 1.5, len(leaves)).astype(np.int64) + 1
    nbytes = np.where(is_copy & (kinds != MEMSET), rng.integers(1 << 10, 1 << 26, len(leaves)), 0)
    exc = exclusive_matrix(n, leaves, kinds, dur, nbytes, np.zeros(0, np.int64), np.zeros(0, np.int64))
    acts = Activities(node=leaves, kind=kinds, name=frame[leaves], device=np.zeros(len(leaves), np.int64),
                      stream=np.full(len(leaves), 7), start=np.cumsum(dur), duration=dur, bytes=nbytes)
    meta = {"source": "record", "command": "python train.py --synthetic", "devices": [{"name": "NVIDIA H200"}]}
    src = {"model.py": "".join(f"    x = self.layer{i}(x)  # line {i}\n" for i in range(1, 220)),
           "train.py": "".join(f"    loss = step({i})\n" for i in range(1, 80))}
    return Profile(ft.frames, CCT(np.asarray(parent), frame, exc), acts, meta, src, path="synthetic-1M.dlpt")
