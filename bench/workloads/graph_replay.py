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
import os
import statistics
import threading
import time

import torch


def py_us() -> float:
    """Median µs of a fixed pure-Python loop: the host's own speed, with no CUDA call or op in it
    (a recorder that slows every op and one that slows the core tell apart here)."""
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        acc = 0
        for i in range(5000):
            acc += i * i % 7
        ts.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(ts), 1)


def threads() -> list[list]:
    """Each thread of this process: name, CPU seconds (user + system), the CPU it last ran on."""
    rows = []
    tick = os.sysconf("SC_CLK_TCK")
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        st = _stat(f"/proc/self/task/{tid}/stat")
        if st is not None:
            name, rest = st
            rows.append([name, round((int(rest[11]) + int(rest[12])) / tick, 2), int(rest[36])])
    return rows


def this_cpu() -> int:
    """The CPU the calling thread last ran on (-1 where /proc has no thread-self)."""
    st = _stat("/proc/thread-self/stat")
    return -1 if st is None else int(st[1][36])


def _stat(path: str) -> tuple[str, list[str]] | None:
    """A /proc stat file: (the name, the fields after it), None where it cannot be read."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--sync-every", type=int, default=1)
    ap.add_argument("--eager", type=int, default=0,
                    help="eager ops after each replay (clone, in-place add), as gpt-fast's decode loop runs")
    ap.add_argument("--threads", type=int, default=0, help="idle Python threads beside the loop")
    ap.add_argument("--depth", type=int, default=0, help="Python frames between the script and the loop")
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

    py_before = py_us()
    cpus: list[int] = []  # the CPU the main thread ran on, after each chunk
    ctx = contextlib.nullcontext()
    if a.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CUDA])
    chunk = 100
    walls: list[float] = []
    launch: list[float] = []
    eager: list[float] = []  # host µs of one eager op, per chunk
    pos = torch.zeros(1, device=dev, dtype=torch.int64)
    kept: list[torch.Tensor] = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed() -> float:
        with ctx:
            torch.cuda.synchronize()
            e0.record()
            t_all = time.perf_counter()
            for _ in range(a.steps // chunk):
                t0 = time.perf_counter()
                lsum = esum = 0.0
                for i in range(chunk):
                    l0 = time.perf_counter()
                    g.replay()
                    lsum += time.perf_counter() - l0
                    if a.eager:
                        q0 = time.perf_counter()
                        for j in range(a.eager):
                            if j % 2:
                                pos.add_(1)
                            else:
                                kept.append(out.clone())
                        esum += time.perf_counter() - q0
                        del kept[:]
                    if (i + 1) % a.sync_every == 0:
                        out[0, 0].item()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) / chunk * 1e3)
                launch.append(lsum / chunk * 1e3)
                eager.append(esum / chunk / max(a.eager, 1) * 1e6)
                cpus.append(this_cpu())
            e1.record()
            torch.cuda.synchronize()
            total = time.perf_counter() - t_all
        return total

    def nested(n: int) -> float:  # the loop `--depth` Python frames down, as a program's decode loop runs
        return timed() if n <= 0 else nested(n - 1)

    idle = threading.Event()
    for k in range(a.threads):  # idle Python threads, as a progress bar's monitor or a compile pool's readers
        threading.Thread(target=lambda: [idle.wait(1.0) for _ in iter(idle.is_set, True)], daemon=True,
                         name=f"idle-{k}").start()
    total = nested(a.depth)
    idle.set()
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
        "eager_op_us": round(statistics.median(eager), 2) if a.eager else None,
        "events_ms_per_step": round(e0.elapsed_time(e1) / (a.steps // chunk * chunk), 4),
        "gpu_ms_per_replay": round(ge0.elapsed_time(ge1) / 50, 4),
        "py_loop_us": [py_before, py_us()],
        "main_cpus": cpus,
        "threads": threads() if os.path.isdir("/proc/self/task") else [],
    }), flush=True)


if __name__ == "__main__":
    main()
