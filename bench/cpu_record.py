"""CPU recording overhead and memory of `dlpt record` (docs/BENCHMARKS.md), fresh process each run:

- `oploop`: 8 × (Linear + LayerNorm + GELU) on 16×64 tensors, AdamW, 320 steps
  (bench/workloads/cpu_loop.py): median step time over steps 20..end, unprofiled vs `dlpt record`,
  interleaved; ratio (target ≤ 1.25×); exit status; profile saved and reads back.
- `memory`: 100k steps of a tiny Linear + SGD loop: resident memory growth inside the loop
  (after the warm-up steps → end) and the process's peak RSS (wait4), unprofiled vs recorded;
  dlpt's growth is the difference (target < 50 MB).

    python bench/run.py cpu-record [oploop,memory] [--repeats 3] [--steps 320] [--mem-steps 100000]
    python bench/run.py cpu-record oploop --configs 'none;before=dlpt:PYTHONPATH=/tmp/old;after=dlpt'

`--configs`: the oploop's configurations in turns, each `[LABEL=]none|dlpt[:ENV=VAL,...]` (two
builds of dlpt side by side: PYTHONPATH naming each one's package tree).

Writes $OUT/cpu.json and $OUT/cpu.log; prints tables last.

`--callgrind`: the collector's host-side cost in instructions instead, counted by callgrind:
deterministic, so it can be measured on a small, shared, noisy machine where timings cannot.
nanoGPT's own model runs N training steps (bench/workloads/cpu_loop.py nanogpt); every
configuration runs twice, 1 and 1 + N steps, and the difference counts N steady steps. CONFIG is
`none` (unprofiled), `dlpt`, or `LABEL=dlpt:DLPT_DIAG=...`. Needs valgrind; start-up runs
uninstrumented (the workload asks callgrind to instrument its steps only). tests/test_cost_guard.py
is the short tripwire, on the oploop's steps.

    python bench/run.py cpu-record --callgrind [--steps 10] [--configs CONFIG,CONFIG...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import runlib as rl

PROG = os.path.join(rl.WORKLOADS, "cpu_loop.py")
# Both runs on the CPU even on a GPU machine: the point is the host-side cost per op.
ENV = {"CUDA_VISIBLE_DEVICES": ""}


def result(r: rl.Result) -> dict[str, Any] | None:
    for line in reversed(r.out_lines):
        if line.startswith("OPLOOP_RESULT "):
            return json.loads(line[len("OPLOOP_RESULT "):])
    return None


def one(cfg: str, mode: str, n: int, work: str, tag: str, a: argparse.Namespace, log: str,
        run_as: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of the workload's `mode` (oploop, memory), unprofiled where `run_as` (else `cfg`)
    is "none", else recorded; `env` is added to the run's environment."""
    run_as = run_as or cfg
    if a.budget_clock.left() < 30:  # a run cut off at once measures nothing: say it was not run
        print(f"  skip {tag}: {a.budget_clock.left():.0f} s left", flush=True)
        return {"config": cfg, "tag": tag, "skipped": "budget", "rc": None, "timed_out": False,
                "median_ms": None, "maxrss_mb": None}
    prof = os.path.join(work, f"{tag}.dlpt")
    prog = [PROG, mode, str(n)]
    cmd = [rl.PY, *prog] if run_as == "none" else rl.dlpt_record(prof, *prog)
    print(f"  run {tag} ...", end="", flush=True)
    r = rl.run(cmd, cwd=work, timeout=max(10.0, min(a.run_timeout, a.budget_clock.left() - 15)), log=log,
               env={**ENV, **(env or {})})
    doc = result(r) or {}
    row: dict[str, Any] = {"config": cfg, "tag": tag, **r.brief()}
    if mode == "oploop":
        st = doc.get("step_s") or []
        row["median_ms"] = rl.med([s * 1e3 for s in st[a.skip:]])
        row["max_ms"] = max((s * 1e3 for s in st[a.skip:]), default=None)
        row["steps"] = len(st)
    else:
        row.update({k: doc.get(k) for k in ("rss_after_warm_mb", "rss_end_mb", "loop_s", "steps")})
        if doc.get("rss_end_mb") is not None and doc.get("rss_after_warm_mb") is not None:
            row["growth_mb"] = round(doc["rss_end_mb"] - doc["rss_after_warm_mb"], 1)
    if run_as == "dlpt":
        row.update(rl.parse_saved(r))
        rd = rl.read_profile(prof, metric="cpu_time") if os.path.exists(prof) else {"ok": False, "error": "no file"}
        row["saved"] = rd["ok"]
        row["read_error"] = rd.get("error")
        if rd["ok"]:
            row["cpu_time_us"] = rd["doc"]["summary"].get("cpu_time")
        if os.path.exists(prof):
            os.unlink(prof)
    print(f" rc {r['rc']}, {r['wall_s']:.1f} s" + (f", saved {rl.fmt(row['saved'])}" if run_as == "dlpt" else "")
          + (" TIMED OUT" if r["timed_out"] else ""), flush=True)
    if r["rc"] != 0:
        print("    " + "\n    ".join(r.err_lines[-5:]), flush=True)
    return row


# The callgrind configurations: unprofiled, dlpt, and dlpt with parts of its host path switched
# off (DLPT_DIAG, collectors/native), to see where its instructions go.
CALLGRIND = ("none,dlpt,switching RecordFunction off per op=dlpt:DLPT_DIAG=toggle,"
             "callback returning at once=dlpt:DLPT_DIAG=noop,backward() without RecordFunction=dlpt:DLPT_DIAG=bwoff")


def callgrind(configs: list[str], steps: int) -> None:
    """Instructions per steady nanoGPT step, unprofiled and under each configuration."""
    from dlpt.collectors.record import native

    native.load(quiet=True)  # built here, not under valgrind
    rows = []
    for config in configs:
        label, mode, env = rl.parse_config(config)
        env = {**os.environ, "PYTHONHASHSEED": "0", **env}
        # Two runs, 1 and 1 + STEPS steps, at once: their difference is STEPS steady steps, without
        # what the first steps through the loop's call site cost (new contexts to intern).
        with tempfile.TemporaryDirectory() as tmp:
            # --instr-atstart=no: the workload starts instrumenting right before its steps (a client
            # request, cpu_loop.py), so start-up runs at Valgrind's plain speed.
            procs = [subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--toggle-collect=starmap_next",
                                       f"--callgrind-out-file={tmp}/cg.{k}", rl.PY, PROG, "nanogpt",
                                       mode, str(k)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True) for k in (1, 1 + steps)]
            outs = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
        counts = [re.search(r"Collected : (\d+)", err) for _, err in outs]
        if any(rc != 0 for rc, _ in outs) or not all(counts):
            print(f"{config}: failed\n{outs[-1][1][-2000:]}", file=sys.stderr)
            continue
        c0, c1 = (int(m.group(1)) for m in counts if m)
        rows.append((label, (c1 - c0) / steps))
        print(f"{label}: {rows[-1][1]:,.0f} instructions/step", file=sys.stderr, flush=True)
    base = next((v for k, v in rows if k == "none"), None)
    print("| configuration | instructions / step | × unprofiled |\n| --- | --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v:,.0f} | {v / base:.3f} |" if base else f"| {k} | {v:,.0f} | - |")


def cpu_record(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py cpu-record", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="?", default="oploop,memory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="oploop steps (320); with --callgrind: counted steps (10)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions per step under callgrind instead")
    ap.add_argument("--configs", default=None,
                    help="configurations, `[LABEL=]none|dlpt[:ENV=VAL,...]`, comma-separated (';' where one sets "
                         "several variables): the oploop's (default none,dlpt), or --callgrind's (default: the "
                         "collector's parts switched off in turn)")
    ap.add_argument("--skip", type=int, default=20, help="warm-up steps left out of the median")
    ap.add_argument("--mem-steps", type=int, default=100_000)
    ap.add_argument("--run-timeout", type=float, default=300)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for the whole invocation (runs are cut to fit)")
    a = ap.parse_args(argv)
    if a.callgrind:
        callgrind((a.configs or CALLGRIND).split(","), a.steps or 10)
        return
    a.steps = a.steps or 320
    a.budget_clock = rl.Budget(a.budget)
    out, work = rl.out_dir(), rl.work_dir()
    log = rl.log_path(out, "cpu.log")
    res: dict[str, Any] = {"args": {k: v for k, v in vars(a).items() if k != "budget_clock"}, "cores": os.cpu_count(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"out: {out}; work: {work}", flush=True)
    tables = []
    parts = a.parts.split(",")
    if "oploop" in parts:
        print("== oploop", flush=True)
        runs = res["oploop"] = []
        configs = rl.parse_configs(a.configs or "none,dlpt")
        for rep in range(a.repeats):  # in turns: the machine's drift falls on every configuration alike
            for label, mode, env in configs:
                runs.append(one(label, "oploop", a.steps, work, f"oploop-{label}-{rep}", a, log, mode, env))
                rl.write_json(out, "cpu.json", res)
        rows, summ = [], {}
        for label, _, _ in configs:
            rs = [r for r in runs if r["config"] == label]
            ok = [r for r in rs if r["rc"] == 0 and r["median_ms"] is not None]
            summ[label] = {"median_ms": rl.med([r["median_ms"] for r in ok]), "per_run": [r["median_ms"] for r in ok],
                           "ok": len(ok), "n": len(rs), "saved": sum(1 for r in rs if r.get("saved")),
                           "exit": sorted({r["rc"] for r in rs if r["rc"] is not None})}
        base = summ.get("none", {}).get("median_ms")
        if "dlpt" in summ:
            summ["ratio"] = rl.ratio(summ["dlpt"]["median_ms"], base)
        res["oploop_summary"] = summ
        for label, mode, _ in configs:
            s = summ[label]
            rows.append([{"none": "unprofiled", "dlpt": "dlpt record"}.get(label, label), f"{s['ok']}/{s['n']}",
                         s["median_ms"], ", ".join(rl.fmt(x) for x in s["per_run"]), rl.ratio(s["median_ms"], base),
                         f"{s['saved']}/{s['n']}" if mode == "dlpt" else "-",
                         ", ".join("skipped" if r.get("skipped") else "timed out" if r["timed_out"] else str(r["rc"])
                                   for r in runs if r["config"] == label)])
        tables.append(rl.table(f"CPU op-bound loop: 8×(Linear+LayerNorm+GELU) 16×64, AdamW, {a.steps} steps, median "
                               f"step ms over steps {a.skip}.. ({os.cpu_count()} cores; target ≤ 1.25×)",
                               ["config", "ran", "median ms", "per run", "× unprofiled", "saved", "exit"], rows))
    if "memory" in parts:
        print("== memory", flush=True)
        runs = res["memory"] = [one(cfg, "memory", a.mem_steps, work, f"memory-{cfg}", a, log) for cfg in ("none", "dlpt")]
        rl.write_json(out, "cpu.json", res)
        by = {r["config"]: r for r in runs}
        g = {c: by[c].get("growth_mb") for c in by}
        # A run that died has no comparable peak: it never reached the end (or the save).
        m = {c: by[c].get("maxrss_mb") if by[c]["rc"] == 0 else None for c in by}
        summ = {"growth_mb": g, "maxrss_mb": m,
                "dlpt_growth_mb": round(g["dlpt"] - g["none"], 1) if None not in g.values() else None,
                "dlpt_peak_extra_mb": round(m["dlpt"] - m["none"], 1) if None not in m.values() else None}
        res["memory_summary"] = summ
        rows = [[label, "skipped" if by[c].get("skipped") else "timed out" if by[c]["timed_out"] else by[c]["rc"],
                 by[c].get("steps"), by[c].get("loop_s"), by[c].get("rss_after_warm_mb"),
                 by[c].get("rss_end_mb"), g[c], m[c]] for c, label in (("none", "unprofiled"), ("dlpt", "dlpt record"))]
        tables.append(rl.table(f"Memory: {a.mem_steps} steps of a tiny Linear+SGD loop (target: dlpt's growth < 50 MB)",
                               ["config", "exit", "steps", "loop s", "RSS after warm-up MB", "RSS end MB",
                                "growth MB", "peak RSS MB"], rows)
                      + f"\ndlpt's growth in the loop: {rl.fmt(summ['dlpt_growth_mb'])} MB; peak RSS over unprofiled: "
                        f"{rl.fmt(summ['dlpt_peak_extra_mb'])} MB (saving the profile included)")
    rl.write_json(out, "cpu.json", res)
    rl.finish(out, "\n\n".join(tables), "cpu.json", log)

