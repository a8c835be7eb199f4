"""Ground truth for `dlpt record` on a GPU: `torch.cuda._sleep` kernels of known, different
lengths, launched from known lines — in forward code and in a custom autograd Function's
backward (which runs on autograd's device thread, with no Python frames recorded). CUDA events
around each kernel give its time independently of the profiler; the sums per line go to the
JSON file named by argv[1]. `bench/gpu_proof.py` compares them with dlpt's time per line.

Lines are named by `# LINE:<name>` markers, so the proof finds them without hard-coded numbers.
"""

from __future__ import annotations

import json
import sys

import torch

CYCLES = {"a": 2_000_000, "b": 6_000_000, "fwd_in": 4_000_000, "bwd": 8_000_000}
EVENTS: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []


def timed_sleep(name: str, cycles: int) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    EVENTS.append((name, start, end))


class Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(CYCLES["fwd_in"])  # LINE:fwd_in
        e.record()
        EVENTS.append(("fwd_in", s, e))
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(CYCLES["bwd"])  # its time belongs to the line that applied Slow
        e.record()
        EVENTS.append(("apply", s, e))
        return g


def step(x: torch.Tensor) -> None:
    # Put the GPU behind the host first, so that no event pair below spans a launch gap.
    torch.cuda._sleep(40_000_000)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(CYCLES["a"])  # LINE:a
    e.record()
    EVENTS.append(("a", s, e))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(CYCLES["b"])  # LINE:b
    e.record()
    EVENTS.append(("b", s, e))
    y = Slow.apply(x)  # LINE:apply
    y.sum().backward()


def main() -> None:
    x = torch.ones(1024, device="cuda", requires_grad=True)
    for _ in range(5):
        step(x)
    torch.cuda.synchronize()
    per_line: dict[str, float] = {}
    for name, s, e in EVENTS:
        per_line[name] = per_line.get(name, 0.0) + s.elapsed_time(e) * 1e6  # ms → ns
    with open(sys.argv[1], "w") as f:
        json.dump({"cuda_event_ns": per_line, "count": len(EVENTS)}, f)


if __name__ == "__main__":
    main()
