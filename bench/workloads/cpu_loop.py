"""Op-bound CPU programs for `bench/run.py cpu-record` (issue 10; docs/BENCHMARKS.md "an op-bound loop of tiny
tensors at most 1.25× unprofiled per step"; memory: 100k steps grow dlpt's memory < 50 MB).

    python bench/workloads/cpu_loop.py oploop [STEPS=320]    # 8 × (Linear + LayerNorm + GELU), 16×64, AdamW
    python bench/workloads/cpu_loop.py memory [STEPS=100000] # a tiny Linear + SGD loop
    python bench/workloads/cpu_loop.py nanogpt none|dlpt N   # N nanoGPT steps for callgrind (see below)

Runs on the CPU whatever the machine has (the point is the host-side cost per op). Prints, as
its last line, `OPLOOP_RESULT {json}`: every step's seconds (oploop), or the resident set size
after the warm-up steps and at the end (memory), read from /proc/self/status.

`nanogpt` is what `bench/run.py cpu-record --callgrind` counts: nanoGPT's own model
(`shared/programs/nanoGPT/model.py`, 2 layers, 32 wide) runs N training steps (forward, backward,
gradient clipping, AdamW) inside `itertools.starmap`, so that callgrind, told to count only inside
it (`--toggle-collect=starmap_next`), sees the steps and nothing of start-up or of building the
profile; with `dlpt`, dlpt's recorder runs around them, started one step earlier (first sight of
every line and op: interning, not the steady state).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
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


def nanogpt(mode: str, n: int) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in (os.path.join(root, "shared"), os.path.join(os.path.dirname(root), "shared")):
        sys.path.insert(0, os.path.join(d, "programs", "nanoGPT"))
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=False))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    data = torch.randint(0, 65, (2, 17))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    rec = None
    if mode == "dlpt":
        from dlpt.collectors.record.session import Recorder

        rec = Recorder(command="cpu_instr", quiet=True)
        rec.start()
        step()
    collections.deque(itertools.starmap(step, [()] * n), maxlen=0)
    if rec is not None:
        rec.stop()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "oploop"
    if mode == "oploop":
        doc = oploop(int(sys.argv[2]) if len(sys.argv) > 2 else 320)
    elif mode == "memory":
        doc = memory(int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)
    elif mode == "nanogpt":
        nanogpt(sys.argv[2], int(sys.argv[3]))
        return
    else:
        raise SystemExit(f"unknown mode {mode!r}: oploop, memory or nanogpt")
    doc["threads"] = torch.get_num_threads()
    print("OPLOOP_RESULT " + json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
