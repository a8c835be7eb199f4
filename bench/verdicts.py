"""Verdicts on real programs, checked against the programs' own timers (`bench/run.py verdicts`).

A diagnosis is a claim about a program: here each third-party program runs as its users run it,
under `dlpt record`, and the profile's phases and findings are set beside what the program
itself prints in the same run.

    python bench/run.py verdicts [--programs NAME,...] [--budget S]

Programs (NAME), their command lines, and what checks the verdict:
- `gptfast-compile`: gpt-fast `generate.py --compile` (decode in mode="reduce-overhead": CUDA
  graphs), 5 samples of 200 tokens. Its `Compilation time` is the warm-up generation, compiling
  included; `Time for inference i` the steady samples. Check: the steady state is gpu-bound, no
  finding tells it to compile, compiling is a phase of its own.
- `gptfast-eager`: the same without `--compile`, 3 samples. Check: launch-bound.
- `imagenet`: pytorch/examples imagenet `--dummy -a resnet50 -b 64 -j 1 --print-freq 1`, Ctrl-C
  after a fixed time. Its `Data` meter per iteration is the time the step waited for the batch.
  Check: dataloader-wait, its idle within 15% of the Data meter summed over the steady state
  (iterations after the first: the first step is start-up), naming the 1 worker.
- `nanogpt`, `nanogpt-compile`: nanoGPT `train.py` (shakespeare_char, 60 iterations), eager and
  `--compile=True`; its `iter N: … time X ms`. Check: no finding tells the compiled run to compile.
- `timm`: timm `benchmark.py --model resnet50 --bench train --amp -b 256`. Check: gpu-bound.
- `trainer`: a Hugging Face Trainer run (bench/workloads/hf_trainer.py, 2 loader workers), whose
  library code reads the loss every logging step. Check: any sync finding names library code, not
  an `.item()` of the user's.
- `loader-trace`: bench/workloads/loader_trace.py, a DataLoader-bound loop recorded by torch.profiler
  (stacks, a schedule): its trace read as a user's, with its `--check` (dataloader-wait within
  15% of the loop's own timer, ≥ 90% of the idle on source lines); the trace is kept under $OUT.
- `short`: bench/gpu_cases/idle_truth.py (its own timers and CUDA events), with its `--check`.
Writes verdicts.json under $OUT and a table: program, verdict (rule, share), phases, truth, check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from typing import Any

import runlib as rl
from programs import NANOGPT_ARGS

PROGRAMS = ("gptfast-compile", "gptfast-eager", "imagenet", "nanogpt", "nanogpt-compile", "timm", "trainer",
            "loader-trace", "short")
_DATA = re.compile(r"Epoch: \[\d+\]\[\s*(\d+)/\d+\].*Data\s+([0-9.]+)")
_INFER = re.compile(r"Time for inference (\d+): ([0-9.]+) sec total, ([0-9.]+) tokens/sec")
_COMPILE = re.compile(r"Compilation time: ([0-9.]+) seconds")
_LOAD = re.compile(r"Time to load model: ([0-9.]+) seconds")


def _rules(summary: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in (summary or {}).get("findings") or []}


def _verdict_text(summary: dict[str, Any] | None) -> str:
    if not summary or "error" in summary:
        return f"unread ({(summary or {}).get('error', 'no profile')})"
    parts = [f"{f['rule']} {100 * f['share']:.0f}%" if f.get("share") is not None else f["rule"]
             for f in summary.get("findings") or []]
    return ", ".join(parts) or "none"


def _phases_text(summary: dict[str, Any] | None) -> str:
    ph = (summary or {}).get("phases") or {}
    parts = []
    for name, v in ph.items():
        text = f"{name} {v['wall_time'] / 1e6:.2f} s"
        if name == "steady" and v.get("gpu_busy_time") is not None and v["wall_time"]:
            text += f" (busy {100 * v['gpu_busy_time'] / v['wall_time']:.1f}%)"
        parts.append(text)
    return "; ".join(parts) or "-"


class Verdicts:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = rl.out_dir()
        self.work = rl.work_dir()
        self.log = rl.log_path(self.out, "verdicts.log")
        self.budget = rl.Budget(a.budget)
        self.rows: list[list[Any]] = []
        self.res: dict[str, Any] = {"gpu": rl.gpu_name()}

    def record(self, name: str, program: list[str], cwd: str, timeout: float,
               interrupt_after: float | None = None) -> tuple[rl.Result, dict[str, Any] | None]:
        prof = os.path.join(self.work, f"{name}.dlpt")
        r = rl.run(rl.dlpt_record(prof, *program), cwd=cwd, timeout=timeout, log=self.log,
                   interrupt_after=interrupt_after)
        summary = rl.hotspots_summary(prof) if os.path.exists(prof) else None
        self.res[name] = {"run": r.brief(), "summary": summary}
        if name in self.a.keep.split(",") and os.path.exists(prof):
            import shutil

            shutil.copy(prof, os.path.join(self.out, f"{name}.dlpt"))  # a real program's profile, for tests
        return r, summary

    def keep_truth(self, name: str, truth: dict[str, Any]) -> None:
        """The program's own figures beside a kept profile (`{name}.truth.json`): a test's truth."""
        if name in self.a.keep.split(","):
            rl.write_json(self.out, f"{name}.truth.json", truth)

    def row(self, name: str, summary: dict[str, Any] | None, truth: str, ok: bool | None, why: str) -> None:
        self.rows.append([name, _verdict_text(summary), _phases_text(summary), truth,
                          ("ok" if ok else "OFF") + (f": {why}" if why else "") if ok is not None else why])
        self.res.setdefault(name, {})["check"] = {"ok": ok, "why": why, "truth": truth}
        rl.write_json(self.out, "verdicts.json", self.res)

    # ----- the programs -----

    def gptfast(self, compiled: bool) -> None:
        name = "gptfast-compile" if compiled else "gptfast-eager"
        n = 5 if compiled else 3
        prog = [os.path.join(rl.WORKLOADS, "gptfast.py"), "--prompt", "16", "--num_samples", str(n),
                "--max_new_tokens", "200", *(["--compile"] if compiled else [])]
        r, s = self.record(name, prog, self.work, timeout=420)
        infer = [(float(m.group(2)), float(m.group(3))) for x in r.out_lines if (m := _INFER.search(x))]
        comp = next((float(m.group(1)) for x in r.out_lines if (m := _COMPILE.search(x))), None)
        load = next((float(m.group(1)) for x in r.out_lines if (m := _LOAD.search(x))), None)
        self.keep_truth(name, {"load_s": load, "compilation_s": comp, "samples_s": [t for t, _ in infer],
                               "tokens_per_s": [v for _, v in infer], "stdout": r.out_lines[-40:]})
        truth = (f"load {load} s; " if load is not None else "") + (f"compiling (warm-up) {comp} s; " if comp else "")
        truth += f"{len(infer)} samples {sum(t for t, _ in infer):.2f} s, {statistics.median([v for _, v in infer]):.0f} tok/s" \
            if infer else "no samples printed"
        rules = _rules(s)
        advice = " ".join(f.get("remedy", "") for f in rules.values())
        if compiled:
            # The steady state's largest part is the GPU's, and no remedy asks to compile.
            steady = [f for f in (s or {}).get("findings") or [] if f.get("of") == "steady state"]
            ok = bool(steady) and steady[0]["rule"] == "gpu-bound" and "compile the model with torch.compile" not in advice
            why = "" if ok else "steady state not mostly gpu-bound, or told to compile"
        else:
            ok = "launch-bound" in rules
            why = "" if ok else "no launch-bound"
        self.row(name, s, truth, ok if s else None, why)

    def imagenet(self) -> None:
        src = os.path.join(rl.programs_dir(), "imagenet", "main.py")
        prog = [src, "--dummy", "-a", "resnet50", "-b", "64", "-j", "1", "--epochs", "1", "--print-freq", "1",
                "--gpu", "0"]
        r, s = self.record("imagenet", prog, self.work, timeout=self.a.imagenet_s + 120,
                           interrupt_after=self.a.imagenet_s)
        data = {int(m.group(1)): float(m.group(2)) for x in r.out_lines if (m := _DATA.search(x))}
        # Printed as `[ i+1/N]` after iteration i: the first (its batch waited for the worker to
        # start) belongs to the start-up, which ends with the first optimizer step.
        steady = sum(v for k, v in data.items() if k > 1)
        self.keep_truth("imagenet", {"data_s": data, "steady_data_s": steady, "workers": 1})
        f = _rules(s).get("dataloader-wait")
        got = None
        if f is not None:
            m = re.search(r"GPU idle ([0-9.]+) (s|ms)", f["figure"])
            if m:
                got = float(m.group(1)) * (1 if m.group(2) == "s" else 1e-3)
        err = (got - steady) / steady if got is not None and steady else None
        truth = f"Data meter {steady:.2f} s over {max(len(data) - 1, 0)} steady iterations"
        ok = f is not None and err is not None and abs(err) <= 0.15 and "1 worker process" in f["figure"]
        why = f"dlpt {got:.2f} s ({err:+.1%})" if err is not None else "no dataloader-wait"
        self.row("imagenet", s, truth, ok if s else None, why)

    def nanogpt(self, compiled: bool) -> None:
        name = "nanogpt-compile" if compiled else "nanogpt"
        nd = os.path.join(self.work, "nanoGPT")
        if not os.path.isdir(nd):
            nd = rl.nanogpt_copy(self.work)
        r, s = self.record(name, ["train.py", *NANOGPT_ARGS, f"--compile={compiled}"], nd, timeout=420)
        it = rl.nanogpt_iters(r)
        steps = rl.window(it, 10, 60)
        truth = (f"iter 0 {it.get(0, 0):.0f} ms; median step (10-60) {statistics.median(steps):.2f} ms"
                 if steps else "no iterations printed")
        advice = " ".join(f.get("remedy", "") for f in _rules(s).values())
        ok = not compiled or "compile the model with torch.compile" not in advice
        self.row(name, s, truth, ok if s else None, "" if ok else "told a compiled run to compile")

    def timm(self) -> None:
        src = os.path.join(rl.programs_dir(), "timm_benchmark", "benchmark.py")
        prog = [src, "--model", "resnet50", "--bench", "train", "--amp", "-b", "256", "--num-warm-iter", "5",
                "--num-bench-iter", "40"]
        r, s = self.record("timm", prog, self.work, timeout=300)
        # timm's benchmark logs its result (`Train benchmark of resnet50 done. N samples/sec, …`) on stderr.
        rate = next((x for x in reversed(r.out_lines + r.err_lines) if "samples/sec" in x and "done" in x), "")
        ok = "gpu-bound" in _rules(s)
        self.row("timm", s, rate.strip()[:90] or "no rate printed", ok if s else None, "" if ok else "not gpu-bound")

    def trainer(self) -> None:
        r, s = self.record("trainer", [os.path.join(rl.WORKLOADS, "hf_trainer.py"), "--steps", "60"], self.work,
                           timeout=300)
        f = _rules(s).get("sync-in-loop")
        steady = [x for x in (s or {}).get("findings") or [] if x.get("of") == "steady state"]
        ok = bool(steady) and (f is None or "library code" in f["remedy"])
        line = next((x for x in reversed(r.out_lines) if x.startswith("TRAINER_RESULT")), "")
        doc = json.loads(line.split(" ", 1)[1]) if line else {}
        truth = (f"{doc.get('steps_seen')} steps, median {1e3 * doc['step_s_median']:.1f} ms"
                 if doc.get("step_s_median") else "no TRAINER_RESULT")
        self.row("trainer", s, truth, ok if s else None,
                 "" if ok else "no steady-state verdict, or asks to remove an .item() that is library code's")

    def loader_trace(self) -> None:
        """A DataLoader-bound loop recorded by torch.profiler (not dlpt): the trace is read as a
        user's trace is, and kept (gzipped, under $OUT) as test data."""
        import gzip
        import shutil

        src = os.path.join(rl.WORKLOADS, "loader_trace.py")
        d = os.path.join(self.work, "loader_trace")
        r = rl.run([rl.PY, src, d], cwd=self.work, timeout=240, log=self.log)
        chk = rl.run([rl.PY, src, "--check", d], cwd=self.work, timeout=120, log=self.log)
        s = rl.hotspots_summary(os.path.join(d, "trace")) if r["rc"] == 0 else {"error": f"rc {r['rc']}"}
        self.res["loader-trace"] = {"check_lines": chk.out_lines, "summary": s}
        for name in os.listdir(os.path.join(d, "trace")) if r["rc"] == 0 else []:
            with open(os.path.join(d, "trace", name), "rb") as fi, gzip.open(
                    os.path.join(self.out, "loader_trace.pt.trace.json.gz"), "wb") as fo:
                shutil.copyfileobj(fi, fo)
            shutil.copy(os.path.join(d, "truth.json"), os.path.join(self.out, "loader_trace.truth.json"))
            break
        self.row("loader-trace", s, " | ".join(chk.out_lines[-3:-1]), chk["rc"] == 0, "")

    def short(self) -> None:
        src = os.path.join(rl.BENCH, "gpu_cases", "idle_truth.py")
        truth_json = os.path.join(self.work, "idle_truth.json")
        r, s = self.record("short", [src, truth_json], self.work, timeout=300)
        chk = rl.run([rl.PY, src, "--check", os.path.join(self.work, "short.dlpt"), truth_json], cwd=self.work,
                     timeout=120, log=self.log)
        self.res["short"]["check_lines"] = chk.out_lines
        bad = [x for x in chk.out_lines if "OFF" in x]
        self.row("short", s, f"{len(chk.out_lines) - 1} lines checked against its timers", chk["rc"] == 0,
                 "; ".join(x.split()[0] + " " + x.split()[-1] for x in bad[:3]))

    def run(self) -> None:
        todo = {"gptfast-compile": (lambda: self.gptfast(True), 150), "gptfast-eager": (lambda: self.gptfast(False), 60),
                "imagenet": (self.imagenet, self.a.imagenet_s + 40), "nanogpt": (lambda: self.nanogpt(False), 40),
                "nanogpt-compile": (lambda: self.nanogpt(True), 120), "timm": (self.timm, 60),
                "trainer": (self.trainer, 60), "loader-trace": (self.loader_trace, 40), "short": (self.short, 40)}
        for name in self.a.programs.split(","):
            fn, estimate = todo[name]
            if not self.budget.allows(estimate):
                self.rows.append([name, "skipped", "-", "-", f"{self.budget.left():.0f} s left, needs ~{estimate}"])
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one program's failure is a row, not the end of the case
                self.rows.append([name, "failed", "-", "-", f"{type(e).__name__}: {e}"])
        text = rl.table(f"Verdicts on real programs against their own timers ({self.res['gpu']})",
                        ["program", "verdict (share)", "phases", "truth (its own timers)", "check"], self.rows)
        rl.finish(self.out, text, "verdicts.json", self.log)


def verdicts(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py verdicts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated: " + ",".join(PROGRAMS))
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--imagenet-s", type=float, default=60, help="seconds before Ctrl-C reaches imagenet")
    ap.add_argument("--keep", default="", help="comma-separated programs whose profiles are copied to $OUT")
    a = ap.parse_args(argv)
    unknown = set(a.programs.split(",")) - set(PROGRAMS)
    if unknown:
        raise SystemExit(f"unknown programs {sorted(unknown)}; known: {','.join(PROGRAMS)}")
    if not rl.has_gpu():
        print("verdicts: no GPU here; the programs need one", file=sys.stderr)
    Verdicts(a).run()
