"""nanoGPT's training step with a profiler switched on and off in one process, interleaved.

Step times of nanoGPT on the GPU machine spread by ±15% between processes (docs/BENCHMARKS.md),
more than the differences to measure. Here one process builds nanoGPT's own model
(`shared/programs/nanoGPT/model.py`, the shakespeare_char configuration train.py uses: 6 layers,
6 heads, 384 wide, block 256, batch 64, bf16 autocast, fused AdamW, gradient clipping) and runs
blocks of steps alternately unprofiled and under one profiler, so both see the same machine state.
Each profiler gets its own process: CUPTI takes one subscriber, and torch.profiler's Kineto
keeps its subscription once it has run.

    python bench/workloads/nanogpt_inproc.py dlpt|torch.profiler|proton [ROUNDS] [BLOCK]
prints one JSON line: median step (ms) unprofiled and profiled, and the ratio; also the median
before the profiler first ran (pristine) and the profiled steps' ratio to it.

    python bench/workloads/nanogpt_inproc.py after [ROUNDS] [BLOCK]
is what `--steps A:B` leaves behind: ROUNDS blocks unprofiled, one block under dlpt (switched on
and fully off, as at steps A and B), ROUNDS blocks unprofiled again; the ratio is after / before.
`after-none` runs the same blocks with no profiler: the machine's own drift, to compare with.
DLPT_BENCH_CYCLES=K: K windows one after another before the "after" blocks.
DLPT_BENCH_CPUS=A-B: the process pinned to those CPUs. `host_ms` in the output is the host's time
per step up to the loss read (all enqueued): equal to the step, the step is launch-bound.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

if os.environ.get("DLPT_BENCH_CPUS"):
    # Pinned before torch starts its threads (they inherit it): whether the host's drift between
    # and within processes comes from moving between cores.
    lo, _, hi = os.environ["DLPT_BENCH_CPUS"].partition("-")
    os.sched_setaffinity(0, range(int(lo), int(hi or lo) + 1))

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "shared", "programs", "nanoGPT"))

from model import GPT, GPTConfig  # noqa: E402

# Host time per step (up to the loss read, which waits for the GPU), by phase: whether a
# profiler's cost falls on the host (launch-bound steps) or on the GPU.
PHASE = ["warm"]
HOST: dict[str, list[float]] = {"warm": [], "pristine": [], "none": [], "prof": []}


def make_step():
    torch.manual_seed(1337)
    cfg = GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)
    model = GPT(cfg).cuda()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cuda")
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
    data = torch.randint(0, 65, (64, 257), device="cuda")
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step() -> float:
        t0 = time.perf_counter()
        with ctx:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        HOST[PHASE[0]].append(time.perf_counter() - t0)  # the host's share: all enqueued
        loss.item()  # train.py reads the loss every step (log_interval 1)
        return time.perf_counter() - t0

    return step


def main() -> None:
    which = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    step = make_step()
    for _ in range(15):
        step()
    if which in ("after", "after-none"):
        # after-none: the same blocks with no profiler in the middle, for how far the machine
        # itself drifts between the first and the second half of a process.
        from dlpt.collectors.record.session import Recorder

        before = [t for _ in range(rounds) for t in [step() for _ in range(block)][1:]]
        # DLPT_BENCH_CYCLES windows one after another (dlpt.profile() used again and again); the
        # last one's hooks stay, as under `dlpt record --steps`.
        cycles = int(os.environ.get("DLPT_BENCH_CYCLES", "1"))
        during: list[float] = []
        r = None
        for _ in range(cycles if which == "after" else 0):
            if r is not None:
                r.stop()
            r = Recorder(command="inproc", quiet=True, steps=(1, 1 + block))
            r.start()
            during += [step() for _ in range(block + 2)]
        if r is None:
            during = [step() for _ in range(block + 2)]
        after = [t for _ in range(rounds) for t in [step() for _ in range(block)][1:]]
        if r is not None:
            r.stop()
        a, d, b = (statistics.median(v) * 1e3 for v in (before, during, after))
        print(json.dumps({"profiler": f"dlpt ×{cycles} (after)" if r else "none (after)", "before_ms": round(a, 3),
                          "during_ms": round(d, 3), "after_ms": round(b, 3), "ratio": round(b / a, 4),
                          "steps_each": len(before), "device": torch.cuda.get_device_name(0)}))
        return
    if which == "dlpt":
        from dlpt.collectors.record.session import Recorder

        def on() -> object:
            r = Recorder(command="inproc", quiet=True)
            r.start()
            return r

        def off(r: object) -> None:
            r.stop()  # type: ignore[attr-defined]
    elif which == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        def on() -> object:
            p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True)
            p.__enter__()
            return p

        def off(p: object) -> None:
            p.__exit__(None, None, None)  # type: ignore[attr-defined]
    elif which == "proton":
        import triton.profiler as proton

        sid = None

        def on() -> object:
            # Started at the first profiled block, so the pristine blocks run without it.
            nonlocal sid
            if sid is None:
                sid = proton.start("/tmp/inproc_proton", context="python")
            else:
                proton.activate(sid)
            return sid

        def off(s: object) -> None:
            proton.deactivate(s)
    else:
        raise SystemExit(f"unknown profiler {which!r}")
    # Before any profiler ran: a profiler that stays attached once switched off (CUPTI does,
    # until finalized) slows the unprofiled blocks between its profiled ones too.
    PHASE[0] = "pristine"
    pristine = [t for _ in range(max(2, rounds // 3)) for t in [step() for _ in range(block)][1:]]
    none: list[float] = []
    prof: list[float] = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        PHASE[0] = "none"
        none += [step() for _ in range(block)][1:]
        h = on()
        PHASE[0] = "prof"
        prof += [step() for _ in range(block)][1:]  # the first step of a block warms the profiler
        off(h)
    a, b = statistics.median(none) * 1e3, statistics.median(prof) * 1e3
    p0 = statistics.median(pristine) * 1e3
    print(json.dumps({"profiler": which, "pristine_ms": round(p0, 3), "unprofiled_ms": round(a, 3),
                      "profiled_ms": round(b, 3), "ratio": round(b / a, 4), "ratio_to_pristine": round(b / p0, 4),
                      "steps_each": len(none), "device": torch.cuda.get_device_name(0),
                      "host_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in HOST.items() if v}}))
    if which == "proton":
        import triton.profiler as proton

        proton.finalize()


if __name__ == "__main__":
    main()
