"""Host cost per op and per launch on a GPU, by part of the collector, against peers.

nanoGPT's step times spread by ±10-20% on the GPU machine (docs/BENCHMARKS.md), more than the
few percent each part of a profiler costs. A launch-bound loop of tiny ops spreads far less, and
its time per iteration is the host's time: what each part adds per op is what it adds to a
launch-bound program's step. One process per family (CUPTI takes one subscriber, and Kineto
and Proton keep theirs once started); inside it, configurations alternate round by round.

    python bench/gpu_percall.py dlpt|torch.profiler|proton [ROUNDS]

prints a table, ns per iteration (median over rounds) and the difference to unprofiled, and one
JSON line with the same figures. Loops:
- add:    `x.add_(1)`, one op, one kernel;
- linear: `lin(x)` without grad (aten::linear → addmm inside), one kernel;
- deep:   `x.add_(1)` 40 Python frames down (the frame walk's share);
- mlp:    a 4-layer MLP's forward, backward and SGD step (autograd's path), per iteration.
dlpt's configurations (DLPT_DIAG parts, collector.cpp/device.h say what each switches):
- rf-noop:   RecordFunction callback registered, returning at once (torch's machinery alone);
- host:      the op callback, no CUPTI;
- cupti-act: CUPTI activities only (no callbacks, records unlinked);
- cupti-cb:  CUPTI launch callbacks only, host callback off (each launch walks Python frames);
- cupti:     CUPTI callbacks and activities, host callback off (= DLPT_HOST=0);
- dlpt:      everything, as `dlpt record` runs;
- dlpt-rt:   everything, runtime-API callbacks only (DLPT_DIAG=nodriver).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

x = torch.ones(4, device="cuda")
lin = torch.nn.Linear(64, 64).cuda()
xl = torch.ones(8, 64, device="cuda")
mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)]).cuda()
opt = torch.optim.SGD(mlp.parameters(), lr=1e-3, foreach=True)


def add(k: int) -> None:
    for _ in range(k):
        x.add_(1)


def linear(k: int) -> None:
    with torch.no_grad():
        for _ in range(k):
            lin(xl)


def deep(k: int, depth: int = 40) -> None:
    if depth > 0:
        deep(k, depth - 1)
        return
    add(k)


def mlp_step(k: int) -> None:
    for _ in range(k):
        mlp(xl).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


LOOPS = {"add": (add, 20_000), "linear": (linear, 20_000), "deep": (deep, 20_000), "mlp": (mlp_step, 1_000)}


def timed(fn, k: int) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    fn(k)
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / k


def dlpt_configs() -> dict[str, tuple]:
    from dlpt.collectors.record import native

    mod = native.load(quiet=True)
    if not mod.capabilities()["cupti"]:
        raise SystemExit("this dlpt build has no CUPTI")

    def sw(device: bool, host: bool, diag: str):  # type: ignore[no-untyped-def]
        def on() -> None:
            err = mod.start(device, False, host, diag)
            if err:
                raise SystemExit(f"start: {err}")

        return on, mod.stop

    return {"rf-noop": sw(False, True, "noop"), "host": sw(False, True, ""),
            "cupti-act": sw(True, False, "nocallbacks"), "cupti-cb": sw(True, False, "noactivities"),
            "cupti": sw(True, False, ""), "dlpt": sw(True, True, ""), "dlpt-rt": sw(True, True, "nodriver")}


def peer_configs(which: str) -> dict[str, tuple]:
    if which == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        box: list = []

        def on_k(acts: list, stack: bool):  # type: ignore[no-untyped-def]
            def on() -> None:
                p = profile(activities=acts, with_stack=stack)
                p.__enter__()
                box.append(p)

            return on

        def off() -> None:
            box.pop().__exit__(None, None, None)

        return {"kineto-cuda": (on_k([ProfilerActivity.CUDA], False), off),
                "torch.profiler": (on_k([ProfilerActivity.CPU, ProfilerActivity.CUDA], False), off),
                "torch.profiler+stack": (on_k([ProfilerActivity.CPU, ProfilerActivity.CUDA], True), off)}
    if which == "proton":
        import triton.profiler as proton

        sids: dict[str, int] = {}

        def on_p(ctx: str):  # type: ignore[no-untyped-def]
            def on() -> None:
                if ctx in sids:
                    proton.activate(sids[ctx])
                else:
                    sids[ctx] = proton.start(f"/tmp/percall_proton_{ctx}", context=ctx)

            def off() -> None:
                proton.deactivate(sids[ctx])

            return on, off

        # Proton's sessions share one CUPTI subscription: one context per process is measured.
        ctx = os.environ.get("DLPT_BENCH_PROTON_CONTEXT", "python")
        return {f"proton-{ctx}": on_p(ctx)}
    raise SystemExit(f"unknown family {which!r}")


def main() -> None:
    which = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    for fn, k in LOOPS.values():
        fn(k // 4)  # warm: kernels loaded, allocator primed
    configs = dlpt_configs() if which == "dlpt" else peer_configs(which)
    # Unprofiled before any profiler ran, then alternating: CUPTI left attached shows as a
    # difference between the two.
    res: dict[str, dict[str, list[float]]] = {"pristine": {n: [] for n in LOOPS}, "none": {n: [] for n in LOOPS}}
    for _ in range(3):
        for n, (fn, k) in LOOPS.items():
            res["pristine"][n].append(timed(fn, k))
    for name in configs:
        res[name] = {n: [] for n in LOOPS}
    for r in range(rounds):
        order = list(configs)
        order = order[r % len(order):] + order[: r % len(order)]  # rotate: no config always first
        for name in ["none", *order]:
            if name != "none":
                configs[name][0]()
            for n, (fn, k) in LOOPS.items():
                fn(max(1, k // 50))  # the first calls under a switch intern their contexts
                res[name][n].append(timed(fn, k))
            if name != "none":
                configs[name][1]()
    med = {c: {n: statistics.median(v) for n, v in d.items()} for c, d in res.items()}
    base = med["pristine"]
    print(f"{'ns per iteration':24}" + "".join(f"{n:>18}" for n in LOOPS))
    for c, d in med.items():
        print(f"{c:24}" + "".join(f"{d[n]:>10.0f} {d[n] - base[n]:>+7.0f}" for n in LOOPS))
    print(json.dumps({"family": which, "device": torch.cuda.get_device_name(0), "rounds": rounds,
                      "ns_per_iter": {c: {n: round(v, 1) for n, v in d.items()} for c, d in med.items()}}))
    if which == "proton":
        import triton.profiler as proton

        proton.finalize()


if __name__ == "__main__":
    main()
