"""What recording costs where users run it: real programs' own command lines as whole processes,
read by their own throughput (`bench/run.py programs`).

    python bench/run.py programs [--programs NAME,...] [--configs C,...] [--procs N] [--gpus N] [--budget S]

Each program runs as its users run it, once per configuration per round, rounds in turns
(plain, dlpt, Proton, torch.profiler, plain, dlpt, …), so that a machine whose speed drifts
weighs on every configuration alike. A program's figure is the one it prints itself:

- `gptfast-compile`, `gptfast-eager`: gpt-fast `generate.py` (bench/workloads/gptfast.py: random
  weights, offline), `--compile` (decode as CUDA-graph replays) or eager; its `Average tokens/sec`.
- `nanogpt`, `nanogpt-compile`: nanoGPT `train.py` (shakespeare_char), eager and `--compile=True`;
  the median of its `iter N: … time X ms` over iterations 10-60.
- `timm`: timm `benchmark.py --model resnet50 --bench train --amp -b 256`; its `samples/sec`.
- `imagenet`: pytorch/examples imagenet `--dummy -a resnet50 -b 64 -j 8`, Ctrl-C after a fixed
  time; the median of its per-iteration `Time` meter past the first 10 iterations.
- `trainer`: a Hugging Face Trainer run (bench/workloads/hf_trainer.py); its median step.

Configurations (`--configs`, `LABEL=MODE[:ENV=V,...]` as the other cases take them; the first
is the baseline): `plain`; `dlpt` (`dlpt record`); `proton` (`proton -c python`: its Python
context, the one that names source lines as dlpt does) and `proton-shadow` (its default
context); `torch.profiler-cuda` (CUDA activities only) and `torch.profiler` (CPU and CUDA, with
stacks), both wrapped around the unmodified script.

`--gpus N` runs N processes at once, each on a GPU of its own (CUDA_VISIBLE_DEVICES), taking the
same list of turns in order: on a machine of several GPUs the table is N times quicker to fill.
The processes then share the host (cores, memory bandwidth, the PCIe root), and every
configuration shares it alike, since the turns interleave them; a figure is of that machine
busy, not of one process alone (the table's title says how many ran at once).

The table gives, per configuration: every process's figure in run order, the median, its ratio
to the baseline's median (as slowdown: >1 is slower), and the range of each process's ratio to
that median — the spread a user meets in one run. After it, each recorded process's figure beside
what dlpt says of that process (its findings with their shares and first lines, the steady
state's GPU busy share, and the split of it the rules read): a verdict is a claim, checked here
against the program's own timer. On the device machines the unprofiled
programs themselves spread (docs/BENCHMARKS.md: gpt-fast --compile 1,214-1,898 tok/s over 7
processes), so read a ratio with the baseline's own range beside it. Writes programs.json under
$OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import runlib as rl

NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--max_iters=60", "--eval_interval=1000", "--eval_iters=5",
                "--log_interval=1", "--always_save_checkpoint=False"]
_AVG = re.compile(r"Average tokens/sec: ([0-9.]+)")
_TIMM = re.compile(r"done\.\s*([0-9.]+) samples/sec")
_IMAGENET = re.compile(r"Epoch: \[\d+\]\[\s*(\d+)/\d+\]\s+Time\s+([0-9.]+)")
_TRAINER = re.compile(r"^TRAINER_RESULT (.*)$")


@dataclass
class Program:
    """A third-party program as its users run it: `command(work)` gives its argv (after the
    interpreter or the profiler's launcher) and cwd; `figure(result)` reads the one number it
    prints about its own speed (None: it printed none)."""

    command: Callable[[str], tuple[list[str], str]]
    figure: Callable[[rl.Result], float | None]
    unit: str
    higher_is_better: bool
    estimate: float  # seconds one unprofiled process takes on the device machine
    timeout: float = 420
    interrupt_after: float | None = None


def _gptfast(compiled: bool) -> Callable[[str], tuple[list[str], str]]:
    def command(work: str) -> tuple[list[str], str]:
        n = "5" if compiled else "3"
        return ([os.path.join(rl.WORKLOADS, "gptfast.py"), "--prompt", "16", "--num_samples", n,
                 "--max_new_tokens", "200", *(["--compile"] if compiled else [])], work)
    return command


def _last(pattern: re.Pattern[str], res: rl.Result, stderr: bool = False) -> float | None:
    lines = res.out_lines + (res.err_lines if stderr else [])
    found = [float(m.group(1)) for x in lines if (m := pattern.search(x))]
    return found[-1] if found else None


def _nanogpt(compiled: bool) -> Callable[[str], tuple[list[str], str]]:
    def command(work: str) -> tuple[list[str], str]:
        nd = os.path.join(work, "nanoGPT")
        if not os.path.isdir(nd):
            nd = rl.nanogpt_copy(work)
        return ["train.py", *NANOGPT_ARGS, f"--compile={compiled}"], nd
    return command


def _nanogpt_step(res: rl.Result) -> float | None:
    steps = rl.window(rl.nanogpt_iters(res), 10, 60)
    return statistics.median(steps) if steps else None


def _imagenet_step(res: rl.Result) -> float | None:
    times = [float(m.group(2)) for x in res.out_lines if (m := _IMAGENET.search(x)) and int(m.group(1)) > 10]
    return 1e3 * statistics.median(times) if times else None


def _trainer_step(res: rl.Result) -> float | None:
    found = [json.loads(m.group(1)) for x in res.out_lines if (m := _TRAINER.match(x))]
    return 1e3 * found[-1]["step_s_median"] if found and found[-1].get("step_s_median") else None


PROGRAMS: dict[str, Program] = {
    "gptfast-compile": Program(_gptfast(True), lambda r: _last(_AVG, r), "tok/s", True, 60),
    "gptfast-eager": Program(_gptfast(False), lambda r: _last(_AVG, r), "tok/s", True, 25),
    "nanogpt": Program(_nanogpt(False), _nanogpt_step, "ms/iter", False, 30),
    "nanogpt-compile": Program(_nanogpt(True), _nanogpt_step, "ms/iter", False, 90),
    "timm": Program(lambda w: ([os.path.join(rl.programs_dir(), "timm_benchmark", "benchmark.py"), "--model",
                                "resnet50", "--bench", "train", "--amp", "-b", "256", "--num-warm-iter", "5",
                                "--num-bench-iter", "40"], w),
                    lambda r: _last(_TIMM, r, stderr=True), "samples/s", True, 45),
    "imagenet": Program(lambda w: ([os.path.join(rl.programs_dir(), "imagenet", "main.py"), "--dummy", "-a",
                                    "resnet50", "-b", "64", "-j", "8", "--epochs", "1", "--print-freq", "1",
                                    "--gpu", "0"], w),
                        _imagenet_step, "ms/iter", False, 50, timeout=150, interrupt_after=40),
    "trainer": Program(lambda w: ([os.path.join(rl.WORKLOADS, "hf_trainer.py"), "--steps", "60"], w),
                       _trainer_step, "ms/step", False, 40),
}

TORCH_PROFILER_CUDA = rl.TORCH_PROFILER_RUN.replace(
    "acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])",
    "acts = [ProfilerActivity.CUDA]").replace("with_stack=True", "with_stack=False")


# What dlpt says of a recording, read in one child with the recording's dlpt: the findings (as
# `dlpt report` gives them), the steady state's GPU busy share (its phase figures, as the report's
# summary has them), and the evidence the rules read (dlpt.evidence: each part's share of the
# judged GPU time, the idle parts by cause).
_VERDICTS = """
import json, sys
import dlpt
from dlpt.evidence import evidence
from dlpt.findings import findings
from dlpt.phases import phase_figures
p = dlpt.load(sys.argv[1])
e = evidence(p)
s = e.split
steady = [f for f in phase_figures(p) if f.name == "steady"]
parts = ("busy", "queued", "launch", "python", "after_sync", "loader", "unplaced", "comm_wait", "pageable")
print(json.dumps({
    "findings": [{"rule": f.rule, "share": f.share, "of": f.of, "line": (f.lines or [None])[0]} for f in findings(p)],
    "steady_gpu_busy": steady[0].busy / steady[0].wall if steady and steady[0].busy is not None and steady[0].wall
    else None,
    "split": {"of": e.of, "device": int(s.device), "kernels": int(s.kernels), "short_kernels": int(s.short_kernels),
              "launch_us_host": round(s.launch_host / s.launch_kernels / 1e3, 1) if s.launch_kernels else None,
              "launch_us_gpu": round(s.launch_gpu / s.launch_kernels / 1e3, 1) if s.launch_kernels else None,
              **{k: round(s.share(getattr(s, k)), 4) for k in parts}}}))
"""


def verdicts(profile: str, cwd: str) -> dict[str, Any] | None:
    """What dlpt says of a recorded process (`_VERDICTS`), to set beside the figure the program
    printed (a verdict is a claim, checked against the program's own timers), with a line of it
    in words. None where the profile cannot be read (its error is in the log)."""
    r = rl.run([rl.PY, "-c", _VERDICTS, profile], cwd=cwd, timeout=300)
    try:
        said = json.loads(r.out_lines[-1])
    except (ValueError, IndexError):
        return None
    found, busy, split = said["findings"], said["steady_gpu_busy"], said["split"]
    words = ", ".join(f"{f['rule']} {f['share']:.0%} of the {f['of']}" if f["share"] is not None else f"{f['rule']}"
                      for f in found) or "no finding"
    line = words + (f"; steady-state GPU busy {busy:.0%}" if busy is not None else "")
    if split["device"]:
        parts = ("busy", "queued", "launch", "python", "after_sync", "loader", "unplaced")
        line += " (" + ", ".join(f"{k} {split[k]:.0%}" for k in parts if split.get(k)) + \
            f"; {split['short_kernels']} of {split['kernels']} kernels short" + \
            (f"; launching lines {split['launch_us_host']} us of host time per launch, {split['launch_us_gpu']} us "
             "of GPU time per kernel" if split.get("launch_us_host") is not None else "") + ")"
    return {**said, "line": line}


def launcher(mode: str, out: str, work: str) -> list[str]:
    """The argv before a program's own: how a user starts it under each configuration."""
    if mode == "plain":
        return [rl.PY]
    if mode == "dlpt":
        return rl.dlpt_record(out)
    if mode in ("proton", "proton-shadow"):
        ctx = "python" if mode == "proton" else "shadow"
        return [rl.PY, "-m", "triton.profiler.proton", "-n", out, "-c", ctx]
    if mode == "torch.profiler":
        return [rl.PY, rl.torch_profiler_script(work)]
    if mode == "torch.profiler-cuda":
        path = os.path.join(work, "torch_profiler_cuda_run.py")
        with open(path, "w") as f:
            f.write(TORCH_PROFILER_CUDA)
        return [rl.PY, path]
    raise SystemExit(f"bench/run.py programs: no configuration mode {mode!r}")


def ratios(values: list[float], base: float | None, higher_is_better: bool) -> list[float]:
    """Each figure as a slowdown against the baseline's median (> 1: slower than it)."""
    if not base:
        return []
    return [round(base / v if higher_is_better else v / base, 3) for v in values if v]


class Programs:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = rl.out_dir()
        self.work = rl.work_dir()
        self.log = rl.log_path(self.out, "programs.log")
        self.budget = rl.Budget(a.budget)
        self.configs = rl.parse_configs(a.configs)
        self.env = dict(kv.split("=", 1) for kv in a.env)  # for every configuration alike
        self.res: dict[str, Any] = {"gpu": rl.gpu_name(), "configs": [c[0] for c in self.configs],
                                    "processes_at_once": max(a.gpus, 1), "programs": {}}
        self.tables: list[str] = []
        self.lock = threading.Lock()  # --gpus: the turns, the results and programs.json are shared
        self.said: list[str] = []  # each recorded process's figure beside dlpt's verdict on it
        # (program, configuration label): the longest process that gave its figure so far
        self.walls: dict[tuple[str, str], float] = {}

    def estimate(self, name: str, label: str, profiled: bool) -> float:
        """Seconds the next process of `name` under `label` is expected to take: half again the
        longest of that configuration so far; before one has run, half again the longest of any
        configuration of the program, twice that for a profiled one (Proton's processes took 1.6x
        dlpt's); before any, the program's static estimate (twice it for a profiled one). Only
        processes that gave their figure count: one that failed at once says nothing of the next.
        A static figure alone skipped processes that would have fit: compiled nanoGPT is
        estimated at 90 s and ran in 22-41 s, so a third of a call's turns went unrun."""
        seen = self.walls.get((name, label))
        if seen is not None:
            return seen * 1.5
        others = [w for (n, _), w in self.walls.items() if n == name]
        if others:
            return max(others) * 1.5 * (2 if profiled else 1)
        return PROGRAMS[name].estimate * (2 if profiled else 1)

    def one(self, name: str, label: str, mode: str, env: dict[str, str], i: int, gpu: int | None = None) -> float | None:
        p = PROGRAMS[name]
        argv, cwd = p.command(self.work)
        out = os.path.join(self.work, f"{name}-{label}-{i}" + (".dlpt" if mode == "dlpt" else ""))
        own = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}
        r = rl.run([*launcher(mode, out, self.work), *argv], cwd=cwd, timeout=p.timeout, log=self.log,
                   env={**self.env, **env, **own},
                   interrupt_after=p.interrupt_after)
        v = p.figure(r)
        if v is not None and r["rc"] == 0:
            with self.lock:
                self.walls[(name, label)] = max(self.walls.get((name, label), 0.0), float(r["wall_s"]))
        # A driver's own probe lines (bench/workloads/gptfast.py GPTFAST_REPLAYS=1: each CUDA-graph
        # replay timed by CUDA events) are kept with the run.
        probes = {x.split(" ", 1)[0]: json.loads(x.split(" ", 1)[1]) for x in r.out_lines
                  if x.startswith(("REPLAYS {", "THREADS ["))}
        said = verdicts(out, cwd=self.work) if mode == "dlpt" and os.path.isfile(out) else None
        with self.lock:
            self.res["programs"][name]["runs"].append({"config": label, "round": i, "figure": v, "gpu": gpu,
                                                       **probes, **r.brief(), **({"dlpt": said} if said else {})})
            if said:
                self.said.append(f"{name} {label} #{i + 1}: {v} {p.unit} · {said['line']}")
        where = "" if gpu is None else f" on GPU {gpu}"
        print(f"  {name} {label} #{i + 1}{where}: {v} {p.unit} (rc {r['rc']}, {r['wall_s']} s)"
              + (f"; dlpt says {said['line']}" if said else ""), flush=True)
        return v

    def program(self, name: str) -> None:
        p = PROGRAMS[name]
        got: dict[str, list[float]] = {c[0]: [] for c in self.configs}
        self.res["programs"][name] = {"unit": p.unit, "higher_is_better": p.higher_is_better, "runs": [],
                                      "figures": got}
        if self.a.warm and self.budget.allows(p.estimate * 2):
            # One untimed plain process first: Inductor's and Triton's caches (and the OS's file
            # cache) are then as warm for the first timed process as for the last.
            argv, cwd = p.command(self.work)
            r = rl.run([rl.PY, *argv], cwd=cwd, timeout=p.timeout, log=self.log, interrupt_after=p.interrupt_after)
            print(f"  {name} warm-up: {p.figure(r)} {p.unit} (rc {r['rc']}, {r['wall_s']} s, not counted)", flush=True)
        p.command(self.work)  # its working copy made once, before processes run side by side
        # Side by side, each round starts one configuration further on, so that no configuration
        # keeps to one GPU (with as many configurations as GPUs it otherwise would).
        n, k = len(self.configs), (1 if self.a.gpus > 1 else 0)
        turns = [(i, *self.configs[(j + k * i) % n]) for i in range(self.a.procs) for j in range(n)]
        done: dict[tuple[int, str], float] = {}

        def worker(gpu: int | None) -> None:
            while True:
                with self.lock:
                    if not turns:
                        return
                    i, label, mode, env = turns.pop(0)
                if not self.budget.allows(self.estimate(name, label, mode != "plain")):
                    print(f"  {name} {label} #{i + 1}: skipped, {self.budget.left():.0f} s left", flush=True)
                    continue
                v = self.one(name, label, mode, env, i, gpu)
                with self.lock:
                    if v is not None:
                        done[(i, label)] = v
                    rl.write_json(self.out, "programs.json", self.res)

        if self.a.gpus <= 1:
            worker(None)
        else:
            pool = [threading.Thread(target=worker, args=(g,)) for g in range(self.a.gpus)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        for (_, label), v in sorted(done.items()):  # in turn order, however they finished
            got[label].append(v)
        base_label = self.configs[0][0]
        base = statistics.median(got[base_label]) if got[base_label] else None
        rows = []
        for label, values in got.items():
            med = statistics.median(values) if values else None
            r = ratios(values, base, p.higher_is_better)
            rows.append([label, len(values), ", ".join(rl.fmt(v) for v in values) or "-", med,
                         ratios([med], base, p.higher_is_better)[0] if med else None,
                         f"{min(r)}-{max(r)}" if r else "-"])
        self.tables.append(rl.table(
            f"{name}: whole processes, {p.unit} as it prints it ({self.res['gpu']}"
            + (f"; {self.a.gpus} processes at once, one GPU each)" if self.a.gpus > 1 else ")"),
            ["configuration", "processes", f"each process ({p.unit}, in run order)", "median",
             f"slowdown vs {base_label} median", "each process's slowdown"], rows))
        print(self.tables[-1], flush=True)
        mine = [x for x in self.said if x.startswith(name + " ")]
        if mine:
            self.tables.append(f"{name}: dlpt's verdicts, each beside the process's own figure\n"
                               + "\n".join(f"- {x}" for x in mine))

    def run(self) -> None:
        for name in self.a.programs.split(","):
            try:
                self.program(name)
            except Exception as e:  # noqa: BLE001 - one program's failure is a line, not the end of the case
                self.tables.append(f"{name}: failed: {type(e).__name__}: {e}")
        rl.finish(self.out, "\n\n".join(self.tables), "programs.json", self.log)


def programs(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py programs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default="gptfast-compile", help="comma-separated: " + ",".join(PROGRAMS))
    ap.add_argument("--configs", default="plain,dlpt,proton,torch.profiler-cuda",
                    help="comma-separated configurations, the first the baseline: plain, dlpt, proton, "
                         "proton-shadow, torch.profiler-cuda, torch.profiler (LABEL=MODE:ENV=V,... for variants)")
    ap.add_argument("--procs", type=int, default=3, help="processes per configuration, in turns")
    ap.add_argument("--gpus", type=int, default=1, help="processes at once, each on a GPU of its own "
                    "(CUDA_VISIBLE_DEVICES=0..N-1)")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole invocation")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="set for every process, e.g. --env GPTFAST_REPLAYS=1 (each replay timed)")
    ap.add_argument("--no-warm", dest="warm", action="store_false", help="skip the untimed plain process "
                    "each program runs first")
    a = ap.parse_args(argv)
    unknown = set(a.programs.split(",")) - set(PROGRAMS)
    if unknown:
        raise SystemExit(f"unknown programs {sorted(unknown)}; known: {','.join(PROGRAMS)}")
    if not rl.has_gpu():
        print("programs: no GPU here; the programs need one", file=sys.stderr)
    Programs(a).run()
