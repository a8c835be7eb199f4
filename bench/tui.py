"""`dlpt view`: time to the first screen and key-press latency, on a synthetic profile with 1M
calling-context nodes and on the gpt_train fixture. Prints a table; its peer is the harness's own
floor (an unbound key pressed the same way), measured in the same run.

    python bench/run.py tui [--nodes 1000000] [--repeat 15] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import numpy as np
import runlib as rl

from dlpt.cct import CCT
from dlpt.frames import Frame, FrameTable
from dlpt.metrics import DTOD, DTOH, HTOD, KERNEL, MEMSET, exclusive_matrix
from dlpt.profile import Activities, Profile

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


async def _settle(app, pilot) -> None:
    while True:
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not app.busy and not any(w.is_running for w in app.workers):
            return


async def _first_screen(make, include_library: bool) -> float:
    from dlpt.viewers.tui import DlptApp

    prof = make()  # a fresh profile: nothing cached on its tree
    t0 = time.perf_counter()
    app = DlptApp(profile=prof, include_library=include_library)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.table.first_paint is None:
            await pilot.pause(0.002)
        return app.table.first_paint - t0


async def _keys(make, repeat: int) -> dict[str, list[float]]:
    """Median latency of each key: `pilot.press` + `pilot.pause()` (the key handled and the
    screen updated); for keys that start background work, also the time until it is done."""
    from dlpt.viewers.tui import DlptApp

    app = DlptApp(profile=make())
    out: dict[str, list[float]] = {}

    async def timed(name: str, *keys: str, settle: bool = False) -> None:
        t = time.perf_counter()
        await pilot.press(*keys)
        await pilot.pause()
        out.setdefault(name, []).append(time.perf_counter() - t)
        if settle:
            await _settle(app, pilot)
            out.setdefault(name + " (until done)", []).append(time.perf_counter() - t)

    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("e")  # open the hottest path so that rows have depth
        await pilot.press("home")
        for _ in range(repeat):
            await timed("(harness floor: an unbound key)", "z")
        for _ in range(repeat):
            await timed("down", "down")
        for _ in range(repeat):
            await timed("enter (expand or collapse)", "enter")
        for _ in range(max(repeat // 3, 2)):
            await timed("e (expand hottest path)", "home", "e")
        for _ in range(repeat):
            await timed("s (cycle metric)", "s")
        while app.metric != "gpu_time":
            await pilot.press("s")
        await timed("2 (bottom-up, first time)", "2", settle=True)
        await timed("3 (flat, first time)", "3", settle=True)
        for _ in range(repeat):
            await timed("1/2/3 (switch view, built)", "1" if _ % 2 else "2", settle=True)
        await pilot.press("1")
        await _settle(app, pilot)
        await timed("l (library frames, first time)", "l", settle=True)
        await timed("/ search 'mm'", "slash", "m", "m", "enter", settle=True)
        await pilot.press("escape", "l")
        await _settle(app, pilot)
        # The app's own work per key, without the harness's idle detection: the handler, then
        # every visible line rendered as a repaint would.
        table = app.table

        def direct(name: str, action) -> None:
            for _ in range(repeat):
                t = time.perf_counter()
                action()
                for y in range(table.size.height):
                    table.render_line(y)
                out.setdefault(f"{name} [handler + repaint]", []).append(time.perf_counter() - t)

        direct("down", lambda: table.action_cursor(1))
        direct("enter", table.action_toggle_row)
        direct("s", app.action_metric)
        direct("e", lambda: (table.move_to(0), app.action_hottest()))
        direct("1/3 (built)", lambda: app.action_view("flat" if app.view == "top-down" else "top-down"))
    return out


def tui(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py tui", description="dlpt view: first screen and key latency")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--runs", type=int, default=3, help="first-screen runs per case")
    args = ap.parse_args(argv)
    from dlpt.loader import open_profile

    cases = [(f"synthetic {args.nodes:,} nodes", lambda: synthetic_profile(args.nodes))]
    fixture = rl.gpt_trace()
    if os.path.exists(fixture):
        cases.append(("gpt_train fixture", lambda: open_profile(fixture)))
    rows = []
    for name, make in cases:
        p = make()
        print(f"# {name}: {len(p.cct):,} nodes, {len(p.activities):,} activities", file=sys.stderr)
        for lib in (True, False):
            ts = [asyncio.run(_first_screen(make, lib)) for _ in range(args.runs)]
            what = "first screen, library frames " + ("shown" if lib else "hidden (default)")
            rows.append((name, what, statistics.median(ts), len(ts)))
        for k, ts in asyncio.run(_keys(make, args.repeat)).items():
            rows.append((name, k, statistics.median(ts), len(ts)))
    print("| profile | measure | median | n |\n| --- | --- | --- | --- |")
    for name, what, t, n in rows:
        print(f"| {name} | {what} | {t * 1000:.0f} ms | {n} |" if t >= 0.01 else f"| {name} | {what} | {t * 1000:.1f} ms | {n} |")
