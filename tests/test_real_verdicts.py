"""The diagnosis of real programs nobody here wrote, recorded on an H100 as their users run them
(`python bench/run.py verdicts --keep ...`), against the figures the programs printed in the same
run (`*.truth.json` beside each profile: their own timers).

- gpu_gptfast_compile: gpt-fast `generate.py --compile` (decode in mode="reduce-overhead": CUDA
  graphs), 5 samples of 200 tokens; it prints `Compilation time` (its warm-up generation, where
  everything is compiled) and `Time for inference i` per sample.
- gpu_imagenet_j1: pytorch/examples imagenet `--dummy -a resnet50 -b 64 -j 1 --print-freq 1`,
  stopped with Ctrl-C; its `Data` meter says how long each step waited for its batch.
- gpu_nanogpt_b64: nanoGPT `train.py config/train_shakespeare_char.py` eager (batch 64), 60
  iterations, recorded on an H200 by `bench/run.py device programs --programs nanogpt`'s
  arrangement; it prints each iteration's time.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import DATA

import dlpt
from dlpt import findings as fd
from dlpt.phases import COMPILE, STARTUP, STEADY, phase_figures


def _load(name: str) -> tuple[dlpt.Profile, dict]:
    return dlpt.load(str(DATA / f"{name}.dlpt")), json.loads((DATA / f"{name}.truth.json").read_text())


def _seconds(figure: str) -> float:
    m = re.search(r"GPU idle ([0-9.]+) (s|ms)", figure)
    assert m, figure
    return float(m.group(1)) * (1.0 if m.group(2) == "s" else 1e-3)


def test_gpt_fast_compiled_keeps_compiling_apart_and_is_never_told_to_compile() -> None:
    prof, truth = _load("gpu_gptfast_compile")
    figs = {f.name: f for f in phase_figures(prof)}
    assert set(figs) == {STARTUP, COMPILE, STEADY}
    win = prof.meta["window"]
    assert sum(f.wall for f in figs.values()) == win["end"] - win["start"]
    # Compiling happens inside the program's warm-up generation, which it times: 60.17 s of its
    # 62.42 s there (96.4%); the rest of that generation is its first decoding.
    assert 0.9 * truth["compilation_s"] <= figs[COMPILE].wall / 1e9 <= truth["compilation_s"]
    # The steady state holds the five timed samples (1.34 s) and what the program prints between
    # them: 1.64 s.
    samples = sum(truth["samples_s"])
    assert samples <= figs[STEADY].wall / 1e9 <= 1.5 * samples
    found = fd.findings(prof)
    assert all("compile the model with torch.compile" not in f.remedy for f in found)
    compiling = next(f for f in found if f.rule == "compile")
    assert compiling.of == "run" and compiling.share == pytest.approx(figs[COMPILE].wall / (win["end"] - win["start"]))
    steady = [f for f in found if f.of == "steady state"]
    assert steady and sum(f.share for f in steady) <= 1.0
    for f in steady:
        assert f.rule not in ("launch-bound", "gpu-bound") or "already" in f.remedy + f.figure


def test_imagenet_with_one_worker_waits_for_its_loader_as_its_data_meter_says() -> None:
    prof, truth = _load("gpu_imagenet_j1")
    found = fd.findings(prof)
    steady = [f for f in found if f.of == "steady state"]
    f = steady[0]
    assert f.rule == "dataloader-wait" and "1 worker process" in f.figure
    # The Data meter over the steady state (every iteration after the first, whose batch waited
    # for the worker to start): 21.58 s; dlpt's idle on the loader's lines −5.7%.
    got, want = _seconds(f.figure), truth["steady_data_s"]
    assert abs(got - want) <= 0.15 * want, (got, want)
    assert sum(x.share for x in steady) <= 1.0
    # One worker already: the remedy is more of them, not "num_workers=N" from zero.
    assert "raise num_workers" in f.remedy


def test_a_graphed_program_recorded_per_kernel_is_told_the_recorder_costs_its_graph_launches() -> None:
    """gpt-fast --compile recorded with every replayed kernel traced (`--cuda-graph-trace node`) shows idle
    between launches that CUPTI's per-kernel records put into each graph launch: the verdict says
    so and how to record without it; the same profile marked as recorded per graph does not."""
    from dataclasses import replace

    prof, _ = _load("gpu_gptfast_compile")
    steady = [f for f in fd.findings(prof) if f.of == "steady state" and f.rule in ("launch-bound", "host-bound")]
    assert steady, [f.rule for f in fd.findings(prof)]
    for f in steady:
        assert f.remedy.startswith("this recording traced every kernel of every CUDA-graph replay"), f.remedy
        assert "dlpt record --cuda-graph-trace graph" in f.remedy
    per_graph = replace(prof, meta={**prof.meta, "collector": {**prof.meta.get("collector", {}), "graph_trace": "graph"},
                                    "diagnosis": None})
    assert all("--cuda-graph-trace" not in f.remedy for f in fd.findings(per_graph))


def test_kernels_replayed_in_a_cuda_graph_are_no_launches() -> None:
    """bench/gpu_cases/cudagraph.py (H100): a graph of 7 nodes captured once and replayed, next to
    eager ops. The split's kernel counts (the launch-bound rule's evidence) hold only the kernels
    launched one by one: those beneath `CUDAGraph.replay`, found here by walking each kernel's
    parents, are left out."""
    from dlpt.evidence import evidence
    from dlpt.metrics import KERNEL

    e = evidence(dlpt.load(str(DATA / "gpu_case_cudagraph.dlpt")))
    p, a = e.steady, e.steady.activities
    assert a.count is not None

    def under_replay(node: int) -> bool:
        while node > 0:
            f = p.frames[int(p.cct.frame[node])]
            if f.function == "replay" and f.file.endswith("torch/cuda/graphs.py"):
                return True
            node = int(p.cct.parent[node])
        return False

    kernels = [(int(a.node[i]), int(a.count[i])) for i in range(len(a)) if a.kind[i] == KERNEL]
    replayed = sum(c for n, c in kernels if under_replay(n))
    assert replayed >= 25, replayed  # 5 kernel nodes × 5+ replays in the steady state
    assert e.split.kernels == sum(c for _, c in kernels) - replayed


def test_nanogpt_at_batch_64_is_told_both_halves_of_its_idle() -> None:
    """nanoGPT's character model at batch 64: most of its kernels run 10 us or more, so the
    short-kernel half of launch-bound does not fire, yet its launching lines take 48 us of host
    time per launch for 14 us of GPU time per kernel. The steady state's findings explain the GPU's
    idle as the program's own timer shows it (its 60 iterations' time, less the kernels' time the
    recording measured): launch-bound on the lines that launch op by op, host-bound on get_batch's
    per-sample loops (train.py:124-125: a Python list of 64 numpy slices a batch)."""
    prof, truth = _load("gpu_nanogpt_b64")
    steady = {f.rule: f for f in fd.findings(prof) if f.of == "steady state"}
    assert set(steady) == {"launch-bound", "host-bound"}, steady
    launch, host = steady["launch-bound"], steady["host-bound"]
    from dlpt.evidence import evidence

    s = evidence(prof).split
    assert s.short_kernels < fd.LAUNCH_SHORT_SHARE * s.kernels  # the pace, not the short kernels, decides
    assert s.launch_host > s.launch_gpu and "of host time per launch" in launch.figure
    assert "torch.compile" in launch.remedy
    assert {x.rsplit("/", 1)[-1] for x in host.lines[:2]} == {"train.py:124", "train.py:125"}
    # The program's own timer: iterations 1-60 (iteration 0 holds start-up) against the GPU's busy
    # time in the steady state; the two verdicts together explain at least 85% of that idle.
    loop_s = sum(ms for i, ms in truth["iter_ms"].items() if int(i) >= 1) / 1e3
    idle_share = 1.0 - s.busy / 1e9 / loop_s
    assert 0.5 < idle_share < 0.8, idle_share
    assert 0.85 * idle_share <= launch.share + host.share <= idle_share + 0.02, (launch.share, host.share, idle_share)


def test_an_eager_program_that_captures_a_graph_by_hand_is_not_called_compiled() -> None:
    """bench/workloads/truth.py (recorded on an H100) runs eager cases and one CUDA graph it
    captures itself: the capture is in the compile phase, yet nothing was compiled. Its gpu-bound
    finding read "(the program is already compiled and CUDA-graphed)" and so left torch.compile out
    of its remedy; gpt-fast, compiled, still reads compiled."""
    from dlpt.evidence import traits

    truth = dlpt.load(str(DATA / "gpu_truth.dlpt"))
    assert (truth.meta.phases or {}).get(COMPILE, {}).get("wall")  # the capture's phase is there
    t = traits(truth)
    assert t.graphed and not t.compiled
    (gpu,) = [f for f in fd.findings(truth) if f.rule == "gpu-bound"]
    assert "compiled" not in gpu.figure and "torch.compile" in gpu.remedy, gpu
    assert traits(dlpt.load(str(DATA / "gpu_gptfast_compile.dlpt"))).compiled
