"""CUDA-graph replays as a decode loop runs them: one graph of many small kernels, replayed one
step at a time, with its own timers (what a recorder costs a graphed program per step).

    python bench/workloads/graph_replay.py [--layers 12] [--steps 2000] [--torch-profiler]

The graph is a decode step of a small transformer's shape (per layer: four GEMVs and the
elementwise kernels between them, about 12 kernels a layer), captured once with
torch.cuda.graph and replayed `--steps` times; each step's replay is followed by a 1-element
read of the output on the host every `--sync-every` steps, as a sampler's next token is. It
prints one JSON line: the steps' wall (ms per step, in chunks of 100 steps, so a step cost that
changes during the run shows), the host time of the replay call itself, and the GPU time per
step from CUDA events. `--torch-profiler` runs the timed loop inside torch.profiler with CUDA
activities only (a peer measured in the same way).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--sync-every", type=int, default=1)
    ap.add_argument("--torch-profiler", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    d = a.dim
    ws = [[torch.randn(d, d, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(4)] for _ in range(a.layers)]
    x = torch.randn(1, d, device=dev, dtype=torch.bfloat16)

    def step(h: torch.Tensor) -> torch.Tensor:
        for wq, wk, wo, wf in ws:
            q = h @ wq
            k = h @ wk
            att = torch.softmax(q * k, dim=-1)
            h = h + att @ wo
            n = torch.nn.functional.rms_norm(h, (d,))
            h = h + torch.nn.functional.silu(n @ wf) * n
        return h

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            out = step(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(x)
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()

    ctx = contextlib.nullcontext()
    if a.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CUDA])
    chunk = 100
    walls: list[float] = []
    launch: list[float] = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ctx:
        torch.cuda.synchronize()
        e0.record()
        t_all = time.perf_counter()
        for _ in range(a.steps // chunk):
            t0 = time.perf_counter()
            lsum = 0.0
            for i in range(chunk):
                l0 = time.perf_counter()
                g.replay()
                lsum += time.perf_counter() - l0
                if (i + 1) % a.sync_every == 0:
                    out[0, 0].item()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) / chunk * 1e3)
            launch.append(lsum / chunk * 1e3)
        e1.record()
        torch.cuda.synchronize()
        total = time.perf_counter() - t_all
    # GPU time of one replay alone, outside the timed loop
    ge0, ge1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ge0.record()
    for _ in range(50):
        g.replay()
    ge1.record()
    torch.cuda.synchronize()
    print(json.dumps({
        "kernels_per_step": a.layers * 12,
        "ms_per_step": round(total / (a.steps // chunk * chunk) * 1e3, 4),
        "chunk_ms": [round(w, 4) for w in walls],
        "chunk_median_ms": round(statistics.median(walls), 4),
        "replay_call_ms": round(statistics.median(launch), 4),
        "events_ms_per_step": round(e0.elapsed_time(e1) / (a.steps // chunk * chunk), 4),
        "gpu_ms_per_replay": round(ge0.elapsed_time(ge1) / 50, 4),
    }), flush=True)


if __name__ == "__main__":
    main()
