"""GPU fidelity of `dlpt record`, two cases (docs/BENCHMARKS.md).

`gpu-fidelity`:
- `truth`: records bench/workloads/truth.py (sleep kernels, operator expressions, copies of
  known size, a module forward, module-level code, a custom Function's forward and backward, a
  thread, a CUDA graph replay — every activity from a marked line, timed with CUDA events) and
  compares per marked line: dlpt's GPU time (flat view by line, self; total shown too) vs the
  CUDA events (target: within 1%), copy bytes (exact), `# ZERO:` lines (no time), and the share
  of all GPU time that lies on the marked lines (≥ 99.5%; also shown without the busy line,
  which would otherwise hide a loss elsewhere).
- `nanogpt`: records nanoGPT eager and reads the share of GPU time on `def`/`class` lines (a
  hotspot line whose source text is a definition: time that missed its own line), on no source
  line at all, attributed to source, and done in backward (`dlpt export -f hotspots` summary).
- `kineto`: `dlpt record` on a program that itself runs torch.profiler (nanoGPT inside
  torch.profiler with stacks): does it run to its end, is the profile saved, what did dlpt record.

    python bench/run.py gpu-fidelity [truth,nanogpt,kineto] [--rounds 10] [--nanogpt-iters 30]
    python bench/run.py gpu-fidelity --analyze PROFILE --truth TRUTH.json --source PROGRAM.py
        # the comparison alone, on a profile recorded before
    python bench/run.py gpu-fidelity nanogpt --cpu --metric cpu_time   # the nanoGPT part on a CPU

Writes $OUT/fidelity.json, $OUT/fidelity.log and (when small) $OUT/fidelity.dlpt; prints tables.

`gpu-cases`: the hard cases, bench/gpu_cases/*.py (a torch.compile'd module, a CUDA-graph replay,
threads, every copy kind, activation checkpointing, a second-order gradient, a custom backward on
the CPU queue, `mode="reduce-overhead"` training, shares of fused kernels, idle and sync truth):
each recorded whole with `dlpt record`; per line marked `# CASE: ...`, the GPU time dlpt puts on
it, the share of GPU time at a source line and what stayed unattributed. A program that knows
`--check` (idle_truth.py) writes its own truth, given as its argument, and its check
(`PROGRAM --check PROFILE TRUTH`) judges the profile. Exits 1 when a program fails, keeps under
99.5% of its GPU time at a source line, or fails its check.

    python bench/run.py gpu-cases [CASE...]   # profiles and gpu_cases.json under $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

import runlib as rl

PROG = os.path.join(rl.WORKLOADS, "truth.py")
CASES_DIR = os.path.join(rl.BENCH, "gpu_cases")
MARK = re.compile(r"#\s*(LINE|ALSO|ZERO):(\w+)")
TOLERANCE_PCT = 1.0
DEF = re.compile(r"^\s*(async\s+def|def|class)\s|^\s*@")


def timeout(a: argparse.Namespace) -> float:
    """A run's limit: its own, or what is left of the part's budget, keeping time to read back."""
    return max(10.0, min(a.run_timeout, a.budget_clock.left() - 20))


def markers(src: str) -> dict[int, tuple[str, str]]:
    """{line number: (LINE | ALSO | ZERO, name)} from the program's `# LINE:name` comments."""
    with open(src) as f:
        return {i: (m.group(1), m.group(2)) for i, text in enumerate(f, 1) if (m := MARK.search(text))}


def compare(doc: dict[str, Any], truth: dict[str, Any], src: str) -> dict[str, Any]:
    """Per marked group: dlpt self/total ns on its lines vs the CUDA events; bytes; shares."""
    marks = markers(src)
    base = os.path.basename(src)
    metric = doc.get("metric", "gpu_time")
    # The report's JSON names its units (ns since it did); older ones gave the summary in µs.
    total_ns = doc["summary"][metric] * (1 if doc.get("unit", "us") == "ns" else 1000)
    per_line: dict[int, dict[str, Any]] = {}
    unmarked: list[tuple[str, int]] = []
    for row in doc["rows"]:
        if row.get("file") and os.path.basename(row["file"]) == base and row.get("line") in marks:
            per_line[row["line"]] = row
        elif row.get("self"):
            unmarked.append((row.get("name") or "?", int(row["self"])))
    ev = truth["cuda_event_ns"]
    groups: dict[str, dict[str, Any]] = {}
    for line, (kind, name) in sorted(marks.items()):
        g = groups.setdefault(name, {"lines": {}, "zero": kind == "ZERO"})
        row = per_line.get(line, {})
        g["lines"][line] = {"kind": kind, "self_ns": int(row.get("self", 0)), "total_ns": int(row.get("total", 0)),
                            "metrics": row.get("metrics", {})}
    out_rows = {}
    for name, g in groups.items():
        dl = sum(v["self_ns"] for v in g["lines"].values())
        prim = [v for v in g["lines"].values() if v["kind"] in ("LINE", "ZERO")]
        r: dict[str, Any] = {"lines": sorted(g["lines"]), "dlpt_self_ns": dl,
                             "dlpt_total_ns": sum(v["total_ns"] for v in prim),
                             "split": {str(ln): v["self_ns"] for ln, v in g["lines"].items()} if len(g["lines"]) > 1 else None}
        if g["zero"]:
            r["expected"] = "no GPU time"
            r["ok"] = dl == 0
        elif name in ev:
            r["cuda_events_ns"] = ev[name]
            r["count"] = truth.get("count", {}).get(name)
            r["error_pct"] = round(100 * (dl - ev[name]) / ev[name], 3) if ev[name] else None
            r["ok"] = r["error_pct"] is not None and abs(r["error_pct"]) <= TOLERANCE_PCT
        else:
            r["ok"] = None  # marked but not timed (not run, e.g. a case the program skipped)
        if name in truth.get("bytes", {}):
            col, want = truth["bytes"][name]
            got = sum(int(v["metrics"].get(col, 0)) for v in g["lines"].values())
            r["bytes"] = {"column": col, "expected": want, "dlpt": got, "exact": got == want}
            r["ok"] = bool(r["ok"]) and got == want
        out_rows[name] = r
    marked = sum(r["dlpt_self_ns"] for r in out_rows.values())
    busy = out_rows.get("busy", {}).get("dlpt_self_ns", 0)
    unmarked.sort(key=lambda t: -t[1])
    return {"groups": out_rows, "total_gpu_ns": total_ns, "marked_ns": marked,
            "marked_share_pct": round(100 * marked / total_ns, 4) if total_ns else None,
            "marked_share_without_busy_pct": round(100 * (marked - busy) / (total_ns - busy), 4) if total_ns > busy else None,
            "unmarked_top": unmarked[:8], "summary": doc["summary"]}


def truth_table(c: dict[str, Any], title: str) -> str:
    rows = []
    for name, r in c["groups"].items():
        err = r.get("error_pct")
        by = r.get("bytes")
        rows.append([name, ",".join(map(str, r["lines"])), r["dlpt_self_ns"] / 1e6, r["dlpt_total_ns"] / 1e6,
                     (r["cuda_events_ns"] / 1e6) if "cuda_events_ns" in r else r.get("expected"),
                     f"{err:+.3f}%" if err is not None else None,
                     f"{by['dlpt']}/{by['expected']}" if by else None,
                     " + ".join(f"{v / 1e6:.3f}" for v in r["split"].values()) if r.get("split") else None,
                     r["ok"]])
    t = rl.table(title, ["line", "at", "dlpt self ms", "dlpt total ms", "CUDA events ms", "error", "bytes dlpt/expected",
                         "split ms", "ok"], rows)
    share = (f"GPU time on marked lines: {rl.fmt(c['marked_share_pct'])}% (target ≥ 99.5%); without the busy line: "
             f"{rl.fmt(c['marked_share_without_busy_pct'])}%; total {c['total_gpu_ns'] / 1e6:.3f} ms")
    top = "; ".join(f"{n} {v / 1e6:.3f} ms" for n, v in c["unmarked_top"][:5]) or "none"
    return f"{t}\n{share}\nunmarked rows: {top}"


def part_truth(a: argparse.Namespace, out: str, work: str, log: str, res: dict[str, Any]) -> str:
    tj = os.path.join(work, "truth.json")
    prof = os.path.join(work, "fidelity.dlpt")
    r = rl.run(rl.dlpt_record(prof, PROG, tj, str(a.rounds)), cwd=work, timeout=timeout(a), log=log)
    res["truth_run"] = {**r.brief(), **rl.parse_saved(r)}
    if r["rc"] != 0 or not os.path.exists(tj):
        print("\n".join(r.err_lines[-15:]))
        return f"truth: program failed under dlpt record (rc {r['rc']}); see fidelity.log"
    with open(tj) as f:
        truth = json.load(f)
    res["truth"] = truth
    rd = rl.read_profile(prof)
    if not rd["ok"]:
        return f"truth: the profile does not read back: {rd['error']}"
    c = compare(rd["doc"], truth, PROG)
    res["truth_compare"] = c
    if os.path.getsize(prof) < 12 << 20:
        shutil.copy(prof, os.path.join(out, "fidelity.dlpt"))  # for a look with `dlpt view` later
    return truth_table(c, f"Ground truth ({truth.get('device')}, {truth.get('rounds')} rounds): dlpt vs CUDA events "
                          f"per marked line (target within {TOLERANCE_PCT}%)")


def def_line_shares(doc: dict[str, Any]) -> dict[str, Any]:
    """Shares of the flat-by-line rows (self) whose line is a def/class/decorator line, or that
    have no readable source line at all."""
    cache: dict[str, list[str] | None] = {}
    total = sum(int(r.get("self", 0)) for r in doc["rows"])
    on_def, no_line, def_rows = 0, 0, []
    for r in doc["rows"]:
        v = int(r.get("self", 0))
        f, ln = r.get("file"), r.get("line")
        if not f or not ln:
            no_line += v
            continue
        if f not in cache:
            try:
                with open(f) as fh:
                    cache[f] = fh.read().splitlines()
            except OSError:
                cache[f] = None
        src = cache[f]
        if src is None or ln > len(src):
            no_line += v
        elif DEF.match(src[ln - 1]):
            on_def += v
            def_rows.append((r.get("name"), v, src[ln - 1].strip()))
    return {"rows_total": total, "on_def": on_def, "no_line": no_line,
            "def_pct": round(100 * on_def / total, 4) if total else None,
            "no_line_pct": round(100 * no_line / total, 4) if total else None,
            "def_rows": sorted(def_rows, key=lambda t: -t[1])[:10]}


def nanogpt_prog(a: argparse.Namespace, work: str, iters: int) -> tuple[str, list[str]]:
    """(nanoGPT folder, train.py and its arguments); one copy per work folder."""
    nd = os.path.join(work, "nanoGPT")
    if not os.path.isdir(nd):
        nd = rl.nanogpt_copy(work)
    extra = ["--device=cpu", "--dtype=float32", "--batch_size=4", "--block_size=64", "--n_layer=2", "--n_head=2",
             "--n_embd=64"] if a.cpu else []
    return nd, ["train.py", "config/train_shakespeare_char.py", "--compile=False", f"--max_iters={iters}",
                "--eval_interval=1000", "--eval_iters=5", "--log_interval=1", "--always_save_checkpoint=False", *extra]


def part_kineto(a: argparse.Namespace, out: str, work: str, log: str, res: dict[str, Any]) -> str:
    """A program that runs torch.profiler itself (nanoGPT inside torch.profiler), recorded
    by dlpt: CUPTI has one subscriber per process, so this is where dlpt's collector and Kineto
    meet. The program must still run to its end; the row says what dlpt recorded then."""
    nd, prog = nanogpt_prog(a, work, 12)
    prof = os.path.join(work, "kineto.dlpt")
    r = rl.run(rl.dlpt_record(prof, rl.torch_profiler_script(work), *prog), cwd=nd, timeout=timeout(a), log=log)
    it = rl.nanogpt_iters(r)
    rd = rl.read_profile(prof, metric=a.metric)
    s = rd["doc"]["summary"] if rd["ok"] else {}
    tot = s.get(a.metric)
    row = {"rc": r["rc"], "timed_out": r["timed_out"], "iterations_run": len(it), "saved_and_read": rd["ok"],
           "read_error": rd.get("error"), "total_us": tot, **rl.parse_saved(r),
           "attributed_pct": round(100 * s["attributed_to_source"] / tot, 3) if tot else None,
           "stderr_tail": r.err_lines[-4:]}
    res["kineto"] = row
    return (rl.table(f"dlpt record on a program that runs torch.profiler itself (nanoGPT, 12 iterations, {a.metric})",
                     ["exit", "iterations run (of 13)", "profile saved+read", f"{a.metric} µs", "attributed %"],
                     [[row["rc"], row["iterations_run"], row["saved_and_read"], tot, row["attributed_pct"]]])
            + "\nstderr: " + " | ".join(row["stderr_tail"]))


def part_nanogpt(a: argparse.Namespace, out: str, work: str, log: str, res: dict[str, Any]) -> str:
    nd, prog = nanogpt_prog(a, work, a.nanogpt_iters)
    prof = os.path.join(work, "nanogpt.dlpt")
    r = rl.run(rl.dlpt_record(prof, *prog), cwd=nd, timeout=timeout(a), log=log)
    res["nanogpt_run"] = {**r.brief(), **rl.parse_saved(r)}
    rd = rl.read_profile(prof, metric=a.metric)
    if not rd["ok"]:
        return f"nanoGPT: rc {r['rc']}; the profile does not read back: {rd['error']}"
    s = rl.hotspots_summary(prof, metric=a.metric) or {}
    shares = def_line_shares(rd["doc"])
    tot = s.get(a.metric) or 0
    att = s.get("attributed_to_source")
    bwd = s.get("backward_time")
    n = {"metric": a.metric, "total_us": tot, **shares,
         "attributed_pct": round(100 * att / tot, 4) if tot and att is not None else None,
         "backward_pct": round(100 * bwd / tot, 4) if tot and bwd is not None else None,
         "unattributed": s.get("unattributed"), "hotspots_summary": s}
    res["nanogpt"] = n
    rows = [["on def/class lines (target ≤ 0.5%)", n["def_pct"]], ["on no source line", n["no_line_pct"]],
            ["attributed to source", n["attributed_pct"]], ["backward", n["backward_pct"]]]
    top = "; ".join(f"{name} {v / 1e6:.3f} ms `{code}`" for name, v, code in n["def_rows"][:4]) or "none"
    return rl.table(f"nanoGPT eager, {a.nanogpt_iters} iterations under dlpt record: share of {a.metric} "
                    f"(total {rl.fmt(tot)} µs)", ["where", "%"], rows) + f"\nlargest def-line rows: {top}"


def gpu_fidelity(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py gpu-fidelity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="?", default="truth,nanogpt,kineto")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--nanogpt-iters", type=int, default=30)
    ap.add_argument("--metric", default="gpu_time", help="nanogpt part and --analyze: cpu_time to try them on a CPU")
    ap.add_argument("--cpu", action="store_true", help="nanogpt part: a small CPU configuration")
    ap.add_argument("--run-timeout", type=float, default=240)
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole invocation")
    ap.add_argument("--analyze", metavar="PROFILE", help="compare an existing profile (with --truth, --source)")
    ap.add_argument("--truth", metavar="JSON")
    ap.add_argument("--source", metavar="PROGRAM", default=PROG)
    a = ap.parse_args(argv)
    a.budget_clock = rl.Budget(a.budget)
    out, work = rl.out_dir(), rl.work_dir()
    log = rl.log_path(out, "fidelity.log")
    res: dict[str, Any] = {"device": rl.gpu_name(), "args": {k: v for k, v in vars(a).items() if k != "budget_clock"},
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if a.analyze:
        with open(a.truth) as f:
            truth = json.load(f)
        rd = rl.read_profile(a.analyze, metric=a.metric)
        if not rd["ok"]:
            raise SystemExit(f"{a.analyze}: {rd['error']}")
        c = compare(rd["doc"], truth, a.source)
        res["truth_compare"] = c
        rl.write_json(out, "fidelity.json", res)
        print(truth_table(c, f"{os.path.basename(a.analyze)} vs {os.path.basename(a.truth)}"))
        return
    print(f"device: {res['device']}; out: {out}; work: {work}", flush=True)
    tables = []
    for part in a.parts.split(","):
        print(f"== {part}", flush=True)
        t0 = time.perf_counter()
        try:
            tables.append({"truth": part_truth, "nanogpt": part_nanogpt, "kineto": part_kineto}[part](a, out, work, log, res))
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the other's table
            import traceback

            traceback.print_exc()
            res.setdefault("errors", {})[part] = repr(e)
        res.setdefault("part_seconds", {})[part] = round(time.perf_counter() - t0, 1)
        rl.write_json(out, "fidelity.json", res)
    rl.finish(out, "\n\n".join(tables), "fidelity.json", log)



def case_lines(path: str) -> dict[int, str]:
    """{line number: label} of a case program's `# CASE: label` comments."""
    with open(path) as f:
        return {i: m.group(1).strip() for i, text in enumerate(f, 1) if (m := re.search(r"# CASE: (.*)$", text))}


def gpu_cases(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py gpu-cases", description="bench/gpu_cases/*.py under dlpt record: "
                                 "GPU time per `# CASE:` line, >= 99.5% at a source line, and each program's --check")
    ap.add_argument("cases", nargs="*", help="program names in bench/gpu_cases/ (default: all)")
    a = ap.parse_args(argv)
    names = a.cases or sorted(f[:-3] for f in os.listdir(CASES_DIR) if f.endswith(".py"))
    import dlpt
    from dlpt.metrics import COL
    from dlpt.transforms import hide_library_unless
    from dlpt.viewers.hotspots import summary
    from dlpt.views import flat

    out = rl.out_dir()
    results: dict[str, Any] = {}
    for name in names:
        src = os.path.join(CASES_DIR, f"{name}.py")
        prof_path = os.path.join(out, f"{name}.dlpt")
        with open(src) as f:
            checked = "--check" in f.read()
        truth = os.path.join(out, f"{name}.truth.json")
        # cwd=OUT: the checkout's dlpt/ folder would shadow the installed package's layout.
        r = subprocess.run(rl.dlpt_record(prof_path, src, *([truth] if checked else [])),
                           capture_output=True, text=True, cwd=out, timeout=300)
        if r.returncode != 0:
            results[name] = {"error": r.stderr[-2000:]}
            print(name, "FAILED", r.stderr[-2000:], flush=True)
            continue
        prof = dlpt.load(prof_path)
        view = hide_library_unless(prof, False)
        s = summary(view)
        fv = flat(view, "line")
        marks = case_lines(src)
        per_line: dict[int, int] = {}
        for g, fr in enumerate(fv.frame):
            if fr.kind == "python" and fr.file and os.path.basename(fr.file) == f"{name}.py":
                per_line[fr.line] = per_line.get(fr.line, 0) + int(fv.exclusive[g, COL["gpu_time"]])
        tot = prof.cct.exclusive.sum(axis=0)
        results[name] = {
            "gpu_time_us": s["gpu_time"], "attributed_to_source_us": s["attributed_to_source"],
            "unattributed": s["unattributed"], "activities": int(len(prof.activities)),
            "cases": {f"{ln}: {label}": per_line.get(ln, 0) / 1000.0 for ln, label in marks.items()},
            "other_lines_us": {str(ln): v / 1000.0 for ln, v in per_line.items() if ln not in marks},
            "htod_bytes": int(tot[COL["htod_bytes"]]), "dtoh_bytes": int(tot[COL["dtoh_bytes"]]),
            "dtod_bytes": int(tot[COL["dtod_bytes"]]), "memset_time_us": s["memset_time"],
            "post_processing_s": prof.meta.get("post_processing_s"),
            "profile_bytes": os.path.getsize(prof_path),
        }
        print(f"== {name}: GPU {s['gpu_time']:.1f} us, at a source line "
              f"{100 * s['attributed_to_source'] / max(s['gpu_time'], 1e-9):.2f}%, unattributed {s['unattributed']}",
              flush=True)
        for k, v in results[name]["cases"].items():
            print(f"   {k:<40} {v:10.1f} us", flush=True)
        for k, v in results[name]["other_lines_us"].items():
            print(f"   (line {k}){'':<31} {v:10.1f} us", flush=True)
        if checked:  # the program's own judge of its truth against the profile
            c = subprocess.run([rl.PY, src, "--check", prof_path, truth], capture_output=True, text=True, cwd=out)
            print(c.stdout + c.stderr, flush=True)
            results[name]["check_rc"] = c.returncode
    import torch

    rl.write_json(out, "gpu_cases.json", {"torch": torch.__version__, "gpu": rl.gpu_name(), "results": results})
    # Every program must run to its end, keep all but 0.5% of its GPU time on source lines, and
    # pass its own check.
    bad = [n for n, r in results.items() if "error" in r or r.get("check_rc")
           or r["attributed_to_source_us"] < 0.995 * r["gpu_time_us"]]
    if bad:
        print(f"gpu-cases: failed, under 99.5% at a source line, or failed its check: {', '.join(bad)}", flush=True)
        return 1
    return 0
