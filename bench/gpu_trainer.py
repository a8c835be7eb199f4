"""`dlpt record` on a Hugging Face `Trainer` run (bench/workloads/hf_trainer.py: small random GPT-2,
synthetic data, 2 dataloader workers, bf16, 40 steps), N times (issue 10; docs/BENCHMARKS.md: ≤ 1.3×
runtime, no pause over 100 ms, ≤ 0.5 s to the saved profile, 10 of 10 saved).

Runs the program unprofiled (`--baseline` times, default 1), then under `dlpt record` N times,
each a fresh process, and for each: exit status, Trainer's train_runtime, the longest step
(a pause inside the program), whether the profile was saved and reads back (`dlpt report`, that
is `dlpt.load`), dlpt's own post-processing seconds, and the program's last line → process exit
(the time to the saved profile, with the unprofiled run's own exit time subtracted).

    python bench/run.py trainer [-n 10] [--steps 40] [--budget 540]
    python bench/run.py trainer -n 2 --steps 4 --batch 2        # a quick try on a CPU

Writes $OUT/trainer.json (rewritten after each run) and $OUT/trainer.log; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import runlib as rl

PROG = os.path.join(rl.WORKLOADS, "hf_trainer.py")


def trainer_result(r: rl.Result) -> dict[str, Any] | None:
    for line in reversed(r.out_lines):
        if line.startswith("TRAINER_RESULT "):
            return json.loads(line[len("TRAINER_RESULT "):])
    return None


def gpu_trainer(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py trainer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=10, help="runs under dlpt record")
    ap.add_argument("--baseline", type=int, default=1, help="unprofiled runs (first)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dlpt-steps", default=None, help="also pass --steps A:B to dlpt record")
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--run-timeout", type=float, default=150)
    a = ap.parse_args(argv)
    out, work = rl.out_dir(), rl.work_dir()
    log = rl.log_path(out, "trainer.log")
    budget = rl.Budget(a.budget)
    res: dict[str, Any] = {"device": rl.gpu_name(), "args": vars(a), "runs": [],
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"device: {res['device']}; out: {out}; work: {work}", flush=True)
    prog = [PROG, "--steps", str(a.steps), "--batch", str(a.batch), "--workers", str(a.workers)]
    plan = [("none", i) for i in range(a.baseline)] + [("dlpt", i) for i in range(a.runs)]
    est: dict[str, float] = {}
    for cfg, i in plan:
        need = est.get(cfg, est.get("none", 30) * (2 if cfg == "dlpt" else 1)) * 1.1
        if not budget.allows(need):
            print(f"  skip {cfg} {i}: {budget.left():.0f} s left, needs ~{need:.0f} s", flush=True)
            res["runs"].append({"config": cfg, "i": i, "skipped": "budget"})
            continue
        prof = os.path.join(work, f"trainer-{i}.dlpt")
        cmd = [rl.PY, *prog] if cfg == "none" else rl.dlpt_record(prof, *prog, steps=a.dlpt_steps)
        print(f"  run {cfg} {i} ...", end="", flush=True)
        r = rl.run(cmd, cwd=work, timeout=min(a.run_timeout, max(budget.left() - 5, 10)), log=log)
        est[cfg] = max(est.get(cfg, 0), r["wall_s"])
        tr = trainer_result(r) or {}
        row: dict[str, Any] = {"config": cfg, "i": i, **r.brief(),
                               "train_runtime": tr.get("metrics", {}).get("train_runtime"),
                               "step_s_median": tr.get("step_s_median"),
                               "step_s_max": tr.get("step_s_max_after_first"), "steps_seen": tr.get("steps_seen")}
        if cfg == "dlpt":
            row.update(rl.parse_saved(r))
            row["file"] = os.path.exists(prof)
            rd = rl.read_profile(prof) if row["file"] else {"ok": False, "error": "no file"}
            row["read_ok"] = rd["ok"]
            row["read_error"] = rd.get("error")
            row["saved"] = bool(row["file"] and rd["ok"])
            if rd["ok"]:
                row["gpu_time_us"] = rd["doc"]["summary"].get("gpu_time")
            if os.path.exists(prof):
                os.unlink(prof)  # ten profiles of a 40-step run need not pile up on the device's disk
        print(f" rc {r['rc']}, {r['wall_s']:.1f} s, train_runtime {rl.fmt(row['train_runtime'])}"
              + (f", saved {rl.fmt(row['saved'])}" if cfg == "dlpt" else "")
              + (" TIMED OUT" if r["timed_out"] else ""), flush=True)
        if r["rc"] != 0:
            print("    " + "\n    ".join(r.err_lines[-5:]), flush=True)
        res["runs"].append(row)
        rl.write_json(out, "trainer.json", res)

    done = [r for r in res["runs"] if "skipped" not in r]
    base = [r for r in done if r["config"] == "none" and r["rc"] == 0]
    dl = [r for r in done if r["config"] == "dlpt"]
    base_rt = rl.med([r["train_runtime"] for r in base if r["train_runtime"] is not None])
    base_tail = rl.med([r["tail_s"] for r in base if r["tail_s"] is not None])
    dl_rt = rl.med([r["train_runtime"] for r in dl if r["train_runtime"] is not None])
    # The program's end → saved profile: dlpt's exit after the program's last line, less the
    # unprofiled program's own (interpreter shutdown, dataloader workers joining).
    ttp = [r["tail_s"] - (base_tail or 0) for r in dl if r.get("saved") and r["tail_s"] is not None]
    summ = {
        "unprofiled_train_runtime_s": base_rt, "dlpt_train_runtime_s": dl_rt, "runtime_ratio": rl.ratio(dl_rt, base_rt),
        "saved": sum(1 for r in dl if r.get("saved")), "runs": len(dl),
        "exit_statuses": sorted({r["rc"] for r in dl}),
        "time_to_profile_s_median": rl.med(ttp), "time_to_profile_s_max": max(ttp, default=None),
        "post_processing_s_median": rl.med([r["post_processing_s"] for r in dl if r.get("post_processing_s") is not None]),
        "unprofiled_exit_after_last_line_s": base_tail,
        "max_step_s_unprofiled": max((r["step_s_max"] for r in base if r["step_s_max"] is not None), default=None),
        "max_step_s_dlpt": max((r["step_s_max"] for r in dl if r["step_s_max"] is not None), default=None),
        "skipped": sum(1 for r in res["runs"] if "skipped" in r),
    }
    res["summary"] = summ
    rl.write_json(out, "trainer.json", res)
    rows = [["unprofiled", f"{len(base)}/{len([r for r in done if r['config'] == 'none'])}", base_rt, 1.0 if base_rt else None,
             "-", "-", base_tail, summ["max_step_s_unprofiled"]],
            ["dlpt record", f"{sum(1 for r in dl if r['rc'] == 0)}/{len(dl)}", dl_rt, summ["runtime_ratio"],
             f"{summ['saved']}/{len(dl)}",
             f"{rl.fmt(summ['time_to_profile_s_median'])} / {rl.fmt(summ['time_to_profile_s_max'])}",
             rl.med([r["tail_s"] for r in dl if r["tail_s"] is not None]), summ["max_step_s_dlpt"]]]
    t = rl.table(f"HF Trainer, GPT-2 4×256 random init, {a.steps} steps, {a.workers} workers ({res['device']}); "
                 "targets: ≤ 1.3×, 10/10 saved, ≤ 0.5 s to profile, no step over 0.1 s",
                 ["config", "exit 0", "train_runtime s", "× unprofiled", "saved", "to profile s med / max",
                  "last line→exit s", "longest step s"], rows)
    print()
    rl.emit(out, t + f"\nexit statuses under dlpt: {summ['exit_statuses']}; dlpt post-processing median "
                     f"{rl.fmt(summ['post_processing_s_median'])} s; skipped for time: {summ['skipped']}")
    print(f"JSON: {os.path.join(out, 'trainer.json')}; log: {log}")

