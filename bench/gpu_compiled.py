"""torch.compile'd programs under `dlpt record` on a GPU, next to their eager runs. Run on the
device machine from the repository root, with the third-party programs copied to `shared/programs/`:

    python bench/run.py gpu-compiled nanogpt        # nanoGPT --compile=True and --compile=False
    python bench/run.py gpu-compiled own            # reduce-overhead and graph-break models, and eager
    python bench/run.py gpu-compiled compile-time   # cold compile time, provenance off and on
    python bench/run.py gpu-compiled report         # the tables from what the stages kept
    python bench/run.py gpu-compiled nanogpt-eager  # or any single stage (names: see STAGES)

Each device call has a 10-minute limit: run a group, or single stages, per call.

Each stage prints its tables and keeps its numbers in bench/out/gpu_compiled/ (kept between
device calls on a warm machine) and copies them to $OUT. Per program: the share of GPU time on
source lines that are not `def` lines, the share on model lines (nanoGPT's model.py; the own
models' `forward` bodies, bench/workloads/compiled_models.py), and the top lines side by side with
the eager run's. The recorder applies compiled-code provenance itself; `compile-time` measures
what collecting it costs a cold compile, the program run with and without it (PROVENANCE_RUN).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = os.path.join(ROOT, "bench", "out", "gpu_compiled")
OUT = os.environ.get("OUT") or KEEP
NANOGPT = os.path.join(ROOT, "shared", "programs", "nanoGPT")
MODELS = os.path.join(ROOT, "bench", "workloads", "compiled_models.py")
# `python IT SCRIPT ARGS`: the program as `python SCRIPT ARGS` would run it, with dlpt's
# compiled-code provenance collected around it (what the recorder does), and nothing else.
PROVENANCE_RUN = """\
import os, runpy, sys
from dlpt.collectors.record.provenance import ProvenanceRecorder
prov = ProvenanceRecorder()
prov.start()
target = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.realpath(target))
try:
    runpy.run_path(target, run_name="__main__")
finally:
    prov.stop()
"""
# Host op time stands in on a machine without a GPU (a smoke run of this script).
METRIC = os.environ.get("DLPT_BENCH_METRIC", "gpu_time")
NANO_ARGS = ["config/train_shakespeare_char.py", "--eval_interval=1000", "--eval_iters=5", "--log_interval=1",
             "--always_save_checkpoint=False"]


def record(out: str, program: list[str], cwd: str, steps: str = "") -> tuple[object, str, float]:
    """(profile, who applied provenance, wall seconds). `steps`: dlpt's `--steps A:B` (the
    steady state, after compiling and autotuning)."""
    from dlpt.store import load

    cmd = [sys.executable, "-m", "dlpt", "record", "--force", "-o", out, *(["--steps", steps] if steps else []), "--"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd + program, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"record {program} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    print("   ", (r.stderr.strip().splitlines() or [""])[-2:], flush=True)
    return load(out), "recorder", wall


def line_shares(prof: object, model_file: str | None) -> dict:
    """GPU time per source line (library frames hidden) and the shares the issue asks for."""
    from dlpt.compiled.fused import AUTOTUNING, NO_PROVENANCE, NOT_LEARNED
    from dlpt.metrics import COL
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    fv = flat(hide_library_unless(prof, False), "line")
    col = COL[METRIC]
    total = int(prof.cct.inclusive[0, col])  # type: ignore[attr-defined]
    rows = []
    for g, fr in enumerate(fv.frame):
        v = int(fv.exclusive[g, col])
        if fr.kind != "python" or not fr.file or v == 0:
            continue
        code = prof.source_line(fr.file, fr.line)  # type: ignore[attr-defined]
        if not code and os.path.isfile(fr.file):
            lines = open(fr.file, encoding="utf-8", errors="replace").read().splitlines()
            code = lines[fr.line - 1].strip() if 0 < fr.line <= len(lines) else ""
        rows.append({"file": os.path.basename(fr.file), "line": fr.line, "function": fr.function,
                     "code": code[:60], "gpu_ns": v, "def": code.startswith(("def ", "async def ")),
                     "model": (os.path.basename(fr.file) == model_file) if model_file else fr.function == "forward"})
    rows.sort(key=lambda r: -r["gpu_ns"])
    pct = (lambda v: round(100.0 * v / total, 2) if total else 0.0)  # noqa: E731
    cct, frames = prof.cct, prof.frames  # type: ignore[attr-defined]

    def under(name: str) -> int:
        """Time beneath nodes of that frame name (outermost only: they do not nest)."""
        return sum(int(cct.inclusive[i, col]) for i in range(len(cct)) if frames[int(cct.frame[i])].name == name)

    return {"total_gpu_ms": total / 1e6,
            "autotuning_pct": pct(under(AUTOTUNING.name)),
            "no_provenance_pct": pct(under(NO_PROVENANCE.name) + under(NOT_LEARNED.name)),
            "non_def_pct": pct(sum(r["gpu_ns"] for r in rows if not r["def"])),
            "model_non_def_pct": pct(sum(r["gpu_ns"] for r in rows if r["model"] and not r["def"])),
            # the same, of the time the model's steps run (autotuning is compile-time work, once)
            "model_non_def_pct_of_run": round(100.0 * sum(r["gpu_ns"] for r in rows if r["model"] and not r["def"])
                                              / max(1, total - under(AUTOTUNING.name)), 2),
            "top_line_pct": pct(rows[0]["gpu_ns"]) if rows else 0.0,
            "lines": [dict(r, pct=pct(r["gpu_ns"])) for r in rows[:25]]}


def side_by_side(name: str, compiled: dict, eager: dict, top: int = 15) -> None:
    print(f"\n{name}: compiled {compiled['non_def_pct']}% of {METRIC} on non-def source lines "
          f"({compiled['model_non_def_pct']}% on model lines; top line {compiled['top_line_pct']}%; "
          f"{compiled.get('no_provenance_pct', '?')}% without provenance, {compiled.get('autotuning_pct', '?')}% autotuning), "
          f"eager {eager['non_def_pct']}% ({eager['model_non_def_pct']}%); {METRIC} "
          f"{compiled['total_gpu_ms']:.1f} ms compiled, {eager['total_gpu_ms']:.1f} ms eager")
    key = (lambda r: (r["file"], r["line"]))  # noqa: E731
    e = {key(r): r for r in eager["lines"]}
    print(f"  {'line':<22} {'compiled %':>10} {'eager %':>8}  code")
    for r in compiled["lines"][:top]:
        er = e.get(key(r))
        print(f"  {r['file'] + ':' + str(r['line']):<22} {r['pct']:>10.2f} {er['pct'] if er else 0.0:>8.2f}  {r['code']}")
    missing = [r for r in eager["lines"][:top] if key(r) not in {key(c) for c in compiled["lines"]}]
    for r in missing[:5]:
        print(f"  {r['file'] + ':' + str(r['line']):<22} {'-':>10} {r['pct']:>8.2f}  {r['code']}  (eager only)")


def keep(stage: str, data: dict) -> None:
    os.makedirs(KEEP, exist_ok=True)
    path = os.path.join(KEEP, f"{stage}.json")
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    if os.path.abspath(OUT) != os.path.abspath(KEEP):
        os.makedirs(OUT, exist_ok=True)
        shutil.copy(path, OUT)


def run_nanogpt(mode: str, iters: int = 30, steps: str = "10:25") -> dict:
    """One nanoGPT recording, `--compile=True` or `--compile=False`; `steps` "" records it all."""
    subprocess.run([sys.executable, os.path.join(ROOT, "shared", "programs", "make_nanogpt_data.py"), NANOGPT],
                   check=True, capture_output=True)
    prog = ["train.py", *NANO_ARGS, f"--compile={mode}", f"--max_iters={iters}"]
    print(f"nanoGPT --compile={mode}", flush=True)
    tag = f"_steps{steps.replace(':', '-')}" if steps else "_whole"
    prof, by, wall = record(os.path.join(KEEP, f"nanogpt_compile{mode}{tag}.dlpt"), prog, NANOGPT, steps)
    return dict(line_shares(prof, "model.py"), applied_by=by, record_wall_s=round(wall, 1), steps=steps or "all")


def run_own(mode: str, steps: int = 30, window: str = "10:25") -> dict:
    """One recording of bench/workloads/compiled_models.py in `mode`, optimizer steps `window` only."""
    print(f"own model --mode {mode}", flush=True)
    prof, by, wall = record(os.path.join(KEEP, f"own_{mode}.dlpt"), [MODELS, "--mode", mode, "--steps", str(steps)],
                            os.path.join(ROOT, "bench"), window)
    return dict(line_shares(prof, None), applied_by=by, record_wall_s=round(wall, 1), steps=window or "all")


def _cold_run(cmd: list[str], cwd: str, with_prov: bool) -> tuple[str, float]:
    """One run with empty Inductor and Triton caches, so the compile is measured, not a cache hit."""
    d = tempfile.mkdtemp(prefix="dlpt-ct-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"), TRITON_CACHE_DIR=os.path.join(d, "triton"))
    wrap = os.path.join(d, "provenance_run.py")
    with open(wrap, "w") as fh:
        fh.write(PROVENANCE_RUN)
    full = [sys.executable, *([wrap] if with_prov else []), *cmd]
    t0 = time.perf_counter()
    r = subprocess.run(full, capture_output=True, text=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"{full} failed:\n{r.stderr[-3000:]}")
    return r.stdout, wall


def compile_time(program: str, repeats: int) -> dict:
    """Cold compile times of one program, provenance off and on, interleaved."""
    if program == "nanogpt":
        subprocess.run([sys.executable, os.path.join(ROOT, "shared", "programs", "make_nanogpt_data.py"), NANOGPT],
                       check=True, capture_output=True)
    res: dict = {"off": [], "on": []}
    for rep in range(repeats):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            k = "on" if on else "off"
            if program == "own":
                so, _ = _cold_run([MODELS, "--mode", "default", "--compile-time"], os.path.join(ROOT, "bench"), on)
                res[k].append(json.loads(so.strip().splitlines()[-1])["compile_s"])
            else:
                so, wall = _cold_run(["train.py", *NANO_ARGS, "--compile=True", "--max_iters=1"], NANOGPT, on)
                m = re.search(r"iter 0: loss [\d.]+, time ([\d.]+)ms", so)
                res[k].append(float(m.group(1)) / 1000 if m else wall)
            print(f"  {program} repeat {rep} provenance {k}: {res[k][-1]:.1f} s", flush=True)
    return res


def print_compile_time(res: dict) -> None:
    print("\ncompile time (cold caches; first step / nanoGPT iter 0), median of runs")
    print(f"  {'program':<10} {'without s':>10} {'with provenance s':>18} {'ratio':>6}")
    for name, r in res.items():
        if r["off"] and r["on"]:
            off, on = statistics.median(r["off"]), statistics.median(r["on"])
            print(f"  {name:<10} {off:>10.1f} {on:>18.1f} {on / off:>6.2f}")


def report() -> None:
    def read(stage: str) -> dict | None:
        p = os.path.join(KEEP, f"{stage}.json")
        return json.load(open(p)) if os.path.exists(p) else None

    ne, nc = read("nanogpt-eager"), read("nanogpt-compiled")
    if ne and nc:
        side_by_side(f"nanoGPT --compile=True, steps {nc.get('steps')} (provenance applied by {nc['applied_by']})", nc, ne)
    nw = read("nanogpt-compiled-whole")
    if nw:
        print(f"\nnanoGPT --compile=True, whole run (compiling and autotuning included): "
              f"{nw['model_non_def_pct']}% on model lines, {nw['autotuning_pct']}% under [torch.compile autotuning], "
              f"{nw['no_provenance_pct']}% without provenance, {nw['total_gpu_ms']:.1f} ms GPU time")
    oe = read("own-eager")
    for mode in ("reduce-overhead", "graph-break"):
        o = read(f"own-{mode}")
        if o and oe:
            side_by_side(f"4-block transformer, {mode} (provenance applied by {o['applied_by']})", o, oe)
    ct = {p: read(f"compile-time-{p}") for p in ("own", "nanogpt")}
    if any(ct.values()):
        print_compile_time({k: v for k, v in ct.items() if v})


STAGES = {
    "nanogpt-compiled": lambda: run_nanogpt("True"),
    "nanogpt-eager": lambda: run_nanogpt("False"),
    "nanogpt-compiled-whole": lambda: run_nanogpt("True", steps=""),
    "own-eager": lambda: run_own("eager"),
    # Whole: a replayed cuBLAS kernel is recognised by the runs that captured the graph (step 2).
    "own-reduce-overhead": lambda: run_own("reduce-overhead", window=""),
    "own-graph-break": lambda: run_own("graph-break"),
    "compile-time-own": lambda: compile_time("own", int(os.environ.get("DLPT_BENCH_REPEATS", "2"))),
    "compile-time-nanogpt": lambda: compile_time("nanogpt", int(os.environ.get("DLPT_BENCH_REPEATS", "2"))),
}
GROUPS = {"nanogpt": ["nanogpt-compiled", "nanogpt-eager", "nanogpt-compiled-whole"],
          "own": ["own-eager", "own-reduce-overhead", "own-graph-break"],
          "compile-time": ["compile-time-own", "compile-time-nanogpt"]}


def gpu_compiled(argv: list[str]) -> None:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__ + f"\nstages: {', '.join(STAGES)}; groups: {', '.join(GROUPS)}; report")
        return
    asked = argv or [*GROUPS, "report"]
    os.makedirs(KEEP, exist_ok=True)
    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}",
          flush=True)
    for a in asked:
        for s in GROUPS.get(a, [a]):
            if s == "report":
                continue
            if s not in STAGES:
                raise SystemExit(f"unknown stage {s!r}: {', '.join([*STAGES, *GROUPS, 'report'])}")
            keep(s, STAGES[s]())
    report()

