"""dlpt's bench suite: named cases, each printing a table with its peer measured in the same run
(docs/BENCHMARKS.md holds the figures and the command that made each).

    python bench/run.py --list                 # the cases
    python bench/run.py NAME [options]         # one case; NAME --help for its options
    python bench/run.py device CASE[,CASE...] [options of one case]
        # on the device machine: install carried wheels (.whl/), dlpt, build the collector once,
        # then run the cases in the time left ($TOTAL seconds, default 540), tables under $OUT

Cases are never timed tests: they measure, print, and (the GPU ones) write JSON under $OUT. The
programs they measure are in bench/workloads/ (ours) and bench/gpu_cases/ (the hard cases);
third-party programs (nanoGPT, timm; gpt-fast copied there, see bench/workloads/inproc.py) come
from the project's shared/programs.
"""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # the case modules import runlib and each other by name


class Case(NamedTuple):
    module: str
    function: str
    peer: str  # what the case measures dlpt against, in the same run
    about: str
    budget: int = 0  # seconds a device run keeps back for it; >0: it takes --budget


CASES: dict[str, Case] = {
    "read": Case("read", "read", "HTA TraceAnalysis", "dlpt report on Kineto traces at four sizes: time, peak memory"),
    "tui": Case("tui", "tui", "an unbound key (harness floor)", "dlpt view: first screen and key latency at 1M nodes"),
    "interop": Case("read", "interop", "hatchet GraphFrame.from_literal", "GraphFrame construction"),
    "ranks": Case("ranks", "ranks", "unprofiled torchrun (ddp)",
                  "merge of 8-256 rank profiles (CPU); DDP on 2 GPUs with a straggler (ddp)"),
    "cpu-record": Case("cpu_record", "cpu_record", "unprofiled", "op-bound CPU loop and 100k-step memory; "
                       "--callgrind: instructions per step", 120),
    "gpu-overhead": Case("gpu_overhead", "gpu_overhead", "unprofiled, Proton, torch.profiler",
                         "nanoGPT step in one process (the judge); whole processes, --steps, timm", 240),
    "gpu-fidelity": Case("gpu_fidelity", "gpu_fidelity", "CUDA events, Kineto",
                         "ground truth per line; nanoGPT's shares; a program running torch.profiler", 120),
    "gpu-cases": Case("gpu_fidelity", "gpu_cases", "≥ 99.5% at a source line; idle_truth --check",
                      "bench/gpu_cases/*.py under dlpt record"),
    "gpu-compiled": Case("gpu_compiled", "gpu_compiled", "the eager run; compile without provenance",
                         "torch.compile'd nanoGPT and own models: GPU time on model lines"),
    "trainer": Case("gpu_trainer", "gpu_trainer", "unprofiled", "HF Trainer under dlpt record, N times", 150),
    "programs": Case("programs", "programs", "unprofiled, Proton, torch.profiler (CUDA only; with stacks)",
                     "real programs' own command lines as whole processes, in turns: their own throughput", 300),
    "verdicts": Case("verdicts", "verdicts", "the programs' own timers (Data meter, tok/s, CUDA events)",
                     "the diagnosis of real programs (gpt-fast, imagenet, nanoGPT, timm, Trainer)", 300),
}


def entry(name: str) -> Callable[[list[str]], object]:
    c = CASES[name]
    return getattr(importlib.import_module(c.module), c.function)


def listing() -> str:
    w = max(map(len, CASES))
    return "\n".join(f"{n:<{w}}  {c.about} (peer: {c.peer})" for n, c in CASES.items())


# What dlpt and the cases import, checked once up front on the device: a missing one is named
# there rather than as a traceback in the middle of a case.
IMPORTS = """\
import importlib, sys
need = ["torch", "numpy", "msgspec", "dlpt", "transformers", "accelerate", "timm", "triton.profiler.proton"]
bad = []
for m in need:
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '')}")
    except Exception as e:  # a report: the case that needs it fails too, and says so
        bad.append(m); print(f"  {m}: MISSING ({type(e).__name__}: {e})")
import torch
print(f"  python {sys.version.split()[0]}, cuda {torch.version.cuda}, gpu {torch.cuda.is_available()}")
sys.exit(1 if set(bad) & {"torch", "numpy", "msgspec", "dlpt"} else 0)
"""
WARM = """\
import torch
x = torch.ones(1024, device="cuda")
for _ in range(10):
    x = x * 1.0001
torch.cuda.synchronize()
"""


def device(argv: list[str]) -> int:
    """The device machine's entry point: set up once, then run the cases within $TOTAL seconds
    (the device tool stops a command at 10 minutes), each keeping back what the later ones need.
    Under $OUT: tables.md (every table), runs.log (every measured run's lines, time-stamped),
    the cases' JSON, and device.log (this run's own output)."""
    if not argv or argv[0].startswith("-"):
        print("usage: bench/run.py device CASE[,CASE...] [options of one case]", file=sys.stderr)
        return 2
    names, rest = argv[0].split(","), argv[1:]
    bad = [n for n in names if n not in CASES]
    if bad or (len(names) > 1 and rest):
        print(f"bench/run.py device: unknown case {bad}" if bad else "options after the cases go with one case only",
              file=sys.stderr)
        return 2
    out = os.environ.setdefault("OUT", tempfile.mkdtemp(prefix="dlpt-bench-"))
    os.makedirs(out, exist_ok=True)
    os.environ.update(DLPT_BENCH_LOG=os.path.join(out, "runs.log"), PYTHONUNBUFFERED="1")
    total, t0 = float(os.environ.get("TOTAL", "540")), time.monotonic()
    log = open(os.path.join(out, "device.log"), "a")

    def left() -> float:
        return total - (time.monotonic() - t0)

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    def step(cmd: list[str], timeout: float, cwd: str = ROOT) -> int:
        """Run cmd, its output to the screen and device.log (runlib.stream keeps the deadline)."""
        import runlib

        return runlib.stream(cmd, timeout, say, cwd)

    wheels = sorted(glob.glob(os.path.join(ROOT, ".whl", "*.whl")))
    if wheels:  # dlpt's dependencies the device image lacks, carried in .whl/
        if subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", "/tmp/site", *wheels]).returncode:
            say("wheel install failed")
            return 1
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, ["/tmp/site", os.environ.get("PYTHONPATH")]))
    if not os.environ.get("DLPT_SKIP_INSTALL"):  # set it where dlpt is installed already
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                            ROOT], capture_output=True, text=True)
        if r.returncode:
            say(r.stdout + r.stderr + "pip install -e . failed")
            return 1
    import runlib

    say(f"device: {runlib.gpu_name()}")
    # cwd /tmp: the checkout's dlpt/ folder would shadow the installed package's layout.
    if step([sys.executable, "-c", IMPORTS], 120, cwd="/tmp"):
        say("a package dlpt needs is missing (carry its wheel in .whl/)")
        return 1
    if not os.path.isdir(os.path.join(ROOT, "shared", "programs", "nanoGPT")):
        say("WARNING: shared/programs/ is missing: the cases that run nanoGPT, timm or the Trainer will fail")
    if not os.path.isdir(os.path.join(ROOT, "shared", "programs", "gpt-fast")):
        say("WARNING: shared/programs/gpt-fast is missing: gpu-overhead's decode workloads will fail")
    # dlpt builds its native part on first use: once here, so that no measured run pays for it.
    with open("/tmp/dlpt_warm.py", "w") as f:
        f.write(WARM)
    w0 = time.monotonic()
    step([sys.executable, "-m", "dlpt", "record", "--force", "-o", "/tmp/dlpt_warm.dlpt", "/tmp/dlpt_warm.py"], 300,
         cwd="/tmp")
    say(f"warm-up record (native build on first use): {time.monotonic() - w0:.0f} s")
    for i, name in enumerate(names):
        case = CASES[name]
        mine = left() - sum(CASES[n].budget for n in names[i + 1:])
        if mine < 60:
            say(f"== {name}: skipped, {left():.0f} s left and {mine:.0f} s for it")
            continue
        say(f"== {name} ({mine:.0f} of {left():.0f} s left)")
        budget = ["--budget", str(int(mine))] if case.budget else []
        rc = step([sys.executable, os.path.join(HERE, "run.py"), name, *budget, *rest], mine)
        if rc:
            say(f"== {name}: exit status {rc}")
    say(f"total {total - left():.0f} s\n\n################ tables")
    tables = os.path.join(out, "tables.md")
    if os.path.exists(tables):
        with open(tables) as f:
            print(f.read())
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\ncases:\n" + listing())
        return 0
    if argv[0] == "--list":
        print(listing())
        return 0
    if argv[0] == "device":
        return device(argv[1:])
    if argv[0] not in CASES:
        print(f"bench/run.py: no case {argv[0]!r}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    rc = entry(argv[0])(argv[1:])
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
