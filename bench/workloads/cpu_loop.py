"""Op-bound CPU programs for `bench/run.py cpu-record` (issue 10; docs/BENCHMARKS.md "an op-bound loop of tiny
tensors at most 1.25× unprofiled per step"; memory: 100k steps grow dlpt's memory < 50 MB).

    python bench/workloads/cpu_loop.py oploop [STEPS=320]    # 8 × (Linear + LayerNorm + GELU), 16×64, AdamW
    python bench/workloads/cpu_loop.py memory [STEPS=100000] # a tiny Linear + SGD loop
    python bench/workloads/cpu_loop.py nanogpt none|dlpt N   # N nanoGPT steps for callgrind (see below)
    python bench/workloads/cpu_loop.py oploop-steps none|dlpt N  # N oploop steps, likewise
    python bench/workloads/cpu_loop.py cost [K=2]            # the collector's cost, for tests/test_cost_guard.py

Runs on the CPU whatever the machine has (the point is the host-side cost per op). Prints, as
its last line, `OPLOOP_RESULT {json}`: every step's seconds (oploop), or the resident set size
after the warm-up steps and at the end (memory), read from /proc/self/status.

`nanogpt` is what `bench/run.py cpu-record --callgrind` counts: nanoGPT's own model
(`shared/programs/nanoGPT/model.py`, 2 layers, 32 wide) runs N training steps (forward, backward,
gradient clipping, AdamW) inside `itertools.starmap`, so that callgrind, told to count only inside
it (`--toggle-collect=starmap_next`), sees the steps and nothing of start-up or of building the
profile; with `dlpt`, dlpt's recorder runs around them, started one step earlier (first sight of
every line and op: interning, not the steady state). `oploop-steps` runs the oploop's steps the
same way (no shared/ needed: tests/test_cost_guard.py counts them in CI).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import resource
import sys
import time
from collections.abc import Callable

import torch


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def oploop_model() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.randn(16, 64)


def oploop(steps: int) -> dict:
    model, opt, x = oploop_model()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "loss": float(loss)}


def callgrind_request() -> Callable[[int], int] | None:
    """Valgrind's client request (valgrind.h's VALGRIND_DO_CLIENT_REQUEST, x86-64) as a function of
    the request's code, or None on other machines. Outside Valgrind the instructions do nothing.
    Machine code through ctypes, not a compiled helper: nothing to build, no valgrind headers."""
    import ctypes
    import mmap
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    code = bytes([0x48, 0x89, 0xF8,  # mov rax, rdi: the request's arguments
                  0x31, 0xD2,  # xor edx, edx: the result outside Valgrind
                  0x48, 0xC1, 0xC7, 0x03, 0x48, 0xC1, 0xC7, 0x0D,  # rol rdi, 3; rol rdi, 13
                  0x48, 0xC1, 0xC7, 0x3D, 0x48, 0xC1, 0xC7, 0x33,  # rol rdi, 61; rol rdi, 51 (Valgrind's marker)
                  0x48, 0x87, 0xDB,  # xchg rbx, rbx: the request
                  0x48, 0x89, 0xD0, 0xC3])  # mov rax, rdx; ret
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):  # a system that forbids executable mappings: run instrumented throughout
        return None
    page.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(ctypes.addressof(ctypes.c_char.from_buffer(page)))

    def request(what: int, arg: int = 0) -> int:
        args = (ctypes.c_uint64 * 6)(what, arg, 0, 0, 0, 0)
        return int(fn(ctypes.addressof(args)) + 0 * len(page))  # the page lives as long as this function

    return request


# callgrind.h's requests: VG_USERREQ_TOOL_BASE('C', 'T') + 0, 2, 4 and 5.
CALLGRIND_BASE = ord("C") << 24 | ord("T") << 16
CALLGRIND_DUMP_STATS_AT = CALLGRIND_BASE + 3
CALLGRIND_TOGGLE_COLLECT = CALLGRIND_BASE + 2
CALLGRIND_START_INSTRUMENTATION = CALLGRIND_BASE + 4
CALLGRIND_STOP_INSTRUMENTATION = CALLGRIND_BASE + 5


def cost(k: int) -> None:
    """The collector's cost per op in one process, for tests/test_cost_guard.py: the oploop's steps
    counted by callgrind in four segments — unprofiled 1 and 1 + k steps, then recorded (dlpt's
    recorder started, one step of first sight run) 1 and 1 + k steps — each dumped apart
    (CALLGRIND_DUMP_STATS_AT, labelled `dlpt-cost-<what>-<steps>`). The differences are k steady
    steps each way. Run it under `valgrind --tool=callgrind --instr-atstart=no
    --collect-atstart=no`: only the segments are instrumented and counted, and only on this
    thread (collection is per thread), so the count is the same from run to run. Prints the
    recorded ops per step as `COST_OPS <n>`."""
    import ctypes

    step = oploop_step()

    request = callgrind_request()
    if request is None:
        raise SystemExit("cost: x86-64 only (Valgrind's client requests through ctypes)")

    def segment(label: str | None, n: int) -> None:
        if label is not None:
            request(CALLGRIND_TOGGLE_COLLECT)
        for _ in range(n):
            step()
        if label is not None:
            request(CALLGRIND_TOGGLE_COLLECT)
            name = ctypes.create_string_buffer(label.encode())
            request(CALLGRIND_DUMP_STATS_AT, ctypes.addressof(name))

    from dlpt.collectors.record.session import Recorder  # imported at Valgrind's plain speed

    for _ in range(3):
        step()
    request(CALLGRIND_START_INSTRUMENTATION)
    segment(None, 1)  # instrumented once before any count
    segment("dlpt-cost-none-1", 1)
    segment(f"dlpt-cost-none-{1 + k}", 1 + k)
    request(CALLGRIND_STOP_INSTRUMENTATION)  # the recorder's start-up, likewise
    rec = Recorder(command="cpu_cost", quiet=True)
    rec.start()
    request(CALLGRIND_START_INSTRUMENTATION)
    segment(None, 1)  # first sight of every line and op: interning, not the steady state
    segment("dlpt-cost-dlpt-1", 1)
    ops0 = rec.mod.stats()["ops"]
    segment(f"dlpt-cost-dlpt-{1 + k}", 1 + k)
    ops = (rec.mod.stats()["ops"] - ops0) / (1 + k)
    request(CALLGRIND_STOP_INSTRUMENTATION)
    rec.stop()
    print(f"COST_OPS {ops:.1f}", flush=True)


def counted(step: Callable[[], None], mode: str, n: int) -> None:
    """Three warm-up steps, then (with `dlpt`) dlpt's recorder started and one step more, then `n`
    steps inside `itertools.starmap`: what callgrind counts (`--toggle-collect=starmap_next`).
    Run under `--instr-atstart=no`, callgrind instruments the steps only (start-up, torch's import
    and the warm-up run at Valgrind's plain speed, several times faster)."""
    for _ in range(3):
        step()
    rec = None
    if mode == "dlpt":
        from dlpt.collectors.record.session import Recorder

        rec = Recorder(command="cpu_instr", quiet=True)
        rec.start()
        step()
    request = callgrind_request()
    if request is not None:
        request(CALLGRIND_START_INSTRUMENTATION)
    collections.deque(itertools.starmap(step, [()] * n), maxlen=0)
    if request is not None:
        request(CALLGRIND_STOP_INSTRUMENTATION)
    if rec is not None:
        rec.stop()


def oploop_step() -> Callable[[], None]:
    """One training step of the oploop, on one thread (the counted and the timed modes alike)."""
    torch.set_num_threads(1)
    model, opt, x = oploop_model()

    def step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def oploop_steps(mode: str, n: int) -> None:
    step = oploop_step()

    counted(step, mode, n)


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

    counted(step, mode, n)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "oploop"
    if mode == "oploop":
        doc = oploop(int(sys.argv[2]) if len(sys.argv) > 2 else 320)
    elif mode == "memory":
        doc = memory(int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)
    elif mode == "nanogpt":
        nanogpt(sys.argv[2], int(sys.argv[3]))
        return
    elif mode == "oploop-steps":
        oploop_steps(sys.argv[2], int(sys.argv[3]))
        return
    elif mode == "cost":
        cost(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
        return
    else:
        raise SystemExit(f"unknown mode {mode!r}: oploop, memory, nanogpt, oploop-steps or cost")
    doc["threads"] = torch.get_num_threads()
    print("OPLOOP_RESULT " + json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
