"""Recording overhead on the GPU (docs/BENCHMARKS.md), each profiler next to unprofiled in one run:

- `ab` (the judge): a program's step in one process (bench/workloads/inproc.py: nanogpt, decode
  with CUDA graphs, decode-eager, resnet50 training, vit inference; `--workloads`), blocks of
  steps alternately unprofiled and under one profiler, so both see the same machine state; one
  process per profiler and run, processes in turns (a step moves by ±15% between processes on
  the GPU machine, more than the differences to measure). Per workload and configuration, the
  median over processes of the profiled step against the pristine one (before any profiler ran
  in that process) and against the unprofiled blocks in between. A configuration is a mode
  inproc.py knows (dlpt, proton, torch.profiler, torch.profiler-cuda, after, after-none), optionally with a label and
  environment: `old-backward=dlpt:DLPT_DIAG=rfbackward`.
- `variants`: where dlpt's cost goes: per workload one process running dlpt in the `--variants`
  configurations in turns with unprofiled blocks (inproc.py's `variants` mode): each one's step
  over unprofiled, its GPU time and kernels per step, and its GPU time per line (the
  collector's diagnostics: DLPT_DEVICE=0, DLPT_HOST=0, DLPT_DIAG=..., DLPT_MEMORY=0,
  DLPT_SAMPLE_US=0; collectors/record/session.py).
- `whole`: inproc.py's `plain` mode in whole processes, as it is and under `dlpt record`
  (`--whole`), in turns: CUDA graphs are then instantiated while dlpt records.
- `nanogpt`: nanoGPT `train.py` eager in whole processes, median step time over iterations 10–60,
  unprofiled / `dlpt record` / torch.profiler with stacks / Proton `-c python`,
  interleaved (A B C D A B C D …); ratios vs unprofiled; whether dlpt is below Proton.
- `steps`: the same program over 120 iterations, unprofiled vs `dlpt record --steps 10:20`:
  median step before (2–9), during (10–19) and after (40–120) the recorded steps.
- `timm`: timm `benchmark.py` resnet50 training, AMP, batch 64: unprofiled vs `dlpt record`.
- `graphs`: CUDA-graph replays in whole processes, in turns: bench/workloads/graph_replay.py
  (ms per step, its own timers) and gpt-fast `generate.py --compile` (its tokens/s), unprofiled,
  `dlpt record` (every replay's kernels), `dlpt record --cuda-graph-trace graph`, torch.profiler
  with CUDA activities only (graph_replay.py's `--torch-profiler`); and, as the truth for the
  graph mode's kernel times, each kernel's share of GPU time under both dlpt modes.

For every `dlpt record` run: dlpt's own "post-processing X s" (stderr), the time from the
program's last output line to the process's exit (minus the same for the unprofiled runs, that
is dlpt's end-of-run cost), whether the profile was saved and reads back.

    python bench/run.py gpu-overhead [ab,nanogpt,steps,timm] [--repeats 2] [--budget 540]
    python bench/run.py gpu-overhead ab --ab dlpt,proton,torch.profiler --procs 3 --rounds 12
    python bench/run.py gpu-overhead ab --workloads decode,decode-eager,resnet50,vit --ab dlpt,proton
    python bench/run.py gpu-overhead variants --workloads decode-eager --variants "dlpt=;nodevice=DLPT_DEVICE=0"
    python bench/run.py gpu-overhead whole --workloads decode --whole none,dlpt
    python bench/run.py gpu-overhead ab --ab after,after-none        # what --steps A:B leaves behind
    python bench/run.py gpu-overhead nanogpt --cpu      # a small CPU configuration, to try it here
    python bench/run.py gpu-overhead graphs --procs 3

Writes $OUT/overhead.json (rewritten after each run) and $OUT/overhead.log (every line of every
run, time-stamped), prints the tables last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Any

import runlib as rl

NANOGPT_BASE = ["config/train_shakespeare_char.py", "--compile=False", "--eval_interval=1000", "--eval_iters=5",
                "--log_interval=1", "--always_save_checkpoint=False"]
# Small enough for 2 CPU cores: only to exercise the harness here, never a number to report.
NANOGPT_CPU = ["--device=cpu", "--dtype=float32", "--batch_size=4", "--block_size=64", "--n_layer=2",
               "--n_head=2", "--n_embd=64"]
CONFIGS = ("none", "dlpt", "torchprof", "proton")
LABEL = {"none": "unprofiled", "dlpt": "dlpt record", "torchprof": "torch.profiler (stacks)",
         "proton": "Proton -c python"}


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = rl.out_dir()
        self.work = rl.work_dir()
        self.log = rl.log_path(self.out, "overhead.log")
        self.budget = rl.Budget(a.budget)
        self.res: dict[str, Any] = {"device": rl.gpu_name(), "python": sys.version.split()[0], "args": vars(a),
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.est: dict[str, float] = {}  # last wall per (part, config): what the next such run needs
        self.tables: list[str] = []
        self._nanogpt: str | None = None

    def save(self) -> None:
        rl.write_json(self.out, "overhead.json", self.res)

    def nanogpt(self) -> str:
        if self._nanogpt is None:
            self._nanogpt = rl.nanogpt_copy(self.work)
        return self._nanogpt

    def launch(self, part: str, cfg: str, prog: list[str], cwd: str, tag: str, steps: str | None = None) -> Any:
        """Run `prog` (script and args, relative to cwd) under configuration `cfg`, unless the
        budget says it would not fit."""
        key = f"{part}/{cfg}"
        need = self.est.get(key, self.a.first_estimate) * 1.2
        if not self.budget.allows(need):
            print(f"  skip {tag}: {self.budget.left():.0f} s left, needs ~{need:.0f} s", flush=True)
            return {"config": cfg, "tag": tag, "skipped": "budget"}
        prof = os.path.join(self.work, f"{tag}.dlpt")
        if cfg == "none":
            cmd = [rl.PY, *prog]
        elif cfg == "dlpt":
            cmd = rl.dlpt_record(prof, *prog, steps=steps)
        elif cfg == "torchprof":
            cmd = [rl.PY, rl.torch_profiler_script(self.work), *prog]
        elif cfg == "proton":
            # -n: where Proton writes (NAME.hatchet); its default lands in the cwd.
            cmd = [rl.PY, "-m", "triton.profiler.proton", "-c", "python", "-n", os.path.join(self.work, tag), *prog]
        else:
            raise ValueError(cfg)
        timeout = min(self.a.run_timeout, max(self.budget.left() - 5, 10))
        print(f"  run {tag} ({LABEL[cfg]}) ...", end="", flush=True)
        r = rl.run(cmd, cwd=cwd, timeout=timeout, log=self.log)
        self.est[key] = r["wall_s"]
        row: dict[str, Any] = {"config": cfg, "tag": tag, **r.brief()}
        if cfg == "dlpt":
            row.update(rl.parse_saved(r))
            row["profile_bytes"] = os.path.getsize(prof) if os.path.exists(prof) else None
            row["profile_path"] = prof
        if cfg == "proton":
            row["proton_file"] = os.path.exists(os.path.join(self.work, tag + ".hatchet"))
        print(f" rc {r['rc']}, {r['wall_s']:.1f} s" + (" TIMED OUT" if r["timed_out"] else ""), flush=True)
        if r["rc"] != 0:
            print("    " + "\n    ".join((r.err_lines or r.out_lines)[-6:]), flush=True)
        return row, r

    def check_read(self, row: dict[str, Any]) -> None:
        """Does the saved profile read back (`dlpt report`), and how much of it is attributed."""
        if row.get("config") != "dlpt" or not self.budget.allows(30):
            return
        rd = rl.read_profile(row["profile_path"])
        row["read_ok"] = rd["ok"]
        row["read_s"] = rd.get("read_s")
        if rd["ok"]:
            s = rd["doc"]["summary"]
            row["gpu_time_us"] = s.get("gpu_time")
            row["attributed_pct"] = round(100 * s["attributed_to_source"] / s["gpu_time"], 3) if s.get("gpu_time") else None
        else:
            row["read_error"] = rd["error"]

    def json_run(self, key: str, tag: str, cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | None:
        """Run a program that prints one JSON line, unless the budget says it would not fit (the
        last run of `key` tells how long it takes); its JSON, or None (skipped or failed: said)."""
        a = self.a
        if not self.budget.allows(self.est.get(key, a.first_estimate) * 1.2):
            print(f"  skip {tag}: {self.budget.left():.0f} s left", flush=True)
            return None
        r = rl.run(cmd, cwd=self.work, timeout=min(a.run_timeout, max(self.budget.left() - 5, 10)), log=self.log,
                   env=env)
        self.est[key] = r["wall_s"]
        line = next((ln for ln in r.out_lines if ln.startswith("{")), None)
        if line is None:
            print(f"  {tag}: failed\n    " + "\n    ".join((r.err_lines or r.out_lines)[-8:]), flush=True)
            return None
        return json.loads(line)

    # ---- a program's step in one process, profilers in turns: the judge
    def part_ab(self) -> None:
        for w in self.a.workloads.split(","):
            self.ab_one(w)

    def ab_one(self, workload: str) -> None:
        a = self.a
        configs = rl.parse_configs(a.ab)
        rows: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in configs}
        self.res.setdefault("ab", {})[workload] = rows
        for p in range(a.procs):
            for label, which, env in configs:
                cmd = [rl.PY, os.path.join(rl.WORKLOADS, "inproc.py"), workload, which, str(a.rounds), str(a.block)]
                d = self.json_run(f"ab/{workload}/{label}", f"{workload} {label} #{p + 1}", cmd, env)
                if d is None:
                    continue
                rows[label].append(d)
                print(f"  {workload} {label} #{p + 1}: {json.dumps(d)}", flush=True)
                self.save()
        after = {k: ds for k, ds in rows.items() if ds and "after_ms" in ds[0]}
        profiled = {k: ds for k, ds in rows.items() if k not in after}
        text = []
        if profiled:
            trs = []
            for label, ds in profiled.items():
                m = {k: statistics.median(d[k] for d in ds) if ds else None
                     for k in ("ratio_to_pristine", "ratio", "pristine_ms", "profiled_ms")}
                trs.append([label, len(ds), m["ratio_to_pristine"], m["ratio"], m["pristine_ms"], m["profiled_ms"]])
            text.append(rl.table(f"{workload} step in one process, {a.rounds} rounds of {a.block} steps, "
                                 f"{a.procs} processes each ({self.res['device']})",
                                 ["configuration", "processes", "profiled / pristine (median)",
                                  "profiled / between (median)", "pristine ms", "profiled ms"], trs))
        if after:
            text.append(rl.table("after a recorded window, in one process", ["configuration", "processes",
                                 "after / before (median)", "per process"],
                                 [[k, len(ds), statistics.median(d["ratio"] for d in ds),
                                   ", ".join(f"{d['ratio']:.3f}" for d in ds)] for k, ds in after.items()]))
        per = []
        for label, ds in rows.items():
            for i, d in enumerate(ds, 1):
                if "after_ms" in d:
                    per.append(f"- {label} #{i}: before {d['before_ms']} ms, during {d['during_ms']} ms, "
                               f"after {d['after_ms']} ms ({d['ratio']})")
                else:
                    rec = ""
                    if "kernels_per_step" in d:
                        rec = f"; recorded {d['gpu_ms_per_step']} GPU ms and {d['kernels_per_step']} kernels a step"
                    per.append(f"- {label} #{i}: pristine {d['pristine_ms']} ms, between {d['unprofiled_ms']} ms, "
                               f"profiled {d['profiled_ms']} ms ({d['ratio_to_pristine']} / {d['ratio']}){rec}")
        self.tables.append("\n\n".join(text) + "\n" + "\n".join(per))

    # ---- whole processes: inproc.py's `plain` mode as it is and under `dlpt record`, in turns
    def part_whole(self) -> None:
        a = self.a
        configs = rl.parse_configs(a.whole)
        for workload in a.workloads.split(","):
            got: dict[str, list[float]] = {c[0]: [] for c in configs}
            self.res.setdefault("whole", {})[workload] = got
            for p in range(a.procs):
                for label, mode, env in configs:
                    key = f"whole/{workload}/{label}"
                    prog = [os.path.join(rl.WORKLOADS, "inproc.py"), workload, "plain", str(a.rounds), str(a.block)]
                    out = os.path.join(self.work, f"whole-{workload}-{label}-{p}.dlpt")
                    cmd = [rl.PY, *prog] if mode == "none" else rl.dlpt_record(out, *prog)
                    d = self.json_run(key, f"{key} #{p + 1}", cmd, env)
                    if d is None:
                        continue
                    got[label].append(d["median_ms"])
                    print(f"  {key} #{p + 1}: {got[label][-1]} ms" + (f" ({out})" if mode != "none" else ""), flush=True)
                    self.save()
            base = statistics.median(got[configs[0][0]]) if got[configs[0][0]] else None
            rows = [[label, len(v), statistics.median(v) if v else None,
                     round(statistics.median(v) / base, 4) if v and base else None] for label, v in got.items()]
            self.tables.append(rl.table(f"{workload}: whole processes, median step of {a.rounds * a.block} "
                                        f"({self.res['device']})", ["configuration", "processes", "step ms",
                                                                    f"× {configs[0][0]}"], rows))
            print(self.tables[-1], flush=True)

    # ---- where dlpt's cost goes: configurations in turns in one process per workload
    def part_variants(self) -> None:
        a = self.a
        specs = [v for v in a.variants.split(";") if v]
        for workload in a.workloads.split(","):
            cmd = [rl.PY, os.path.join(rl.WORKLOADS, "inproc.py"), workload, "variants", str(a.rounds), str(a.block),
                   *specs]
            d = self.json_run(f"variants/{workload}", f"variants {workload}", cmd)
            if d is None:
                continue
            self.res.setdefault("variants", {})[workload] = d
            self.save()
            rows = [[label, c["ms"], c["ratio"], c["gpu_ms_per_step"], c["kernels_per_step"], c["unlinked_pct"]]
                    for label, c in d["configs"].items()]
            text = rl.table(f"{workload}: dlpt configurations in turns with unprofiled blocks, one process, "
                            f"{a.rounds} rounds of {a.block} steps ({d['device']}; unprofiled {d['unprofiled_ms']} ms)",
                            ["configuration", "step ms", "× unprofiled", "GPU ms/step", "kernels/step",
                             "% records unlinked"],
                            rows)
            # Per line: each configuration's GPU time per step against the first one's.
            labels = list(d["configs"])
            ref = d["configs"][labels[0]]["lines_us_per_step"]
            lrows = [[k[:70], ref[k]] + [d["configs"][lb]["lines_us_per_step"].get(k, 0.0) for lb in labels[1:]]
                     for k in list(ref)[:10]]
            text += "\n\n" + rl.table(f"{workload}: GPU µs per step on the top lines", ["line", *labels], lrows)
            print(text, flush=True)
            self.tables.append(text)

    # ---- nanoGPT: four configurations
    def part_nanogpt(self) -> None:
        a = self.a
        nd = self.nanogpt()
        prog = ["train.py", *NANOGPT_BASE, f"--max_iters={a.iters}", *self.extra()]
        configs = [c for c in a.configs.split(",") if c]
        runs: list[dict[str, Any]] = []
        self.res["nanogpt"] = {"runs": runs, "window": [10, a.iters]}
        for rep in range(a.repeats):
            for cfg in configs:
                got = self.launch("nanogpt", cfg, prog, nd, f"nanogpt-{cfg}-{rep}")
                if isinstance(got, dict):
                    runs.append(got)
                    continue
                row, r = got
                it = rl.nanogpt_iters(r)
                row["iters"] = it
                row["n_iters"] = len(it)
                row["median_ms"] = rl.med(rl.window(it, 10, a.iters))
                row["max_ms_after_0"] = max(rl.window(it, 1, a.iters), default=None)  # iteration 0 holds the eval
                if rep == 0:
                    self.check_read(row)
                runs.append(row)
                self.save()
        self.res["nanogpt"]["summary"] = summ = self.summarise(runs, configs, 10, a.iters)
        base = summ.get("none", {}).get("median_ms")
        rows = []
        for cfg in configs:
            s = summ.get(cfg, {})
            rows.append([LABEL[cfg], f"{s.get('ok', 0)}/{s.get('n', 0)}", s.get("median_ms"),
                         ", ".join(rl.fmt(x) for x in s.get("per_run", [])), rl.ratio(s.get("median_ms"), base),
                         s.get("max_ms"), s.get("tail_s"), s.get("post_s")])
        d, p = summ.get("dlpt", {}).get("median_ms"), summ.get("proton", {}).get("median_ms")
        verdict = (f"dlpt below Proton: {rl.fmt(d < p) if d and p else '-'}   (dlpt/none target ≤ 1.25); "
                   f"dlpt's end cost (its last line→exit less the unprofiled one's): "
                   f"{rl.fmt(summ.get('dlpt', {}).get('end_cost_s'))} s (target ≤ 0.5 s)")
        self.tables.append(rl.table(f"nanoGPT eager, median step ms over iterations 10–{a.iters} ({self.res['device']})",
                                    ["config", "runs ok", "median ms", "per run", "× unprofiled", "max step ms",
                                     "last line→exit s", "dlpt post s"], rows) + "\n" + verdict)
        self.res["nanogpt"]["dlpt_below_proton"] = (d < p) if d and p else None
        self.save()

    def summarise(self, runs: list[dict[str, Any]], configs: list[str], lo: int, hi: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for cfg in configs:
            rs = [r for r in runs if r.get("config") == cfg and "skipped" not in r]
            ok = [r for r in rs if r["rc"] == 0 and r.get("n_iters", 0) > hi - 1]
            pooled = [v for r in ok for v in rl.window(r["iters"], lo, hi)]
            tails = [r["tail_s"] for r in ok if r.get("tail_s") is not None]
            posts = [r["post_processing_s"] for r in ok if r.get("post_processing_s") is not None]
            out[cfg] = {"n": len(rs), "ok": len(ok), "median_ms": rl.med(pooled),
                        "per_run": [r["median_ms"] for r in ok],
                        "max_ms": max((r["max_ms_after_0"] for r in ok if r.get("max_ms_after_0")), default=None),
                        "tail_s": rl.med(tails), "post_s": rl.med(posts)}
        if out.get("dlpt", {}).get("tail_s") is not None and out.get("none", {}).get("tail_s") is not None:
            out["dlpt"]["end_cost_s"] = round(out["dlpt"]["tail_s"] - out["none"]["tail_s"], 3)
        return out

    # ---- nanoGPT with --steps 10:20 over 120 iterations
    def part_steps(self) -> None:
        a = self.a
        nd = self.nanogpt()
        prog = ["train.py", *NANOGPT_BASE, f"--max_iters={a.steps_iters}", *self.extra()]
        ranges = {"before (2–9)": (2, 9), "during (10–19)": (10, 19), f"after (40–{a.steps_iters})": (40, a.steps_iters)}
        runs: list[dict[str, Any]] = []
        self.res["steps"] = {"runs": runs, "steps": a.steps, "ranges": ranges}
        for rep in range(a.repeats):
            for cfg in ("none", "dlpt"):
                got = self.launch("steps", cfg, prog, nd, f"steps-{cfg}-{rep}", steps=a.steps if cfg == "dlpt" else None)
                if isinstance(got, dict):
                    runs.append(got)
                    continue
                row, r = got
                row["iters"] = it = rl.nanogpt_iters(r)
                row["n_iters"] = len(it)
                row["ranges_ms"] = {k: rl.med(rl.window(it, lo, hi)) for k, (lo, hi) in ranges.items()}
                if rep == 0:
                    self.check_read(row)
                runs.append(row)
                self.save()
        rows, summ = [], {}
        for k, (lo, hi) in ranges.items():
            v = {}
            for cfg in ("none", "dlpt"):
                ok = [r for r in runs if r.get("config") == cfg and r.get("rc") == 0 and r.get("n_iters", 0) > hi - 1]
                v[cfg] = rl.med([x for r in ok for x in rl.window(r["iters"], lo, hi)])
                v[cfg + "_max"] = max((x for r in ok for x in rl.window(r["iters"], lo, hi)), default=None)
            summ[k] = {**v, "ratio": rl.ratio(v["dlpt"], v["none"])}
            rows.append([k, v["none"], v["dlpt"], summ[k]["ratio"], v["none_max"], v["dlpt_max"]])
        self.res["steps"]["summary"] = summ
        dl = [r for r in runs if r.get("config") == "dlpt" and "skipped" not in r]
        extra = "  ".join(f"run {r['tag']}: rc {r['rc']}, post {rl.fmt(r.get('post_processing_s'))} s, "
                          f"last line→exit {rl.fmt(r.get('tail_s'))} s, read {rl.fmt(r.get('read_ok'))}" for r in dl)
        self.tables.append(rl.table(f"nanoGPT --steps {a.steps} over {a.steps_iters} iterations: median step ms "
                                    "(target: after within 3%)",
                                    ["range", "unprofiled", "dlpt", "× unprofiled", "max unprof.", "max dlpt"], rows)
                           + "\n" + extra)
        self.save()

    # ---- timm resnet50 training, AMP, batch 64
    def part_timm(self) -> None:
        a = self.a
        bench = os.path.join(rl.programs_dir(), "timm_benchmark", "benchmark.py")
        runs: list[dict[str, Any]] = []
        self.res["timm"] = {"runs": runs}
        for rep in range(a.repeats):
            for cfg in ("none", "dlpt"):
                tag = f"timm-{cfg}-{rep}"
                rf = os.path.join(self.work, tag + ".json")
                prog = [bench, "--model", a.timm_model, "--bench", "train", "-b", str(a.timm_batch),
                        "--num-warm-iter", "10", "--num-bench-iter", str(a.timm_iters),
                        "--results-file", rf, "--results-format", "json", *self.timm_extra()]
                got = self.launch("timm", cfg, prog, self.work, tag)
                if isinstance(got, dict):
                    runs.append(got)
                    continue
                row, r = got
                row.update(self.timm_result(rf, r))
                runs.append(row)
                self.save()
        summ, rows = {}, []
        for cfg in ("none", "dlpt"):
            ok = [r for r in runs if r.get("config") == cfg and r.get("step_ms")]
            summ[cfg] = {"step_ms": rl.med([r["step_ms"] for r in ok]),
                         "samples_per_sec": rl.med([r["samples_per_sec"] for r in ok]),
                         "tail_s": rl.med([r["tail_s"] for r in ok if r.get("tail_s") is not None]),
                         "post_s": rl.med([r["post_processing_s"] for r in ok if r.get("post_processing_s") is not None]),
                         "ok": len(ok), "n": len([r for r in runs if r.get("config") == cfg])}
        base = summ["none"]["step_ms"]
        for cfg in ("none", "dlpt"):
            s = summ[cfg]
            rows.append([LABEL[cfg], f"{s['ok']}/{s['n']}", s["step_ms"], s["samples_per_sec"],
                         rl.ratio(s["step_ms"], base), s["tail_s"], s["post_s"]])
        self.res["timm"]["summary"] = summ
        self.tables.append(rl.table(f"timm benchmark.py {a.timm_model} train AMP batch {a.timm_batch}, "
                                    f"{a.timm_iters} steps (target ≤ 1.05×)",
                                    ["config", "runs ok", "step ms", "samples/s", "× unprofiled", "last line→exit s",
                                     "dlpt post s"], rows))
        self.save()

    # ---- CUDA-graph replays: whole processes, the programs' own timers
    GRAPH_CONFIGS: tuple[tuple[str, str | None], ...] = (("unprofiled", ""), ("dlpt", "node"), ("dlpt graph", "graph"),
                                                        ("torch.profiler cuda", None))

    def part_graphs(self) -> None:
        a = self.a
        replay = [os.path.join(rl.WORKLOADS, "graph_replay.py")]
        decode = [os.path.join(rl.WORKLOADS, "gptfast.py"), "--prompt", "16", "--num_samples", "3",
                  "--max_new_tokens", "200", "--compile"]
        res: dict[str, Any] = {"graph_replay": {}, "gptfast": {}, "shares": {}}
        self.res["graphs"] = res
        tok = re.compile(r"Average tokens/sec: ([0-9.]+)")
        for rep in range(a.procs):
            for label, mode in self.GRAPH_CONFIGS:
                for prog, key in ((replay, "graph_replay"), (decode, "gptfast")):
                    tag = f"{key}-{label.replace(' ', '-')}-{rep}"
                    prof = os.path.join(self.work, tag + ".dlpt")
                    if mode is None:
                        if key == "gptfast":
                            continue
                        cmd = [rl.PY, *prog, "--torch-profiler"]
                    elif not mode:
                        cmd = [rl.PY, *prog]
                    else:
                        cmd = [*rl.dlpt_record(prof), "--cuda-graph-trace", mode, *prog]
                    if not self.budget.allows(self.est.get(f"{key}/{label}", a.first_estimate) * 1.2):
                        print(f"  skip {tag}: {self.budget.left():.0f} s left", flush=True)
                        continue
                    r = rl.run(cmd, cwd=self.work, timeout=min(a.run_timeout, max(self.budget.left() - 5, 10)),
                               log=self.log)
                    self.est[f"{key}/{label}"] = r["wall_s"]
                    if key == "graph_replay":
                        line = next((ln for ln in r.out_lines if ln.startswith("{")), None)
                        v = json.loads(line)["ms_per_step"] if line else None
                    else:
                        m = next((m for ln in r.out_lines if (m := tok.search(ln))), None)
                        v = float(m.group(1)) if m else None
                    res[key].setdefault(label, []).append(v)
                    print(f"  {tag}: {v} (rc {r['rc']}, {r['wall_s']:.0f} s)", flush=True)
                    if rep == 0 and key == "graph_replay" and mode:
                        res["shares"][label] = self.kernel_shares(prof)
                    self.save()
        rows = []
        for key, unit in (("graph_replay", "ms/step"), ("gptfast", "tok/s")):
            base = rl.med([v for v in res[key].get("unprofiled", []) if v])
            for label, _ in self.GRAPH_CONFIGS:
                vs = [v for v in res[key].get(label, []) if v]
                if not vs:
                    continue
                m = rl.med(vs)
                x = rl.ratio(m, base) if unit == "ms/step" else rl.ratio(base, m)
                rows.append([key, label, f"{len(vs)}", f"{min(vs):.4g}–{max(vs):.4g}", m, x])
        node, graph = res["shares"].get("dlpt", {}), res["shares"].get("dlpt graph", {})
        worst = max((abs(graph.get(k, 0) - node.get(k, 0)), k) for k in set(node) | set(graph)) if node and graph else None
        res["worst_share_difference"] = worst
        self.tables.append(rl.table("CUDA-graph replays, whole processes (× unprofiled; graph_replay: ms per step, "
                                    "gpt-fast --compile: tokens/s)",
                                    ["program", "config", "processes", "spread", "median", "×"], rows)
                           + (f"\nlargest difference of a kernel's share of GPU time, graph vs node mode: "
                              f"{worst[0]:.2f} points ({worst[1][:60]})" if worst else ""))
        self.save()

    def kernel_shares(self, prof: str) -> dict[str, float]:
        """Each kernel's share of GPU time (percent), from `dlpt report --view flat --by kernel`."""
        if not os.path.exists(prof):
            return {}
        r = rl.run([rl.PY, "-m", "dlpt", "report", prof, "--view", "flat", "--by", "kernel", "--top", "1000",
                    "--format", "json"], cwd=self.work, timeout=120)
        try:
            rows = json.loads("\n".join(r.out_lines))["rows"]
        except (json.JSONDecodeError, KeyError):
            return {}
        total = sum(x["self"] for x in rows) or 1
        return {x["name"]: 100.0 * x["self"] / total for x in rows}

    @staticmethod
    def timm_result(rf: str, r: rl.Result) -> dict[str, Any]:
        """train_step_time / train_samples_per_sec from --results-file, else from the JSON
        benchmark.py prints after `--result`."""
        doc = None
        if os.path.exists(rf):
            with open(rf) as f:
                doc = json.load(f)
        else:
            text = "\n".join(r.out_lines)
            if "--result" in text:
                try:
                    doc = json.loads(text.split("--result", 1)[1])
                except json.JSONDecodeError:
                    doc = None
        if not isinstance(doc, dict) or "train_step_time" not in doc:
            m = [re.search(r"([0-9.]+) samples/sec, ([0-9.]+) ms/s", x) for x in r.out_lines + r.err_lines]
            m = [x for x in m if x]
            if not m:
                return {"step_ms": None, "samples_per_sec": None, "timm_error": (doc or {}).get("error")}
            return {"step_ms": float(m[-1].group(2)), "samples_per_sec": float(m[-1].group(1))}
        return {"step_ms": doc["train_step_time"], "samples_per_sec": doc["train_samples_per_sec"],
                "batch": doc.get("train_batch_size")}

    def extra(self) -> list[str]:
        return (NANOGPT_CPU if self.a.cpu else []) + self.a.nanogpt_arg

    def timm_extra(self) -> list[str]:
        return ["--device", "cpu"] if self.a.cpu else ["--amp"]


def gpu_overhead(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py gpu-overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="?", default="ab,steps,timm",
                    help="comma-separated: ab,variants,whole,nanogpt,steps,timm,graphs")
    ap.add_argument("--ab", default="dlpt,proton,torch.profiler", help="ab part: configurations, comma-separated "
                    "(';' where one sets several variables: 'dlpt;cupti=dlpt:DLPT_HOST=0,DLPT_SAMPLE_US=0')")
    ap.add_argument("--procs", type=int, default=3, help="ab and graphs parts: processes per configuration")
    ap.add_argument("--rounds", type=int, default=12, help="ab part: blocks unprofiled and profiled per process")
    ap.add_argument("--block", type=int, default=10, help="ab and variants parts: steps per block")
    ap.add_argument("--workloads", default="nanogpt", help="ab and variants parts: comma-separated, inproc.py's "
                    "programs (nanogpt, decode, decode-eager, resnet50, vit)")
    ap.add_argument("--whole", default="none,dlpt", help="whole part: configurations, the first the "
                    "baseline (none: as it is; dlpt: under dlpt record; LABEL=dlpt:K=V for an environment)")
    ap.add_argument("--variants", default="dlpt=;nodevice=DLPT_DEVICE=0;nohost=DLPT_HOST=0;noact=DLPT_DIAG=noactivities",
                    help="variants part: LABEL=ENV;... (ENV: K=V,K=V; empty for the default)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every configuration")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="nanogpt part: which of " + ",".join(CONFIGS))
    ap.add_argument("--iters", type=int, default=60, help="nanogpt part: max_iters (median over 10..this)")
    ap.add_argument("--steps", default="10:20", help="steps part: dlpt's --steps")
    ap.add_argument("--steps-iters", type=int, default=120)
    ap.add_argument("--timm-model", default="resnet50")
    ap.add_argument("--timm-batch", type=int, default=64)
    ap.add_argument("--timm-iters", type=int, default=50)
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole invocation; runs that would not fit are skipped")
    ap.add_argument("--run-timeout", type=float, default=180, help="seconds before one run is killed")
    ap.add_argument("--first-estimate", type=float, default=25, help="seconds a run of an unseen configuration is assumed to need")
    ap.add_argument("--cpu", action="store_true", help="a small CPU configuration (no Proton) to exercise the harness")
    ap.add_argument("--nanogpt-arg", action="append", default=[], help="extra nanoGPT flag, e.g. --nanogpt-arg=--batch_size=8")
    a = ap.parse_args(argv)
    if a.cpu and a.configs == ",".join(CONFIGS):
        a.configs = "none,dlpt,torchprof"  # Proton needs a GPU
    b = Bench(a)
    print(f"device: {b.res['device']}; out: {b.out}; work: {b.work}", flush=True)
    for part in a.parts.split(","):
        print(f"== {part}", flush=True)
        try:
            getattr(b, f"part_{part}")()
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others' tables
            import traceback

            traceback.print_exc()
            b.res.setdefault("errors", {})[part] = repr(e)
            b.save()
    print()
    rl.emit(b.out, "\n\n".join(b.tables))
    print(f"\nJSON: {os.path.join(b.out, 'overhead.json')}; log: {b.log}")

