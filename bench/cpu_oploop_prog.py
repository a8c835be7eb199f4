"""Op-bound CPU programs for bench/cpu_oploop.py (issue 10; docs/BENCHMARKS.md "an op-bound loop of tiny
tensors at most 1.25× unprofiled per step"; memory: 100k steps grow dlpt's memory < 50 MB).

    python bench/cpu_oploop_prog.py oploop [STEPS=320]    # 8 × (Linear + LayerNorm + GELU), 16×64, AdamW
    python bench/cpu_oploop_prog.py memory [STEPS=100000] # a tiny Linear + SGD loop

Runs on the CPU whatever the machine has (the point is the host-side cost per op). Prints, as
its last line, `OPLOOP_RESULT {json}`: every step's seconds (oploop), or the resident set size
after the warm-up steps and at the end (memory), read from /proc/self/status.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def oploop(steps: int) -> dict:
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "loss": float(loss)}


def memory(steps: int) -> dict:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    x = torch.randn(4, 16)
    warm = min(1000, steps // 10)
    rss_warm = None
    t0 = time.perf_counter()
    for i in range(steps):
        if i == warm:
            rss_warm = rss_mb()
        loss = lin(x).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {"steps": steps, "warm_steps": warm, "rss_after_warm_mb": rss_warm, "rss_end_mb": rss_mb(),
            "loop_s": time.perf_counter() - t0,
            "maxrss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "oploop"
    if mode == "oploop":
        doc = oploop(int(sys.argv[2]) if len(sys.argv) > 2 else 320)
    elif mode == "memory":
        doc = memory(int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)
    else:
        raise SystemExit(f"unknown mode {mode!r}: oploop or memory")
    doc["threads"] = torch.get_num_threads()
    print("OPLOOP_RESULT " + json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
