"""A program's step with a profiler switched on and off in one process, interleaved.

Step times on the GPU machine spread by ±15% between processes (docs/BENCHMARKS.md), more than
the differences to measure. Here one process builds one program's step and runs blocks of steps
alternately unprofiled and under one profiler, so both see the same machine state. Each profiler
gets its own process: CUPTI takes one subscriber, and torch.profiler's Kineto keeps its
subscription once it has run.

Programs (WORKLOAD), each built from the third-party code in shared/programs, never edited:
- `nanogpt`: nanoGPT's training step (its model.py, the shakespeare_char configuration train.py
  uses: 6 layers, 6 heads, 384 wide, block 256, batch 64, bf16 autocast, fused AdamW, gradient
  clipping); launch-bound.
- `decode`: gpt-fast's decode (generate.py's prefill and decode_n_tokens, stories110M's shape,
  batch 1, random bf16 weights) with decode_one_token compiled `mode="reduce-overhead",
  fullgraph=True` as generate.py compiles it: CUDA-graph replays. A step is 32 tokens.
- `decode-eager`: the same, not compiled, 8 tokens a step: host-bound eager decode.
- `resnet50`: timm's resnet50 training step, batch 256 (its benchmark.py default), bf16 autocast, SGD; GPU-bound.
- `vit`: timm's vit_base_patch16_224 inference, batch 64, bf16 autocast; GPU-bound.
Every step ends in a synchronize (the decode loop's tokens, the loss read).
gpt-fast is not in the project's shared/programs: copy model.py, generate.py and tokenizer.py of
github.com/pytorch-labs/gpt-fast (commit 32971d3 measured) into shared/programs/gpt-fast/.

    python bench/workloads/inproc.py WORKLOAD dlpt|torch.profiler|torch.profiler-cuda|proton [ROUNDS] [BLOCK]
prints one JSON line: median step (ms) unprofiled and profiled, and the ratio; also the median
before the profiler first ran (pristine) and the profiled steps' ratio to it.

    python bench/workloads/inproc.py WORKLOAD variants [ROUNDS] [BLOCK] LABEL=ENV ...
runs dlpt in several configurations in one process, each block of them after an unprofiled one
(ENV: `K=V,K=V`, e.g. `nodevice=DLPT_DEVICE=0`, empty for the default): per configuration the
median step over the median of the unprofiled blocks, the GPU time it recorded per step, its
kernel count, and its GPU time per source line (the top lines).

    python bench/workloads/inproc.py WORKLOAD plain [ROUNDS] [BLOCK]
runs ROUNDS × BLOCK steps with no profiler and prints their median: for whole processes, run as
they are or under `dlpt record` (CUDA graphs then get instantiated while dlpt records).

    python bench/workloads/inproc.py nanogpt after [ROUNDS] [BLOCK]
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
PROGRAMS = os.path.join(ROOT, "shared", "programs")

# Host time per step (up to the step's synchronize), by phase: whether a profiler's cost falls on
# the host (launch-bound steps) or on the GPU.
PHASE = ["warm"]
HOST: dict[str, list[float]] = {"warm": [], "pristine": [], "none": [], "prof": []}


def make_nanogpt():
    sys.path.insert(0, os.path.join(PROGRAMS, "nanoGPT"))
    from model import GPT, GPTConfig

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


def make_decode(compiled: bool, tokens: int = 32):
    """gpt-fast's own decode path (generate.py), as its generate() runs it after the prompt."""
    sys.path.insert(0, os.path.join(PROGRAMS, "gpt-fast"))
    import generate as gen  # its module-level Inductor settings apply, as in generate.py
    from model import Transformer

    torch.manual_seed(1234)
    with torch.device("cuda"):
        model = Transformer.from_name("stories110M")
    model = model.to(dtype=torch.bfloat16).eval()
    prompt_len, batch = 16, 1
    with torch.device("cuda"):
        model.setup_caches(max_batch_size=batch, max_seq_length=prompt_len + tokens + 8)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device="cuda")
    sampling = {"temperature": 0.8, "top_k": 200}
    with torch.no_grad():
        first = gen.prefill(model, prompt, torch.arange(0, prompt_len, device="cuda"), **sampling).clone()
    if compiled:
        gen.decode_one_token = torch.compile(gen.decode_one_token, mode="reduce-overhead", fullgraph=True)

    def step() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            pos = torch.tensor([prompt_len], device="cuda", dtype=torch.int)
            gen.decode_n_tokens(model, first.view(batch, -1), pos, tokens, **sampling)
        HOST[PHASE[0]].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step


def make_timm(name: str, train: bool, batch: int):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
    if train:
        model.train()
        y = torch.randint(0, 1000, (batch,), device="cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
    else:
        model.eval()

    def step() -> float:
        t0 = time.perf_counter()
        if train:
            with ctx:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), ctx:
                model(x)
        HOST[PHASE[0]].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step


WORKLOADS = {
    "nanogpt": lambda: make_nanogpt(),
    "decode": lambda: make_decode(True),
    "decode-eager": lambda: make_decode(False, tokens=8),
    "resnet50": lambda: make_timm("resnet50", True, 256),
    "vit": lambda: make_timm("vit_base_patch16_224", False, 64),
}


def line_times(prof) -> dict[str, int]:
    """GPU time per source line (library frames hidden), by `file:line  code`."""
    from dlpt.metrics import COL
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    fv = flat(hide_library_unless(prof, False), "line")
    col = COL["gpu_time"]
    out = {}
    for g, fr in enumerate(fv.frame):
        v = int(fv.exclusive[g, col])
        if fr.kind == "python" and fr.file and v:
            code = (prof.source_line(fr.file, fr.line) or "").strip()[:50]
            out[f"{os.path.basename(fr.file)}:{fr.line}  {code}"] = v
    return out


def recorded(profiles: list, steps: int) -> dict:
    """What dlpt's profiles of the profiled blocks hold, per step: GPU time, kernels, GPU time
    on the top lines; and the share of device records no launch callback matched."""
    if not profiles:
        return {}
    from dlpt.metrics import COL

    lines: dict[str, int] = {}
    for p in profiles:
        for k, v in line_times(p).items():
            lines[k] = lines.get(k, 0) + v
    top = sorted(lines.items(), key=lambda kv: -kv[1])[:12]
    records = sum(int(p.meta["collector"].get("device_records", 0)) for p in profiles)
    unlinked = sum(int(p.meta["collector"].get("unlinked_records", 0)) for p in profiles)
    return {"gpu_ms_per_step": round(sum(int(p.cct.inclusive[0, COL["gpu_time"]]) for p in profiles) / steps / 1e6, 5),
            "kernels_per_step": round(sum(int(p.cct.inclusive[0, COL["kernel_count"]]) for p in profiles) / steps, 2),
            "unlinked_pct": round(100.0 * unlinked / records, 3) if records else None,
            "lines_us_per_step": {k: round(v / steps / 1e3, 3) for k, v in top}}


def variants(step, rounds: int, block: int, specs: list[str]) -> None:
    """dlpt in several configurations, each block after an unprofiled one (see the docstring)."""
    from dlpt.collectors.record.session import Recorder

    configs = []
    for spec in specs:
        label, _, env = spec.partition("=")
        configs.append((label, dict(kv.split("=", 1) for kv in env.split(",") if kv)))
    none: list[float] = []
    steps: dict[str, list[float]] = {label: [] for label, _ in configs}
    profiles: dict[str, list] = {label: [] for label, _ in configs}
    for _ in range(rounds):
        for label, env in configs:
            torch.cuda.synchronize()
            PHASE[0] = "none"
            none += [step() for _ in range(block)][1:]
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            r = Recorder(command="inproc", quiet=True)
            r.start()
            PHASE[0] = "prof"
            steps[label] += [step() for _ in range(block)]
            profiles[label].append(r.stop())
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    base = statistics.median(none)
    out = {"unprofiled_ms": round(base * 1e3, 4), "device": torch.cuda.get_device_name(0), "configs": {}}
    for label, env in configs:
        # the first step of each block warms the profiler: left out of the median, kept in the GPU time
        med = statistics.median([t for i, t in enumerate(steps[label]) if i % block])
        out["configs"][label] = {"env": env, "ms": round(med * 1e3, 4), "ratio": round(med / base, 4),
                                 **recorded(profiles[label], len(steps[label]))}
    print(json.dumps(out))


def main() -> None:
    workload, which = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    block = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    step = WORKLOADS[workload]()
    for _ in range(15):
        step()
    if which == "variants":
        variants(step, rounds, block, sys.argv[5:])
        return
    if which == "plain":
        # The whole process is what is measured (`dlpt record` around it, or not): no profiler here.
        times = [step() for _ in range(rounds * block)]
        print(json.dumps({"workload": workload, "profiler": "plain", "median_ms": round(statistics.median(times) * 1e3, 4),
                          "steps": len(times), "device": torch.cuda.get_device_name(0)}))
        return
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
        print(json.dumps({"workload": workload, "profiler": f"dlpt ×{cycles} (after)" if r else "none (after)", "before_ms": round(a, 3),
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
            profiles.append(r.stop())  # type: ignore[attr-defined]
    elif which in ("torch.profiler", "torch.profiler-cuda"):
        from torch.profiler import ProfilerActivity, profile

        # torch.profiler-cuda: CUDA activities only, no op events or stacks: Kineto's leanest
        # configuration, what CUPTI's kernel tracing costs through it.
        acts = [ProfilerActivity.CUDA] if which.endswith("-cuda") else [ProfilerActivity.CPU, ProfilerActivity.CUDA]

        def on() -> object:
            p = profile(activities=acts, with_stack=not which.endswith("-cuda"))
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
    profiles: list = []  # dlpt's, one per profiled block: what it recorded
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
    print(json.dumps({"workload": workload, "profiler": which, "pristine_ms": round(p0, 3), "unprofiled_ms": round(a, 3),
                      "profiled_ms": round(b, 3), "ratio": round(b / a, 4), "ratio_to_pristine": round(b / p0, 4),
                      "steps_each": len(none), "device": torch.cuda.get_device_name(0),
                      "host_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in HOST.items() if v},
                      **recorded(profiles, rounds * block)}))
    if which == "proton":
        import triton.profiler as proton

        proton.finalize()


if __name__ == "__main__":
    main()
