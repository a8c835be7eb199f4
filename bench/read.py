"""Reading cases (docs/BENCHMARKS.md), each next to its peer in the same run.

`read`: `dlpt report` against Holistic Trace Analysis's `TraceAnalysis` on the same Kineto traces,
at several sizes. Each measurement is a fresh process (imports included, as a user would run it);
dlpt and HTA runs are interleaved so that load from other processes on the machine falls on both
alike, and medians are reported. Every child may cache compiled bytecode (under bench/out/pycache,
whatever PYTHONDONTWRITEBYTECODE says) and each command runs once untimed first: an installed
package (HTA, numpy) has its .pyc files, and dlpt read from a checkout would otherwise compile
its own modules in every run (0.15-0.25 s on this machine), which no installed dlpt does. Peak memory is the child's own `ru_maxrss` from `wait4`. Traces
are made once with shared/tools/synth_big.py under bench/out/ (git-ignored), one directory per
size, as HTA's `TraceAnalysis(trace_dir=...)` wants (no `distributedInfo` in the file: HTA then
takes it as rank 0).

    python bench/run.py read                  # 4 sizes from gpt_train (~72k .. ~523k events), 3 repeats
    python bench/run.py read --quick          # 2 small sizes, 2 repeats
    python bench/run.py read --repeats 5 --sizes 4,8,16,29
    python bench/run.py read --baseline-env DLPT_NATIVE_READ=0   # the native scan against the Python reader
    python bench/run.py read --dlpt-path /tmp/new --baseline-path /tmp/old
        # a checkout's dlpt (a folder holding its `dlpt` package, e.g. links to a worktree's
        # dlpt/, collectors/ and viewers/) instead of the installed one, and another beside it

`interop`: GraphFrame construction, dlpt's direct build from arrays against hatchet's literal
reader, on the gpt_train fixture and on larger trees made by repeating it under rank nodes.

    python bench/run.py interop [--trace TRACE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import runlib as rl

OUT = os.path.join(rl.BENCH, "out")
HTA_CODE = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"


def dlpt_command() -> list[str]:
    """The `dlpt` console script run by this interpreter (not a pyenv shim, whose start-up
    would be counted against dlpt)."""
    script = shutil.which("dlpt")
    if script and os.path.isfile(os.path.join(os.path.dirname(sys.executable), "dlpt")):
        script = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if not script:
        return [sys.executable, "-m", "dlpt"]
    return [sys.executable, script]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a timed child: bytecode cached in one folder for every tool alike."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(OUT, "pycache")
    env.update(extra)
    return env


def path_command(root: str) -> tuple[list[str], dict[str, str]]:
    """`python -m dlpt` importing the `dlpt` package found in `root` (not the installed one)."""
    if not os.path.isfile(os.path.join(root, "dlpt", "__init__.py")):
        raise SystemExit(f"{root}: no dlpt package in it")
    return [sys.executable, "-m", "dlpt"], child_env(PYTHONPATH=os.path.abspath(root), PYTHONSAFEPATH="1")


def make_trace(repeats: int) -> tuple[str, str, int]:
    """(directory, file, events) of the gpt_train trace repeated `repeats` times."""
    d = os.path.join(OUT, f"gpt_x{repeats}")
    f = os.path.join(d, f"gpt_x{repeats}.json")
    meta = os.path.join(d, "events.txt")
    if not (os.path.exists(f) and os.path.exists(meta)):
        os.makedirs(d, exist_ok=True)
        synth = os.path.join(rl.shared_dir(), "tools", "synth_big.py")
        res = subprocess.run([sys.executable, synth, rl.gpt_trace(), f, str(repeats)], check=True,
                             capture_output=True, text=True)
        with open(meta, "w") as fh:
            fh.write(res.stdout.split()[0])
    with open(meta) as fh:
        return d, f, int(fh.read().strip())


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of one run of `cmd`, output discarded. CPU
    time (user + system, the child's own) moves less than wall time with other load on the
    machine: the fairer comparison of the two tools' work where the machine is shared."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return wall, ru.ru_maxrss / 1024.0, ru.ru_utime + ru.ru_stime  # Linux: kilobytes


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def read(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py read", description="dlpt report vs HTA's TraceAnalysis at several sizes")
    ap.add_argument("--sizes", default="4,8,16,29", help="repeats of gpt_train (18k events each)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tool per size")
    ap.add_argument("--quick", action="store_true", help="sizes 1,4 and 2 repeats")
    ap.add_argument("--no-hta", action="store_true", help="time dlpt alone")
    ap.add_argument("--json", default=None, help="also write the raw runs here")
    ap.add_argument("--dlpt-path", default=None, metavar="DIR",
                    help="time the dlpt package in DIR (python -m dlpt, PYTHONPATH=DIR), not the installed one")
    ap.add_argument("--baseline-path", default=None, metavar="DIR",
                    help="also time the dlpt package in DIR, interleaved with the others (before/after)")
    ap.add_argument("--baseline-env", default=None, metavar="KEY=VALUE",
                    help="also time the same dlpt with KEY=VALUE set, interleaved with the others "
                         "(DLPT_NATIVE_READ=0: the Python reader)")
    args = ap.parse_args(argv)
    sizes = [1, 4] if args.quick else [int(x) for x in args.sizes.split(",")]
    repeats = 2 if args.quick else args.repeats
    dlpt, dlpt_env = path_command(args.dlpt_path) if args.dlpt_path else (dlpt_command(), child_env())
    base = path_command(args.baseline_path) if args.baseline_path else None
    if args.baseline_env:
        if base is not None:
            raise SystemExit("bench/run.py read: --baseline-path or --baseline-env, not both")
        key, _, value = args.baseline_env.partition("=")
        base = (dlpt, {**dlpt_env, key: value})
    if not args.no_hta:
        import hta.version as hv

        hta_version = ".".join(map(str, hv.__version_tuple__))
    else:
        hta_version = "-"
    where = f" (PYTHONPATH={args.dlpt_path})" if args.dlpt_path else ""
    print(f"dlpt: {' '.join(dlpt)}{where}; HTA {hta_version}; {os.cpu_count()} CPUs; {repeats} runs each, medians",
          flush=True)
    rows = []
    base_rows = []
    cpu_rows = []
    raw = []
    report = ["report", "", "--view", "flat", "--by", "line"]
    hta_env = child_env()
    # Untimed first runs: bytecode compiled and cached, as an installed package has it.
    d0, f0, _ = make_trace(min(sizes))
    report[1] = f0
    run_child(dlpt + report, dlpt_env)
    if base is not None:
        run_child(base[0] + report, base[1])
    if not args.no_hta:
        run_child([sys.executable, "-c", HTA_CODE, d0], hta_env)
    for reps in sizes:
        d, f, events = make_trace(reps)
        mb = os.path.getsize(f) / 1e6
        res: dict[str, list[tuple[float, float, float]]] = {"dlpt": [], "hta": [], "baseline": []}
        report[1] = f
        for _ in range(repeats):
            # Interleaved: one dlpt run, one HTA run, so that both see the same machine load.
            res["dlpt"].append(run_child(dlpt + report, dlpt_env))
            if base is not None:
                res["baseline"].append(run_child(base[0] + report, base[1]))
            if not args.no_hta:
                res["hta"].append(run_child([sys.executable, "-c", HTA_CODE, d], hta_env))
        med = {k: tuple(statistics.median(r[c] for r in v) for c in range(3)) if v else (float("nan"),) * 3
               for k, v in res.items()}
        rows.append((events, mb, *med["dlpt"][:2], *med["hta"][:2]))
        base_rows.append((events, *med["baseline"][:2], *med["dlpt"][:2], *med["hta"][:2]))
        cpu_rows.append((events, med["baseline"][2], med["dlpt"][2], med["hta"][2]))
        raw.append({"events": events, "mb": mb, **res})
        print(f"  {events} events done: dlpt {med['dlpt'][0]:.2f} s, HTA {med['hta'][0]:.2f} s", flush=True)
    print()
    print("| events | trace MB | dlpt s | HTA s | speed-up | dlpt peak MB | HTA peak MB | memory ratio "
          "| dlpt µs/event | HTA µs/event |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for events, mb, dt, dm, ht, hm in rows:
        print(f"| {events:,} | {mb:.0f} | {dt:.2f} | {ht:.2f} | {ht / dt:.1f}× | {dm:.0f} | {hm:.0f} | "
              f"{dm / hm:.2f} | {1e6 * dt / events:.2f} | {1e6 * ht / events:.2f} |")
    print()
    print("CPU seconds (user + system), medians of the same runs:")
    print("| events | dlpt CPU s | HTA CPU s | CPU speed-up |" + (" baseline CPU s |" if base is not None else ""))
    print("| ---: | ---: | ---: | ---: |" + (" ---: |" if base is not None else ""))
    for events, bc, dc, hc in cpu_rows:
        print(f"| {events:,} | {dc:.2f} | {hc:.2f} | {hc / dc:.1f}× |" + (f" {bc:.2f} |" if base is not None else ""))
    if base is not None:
        print()
        print(f"baseline: {f'PYTHONPATH={args.baseline_path}' if args.baseline_path else args.baseline_env}, "
              "timed in the same runs")
        print("| events | baseline s | dlpt s | baseline speed-up over HTA | baseline peak MB | dlpt peak MB | "
              "baseline memory ratio |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for events, bt, bm, dt, dm, ht, hm in base_rows:
            print(f"| {events:,} | {bt:.2f} | {dt:.2f} | {ht / bt:.1f}× | {bm:.0f} | {dm:.0f} | {bm / hm:.2f} |")
    if len(rows) >= 2:
        # Linearity: a least-squares line through the medians, and how far any size is from it.
        ev = [r[0] for r in rows]
        print()
        for label, col, unit, scale in (("dlpt time", 2, "µs", 1e6), ("HTA time", 4, "µs", 1e6),
                                        ("dlpt peak memory", 3, "kB", 1e3), ("HTA peak memory", 5, "kB", 1e3)):
            ys = [r[col] for r in rows]
            slope, icpt = _fit(ev, ys)
            dev = max(abs(y - (icpt + slope * x)) / y for x, y in zip(ev, ys))
            print(f"{label}: {icpt:.2f} + {slope * scale:.3f} {unit}/event × events "
                  f"(largest deviation from the line {100 * dev:.1f}%)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hta": hta_version, "runs": raw}, fh, indent=1)



def replicate(p: object, k: int) -> object:
    """k copies of the tree under k rank nodes: a realistic shape, k times the nodes."""
    import numpy as np

    from dlpt.cct import CCT
    from dlpt.frames import Frame
    from dlpt.profile import Profile

    cct = p.cct  # type: ignore[attr-defined]
    n = len(cct) - 1
    frames = list(p.frames) + [Frame("rank", f"rank {r}") for r in range(k)]  # type: ignore[attr-defined]
    parent, frame, exc = [np.array([-1])], [np.array([0])], [np.zeros((1, cct.exclusive.shape[1]), np.int64)]
    base = 1
    for r in range(k):
        rank_node = base
        parent.append(np.array([0]))
        frame.append(np.array([len(p.frames) + r]))  # type: ignore[attr-defined]
        exc.append(np.zeros((1, cct.exclusive.shape[1]), np.int64))
        sub = cct.parent[1:]
        parent.append(np.where(sub == 0, rank_node, sub + rank_node))
        frame.append(cct.frame[1:])
        exc.append(cct.exclusive[1:])
        base += n + 1
    return Profile(frames, CCT(np.concatenate(parent), np.concatenate(frame), np.concatenate(exc)),
                   meta={"source": "kineto"})


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def interop(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py interop",
                                 description="GraphFrame construction: dlpt's direct build vs hatchet's literal reader")
    ap.add_argument("--trace", default=None, help="a Kineto trace or .dlpt (default: the gpt_train fixture)")
    ap.add_argument("--copies", default="1,10,50", help="the tree repeated this many times under rank nodes")
    a = ap.parse_args(argv)
    import hatchet as ht

    import dlpt
    from dlpt.interop.graphframe import to_graphframe, to_literal

    p = dlpt.load(a.trace or rl.gpt_trace())
    print("| nodes | dlpt to_graphframe | to_literal + GraphFrame.from_literal | ratio | hatchet gf.to_literal() |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for k in (int(x) for x in a.copies.split(",")):
        q = replicate(p, k) if k > 1 else p
        reps = 5 if k <= 10 else 3
        n = len(q.cct)
        t_direct = _median_time(lambda q=q: to_graphframe(q, "gpu_time", include_library=True), reps)
        t_lit = _median_time(lambda q=q: ht.GraphFrame.from_literal(to_literal(q, include_library=True)), reps)
        gf = to_graphframe(q, "gpu_time", include_library=True)
        t_export = _median_time(lambda gf=gf: gf.to_literal(), 1) if n <= 20000 else float("nan")
        print(f"| {n:,} | {t_direct * 1e3:.0f} ms | {t_lit * 1e3:.0f} ms | {t_lit / t_direct:.1f}× | "
              + (f"{t_export * 1e3:.0f} ms |" if t_export == t_export else "not run (quadratic) |"), flush=True)
